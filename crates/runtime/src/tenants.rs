//! Tenants: who owns keys and sandboxes.
//!
//! A tenant is little more than a name today; it is the unit of isolation in
//! the API (a key authenticates as a tenant, and a tenant sees only its own
//! sandboxes).

use std::fmt;

use rusqlite::OptionalExtension;

use crate::store::Cached;
use crate::store::{random_hex_id, Store, StoreError, UnixMillis};

/// The name of the tenant the first start creates.
pub const DEFAULT_TENANT: &str = "default";

/// A tenant's identity: 12 lowercase hex digits.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct TenantId(pub(crate) String);

impl TenantId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A row of `tenants`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Tenant {
    pub id: TenantId,
    pub name: String,
    pub created_at: UnixMillis,
}

/// The longest tenant name.
pub const MAX_TENANT_NAME: usize = 63;

/// Why managing tenants failed.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    #[error(
        "invalid tenant name {name:?}: use 1 to {MAX_TENANT_NAME} lowercase letters, digits, \
         '-', '_' or '.', starting with a letter or digit"
    )]
    BadName { name: String },
    #[error("a tenant named {name:?} exists already")]
    Exists { name: String },
    #[error("no tenant named {name:?} (`brig tenants ls` lists them)")]
    NotFound { name: String },
    #[error("the default tenant holds the admin keys and cannot be removed")]
    Default,
    #[error(
        "tenant {name:?} has {live} live sandboxes: end them first (`brig kill ID` with one of \
         its keys), then remove it"
    )]
    Busy { name: String, live: usize },
    #[error(transparent)]
    Key(#[from] crate::keys::KeyError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl TenantError {
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind;
        match self {
            TenantError::BadName { .. } => ErrorKind::BadRequest,
            TenantError::Exists { .. } | TenantError::Busy { .. } | TenantError::Default => {
                ErrorKind::Conflict
            }
            TenantError::NotFound { .. } => ErrorKind::NotFound,
            TenantError::Key(e) => e.kind(),
            TenantError::Store(e) => e.kind(),
        }
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() <= MAX_TENANT_NAME
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c))
}

impl Store {
    /// Create a tenant. Names are unique.
    pub fn create_tenant(&self, name: &str) -> Result<TenantId, StoreError> {
        let id = TenantId(random_hex_id());
        self.conn
            .execute_cached(
                "INSERT INTO tenants (id, name, created_at) VALUES (?1, ?2, ?3)",
                (&id.0, name, self.now()),
            )
            .map_err(StoreError::query("create tenant"))?;
        Ok(id)
    }

    /// Create a tenant with a checked name (what the API and CLI do).
    pub fn add_tenant(&self, name: &str) -> Result<Tenant, TenantError> {
        if !valid_name(name) {
            return Err(TenantError::BadName {
                name: name.to_string(),
            });
        }
        self.immediate("create tenant", |s| {
            if s.tenant_by_name(name)?.is_some() {
                return Err(TenantError::Exists {
                    name: name.to_string(),
                });
            }
            let id = s.create_tenant(name)?;
            Ok(s.tenant_by_name(name)?.unwrap_or(Tenant {
                id,
                name: name.to_string(),
                created_at: s.now(),
            }))
        })
    }

    /// The tenants, oldest first (removed ones left out).
    pub fn list_tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        let op = "list tenants";
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, name, created_at FROM tenants WHERE removed_at IS NULL
                 ORDER BY created_at, rowid",
            )
            .map_err(StoreError::query(op))?;
        let rows = stmt
            .query_map([], |r| {
                Ok(Tenant {
                    id: TenantId(r.get(0)?),
                    name: r.get(1)?,
                    created_at: r.get(2)?,
                })
            })
            .map_err(StoreError::query(op))?;
        rows.collect::<Result<_, _>>()
            .map_err(StoreError::query(op))
    }

    /// Remove a tenant: its keys are revoked at once, its ended sandboxes'
    /// records stay (under the renamed tenant, `NAME (removed ID)`), and
    /// its name is free again. Refused for the default tenant and while it
    /// has live sandboxes.
    pub fn remove_tenant(&self, name: &str) -> Result<Tenant, TenantError> {
        self.immediate("remove tenant", |s| {
            let tenant = s.tenant_by_name(name)?.ok_or_else(|| TenantError::NotFound {
                name: name.to_string(),
            })?;
            if name == DEFAULT_TENANT {
                return Err(TenantError::Default);
            }
            let live: i64 = s
                .conn
                .query_row_cached(
                    "SELECT count(*) FROM sandboxes WHERE tenant_id = ?1
                     AND state IN ('creating', 'running', 'paused')",
                    [tenant.id.as_str()],
                    |r| r.get(0),
                )
                .map_err(StoreError::query("count a tenant's live sandboxes"))?;
            if live > 0 {
                return Err(TenantError::Busy {
                    name: name.to_string(),
                    live: live as usize,
                });
            }
            let now = s.now();
            s.conn
                .execute_cached(
                    "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?2) WHERE tenant_id = ?1",
                    (tenant.id.as_str(), now),
                )
                .map_err(StoreError::query("revoke a tenant's keys"))?;
            s.conn
                .execute_cached(
                    "UPDATE tenants SET removed_at = ?2, name = name || ' (removed ' || id || ')'
                     WHERE id = ?1",
                    (tenant.id.as_str(), now),
                )
                .map_err(StoreError::query("remove tenant"))?;
            Ok(tenant)
        })
    }

    /// A tenant's name, if it exists.
    pub fn tenant_name(&self, id: &TenantId) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row_cached(
                "SELECT name FROM tenants WHERE id = ?1",
                [id.as_str()],
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::query("look up tenant"))
    }

    /// Look a tenant up by name (a live one).
    pub fn tenant_by_name(&self, name: &str) -> Result<Option<Tenant>, StoreError> {
        self.conn
            .query_row_cached(
                "SELECT id, name, created_at FROM tenants WHERE name = ?1 AND removed_at IS NULL",
                [name],
                |r| {
                    Ok(Tenant {
                        id: TenantId(r.get(0)?),
                        name: r.get(1)?,
                        created_at: r.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(StoreError::query("look up tenant"))
    }
}
