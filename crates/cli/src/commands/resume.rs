//! `brig resume ID [--timeout D]`: thaw a paused sandbox on the daemon,
//! optionally giving it a new time to live from now.

use serde_json::json;

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct ResumeArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
    /// A new time to live from now, e.g. 30s, 10m, 1h.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
}

pub fn run(args: ResumeArgs) -> anyhow::Result<i32> {
    // Always a JSON object (perhaps empty), so the daemon sees one body
    // shape whether or not a timeout was given.
    let body = match args.timeout {
        Some(t) => json!({ "timeout": t }),
        None => json!({}),
    };
    let client = Client::from_env()?;
    let id = client.resolve(&args.id)?;
    client.send(
        client.request("POST", &format!("/v1/sandboxes/{id}/resume")),
        Some(&body),
    )?;
    Ok(0)
}
