//! brig-runtime: the daemon's domain, drivable without HTTP.
//!
//! Start with [`SandboxManager`] (`manager.rs`): the live sandboxes, each
//! running `brig-agent` in a process-tier sandbox, with their spawner
//! threads, a supervisor per sandbox, the expiry sweeper and the pool of
//! pre-made sandboxes ([`pool`]). Pause, resume and per-sandbox metrics
//! are more of its methods, in `lifecycle.rs`. Every change of a live
//! sandbox is published as an [`Event`] ([`events`]); front-ends subscribe
//! instead of polling.
//!
//! Under it, the durable state: [`Store`], one connection to
//! `$BRIG_HOME/brig.db` (SQLite in WAL mode), opened with [`Store::open`],
//! which also applies the schema migrations. The other modules add methods
//! to it:
//!
//! - [`tenants`]: [`TenantId`], the owner of keys and sandboxes.
//! - [`keys`]: API keys (`brig_<id>_<secret>`, stored only as a hash):
//!   [`Store::create_key`], [`Store::authenticate`] (→ [`TenantId`] or
//!   [`AuthError`]), and [`Store::ensure_initial_key`] for the first start.
//! - [`sandboxes`]: [`SandboxRecord`]s and their [`SandboxState`] machine,
//!   tenant-scoped reads ([`Scope`]), keyset pagination, the expiry query and
//!   [`Store::reconcile`], which the daemon runs on start.
//!
//! And for the front-ends (crates `brig-api`, `brig-e2b`): [`metrics`], the
//! Prometheus registry, and [`ErrorKind`], what every error's `kind()`
//! says a client should be told (`error.rs`). Nothing here speaks HTTP.
//!
//! See `docs/state.md` for the schema and `docs/server.md` for the daemon.
#![forbid(unsafe_code)]

pub mod error;
pub mod events;
pub mod keys;
mod lifecycle;
pub mod manager;
pub mod metrics;
pub mod pool;
mod prepare;
pub mod sandboxes;
pub mod secrets;
pub mod snapshots;
pub mod store;
pub mod tenants;
pub mod volume_files;
pub mod volumes;
pub mod warm;

pub use error::{chain, ErrorKind};
pub use events::{Event, EventKind};
pub use keys::{e2b_spelling, AuthError, KeyError, KeyId, KeyInfo, NewKey, Principal, Role};
pub use lifecycle::{LiveCounts, PauseMode, Resumed, SandboxMetrics};
pub use manager::{
    CreateConfig, ManagerConfig, ManagerError, NetworkInfo, OnStop, SandboxManager, StepRun,
};
pub use metrics::Metrics;
pub use pool::PoolTarget;
pub use sandboxes::{
    Cursor, EndCause, ListFilter, NewSandbox, Page, SandboxError, SandboxRecord, SandboxState,
    Scope,
};
pub use secrets::{SecretError, SecretInfo};
pub use snapshots::SnapshotInfo;
pub use store::{Store, StoreError, UnixMillis, DB_FILE, SCHEMA_VERSION};
pub use tenants::{Tenant, TenantError, TenantId, DEFAULT_TENANT};
pub use volumes::{MountedVolume, VolumeInfo, VolumeRequest};
pub use warm::WarmKey;
