//! The SQLite database under `$BRIG_HOME`: opening it, its pragmas and its
//! migrations.
//!
//! [`Store::open`] is the only way in. It sets the connection up the same way
//! every time (WAL, `synchronous=NORMAL`, foreign keys, a busy timeout) and
//! brings the schema up to [`SCHEMA_VERSION`] before returning, so the rest
//! of the crate can assume the tables exist. The other modules add methods to
//! [`Store`]: [`crate::keys`] and [`crate::sandboxes`].
//!
//! One `Store` is one connection. It is `Send` but not `Sync`: a thread (or a
//! mutex) owns it. Several `Store`s may open the same file at once, in one
//! process or several; WAL lets readers run beside the one writer, and the
//! busy timeout makes writers queue instead of failing with `SQLITE_BUSY`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, Params, Row};

use crate::error::ErrorKind;

/// The database's file name inside `$BRIG_HOME`.
pub const DB_FILE: &str = "brig.db";

/// How long a writer waits for another writer before giving up. Writes are
/// single rows and short, so anything near this means something is wrong.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Milliseconds since the Unix epoch. Every timestamp in the database is one.
pub type UnixMillis = i64;

/// The schema, one migration per entry. Entry `i` moves the database from
/// `user_version = i` to `i + 1`.
///
/// The rule: never edit or reorder an entry once it has been committed. A
/// change to the schema is a new entry at the end. A database that has seen
/// entry `i` will never run it again, so editing it would leave old and new
/// databases with different schemas under the same version number.
const MIGRATIONS: &[&str] = &[
    // 1: tenants, their API keys, and sandbox records.
    "
    CREATE TABLE tenants (
        id          TEXT PRIMARY KEY,
        name        TEXT NOT NULL UNIQUE,
        created_at  INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE api_keys (
        id          TEXT PRIMARY KEY,
        tenant_id   TEXT NOT NULL REFERENCES tenants(id),
        -- SHA-256 of the secret part of the key; the key itself is never stored.
        key_hash    BLOB NOT NULL,
        -- What `brig keys ls` shows: enough to recognise a key, useless to use it.
        prefix      TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        revoked_at  INTEGER
    ) STRICT;
    CREATE INDEX api_keys_tenant ON api_keys(tenant_id);

    CREATE TABLE sandboxes (
        id          TEXT PRIMARY KEY CHECK (length(id) = 12),
        tenant_id   TEXT NOT NULL REFERENCES tenants(id),
        template    TEXT NOT NULL,
        isolation   TEXT NOT NULL,
        spec_json   TEXT NOT NULL,
        labels_json TEXT NOT NULL DEFAULT '{}',
        state       TEXT NOT NULL
                    CHECK (state IN ('creating', 'running', 'paused', 'stopped', 'dead')),
        init_pid    INTEGER,
        created_at  INTEGER NOT NULL,
        expires_at  INTEGER NOT NULL,
        ended_at    INTEGER,
        exit_code   INTEGER
    ) STRICT;
    -- Listing is always per tenant, in (created_at, id) order.
    CREATE INDEX sandboxes_tenant_order ON sandboxes(tenant_id, created_at, id);
    -- The expiry sweep and reconcile look only at live sandboxes.
    CREATE INDEX sandboxes_live ON sandboxes(state, expires_at)
        WHERE state IN ('creating', 'running', 'paused');
    ",
    // 2: a name for each API key (optional, shown by `brig keys ls`) and
    // when it was last used (updated at most once a minute per key).
    "
    ALTER TABLE api_keys ADD COLUMN name TEXT;
    ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;
    ",
    // 3: what a daemon needs to re-adopt a live sandbox after a restart,
    // beyond its spec: its pause state and pause-on-timeout setting (JSON,
    // the manager's), and what a front-end keeps about it (JSON, keyed by
    // front-end: E2B's access token, default user, lifecycle options).
    "
    ALTER TABLE sandboxes ADD COLUMN lifecycle_json TEXT;
    ALTER TABLE sandboxes ADD COLUMN attrs_json TEXT;
    ",
    // 4: why an ended sandbox ended (JSON, `EndCause`): deleted, timeout,
    // out of memory, its agent exited, the daemon shut down, ...
    "
    ALTER TABLE sandboxes ADD COLUMN end_json TEXT;
    ",
    // 5: roles and expiry for keys, removal for tenants. An admin key
    // manages tenants and every key; a tenant key its tenant's sandboxes
    // and keys. The first key of the default tenant (the one `brig serve`
    // wrote to local.key) becomes the admin key.
    "
    ALTER TABLE api_keys ADD COLUMN role TEXT NOT NULL DEFAULT 'tenant'
        CHECK (role IN ('admin', 'tenant'));
    ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;
    ALTER TABLE tenants ADD COLUMN removed_at INTEGER;
    UPDATE api_keys SET role = 'admin' WHERE id = (
        SELECT k.id FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
        WHERE t.name = 'default' ORDER BY k.created_at, k.id LIMIT 1);
    ",
    // 6: an optional name per sandbox (`brig create --name`), unique among
    // the tenant's records until the record is removed, as docker's
    // container names are.
    "
    ALTER TABLE sandboxes ADD COLUMN name TEXT;
    CREATE UNIQUE INDEX sandboxes_name ON sandboxes(tenant_id, name) WHERE name IS NOT NULL;
    ",
    // 7: secrets (secrets.rs): write-only values a tenant keeps for brig to
    // use on its behalf; the current version only.
    "
    CREATE TABLE secrets (
        id            TEXT PRIMARY KEY,
        tenant_id     TEXT NOT NULL REFERENCES tenants(id),
        name          TEXT NOT NULL,
        value         BLOB NOT NULL,
        version       INTEGER NOT NULL,
        metadata_json TEXT NOT NULL DEFAULT '{}',
        created_at    INTEGER NOT NULL,
        updated_at    INTEGER NOT NULL,
        UNIQUE (tenant_id, name)
    ) STRICT;
    ",
    // 8: snapshots (snapshots.rs): a sandbox's files as an image of the
    // image store (`image`), per tenant, optionally named; `hidden` ones
    // were made for a fork and go when no sandbox runs on them.
    "
    CREATE TABLE snapshots (
        id          TEXT PRIMARY KEY,
        tenant_id   TEXT NOT NULL REFERENCES tenants(id),
        name        TEXT,
        sandbox_id  TEXT NOT NULL,
        template    TEXT NOT NULL,
        image       TEXT NOT NULL,
        size        INTEGER NOT NULL,
        hidden      INTEGER NOT NULL DEFAULT 0,
        created_at  INTEGER NOT NULL
    ) STRICT;
    CREATE UNIQUE INDEX snapshots_name ON snapshots(tenant_id, name) WHERE name IS NOT NULL;
    ",
    // 9: volumes (volumes.rs): a tenant's persistent filesystems, each an
    // image file under the home, named uniquely per tenant; `token` is the
    // bearer token of its content API.
    "
    CREATE TABLE volumes (
        id          TEXT PRIMARY KEY,
        tenant_id   TEXT NOT NULL REFERENCES tenants(id),
        name        TEXT NOT NULL,
        size        INTEGER NOT NULL,
        token       TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        UNIQUE (tenant_id, name)
    ) STRICT;
    ",
];

/// The schema version this code writes and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Why the database could not be opened or queried.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open database {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("cannot set {pragma} on database {path}")]
    Pragma {
        path: PathBuf,
        pragma: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("database {path} did not switch to WAL mode (journal_mode is {mode:?})")]
    NotWal { path: PathBuf, mode: String },
    #[error("cannot migrate database {path} to schema version {version}")]
    Migrate {
        path: PathBuf,
        version: u32,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "database {path} has schema version {found}, newer than the {supported} this brig \
         understands: it was written by a newer brig; upgrade brig or point --home elsewhere"
    )]
    TooNew {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("database query failed: {op}")]
    Query {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("corrupt row in {table} (id {id:?}): {reason}")]
    Corrupt {
        table: &'static str,
        id: String,
        reason: String,
    },
}

impl StoreError {
    /// Every store failure is the server's, never the client's.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::Internal
    }

    /// Wrap a query failure with what was being done.
    pub(crate) fn query(op: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |source| StoreError::Query { op, source }
    }
}

/// Where "now" comes from. The daemon uses the system clock; tests swap in a
/// fixed one so expiry can be tested without sleeping.
pub type Clock = Arc<dyn Fn() -> UnixMillis + Send + Sync>;

/// The system clock, in milliseconds since the epoch.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as UnixMillis)
            // A clock before 1970 is a broken host; 0 keeps ordering sane.
            .unwrap_or(0)
    })
}

/// Statements the connection keeps parsed: more than the store has fixed
/// statements (about 50), so none is evicted by the others.
const STATEMENT_CACHE: usize = 128;

/// `execute` and `query_row` through the connection's statement cache.
/// The daemon runs the same few statements for every create, exec and
/// delete; parsing each anew took about 1 ms of CPU per
/// create→exec→delete cycle (bench/daemon.py, profiled with perf). For
/// fixed SQL only: a statement built with values inside would fill the
/// cache with one-offs.
pub(crate) trait Cached {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}

/// One open connection to `brig.db`, with the schema up to date.
pub struct Store {
    pub(crate) conn: Connection,
    path: PathBuf,
    clock: Clock,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Open (creating if needed) the database file at `path`, configure the
    /// connection, and apply any pending migrations.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, StoreError> {
        let path = path.as_ref().to_path_buf();
        let conn = Connection::open(&path).map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
        let pragma_err = |pragma| {
            let path = path.clone();
            move |source| StoreError::Pragma {
                path,
                pragma,
                source,
            }
        };

        // The busy timeout comes first: switching to WAL and migrating both
        // take locks that another process opening the same file may hold.
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(pragma_err("busy_timeout"))?;
        // WAL: readers never block the writer and vice versa, and a commit is
        // one append to the log. The mode is stored in the file, but asking
        // every time costs nothing and repairs a file someone switched back.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(pragma_err("journal_mode"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::NotWal { path, mode });
        }
        // NORMAL is durable against a crash of the daemon (the WAL is in the
        // OS's hands once written) and may lose the last commits only on
        // power loss, which reconcile repairs anyway. FULL would fsync on
        // every commit, on the sandbox-create hot path.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(pragma_err("synchronous"))?;
        // Off by default in SQLite, per connection; the schema relies on it.
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(pragma_err("foreign_keys"))?;
        // Room for every fixed statement the store runs (see `Cached`).
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);

        let mut store = Store {
            conn,
            path,
            clock: system_clock(),
        };
        store.migrate()?;
        Ok(store)
    }

    /// Open `brig.db` inside `home` (`$BRIG_HOME`).
    pub fn open_in(home: impl AsRef<Path>) -> Result<Store, StoreError> {
        Store::open(home.as_ref().join(DB_FILE))
    }

    /// The database file this store has open.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replace the clock ("now" for created_at, expires_at, revoked_at...).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    pub(crate) fn now(&self) -> UnixMillis {
        (self.clock)()
    }

    /// The schema version recorded in the file.
    pub fn schema_version(&self) -> Result<u32, StoreError> {
        user_version(&self.conn).map_err(StoreError::query("read schema version"))
    }

    /// The journal mode SQLite reports for this connection (`"wal"`).
    pub fn journal_mode(&self) -> Result<String, StoreError> {
        self.conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .map_err(StoreError::query("read journal mode"))
    }

    /// Run `f` inside a `BEGIN IMMEDIATE` transaction: commit if it
    /// returns `Ok`, roll back otherwise.
    ///
    /// IMMEDIATE matters for read-then-write sequences. A plain (deferred)
    /// transaction starts as a reader and upgrades to a writer at its first
    /// write; in WAL mode, if another connection committed in between, that
    /// upgrade fails with `SQLITE_BUSY` at once and the busy timeout does
    /// not help. Taking the write lock up front makes the transaction wait
    /// its turn instead.
    pub(crate) fn immediate<T, E: From<StoreError>>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Store) -> Result<T, E>,
    ) -> Result<T, E> {
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(StoreError::query(op))?;
        let result = f(self).and_then(|v| {
            self.conn
                .execute_batch("COMMIT")
                .map_err(StoreError::query(op))?;
            Ok(v)
        });
        if result.is_err() && !self.conn.is_autocommit() {
            // The error being returned matters more than a failed rollback;
            // SQLite rolls back on its own when the connection closes.
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        result
    }

    /// Bring the schema up to [`SCHEMA_VERSION`].
    ///
    /// All pending migrations run in one IMMEDIATE transaction, and the
    /// version is read again inside it: two processes opening a fresh file at
    /// once serialise on the write lock, and the second finds nothing to do.
    /// A failed migration rolls back entirely; the file stays at its old
    /// version.
    fn migrate(&mut self) -> Result<(), StoreError> {
        let path = self.path.clone();
        // The common case, an up-to-date file, needs no write lock: opening
        // a store must not queue behind a busy writer.
        if self.schema_version()? == SCHEMA_VERSION {
            return Ok(());
        }
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(|source| StoreError::Migrate {
                path: path.clone(),
                version: SCHEMA_VERSION,
                source,
            })?;
        let found = user_version(&tx).map_err(StoreError::query("read schema version"))?;
        if found > SCHEMA_VERSION {
            return Err(StoreError::TooNew {
                path,
                found,
                supported: SCHEMA_VERSION,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            let version = i as u32 + 1;
            let err = |source| StoreError::Migrate {
                path: path.clone(),
                version,
                source,
            };
            tx.execute_batch(sql).map_err(err)?;
            // PRAGMA takes no bound parameters; `version` is our own integer.
            tx.execute_batch(&format!("PRAGMA user_version = {version}"))
                .map_err(err)?;
        }
        tx.commit().map_err(|source| StoreError::Migrate {
            path,
            version: SCHEMA_VERSION,
            source,
        })
    }
}

fn user_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

/// A fresh 48-bit random id as 12 lowercase hex digits: the shape of
/// [`brig_core::SandboxId`], reused for tenants and keys so every id brig
/// shows looks alike.
pub(crate) fn random_hex_id() -> String {
    use rand::Rng;
    format!("{:012x}", rand::rngs::OsRng.gen::<u64>() & 0xffff_ffff_ffff)
}

/// `n` random lowercase letters and digits (snapshot and volume ids,
/// volume tokens).
pub(crate) fn random_alnum(n: usize) -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rngs::OsRng;
    (0..n)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_database_is_migrated_and_in_wal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.journal_mode().unwrap(), "wal");
        let fk: i64 = store
            .conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
        // synchronous: 1 = NORMAL.
        let sync: i64 = store
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 1);
    }

    #[test]
    fn reopening_runs_no_migration_twice() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open_in(dir.path()).unwrap());
        // A second CREATE TABLE would fail; reopening must be a no-op.
        let store = Store::open_in(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn newer_database_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DB_FILE);
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(&format!("PRAGMA user_version = {}", SCHEMA_VERSION + 1))
                .unwrap();
        }
        let err = Store::open(&path).unwrap_err();
        assert!(
            matches!(err, StoreError::TooNew { found, .. } if found == SCHEMA_VERSION + 1),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("newer"), "{msg}");
        // Refusing must not have touched the file's version.
        let conn = Connection::open(&path).unwrap();
        assert_eq!(user_version(&conn).unwrap(), SCHEMA_VERSION + 1);
    }

    #[test]
    fn foreign_keys_are_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_in(dir.path()).unwrap();
        let err = store.conn.execute(
            "INSERT INTO api_keys (id, tenant_id, key_hash, prefix, created_at)
             VALUES ('k', 'no-such-tenant', x'00', 'p', 0)",
            [],
        );
        assert!(err.is_err());
    }
}
