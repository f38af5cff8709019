//! envd's plain HTTP endpoints (reference §3.6): `/health`, `/files`
//! (download and upload, multipart or raw, gzip, signed URLs), `/envs`,
//! `/metrics`. Errors are envd's `{"code": <status>, "message"}`.
//!
//! `/files` takes either the sandbox's `X-Access-Token` or a signature
//! (`v1_` + base64(sha256("{path}:{op}:{user}:{token}[:{expiration}]"))),
//! which is what `download_url()`/`upload_url()` put in the URL.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Query, Request};
use axum::http::header::{ACCEPT_ENCODING, CONTENT_ENCODING, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use brig_agent_client::{Call, ClientError};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::connect::{Code, ConnectError};
use super::filesystem::METADATA_XATTR_PREFIX;
use super::{token_ok, Ctx, User};
use brig_runtime::ManagerError;

const CHUNK: usize = 64 * 1024;
const CHUNKS_IN_FLIGHT: usize = 4;

/// An envd HTTP error: `{"code": <status>, "message"}`.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({ "code": status.as_u16(), "message": message.into() })),
    )
        .into_response()
}

/// A Connect-coded failure as an envd HTTP error.
fn from_connect(e: ConnectError) -> Response {
    let status = match e.code {
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        // E.g. metadata on a filesystem without user extended attributes.
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, e.message)
}

/// `GET /health`: 204 while the sandbox runs (the router answered 502
/// already if it does not).
pub async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// `GET /envs`: the sandbox-wide environment variables.
pub async fn envs(Extension(ctx): Extension<Ctx>) -> Json<Value> {
    Json(json!(ctx.sandbox.env))
}

/// `GET /metrics`, in envd's shape.
pub async fn metrics(Extension(ctx): Extension<Ctx>) -> Response {
    let m = match ctx
        .blocking(|ctx| Ok(ctx.manager().metrics(&ctx.sandbox.tenant, ctx.id())?))
        .await
    {
        Ok(m) => m,
        Err(e) => return from_connect(e),
    };
    let cpus = brig_core::host_cpus();
    let mem_total = if m.memory_limit_bytes > 0 && m.memory_limit_bytes < u64::MAX / 2 {
        m.memory_limit_bytes
    } else {
        host_memory()
    };
    Json(json!({
        "ts": m.timestamp / 1000,
        "cpu_count": cpus,
        "cpu_used_pct": m.cpu_percent.unwrap_or(0.0),
        "mem_total": mem_total,
        "mem_used": m.memory_bytes,
        "mem_cache": 0,
        "mem_total_mib": mem_total >> 20,
        "mem_used_mib": m.memory_bytes >> 20,
        "disk_used": m.disk_used_bytes.unwrap_or(0),
        "disk_total": m.disk_total_bytes.unwrap_or(0),
    }))
    .into_response()
}

fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[derive(Debug, Deserialize)]
pub struct FilesQuery {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    signature: Option<String>,
    #[serde(default)]
    signature_expiration: Option<i64>,
}

/// The signature `download_url()`/`upload_url()` compute (reference §3.5).
pub fn signature(path: &str, op: &str, user: &str, token: &str, expiration: Option<i64>) -> String {
    let raw = match expiration {
        Some(exp) => format!("{path}:{op}:{user}:{token}:{exp}"),
        None => format!("{path}:{op}:{user}:{token}"),
    };
    let digest = Sha256::digest(raw.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

// The error is the finished HTTP answer; these run once per request, so
// its size on the stack does not matter.
#[allow(clippy::result_large_err)]
/// `X-Access-Token`, or a valid signature for `op`.
fn authorize(ctx: &Ctx, headers: &HeaderMap, q: &FilesQuery, op: &str) -> Result<(), Response> {
    if token_ok(&ctx.sandbox, headers) {
        return Ok(());
    }
    let Some(sig) = &q.signature else {
        return Err(super::unauthorized_token());
    };
    if let Some(exp) = q.signature_expiration {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        if exp < now {
            return Err(error(
                StatusCode::UNAUTHORIZED,
                "signature is already expired",
            ));
        }
    }
    let want = signature(
        q.path.as_deref().unwrap_or_default(),
        op,
        q.username.as_deref().unwrap_or_default(),
        &ctx.sandbox.access_token,
        q.signature_expiration,
    );
    if crate::constant_time_eq(sig.as_bytes(), want.as_bytes()) {
        Ok(())
    } else {
        Err(error(StatusCode::UNAUTHORIZED, "invalid signature"))
    }
}

/// The sandbox a signed `/files` request without routing headers is for:
/// the one whose access token its signature validates (reference §2.4).
pub fn signed_sandbox(state: &super::E2bState, req: &Request) -> Option<String> {
    if req.uri().path() != "/files" {
        return None;
    }
    let q: FilesQuery = serde_urlencoded::from_str(req.uri().query()?).ok()?;
    let sig = q.signature.as_deref()?;
    let op = if req.method() == axum::http::Method::GET {
        "read"
    } else {
        "write"
    };
    state
        .sandboxes
        .all()
        .into_iter()
        .find(|sb| {
            !sb.access_token.is_empty() && {
                let want = signature(
                    q.path.as_deref().unwrap_or_default(),
                    op,
                    q.username.as_deref().unwrap_or_default(),
                    &sb.access_token,
                    q.signature_expiration,
                );
                crate::constant_time_eq(sig.as_bytes(), want.as_bytes())
            }
        })
        .map(|sb| sb.id.to_string())
}

/// An agent failure on a file, as envd reports it.
fn file_error(path: &str, e: ManagerError) -> Response {
    use brig_agent_client::ErrorCode as E;
    let code = match &e {
        ManagerError::Agent {
            source: ClientError::Agent { code, .. },
            ..
        } => Some(*code),
        _ => None,
    };
    match code {
        Some(E::NotFound) => error(
            StatusCode::NOT_FOUND,
            format!("path '{path}' does not exist"),
        ),
        Some(E::IsADirectory) => error(
            StatusCode::BAD_REQUEST,
            format!("path '{path}' is a directory"),
        ),
        Some(E::PermissionDenied) => error(StatusCode::FORBIDDEN, e.to_string()),
        Some(E::InvalidRequest | E::NotADirectory) => error(StatusCode::BAD_REQUEST, e.to_string()),
        _ => from_connect(e.into()),
    }
}

fn wants_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|enc| {
            let mut parts = enc.split(';').map(str::trim);
            parts.next() == Some("gzip") && !parts.any(|p| p.replace(' ', "") == "q=0")
        })
}

/// `GET /files?path=`: the file's contents, streamed (gzip if asked).
pub async fn download(
    Extension(ctx): Extension<Ctx>,
    headers: HeaderMap,
    query: Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return error(StatusCode::BAD_REQUEST, "invalid query: use ?path=<file>");
    };
    if let Err(resp) = authorize(&ctx, &headers, &q, "read") {
        return resp;
    }
    let (username, raw_path) = (q.username.clone(), q.path.clone().unwrap_or_default());
    let opened = ctx
        .blocking(move |ctx| {
            let user = ctx.user(username.as_deref())?;
            let path = user.resolve(&raw_path);
            Ok(ctx
                .manager()
                .read_file(&ctx.sandbox.tenant, ctx.id(), &path)
                .map_err(|e| (path.clone(), e)))
        })
        .await;
    let reader = match opened {
        Err(e) => return from_connect(e),
        Ok(Err((path, e))) => return file_error(&path, e),
        Ok(Ok(r)) => r,
    };
    let gzip = wants_gzip(&headers);
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHUNKS_IN_FLIGHT);
    tokio::spawn(pump_file(reader, gzip, tx));
    let mut resp = Response::new(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ));
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, "application/octet-stream".parse().unwrap());
    h.insert("vary", "Accept-Encoding".parse().unwrap());
    if gzip {
        h.insert(CONTENT_ENCODING, "gzip".parse().unwrap());
    }
    resp
}

/// The file's bytes down the response body (gzipped if asked), read from
/// the agent as fast as the client takes them, without a thread.
async fn pump_file(
    mut reader: brig_agent_client::FileReader,
    gzip: bool,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut enc =
        gzip.then(|| flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
    let result: std::io::Result<()> = async {
        loop {
            let n = std::future::poll_fn(|cx| reader.poll_read(cx, &mut buf)).await?;
            let out = match (enc.as_mut(), n) {
                (None, 0) => return Ok(()),
                (None, n) => buf[..n].to_vec(),
                (Some(_), 0) => {
                    let rest = enc.take().expect("matched Some").finish()?;
                    if !rest.is_empty() {
                        let _ = tx.send(Ok(Bytes::from(rest))).await;
                    }
                    return Ok(());
                }
                (Some(e), n) => {
                    e.write_all(&buf[..n])?;
                    std::mem::take(e.get_mut())
                }
            };
            if out.is_empty() {
                continue;
            }
            if tx.send(Ok(Bytes::from(out))).await.is_err() {
                // The client went away.
                return Ok(());
            }
        }
    }
    .await;
    if let Err(e) = result {
        // Breaks the body, so the client sees a truncated download.
        let _ = tx.send(Err(e)).await;
    }
}

/// `POST /files`: multipart (each part's filename is its full target
/// path, unless `?path=` names it) or a raw body to `?path=` (optionally
/// `Content-Encoding: gzip`). Parents are created, files overwritten, and
/// all of it owned by the user.
pub async fn upload(
    Extension(ctx): Extension<Ctx>,
    query: Result<Query<FilesQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Response {
    let Ok(Query(q)) = query else {
        return error(StatusCode::BAD_REQUEST, "invalid query parameters");
    };
    if let Err(resp) = authorize(&ctx, req.headers(), &q, "write") {
        return resp;
    }
    let metadata = match upload_metadata(req.headers()) {
        Ok(m) => m,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let username = q.username.clone();
    let user = match ctx.blocking(move |ctx| ctx.user(username.as_deref())).await {
        Ok(u) => u,
        Err(e) => return from_connect(e),
    };
    let multipart = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("multipart/form-data"));
    let written = if multipart {
        upload_multipart(&ctx, &user, q.path.as_deref(), req).await
    } else {
        upload_raw(&ctx, &user, q.path.as_deref(), req).await
    };
    let written = match written {
        Ok(w) => w,
        Err(resp) => return resp,
    };
    let (paths, meta) = (written.clone(), metadata.clone());
    let finished = ctx
        .blocking(move |ctx| {
            // The files were written as the user (`User::owner`): a new
            // one is theirs already, and one they may not write was
            // refused by the kernel. (A chown by name afterwards would
            // follow whatever the sandbox swapped into the path meanwhile.)
            // Always, even with no metadata: an overwrite replaces the
            // file's whole metadata set (truncating keeps xattrs).
            paths
                .iter()
                .try_for_each(|p| set_metadata(ctx, p, &meta).map_err(ConnectError::from))
        })
        .await;
    if let Err(e) = finished {
        return from_connect(e);
    }
    let body: Vec<Value> = written
        .iter()
        .map(|p| {
            let name = p.rsplit('/').next().unwrap_or(p);
            let mut v = json!({ "path": p, "name": name, "type": "file" });
            if !metadata.is_empty() {
                v["metadata"] = json!(metadata);
            }
            v
        })
        .collect();
    Json(body).into_response()
}

/// The most bytes of one metadata key: `user.e2b.` plus the key must fit
/// the kernel's 255-byte attribute name.
const MAX_METADATA_KEY: usize = 255 - METADATA_XATTR_PREFIX.len();
/// The most bytes of all keys and values of one upload together.
const MAX_METADATA_TOTAL: usize = 4096;

/// envd 0.6.2: each `X-Metadata-<key>: <value>` header is a metadata entry,
/// the key lower-cased. Keys are header names, so they are already HTTP
/// tokens; values must be printable ASCII.
fn upload_metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    let mut total = 0;
    for (name, value) in headers {
        // Header names arrive lower-cased.
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        if key.is_empty() {
            continue;
        }
        if key.len() > MAX_METADATA_KEY {
            return Err(format!(
                "invalid metadata: key '{key}' is longer than {MAX_METADATA_KEY} bytes"
            ));
        }
        let value = value
            .to_str()
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .ok_or_else(|| {
                format!("invalid metadata: the value of '{key}' must be printable ASCII")
            })?;
        total += key.len() + value.len();
        if total > MAX_METADATA_TOTAL {
            return Err(format!(
                "invalid metadata: keys and values together exceed {MAX_METADATA_TOTAL} bytes"
            ));
        }
        out.entry(key.to_string())
            .or_insert_with(|| value.to_string());
    }
    Ok(out)
}

/// Make `metadata` the file's whole `user.e2b.*` set.
fn set_metadata(
    ctx: &Ctx,
    path: &str,
    metadata: &BTreeMap<String, String>,
) -> Result<(), ManagerError> {
    let xattrs = metadata
        .iter()
        .map(|(k, v)| (format!("{METADATA_XATTR_PREFIX}{k}"), v.clone()))
        .collect();
    ctx.manager().call(
        &ctx.sandbox.tenant,
        ctx.id(),
        &Call::SetXattrs {
            path: path.to_string(),
            xattrs,
            replace_prefix: Some(METADATA_XATTR_PREFIX.to_string()),
        },
    )?;
    Ok(())
}

// The error is the finished HTTP answer; these run once per request, so
// its size on the stack does not matter.
#[allow(clippy::result_large_err)]
async fn upload_raw(
    ctx: &Ctx,
    user: &User,
    path: Option<&str>,
    req: Request,
) -> Result<Vec<String>, Response> {
    let Some(path) = path.filter(|p| !p.is_empty()) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "a raw upload needs ?path=<file> (or send multipart/form-data)",
        ));
    };
    let path = user.resolve(path);
    let gzip = match req
        .headers()
        .get(CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    {
        None | Some("identity") => false,
        Some("gzip") => true,
        Some(other) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("unsupported Content-Encoding {other:?}: use gzip or none"),
            ));
        }
    };
    let stream = req
        .into_body()
        .into_data_stream()
        .map(|r| r.map_err(std::io::Error::other));
    let reader = SyncIoBridge::new(StreamReader::new(stream));
    let (user, p) = (user.clone(), path.clone());
    let result = ctx
        .blocking(move |ctx| {
            make_parent(ctx, &user, &p)?;
            let reader: Box<dyn Read + Send> = if gzip {
                Box::new(flate2::read::MultiGzDecoder::new(reader))
            } else {
                Box::new(reader)
            };
            Ok(ctx
                .manager()
                .write_file_as(&ctx.sandbox.tenant, ctx.id(), &p, reader, user.owner()))
        })
        .await;
    match result {
        Err(e) => Err(from_connect(e)),
        Ok(Err(e)) => Err(file_error(&path, e)),
        Ok(Ok(_)) => Ok(vec![path]),
    }
}

fn make_parent(ctx: &Ctx, user: &User, path: &str) -> Result<(), ConnectError> {
    match std::path::Path::new(path).parent() {
        Some(parent) => ctx.ensure_dirs(user, &parent.to_string_lossy()).map(drop),
        None => Ok(()),
    }
}

// The error is the finished HTTP answer; these run once per request, so
// its size on the stack does not matter.
#[allow(clippy::result_large_err)]
async fn upload_multipart(
    ctx: &Ctx,
    user: &User,
    path: Option<&str>,
    req: Request,
) -> Result<Vec<String>, Response> {
    let (req, phase) = brig_http::multipart::bounded(req);
    let mut multipart = Multipart::from_request(req, &())
        .await
        .map_err(|r| error(StatusCode::BAD_REQUEST, r.body_text()))?;
    let bad_part = |e: axum::extract::multipart::MultipartError| {
        error(
            StatusCode::BAD_REQUEST,
            format!("malformed multipart body: {}", phase.explain(&e)),
        )
    };
    let mut written: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    while let Some(mut field) = {
        phase.headers();
        multipart.next_field().await.map_err(bad_part)?
    } {
        phase.data();
        let target = match path.filter(|p| !p.is_empty()).or(field.file_name()) {
            Some(t) if !t.is_empty() => user.resolve(t),
            _ => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "a multipart part needs a filename (its target path) or ?path=",
                ));
            }
        };
        if !seen.insert(target.clone()) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("cannot upload two files to the same path '{target}'"),
            ));
        }
        let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(CHUNKS_IN_FLIGHT);
        let reader = SyncIoBridge::new(StreamReader::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ));
        let (u, p) = (user.clone(), target.clone());
        let writer = ctx.blocking(move |ctx| {
            make_parent(ctx, &u, &p)?;
            Ok(ctx
                .manager()
                .write_file_as(&ctx.sandbox.tenant, ctx.id(), &p, reader, u.owner()))
        });
        // Feed and write at once; the feeder drops `tx` when the part ends.
        let feed = async move {
            loop {
                match field.chunk().await {
                    Ok(Some(chunk)) => {
                        // The writer stopped early: its own error says why.
                        if tx.send(Ok(chunk)).await.is_err() {
                            break Ok(());
                        }
                    }
                    Ok(None) => break Ok(()),
                    Err(e) => {
                        let _ = tx
                            .send(Err(std::io::Error::other("the multipart body broke off")))
                            .await;
                        break Err(bad_part(e));
                    }
                }
            }
        };
        let (fed, wrote) = tokio::join!(feed, writer);
        fed?;
        match wrote {
            Err(e) => return Err(from_connect(e)),
            Ok(Err(e)) => return Err(file_error(&target, e)),
            Ok(Ok(_)) => written.push(target),
        }
    }
    if written.is_empty() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the multipart body has no file part",
        ));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_sdk() {
        // sha256("/a:read::tok") in base64 without padding, as the SDK and
        // envd compute it.
        let s = signature("/a", "read", "", "tok", None);
        assert!(s.starts_with("v1_") && !s.ends_with('='), "{s}");
        assert_ne!(s, signature("/a", "write", "", "tok", None));
        assert_ne!(s, signature("/a", "read", "", "tok", Some(1)));
    }

    #[test]
    fn gzip_is_taken_when_offered() {
        let mut h = HeaderMap::new();
        assert!(!wants_gzip(&h));
        h.insert(ACCEPT_ENCODING, "br, gzip".parse().unwrap());
        assert!(wants_gzip(&h));
        h.insert(ACCEPT_ENCODING, "gzip;q=0".parse().unwrap());
        assert!(!wants_gzip(&h));
    }
}
