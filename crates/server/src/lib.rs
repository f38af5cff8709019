//! brig-server: the daemon's durable state.
//!
//! Start with [`Store`]: one connection to `$BRIG_HOME/brig.db` (SQLite in
//! WAL mode), opened with [`Store::open`], which also applies the schema
//! migrations. The other modules add methods to it:
//!
//! - [`tenants`]: [`TenantId`], the owner of keys and sandboxes.
//! - [`keys`]: API keys (`brig_<id>_<secret>`, stored only as a hash):
//!   [`Store::create_key`], [`Store::authenticate`] (→ [`TenantId`] or
//!   [`AuthError`]), and [`Store::ensure_initial_key`] for the first start.
//! - [`sandboxes`]: [`SandboxRecord`]s and their [`SandboxState`] machine,
//!   tenant-scoped reads ([`Scope`]), keyset pagination, the expiry query and
//!   [`Store::reconcile`], which the daemon runs on start.
//!
//! On top of the store, the daemon itself:
//!
//! - [`manager`]: [`SandboxManager`], the live sandboxes (each one running
//!   `brig-agent`), their spawner thread, supervisors and expiry sweeper;
//!   usable without HTTP.
//!   Pause, resume and per-sandbox metrics are in `lifecycle.rs`.
//! - [`metrics`]: the daemon's Prometheus metrics (`GET /metrics`).
//! - [`http`]: the native API, [`http::app`] builds the axum router.
//!
//! See `docs/state.md` for the schema and `docs/server.md` for the daemon.
#![forbid(unsafe_code)]

pub mod e2b;
pub mod http;
pub mod keys;
mod lifecycle;
pub mod manager;
pub mod metrics;
pub mod pool;
pub mod sandboxes;
pub mod store;
pub mod tenants;

pub use keys::{AuthError, KeyError, KeyId, KeyInfo};
pub use lifecycle::{LiveCounts, PauseMode, Resumed, SandboxMetrics};
pub use manager::{CreateConfig, ManagerConfig, ManagerError, SandboxManager};
pub use pool::PoolTarget;
pub use sandboxes::{
    Cursor, ListFilter, NewSandbox, Page, SandboxError, SandboxRecord, SandboxState, Scope,
};
pub use store::{Store, StoreError, UnixMillis, DB_FILE, SCHEMA_VERSION};
pub use tenants::{Tenant, TenantId, DEFAULT_TENANT};
