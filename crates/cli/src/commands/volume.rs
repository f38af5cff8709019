//! `brig volume create|ls|rm`: persistent volumes, mounted into sandboxes
//! with `brig create --volume NAME:/path`. A volume's size is its quota
//! (a write past it fails with "no space left on device"); its files
//! outlive every sandbox until `brig volume rm`.

use serde_json::{json, Value};

use super::client::{ago, human_size, Client};

#[derive(Debug, clap::Args)]
pub struct VolumeArgs {
    #[command(subcommand)]
    command: VolumeCommand,
}

#[derive(Debug, clap::Subcommand)]
enum VolumeCommand {
    /// Create a volume; prints its id.
    Create {
        /// 1 to 64 letters, digits, '_' or '-', unique among yours.
        name: String,
        /// Its size, which is its quota, e.g. 512MiB or 2GiB (default: the
        /// daemon's, 1 GiB unless `brig serve --volume-size` says so).
        #[arg(long, value_name = "SIZE")]
        size: Option<String>,
    },
    /// List your volumes, oldest first.
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove volumes (by name or id) and their files. Refused while a
    /// sandbox mounts one.
    Rm {
        #[arg(required = true)]
        volumes: Vec<String>,
    },
}

pub fn run(args: VolumeArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    match args.command {
        VolumeCommand::Create { name, size } => {
            if let Some(size) = &size {
                brig_core::parse_size(size)
                    .map_err(|e| anyhow::anyhow!("invalid --size {size:?}: {e}"))?;
            }
            let mut body = json!({ "name": name });
            if let Some(size) = size {
                body["size"] = json!(size);
            }
            let volume = client.json("POST", "/v1/volumes", Some(&body))?;
            println!("{}", volume["id"].as_str().unwrap_or_default());
        }
        VolumeCommand::Ls { json } => {
            let items = client.json("GET", "/v1/volumes", None)?["items"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if json {
                println!("{}", Value::Array(items));
                return Ok(0);
            }
            // FOR: which sandboxes may mount it (a vm guest's kernel has
            // had a `vm` one: the host never mounts it again).
            println!(
                "{:<24}  {:<24}  {:>8}  {:<4}  CREATED",
                "ID", "NAME", "SIZE", "FOR"
            );
            for v in &items {
                println!(
                    "{:<24}  {:<24}  {:>8}  {:<4}  {}",
                    v["id"].as_str().unwrap_or("?"),
                    v["name"].as_str().unwrap_or("?"),
                    human_size(v["size_bytes"].as_u64().unwrap_or(0)),
                    if v["vm_only"].as_bool() == Some(true) {
                        "vm"
                    } else {
                        "all"
                    },
                    v["created_at"].as_i64().map_or("-".into(), ago),
                );
            }
        }
        VolumeCommand::Rm { volumes } => {
            for v in volumes {
                client.send(client.request("DELETE", &format!("/v1/volumes/{v}")), None)?;
            }
        }
    }
    Ok(0)
}
