//! `/v1/sandboxes/{id}/files?path=/abs/path`: raw download (GET) and upload
//! (PUT), both streamed: neither direction holds a file in the daemon.
//!
//! Paths are resolved by the agent inside the sandbox's own mount
//! namespace, so `..` or a symlink can only lead elsewhere in the sandbox.

use std::io::Read;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::{blocking, sandbox_id, ApiError, AppState, Auth};

/// Chunks in flight between the agent and the HTTP client.
const CHUNKS_IN_FLIGHT: usize = 4;
const CHUNK: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileQuery {
    /// An absolute path inside the sandbox.
    pub path: String,
}

impl FileQuery {
    fn checked(self) -> Result<String, ApiError> {
        if !self.path.starts_with('/') || self.path.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "invalid path {:?}: use an absolute path inside the sandbox",
                self.path
            )));
        }
        Ok(self.path)
    }
}

pub async fn download(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let path = query?.0.checked()?;
    let manager = state.manager.clone();
    let mut reader = blocking(move || manager.read_file(&tenant, &id, &path)).await?;
    let size = reader.size();

    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHUNKS_IN_FLIGHT);
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let chunk = match reader.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                // Ends the response abnormally: the client sees a truncated
                // body, not a silently short file.
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            if tx.blocking_send(chunk).is_err() || failed {
                return;
            }
        }
    });
    Response::builder()
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(CONTENT_LENGTH, size)
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .map_err(|e| ApiError::internal(&e))
}

pub async fn upload(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let path = query?.0.checked()?;
    let stream = body
        .into_data_stream()
        .map(|r| r.map_err(std::io::Error::other));
    // The agent client wants a blocking reader; the bridge blocks its
    // (blocking-pool) thread on the async body.
    let reader = SyncIoBridge::new(StreamReader::new(stream));
    let manager = state.manager.clone();
    let shown = path.clone();
    let size = blocking(move || manager.write_file(&tenant, &id, &path, reader)).await?;
    Ok(Json(json!({ "path": shown, "size": size })))
}
