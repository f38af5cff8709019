//! `run_command` (a foreground command: progress while it runs, killed if
//! the call is cancelled), `start_process`, `read_process_output` and
//! `kill_process` (background processes, kept by the sandbox's agent).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use brig_agent_client::{Call as AgentCall, ExecRequest, Output, Process};
use brig_core::SandboxId;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::json;

use crate::error::ToolError;
use crate::tools::{KillProcessArgs, ReadProcessArgs, RunCommandArgs, StartProcessArgs};
use crate::Structured;
use crate::{Call, DEFAULT_WAIT};

/// The most of each stream a result shows; the rest is in a file.
pub const SHOWN: usize = 20_000;
/// The most of each stream kept for that file.
const KEPT: usize = 64 << 20;
/// How often a running command reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The user and home commands run as by default: `user` if the template
/// has one (the code-interpreter template does), else root.
pub(crate) async fn default_user(call: &Call<'_>, id: &SandboxId) -> (String, String) {
    let known = crate::lock(&call.shared().users).get(id).cloned();
    if let Some(known) = known.filter(|_| call.manager().is_running(&call.tenant, id)) {
        return known;
    }
    let (m, t, i) = (Arc::clone(call.manager()), call.tenant.clone(), id.clone());
    let Ok(found) =
        tokio::task::spawn_blocking(move || brig_e2b::control::default_user(&m, &t, &i)).await
    else {
        return ("root".into(), "/root".into());
    };
    // Only a sandbox the tenant may use is remembered (another tenant's
    // reads as "root": its /etc/passwd could not be read).
    if call.manager().is_running(&call.tenant, id) {
        crate::lock(&call.shared().users).insert(id.clone(), found.clone());
    }
    found
}

async fn request(
    call: &Call<'_>,
    id: &SandboxId,
    command: String,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    user: Option<String>,
) -> ExecRequest {
    let (default_user, home) = default_user(call, id).await;
    let mut env = env;
    // The agent runs processes as root unless told a user; naming root
    // costs a passwd lookup in the sandbox on every exec (0.2 ms here), so
    // root by default goes unnamed, with the variables its login would set.
    let user = match user {
        Some(u) => Some(u),
        None if default_user == "root" => {
            for (k, v) in [
                ("HOME", home.as_str()),
                ("USER", "root"),
                ("LOGNAME", "root"),
            ] {
                env.entry(k.to_string()).or_insert_with(|| v.to_string());
            }
            None
        }
        None => Some(default_user),
    };
    ExecRequest {
        argv: vec!["sh".into(), "-c".into(), command],
        env,
        cwd: Some(cwd.unwrap_or(home)),
        user,
        ..ExecRequest::default()
    }
}

fn no_nul(s: &str, field: &str) -> Result<(), ToolError> {
    if s.contains('\0') {
        return Err(ToolError::Invalid(format!(
            "{field} contains a NUL byte, which a process cannot be given"
        )));
    }
    Ok(())
}

/// Kill a process's group, then the process (an older agent takes only
/// the pid).
async fn kill_group(call: &Call<'_>, id: &SandboxId, pid: i32) -> Result<(), ToolError> {
    let (m, t, i) = (Arc::clone(call.manager()), call.tenant.clone(), id.clone());
    tokio::task::spawn_blocking(move || {
        let group = AgentCall::Signal {
            pid: -pid,
            sig: libc::SIGKILL,
        };
        m.call(&t, &i, &group).map(|_| ()).or_else(|_| {
            m.call(
                &t,
                &i,
                &AgentCall::Signal {
                    pid,
                    sig: libc::SIGKILL,
                },
            )
            .map(|_| ())
        })
    })
    .await
    .map_err(|e| ToolError::Failed(format!("the kill task failed: {e}")))??;
    Ok(())
}

/// One stream's bytes, up to [`KEPT`].
#[derive(Default)]
struct Captured {
    bytes: Vec<u8>,
    total: u64,
}

impl Captured {
    fn push(&mut self, b: &[u8]) {
        self.total += b.len() as u64;
        let room = KEPT.saturating_sub(self.bytes.len());
        self.bytes.extend_from_slice(&b[..b.len().min(room)]);
    }

    /// The text to show: all of it, or its head and tail around a note.
    fn shown(&self) -> (String, bool) {
        let text = String::from_utf8_lossy(&self.bytes);
        if text.len() <= SHOWN {
            return (text.into_owned(), self.total > self.bytes.len() as u64);
        }
        let head = floor(&text, SHOWN / 2);
        let tail_at = ceil(&text, text.len() - SHOWN / 2);
        let cut = text.len() - head.len() - (text.len() - tail_at);
        (
            format!(
                "{head}\n[... {cut} bytes cut here; the whole output is in the file named \
                 below ...]\n{}",
                &text[tail_at..]
            ),
            true,
        )
    }
}

fn floor(s: &str, mut at: usize) -> &str {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    &s[..at]
}

fn ceil(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at += 1;
    }
    at
}

pub(crate) async fn run_command(
    call: &Call<'_>,
    args: RunCommandArgs,
) -> Result<CallToolResult, ToolError> {
    no_nul(&args.command, "command")?;
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    let limit = args
        .timeout_seconds
        .map_or(DEFAULT_WAIT, Duration::from_secs);
    let req = request(call, &id, args.command, args.cwd, args.env, args.user).await;
    let mut process = call
        .manager()
        .exec_async(&call.tenant, &id, &req)
        .await
        .map_err(ToolError::manager)?;
    match args.stdin {
        Some(data) => {
            let w = process.stdin();
            tokio::spawn(async move {
                let _ = w.write_all_async(data.as_bytes()).await;
                let _ = w.close();
            });
        }
        None => {
            let _ = process.close_stdin();
        }
    }
    let (mut out, mut err) = (Captured::default(), Captured::default());
    let deadline = tokio::time::Instant::now() + limit;
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    let started = tokio::time::Instant::now();
    let mut pid = None;
    let (code, signal, timed_out) = loop {
        tokio::select! {
            item = process.next_output() => match item {
                Some(Ok(Output::Started { pid: p })) => pid = Some(p),
                Some(Ok(Output::Stdout(b))) => out.push(&b),
                Some(Ok(Output::Stderr(b))) => err.push(&b),
                Some(Ok(Output::Exited { code, signal })) => break (code, signal, false),
                Some(Ok(Output::Attached { .. })) => {}
                Some(Err(e)) => {
                    return Err(ToolError::Failed(format!(
                        "the command's stream broke: {} (the sandbox may have ended: see \
                         list_sandboxes)",
                        crate::error::chain(&e)
                    )))
                }
                None => break (None, None, false),
            },
            _ = tick.tick() => {
                let secs = started.elapsed().as_secs();
                call.progress(
                    secs as f64,
                    format!("running for {secs} s; {} bytes of output so far", out.total + err.total),
                )
                .await;
            }
            () = tokio::time::sleep_until(deadline) => {
                if let Some(p) = pid.or(process.pid()) {
                    let _ = kill_group(call, &id, p).await;
                }
                break (Some(124), None, true);
            }
            () = call.ctx.ct.cancelled() => {
                // The client gave up on the call: the command goes too.
                if let Some(p) = pid.or(process.pid()) {
                    let _ = kill_group(call, &id, p).await;
                }
                drop(process);
                return Err(ToolError::Cancelled);
            }
        }
    };
    drop(process);
    let (stdout, cut_out) = out.shown();
    let (stderr, cut_err) = err.shown();
    let mut saved = None;
    if cut_out || cut_err {
        saved = Some(save_output(call, &id, &out, &err).await?);
    }
    let mut text = match (code, signal) {
        _ if timed_out => format!(
            "timed out after {} s and was killed (exit code 124); give timeout_seconds more, \
             or use start_process for long jobs\n",
            limit.as_secs()
        ),
        (Some(c), _) => format!("exit code: {c}\n"),
        (None, Some(s)) => format!("killed by signal {s}\n"),
        (None, None) => "the command's end was not reported\n".to_string(),
    };
    if !stdout.is_empty() {
        text.push_str(&format!("--- stdout ---\n{stdout}"));
        if !stdout.ends_with('\n') {
            text.push('\n');
        }
    }
    if !stderr.is_empty() {
        text.push_str(&format!("--- stderr ---\n{stderr}"));
        if !stderr.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(path) = &saved {
        text.push_str(&format!(
            "[output was long and is truncated above; the whole of it is in {path}.stdout and \
             {path}.stderr in the sandbox: read_file or run_command with grep, head or tail]\n"
        ));
    }
    let structured = json!({
        "sandbox_id": id.as_str(),
        "exit_code": code,
        "signal": signal,
        "timed_out": timed_out,
        "stdout": stdout,
        "stderr": stderr,
        "truncated": saved.is_some(),
        "full_output": saved,
    });
    Ok(CallToolResult::success(vec![ContentBlock::text(text)]).with_structured_content(structured))
}

/// Write a command's whole output into the sandbox; the path without its
/// `.stdout`/`.stderr`.
async fn save_output(
    call: &Call<'_>,
    id: &SandboxId,
    out: &Captured,
    err: &Captured,
) -> Result<String, ToolError> {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let base = format!("/tmp/brig-mcp/output-{n}");
    let (m, t, i) = (Arc::clone(call.manager()), call.tenant.clone(), id.clone());
    let (o, e) = (out.bytes.clone(), err.bytes.clone());
    let at = base.clone();
    tokio::task::spawn_blocking(move || -> Result<(), brig_runtime::ManagerError> {
        let _ = m.call(
            &t,
            &i,
            &AgentCall::Mkdir {
                path: "/tmp/brig-mcp".into(),
                parents: true,
            },
        );
        m.write_file(&t, &i, &format!("{at}.stdout"), &o[..])?;
        m.write_file(&t, &i, &format!("{at}.stderr"), &e[..])?;
        Ok(())
    })
    .await
    .map_err(|e| ToolError::Failed(format!("the save task failed: {e}")))??;
    Ok(base)
}

pub(crate) async fn start_process(
    call: &Call<'_>,
    args: StartProcessArgs,
) -> Result<CallToolResult, ToolError> {
    no_nul(&args.command, "command")?;
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    let mut req = request(
        call,
        &id,
        args.command.clone(),
        args.cwd,
        args.env,
        args.user,
    )
    .await;
    req.background = true;
    let mut process = call
        .manager()
        .exec_async(&call.tenant, &id, &req)
        .await
        .map_err(ToolError::manager)?;
    let pid = match process.pid() {
        Some(p) => p,
        None => match process.next_output().await {
            Some(Ok(Output::Started { pid })) => pid,
            other => {
                return Err(ToolError::Failed(format!(
                    "the process did not start: {other:?}"
                )))
            }
        },
    };
    // Dropping the handle detaches: a background process keeps running.
    drop(process);
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "started pid {pid} in sandbox {id}: {}\nread its output with read_process_output \
         {{\"pid\": {pid}}}",
        args.command
    ))])
    .with_structured_content(json!({ "sandbox_id": id.as_str(), "pid": pid })))
}

pub(crate) async fn read_output(
    call: &Call<'_>,
    args: ReadProcessArgs,
) -> Result<CallToolResult, ToolError> {
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    let wait = Duration::from_secs(args.wait_seconds.unwrap_or(0).min(600));
    let (m, t, i) = (Arc::clone(call.manager()), call.tenant.clone(), id.clone());
    let pid = args.pid;
    let mut process: Process = tokio::task::spawn_blocking(move || m.attach(&t, &i, pid))
        .await
        .map_err(|e| ToolError::Failed(format!("the attach task failed: {e}")))?
        .map_err(|e| {
            ToolError::Invalid(format!(
                "no background process {pid} in sandbox {id}: {} (start_process gives the pid)",
                crate::error::chain(&e)
            ))
        })?;
    let (mut out, mut err) = (Captured::default(), Captured::default());
    let mut dropped = 0;
    let wait_until = tokio::time::Instant::now() + wait;
    let mut ended = None;
    loop {
        // What the agent kept comes at once; after it, wait only as long
        // as asked (and a moment for the replay itself).
        let quiet = tokio::time::Instant::now() + Duration::from_millis(150);
        let until = quiet.max(wait_until);
        let item = tokio::select! {
            item = process.next_output() => item,
            () = tokio::time::sleep_until(until) => break,
            () = call.ctx.ct.cancelled() => return Err(ToolError::Failed("cancelled".into())),
        };
        match item {
            Some(Ok(Output::Attached { dropped: d, .. })) => dropped = d,
            Some(Ok(Output::Stdout(b))) => out.push(&b),
            Some(Ok(Output::Stderr(b))) => err.push(&b),
            Some(Ok(Output::Exited { code, signal })) => {
                ended = Some((code, signal));
                break;
            }
            Some(Ok(Output::Started { .. })) => {}
            Some(Err(e)) => {
                return Err(ToolError::Failed(format!(
                    "reading process {pid}: {}",
                    crate::error::chain(&e)
                )))
            }
            None => break,
        }
    }
    // Detach; the process goes on.
    drop(process);
    let (stdout, _) = out.shown();
    let (stderr, _) = err.shown();
    let status = match ended {
        Some((Some(c), _)) => format!("exited with code {c}"),
        Some((None, Some(s))) => format!("killed by signal {s}"),
        Some((None, None)) => "ended".to_string(),
        None => "still running".to_string(),
    };
    let mut text = format!("process {pid}: {status}\n");
    if dropped > 0 {
        text.push_str(&format!(
            "[{dropped} bytes of its earliest output were dropped: the sandbox keeps only the \
             latest]\n"
        ));
    }
    text.push_str(&format!("--- stdout ---\n{stdout}"));
    if !stderr.is_empty() {
        text.push_str(&format!("\n--- stderr ---\n{stderr}"));
    }
    Ok(
        CallToolResult::success(vec![ContentBlock::text(text)]).with_structured_content(json!({
            "pid": pid,
            "running": ended.is_none(),
            "exit_code": ended.and_then(|e| e.0),
            "signal": ended.and_then(|e| e.1),
            "stdout": stdout,
            "stderr": stderr,
        })),
    )
}

pub(crate) async fn kill_process(
    call: &Call<'_>,
    args: KillProcessArgs,
) -> Result<CallToolResult, ToolError> {
    let id = call.sandbox(args.sandbox_id.as_deref()).await?;
    kill_group(call, &id, args.pid).await?;
    Ok(CallToolResult::success(vec![ContentBlock::text(format!(
        "killed process {} in sandbox {id}",
        args.pid
    ))]))
}
