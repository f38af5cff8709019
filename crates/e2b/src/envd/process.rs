//! envd's `process.Process` service (reference §3.2).
//!
//! ## Processes outlive their request
//!
//! E2B's processes keep running when the client that started them goes
//! away (a background command, a dropped connection), and any later
//! request may re-attach (`Connect`), write their stdin, signal or resize
//! them. So each one runs as one of the agent's *background* processes
//! whose exec stream stays attached from its first byte
//! (`ExecRequest::attached`; attaching after `started` left a gap in which
//! a fast writer overran the agent's 1 MiB buffer for unattended output),
//! and the daemon stays attached until it exits ([`Tracked`]). While
//! attached, the agent paces the process by this stream, so nothing is
//! lost between it and the daemon. A pump thread takes its output and fans it out to
//! whichever streams are subscribed right now (`Start`'s, `Connect`s'),
//! and the attachment's stdin serves `SendInput`, `StreamInput`,
//! `CloseStdin`, `Update` and `SendSignal`. With nobody subscribed the
//! output is dropped, as upstream does: `Connect` gives live output from
//! the moment it attaches. A slow subscriber slows the pump, so the
//! process is throttled by its readers instead of buffered without bound.
//!
//! An exited process stays in the table for [`KEEP_ENDED`] (at most
//! [`MAX_ENDED`] of them) so a late `Connect` still gets its `end`.
//!
//! `Connect-Timeout-Ms` on `Start` bounds the process's life: when it
//! elapses the process is killed (upstream's `exec.CommandContext`);
//! absent or 0 means no limit.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine;
use brig_agent_client::{Call, ExecRequest, Output, Process, PtySize, Reply, Stdin};
use brig_core::SandboxId;
use brig_runtime::{SandboxManager, TenantId};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::{self, Code, ConnectError, EnvelopeReader, StreamItem};
use super::{lock, Ctx};

/// How long an exited process stays for a late `Connect`.
const KEEP_ENDED: Duration = Duration::from_secs(60);
/// At most this many exited processes are kept per sandbox.
const MAX_ENDED: usize = 64;
/// Events in flight to one subscriber before the pump waits for it.
const EVENTS_IN_FLIGHT: usize = 64;

/// `POST /process.Process/{method}`.
pub async fn rpc(
    Extension(ctx): Extension<Ctx>,
    Path(method): Path<String>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    match method.as_str() {
        "Start" => match read_body(body).await {
            Ok(b) => start(&ctx, &headers, &b).await,
            Err(e) => connect::stream_error(e),
        },
        "Connect" => match read_body(body).await {
            Ok(b) => attach(&ctx, &headers, &b).await,
            Err(e) => connect::stream_error(e),
        },
        "StreamInput" => connect::client_stream_response(stream_input(&ctx, body).await),
        _ => {
            let b = match read_body(body).await {
                Ok(b) => b,
                Err(e) => return e.into_response(),
            };
            let result = match method.as_str() {
                "List" => list(&ctx, &headers, &b),
                "SendInput" => send_input(&ctx, &headers, &b).await,
                "SendSignal" => send_signal(&ctx, &headers, &b).await,
                "CloseStdin" => close_stdin(&ctx, &headers, &b).await,
                "Update" => update(&ctx, &headers, &b).await,
                other => Err(ConnectError::new(
                    Code::Unimplemented,
                    format!("process.Process has no method {other}"),
                )),
            };
            connect::unary(result)
        }
    }
}

/// Decode `body` as `method`'s request and check it as the handler does
/// before it touches a sandbox (the base64 input, the PTY size, the
/// signal): the part of [`rpc`] a client's bytes reach first, runnable
/// without a sandbox, for the `envd_messages` fuzz target. A method added
/// to [`rpc`] belongs here too. `StreamInput`'s body is a sequence of
/// envelopes, each a `StreamInputEvent`.
pub fn check_request(method: &str, headers: &HeaderMap, body: &[u8]) -> Result<(), ConnectError> {
    match method {
        "Start" => {
            let req: StartRequest = connect::stream_request(headers, body)?;
            if let Some(pty) = req.pty {
                pty.size();
            }
        }
        "Connect" => {
            let _: SelectorRequest = connect::stream_request(headers, body)?;
        }
        "StreamInput" => {
            let mut rest = body;
            while let Some((flags, payload)) = connect::split_envelope(&mut rest)? {
                if flags & connect::FLAG_END_STREAM != 0 {
                    break;
                }
                let ev: StreamInputEvent =
                    connect::decode_message(if payload.is_empty() { b"{}" } else { payload })?;
                if let StreamInputEvent::Data { input } = ev {
                    input.unwrap_or_default().bytes()?;
                }
            }
        }
        "List" => {
            let _: Value = connect::unary_request(headers, body)?;
        }
        "SendInput" => {
            let req: SendInputRequest = connect::unary_request(headers, body)?;
            req.input.unwrap_or_default().bytes()?;
        }
        "SendSignal" => {
            let req: SendSignalRequest = connect::unary_request(headers, body)?;
            signal_number(req.signal.as_ref())?;
        }
        "CloseStdin" => {
            let _: SelectorRequest = connect::unary_request(headers, body)?;
        }
        "Update" => {
            let req: UpdateRequest = connect::unary_request(headers, body)?;
            if let Some(pty) = req.pty {
                pty.size();
            }
        }
        other => {
            return Err(ConnectError::new(
                Code::Unimplemented,
                format!("process.Process has no method {other}"),
            ))
        }
    }
    Ok(())
}

pub(crate) async fn read_body(body: Body) -> Result<Bytes, ConnectError> {
    axum::body::to_bytes(body, 64 << 20)
        .await
        .map_err(|e| ConnectError::invalid(format!("reading the request body: {e}")))
}

// ---- messages ----

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProcessConfig {
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

#[derive(Debug, Deserialize)]
struct PtyMsg {
    #[serde(default)]
    size: Option<SizeMsg>,
}

#[derive(Debug, Deserialize)]
struct SizeMsg {
    #[serde(default)]
    cols: u32,
    #[serde(default)]
    rows: u32,
}

impl PtyMsg {
    fn size(&self) -> PtySize {
        let (cols, rows) = self.size.as_ref().map_or((80, 24), |s| (s.cols, s.rows));
        PtySize {
            cols: clamp_dim(cols, 80),
            rows: clamp_dim(rows, 24),
        }
    }
}

fn clamp_dim(v: u32, default: u16) -> u16 {
    if v == 0 {
        default
    } else {
        v.min(u16::MAX as u32) as u16
    }
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    process: Option<ProcessConfig>,
    #[serde(default)]
    pty: Option<PtyMsg>,
    #[serde(default)]
    tag: Option<String>,
    /// Absent means true (envd's back-compat rule).
    #[serde(default)]
    stdin: Option<bool>,
}

/// `ProcessSelector`: a pid or a tag.
#[derive(Debug, Default, Deserialize)]
struct Selector {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SelectorRequest {
    #[serde(default)]
    process: Option<Selector>,
}

#[derive(Debug, Default, Deserialize)]
struct InputMsg {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    pty: Option<String>,
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    input: Option<InputMsg>,
}

#[derive(Debug, Deserialize)]
struct SendSignalRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    signal: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    #[serde(default)]
    process: Option<Selector>,
    #[serde(default)]
    pty: Option<PtyMsg>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
enum StreamInputEvent {
    Start {
        #[serde(default)]
        process: Option<Selector>,
    },
    Data {
        #[serde(default)]
        input: Option<InputMsg>,
    },
    Keepalive {},
}

fn event(ev: Value) -> Value {
    json!({ "event": ev })
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str) -> Result<Vec<u8>, ConnectError> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| ConnectError::invalid(format!("input is not valid base64: {e}")))
}

impl InputMsg {
    fn bytes(&self) -> Result<Vec<u8>, ConnectError> {
        match (&self.stdin, &self.pty) {
            (Some(s), _) | (None, Some(s)) => unb64(s),
            (None, None) => Ok(Vec::new()),
        }
    }
}

// ---- the table of processes ----

/// The key of envd's note in a process's `meta` (kept by the agent).
const NOTE_KEY: &str = "e2b";

/// The processes envd started in one sandbox.
#[derive(Debug, Default)]
pub struct Table {
    procs: Mutex<HashMap<u32, Arc<Tracked>>>,
}

/// One process the daemon is attached to.
#[derive(Debug)]
struct Tracked {
    pid: u32,
    tag: Option<String>,
    /// `ProcessConfig` as `List` reports it.
    config: Value,
    pty: bool,
    /// The attachment's writer side: stdin and resize. Nothing may be sent
    /// on it once stdin is closed (the agent would reset the stream), so
    /// signals go by pid instead.
    stdin: tokio::sync::Mutex<Stdin>,
    stdin_closed: std::sync::atomic::AtomicBool,
    fanout: Mutex<Fanout>,
}

#[derive(Debug, Default)]
struct Fanout {
    subscribers: Vec<mpsc::Sender<StreamItem>>,
    /// How the stream ended, once it did, and when.
    end: Option<(Ending, Instant)>,
}

/// How a process's stream ends for every subscriber, present and late.
#[derive(Debug, Clone)]
enum Ending {
    /// The process exited: its `end` event, then a clean end of stream.
    Exited(Value),
    /// The sandbox was killed (or its agent lost) under the process: the
    /// stream ends with `unavailable`, as E2B's proxy ends it when a
    /// sandbox goes away mid-command. The clients then probe `/health`
    /// (a 502 "was not found" for a sandbox that is gone) and raise
    /// their killed-sandbox error (Python `SandboxNotRunningException`,
    /// JS `TimeoutError`), not an exit code of -1.
    Lost(ConnectError),
}

impl Ending {
    fn items(&self) -> Vec<StreamItem> {
        match self {
            Ending::Exited(end) => vec![StreamItem::Msg(end.clone())],
            Ending::Lost(e) => vec![StreamItem::End(Some(e.clone()))],
        }
    }
}

impl Table {
    fn find(&self, sel: Option<&Selector>) -> Result<Arc<Tracked>, ConnectError> {
        let sel = sel.ok_or_else(|| ConnectError::invalid("process selector is missing"))?;
        let procs = lock(&self.procs);
        let found = match (sel.pid, &sel.tag) {
            (Some(pid), _) => procs.get(&pid).cloned(),
            (None, Some(tag)) => procs
                .values()
                .filter(|p| p.tag.as_deref() == Some(tag))
                .max_by_key(|p| lock(&p.fanout).end.is_none())
                .cloned(),
            (None, None) => {
                return Err(ConnectError::invalid(
                    "process selector needs a pid or a tag",
                ));
            }
        };
        found.ok_or_else(|| match (sel.pid, &sel.tag) {
            (Some(pid), _) => ConnectError::not_found(format!("process with pid {pid} not found")),
            (_, tag) => ConnectError::not_found(format!(
                "process with tag {} not found",
                tag.as_deref().unwrap_or_default()
            )),
        })
    }

    /// A process that is still running (signals, input, resize).
    fn running(&self, sel: Option<&Selector>) -> Result<Arc<Tracked>, ConnectError> {
        let p = self.find(sel)?;
        if lock(&p.fanout).end.is_some() {
            return Err(ConnectError::not_found(format!(
                "process with pid {} not found (it has exited)",
                p.pid
            )));
        }
        Ok(p)
    }

    /// After a daemon restart: take back the processes an earlier daemon
    /// started in this sandbox. The agent kept them running, and with each
    /// the note `start` gave it ([`NOTE_KEY`]: tag and config); each one
    /// still running is re-attached and pumped as `start` does, so `List`
    /// shows it and `Connect`, input and signals reach it again. Output it
    /// wrote while no daemon ran was kept by the agent (its last 1 MiB) and
    /// is dropped here like any output nobody is subscribed to.
    pub(crate) fn restore(&self, manager: &Arc<SandboxManager>, tenant: &TenantId, id: &SandboxId) {
        let list = match manager.call(tenant, id, &Call::ListProcesses) {
            Ok(Reply::Processes(list)) => list,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!("sandbox {id}: cannot list its processes to restore them: {e}");
                return;
            }
        };
        for info in list.into_iter().filter(|p| p.running && p.background) {
            let Some(note) = info
                .meta
                .as_deref()
                .and_then(|m| serde_json::from_str::<Value>(m).ok())
                .and_then(|mut v| v.get_mut(NOTE_KEY).map(Value::take))
            else {
                continue;
            };
            let attached = match manager.attach(tenant, id, info.pid) {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(
                        "sandbox {id}: cannot re-attach to process {}: {e}",
                        info.pid
                    );
                    continue;
                }
            };
            let tracked = Arc::new(Tracked {
                pid: info.pid as u32,
                tag: note["tag"].as_str().map(str::to_string),
                config: note["config"].clone(),
                pty: info.pty,
                stdin: tokio::sync::Mutex::new(attached.stdin()),
                stdin_closed: std::sync::atomic::AtomicBool::new(false),
                fanout: Mutex::new(Fanout::default()),
            });
            self.insert(Arc::clone(&tracked));
            if let Err(e) = spawn_pump(tracked, attached, Arc::clone(manager), id.clone()) {
                tracing::warn!("sandbox {id}: cannot pump process {}: {e}", info.pid);
            }
        }
    }

    fn insert(&self, p: Arc<Tracked>) {
        let mut procs = lock(&self.procs);
        // Forget exited processes past their grace period, and the oldest
        // beyond the cap.
        let mut ended: Vec<(u32, Instant)> = procs
            .values()
            .filter_map(|p| lock(&p.fanout).end.as_ref().map(|(_, at)| (p.pid, *at)))
            .collect();
        ended.sort_by_key(|(_, at)| *at);
        let excess = ended.len().saturating_sub(MAX_ENDED);
        for (i, (pid, at)) in ended.iter().enumerate() {
            if i < excess || at.elapsed() > KEEP_ENDED {
                procs.remove(pid);
            }
        }
        procs.insert(p.pid, p);
    }
}

impl Tracked {
    /// Add a stream. If the process already ended the stream gets `end`
    /// now, and its end-stream once the caller drops its sender.
    fn subscribe(&self, tx: mpsc::Sender<StreamItem>) {
        let mut f = lock(&self.fanout);
        match &f.end {
            Some((end, _)) => {
                for item in end.items() {
                    let _ = tx.try_send(item);
                }
            }
            None => f.subscribers.push(tx),
        }
    }

    /// Write to the process's stdin, waiting on its credit without a
    /// thread (a process that does not read its stdin holds the writer
    /// here, not a blocking thread).
    async fn input(&self, bytes: &[u8]) -> Result<(), ConnectError> {
        if self.stdin_closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ConnectError::new(
                Code::FailedPrecondition,
                format!("the stdin of process {} is closed", self.pid),
            ));
        }
        self.stdin
            .lock()
            .await
            .write_all_async(bytes)
            .await
            .map_err(|e| {
                ConnectError::new(
                    Code::FailedPrecondition,
                    format!("write to the stdin of process {}: {e}", self.pid),
                )
            })
    }
}

/// [`pump`] as a task of the daemon's runtime: it waits on the agent
/// without a thread for as long as the process runs.
fn spawn_pump(
    p: Arc<Tracked>,
    process: Process,
    manager: Arc<SandboxManager>,
    id: SandboxId,
) -> std::io::Result<()> {
    let rt = tokio::runtime::Handle::try_current()
        .map_err(|e| std::io::Error::other(format!("no async runtime to pump on: {e}")))?;
    rt.spawn(async move { pump(&p, process, &manager, &id).await });
    Ok(())
}

/// Take the attachment's output until the process exits, fanning it out.
async fn pump(p: &Tracked, mut process: Process, manager: &SandboxManager, id: &SandboxId) {
    let lost = |why: String| {
        Ending::Lost(ConnectError::new(
            Code::Unavailable,
            format!("the connection to sandbox {id} ended before the stream completed: {why}"),
        ))
    };
    let mut end = None;
    while let Some(item) = process.next_output().await {
        let ev = match item {
            Ok(Output::Stdout(b)) if p.pty => json!({ "data": { "pty": b64(&b) } }),
            Ok(Output::Stdout(b)) => json!({ "data": { "stdout": b64(&b) } }),
            Ok(Output::Stderr(b)) => json!({ "data": { "stderr": b64(&b) } }),
            // Killed with its sandbox: the sandbox's end, not the process's.
            Ok(Output::Exited {
                signal: Some(libc::SIGKILL),
                ..
            }) if manager.is_ending(id) => {
                end = Some(lost("the sandbox was killed".into()));
                break;
            }
            Ok(Output::Exited { code, signal }) => {
                end = Some(Ending::Exited(end_event(code, signal)));
                break;
            }
            Ok(Output::Started { .. } | Output::Attached { .. }) => continue,
            Err(e) => {
                // The sandbox or its agent went away mid-process.
                end = Some(lost(e.to_string()));
                break;
            }
        };
        let subs = lock(&p.fanout).subscribers.clone();
        let mut gone = Vec::new();
        for tx in subs {
            if tx.send(StreamItem::Msg(event(ev.clone()))).await.is_err() {
                gone.push(tx);
            }
        }
        if !gone.is_empty() {
            lock(&p.fanout)
                .subscribers
                .retain(|s| !gone.iter().any(|g| g.same_channel(s)));
        }
    }
    let end = end.unwrap_or_else(|| lost("the process stream ended without an exit status".into()));
    let end = match end {
        Ending::Exited(v) => Ending::Exited(event(v)),
        lost => lost,
    };
    let subs = {
        let mut f = lock(&p.fanout);
        f.end = Some((end.clone(), Instant::now()));
        std::mem::take(&mut f.subscribers)
    };
    for tx in subs {
        // Dropping the sender afterwards ends an exited stream with `{}`.
        for item in end.items() {
            let _ = tx.send(item).await;
        }
    }
}

/// `ProcessEvent.end` as envd reports it (Go's `ProcessState.String()`).
fn end_event(code: Option<i32>, signal: Option<i32>) -> Value {
    match (code, signal) {
        (Some(0), _) => {
            json!({ "end": { "exitCode": 0, "exited": true, "status": "exit status 0" } })
        }
        (Some(c), _) => {
            let status = format!("exit status {c}");
            json!({ "end": { "exitCode": c, "exited": true, "status": status, "error": status } })
        }
        (None, sig) => {
            let status = format!("signal: {}", signal_name(sig.unwrap_or(0)));
            json!({ "end": { "exitCode": -1, "exited": false, "status": status, "error": status } })
        }
    }
}

fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGHUP => "hangup".into(),
        libc::SIGINT => "interrupt".into(),
        libc::SIGQUIT => "quit".into(),
        libc::SIGKILL => "killed".into(),
        libc::SIGSEGV => "segmentation fault".into(),
        libc::SIGPIPE => "broken pipe".into(),
        libc::SIGALRM => "alarm clock".into(),
        libc::SIGTERM => "terminated".into(),
        libc::SIGABRT => "aborted".into(),
        libc::SIGUSR1 => "user defined signal 1".into(),
        libc::SIGUSR2 => "user defined signal 2".into(),
        n => format!("signal {n}"),
    }
}

// ---- the RPCs ----

async fn start(ctx: &Ctx, headers: &HeaderMap, body: &[u8]) -> Response {
    let req: StartRequest = match connect::stream_request(headers, body) {
        Ok(r) => r,
        Err(e) => return connect::stream_error(e),
    };
    let keepalive = connect::keepalive(headers);
    let timeout = connect::timeout(headers);
    let user = super::basic_user(headers);
    let (tx, rx) = mpsc::channel(EVENTS_IN_FLIGHT);
    let started = ctx
        .blocking(move |ctx| spawn(ctx, req, user.as_deref(), tx))
        .await;
    let tracked = match started {
        Ok(t) => t,
        Err(e) => return connect::stream_error(e),
    };
    if let Some(limit) = timeout {
        let (ctx, p) = (ctx.clone(), Arc::clone(&tracked));
        tokio::spawn(async move {
            tokio::time::sleep(limit).await;
            if lock(&p.fanout).end.is_none() {
                let _ = ctx
                    .blocking(move |ctx| signal(ctx, &p, libc::SIGKILL))
                    .await;
            }
        });
    }
    connect::stream_response(rx, keepalive, event(json!({ "keepalive": {} })))
}

/// Start the process, attach, subscribe `tx` (after the `start` event) and
/// start the pump.
fn spawn(
    ctx: &Ctx,
    req: StartRequest,
    user: Option<&str>,
    tx: mpsc::Sender<StreamItem>,
) -> Result<Arc<Tracked>, ConnectError> {
    let config = req
        .process
        .ok_or_else(|| ConnectError::invalid("process config is missing"))?;
    if config.cmd.is_empty() {
        return Err(ConnectError::invalid("process.cmd must name a program"));
    }
    let user = ctx.user(user)?;
    let cwd = match config.cwd.as_deref() {
        Some(c) => user.resolve(c),
        None => ctx
            .sandbox
            .workdir
            .clone()
            .unwrap_or_else(|| user.home.clone()),
    };
    let cwd_exists = matches!(
        ctx.manager().call(&ctx.sandbox.tenant, ctx.id(), &Call::Stat { path: cwd.clone(), xattrs: None }),
        Ok(brig_agent_client::Reply::Stat(e)) if e.kind == brig_agent_client::FileKind::Dir
    );
    let cwd = if cwd_exists {
        Some(cwd)
    } else if config.cwd.is_some() {
        return Err(ConnectError::invalid(format!("cwd '{cwd}' does not exist")));
    } else {
        // A user without a home directory runs from the agent's default.
        None
    };
    // HOME, USER, LOGNAME; then the sandbox's variables; then the request's.
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert("HOME".into(), user.home.clone());
    env.insert("USER".into(), user.name.clone());
    env.insert("LOGNAME".into(), user.name.clone());
    env.extend(ctx.sandbox.env.clone());
    env.extend(config.envs.clone());
    let mut argv = vec![config.cmd.clone()];
    argv.extend(config.args.iter().cloned());
    let pty = req.pty.as_ref().map(PtyMsg::size);
    let config_json = json!({
        "cmd": config.cmd,
        "args": config.args,
        "envs": config.envs,
        "cwd": config.cwd,
    });
    // What a restarted daemon needs to list and re-attach it: kept by the
    // agent with the process (see `Table::restore`).
    let note = json!({ NOTE_KEY: { "tag": req.tag, "config": config_json } });
    let exec = ExecRequest {
        argv,
        env,
        cwd,
        user: Some(user.name.clone()),
        pty,
        // A background process (it outlives this request) whose output
        // comes on this very stream from its first byte: attaching
        // afterwards would leave a gap in which a fast writer overruns the
        // agent's buffer for unattached processes.
        background: true,
        attached: true,
        meta: Some(note.to_string()).filter(|m| m.len() <= brig_agent_client::MAX_META),
        ..ExecRequest::default()
    };
    let manager = ctx.manager();
    let (tenant, id) = (&ctx.sandbox.tenant, ctx.id());
    let attached = manager.exec(tenant, id, &exec).map_err(|e| {
        let e = ConnectError::from(e);
        match e.code {
            // A program that does not exist is the caller's mistake.
            Code::NotFound => ConnectError::invalid(e.message),
            _ => e,
        }
    })?;
    let pid = attached
        .pid()
        .ok_or_else(|| ConnectError::internal("the agent started the process without a pid"))?;
    // stdin=false: the process reads EOF, as with envd (absent means open).
    if pty.is_none() && req.stdin == Some(false) {
        attached
            .close_stdin()
            .map_err(|e| ConnectError::internal(format!("close stdin: {e}")))?;
    }
    let tracked = Arc::new(Tracked {
        pid: pid as u32,
        tag: req.tag,
        config: config_json,
        pty: pty.is_some(),
        stdin: tokio::sync::Mutex::new(attached.stdin()),
        stdin_closed: std::sync::atomic::AtomicBool::new(pty.is_none() && req.stdin == Some(false)),
        fanout: Mutex::new(Fanout::default()),
    });
    // `start` first, flushed at once: background commands return on it.
    let _ = tx.try_send(StreamItem::Msg(event(json!({ "start": { "pid": pid } }))));
    tracked.subscribe(tx);
    ctx.envd.processes.insert(Arc::clone(&tracked));
    spawn_pump(Arc::clone(&tracked), attached, ctx.manager(), id.clone())
        .map_err(|e| ConnectError::internal(format!("cannot start a pump thread: {e}")))?;
    Ok(tracked)
}

async fn attach(ctx: &Ctx, headers: &HeaderMap, body: &[u8]) -> Response {
    let req: SelectorRequest = match connect::stream_request(headers, body) {
        Ok(r) => r,
        Err(e) => return connect::stream_error(e),
    };
    let p = match ctx.envd.processes.find(req.process.as_ref()) {
        Ok(p) => p,
        Err(e) => return connect::stream_error(e),
    };
    let (tx, rx) = mpsc::channel(EVENTS_IN_FLIGHT);
    let _ = tx.try_send(StreamItem::Msg(event(json!({ "start": { "pid": p.pid } }))));
    p.subscribe(tx);
    connect::stream_response(
        rx,
        connect::keepalive(headers),
        event(json!({ "keepalive": {} })),
    )
}

fn list(ctx: &Ctx, headers: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let _: Value = connect::unary_request(headers, body)?;
    let procs = lock(&ctx.envd.processes.procs);
    let mut items: Vec<&Arc<Tracked>> = procs
        .values()
        .filter(|p| lock(&p.fanout).end.is_none())
        .collect();
    items.sort_by_key(|p| p.pid);
    let processes: Vec<Value> = items
        .iter()
        .map(|p| {
            let mut v = json!({ "config": p.config, "pid": p.pid });
            if let Some(tag) = &p.tag {
                v["tag"] = json!(tag);
            }
            v
        })
        .collect();
    Ok(json!({ "processes": processes }))
}

async fn send_input(ctx: &Ctx, headers: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: SendInputRequest = connect::unary_request(headers, body)?;
    let p = ctx.envd.processes.running(req.process.as_ref())?;
    let bytes = req.input.unwrap_or_default().bytes()?;
    p.input(&bytes).await?;
    Ok(json!({}))
}

async fn stream_input(ctx: &Ctx, body: Body) -> Result<Value, ConnectError> {
    let mut reader = EnvelopeReader::new(body);
    let mut target: Option<Arc<Tracked>> = None;
    while let Some(ev) = reader.next::<StreamInputEvent>().await? {
        match ev {
            StreamInputEvent::Start { process } => {
                target = Some(ctx.envd.processes.running(process.as_ref())?);
            }
            StreamInputEvent::Data { input } => {
                let p = target.clone().ok_or_else(|| {
                    ConnectError::invalid("StreamInput: the first message must be start")
                })?;
                let bytes = input.unwrap_or_default().bytes()?;
                p.input(&bytes).await?;
            }
            StreamInputEvent::Keepalive {} => {}
        }
    }
    Ok(json!({}))
}

async fn close_stdin(ctx: &Ctx, headers: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: SelectorRequest = connect::unary_request(headers, body)?;
    let p = ctx.envd.processes.running(req.process.as_ref())?;
    if p.pty {
        return Err(ConnectError::new(
            Code::FailedPrecondition,
            "cannot close the stdin of a PTY process: send ^D (0x04) as input instead",
        ));
    }
    p.stdin_closed
        .store(true, std::sync::atomic::Ordering::SeqCst);
    p.stdin
        .lock()
        .await
        .close()
        .map_err(|e| ConnectError::internal(format!("close stdin: {e}")))?;
    Ok(json!({}))
}

async fn send_signal(ctx: &Ctx, headers: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: SendSignalRequest = connect::unary_request(headers, body)?;
    let sig = signal_number(req.signal.as_ref())?;
    let p = ctx.envd.processes.running(req.process.as_ref())?;
    ctx.blocking(move |ctx| signal(ctx, &p, sig)).await?;
    Ok(json!({}))
}

/// The `Signal` enum of a `SendSignal`, by name or number: envd knows
/// only SIGTERM and SIGKILL.
fn signal_number(signal: Option<&Value>) -> Result<i32, ConnectError> {
    match signal {
        Some(Value::String(s)) if s == "SIGNAL_SIGKILL" => Ok(libc::SIGKILL),
        Some(Value::String(s)) if s == "SIGNAL_SIGTERM" => Ok(libc::SIGTERM),
        Some(Value::Number(n)) if n.as_i64() == Some(9) => Ok(libc::SIGKILL),
        Some(Value::Number(n)) if n.as_i64() == Some(15) => Ok(libc::SIGTERM),
        other => Err(ConnectError::invalid(format!(
            "unsupported signal {}: use SIGNAL_SIGTERM or SIGNAL_SIGKILL",
            other.map_or("(none)".to_string(), Value::to_string)
        ))),
    }
}

/// Signal the process and everything it started: the agent starts every
/// process as a group leader, and a `sh -c` that did not exec its command
/// must not leave that command running (holding the output open). The
/// group goes through `kill` in the sandbox; if there is no group any
/// more, the pid alone, which answers NOT_FOUND once it is gone.
fn signal(ctx: &Ctx, p: &Tracked, sig: i32) -> Result<(), ConnectError> {
    let script = format!("kill -{sig} -{} 2>/dev/null", p.pid);
    if ctx.run_root(&["/bin/sh", "-c", &script]).is_ok() {
        return Ok(());
    }
    ctx.manager().call(
        &ctx.sandbox.tenant,
        ctx.id(),
        &Call::Signal {
            pid: p.pid as i32,
            sig,
        },
    )?;
    Ok(())
}

async fn update(ctx: &Ctx, headers: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: UpdateRequest = connect::unary_request(headers, body)?;
    let p = ctx.envd.processes.running(req.process.as_ref())?;
    let Some(pty) = req.pty else {
        return Ok(json!({}));
    };
    if !p.pty {
        return Err(ConnectError::new(
            Code::FailedPrecondition,
            format!("process {} has no PTY to resize", p.pid),
        ));
    }
    let size = pty.size();
    p.stdin
        .lock()
        .await
        .resize_async(size.rows, size.cols)
        .await
        .map_err(|e| ConnectError::internal(format!("resize: {e}")))?;
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_read_like_go_process_states() {
        assert_eq!(
            end_event(Some(0), None),
            json!({"end":{"exitCode":0,"exited":true,"status":"exit status 0"}})
        );
        assert_eq!(end_event(Some(3), None)["end"]["error"], "exit status 3");
        let killed = end_event(None, Some(9));
        assert_eq!(killed["end"]["status"], "signal: killed");
        assert_eq!(killed["end"]["exited"], false);
    }

    #[test]
    fn stream_input_messages_parse() {
        let ev: StreamInputEvent =
            serde_json::from_str(r#"{"start":{"process":{"pid":42}}}"#).unwrap();
        assert!(matches!(
            ev,
            StreamInputEvent::Start {
                process: Some(Selector { pid: Some(42), .. })
            }
        ));
        let ev: StreamInputEvent =
            serde_json::from_str(r#"{"data":{"input":{"stdin":"YQ=="}}}"#).unwrap();
        let StreamInputEvent::Data { input: Some(i) } = ev else {
            panic!()
        };
        assert_eq!(i.bytes().unwrap(), b"a");
    }
}
