//! `brig kill ID`: end a sandbox on the daemon; returns once it is gone.

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct KillArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
}

pub fn run(args: KillArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let id = client.resolve(&args.id)?;
    client.json("DELETE", &format!("/v1/sandboxes/{id}"), None)?;
    Ok(0)
}
