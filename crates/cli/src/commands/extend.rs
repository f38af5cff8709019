//! `brig extend ID DURATION`: give a live sandbox DURATION more to live,
//! counted from now (as the API's `POST /timeout`).

use super::client::Client;

#[derive(Debug, clap::Args)]
pub struct ExtendArgs {
    /// The sandbox: its id, its name, or a unique start of its id.
    id: String,
    /// How long it may live from now, e.g. 30m, 2h.
    duration: String,
}

pub fn run(args: ExtendArgs) -> anyhow::Result<i32> {
    // The unit error names the input and the units.
    brig_core::parse_duration(&args.duration)?;
    let client = Client::from_env()?;
    let id = client.resolve(&args.id)?;
    let record = client.json(
        "POST",
        &format!("/v1/sandboxes/{id}/timeout"),
        Some(&serde_json::json!({ "timeout": args.duration })),
    )?;
    let left = record["expires_at"].as_i64().unwrap_or(0) - super::client::now_millis();
    println!("{id} expires in {}", super::client::span(left));
    Ok(0)
}
