//! `brig serve`: the daemon. Opens the store under `--home`, reconciles
//! what an earlier daemon left, creates the first API key if there is none
//! (printed once and written to `$BRIG_HOME/local.key` for the local CLI),
//! and serves the HTTP API until SIGINT or SIGTERM, then ends its
//! sandboxes.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use brig_core::parse_duration;
use brig_server::http::{app, AppState};
use brig_server::manager::{find_agent, ManagerConfig, DEFAULT_MAX_TIMEOUT};
use brig_server::PoolTarget;
use brig_server::{SandboxManager, Store};

use super::client::{home_dir, LOCAL_KEY_FILE};
use crate::exit;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (port 0 picks a free one; the address chosen
    /// is printed on stderr).
    #[arg(long, default_value = "127.0.0.1:7777", value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// Where the daemon keeps its state [default: $BRIG_HOME, else
    /// /var/lib/brig].
    #[arg(long, value_name = "DIR")]
    home: Option<PathBuf>,
    /// The longest timeout a sandbox may be given.
    #[arg(long, value_name = "DURATION")]
    max_timeout: Option<String>,
    /// Serve the Prometheus metrics at GET /metrics without an API key
    /// (for a scraper on a trusted network).
    #[arg(long)]
    metrics_public: bool,
    /// Keep N sandboxes of TEMPLATE made in advance, so creating one does
    /// not wait for namespaces, mounts and cgroups (repeatable; `host=0`
    /// turns the default off) [default: host=4].
    #[arg(long = "pool", value_name = "TEMPLATE=N", value_parser = PoolTarget::parse)]
    pool: Vec<PoolTarget>,
    /// Let clients use the directories inside DIR as `dir:` templates
    /// (repeatable; `$BRIG_HOME/templates` always is). Any other `dir:`
    /// path is refused, so a key holder cannot mount an arbitrary host
    /// directory into a sandbox.
    #[arg(long = "template-root", value_name = "DIR")]
    template_roots: Vec<PathBuf>,
}

/// What serving needs, checked before anything starts.
#[derive(Debug)]
struct ServeConfig {
    listen: SocketAddr,
    home: PathBuf,
    manager: ManagerConfig,
    metrics_public: bool,
}

impl ServeArgs {
    fn into_config(self) -> anyhow::Result<ServeConfig> {
        let mut manager = ManagerConfig::new(find_agent()?);
        manager.max_timeout = match &self.max_timeout {
            Some(d) => parse_duration(d).context("--max-timeout")?,
            None => DEFAULT_MAX_TIMEOUT,
        };
        manager.default_timeout = manager.default_timeout.min(manager.max_timeout);
        for target in self.pool {
            // A later flag for the same template replaces an earlier one
            // (and the default).
            manager.pool.retain(|t| t.template != target.template);
            manager.pool.push(target);
        }
        let home = self.home.unwrap_or_else(home_dir);
        manager.template_roots = std::iter::once(home.join("templates"))
            .chain(self.template_roots)
            .collect();
        Ok(ServeConfig {
            listen: self.listen,
            home,
            manager,
            metrics_public: self.metrics_public,
        })
    }
}

pub fn run(args: ServeArgs) -> anyhow::Result<i32> {
    let config = args.into_config()?;
    exit::require_root()?;
    std::fs::create_dir_all(&config.home)
        .with_context(|| format!("cannot create the home directory {}", config.home.display()))?;
    let store = Store::open_in(&config.home)?;
    if let Some(key) = store.ensure_initial_key()? {
        let path = config.home.join(LOCAL_KEY_FILE);
        write_key(&path, &key)?;
        eprintln!(
            "brig: created the first api key (shown once; also saved to {} for the local CLI):\n{key}",
            path.display()
        );
    }
    let manager = SandboxManager::start(store, config.manager)?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let state = AppState::new(Arc::clone(&manager)).with_public_metrics(config.metrics_public);
    let served = runtime.block_on(serve(config.listen, state));
    // Sandboxes end before the runtime goes: their teardown is blocking
    // work that must finish before brig exits.
    manager.shutdown();
    runtime.shutdown_timeout(Duration::from_secs(5));
    served?;
    Ok(0)
}

async fn serve(listen: SocketAddr, state: AppState) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let addr = listener
        .local_addr()
        .context("cannot read the listening address")?;
    eprintln!("brig: listening on http://{addr}");
    // No Nagle: a streamed answer's last small line (`exited`) would wait
    // for the client's delayed ACK, 40 ms, on every exec of a kept-alive
    // connection.
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("the HTTP server failed")?;
    eprintln!("brig: shutting down; ending sandboxes");
    Ok(())
}

async fn shutdown_signal() {
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
fn write_key(path: &Path, key: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write the api key to {}", path.display()))?;
    writeln!(f, "{key}").with_context(|| format!("cannot write the api key to {}", path.display()))
}
