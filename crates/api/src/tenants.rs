//! `/v1/tenants`: who owns keys and sandboxes — create (with the tenant's
//! first key, shown once), list, remove. Admin keys only (`keys.rs` says
//! who holds one).

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};

use super::keys::with_store;
use super::{ApiError, AppState};
use brig_http::Caller;
use brig_runtime::keys::KeyId;
use brig_runtime::{NewKey, Principal, Tenant, TenantError, TenantId, UnixMillis};

/// The body of `POST /v1/tenants`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTenantConfig {
    /// Lowercase letters, digits, `-`, `_`, `.`; at most 63.
    pub name: String,
}

#[derive(Debug, Serialize)]
pub struct TenantView {
    pub id: TenantId,
    pub name: String,
    pub created_at: UnixMillis,
}

impl From<Tenant> for TenantView {
    fn from(t: Tenant) -> TenantView {
        TenantView {
            id: t.id,
            name: t.name,
            created_at: t.created_at,
        }
    }
}

/// A new tenant and its first key (the only time that key is shown).
#[derive(Debug, Serialize)]
pub struct CreatedTenant {
    #[serde(flatten)]
    pub tenant: TenantView,
    pub key: FirstKey,
}

#[derive(Debug, Serialize)]
pub struct FirstKey {
    pub id: KeyId,
    pub key: String,
}

#[derive(Debug, Serialize)]
pub struct TenantList {
    pub items: Vec<TenantView>,
}

fn admin_only(caller: &Principal) -> Result<(), ApiError> {
    if caller.is_admin() {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "managing tenants needs an admin key (the key `brig serve` wrote to local.key is one)",
    ))
}

pub async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Result<Json<CreateTenantConfig>, JsonRejection>,
) -> Result<(StatusCode, Json<CreatedTenant>), ApiError> {
    admin_only(&caller)?;
    let name = body?.0.name;
    let (tenant, key) = with_store(&state, move |s| {
        let tenant = s.add_tenant(&name)?;
        let (info, key) = s.create_key_with(
            &tenant.id,
            &NewKey {
                name: Some("first key"),
                ..NewKey::default()
            },
        )?;
        Ok::<_, TenantError>((tenant, FirstKey { id: info.id, key }))
    })
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(CreatedTenant {
            tenant: tenant.into(),
            key,
        }),
    ))
}

pub async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<TenantList>, ApiError> {
    admin_only(&caller)?;
    let tenants = with_store(&state, |s| s.list_tenants().map_err(TenantError::from)).await?;
    Ok(Json(TenantList {
        items: tenants.into_iter().map(TenantView::from).collect(),
    }))
}

pub async fn remove(
    State(state): State<AppState>,
    Caller(caller): Caller,
    name: Result<Path<String>, PathRejection>,
) -> Result<Json<TenantView>, ApiError> {
    admin_only(&caller)?;
    let name = name?.0;
    let removed = with_store(&state, move |s| s.remove_tenant(&name)).await?;
    Ok(Json(removed.into()))
}
