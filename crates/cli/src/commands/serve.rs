//! `brig serve`: the daemon. Opens the store under `--home`, reconciles
//! what an earlier daemon left, creates the first API key if there is none
//! (printed once and written to `$BRIG_HOME/local.key` for the local CLI),
//! and serves the front-ends over one runtime (brig-runtime's
//! `SandboxManager`): the native API (brig-api) and, with `--e2b`, E2B's
//! control and data planes (brig-e2b) and, with `--mcp`, the Model Context
//! Protocol at /mcp (brig-mcp), until SIGINT or SIGTERM, then ends
//! its sandboxes — or, with `--keep-sandboxes`, leaves them running for the
//! next daemon on this home to re-adopt (as it does after a crash or a
//! `kill -9`: sandboxes outlive the daemon, see brig-runtime's manager).
//!
//! A panic while serving a request answers that request with a 500 and
//! leaves the daemon and every sandbox running ([`harden`]; the release
//! profile unwinds).

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use brig_api::{app, AppState};
use brig_core::parse_duration;
use brig_e2b::{control_router, data_router, domain_router, E2bState};
use brig_jail::ProcessTier;
use brig_runtime::manager::{ManagerConfig, OnStop, DEFAULT_MAX_TIMEOUT};
use brig_runtime::pool::{self, PoolTarget};
use brig_runtime::{SandboxManager, Store};

use super::client::{home_dir, LOCAL_KEY_FILE};
use crate::exit;

/// A line for the operator on stderr. A daemon whose stderr went away (its
/// terminal closed, the reader of its pipe exited) keeps serving: the line
/// is lost, not the daemon — `eprintln!` panics on a write error, and a
/// panic on the way out skipped ending the sandboxes, leaving them running
/// for a daemon that would never come.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// When the daemon pulls images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PullPolicy {
    Missing,
    Never,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free one; the address chosen
    /// is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:7777", value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// The longest timeout a sandbox may be given.
    #[arg(long, value_name = "DURATION")]
    max_timeout: Option<String>,
    /// The CPU quota, in cores, of a sandbox created without one, so that
    /// no sandbox takes the whole host by default; `none`: unlimited
    /// [default: half the host's CPUs, at least 1].
    #[arg(long, value_name = "N|none")]
    default_cpus: Option<String>,
    /// The size (the quota) of a volume created without one, such as
    /// 512MiB; E2B's creates always get it [default: 1GiB].
    #[arg(long, value_name = "SIZE")]
    volume_size: Option<String>,
    /// Serve the Prometheus metrics at GET /metrics without an API key
    /// (for a scraper on a trusted network).
    #[arg(long)]
    metrics_public: bool,
    /// Keep N sandboxes of TEMPLATE made in advance, so creating one does
    /// not wait for namespaces, mounts and cgroups; TEMPLATE+setuid=N for
    /// sandboxes where setuid binaries (sudo) work, which is what E2B
    /// creates ask for. Repeatable; a flag replaces the defaults of its
    /// template (`host=0`, `base=0` turn them off). A named template's pool
    /// fills once the template is built [default: host=4; with --e2b also
    /// base+setuid=2].
    #[arg(long = "pool", value_name = "TEMPLATE[+setuid]=N", value_parser = PoolTarget::parse)]
    pool: Vec<PoolTarget>,
    /// Let clients use the directories inside DIR as `dir:` templates
    /// (repeatable; `$BRIG_HOME/templates` always is). Any other `dir:`
    /// path is refused, so a key holder cannot mount an arbitrary host
    /// directory into a sandbox.
    #[arg(long = "template-root", value_name = "DIR")]
    template_roots: Vec<PathBuf>,
    /// Whether a create naming an image the store lacks pulls it (and
    /// whether POST /v1/templates/pull works): `missing` (the default), or
    /// `never` (only images an operator pulled or imported with `brig
    /// template`, on this host).
    #[arg(long, value_enum, default_value_t = PullPolicy::Missing, value_name = "WHEN")]
    pull: PullPolicy,
    /// A resolver the sandboxes' DNS questions are forwarded to, for the
    /// names their network policy allows (repeatable) [default: the
    /// nameservers of /etc/resolv.conf].
    #[arg(long = "dns-upstream", value_name = "IP[:PORT]", value_parser = super::net::parse_upstream)]
    dns_upstream: Vec<SocketAddr>,
    /// Also serve E2B's API, so the official E2B SDKs work against brig
    /// (docs/e2b.md): the control plane on --e2b-api, the sandboxes' data
    /// plane on --e2b-sandbox.
    #[arg(long)]
    e2b: bool,
    /// Where --e2b serves E2B's control plane (E2B_API_URL).
    #[arg(long, default_value = "127.0.0.1:3000", value_name = "ADDR:PORT")]
    e2b_api: SocketAddr,
    /// Where --e2b serves the sandboxes' data plane, envd and the code
    /// interpreter (E2B_SANDBOX_URL).
    #[arg(long, default_value = "127.0.0.1:49983", value_name = "ADDR:PORT")]
    e2b_sandbox: SocketAddr,
    /// With --e2b, also serve both E2B planes over HTTPS on DOMAIN, as
    /// E2B's cloud does, so that clients need only E2B_DOMAIN set
    /// (docs/e2b.md): `api.DOMAIN` is the API, `PORT-ID.DOMAIN` a
    /// sandbox's port. The certificate is signed by a CA this home keeps
    /// ($BRIG_HOME/tls/DOMAIN/ca.pem), which can vouch for names under
    /// DOMAIN only: trust it once. The names must resolve to this host:
    /// names under `localhost` do with systemd-resolved or Debian's
    /// libnss-myhostname (`brig doctor` checks). E.g. brig.localhost.
    #[arg(long, value_name = "DOMAIN", requires = "e2b")]
    e2b_domain: Option<String>,
    /// Where --e2b-domain serves HTTPS. Clients reach it on this port:
    /// E2B_DOMAIN is DOMAIN:PORT unless it is 443.
    #[arg(long, default_value = "127.0.0.1:443", value_name = "ADDR:PORT")]
    e2b_https: SocketAddr,
    /// Build these named templates in the background from the start, if
    /// they are not built yet (a first build takes minutes; its progress
    /// goes to the log), so the first client to ask for one does not wait:
    /// meanwhile an E2B create of it answers 503 with the time it has been
    /// building (the clients retry), a native one waits. `none` builds
    /// nothing [default: with --e2b, base,code-interpreter-v1 (what E2B's
    /// clients ask for); else none].
    #[arg(long, value_name = "TEMPLATE,...|none", value_delimiter = ',')]
    prepare: Vec<String>,
    /// Also serve the Model Context Protocol (streamable HTTP) at /mcp on
    /// --listen, authenticated with a brig key like the API (docs/mcp.md).
    #[arg(long)]
    mcp: bool,
    /// The template of an MCP session's default sandbox (what `run_code`
    /// and `run_command` use when given no sandbox).
    #[arg(long, default_value = brig_mcp::DEFAULT_TEMPLATE, value_name = "TEMPLATE")]
    mcp_template: String,
    /// On SIGTERM or SIGINT, leave the sandboxes running (with their
    /// processes, files and timeouts) for the next `brig serve` on this
    /// home to re-adopt, instead of ending them: for restarts and
    /// upgrades. A crash or `kill -9` always leaves them running.
    #[arg(long)]
    keep_sandboxes: bool,
    /// The least severe events the log shows: error, warn, info (one line
    /// per request and per sandbox change), debug or trace. RUST_LOG, when
    /// set, wins (tracing's syntax, e.g. brig=debug,hyper=warn).
    #[arg(long, default_value = "info", value_name = "LEVEL")]
    log_level: String,
    /// Log lines as readable text or as one JSON object per line (for log
    /// shippers). The log goes to stderr.
    #[arg(long, value_enum, default_value_t = crate::log::LogFormat::Text, value_name = "FORMAT")]
    log_format: crate::log::LogFormat,
}

/// E2B's planes: the control plane (E2B_API_URL), the data plane
/// (E2B_SANDBOX_URL), and both over HTTPS on a domain (E2B_DOMAIN).
#[derive(Debug, Clone)]
struct E2bListeners {
    api: SocketAddr,
    sandbox: SocketAddr,
    domain: Option<(String, SocketAddr)>,
}

/// What serving needs, checked before anything starts.
#[derive(Debug)]
struct ServeConfig {
    listen: SocketAddr,
    home: PathBuf,
    manager: ManagerConfig,
    metrics_public: bool,
    /// What --e2b serves where.
    e2b: Option<E2bListeners>,
    on_stop: OnStop,
    dns_upstream: Vec<SocketAddr>,
    /// Named templates to build in the background from the start.
    prepare: Vec<String>,
    /// The default template of MCP sessions, when --mcp is given.
    mcp: Option<String>,
}

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<ServeConfig> {
        let mut manager = ManagerConfig::new();
        manager.pull_images = self.pull == PullPolicy::Missing;
        manager.max_timeout = match &self.max_timeout {
            Some(d) => parse_duration(d).context("--max-timeout")?,
            None => DEFAULT_MAX_TIMEOUT,
        };
        manager.default_timeout = manager.default_timeout.min(manager.max_timeout);
        if let Some(size) = &self.volume_size {
            let bytes = brig_core::parse_size(size)
                .context("--volume-size")?
                .bytes();
            let (min, max) = (
                brig_runtime::volumes::MIN_SIZE,
                brig_runtime::volumes::MAX_SIZE,
            );
            if !(min..=max).contains(&bytes) {
                anyhow::bail!(
                    "invalid --volume-size {size}: a volume is {} to {}",
                    brig_core::ByteSize(min),
                    brig_core::ByteSize(max)
                );
            }
            manager.volume_size = bytes;
        }
        match self.default_cpus.as_deref() {
            None => {}
            Some("none") => manager.default_cpus = None,
            Some(n) => {
                let cpus: f64 = n.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "invalid --default-cpus {n:?}: give a number of cores (0.5, 2) or `none`"
                    )
                })?;
                // The same rule as a sandbox's own --cpus.
                brig_core::Limits {
                    cpus: Some(cpus),
                    ..brig_core::Limits::default()
                }
                .validate()
                .context("--default-cpus")?;
                manager.default_cpus = Some(cpus);
            }
        }
        // The defaults (host=4; with --e2b also base+setuid=2, for E2B's
        // creates) give way to any flag naming their template; a later flag
        // for the same template and setuid replaces an earlier one.
        let mut defaults = std::mem::take(&mut manager.pool);
        if self.e2b {
            defaults.push(pool::e2b_default());
        }
        manager.pool = pool::merge(defaults, self.pool);
        let home = home_dir();
        manager.template_roots = std::iter::once(home.join("templates"))
            .chain(self.template_roots)
            .collect();
        manager.home = Some(home.clone());
        // A pool of a named template is not built here: it fills once the
        // template is built (at once if it is; else after the first create
        // of it built it; see pool.rs), so an unbuilt one delays nothing.
        let prepare = match self.prepare.as_slice() {
            [] if self.e2b => vec!["base".to_string(), "code-interpreter-v1".to_string()],
            [] => Vec::new(),
            [none] if none == "none" => Vec::new(),
            names => {
                for name in names {
                    brig_template::recipe(name).map_err(|_| {
                        anyhow::anyhow!(
                            "--prepare {name}: not a template brig builds (known: {}; or none)",
                            brig_template::known_names()
                        )
                    })?;
                }
                names.to_vec()
            }
        };
        if let Some(domain) = &self.e2b_domain {
            brig_http::tls::check_domain(domain).context("--e2b-domain")?;
        }
        Ok(ServeConfig {
            prepare,
            dns_upstream: self.dns_upstream,
            listen: self.listen,
            home,
            manager,
            metrics_public: self.metrics_public,
            e2b: self.e2b.then_some(E2bListeners {
                api: self.e2b_api,
                sandbox: self.e2b_sandbox,
                domain: self.e2b_domain.map(|d| (d, self.e2b_https)),
            }),
            mcp: self.mcp.then_some(self.mcp_template),
            on_stop: if self.keep_sandboxes {
                OnStop::Keep
            } else {
                OnStop::End
            },
        })
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<i32> {
    crate::log::init(&args.log_level, args.log_format)?;
    let config = args.into_config()?;
    exit::require_root()?;
    std::fs::create_dir_all(&config.home)
        .with_context(|| format!("cannot create the home directory {}", config.home.display()))?;
    // One daemon per home, before anything reads the records: a second one
    // would take the first's live sandboxes for dead ones.
    let claim = HomeClaim::take(&config.home)?;
    let store = Store::open_in(&config.home)?;
    if let Some(key) = store.ensure_initial_key()? {
        let path = config.home.join(LOCAL_KEY_FILE);
        write_key(&path, &key)?;
        say!(
            "brig: created the first api key (shown once; also saved to {} for the local CLI):\n{key}\n\
             brig: the same key for E2B's clients (E2B_API_KEY; brig keys e2b prints it): {}",
            path.display(),
            brig_runtime::e2b_spelling(&key).unwrap_or_default()
        );
    }
    let Started {
        manager,
        runtime,
        pin,
    } = start_runtime(store, config.manager, &config.dns_upstream)?;
    manager.prepare(&config.prepare);
    for (name, _) in manager.preparing() {
        say!(
            "brig: preparing template {name} in the background (a first build takes a few \
             minutes; progress below). E2B creates of it answer 503 until it is ready"
        );
    }
    // E2B's code interpreter restored ready on the tiers that keep warm
    // starts (vm): made once, when its template is built.
    if config.e2b.is_some() {
        for name in config
            .prepare
            .iter()
            .filter(|n| brig_e2b::control::interpreter::wanted(n))
        {
            for tier in brig_e2b::control::interpreter::warm_ahead(&manager, name) {
                say!(
                    "brig: making {name}'s warm start on the {tier} tier in the background (its \
                     kernel ready, checkpointed once; kept in the home). E2B creates of it on \
                     {tier} answer 503 until it is ready"
                );
            }
        }
    }
    let state = AppState::new(Arc::clone(&manager)).with_public_metrics(config.metrics_public);
    let served = runtime.block_on(serve(
        config.listen,
        state,
        config.e2b,
        config.mcp,
        config.on_stop,
        &claim,
    ));
    // Sandboxes end before the runtime goes: their teardown is blocking
    // work that must finish before brig exits.
    manager.stop(config.on_stop);
    runtime.shutdown_timeout(Duration::from_secs(5));
    if config.on_stop == OnStop::End {
        // Every sandbox has ended: nothing is linked to the gateway.
        brig_net::gateway::remove_pin(&pin);
    }
    served?;
    Ok(0)
}

/// A runtime on a home: the async runtime, the manager over the process
/// tier, and the network gateway's pin (to remove once every sandbox has
/// ended). What `brig serve` and `brig mcp`'s embedded runtime share.
pub(crate) struct Started {
    pub manager: Arc<SandboxManager>,
    pub runtime: tokio::runtime::Runtime,
    pub pin: PathBuf,
}

/// Start the runtime on an opened store: the process tier, the network
/// gateway (or none, said in the log), the manager (which re-adopts what
/// an earlier daemon left).
pub(crate) fn start_runtime(
    store: Store,
    mut manager_config: ManagerConfig,
    dns_upstream: &[SocketAddr],
) -> anyhow::Result<Started> {
    // The process tier, run by the agent this binary carries, and tagged
    // with this daemon's database: sandboxes of another home on the same
    // host are none of its business.
    let store_path = store.path().to_path_buf();
    let owner = store_path.display().to_string();
    let tier = ProcessTier::new(crate::agent::path()?, &owner)
        .context("cannot prepare the process tier (see brig doctor)")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    // The network gateway (its proxy and resolver run on the runtime), before
    // the manager re-adopts sandboxes attached to it.
    let pin = gateway_pin(&tier.options().run_dir, &owner);
    let upstream = if dns_upstream.is_empty() {
        brig_net::dns::upstream_from_resolv_conf()
    } else {
        dns_upstream.to_vec()
    };
    if let Some(dir) = pin.parent() {
        brig_net::gateway::reap_orphan_pins(dir);
    }
    match runtime.block_on(async {
        brig_net::Gateway::start(brig_net::GatewayConfig {
            pin: Some(brig_net::Pin {
                path: pin.clone(),
                owner: store_path.clone(),
            }),
            upstream_dns: upstream,
            loopback_dns: brig_net::gateway::default_loopback_dns(),
        })
    }) {
        Ok(gateway) => manager_config.gateway = Some(gateway),
        Err(e) => {
            tracing::warn!("sandboxes get no network from this daemon: {e}");
            manager_config.network_unavailable = Some(e.to_string());
        }
    }
    let mut tiers: Vec<Arc<dyn brig_core::Tier>> = Vec::new();
    // The gvisor tier where this host has runsc (said in the log if not;
    // `brig doctor` says how to get it). Its sandboxes are found again
    // like the process tier's, so it is made before the manager adopts.
    match gvisor_tier(&tier.options().run_dir, &store_path, &owner) {
        Ok(g) => {
            tracing::info!(
                "gvisor tier: runsc on the {} platform",
                g.platform().as_str()
            );
            tiers.push(Arc::new(g));
        }
        Err(e) => tracing::info!("no gvisor tier: {e}"),
    }
    // The vm tier where this host has QEMU. Its first launch fetches the
    // guest kernel from Debian's archive (seconds, once per home).
    match vm_tier(&tier.options().run_dir, &store_path, &owner) {
        Ok(v) => {
            tracing::info!("vm tier: QEMU with {}", v.accel().as_str());
            tiers.push(Arc::new(v));
        }
        Err(e) => tracing::info!("no vm tier: {e}"),
    }
    tiers.insert(0, Arc::new(tier));
    let manager = SandboxManager::start(store, manager_config, tiers)?;
    Ok(Started {
        manager,
        runtime,
        pin,
    })
}

/// The gvisor tier, if this host offers it: runsc on PATH (or
/// `BRIG_RUNSC`), on the platform `BRIG_GVISOR_PLATFORM` names or the best
/// it has; the agent copied into the home (runsc runs binaries from
/// exec-able file systems only).
fn gvisor_tier(
    run_dir: &std::path::Path,
    store_path: &std::path::Path,
    owner: &str,
) -> Result<brig_gvisor::GvisorTier, brig_core::TierError> {
    let runsc = brig_gvisor::find_runsc().ok_or_else(|| brig_core::TierError::Unavailable {
        tier: brig_core::Isolation::Gvisor,
        reason: "runsc is not installed (apt-get install runsc)".into(),
    })?;
    let agent = crate::agent::path().map_err(|e| brig_core::TierError::Unavailable {
        tier: brig_core::Isolation::Gvisor,
        reason: format!("{e:#}"),
    })?;
    brig_gvisor::GvisorTier::new(brig_gvisor::GvisorConfig {
        runsc,
        run_dir: run_dir.to_path_buf(),
        state_dir: store_path
            .parent()
            .unwrap_or(std::path::Path::new("/"))
            .to_path_buf(),
        agent,
        owner: owner.to_string(),
        platform: std::env::var("BRIG_GVISOR_PLATFORM").ok(),
    })
}

/// The vm tier, if this host offers it: QEMU on PATH (or `BRIG_QEMU`),
/// its guest kernel and images in `$BRIG_HOME/vm` (or `BRIG_VM_HOME`, a
/// cache several homes share: the tests').
fn vm_tier(
    run_dir: &std::path::Path,
    store_path: &std::path::Path,
    owner: &str,
) -> Result<brig_vm::VmTier, brig_core::TierError> {
    let unavailable = |reason: String| brig_core::TierError::Unavailable {
        tier: brig_core::Isolation::Vm,
        reason,
    };
    let qemu = brig_vm::find_qemu().ok_or_else(|| {
        unavailable("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)".into())
    })?;
    let agent = crate::agent::path().map_err(|e| unavailable(format!("{e:#}")))?;
    let home = std::env::var_os("BRIG_VM_HOME").map_or_else(
        || {
            store_path
                .parent()
                .unwrap_or(std::path::Path::new("/"))
                .join("vm")
        },
        PathBuf::from,
    );
    brig_vm::VmTier::new(brig_vm::VmConfig {
        qemu,
        run_dir: run_dir.to_path_buf(),
        home,
        agent,
        owner: owner.to_string(),
    })
}

/// Where this daemon's gateway namespace is pinned: one per home (the
/// tier's runtime directory is shared by every daemon of the host).
fn gateway_pin(run_dir: &std::path::Path, owner: &str) -> PathBuf {
    // FNV-1a: a short, stable name for the home's database path.
    let hash = owner.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    run_dir.join("net").join(format!("gw-{hash:016x}"))
}

async fn serve(
    listen: SocketAddr,
    state: AppState,
    e2b: Option<E2bListeners>,
    mcp: Option<String>,
    on_stop: OnStop,
    claim: &HomeClaim,
) -> anyhow::Result<()> {
    // Every listener is bound before any address is printed, so a wrapper
    // that waits for the last line finds all of them ready.
    let (main, addr) = bind(listen).await?;
    claim.listening_on(addr);
    let e2b = match e2b {
        Some(e) => {
            let https = match e.domain {
                Some((domain, addr)) => {
                    let listener = brig_http::listen(addr).with_context(|| {
                        format!(
                            "cannot listen on {addr} for --e2b-domain's HTTPS: choose another \
                             address with --e2b-https (clients then set E2B_DOMAIN=DOMAIN:PORT)"
                        )
                    })?;
                    let addr = listener
                        .local_addr()
                        .context("cannot read the listening address")?;
                    Some((domain, (listener, addr)))
                }
                None => None,
            };
            Some((bind(e.api).await?, bind(e.sandbox).await?, https))
        }
        None => None,
    };
    say!("brig: listening on http://{addr}");
    crate::log::lifecycle(&state.manager);
    // Re-adopted sandboxes get their published host ports back.
    state.publisher.readopt();
    // One signal ends every listener.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    let mut servers = tokio::task::JoinSet::new();
    if let Some(((api, api_addr), (data, data_addr), https)) = e2b {
        let mut e2b_state = E2bState::new(Arc::clone(&state.manager));
        if let Some((domain, (listener, addr))) = https {
            let home = state.manager.config().home.clone().unwrap_or_default();
            let ca = brig_http::tls::LocalCa::open(&home.join("tls"), &domain)
                .context("--e2b-domain: the local certificate authority")?;
            let tls = ca.server_config().context("--e2b-domain")?;
            // What the clients are given: the port is part of it unless
            // it is HTTPS's own.
            let e2b_domain = match addr.port() {
                443 => domain.clone(),
                port => format!("{domain}:{port}"),
            };
            e2b_state = e2b_state.with_domain(&e2b_domain);
            say!(
                "brig: e2b over https on {addr}: E2B_DOMAIN={e2b_domain} (trust the CA {})",
                ca.cert_path().display()
            );
            let router = harden(domain_router(e2b_state.clone(), &domain), "e2b-https");
            let stop = stopped.clone();
            servers.spawn(async move {
                brig_http::tls::serve(listener, tls, router, stop())
                    .await
                    .context("the E2B HTTPS server failed")
            });
        }
        say!("brig: e2b api on http://{api_addr}");
        say!("brig: e2b sandboxes on http://{data_addr}");
        let control = harden(control_router(e2b_state.clone()), "e2b-api");
        let data_plane = harden(data_router(e2b_state), "e2b-sandbox");
        let stop = stopped.clone();
        servers.spawn(async move {
            axum::serve(api, control)
                .with_graceful_shutdown(stop())
                .await
                .context("the E2B API server failed")
        });
        let stop = stopped.clone();
        servers.spawn(async move {
            axum::serve(data, data_plane)
                .with_graceful_shutdown(stop())
                .await
                .context("the E2B sandbox server failed")
        });
    }
    let mut api = app(state.clone());
    if let Some(template) = mcp {
        say!("brig: mcp on http://{addr}{}", brig_mcp::http::PATH);
        let shared = brig_mcp::Shared::new(Arc::clone(&state.manager), template);
        // Before the API's fallback (404 for unknown paths).
        api = brig_mcp::http::router(shared).merge(api);
    }
    let stop = stopped.clone();
    servers.spawn(async move {
        axum::serve(main, harden(api, "api"))
            .with_graceful_shutdown(stop())
            .await
            .context("the HTTP server failed")
    });
    let stop_tx = std::sync::Arc::new(stop_tx);
    {
        let stop_tx = std::sync::Arc::clone(&stop_tx);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop_tx.send(true);
        });
    }
    // A server that fails stops the others (gracefully); all are awaited.
    let mut result = Ok(());
    while let Some(done) = servers.join_next().await {
        let done = done.context("an HTTP server task panicked").and_then(|r| r);
        if done.is_err() {
            let _ = stop_tx.send(true);
            if result.is_ok() {
                result = done;
            }
        }
    }
    match on_stop {
        OnStop::End => say!("brig: shutting down; ending sandboxes"),
        OnStop::Keep => say!("brig: shutting down; leaving sandboxes running"),
    }
    result
}

/// A router whose handlers may panic without taking anything down: the
/// panic is caught, logged, and answered with a 500; the daemon, other
/// requests and the sandboxes go on.
pub fn harden(router: axum::Router, plane: &'static str) -> axum::Router {
    router
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |panic: Box<dyn std::any::Any + Send + 'static>| {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                tracing::error!("a request handler panicked: {what}");
                let body = serde_json::json!({
                    "code": "internal",
                    "message": "internal error: the request failed inside brig (a bug; the \
                                daemon's log has details); retry, and report it if it happens \
                                again",
                });
                axum::response::IntoResponse::into_response((
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    axum::Json(body),
                ))
            },
        ))
        // Outside the panic catcher: a request that panicked is logged
        // with the 500 it was answered.
        .layer(axum::middleware::from_fn(move |req, next| {
            crate::log::requests(plane, req, next)
        }))
}

type Listener = axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)>;

/// This daemon's hold on its home: an exclusive POSIX record lock
/// (`fcntl(F_SETLK)`) on `$HOME/daemon`, which says "pid\naddress\n" for
/// whoever finds it taken. A record lock belongs to this process alone —
/// unlike an `flock`, a sandbox child cloned from the daemon (which holds a
/// copy of the descriptor until its exec) does not keep it alive — and the
/// kernel drops it when the daemon exits, however it exits.
pub struct HomeClaim {
    file: std::fs::File,
}

/// The file a daemon holds while it serves a home.
pub const DAEMON_FILE: &str = "daemon";

/// An `F_WRLCK` record lock over the whole file (`l_len` 0: to the end).
fn whole_file_lock(kind: libc::c_int) -> libc::flock {
    // SAFETY: flock is plain data; zero is a valid value for every field.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l
}

/// The pid holding a write lock on `file`, if any (`F_GETLK`).
pub fn lock_holder(file: &std::fs::File) -> Option<libc::pid_t> {
    use std::os::fd::AsRawFd;
    let mut l = whole_file_lock(libc::F_WRLCK);
    // SAFETY: F_GETLK fills `l`, a valid flock, for a descriptor we own.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut l) };
    (r == 0 && l.l_type != libc::F_UNLCK as libc::c_short).then_some(l.l_pid)
}

impl HomeClaim {
    pub(crate) fn take(home: &std::path::Path) -> anyhow::Result<HomeClaim> {
        use std::io::{Read, Seek, Write};
        use std::os::fd::AsRawFd;
        let path = home.join(DAEMON_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let lock = whole_file_lock(libc::F_WRLCK);
        // SAFETY: F_SETLK with a valid flock on a descriptor we own.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &lock) } != 0 {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            let mut lines = text.lines();
            let pid = lines.next().unwrap_or("?");
            let addr = lines.next().unwrap_or("an address it has not bound yet");
            anyhow::bail!(
                "another brig serve (pid {pid}, listening on {addr}) is using the home {}: \
                 stop it first (kill -TERM {pid}), or give this one its own --home",
                home.display()
            );
        }
        file.set_len(0)?;
        file.seek(std::io::SeekFrom::Start(0))?;
        writeln!(file, "{}", std::process::id())?;
        Ok(HomeClaim { file })
    }

    /// Add the address, for a second daemon's message (and clients).
    fn listening_on(&self, addr: SocketAddr) {
        use std::io::Write;
        let _ = (&self.file).write_all(format!("{addr}\n").as_bytes());
    }
}

/// Bind one listener (port 0 picks a free one) with TCP_NODELAY on every
/// connection: a streamed answer's last small line (`exited`) would
/// otherwise wait for the client's delayed ACK, 40 ms, on every exec of a
/// kept-alive connection.
async fn bind(listen: SocketAddr) -> anyhow::Result<(Listener, SocketAddr)> {
    let listener =
        brig_http::listen(listen).with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener
        .local_addr()
        .context("cannot read the listening address")?;
    fn nodelay(tcp: &mut tokio::net::TcpStream) {
        let _ = tcp.set_nodelay(true);
    }
    let listener = axum::serve::ListenerExt::tap_io(listener, nodelay as fn(&mut _));
    Ok((listener, addr))
}

pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without handlers the default action (death) still applies, and
        // the sandboxes die with brig (PR_SET_PDEATHSIG).
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// Write the key readable by root only.
pub(crate) fn write_key(path: &Path, key: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write the api key to {}", path.display()))?;
    writeln!(f, "{key}").with_context(|| format!("cannot write the api key to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tower::ServiceExt;

    #[tokio::test]
    async fn a_panicking_handler_answers_500_and_the_router_serves_on() {
        let router = harden(
            axum::Router::new()
                .route(
                    "/boom",
                    get(|| async {
                        if std::hint::black_box(true) {
                            panic!("boom");
                        }
                        "unreachable"
                    }),
                )
                .route("/ok", get(|| async { "fine" })),
            "api",
        );
        let req = |path: &str| {
            axum::http::Request::builder()
                .uri(path)
                .body(axum::body::Body::empty())
                .unwrap()
        };
        let boom = router.clone().oneshot(req("/boom")).await.unwrap();
        assert_eq!(boom.status(), 500);
        let body = axum::body::to_bytes(boom.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], "internal");
        let ok = router.oneshot(req("/ok")).await.unwrap();
        assert_eq!(ok.status(), 200);
    }
}
