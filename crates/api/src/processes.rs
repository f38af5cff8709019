//! `/v1/sandboxes/{id}/processes...`: background processes that outlive
//! their request.
//!
//! - `POST /processes` `{argv, env, cwd, user}` starts one and answers `201
//!   {pid}`; it keeps running with no client (its output goes to the
//!   agent's 1 MiB ring, which drops the oldest bytes).
//! - `GET /processes` lists what the agent manages.
//! - `POST /processes/{pid}/signal` `{signal}` ("SIGTERM", "TERM" or 15).
//! - `GET /processes/{pid}/output` re-attaches: NDJSON, `attached` (with the
//!   bytes the ring dropped), what it kept, then live output and `exited`.
//! - `POST /processes/{pid}/stdin` writes the raw body to its stdin;
//!   `?eof=true` then closes it.
//!
//! ## One attachment per process, parked between requests
//!
//! The agent lets one client attach to a process at a time, and hands the
//! attached client its output as it comes. Attaching only to write stdin
//! and detaching again would therefore race: whatever output the agent
//! sent before the detach is gone from its ring, and a process that exits
//! meanwhile is forgotten after its `exited` went to the stdin writer. So
//! the daemon keeps the attachment it makes ([`Attachments`], one per
//! router): a stdin request leaves it *parked*, unread (the agent's output
//! then waits in the stream's bounded window and the ring), and the next
//! output request picks it up where the last one stopped. A client that
//! disconnects from `output` parks it again. The attachment is dropped when
//! its stream ends (the process exited and `exited` was delivered) or when
//! the sandbox is gone.

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use axum::body::{Body, Bytes};
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use brig_agent_client::{Call, ClientError, Connection, ExecRequest, Process, Reply, Stdin};
use brig_core::SandboxId;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

use super::exec::event_line;
use super::{blocking, sandbox_id, ApiError, AppState, Auth};
use brig_runtime::ManagerError;
use brig_runtime::TenantId;

/// Lines in flight between the agent and the HTTP client.
const LINES_IN_FLIGHT: usize = 16;

/// The process routes, with the attachments they share.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/sandboxes/{id}/processes",
            post(start).layer(super::exec::body_limit()).get(list),
        )
        .route("/v1/sandboxes/{id}/processes/{pid}/signal", post(signal))
        .route("/v1/sandboxes/{id}/processes/{pid}/output", get(output))
        .route("/v1/sandboxes/{id}/processes/{pid}/stdin", post(stdin))
        .layer(Extension(Attachments::default()))
}

/// The body of `POST /processes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessConfig {
    /// Program and arguments; `argv[0]` is looked up on the sandbox's PATH.
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// A user from the sandbox's /etc/passwd (sets uid, gid and HOME).
    pub user: Option<String>,
    /// Must be true (the default): a foreground process is `POST /exec`.
    #[serde(default = "yes")]
    pub background: bool,
}

fn yes() -> bool {
    true
}

/// The body of `POST /processes/{pid}/signal`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignalConfig {
    pub signal: SignalSpec,
}

/// A signal by name (`SIGTERM` or `TERM`) or number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum SignalSpec {
    Number(i64),
    Name(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinQuery {
    /// Close stdin after the body.
    #[serde(default)]
    pub eof: bool,
}

/// The signals a client may name (Linux numbering).
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ILL", libc::SIGILL),
    ("TRAP", libc::SIGTRAP),
    ("ABRT", libc::SIGABRT),
    ("BUS", libc::SIGBUS),
    ("FPE", libc::SIGFPE),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// The highest signal number (SIGRTMAX on Linux).
const MAX_SIGNAL: i64 = 64;

impl SignalSpec {
    pub(crate) fn number(&self) -> Result<i32, ApiError> {
        match self {
            SignalSpec::Number(n) if (1..=MAX_SIGNAL).contains(n) => Ok(*n as i32),
            SignalSpec::Number(n) => Err(ApiError::bad_request(format!(
                "signal {n} does not exist: use 1 to {MAX_SIGNAL} or a name like \"SIGTERM\""
            ))),
            SignalSpec::Name(name) => {
                let upper = name.to_ascii_uppercase();
                let short = upper.strip_prefix("SIG").unwrap_or(&upper);
                SIGNALS
                    .iter()
                    .find(|(n, _)| *n == short)
                    .map(|(_, sig)| *sig)
                    .ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "unknown signal {name:?}: use a name like \"SIGTERM\" or \"KILL\", \
                             or a number"
                        ))
                    })
            }
        }
    }
}

pub async fn start(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: Result<Json<ProcessConfig>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let id = sandbox_id(&id?.0)?;
    let config = body?.0;
    if config.argv.first().is_none_or(|a| a.is_empty()) {
        return Err(ApiError::bad_request(
            "argv must name a program, for example [\"sleep\", \"60\"]",
        ));
    }
    super::exec::no_nul(&config.argv, &config.env, config.cwd.as_deref())?;
    if !config.background {
        return Err(ApiError::bad_request(
            "processes started here run in the background; for a foreground process whose \
             output streams back, use POST /v1/sandboxes/{id}/exec",
        ));
    }
    let req = ExecRequest {
        argv: config.argv,
        env: config.env,
        cwd: config.cwd,
        user: config.user,
        background: true,
        ..ExecRequest::default()
    };
    let manager = state.manager.clone();
    // The agent closes a background exec's stream right after `started`;
    // dropping the handle leaves the process running.
    let process = tokio::task::spawn_blocking(move || manager.exec(&tenant, &id, &req))
        .await?
        .map_err(ApiError::command_start)?;
    let pid = process.pid();
    Ok((StatusCode::CREATED, Json(json!({ "pid": pid }))))
}

pub async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let manager = state.manager.clone();
    match blocking(move || manager.call(&tenant, &id, &Call::ListProcesses)).await? {
        Reply::Processes(items) => Ok(Json(json!({ "items": items }))),
        other => Err(ApiError::internal(&std::io::Error::other(format!(
            "the agent answered list_processes with {other:?}"
        )))),
    }
}

pub async fn signal(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    path: Result<Path<(String, i32)>, PathRejection>,
    body: Result<Json<SignalConfig>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let (id, pid) = path?.0;
    let id = sandbox_id(&id)?;
    let sig = body?.0.signal.number()?;
    let manager = state.manager.clone();
    blocking(move || manager.call(&tenant, &id, &Call::Signal { pid, sig })).await?;
    Ok(Json(json!({ "pid": pid, "signal": sig })))
}

pub async fn output(
    State(state): State<AppState>,
    Extension(attachments): Extension<Attachments>,
    Auth(tenant): Auth,
    path: Result<Path<(String, i32)>, PathRejection>,
) -> Result<Response, ApiError> {
    let (id, pid) = path?.0;
    let id = sandbox_id(&id)?;
    let (att, hub) = (
        attachments.get(&state, tenant, id.clone(), pid).await?,
        attachments.clone(),
    );
    let parked = lock(&att.reader).take().ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("process {pid} already has a client reading its output"),
        )
    })?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(LINES_IN_FLIGHT);
    tokio::spawn(async move { pump(&hub, &(id, pid), &att, parked, &tx).await });
    super::ndjson::response(rx)
}

pub async fn stdin(
    State(state): State<AppState>,
    Extension(attachments): Extension<Attachments>,
    Auth(tenant): Auth,
    path: Result<Path<(String, i32)>, PathRejection>,
    query: Result<Query<StdinQuery>, QueryRejection>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let (id, pid) = path?.0;
    let id = sandbox_id(&id)?;
    let eof = query?.0.eof;
    let att = attachments.get(&state, tenant, id.clone(), pid).await?;
    let agent_error = |source: ClientError| {
        ApiError::from(ManagerError::Agent {
            id: id.clone(),
            source,
        })
    };
    // One writer at a time, so two requests' bytes do not interleave.
    let w = att.stdin.lock().await;
    let mut body = body.into_data_stream();
    let mut written = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        w.write_all_async(&chunk).await.map_err(agent_error)?;
        written += chunk.len() as u64;
    }
    if eof {
        w.close().map_err(agent_error)?;
    }
    Ok(Json(json!({ "pid": pid, "bytes": written, "eof": eof })))
}

/// Stream a parked attachment's output to one client until the process
/// exits (then forget the attachment) or the client leaves (then park it
/// again, with the line it could not take).
async fn pump(
    hub: &Attachments,
    key: &ProcessKey,
    att: &Arc<Attachment>,
    mut parked: Parked,
    tx: &mpsc::Sender<Result<Bytes, Infallible>>,
) {
    loop {
        let line = match parked.unsent.take() {
            Some(line) => line,
            None => {
                let item = tokio::select! {
                    item = parked.process.next_output() => item,
                    // The client left while the process printed nothing.
                    () = tx.closed() => break,
                };
                match item {
                    Some(item) => event_line(item),
                    None => {
                        // The stream is over: the agent has forgotten the
                        // process.
                        hub.forget(key, att);
                        return;
                    }
                }
            }
        };
        if let Err(mpsc::error::SendError(Ok(line))) = tx.send(Ok(line)).await {
            parked.unsent = Some(line);
            break;
        }
    }
    *lock(&att.reader) = Some(parked);
}

/// An attachment not being read right now.
#[derive(Debug)]
struct Parked {
    process: Process,
    /// A line taken from the agent that its reader left before receiving.
    unsent: Option<Bytes>,
}

/// The daemon's one attachment to a background process.
#[derive(Debug)]
struct Attachment {
    /// To notice the sandbox is gone.
    conn: Weak<Connection>,
    stdin: tokio::sync::Mutex<Stdin>,
    /// `None` while an output request holds it.
    reader: Mutex<Option<Parked>>,
}

/// The attachments of one router, by sandbox and pid.
#[derive(Debug, Clone, Default)]
pub struct Attachments(Arc<Mutex<HashMap<ProcessKey, Arc<Attachment>>>>);

/// A process of a sandbox.
type ProcessKey = (SandboxId, i32);

impl Attachments {
    /// This process's attachment, attaching now if there is none. The
    /// manager checks the tenant on every request, parked or not.
    async fn get(
        &self,
        state: &AppState,
        tenant: TenantId,
        id: SandboxId,
        pid: i32,
    ) -> Result<Arc<Attachment>, ApiError> {
        let manager = state.manager.clone();
        let hub = self.clone();
        let attached = blocking(move || -> Result<_, ManagerError> {
            let conn = manager.connection(&tenant, &id)?;
            let mut map = lock(&hub.0);
            // Sandboxes that ended take their attachments with them.
            map.retain(|_, a| a.conn.upgrade().is_some_and(|c| !c.is_closed()));
            let key = (id, pid);
            if let Some(att) = map.get(&key) {
                return Ok(Arc::clone(att));
            }
            // Attaching under the lock keeps two requests from racing to
            // attach (the agent would refuse the second as busy).
            let process = manager.attach(&tenant, &key.0, pid)?;
            let att = Arc::new(Attachment {
                conn: Arc::downgrade(&conn),
                stdin: tokio::sync::Mutex::new(process.stdin()),
                reader: Mutex::new(Some(Parked {
                    process,
                    unsent: None,
                })),
            });
            map.insert(key, Arc::clone(&att));
            Ok(att)
        })
        .await?;
        Ok(attached)
    }

    fn forget(&self, key: &ProcessKey, att: &Arc<Attachment>) {
        let mut map = lock(&self.0);
        if map.get(key).is_some_and(|a| Arc::ptr_eq(a, att)) {
            map.remove(key);
        }
    }
}

/// Lock a mutex; every critical section here leaves its data consistent,
/// so a panic elsewhere does not poison the API.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
