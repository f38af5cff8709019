//! brig-api: the native HTTP API (`/v1`), on axum, over the runtime
//! ([`SandboxManager`]).
//!
//! [`app`] builds the whole router from an [`AppState`]; tests drive it in
//! process (`tower::ServiceExt::oneshot`), `brig serve` binds it to a
//! socket. One file per resource: [`info`] (`/healthz`, `/v1/info`),
//! [`sandboxes`] (create, list, get, delete, timeout, pause, resume,
//! metrics), [`exec`] (one
//! foreground command, streamed as NDJSON), [`processes`] (background
//! processes: start, list, signal, stdin, re-attach to their output),
//! [`pty`] (an interactive session over a WebSocket), [`logs`] (what
//! background processes printed) and
//! [`files`] (raw download and upload, multipart upload, list, stat, mkdir,
//! rename, remove), [`ports`] (HTTP and WebSocket to a port inside the
//! sandbox) and [`keys`] (the tenant's API keys). Handlers are
//! thin: decode the request into a config, make one call on the
//! [`SandboxManager`], encode the answer. Every error goes through
//! [`ApiError`] (`error.rs`), which maps the runtime's
//! [`ErrorKind`](brig_runtime::ErrorKind)s to statuses and codes and adds
//! this API's hints.
//!
//! Authentication is brig-http's [`Auth`] extractor: every handler but
//! `/healthz` takes it first, so a request without a valid key is answered
//! 401 before its body is even looked at. `GET /metrics` (Prometheus, in
//! [`metrics`]) asks for a key too, unless the server was started with
//! `--metrics-public`.
#![forbid(unsafe_code)]

pub mod error;
pub mod exec;
pub mod files;
pub mod info;
pub mod keys;
pub mod logs;
pub mod metrics;
mod ndjson;
pub mod network;
pub mod ports;
pub mod processes;
pub mod pty;
pub mod sandboxes;
pub mod secrets;
pub mod snapshots;
pub mod templates;
pub mod tenants;
pub mod volumes;

use std::sync::{Arc, OnceLock};

use axum::routing::{get, post};
use axum::Router;
use brig_core::SandboxId;
use brig_http::AuthState;
use brig_runtime::{Metrics, SandboxManager};

use brig_http::{blocking, Auth};
pub use error::ApiError;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    pub manager: Arc<SandboxManager>,
    /// The host's tiers, probed once on first use of `/v1/info`.
    tiers: Arc<OnceLock<serde_json::Value>>,
    /// Prometheus metrics (`GET /metrics`), kept by a middleware.
    pub metrics: Arc<Metrics>,
    /// `GET /metrics` without an API key (`brig serve --metrics-public`).
    pub metrics_public: bool,
    /// Sandboxes' ports on the host's loopback (`publish`).
    pub publisher: Arc<brig_http::publish::Publisher>,
}

impl AppState {
    pub fn new(manager: Arc<SandboxManager>) -> AppState {
        AppState {
            tiers: Arc::new(OnceLock::new()),
            metrics: Arc::new(Metrics::new()),
            metrics_public: false,
            publisher: brig_http::publish::Publisher::new(Arc::clone(&manager)),
            manager,
        }
    }

    /// Serve `GET /metrics` without an API key.
    pub fn with_public_metrics(mut self, public: bool) -> AppState {
        self.metrics_public = public;
        self
    }
}

/// The whole API.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(info::healthz))
        .route("/v1/info", get(info::info))
        .route("/v1/keys", post(keys::create).get(keys::list))
        .route("/v1/keys/{id}", axum::routing::delete(keys::revoke))
        .route("/v1/tenants", post(tenants::create).get(tenants::list))
        .route("/v1/tenants/{name}", axum::routing::delete(tenants::remove))
        .route("/v1/templates", get(templates::list))
        .route("/v1/templates/pull", post(templates::pull))
        .route(
            "/v1/templates/import",
            post(templates::import).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/v1/templates/prune", post(templates::prune))
        .route(
            "/v1/templates/{*name}",
            get(templates::get).delete(templates::remove),
        )
        .route("/v1/secrets", get(secrets::list))
        .route(
            "/v1/secrets/{name}",
            get(secrets::get).put(secrets::set).delete(secrets::delete),
        )
        .route(
            "/v1/sandboxes",
            post(sandboxes::create).get(sandboxes::list),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(sandboxes::get).delete(sandboxes::delete),
        )
        .route("/v1/sandboxes/{id}/timeout", post(sandboxes::extend))
        .route("/v1/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/v1/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/v1/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/v1/volumes", get(volumes::list).post(volumes::create))
        .route(
            "/v1/volumes/{volume}",
            get(volumes::get).delete(volumes::delete),
        )
        .route("/v1/snapshots", get(snapshots::list))
        .route(
            "/v1/snapshots/{snapshot}",
            get(snapshots::get).delete(snapshots::delete),
        )
        .route("/v1/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/v1/sandboxes/{id}/metrics", get(sandboxes::metrics))
        .route(
            "/v1/sandboxes/{id}/metrics/series",
            get(sandboxes::metrics_series),
        )
        .route("/metrics", get(metrics::serve))
        .route(
            "/v1/sandboxes/{id}/exec",
            post(exec::exec).layer(exec::body_limit()),
        )
        .route(
            "/v1/sandboxes/{id}/files",
            get(files::download)
                .put(files::upload)
                .delete(files::remove)
                // Uploads are streamed to the sandbox, never held here.
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route(
            "/v1/sandboxes/{id}/files/upload",
            post(files::upload_multipart).layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/v1/sandboxes/{id}/files/list", get(files::list))
        .route("/v1/sandboxes/{id}/files/stat", get(files::stat))
        .route("/v1/sandboxes/{id}/files/mkdir", post(files::mkdir))
        .route("/v1/sandboxes/{id}/files/rename", post(files::rename))
        .route("/v1/sandboxes/{id}/files/watch", get(files::watch))
        .route(
            "/v1/sandboxes/{id}/archive",
            get(files::archive::download)
                .put(files::archive::upload)
                // Archives are unpacked as they arrive, never held here.
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .merge(processes::routes())
        .merge(ports::routes())
        .route("/v1/sandboxes/{id}/pty", get(pty::pty))
        .route("/v1/sandboxes/{id}/logs", get(logs::logs))
        .route(
            "/v1/sandboxes/{id}/network",
            get(network::get).put(network::put),
        )
        .route(
            "/v1/sandboxes/{id}/network/connections",
            get(network::connections),
        )
        .fallback(|| async { ApiError::not_found("no such endpoint; see api/openapi.yaml") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method; see api/openapi.yaml",
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            ports::by_host,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .with_state(state)
}

impl AuthState for AppState {
    type Rejection = ApiError;

    fn manager(&self) -> &Arc<SandboxManager> {
        &self.manager
    }
}

/// A sandbox id from a path. One that cannot exist is simply not found.
pub(crate) fn sandbox_id(s: &str) -> Result<SandboxId, ApiError> {
    SandboxId::parse(s).ok_or_else(|| ApiError::not_found(format!("no sandbox {s}")))
}
