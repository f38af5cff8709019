//! Secrets: named values a tenant stores for brig to use on its behalf,
//! never handed back. No read surface returns a value: [`SecretInfo`] has
//! none, and only [`Store::secret_value`] (the runtime's own, for the
//! egress proxy) reads one.
//!
//! A secret is known by its name (1 to 128 of `A-Z a-z 0-9 _ -`, kept
//! lower-cased, E2B's rule) or its id (`sec_` and 24 hex digits). Each
//! new value is a new version; metadata (string pairs, E2B's) is kept with
//! it. Values are stored in the daemon's database as given: whoever can
//! read the database (root on the host) can read them.

use std::collections::BTreeMap;

use rusqlite::OptionalExtension;

use crate::store::Cached;
use crate::store::{Store, StoreError, UnixMillis};
use crate::TenantId;

/// The longest secret name.
pub const MAX_NAME: usize = 128;
/// The largest value, in bytes.
pub const MAX_VALUE: usize = 64 * 1024;
/// Metadata limits (E2B's): keys, bytes per key, per value, in all.
pub const MAX_META_KEYS: usize = 32;
pub const MAX_META_KEY: usize = 128;
pub const MAX_META_VALUE: usize = 1024;
pub const MAX_META_TOTAL: usize = 8192;
/// Secrets per tenant.
pub const MAX_SECRETS: usize = 1000;

/// What is known of a secret: everything but its value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SecretInfo {
    pub id: String,
    pub name: String,
    /// 1 for a new secret; each new value adds one.
    pub version: u32,
    pub metadata: BTreeMap<String, String>,
    pub created_at: UnixMillis,
    pub updated_at: UnixMillis,
}

/// Why a secret operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "invalid secret name {0:?}: use 1 to {MAX_NAME} letters, digits, '_' or '-' \
         (not starting with sec_)"
    )]
    BadName(String),
    #[error("secret value of {0} bytes is too large: at most {MAX_VALUE} bytes")]
    TooLarge(usize),
    #[error("a secret value may not be empty")]
    Empty,
    #[error("invalid secret metadata: {0}")]
    BadMetadata(String),
    #[error("a secret named {0:?} exists already: update it, or remove it first")]
    Exists(String),
    #[error("no secret {0:?}")]
    NotFound(String),
    #[error("this tenant has {MAX_SECRETS} secrets, the most it may keep: remove some first")]
    TooMany,
    #[error(
        "{0} secrets given to one sandbox: at most {MAX_OWN} (store more with brig secrets set)"
    )]
    TooManyOwn(usize),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SecretError {
    pub fn kind(&self) -> crate::ErrorKind {
        use crate::ErrorKind as K;
        match self {
            SecretError::BadName(_)
            | SecretError::TooLarge(_)
            | SecretError::Empty
            | SecretError::BadMetadata(_)
            | SecretError::TooManyOwn(_) => K::BadRequest,
            SecretError::Exists(_) | SecretError::TooMany => K::Conflict,
            SecretError::NotFound(_) => K::NotFound,
            SecretError::Store(e) => e.kind(),
        }
    }
}

/// A name as kept: trimmed and lower-cased, or why it cannot be one.
pub fn normalize_name(name: &str) -> Result<String, SecretError> {
    let n = name.trim().to_ascii_lowercase();
    let ok = !n.is_empty()
        && n.len() <= MAX_NAME
        && !n.starts_with("sec_")
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(n)
    } else {
        Err(SecretError::BadName(name.to_string()))
    }
}

fn check_value(value: &[u8]) -> Result<(), SecretError> {
    if value.is_empty() {
        return Err(SecretError::Empty);
    }
    if value.len() > MAX_VALUE {
        return Err(SecretError::TooLarge(value.len()));
    }
    Ok(())
}

/// Metadata within E2B's limits.
pub fn check_metadata(meta: &BTreeMap<String, String>) -> Result<(), SecretError> {
    let bad = |m: String| Err(SecretError::BadMetadata(m));
    if meta.len() > MAX_META_KEYS {
        return bad(format!("{} keys (at most {MAX_META_KEYS})", meta.len()));
    }
    let mut total = 0;
    for (k, v) in meta {
        if k.is_empty() || k.len() > MAX_META_KEY {
            return bad(format!("key {k:?} must be 1 to {MAX_META_KEY} bytes"));
        }
        if v.len() > MAX_META_VALUE {
            return bad(format!("the value of {k:?} is over {MAX_META_VALUE} bytes"));
        }
        total += k.len() + v.len();
    }
    if total > MAX_META_TOTAL {
        return bad(format!("{total} bytes in all (at most {MAX_META_TOTAL})"));
    }
    Ok(())
}

fn new_id() -> String {
    use rand::Rng;
    format!("sec_{:024x}", rand::rngs::OsRng.gen::<u128>() >> 32)
}

const COLUMNS: &str = "id, name, version, metadata_json, created_at, updated_at";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SecretInfo> {
    let meta: String = r.get(3)?;
    Ok(SecretInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        version: r.get(2)?,
        metadata: serde_json::from_str(&meta).unwrap_or_default(),
        created_at: r.get(4)?,
        updated_at: r.get(5)?,
    })
}

impl Store {
    /// A new secret, version 1.
    pub fn create_secret(
        &self,
        tenant: &TenantId,
        name: &str,
        value: &[u8],
        metadata: &BTreeMap<String, String>,
    ) -> Result<SecretInfo, SecretError> {
        let name = normalize_name(name)?;
        check_value(value)?;
        check_metadata(metadata)?;
        self.immediate("create secret", |s| {
            if s.find_secret(tenant, &name)?.is_some() {
                return Err(SecretError::Exists(name.clone()));
            }
            let count: i64 = s
                .conn
                .query_row_cached(
                    "SELECT count(*) FROM secrets WHERE tenant_id = ?1",
                    [tenant.as_str()],
                    |r| r.get(0),
                )
                .map_err(StoreError::query("count secrets"))?;
            if count as usize >= MAX_SECRETS {
                return Err(SecretError::TooMany);
            }
            let now = s.now();
            let meta = serde_json::to_string(metadata).unwrap_or_else(|_| "{}".into());
            s.conn
                .execute_cached(
                    "INSERT INTO secrets (id, tenant_id, name, value, version, metadata_json,
                                          created_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?6)",
                    (new_id(), tenant.as_str(), &name, value, meta, now),
                )
                .map_err(StoreError::query("create secret"))?;
            s.find_secret(tenant, &name)?
                .ok_or_else(|| SecretError::NotFound(name.clone()))
        })
    }

    /// A new value for secret `key` (id or name), as its next version;
    /// `metadata`: `None` keeps what it had, `Some` replaces it.
    pub fn update_secret(
        &self,
        tenant: &TenantId,
        key: &str,
        value: &[u8],
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<SecretInfo, SecretError> {
        check_value(value)?;
        if let Some(m) = metadata {
            check_metadata(m)?;
        }
        self.immediate("update secret", |s| {
            let found = s
                .find_secret(tenant, key)?
                .ok_or_else(|| SecretError::NotFound(key.to_string()))?;
            let meta = metadata.map_or_else(
                || serde_json::to_string(&found.metadata),
                serde_json::to_string,
            );
            s.conn
                .execute_cached(
                    "UPDATE secrets SET value = ?1, version = version + 1, metadata_json = ?2,
                            updated_at = ?3
                     WHERE id = ?4",
                    (
                        value,
                        meta.unwrap_or_else(|_| "{}".into()),
                        s.now(),
                        &found.id,
                    ),
                )
                .map_err(StoreError::query("update secret"))?;
            s.find_secret(tenant, &found.id)?
                .ok_or_else(|| SecretError::NotFound(key.to_string()))
        })
    }

    /// Set secret `name` to `value`: a new secret, or the next version of
    /// the one there (`brig secrets set`, `PUT /v1/secrets/{name}`);
    /// `metadata` as in [`Store::update_secret`]. `true` if it was new.
    pub fn set_secret(
        &self,
        tenant: &TenantId,
        name: &str,
        value: &[u8],
        metadata: Option<&BTreeMap<String, String>>,
    ) -> Result<(SecretInfo, bool), SecretError> {
        let name = normalize_name(name)?;
        match self.update_secret(tenant, &name, value, metadata) {
            Err(SecretError::NotFound(_)) => self
                .create_secret(tenant, &name, value, metadata.unwrap_or(&BTreeMap::new()))
                .map(|info| (info, true)),
            other => other.map(|info| (info, false)),
        }
    }

    /// Secret `key` (id or name) of `tenant`, without its value.
    pub fn secret_info(&self, tenant: &TenantId, key: &str) -> Result<SecretInfo, SecretError> {
        self.find_secret(tenant, key)?
            .ok_or_else(|| SecretError::NotFound(key.to_string()))
    }

    /// A page of `tenant`'s secrets in name order, after `after` (a name).
    pub fn list_secrets(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SecretInfo>, SecretError> {
        let op = "list secrets";
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM secrets WHERE tenant_id = ?1 AND name > ?2
                 ORDER BY name LIMIT ?3"
            ))
            .map_err(StoreError::query(op))?;
        let rows = stmt
            .query_map((tenant.as_str(), after.unwrap_or(""), limit as i64), row)
            .map_err(StoreError::query(op))?;
        Ok(rows
            .collect::<Result<_, _>>()
            .map_err(StoreError::query(op))?)
    }

    /// Remove secret `key` (id or name) and every version of it.
    pub fn delete_secret(&self, tenant: &TenantId, key: &str) -> Result<SecretInfo, SecretError> {
        self.immediate("delete secret", |s| {
            let found = s
                .find_secret(tenant, key)?
                .ok_or_else(|| SecretError::NotFound(key.to_string()))?;
            s.conn
                .execute_cached("DELETE FROM secrets WHERE id = ?1", [&found.id])
                .map_err(StoreError::query("delete secret"))?;
            Ok(found)
        })
    }

    /// The current value of `tenant`'s secret `name`: for the runtime's own
    /// use (the egress proxy), never for a client.
    pub fn secret_value(
        &self,
        tenant: &TenantId,
        name: &str,
    ) -> Result<Option<Vec<u8>>, SecretError> {
        let Ok(name) = normalize_name(name) else {
            return Ok(None);
        };
        Ok(self
            .conn
            .query_row_cached(
                "SELECT value FROM secrets WHERE tenant_id = ?1 AND name = ?2",
                (tenant.as_str(), &name),
                |r| r.get(0),
            )
            .optional()
            .map_err(StoreError::query("read secret"))?)
    }

    fn find_secret(&self, tenant: &TenantId, key: &str) -> Result<Option<SecretInfo>, SecretError> {
        let by_id = key.starts_with("sec_");
        let key = if by_id {
            key.to_string()
        } else {
            match normalize_name(key) {
                Ok(k) => k,
                Err(_) => return Ok(None),
            }
        };
        let column = if by_id { "id" } else { "name" };
        Ok(self
            .conn
            .query_row_cached(
                &format!("SELECT {COLUMNS} FROM secrets WHERE tenant_id = ?1 AND {column} = ?2"),
                (tenant.as_str(), &key),
                row,
            )
            .optional()
            .map_err(StoreError::query("read secret"))?)
    }
}

/// The secrets as the egress proxy reads them (header injection): a
/// database connection of its own, opened on first use, shared by every
/// sandbox of the daemon.
#[derive(Debug)]
pub(crate) struct SecretReader {
    path: std::path::PathBuf,
    store: std::sync::Mutex<Option<Store>>,
}

impl SecretReader {
    pub(crate) fn new(path: std::path::PathBuf) -> SecretReader {
        SecretReader {
            path,
            store: std::sync::Mutex::default(),
        }
    }

    fn value(&self, tenant: &TenantId, name: &str) -> Option<Vec<u8>> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        if store.is_none() {
            *store = Store::open(&self.path)
                .map_err(|e| tracing::warn!("header injection cannot read secrets: {e}"))
                .ok();
        }
        store.as_ref()?.secret_value(tenant, name).ok().flatten()
    }
}

/// Where a sandbox's own secrets (`brig create --secret`) are kept on its
/// record: in its attrs, never shown by any answer.
pub(crate) const OWN_ATTR: &str = "secrets";
/// The most secrets one sandbox may be given at create.
pub const MAX_OWN: usize = 64;

/// A sandbox's secrets, for its injections: those it was created with,
/// then its tenant's.
pub(crate) struct TenantSecrets {
    pub(crate) reader: std::sync::Arc<SecretReader>,
    pub(crate) tenant: TenantId,
    pub(crate) own: BTreeMap<String, String>,
}

impl TenantSecrets {
    /// The sandbox's own secrets as its record keeps them.
    pub(crate) fn own_from(
        attrs: &serde_json::Map<String, serde_json::Value>,
    ) -> BTreeMap<String, String> {
        attrs
            .get(OWN_ATTR)
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default()
    }
}

impl brig_net::inject::SecretSource for TenantSecrets {
    fn secret(&self, name: &str) -> Option<Vec<u8>> {
        match self.own.get(name) {
            Some(v) => Some(v.clone().into_bytes()),
            None => self.reader.value(&self.tenant, name),
        }
    }
}

/// A create's own secrets, checked (names as the store takes them, values
/// within its limit, at most [`MAX_OWN`]) and keyed by their lower-cased
/// names.
pub fn check_own(
    given: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, SecretError> {
    if given.len() > MAX_OWN {
        return Err(SecretError::TooManyOwn(given.len()));
    }
    let mut out = BTreeMap::new();
    for (name, value) in given {
        let name = normalize_name(name)?;
        if value.is_empty() {
            return Err(SecretError::Empty);
        }
        if value.len() > MAX_VALUE {
            return Err(SecretError::TooLarge(value.len()));
        }
        out.insert(name, value.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store, TenantId) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("brig.db")).unwrap();
        let tenant = store.create_tenant("t").unwrap();
        (dir, store, tenant)
    }

    #[test]
    fn secrets_are_kept_versioned_and_never_shown() {
        let (_d, s, t) = store();
        let meta = BTreeMap::from([("team".to_string(), "ml".to_string())]);
        let a = s.create_secret(&t, " OpenAI_Key ", b"sk-1", &meta).unwrap();
        assert_eq!(a.name, "openai_key");
        assert_eq!(a.version, 1);
        assert!(a.id.starts_with("sec_") && a.id.len() == 28, "{}", a.id);
        assert!(matches!(
            s.create_secret(&t, "openai_key", b"x", &BTreeMap::new()),
            Err(SecretError::Exists(_))
        ));
        // By name or id; metadata kept unless replaced.
        let b = s.update_secret(&t, &a.id, b"sk-2", None).unwrap();
        assert_eq!((b.version, b.metadata.clone()), (2, meta));
        let c = s
            .update_secret(&t, "OPENAI_KEY", b"sk-3", Some(&BTreeMap::new()))
            .unwrap();
        assert_eq!((c.version, c.metadata.len()), (3, 0));
        assert_eq!(s.secret_value(&t, "openai_key").unwrap().unwrap(), b"sk-3");
        // What the read surfaces give has no value in it.
        let shown = serde_json::to_string(&s.secret_info(&t, "openai_key").unwrap()).unwrap();
        assert!(!shown.contains("sk-"), "{shown}");
        // Another tenant sees nothing of it.
        let other = s.create_tenant("u").unwrap();
        assert!(matches!(
            s.secret_info(&other, "openai_key"),
            Err(SecretError::NotFound(_))
        ));
        assert_eq!(s.secret_value(&other, "openai_key").unwrap(), None);
        // set: creates, then adds versions.
        assert!(s.set_secret(&t, "b", b"1", None).unwrap().1);
        assert_eq!(s.set_secret(&t, "b", b"2", None).unwrap().0.version, 2);
        let names: Vec<String> = s
            .list_secrets(&t, None, 10)
            .unwrap()
            .into_iter()
            .map(|i| i.name)
            .collect();
        assert_eq!(names, ["b", "openai_key"]);
        assert_eq!(s.list_secrets(&t, Some("b"), 10).unwrap().len(), 1);
        s.delete_secret(&t, "b").unwrap();
        assert!(matches!(
            s.delete_secret(&t, "b"),
            Err(SecretError::NotFound(_))
        ));
    }

    #[test]
    fn bad_names_values_and_metadata_are_refused_at_the_edge() {
        let (_d, s, t) = store();
        let none = BTreeMap::new();
        for name in ["", " ", "a b", "a.b", "sec_x", "{x}", &"a".repeat(129)] {
            assert!(
                matches!(
                    s.create_secret(&t, name, b"v", &none),
                    Err(SecretError::BadName(_))
                ),
                "{name:?}"
            );
        }
        assert!(s.create_secret(&t, &"a".repeat(128), b"v", &none).is_ok());
        assert!(matches!(
            s.create_secret(&t, "e", b"", &none),
            Err(SecretError::Empty)
        ));
        assert!(s
            .create_secret(&t, "big", &vec![b'x'; MAX_VALUE], &none)
            .is_ok());
        assert!(matches!(
            s.create_secret(&t, "bigger", &vec![b'x'; MAX_VALUE + 1], &none),
            Err(SecretError::TooLarge(_))
        ));
        let many: BTreeMap<String, String> = (0..=MAX_META_KEYS)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(matches!(
            check_metadata(&many),
            Err(SecretError::BadMetadata(_))
        ));
        let long = BTreeMap::from([("k".to_string(), "v".repeat(MAX_META_VALUE + 1))]);
        assert!(check_metadata(&long).is_err());
        let total: BTreeMap<String, String> = (0..9)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect();
        assert!(check_metadata(&total).is_err());
    }
}
