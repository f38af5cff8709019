//! `brig inspect ID [--json]`: one sandbox on the daemon, as a short
//! summary or as the API's JSON.

use serde_json::Value;

use super::client::{ago, now_millis, span, Client};

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
    /// The daemon's JSON, unchanged, instead of a summary.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InspectArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let id = client.resolve(&args.id)?;
    let sandbox = client.json("GET", &format!("/v1/sandboxes/{id}"), None)?;
    if args.json {
        println!("{sandbox}");
    } else {
        print!("{}", summary(&sandbox, now_millis()));
    }
    Ok(0)
}

/// `Field:  value` lines; a field the daemon did not send is left out.
fn summary(s: &Value, now: i64) -> String {
    let text = |k: &str| s[k].as_str().map(str::to_string);
    let state = s["state"].as_str().unwrap_or("?");
    let live = matches!(state, "creating" | "running" | "paused");
    let labels = s["labels"].as_object().map(|m| {
        if m.is_empty() {
            "-".to_string()
        } else {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        }
    });
    let expires = s["expires_at"].as_i64().filter(|_| live).map(|at| {
        if at > now {
            format!("in {}", span(at - now))
        } else {
            "now".to_string()
        }
    });
    let rows = [
        ("ID", text("id")),
        ("Name", text("name")),
        ("State", Some(state.to_string())),
        (
            "Template",
            text("template").map(|t| super::ls::template_name(&t).to_string()),
        ),
        ("Isolation", text("isolation")),
        ("Limits", limits(&s["limits"])),
        ("Labels", labels),
        ("Created", s["created_at"].as_i64().map(ago)),
        ("Expires", expires),
        ("Ended", s["ended_at"].as_i64().map(ago)),
        ("Exit code", s["exit_code"].as_i64().map(|c| c.to_string())),
        ("Why", s["end"]["message"].as_str().map(str::to_string)),
        ("Published", {
            let list = super::create::published(s);
            (!list.is_empty() && live).then(|| list.join(", "))
        }),
    ];
    let mut out = String::new();
    for (name, value) in rows {
        if let Some(v) = value {
            out.push_str(&format!("{:<10} {v}\n", format!("{name}:")));
        }
    }
    out
}

/// "memory 512 MiB, disk 1024 MiB, pids 256, cpus unlimited".
fn limits(l: &Value) -> Option<String> {
    let mib = |v: &Value| v.as_u64().map(|b| format!("{} MiB", b >> 20));
    Some(format!(
        "memory {}, disk {}, pids {}, cpus {}",
        mib(&l["memory_bytes"])?,
        mib(&l["disk_bytes"])?,
        l["pids"].as_u64()?,
        l["cpus"]
            .as_f64()
            .map_or("unlimited".to_string(), |c| c.to_string())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_a_running_and_an_ended_sandbox() {
        let now = now_millis();
        let running = serde_json::json!({
            "id": "0123456789ab", "state": "running", "template": "host",
            "isolation": "process", "labels": {"a": "1", "b": "2"},
            "created_at": now - 65_000, "expires_at": now + 125_500,
            "ended_at": null, "exit_code": null,
        });
        let text = summary(&running, now);
        assert!(text.contains("ID:        0123456789ab\n"), "{text}");
        assert!(text.contains("State:     running\n"), "{text}");
        assert!(text.contains("Labels:    a=1, b=2\n"), "{text}");
        assert!(text.contains("Expires:   in 2m5s\n"), "{text}");
        assert!(!text.contains("Ended"), "{text}");

        let ended = serde_json::json!({
            "id": "0123456789ab", "state": "stopped", "labels": {},
            "created_at": now, "expires_at": now, "ended_at": now, "exit_code": 137,
            "end": {"cause": "timeout", "message": "its timeout passed"},
        });
        let text = summary(&ended, now);
        assert!(text.contains("Why:       its timeout passed\n"), "{text}");
        assert!(text.contains("Labels:    -\n"), "{text}");
        assert!(text.contains("Exit code: 137\n"), "{text}");
        assert!(
            !text.contains("Expires"),
            "an ended sandbox does not expire: {text}"
        );
    }
}
