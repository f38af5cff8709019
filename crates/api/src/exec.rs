//! `POST /v1/sandboxes/{id}/exec`: run a process, stream what it does.
//!
//! The answer is NDJSON (`application/x-ndjson`) over chunked HTTP, one
//! event per line, written as the agent reports it:
//!
//! ```text
//! {"type":"started","pid":7}
//! {"type":"stdout","data":"aGkK"}          (base64: output may be any bytes)
//! {"type":"stderr","data":"..."}
//! {"type":"exited","code":0,"signal":null}
//! {"type":"error","message":"..."}         (instead of exited, if the stream broke)
//! ```
//!
//! NDJSON rather than SSE: every line is a complete JSON document, any HTTP
//! client can read it line by line, and there is no event-stream framing or
//! reconnection semantics to implement for a stream that cannot be resumed.
//!
//! Output is taken from the agent only as fast as the HTTP client reads it
//! (a small channel between the two), so a slow client pauses the process
//! inside the sandbox rather than filling the daemon's memory. A client
//! that disconnects drops the process handle, which kills the process.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::response::Response;
use axum::Json;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use brig_agent_client::{ClientError, ExecRequest, Output, Process};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::{sandbox_id, ApiError, AppState, Auth};

/// Lines in flight between the agent and the HTTP client.
const LINES_IN_FLIGHT: usize = 16;

/// The largest exec (or process start) body the API reads: a command line
/// and environment up to what the agent takes (itself more than execve
/// takes), in JSON. axum's default (2 MB) would refuse some that execve
/// accepts.
pub(crate) fn body_limit() -> axum::extract::DefaultBodyLimit {
    axum::extract::DefaultBodyLimit::max(brig_agent_client::MAX_EXEC_REQUEST + (1 << 20))
}

/// The body of an exec request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Program and arguments; `argv[0]` is looked up on the sandbox's PATH.
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// A user from the sandbox's /etc/passwd (sets uid, gid and HOME).
    pub user: Option<String>,
    /// Standard input, base64; stdin is closed after it (or at once).
    pub stdin: Option<String>,
    /// Kill the process (its whole group) if it runs longer, e.g. "30s":
    /// the stream then ends with `exited` code 124 and `timed_out: true`.
    pub timeout: Option<String>,
}

/// An exec's optional time limit, parsed: at most the sandbox's own life
/// matters, so anything brig's duration syntax takes is accepted.
pub(crate) fn exec_timeout(timeout: Option<&str>) -> Result<Option<Duration>, ApiError> {
    timeout
        .map(|t| {
            brig_core::parse_duration(t)
                .map_err(|e| ApiError::bad_request(format!("timeout: {e} (for example \"30s\")")))
        })
        .transpose()
}

/// The exit code reported for a process killed at its time limit, as
/// `timeout(1)` and `brig run --timeout` report it.
pub(crate) const TIMED_OUT: i32 = 124;

/// Wait for a process's next output until `deadline`; `None` there.
pub(crate) async fn next_before(
    process: &mut Process,
    deadline: Option<tokio::time::Instant>,
) -> Option<Option<Result<Output, ClientError>>> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, process.next_output())
            .await
            .ok(),
        None => Some(process.next_output().await),
    }
}

/// Kill a process whose time is up (its group, by pid: its stream may no
/// longer carry a signal once stdin is closed) and take what it still
/// says until it exits, up to a few seconds: everything but its `exited`,
/// in order (at most the stream's window, as it was already sent).
pub(crate) async fn kill_for_timeout(
    manager: &std::sync::Arc<brig_runtime::SandboxManager>,
    tenant: &brig_runtime::TenantId,
    id: &brig_core::SandboxId,
    process: &mut Process,
) -> Vec<Result<Output, ClientError>> {
    manager.note_exec_timeout();
    let mut last = Vec::new();
    if let Some(pid) = process.pid() {
        let (m, t, i) = (std::sync::Arc::clone(manager), tenant.clone(), id.clone());
        let _ = tokio::task::spawn_blocking(move || {
            // Its group (what it started too); an older agent takes only
            // the pid.
            let group = brig_agent_client::Call::Signal {
                pid: -pid,
                sig: libc::SIGKILL,
            };
            if m.call(&t, &i, &group).is_err() {
                let one = brig_agent_client::Call::Signal {
                    pid,
                    sig: libc::SIGKILL,
                };
                let _ = m.call(&t, &i, &one);
            }
        })
        .await;
    }
    let grace = tokio::time::Instant::now() + Duration::from_secs(5);
    while let Some(Some(item)) = next_before(process, Some(grace)).await {
        if matches!(item, Ok(Output::Exited { .. })) {
            break;
        }
        let failed = item.is_err();
        last.push(item);
        if failed {
            break;
        }
    }
    last
}

pub async fn exec(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: Result<Json<ExecConfig>, JsonRejection>,
) -> Result<Response, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let config = body?.0;
    if config.argv.first().is_none_or(|a| a.is_empty()) {
        return Err(ApiError::bad_request(
            "argv must name a program, for example [\"sh\", \"-c\", \"echo hi\"]",
        ));
    }
    no_nul(&config.argv, &config.env, config.cwd.as_deref())?;
    let stdin = config
        .stdin
        .as_deref()
        .map(|s| BASE64.decode(s))
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("stdin is not valid base64: {e}")))?;
    let timeout = exec_timeout(config.timeout.as_deref())?;
    let req = ExecRequest {
        argv: config.argv,
        env: config.env,
        cwd: config.cwd,
        user: config.user,
        ..ExecRequest::default()
    };
    let process = state
        .manager
        .exec_async(&tenant, &id, &req)
        .await
        .map_err(ApiError::command_start)?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(LINES_IN_FLIGHT);
    // Waits on the agent without a thread for as long as the process runs.
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let limit = Limit {
        manager: state.manager.clone(),
        tenant,
        id,
        deadline,
        after: timeout,
    };
    tokio::spawn(pump(process, stdin, tx, limit));
    super::ndjson::response(rx)
}

/// argv, env and cwd reach execve as C strings, which cannot hold a NUL
/// byte: refuse one here (400) rather than let the spawn fail.
pub(crate) fn no_nul(
    argv: &[String],
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
) -> Result<(), ApiError> {
    let strings = argv
        .iter()
        .map(|a| ("argv", a))
        .chain(env.iter().flat_map(|(k, v)| [("env", k), ("env", v)]));
    for (field, s) in strings
        .map(|(f, s)| (f, s.as_str()))
        .chain(cwd.map(|c| ("cwd", c)))
    {
        if s.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "{field} contains a NUL byte ({s:?}), which a process cannot be given"
            )));
        }
    }
    Ok(())
}

/// Feed stdin, then turn each output item into one NDJSON line until the
/// process exits or the client goes away. hyper drops the response body
/// (the receiver) as soon as it reads EOF from the client, even while the
/// process prints nothing (`sleep`); then dropping `process` resets its
/// stream, and the agent kills it.
/// An exec's time limit and what it takes to enforce it.
struct Limit {
    manager: std::sync::Arc<brig_runtime::SandboxManager>,
    tenant: brig_runtime::TenantId,
    id: brig_core::SandboxId,
    deadline: Option<tokio::time::Instant>,
    after: Option<Duration>,
}

async fn pump(
    mut process: Process,
    stdin: Option<Vec<u8>>,
    tx: mpsc::Sender<Result<Bytes, Infallible>>,
    limit: Limit,
) {
    match stdin {
        // From its own task: output is only credited back as it is read,
        // so writing a lot of stdin here could deadlock with an echoing
        // process.
        Some(data) => {
            let w = process.stdin();
            tokio::spawn(async move {
                let _ = w.write_all_async(&data).await;
                let _ = w.close();
            });
        }
        None => {
            let _ = process.close_stdin();
        }
    }
    loop {
        let item = tokio::select! {
            item = next_before(&mut process, limit.deadline) => item,
            () = tx.closed() => return,
        };
        let Some(item) = item else {
            // Time is up.
            for item in
                kill_for_timeout(&limit.manager, &limit.tenant, &limit.id, &mut process).await
            {
                if tx.send(Ok(event_line(item))).await.is_err() {
                    return;
                }
            }
            let after = limit.after.map_or(0, |a| a.as_millis() as u64);
            let line = json!({ "type": "exited", "code": TIMED_OUT, "signal": null,
                               "timed_out": true, "timeout_ms": after });
            let _ = tx.send(Ok(Bytes::from(format!("{line}\n")))).await;
            return;
        };
        let Some(item) = item else { return };
        let line = match item {
            Err(e) => {
                let v = stream_error(&limit.manager, &limit.tenant, &limit.id, &e).await;
                Bytes::from(format!("{v}\n"))
            }
            Ok(Output::Exited {
                code,
                signal: Some(libc::SIGKILL),
            }) => {
                let mut v = json!({ "type": "exited", "code": code, "signal": libc::SIGKILL });
                if let Some(why) = oom_note(&limit.manager, &limit.tenant, &limit.id).await {
                    v["oom_killed"] = true.into();
                    v["message"] = why.into();
                }
                Bytes::from(format!("{v}\n"))
            }
            item => event_line(item),
        };
        if tx.send(Ok(line)).await.is_err() {
            return;
        }
    }
}

/// Why a process's stream broke, for its client: if the sandbox itself
/// ended under it (the agent's connection went away), wait a moment for
/// the end to be recorded and say why it ended (`sandbox_end`: its
/// recorded cause, e.g. `timeout`, `out_of_memory`, `deleted`) instead of
/// "connection to the agent closed".
pub(crate) async fn stream_error(
    manager: &std::sync::Arc<brig_runtime::SandboxManager>,
    tenant: &brig_runtime::TenantId,
    id: &brig_core::SandboxId,
    e: &ClientError,
) -> serde_json::Value {
    let plain = json!({ "type": "error", "message": e.to_string() });
    if !matches!(
        e,
        ClientError::Closed | ClientError::StreamClosed { .. } | ClientError::Reset { .. }
    ) {
        return plain;
    }
    // The teardown records the end on its own thread: a few seconds at
    // most (it waits for every process to die and the cgroups to go).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (m, t, i) = (std::sync::Arc::clone(manager), tenant.clone(), id.clone());
        let record = tokio::task::spawn_blocking(move || m.get(&t, &i)).await;
        if let Ok(Ok(r)) = &record {
            if let (true, Some(cause)) = (r.state.is_final(), &r.end) {
                let mut end = serde_json::to_value(cause).unwrap_or_default();
                end["message"] = cause.describe().into();
                return json!({
                    "type": "error",
                    "message": format!("the sandbox ended: {}", cause.describe()),
                    "sandbox_end": end,
                });
            }
        }
        if tokio::time::Instant::now() >= deadline || !matches!(record, Ok(Ok(_))) {
            return plain;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// For a process killed by SIGKILL: if the kernel's OOM killer has fired
/// in the sandbox, say so (a process over the memory limit dies of
/// SIGKILL, which alone reads like any other kill), as `brig run` does.
pub(crate) async fn oom_note(
    manager: &std::sync::Arc<brig_runtime::SandboxManager>,
    tenant: &brig_runtime::TenantId,
    id: &brig_core::SandboxId,
) -> Option<String> {
    let (m, t, i) = (std::sync::Arc::clone(manager), tenant.clone(), id.clone());
    let usage = tokio::task::spawn_blocking(move || m.usage(&t, &i))
        .await
        .ok()?
        .ok()?;
    (usage.oom_kills? > 0).then(|| {
        format!(
            "killed by the kernel's OOM killer: the sandbox's memory limit is {} MiB; give it \
             more (--memory) or make the command use less",
            usage.memory_limit_bytes >> 20
        )
    })
}

/// One NDJSON line for one thing a process did. Shared with the re-attach
/// stream of `processes.rs`, whose first line is `attached`.
pub(crate) fn event_line(item: Result<Output, ClientError>) -> Bytes {
    let event = match item {
        Ok(Output::Started { pid }) => json!({ "type": "started", "pid": pid }),
        Ok(Output::Attached { pid, dropped }) => {
            json!({ "type": "attached", "pid": pid, "dropped": dropped })
        }
        Ok(Output::Stdout(b)) => json!({ "type": "stdout", "data": BASE64.encode(b) }),
        Ok(Output::Stderr(b)) => json!({ "type": "stderr", "data": BASE64.encode(b) }),
        Ok(Output::Exited { code, signal }) => {
            json!({ "type": "exited", "code": code, "signal": signal })
        }
        Err(e) => json!({ "type": "error", "message": e.to_string() }),
    };
    super::ndjson::line(&event)
}
