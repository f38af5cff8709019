//! E2B's volumes, on brig's (the runtime's `volumes.rs`), and their
//! content API, served on the same port (point `E2B_VOLUME_API_URL` at
//! `E2B_API_URL`: the clients send content requests there, never to
//! `E2B_API_URL`):
//!
//! | Call | Answer |
//! |---|---|
//! | `POST /volumes {name}` | 201 `{volumeID, name, token}`; 400 bad or taken name |
//! | `GET /volumes` | 200 `[{volumeID, name}]` |
//! | `GET /volumes/{id}` | 200 `{volumeID, name, token}`; 404 → `VolumeNotFoundException` |
//! | `DELETE /volumes/{id}` | 204; 404 (`destroy` returns False); 409 while a sandbox mounts it |
//! | `GET /volumecontent/{id}/path?path=` | 200 stat |
//! | `PATCH …/path?path=` `{uid?, gid?, mode?}` | 200 stat |
//! | `DELETE …/path?path=` | 204 (a directory with what is in it) |
//! | `GET …/dir?path=&depth=` | 200 `[stat]` |
//! | `POST …/dir?path=&uid=&gid=&mode=&force=` | 201 stat; 409 exists; 404 no parent (force: make parents) |
//! | `GET …/file?path=` | 200 bytes |
//! | `PUT …/file?path=&uid=&gid=&mode=&force=` | 201 stat; 409 exists (force: overwrite); 507 volume full |
//!
//! Content requests carry the volume's token (`Authorization: Bearer`);
//! their errors are `{code: string, message}`, a missing path 404
//! (`VolumePathNotFoundException`). A create mounts volumes by name with
//! `volumeMounts: [{name, path}]`; `GET /sandboxes/{id}` and the lists
//! echo them.

use std::io::Write;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use super::wire::{self, E2bError};
use super::{rfc3339, ApiKey};
use crate::E2bState;
use brig_runtime::volume_files::{Entry, FileError, Meta};
use brig_runtime::{ErrorKind, ManagerError, SandboxManager, TenantId, VolumeInfo};

/// `NewVolume`.
#[derive(Debug, Default, Deserialize)]
struct NewVolume {
    name: String,
}

/// `VolumeAndToken` (and, without the token, `Volume`).
#[derive(Debug, Serialize)]
struct Volume {
    #[serde(rename = "volumeID")]
    volume_id: String,
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
}

impl Volume {
    fn new(v: VolumeInfo, with_token: bool) -> Volume {
        Volume {
            volume_id: v.id,
            name: v.name,
            token: with_token.then_some(v.token),
        }
    }
}

/// `SandboxVolumeMount`: a create's `volumeMounts` item, and as echoed.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct VolumeMount {
    pub name: String,
    pub path: String,
}

/// The mounts a sandbox record keeps, as E2B shows them.
pub fn echoed(record: &brig_runtime::SandboxRecord) -> Vec<VolumeMount> {
    brig_runtime::volumes::mounted(&record.attrs)
        .into_iter()
        .map(|v| VolumeMount {
            name: v.name,
            path: v.path,
        })
        .collect()
}

/// A create's `volumeMounts`, each checked as E2B does: one 400 naming
/// every bad mount (`invalid mounts:\n\t- volume mount #i: …`).
pub fn requests(
    manager: &SandboxManager,
    tenant: &TenantId,
    mounts: &[VolumeMount],
) -> Result<Vec<brig_runtime::VolumeRequest>, E2bError> {
    let mut problems = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for (i, m) in mounts.iter().enumerate() {
        let problem = if let Err(e) = brig_core::volume::check_name(&m.name) {
            Some(e.to_string())
        } else if let Err(e) = brig_core::volume::check_path(&m.path) {
            Some(e.to_string())
        } else if let Err(e) =
            brig_core::volume::check_paths(seen.iter().copied().chain([m.path.as_str()]))
        {
            Some(e.to_string())
        } else {
            match manager.volume(tenant, &m.name) {
                Ok(_) => None,
                Err(ManagerError::VolumeNotFound { .. }) => {
                    Some(format!("volume {:?} not found in your team", m.name))
                }
                Err(e) => return Err(e.into()),
            }
        };
        seen.push(&m.path);
        if let Some(p) = problem {
            problems.push(format!("\t- volume mount #{i}: {p}"));
        }
    }
    if !problems.is_empty() {
        return Err(E2bError::bad_request(format!(
            "invalid mounts:\n{}",
            problems.join("\n")
        )));
    }
    Ok(mounts
        .iter()
        .map(|m| brig_runtime::VolumeRequest {
            volume: m.name.clone(),
            path: m.path.clone(),
        })
        .collect())
}

pub(super) async fn create(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: NewVolume = wire::body(&body)?;
    if req.name.is_empty() {
        return Err(E2bError::bad_request("name is required"));
    }
    let manager = Arc::clone(&state.manager);
    let info = tokio::task::spawn_blocking(move || manager.create_volume(&tenant, &req.name, None))
        .await
        .map_err(E2bError::from)?
        // E2B answers a taken name 400, as a bad one.
        .map_err(|e| match e {
            ManagerError::VolumeExists { .. } => E2bError::bad_request(e.to_string()),
            e => e.into(),
        })?;
    Ok((StatusCode::CREATED, Json(Volume::new(info, true))).into_response())
}

pub(super) async fn list(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
) -> Result<Response, E2bError> {
    let manager = Arc::clone(&state.manager);
    let all = tokio::task::spawn_blocking(move || manager.volumes(&tenant))
        .await
        .map_err(E2bError::from)??;
    let all: Vec<Volume> = all.into_iter().map(|v| Volume::new(v, false)).collect();
    Ok(Json(all).into_response())
}

pub(super) async fn get(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let manager = Arc::clone(&state.manager);
    let info = tokio::task::spawn_blocking(move || manager.volume(&tenant, &id))
        .await
        .map_err(E2bError::from)??;
    Ok(Json(Volume::new(info, true)).into_response())
}

pub(super) async fn delete(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let manager = Arc::clone(&state.manager);
    tokio::task::spawn_blocking(move || manager.delete_volume(&tenant, &id))
        .await
        .map_err(E2bError::from)??;
    Ok(StatusCode::NO_CONTENT)
}

/// A content API error: `{code, message}` with a string code.
#[derive(Debug)]
pub(super) struct ContentError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ContentError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ContentError {
        ContentError {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> ContentError {
        ContentError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    fn of(kind: ErrorKind, message: String) -> ContentError {
        let (status, code) = match kind {
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            ErrorKind::BadRequest => (StatusCode::BAD_REQUEST, "bad_request"),
            ErrorKind::Conflict => (StatusCode::CONFLICT, "conflict"),
            ErrorKind::NoSpace => (StatusCode::INSUFFICIENT_STORAGE, "no_space"),
            ErrorKind::Unauthorized => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ErrorKind::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            _ => {
                tracing::error!("volume content: {message}");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
        };
        ContentError::new(status, code, message)
    }
}

impl From<FileError> for ContentError {
    fn from(e: FileError) -> ContentError {
        ContentError::of(e.kind(), brig_runtime::chain(&e))
    }
}

impl From<ManagerError> for ContentError {
    fn from(e: ManagerError) -> ContentError {
        ContentError::of(e.kind(), brig_runtime::chain(&e))
    }
}

impl From<tokio::task::JoinError> for ContentError {
    fn from(e: tokio::task::JoinError) -> ContentError {
        ContentError::of(ErrorKind::Internal, e.to_string())
    }
}

impl IntoResponse for ContentError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.code, "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

/// The volume a content request is for, by its id in the path and its
/// token (`Authorization: Bearer`).
pub(super) struct Content(VolumeInfo);

impl FromRequestParts<E2bState> for Content {
    type Rejection = ContentError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &E2bState,
    ) -> Result<Content, ContentError> {
        let unauthorized = |m: &str| ContentError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let id = parts
            .uri
            .path()
            .strip_prefix("/volumecontent/")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_default()
            .to_string();
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                unauthorized("missing Authorization: Bearer <token>: the token is the volume's (Volume.create or Volume.connect give it)")
            })?;
        let manager = Arc::clone(&state.manager);
        let found =
            tokio::task::spawn_blocking(move || manager.volume_by_token(&id, &token)).await??;
        match found {
            Some((_tenant, info)) => Ok(Content(info)),
            None => Err(unauthorized(
                "no volume of that id has this token (was it removed?): connect to the volume again",
            )),
        }
    }
}

/// `VolumeEntryStat`.
#[derive(Debug, Serialize)]
struct Stat {
    name: String,
    #[serde(rename = "type")]
    kind: brig_runtime::volume_files::EntryKind,
    path: String,
    size: u64,
    mode: u32,
    uid: u32,
    gid: u32,
    atime: String,
    mtime: String,
    ctime: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<String>,
}

impl From<Entry> for Stat {
    fn from(e: Entry) -> Stat {
        Stat {
            name: e.name,
            kind: e.kind,
            path: e.path,
            size: e.size,
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            atime: rfc3339(e.atime),
            mtime: rfc3339(e.mtime),
            ctime: rfc3339(e.ctime),
            target: e.target,
        }
    }
}

/// The query every content request has: `path`, and what some take.
#[derive(Debug, Default)]
struct Query {
    path: String,
    depth: Option<u32>,
    meta: Meta,
    force: bool,
}

fn query(raw: Option<String>) -> Result<Query, ContentError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.as_deref().unwrap_or(""))
        .map_err(|e| ContentError::bad(format!("invalid query: {e}")))?;
    let mut q = Query::default();
    let mut path = None;
    let number = |k: &str, v: &str| {
        v.parse::<u32>()
            .map_err(|_| ContentError::bad(format!("invalid {k} {v:?}: expected a number")))
    };
    for (k, v) in pairs {
        match k.as_str() {
            "path" => path = Some(v),
            "depth" => q.depth = Some(number(&k, &v)?),
            "uid" => q.meta.uid = Some(number(&k, &v)?),
            "gid" => q.meta.gid = Some(number(&k, &v)?),
            "mode" => q.meta.mode = Some(number(&k, &v)?),
            "force" => {
                q.force = v
                    .parse()
                    .map_err(|_| ContentError::bad(format!("invalid force {v:?}: true or false")))?
            }
            _ => {}
        }
    }
    q.path = path.ok_or_else(|| ContentError::bad("the query parameter path is required"))?;
    Ok(q)
}

/// Run `op` on the volume's files on a blocking thread.
async fn on_files<T: Send + 'static>(
    state: &E2bState,
    info: VolumeInfo,
    op: impl FnOnce(&brig_runtime::volume_files::VolumeFiles<'_>) -> Result<T, FileError>
        + Send
        + 'static,
) -> Result<T, ContentError> {
    let manager = Arc::clone(&state.manager);
    tokio::task::spawn_blocking(move || -> Result<T, ContentError> {
        let files = manager.volume_files(&info)?;
        Ok(op(&files)?)
    })
    .await?
}

pub(super) async fn stat(
    State(state): State<E2bState>,
    Content(info): Content,
    RawQuery(raw): RawQuery,
) -> Result<Response, ContentError> {
    let q = query(raw)?;
    let entry = on_files(&state, info, move |f| f.stat(&q.path)).await?;
    Ok(Json(Stat::from(entry)).into_response())
}

/// `PATCH …/path`'s body.
#[derive(Debug, Default, Deserialize)]
struct MetaBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

pub(super) async fn patch(
    State(state): State<E2bState>,
    Content(info): Content,
    RawQuery(raw): RawQuery,
    body: axum::body::Bytes,
) -> Result<Response, ContentError> {
    let q = query(raw)?;
    let m: MetaBody = if body.is_empty() {
        MetaBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ContentError::bad(format!("invalid body: {e}")))?
    };
    let meta = Meta {
        uid: m.uid,
        gid: m.gid,
        mode: m.mode,
    };
    let entry = on_files(&state, info, move |f| f.set_meta(&q.path, meta)).await?;
    Ok(Json(Stat::from(entry)).into_response())
}

pub(super) async fn remove(
    State(state): State<E2bState>,
    Content(info): Content,
    RawQuery(raw): RawQuery,
) -> Result<StatusCode, ContentError> {
    let q = query(raw)?;
    on_files(&state, info, move |f| f.remove(&q.path)).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn list_dir(
    State(state): State<E2bState>,
    Content(info): Content,
    RawQuery(raw): RawQuery,
) -> Result<Response, ContentError> {
    let q = query(raw)?;
    let depth = q.depth.unwrap_or(1);
    let entries = on_files(&state, info, move |f| f.list(&q.path, depth)).await?;
    let entries: Vec<Stat> = entries.into_iter().map(Stat::from).collect();
    Ok(Json(entries).into_response())
}

pub(super) async fn make_dir(
    State(state): State<E2bState>,
    Content(info): Content,
    RawQuery(raw): RawQuery,
) -> Result<Response, ContentError> {
    let q = query(raw)?;
    let entry = on_files(&state, info, move |f| f.make_dir(&q.path, q.meta, q.force)).await?;
    Ok((StatusCode::CREATED, Json(Stat::from(entry))).into_response())
}

pub(super) async fn read_file(
    State(state): State<E2bState>,
    Content(info): Content,
    RawQuery(raw): RawQuery,
) -> Result<Response, ContentError> {
    let q = query(raw)?;
    // The open file keeps the volume's mount busy, not held: a delete
    // meanwhile fails to unmount and says so.
    let file = on_files(&state, info, move |f| f.open_file(&q.path)).await?;
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(stream),
    )
        .into_response())
}

pub(super) async fn write_file(
    State(state): State<E2bState>,
    Content(info): Content,
    RawQuery(raw): RawQuery,
    body: Body,
) -> Result<Response, ContentError> {
    let q = query(raw)?;
    let manager = Arc::clone(&state.manager);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, String>>(8);
    // One blocking task holds the volume and writes what the body brings.
    let writer = tokio::task::spawn_blocking(move || -> Result<Entry, ContentError> {
        let files = manager.volume_files(&info)?;
        let mut file = files.create_file(&q.path, q.meta, q.force)?;
        let written = (|| {
            while let Some(chunk) = rx.blocking_recv() {
                let chunk =
                    chunk.map_err(|e| ContentError::bad(format!("the upload broke off: {e}")))?;
                file.write_all(&chunk)
                    .map_err(|e| FileError::io("write", &q.path, e))?;
            }
            file.sync_data()
                .map_err(|e| FileError::io("write", &q.path, e))?;
            Ok::<(), ContentError>(())
        })();
        drop(file);
        if let Err(e) = written {
            // Half a file is no use to anyone, and holds the space.
            let _ = files.remove(&q.path);
            return Err(e);
        }
        Ok(files.stat(&q.path)?)
    });
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        if tx.send(chunk.map_err(|e| e.to_string())).await.is_err() {
            break;
        }
    }
    drop(tx);
    let entry = writer.await??;
    Ok((StatusCode::CREATED, Json(Stat::from(entry))).into_response())
}
