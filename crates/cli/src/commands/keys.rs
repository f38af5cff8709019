//! `brig keys create|ls|revoke`: the API keys of this key's tenant.
//!
//! `create` prints the new key once — the daemon keeps only its hash, so it
//! can never be shown again. `revoke` refuses (409 from the daemon) to
//! revoke the tenant's last active key.

use serde_json::{json, Value};

use super::client::{ago, Client};

#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    command: KeysCommand,
}

#[derive(Debug, clap::Subcommand)]
enum KeysCommand {
    /// Create a key and print it; it is shown this once only.
    Create {
        /// A label to recognise the key by in `brig keys ls`.
        #[arg(long)]
        name: Option<String>,
        /// Print `{"id": …, "key": …, …}` instead of the bare key.
        #[arg(long)]
        json: bool,
    },
    /// List the tenant's active keys (ids and names, never secrets).
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key: every request with it is refused from then on.
    Revoke {
        /// The key's id (the 12 hex digits after `brig_`, as `ls` shows).
        id: String,
    },
}

pub fn run(args: KeysArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    match args.command {
        KeysCommand::Create { name, json } => {
            let body = name.map(|n| json!({ "name": n }));
            let created = client.json("POST", "/v1/keys", body.as_ref())?;
            if json {
                println!("{created}");
            } else {
                println!("{}", created["key"].as_str().unwrap_or_default());
                eprintln!(
                    "brig: created api key {}; store it now, it is not shown again",
                    created["id"].as_str().unwrap_or_default()
                );
            }
        }
        KeysCommand::Ls { json } => {
            let list = client.json("GET", "/v1/keys", None)?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            if json {
                println!("{}", Value::Array(items));
                return Ok(0);
            }
            println!("{:<12}  {:<24}  {:<12}  LAST_USED", "ID", "NAME", "CREATED");
            for k in &items {
                println!(
                    "{:<12}  {:<24}  {:<12}  {}",
                    k["id"].as_str().unwrap_or("?"),
                    k["name"].as_str().unwrap_or("-"),
                    k["created_at"].as_i64().map_or("-".into(), ago),
                    k["last_used_at"].as_i64().map_or("never".into(), ago),
                );
            }
        }
        KeysCommand::Revoke { id } => {
            // The path segment is the user's text: refuse what is not an id
            // rather than send `/` or `?` into the URL.
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
                anyhow::bail!(
                    "invalid key id {id:?}: use the ID column of `brig keys ls` (12 hex digits)"
                );
            }
            client.send(client.request("DELETE", &format!("/v1/keys/{id}")), None)?;
        }
    }
    Ok(0)
}
