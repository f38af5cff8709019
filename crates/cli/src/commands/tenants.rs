//! `brig tenants create|ls|rm`: who owns keys and sandboxes (admin keys
//! only). `create` prints the new tenant's first key, once.

use serde_json::Value;

use super::client::{ago, Client};

#[derive(Debug, clap::Args)]
pub struct TenantsArgs {
    #[command(subcommand)]
    command: TenantsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum TenantsCommand {
    /// Create a tenant and print its first key (shown this once only).
    Create {
        /// Lowercase letters, digits, '-', '_' or '.'.
        name: String,
        /// Print `{"id", "name", "key": {"id", "key"}, …}` instead.
        #[arg(long)]
        json: bool,
    },
    /// List the tenants.
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove a tenant: its keys stop working; refused while it has live
    /// sandboxes.
    Rm { name: String },
}

pub fn run(args: TenantsArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let named = |name: &str| -> anyhow::Result<()> {
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            anyhow::bail!(
                "invalid tenant name {name:?}: use lowercase letters, digits, '-', '_' or '.'"
            );
        }
        Ok(())
    };
    match args.command {
        TenantsCommand::Create { name, json } => {
            named(&name)?;
            let created = client.json(
                "POST",
                "/v1/tenants",
                Some(&serde_json::json!({ "name": name })),
            )?;
            if json {
                println!("{created}");
            } else {
                println!("{}", created["key"]["key"].as_str().unwrap_or_default());
                eprintln!(
                    "brig: created tenant {name} and its first key {}; store it now, it is not \
                     shown again",
                    created["key"]["id"].as_str().unwrap_or_default()
                );
            }
        }
        TenantsCommand::Ls { json } => {
            let list = client.json("GET", "/v1/tenants", None)?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            if json {
                println!("{}", Value::Array(items));
                return Ok(0);
            }
            println!("{:<12}  {:<24}  CREATED", "ID", "NAME");
            for t in &items {
                println!(
                    "{:<12}  {:<24}  {}",
                    t["id"].as_str().unwrap_or("?"),
                    t["name"].as_str().unwrap_or("?"),
                    t["created_at"].as_i64().map_or("-".into(), ago),
                );
            }
        }
        TenantsCommand::Rm { name } => {
            named(&name)?;
            client.send(
                client.request("DELETE", &format!("/v1/tenants/{name}")),
                None,
            )?;
        }
    }
    Ok(0)
}
