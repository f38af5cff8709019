//! `GET /v1/sandboxes/{id}/logs?follow=&pid=&tail=`: the sandbox's log,
//! what its background processes printed (not PTY sessions, not foreground
//! execs, whose output goes to their own client), as NDJSON:
//!
//! ```text
//! {"type":"logging","dropped":0}           (first: bytes already gone from the log)
//! {"type":"stdout","data":"<base64>"}
//! {"type":"stderr","data":"<base64>"}
//! {"type":"skipped","bytes":N}             (this reader was too slow; N bytes lost here)
//! {"type":"error","message":"...","sandbox_end":{...}}   (the stream broke)
//! ```
//!
//! The agent keeps the last 1 MiB for the whole sandbox, interleaved as it
//! arrived; reading takes nothing away. Without `follow` the stream ends
//! once it has sent what the log held; with it, it goes on until the client
//! disconnects or the sandbox ends. `pid` keeps one process's output,
//! `tail=N` starts N lines before the end.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use brig_agent_client::{LogOutput, LogReader, LogsRequest};
use brig_core::SandboxId;
use brig_runtime::{SandboxManager, TenantId};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::exec::stream_error;
use super::ndjson::{self, line};
use super::{sandbox_id, ApiError, AppState, Auth};

/// Lines in flight between the agent and the HTTP client; the agent's
/// stream window is behind them.
const LINES_IN_FLIGHT: usize = 16;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsQuery {
    #[serde(default)]
    pub follow: bool,
    pub pid: Option<i32>,
    pub tail: Option<u32>,
}

pub async fn logs(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<LogsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let q = query?.0;
    if q.pid.is_some_and(|p| p <= 0) {
        return Err(ApiError::bad_request(
            "pid must be a process id inside the sandbox (a positive number)",
        ));
    }
    let req = LogsRequest {
        pid: q.pid,
        follow: q.follow,
        tail: q.tail,
    };
    let reader = state.manager.logs_async(&tenant, &id, &req).await?;
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(LINES_IN_FLIGHT);
    let manager = state.manager.clone();
    tokio::spawn(async move {
        let first = json!({ "type": "logging", "dropped": reader.dropped() });
        if tx.send(Ok(line(&first))).await.is_err() {
            return;
        }
        pump(
            reader,
            &tx,
            &Source {
                manager,
                tenant,
                id,
            },
        )
        .await;
    });
    ndjson::response(rx)
}

/// Whose log: to say why a stream broke when the sandbox ended under it.
struct Source {
    manager: Arc<SandboxManager>,
    tenant: TenantId,
    id: SandboxId,
}

/// One line per piece of the log until the reader ends or the client goes
/// away (dropping the reader then ends the stream in the agent).
async fn pump(mut reader: LogReader, tx: &mpsc::Sender<Result<Bytes, Infallible>>, src: &Source) {
    loop {
        let item = tokio::select! {
            item = reader.next_output() => item,
            () = tx.closed() => return,
        };
        let v = match item {
            None => return,
            Some(Ok(LogOutput::Stdout(b))) => json!({ "type": "stdout", "data": BASE64.encode(b) }),
            Some(Ok(LogOutput::Stderr(b))) => json!({ "type": "stderr", "data": BASE64.encode(b) }),
            Some(Ok(LogOutput::Skipped(n))) => json!({ "type": "skipped", "bytes": n }),
            Some(Err(e)) => stream_error(&src.manager, &src.tenant, &src.id, &e).await,
        };
        if tx.send(Ok(line(&v))).await.is_err() {
            return;
        }
    }
}
