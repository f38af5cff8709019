//! The E2B data plane (`E2B_SANDBOX_URL`): envd on port 49983, and every
//! other port proxied into the sandbox.
//!
//! Every request names its sandbox and port in the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers (reference §2.4); [`dispatch`] checks both,
//! answers an unknown or ended sandbox with the 502 the SDKs key on, sends
//! ports other than 49983 to [`other_port`], checks envd's
//! `X-Access-Token` and hands the request, with its [`Ctx`], to envd's
//! routes:
//!
//! - `connect.rs`: the Connect protocol (JSON codec): unary calls,
//!   streaming envelopes, end-stream, error codes, keepalives;
//! - `process.rs`: `process.Process` (commands and PTYs, as the agent's
//!   background processes the daemon stays attached to);
//! - `filesystem.rs`: `filesystem.Filesystem` (stat, list, mkdir, move,
//!   remove, watches);
//! - `files.rs`: the plain HTTP endpoints (`/health`, `/files`, `/envs`,
//!   `/metrics`).
//!
//! What envd keeps per sandbox (its processes, polling watchers, the users
//! of its `/etc/passwd`) is in [`SandboxEnvd`], dropped when the runtime
//! says the sandbox ended ([`on_end`]).

pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use base64::Engine;
use brig_agent_client::{Connection, ExecRequest};
use brig_core::SandboxId;
use brig_runtime::{ErrorKind, ManagerError, PauseMode, SandboxManager, TenantId};

use self::connect::{Code, ConnectError};
use super::{
    on_end, routing, sandbox_not_found, unauthorized_token, E2bSandbox, E2bState, Ended, ENVD_PORT,
};

/// The data plane: dispatch on `E2b-Sandbox-Port`.
pub fn data_plane(state: E2bState) -> Router {
    let envd = Arc::new(Envd::default());
    on_end(&state.manager, &envd, Envd::forget);
    Router::new()
        .route("/health", get(files::health))
        // Uploads stream to the sandbox: no body limit (axum's default of
        // 2 MB would refuse multipart writes of bigger files).
        .route(
            "/files",
            get(files::download)
                .post(files::upload)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/envs", get(files::envs))
        .route("/metrics", get(files::metrics))
        .route("/process.Process/{method}", post(process::rpc))
        .route("/filesystem.Filesystem/{method}", post(filesystem::rpc))
        .fallback(not_an_envd_route)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            dispatch,
        ))
        .layer(Extension(envd))
        .with_state(state)
}

/// What an envd handler works with: the daemon, the sandbox, and envd's
/// state for it.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub state: E2bState,
    pub sandbox: Arc<E2bSandbox>,
    pub envd: Arc<SandboxEnvd>,
}

impl Ctx {
    pub fn id(&self) -> &SandboxId {
        &self.sandbox.id
    }

    pub fn manager(&self) -> Arc<SandboxManager> {
        Arc::clone(&self.state.manager)
    }

    /// The agent connection (for watches, which the manager does not wrap).
    pub fn connection(&self) -> Result<Arc<Connection>, ConnectError> {
        Ok(self
            .state
            .manager
            .connection(&self.sandbox.tenant, &self.sandbox.id)?)
    }

    /// Run a blocking manager call off the async workers.
    pub async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Ctx) -> Result<T, ConnectError> + Send + 'static,
    ) -> Result<T, ConnectError> {
        let ctx = self.clone();
        tokio::task::spawn_blocking(move || f(&ctx)).await?
    }

    /// The user a request runs as: `Authorization: Basic base64("<user>:")`
    /// (RPCs) or `username` (`/files`), else the sandbox's default user.
    /// Blocking (may read the sandbox's /etc/passwd).
    pub fn user(&self, name: Option<&str>) -> Result<User, ConnectError> {
        let name = name
            .filter(|n| !n.is_empty())
            .unwrap_or(&self.sandbox.default_user);
        if let Some(u) = self.envd.users().get(name) {
            return Ok(u.clone());
        }
        // Not cached: the sandbox may have gained the user since.
        let users = read_passwd(self)?;
        let found = users.get(name).cloned();
        *lock(&self.envd.users) = Arc::new(users);
        found.ok_or_else(|| {
            ConnectError::new(Code::Unauthenticated, format!("invalid username: '{name}'"))
        })
    }

    /// Run `argv` as root to its end; an error with its stderr if it fails.
    pub fn run_root(&self, argv: &[&str]) -> Result<(), ConnectError> {
        let req = ExecRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..ExecRequest::default()
        };
        let process = self
            .state
            .manager
            .exec(&self.sandbox.tenant, &self.sandbox.id, &req)?;
        let (_, stderr, status) = process
            .wait_with_output()
            .map_err(|e| ConnectError::internal(format!("{}: {e}", argv.join(" "))))?;
        if status.success() {
            return Ok(());
        }
        Err(ConnectError::internal(format!(
            "{}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&stderr).trim()
        )))
    }

    /// Give `paths` to `user` (what envd does with everything it creates
    /// for a user); nothing to do for root.
    pub fn chown(&self, user: &User, paths: &[String]) -> Result<(), ConnectError> {
        if user.uid == 0 || paths.is_empty() {
            return Ok(());
        }
        let owner = format!("{}:{}", user.uid, user.gid);
        let mut argv = vec!["chown", "-h", owner.as_str(), "--"];
        argv.extend(paths.iter().map(String::as_str));
        self.run_root(&argv)
    }

    /// Create `dir` and its missing parents, owned by `user` (envd's
    /// `EnsureDirs`). Returns whether `dir` itself was created.
    pub fn ensure_dirs(&self, user: &User, dir: &str) -> Result<bool, ConnectError> {
        use brig_agent_client::{Call, FileKind, Reply};
        let manager = self.manager();
        let (tenant, id) = (&self.sandbox.tenant, &self.sandbox.id);
        // Walk up to the first ancestor that exists: those below it are new.
        let mut missing = Vec::new();
        let mut cur = std::path::Path::new(dir);
        loop {
            match manager.call(
                tenant,
                id,
                &Call::Stat {
                    path: cur.to_string_lossy().into_owned(),
                    xattrs: None,
                },
            ) {
                Ok(Reply::Stat(e)) if e.kind == FileKind::Dir => break,
                Ok(_) => {
                    return Err(ConnectError::invalid(format!(
                        "path '{}' exists but is not a directory",
                        cur.display()
                    )));
                }
                Err(e) => {
                    let e = ConnectError::from(e);
                    if e.code != Code::NotFound {
                        return Err(e);
                    }
                }
            }
            missing.push(cur.to_string_lossy().into_owned());
            match cur.parent() {
                Some(p) => cur = p,
                None => break,
            }
        }
        if missing.is_empty() {
            return Ok(false);
        }
        manager.call(
            tenant,
            id,
            &Call::Mkdir {
                path: dir.to_string(),
                parents: true,
            },
        )?;
        self.chown(user, &missing)?;
        Ok(true)
    }
}

/// A user of the sandbox, from its /etc/passwd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

impl User {
    /// Whom the agent writes files as for this user: nobody in particular
    /// for root (the agent is root), else the user's uid and gid.
    pub fn owner(&self) -> Option<brig_agent_client::FileOwner> {
        (self.uid != 0).then_some(brig_agent_client::FileOwner {
            uid: self.uid,
            gid: self.gid,
        })
    }

    /// envd's path rule (reference §3.5): `~` and relative paths are under
    /// the user's home; an empty path is the home itself.
    pub fn resolve(&self, path: &str) -> String {
        let joined = if path.is_empty() || path == "~" {
            self.home.clone()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{}/{rest}", self.home.trim_end_matches('/'))
        } else if path.starts_with('/') {
            path.to_string()
        } else {
            format!("{}/{path}", self.home.trim_end_matches('/'))
        };
        normalize(&joined)
    }
}

/// `.` and `..` resolved lexically, duplicate slashes removed: an absolute
/// path with no `.`, `..` or empty component, and no `..` above `/`.
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The sandbox's users by name, from its /etc/passwd.
fn read_passwd(ctx: &Ctx) -> Result<HashMap<String, User>, ConnectError> {
    use std::io::Read;
    let mut reader =
        ctx.manager()
            .read_file(&ctx.sandbox.tenant, &ctx.sandbox.id, "/etc/passwd")?;
    let mut text = String::new();
    reader
        .read_to_string(&mut text)
        .map_err(|e| ConnectError::internal(format!("read /etc/passwd: {e}")))?;
    Ok(parse_passwd(&text))
}

fn parse_passwd(text: &str) -> HashMap<String, User> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            (f.len() >= 7).then_some(())?;
            Some(User {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: f[5].to_string(),
            })
        })
        .map(|u| (u.name.clone(), u))
        .collect()
}

/// The user named by `Authorization: Basic base64("<user>:")`, if any.
pub fn basic_user(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let (scheme, b64) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let user = raw.split_once(':').map_or(raw.as_str(), |(u, _)| u);
    Some(user.to_string())
}

/// envd's state across the daemon's sandboxes.
#[derive(Debug, Default)]
pub struct Envd {
    sandboxes: Mutex<HashMap<SandboxId, Arc<SandboxEnvd>>>,
}

impl Envd {
    /// This sandbox's envd state, made on first use. For a sandbox an
    /// earlier daemon created (re-adopted after a restart), first use takes
    /// back the processes that daemon started (see `process::Table::restore`).
    fn for_sandbox(
        &self,
        manager: &Arc<SandboxManager>,
        tenant: &TenantId,
        id: &SandboxId,
    ) -> Arc<SandboxEnvd> {
        let mut map = lock(&self.sandboxes);
        if let Some(s) = map.get(id) {
            return Arc::clone(s);
        }
        let s = Arc::new(SandboxEnvd {
            processes: process::Table::default(),
            watchers: filesystem::Watchers::default(),
            users: Mutex::new(Arc::new(HashMap::new())),
        });
        // Kept only while the sandbox is live. Checked under the lock that
        // `forget` takes: an end published before this check finds the
        // sandbox not live here, one published after it removes the entry.
        if manager.is_live(id) {
            map.insert(id.clone(), Arc::clone(&s));
            if manager.was_adopted(id) {
                s.processes.restore(manager, tenant, id);
            }
        }
        s
    }

    /// Sandboxes that ended take their state with them (processes,
    /// watchers).
    fn forget(&self, ended: Ended<'_>) {
        let mut map = lock(&self.sandboxes);
        match ended {
            Ended::One(id) => drop(map.remove(id)),
            Ended::Missed(manager) => map.retain(|id, _| manager.is_live(id)),
        }
    }
}

/// What envd keeps for one sandbox.
#[derive(Debug)]
pub struct SandboxEnvd {
    pub processes: process::Table,
    pub watchers: filesystem::Watchers,
    users: Mutex<Arc<HashMap<String, User>>>,
}

impl SandboxEnvd {
    fn users(&self) -> Arc<HashMap<String, User>> {
        Arc::clone(&lock(&self.users))
    }
}

/// A request for a paused sandbox created with `autoResume`: resume it (with
/// the time to live it had left, or its create timeout after a pause on
/// timeout) and answer with its connection. `None`
/// if it does not auto-resume: not asked for, or paused filesystem-only
/// (which only an explicit connect resumes, as E2B does).
async fn auto_resume(
    state: &E2bState,
    sandbox: &Arc<E2bSandbox>,
) -> Option<Result<Arc<Connection>, ManagerError>> {
    let manager = Arc::clone(&state.manager);
    if !sandbox.lifecycle.auto_resume || manager.pause_mode(&sandbox.id) != Some(PauseMode::Full) {
        return None;
    }
    let sb = Arc::clone(sandbox);
    let resumed = tokio::task::spawn_blocking(move || {
        // Resumed meanwhile by another request: NotPaused, and fine.
        let _ = manager.resume(&sb.tenant, &sb.id, None);
        manager.connection(&sb.tenant, &sb.id)
    })
    .await
    .ok()?;
    Some(resumed)
}

/// Route a data-plane request (reference §2.4, §2.6): both headers are
/// required; an unknown or ended sandbox is the SDKs' 502; port 49983 is
/// envd (token checked here, except `/health` and `/files`, which has
/// signatures); any other port is proxied.
async fn dispatch(
    State(state): State<E2bState>,
    Extension(envd): Extension<Arc<Envd>>,
    mut req: Request,
    next: Next,
) -> Response {
    let (id, port) = match routing(req.headers()) {
        (Some(id), Some(port)) => (id.to_string(), port),
        // A signed `/files` URL (`download_url()`, `upload_url()`) names no
        // sandbox: it is the one whose token the signature validates.
        (None, None) => match files::signed_sandbox(&state, &req) {
            Some(id) => (id, ENVD_PORT),
            None => return missing_headers(req.headers()),
        },
        _ => return missing_headers(req.headers()),
    };
    // A sandbox whose end has begun is gone for the clients already: the
    // /health probe they send when a stream breaks off must say so.
    let Some(sandbox) = state
        .sandboxes
        .get(&id)
        .filter(|sb| !state.manager.is_ending(&sb.id))
    else {
        return sandbox_not_found(&id);
    };
    let paused = |c: &Result<_, ManagerError>| matches!(c, Err(e) if e.kind() == ErrorKind::Paused);
    let mut conn = state.manager.connection(&sandbox.tenant, &sandbox.id);
    if paused(&conn) {
        if let Some(resumed) = auto_resume(&state, &sandbox).await {
            conn = resumed;
        }
    }
    match conn {
        Ok(_) => {}
        // Paused, and not to be woken by traffic: not there, as E2B's
        // proxy answers for a paused sandbox (its catalog has no entry).
        // So `is_running()` is false, a command raises the clients'
        // not-running error, and `connect` (which resumes) is the way back.
        Err(e) if e.kind() == ErrorKind::Paused => return sandbox_not_found(&id),
        Err(_) => return sandbox_not_found(&id),
    }
    if port != ENVD_PORT {
        return other_port(&state, &sandbox, port, req).await;
    }
    let path = req.uri().path();
    let open = path == "/health" || path == "/files";
    if !open && !token_ok(&sandbox, req.headers()) {
        return unauthorized_token();
    }
    let ctx = Ctx {
        envd: envd.for_sandbox(&state.manager, &sandbox.tenant, &sandbox.id),
        state,
        sandbox,
    };
    req.extensions_mut().insert(ctx);
    next.run(req).await
}

/// Whether a request carries the sandbox's envd access token (a sandbox
/// created without one accepts every request).
pub fn token_ok(sandbox: &Arc<E2bSandbox>, headers: &HeaderMap) -> bool {
    sandbox.access_token.is_empty() || super::RoutedSandbox(Arc::clone(sandbox)).token_ok(headers)
}

fn missing_headers(headers: &HeaderMap) -> Response {
    let (id, _) = routing(headers);
    let message = match (id, headers.get("e2b-sandbox-port")) {
        (None, _) => "missing header E2b-Sandbox-Id: the data plane routes every request by \
                      the E2b-Sandbox-Id and E2b-Sandbox-Port headers (set E2B_SANDBOX_URL \
                      with an E2B SDK >= 2.7.0)"
            .to_string(),
        (Some(_), None) => "missing header E2b-Sandbox-Port (49983 for envd)".to_string(),
        (Some(_), Some(p)) => format!(
            "invalid E2b-Sandbox-Port {:?}: a port number is expected",
            String::from_utf8_lossy(p.as_bytes())
        ),
    };
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({ "message": message, "code": 400 })),
    )
        .into_response()
}

/// A request for a port other than envd's (the code interpreter's 49999
/// included): proxied to that port inside the sandbox, HTTP and WebSocket.
async fn other_port(
    state: &E2bState,
    sandbox: &E2bSandbox,
    port: u16,
    mut req: Request,
) -> Response {
    use brig_http::ports::{proxy, ProxyError};
    let id = sandbox.id.to_string();
    // `allowPublicTraffic: false`: only with its token (which the sandbox
    // is not sent).
    if let Some(token) = &sandbox.traffic_token {
        let given = req
            .headers_mut()
            .remove(TRAFFIC_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok().map(str::to_owned));
        if !given.is_some_and(|t| crate::constant_time_eq(t.as_bytes(), token.as_bytes())) {
            return (
                StatusCode::FORBIDDEN,
                Json(serde_json::json!({
                    "sandboxId": id,
                    "message": "this sandbox's traffic is not public: send the \
                                trafficAccessToken its create returned in the \
                                e2b-traffic-access-token header",
                    "code": 403,
                })),
            )
                .into_response();
        }
    }
    // `maskRequestHost`: the Host the sandbox's server sees.
    if let Some(mask) = sandbox
        .network
        .as_ref()
        .and_then(|n| n.mask_request_host.as_deref())
    {
        if let Ok(host) = mask.replace("${PORT}", &port.to_string()).parse() {
            req.extensions_mut()
                .insert(brig_http::ports::UpstreamHost(host));
        }
    }
    match proxy(
        Arc::clone(&state.manager),
        sandbox.tenant.clone(),
        sandbox.id.clone(),
        port,
        req,
    )
    .await
    {
        Ok(resp) => resp,
        Err(ProxyError::PortClosed { .. }) => port_closed(&id, port),
        Err(ProxyError::Manager(_)) => sandbox_not_found(&id),
        Err(e) => (
            StatusCode::BAD_GATEWAY,
            Json(serde_json::json!({
                "sandboxId": id,
                "message": e.to_string(),
                "code": 502,
                "port": port,
            })),
        )
            .into_response(),
    }
}

/// The header that carries a non-public sandbox's traffic token.
const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// The SDKs' "port is not open" answer (→ `SandboxUnreachableException`).
pub fn port_closed(id: &str, port: u16) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(serde_json::json!({
            "sandboxId": id,
            "message": "The sandbox is running but port is not open",
            "code": 502,
            "port": port,
        })),
    )
        .into_response()
}

async fn not_an_envd_route(req: Request) -> Response {
    ConnectError::new(
        Code::Unimplemented,
        format!("envd has no {} {}", req.method(), req.uri().path()),
    )
    .into_response()
}

/// Lock a mutex; every critical section here leaves its data consistent.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> User {
        User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/user".into(),
        }
    }

    #[test]
    fn paths_resolve_against_home() {
        let u = user();
        assert_eq!(u.resolve(""), "/home/user");
        assert_eq!(u.resolve("~"), "/home/user");
        assert_eq!(u.resolve("~/a/b"), "/home/user/a/b");
        assert_eq!(u.resolve("a.txt"), "/home/user/a.txt");
        assert_eq!(u.resolve("/tmp//x/../y/."), "/tmp/y");
        assert_eq!(u.resolve("/"), "/");
    }

    #[test]
    fn basic_auth_names_the_user() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h), None);
        h.insert("authorization", "Basic cm9vdDo=".parse().unwrap());
        assert_eq!(basic_user(&h).as_deref(), Some("root"));
        h.insert("authorization", "Bearer x".parse().unwrap());
        assert_eq!(basic_user(&h), None);
    }

    #[test]
    fn passwd_lines_parse() {
        let users = parse_passwd(
            "root:x:0:0:root:/root:/bin/bash\nbad\nuser:x:1000:1001::/home/user:/bin/sh\n",
        );
        assert_eq!(users["root"].home, "/root");
        assert_eq!(users["user"].gid, 1001);
        assert_eq!(users.len(), 2);
    }
}
