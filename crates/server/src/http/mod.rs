//! The native HTTP API (`/v1`), on axum.
//!
//! [`app`] builds the whole router from an [`AppState`]; tests drive it in
//! process (`tower::ServiceExt::oneshot`), `brig serve` binds it to a
//! socket. One file per resource: [`info`] (`/healthz`, `/v1/info`),
//! [`sandboxes`] (create, list, get, delete, timeout, pause, resume,
//! metrics), [`exec`] (one
//! foreground command, streamed as NDJSON), [`processes`] (background
//! processes: start, list, signal, stdin, re-attach to their output),
//! [`pty`] (an interactive session over a WebSocket) and
//! [`files`] (raw download and upload, multipart upload, list, stat, mkdir,
//! rename, remove), [`ports`] (HTTP and WebSocket to a port inside the
//! sandbox) and [`keys`] (the tenant's API keys). Handlers are
//! thin: decode the request into a config, make one call on the
//! [`SandboxManager`], encode the answer. Every error goes through
//! [`ApiError`] (`error.rs`).
//!
//! Authentication is the [`Auth`] extractor: every handler but `/healthz`
//! takes it first, so a request without a valid key is answered 401 before
//! its body is even looked at. `GET /metrics` (Prometheus, in
//! [`crate::metrics`]) asks for a key too, unless the server was started
//! with `--metrics-public`.

pub mod error;
pub mod exec;
pub mod files;
pub mod info;
pub mod keys;
pub mod ports;
pub mod processes;
pub mod pty;
pub mod sandboxes;

use std::sync::{Arc, OnceLock};

use axum::extract::FromRequestParts;
use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use axum::routing::{get, post};
use axum::Router;
use brig_core::SandboxId;

pub use error::ApiError;

use crate::manager::{ManagerError, SandboxManager};
use crate::TenantId;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct AppState {
    pub manager: Arc<SandboxManager>,
    /// The host's tiers, probed once on first use of `/v1/info`.
    tiers: Arc<OnceLock<serde_json::Value>>,
    /// Prometheus metrics (`GET /metrics`), kept by a middleware.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// `GET /metrics` without an API key (`brig serve --metrics-public`).
    pub metrics_public: bool,
}

impl AppState {
    pub fn new(manager: Arc<SandboxManager>) -> AppState {
        AppState {
            manager,
            tiers: Arc::new(OnceLock::new()),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            metrics_public: false,
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
        .route("/v1/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/v1/sandboxes/{id}/metrics", get(sandboxes::metrics))
        .route("/metrics", get(crate::metrics::serve))
        .route("/v1/sandboxes/{id}/exec", post(exec::exec))
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
        .merge(processes::routes())
        .merge(ports::routes())
        .route("/v1/sandboxes/{id}/pty", get(pty::pty))
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
            crate::metrics::track,
        ))
        .with_state(state)
}

/// The tenant a request acts for, from `Authorization: Bearer <key>`.
#[derive(Debug, Clone)]
pub struct Auth(pub TenantId);

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Auth, ApiError> {
        let key = parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|k| k.trim().to_string())
            .ok_or_else(ApiError::unauthorized)?;
        Auth::with_key(state, key).await
    }
}

impl Auth {
    /// Check a key however it arrived (the PTY route also takes one from
    /// `Sec-WebSocket-Protocol`, see `pty.rs`).
    pub(crate) async fn with_key(state: &AppState, key: String) -> Result<Auth, ApiError> {
        let manager = Arc::clone(&state.manager);
        let tenant = tokio::task::spawn_blocking(move || manager.authenticate(&key)).await??;
        Ok(Auth(tenant))
    }
}

/// A sandbox id from a path. One that cannot exist is simply not found.
pub(crate) fn sandbox_id(s: &str) -> Result<SandboxId, ApiError> {
    SandboxId::parse(s).ok_or_else(|| ApiError::not_found(format!("no sandbox {s}")))
}

/// Run a blocking manager call (SQLite, the agent, the spawner) off the
/// async workers.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ManagerError> + Send + 'static,
) -> Result<T, ApiError> {
    Ok(tokio::task::spawn_blocking(f).await??)
}
