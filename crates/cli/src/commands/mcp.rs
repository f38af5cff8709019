//! `brig mcp`: the Model Context Protocol over stdin/stdout, what desktop
//! MCP clients and IDE agents launch (`{"command": "brig", "args":
//! ["mcp"]}`).
//!
//! One implementation of the tools (brig-mcp's `BrigMcp`), reached one of
//! two ways:
//!
//! - **relay** (a daemon runs for the home, or `--url`/`BRIG_URL` names
//!   one): every JSON-RPC line from stdin is POSTed to the daemon's `/mcp`
//!   (`brig serve --mcp`) with the key (`BRIG_API_KEY`, else
//!   `$BRIG_HOME/local.key`), and what comes back (JSON, or the events of
//!   an SSE stream: progress, then the result) is written to stdout. The
//!   sandboxes are the daemon's, shown by `brig ls` like any other; the
//!   session is deleted when stdin closes, which ends the sandboxes it
//!   made: the handshake's `Mcp-Session-Id`, or, for a client of the
//!   stateless revision (2026-07-28), the relay's own session name
//!   (`brig-mcp-session`), which brig-mcp keeps sandboxes under.
//! - **embedded** (no daemon): the runtime is started in this process for
//!   the session, on the home (whose lock it takes, as a daemon would), and
//!   brig-mcp serves stdio directly as the home's first tenant (the local
//!   key's). When stdin closes every sandbox ends and brig exits.
//!
//! Relaying rather than serving stdio from this process with the daemon's
//! native API as a back-end keeps one implementation of the tools, in the
//! daemon, with its pools, limits and tenants.

use std::io::{BufRead, BufReader, Write};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use brig_runtime::manager::{ManagerConfig, OnStop};
use brig_runtime::Store;

use super::client::{home_dir, LOCAL_KEY_FILE};
use crate::exit;

#[derive(Debug, clap::Args)]
pub struct McpArgs {
    /// The template of the session's default sandbox, in embedded mode (a
    /// daemon's is its `--mcp-template`).
    #[arg(long, default_value = brig_mcp::DEFAULT_TEMPLATE, value_name = "TEMPLATE")]
    template: String,
    /// Never start an embedded runtime: fail unless a daemon is reachable.
    #[arg(long, conflicts_with = "embedded")]
    relay: bool,
    /// Always start an embedded runtime, even if a daemon runs elsewhere
    /// (not on this home: a home serves one runtime at a time).
    #[arg(long)]
    embedded: bool,
    /// The least severe events logged to stderr: error, warn, info, debug.
    #[arg(long, default_value = "warn", value_name = "LEVEL")]
    log_level: String,
}

pub fn run(args: McpArgs) -> anyhow::Result<i32> {
    crate::log::init(&args.log_level, crate::log::LogFormat::Text)?;
    let daemon = if args.embedded {
        None
    } else {
        super::client::daemon_url()
    };
    match daemon {
        Some(url) => relay(&url),
        None if args.relay => anyhow::bail!(
            "no daemon to relay to: start one with `brig serve --mcp`, or set --url / BRIG_URL"
        ),
        None => embedded(&args.template),
    }
}

/// Relay stdio to `{base}/mcp`.
fn relay(base: &str) -> anyhow::Result<i32> {
    let key = super::client::api_key()?;
    // SIGTERM and SIGINT are taken by a thread of their own (blocked here,
    // before any thread starts, so every thread inherits the mask): a
    // client that stops its server by signal ends the session as a closed
    // stdin does.
    let signals = termination_signals();
    // SAFETY: pthread_sigmask with a valid, initialised set, on this thread.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &signals, std::ptr::null_mut()) };
    let relay = Arc::new(Relay {
        url: format!("{}{}", base.trim_end_matches('/'), brig_mcp::http::PATH),
        key,
        agent: ureq::AgentBuilder::new().build(),
        session: Mutex::new(None),
        name: brig_http::random_token(),
        version: Mutex::new(None),
        out: Mutex::new(std::io::stdout()),
    });
    // While stdin is open the client is there, however long it idles: a
    // ping a minute keeps the daemon from ending the session (and its
    // sandboxes) as abandoned.
    {
        let r = Arc::clone(&relay);
        std::thread::spawn(move || {
            for n in 0u64.. {
                std::thread::sleep(PING_EVERY);
                r.ping(n);
            }
        });
    }
    {
        let r = Arc::clone(&relay);
        std::thread::spawn(move || {
            let mut sig: libc::c_int = 0;
            // SAFETY: sigwait with a valid set (blocked in every thread)
            // and a valid out pointer.
            if unsafe { libc::sigwait(&signals, &mut sig) } == 0 {
                r.close();
                std::process::exit(0);
            }
        });
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    // The first message (initialize) goes alone, so its session id is
    // known before any other is sent.
    let mut first = true;
    let mut inflight = Vec::new();
    while let Some(line) = lines.next().transpose().context("cannot read stdin")? {
        if line.trim().is_empty() {
            continue;
        }
        if first {
            relay.post(&line);
            first = false;
            continue;
        }
        // Each in its own thread: a cancellation must get through while
        // the call it cancels is still streaming.
        let r = Arc::clone(&relay);
        inflight.push(std::thread::spawn(move || r.post(&line)));
        inflight.retain(|t| !t.is_finished());
    }
    // stdin closed: the client is gone. End the session (and with it the
    // sandboxes it made); calls still running are cut off with it.
    relay.close();
    Ok(0)
}

/// The set of SIGTERM and SIGINT.
fn termination_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before
    // sigaddset reads it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        set
    }
}

/// How often the relay tells the daemon its client is still there.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

struct Relay {
    url: String,
    key: String,
    agent: ureq::Agent,
    /// The handshake's session (`Mcp-Session-Id`), if the client made one.
    session: Mutex<Option<String>>,
    /// This relay's own session name, for a client of the stateless
    /// revision ([`brig_mcp::CLIENT_SESSION`]), so that its sandboxes end
    /// with stdin as a handshake session's do.
    name: String,
    version: Mutex<Option<String>>,
    out: Mutex<std::io::Stdout>,
}

impl Relay {
    fn request(&self, method: &str) -> ureq::Request {
        let mut req = self
            .agent
            .request(method, &self.url)
            .set("Authorization", &format!("Bearer {}", self.key))
            .set("Accept", "application/json, text/event-stream")
            .set(brig_mcp::CLIENT_SESSION, &self.name);
        if let Some(s) = &*lock(&self.session) {
            req = req.set("Mcp-Session-Id", s);
        }
        if let Some(v) = &*lock(&self.version) {
            req = req.set("MCP-Protocol-Version", v);
        }
        req
    }

    fn write(&self, line: &str) {
        let mut out = lock(&self.out);
        let _ = writeln!(out, "{}", line.trim_end());
        let _ = out.flush();
    }

    /// Answer a request the daemon did not, so the client is not left
    /// waiting.
    fn fail(&self, message: &serde_json::Value, why: String) {
        eprintln!("brig mcp: {why}");
        if let Some(id) = message
            .get("id")
            .filter(|_| message.get("method").is_some())
        {
            let answer = serde_json::json!({
                "jsonrpc": "2.0", "id": id,
                "error": { "code": -32603, "message": why },
            });
            self.write(&answer.to_string());
        }
    }

    fn post(&self, line: &str) {
        let message: serde_json::Value = serde_json::from_str(line).unwrap_or_default();
        let mut req = self.request("POST").set("Content-Type", "application/json");
        for (name, value) in standard_headers(&message) {
            req = req.set(name, &value);
        }
        let result = req.send_string(line);
        let resp = match result {
            Ok(r) => r,
            Err(ureq::Error::Status(status, r)) => {
                let body = r.into_string().unwrap_or_default();
                let text = serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["message"].as_str().map(str::to_string))
                    .unwrap_or(body);
                let why = match status {
                    404 => format!(
                        "the daemon at {} does not serve MCP (404): restart it with `brig serve \
                         --mcp`",
                        self.url
                    ),
                    401 => format!("the daemon refused the key ({text}); set BRIG_API_KEY"),
                    _ => format!("the daemon answered {status}: {}", text.trim()),
                };
                return self.fail(&message, why);
            }
            Err(e) => {
                return self.fail(
                    &message,
                    format!("cannot reach the daemon at {}: {e}", self.url),
                )
            }
        };
        if let Some(s) = resp.header("mcp-session-id") {
            *lock(&self.session) = Some(s.to_string());
        }
        let sse = resp
            .header("content-type")
            .is_some_and(|c| c.starts_with("text/event-stream"));
        if !sse {
            let body = resp.into_string().unwrap_or_default();
            if !body.trim().is_empty() {
                self.note_version(&body);
                self.write(&body);
            }
            return;
        }
        // SSE: one JSON-RPC message per event's data lines.
        let mut data = String::new();
        for l in BufReader::new(resp.into_reader()).lines() {
            let Ok(l) = l else { break };
            if let Some(d) = l.strip_prefix("data:") {
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            } else if l.is_empty() && !data.is_empty() {
                let event = std::mem::take(&mut data);
                self.note_version(&event);
                self.write(&event);
            }
        }
        if !data.trim().is_empty() {
            self.write(&data);
        }
    }

    /// An initialize answer names the protocol version every later request
    /// must carry in `MCP-Protocol-Version`.
    fn note_version(&self, body: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
            return;
        };
        if let Some(version) = v["result"]["protocolVersion"].as_str() {
            *lock(&self.version) = Some(version.to_string());
        }
    }

    /// A ping of the relay's own, its answer not passed on.
    fn ping(&self, n: u64) {
        let message = serde_json::json!({
            "jsonrpc": "2.0", "id": format!("brig-relay-ping-{n}"), "method": "ping",
        });
        let mut req = self.request("POST").set("Content-Type", "application/json");
        for (name, value) in standard_headers(&message) {
            req = req.set(name, &value);
        }
        if let Ok(r) = req.send_string(&message.to_string()) {
            let _ = r.into_string();
        }
    }

    /// End the session: the handshake's (rmcp ends it), or this relay's
    /// named one (brig-mcp does).
    fn close(&self) {
        let _ = self.request("DELETE").call();
    }
}

/// The headers the stateless revision (2026-07-28) asks of an HTTP request
/// beside its body (what an SDK's HTTP client sets itself): `Mcp-Method`,
/// `Mcp-Name` (a tool's name, a resource's URI), and the version the
/// request names in its `_meta`. Earlier revisions ignore them.
fn standard_headers(message: &serde_json::Value) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let Some(method) = message["method"].as_str() else {
        return out;
    };
    let params = &message["params"];
    if let Some(v) = params["_meta"]["io.modelcontextprotocol/protocolVersion"].as_str() {
        out.push(("MCP-Protocol-Version", v.to_string()));
    }
    out.push(("Mcp-Method", method.to_string()));
    let name = match method {
        "tools/call" | "prompts/get" => params["name"].as_str(),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => {
            params["uri"].as_str()
        }
        "tasks/get" | "tasks/update" | "tasks/cancel" => params["taskId"].as_str(),
        _ => None,
    };
    if let Some(name) = name {
        // A value that is not plain visible ASCII goes as `=?base64?…?=`.
        let plain = !name.starts_with([' ', '\t'])
            && !name.ends_with([' ', '\t'])
            && name.chars().all(|c| (' '..='~').contains(&c))
            && (!name.starts_with("=?base64?") || !name.ends_with("?="));
        let value = if plain {
            name.to_string()
        } else {
            use base64::Engine;
            format!(
                "=?base64?{}?=",
                base64::engine::general_purpose::STANDARD.encode(name)
            )
        };
        out.push(("Mcp-Name", value));
    }
    out
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serve stdio from a runtime started in this process.
fn embedded(template: &str) -> anyhow::Result<i32> {
    exit::require_root().context(
        "no daemon is running for this home, and an embedded runtime needs root (start one \
         with `sudo brig serve --mcp`, or run brig mcp as root)",
    )?;
    let home = home_dir();
    std::fs::create_dir_all(&home)
        .with_context(|| format!("cannot create the home directory {}", home.display()))?;
    let _claim = super::serve::HomeClaim::take(&home)?;
    let store = Store::open_in(&home)?;
    let key = match store.ensure_initial_key()? {
        Some(key) => {
            super::serve::write_key(&home.join(LOCAL_KEY_FILE), &key)?;
            key
        }
        None => super::client::api_key()?,
    };
    let tenant = store
        .authenticate(&key)
        .context("the local key does not open this home (set BRIG_API_KEY)")?
        .tenant;
    let mut config = ManagerConfig::new();
    // No pre-made sandboxes: one session needs a few, made as it asks.
    config.pool.clear();
    config.template_roots = vec![home.join("templates")];
    config.home = Some(home.clone());
    let started = super::serve::start_runtime(store, config, &[])?;
    let shared = brig_mcp::Shared::new(Arc::clone(&started.manager), template);
    // Until stdin closes, or a SIGTERM/SIGINT (a client that stops its
    // server by signal): either way the sandboxes end below. (After a
    // SIGKILL they run on, and the next runtime on this home adopts them.)
    let served = started.runtime.block_on(async {
        tokio::select! {
            served = brig_mcp::serve_stdio(shared, tenant) => served,
            () = super::serve::shutdown_signal() => Ok(()),
        }
    });
    // Every sandbox of this runtime ends with it.
    started.manager.stop(OnStop::End);
    started
        .runtime
        .shutdown_timeout(std::time::Duration::from_secs(5));
    brig_net::gateway::remove_pin(&started.pin);
    served?;
    Ok(0)
}
