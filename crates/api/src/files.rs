//! `/v1/sandboxes/{id}/files...`: raw download (GET `?path=`), upload (PUT
//! `?path=`) and multipart upload (`POST /files/upload?dir=`), all streamed:
//! no direction holds a file in the daemon; and the one-shot calls `list`,
//! `stat`, `mkdir`, `rename` and remove (`DELETE ?path=&recursive=`); and
//! `GET /files/watch?path=&recursive=`, a directory's changes streamed as
//! NDJSON (see [`watch`]); and `/v1/sandboxes/{id}/archive?path=`, a file
//! or a whole tree as one tar stream, both ways (see [`archive`]).
//!
//! Every agent failure keeps the agent's message and gets its status from
//! its code in `error.rs`: not found 404, already exists 409, invalid input
//! 400.
//!
//! Paths are resolved by the agent inside the sandbox's own mount
//! namespace, so `..` or a symlink can only lead elsewhere in the sandbox.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, Multipart, Path, Query, State};
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::response::Response;
use axum::Json;
use brig_agent_client::{Call, ClientError, Entry, Reply, WatchEvent, Watcher};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::ndjson;
use super::{blocking, sandbox_id, ApiError, AppState, Auth};
use brig_runtime::ManagerError;

pub mod archive;

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
        checked(self.path)
    }
}

/// A path the agent can be asked about: absolute, no NUL. The agent checks
/// again; this gives the client one message for both mistakes. Public for
/// the `file_paths` fuzz target, like [`file_name`].
pub fn checked(path: String) -> Result<String, ApiError> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(ApiError::bad_request(format!(
            "invalid path {path:?}: use an absolute path inside the sandbox"
        )));
    }
    Ok(path)
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
    // Waits on the agent without a thread, as fast as the client reads.
    tokio::spawn(async move {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let chunk = match std::future::poll_fn(|cx| reader.poll_read(cx, &mut buf)).await {
                Ok(0) => return,
                Ok(n) => Ok(Bytes::copy_from_slice(&buf[..n])),
                // Ends the response abnormally: the client sees a truncated
                // body, not a silently short file.
                Err(e) => Err(e),
            };
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() || failed {
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

/// The deepest `list` the API takes (the agent's own limit).
const MAX_DEPTH: u32 = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub path: String,
    /// Levels below `path` (1: its direct children).
    #[serde(default = "one")]
    pub depth: u32,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    pub path: String,
    /// Remove a directory and everything in it.
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MkdirConfig {
    pub path: String,
    /// Create missing parents, and succeed if the directory exists.
    #[serde(default)]
    pub parents: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RenameConfig {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UploadQuery {
    /// The directory each part is written into, as `dir/<filename>`.
    pub dir: String,
}

/// The API's shape of one file (the protocol's `kind` is `type` here).
fn entry_json(e: Entry) -> Value {
    let mut v = json!({
        "name": e.name,
        "path": e.path,
        "type": e.kind,
        "size": e.size,
        "mode": e.mode,
        "mtime": e.mtime,
    });
    if let Some(target) = e.symlink_target {
        v["symlink_target"] = Value::String(target);
    }
    // Owner and group: ids always (an agent too old to report them leaves
    // them out), names when the sandbox's /etc/passwd and /etc/group have
    // them.
    for (key, value) in [("uid", e.uid), ("gid", e.gid)] {
        if let Some(id) = value {
            v[key] = json!(id);
        }
    }
    for (key, value) in [("owner", e.owner), ("group", e.group)] {
        if let Some(name) = value {
            v[key] = Value::String(name);
        }
    }
    v
}

/// Make one call on the sandbox's agent.
async fn call(
    state: &AppState,
    tenant: brig_runtime::TenantId,
    id: &str,
    call: Call,
) -> Result<Reply, ApiError> {
    let id = sandbox_id(id)?;
    let manager = state.manager.clone();
    Ok(blocking(move || manager.call(&tenant, &id, &call)).await?)
}

/// A reply of the wrong kind is the agent breaking the protocol.
fn unexpected(reply: Reply) -> ApiError {
    let err = std::io::Error::other(format!("the agent answered with {reply:?}"));
    ApiError::internal(&err)
}

pub async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = id?.0;
    let q = query?.0;
    if !(1..=MAX_DEPTH).contains(&q.depth) {
        return Err(ApiError::bad_request(format!(
            "depth must be between 1 and {MAX_DEPTH}"
        )));
    }
    let path = checked(q.path)?;
    match call(
        &state,
        tenant,
        &id,
        Call::List {
            path,
            depth: q.depth,
            xattrs: None,
        },
    )
    .await?
    {
        Reply::Entries(entries) => Ok(Json(json!({
            "entries": entries.into_iter().map(entry_json).collect::<Vec<_>>()
        }))),
        // An empty directory: the agent sends `done` with no `entries`.
        Reply::Done => Ok(Json(json!({ "entries": [] }))),
        other => Err(unexpected(other)),
    }
}

pub async fn stat(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = id?.0;
    let path = query?.0.checked()?;
    match call(&state, tenant, &id, Call::Stat { path, xattrs: None }).await? {
        Reply::Stat(entry) => Ok(Json(entry_json(entry))),
        other => Err(unexpected(other)),
    }
}

pub async fn mkdir(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: Result<Json<MkdirConfig>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = id?.0;
    let config = body?.0;
    let path = checked(config.path)?;
    let shown = path.clone();
    call(
        &state,
        tenant,
        &id,
        Call::Mkdir {
            path,
            parents: config.parents,
        },
    )
    .await?;
    Ok(Json(json!({ "path": shown })))
}

pub async fn rename(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: Result<Json<RenameConfig>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = id?.0;
    let config = body?.0;
    let (from, to) = (checked(config.from)?, checked(config.to)?);
    let shown = json!({ "from": from, "to": to });
    call(&state, tenant, &id, Call::Rename { from, to }).await?;
    Ok(Json(shown))
}

pub async fn remove(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<RemoveQuery>, QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let id = id?.0;
    let q = query?.0;
    let path = checked(q.path)?;
    let shown = path.clone();
    call(
        &state,
        tenant,
        &id,
        Call::Remove {
            path,
            recursive: q.recursive,
        },
    )
    .await?;
    Ok(Json(json!({ "path": shown })))
}

/// A multipart part's file name as one path component: no `/`, no `..`,
/// nothing empty. The agent would keep a bad one inside the sandbox
/// anyway; refusing it keeps each part in the directory the client named.
pub fn file_name(name: Option<&str>) -> Result<String, ApiError> {
    match name {
        Some(n) if !n.is_empty() && n != "." && !n.contains(['/', '\0']) && !n.contains("..") => {
            Ok(n.to_string())
        }
        Some(n) => Err(ApiError::bad_request(format!(
            "invalid file name {n:?} in the upload: use a plain name, without `/` or `..`"
        ))),
        None => Err(ApiError::bad_request(
            "every part of the upload needs a filename (Content-Disposition: form-data; \
             name=\"file\"; filename=\"...\")",
        )),
    }
}

/// `POST /files/upload?dir=`: each part of a `multipart/form-data` body is
/// streamed to `dir/<its filename>`, one after the other. A part that
/// fails stops the upload; the parts before it stay written.
pub async fn upload_multipart(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<UploadQuery>, QueryRejection>,
    req: axum::extract::Request,
) -> Result<Json<Value>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let dir = checked(query?.0.dir)?;
    // Bounded: boundaries and part headers that never end fail, rather
    // than being held (brig_http::multipart).
    let (req, phase) = brig_http::multipart::bounded(req);
    let mut multipart = Multipart::from_request(req, &())
        .await
        .map_err(|r: MultipartRejection| ApiError::bad_request(r.body_text()))?;
    let bad_part = |e: axum::extract::multipart::MultipartError| {
        ApiError::bad_request(format!("malformed multipart body: {}", phase.explain(&e)))
    };
    let mut written = Vec::new();
    while let Some(mut field) = {
        phase.headers();
        multipart.next_field().await.map_err(bad_part)?
    } {
        phase.data();
        let name = file_name(field.file_name())?;
        let path = format!("{}/{name}", dir.trim_end_matches('/'));

        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHUNKS_IN_FLIGHT);
        let reader = SyncIoBridge::new(StreamReader::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let manager = state.manager.clone();
        let (t, i, p) = (tenant.clone(), id.clone(), path.clone());
        let writer = tokio::task::spawn_blocking(move || manager.write_file(&t, &i, &p, reader));
        let mut failed = None;
        loop {
            match field.chunk().await {
                Ok(Some(chunk)) => {
                    // The writer stopped early: its own error says why.
                    if tx.send(Ok(chunk)).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    // Cancels the write (the agent keeps what it has).
                    let _ = tx
                        .send(Err(std::io::Error::other("the multipart body broke off")))
                        .await;
                    failed = Some(bad_part(e));
                    break;
                }
            }
        }
        drop(tx);
        let size = writer.await??;
        if let Some(e) = failed {
            return Err(e);
        }
        written.push(json!({ "path": path, "size": size }));
    }
    Ok(Json(json!({ "files": written })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// The directory to watch.
    pub path: String,
    /// Also every directory below it, present and future.
    #[serde(default)]
    pub recursive: bool,
}

/// Lines in flight between the agent and the HTTP client. The agent's own
/// bounded queue and the stream window are behind it: a client reading too
/// slowly gets an `overflow` line, not a growing daemon.
const WATCH_LINES_IN_FLIGHT: usize = 16;

/// `GET /files/watch?path=&recursive=`: a directory's changes as NDJSON,
/// one JSON document per line, as the exec stream:
///
/// ```text
/// {"type":"started"}                                  (the watch is in place)
/// {"type":"event","kind":"create","name":"sub/a.txt","file_type":"file"}
/// {"type":"overflow"}                                 (changes were lost here)
/// {"type":"error","message":"..."}                    (the watch ended abnormally)
/// ```
///
/// `kind` is `create`, `write`, `remove`, `rename` (the old name; the new
/// one follows as `create`) or `chmod`; `name` is relative to `path`;
/// `file_type` is there when the agent knew it. The stream lasts until the
/// client disconnects (which ends the watch in the agent), the watched
/// directory goes away, or the sandbox ends. Errors before the first line
/// (no such directory: 404, not a directory: 409) are ordinary API errors.
pub async fn watch(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<WatchQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let q = query?.0;
    let path = checked(q.path)?;
    let manager = state.manager.clone();
    let watcher = blocking(move || {
        let conn = manager.connection(&tenant, &id)?;
        conn.watch(&path, q.recursive)
            .map_err(|source| ManagerError::Agent { id, source })
    })
    .await?;

    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(WATCH_LINES_IN_FLIGHT);
    tokio::spawn(watch_pump(watcher, tx));
    super::ndjson::response(rx)
}

/// `started`, then one line per watch event until the watch ends or the
/// client goes away (dropping the watcher then ends the watch in the
/// agent). Waits on the agent without a thread, possibly for hours.
async fn watch_pump(mut watcher: Watcher, tx: mpsc::Sender<Result<Bytes, Infallible>>) {
    if tx
        .send(Ok(ndjson::line(&json!({ "type": "started" }))))
        .await
        .is_err()
    {
        return;
    }
    loop {
        let item = tokio::select! {
            item = watcher.recv_async() => item,
            () = tx.closed() => return,
        };
        let Some(item) = item.transpose() else { return };
        if tx.send(Ok(watch_line(item))).await.is_err() {
            return;
        }
    }
}

fn watch_line(item: Result<WatchEvent, ClientError>) -> Bytes {
    ndjson::line(&match item {
        Ok(WatchEvent::Change {
            kind,
            name,
            file_type,
        }) => {
            let mut v = json!({ "type": "event", "kind": kind, "name": name });
            if let Some(t) = file_type {
                v["file_type"] = json!(t);
            }
            v
        }
        Ok(WatchEvent::Overflow) => json!({ "type": "overflow" }),
        Err(e) => json!({ "type": "error", "message": e.to_string() }),
    })
}
