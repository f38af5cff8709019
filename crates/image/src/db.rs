//! `images.db`: the SQLite index of images, beside the blobs and layers it
//! refers to.
//!
//! The same set-up as brig-runtime's database (WAL, a busy timeout,
//! migrations by `user_version`), in a file of its own: the image store is
//! used by `brig run` without a daemon, and by a daemon, at the same time,
//! and is not the daemon's state. The index says which images exist; the
//! files say nothing by themselves (an unreferenced blob or layer is
//! garbage for [`crate::ImageStore::prune`]).

use std::path::Path;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::{ImageConfig, ImageError, ImageRecord};

/// The index's file name inside `<home>/images`.
pub const DB_FILE: &str = "images.db";

/// How long a writer waits for another (a daemon and a `brig run` writing
/// at once). Writes are single rows.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema, one migration per entry; entry `i` moves `user_version`
/// from `i` to `i + 1`. Never edit a committed entry: add one.
const MIGRATIONS: &[&str] = &[
    // 1: images by name.
    "
    CREATE TABLE images (
        name         TEXT NOT NULL UNIQUE,
        source       TEXT NOT NULL,
        -- The manifest's digest (sha256:...).
        digest       TEXT NOT NULL,
        -- ImageConfig as JSON.
        config_json  TEXT NOT NULL,
        -- Diff ids, bottom first, as a JSON array.
        layers_json  TEXT NOT NULL,
        size         INTEGER NOT NULL,
        created_at   INTEGER NOT NULL
    ) STRICT;
    ",
    // 2: a directory below an image's layers (images made over a named
    // template's build).
    "ALTER TABLE images ADD COLUMN base TEXT;",
];

const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Open (creating and migrating) the index at `path`.
pub(crate) fn open(path: &Path) -> Result<Connection, ImageError> {
    let open_err = |source| ImageError::OpenIndex {
        path: path.to_path_buf(),
        source,
    };
    let mut conn = Connection::open(path).map_err(open_err)?;
    // The timeout first: switching to WAL takes a lock another process
    // may hold for a moment.
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(open_err)?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(open_err)?;

    // IMMEDIATE: two processes opening a new index at once migrate one
    // after the other, the second finding the work done.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(ImageError::query("begin the migration"))?;
    let version: u32 = tx
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(ImageError::query("read the schema version"))?;
    if version > SCHEMA_VERSION {
        return Err(ImageError::IndexTooNew {
            path: path.to_path_buf(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(migration)
            .map_err(ImageError::query("migrate the image index"))?;
        tx.pragma_update(None, "user_version", i as u32 + 1)
            .map_err(ImageError::query("migrate the image index"))?;
    }
    tx.commit()
        .map_err(ImageError::query("commit the migration"))?;
    Ok(conn)
}

/// Insert `image`, or replace the image of the same name.
pub(crate) fn upsert(conn: &Connection, image: &ImageRecord) -> Result<(), ImageError> {
    let config = serde_json::to_string(&image.config).expect("ImageConfig serializes");
    let layers = serde_json::to_string(&image.layers).expect("strings serialize");
    let size = i64::try_from(image.size).unwrap_or(i64::MAX);
    conn.execute(
        "INSERT INTO images (name, source, digest, config_json, layers_json, size, created_at, base)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (name) DO UPDATE SET
             source = excluded.source, digest = excluded.digest,
             config_json = excluded.config_json, layers_json = excluded.layers_json,
             size = excluded.size, created_at = excluded.created_at, base = excluded.base",
        params![
            image.name,
            image.source,
            image.digest,
            config,
            layers,
            size,
            image.created_at,
            image.base.as_ref().map(|b| b.to_string_lossy().into_owned()),
        ],
    )
    .map_err(ImageError::query("register the image"))?;
    Ok(())
}

const COLUMNS: &str = "name, source, digest, config_json, layers_json, size, created_at, base";

pub(crate) fn get(conn: &Connection, name: &str) -> Result<Option<ImageRecord>, ImageError> {
    let row = conn
        .query_row(
            &format!("SELECT {COLUMNS} FROM images WHERE name = ?1"),
            [name],
            Row::read,
        )
        .optional()
        .map_err(ImageError::query("look the image up"))?;
    row.map(Row::record).transpose()
}

pub(crate) fn list(conn: &Connection) -> Result<Vec<ImageRecord>, ImageError> {
    let mut stmt = conn
        .prepare(&format!("SELECT {COLUMNS} FROM images ORDER BY name"))
        .map_err(ImageError::query("list the images"))?;
    let rows = stmt
        .query_map([], Row::read)
        .map_err(ImageError::query("list the images"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(ImageError::query("list the images"))?;
    rows.into_iter().map(Row::record).collect()
}

/// Delete the image called `name`; whether there was one.
pub(crate) fn delete(conn: &Connection, name: &str) -> Result<bool, ImageError> {
    let n = conn
        .execute("DELETE FROM images WHERE name = ?1", [name])
        .map_err(ImageError::query("remove the image"))?;
    Ok(n > 0)
}

/// A row as stored, before its JSON columns are read.
struct Row {
    name: String,
    source: String,
    digest: String,
    config_json: String,
    layers_json: String,
    size: i64,
    created_at: i64,
    base: Option<String>,
}

impl Row {
    fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
        Ok(Row {
            name: r.get(0)?,
            source: r.get(1)?,
            digest: r.get(2)?,
            config_json: r.get(3)?,
            layers_json: r.get(4)?,
            size: r.get(5)?,
            created_at: r.get(6)?,
            base: r.get(7)?,
        })
    }

    fn record(self) -> Result<ImageRecord, ImageError> {
        let corrupt = |reason: String| ImageError::CorruptRow {
            name: self.name.clone(),
            reason,
        };
        let config: ImageConfig = serde_json::from_str(&self.config_json)
            .map_err(|e| corrupt(format!("config_json: {e}")))?;
        let layers: Vec<String> = serde_json::from_str(&self.layers_json)
            .map_err(|e| corrupt(format!("layers_json: {e}")))?;
        Ok(ImageRecord {
            size: u64::try_from(self.size).map_err(|_| corrupt("negative size".into()))?,
            name: self.name,
            source: self.source,
            digest: self.digest,
            config,
            layers,
            base: self.base.map(std::path::PathBuf::from),
            created_at: self.created_at,
        })
    }
}
