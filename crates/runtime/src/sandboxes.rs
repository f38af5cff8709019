//! Sandbox records: what exists, who owns it, what state it is in, and when
//! it expires.
//!
//! A record is inserted as `creating` before any host resource is made, so
//! a crash at any later point leaves a row that [`Store::reconcile`] will
//! find. Every state change goes through [`Store::transition`] (or
//! [`Store::set_running`], which also records the init pid), which applies
//! the state machine in [`SandboxState::can_become`] in a single conditional
//! `UPDATE`, so two racing changes cannot both win.
//!
//! Reads and changes made on behalf of an API caller take
//! [`Scope::Tenant`]: another tenant's sandbox is then [`SandboxError::NotFound`],
//! exactly like an id that does not exist, so ids cannot be probed across
//! tenants. The daemon's own sweeps (expiry, reconcile) use [`Scope::Daemon`].

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use brig_core::SandboxId;
use rusqlite::types::Value;
use rusqlite::OptionalExtension;

use crate::error::ErrorKind;
use crate::store::Cached;
use crate::store::{Store, StoreError, UnixMillis};
use crate::tenants::TenantId;

/// Where a sandbox is in its life.
///
/// ```text
///            set_running(pid)          pause
///  creating ─────────────────▶ running ◀─────▶ paused
///     │                          │      resume    │
///     │                          ▼                │
///     └──────────────────▶ stopped | dead ◀───────┘
/// ```
///
/// `stopped` is an end brig chose (delete, timeout); `dead` is an end brig
/// found (the process exited or vanished, creation failed, reconcile). Both
/// are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    Creating,
    Running,
    Paused,
    Stopped,
    Dead,
}

impl SandboxState {
    pub const ALL: [SandboxState; 5] = [
        SandboxState::Creating,
        SandboxState::Running,
        SandboxState::Paused,
        SandboxState::Stopped,
        SandboxState::Dead,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Stopped => "stopped",
            SandboxState::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<SandboxState> {
        SandboxState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Stopped and dead sandboxes never change again.
    pub fn is_final(self) -> bool {
        matches!(self, SandboxState::Stopped | SandboxState::Dead)
    }

    /// The state machine. `creating → running` is allowed only through
    /// [`Store::set_running`], which records the pid with it.
    pub fn can_become(self, to: SandboxState) -> bool {
        use SandboxState::*;
        matches!(
            (self, to),
            (Creating, Running)
                | (Creating, Stopped | Dead)
                | (Running, Paused)
                | (Paused, Running)
                | (Running | Paused, Stopped | Dead)
        )
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// On whose behalf a record is read or changed.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// An API caller: only this tenant's sandboxes exist.
    Tenant(&'a TenantId),
    /// The daemon itself (expiry, reconcile, process exit): all sandboxes.
    Daemon,
}

impl Scope<'_> {
    fn tenant(&self) -> Option<&str> {
        match self {
            Scope::Tenant(t) => Some(t.as_str()),
            Scope::Daemon => None,
        }
    }
}

/// What is known when a sandbox is first recorded.
#[derive(Debug, Clone)]
pub struct NewSandbox {
    pub id: SandboxId,
    pub tenant: TenantId,
    /// The template as the user named it (`host`, `dir:/…`, a template name).
    pub template: String,
    /// The isolation tier (`process`, `vm`, …).
    pub isolation: String,
    /// The full validated spec, as the daemon serialises it; kept so a
    /// sandbox can be inspected, and re-created after a restart.
    pub spec: serde_json::Value,
    pub labels: BTreeMap<String, String>,
    /// A name unique among the tenant's records ([`check_name`]).
    pub name: Option<String>,
    /// Time to live from now.
    pub timeout: Duration,
    /// What front-ends keep on it from its first write (the record's
    /// `attrs`, by key: `network`, `ingress`, …).
    pub attrs: serde_json::Map<String, serde_json::Value>,
}

/// A row of `sandboxes`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SandboxRecord {
    pub id: SandboxId,
    pub tenant: TenantId,
    pub template: String,
    pub isolation: String,
    pub spec: serde_json::Value,
    pub labels: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub state: SandboxState,
    pub init_pid: Option<u32>,
    pub created_at: UnixMillis,
    pub expires_at: UnixMillis,
    pub ended_at: Option<UnixMillis>,
    pub exit_code: Option<i32>,
    /// The manager's pause state, kept for a daemon that re-adopts it.
    #[serde(skip)]
    pub lifecycle: Option<serde_json::Value>,
    /// What front-ends keep about it, by front-end (`{"e2b": {...}}`).
    #[serde(skip)]
    pub attrs: serde_json::Map<String, serde_json::Value>,
    /// Why it ended (ended records written by this version on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<EndCause>,
}

/// How many sandboxes this daemon tore down, by [`EndCause`] (for
/// metrics).
#[derive(Debug, Default)]
pub struct EndCounts([std::sync::atomic::AtomicU64; 7]);

impl EndCounts {
    pub(crate) fn count(&self, cause: &EndCause) {
        self.0[cause.index()].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// (cause name, count) for every cause.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        EndCause::NAMES
            .iter()
            .zip(&self.0)
            .map(|(n, c)| (*n, c.load(std::sync::atomic::Ordering::Relaxed)))
            .collect()
    }
}

/// Why a sandbox ended, as recorded with its end and shown by `inspect`,
/// the API and a stream that was open when it happened.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum EndCause {
    /// Deleted (`brig kill`, `DELETE`, an E2B kill) by this tenant.
    Deleted { by: String },
    /// Its timeout passed.
    Timeout,
    /// The kernel's OOM killer fired in it and it ended: its memory limit
    /// was too small for what ran.
    OutOfMemory { memory_limit_bytes: Option<u64> },
    /// Its agent (the sandbox's first process) exited or was killed from
    /// inside, with the status the teardown learned.
    AgentExited { code: Option<i32> },
    /// It ended while no daemon watched it (found gone at re-adoption).
    EndedUnwatched,
    /// The daemon shut down and ended it.
    Shutdown,
    /// Its create was cut short (the daemon died mid-create, or the
    /// launch failed).
    CreateFailed,
}

impl EndCause {
    /// Every cause's name, as serialized (`cause`) and in metrics.
    pub const NAMES: [&'static str; 7] = [
        "deleted",
        "timeout",
        "out_of_memory",
        "agent_exited",
        "ended_unwatched",
        "shutdown",
        "create_failed",
    ];

    /// This cause's name (one of [`EndCause::NAMES`]).
    pub fn name(&self) -> &'static str {
        Self::NAMES[self.index()]
    }

    fn index(&self) -> usize {
        match self {
            EndCause::Deleted { .. } => 0,
            EndCause::Timeout => 1,
            EndCause::OutOfMemory { .. } => 2,
            EndCause::AgentExited { .. } => 3,
            EndCause::EndedUnwatched => 4,
            EndCause::Shutdown => 5,
            EndCause::CreateFailed => 6,
        }
    }

    /// One line for people: "deleted by tenant …", "its timeout passed", ...
    pub fn describe(&self) -> String {
        match self {
            EndCause::Deleted { by } => format!("deleted (by tenant {by})"),
            EndCause::Timeout => "its timeout passed".into(),
            EndCause::OutOfMemory {
                memory_limit_bytes: Some(b),
            } => format!(
                "out of memory: the kernel killed it at its memory limit ({} MiB)",
                b >> 20
            ),
            EndCause::OutOfMemory { .. } => {
                "out of memory: the kernel killed it at its memory limit".into()
            }
            EndCause::AgentExited { code: Some(c) } => {
                format!("its first process (the agent) exited with status {c}")
            }
            EndCause::AgentExited { code: None } => "its first process (the agent) exited".into(),
            EndCause::EndedUnwatched => "it ended while no daemon was running".into(),
            EndCause::Shutdown => "the daemon shut down".into(),
            EndCause::CreateFailed => "its create did not finish".into(),
        }
    }
}

/// Which sandboxes a listing returns.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Every pair must be among the sandbox's labels (subset match).
    pub labels: BTreeMap<String, String>,
    pub state: Option<SandboxState>,
}

/// Where the next page starts: the (created_at, id) of the last row served.
/// Opaque to clients; they hand back [`Cursor::as_str`] verbatim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    created_at: UnixMillis,
    id: String,
    text: String,
}

impl Cursor {
    fn after(record: &SandboxRecord) -> Cursor {
        Cursor {
            created_at: record.created_at,
            id: record.id.as_str().to_string(),
            text: format!("{}.{}", record.created_at, record.id),
        }
    }

    /// Accept a cursor a client sent back.
    pub fn parse(s: &str) -> Result<Cursor, SandboxError> {
        let bad = || SandboxError::BadCursor {
            cursor: s.chars().take(64).collect(),
        };
        let (at, id) = s.split_once('.').ok_or_else(bad)?;
        let created_at = at.parse().map_err(|_| bad())?;
        let id = SandboxId::parse(id).ok_or_else(bad)?;
        Ok(Cursor {
            created_at,
            id: id.as_str().to_string(),
            text: s.to_string(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// One page of a listing.
#[derive(Debug, Clone)]
pub struct Page {
    pub items: Vec<SandboxRecord>,
    /// `None` on the last page.
    pub next: Option<Cursor>,
}

/// The longest sandbox name.
pub const MAX_NAME: usize = 64;

/// A sandbox name is 1 to [`MAX_NAME`] letters, digits, `_`, `.` and `-`,
/// starting with a letter or digit (docker's rule), and not 12 hex digits
/// (it would read as another sandbox's id).
pub fn check_name(name: &str) -> Result<(), SandboxError> {
    let bad = |reason| {
        Err(SandboxError::BadName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() || name.len() > MAX_NAME {
        return bad("a name is 1 to 64 characters");
    }
    if !name
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphanumeric())
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return bad("use letters, digits, '_', '.' and '-', starting with a letter or digit");
    }
    if SandboxId::parse(name).is_some() {
        return bad("12 hex digits read as a sandbox id; choose another name");
    }
    Ok(())
}

fn name_taken(name: &str, holder: Option<&(SandboxId, SandboxState)>) -> String {
    match holder {
        Some((id, state)) if state.is_final() => format!(
            "the name {name:?} is taken by sandbox {id}, which has ended ({state}): remove its \
             record first, or choose another name"
        ),
        Some((id, state)) => {
            format!("the name {name:?} is taken by sandbox {id} ({state}): choose another name")
        }
        None => format!("the name {name:?} is taken: choose another name"),
    }
}

/// Why a sandbox operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("no sandbox {id}")]
    NotFound { id: SandboxId },
    #[error("sandbox {id} already exists")]
    AlreadyExists { id: SandboxId },
    #[error("sandbox {id} is {from} and cannot become {to}")]
    InvalidTransition {
        id: SandboxId,
        from: SandboxState,
        to: SandboxState,
    },
    #[error("sandbox {id} has ended ({state}); its timeout cannot change")]
    Ended { id: SandboxId, state: SandboxState },
    #[error("sandbox {id} is {state}: end it before removing its record")]
    StillLive { id: SandboxId, state: SandboxState },
    #[error("{}", name_taken(name, holder.as_ref()))]
    NameTaken {
        name: String,
        holder: Option<(SandboxId, SandboxState)>,
    },
    #[error("invalid sandbox name {name:?}: {reason}")]
    BadName { name: String, reason: &'static str },
    #[error(
        "invalid page cursor {cursor:?}: pass back the `next` value of the previous page unchanged"
    )]
    BadCursor { cursor: String },
    #[error("cannot encode the spec or labels of sandbox {id}")]
    Encode {
        id: SandboxId,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl SandboxError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            SandboxError::NotFound { .. } => ErrorKind::NotFound,
            SandboxError::InvalidTransition { .. }
            | SandboxError::Ended { .. }
            | SandboxError::StillLive { .. }
            | SandboxError::NameTaken { .. } => ErrorKind::Conflict,
            SandboxError::BadCursor { .. } | SandboxError::BadName { .. } => ErrorKind::BadRequest,
            // Ids are random: a clash is a bug, not the client's doing.
            SandboxError::AlreadyExists { .. } | SandboxError::Encode { .. } => ErrorKind::Internal,
            SandboxError::Store(e) => e.kind(),
        }
    }
}

const COLUMNS: &str = "id, tenant_id, template, isolation, spec_json, labels_json, state, \
                       init_pid, created_at, expires_at, ended_at, exit_code, lifecycle_json, \
                       attrs_json, end_json, name";

/// A row as SQLite hands it over, before the checks that turn it into a
/// [`SandboxRecord`] (done outside rusqlite's closure so a bad row becomes a
/// [`StoreError::Corrupt`] naming the row, not an opaque conversion error).
struct RawRow {
    id: String,
    tenant: String,
    template: String,
    isolation: String,
    spec_json: String,
    labels_json: String,
    state: String,
    init_pid: Option<i64>,
    created_at: i64,
    expires_at: i64,
    ended_at: Option<i64>,
    exit_code: Option<i64>,
    lifecycle_json: Option<String>,
    attrs_json: Option<String>,
    end_json: Option<String>,
    name: Option<String>,
}

fn raw_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRow> {
    Ok(RawRow {
        id: r.get(0)?,
        tenant: r.get(1)?,
        template: r.get(2)?,
        isolation: r.get(3)?,
        spec_json: r.get(4)?,
        labels_json: r.get(5)?,
        state: r.get(6)?,
        init_pid: r.get(7)?,
        created_at: r.get(8)?,
        expires_at: r.get(9)?,
        ended_at: r.get(10)?,
        exit_code: r.get(11)?,
        lifecycle_json: r.get(12)?,
        attrs_json: r.get(13)?,
        end_json: r.get(14)?,
        name: r.get(15)?,
    })
}

impl RawRow {
    fn into_record(self) -> Result<SandboxRecord, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            table: "sandboxes",
            id: self.id.clone(),
            reason,
        };
        let id =
            SandboxId::parse(&self.id).ok_or_else(|| corrupt("id is not 12 hex digits".into()))?;
        let state = SandboxState::parse(&self.state)
            .ok_or_else(|| corrupt(format!("unknown state {:?}", self.state)))?;
        let spec = serde_json::from_str(&self.spec_json)
            .map_err(|e| corrupt(format!("spec_json: {e}")))?;
        let labels = serde_json::from_str(&self.labels_json)
            .map_err(|e| corrupt(format!("labels_json: {e}")))?;
        let init_pid = self
            .init_pid
            .map(u32::try_from)
            .transpose()
            .map_err(|_| corrupt("init_pid out of range".into()))?;
        let exit_code = self
            .exit_code
            .map(i32::try_from)
            .transpose()
            .map_err(|_| corrupt("exit_code out of range".into()))?;
        // Both written by this daemon's code only; unreadable means
        // "nothing kept", not a corrupt row.
        let lifecycle = self
            .lifecycle_json
            .as_deref()
            .and_then(|j| serde_json::from_str(j).ok());
        let attrs = self
            .attrs_json
            .as_deref()
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_default();
        let end = self
            .end_json
            .as_deref()
            .and_then(|j| serde_json::from_str(j).ok());
        Ok(SandboxRecord {
            id,
            tenant: TenantId(self.tenant),
            template: self.template,
            isolation: self.isolation,
            spec,
            labels,
            name: self.name,
            state,
            init_pid,
            created_at: self.created_at,
            expires_at: self.expires_at,
            ended_at: self.ended_at,
            exit_code,
            lifecycle,
            attrs,
            end,
        })
    }
}

/// `'a', 'b'` for the states `to` may be reached from: our own constants,
/// so safe to put in SQL text.
fn sources_sql(to: SandboxState) -> String {
    SandboxState::ALL
        .into_iter()
        .filter(|from| {
            from.can_become(to) && !(*from == SandboxState::Creating && to == SandboxState::Running)
        })
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Store {
    /// Record a new sandbox in state `creating`, expiring `timeout` from now.
    pub fn insert_sandbox(&self, new: &NewSandbox) -> Result<SandboxRecord, SandboxError> {
        let encode = |source| SandboxError::Encode {
            id: new.id.clone(),
            source,
        };
        let spec_json = serde_json::to_string(&new.spec).map_err(encode)?;
        let labels_json = serde_json::to_string(&new.labels).map_err(encode)?;
        let attrs_json = (!new.attrs.is_empty())
            .then(|| serde_json::to_string(&new.attrs))
            .transpose()
            .map_err(encode)?;
        let now = self.now();
        let expires_at = now.saturating_add(duration_ms(new.timeout));
        let inserted = self.conn.execute_cached(
            "INSERT INTO sandboxes (id, tenant_id, template, isolation, spec_json, labels_json,
                                    state, created_at, expires_at, name, attrs_json)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'creating', ?7, ?8, ?9, ?10)",
            (
                new.id.as_str(),
                new.tenant.as_str(),
                &new.template,
                &new.isolation,
                &spec_json,
                &labels_json,
                now,
                expires_at,
                &new.name,
                &attrs_json,
            ),
        );
        match inserted {
            Ok(_) => {}
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE =>
            {
                let name = new.name.clone().unwrap_or_default();
                let holder = self
                    .conn
                    .query_row_cached(
                        "SELECT id, state FROM sandboxes WHERE tenant_id = ?1 AND name = ?2",
                        (new.tenant.as_str(), &name),
                        |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
                    )
                    .ok()
                    .and_then(|(id, state)| {
                        Some((SandboxId::parse(&id)?, SandboxState::parse(&state)?))
                    });
                return Err(SandboxError::NameTaken { name, holder });
            }
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY =>
            {
                return Err(SandboxError::AlreadyExists { id: new.id.clone() })
            }
            Err(source) => {
                return Err(StoreError::Query {
                    op: "insert sandbox",
                    source,
                }
                .into())
            }
        }
        Ok(SandboxRecord {
            id: new.id.clone(),
            tenant: new.tenant.clone(),
            template: new.template.clone(),
            isolation: new.isolation.clone(),
            spec: new.spec.clone(),
            labels: new.labels.clone(),
            name: new.name.clone(),
            state: SandboxState::Creating,
            init_pid: None,
            created_at: now,
            expires_at,
            ended_at: None,
            exit_code: None,
            lifecycle: None,
            attrs: serde_json::Map::new(),
            end: None,
        })
    }

    /// Forget an ended sandbox: its record goes (`brig rm`). A live one is
    /// [`SandboxError::StillLive`].
    pub fn remove_sandbox(&self, scope: Scope<'_>, id: &SandboxId) -> Result<(), SandboxError> {
        let record = self.get_sandbox(scope, id)?;
        if !record.state.is_final() {
            return Err(SandboxError::StillLive {
                id: id.clone(),
                state: record.state,
            });
        }
        self.conn
            .execute_cached(
                "DELETE FROM sandboxes WHERE id = ?1 AND state IN ('stopped', 'dead')",
                [id.as_str()],
            )
            .map_err(StoreError::query("remove sandbox record"))?;
        Ok(())
    }

    /// One sandbox. In [`Scope::Tenant`], another tenant's sandbox is
    /// [`SandboxError::NotFound`].
    pub fn get_sandbox(
        &self,
        scope: Scope<'_>,
        id: &SandboxId,
    ) -> Result<SandboxRecord, SandboxError> {
        self.find_sandbox(scope, id)?
            .ok_or_else(|| SandboxError::NotFound { id: id.clone() })
    }

    fn find_sandbox(
        &self,
        scope: Scope<'_>,
        id: &SandboxId,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        let raw = self
            .conn
            .query_row_cached(
                &format!(
                    "SELECT {COLUMNS} FROM sandboxes
                     WHERE id = ?1 AND (?2 IS NULL OR tenant_id = ?2)"
                ),
                (id.as_str(), scope.tenant()),
                raw_row,
            )
            .optional()
            .map_err(StoreError::query("get sandbox"))?;
        raw.map(RawRow::into_record).transpose()
    }

    /// A page of `tenant`'s sandboxes in (created_at, id) order, starting
    /// after `after`. At most `limit` rows (at least one).
    ///
    /// Keyset pagination: each page is "rows after the last one served", so
    /// rows inserted or ended between pages never shift the window — every
    /// row that existed when the listing began is served exactly once.
    pub fn list_sandboxes(
        &self,
        tenant: &TenantId,
        filter: &ListFilter,
        after: Option<&Cursor>,
        limit: usize,
    ) -> Result<Page, SandboxError> {
        let limit = limit.max(1);
        let (after_at, after_id) = match after {
            Some(c) => (c.created_at, c.id.clone()),
            None => (i64::MIN, String::new()),
        };
        let mut sql = format!(
            "SELECT {COLUMNS} FROM sandboxes
             WHERE tenant_id = ?1 AND (?2 IS NULL OR state = ?2)
               AND (created_at, id) > (?3, ?4)"
        );
        let mut params: Vec<Value> = vec![
            Value::Text(tenant.as_str().to_string()),
            filter
                .state
                .map_or(Value::Null, |s| Value::Text(s.as_str().to_string())),
            Value::Integer(after_at),
            Value::Text(after_id),
        ];
        for (k, v) in &filter.labels {
            params.push(Value::Text(k.clone()));
            params.push(Value::Text(v.clone()));
            let (pk, pv) = (params.len() - 1, params.len());
            // json_each over the labels object: one row per label, `key` and
            // `value` bound as parameters, so no label text reaches the SQL.
            sql.push_str(&format!(
                " AND EXISTS (SELECT 1 FROM json_each(labels_json) AS l
                              WHERE l.key = ?{pk} AND l.value = ?{pv} AND l.type = 'text')"
            ));
        }
        // One extra row says whether there is a next page without a
        // trailing empty page.
        sql.push_str(&format!(" ORDER BY created_at, id LIMIT {}", limit + 1));

        let op = "list sandboxes";
        let mut stmt = self.conn.prepare(&sql).map_err(StoreError::query(op))?;
        let raws = stmt
            .query_map(rusqlite::params_from_iter(params), raw_row)
            .map_err(StoreError::query(op))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::query(op))?;
        let mut items = raws
            .into_iter()
            .map(RawRow::into_record)
            .collect::<Result<Vec<_>, _>>()?;
        let next = if items.len() > limit {
            items.truncate(limit);
            items.last().map(Cursor::after)
        } else {
            None
        };
        Ok(Page { items, next })
    }

    /// `creating → running`, recording the sandbox's init pid.
    pub fn set_running(&self, id: &SandboxId, pid: u32) -> Result<SandboxRecord, SandboxError> {
        let updated = self
            .conn
            .query_row_cached(
                &format!(
                    "UPDATE sandboxes SET state = 'running', init_pid = ?2
                     WHERE id = ?1 AND state = 'creating' RETURNING {COLUMNS}"
                ),
                (id.as_str(), pid),
                raw_row,
            )
            .optional()
            .map_err(StoreError::query("mark sandbox running"))?;
        match updated {
            Some(raw) => Ok(raw.into_record()?),
            None => Err(self.explain_refusal(Scope::Daemon, id, SandboxState::Running)),
        }
    }

    /// Move a sandbox to `to` if the state machine allows it from its
    /// current state. Entering `stopped` or `dead` records `ended_at` and
    /// `exit_code` (when known).
    pub fn transition(
        &self,
        scope: Scope<'_>,
        id: &SandboxId,
        to: SandboxState,
        exit_code: Option<i32>,
    ) -> Result<SandboxRecord, SandboxError> {
        self.transition_for(scope, id, to, exit_code, None)
    }

    /// End a sandbox's record (`to` is final) with why it ended.
    pub fn end_sandbox(
        &self,
        scope: Scope<'_>,
        id: &SandboxId,
        to: SandboxState,
        exit_code: Option<i32>,
        cause: &EndCause,
    ) -> Result<SandboxRecord, SandboxError> {
        debug_assert!(to.is_final());
        self.transition_for(scope, id, to, exit_code, Some(cause))
    }

    fn transition_for(
        &self,
        scope: Scope<'_>,
        id: &SandboxId,
        to: SandboxState,
        exit_code: Option<i32>,
        cause: Option<&EndCause>,
    ) -> Result<SandboxRecord, SandboxError> {
        let sources = sources_sql(to);
        if sources.is_empty() {
            return Err(self.explain_refusal(scope, id, to));
        }
        let ending = if to.is_final() {
            ", ended_at = ?4, exit_code = ?5, end_json = ?6"
        } else {
            ""
        };
        let sql = format!(
            "UPDATE sandboxes SET state = ?3{ending}
             WHERE id = ?1 AND (?2 IS NULL OR tenant_id = ?2) AND state IN ({sources})
             RETURNING {COLUMNS}"
        );
        let mut params = vec![
            Value::Text(id.as_str().to_string()),
            scope
                .tenant()
                .map_or(Value::Null, |t| Value::Text(t.to_string())),
            Value::Text(to.as_str().to_string()),
        ];
        if to.is_final() {
            params.push(Value::Integer(self.now()));
            params.push(exit_code.map_or(Value::Null, |c| Value::Integer(c.into())));
            params.push(
                cause
                    .and_then(|c| serde_json::to_string(c).ok())
                    .map_or(Value::Null, Value::Text),
            );
        }
        let updated = self
            .conn
            .query_row_cached(&sql, rusqlite::params_from_iter(params), raw_row)
            .optional()
            .map_err(StoreError::query("change sandbox state"))?;
        match updated {
            Some(raw) => Ok(raw.into_record()?),
            None => Err(self.explain_refusal(scope, id, to)),
        }
    }

    /// The daemon found the sandbox's process gone.
    pub fn mark_dead(
        &self,
        id: &SandboxId,
        exit_code: Option<i32>,
        cause: &EndCause,
    ) -> Result<SandboxRecord, SandboxError> {
        self.end_sandbox(Scope::Daemon, id, SandboxState::Dead, exit_code, cause)
    }

    /// A conditional update changed nothing: say whether the sandbox is
    /// missing (or another tenant's) or in a state that forbids the change.
    fn explain_refusal(&self, scope: Scope<'_>, id: &SandboxId, to: SandboxState) -> SandboxError {
        match self.find_sandbox(scope, id) {
            Ok(Some(r)) => SandboxError::InvalidTransition {
                id: id.clone(),
                from: r.state,
                to,
            },
            Ok(None) => SandboxError::NotFound { id: id.clone() },
            Err(e) => e.into(),
        }
    }

    /// Make a live sandbox expire `timeout` from now (which may be sooner
    /// than before). Capping it at the server's maximum is the caller's job.
    pub fn extend_timeout(
        &self,
        scope: Scope<'_>,
        id: &SandboxId,
        timeout: Duration,
    ) -> Result<SandboxRecord, SandboxError> {
        let expires_at = self.now().saturating_add(duration_ms(timeout));
        let updated = self
            .conn
            .query_row_cached(
                &format!(
                    "UPDATE sandboxes SET expires_at = ?3
                     WHERE id = ?1 AND (?2 IS NULL OR tenant_id = ?2)
                       AND state IN ('creating', 'running', 'paused')
                     RETURNING {COLUMNS}"
                ),
                (id.as_str(), scope.tenant(), expires_at),
                raw_row,
            )
            .optional()
            .map_err(StoreError::query("extend sandbox timeout"))?;
        match updated {
            Some(raw) => Ok(raw.into_record()?),
            None => match self.find_sandbox(scope, id)? {
                Some(r) => Err(SandboxError::Ended {
                    id: id.clone(),
                    state: r.state,
                }),
                None => Err(SandboxError::NotFound { id: id.clone() }),
            },
        }
    }

    /// Running or paused sandboxes whose `expires_at` has passed, oldest
    /// deadline first: the expiry sweep kills these and marks them stopped.
    pub fn expired_sandboxes(&self) -> Result<Vec<SandboxRecord>, SandboxError> {
        self.select_records(
            "expired sandboxes",
            &format!(
                "SELECT {COLUMNS} FROM sandboxes
                 WHERE state IN ('running', 'paused') AND expires_at < ?1
                 ORDER BY expires_at, id"
            ),
            &[Value::Integer(self.now())],
        )
    }

    /// Daemon start: mark dead every record whose sandbox cannot still be
    /// there, and return them (now `dead`) so the caller can kill leftovers
    /// and remove their mounts, cgroups and directories.
    ///
    /// - `creating`: dead. Creation runs inside the daemon; a daemon that is
    ///   starting has no creation in flight, so these were cut off by a crash.
    /// - `running`/`paused` without a pid: dead (cannot be checked).
    /// - `running`/`paused` with a pid: dead if `is_alive(id, pid)` says so.
    ///   The caller decides what alive means (the pid exists *and* is still
    ///   that sandbox's init, e.g. by its cgroup, not a recycled pid).
    ///
    /// `is_alive` runs outside any transaction, so a slow check holds no
    /// lock; each row is then marked dead only if its state and pid are still
    /// what was checked.
    pub fn reconcile(
        &self,
        mut is_alive: impl FnMut(&SandboxId, u32) -> bool,
    ) -> Result<Vec<SandboxRecord>, SandboxError> {
        let live = self.select_records(
            "reconcile: list live sandboxes",
            &format!(
                "SELECT {COLUMNS} FROM sandboxes
                 WHERE state IN ('creating', 'running', 'paused') ORDER BY created_at, id"
            ),
            &[],
        )?;
        let gone: Vec<SandboxRecord> = live
            .into_iter()
            .filter(|r| match (r.state, r.init_pid) {
                (SandboxState::Creating, _) | (_, None) => true,
                (_, Some(pid)) => !is_alive(&r.id, pid),
            })
            .collect();

        let now = self.now();
        self.immediate("reconcile: mark sandboxes dead", |s| {
            let mut marked = Vec::with_capacity(gone.len());
            for r in gone {
                let updated = s
                    .conn
                    .query_row_cached(
                        &format!(
                            "UPDATE sandboxes SET state = 'dead', ended_at = ?4
                             WHERE id = ?1 AND state = ?2 AND init_pid IS ?3
                             RETURNING {COLUMNS}"
                        ),
                        (r.id.as_str(), r.state.as_str(), r.init_pid, now),
                        raw_row,
                    )
                    .optional()
                    .map_err(StoreError::query("reconcile: mark sandbox dead"))?;
                if let Some(raw) = updated {
                    marked.push(raw.into_record()?);
                }
            }
            Ok::<_, SandboxError>(marked)
        })
    }

    /// Every sandbox in a live state (`creating`, `running`, `paused`): what
    /// a starting daemon settles.
    pub fn live_sandboxes(&self) -> Result<Vec<SandboxRecord>, SandboxError> {
        self.select_records(
            "list live sandboxes",
            &format!(
                "SELECT {COLUMNS} FROM sandboxes
                 WHERE state IN ('creating', 'running', 'paused') ORDER BY created_at, id"
            ),
            &[],
        )
    }

    /// The live sandboxes created from `template` (as the record names it:
    /// an image's name): what keeps an image from being removed.
    pub fn live_on_template(&self, template: &str) -> Result<Vec<SandboxId>, SandboxError> {
        Ok(self
            .live_sandboxes()?
            .into_iter()
            .filter(|r| r.template == template)
            .map(|r| r.id)
            .collect())
    }

    /// Keep the manager's pause state of a live sandbox (see
    /// [`SandboxRecord::lifecycle`]).
    pub fn set_lifecycle(
        &self,
        id: &SandboxId,
        lifecycle: &serde_json::Value,
    ) -> Result<(), SandboxError> {
        self.conn
            .execute_cached(
                "UPDATE sandboxes SET lifecycle_json = ?2 WHERE id = ?1",
                (id.as_str(), lifecycle.to_string()),
            )
            .map_err(StoreError::query("keep a sandbox's lifecycle"))?;
        Ok(())
    }

    /// Keep what front-end `frontend` needs about a sandbox (see
    /// [`SandboxRecord::attrs`]); replaces what it kept before.
    pub fn set_attrs(
        &self,
        id: &SandboxId,
        frontend: &str,
        value: &serde_json::Value,
    ) -> Result<(), SandboxError> {
        self.conn
            .execute_cached(
                "UPDATE sandboxes SET attrs_json = json_set(coalesce(attrs_json, '{}'), '$.' || ?2, json(?3))
                 WHERE id = ?1",
                (id.as_str(), frontend, value.to_string()),
            )
            .map_err(StoreError::query("keep a front-end's data on a sandbox"))?;
        Ok(())
    }

    fn select_records(
        &self,
        op: &'static str,
        sql: &str,
        params: &[Value],
    ) -> Result<Vec<SandboxRecord>, SandboxError> {
        let mut stmt = self
            .conn
            .prepare_cached(sql)
            .map_err(StoreError::query(op))?;
        let raws = stmt
            .query_map(rusqlite::params_from_iter(params), raw_row)
            .map_err(StoreError::query(op))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::query(op))?;
        Ok(raws
            .into_iter()
            .map(RawRow::into_record)
            .collect::<Result<Vec<_>, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI64, Ordering};
    use std::sync::Arc;

    struct Fixture {
        _dir: tempfile::TempDir,
        store: Store,
        now: Arc<AtomicI64>,
        tenant: TenantId,
        next: u64,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open_in(dir.path()).unwrap();
        let now = Arc::new(AtomicI64::new(1_000_000));
        let clock = now.clone();
        store.set_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
        let tenant = store.create_tenant("acme").unwrap();
        Fixture {
            _dir: dir,
            store,
            now,
            tenant,
            next: 1,
        }
    }

    impl Fixture {
        fn insert(&mut self, labels: &[(&str, &str)], timeout: Duration) -> SandboxId {
            let id = SandboxId::from_random(self.next);
            self.next += 1;
            let new = NewSandbox {
                id: id.clone(),
                tenant: self.tenant.clone(),
                template: "host".into(),
                isolation: "process".into(),
                spec: serde_json::json!({"argv": ["/bin/true"]}),
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                name: None,
                timeout,
                attrs: Default::default(),
            };
            let rec = self.store.insert_sandbox(&new).unwrap();
            assert_eq!(rec.state, SandboxState::Creating);
            id
        }
    }

    #[test]
    fn state_machine_table() {
        use SandboxState::*;
        for from in SandboxState::ALL {
            assert!(!from.can_become(from), "{from} -> itself");
            if from.is_final() {
                assert!(SandboxState::ALL.iter().all(|&to| !from.can_become(to)));
            }
        }
        assert!(Creating.can_become(Running));
        assert!(Running.can_become(Paused));
        assert!(Paused.can_become(Running));
        assert!(!Creating.can_become(Paused));
    }

    #[test]
    fn insert_get_and_duplicate() {
        let mut f = fixture();
        let id = f.insert(&[("team", "a")], Duration::from_secs(300));
        let rec = f.store.get_sandbox(Scope::Tenant(&f.tenant), &id).unwrap();
        assert_eq!(rec.labels["team"], "a");
        assert_eq!(rec.expires_at, rec.created_at + 300_000);
        assert_eq!(rec.spec["argv"][0], "/bin/true");
        let dup = NewSandbox {
            id: id.clone(),
            tenant: f.tenant.clone(),
            template: "host".into(),
            isolation: "process".into(),
            spec: serde_json::Value::Null,
            labels: BTreeMap::new(),
            name: None,
            timeout: Duration::from_secs(1),
            attrs: Default::default(),
        };
        let err = f.store.insert_sandbox(&dup).unwrap_err();
        assert!(matches!(err, SandboxError::AlreadyExists { .. }), "{err:?}");
    }

    #[test]
    fn transitions_follow_the_state_machine() {
        let mut f = fixture();
        let id = f.insert(&[], Duration::from_secs(60));
        let t = Scope::Tenant(&f.tenant);
        // creating -> running only with a pid.
        let err = f
            .store
            .transition(t, &id, SandboxState::Running, None)
            .unwrap_err();
        assert!(
            matches!(
                err,
                SandboxError::InvalidTransition {
                    from: SandboxState::Creating,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = f
            .store
            .transition(t, &id, SandboxState::Paused, None)
            .unwrap_err();
        assert!(
            matches!(err, SandboxError::InvalidTransition { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            format!("sandbox {id} is creating and cannot become paused")
        );

        let rec = f.store.set_running(&id, 4242).unwrap();
        assert_eq!(
            (rec.state, rec.init_pid),
            (SandboxState::Running, Some(4242))
        );
        assert!(f.store.set_running(&id, 1).is_err());
        f.store
            .transition(t, &id, SandboxState::Paused, None)
            .unwrap();
        f.store
            .transition(t, &id, SandboxState::Running, None)
            .unwrap();
        f.now.fetch_add(5, Ordering::SeqCst);
        let rec = f
            .store
            .transition(t, &id, SandboxState::Stopped, Some(137))
            .unwrap();
        assert_eq!(rec.ended_at, Some(f.now.load(Ordering::SeqCst)));
        assert_eq!(rec.exit_code, Some(137));
        for to in SandboxState::ALL {
            let err = f.store.transition(t, &id, to, None).unwrap_err();
            assert!(
                matches!(
                    err,
                    SandboxError::InvalidTransition {
                        from: SandboxState::Stopped,
                        ..
                    }
                ),
                "{err:?}"
            );
        }
        let missing = SandboxId::from_random(0xffff);
        assert!(matches!(
            f.store.transition(t, &missing, SandboxState::Dead, None),
            Err(SandboxError::NotFound { .. })
        ));
    }

    #[test]
    fn a_name_is_unique_per_tenant_until_its_record_is_removed() {
        let mut f = fixture();
        let named = |id: u64, tenant: &TenantId, name: &str| NewSandbox {
            id: SandboxId::from_random(id),
            tenant: tenant.clone(),
            template: "host".into(),
            isolation: "process".into(),
            spec: serde_json::Value::Null,
            labels: BTreeMap::new(),
            name: Some(name.into()),
            timeout: Duration::from_secs(60),
            attrs: Default::default(),
        };
        let first = f
            .store
            .insert_sandbox(&named(100, &f.tenant, "dev"))
            .unwrap();
        assert_eq!(first.name.as_deref(), Some("dev"));
        let got = f
            .store
            .get_sandbox(Scope::Tenant(&f.tenant), &first.id)
            .unwrap();
        assert_eq!(got.name.as_deref(), Some("dev"));
        let err = f
            .store
            .insert_sandbox(&named(101, &f.tenant, "dev"))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Conflict);
        assert!(err.to_string().contains(first.id.as_str()), "{err}");
        // Another tenant may use it; unnamed sandboxes never clash.
        let other = f.store.create_tenant("other").unwrap();
        f.store.insert_sandbox(&named(102, &other, "dev")).unwrap();
        f.insert(&[], Duration::from_secs(60));
        f.insert(&[], Duration::from_secs(60));
        // Ended, the name stays taken (the message says how to free it)...
        f.store
            .transition(Scope::Daemon, &first.id, SandboxState::Dead, None)
            .unwrap();
        let err = f
            .store
            .insert_sandbox(&named(103, &f.tenant, "dev"))
            .unwrap_err();
        assert!(err.to_string().contains("has ended"), "{err}");
        // ...until the record is removed.
        f.store
            .remove_sandbox(Scope::Tenant(&f.tenant), &first.id)
            .unwrap();
        f.store
            .insert_sandbox(&named(104, &f.tenant, "dev"))
            .unwrap();
    }

    #[test]
    fn names_follow_one_rule() {
        for good in ["dev", "a", "web-1.test_x", &"n".repeat(MAX_NAME)] {
            check_name(good).unwrap();
        }
        for bad in [
            "",
            "-x",
            ".x",
            "a b",
            "a/b",
            "é",
            "0123456789ab",
            &"n".repeat(MAX_NAME + 1),
        ] {
            let err = check_name(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::BadRequest, "{bad:?}");
        }
    }

    #[test]
    fn list_filters_by_labels_and_state() {
        let mut f = fixture();
        let a = f.insert(&[("team", "a"), ("env", "prod")], Duration::from_secs(60));
        let b = f.insert(&[("team", "a")], Duration::from_secs(60));
        let _c = f.insert(&[("team", "b"), ("env", "prod")], Duration::from_secs(60));
        f.store.set_running(&b, 10).unwrap();

        let list = |labels: &[(&str, &str)], state| {
            let filter = ListFilter {
                labels: labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                state,
            };
            let page = f
                .store
                .list_sandboxes(&f.tenant, &filter, None, 100)
                .unwrap();
            assert!(page.next.is_none());
            page.items.into_iter().map(|r| r.id).collect::<Vec<_>>()
        };
        assert_eq!(list(&[("team", "a")], None), vec![a.clone(), b.clone()]);
        assert_eq!(
            list(&[("team", "a"), ("env", "prod")], None),
            vec![a.clone()]
        );
        assert_eq!(list(&[("team", "a")], Some(SandboxState::Running)), vec![b]);
        assert_eq!(list(&[("nope", "x")], None), Vec::<SandboxId>::new());
        // Label text is data, never SQL.
        assert_eq!(
            list(&[("team' OR 1=1 --", "a")], None),
            Vec::<SandboxId>::new()
        );
        assert_eq!(list(&[], None).len(), 3);
    }

    #[test]
    fn bad_cursor_is_rejected() {
        for s in ["", "abc", "12.xyz", "x.0123456789ab"] {
            assert!(
                matches!(Cursor::parse(s), Err(SandboxError::BadCursor { .. })),
                "{s}"
            );
        }
        assert!(Cursor::parse("5.0123456789ab").is_ok());
    }

    #[test]
    fn expiry_and_extend() {
        let mut f = fixture();
        let short = f.insert(&[], Duration::from_secs(10));
        let long = f.insert(&[], Duration::from_secs(100));
        let never_started = f.insert(&[], Duration::from_secs(1));
        f.store.set_running(&short, 1).unwrap();
        f.store.set_running(&long, 2).unwrap();
        f.store
            .transition(Scope::Daemon, &long, SandboxState::Paused, None)
            .unwrap();
        assert!(f.store.expired_sandboxes().unwrap().is_empty());

        f.now.fetch_add(50_000, Ordering::SeqCst);
        let ids: Vec<_> = f
            .store
            .expired_sandboxes()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        // `creating` is reconcile's business, not the sweep's.
        assert_eq!(ids, vec![short.clone()]);
        let _ = never_started;

        f.store
            .extend_timeout(Scope::Tenant(&f.tenant), &short, Duration::from_secs(60))
            .unwrap();
        assert!(f.store.expired_sandboxes().unwrap().is_empty());

        f.now.fetch_add(100_000, Ordering::SeqCst);
        let ids: Vec<_> = f
            .store
            .expired_sandboxes()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, vec![long.clone(), short.clone()]);

        f.store
            .transition(Scope::Daemon, &short, SandboxState::Stopped, None)
            .unwrap();
        let err = f
            .store
            .extend_timeout(Scope::Daemon, &short, Duration::from_secs(60))
            .unwrap_err();
        assert!(
            matches!(
                err,
                SandboxError::Ended {
                    state: SandboxState::Stopped,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn reconcile_marks_only_the_gone() {
        let mut f = fixture();
        let creating = f.insert(&[], Duration::from_secs(60));
        let alive = f.insert(&[], Duration::from_secs(60));
        let gone = f.insert(&[], Duration::from_secs(60));
        let paused_gone = f.insert(&[], Duration::from_secs(60));
        let stopped = f.insert(&[], Duration::from_secs(60));
        f.store.set_running(&alive, 100).unwrap();
        f.store.set_running(&gone, 200).unwrap();
        f.store.set_running(&paused_gone, 300).unwrap();
        f.store
            .transition(Scope::Daemon, &paused_gone, SandboxState::Paused, None)
            .unwrap();
        f.store
            .transition(Scope::Daemon, &stopped, SandboxState::Stopped, Some(0))
            .unwrap();

        let mut asked = Vec::new();
        let dead = f
            .store
            .reconcile(|id, pid| {
                asked.push((id.clone(), pid));
                pid == 100
            })
            .unwrap();
        let mut dead_ids: Vec<_> = dead.iter().map(|r| r.id.clone()).collect();
        dead_ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        let mut want = vec![creating, gone, paused_gone];
        want.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        assert_eq!(dead_ids, want);
        assert!(dead
            .iter()
            .all(|r| r.state == SandboxState::Dead && r.ended_at.is_some()));
        assert_eq!(asked.len(), 3, "only running/paused with a pid are checked");
        let d = Scope::Daemon;
        assert_eq!(
            f.store.get_sandbox(d, &alive).unwrap().state,
            SandboxState::Running
        );
        assert_eq!(
            f.store.get_sandbox(d, &stopped).unwrap().state,
            SandboxState::Stopped
        );
        // A second pass finds nothing new.
        assert!(f.store.reconcile(|_, _| true).unwrap().is_empty());
    }
}
