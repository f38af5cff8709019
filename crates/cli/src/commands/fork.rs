//! `brig fork ID [-n N]`: N new sandboxes from a sandbox's files as they
//! are now, with its limits, environment, labels and network policy; the
//! sandbox runs on. Prints each fork's id (or why it could not start).

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
    /// How many (1 to 100).
    #[arg(short = 'n', long = "count", default_value_t = 1)]
    count: u32,
    /// Each fork's timeout, e.g. 30s, 10m, 1h [default: the daemon's].
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
}

pub fn run(args: ForkArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let id = client.resolve(&args.id)?;
    let mut body = serde_json::json!({ "count": args.count });
    if let Some(t) = args.timeout {
        body["timeout"] = t.into();
    }
    let results = client.json("POST", &format!("/v1/sandboxes/{id}/fork"), Some(&body))?;
    let mut failed = 0;
    for r in results.as_array().into_iter().flatten() {
        match r["sandbox"]["id"].as_str() {
            Some(fork) => println!("{fork}"),
            None => {
                failed += 1;
                eprintln!(
                    "brig: a fork could not start: {}",
                    r["error"]["message"].as_str().unwrap_or("unknown error")
                );
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}
