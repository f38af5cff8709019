//! `brig ls`: the sandboxes this key's tenant has on the daemon.

use serde_json::Value;

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    /// One JSON array instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: LsArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let mut all: Vec<Value> = Vec::new();
    let mut path = "/v1/sandboxes?limit=1000".to_string();
    loop {
        let page = client.json("GET", &path, None)?;
        if let Some(items) = page["items"].as_array() {
            all.extend(items.iter().cloned());
        }
        match page["next"].as_str() {
            Some(next) => path = format!("/v1/sandboxes?limit=1000&cursor={next}"),
            None => break,
        }
    }
    if args.json {
        println!("{}", Value::Array(all));
        return Ok(0);
    }
    println!(
        "{:<12}  {:<8}  {:<20}  EXPIRES_IN",
        "ID", "STATE", "TEMPLATE"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    for s in &all {
        let state = s["state"].as_str().unwrap_or("?");
        let expires = match (state, s["expires_at"].as_i64()) {
            ("running" | "paused" | "creating", Some(at)) => {
                format!("{}s", (at - now).max(0) / 1000)
            }
            _ => "-".to_string(),
        };
        println!(
            "{:<12}  {:<8}  {:<20}  {expires}",
            s["id"].as_str().unwrap_or("?"),
            state,
            s["template"].as_str().unwrap_or("?"),
        );
    }
    Ok(0)
}
