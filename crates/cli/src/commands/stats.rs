//! `brig stats [ID...]`: live CPU, memory, disk and pids of sandboxes, as
//! `docker stats --no-stream` shows containers (every live sandbox when
//! no id is given; `--json` for the API's numbers).

use serde_json::Value;

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct StatsArgs {
    /// Sandboxes: ids, names or unique starts of ids; default: every live sandbox.
    ids: Vec<String>,
    /// One JSON array of the API's metrics instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: StatsArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let ids: Vec<String> = if args.ids.is_empty() {
        client
            .sandboxes()?
            .iter()
            .filter(|s| matches!(s["state"].as_str(), Some("running" | "paused")))
            .filter_map(|s| s["id"].as_str().map(str::to_string))
            .collect()
    } else {
        args.ids
            .iter()
            .map(|i| client.resolve(i))
            .collect::<anyhow::Result<_>>()?
    };
    let mut all = Vec::new();
    for id in &ids {
        let mut m = client.json("GET", &format!("/v1/sandboxes/{id}/metrics"), None)?;
        m["id"] = id.as_str().into();
        all.push(m);
    }
    if args.json {
        println!("{}", Value::Array(all));
        return Ok(0);
    }
    println!(
        "{:<12}  {:<7}  {:>7}  {:>21}  {:>6}  {:>17}  {:>5}",
        "ID", "STATE", "CPU %", "MEM USAGE / LIMIT", "MEM %", "DISK", "PIDS"
    );
    let mib = |v: &Value| {
        v.as_u64()
            .map_or("-".into(), |b| format!("{:.1}MiB", b as f64 / 1048576.0))
    };
    for m in &all {
        let (used, limit) = (m["memory_bytes"].as_f64(), m["memory_limit_bytes"].as_f64());
        let mem_pct = match (used, limit) {
            (Some(u), Some(l)) if l > 0.0 => format!("{:.1}%", 100.0 * u / l),
            _ => "-".into(),
        };
        println!(
            "{:<12}  {:<7}  {:>7}  {:>21}  {:>6}  {:>17}  {:>5}",
            m["id"].as_str().unwrap_or("?"),
            m["state"].as_str().unwrap_or("?"),
            m["cpu_percent"]
                .as_f64()
                .map_or("-".into(), |c| format!("{c:.1}%")),
            format!(
                "{} / {}",
                mib(&m["memory_bytes"]),
                mib(&m["memory_limit_bytes"])
            ),
            mem_pct,
            format!(
                "{} / {}",
                mib(&m["disk_used_bytes"]),
                mib(&m["disk_total_bytes"])
            ),
            m["pids"].as_u64().unwrap_or(0),
        );
    }
    Ok(0)
}
