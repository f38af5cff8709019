//! `GET /v1/sandboxes/{id}/pty`: an interactive process over a WebSocket,
//! on a terminal (`brig exec -t`, a browser terminal) or on pipes
//! (`brig exec -i`).
//!
//! The protocol (also in docs/server.md and api/openapi.yaml):
//!
//! 1. Authentication and the sandbox are checked before the upgrade, so a
//!    bad key is a plain 401 and an unknown sandbox a 404. The key comes
//!    from `Authorization: Bearer`, or, for browsers (which cannot set
//!    headers on a WebSocket), from a `Sec-WebSocket-Protocol` value
//!    `brig.key.<KEY>` offered together with `brig`; the server then
//!    selects `brig` (never the key).
//! 2. The client's first message is text: [`PtyStart`], `{argv, env?, cwd?,
//!    user?, cols?, rows?, pty?}` (80×24 and `pty: true` by default).
//! 3. The server answers `{"type":"started","pid":N}` (text), or
//!    `{"type":"error","code":..,"message":..}` and a close if the process
//!    could not start (`code` as in the API's error bodies, e.g.
//!    `bad_request`, `command_not_found`).
//! 4. Client → server: binary frames are input bytes; text frames are
//!    control: `{"type":"resize","cols":..,"rows":..}`,
//!    `{"type":"signal","signal":"SIGINT"}` (name or number),
//!    `{"type":"eof"}` (end of input; on a terminal, ^D).
//! 5. Server → client: binary frames are output. On a terminal they are
//!    the terminal's bytes as they are; on pipes each frame starts with one
//!    byte naming the stream, 1 = stdout, 2 = stderr, then the bytes.
//! 6. The end: `{"type":"exited","code":N,"signal":S}` (one of the two is
//!    null), then a close. A stream that broke ends with an `error` frame
//!    instead.
//!
//! Re-attach: a session's process is started `background + attached`, so
//! it outlives the daemon (a restart, an upgrade); `?pid=N` re-attaches
//! to it (`{"type":"attached","pid":N}` first, no start message). A
//! client that leaves still takes its process with it (an explicit kill).
//!
//! Flow control: output is taken from the agent only as fast as the client
//! reads the socket (a few frames between the two), so a slow client pauses
//! the process; input is read from the socket only as fast as the process's
//! stdin takes it. A client that goes away (closes, or its connection
//! drops) gets its process killed (SIGKILL to its process group), as with
//! `POST /exec`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::header::{AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::Response;
use brig_agent_client::{
    Call, ClientError, Connection, ExecRequest, Output, Process, PtySize, Stdin,
};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::processes::SignalSpec;
use super::{blocking, sandbox_id, ApiError, AppState, Auth};

/// The subprotocol a browser offers (with `brig.key.<KEY>`) and gets back.
pub const SUBPROTOCOL: &str = "brig";
/// The prefix of the subprotocol value that carries an API key.
pub const KEY_PROTOCOL_PREFIX: &str = "brig.key.";

/// Output frames in flight between the agent and the socket.
const FRAMES_IN_FLIGHT: usize = 8;
/// Input frames in flight between the socket and the process's stdin.
const INPUT_IN_FLIGHT: usize = 8;
/// The largest message a client may send: the start message's command
/// line and environment, up to what the agent takes (input is streamed in
/// frames of the client's choosing).
const MAX_MESSAGE: usize = brig_agent_client::MAX_EXEC_REQUEST + (1 << 20);
/// How long the client has to send its first message.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Pipes mode: the byte that starts an output frame.
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;

/// The client's first message.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyStart {
    /// Program and arguments; `argv[0]` is looked up on the sandbox's PATH.
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// A user from the sandbox's /etc/passwd (sets uid, gid and HOME).
    pub user: Option<String>,
    #[serde(default = "default_cols")]
    pub cols: u16,
    #[serde(default = "default_rows")]
    pub rows: u16,
    /// A terminal (the default) or pipes with tagged output.
    #[serde(default = "yes")]
    pub pty: bool,
    /// Kill the process (its group) if it runs longer, e.g. "30s": the
    /// session then ends with `exited` code 124 and `timed_out: true`.
    pub timeout: Option<String>,
}

fn default_cols() -> u16 {
    80
}
fn default_rows() -> u16 {
    24
}
fn yes() -> bool {
    true
}

/// A control message from the client.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum Control {
    Resize { cols: u16, rows: u16 },
    Signal { signal: SignalSpec },
    Eof,
}

/// What the socket reader hands the blocking writer.
#[derive(Debug)]
enum Input {
    Bytes(Bytes),
    Eof,
    Resize {
        rows: u16,
        cols: u16,
    },
    Signal(i32),
    /// The client went away: kill the process.
    Gone,
}

/// The tenant, from `Authorization: Bearer` or `Sec-WebSocket-Protocol:
/// brig, brig.key.<KEY>` (only this route takes the latter).
#[derive(Debug)]
pub struct PtyAuth(Auth);

impl FromRequestParts<AppState> for PtyAuth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<PtyAuth, ApiError> {
        if parts.headers.contains_key(AUTHORIZATION) {
            return Ok(PtyAuth(Auth::from_request_parts(parts, state).await?));
        }
        let key = parts
            .headers
            .get_all(SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .find_map(|p| p.trim().strip_prefix(KEY_PROTOCOL_PREFIX))
            .map(str::to_string)
            .ok_or_else(ApiError::unauthorized)?;
        Ok(PtyAuth(Auth::with_key(&state.manager, key).await?))
    }
}

/// `?pid=N`: re-attach to a session's process instead of starting one.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyQuery {
    pub pid: Option<i32>,
}

pub async fn pty(
    State(state): State<AppState>,
    PtyAuth(Auth(tenant)): PtyAuth,
    id: Result<Path<String>, PathRejection>,
    query: Result<axum::extract::Query<PtyQuery>, axum::extract::rejection::QueryRejection>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let reattach = query.map_err(ApiError::from)?.0.pid;
    let ws = ws.map_err(|r| {
        ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            "upgrade_required",
            format!(
                "{}: this endpoint is a WebSocket (GET with `Upgrade: websocket`)",
                r.body_text()
            ),
        )
    })?;
    // Unknown or ended sandboxes are answered before the upgrade.
    let manager = Arc::clone(&state.manager);
    let (t, i) = (tenant.clone(), id.clone());
    blocking(move || manager.connection(&t, &i)).await?;
    Ok(ws
        .protocols([SUBPROTOCOL])
        .max_message_size(MAX_MESSAGE)
        .on_upgrade(move |socket| async move {
            match reattach {
                Some(pid) => reattach_session(socket, state, tenant, id, pid).await,
                None => session(socket, state, tenant, id).await,
            }
        }))
}

/// A session on a process an earlier session started (its client or the
/// daemon went away meanwhile: the process lives on, as every session's
/// does until its client leaves): `attached` with the pid, the output the
/// agent kept, then as a new session.
async fn reattach_session(
    mut socket: WebSocket,
    state: AppState,
    tenant: brig_runtime::TenantId,
    id: brig_core::SandboxId,
    pid: i32,
) {
    let manager = Arc::clone(&state.manager);
    let (t, i) = (tenant.clone(), id.clone());
    let found = blocking(move || -> Result<_, brig_runtime::ManagerError> {
        let pty = match manager.call(&t, &i, &Call::ListProcesses)? {
            brig_agent_client::Reply::Processes(list) => {
                list.into_iter().find(|p| p.pid == pid).map(|p| p.pty)
            }
            _ => None,
        };
        let process = manager.attach(&t, &i, pid)?;
        Ok((manager.connection(&t, &i)?, process, pty.unwrap_or(false)))
    })
    .await;
    let (conn, process, pty) = match found {
        Ok(found) => found,
        Err(e) => return refuse(socket, ApiError::from(e)).await,
    };
    let attached = json!({ "type": "attached", "pid": pid }).to_string();
    if socket.send(Message::text(attached)).await.is_err() {
        return;
    }
    run_session(socket, state, tenant, id, conn, process, pty, None).await;
}

/// One session: read the start message, start the process, then pump both
/// ways until it exits or the client leaves.
async fn session(
    mut socket: WebSocket,
    state: AppState,
    tenant: brig_runtime::TenantId,
    id: brig_core::SandboxId,
) {
    let start = match tokio::time::timeout(START_TIMEOUT, first_message(&mut socket)).await {
        Ok(Ok(start)) => start,
        Ok(Err(Some(e))) => return refuse(socket, e).await,
        // The client left before saying anything.
        Ok(Err(None)) => return,
        Err(_) => {
            let e = ApiError::bad_request(format!(
                "no start message within {}s: send {{\"argv\": [...]}} first",
                START_TIMEOUT.as_secs()
            ));
            return refuse(socket, e).await;
        }
    };
    let pty = start.pty;
    let timeout = match super::exec::exec_timeout(start.timeout.as_deref()) {
        Ok(t) => t,
        Err(e) => return refuse(socket, e).await,
    };
    let req = ExecRequest {
        argv: start.argv,
        env: start.env,
        cwd: start.cwd,
        user: start.user,
        pty: pty.then_some(PtySize {
            rows: start.rows,
            cols: start.cols,
        }),
        // Its own, not the session's: it outlives a daemon that goes away
        // (restarted, upgraded) and a client re-attaches with `?pid=`; the
        // client leaving is what kills it (`Input::Gone`).
        background: true,
        attached: true,
        ..ExecRequest::default()
    };
    let manager = &state.manager;
    let started = async {
        let process = manager.exec_async(&tenant, &id, &req).await?;
        Ok((manager.connection(&tenant, &id)?, process))
    };
    let (conn, process) = match started.await {
        Ok(p) => p,
        Err(e) => return refuse(socket, ApiError::command_start(e)).await,
    };
    let pid = process.pid().unwrap_or(0);
    let started = json!({ "type": "started", "pid": pid }).to_string();
    if socket.send(Message::text(started)).await.is_err() {
        // Nobody will ever attach: end it.
        let _ = process.stdin().signal_async(libc::SIGKILL).await;
        return;
    }
    run_session(socket, state, tenant, id, conn, process, pty, timeout).await;
}

/// Pump a session's process both ways until it exits or the client leaves
/// (then it is killed).
#[allow(clippy::too_many_arguments)]
async fn run_session(
    socket: WebSocket,
    state: AppState,
    tenant: brig_runtime::TenantId,
    id: brig_core::SandboxId,
    conn: Arc<Connection>,
    process: Process,
    pty: bool,
    timeout: Option<Duration>,
) {
    let pid = process.pid().unwrap_or(0);
    let (mut sink, mut stream) = socket.split();
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(FRAMES_IN_FLIGHT);
    let (in_tx, in_rx) = mpsc::channel::<Input>(INPUT_IN_FLIGHT);
    let target = Target {
        stdin: process.stdin(),
        conn,
        pid,
        exited: Arc::new(AtomicBool::new(false)),
    };
    let exited = Arc::clone(&target.exited);
    // Both wait on the agent without a thread: its output (taken as the
    // socket drains) and its stdin credit.
    let limit = TimeLimit {
        manager: Arc::clone(&state.manager),
        tenant: tenant.clone(),
        id: id.clone(),
        deadline: timeout.map(|t| tokio::time::Instant::now() + t),
        after: timeout,
    };
    tokio::spawn(async move { pump_output(process, pty, &exited, out_tx, limit).await });
    tokio::spawn(pump_input(target, in_rx));

    let mut reader = tokio::spawn(async move {
        while let Some(msg) = stream.next().await {
            let input = match msg {
                Ok(Message::Binary(b)) => Input::Bytes(b),
                Ok(Message::Text(t)) => match serde_json::from_str::<Control>(t.as_str()) {
                    Ok(Control::Eof) => Input::Eof,
                    Ok(Control::Resize { cols, rows }) => Input::Resize { rows, cols },
                    Ok(Control::Signal { signal }) => match signal.number() {
                        Ok(sig) => Input::Signal(sig),
                        Err(e) => {
                            tracing::debug!("pty session: ignored a bad signal: {}", e.message);
                            continue;
                        }
                    },
                    Err(e) => {
                        tracing::debug!("pty session: ignored a bad control message: {e}");
                        continue;
                    }
                },
                Ok(Message::Close(_)) | Err(_) => break,
                Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            };
            if in_tx.send(input).await.is_err() {
                return; // the process's stdin is over
            }
        }
        let _ = in_tx.send(Input::Gone).await;
    });

    // Output to the socket until the process's stream ends or the client
    // stops taking it.
    let mut ended = false;
    while let Some(msg) = out_rx.recv().await {
        ended = matches!(msg, Message::Close(_));
        if sink.send(msg).await.is_err() {
            break;
        }
    }
    drop(out_rx); // a pump still sending learns the client is gone
    if ended {
        // Give the client a moment to answer the close; then stop reading.
        if tokio::time::timeout(Duration::from_secs(2), &mut reader)
            .await
            .is_err()
        {
            reader.abort();
        }
    } else {
        // The client is gone: the reader reports it (and so kills the
        // process) once its half of the socket ends.
        let _ = reader.await;
    }
}

/// The start message, or the error to refuse with (`None`: the client
/// left).
async fn first_message(socket: &mut WebSocket) -> Result<PtyStart, Option<ApiError>> {
    loop {
        let text =
            match socket.recv().await {
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(Message::Binary(_))) => return Err(Some(ApiError::bad_request(
                    "the first message must be text: {\"argv\": [...], \"cols\": .., \"rows\": ..}",
                ))),
                Some(Ok(Message::Close(_)) | Err(_)) | None => return Err(None),
            };
        let start: PtyStart = serde_json::from_str(text.as_str()).map_err(|e| {
            Some(ApiError::bad_request(format!(
                "the start message is not valid: {e}"
            )))
        })?;
        if start.argv.first().is_none_or(|a| a.is_empty()) {
            return Err(Some(ApiError::bad_request(
                "argv must name a program, for example [\"bash\"]",
            )));
        }
        super::exec::no_nul(&start.argv, &start.env, start.cwd.as_deref()).map_err(Some)?;
        if start.pty && (start.cols == 0 || start.rows == 0) {
            return Err(Some(ApiError::bad_request(
                "cols and rows must be at least 1",
            )));
        }
        return Ok(start);
    }
}

/// An `error` frame for `err`, then a close.
async fn refuse(mut socket: WebSocket, err: ApiError) {
    let frame = json!({ "type": "error", "code": err.code, "message": err.message });
    let _ = socket.send(Message::text(frame.to_string())).await;
    let _ = socket.send(close(close_code::POLICY)).await;
}

/// WebSocket close codes (RFC 6455 §7.4.1).
mod close_code {
    pub const NORMAL: u16 = 1000;
    pub const POLICY: u16 = 1008;
    pub const ERROR: u16 = 1011;
}

fn close(code: u16) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: "".into(),
    }))
}

/// The process's output as frames, then `exited` (or `error`) and a close.
/// Returns as soon as the socket side is gone; dropping `process` then
/// kills it.
async fn pump_output(
    mut process: Process,
    pty: bool,
    exited: &AtomicBool,
    tx: mpsc::Sender<Message>,
    limit: TimeLimit,
) {
    let mut code = close_code::ERROR;
    loop {
        let Some(next) = super::exec::next_before(&mut process, limit.deadline).await else {
            // Time is up: what it still printed, then `exited` 124.
            let last = super::exec::kill_for_timeout(
                &limit.manager,
                &limit.tenant,
                &limit.id,
                &mut process,
            )
            .await;
            for msg in last
                .into_iter()
                .filter_map(|item| output_frame(item.ok()?, pty))
            {
                if tx.send(msg).await.is_err() {
                    return;
                }
            }
            exited.store(true, Ordering::Relaxed);
            let after = limit.after.map_or(0, |a| a.as_millis() as u64);
            let end = json!({ "type": "exited", "code": super::exec::TIMED_OUT, "signal": null,
                              "timed_out": true, "timeout_ms": after });
            let _ = tx.send(Message::text(end.to_string())).await;
            let _ = tx.send(close(close_code::NORMAL)).await;
            return;
        };
        let Some(item) = next else { break };
        let msg = match item {
            Ok(out @ (Output::Stdout(_) | Output::Stderr(_))) => match output_frame(out, pty) {
                Some(frame) => frame,
                None => continue,
            },
            Ok(Output::Exited { code: c, signal }) => {
                exited.store(true, Ordering::Relaxed);
                code = close_code::NORMAL;
                let mut v = json!({ "type": "exited", "code": c, "signal": signal });
                if signal == Some(libc::SIGKILL) {
                    if let Some(why) =
                        super::exec::oom_note(&limit.manager, &limit.tenant, &limit.id).await
                    {
                        v["oom_killed"] = true.into();
                        v["message"] = why.into();
                    }
                }
                Message::text(v.to_string())
            }
            Ok(Output::Started { .. } | Output::Attached { .. }) => continue,
            Err(e) => {
                let mut v =
                    super::exec::stream_error(&limit.manager, &limit.tenant, &limit.id, &e).await;
                // The session's error frames carry a code, as its refusals do.
                v["code"] = if v.get("sandbox_end").is_some() {
                    "sandbox_ended"
                } else {
                    "stream_failed"
                }
                .into();
                Message::text(v.to_string())
            }
        };
        if tx.send(msg).await.is_err() {
            return;
        }
    }
    let _ = tx.send(close(code)).await;
}

/// The binary frame for some output: a terminal's bytes as they are, on
/// pipes tagged with the stream they came from; `None` for anything else.
fn output_frame(out: Output, pty: bool) -> Option<Message> {
    Some(match out {
        Output::Stdout(b) if pty => Message::Binary(b.into()),
        Output::Stdout(b) => Message::Binary(tagged(STDOUT, b)),
        Output::Stderr(b) => Message::Binary(tagged(STDERR, b)),
        _ => return None,
    })
}

fn tagged(tag: u8, bytes: Vec<u8>) -> Bytes {
    let mut v = Vec::with_capacity(bytes.len() + 1);
    v.push(tag);
    v.extend(bytes);
    Bytes::from(v)
}

/// A session's time limit and what it takes to enforce it.
struct TimeLimit {
    manager: Arc<brig_runtime::SandboxManager>,
    tenant: brig_runtime::TenantId,
    id: brig_core::SandboxId,
    deadline: Option<tokio::time::Instant>,
    after: Option<Duration>,
}

/// Where the client's input goes.
struct Target {
    stdin: Stdin,
    /// For signals once stdin is closed (the stream then takes no control
    /// messages from this side).
    conn: Arc<Connection>,
    pid: i32,
    /// Set once the process's `exited` was read: its pid may then be
    /// reused, so it is not signalled by pid any more.
    exited: Arc<AtomicBool>,
}

impl Target {
    async fn signal(&self, sig: i32) -> Result<(), ClientError> {
        match self.stdin.signal_async(sig).await {
            Err(_) if !self.exited.load(Ordering::Relaxed) && self.pid > 0 => {
                let (conn, pid) = (Arc::clone(&self.conn), self.pid);
                tokio::task::spawn_blocking(move || conn.call(&Call::Signal { pid, sig }).map(drop))
                    .await
                    .unwrap_or(Err(ClientError::Closed))
            }
            other => other,
        }
    }
}

/// The client's input to the process, in order. Waits on the stream's
/// send credit, which is what backpressures the socket reader.
async fn pump_input(target: Target, mut rx: mpsc::Receiver<Input>) {
    while let Some(input) = rx.recv().await {
        let done = match input {
            Input::Bytes(b) => target.stdin.write_all_async(&b).await,
            Input::Eof => target.stdin.close(),
            Input::Resize { rows, cols } => target.stdin.resize_async(rows, cols).await,
            Input::Signal(sig) => target.signal(sig).await,
            Input::Gone => {
                let _ = target.signal(libc::SIGKILL).await;
                return;
            }
        };
        if let Err(e) = done {
            // The process exited or closed its stdin; its output side
            // reports how it ended. Keep draining so the reader never
            // blocks on a full channel, but a departed client still kills.
            tracing::debug!("pty session: input not delivered: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_message_has_terminal_defaults() {
        let s: PtyStart = serde_json::from_str(r#"{"argv": ["bash"]}"#).unwrap();
        assert_eq!((s.cols, s.rows, s.pty), (80, 24, true));
        assert!(serde_json::from_str::<PtyStart>(r#"{"argv": [], "bogus": 1}"#).is_err());
    }

    #[test]
    fn control_messages_parse() {
        let parse = |s: &str| serde_json::from_str::<Control>(s);
        assert!(matches!(
            parse(r#"{"type":"resize","cols":132,"rows":43}"#).unwrap(),
            Control::Resize {
                cols: 132,
                rows: 43
            }
        ));
        assert!(matches!(parse(r#"{"type":"eof"}"#).unwrap(), Control::Eof));
        for (text, sig) in [
            (r#"{"type":"signal","signal":"SIGINT"}"#, libc::SIGINT),
            (r#"{"type":"signal","signal":"TERM"}"#, libc::SIGTERM),
            (r#"{"type":"signal","signal":9}"#, libc::SIGKILL),
        ] {
            match parse(text).unwrap() {
                Control::Signal { signal } => assert_eq!(signal.number().unwrap(), sig),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(parse(r#"{"type":"resize","cols":-1,"rows":1}"#).is_err());
        assert!(parse(r#"{"type":"dance"}"#).is_err());
    }
}
