//! `/v1/keys`: API keys — create (the one time a secret is shown), list
//! (never secrets nor hashes), revoke — and who may do which.
//!
//! A key has a role. A **tenant** key manages its own tenant's sandboxes
//! and its tenant's tenant keys: another tenant's key is "not found",
//! exactly like a missing one, so ids cannot be probed. An **admin** key
//! (the one `brig serve` wrote to `local.key`) also manages tenants
//! (`tenants.rs`) and any tenant's keys (`?tenant=NAME` or `all` when
//! listing, `"tenant"` and `"role"` when creating). The store enforces
//! the rules (`Store::create_key_as`, `Store::revoke_key_as`): a tenant's
//! last active key and the last admin key cannot be revoked, so nobody is
//! locked out through the API (and an operator who is, by other means,
//! recovers with `brig keys create --local` on the daemon's host).

use std::collections::HashMap;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{ApiError, AppState};
use brig_http::Caller;
use brig_runtime::keys::{KeyError, KeyId, KeyInfo};
use brig_runtime::{NewKey, Principal, Role, Store, TenantId, UnixMillis};

/// The body of `POST /v1/keys`; the body itself is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyConfig {
    /// A label for people (`brig keys ls`), at most 64 characters.
    pub name: Option<String>,
    /// Another tenant's name (admin keys only); default: the caller's.
    pub tenant: Option<String>,
    /// `tenant` (default) or `admin` (admin keys only).
    pub role: Option<Role>,
    /// How long it works, e.g. `30d`, `12h`; default: until revoked.
    pub expires: Option<String>,
}

/// A key as listing shows it.
#[derive(Debug, Serialize)]
pub struct KeyView {
    pub id: KeyId,
    pub name: Option<String>,
    pub role: Role,
    /// Its tenant's name.
    pub tenant: String,
    pub created_at: UnixMillis,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<UnixMillis>,
}

impl KeyView {
    fn new(k: KeyInfo, tenant: String) -> KeyView {
        KeyView {
            id: k.id,
            name: k.name,
            role: k.role,
            tenant,
            created_at: k.created_at,
            expires_at: k.expires_at,
            last_used_at: k.last_used_at,
        }
    }
}

/// The answer to `POST /v1/keys`: the only time `key` is ever shown.
#[derive(Debug, Serialize)]
pub struct CreatedKey {
    pub id: KeyId,
    pub key: String,
    /// The same key as E2B's clients take it (`e2b_` and hex digits).
    pub e2b_key: String,
    pub name: Option<String>,
    pub role: Role,
    pub tenant: String,
    pub created_at: UnixMillis,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<UnixMillis>,
}

#[derive(Debug, Serialize)]
pub struct KeyList {
    pub items: Vec<KeyView>,
}

/// `GET /v1/keys?tenant=NAME|all`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyListQuery {
    pub tenant: Option<String>,
}

/// Run a store call off the async workers.
pub(crate) async fn with_store<T: Send + 'static, E: Send + 'static>(
    state: &AppState,
    f: impl FnOnce(&Store) -> Result<T, E> + Send + 'static,
) -> Result<T, ApiError>
where
    ApiError: From<E>,
{
    let manager = state.manager.clone();
    Ok(tokio::task::spawn_blocking(move || f(&manager.store())).await??)
}

/// A tenant by name, as `caller` may name it: a tenant key only its own.
fn tenant_named(s: &Store, caller: &Principal, name: &str) -> Result<TenantId, KeyError> {
    match s.tenant_by_name(name)? {
        Some(t) if caller.is_admin() || t.id == caller.tenant => Ok(t.id),
        // Whether another tenant exists is no tenant key's business.
        _ if !caller.is_admin() => Err(KeyError::Forbidden {
            what: format!("managing the keys of tenant {name:?}"),
        }),
        _ => Err(KeyError::UnknownTenant {
            name: name.to_string(),
        }),
    }
}

pub async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Result<Option<Json<CreateKeyConfig>>, JsonRejection>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    let config = body?.map(|Json(c)| c).unwrap_or_default();
    let expires_in = config
        .expires
        .as_deref()
        .map(|e| {
            brig_core::parse_duration(e).map_err(|err| {
                ApiError::bad_request(format!("expires: {err} (for example \"30d\")"))
            })
        })
        .transpose()?;
    let (info, key, tenant_name) = with_store(&state, move |s| {
        let tenant = match config.tenant.as_deref() {
            Some(name) => tenant_named(s, &caller, name)?,
            None => caller.tenant.clone(),
        };
        let new = NewKey {
            name: config.name.as_deref(),
            role: config.role,
            expires_in,
        };
        let (info, key) = s.create_key_as(&caller, &tenant, &new)?;
        let name = s.tenant_name(&tenant)?.unwrap_or_default();
        Ok::<_, KeyError>((info, key, name))
    })
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedKey {
            id: info.id,
            e2b_key: brig_runtime::e2b_spelling(&key).unwrap_or_default(),
            key,
            name: info.name,
            role: info.role,
            tenant: tenant_name,
            created_at: info.created_at,
            expires_at: info.expires_at,
        }),
    ))
}

pub async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    query: Result<Query<KeyListQuery>, QueryRejection>,
) -> Result<Json<KeyList>, ApiError> {
    let which = query.map_err(ApiError::from)?.0.tenant;
    let items = with_store(&state, move |s| {
        let keys = match which.as_deref() {
            Some("all") if caller.is_admin() => s.list_all_keys()?,
            Some("all") => {
                return Err(KeyError::Forbidden {
                    what: "listing every tenant's keys".into(),
                })
            }
            Some(name) => s.list_keys(&tenant_named(s, &caller, name)?)?,
            None => s.list_keys(&caller.tenant)?,
        };
        let mut names: HashMap<TenantId, String> = HashMap::new();
        let mut items = Vec::new();
        for k in keys.into_iter().filter(|k| k.revoked_at.is_none()) {
            if !names.contains_key(&k.tenant) {
                let name = s.tenant_name(&k.tenant)?.unwrap_or_default();
                names.insert(k.tenant.clone(), name);
            }
            let name = names[&k.tenant].clone();
            items.push(KeyView::new(k, name));
        }
        Ok(items)
    })
    .await?;
    Ok(Json(KeyList { items }))
}

pub async fn revoke(
    State(state): State<AppState>,
    Caller(caller): Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let raw = id?.0;
    let id = KeyId::parse(&raw)
        .ok_or_else(|| ApiError::not_found(format!("no api key {raw} for this tenant")))?;
    with_store(&state, move |s| s.revoke_key_as(&caller, &id)).await?;
    Ok(StatusCode::NO_CONTENT)
}
