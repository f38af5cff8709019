//! Tenants: who owns keys and sandboxes.
//!
//! A tenant is little more than a name today; it is the unit of isolation in
//! the API (a key authenticates as a tenant, and a tenant sees only its own
//! sandboxes).

use std::fmt;

use rusqlite::OptionalExtension;

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

impl Store {
    /// Create a tenant. Names are unique.
    pub fn create_tenant(&self, name: &str) -> Result<TenantId, StoreError> {
        let id = TenantId(random_hex_id());
        self.conn
            .execute(
                "INSERT INTO tenants (id, name, created_at) VALUES (?1, ?2, ?3)",
                (&id.0, name, self.now()),
            )
            .map_err(StoreError::query("create tenant"))?;
        Ok(id)
    }

    /// Look a tenant up by name.
    pub fn tenant_by_name(&self, name: &str) -> Result<Option<Tenant>, StoreError> {
        self.conn
            .query_row(
                "SELECT id, name, created_at FROM tenants WHERE name = ?1",
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
