//! `/v1/secrets`: a tenant's write-only secrets (`brig_runtime::secrets`):
//! set (create, or a new version), list, show, remove. No answer ever
//! carries a value; every one says `Cache-Control: no-store`.

use std::collections::BTreeMap;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::keys::with_store;
use super::{ApiError, AppState, Auth};
use brig_runtime::SecretInfo;

/// The body of `PUT /v1/secrets/{name}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetSecret {
    /// The value (UTF-8 text, at most 64 KiB).
    pub value: String,
    /// Replaces the secret's metadata when given.
    pub metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
pub struct ListQuery {
    /// A page after this name.
    pub after: Option<String>,
    /// At most this many (1 to 1000; default 100).
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize)]
pub struct SecretList {
    pub items: Vec<SecretInfo>,
    /// The `after` of the next page, if there is one.
    pub next: Option<String>,
}

fn no_store(status: StatusCode, body: impl Serialize) -> Response {
    let mut r = (status, Json(body)).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// `PUT /v1/secrets/{name}`: 201 with a new secret, 200 with the next
/// version of one there.
pub async fn set(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    name: Result<Path<String>, PathRejection>,
    body: Result<Json<SetSecret>, JsonRejection>,
) -> Result<Response, ApiError> {
    let name = name?.0;
    let SetSecret { value, metadata } = body?.0;
    let (info, created) = with_store(&state, move |s| {
        s.set_secret(&tenant, &name, value.as_bytes(), metadata.as_ref())
    })
    .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(no_store(status, info))
}

/// `GET /v1/secrets[?after=NAME&limit=N]`: names and metadata, in name order.
pub async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let query = query?.0;
    let limit = query.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "invalid limit {limit}: from 1 to 1000"
        )));
    }
    let after = query.after;
    let mut items = with_store(&state, move |s| {
        s.list_secrets(&tenant, after.as_deref(), limit + 1)
    })
    .await?;
    let next = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|i| i.name.clone())
    } else {
        None
    };
    Ok(no_store(StatusCode::OK, SecretList { items, next }))
}

/// `GET /v1/secrets/{name}`: its metadata (never its value).
pub async fn get(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = name?.0;
    let info = with_store(&state, move |s| s.secret_info(&tenant, &name)).await?;
    Ok(no_store(StatusCode::OK, info))
}

/// `DELETE /v1/secrets/{name}`: 204.
pub async fn delete(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    name: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = name?.0;
    with_store(&state, move |s| s.delete_secret(&tenant, &name)).await?;
    let mut r = StatusCode::NO_CONTENT.into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}
