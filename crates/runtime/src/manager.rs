//! [`SandboxManager`]: the daemon's live sandboxes, drivable without HTTP.
//!
//! Every sandbox runs `brig-agent` and is started by an isolation tier
//! behind brig-core's [`Tier`] boundary; the caller hands the tiers in
//! (`brig serve` the process tier; the unit tests a fake one). This crate depends on no tier crate: the manager
//! speaks to a sandbox only through its [`Instance`] (pause, resume, usage,
//! limits, kill, wait) and its agent [`Connection`].
//!
//! **Sandboxes outlive the daemon.** The manager picks a sandbox's id and
//! writes its record (`creating`) before the tier starts anything; the
//! record becomes `running` once the agent answered. A daemon that dies
//! (crash, `kill -9`, an upgrade, `shutdown(Keep)`) leaves its sandboxes
//! running; the next one re-adopts each running or paused record through
//! [`Tier::adopt`] (records, deadlines, pause state, create-time
//! environment), discards what a `creating` record names (a create the
//! crash cut short), and discards running sandboxes no record names (the
//! pool's). See [`SandboxManager::start`].
//!
//! **No thread per sandbox.** An idle sandbox costs the daemon no thread:
//! agent connections are read by one reactor (brig-agent-client), and a
//! sandbox's end is a short-lived thread that kills it, waits for its
//! teardown and records the end. The long-lived threads are few:
//!
//! - **the sweeper** (`brig-sweeper`): every
//!   [`ManagerConfig::sweep_interval`] it ends sandboxes whose timeout
//!   passed (even with no client connected) and those whose agent hung up;
//! - **the pool fillers** (`brig-pool-N`): they keep pre-made sandboxes
//!   ready (`pool.rs`).
//!
//! State goes to the [`Store`] as it changes: `creating` before the launch,
//! `running` once the agent has answered the handshake, `stopped` when brig
//! ended it (delete, timeout, shutdown) and `dead` when it ended by itself.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use brig_agent_client::{
    Call, ClientError, Connection, ExecRequest, FileReader, LogReader, LogsRequest, Process, Reply,
};
use brig_core::{
    Checkpoints, EnvVar, Instance, Isolation, Launch, Limits, NetworkAttachment, SandboxId,
    SandboxSpec, SpecError, TemplateRef, Tier, TierError, TierErrorKind,
};

use crate::error::{chain, ErrorKind};
use crate::events::{Event, EventKind, Events};
use crate::pool::{Pool, PoolTarget, Warm};
use crate::sandboxes::{
    Cursor, EndCause, ListFilter, NewSandbox, Page, SandboxError, SandboxState, Scope,
};
use crate::{AuthError, SandboxRecord, Store, StoreError, TenantId};

/// Threads that keep the pool full, each one spawn at a time: most of a
/// spawn's time is spent waiting, not computing (moving the init into its
/// first cgroup waits for an RCU grace period, 3-15 ms on this VM, on
/// cgroup v1), and concurrent spawns share those waits.
const FILLERS: usize = 2;

/// Pre-made sandboxes kept for the `host` template unless configured.
pub const DEFAULT_POOL: usize = 4;

/// A sandbox's time to live when the create request names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// The longest time to live a request may ask for, unless the server is
/// configured otherwise.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// How long `delete` and `shutdown` wait for one sandbox's teardown.
const TEARDOWN_WAIT: Duration = Duration::from_secs(30);

/// A sandbox's teardown thread only kills, waits and records: a small
/// stack.
const TEARDOWN_STACK: usize = 128 * 1024;

/// The sandbox every agent runs in: the agent as its command, no time
/// limit of its own (the manager ends it).
fn agent_spec(template: TemplateRef, limits: Limits) -> SandboxSpec {
    let mut spec = SandboxSpec::new(vec!["brig-agent".into(), "--listen".into()]);
    spec.template = template;
    spec.limits = limits;
    spec.limits.timeout = None;
    spec
}

/// How the manager runs.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    pub default_timeout: Duration,
    /// Requests for longer timeouts are capped to this.
    pub max_timeout: Duration,
    /// How often the sweeper looks for expired sandboxes and dead agents.
    pub sweep_interval: Duration,
    /// How often a running sandbox's metrics series takes a sample (on
    /// the sweeper's next tick after it is due): E2B's 5 s by default.
    pub metrics_interval: Duration,
    /// Pre-made sandboxes to keep ready, per template (see `pool.rs`).
    pub pool: Vec<PoolTarget>,
    /// The directories whose subdirectories a client may name as a
    /// `dir:` template. Any other path is refused: a key holder must not be
    /// able to mount an arbitrary host directory (`dir:/`) into a sandbox.
    pub template_roots: Vec<PathBuf>,
    /// `$BRIG_HOME`: named templates (`base`, `code-interpreter-v1`) are
    /// built and cached under its `templates/` (brig-template). `None`
    /// refuses named templates.
    pub home: Option<PathBuf>,
    /// The CPU quota (cores) of a sandbox created without one, so no
    /// sandbox takes the whole host by default; `None`: unlimited.
    pub default_cpus: Option<f64>,
    /// How long a request waits for an agent's first answer before it
    /// fails (a stuck or hostile agent must not hold a request forever).
    pub agent_answer_timeout: Duration,
    /// The network gateway sandboxes asking for a network are attached to;
    /// `None`: this daemon offers loopback only (a create asking for more
    /// is refused with the reason in [`ManagerConfig::network_unavailable`]).
    pub gateway: Option<Arc<brig_net::Gateway>>,
    /// Why there is no gateway, for that refusal.
    pub network_unavailable: Option<String>,
    /// Pull an image a create names that the store lacks (`brig serve
    /// --pull missing`); off: only images already there.
    pub pull_images: bool,
    /// A volume's size when its create names none (`brig serve
    /// --volume-size`; E2B's creates never name one).
    pub volume_size: u64,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        ManagerConfig::new()
    }
}

impl ManagerConfig {
    pub fn new() -> ManagerConfig {
        ManagerConfig {
            default_timeout: DEFAULT_TIMEOUT,
            max_timeout: DEFAULT_MAX_TIMEOUT,
            sweep_interval: Duration::from_secs(1),
            metrics_interval: Duration::from_secs(5),
            pool: vec![PoolTarget {
                template: TemplateRef::Host,
                setuid: false,
                size: DEFAULT_POOL,
            }],
            template_roots: Vec::new(),
            home: None,
            default_cpus: Some(default_cpus()),
            agent_answer_timeout: brig_agent_client::connection::ANSWER_TIMEOUT,
            gateway: None,
            network_unavailable: None,
            pull_images: true,
            volume_size: crate::volumes::DEFAULT_SIZE,
        }
    }
}

/// Half the host's CPUs, at least one: a sandbox created without a quota
/// can use no more (`brig serve --default-cpus` sets another).
pub fn default_cpus() -> f64 {
    let host = brig_core::host_cpus();
    (host / 2).max(1) as f64
}

/// What a client asks for when it creates a sandbox, already parsed.
#[derive(Debug, Clone)]
pub struct CreateConfig {
    pub template: TemplateRef,
    /// `limits.timeout` is ignored: the sandbox's life is `timeout` below.
    pub limits: Limits,
    pub env: Vec<EnvVar>,
    pub labels: BTreeMap<String, String>,
    /// A name unique among the tenant's sandboxes (`brig create --name`).
    pub name: Option<String>,
    /// `None`: [`ManagerConfig::default_timeout`].
    pub timeout: Option<Duration>,
    /// Let setuid binaries (`sudo`) work inside the sandbox
    /// ([`SandboxSpec::allow_setuid`]). For E2B sandboxes, whose user
    /// `user` has passwordless sudo; off otherwise.
    pub allow_setuid: bool,
    /// The isolation tier to start it on.
    pub isolation: Isolation,
    /// Its network policy; `None`: the daemon's default, `public` when it
    /// has a gateway, loopback only when it has none.
    pub network: Option<brig_net::Policy>,
    /// What the front-end keeps on the record from its first write, by key
    /// (`network` and `secrets` are the runtime's own: ones given here are
    /// replaced).
    pub attrs: serde_json::Map<String, serde_json::Value>,
    /// Secrets of this sandbox alone, for its injections' `${secrets.NAME}`
    /// (before its tenant's of the same name); kept on its record, never
    /// shown.
    pub secrets: BTreeMap<String, String>,
    /// A named template that is not built yet is built before the create
    /// goes on (minutes, once). Off (E2B, whose clients give up after
    /// 60 s): its build starts in the background and the create fails at
    /// once with [`ManagerError::Preparing`] (see `prepare.rs`).
    pub wait_for_template: bool,
    /// Volumes to mount, by id or name (the tenant's).
    pub volumes: Vec<crate::volumes::VolumeRequest>,
    /// Restore this warm start (`warm.rs`) instead of starting afresh:
    /// the template and tier are the ones it was taken on. A failed
    /// restore forgets it, so that the front-end makes another.
    pub warm: Option<crate::WarmKey>,
}

impl Default for CreateConfig {
    fn default() -> Self {
        CreateConfig {
            template: TemplateRef::Host,
            limits: Limits::default(),
            env: Vec::new(),
            labels: BTreeMap::new(),
            name: None,
            timeout: None,
            allow_setuid: false,
            isolation: Isolation::Process,
            network: None,
            attrs: serde_json::Map::new(),
            secrets: BTreeMap::new(),
            wait_for_template: true,
            volumes: Vec::new(),
            warm: None,
        }
    }
}

/// Why a manager operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("invalid request: {reason}")]
    BadRequest { reason: String },
    #[error("sandbox {id}: cannot give it a network: {reason}")]
    Network { id: SandboxId, reason: String },
    #[error("sandbox {id} is {state}, not running (an ended sandbox cannot be used again: create a new one)")]
    NotRunning { id: SandboxId, state: SandboxState },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start a sandbox")]
    Spawn(#[source] TierError),
    /// A tier operation on a live sandbox failed (pause, usage, limits).
    #[error("sandbox {id}: cannot {op}")]
    Tier {
        id: SandboxId,
        op: &'static str,
        #[source]
        source: TierError,
    },
    /// No tier of this daemon offers the isolation asked for.
    #[error("the {isolation} isolation tier is not available on this daemon (see brig doctor)")]
    NoTier { isolation: Isolation },
    #[error(
        "the agent in sandbox {id} did not answer its handshake: check that BRIG_AGENT (or \
         brig-agent next to brig) is the agent built with this brig, and the daemon's log"
    )]
    Handshake {
        id: SandboxId,
        #[source]
        source: ClientError,
    },
    /// An operation inside the sandbox failed; the agent's message says
    /// what and where (`stat /x: no such file or directory`).
    #[error("sandbox {id}: {source}")]
    Agent {
        id: SandboxId,
        #[source]
        source: ClientError,
    },
    #[error("cannot {op}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error(
        "template {template} is not allowed on this daemon: a dir: template must be a \
         directory inside one of [{roots}] (start brig serve with --template-root DIR to allow \
         another)"
    )]
    TemplateNotAllowed { template: String, roots: String },
    /// A front-end may add how to resume it on its own API.
    #[error("sandbox {id} is paused; resume it first")]
    Paused { id: SandboxId },
    /// A front-end may add how to resume it on its own API.
    #[error("sandbox {id} is already paused")]
    AlreadyPaused { id: SandboxId },
    #[error("sandbox {id} is {state}, not paused; only a paused sandbox can be resumed")]
    NotPaused { id: SandboxId, state: SandboxState },
    /// A named template this daemon is still building (`prepare.rs`).
    #[error(
        "template {name} is still being prepared on this daemon ({for_secs} s so far; a first \
         build takes a few minutes, its progress is in the daemon's log): try again shortly"
    )]
    Preparing { name: String, for_secs: u64 },
    /// A named template whose background build failed lately: said until
    /// the next attempt rather than starting a build per create.
    #[error(
        "template {name} could not be prepared on this daemon ({ago_secs} s ago): {reason}. \
         It is tried again {retry_in_secs} s from now; the build's output is in the daemon's \
         log, and an operator can build it by hand with `brig template build {name}`"
    )]
    PrepareFailed {
        name: String,
        reason: String,
        ago_secs: u64,
        retry_in_secs: u64,
    },
    /// A warm start a front-end is making (`warm.rs`, `prepare.rs`).
    #[error(
        "the {name} is still being made on this daemon ({for_secs} s so far; the first sandbox \
         of its kind on this tier and template makes it once, then every create restores it): \
         try again shortly"
    )]
    Warming { name: String, for_secs: u64 },
    /// A warm start whose making failed lately.
    #[error(
        "the {name} could not be made on this daemon ({ago_secs} s ago): {reason}. It is tried \
         again {retry_in_secs} s from now; the daemon's log has the details"
    )]
    WarmFailed {
        name: String,
        reason: String,
        ago_secs: u64,
        retry_in_secs: u64,
    },
    #[error("no snapshot {snapshot} (of yours): snapshots are named by their id or name")]
    SnapshotNotFound { snapshot: String },
    #[error("sandbox {id} is being snapshotted already: try again when that is done")]
    Snapshotting { id: SandboxId },
    #[error("no volume {volume} (of yours): volumes are named by their id or name")]
    VolumeNotFound { volume: String },
    #[error("a volume named {name} exists already: choose another name, or remove it first")]
    VolumeExists { name: String },
    #[error(
        "volume {volume} is in use{}: remove it once nothing uses it",
        if sandboxes.is_empty() { String::new() } else { format!(" by sandbox(es) {}", sandboxes.join(", ")) }
    )]
    VolumeInUse {
        volume: String,
        sandboxes: Vec<String>,
    },
    #[error("cannot {op}: {reason}")]
    Volume { op: &'static str, reason: String },
    /// The host's disk (or the daemon's quota on it) has no room for a new
    /// volume's image: nothing the client sent is wrong.
    #[error(
        "the host's disk has no room for a volume of {size} bytes: free space under the \
         daemon's home or create a smaller volume"
    )]
    HostDiskFull { size: u64 },
    /// A vm guest's kernel mounts a volume alone: it and another user
    /// cannot have it at once.
    #[error("volume {volume} {reason}")]
    VolumeExclusive { volume: String, reason: String },
    #[error("cannot {op}")]
    Image {
        op: &'static str,
        #[source]
        source: brig_image::ImageError,
    },
    #[error("template {name} is not available")]
    Template {
        name: String,
        #[source]
        source: Box<brig_template::TemplateError>,
    },
}

impl ManagerError {
    /// What kind of failure this is, for a front-end to answer it (see
    /// `error.rs`). A failure inside the sandbox is classified by the
    /// agent's error code.
    pub fn kind(&self) -> ErrorKind {
        use brig_agent_client::ErrorCode as Code;
        match self {
            ManagerError::Spec(_) | ManagerError::BadRequest { .. } => ErrorKind::BadRequest,
            ManagerError::Network { .. } => ErrorKind::Unavailable,
            ManagerError::NotRunning { .. } => ErrorKind::NotRunning,
            ManagerError::Sandbox(e) => e.kind(),
            ManagerError::Store(e) => e.kind(),
            ManagerError::Agent { source, .. } => match source {
                ClientError::Agent { code, .. } => match code {
                    Code::NotFound | Code::NoSuchProcess => ErrorKind::NotFound,
                    Code::PermissionDenied => ErrorKind::Forbidden,
                    Code::AlreadyExists
                    | Code::DirectoryNotEmpty
                    | Code::Busy
                    | Code::NotADirectory
                    | Code::IsADirectory => ErrorKind::Conflict,
                    Code::InvalidRequest | Code::Unsupported => ErrorKind::BadRequest,
                    _ => ErrorKind::Internal,
                },
                // The sandbox ended under the request.
                ClientError::Closed
                | ClientError::StreamClosed { .. }
                | ClientError::Reset { .. } => ErrorKind::NotRunning,
                // Stuck or taken over: not the daemon's failure.
                ClientError::NoAnswer { .. } => ErrorKind::Unavailable,
                _ => ErrorKind::Internal,
            },
            ManagerError::Paused { .. } => ErrorKind::Paused,
            ManagerError::AlreadyPaused { .. } | ManagerError::NotPaused { .. } => {
                ErrorKind::Conflict
            }
            ManagerError::Spawn(e) | ManagerError::Tier { source: e, .. } => match e.kind() {
                TierErrorKind::Invalid => ErrorKind::BadRequest,
                TierErrorKind::Unsupported => ErrorKind::Unsupported,
                TierErrorKind::Unavailable | TierErrorKind::Busy => ErrorKind::Unavailable,
                TierErrorKind::Gone => ErrorKind::NotRunning,
                // A daemon's sandboxes run the agent, never a one-shot
                // command: only a broken tier says this.
                TierErrorKind::Command(_) | TierErrorKind::Failed => ErrorKind::Internal,
            },
            ManagerError::NoTier { .. } => ErrorKind::Unsupported,
            ManagerError::SnapshotNotFound { .. } => ErrorKind::NotFound,
            ManagerError::Snapshotting { .. } => ErrorKind::Conflict,
            ManagerError::Image { .. } | ManagerError::Volume { .. } => ErrorKind::Internal,
            ManagerError::VolumeNotFound { .. } => ErrorKind::NotFound,
            ManagerError::HostDiskFull { .. } => ErrorKind::NoSpace,
            ManagerError::VolumeExists { .. }
            | ManagerError::VolumeInUse { .. }
            | ManagerError::VolumeExclusive { .. } => ErrorKind::Conflict,
            ManagerError::TemplateNotAllowed { .. } => ErrorKind::Forbidden,
            ManagerError::Template { .. }
            | ManagerError::Preparing { .. }
            | ManagerError::PrepareFailed { .. }
            | ManagerError::Warming { .. }
            | ManagerError::WarmFailed { .. }
            | ManagerError::ShuttingDown => ErrorKind::Unavailable,
            ManagerError::Handshake { .. } | ManagerError::Io { .. } => ErrorKind::Internal,
        }
    }
}

/// A sandbox's end, once asked for: who waits for its teardown.
#[derive(Debug, Default)]
struct Ending {
    /// The teardown has started (only the first end request starts it).
    started: bool,
    /// The teardown is over.
    done: bool,
    /// Told once the sandbox is fully torn down.
    waiters: Vec<mpsc::Sender<()>>,
}

/// A sandbox of this daemon that has not ended yet.
pub(crate) struct Live {
    pub(crate) tenant: TenantId,
    pub(crate) conn: Arc<Connection>,
    /// Its tier's handle: pause, resume, usage, limits, kill, wait.
    pub(crate) instance: Arc<dyn Instance>,
    ending: Mutex<Ending>,
    /// Create-time environment variables, given to every process it
    /// starts (under the request's own).
    pub(crate) env: BTreeMap<String, String>,
    /// Paused or not, and the last metrics sample (see `lifecycle.rs`).
    pub(crate) lifecycle: Mutex<crate::lifecycle::Lifecycle>,
    /// Started by an earlier daemon and re-adopted by this one.
    adopted: bool,
    /// Its link to the gateway: every sandbox of a daemon with a gateway
    /// has one, whatever its policy (`none` is a policy, so it can change).
    net: Option<Arc<NetLink>>,
    /// The layers of the snapshot it runs on, held until it ends.
    _layers: Option<brig_image::LayerLease>,
}

/// A sandbox's place at the gateway, given up when its last holder drops
/// it (a pre-made sandbox dropped by the pool, an ended one).
#[derive(Debug)]
pub(crate) struct NetLink {
    gateway: Arc<brig_net::Gateway>,
    net: Arc<brig_net::SandboxNet>,
    /// Its CA is installed in the sandbox ([`SandboxManager::trust_ca`]):
    /// only then are its processes pointed at the bundle.
    trusted: std::sync::atomic::AtomicBool,
}

impl NetLink {
    fn set_policy(&self, policy: brig_net::Policy) {
        // Through brig-net, which also ends the UDP flows it now refuses.
        self.net.set_policy(policy);
    }
}

/// Where a record keeps its sandbox's CA (certificate and key, PEM).
const CA_ATTR: &str = "network_ca";

/// Write the sandbox's CA into it: the CA and a bundle of it with the
/// host's certificates under /run, and the CA appended to the system
/// bundle where the template lets it be written. False (logged) if it
/// could not be.
fn write_ca(conn: &Connection, id: &SandboxId, ca: &brig_net::tls::SandboxCa) -> bool {
    use brig_net::tls::{host_bundle, CA_BUNDLE, CA_FILE};
    let pem = ca.pem();
    let bundle = format!("{}\n{pem}", host_bundle());
    let wrote = conn
        .write_file(CA_FILE, pem.as_bytes(), Some(0o644), false)
        .and_then(|_| conn.write_file(CA_BUNDLE, bundle.as_bytes(), Some(0o644), false));
    if let Err(e) = wrote {
        tracing::warn!(
            sandbox = id.as_str(),
            "cannot install its certificate authority: {e}"
        );
        return false;
    }
    // Best effort: a read-only /etc (the host template's) keeps its own.
    let _ = conn.write_file(
        "/etc/ssl/certs/ca-certificates.crt",
        format!("\n{pem}").as_bytes(),
        None,
        true,
    );
    true
}

impl Drop for NetLink {
    fn drop(&mut self) {
        self.gateway.forget(&self.net);
    }
}

/// How a [`SandboxManager::run_to_end`] ended.
#[derive(Debug, Clone)]
pub struct StepRun {
    pub ended: brig_core::Ended,
    /// It was killed at its time limit.
    pub timed_out: bool,
}

/// What [`SandboxManager::network`] reports of a sandbox's network.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NetworkInfo {
    pub policy: brig_net::Policy,
    /// Its address on the link to the gateway (`None` without a network).
    pub address: Option<std::net::Ipv4Addr>,
    pub bytes_out: u64,
    pub bytes_in: u64,
    pub connections_allowed: u64,
    pub connections_denied: u64,
}

/// The policy kept on a record (in its attrs, under `network`).
fn recorded_policy(record: &SandboxRecord) -> Option<brig_net::Policy> {
    record
        .attrs
        .get("network")
        .and_then(|v| serde_json::from_value(v.clone()).ok())
}

type LiveMap = Arc<Mutex<HashMap<SandboxId, Arc<Live>>>>;

/// What a daemon does with its sandboxes when it stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStop {
    /// End every sandbox and wait for its teardown.
    End,
    /// Leave them running, for the next daemon to adopt (the pre-made
    /// ones of the pool are ended: they hold nothing of anyone's).
    Keep,
}

/// The daemon's sandboxes: create, inspect, drive and end them.
pub struct SandboxManager {
    config: ManagerConfig,
    store: Mutex<Store>,
    /// Shared with the supervisors, which remove their own entry once the
    /// end is recorded.
    pub(crate) live: LiveMap,
    /// The isolation tiers this daemon offers.
    tiers: Vec<Arc<dyn Tier>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    closing: AtomicBool,
    /// Pre-made sandboxes, filled by the `brig-pool` thread.
    pool: Arc<Pool>,
    /// Creates waiting on a spawn of their own (the pool was empty).
    waiting: AtomicUsize,
    /// Dropped by `shutdown` to wake the sweeper at once.
    sweeper_stop: Mutex<Option<mpsc::Sender<()>>>,
    /// Where creates, pauses, resumes and ends are told (`events.rs`).
    events: Events,
    /// Sandboxes torn down, by cause (metrics).
    ends: Arc<crate::sandboxes::EndCounts>,
    /// Execs killed at their timeout (`note_exec_timeout`).
    exec_timeouts: AtomicU64,
    /// The secrets header injection reads (`secrets.rs`).
    secret_reader: Arc<crate::secrets::SecretReader>,
    /// Named templates being built in the background, and those whose
    /// build failed lately (`prepare.rs`).
    pub(crate) preparing: Arc<Mutex<crate::prepare::Preparing>>,
    /// Sandboxes being snapshotted now (`snapshots.rs`).
    pub(crate) snapshotting: Mutex<std::collections::HashSet<SandboxId>>,
    /// Volumes creates and content requests use now (`volumes.rs`).
    pub(crate) volumes_in_use: Mutex<crate::volumes::InUse>,
}

impl std::fmt::Debug for SandboxManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxManager")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SandboxManager {
    /// Re-adopt what an earlier daemon left running, then start the
    /// sweeper and the pool fillers. `tiers`: the isolation tiers to offer.
    ///
    /// Each record still live is settled: `running` and `paused` ones are
    /// adopted from their tier (a new agent connection; the record's
    /// deadline and pause state as they were), or marked `dead` if the
    /// sandbox is gone; a `creating` one (a create a crash cut short) is
    /// discarded and marked `dead`. Sandboxes a tier runs that no record
    /// names (pre-made ones of the old pool) are discarded.
    pub fn start(
        store: Store,
        config: ManagerConfig,
        tiers: Vec<Arc<dyn Tier>>,
    ) -> Result<Arc<SandboxManager>, ManagerError> {
        // Builds of named templates that a rebuild replaced: no sandbox of
        // this daemon runs on them yet (`brig run`s hold leases; adopted
        // sandboxes keep theirs, see brig_template::prune).
        if let Some(home) = &config.home {
            let freed = brig_template::prune(home);
            if freed > 0 {
                tracing::info!("removed old template builds: {} MiB", freed >> 20);
            }
        }
        let made = Limits {
            cpus: config.default_cpus,
            ..Limits::default()
        };
        let pool = Arc::new(Pool::new(config.pool.clone(), config.home.as_deref(), made));
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let manager = Arc::new(SandboxManager {
            config,
            secret_reader: Arc::new(crate::secrets::SecretReader::new(
                store.path().to_path_buf(),
            )),
            store: Mutex::new(store),
            live: Arc::new(Mutex::new(HashMap::new())),
            tiers,
            threads: Mutex::new(Vec::new()),
            closing: AtomicBool::new(false),
            sweeper_stop: Mutex::new(Some(stop_tx)),
            pool,
            waiting: AtomicUsize::new(0),
            events: Events::new(),
            ends: Arc::default(),
            exec_timeouts: Default::default(),
            preparing: Arc::default(),
            snapshotting: Mutex::default(),
            volumes_in_use: Mutex::default(),
        });
        manager.readopt()?;
        manager.reconcile_volumes();
        manager.collect_checkpoints();
        manager.collect_warm();

        // The sweeper holds only a weak reference, so dropping the manager
        // without `shutdown` still lets it go.
        let weak = Arc::downgrade(&manager);
        // Ticks often enough that each sandbox's metrics sample is taken
        // within a fifth of an interval of when it is due.
        let tick = manager
            .config
            .sweep_interval
            .min(manager.config.metrics_interval / 5);
        let sweep_every = manager.config.sweep_interval;
        let sweeper = thread::Builder::new()
            .name("brig-sweeper".into())
            .spawn(move || {
                let mut swept = Instant::now();
                while let Err(mpsc::RecvTimeoutError::Timeout) = stop_rx.recv_timeout(tick) {
                    let Some(m) = weak.upgrade() else { return };
                    if swept.elapsed() >= sweep_every.saturating_sub(tick / 2) {
                        swept = Instant::now();
                        m.sweep();
                    }
                    m.sample_series();
                }
            })
            .map_err(|source| ManagerError::Io {
                op: "start the sweeper thread",
                source,
            })?;
        lock(&manager.threads).push(sweeper);

        // The fillers, like the sweeper, hold the manager weakly; they wait
        // on the pool itself, which they hold strongly.
        for n in 0..FILLERS {
            let weak = Arc::downgrade(&manager);
            let pool = Arc::clone(&manager.pool);
            let filler = thread::Builder::new()
                .name(format!("brig-pool-{n}"))
                .spawn(move || loop {
                    let pause = match weak.upgrade() {
                        Some(m) if !m.closing.load(Ordering::SeqCst) => m.fill_once(),
                        _ => return,
                    };
                    if let Some(pause) = pause {
                        pool.wait(pause);
                    }
                })
                .map_err(|source| ManagerError::Io {
                    op: "start a pool filler thread",
                    source,
                })?;
            lock(&manager.threads).push(filler);
        }
        Ok(manager)
    }

    /// Settle every live record an earlier daemon left (see
    /// [`SandboxManager::start`]).
    fn readopt(&self) -> Result<(), ManagerError> {
        let records = self.store().live_sandboxes()?;
        let mut known: HashSet<SandboxId> = HashSet::new();
        let (mut adopted, mut gone) = (0usize, 0usize);
        for record in records {
            known.insert(record.id.clone());
            let id = record.id.clone();
            match self.readopt_one(record) {
                Ok(true) => adopted += 1,
                Ok(false) => gone += 1,
                Err(e) => {
                    gone += 1;
                    tracing::warn!("sandbox {id}: cannot adopt it: {}", chain(&e));
                    let _ = self.store().mark_dead(&id, None, &EndCause::EndedUnwatched);
                }
            }
        }
        let mut strays = 0usize;
        for tier in &self.tiers {
            for id in tier.running() {
                if !known.contains(&id) {
                    strays += 1;
                    if let Err(e) = tier.discard(&id) {
                        tracing::warn!("sandbox {id}: cannot discard it: {e}");
                    }
                }
            }
        }
        if adopted + gone + strays > 0 {
            tracing::info!(
                "re-adopted {adopted} sandboxes; {gone} had ended; {strays} unrecorded removed"
            );
        }
        Ok(())
    }

    /// Adopt one record's sandbox: `Ok(true)` if it runs on, `Ok(false)`
    /// if it had ended (its record now says so).
    fn readopt_one(&self, record: SandboxRecord) -> Result<bool, ManagerError> {
        let id = record.id.clone();
        let isolation: Isolation = record.isolation.parse().unwrap_or_default();
        let tier = self.tier(isolation)?;
        if record.state == SandboxState::Creating {
            // Cut short by the crash: nothing half-made may stay.
            tier.discard(&id).map_err(ManagerError::Spawn)?;
            self.store().mark_dead(&id, None, &EndCause::CreateFailed)?;
            return Ok(false);
        }
        let Some(instance) = tier.adopt(&id).map_err(ManagerError::Spawn)? else {
            self.store()
                .mark_dead(&id, None, &EndCause::EndedUnwatched)?;
            return Ok(false);
        };
        let instance: Arc<dyn Instance> = Arc::from(instance);
        // A paused sandbox's agent is frozen and cannot answer the
        // handshake: thawed for that moment (a few milliseconds in which
        // its processes run), then frozen again. The record decides, not
        // the tier's `is_paused`: a freeze caught half-way (or one the last
        // daemon died in the middle of) reads as neither paused nor
        // running, and such an agent does not answer; seen under load, the
        // handshake then timed out and the sandbox was lost. So every
        // adopted sandbox is resumed first (a no-op for a running one).
        let frozen = record.state == SandboxState::Paused;
        let thawed = instance.resume().map_err(|source| ManagerError::Tier {
            id: id.clone(),
            op: "thaw it to reconnect",
            source,
        });
        if frozen {
            thawed?;
        }
        let conn = self.connect(&*instance);
        if frozen {
            if let Err(source) = instance.pause() {
                instance.kill();
                let _ = instance.wait();
                return Err(ManagerError::Tier {
                    id,
                    op: "freeze it again after reconnecting",
                    source,
                });
            }
        }
        let conn = match conn {
            Ok(conn) => conn,
            Err(e) => {
                // An agent that does not answer serves nobody: end it.
                instance.kill();
                let _ = instance.wait();
                return Err(e);
            }
        };
        let spec: Option<SandboxSpec> = serde_json::from_value(record.spec.clone()).ok();
        let layers = spec.as_ref().and_then(|s| self.snapshot_lease(&s.template));
        let env = spec
            .map(|s| s.env.into_iter().map(|e| (e.key, e.value)).collect())
            .unwrap_or_default();
        let net = self.relink(&record, &*instance);
        let live = Arc::new(Live {
            tenant: record.tenant.clone(),
            conn: Arc::new(conn),
            instance,
            ending: Mutex::default(),
            env,
            lifecycle: Mutex::new(crate::lifecycle::Lifecycle::restored(&record)),
            adopted: true,
            net,
            _layers: layers,
        });
        lock(&self.live).insert(id, live);
        Ok(true)
    }

    /// A new agent connection for live sandbox `id` (its agent let go of
    /// the last one for a checkpoint): the sandbox is kept as a new
    /// [`Live`] with it; holders of the old one see its connection closed.
    /// A paused sandbox is thawed for the handshake only.
    pub(crate) fn reconnect(
        &self,
        id: &SandboxId,
        old: &Arc<Live>,
        spec: &SandboxSpec,
    ) -> Result<(), ManagerError> {
        let paused = lock(&old.lifecycle).is_paused();
        if paused {
            old.instance.resume().map_err(|source| ManagerError::Tier {
                id: id.clone(),
                op: "thaw it to reconnect",
                source,
            })?;
        }
        let conn = self.connect(&*old.instance);
        if paused {
            old.instance.pause().map_err(|source| ManagerError::Tier {
                id: id.clone(),
                op: "freeze it again after reconnecting",
                source,
            })?;
        }
        let live = Arc::new(Live {
            tenant: old.tenant.clone(),
            conn: Arc::new(conn?),
            instance: Arc::clone(&old.instance),
            ending: Mutex::default(),
            env: old.env.clone(),
            lifecycle: Mutex::new(std::mem::take(&mut *lock(&old.lifecycle))),
            adopted: old.adopted,
            net: old.net.clone(),
            _layers: self.snapshot_lease(&spec.template),
        });
        lock(&self.live).insert(id.clone(), live);
        Ok(())
    }

    /// Re-attach an adopted sandbox's network to this daemon's gateway:
    /// its address is read from its namespace, its policy from its record.
    /// Without a gateway, or if its address cannot be found, it runs on
    /// with no egress (the gateway steers nothing of an unknown address).
    fn relink(&self, record: &SandboxRecord, instance: &dyn Instance) -> Option<Arc<NetLink>> {
        let policy = recorded_policy(record)?;
        let gateway = self.config.gateway.as_ref()?;
        let addr = instance.pid().and_then(brig_net::gateway::address_of_pid);
        let Some(addr) = addr else {
            // Made before sandboxes were always linked, or its link is gone.
            if policy.mode != brig_net::Mode::None {
                tracing::warn!(
                    "sandbox {}: its network address cannot be found: it has no egress until recreated",
                    record.id
                );
            }
            return None;
        };
        // Its namespace, where the resolver answers on loopback again.
        let netns = instance
            .pid()
            .and_then(|pid| std::fs::File::open(format!("/proc/{pid}/ns/net")).ok())
            .map(std::os::fd::OwnedFd::from);
        // The CA it trusts, as kept on its record (made when first needed
        // if it has none).
        let id = record.id.as_str();
        let ca = record
            .attrs
            .get(CA_ATTR)
            .and_then(|c| Some((c["pem"].as_str()?, c["key"].as_str()?)))
            .and_then(|(pem, key)| brig_net::tls::SandboxCa::restore(id, pem, key).ok());
        let net = gateway.readopt(id, addr, policy, netns.as_ref(), ca);
        net.set_secrets(Arc::new(crate::secrets::TenantSecrets {
            reader: Arc::clone(&self.secret_reader),
            tenant: record.tenant.clone(),
            own: crate::secrets::TenantSecrets::own_from(&record.attrs),
        }));
        // A kept CA was installed by the daemon that made it.
        let trusted = record.attrs.get(CA_ATTR).is_some();
        Some(Arc::new(NetLink {
            gateway: Arc::clone(gateway),
            net,
            trusted: trusted.into(),
        }))
    }

    /// Replace a running sandbox's network policy; new connections and
    /// lookups follow it at once, and it is kept across daemon restarts.
    pub fn set_network(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        policy: brig_net::Policy,
    ) -> Result<NetworkInfo, ManagerError> {
        policy.validate().map_err(|e| ManagerError::BadRequest {
            reason: e.to_string(),
        })?;
        let live = self.owned_live(tenant, id)?;
        let Some(link) = &live.net else {
            if policy.mode == brig_net::Mode::None {
                self.store().set_attrs(
                    id,
                    "network",
                    &serde_json::to_value(&policy).unwrap_or_default(),
                )?;
                return self.network(tenant, id);
            }
            return Err(ManagerError::BadRequest {
                reason: format!(
                    "sandbox {id} has no link to a network (it was created with network none on \
                     a tier that then gives it no network at all, vm or gvisor, or by a daemon \
                     that could not give sandboxes one): its policy can only be none; create a \
                     new sandbox with the network it needs"
                ),
            });
        };
        link.set_policy(policy.clone());
        self.store().set_attrs(
            id,
            "network",
            &serde_json::to_value(&policy).unwrap_or_default(),
        )?;
        if link.net.injects() {
            self.trust_ca(&live.conn, id, link);
        }
        self.network(tenant, id)
    }

    /// A sandbox's network: its policy, address and counters.
    pub fn network(&self, tenant: &TenantId, id: &SandboxId) -> Result<NetworkInfo, ManagerError> {
        let record = self.get(tenant, id)?;
        let live = self.live_sandbox(id);
        let link = live.as_ref().and_then(|l| l.net.clone());
        let policy = match &link {
            Some(l) => l.net.policy(),
            None => recorded_policy(&record).unwrap_or_else(brig_net::Policy::none),
        };
        let count = |f: fn(&brig_net::proxy::Counters) -> &std::sync::atomic::AtomicU64| {
            link.as_ref()
                .map_or(0, |l| f(&l.net.counters).load(Ordering::Relaxed))
        };
        Ok(NetworkInfo {
            policy,
            address: link.as_ref().map(|l| l.net.addr),
            bytes_out: count(|c| &c.bytes_out),
            bytes_in: count(|c| &c.bytes_in),
            connections_allowed: count(|c| &c.allowed),
            connections_denied: count(|c| &c.denied),
        })
    }

    /// The last connections a sandbox tried, oldest first.
    pub fn connections(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Result<Vec<brig_net::proxy::Entry>, ManagerError> {
        self.get(tenant, id)?;
        Ok(self
            .live_sandbox(id)
            .and_then(|l| l.net.clone())
            .map(|l| {
                l.net
                    .log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entries()
            })
            .unwrap_or_default())
    }

    /// The tier of `isolation`, if this daemon offers it.
    pub(crate) fn tier(&self, isolation: Isolation) -> Result<&Arc<dyn Tier>, ManagerError> {
        self.tiers
            .iter()
            .find(|t| t.isolation() == isolation)
            .ok_or(ManagerError::NoTier { isolation })
    }

    /// The isolation tiers this daemon offers.
    pub fn tiers(&self) -> Vec<Isolation> {
        self.tiers.iter().map(|t| t.isolation()).collect()
    }

    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// The store, for what the manager does not wrap (keys, tenants).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    /// Which tenant a presented API key belongs to.
    pub fn authenticate(&self, key: &str) -> Result<crate::keys::Principal, AuthError> {
        self.store().authenticate(key)
    }

    /// Create a sandbox running the agent, for `tenant`. Blocks until the
    /// agent has answered its handshake.
    pub fn create(
        &self,
        tenant: &TenantId,
        req: CreateConfig,
    ) -> Result<SandboxRecord, ManagerError> {
        if self.closing.load(Ordering::SeqCst) {
            return Err(ManagerError::ShuttingDown);
        }
        let timeout = self.cap_timeout(req.timeout.unwrap_or(self.config.default_timeout))?;
        // The record keeps what was asked for. The agent itself runs with
        // the template's environment: create-time variables are given to
        // each process it starts (see `exec`), so a pre-made sandbox and a
        // new one behave alike.
        if let Some(name) = &req.name {
            crate::sandboxes::check_name(name)?;
        }
        let mut req = req;
        // One of the tenant's memory snapshots: restored on the tier that
        // took it, from the template its sandbox ran on, with no network
        // where the tier checkpoints loopback only.
        let checkpoint = match &req.warm {
            Some(key) => Some(self.warm_checkpoint(key)?),
            None => self.checkpoint_template(tenant, &req.template)?,
        };
        if let Some(cp) = &checkpoint {
            req.isolation = cp.isolation;
        }
        let on_loopback_only = checkpoint.is_some()
            && self.tier(req.isolation)?.checkpoints() == Checkpoints::MemoryOnLoopback;
        if on_loopback_only {
            if req
                .network
                .as_ref()
                .is_some_and(|p| p.mode != brig_net::Mode::None)
            {
                return Err(ManagerError::BadRequest {
                    reason: "a sandbox restored from a memory snapshot has no network (its \
                             processes were saved on loopback only): create it with network \
                             mode none"
                        .into(),
                });
            }
            req.network = Some(brig_net::Policy::none());
        }
        // One of the tenant's snapshots of files, by id or name: its image.
        req.template = self.snapshot_template(tenant, req.template)?;
        if checkpoint.is_none() && !req.wait_for_template {
            self.unless_preparing(&req.template)?;
        }
        let (template, image) = match &checkpoint {
            Some(cp) => (cp.template.clone(), None),
            None => self.allowed_template(req.template)?,
        };
        let mut limits = req.limits;
        if limits.cpus.is_none() {
            limits.cpus = self.config.default_cpus;
        }
        let mut spec = agent_spec(template, limits);
        // An image's environment first; what the create gives wins.
        let mut env: Vec<EnvVar> = image
            .iter()
            .flat_map(|i| i.env.iter())
            .filter_map(|kv| EnvVar::parse(kv).ok())
            .filter(|e| !req.env.iter().any(|g| g.key == e.key))
            .collect();
        env.extend(req.env);
        spec.env = env;
        spec.allow_setuid = req.allow_setuid;
        spec.validate()?;

        let tier = Arc::clone(self.tier(req.isolation)?);
        let volumes = self.resolve_volumes(tenant, &req.volumes)?;
        // The network: checked before anything is made. With a gateway
        // every sandbox is linked to it (`none` is then a policy like any
        // other), pre-made ones too.
        let policy = match req.network {
            Some(policy) => {
                policy.validate().map_err(|e| ManagerError::BadRequest {
                    reason: e.to_string(),
                })?;
                policy
            }
            None if self.config.gateway.is_some() => brig_net::Policy::default(),
            None => brig_net::Policy::none(),
        };
        if policy.mode != brig_net::Mode::None && self.config.gateway.is_none() {
            return Err(ManagerError::BadRequest {
                reason: format!(
                    "this daemon cannot give sandboxes a network ({}); create it with network mode none",
                    self.config
                        .network_unavailable
                        .as_deref()
                        .unwrap_or("it was started without one")
                ),
            });
        }
        // The record keeps the policy (for a later daemon) and what the
        // front-end asked to keep, in its first write.
        let own =
            crate::secrets::check_own(&req.secrets).map_err(|e| ManagerError::BadRequest {
                reason: e.to_string(),
            })?;
        let mut attrs = req.attrs;
        attrs.insert(
            "network".into(),
            serde_json::to_value(&policy).unwrap_or_default(),
        );
        attrs.remove(crate::secrets::OWN_ATTR);
        attrs.remove(crate::volumes::ATTR);
        if !volumes.is_empty() {
            attrs.insert(
                crate::volumes::ATTR.into(),
                serde_json::to_value(&volumes).unwrap_or_default(),
            );
        }
        if !own.is_empty() {
            attrs.insert(
                crate::secrets::OWN_ATTR.into(),
                serde_json::to_value(&own).unwrap_or_default(),
            );
        }
        let new = |id: SandboxId| NewSandbox {
            id,
            tenant: tenant.clone(),
            template: spec.template.to_string(),
            isolation: req.isolation.to_string(),
            spec: serde_json::to_value(&spec).unwrap_or(serde_json::Value::Null),
            labels: req.labels.clone(),
            name: req.name.clone(),
            timeout,
            attrs: attrs.clone(),
        };
        // Mounted on the host (and held) before the record says the
        // sandbox uses them; a pre-made sandbox has none.
        let (hold, mounts) = self.hold_volumes(req.isolation, &volumes)?;
        if req.isolation == Isolation::Process && mounts.is_empty() {
            if let Some(mut warm) = self.claim(&spec)? {
                // A pre-made sandbox: its id was picked when it was made;
                // its record is written now, its policy set.
                self.store()
                    .insert_sandbox(&new(warm.instance.id().clone()))?;
                let link = warm.net.take();
                if let Some(link) = &link {
                    link.set_policy(policy.clone());
                }
                return self.register(tenant, warm, &spec, link);
            }
        }
        // The record first, so a crash from here on leaves a name for the
        // next daemon to clean up after.
        let id = SandboxId::from_random(rand::random());
        self.store().insert_sandbox(&new(id.clone()))?;
        let mut fresh = spec.clone();
        fresh.env.clear();
        // Its network namespace, linked to the gateway, before the spawn
        // (not for a sandbox with no network on a tier that can checkpoint
        // memory on loopback only, so that it can be snapshotted; nor for
        // a vm guest with no network: it gets no network device at all).
        let unlinked = policy.mode == brig_net::Mode::None
            && (tier.checkpoints() == Checkpoints::MemoryOnLoopback
                || req.isolation == Isolation::Vm);
        let linked = if unlinked {
            Ok((NetworkAttachment::Loopback, None))
        } else {
            self.link(&id, policy)
        };
        let (attachment, link) = match linked {
            Ok(linked) => linked,
            Err(e) => {
                let _ = self.store().mark_dead(&id, None, &EndCause::CreateFailed);
                return Err(e);
            }
        };
        // The filler steps aside while a client waits on a spawn.
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let made = self.launch(
            &*tier,
            &id,
            &fresh,
            attachment,
            mounts,
            checkpoint.as_ref().map(|c| c.image.as_path()),
        );
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let result = match made {
            Ok(warm) => self.register(tenant, warm, &spec, link),
            Err(e) => {
                let _ = self.store().mark_dead(&id, None, &EndCause::CreateFailed);
                if let Some(key) = &req.warm {
                    tracing::warn!("{key}: its restore failed, forgetting it: {e}");
                    self.forget_warm(key);
                }
                // Refused before anything ran: no guest wrote its volumes.
                if matches!(&e, ManagerError::Spawn(t)
                    if matches!(t.kind(), TierErrorKind::Invalid | TierErrorKind::Unsupported))
                {
                    hold.never_started();
                }
                Err(e)
            }
        };
        // The record is live now (or dead): the sweeper sees who uses them.
        drop(hold);
        result
    }

    /// `template` if this daemon lets clients use it: `host` always, a
    /// `dir:` template only inside one of [`ManagerConfig::template_roots`]
    /// (after resolving symlinks and `..`; the resolved path is what is
    /// used).
    ///
    /// A named template is resolved to its built rootfs under
    /// `$BRIG_HOME/templates`, building it first if it is missing or its
    /// recipe changed (minutes, once). No manager lock is held meanwhile;
    /// concurrent creates of the same template wait for the same build
    /// (brig-template's flock).
    pub(crate) fn allowed_template(
        &self,
        template: TemplateRef,
    ) -> Result<(TemplateRef, Option<brig_image::ImageConfig>), ManagerError> {
        if let TemplateRef::Named(name) | TemplateRef::Image(name) = &template {
            let Some(home) = &self.config.home else {
                return Err(ManagerError::BadRequest {
                    reason: format!(
                        "named templates and images such as {name:?} are not enabled on this daemon"
                    ),
                });
            };
            let resolved = brig_template::resolve(
                home,
                template.clone(),
                brig_template::Progress::Lines,
                self.config.pull_images,
            )
            .map_err(|source| match source {
                // Nothing by that name anywhere, or a registry that
                // refused: the client's to fix.
                e if crate::prepare::client_fault(&e) => ManagerError::BadRequest {
                    reason: e.to_string(),
                },
                source => ManagerError::Template {
                    name: name.clone(),
                    source: Box::new(source),
                },
            })?;
            // Built or pulled now if it was not: its pools (if any) start
            // filling.
            drop(self.pool.resolve(name, &resolved.template));
            return Ok((resolved.template, resolved.image));
        }
        let TemplateRef::Dir(path) = &template else {
            return Ok((template, None));
        };
        let real = path.canonicalize().map_err(|e| ManagerError::BadRequest {
            reason: format!("template {template}: {e}"),
        })?;
        let inside = self.config.template_roots.iter().any(|root| {
            root.canonicalize()
                .is_ok_and(|root| real.starts_with(&root) && real != root)
        });
        if !inside {
            return Err(ManagerError::TemplateNotAllowed {
                template: template.to_string(),
                roots: self
                    .config
                    .template_roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok((TemplateRef::Dir(real), None))
    }

    /// Run `spec` (an image build's RUN step: its `upper_dir` keeps what
    /// it changes) to its end in a one-shot sandbox of the process tier,
    /// with the daemon's network under brig's default policy (the
    /// internet; never the host, private ranges or metadata). Its output,
    /// stdout and stderr together as a terminal shows them, goes to
    /// `output` as it comes; stdin is the terminal, which nothing writes
    /// (callers redirect it). The sandbox is not a client's: it is in no
    /// list, counts against no tenant, and dies with the daemon (its init
    /// is tied to the daemon's thread).
    ///
    /// It ends when its command does (whatever it left running is killed
    /// with the sandbox), or after `limit`, when it is killed and
    /// [`StepRun::timed_out`] says so.
    pub fn run_to_end(
        &self,
        mut spec: SandboxSpec,
        limit: Duration,
        output: &mut dyn FnMut(&[u8]),
    ) -> Result<StepRun, ManagerError> {
        use rustix::event::{poll, PollFd, PollFlags};
        use std::io::Read;
        let tier = Arc::clone(self.tier(Isolation::Process)?);
        let id = SandboxId::from_random(rand::random());
        let (network, link) = self.link(&id, brig_net::Policy::default())?;
        // A terminal, so output arrives as one ordered stream a person
        // would read.
        spec.tty = true;
        spec.stdin = false;
        let mut run = tier.run(&spec, &network).map_err(ManagerError::Spawn)?;
        let deadline = Instant::now() + limit;
        let mut timed_out = false;
        if let Some(pty) = run.take_pty() {
            let mut pty = std::fs::File::from(pty);
            let mut buf = [0u8; 8192];
            let mut exited = false;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    timed_out = true;
                    run.kill();
                    break;
                }
                // After the command exits, only what is already buffered.
                let wait = if exited {
                    Duration::ZERO
                } else {
                    left.min(Duration::from_millis(500))
                };
                let timeout = rustix::time::Timespec::try_from(wait).ok();
                let (out_ready, ended) = {
                    let mut fds = [
                        PollFd::new(&pty, PollFlags::IN),
                        PollFd::from_borrowed_fd(run.exit_fd(), PollFlags::IN),
                    ];
                    match poll(&mut fds, timeout.as_ref()) {
                        Ok(_) => (!fds[0].revents().is_empty(), !fds[1].revents().is_empty()),
                        Err(rustix::io::Errno::INTR) => (false, false),
                        Err(_) => break,
                    }
                };
                if out_ready {
                    match pty.read(&mut buf) {
                        // EIO once the last process holding the terminal
                        // is gone.
                        Ok(0) | Err(_) => break,
                        Ok(n) => output(&buf[..n]),
                    }
                    continue;
                }
                if exited {
                    break;
                }
                exited = ended;
            }
        }
        let ended = run.wait().map_err(|source| ManagerError::Tier {
            id: id.clone(),
            op: "wait for a build step",
            source,
        })?;
        drop(link);
        Ok(StepRun { ended, timed_out })
    }

    /// Sandbox `id`'s network namespace, linked to the gateway under
    /// `policy`; loopback only when this daemon has no gateway.
    fn link(
        &self,
        id: &SandboxId,
        policy: brig_net::Policy,
    ) -> Result<(NetworkAttachment, Option<Arc<NetLink>>), ManagerError> {
        let Some(gateway) = &self.config.gateway else {
            return Ok((NetworkAttachment::Loopback, None));
        };
        let a = gateway
            .attach(id.as_str(), policy)
            .map_err(|e| ManagerError::Network {
                id: id.clone(),
                reason: e.to_string(),
            })?;
        let link = Arc::new(NetLink {
            gateway: Arc::clone(gateway),
            net: a.net,
            trusted: false.into(),
        });
        Ok((NetworkAttachment::Namespace(Arc::new(a.netns)), Some(link)))
    }

    /// A pre-made sandbox that can serve `spec`, with `spec`'s limits
    /// written to its cgroups; `None` when there is none.
    fn claim(&self, spec: &SandboxSpec) -> Result<Option<Warm>, ManagerError> {
        // Whether setuid binaries work is fixed at spawn: pools are kept
        // for each (template, setuid) pair.
        let setuid = spec.allow_setuid;
        if !self.pool.serves(&spec.template, setuid, &spec.limits) {
            return Ok(None);
        }
        let Some(warm) = self.pool.take(&spec.template, setuid) else {
            return Ok(None);
        };
        let made = self.pool.limits();
        if spec.limits.memory != made.memory || spec.limits.pids != made.pids {
            warm.instance
                .set_limits(&spec.limits)
                .map_err(|source| ManagerError::Tier {
                    id: warm.instance.id().clone(),
                    op: "set the limits of a pre-made sandbox",
                    source,
                })?;
        }
        Ok(Some(warm))
    }

    /// Start the agent in a new sandbox `id` on `tier` (restored from the
    /// checkpoint in `from`, if given) and wait for its handshake. Nothing
    /// is recorded: an error drops the instance, which ends the sandbox.
    fn launch(
        &self,
        tier: &dyn Tier,
        id: &SandboxId,
        spec: &SandboxSpec,
        network: NetworkAttachment,
        volumes: Vec<brig_core::VolumeMount>,
        from: Option<&std::path::Path>,
    ) -> Result<Warm, ManagerError> {
        let launch = Launch {
            id: id.clone(),
            template: spec.template.clone(),
            limits: spec.limits.clone(),
            allow_setuid: spec.allow_setuid,
            network,
            volumes,
        };
        let instance = match from {
            Some(from) => tier.restore(&launch, from),
            None => tier.launch(&launch),
        }
        .map_err(ManagerError::Spawn)?;
        let conn = self.connect(&*instance)?;
        Ok(Warm {
            instance,
            conn,
            net: None,
        })
    }

    /// A new connection to a sandbox's agent, handshake done.
    fn connect(&self, instance: &dyn Instance) -> Result<Connection, ManagerError> {
        let stream = instance
            .connect_agent()
            .map_err(|source| ManagerError::Tier {
                id: instance.id().clone(),
                op: "connect to its agent",
                source,
            })?;
        let conn = Connection::new(stream).map_err(|source| ManagerError::Handshake {
            id: instance.id().clone(),
            source,
        })?;
        conn.set_answer_timeout(self.config.agent_answer_timeout);
        Ok(conn)
    }

    /// Make a running sandbox whose record exists (`creating`) `tenant`'s:
    /// `running`, among the live ones, announced. On error the sandbox is
    /// ended and its record marked dead.
    fn register(
        &self,
        tenant: &TenantId,
        warm: Warm,
        spec: &SandboxSpec,
        net: Option<Arc<NetLink>>,
    ) -> Result<SandboxRecord, ManagerError> {
        let Warm { instance, conn, .. } = warm;
        let instance: Arc<dyn Instance> = Arc::from(instance);
        let id = instance.id().clone();
        let record = match self.store().set_running(&id, instance.pid().unwrap_or(0)) {
            Ok(record) => record,
            Err(e) => {
                instance.kill();
                let _ = instance.wait();
                let _ = self.store().mark_dead(&id, None, &EndCause::CreateFailed);
                return Err(e.into());
            }
        };
        let env: BTreeMap<String, String> = spec
            .env
            .iter()
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect();
        if let Some(link) = &net {
            // Its injections read its own secrets, then its tenant's, and
            // need its CA trusted.
            link.net
                .set_secrets(Arc::new(crate::secrets::TenantSecrets {
                    reader: Arc::clone(&self.secret_reader),
                    tenant: tenant.clone(),
                    own: crate::secrets::TenantSecrets::own_from(&record.attrs),
                }));
            if link.net.injects() {
                self.trust_ca(&conn, &id, link);
            }
        }
        let live = Arc::new(Live {
            tenant: tenant.clone(),
            conn: Arc::new(conn),
            instance,
            ending: Mutex::default(),
            env,
            lifecycle: Mutex::default(),
            adopted: false,
            net,
            _layers: self.snapshot_lease(&spec.template),
        });
        lock(&self.live).insert(id.clone(), live);
        self.events.publish(&id, tenant, EventKind::Created);
        Ok(record)
    }

    /// One step of keeping the pool full: make a sandbox for the first
    /// template short of its target. Returns how long to wait before the
    /// next step (`None`: go on at once). Runs on the filler thread.
    fn fill_once(&self) -> Option<Duration> {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            return Some(Duration::from_millis(10));
        }
        let Some(reserved) = self.pool.reserve() else {
            return Some(Duration::from_secs(1));
        };
        let mut spec = agent_spec(reserved.template.clone(), self.pool.limits());
        spec.allow_setuid = reserved.setuid;
        // Linked like any sandbox, under `none` until a create claims it.
        let id = SandboxId::from_random(rand::random());
        let made = self.tier(Isolation::Process).and_then(|tier| {
            let (attachment, link) = self.link(&id, brig_net::Policy::none())?;
            let mut warm = self.launch(&**tier, &id, &spec, attachment, Vec::new(), None)?;
            warm.net = link;
            Ok(warm)
        });
        match made {
            Ok(warm) => {
                // Put and unreserve at once: no other filler sees a gap. One
                // of a rootfs rebuilt meanwhile comes back and is dropped.
                drop(self.pool.put(&reserved, warm));
                None
            }
            // Shutting down: the filler stops at its next look at the flag.
            Err(_) if self.closing.load(Ordering::SeqCst) => {
                self.pool.unreserve(&reserved);
                None
            }
            Err(e) => {
                self.pool.unreserve(&reserved);
                // A template that cannot start must not spin: try again
                // later, and say why.
                let setuid = if reserved.setuid { " (setuid)" } else { "" };
                tracing::warn!(
                    "pre-made sandbox pool for {}{setuid}: {e}",
                    reserved.template
                );
                Some(Duration::from_secs(5))
            }
        }
    }

    /// One of `tenant`'s sandboxes.
    pub fn get(&self, tenant: &TenantId, id: &SandboxId) -> Result<SandboxRecord, ManagerError> {
        Ok(self.store().get_sandbox(Scope::Tenant(tenant), id)?)
    }

    /// A page of `tenant`'s sandboxes.
    pub fn list(
        &self,
        tenant: &TenantId,
        filter: &ListFilter,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, ManagerError> {
        Ok(self.store().list_sandboxes(tenant, filter, after, limit)?)
    }

    /// Make the sandbox expire `timeout` from now (capped at the server's
    /// maximum).
    pub fn extend(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        timeout: Duration,
    ) -> Result<SandboxRecord, ManagerError> {
        let timeout = self.cap_timeout(timeout)?;
        // A paused sandbox keeps the new time to live for its resume.
        if let Some(record) = self.extend_paused(tenant, id, timeout)? {
            return Ok(record);
        }
        Ok(self
            .store()
            .extend_timeout(Scope::Tenant(tenant), id, timeout)?)
    }

    /// Kill the sandbox and wait until it is torn down. Deleting a sandbox
    /// that has already ended changes nothing and returns its record.
    pub fn delete(&self, tenant: &TenantId, id: &SandboxId) -> Result<SandboxRecord, ManagerError> {
        let record = self.get(tenant, id)?;
        if record.state.is_final() {
            return Ok(record);
        }
        let cause = EndCause::Deleted {
            by: tenant.as_str().to_string(),
        };
        match self.live_sandbox(id) {
            Some(live) => self.end_and_wait(&live, SandboxState::Stopped, cause),
            // Live in the store but not in this daemon: nothing to kill.
            None => {
                self.store().end_sandbox(
                    Scope::Tenant(tenant),
                    id,
                    SandboxState::Stopped,
                    None,
                    &cause,
                )?;
            }
        }
        self.get(tenant, id)
    }

    /// Forget an ended sandbox's record (a live one is refused).
    pub fn remove(&self, tenant: &TenantId, id: &SandboxId) -> Result<(), ManagerError> {
        Ok(self.store().remove_sandbox(Scope::Tenant(tenant), id)?)
    }

    /// Start a process in the sandbox. Returns once the agent has started
    /// it (or refused to).
    pub fn exec(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        req: &ExecRequest,
    ) -> Result<Process, ManagerError> {
        let conn = self.connection(tenant, id)?;
        conn.exec(&self.with_sandbox_env(id, req))
            .map_err(agent_err(id))
    }

    /// [`SandboxManager::exec`] for an async caller: waits for the agent's
    /// `started` without holding a thread.
    pub async fn exec_async(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        req: &ExecRequest,
    ) -> Result<Process, ManagerError> {
        let conn = self.connection(tenant, id)?;
        let within = conn.answer_timeout();
        // The blocking form waits on a condvar with the deadline; here a
        // timer does it.
        match tokio::time::timeout(within, conn.exec_async(&self.with_sandbox_env(id, req))).await {
            Ok(started) => started.map_err(agent_err(id)),
            Err(_) => Err(agent_err(id)(ClientError::NoAnswer {
                stream: 0,
                waited: within,
            })),
        }
    }

    /// The request with the sandbox's create-time environment under its
    /// own.
    fn with_sandbox_env<'a>(&self, id: &SandboxId, req: &'a ExecRequest) -> Cow<'a, ExecRequest> {
        let Some(live) = self.live_sandbox(id) else {
            return Cow::Borrowed(req);
        };
        // A sandbox that trusts its CA points its processes at it (unless
        // its own variables or the request's say otherwise).
        let ca = live
            .net
            .as_ref()
            .is_some_and(|l| l.trusted.load(Ordering::Relaxed));
        if live.env.is_empty() && !ca {
            return Cow::Borrowed(req);
        }
        let mut req = req.clone();
        for (k, v) in &live.env {
            req.env.entry(k.clone()).or_insert_with(|| v.clone());
        }
        if ca {
            for (k, v) in brig_net::tls::CA_ENV {
                req.env
                    .entry(k.to_string())
                    .or_insert_with(|| v.to_string());
            }
        }
        Cow::Owned(req)
    }

    /// Have sandbox `id` trust its CA (made now if it was not), for the
    /// headers its policy injects over TLS: written into it (`write_ca`),
    /// kept on its record for a later daemon, and its later processes
    /// pointed at it. Made when first needed rather than for every sandbox:
    /// most never inject, and the bundle costs each one ~220 KB of memory.
    /// Processes that loaded their trust store before (a running Node
    /// process, say) do not see it. A failure is logged: injection to TLS
    /// hosts then fails in that sandbox only.
    fn trust_ca(&self, conn: &Connection, id: &SandboxId, link: &NetLink) {
        if link.trusted.load(Ordering::Relaxed) {
            return;
        }
        let ca = match link.net.ca() {
            Ok(ca) => ca,
            Err(e) => {
                tracing::warn!("sandbox {id}: cannot make its certificate authority: {e}");
                return;
            }
        };
        if !write_ca(conn, id, &ca) {
            return;
        }
        let kept = serde_json::json!({"pem": ca.pem(), "key": ca.key_pem()});
        if let Err(e) = self.store().set_attrs(id, CA_ATTR, &kept) {
            tracing::warn!("sandbox {id}: cannot keep its certificate authority: {e}");
        }
        link.trusted.store(true, Ordering::Relaxed);
    }

    /// Re-attach to a process the agent manages (a background one, running
    /// or finished): its buffered output, then live output until it exits.
    pub fn attach(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        pid: i32,
    ) -> Result<Process, ManagerError> {
        let conn = self.connection(tenant, id)?;
        conn.attach(pid).map_err(agent_err(id))
    }

    /// Read the sandbox's log: what its background processes printed (the
    /// agent keeps the last [`LOG_KEEP`](brig_agent_client::LOG_KEEP)
    /// bytes), then, with `follow`, output as it comes.
    pub async fn logs_async(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        req: &LogsRequest,
    ) -> Result<LogReader, ManagerError> {
        let conn = self.connection(tenant, id)?;
        conn.logs_async(req).await.map_err(agent_err(id))
    }

    /// A one-shot request to the agent: list, stat, mkdir, rename, remove,
    /// list processes, signal.
    pub fn call(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        call: &Call,
    ) -> Result<Reply, ManagerError> {
        let conn = self.connection(tenant, id)?;
        conn.call(call).map_err(agent_err(id))
    }

    /// Open a file in the sandbox for a streaming read.
    pub fn read_file(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        path: &str,
    ) -> Result<FileReader, ManagerError> {
        let conn = self.connection(tenant, id)?;
        conn.read_file(path).map_err(agent_err(id))
    }

    /// Stream `contents` into a file in the sandbox; returns the bytes
    /// written.
    pub fn write_file(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        path: &str,
        contents: impl std::io::Read,
    ) -> Result<u64, ManagerError> {
        self.write_file_as(tenant, id, path, contents, None)
    }

    /// [`Manager::write_file`] as a user of the sandbox: the agent opens
    /// (and creates) the file with that user's uid and gid, so the
    /// kernel's permission checks are that user's.
    pub fn write_file_as(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        path: &str,
        contents: impl std::io::Read,
        owner: Option<brig_agent_client::FileOwner>,
    ) -> Result<u64, ManagerError> {
        let conn = self.connection(tenant, id)?;
        conn.write_file_as(path, contents, None, false, owner)
            .map_err(agent_err(id))
    }

    /// Refuse new sandboxes, end every live one (waiting for each
    /// teardown), and stop the manager's threads.
    pub fn shutdown(&self) {
        self.stop(OnStop::End);
    }

    /// Refuse new sandboxes, stop the manager's threads, and end or keep
    /// the live sandboxes (see [`OnStop`]). Pre-made sandboxes are ended
    /// either way.
    pub fn stop(&self, on_stop: OnStop) {
        self.closing.store(true, Ordering::SeqCst);
        lock(&self.sweeper_stop).take();
        self.pool.wake();
        let live: Vec<Arc<Live>> = lock(&self.live).values().cloned().collect();
        match on_stop {
            OnStop::End => {
                let waits: Vec<_> = live
                    .iter()
                    .filter_map(|l| self.end(l, SandboxState::Stopped, EndCause::Shutdown))
                    .collect();
                for done in waits {
                    let _ = done.recv_timeout(TEARDOWN_WAIT);
                }
            }
            OnStop::Keep => {
                for l in &live {
                    l.instance.release();
                }
                if !live.is_empty() {
                    tracing::info!("left {} sandboxes running for the next daemon", live.len());
                }
            }
        }
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        // Dropping a pre-made sandbox ends it and waits for its teardown.
        drop(self.pool.drain());
        // Volumes whose sandboxes ended are unmounted now, not at the next
        // start (those of sandboxes left running stay mounted).
        self.release_volumes();
    }

    /// Pre-made sandboxes per template: (template, idle now, target).
    pub fn pool_sizes(&self) -> Vec<(String, usize, usize)> {
        self.pool.sizes()
    }

    /// Creates served from the pool since the start.
    pub fn pool_claims(&self) -> u64 {
        self.pool.served()
    }

    /// Sandboxes this daemon tore down since it started, by cause name.
    pub fn end_counts(&self) -> Vec<(&'static str, u64)> {
        self.ends.snapshot()
    }

    /// Every live sandbox's resource use, read from its tier now (for the
    /// per-sandbox Prometheus series): id, tenant, usage. A sandbox whose
    /// tier cannot answer (it is ending) is left out.
    pub fn live_usage(&self) -> Vec<(SandboxId, TenantId, brig_core::Usage)> {
        let live: Vec<(SandboxId, Arc<Live>)> = lock(&self.live)
            .iter()
            .map(|(id, l)| (id.clone(), Arc::clone(l)))
            .collect();
        live.into_iter()
            .filter_map(|(id, l)| Some((id, l.tenant.clone(), l.instance.usage().ok()?)))
            .collect()
    }

    /// The network counters of every live sandbox linked to the gateway:
    /// (id, tenant, bytes out, bytes in, connections allowed, denied).
    pub fn live_network(&self) -> Vec<(SandboxId, TenantId, [u64; 4])> {
        lock(&self.live)
            .iter()
            .filter_map(|(id, l)| {
                let c = &l.net.as_ref()?.net.counters;
                let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
                Some((
                    id.clone(),
                    l.tenant.clone(),
                    [n(&c.bytes_out), n(&c.bytes_in), n(&c.allowed), n(&c.denied)],
                ))
            })
            .collect()
    }

    /// An exec ran into its timeout and was killed (a front-end says so).
    pub fn note_exec_timeout(&self) {
        self.exec_timeouts.fetch_add(1, Ordering::Relaxed);
    }

    /// Execs killed at their timeout since this daemon started.
    pub fn exec_timeouts(&self) -> u64 {
        self.exec_timeouts.load(Ordering::Relaxed)
    }

    /// The number of sandboxes this daemon is running.
    pub fn live_count(&self) -> usize {
        lock(&self.live).len()
    }

    /// Whether this daemon is running sandbox `id` (paused or not): false
    /// once its end is recorded, before [`EventKind::Ended`] is published.
    pub fn is_live(&self, id: &SandboxId) -> bool {
        lock(&self.live).contains_key(id)
    }

    /// Whether `id` is gone or on its way out (its end has begun: a kill,
    /// an expiry, a shutdown): what a front-end asks when a stream into it
    /// broke off, to tell the sandbox's end from a process's.
    pub fn is_ending(&self, id: &SandboxId) -> bool {
        self.live_sandbox(id)
            .is_none_or(|live| lock(&live.ending).started)
    }

    /// Whether `id` is live and was started by an earlier daemon (re-adopted
    /// at this one's start): a front-end's state about it must come back
    /// from its record or its agent.
    pub fn was_adopted(&self, id: &SandboxId) -> bool {
        self.live_sandbox(id).is_some_and(|l| l.adopted)
    }

    /// Whether `id` is one of `tenant`'s live sandboxes and is not paused:
    /// whether a call into it would be answered now.
    pub fn is_running(&self, tenant: &TenantId, id: &SandboxId) -> bool {
        self.live_sandbox(id)
            .is_some_and(|live| &live.tenant == tenant && !live.is_paused())
    }

    /// Every [`Event`] from now on: creates, pauses, resumes and ends of
    /// this daemon's sandboxes (see `events.rs`).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub(crate) fn events(&self) -> &Events {
        &self.events
    }

    pub(crate) fn cap_timeout(&self, timeout: Duration) -> Result<Duration, ManagerError> {
        if timeout.is_zero() {
            return Err(ManagerError::BadRequest {
                reason: "timeout must be positive, for example 30s or 10m".into(),
            });
        }
        Ok(timeout.min(self.config.max_timeout))
    }

    pub(crate) fn live_sandbox(&self, id: &SandboxId) -> Option<Arc<Live>> {
        lock(&self.live).get(id).cloned()
    }

    /// The tenant a live sandbox belongs to (for a front-end that routes a
    /// request by the sandbox's id before it knows who asks, and then checks
    /// a token the sandbox's record keeps).
    pub fn live_tenant(&self, id: &SandboxId) -> Option<TenantId> {
        self.live_sandbox(id).map(|live| live.tenant.clone())
    }

    /// The agent connection of a running sandbox of `tenant`'s. A front-end
    /// may hold it weakly to tell when state it keeps per sandbox (the
    /// native API's parked process attachments) has outlived the sandbox.
    pub fn connection(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Result<Arc<Connection>, ManagerError> {
        match self.live_sandbox(id) {
            // A frozen agent would never answer: say so instead of hanging.
            Some(live) if &live.tenant == tenant && live.is_paused() => {
                Err(ManagerError::Paused { id: id.clone() })
            }
            Some(live) if &live.tenant == tenant => Ok(Arc::clone(&live.conn)),
            // Another tenant's is reported exactly like a missing one.
            Some(_) => Err(SandboxError::NotFound { id: id.clone() }.into()),
            None => {
                let record = self.get(tenant, id)?;
                Err(ManagerError::NotRunning {
                    id: id.clone(),
                    state: record.state,
                })
            }
        }
    }

    /// End a sandbox: kill it, wait for its teardown and record the end, on
    /// a short-lived thread of its own (only the first request starts one).
    /// Returns where to wait for the teardown (`None` if it is over).
    fn end(
        &self,
        live: &Arc<Live>,
        state: SandboxState,
        cause: EndCause,
    ) -> Option<mpsc::Receiver<()>> {
        let (done_tx, done_rx) = mpsc::channel();
        {
            let mut ending = lock(&live.ending);
            if ending.done {
                return None;
            }
            ending.waiters.push(done_tx);
            if ending.started {
                return Some(done_rx);
            }
            ending.started = true;
        }
        let store_path = self.store().path().to_path_buf();
        let job = {
            let (live, map, events, ends) = (
                Arc::clone(live),
                Arc::clone(&self.live),
                self.events.clone(),
                Arc::clone(&self.ends),
            );
            move || {
                let cause = teardown(&live, state, cause, &store_path, &map, &events);
                ends.count(&cause);
            }
        };
        let thread = thread::Builder::new()
            .name(format!("brig-end-{}", live.instance.id()))
            .stack_size(TEARDOWN_STACK)
            .spawn(job);
        if let Err(e) = thread {
            // No thread to be had: the sweeper tries again next pass.
            tracing::warn!(
                "sandbox {}: cannot start its teardown: {e}",
                live.instance.id()
            );
            let mut ending = lock(&live.ending);
            ending.started = false;
            ending.waiters.clear();
            return None;
        }
        Some(done_rx)
    }

    fn end_and_wait(&self, live: &Arc<Live>, state: SandboxState, cause: EndCause) {
        if let Some(done) = self.end(live, state, cause) {
            let _ = done.recv_timeout(TEARDOWN_WAIT);
        }
    }

    /// One pass of the sweeper: end expired sandboxes and those whose agent
    /// is gone.
    fn sweep(&self) {
        self.collect_fork_snapshots();
        self.release_volumes();
        let expired = match self.store().expired_sandboxes() {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!("expiry sweep: {e}");
                Vec::new()
            }
        };
        for record in expired {
            match self.live_sandbox(&record.id) {
                Some(live) if self.paused_on_timeout(&record.id, &live) => {}
                // Fire and forget: the supervisor records the end.
                Some(live) => drop(self.end(&live, SandboxState::Stopped, EndCause::Timeout)),
                None => {
                    let _ = self.store().end_sandbox(
                        Scope::Daemon,
                        &record.id,
                        SandboxState::Stopped,
                        None,
                        &EndCause::Timeout,
                    );
                }
            }
        }
        // A sandbox being checkpointed has let go of its agent's
        // connection on purpose: the snapshot connects again.
        let snapshotting = lock(&self.snapshotting).clone();
        let gone: Vec<Arc<Live>> = lock(&self.live)
            .iter()
            .filter(|(id, l)| l.conn.is_closed() && !snapshotting.contains(*id))
            .map(|(_, l)| Arc::clone(l))
            .collect();
        for live in gone {
            // The teardown learns the agent's status (and an OOM kill).
            drop(self.end(
                &live,
                SandboxState::Dead,
                EndCause::AgentExited { code: None },
            ));
        }
    }
}

/// A sandbox's end: kill it, wait for the whole teardown, record how it
/// ended, forget it, announce it, and wake whoever waits.
///
/// The record is written through a store of its own: the manager may be
/// gone (or its store lock held by a caller waiting on this teardown).
fn teardown(
    live: &Live,
    state: SandboxState,
    cause: EndCause,
    store_path: &Path,
    map: &LiveMap,
    events: &Events,
) -> EndCause {
    let id = live.instance.id().clone();
    // Read before the kill: the tier cannot tell once the sandbox is gone.
    let memory_limit = match state {
        SandboxState::Dead => live.instance.usage().ok().map(|u| u.memory_limit_bytes),
        _ => None,
    };
    live.instance.kill();
    let ended = live.instance.wait();
    let code = ended.as_ref().ok().and_then(|e| e.code);
    if let Err(e) = &ended {
        tracing::warn!("sandbox {id}: teardown: {}", chain(e));
    }
    // A sandbox that ended by itself after the OOM killer fired in it
    // ended of that; one brig ended keeps brig's reason.
    let cause = match (state, &ended) {
        (SandboxState::Dead, Ok(e)) if e.oom => EndCause::OutOfMemory {
            memory_limit_bytes: memory_limit,
        },
        (SandboxState::Dead, _) => match cause {
            EndCause::AgentExited { .. } => EndCause::AgentExited { code },
            other => other,
        },
        _ => cause,
    };
    match Store::open(store_path) {
        Ok(store) => {
            let _ = store.end_sandbox(Scope::Daemon, &id, state, code, &cause);
        }
        Err(e) => tracing::warn!("sandbox {id}: cannot record its end: {e}"),
    }
    if let Some(link) = &live.net {
        link.gateway.forget(&link.net);
    }
    // No longer live before anyone hears of the end: a listener that checks
    // `is_live` after the event never finds it live again.
    lock(map).remove(&id);
    events.publish(&id, &live.tenant, EventKind::Ended { state, code });
    let waiters = {
        let mut ending = lock(&live.ending);
        ending.done = true;
        std::mem::take(&mut ending.waiters)
    };
    for w in waiters {
        let _ = w.send(());
    }
    cause
}

fn agent_err(id: &SandboxId) -> impl FnOnce(ClientError) -> ManagerError + '_ {
    move |source| ManagerError::Agent {
        id: id.clone(),
        source,
    }
}

/// Lock a mutex; a panic elsewhere while holding it does not make the
/// daemon's state unusable (every critical section leaves it consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
