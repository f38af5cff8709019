//! [`SandboxManager`]: the daemon's live sandboxes, drivable without HTTP.
//!
//! Every sandbox is `brig-agent --stdio` in a process-tier sandbox, spoken
//! to over one end of a socketpair through a [`Connection`]; the other end
//! is the agent's stdin/stdout ([`brig_jail::Extras`]). The manager owns
//! three kinds of thread, all plain `std::thread`s:
//!
//! - **the spawner** (one, `brig-spawner`): every sandbox is cloned from
//!   it. `PR_SET_PDEATHSIG` fires when the *thread* that cloned a sandbox's
//!   init exits, so sandboxes must come from a thread that lives as long as
//!   the daemon — not from tokio's blocking pool, whose idle threads exit
//!   and would take their sandboxes with them. The thread lives until
//!   [`SandboxManager::shutdown`] (or the daemon's death, which is then
//!   exactly when the sandboxes should die).
//! - **a supervisor per sandbox** (`brig-sb-<id>`): owns the
//!   [`Sandbox`], blocks until it is told to end it (delete, expiry, the
//!   agent gone, shutdown), then kills it, waits for the whole teardown
//!   (cgroups removed, slot released) and records how it ended.
//! - **the sweeper** (one, `brig-sweeper`): every
//!   [`ManagerConfig::sweep_interval`] it ends sandboxes whose timeout
//!   passed (even with no client connected) and those whose agent hung up.
//!
//! State goes to the [`Store`] as it changes: a record is inserted once the
//! sandbox exists (the jail picks the id), `running` once the agent has
//! answered the handshake, `stopped` when brig ended it (delete, timeout,
//! shutdown) and `dead` when it ended by itself.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use brig_agent_client::{Call, ClientError, Connection, ExecRequest, FileReader, Process, Reply};
use brig_core::{EnvVar, Limits, SandboxId, SandboxSpec, SpecError, TemplateRef};
use brig_jail::{Extras, JailError, Sandbox, SpawnOptions};

use crate::error::ErrorKind;
use crate::events::{Event, EventKind, Events};
use crate::pool::{Pool, PoolTarget, Warm};
use crate::sandboxes::{Cursor, ListFilter, NewSandbox, Page, SandboxError, SandboxState, Scope};
use crate::{AuthError, SandboxRecord, Store, StoreError, TenantId};

/// Threads that clone sandboxes (see `SandboxManager::start`).
const SPAWNERS: usize = 4;
/// Threads that keep the pool full, each one spawn at a time.
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

/// A supervisor only waits, kills and cleans up: a small stack keeps a
/// thousand of them cheap.
const SUPERVISOR_STACK: usize = 128 * 1024;

/// The sandbox every agent runs in: the agent as its command, no time
/// limit of its own (the manager ends it).
fn agent_spec(template: TemplateRef, limits: Limits) -> SandboxSpec {
    let mut spec = SandboxSpec::new(vec!["brig-agent".into(), "--stdio".into()]);
    spec.template = template;
    spec.limits = limits;
    spec.limits.timeout = None;
    spec
}

/// The environment variable that overrides where the agent binary is.
pub const AGENT_ENV: &str = "BRIG_AGENT";

/// How the manager runs.
#[derive(Debug, Clone)]
pub struct ManagerConfig {
    /// The `brig-agent` executable started in every sandbox.
    pub agent: PathBuf,
    pub default_timeout: Duration,
    /// Requests for longer timeouts are capped to this.
    pub max_timeout: Duration,
    /// How often the sweeper looks for expired sandboxes and dead agents.
    pub sweep_interval: Duration,
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
}

impl ManagerConfig {
    pub fn new(agent: PathBuf) -> ManagerConfig {
        ManagerConfig {
            agent,
            default_timeout: DEFAULT_TIMEOUT,
            max_timeout: DEFAULT_MAX_TIMEOUT,
            sweep_interval: Duration::from_secs(1),
            pool: vec![PoolTarget {
                template: TemplateRef::Host,
                setuid: false,
                size: DEFAULT_POOL,
            }],
            template_roots: Vec::new(),
            home: None,
        }
    }
}

/// Where the agent binary is: `$BRIG_AGENT`, else `brig-agent` next to the
/// running executable (how it is installed and how cargo builds it).
pub fn find_agent() -> Result<PathBuf, ManagerError> {
    let path = match std::env::var_os(AGENT_ENV) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()
            .map_err(|source| ManagerError::Io {
                op: "find the running executable",
                source,
            })?
            .with_file_name("brig-agent"),
    };
    if !path.is_file() {
        return Err(ManagerError::NoAgent { path });
    }
    Ok(path)
}

/// What a client asks for when it creates a sandbox, already parsed.
#[derive(Debug, Clone)]
pub struct CreateConfig {
    pub template: TemplateRef,
    /// `limits.timeout` is ignored: the sandbox's life is `timeout` below.
    pub limits: Limits,
    pub env: Vec<EnvVar>,
    pub labels: BTreeMap<String, String>,
    /// `None`: [`ManagerConfig::default_timeout`].
    pub timeout: Option<Duration>,
    /// Let setuid binaries (`sudo`) work inside the sandbox
    /// ([`SandboxSpec::allow_setuid`]). For E2B sandboxes, whose user
    /// `user` has passwordless sudo; off otherwise.
    pub allow_setuid: bool,
}

impl Default for CreateConfig {
    fn default() -> Self {
        CreateConfig {
            template: TemplateRef::Host,
            limits: Limits::default(),
            env: Vec::new(),
            labels: BTreeMap::new(),
            timeout: None,
            allow_setuid: false,
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
    #[error("sandbox {id} is {state}, not running (an ended sandbox cannot be used again: create a new one)")]
    NotRunning { id: SandboxId, state: SandboxState },
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start a sandbox")]
    Spawn(#[source] JailError),
    #[error(
        "the agent binary {path} does not exist: build it (cargo build -p brig-agent) or set \
         BRIG_AGENT to its path"
    )]
    NoAgent { path: PathBuf },
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
    #[error("sandbox {id}: cannot {op}")]
    Cgroup {
        id: SandboxId,
        op: &'static str,
        #[source]
        source: brig_jail::cgroup::CgroupError,
    },
    #[error("the spawner thread is gone")]
    SpawnerGone,
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
                _ => ErrorKind::Internal,
            },
            ManagerError::Paused { .. } => ErrorKind::Paused,
            ManagerError::AlreadyPaused { .. } | ManagerError::NotPaused { .. } => {
                ErrorKind::Conflict
            }
            ManagerError::Cgroup {
                source: brig_jail::cgroup::CgroupError::NoGroup { .. },
                ..
            } => ErrorKind::Unsupported,
            ManagerError::TemplateNotAllowed { .. } => ErrorKind::Forbidden,
            ManagerError::Spawn(
                JailError::Spec(_) | JailError::Template(_) | JailError::NoCpuController,
            ) => ErrorKind::BadRequest,
            ManagerError::Template { .. } | ManagerError::ShuttingDown => ErrorKind::Unavailable,
            ManagerError::Spawn(_)
            | ManagerError::NoAgent { .. }
            | ManagerError::Handshake { .. }
            | ManagerError::Io { .. }
            | ManagerError::Cgroup { .. }
            | ManagerError::SpawnerGone => ErrorKind::Internal,
        }
    }
}

/// How a supervisor is told to end its sandbox.
struct Ending {
    /// `stopped` (brig's choice) or `dead` (the agent went away).
    state: SandboxState,
    /// Told once the sandbox is fully torn down.
    done: Option<mpsc::Sender<()>>,
}

/// A sandbox this daemon started and that has not ended yet.
pub(crate) struct Live {
    pub(crate) tenant: TenantId,
    pub(crate) conn: Arc<Connection>,
    end: Mutex<mpsc::Sender<Ending>>,
    /// Create-time environment variables, given to every process it
    /// starts (under the request's own).
    env: BTreeMap<String, String>,
    /// Its cgroups (freeze, thaw, statistics), usable while the supervisor
    /// owns the [`Sandbox`].
    pub(crate) controls: brig_jail::CgroupControls,
    /// Paused or not, and the last metrics sample (see `lifecycle.rs`).
    pub(crate) lifecycle: Mutex<crate::lifecycle::Lifecycle>,
}

type LiveMap = Arc<Mutex<HashMap<SandboxId, Arc<Live>>>>;

/// A request to the spawner thread.
struct SpawnJob {
    spec: SandboxSpec,
    extras: Extras,
    reply: mpsc::SyncSender<Result<Sandbox, JailError>>,
}

/// The daemon's sandboxes: create, inspect, drive and end them.
pub struct SandboxManager {
    config: ManagerConfig,
    store: Mutex<Store>,
    /// Shared with the supervisors, which remove their own entry once the
    /// end is recorded.
    pub(crate) live: LiveMap,
    spawner: Mutex<Option<mpsc::Sender<SpawnJob>>>,
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
}

impl std::fmt::Debug for SandboxManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxManager")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SandboxManager {
    /// Reconcile what an earlier daemon left behind, then start the spawner
    /// and the sweeper.
    ///
    /// Sandboxes of an earlier daemon died with it (`PR_SET_PDEATHSIG`), so
    /// every record still live is marked dead, and
    /// [`SpawnOptions::prepare`] removes their leftover cgroups.
    pub fn start(store: Store, config: ManagerConfig) -> Result<Arc<SandboxManager>, ManagerError> {
        let mut opts = SpawnOptions::prepare().map_err(ManagerError::Spawn)?;
        // Every daemon sandbox can be paused and reports its CPU use.
        opts.pausable = true;
        store.reconcile(|_, _| false)?;
        // Builds of named templates that a rebuild replaced: no sandbox of
        // this daemon runs on them yet (`brig run`s hold leases).
        if let Some(home) = &config.home {
            let freed = brig_template::prune(home);
            if freed > 0 {
                tracing::info!("removed old template builds: {} MiB", freed >> 20);
            }
        }
        let pool = Arc::new(Pool::new(config.pool.clone(), config.home.as_deref()));
        // Every sandbox holds a handful of descriptors here (pidfd, agent
        // socket, slot and liveness locks, OOM eventfd): a thousand need
        // more than the usual soft limit of 1024.
        if let Err(e) = brig_jail::raise_fd_limit() {
            tracing::warn!("cannot raise the open-file limit: {e}");
        }

        // Several spawners: most of a spawn's time is spent waiting, not
        // computing (moving the init into its first cgroup waits for an RCU
        // grace period, 3-15 ms on this VM, on cgroup v1), and concurrent
        // spawns share those waits.
        let (spawn_tx, spawn_rx) = mpsc::channel::<SpawnJob>();
        let (opts, jobs) = (Arc::new(opts), Arc::new(Mutex::new(spawn_rx)));
        let mut spawners = Vec::new();
        for n in 0..SPAWNERS {
            let (opts, jobs) = (Arc::clone(&opts), Arc::clone(&jobs));
            let spawner = thread::Builder::new()
                .name(format!("brig-spawner-{n}"))
                .spawn(move || loop {
                    let job = match lock(&jobs).recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    };
                    // A job whose requester went away drops its Sandbox
                    // here, which kills and reaps it.
                    let result = Sandbox::spawn_with(&job.spec, &opts, job.extras);
                    let _ = job.reply.send(result);
                })
                .map_err(|source| ManagerError::Io {
                    op: "start a spawner thread",
                    source,
                })?;
            spawners.push(spawner);
        }

        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let manager = Arc::new(SandboxManager {
            config,
            store: Mutex::new(store),
            live: Arc::new(Mutex::new(HashMap::new())),
            spawner: Mutex::new(Some(spawn_tx)),
            threads: Mutex::new(spawners),
            closing: AtomicBool::new(false),
            sweeper_stop: Mutex::new(Some(stop_tx)),
            pool,
            waiting: AtomicUsize::new(0),
            events: Events::new(),
        });
        // The sweeper holds only a weak reference, so dropping the manager
        // without `shutdown` still lets it go.
        let weak = Arc::downgrade(&manager);
        let interval = manager.config.sweep_interval;
        let sweeper = thread::Builder::new()
            .name("brig-sweeper".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stop_rx.recv_timeout(interval) {
                    match weak.upgrade() {
                        Some(m) => m.sweep(),
                        None => return,
                    }
                }
            })
            .map_err(|source| ManagerError::Io {
                op: "start the sweeper thread",
                source,
            })?;
        lock(&manager.threads).push(sweeper);

        // The fillers, like the sweeper, hold the manager weakly; they wait
        // on the pool itself, which they hold strongly. Two, so that their
        // spawns overlap (see SPAWNERS).
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

    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// The store, for what the manager does not wrap (keys, tenants).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }

    /// Which tenant a presented API key belongs to.
    pub fn authenticate(&self, key: &str) -> Result<TenantId, AuthError> {
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
        let template = self.allowed_template(req.template)?;
        let mut spec = agent_spec(template, req.limits);
        spec.env = req.env;
        spec.allow_setuid = req.allow_setuid;
        spec.validate()?;

        let warm = match self.claim(&spec)? {
            Some(warm) => warm,
            None => {
                let mut fresh = spec.clone();
                fresh.env.clear();
                // The filler steps aside while a client waits on a spawn.
                self.waiting.fetch_add(1, Ordering::SeqCst);
                let made = self.spawn_agent(&fresh);
                self.waiting.fetch_sub(1, Ordering::SeqCst);
                made?
            }
        };
        self.adopt(tenant, warm, &spec, req.labels, timeout)
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
    fn allowed_template(&self, template: TemplateRef) -> Result<TemplateRef, ManagerError> {
        if let TemplateRef::Named(name) = &template {
            // An unknown name is the client's mistake: a 400 listing the
            // known ones, before anything touches the disk.
            brig_template::recipe(name).map_err(|e| ManagerError::BadRequest {
                reason: e.to_string(),
            })?;
            let Some(home) = &self.config.home else {
                return Err(ManagerError::BadRequest {
                    reason: format!(
                        "named templates such as {name:?} are not enabled on this daemon"
                    ),
                });
            };
            let rootfs = brig_template::ensure(home, name, brig_template::Progress::Lines)
                .map_err(|source| ManagerError::Template {
                    name: name.clone(),
                    source: Box::new(source),
                })?;
            let rootfs = TemplateRef::Dir(rootfs);
            // Built now if it was not: its pools (if any) start filling.
            drop(self.pool.resolve(name, &rootfs));
            return Ok(rootfs);
        }
        let TemplateRef::Dir(path) = &template else {
            return Ok(template);
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
        Ok(TemplateRef::Dir(real))
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
        let made = Pool::limits();
        if spec.limits.memory != made.memory || spec.limits.pids != made.pids {
            if let Some(controls) = warm.sandbox.controls() {
                controls
                    .set_limits(&spec.limits)
                    .map_err(|source| ManagerError::Cgroup {
                        id: warm.sandbox.id().clone(),
                        op: "set the limits of a pre-made sandbox",
                        source,
                    })?;
            }
        }
        Ok(Some(warm))
    }

    /// Start the agent in a new sandbox (on the spawner thread) and wait
    /// for its handshake. Nothing is recorded: an error drops the sandbox,
    /// which kills and reaps it.
    fn spawn_agent(&self, spec: &SandboxSpec) -> Result<Warm, ManagerError> {
        let program = File::open(&self.config.agent).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                ManagerError::NoAgent {
                    path: self.config.agent.clone(),
                }
            } else {
                ManagerError::Io {
                    op: "open the agent binary",
                    source,
                }
            }
        })?;
        let (ours, theirs) = UnixStream::pair().map_err(|source| ManagerError::Io {
            op: "create the agent's socketpair",
            source,
        })?;
        let (reply_tx, reply_rx) = mpsc::sync_channel(1);
        let job = SpawnJob {
            spec: spec.clone(),
            extras: Extras {
                program: Some(OwnedFd::from(program)),
                stdio: Some(OwnedFd::from(theirs)),
                // The agent reaps orphans itself; as pid 1 it leaves no
                // copy of the daemon's memory in the sandbox.
                as_init: true,
                ..Default::default()
            },
            reply: reply_tx,
        };
        lock(&self.spawner)
            .as_ref()
            .ok_or(ManagerError::ShuttingDown)?
            .send(job)
            .map_err(|_| ManagerError::SpawnerGone)?;
        let sandbox = reply_rx
            .recv()
            .map_err(|_| ManagerError::SpawnerGone)?
            .map_err(ManagerError::Spawn)?;
        let conn = Connection::new(ours).map_err(|source| ManagerError::Handshake {
            id: sandbox.id().clone(),
            source,
        })?;
        Ok(Warm { sandbox, conn })
    }

    /// Make a running sandbox `tenant`'s: its record, its place among the
    /// live ones, its supervisor.
    fn adopt(
        &self,
        tenant: &TenantId,
        warm: Warm,
        spec: &SandboxSpec,
        labels: BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<SandboxRecord, ManagerError> {
        let Warm { sandbox, conn } = warm;
        let id = sandbox.id().clone();
        let Some(controls) = sandbox.controls() else {
            return Err(ManagerError::Io {
                op: "find the new sandbox's cgroups",
                source: std::io::Error::other("the sandbox has no cgroups"),
            });
        };

        // From here on, an error return drops `sandbox`, which kills and
        // reaps it; a record already written is then marked dead.
        let spec_json = serde_json::to_value(spec).unwrap_or(serde_json::Value::Null);
        self.store().insert_sandbox(&NewSandbox {
            id: id.clone(),
            tenant: tenant.clone(),
            template: spec.template.to_string(),
            isolation: "process".into(),
            spec: spec_json,
            labels,
            timeout,
        })?;
        let record = match self.store().set_running(&id, sandbox.pid() as u32) {
            Ok(record) => record,
            Err(e) => {
                drop(sandbox);
                let _ = self.store().mark_dead(&id, None);
                return Err(e.into());
            }
        };

        let (end_tx, end_rx) = mpsc::channel();
        let live = Arc::new(Live {
            tenant: tenant.clone(),
            conn: Arc::new(conn),
            end: Mutex::new(end_tx),
            env: spec
                .env
                .iter()
                .map(|e| (e.key.clone(), e.value.clone()))
                .collect(),
            controls,
            lifecycle: Mutex::default(),
        });
        lock(&self.live).insert(id.clone(), live);
        let supervisor = {
            let id = id.clone();
            let store_path = self.store().path().to_path_buf();
            let live = Arc::clone(&self.live);
            let (events, tenant) = (self.events.clone(), tenant.clone());
            thread::Builder::new()
                .name(format!("brig-sb-{id}"))
                .stack_size(SUPERVISOR_STACK)
                .spawn(move || supervise(sandbox, end_rx, &store_path, &live, &events, &tenant))
        };
        if let Err(source) = supervisor {
            // The sandbox went down with the closure; record it.
            lock(&self.live).remove(&id);
            let _ = self.store().mark_dead(&id, None);
            return Err(ManagerError::Io {
                op: "start a sandbox supervisor thread",
                source,
            });
        }
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
        let mut spec = agent_spec(reserved.template.clone(), Pool::limits());
        spec.allow_setuid = reserved.setuid;
        match self.spawn_agent(&spec) {
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
        match self.live_sandbox(id) {
            Some(live) => self.end_and_wait(&live, SandboxState::Stopped),
            // Live in the store but not in this daemon: nothing to kill.
            None => {
                self.store()
                    .transition(Scope::Tenant(tenant), id, SandboxState::Stopped, None)?;
            }
        }
        self.get(tenant, id)
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
        // The sandbox's create-time environment, under the request's own.
        let env = self
            .live_sandbox(id)
            .map(|l| l.env.clone())
            .unwrap_or_default();
        if env.is_empty() {
            return conn.exec(req).map_err(agent_err(id));
        }
        let mut req = req.clone();
        for (k, v) in env {
            req.env.entry(k).or_insert(v);
        }
        conn.exec(&req).map_err(agent_err(id))
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
        let conn = self.connection(tenant, id)?;
        conn.write_file(path, contents, None, false)
            .map_err(agent_err(id))
    }

    /// Refuse new sandboxes, end every live one (waiting for each
    /// teardown), and stop the manager's threads.
    pub fn shutdown(&self) {
        self.closing.store(true, Ordering::SeqCst);
        lock(&self.sweeper_stop).take();
        self.pool.wake();
        let live: Vec<Arc<Live>> = lock(&self.live).values().cloned().collect();
        let waits: Vec<_> = live
            .iter()
            .filter_map(|l| self.end(l, SandboxState::Stopped))
            .collect();
        for done in waits {
            let _ = done.recv_timeout(TEARDOWN_WAIT);
        }
        lock(&self.spawner).take();
        let threads = std::mem::take(&mut *lock(&self.threads));
        for t in threads {
            let _ = t.join();
        }
        // Dropping a pre-made sandbox kills it and waits for its teardown.
        drop(self.pool.drain());
    }

    /// Pre-made sandboxes per template: (template, idle now, target).
    pub fn pool_sizes(&self) -> Vec<(String, usize, usize)> {
        self.pool.sizes()
    }

    /// Creates served from the pool since the start.
    pub fn pool_claims(&self) -> u64 {
        self.pool.served()
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

    /// Tell a sandbox's supervisor to end it; returns where to wait for the
    /// teardown (`None` if the supervisor is already gone).
    fn end(&self, live: &Live, state: SandboxState) -> Option<mpsc::Receiver<()>> {
        let (done_tx, done_rx) = mpsc::channel();
        let sent = lock(&live.end).send(Ending {
            state,
            done: Some(done_tx),
        });
        sent.is_ok().then_some(done_rx)
    }

    fn end_and_wait(&self, live: &Live, state: SandboxState) {
        if let Some(done) = self.end(live, state) {
            let _ = done.recv_timeout(TEARDOWN_WAIT);
        }
    }

    /// One pass of the sweeper: end expired sandboxes and those whose agent
    /// is gone.
    fn sweep(&self) {
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
                Some(live) => drop(self.end(&live, SandboxState::Stopped)),
                None => {
                    let _ = self.store().transition(
                        Scope::Daemon,
                        &record.id,
                        SandboxState::Stopped,
                        None,
                    );
                }
            }
        }
        let gone: Vec<Arc<Live>> = lock(&self.live)
            .values()
            .filter(|l| l.conn.is_closed())
            .cloned()
            .collect();
        for live in gone {
            drop(self.end(&live, SandboxState::Dead));
        }
    }
}

/// A supervisor thread: own the sandbox until told to end it, then kill it,
/// wait for the teardown, record the end and publish it.
///
/// The record is written through a store of its own: the manager may be
/// gone (or its store lock held by a caller waiting on this teardown).
fn supervise(
    sandbox: Sandbox,
    end: mpsc::Receiver<Ending>,
    store_path: &Path,
    live: &LiveMap,
    events: &Events,
    tenant: &TenantId,
) {
    let id = sandbox.id().clone();
    // Every sender gone (the manager dropped without shutdown) ends it too.
    let ending = end.recv().unwrap_or(Ending {
        state: SandboxState::Stopped,
        done: None,
    });
    sandbox.kill();
    let exit = sandbox.wait();
    let code = exit.as_ref().ok().map(|e| e.code);
    if let Err(e) = &exit {
        tracing::warn!("sandbox {id}: teardown: {e}");
    }
    match Store::open(store_path) {
        Ok(store) => {
            let _ = store.transition(Scope::Daemon, &id, ending.state, code);
        }
        Err(e) => tracing::warn!("sandbox {id}: cannot record its end: {e}"),
    }
    // No longer live before anyone hears of the end: a listener that checks
    // `is_live` after the event never finds it live again.
    lock(live).remove(&id);
    events.publish(
        &id,
        tenant,
        EventKind::Ended {
            state: ending.state,
            code,
        },
    );
    // Later endings (a sweep racing a delete) must not wait forever.
    drop(end);
    if let Some(done) = ending.done {
        let _ = done.send(());
    }
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
