//! `brig exec ID -- CMD...`: run a command in a sandbox on the daemon,
//! stream its output, and exit with its status (128+N for signal N).

use std::io::{BufRead, BufReader, Write};

use anyhow::Context;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::{json, Value};

use super::client::{pairs, Client, RemoteError};
use crate::exit;

#[derive(Debug, clap::Args)]
#[command(trailing_var_arg = true)]
pub struct ExecArgs {
    /// The sandbox's id.
    id: String,
    /// Set an environment variable (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, short = 'w', value_name = "DIR")]
    workdir: Option<String>,
    /// The command and its arguments (after `--`).
    #[arg(value_name = "CMD", required = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

pub fn run(args: ExecArgs) -> anyhow::Result<i32> {
    let body = json!({
        "argv": args.command,
        "env": pairs("env", &args.env)?,
        "cwd": args.workdir,
    });
    let client = Client::from_env()?;
    let sent = client.send(
        client.request("POST", &format!("/v1/sandboxes/{}/exec", args.id)),
        Some(&body),
    );
    let resp = match sent {
        // As `brig run`: a command that does not exist is 127.
        Err(e)
            if e.downcast_ref::<RemoteError>()
                .is_some_and(|r| r.code == "command_not_found") =>
        {
            eprintln!("brig: {e:#}");
            return Ok(exit::NOT_FOUND);
        }
        other => other?,
    };
    let (mut out, mut err) = (std::io::stdout().lock(), std::io::stderr().lock());
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.context("the daemon's output stream broke")?;
        let event: Value = serde_json::from_str(&line)
            .with_context(|| format!("the daemon sent a line that is not JSON: {line:?}"))?;
        let data = || BASE64.decode(event["data"].as_str().unwrap_or_default());
        match event["type"].as_str() {
            Some("stdout") => {
                out.write_all(&data().context("bad stdout data")?)?;
                out.flush()?;
            }
            Some("stderr") => {
                err.write_all(&data().context("bad stderr data")?)?;
                err.flush()?;
            }
            Some("exited") => {
                return Ok(match (event["code"].as_i64(), event["signal"].as_i64()) {
                    (Some(code), _) => code as i32,
                    (None, Some(sig)) => 128 + sig as i32,
                    (None, None) => exit::START_FAILED,
                });
            }
            Some("error") => {
                anyhow::bail!(
                    "{}",
                    event["message"]
                        .as_str()
                        .unwrap_or("the process stream failed")
                )
            }
            _ => {}
        }
    }
    anyhow::bail!("the daemon ended the output stream before the command exited")
}
