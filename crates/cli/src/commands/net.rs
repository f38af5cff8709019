//! `brig net SANDBOX`: show a sandbox's network policy and counters, or
//! replace the policy (`--network`, `--allow`, `--deny`, `--add-host`);
//! `--connections` lists the connections it tried. Also the network flags
//! `brig create` shares.

use serde_json::{json, Value};

use super::client::Client;

/// The network flags of `brig create` and `brig net`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NetworkFlags {
    /// none (loopback only), public (the internet, never the host, private
    /// ranges or cloud metadata) or allow (only what --allow admits)
    /// [default: none; public once --allow, --deny or --add-host is given].
    #[arg(long, value_name = "none|public|allow")]
    pub network: Option<String>,
    /// Admit RULE: domain, *.domain, IP or CIDR, optionally :PORT or
    /// :PORT-PORT (repeatable). With --network allow, only these.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// Refuse RULE, whatever --allow says (repeatable).
    #[arg(long = "deny", value_name = "RULE")]
    pub deny: Vec<String>,
    /// Answer NAME with IP in the sandbox's DNS (repeatable).
    #[arg(long = "add-host", value_name = "NAME:IP")]
    pub add_host: Vec<String>,
}

impl NetworkFlags {
    /// The `network` object of a request, or `None` if no flag was given.
    pub fn body(&self) -> anyhow::Result<Option<Value>> {
        if self.network.is_none()
            && self.allow.is_empty()
            && self.deny.is_empty()
            && self.add_host.is_empty()
        {
            return Ok(None);
        }
        let mut hosts = serde_json::Map::new();
        for h in &self.add_host {
            // NAME:IP, where IP may be IPv6 (split at the first colon).
            let Some((name, ip)) = h.split_once(':') else {
                anyhow::bail!("--add-host {h:?}: expected NAME:IP, e.g. db.internal:192.0.2.7");
            };
            hosts.insert(name.to_string(), Value::from(ip));
        }
        let mut body = json!({ "allow": self.allow, "deny": self.deny, "hosts": hosts });
        if let Some(mode) = &self.network {
            body["mode"] = Value::from(mode.as_str());
        }
        Ok(Some(body))
    }
}

#[derive(Debug, clap::Args)]
pub struct NetArgs {
    /// The sandbox: its id, name or a unique prefix of its id.
    sandbox: String,
    #[command(flatten)]
    flags: NetworkFlags,
    /// List the connections it tried (the last 1000) instead.
    #[arg(long)]
    connections: bool,
}

pub fn run(args: NetArgs) -> anyhow::Result<i32> {
    let client = Client::from_env()?;
    let id = client.resolve(&args.sandbox)?;
    if args.connections {
        let got = client.json(
            "GET",
            &format!("/v1/sandboxes/{id}/network/connections"),
            None,
        )?;
        for c in got["connections"].as_array().into_iter().flatten() {
            let verdict = if c["allowed"] == true {
                "allowed"
            } else {
                "denied "
            };
            let name = c["name"]
                .as_str()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            let why = c["reason"]
                .as_str()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            println!(
                "{verdict} {}{name} out {} in {}{why}",
                c["destination"].as_str().unwrap_or("?"),
                c["bytes_out"],
                c["bytes_in"],
            );
        }
        return Ok(0);
    }
    let info = match args.flags.body()? {
        Some(body) => client.json("PUT", &format!("/v1/sandboxes/{id}/network"), Some(&body))?,
        None => client.json("GET", &format!("/v1/sandboxes/{id}/network"), None)?,
    };
    println!("{}", serde_json::to_string_pretty(&info)?);
    Ok(0)
}
