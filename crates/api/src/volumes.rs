//! Volumes: `POST /v1/volumes`, `GET /v1/volumes`,
//! `GET|DELETE /v1/volumes/{volume}` (by id or name). A create mounts one
//! with `volumes: [{volume, path}]`. The runtime's `volumes.rs` says what
//! a volume is.

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use brig_core::parse_size;
use brig_http::{blocking, Auth};
use brig_runtime::VolumeInfo;
use serde::{Deserialize, Serialize};

use crate::{ApiError, AppState};

/// The body of `POST /v1/volumes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeRequest {
    /// 1 to 64 letters, digits, `_` or `-`; unique among the tenant's.
    pub name: String,
    /// Its quota, such as `2GiB`; default: the daemon's (1 GiB unless
    /// `brig serve --volume-size` says otherwise).
    pub size: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct VolumeList {
    pub items: Vec<VolumeInfo>,
}

pub async fn create(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    let req: VolumeRequest = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid volume request: {e}")))?;
    let size = req
        .size
        .as_deref()
        .map(parse_size)
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("invalid size: {e}")))?
        .map(|s| s.bytes());
    let manager = state.manager.clone();
    let info = blocking(move || manager.create_volume(&tenant, &req.name, size)).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
) -> Result<Json<VolumeList>, ApiError> {
    let manager = state.manager.clone();
    let items = blocking(move || manager.volumes(&tenant)).await?;
    Ok(Json(VolumeList { items }))
}

pub async fn get(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    key: Result<Path<String>, PathRejection>,
) -> Result<Json<VolumeInfo>, ApiError> {
    let key = key?.0;
    let manager = state.manager.clone();
    Ok(Json(blocking(move || manager.volume(&tenant, &key)).await?))
}

pub async fn delete(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    key: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let key = key?.0;
    let manager = state.manager.clone();
    blocking(move || manager.delete_volume(&tenant, &key)).await?;
    Ok(StatusCode::NO_CONTENT)
}
