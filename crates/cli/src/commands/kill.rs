//! `brig kill ID`: end a sandbox on the daemon; returns once it is gone.

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct KillArgs {
    /// The sandbox's id.
    id: String,
}

pub fn run(args: KillArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    client.json("DELETE", &format!("/v1/sandboxes/{}", args.id), None)?;
    Ok(0)
}
