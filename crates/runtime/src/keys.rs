//! API keys: creating, listing, revoking and checking them.
//!
//! A key reads `brig_<id>_<secret>`: `id` is the key's 12-hex-digit row id
//! (public: it is what `brig keys ls` and `brig keys revoke` use), `secret` is
//! 43 characters drawn uniformly from `[0-9A-Za-z]` by the OS's random number
//! generator — 256 bits. Only SHA-256 of the secret is stored.
//!
//! Every key has a second spelling for E2B's clients, [`e2b_spelling`]:
//! `e2b_<id><the secret's bytes in hex>` (98 lowercase hex digits). Releases
//! 2.25–2.45 of E2B's Python client refuse, before sending anything, a key
//! that is not `e2b_` followed by hex digits; the spelling is derived, not
//! stored, so every key ever issued has one, and either spelling is the
//! same key everywhere (native API, E2B, MCP).
//!
//! Why a plain SHA-256 and not bcrypt/argon2: slow KDFs exist to make
//! guessing *low-entropy* secrets (passwords people choose) expensive after a
//! database leaks. A 256-bit random secret cannot be guessed at any speed, so
//! slowness buys nothing, while every API request pays for the hash; SHA-256
//! costs well under a microsecond. The id in the key lets [`Store::authenticate`]
//! fetch the one candidate row by primary key instead of hashing against
//! every key, and the hashes are compared in constant time so response
//! timing says nothing about how much of a guess was right.

use rusqlite::OptionalExtension;
use sha2::{Digest, Sha256};

use crate::error::ErrorKind;
use crate::store::Cached;
use crate::store::{random_hex_id, Store, StoreError, UnixMillis};
use crate::tenants::{TenantId, DEFAULT_TENANT};

const KEY_PREFIX: &str = "brig_";
/// The prefix E2B's clients expect (`e2b_` followed by hex digits).
const E2B_PREFIX: &str = "e2b_";
const ID_LEN: usize = 12;
/// 43 base62 characters carry 43 × log2(62) ≈ 256.1 bits.
const SECRET_LEN: usize = 43;
/// Characters of the secret kept in the display prefix so a person can match
/// a key they hold to a listing; 4 of 43 leaves ≈ 232 bits unknown.
const SECRET_SHOWN: usize = 4;
/// The longest name a key may have, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// `last_used_at` is written when it is older than this. Writing it on every
/// request would put a database write on every API call's path; a minute is
/// precise enough to tell a key in use from a forgotten one.
const LAST_USED_GRANULARITY_MS: UnixMillis = 60_000;

/// An API key's public id (12 lowercase hex digits).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct KeyId(String);

impl KeyId {
    /// Accept an id from outside (`brig keys revoke ID`) only in the shape
    /// brig generates.
    pub fn parse(s: &str) -> Option<KeyId> {
        is_hex_id(s).then(|| KeyId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for KeyId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Manages tenants and every tenant's keys (and its own tenant's
    /// sandboxes). The key `brig serve` writes to `local.key` is one.
    Admin,
    /// Manages its tenant's sandboxes and its tenant's tenant keys.
    Tenant,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Tenant => "tenant",
        }
    }

    fn parse(s: &str) -> Role {
        if s == "admin" {
            Role::Admin
        } else {
            Role::Tenant
        }
    }
}

/// Who a request comes from: the key that authenticated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub tenant: TenantId,
    pub key: KeyId,
    pub role: Role,
}

impl Principal {
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

/// What a new key is.
#[derive(Debug, Clone, Default)]
pub struct NewKey<'a> {
    pub name: Option<&'a str>,
    /// `None`: [`Role::Tenant`].
    pub role: Option<Role>,
    /// How long it works, counted on the store's clock from its
    /// creation; after that it authenticates nothing.
    pub expires_in: Option<std::time::Duration>,
}

/// What listing keys shows. There is no field for the secret or its hash.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeyInfo {
    pub id: KeyId,
    pub tenant: TenantId,
    pub role: Role,
    pub expires_at: Option<UnixMillis>,
    /// `brig_<id>_<first 4 characters of the secret>`.
    pub prefix: String,
    /// What its creator called it, if anything.
    pub name: Option<String>,
    pub created_at: UnixMillis,
    /// When it last authenticated a request, to the minute; `None` if never.
    pub last_used_at: Option<UnixMillis>,
    pub revoked_at: Option<UnixMillis>,
}

/// Why managing keys failed.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("no api key {id} for this tenant (`brig keys ls` lists them)")]
    NotFound { id: KeyId },
    #[error(
        "api key {id} is this tenant's last active key: revoking it would lock the tenant out; \
         create another key first (`brig keys create`), then revoke this one"
    )]
    LastKey { id: KeyId },
    #[error(
        "invalid key name {name:?}: use at most {MAX_NAME_CHARS} characters and no control characters"
    )]
    BadName { name: String },
    /// The key asking may not do this (a tenant key managing another
    /// tenant, an admin key, or tenants).
    #[error("{what} needs an admin key (the key `brig serve` wrote to local.key is one)")]
    Forbidden { what: String },
    #[error(
        "api key {id} is the last active admin key: revoking it would leave nobody to manage \
         tenants and keys; create another first (`brig keys create --admin`)"
    )]
    LastAdmin { id: KeyId },
    #[error("the key's lifetime must be more than zero, e.g. 30d or 12h")]
    BadExpiry,
    #[error("no tenant named {name:?} (`brig tenants ls` lists them)")]
    UnknownTenant { name: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl KeyError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            KeyError::NotFound { .. } | KeyError::UnknownTenant { .. } => ErrorKind::NotFound,
            KeyError::LastKey { .. } => ErrorKind::Conflict,
            KeyError::BadName { .. } | KeyError::BadExpiry => ErrorKind::BadRequest,
            KeyError::Forbidden { .. } => ErrorKind::Forbidden,
            KeyError::LastAdmin { .. } => ErrorKind::Conflict,
            KeyError::Store(e) => e.kind(),
        }
    }
}

/// Why a presented key was refused. The variants are for logs and tests;
/// a front-end shows clients one message for every [`ErrorKind::Unauthorized`],
/// so probing cannot tell an unknown key from a revoked one.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("malformed api key: {reason}")]
    Malformed { reason: &'static str },
    #[error("unknown api key {id}")]
    Unknown { id: String },
    #[error("api key {id} does not match its stored hash")]
    WrongSecret { id: String },
    #[error("api key {id} was revoked")]
    Revoked { id: String },
    #[error("api key {id} expired")]
    Expired { id: String },
    /// Not the client's fault: the server should answer 5xx, not 401.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AuthError {
    /// True when the key itself was at fault (answer 401), false when the
    /// server failed to check it (answer 5xx).
    pub fn is_rejection(&self) -> bool {
        !matches!(self, AuthError::Store(_))
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            AuthError::Store(e) => e.kind(),
            _ => ErrorKind::Unauthorized,
        }
    }
}

impl Store {
    /// Create a tenant key for `tenant`. The plaintext is returned once and
    /// never again: only its hash is stored.
    pub fn create_key(&self, tenant: &TenantId) -> Result<(KeyId, String), StoreError> {
        let (info, plaintext) = self.insert_key(tenant, &NewKey::default())?;
        Ok((info.id, plaintext))
    }

    /// Create a tenant key for `tenant` with an optional name.
    pub fn create_named_key(
        &self,
        tenant: &TenantId,
        name: Option<&str>,
    ) -> Result<(KeyInfo, String), KeyError> {
        self.create_key_with(
            tenant,
            &NewKey {
                name,
                ..NewKey::default()
            },
        )
    }

    /// Create a key for `tenant` (checked: a name of at most
    /// [`MAX_NAME_CHARS`] characters and no control characters, an empty
    /// name being no name; an expiry in the future). Returns what listing
    /// will show and, this once, the plaintext. Who may ask is the
    /// caller's business ([`Store::create_key_as`]).
    pub fn create_key_with(
        &self,
        tenant: &TenantId,
        new: &NewKey<'_>,
    ) -> Result<(KeyInfo, String), KeyError> {
        let name = new.name.filter(|n| !n.is_empty());
        if let Some(n) = name {
            if n.chars().count() > MAX_NAME_CHARS || n.chars().any(char::is_control) {
                return Err(KeyError::BadName {
                    name: n.to_string(),
                });
            }
        }
        if new.expires_in.is_some_and(|d| d.is_zero()) {
            return Err(KeyError::BadExpiry);
        }
        Ok(self.insert_key(
            tenant,
            &NewKey {
                name,
                ..new.clone()
            },
        )?)
    }

    /// [`Store::create_key_with`] for `caller`: a tenant key makes tenant
    /// keys of its own tenant only; an admin key any key of any tenant.
    pub fn create_key_as(
        &self,
        caller: &Principal,
        tenant: &TenantId,
        new: &NewKey<'_>,
    ) -> Result<(KeyInfo, String), KeyError> {
        if !caller.is_admin() {
            if new.role == Some(Role::Admin) {
                return Err(KeyError::Forbidden {
                    what: "creating an admin key".into(),
                });
            }
            if tenant != &caller.tenant {
                return Err(KeyError::Forbidden {
                    what: "creating a key for another tenant".into(),
                });
            }
        }
        self.create_key_with(tenant, new)
    }

    fn insert_key(
        &self,
        tenant: &TenantId,
        new: &NewKey<'_>,
    ) -> Result<(KeyInfo, String), StoreError> {
        let id = KeyId(random_hex_id());
        let secret = random_secret();
        let plaintext = format!("{KEY_PREFIX}{id}_{secret}");
        let prefix = format!("{KEY_PREFIX}{id}_{}", &secret[..SECRET_SHOWN]);
        let now = self.now();
        let role = new.role.unwrap_or(Role::Tenant);
        let expires_at = new.expires_in.map(|d| now + d.as_millis() as UnixMillis);
        self.conn
            .execute_cached(
                "INSERT INTO api_keys
                     (id, tenant_id, key_hash, prefix, name, created_at, role, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                (
                    &id.0,
                    tenant.as_str(),
                    hash_secret(&secret).as_slice(),
                    &prefix,
                    new.name,
                    now,
                    role.as_str(),
                    expires_at,
                ),
            )
            .map_err(StoreError::query("create api key"))?;
        let info = KeyInfo {
            id,
            tenant: tenant.clone(),
            role,
            expires_at,
            prefix,
            name: new.name.map(str::to_string),
            created_at: now,
            last_used_at: None,
            revoked_at: None,
        };
        Ok((info, plaintext))
    }

    /// A tenant's keys, oldest first, revoked ones included.
    pub fn list_keys(&self, tenant: &TenantId) -> Result<Vec<KeyInfo>, StoreError> {
        self.keys_where("tenant_id = ?1", Some(tenant.as_str()))
    }

    /// Every tenant's keys, oldest first, revoked ones included.
    pub fn list_all_keys(&self) -> Result<Vec<KeyInfo>, StoreError> {
        self.keys_where("?1 IS NULL", None)
    }

    fn keys_where(&self, filter: &str, arg: Option<&str>) -> Result<Vec<KeyInfo>, StoreError> {
        let op = "list api keys";
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT id, tenant_id, prefix, name, created_at, last_used_at, revoked_at,
                        role, expires_at
                 FROM api_keys WHERE {filter} ORDER BY created_at, id"
            ))
            .map_err(StoreError::query(op))?;
        let rows = stmt
            .query_map([arg], |r| {
                Ok(KeyInfo {
                    id: KeyId(r.get(0)?),
                    tenant: TenantId(r.get(1)?),
                    prefix: r.get(2)?,
                    name: r.get(3)?,
                    created_at: r.get(4)?,
                    last_used_at: r.get(5)?,
                    revoked_at: r.get(6)?,
                    role: Role::parse(&r.get::<_, String>(7)?),
                    expires_at: r.get(8)?,
                })
            })
            .map_err(StoreError::query(op))?;
        rows.collect::<Result<_, _>>()
            .map_err(StoreError::query(op))
    }

    /// Revoke one of `tenant`'s keys. Revoking twice keeps the first time.
    /// Another tenant's key is [`KeyError::NotFound`], like a missing one.
    pub fn revoke_key(&self, tenant: &TenantId, id: &KeyId) -> Result<(), KeyError> {
        let n = self
            .conn
            .execute_cached(
                "UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?3)
                 WHERE id = ?1 AND tenant_id = ?2",
                (id.as_str(), tenant.as_str(), self.now()),
            )
            .map_err(StoreError::query("revoke api key"))?;
        if n == 0 {
            return Err(KeyError::NotFound { id: id.clone() });
        }
        Ok(())
    }

    /// Revoke one of `tenant`'s active keys, unless it is the tenant's last
    /// active one ([`KeyError::LastKey`]): a tenant with no key could never
    /// make another. What the API's `DELETE /v1/keys/{id}` does.
    ///
    /// A key that is already revoked, another tenant's key and a missing one
    /// are all [`KeyError::NotFound`]. The count and the revocation run in
    /// one IMMEDIATE transaction, so two concurrent revocations of a
    /// tenant's last two keys cannot both succeed.
    pub fn revoke_key_unless_last(&self, tenant: &TenantId, id: &KeyId) -> Result<(), KeyError> {
        self.immediate("revoke api key", |s| {
            let active: Vec<String> = {
                let mut stmt = s
                    .conn
                    .prepare_cached(
                        "SELECT id FROM api_keys WHERE tenant_id = ?1 AND revoked_at IS NULL",
                    )
                    .map_err(StoreError::query("list active api keys"))?;
                let rows = stmt
                    .query_map([tenant.as_str()], |r| r.get(0))
                    .map_err(StoreError::query("list active api keys"))?;
                rows.collect::<Result<_, _>>()
                    .map_err(StoreError::query("list active api keys"))?
            };
            if !active.iter().any(|k| k == id.as_str()) {
                return Err(KeyError::NotFound { id: id.clone() });
            }
            if active.len() == 1 {
                return Err(KeyError::LastKey { id: id.clone() });
            }
            s.conn
                .execute_cached(
                    "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1",
                    (id.as_str(), s.now()),
                )
                .map_err(StoreError::query("revoke api key"))?;
            Ok(())
        })
    }

    /// Revoke a key as `caller` may: a tenant key only its own tenant's
    /// tenant keys (anything else is [`KeyError::NotFound`], or
    /// [`KeyError::Forbidden`] for an admin key of its own tenant), an
    /// admin key any key. Never a tenant's last active key
    /// ([`KeyError::LastKey`]) nor the last active admin key
    /// ([`KeyError::LastAdmin`]). Count and revocation run in one
    /// IMMEDIATE transaction.
    pub fn revoke_key_as(&self, caller: &Principal, id: &KeyId) -> Result<(), KeyError> {
        self.immediate("revoke api key", |s| {
            type Row = (String, String, Option<UnixMillis>);
            let row: Option<Row> = s
                .conn
                .query_row_cached(
                    "SELECT tenant_id, role, revoked_at FROM api_keys WHERE id = ?1",
                    [id.as_str()],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
                .map_err(StoreError::query("look up api key"))?;
            let not_found = || KeyError::NotFound { id: id.clone() };
            let Some((tenant, role, revoked)) = row else {
                return Err(not_found());
            };
            let role = Role::parse(&role);
            if revoked.is_some() || (!caller.is_admin() && tenant != caller.tenant.as_str()) {
                return Err(not_found());
            }
            if !caller.is_admin() && role == Role::Admin {
                return Err(KeyError::Forbidden {
                    what: "revoking an admin key".into(),
                });
            }
            let count = |sql: &str, arg: &str| -> Result<i64, StoreError> {
                s.conn
                    .query_row_cached(sql, [arg], |r| r.get(0))
                    .map_err(StoreError::query("count active api keys"))
            };
            let now = s.now();
            let active = "revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ";
            if role == Role::Admin
                && count(
                    &format!("SELECT count(*) FROM api_keys WHERE role = ?1 AND {active}{now})"),
                    "admin",
                )? <= 1
            {
                return Err(KeyError::LastAdmin { id: id.clone() });
            }
            if count(
                &format!("SELECT count(*) FROM api_keys WHERE tenant_id = ?1 AND {active}{now})"),
                &tenant,
            )? <= 1
            {
                return Err(KeyError::LastKey { id: id.clone() });
            }
            s.conn
                .execute_cached(
                    "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1",
                    (id.as_str(), now),
                )
                .map_err(StoreError::query("revoke api key"))?;
            Ok(())
        })
    }

    /// Check a presented key: who it is ([`Principal`]). Records when the
    /// key was last used, at most once a minute.
    pub fn authenticate(&self, plaintext: &str) -> Result<Principal, AuthError> {
        let native = native_spelling(plaintext)?;
        let (id, secret) = parse_key(&native)?;
        type Row = (
            String,
            Vec<u8>,
            Option<UnixMillis>,
            Option<UnixMillis>,
            String,
            Option<UnixMillis>,
        );
        let row: Option<Row> = self
            .conn
            .query_row_cached(
                "SELECT tenant_id, key_hash, revoked_at, last_used_at, role, expires_at
                 FROM api_keys WHERE id = ?1",
                [id],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                },
            )
            .optional()
            .map_err(StoreError::query("look up api key"))?;
        let Some((tenant, stored, revoked_at, last_used_at, role, expires_at)) = row else {
            return Err(AuthError::Unknown { id: id.to_string() });
        };
        if !constant_time_eq(&hash_secret(secret), &stored) {
            return Err(AuthError::WrongSecret { id: id.to_string() });
        }
        // Checked after the hash so a revoked id with a wrong secret reads as
        // a wrong secret: only the holder of the key learns it was revoked
        // (and only in the logs).
        if revoked_at.is_some() {
            return Err(AuthError::Revoked { id: id.to_string() });
        }
        let now = self.now();
        if expires_at.is_some_and(|at| at <= now) {
            return Err(AuthError::Expired { id: id.to_string() });
        }
        if last_used_at.is_none_or(|t| now - t >= LAST_USED_GRANULARITY_MS) {
            self.conn
                .execute_cached(
                    "UPDATE api_keys SET last_used_at = ?2 WHERE id = ?1",
                    (id, now),
                )
                .map_err(StoreError::query("record api key use"))?;
        }
        Ok(Principal {
            tenant: TenantId(tenant),
            key: KeyId(id.to_string()),
            role: Role::parse(&role),
        })
    }

    /// First start: when no key exists at all, create the default tenant (if
    /// needed) and one key for it, and return the plaintext so the daemon
    /// can print it and write it where the local CLI finds it. Returns
    /// `None` on every later start.
    ///
    /// Runs in one IMMEDIATE transaction so two daemons starting on the same
    /// home cannot both create a key.
    pub fn ensure_initial_key(&self) -> Result<Option<String>, StoreError> {
        self.immediate("create the initial api key", |s| {
            let any: bool = s
                .conn
                .query_row_cached("SELECT EXISTS (SELECT 1 FROM api_keys)", [], |r| r.get(0))
                .map_err(StoreError::query("count api keys"))?;
            if any {
                return Ok(None);
            }
            let (_, plaintext) = s.create_admin_key(Some("local.key"))?;
            Ok(Some(plaintext))
        })
    }

    /// A new admin key of the default tenant (created if missing): the
    /// first start's key, and the recovery of an operator locked out
    /// (`brig keys create --local`, as root on the daemon's host).
    pub fn create_admin_key(&self, name: Option<&str>) -> Result<(KeyInfo, String), StoreError> {
        let tenant = match self.tenant_by_name(DEFAULT_TENANT)? {
            Some(t) => t.id,
            None => self.create_tenant(DEFAULT_TENANT)?,
        };
        self.insert_key(
            &tenant,
            &NewKey {
                name,
                role: Some(Role::Admin),
                expires_in: None,
            },
        )
    }
}

/// The spelling of `key` (`brig_<id>_<secret>`) that E2B's clients take:
/// `e2b_<id><hex of the secret>`. `None` if `key` is not a brig key.
pub fn e2b_spelling(key: &str) -> Option<String> {
    let (id, secret) = parse_key(key).ok()?;
    let mut out = String::with_capacity(E2B_PREFIX.len() + ID_LEN + 2 * SECRET_LEN);
    out.push_str(E2B_PREFIX);
    out.push_str(id);
    for b in secret.bytes() {
        out.push_str(&format!("{b:02x}"));
    }
    Some(out)
}

/// A presented key in brig's own spelling: an `e2b_` one translated back,
/// anything else as it is (and checked by [`parse_key`]).
fn native_spelling(plaintext: &str) -> Result<std::borrow::Cow<'_, str>, AuthError> {
    let Some(hex) = plaintext.strip_prefix(E2B_PREFIX) else {
        return Ok(std::borrow::Cow::Borrowed(plaintext));
    };
    let malformed = |reason| AuthError::Malformed { reason };
    if hex.len() != ID_LEN + 2 * SECRET_LEN
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(malformed(
            "an e2b_ key is the E2B spelling of a brig key (brig keys e2b prints it): \
             98 lowercase hex digits after e2b_",
        ));
    }
    let (id, secret_hex) = hex.split_at(ID_LEN);
    let secret: Vec<u8> = secret_hex
        .as_bytes()
        .chunks(2)
        .map(|pair| {
            let digit = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            digit(pair[0]) << 4 | digit(pair[1])
        })
        .collect();
    let secret = String::from_utf8(secret)
        .map_err(|_| malformed("the secret of an e2b_ key is not letters and digits"))?;
    Ok(std::borrow::Cow::Owned(format!(
        "{KEY_PREFIX}{id}_{secret}"
    )))
}

/// Split `brig_<id>_<secret>` and check each part's shape.
fn parse_key(plaintext: &str) -> Result<(&str, &str), AuthError> {
    let malformed = |reason| AuthError::Malformed { reason };
    let rest = plaintext
        .strip_prefix(KEY_PREFIX)
        .ok_or(malformed("does not start with brig_"))?;
    let (id, secret) = rest
        .split_once('_')
        .ok_or(malformed("expected brig_<id>_<secret>"))?;
    if !is_hex_id(id) {
        return Err(malformed("id is not 12 lowercase hex digits"));
    }
    if secret.len() != SECRET_LEN || !secret.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(malformed("secret is not 43 letters and digits"));
    }
    Ok((id, secret))
}

fn is_hex_id(s: &str) -> bool {
    s.len() == ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn random_secret() -> String {
    use rand::distributions::{Alphanumeric, DistString};
    // OsRng: the key is a long-lived credential; take it straight from the
    // kernel rather than from a user-space generator seeded from it.
    Alphanumeric.sample_string(&mut rand::rngs::OsRng, SECRET_LEN)
}

fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Compare without an early exit, so the time taken does not depend on
/// where the first differing byte is. Lengths are public (always 32 here).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box keeps the optimiser from turning the fold back into a
    // short-circuiting comparison.
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn key_round_trip() {
        let (_d, s) = store();
        let t = s.create_tenant("acme").unwrap();
        let (id, key) = s.create_key(&t).unwrap();
        assert!(key.starts_with(&format!("brig_{id}_")), "{key}");
        assert_eq!(key.len(), 5 + 12 + 1 + 43);
        assert_eq!(s.authenticate(&key).unwrap().tenant, t);
        let listed = s.list_keys(&t).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].id, id);
        assert!(key.starts_with(&listed[0].prefix));
        assert!(listed[0].prefix.len() < key.len() - 32);
    }

    /// The E2B spelling is what E2B's validating clients accept
    /// (`\Ae2b_[0-9a-f]+\Z`), authenticates as the same key, and a
    /// damaged one is refused as malformed or wrong, never as another key.
    #[test]
    fn e2b_spelling_is_the_same_key() {
        let (_d, s) = store();
        let t = s.create_tenant("acme").unwrap();
        let (id, key) = s.create_key(&t).unwrap();
        let e2b = e2b_spelling(&key).unwrap();
        assert!(e2b.starts_with(&format!("e2b_{id}")), "{e2b}");
        assert_eq!(e2b.len(), 4 + 12 + 86);
        assert!(e2b[4..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        let who = s.authenticate(&e2b).unwrap();
        assert_eq!((who.tenant, who.key), (t.clone(), id.clone()));
        assert_eq!(e2b_spelling("not a key"), None);
        assert_eq!(e2b_spelling(&e2b), None);

        // One hex digit of the secret changed: the same id, a wrong secret.
        let mut wrong = e2b.clone();
        let last = if wrong.ends_with('1') { "2" } else { "1" };
        wrong.replace_range(wrong.len() - 1.., last);
        assert!(matches!(
            s.authenticate(&wrong),
            Err(AuthError::WrongSecret { .. })
        ));
        for bad in [
            "e2b_".to_string(),
            "e2b_".to_string() + &"0".repeat(40),
            e2b.to_uppercase().replacen("E2B_", "e2b_", 1),
            format!("{e2b}0"),
            // A secret byte that is not a letter or digit ("-" is 2d).
            format!("{}2d", &e2b[..e2b.len() - 2]),
        ] {
            assert!(
                matches!(s.authenticate(&bad), Err(AuthError::Malformed { .. })),
                "{bad}"
            );
        }
        // Revoking the key revokes both spellings.
        s.revoke_key(&t, &id).unwrap();
        assert!(matches!(
            s.authenticate(&e2b),
            Err(AuthError::Revoked { .. })
        ));
    }

    #[test]
    fn revoked_key_is_rejected() {
        let (_d, s) = store();
        let t = s.create_tenant("acme").unwrap();
        let (id, key) = s.create_key(&t).unwrap();
        s.revoke_key(&t, &id).unwrap();
        let err = s.authenticate(&key).unwrap_err();
        assert!(matches!(err, AuthError::Revoked { .. }), "{err:?}");
        assert!(err.is_rejection());
        assert!(s.list_keys(&t).unwrap()[0].revoked_at.is_some());
    }

    #[test]
    fn another_tenant_cannot_revoke() {
        let (_d, s) = store();
        let a = s.create_tenant("a").unwrap();
        let b = s.create_tenant("b").unwrap();
        let (id, key) = s.create_key(&a).unwrap();
        assert!(matches!(
            s.revoke_key(&b, &id),
            Err(KeyError::NotFound { .. })
        ));
        assert_eq!(s.authenticate(&key).unwrap().tenant, a);
        assert!(s.list_keys(&b).unwrap().is_empty());
    }

    #[test]
    fn malformed_unknown_and_wrong_keys_are_rejected_distinctly() {
        let (_d, s) = store();
        let t = s.create_tenant("acme").unwrap();
        let (id, key) = s.create_key(&t).unwrap();
        for bad in [
            "",
            "Bearer x",
            "brig_",
            "brig_0123456789ab",
            "brig_XYZ_aaaa",
            &format!("brig_{id}_short"),
            &format!("brig_{id}_{}", "-".repeat(43)),
            &format!("{key}x"),
        ] {
            let err = s.authenticate(bad).unwrap_err();
            assert!(
                matches!(err, AuthError::Malformed { .. }),
                "{bad:?}: {err:?}"
            );
        }
        let unknown = format!("brig_000000000000_{}", &key[18..]);
        assert!(matches!(
            s.authenticate(&unknown),
            Err(AuthError::Unknown { .. })
        ));
        let mut wrong = key.clone();
        let last = if wrong.ends_with('a') { "b" } else { "a" };
        wrong.replace_range(wrong.len() - 1.., last);
        assert!(matches!(
            s.authenticate(&wrong),
            Err(AuthError::WrongSecret { .. })
        ));
    }

    #[test]
    fn initial_key_is_created_once() {
        let (_d, s) = store();
        let key = s
            .ensure_initial_key()
            .unwrap()
            .expect("first start makes a key");
        let tenant = s.authenticate(&key).unwrap().tenant;
        assert_eq!(
            s.tenant_by_name(DEFAULT_TENANT).unwrap().unwrap().id,
            tenant
        );
        assert_eq!(s.ensure_initial_key().unwrap(), None);
        assert_eq!(s.list_keys(&tenant).unwrap().len(), 1);
    }

    #[test]
    fn constant_time_eq_agrees_with_eq() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }
}
