//! `brig logs ID [-f] [--tail N] [--pid PID]`: what a sandbox's background
//! processes printed (`brig exec -d`, the API's background processes, E2B
//! `background=True` commands), as `docker logs` shows a container's: its
//! stdout on stdout, its stderr on stderr.
//!
//! The sandbox's agent keeps the last 1 MiB of that output for the whole
//! sandbox; reading it takes nothing away, so `brig logs` can be run again.
//! `-f` follows until interrupted or the sandbox ends. The log lives in the
//! sandbox: an ended sandbox has none.

use std::io::{BufRead, Write};

use anyhow::bail;
use base64::Engine as _;

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
    /// Keep following: print output as it comes until interrupted.
    #[arg(short, long)]
    follow: bool,
    /// Start this many lines before the end.
    #[arg(short = 'n', long, value_name = "N")]
    tail: Option<u32>,
    /// Only this background process's output (its pid in the sandbox).
    #[arg(long, value_name = "PID", value_parser = clap::value_parser!(i32).range(1..))]
    pid: Option<i32>,
}

pub fn run(args: LogsArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let id = client.resolve(&args.id)?;
    let mut req = client
        .request("GET", &format!("/v1/sandboxes/{id}/logs"))
        .query("follow", if args.follow { "true" } else { "false" });
    if let Some(n) = args.tail {
        req = req.query("tail", &n.to_string());
    }
    if let Some(pid) = args.pid {
        req = req.query("pid", &pid.to_string());
    }
    // A follow can be quiet for hours: no read timeout.
    let resp = client.send(req, None)?;
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    for line in std::io::BufReader::new(resp.into_reader()).lines() {
        let event: serde_json::Value = serde_json::from_str(&line?)?;
        let data = || {
            base64::engine::general_purpose::STANDARD
                .decode(event["data"].as_str().unwrap_or_default())
        };
        match event["type"].as_str() {
            Some("stdout") => {
                out.write_all(&data()?)?;
                out.flush()?;
            }
            Some("stderr") => {
                err.write_all(&data()?)?;
                err.flush()?;
            }
            Some("logging") => {
                if let Some(n) = event["dropped"].as_u64().filter(|n| *n > 0) {
                    if args.tail.is_none() {
                        eprintln!(
                            "brig: {n} earlier bytes are gone (a sandbox keeps its last 1 MiB \
                             of output)"
                        );
                    }
                }
            }
            Some("skipped") => eprintln!(
                "brig: {} bytes of output were lost here (they came faster than they were read)",
                event["bytes"]
            ),
            Some("error") => {
                let message = event["message"].as_str().unwrap_or("the log stream broke");
                match event["sandbox_end"]["cause"].as_str() {
                    // Following a sandbox to its end is a normal way to stop.
                    Some(_) if args.follow => {
                        eprintln!("brig: {message}");
                        return Ok(0);
                    }
                    _ => bail!("{message}"),
                }
            }
            _ => {}
        }
    }
    Ok(0)
}
