//! `brig net SANDBOX`: show a sandbox's network policy and counters, or
//! replace the policy (`--network`, `--allow`, `--deny`, `--add-host`);
//! `--connections` lists the connections it tried. Also the network flags
//! `brig create` and `brig run` share, and `brig run`'s own gateway
//! ([`OwnNetwork`]).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use serde_json::{json, Value};

use super::client::Client;

/// The network flags of `brig create` and `brig net`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NetworkFlags {
    /// none (loopback only), public (the internet, never the host, private
    /// ranges or cloud metadata) or allow (only what --allow admits)
    /// [default: public].
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
    /// On HTTP(S) requests to HOST (a domain or *.domain) set HEADER to
    /// VALUE, where ${secrets.NAME} is the secret NAME (`brig secrets set`;
    /// for `brig run`, `--secret`): the sandbox never sees it (repeatable).
    #[arg(long = "inject", value_name = "HOST:HEADER=VALUE")]
    pub inject: Vec<String>,
    /// Send every allowed connection through this SOCKS5 proxy, never
    /// around it (DNS is still brig's).
    #[arg(long = "egress-proxy", value_name = "socks5://[USER:PASS@]HOST:PORT")]
    pub egress_proxy: Option<String>,
}

impl NetworkFlags {
    /// Whether any network flag was given.
    pub fn given(&self) -> bool {
        self.network.is_some()
            || !self.allow.is_empty()
            || !self.deny.is_empty()
            || !self.add_host.is_empty()
            || !self.inject.is_empty()
            || self.egress_proxy.is_some()
    }

    /// The `network` object of a request, or `None` if no flag was given.
    pub fn body(&self) -> anyhow::Result<Option<Value>> {
        if !self.given() {
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
        let inject = self
            .inject
            .iter()
            .map(|spec| {
                let i = brig_net::policy::Injection::parse(spec)?;
                Ok(json!({"host": i.host.to_string(), "header": i.header, "value": i.value}))
            })
            .collect::<anyhow::Result<Vec<Value>>>()?;
        let mut body = json!({
            "allow": self.allow, "deny": self.deny, "hosts": hosts, "inject": inject,
        });
        if let Some(url) = &self.egress_proxy {
            let p = brig_net::policy::EgressProxy::parse_url(url)
                .map_err(|e| anyhow::anyhow!("--egress-proxy {e}"))?;
            body["egress_proxy"] =
                json!({"address": p.address, "username": p.username, "password": p.password});
        }
        if let Some(mode) = &self.network {
            body["mode"] = Value::from(mode.as_str());
        }
        Ok(Some(body))
    }

    /// The policy these flags give, checked: for `brig run`, which applies
    /// it itself.
    pub fn policy(&self) -> anyhow::Result<brig_net::Policy> {
        let mode = match &self.network {
            Some(m) => m.parse().context("--network")?,
            None => brig_net::Mode::Public,
        };
        let rules = |list: &[String], flag: &str| {
            list.iter()
                .map(|r| {
                    r.parse::<brig_net::Rule>()
                        .with_context(|| format!("{flag} {r:?}"))
                })
                .collect::<anyhow::Result<Vec<_>>>()
        };
        let mut hosts = Vec::new();
        for h in &self.add_host {
            let parsed = h
                .split_once(':')
                .and_then(|(name, ip)| Some((name.to_string(), ip.parse().ok()?)));
            let Some(entry) = parsed else {
                anyhow::bail!("--add-host {h:?}: expected NAME:IP, e.g. db.internal:192.0.2.7");
            };
            hosts.push(entry);
        }
        let egress_proxy = self
            .egress_proxy
            .as_deref()
            .map(brig_net::policy::EgressProxy::parse_url)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--egress-proxy {e}"))?;
        let inject = self
            .inject
            .iter()
            .map(|spec| brig_net::policy::Injection::parse(spec).map_err(anyhow::Error::from))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let policy = brig_net::Policy {
            mode,
            allow: rules(&self.allow, "--allow")?,
            deny: rules(&self.deny, "--deny")?,
            hosts,
            inject,
            egress_proxy,
            ..brig_net::Policy::default()
        };
        policy.validate()?;
        Ok(policy)
    }
}

/// `--secret NAME=VALUE` / `--secret NAME` (the value of $NAME here, kept
/// out of `ps`), by lower-cased name, each checked as the store checks
/// secrets.
pub fn secret_flags(
    given: &[String],
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    let mut secrets = std::collections::BTreeMap::new();
    for g in given {
        let (name, value) = match g.split_once('=') {
            Some((n, v)) => (n, v.to_string()),
            None => (
                g.as_str(),
                std::env::var(g).map_err(|_| {
                    anyhow::anyhow!(
                        "--secret {g}: ${g} is not set here (give --secret {g}=VALUE, or export {g})"
                    )
                })?,
            ),
        };
        secrets.insert(name.to_string(), value);
    }
    brig_runtime::secrets::check_own(&secrets).map_err(|e| anyhow::anyhow!("--secret: {e}"))
}

/// `--dns-upstream`'s value: IP or IP:PORT (port 53 if none).
pub fn parse_upstream(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| {
            s.parse::<std::net::IpAddr>()
                .map(|ip| SocketAddr::new(ip, 53))
        })
        .map_err(|_| format!("{s:?} is not IP or IP:PORT"))
}

/// The network of one `brig run` sandbox: a gateway private to this
/// process (no daemon is involved), its proxy and resolver on a runtime
/// thread of their own, and the sandbox's namespace linked to it. Dropped
/// after the sandbox has ended; nothing of it outlives the process.
pub struct OwnNetwork {
    netns: Arc<std::os::fd::OwnedFd>,
    net: Arc<brig_net::gateway::SandboxNet>,
    _gateway: Arc<brig_net::Gateway>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl OwnNetwork {
    pub fn start(
        id: &str,
        policy: brig_net::Policy,
        upstream: Vec<SocketAddr>,
    ) -> anyhow::Result<OwnNetwork> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("brig-net")
            .enable_all()
            .build()
            .context("cannot start the network's runtime")?;
        let upstream = if upstream.is_empty() {
            brig_net::dns::upstream_from_resolv_conf()
        } else {
            upstream
        };
        let gateway = {
            let _in = runtime.enter();
            brig_net::Gateway::start(brig_net::GatewayConfig {
                pin: None,
                upstream_dns: upstream,
                loopback_dns: brig_net::gateway::default_loopback_dns(),
            })?
        };
        let attached = gateway.attach(id, policy)?;
        Ok(OwnNetwork {
            netns: Arc::new(attached.netns),
            net: attached.net,
            _gateway: gateway,
            runtime: Some(runtime),
        })
    }

    /// What the sandbox is started in.
    pub fn attachment(&self) -> brig_core::NetworkAttachment {
        brig_core::NetworkAttachment::Namespace(Arc::clone(&self.netns))
    }

    /// Give its injections `secrets` (`--secret`) and return the files
    /// that make the sandbox trust the CA its TLS is ended with (for the
    /// spec's `run_files`; `brig_net::tls::CA_ENV` points clients at them).
    pub fn trust(
        &self,
        secrets: std::collections::HashMap<String, Vec<u8>>,
    ) -> anyhow::Result<Vec<brig_core::RunFile>> {
        self.net.set_secrets(Arc::new(RunSecrets(secrets)));
        let ca = self
            .net
            .ca()
            .context("cannot make the sandbox's certificate authority")?;
        let pem = ca.pem();
        let file = |path: &str, contents: String| brig_core::RunFile {
            name: path.trim_start_matches("/run/").to_string(),
            contents: contents.into_bytes(),
            mode: 0o644,
        };
        let files = vec![
            file(brig_net::tls::CA_FILE, pem.to_string()),
            file(
                brig_net::tls::CA_BUNDLE,
                format!("{}\n{pem}", brig_net::tls::host_bundle()),
            ),
        ];
        Ok(files)
    }

    /// Relay 127.0.0.1:`host_port` (0: any free port) to `port` on the
    /// sandbox's loopback; the address bound.
    pub fn publish(&self, host_port: u16, port: u16) -> anyhow::Result<SocketAddr> {
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, host_port))
            .with_context(|| format!("cannot publish port {port} on 127.0.0.1:{host_port}"))?;
        let bound = listener.local_addr()?;
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        brig_net::publish::publish(runtime.handle(), Arc::clone(&self.netns), listener, port)
            .with_context(|| format!("cannot publish port {port}"))?;
        Ok(bound)
    }
}

/// `brig run --secret`'s values: the process's own, never stored.
struct RunSecrets(std::collections::HashMap<String, Vec<u8>>);

impl brig_net::inject::SecretSource for RunSecrets {
    fn secret(&self, name: &str) -> Option<Vec<u8>> {
        self.0.get(name).cloned()
    }
}

impl Drop for OwnNetwork {
    fn drop(&mut self) {
        // Its tasks hold connections the sandbox made: end them now.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
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
