//! Snapshots and forks: `POST /v1/sandboxes/{id}/snapshots`,
//! `GET /v1/snapshots`, `GET|DELETE /v1/snapshots/{snapshot}`,
//! `POST /v1/sandboxes/{id}/fork`. A create names a snapshot as its
//! `template` (its id or name). The runtime's `snapshots.rs` says what a
//! snapshot keeps.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use brig_core::parse_duration;
use brig_http::{blocking, Auth};
use brig_runtime::{ManagerError, SnapshotInfo};
use serde::{Deserialize, Serialize};

use crate::sandboxes::SandboxView;
use crate::{sandbox_id, ApiError, AppState};

/// The body of `POST /v1/sandboxes/{id}/snapshots` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// A name to find it by (a snapshot of that name is replaced).
    pub name: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct SnapshotList {
    pub items: Vec<SnapshotInfo>,
}

/// `?sandbox=ID&name=NAME`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    pub sandbox: Option<String>,
    pub name: Option<String>,
}

/// The body of `POST /v1/sandboxes/{id}/fork` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many (1 to 100; default 1).
    pub count: Option<u32>,
    /// Each fork's timeout (`10m`); default: the daemon's.
    pub timeout: Option<String>,
}

/// One fork's outcome: its sandbox, or why it could not start.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ForkResult {
    Sandbox { sandbox: Box<SandboxView> },
    Error { error: ForkError },
}

#[derive(Debug, Serialize)]
pub struct ForkError {
    pub code: &'static str,
    pub message: String,
}

pub async fn create(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    let id = sandbox_id(&id?.0)?;
    let req: SnapshotRequest = crate::sandboxes::optional_body(&body)?;
    let manager = state.manager.clone();
    let info = blocking(move || manager.snapshot(&tenant, &id, req.name.as_deref())).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<SnapshotList>, ApiError> {
    let query = query?.0;
    let sandbox = match &query.sandbox {
        Some(s) => Some(sandbox_id(s)?),
        None => None,
    };
    let manager = state.manager.clone();
    let items =
        blocking(move || manager.snapshots(&tenant, sandbox.as_ref(), query.name.as_deref()))
            .await?;
    Ok(Json(SnapshotList { items }))
}

pub async fn get(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    key: Result<Path<String>, PathRejection>,
) -> Result<Json<SnapshotInfo>, ApiError> {
    let key = key?.0;
    let manager = state.manager.clone();
    Ok(Json(
        blocking(move || manager.snapshot_info(&tenant, &key)).await?,
    ))
}

pub async fn delete(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    key: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let key = key?.0;
    let manager = state.manager.clone();
    blocking(move || manager.delete_snapshot(&tenant, &key)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// N sandboxes from the sandbox's files now, with its limits, create-time
/// environment, labels and network policy; the sandbox runs on.
pub async fn fork(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<Vec<ForkResult>>), ApiError> {
    let id = sandbox_id(&id?.0)?;
    let req: ForkRequest = crate::sandboxes::optional_body(&body)?;
    let timeout = req
        .timeout
        .as_deref()
        .map(parse_duration)
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("invalid timeout: {e}")))?;
    let manager = state.manager.clone();
    let results = blocking(move || {
        let config = manager.fork_config(&tenant, &id, timeout)?;
        let with_ports = move |template| {
            let mut c = config(template);
            let kept = crate::ports::Kept {
                public: false,
                token: brig_http::random_token(),
                published: Vec::new(),
            };
            c.attrs.insert(
                crate::ports::ATTR.into(),
                serde_json::to_value(&kept).unwrap_or_default(),
            );
            c
        };
        manager.fork(&tenant, &id, req.count.unwrap_or(1), with_ports)
    })
    .await?;
    let out = results
        .into_iter()
        .map(|r| match r {
            Ok(record) => ForkResult::Sandbox {
                sandbox: Box::new(record.into()),
            },
            Err(e) => ForkResult::Error {
                error: fork_error(e),
            },
        })
        .collect();
    Ok((StatusCode::CREATED, Json(out)))
}

fn fork_error(e: ManagerError) -> ForkError {
    let api = ApiError::from(e);
    ForkError {
        code: api.code,
        message: api.message,
    }
}
