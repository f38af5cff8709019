//! `brig create`: a new sandbox on the daemon; prints its id.

use serde_json::{json, Value};

use super::client::{env_pairs, pairs, Client};

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// Root filesystem: `host`, `dir:PATH`, a named template, an image,
    /// or one of your snapshots.
    #[arg(long, value_name = "NAME|dir:PATH")]
    template: Option<String>,
    /// Start from one of your snapshots (its id or name): its files over
    /// its template.
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "template")]
    from_snapshot: Option<String>,
    /// Isolation tier: process (the default), gvisor (gVisor's
    /// application kernel, where the daemon has runsc) or vm (a QEMU
    /// virtual machine with its own kernel, on the same network policy;
    /// `--network none`: no network device). `brig doctor` says which
    /// this host offers.
    #[arg(long, value_name = "TIER", value_parser = parse_isolation)]
    isolation: Option<brig_core::Isolation>,
    /// How long the sandbox lives (default 5m), e.g. 30s, 10m, 1h.
    #[arg(long, value_name = "DURATION")]
    timeout: Option<String>,
    /// Memory limit, e.g. 512M.
    #[arg(long, value_name = "SIZE")]
    memory: Option<String>,
    /// CPU quota in cores.
    #[arg(long, value_name = "N")]
    cpus: Option<f64>,
    /// Most processes and threads alive at once.
    #[arg(long, value_name = "N")]
    pids: Option<u32>,
    /// Size of the writable layer (and separately of /tmp), e.g. 2G.
    #[arg(long, value_name = "SIZE")]
    disk: Option<String>,
    /// Environment of every process in the sandbox (repeatable); `-e KEY`
    /// passes KEY's value here through.
    #[arg(long = "env", short = 'e', value_name = "KEY[=VALUE]")]
    env: Vec<String>,
    /// Read environment variables from a file of KEY=VALUE lines.
    #[arg(long = "env-file", value_name = "FILE")]
    env_file: Vec<std::path::PathBuf>,
    /// A name to use instead of the id in other commands (unique among
    /// your sandboxes until `brig rm`).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// A label to find the sandbox by (repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    label: Vec<String>,
    #[command(flatten)]
    network: super::net::NetworkFlags,
    /// Publish the sandbox's PORT on the host's 127.0.0.1:HOSTPORT
    /// (repeatable; PORT alone: any free host port, printed on stderr).
    #[arg(long = "publish", short = 'p', value_name = "[HOSTPORT:]PORT")]
    publish: Vec<String>,
    /// A secret of this sandbox alone for --inject's ${secrets.NAME}
    /// (repeatable): NAME=VALUE, or NAME to take the value of $NAME here
    /// (kept out of `ps`); before the tenant's secret of the same name. The
    /// sandbox never sees it.
    #[arg(long = "secret", value_name = "NAME[=VALUE]")]
    secret: Vec<String>,
    /// Mount one of your volumes (`brig volume create`) at PATH inside
    /// (repeatable): VOLUME is its name or id, PATH absolute, such as
    /// /mnt/data. Process tier only.
    #[arg(long = "volume", short = 'v', value_name = "VOLUME:PATH", value_parser = parse_volume)]
    volume: Vec<(String, String)>,
    /// Let anyone reach its ports by host name
    /// (http://PORT-ID.localhost:7777/) without its traffic token.
    #[arg(long)]
    public_ports: bool,
    /// Print the whole sandbox as JSON instead of its id.
    #[arg(long)]
    json: bool,
}

/// `--volume VOLUME:PATH`, its path checked before anything is sent.
pub(crate) fn parse_volume(s: &str) -> Result<(String, String), String> {
    let (volume, path) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected VOLUME:PATH, such as data:/mnt/data"))?;
    brig_core::volume::check_path(path).map_err(|e| e.to_string())?;
    Ok((volume.to_string(), path.to_string()))
}

/// `--isolation`, checked before anything is sent.
pub(crate) fn parse_isolation(s: &str) -> Result<brig_core::Isolation, String> {
    s.parse()
        .map_err(|e: brig_core::UnknownIsolation| e.to_string())
}

impl CreateArgs {
    /// Stage two: the request body.
    fn into_body(self) -> anyhow::Result<Value> {
        let mut body = json!({
            "env": env_pairs(&self.env, &self.env_file)?,
            "labels": pairs("label", &self.label)?,
        });
        let fields = [
            ("name", self.name.map(Value::from)),
            ("template", self.template.map(Value::from)),
            ("isolation", self.isolation.map(|i| Value::from(i.as_str()))),
            ("timeout", self.timeout.map(Value::from)),
            ("memory", self.memory.map(Value::from)),
            ("cpus", self.cpus.map(Value::from)),
            ("pids", self.pids.map(Value::from)),
            ("disk", self.disk.map(Value::from)),
        ];
        for (k, v) in fields {
            if let Some(v) = v {
                body[k] = v;
            }
        }
        if let Some(network) = self.network.body()? {
            body["network"] = network;
        }
        for spec in &self.publish {
            // Checked here too, to say so before anything is sent.
            brig_net::publish::parse(spec).map_err(anyhow::Error::msg)?;
        }
        if !self.publish.is_empty() {
            body["publish"] = json!(self.publish);
        }
        if !self.volume.is_empty() {
            brig_core::volume::check_paths(self.volume.iter().map(|(_, p)| p.as_str()))?;
            body["volumes"] = self
                .volume
                .iter()
                .map(|(volume, path)| json!({ "volume": volume, "path": path }))
                .collect();
        }
        if self.public_ports {
            body["public_ports"] = json!(true);
        }
        let secrets = super::net::secret_flags(&self.secret)?;
        if !secrets.is_empty() {
            body["secrets"] = json!(secrets);
        }
        Ok(body)
    }
}

pub fn run(args: CreateArgs) -> anyhow::Result<i32> {
    let as_json = args.json;
    let client = Client::from_env()?;
    // A snapshot by id or name, checked to be one (a template of that
    // name is not what was asked for).
    let snapshot = match &args.from_snapshot {
        Some(s) => Some(client.json("GET", &format!("/v1/snapshots/{s}"), None)?["id"].clone()),
        None => None,
    };
    let mut body = args.into_body()?;
    if let Some(id) = snapshot {
        body["template"] = id;
    }
    let sandbox = client.json("POST", "/v1/sandboxes", Some(&body))?;
    for p in published(&sandbox) {
        eprintln!("brig: {p} of the sandbox");
    }
    if as_json {
        println!("{sandbox}");
    } else {
        println!("{}", sandbox["id"].as_str().unwrap_or_default());
    }
    Ok(0)
}

/// "127.0.0.1:HOSTPORT -> port PORT" for each published port of a sandbox
/// as the API shows it.
pub fn published(sandbox: &Value) -> Vec<String> {
    sandbox["ports"]["published"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|p| format!("127.0.0.1:{} -> port {}", p["host_port"], p["port"]))
                .collect()
        })
        .unwrap_or_default()
}
