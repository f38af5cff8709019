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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use brig_agent_client::{Call, ClientError, Connection, ExecRequest, FileReader, Process, Reply};
use brig_core::{EnvVar, Limits, SandboxId, SandboxSpec, SpecError, TemplateRef};
use brig_jail::{Extras, JailError, Sandbox, SpawnOptions};

use crate::sandboxes::{Cursor, ListFilter, NewSandbox, Page, SandboxError, SandboxState, Scope};
use crate::{AuthError, SandboxRecord, Store, StoreError, TenantId};

/// A sandbox's time to live when the create request names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// The longest time to live a request may ask for, unless the server is
/// configured otherwise.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);
/// How long `delete` and `shutdown` wait for one sandbox's teardown.
const TEARDOWN_WAIT: Duration = Duration::from_secs(30);

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
}

impl ManagerConfig {
    pub fn new(agent: PathBuf) -> ManagerConfig {
        ManagerConfig {
            agent,
            default_timeout: DEFAULT_TIMEOUT,
            max_timeout: DEFAULT_MAX_TIMEOUT,
            sweep_interval: Duration::from_secs(1),
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
}

impl Default for CreateConfig {
    fn default() -> Self {
        CreateConfig {
            template: TemplateRef::Host,
            limits: Limits::default(),
            env: Vec::new(),
            labels: BTreeMap::new(),
            timeout: None,
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
    #[error("sandbox {id} is {state}, not running")]
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
    #[error("the agent in sandbox {id} did not answer its handshake")]
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
    #[error("the spawner thread is gone")]
    SpawnerGone,
}

/// How a supervisor is told to end its sandbox.
struct Ending {
    /// `stopped` (brig's choice) or `dead` (the agent went away).
    state: SandboxState,
    /// Told once the sandbox is fully torn down.
    done: Option<mpsc::Sender<()>>,
}

/// A sandbox this daemon started and that has not ended yet.
struct Live {
    tenant: TenantId,
    conn: Arc<Connection>,
    end: Mutex<mpsc::Sender<Ending>>,
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
    live: LiveMap,
    spawner: Mutex<Option<mpsc::Sender<SpawnJob>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    closing: AtomicBool,
    /// Dropped by `shutdown` to wake the sweeper at once.
    sweeper_stop: Mutex<Option<mpsc::Sender<()>>>,
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
        let opts = SpawnOptions::prepare().map_err(ManagerError::Spawn)?;
        store.reconcile(|_, _| false)?;

        let (spawn_tx, spawn_rx) = mpsc::channel::<SpawnJob>();
        let spawner = thread::Builder::new()
            .name("brig-spawner".into())
            .spawn(move || {
                // A job whose requester went away drops its Sandbox here,
                // which kills and reaps it.
                for job in spawn_rx {
                    let result = Sandbox::spawn_with(&job.spec, &opts, job.extras);
                    let _ = job.reply.send(result);
                }
            })
            .map_err(|source| ManagerError::Io {
                op: "start the spawner thread",
                source,
            })?;

        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let manager = Arc::new(SandboxManager {
            config,
            store: Mutex::new(store),
            live: Arc::new(Mutex::new(HashMap::new())),
            spawner: Mutex::new(Some(spawn_tx)),
            threads: Mutex::new(vec![spawner]),
            closing: AtomicBool::new(false),
            sweeper_stop: Mutex::new(Some(stop_tx)),
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
        let mut spec = SandboxSpec::new(vec!["brig-agent".into(), "--stdio".into()]);
        spec.template = req.template;
        spec.limits = req.limits;
        spec.limits.timeout = None;
        spec.env = req.env;
        spec.validate()?;

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
        let id = sandbox.id().clone();

        // From here on, an error return drops `sandbox`, which kills and
        // reaps it; its record is then marked dead.
        let spec_json = serde_json::to_value(&spec).unwrap_or(serde_json::Value::Null);
        self.store().insert_sandbox(&NewSandbox {
            id: id.clone(),
            tenant: tenant.clone(),
            template: spec.template.to_string(),
            isolation: "process".into(),
            spec: spec_json,
            labels: req.labels,
            timeout,
        })?;
        let started = Connection::new(ours)
            .map_err(|source| ManagerError::Handshake {
                id: id.clone(),
                source,
            })
            .and_then(|conn| {
                let record = self.store().set_running(&id, sandbox.pid() as u32)?;
                Ok((conn, record))
            });
        let (conn, record) = match started {
            Ok(v) => v,
            Err(e) => {
                drop(sandbox);
                let _ = self.store().mark_dead(&id, None);
                return Err(e);
            }
        };

        let (end_tx, end_rx) = mpsc::channel();
        let live = Arc::new(Live {
            tenant: tenant.clone(),
            conn: Arc::new(conn),
            end: Mutex::new(end_tx),
        });
        lock(&self.live).insert(id.clone(), live);
        let supervisor = {
            let id = id.clone();
            let store_path = self.store().path().to_path_buf();
            let live = Arc::clone(&self.live);
            thread::Builder::new()
                .name(format!("brig-sb-{id}"))
                .spawn(move || supervise(sandbox, end_rx, &store_path, &live))
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
        Ok(record)
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
        conn.exec(req).map_err(agent_err(id))
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
    }

    /// The number of sandboxes this daemon is running.
    pub fn live_count(&self) -> usize {
        lock(&self.live).len()
    }

    fn cap_timeout(&self, timeout: Duration) -> Result<Duration, ManagerError> {
        if timeout.is_zero() {
            return Err(ManagerError::BadRequest {
                reason: "timeout must be positive, for example 30s or 10m".into(),
            });
        }
        Ok(timeout.min(self.config.max_timeout))
    }

    fn live_sandbox(&self, id: &SandboxId) -> Option<Arc<Live>> {
        lock(&self.live).get(id).cloned()
    }

    /// The agent connection of a running sandbox of `tenant`'s. The HTTP
    /// layer holds it weakly to tell when state it keeps per sandbox (a
    /// parked process attachment) has outlived the sandbox.
    pub fn connection(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Result<Arc<Connection>, ManagerError> {
        match self.live_sandbox(id) {
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
/// wait for the teardown and record the end.
///
/// The record is written through a store of its own: the manager may be
/// gone (or its store lock held by a caller waiting on this teardown).
fn supervise(sandbox: Sandbox, end: mpsc::Receiver<Ending>, store_path: &Path, live: &LiveMap) {
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
    lock(live).remove(&id);
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
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
