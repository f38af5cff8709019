//! `brig serve`'s log: one place that sets it up and says what goes in it.
//!
//! - Levels from `--log-level` (default `info`), or `RUST_LOG` (tracing's
//!   filter syntax, e.g. `brig=debug,hyper=warn`) when it is set.
//! - `--log-format text` (one readable line per event) or `json` (one JSON
//!   object per line with `timestamp`, `level`, `target`, `fields`), for
//!   log shippers. Both go to stderr.
//! - One line per HTTP request ([`requests`], target `brig::request`):
//!   plane, method, path, status, latency; 5xx at `error` (the handler
//!   logs the cause just before, at `error` too).
//! - Sandbox lifecycle ([`lifecycle`], target `brig::sandbox`): created,
//!   paused, resumed, ended with its state and exit code.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use brig_runtime::{EventKind, SandboxManager};
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Install the process's log subscriber. `level`: error, warn, info,
/// debug or trace; `RUST_LOG` wins when set.
pub fn init(level: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.is_empty() => EnvFilter::try_new(&spec)
            .map_err(|e| anyhow::anyhow!("RUST_LOG={spec:?} is not a valid filter: {e}"))?,
        _ => EnvFilter::try_new(level).map_err(|_| {
            anyhow::anyhow!(
                "--log-level {level:?}: expected one of error, warn, info, debug, trace"
            )
        })?,
    };
    // A log whose stderr went away (its terminal closed, the reader of its
    // pipe exited) loses lines; it must not end the daemon. By default
    // tracing-subscriber reports a failed write with eprintln!, which
    // panics on the same broken stderr: the daemon died at its next log
    // line, or on its way out, leaving its sandboxes running.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .log_internal_errors(false)
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.with_ansi(crate::tty::is_terminal(2)).try_init(),
        LogFormat::Json => builder.json().with_current_span(false).try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("cannot install the log: {e}"))
}

/// Middleware: one log line per request, after its answer.
pub async fn requests(plane: &'static str, req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let started = Instant::now();
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    if status >= 500 {
        tracing::error!(target: "brig::request", plane, %method, path, status, latency_ms, "request failed");
    } else {
        tracing::info!(target: "brig::request", plane, %method, path, status, latency_ms, "request");
    }
    resp
}

/// Log every lifecycle event of `manager`'s sandboxes, on a task of the
/// current runtime, for as long as the manager lives.
pub fn lifecycle(manager: &Arc<SandboxManager>) {
    let mut events = manager.subscribe();
    tokio::spawn(async move {
        loop {
            match events.recv().await {
                Ok(e) => {
                    let (id, tenant) = (e.id.as_str(), e.tenant.as_str());
                    match e.kind {
                        EventKind::Created => {
                            tracing::info!(target: "brig::sandbox", id, tenant, "created")
                        }
                        EventKind::Paused => {
                            tracing::info!(target: "brig::sandbox", id, tenant, "paused")
                        }
                        EventKind::Resumed => {
                            tracing::info!(target: "brig::sandbox", id, tenant, "resumed")
                        }
                        EventKind::Ended { state, code } => tracing::info!(
                            target: "brig::sandbox", id, tenant, state = %state, code, "ended"
                        ),
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(target: "brig::sandbox", missed = n, "lifecycle log fell behind");
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}
