//! `brig rm ID...`: forget ended sandboxes (their records leave `ls -a`);
//! `-f` ends live ones first, as `docker rm -f`.

use super::client::{Client, RemoteError};

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    /// Sandboxes: ids, names or unique starts of ids.
    #[arg(required = true)]
    ids: Vec<String>,
    /// End a live sandbox first instead of refusing.
    #[arg(short, long)]
    force: bool,
}

pub fn run(args: RmArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let mut failed = 0;
    for given in &args.ids {
        let done = client.resolve(given).and_then(|id| {
            if args.force {
                client.json("DELETE", &format!("/v1/sandboxes/{id}"), None)?;
            }
            client.send(
                client.request("DELETE", &format!("/v1/sandboxes/{id}?remove=true")),
                None,
            )?;
            println!("{id}");
            Ok(())
        });
        if let Err(e) = done {
            let hint = match e.downcast_ref::<RemoteError>() {
                Some(r) if r.code == "conflict" => "; `brig rm -f` ends it first",
                _ => "",
            };
            eprintln!("brig: {given}: {e:#}{hint}");
            failed += 1;
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}
