//! `/v1/keys`: a tenant's API keys — create (the one time a secret is
//! shown), list (never secrets nor hashes), revoke.
//!
//! Every call acts on the caller's tenant only: another tenant's key is
//! "not found", exactly like a missing one, so ids cannot be probed.
//! Revoking the key the request came with is allowed (the next request with
//! it gets 401); revoking the tenant's last active key is refused with 409,
//! since a tenant without a key could never create another.

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState, Auth};
use brig_runtime::keys::{KeyError, KeyId, KeyInfo};
use brig_runtime::UnixMillis;

/// The body of `POST /v1/keys`; the body itself is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyConfig {
    /// A label for people (`brig keys ls`), at most 64 characters.
    pub name: Option<String>,
}

/// A key as listing shows it.
#[derive(Debug, Serialize)]
pub struct KeyView {
    pub id: KeyId,
    pub name: Option<String>,
    pub created_at: UnixMillis,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<UnixMillis>,
}

impl From<KeyInfo> for KeyView {
    fn from(k: KeyInfo) -> KeyView {
        KeyView {
            id: k.id,
            name: k.name,
            created_at: k.created_at,
            last_used_at: k.last_used_at,
        }
    }
}

/// The answer to `POST /v1/keys`: the only time `key` is ever shown.
#[derive(Debug, Serialize)]
pub struct CreatedKey {
    pub id: KeyId,
    pub key: String,
    pub name: Option<String>,
    pub created_at: UnixMillis,
}

#[derive(Debug, Serialize)]
pub struct KeyList {
    pub items: Vec<KeyView>,
}

/// Run a store call off the async workers.
async fn with_store<T: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&brig_runtime::Store) -> Result<T, KeyError> + Send + 'static,
) -> Result<T, ApiError> {
    let manager = state.manager.clone();
    Ok(tokio::task::spawn_blocking(move || f(&manager.store())).await??)
}

pub async fn create(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    body: Result<Option<Json<CreateKeyConfig>>, JsonRejection>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    let config = body?.map(|Json(c)| c).unwrap_or_default();
    let (info, key) = with_store(&state, move |s| {
        s.create_named_key(&tenant, config.name.as_deref())
    })
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            id: info.id,
            key,
            name: info.name,
            created_at: info.created_at,
        }),
    ))
}

pub async fn list(
    State(state): State<AppState>,
    Auth(tenant): Auth,
) -> Result<Json<KeyList>, ApiError> {
    let keys = with_store(&state, move |s| Ok(s.list_keys(&tenant)?)).await?;
    let items = keys
        .into_iter()
        .filter(|k| k.revoked_at.is_none())
        .map(KeyView::from)
        .collect();
    Ok(Json(KeyList { items }))
}

pub async fn revoke(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let raw = id?.0;
    let id = KeyId::parse(&raw)
        .ok_or_else(|| ApiError::not_found(format!("no api key {raw} for this tenant")))?;
    with_store(&state, move |s| s.revoke_key_unless_last(&tenant, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}
