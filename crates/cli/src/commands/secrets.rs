//! `brig secrets set|ls|rm`: a tenant's write-only secrets. `set` reads the
//! value from standard input (typed without echo at a terminal, or piped),
//! never from the command line, where `ps` and shell history would keep it.

use std::io::Read;

use anyhow::Context;
use serde_json::Value;

use super::client::{ago, Client};
use crate::tty::NoEcho;

#[derive(Debug, clap::Args)]
pub struct SecretsArgs {
    #[command(subcommand)]
    command: SecretsCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SecretsCommand {
    /// Set a secret (a new one, or the next version): the value is read from
    /// standard input (`echo -n "$TOKEN" | brig secrets set openai`), or
    /// typed at the prompt without echo.
    Set {
        /// Letters, digits, '_' or '-' (kept lower-cased).
        name: String,
        /// Read the value from this file instead (its bytes as they are).
        #[arg(long, value_name = "FILE")]
        from_file: Option<std::path::PathBuf>,
    },
    /// List the secrets (names, versions, when set; never values).
    Ls {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove secrets.
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

pub fn run(args: SecretsArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    match args.command {
        SecretsCommand::Set { name, from_file } => {
            let value = match from_file {
                Some(path) => std::fs::read_to_string(&path)
                    .with_context(|| format!("cannot read --from-file {}", path.display()))?,
                None => read_value(&name)?,
            };
            if value.is_empty() {
                anyhow::bail!(
                    "no value given for secret {name}: pipe it in, or type it at the prompt"
                );
            }
            let got = client.json(
                "PUT",
                &format!("/v1/secrets/{name}"),
                Some(&serde_json::json!({ "value": value })),
            )?;
            eprintln!(
                "brig: secret {} is at version {}",
                got["name"].as_str().unwrap_or(&name),
                got["version"]
            );
        }
        SecretsCommand::Ls { json } => {
            let mut items = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let path = match &after {
                    Some(a) => format!("/v1/secrets?limit=1000&after={a}"),
                    None => "/v1/secrets?limit=1000".to_string(),
                };
                let page = client.json("GET", &path, None)?;
                items.extend(page["items"].as_array().cloned().unwrap_or_default());
                match page["next"].as_str() {
                    Some(n) => after = Some(n.to_string()),
                    None => break,
                }
            }
            if json {
                println!("{}", Value::Array(items));
                return Ok(0);
            }
            println!("{:<32}  {:>7}  UPDATED", "NAME", "VERSION");
            for s in &items {
                println!(
                    "{:<32}  {:>7}  {}",
                    s["name"].as_str().unwrap_or("?"),
                    s["version"],
                    s["updated_at"].as_i64().map_or("-".into(), ago),
                );
            }
        }
        SecretsCommand::Rm { names } => {
            for name in names {
                client.send(
                    client.request("DELETE", &format!("/v1/secrets/{name}")),
                    None,
                )?;
            }
        }
    }
    Ok(0)
}

/// The value from standard input: a line typed without echo at a terminal,
/// or everything piped in (one trailing newline dropped, as `echo` adds).
fn read_value(name: &str) -> anyhow::Result<String> {
    if let Some(_quiet) = NoEcho::enter(0) {
        eprint!("value for {name}: ");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        eprintln!();
        return Ok(line.trim_end_matches(['\n', '\r']).to_string());
    }
    let mut value = String::new();
    std::io::stdin()
        .read_to_string(&mut value)
        .context("cannot read the secret's value from standard input (it must be UTF-8 text)")?;
    if value.ends_with('\n') {
        value.pop();
        if value.ends_with('\r') {
            value.pop();
        }
    }
    Ok(value)
}
