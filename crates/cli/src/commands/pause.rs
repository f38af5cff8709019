//! `brig pause ID`: freeze every process of a sandbox on the daemon. Its
//! memory and files stay; its timeout keeps running.

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct PauseArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
}

pub fn run(args: PauseArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let id = client.resolve(&args.id)?;
    client.send(
        client.request("POST", &format!("/v1/sandboxes/{id}/pause")),
        None,
    )?;
    Ok(0)
}
