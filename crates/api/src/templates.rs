//! `/v1/templates`: what sandboxes start from — the named templates
//! (recipes built on first use) and the images of the daemon's image store
//! (crate brig-image). Listing and showing need any key; pulling,
//! importing, removing and pruning change what every tenant can run and
//! fill the host's disk, so they need an admin key.
//!
//! - `GET /v1/templates`: recipes and images.
//! - `GET /v1/templates/{name}`: one image (its source, digest, layers,
//!   config); names may hold `/` and `:` (`127.0.0.1:5000/team/tool:1`).
//! - `POST /v1/templates/pull` `{"reference", "name"?, "insecure"?,
//!   "platform"?, "username"?, "password"?}`: NDJSON as it goes
//!   (`resolved`, `progress` at most every 250 ms per layer, `layer`,
//!   `retrying`), then `pulled` with the image or `error` with why.
//! - `POST /v1/templates/import?name=NAME`: the body is an oci-archive or
//!   docker-archive (`docker save`), streamed to a temporary file first.
//! - `DELETE /v1/templates/{name}`: 409 while a live sandbox runs on it.
//! - `POST /v1/templates/prune`: layers and blobs nothing uses.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use brig_http::Caller;
use brig_image::pull::{PullEvent, PullOptions};
use brig_image::{ImageError, ImageStore};
use brig_runtime::Principal;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{blocking, ApiError, AppState};

/// The body of `POST /v1/templates/pull`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PullConfig {
    pub reference: String,
    pub name: Option<String>,
    #[serde(default)]
    pub insecure: bool,
    pub platform: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
}

/// The largest archive `import` takes.
pub const MAX_IMPORT: u64 = 16 << 30;

fn admin_only(caller: &Principal, what: &str) -> Result<(), ApiError> {
    if caller.is_admin() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "{what} changes what every tenant runs: it needs an admin key (the key `brig serve` \
             wrote to local.key is one)"
        ),
    ))
}

/// The daemon's home, where templates and images live.
fn home(state: &AppState) -> Result<PathBuf, ApiError> {
    state.manager.config().home.clone().ok_or_else(|| {
        ApiError::bad_request("named templates and images are not enabled on this daemon")
    })
}

fn store(state: &AppState) -> Result<ImageStore, ApiError> {
    Ok(ImageStore::open(&home(state)?)?)
}

impl From<ImageError> for ApiError {
    fn from(e: ImageError) -> ApiError {
        let message = e.to_string();
        match e {
            ImageError::NotFound { .. } => ApiError::not_found(message),
            // What the client named or sent is at fault.
            ImageError::BadReference { .. }
            | ImageError::Registry { .. }
            | ImageError::BadImage { .. }
            | ImageError::InvalidDigest { .. }
            | ImageError::DigestMismatch { .. }
            | ImageError::SizeMismatch { .. }
            | ImageError::UnsupportedMediaType { .. }
            | ImageError::LayerStream { .. }
            | ImageError::EntryRefused { .. }
            | ImageError::DiffIdMismatch { .. }
            | ImageError::InvalidName { .. }
            | ImageError::NotAnImage { .. }
            | ImageError::CompressedArchive { .. }
            | ImageError::BadLayout { .. }
            | ImageError::Json { .. }
            | ImageError::NoPlatform { .. } => ApiError::bad_request(message),
            _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message),
        }
    }
}

fn image_view(image: &brig_image::ImageRecord) -> Value {
    json!({
        "name": image.name,
        "kind": "image",
        "source": image.source,
        "digest": image.digest,
        "size_bytes": image.size,
        "layers": image.layers.len(),
        "base": image.base,
        "config": image.config,
        "created_at": image.created_at,
    })
}

/// `GET /v1/templates`.
pub async fn list(
    State(state): State<AppState>,
    Caller(_): Caller,
) -> Result<Json<Value>, ApiError> {
    let home = home(&state)?;
    let items = blocking(move || -> Result<Vec<Value>, ApiError> {
        let mut items: Vec<Value> = brig_template::list(&home)
            .iter()
            .map(|t| {
                json!({
                    "name": t.recipe.name,
                    "kind": "recipe",
                    "description": t.recipe.description,
                    "state": t.state.as_str(),
                    "size_bytes": t.size,
                })
            })
            .collect();
        // Snapshots are their tenants' own (`/v1/snapshots`).
        items.extend(
            ImageStore::open(&home)?
                .list()?
                .iter()
                .filter(|i| !i.name.starts_with(brig_image::SNAPSHOT_PREFIX))
                .map(image_view),
        );
        Ok(items)
    })
    .await?;
    Ok(Json(json!({ "items": items })))
}

/// `GET /v1/templates/{name}`.
pub async fn get(
    State(state): State<AppState>,
    Caller(_): Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let store = store(&state)?;
    let image = blocking(move || {
        store
            .get(&name)?
            .filter(|i| !i.name.starts_with(brig_image::SNAPSHOT_PREFIX))
            .ok_or(ImageError::NotFound { name })
    })
    .await?;
    Ok(Json(image_view(&image)))
}

/// `DELETE /v1/templates/{name}`.
pub async fn remove(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>, ApiError> {
    admin_only(&caller, "removing an image")?;
    if name.starts_with(brig_image::SNAPSHOT_PREFIX) {
        return Err(ApiError::not_found(format!(
            "no image {name}: a snapshot is removed with DELETE /v1/snapshots/{{id}}"
        )));
    }
    let store = store(&state)?;
    let manager = Arc::clone(&state.manager);
    let removed = blocking(move || -> Result<_, ApiError> {
        let users: Vec<String> = manager
            .store()
            .live_on_template(&name)
            .map_err(|e| ApiError::internal(&e))?
            .iter()
            .map(ToString::to_string)
            .collect();
        if !users.is_empty() {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!(
                    "image {name} is in use by running sandbox(es) {}: end them first",
                    users.join(", ")
                ),
            ));
        }
        Ok(store.remove(&name)?)
    })
    .await?;
    Ok(Json(image_view(&removed)))
}

/// `POST /v1/templates/prune`.
pub async fn prune(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<Value>, ApiError> {
    admin_only(&caller, "pruning images")?;
    let home = home(&state)?;
    let out = blocking(move || -> Result<Value, ApiError> {
        let pruned = ImageStore::open(&home)?.prune()?;
        let builds = brig_template::prune(&home);
        Ok(json!({
            "layers": pruned.layers,
            "blobs": pruned.blobs,
            "bytes": pruned.bytes,
            "layers_in_use": pruned.in_use,
            "template_builds": builds,
        }))
    })
    .await?;
    Ok(Json(out))
}

/// `POST /v1/templates/pull`: NDJSON, one line per event.
pub async fn pull(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Result<Json<PullConfig>, JsonRejection>,
) -> Result<Response, ApiError> {
    admin_only(&caller, "pulling an image")?;
    if !state.manager.config().pull_images {
        return Err(ApiError::bad_request(
            "this daemon does not pull images (brig serve --pull never): pull on its host with \
             `brig template pull`",
        ));
    }
    let config = body?.0;
    if config.username.is_some() != config.password.is_some() {
        return Err(ApiError::bad_request(
            "username and password go together (or neither, for anonymous access)",
        ));
    }
    let store = Arc::new(store(&state)?);
    // Events come from inside the puller's own runtime, where nothing may
    // block: an unbounded channel (a few lines a second at most), drained
    // into the answer's.
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        while let Some(v) = events_rx.recv().await {
            if tx.send(Ok(super::ndjson::line(&v))).await.is_err() {
                break;
            }
        }
    });
    let send = move |v: Value| {
        let _ = events_tx.send(v);
    };
    // Progress of a layer at most every 250 ms: a line per chunk would be
    // thousands.
    let last: Mutex<HashMap<String, (Instant, u64)>> = Mutex::default();
    let events = {
        let send = send.clone();
        move |e: PullEvent| match e {
            PullEvent::Resolved { digest, layers } => send(json!({
                "event": "resolved",
                "digest": digest,
                "layers": layers.iter().map(|(d, s)| json!({"digest": d, "size": s})).collect::<Vec<_>>(),
            })),
            PullEvent::Progress { digest, bytes } => {
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                let entry = last.entry(digest.clone()).or_insert((Instant::now(), 0));
                entry.1 += bytes;
                if entry.0.elapsed() >= Duration::from_millis(250) {
                    entry.0 = Instant::now();
                    send(json!({"event": "progress", "layer": digest, "bytes": entry.1}));
                }
            }
            PullEvent::Cached { digest } => {
                send(json!({"event": "layer", "layer": digest, "cached": true}))
            }
            PullEvent::Done { digest } => {
                send(json!({"event": "layer", "layer": digest, "cached": false}))
            }
            PullEvent::Retrying { digest, reason } => {
                send(json!({"event": "retrying", "layer": digest, "reason": reason}))
            }
        }
    };
    let opts = PullOptions {
        insecure: config.insecure,
        platform: config.platform,
        credentials: config.username.zip(config.password),
    };
    tokio::task::spawn_blocking(move || {
        let done = brig_image::pull::pull(
            &store,
            &config.reference,
            config.name.as_deref(),
            &opts,
            Arc::new(events),
        );
        match done {
            Ok(image) => send(json!({"event": "pulled", "image": image_view(&image)})),
            Err(e) => send(json!({"event": "error", "message": e.to_string()})),
        }
    });
    super::ndjson::response(rx)
}

/// `?name=NAME` of an import.
#[derive(Debug, Deserialize)]
pub struct ImportQuery {
    pub name: String,
}

/// `POST /v1/templates/import?name=NAME`, the archive as the body.
pub async fn import(
    State(state): State<AppState>,
    Caller(caller): Caller,
    q: Result<Query<ImportQuery>, QueryRejection>,
    body: Body,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    admin_only(&caller, "importing an image")?;
    let Query(q) = q?;
    let store = store(&state)?;
    // The archive lands in a temporary file in the store (same disk), then
    // is imported from there; it goes when the import is over.
    let file = tempfile::NamedTempFile::new_in(store.root()).map_err(|e| ApiError::internal(&e))?;
    let (std_file, path) = file.into_parts();
    let mut out = std::io::BufWriter::new(std_file);
    let mut total = 0u64;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk =
            chunk.map_err(|e| ApiError::bad_request(format!("reading the archive: {e}")))?;
        total += chunk.len() as u64;
        if total > MAX_IMPORT {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!("an archive may be at most {MAX_IMPORT} bytes"),
            ));
        }
        out.write_all(&chunk).map_err(|e| ApiError::internal(&e))?;
    }
    out.flush().map_err(|e| ApiError::internal(&e))?;
    drop(out);
    let name = q.name;
    let image = blocking(move || {
        let imported = brig_image::import(&store, &path, &name);
        drop(path);
        imported
    })
    .await?;
    Ok((StatusCode::CREATED, Json(image_view(&image))))
}
