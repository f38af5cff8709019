//! E2B's Secrets API (`Secret.create/list/get_info/update/destroy` of the
//! official clients) on brig's secrets (`brig_runtime::secrets`): the same
//! store as `/v1/secrets` and `brig secrets`, per tenant. Values are
//! write-only: no answer carries one, and every answer says
//! `Cache-Control: no-store`.
//!
//! | route | answer |
//! |---|---|
//! | `POST /secrets {name, value, metadata?}` | 201 `Secret`; 409 if the name is taken |
//! | `GET /secrets?limit=1..100&nextToken=` | 200 `[Secret]`, the next page's token in `X-Next-Token` |
//! | `GET /secrets/{id}` | 200 `Secret` (`{id}`: a `sec_…` id or a name) |
//! | `POST /secrets/{id} {value, metadata?}` | 200 `Secret`, the next version; metadata kept if absent, replaced if given |
//! | `DELETE /secrets/{id}` | 204 |

use std::collections::BTreeMap;

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::time::rfc3339;
use super::wire::{self, E2bError};
use super::ApiKey;
use crate::E2bState;
use brig_runtime::{SecretError, SecretInfo};

/// `Secret`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Secret {
    #[serde(rename = "secretID")]
    secret_id: String,
    name: String,
    current_version: u32,
    metadata: BTreeMap<String, String>,
    created_at: String,
    updated_at: String,
}

impl From<SecretInfo> for Secret {
    fn from(i: SecretInfo) -> Secret {
        Secret {
            secret_id: i.id,
            name: i.name,
            current_version: i.version,
            metadata: i.metadata,
            created_at: rfc3339(i.created_at),
            updated_at: rfc3339(i.updated_at),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct NewSecret {
    name: Option<String>,
    value: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
struct SecretUpdate {
    value: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
}

impl From<SecretError> for E2bError {
    fn from(e: SecretError) -> E2bError {
        E2bError::from_kind(e.kind(), brig_runtime::chain(&e))
    }
}

fn no_store(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// A `{id}` that looks like an id must be one.
fn check_key(key: &str) -> Result<(), E2bError> {
    if let Some(hex) = key.strip_prefix("sec_") {
        if hex.len() != 24 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(E2bError::bad_request(format!(
                "invalid secret id {key:?}: an id is sec_ and 24 hex digits; or give the name"
            )));
        }
    }
    Ok(())
}

fn value_of(value: Option<String>) -> Result<String, E2bError> {
    value.ok_or_else(|| E2bError::bad_request("value is required"))
}

async fn store<T: Send + 'static>(
    state: &E2bState,
    f: impl FnOnce(&brig_runtime::Store) -> Result<T, SecretError> + Send + 'static,
) -> Result<T, E2bError> {
    let manager = state.manager.clone();
    tokio::task::spawn_blocking(move || f(&manager.store()))
        .await
        .map_err(E2bError::from)?
        .map_err(E2bError::from)
}

/// `POST /secrets`.
pub async fn create(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: NewSecret = wire::body(&body)?;
    let name = req
        .name
        .ok_or_else(|| E2bError::bad_request("name is required"))?;
    let value = value_of(req.value)?;
    let meta = req.metadata.unwrap_or_default();
    let info = store(&state, move |s| {
        s.create_secret(&tenant, &name, value.as_bytes(), &meta)
    })
    .await?;
    Ok(no_store(
        (StatusCode::CREATED, Json(Secret::from(info))).into_response(),
    ))
}

/// `GET /secrets`.
pub async fn list(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    RawQuery(query): RawQuery,
) -> Result<Response, E2bError> {
    let mut limit = 100usize;
    let mut after = None;
    for (k, v) in
        serde_urlencoded::from_str::<Vec<(String, String)>>(query.as_deref().unwrap_or(""))
            .map_err(|e| E2bError::bad_request(format!("invalid query: {e}")))?
    {
        match k.as_str() {
            "limit" => limit = wire::page_limit(&v)?,
            "nextToken" => after = Some(v),
            _ => {}
        }
    }
    let mut items = store(&state, move |s| {
        s.list_secrets(&tenant, after.as_deref(), limit + 1)
    })
    .await?;
    let next = (items.len() > limit).then(|| {
        items.truncate(limit);
        items.last().map(|i| i.name.clone()).unwrap_or_default()
    });
    let body: Vec<Secret> = items.into_iter().map(Secret::from).collect();
    let mut r = Json(body).into_response();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert("x-next-token", next);
    }
    Ok(no_store(r))
}

/// `GET /secrets/{id}`.
pub async fn get(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(key): Path<String>,
) -> Result<Response, E2bError> {
    check_key(&key)?;
    let info = store(&state, move |s| s.secret_info(&tenant, &key)).await?;
    Ok(no_store(Json(Secret::from(info)).into_response()))
}

/// `POST /secrets/{id}`.
pub async fn update(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(key): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    check_key(&key)?;
    let req: SecretUpdate = wire::body(&body)?;
    let value = value_of(req.value)?;
    let info = store(&state, move |s| {
        s.update_secret(&tenant, &key, value.as_bytes(), req.metadata.as_ref())
    })
    .await?;
    Ok(no_store(Json(Secret::from(info)).into_response()))
}

/// `DELETE /secrets/{id}`.
pub async fn delete(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(key): Path<String>,
) -> Result<Response, E2bError> {
    check_key(&key)?;
    store(&state, move |s| s.delete_secret(&tenant, &key)).await?;
    Ok(no_store(StatusCode::NO_CONTENT.into_response()))
}
