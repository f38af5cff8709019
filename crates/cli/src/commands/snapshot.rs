//! `brig snapshot create|ls|rm`: a sandbox's files kept, to start new
//! sandboxes from (`brig create --from-snapshot SNAP`). A snapshot keeps
//! what the sandbox wrote, deleted and linked over its template, not its
//! processes; the sandbox is frozen only while its files are copied.

use serde_json::Value;

use super::client::{ago, human_size, Client};

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SnapshotCommand {
    /// Snapshot a sandbox (its files; on gvisor and vm its memory and
    /// processes too); prints the snapshot's id.
    Create {
        /// The sandbox: its id, its name, or a unique start of its id.
        sandbox: String,
        /// A name to find it by (a snapshot of that name is replaced).
        #[arg(long)]
        name: Option<String>,
    },
    /// List your snapshots, newest first.
    Ls {
        /// Only those of this sandbox.
        #[arg(long, value_name = "SANDBOX")]
        sandbox: Option<String>,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove snapshots (by id or name). Sandboxes made from one run on.
    Rm {
        #[arg(required = true)]
        snapshots: Vec<String>,
    },
}

pub fn run(args: SnapshotArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    match args.command {
        SnapshotCommand::Create { sandbox, name } => {
            let id = client.resolve(&sandbox)?;
            let body = match name {
                Some(n) => serde_json::json!({ "name": n }),
                None => serde_json::json!({}),
            };
            let snap = client.json(
                "POST",
                &format!("/v1/sandboxes/{id}/snapshots"),
                Some(&body),
            )?;
            println!("{}", snap["id"].as_str().unwrap_or_default());
        }
        SnapshotCommand::Ls { sandbox, json } => {
            let path = match sandbox {
                Some(s) => format!("/v1/snapshots?sandbox={}", client.resolve(&s)?),
                None => "/v1/snapshots".to_string(),
            };
            let items = client.json("GET", &path, None)?["items"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if json {
                println!("{}", Value::Array(items));
                return Ok(0);
            }
            // KEEPS: what a sandbox made from it starts with (its memory
            // and processes, or only its files).
            println!(
                "{:<25}  {:<20}  {:<12}  {:<20}  {:>10}  {:<6}  CREATED",
                "ID", "NAME", "SANDBOX", "TEMPLATE", "SIZE", "KEEPS"
            );
            for s in &items {
                println!(
                    "{:<25}  {:<20}  {:<12}  {:<20}  {:>10}  {:<6}  {}",
                    s["id"].as_str().unwrap_or("?"),
                    s["name"].as_str().unwrap_or("-"),
                    s["sandbox_id"].as_str().unwrap_or("?"),
                    s["template"].as_str().unwrap_or("?"),
                    human_size(s["size_bytes"].as_u64().unwrap_or(0)),
                    if s["memory"].as_bool() == Some(true) {
                        "memory"
                    } else {
                        "files"
                    },
                    s["created_at"].as_i64().map_or("-".into(), ago),
                );
            }
        }
        SnapshotCommand::Rm { snapshots } => {
            for s in snapshots {
                client.send(
                    client.request("DELETE", &format!("/v1/snapshots/{s}")),
                    None,
                )?;
            }
        }
    }
    Ok(0)
}
