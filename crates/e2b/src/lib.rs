//! brig-e2b: E2B compatibility, so the official E2B SDKs, unmodified, work
//! against brig.
//!
//! A client is pointed at brig with environment variables alone
//! (`E2B_API_KEY` = a brig key, `E2B_API_URL`, `E2B_SANDBOX_URL`; see
//! `/work/shared/reference/e2b-protocol.md` and `docs/e2b.md`). Two
//! listeners, both started by `brig serve --e2b`:
//!
//! - the **control plane** ([`control_router`], default 127.0.0.1:3000):
//!   E2B's REST API (create, connect, kill, list, get, timeout, pause,
//!   resume, metrics), authenticated with `X-API-KEY`, mapped onto the
//!   runtime's [`SandboxManager`] (`control.rs`);
//! - the **data plane** ([`data_router`], default 127.0.0.1:49983): every
//!   in-sandbox request, routed by the `E2b-Sandbox-Id` and
//!   `E2b-Sandbox-Port` headers: port 49983 is envd (`envd/`: Connect-JSON
//!   `process.Process` and `filesystem.Filesystem`, `/files`, `/health`,
//!   `/metrics`, `/envs`), any other port is proxied to that port inside
//!   the sandbox (brig-http's [`proxy`](brig_http::ports::proxy)), which
//!   is how the code interpreter (49999, a server brig starts in
//!   `code-interpreter-v1` sandboxes, `control/interpreter.rs`) is reached.
//!
//! Both routers are built from one [`E2bState`]: the runtime's manager and
//! the [`Registry`] of [`E2bSandbox`]es. What E2B keeps per sandbox beyond
//! brig's own record (its envd access token, default user, sandbox-wide
//! env vars, metadata) lives there: in memory, because sandboxes do not outlive the daemon.
//! It learns that a sandbox ended from the runtime's events ([`on_end`]),
//! and so does envd's per-sandbox state.
//!
//! Runtime errors are answered in E2B's shapes: [`control::E2bError`] on the
//! control plane, Connect errors ([`envd::connect::ConnectError`]) in envd,
//! both chosen by the runtime's [`ErrorKind`](brig_runtime::ErrorKind).
#![forbid(unsafe_code)]

pub mod control;
pub mod envd;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use brig_core::SandboxId;

pub use brig_http::{constant_time_eq, on_end, Ended};
use brig_runtime::{SandboxManager, TenantId};

/// The `envdVersion` brig reports: the clients enable features by it
/// (reference §3.8). Raise it only with the feature it gates.
///
/// 0.6.4: every feature the clients gate up to it is implemented in
/// `envd/` (recursive watches 0.1.4, metrics 0.1.5/0.2.4, the `stdin` flag
/// 0.3.0, the server-side default user 0.4.0, `CloseStdin` 0.5.2,
/// octet-stream and gzip uploads 0.5.7, file metadata as `user.e2b.*`
/// xattrs 0.6.2, `includeEntry` on watch events 0.6.3, and
/// `allowNetworkMounts` 0.6.4, accepted and ignored: a sandbox has no
/// network mounts). The clients (Python e2b 2.63, JS e2b 2.51) gate
/// nothing above 0.6.4, so a higher number would claim behaviour of later
/// envd releases that no client asks about and nothing here checks.
pub const ENVD_VERSION: &str = "0.6.4";

/// The envd port the SDKs address (`E2b-Sandbox-Port: 49983`).
pub const ENVD_PORT: u16 = 49983;
/// The code interpreter's port.
pub const CODE_INTERPRETER_PORT: u16 = 49999;

/// What both E2B routers share.
#[derive(Debug, Clone)]
pub struct E2bState {
    pub manager: Arc<SandboxManager>,
    pub sandboxes: Arc<Registry>,
    /// The default user and its home per build of a named template (builds
    /// never change: `brig_template` makes a new one instead), so a create
    /// need not read the sandbox's /etc/passwd again.
    pub(crate) users: Arc<Mutex<HashMap<serde_json::Value, (String, String)>>>,
    /// Template builds (`Template.build`), control/templates.rs.
    pub(crate) builds: Arc<control::templates::Builds>,
    /// What clients set `E2B_DOMAIN` to, when the daemon serves both
    /// planes on a domain of its own ([`domain_router`]): sandboxes carry
    /// it as their `domain`, so `get_host(port)` names a host that reaches
    /// the port.
    domain: Option<Arc<str>>,
}

impl E2bState {
    /// The E2B planes over `manager`, knowing again every E2B sandbox an
    /// earlier daemon created that the manager re-adopted (what the planes
    /// know of a sandbox is kept on its record, [`ATTRS_KEY`]).
    pub fn new(manager: Arc<SandboxManager>) -> E2bState {
        let sandboxes = Arc::new(Registry::default());
        let records = manager.store().live_sandboxes();
        match records {
            Ok(records) => {
                for r in records {
                    let known = r
                        .attrs
                        .get(ATTRS_KEY)
                        .and_then(|v| serde_json::from_value::<E2bSandbox>(v.clone()).ok());
                    if let Some(sb) = known.filter(|sb| manager.is_live(&sb.id)) {
                        sandboxes.insert(sb);
                    }
                }
            }
            Err(e) => tracing::warn!("cannot list the sandboxes to re-adopt: {e}"),
        }
        if let Some(home) = &manager.config().home {
            control::templates::reconcile(home);
        }
        E2bState {
            manager,
            sandboxes,
            users: Arc::default(),
            builds: Arc::default(),
            domain: None,
        }
    }
}

/// Where a sandbox's record keeps what the E2B planes know of it.
pub const ATTRS_KEY: &str = "e2b";

/// What the E2B planes know about a sandbox they created. Kept on its
/// record too ([`ATTRS_KEY`]), so a restarted daemon knows it again.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct E2bSandbox {
    pub id: SandboxId,
    pub tenant: TenantId,
    /// `templateID` as the client gave it.
    pub template: String,
    /// envd's `X-Access-Token` (the API's `envdAccessToken`), also the key
    /// of signed `/files` URLs.
    pub access_token: String,
    /// Commands and files run as this user unless a request names one
    /// (`user` in E2B templates, else `root`).
    pub default_user: String,
    /// The default user's home (the code interpreter's working directory).
    pub home: String,
    /// Where commands start when they name no cwd: the template's working
    /// directory (an E2B-built template's `set_workdir`); `None`: the
    /// user's home.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// What happens when its time to live runs out, and on traffic while
    /// paused (create's `autoPause`, `autoPauseMemory`, `autoResume`).
    pub lifecycle: E2bLifecycle,
    /// Sandbox-wide environment variables (create's `envVars`, `GET /envs`).
    pub env: BTreeMap<String, String>,
    /// E2B's `metadata` (brig labels).
    pub metadata: BTreeMap<String, String>,
    /// `allow_internet_access` as the client last gave it (`None`: never).
    #[serde(default)]
    pub allow_internet_access: Option<bool>,
    /// The `network` configuration as given (egress replaced by updates).
    #[serde(default)]
    pub network: Option<control::NetworkConfig>,
    /// With `allowPublicTraffic: false`: the token every request to one of
    /// its ports (other than envd's) must carry in
    /// `e2b-traffic-access-token`.
    #[serde(default)]
    pub traffic_token: Option<String>,
}

/// Keep what the E2B planes know of `sb` on its record, so a restarted
/// daemon knows it again (a failure is logged: the sandbox runs on).
pub(crate) fn keep(manager: &SandboxManager, sb: &E2bSandbox) {
    match serde_json::to_value(sb) {
        Ok(kept) => {
            if let Err(e) = manager.store().set_attrs(&sb.id, ATTRS_KEY, &kept) {
                tracing::warn!("sandbox {}: cannot keep its E2B state: {e}", sb.id);
            }
        }
        Err(e) => tracing::warn!("sandbox {}: cannot encode its E2B state: {e}", sb.id),
    }
}

/// E2B's `lifecycle` of a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct E2bLifecycle {
    /// `Some`: paused (keeping what it says) rather than killed when its
    /// time to live runs out.
    pub on_timeout: Option<brig_runtime::PauseMode>,
    /// A request to its data plane while it is paused (fully) resumes it.
    pub auto_resume: bool,
}

/// The E2B sandboxes of this daemon, by id.
#[derive(Debug, Default)]
pub struct Registry {
    map: Mutex<HashMap<String, Arc<E2bSandbox>>>,
}

impl Registry {
    pub fn get(&self, id: &str) -> Option<Arc<E2bSandbox>> {
        self.lock().get(id).cloned()
    }

    pub fn insert(&self, sandbox: E2bSandbox) -> Arc<E2bSandbox> {
        let sandbox = Arc::new(sandbox);
        self.lock()
            .insert(sandbox.id.to_string(), Arc::clone(&sandbox));
        sandbox
    }

    pub fn remove(&self, id: &str) -> Option<Arc<E2bSandbox>> {
        self.lock().remove(id)
    }

    /// Keep only the sandboxes `keep` says to (the control plane drops
    /// those that have ended).
    pub fn retain(&self, mut keep: impl FnMut(&E2bSandbox) -> bool) {
        self.lock().retain(|_, sb| keep(sb));
    }

    /// Every sandbox of `tenant`'s.
    pub fn of_tenant(&self, tenant: &TenantId) -> Vec<Arc<E2bSandbox>> {
        self.lock()
            .values()
            .filter(|sb| &sb.tenant == tenant)
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every registered sandbox (the data plane routes a signed `/files`
    /// URL, which names no sandbox, by the token its signature validates).
    pub fn all(&self) -> Vec<Arc<E2bSandbox>> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<E2bSandbox>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The data plane's answer for an unknown or ended sandbox: exactly the
/// body the SDKs key on ("was not found" → `SandboxNotRunningException`,
/// and `is_running()` is false on any 502), reference §2.4.
pub fn sandbox_not_found(id: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(serde_json::json!({
            "sandboxId": id,
            "message": "The sandbox was not found",
            "code": 502,
        })),
    )
        .into_response()
}

/// The sandbox and port of a data-plane request: the routing headers
/// (`E2b-Sandbox-Id`, `E2b-Sandbox-Port`; names are case-insensitive), or,
/// when neither is there, a `Host` of the form `{port}-{id}.{domain}` as
/// `get_host(port)` builds it (E2B's host routing; with
/// `E2B_DOMAIN=localhost`, `http://8000-ID.localhost:49983/` reaches port
/// 8000 of sandbox ID from a browser or curl).
pub fn routing(headers: &HeaderMap) -> (Option<&str>, Option<u16>) {
    let id = headers.get("e2b-sandbox-id").and_then(|v| v.to_str().ok());
    let port = headers
        .get("e2b-sandbox-port")
        .and_then(|v| v.to_str().ok())
        .and_then(|p| p.trim().parse().ok());
    if id.is_none() && port.is_none() {
        if let Some(routed) = headers
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(brig_http::ports::host_route)
        {
            return (Some(routed.0), Some(routed.1));
        }
    }
    (id, port)
}

/// The sandbox an envd request is for, from `E2b-Sandbox-Id`, known to
/// this daemon and still live; a 502 ([`sandbox_not_found`]) otherwise.
/// It does **not** check `X-Access-Token`: envd handlers do, as each
/// endpoint's rules differ (`/health` and signed `/files` need none).
#[derive(Debug, Clone)]
pub struct RoutedSandbox(pub Arc<E2bSandbox>);

impl FromRequestParts<E2bState> for RoutedSandbox {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<Self, Response> {
        let (id, _) = routing(&parts.headers);
        let id = id.unwrap_or_default();
        match state.sandboxes.get(id) {
            // Not once its end has begun (see `envd::dispatch`).
            Some(sb) if !state.manager.is_ending(&sb.id) => Ok(RoutedSandbox(sb)),
            _ => Err(sandbox_not_found(id)),
        }
    }
}

impl RoutedSandbox {
    /// Whether the request carries this sandbox's access token.
    pub fn token_ok(&self, headers: &HeaderMap) -> bool {
        headers
            .get("x-access-token")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| constant_time_eq(t.as_bytes(), self.0.access_token.as_bytes()))
    }
}

/// envd's answer to a missing or wrong `X-Access-Token` (reference §3.5).
pub fn unauthorized_token() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({
            "code": 401,
            "message": "unauthorized access, please provide a valid access token or method signing if supported",
        })),
    )
        .into_response()
}

impl E2bState {
    /// Serving on `domain` (`E2B_DOMAIN`: a DNS name, with `:port` unless
    /// the listener is on 443).
    pub fn with_domain(mut self, domain: &str) -> E2bState {
        self.domain = Some(domain.into());
        self
    }

    /// The `E2B_DOMAIN` of [`E2bState::with_domain`].
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }
}

/// Both planes behind one listener, told apart by host as on E2B's cloud:
/// `api.{domain}` is the control plane (`https://api.{domain}`, where the
/// clients send API calls when only `E2B_DOMAIN` is set), every other
/// name the data plane (`{port}-{id}.{domain}`, routed by
/// [`routing`]). The host's port, if any, plays no part.
pub fn domain_router(state: E2bState, domain: &str) -> axum::Router {
    let api_host = format!("api.{domain}");
    let control = control_router(state.clone());
    let data = data_router(state);
    let dispatch = tower::service_fn(move |req: axum::extract::Request| {
        let host = req
            .headers()
            .get(axum::http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(|h| h.rsplit_once(':').map_or(h, |(name, _port)| name))
            .unwrap_or_default();
        let plane = if host.eq_ignore_ascii_case(&api_host) {
            control.clone()
        } else {
            data.clone()
        };
        tower::ServiceExt::oneshot(plane, req)
    });
    axum::Router::new().fallback_service(dispatch)
}

/// The control plane (`E2B_API_URL`).
pub fn control_router(state: E2bState) -> axum::Router {
    control::router(state)
}

/// The data plane (`E2B_SANDBOX_URL`).
pub fn data_router(state: E2bState) -> axum::Router {
    envd::data_plane(state)
}
