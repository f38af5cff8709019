//! The E2B control plane (`E2B_API_URL`): E2B's REST API on the manager.
//!
//! Every route of the `Sandbox` lifecycle the official clients call
//! (reference §1.3), v1 and v2: create, connect (resumes a paused
//! sandbox), the legacy resume, kill, timeout, get, list (v2 with metadata
//! and state filters and `X-Next-Token` paging; the legacy running-only
//! list), metrics and pause. Status codes and field names are E2B's
//! exactly (`wire.rs`); every error is `{"code": <int>, "message"}`.
//!
//! `X-API-KEY` is a brig API key, checked like the native API's bearer
//! key, and scopes every call to its tenant: another tenant's sandbox is
//! not found. Only sandboxes created through this plane exist here (they
//! are in the [`Registry`](super::Registry)); an entry whose sandbox has
//! ended (kill, expiry, death) is dropped when the runtime says it ended
//! ([`on_end`], followed by a task the router starts when
//! it is built inside a tokio runtime), and at once by any call that finds
//! it ended.

pub mod interpreter;
mod network;
mod secrets;
mod snapshots;
mod tags;
pub mod templates;
mod time;
pub mod volumes;
mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, RawQuery, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use brig_core::{EnvVar, Isolation, Limits, SandboxId, TemplateRef};

pub use interpreter::InterpreterError;
pub use time::{parse_rfc3339, rfc3339};
use wire::{Detail, Metric};
pub use wire::{E2bError, NetworkConfig};

use super::{on_end, E2bLifecycle, E2bSandbox, E2bState, Ended, Registry};
use brig_http::{blocking, Auth, AuthRejection};
use brig_runtime::{CreateConfig, ManagerError, SandboxManager};

use brig_runtime::{PauseMode, Resumed, SandboxRecord, SandboxState, TenantId};

/// The metadata key an E2B client sets to pick brig's isolation tier
/// (`process`, the default, or `gvisor`): `Sandbox.create(metadata=
/// {"brig.isolation": "gvisor"})`.
pub const ISOLATION_KEY: &str = "brig.isolation";

/// A sandbox's time to live when create names none (E2B's default).
pub const DEFAULT_TIMEOUT_SECS: i64 = 300;
/// Page size of `GET /v2/sandboxes` when the client names none, and the
/// most it may ask for.
const MAX_PAGE: usize = 100;

/// Every control-plane route.
pub fn router(state: E2bState) -> Router {
    on_end(&state.manager, &state.sandboxes, forget);
    Router::new()
        .route("/sandboxes", post(create).get(list_legacy))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/snapshots", get(snapshots::list))
        .route("/volumes", post(volumes::create).get(volumes::list))
        .route("/volumes/{id}", get(volumes::get).delete(volumes::delete))
        .route(
            "/volumecontent/{id}/path",
            get(volumes::stat)
                .patch(volumes::patch)
                .delete(volumes::remove),
        )
        .route(
            "/volumecontent/{id}/dir",
            get(volumes::list_dir).post(volumes::make_dir),
        )
        .route(
            "/volumecontent/{id}/file",
            get(volumes::read_file).put(volumes::write_file),
        )
        .route("/templates/{id}", axum::routing::delete(tags::delete))
        .route("/templates/tags", post(tags::assign).delete(tags::remove))
        .route("/templates/{id}/tags", get(tags::list))
        .route(
            "/sandboxes/{id}/network",
            axum::routing::put(network::update),
        )
        .route("/secrets", post(secrets::create).get(secrets::list))
        .route(
            "/secrets/{id}",
            get(secrets::get)
                .post(secrets::update)
                .delete(secrets::delete),
        )
        .route("/v3/templates", post(templates::request))
        .route(
            "/templates/{id}/files/{hash}",
            get(templates::upload_link)
                .put(templates::upload)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/v2/templates/{id}/builds/{build}", post(templates::start))
        .route(
            "/templates/{id}/builds/{build}/status",
            get(templates::status),
        )
        .route("/templates/aliases/{alias}", get(templates::alias))
        .fallback(|| async {
            E2bError::new(
                StatusCode::NOT_FOUND,
                "no such endpoint: brig serves E2B's sandbox lifecycle API (docs/e2b.md)",
            )
        })
        .method_not_allowed_fallback(|| async {
            E2bError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "this endpoint does not take that method",
            )
        })
        .with_state(state)
}

/// Drop the registry entries of sandboxes that have ended.
fn forget(registry: &Registry, ended: Ended<'_>) {
    match ended {
        Ended::One(id) => drop(registry.remove(id.as_str())),
        Ended::Missed(manager) => registry.retain(|sb| manager.is_live(&sb.id)),
    }
}

/// The tenant of a control-plane request, from `X-API-KEY` (a brig key).
#[derive(Debug, Clone)]
pub struct ApiKey(pub TenantId);

impl FromRequestParts<E2bState> for ApiKey {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<ApiKey, E2bError> {
        let key = parts
            .headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .ok_or_else(|| {
                E2bError::new(
                    StatusCode::UNAUTHORIZED,
                    "missing X-API-KEY: set E2B_API_KEY to a brig API key (brig keys e2b prints the local one)",
                )
            })?;
        match Auth::with_key(&state.manager, key).await {
            Ok(Auth(tenant)) => Ok(ApiKey(tenant)),
            Err(AuthRejection::Key(e)) if !e.is_rejection() => Err(E2bError::internal(&e)),
            Err(AuthRejection::Task(e)) => Err(E2bError::internal(&e)),
            // Refused (brig-http logged why).
            Err(_) => Err(E2bError::new(
                StatusCode::UNAUTHORIZED,
                "invalid X-API-KEY: set E2B_API_KEY to a brig API key of this daemon (brig keys e2b prints the local one; brig keys create makes another)",
            )),
        }
    }
}

/// One of `tenant`'s E2B sandboxes that is still live; 404 otherwise (and
/// an ended one leaves the registry).
fn lookup(state: &E2bState, tenant: &TenantId, id: &str) -> Result<Arc<E2bSandbox>, E2bError> {
    let sb = state
        .sandboxes
        .get(id)
        .filter(|sb| &sb.tenant == tenant)
        .ok_or_else(|| E2bError::not_found(id))?;
    if !state.manager.is_live(&sb.id) {
        state.sandboxes.remove(id);
        return Err(E2bError::not_found(id));
    }
    Ok(sb)
}

/// A timeout in seconds from a request (E2B's `minimum: 0`), or a 400.
/// Zero is E2B's too: the sandbox's end is now (its API sets `endAt` to
/// the moment of the call and its evictor ends the sandbox on its next
/// round), so brig gives it the shortest lifetime it keeps, 1 ms, and its
/// sweeper ends it on the next round.
fn seconds(t: i64) -> Result<Duration, E2bError> {
    match t {
        ..0 => Err(E2bError::bad_request(format!(
            "invalid timeout {t}: give a number of seconds, 0 or more (0 ends the sandbox now)"
        ))),
        0 => Ok(Duration::from_millis(1)),
        t => Ok(Duration::from_secs(t as u64)),
    }
}

/// envd's access token: 32 random alphanumerics from the OS.
fn access_token() -> String {
    brig_http::random_token()
}

/// `POST /v2/sandboxes` and `POST /sandboxes`: 201 + `Sandbox`.
async fn create(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: wire::NewSandbox = wire::body(&body)?;
    let lifecycle = lifecycle(&req)?;
    let template_id = req
        .template_id
        .filter(|t| !t.is_empty())
        .ok_or_else(|| E2bError::bad_request("templateID is required (e.g. \"base\")"))?;
    let template = TemplateRef::parse(&template_id)
        .map_err(|e| E2bError::bad_request(format!("templateID {template_id:?}: {e}")))?;
    // A template built through E2B is its team's, and says how big its
    // sandboxes are.
    let built = state
        .manager
        .config()
        .home
        .as_ref()
        .and_then(|home| templates::meta(home, &template_id));
    if built
        .as_ref()
        .is_some_and(|m| m.tenant.as_ref() != Some(&tenant))
    {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            format!("template {template_id} belongs to another team"),
        ));
    }
    let timeout = seconds(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?;
    let env: BTreeMap<String, String> = req.env_vars.unwrap_or_default();
    let env_vars = env
        .iter()
        .map(|(k, v)| EnvVar::parse(&format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| E2bError::bad_request(format!("envVars: {e}")))?;
    let metadata = req.metadata.unwrap_or_default();
    // E2B has no isolation setting: brig reads one from the metadata (kept
    // there, so the client sees what it asked for).
    let isolation = match metadata.get(ISOLATION_KEY) {
        None => Isolation::Process,
        Some(t) => t
            .parse::<Isolation>()
            .map_err(|e| E2bError::bad_request(format!("metadata {ISOLATION_KEY:?}: {e}")))?,
    };
    if !state.manager.tiers().contains(&isolation) {
        return Err(E2bError::bad_request(format!(
            "metadata {ISOLATION_KEY:?}: the {isolation} isolation tier is not offered by this \
             brig server (its operator can run `brig doctor` to see why)"
        )));
    }
    // The network: E2B's settings as a brig policy (`None`: unrestricted,
    // the daemon's default), what brig cannot do refused.
    let given = req.network.clone().unwrap_or_default();
    network::check_supported(given.https_ports.as_deref())?;
    network::check_ingress(&given, req.secure)?;
    if req
        .iam
        .as_ref()
        .and_then(|i| i.get("tokens"))
        .and_then(|t| t.as_object())
        .is_some_and(|t| !t.is_empty())
    {
        return Err(E2bError::bad_request(
            "iam workload-identity tokens are not supported by this brig server yet: create the \
             sandbox without `iam`",
        ));
    }
    let policy = network::policy(
        req.allow_internet_access,
        given.allow_out.as_deref().unwrap_or_default(),
        given.deny_out.as_deref().unwrap_or_default(),
        given.rules.as_ref(),
        given.egress_proxy.as_ref(),
    )?;
    let traffic_token = (given.allow_public_traffic == Some(false)).then(access_token);
    let config = CreateConfig {
        template,
        env: env_vars,
        labels: metadata.clone(),
        timeout: Some(timeout),
        // E2B's `user` has passwordless sudo, which needs setuid binaries
        // to work (they can only become the sandbox's own root).
        allow_setuid: true,
        limits: Limits {
            memory: if let Some(mb) = built.as_ref().and_then(|m| m.memory_mb) {
                brig_core::ByteSize::mib(mb)
            } else if interpreter::wanted(&template_id) {
                interpreter::MEMORY
            } else {
                Limits::default().memory
            },
            cpus: built.as_ref().and_then(|m| m.cpu_count).map(f64::from),
            ..Limits::default()
        },
        // E2B's clients give up after 60 s: a template still to be built
        // is a 503 they retry, not a request held for minutes.
        wait_for_template: false,
        // Nothing restricted: E2B's open internet where there is a network
        // (a daemon without one still creates, with loopback only).
        network: policy.or_else(|| state.manager.config().gateway.is_some().then(network::open)),
        isolation,
        ..CreateConfig::default()
    };

    // All of it on one blocking task, which runs to its end even if the
    // client goes away meanwhile: the sandbox is then registered (and
    // listed, killable, ended by its timeout) rather than unreachable.
    let wanted = Wanted {
        template_id,
        lifecycle,
        timeout,
        env,
        metadata,
        allow_internet_access: req.allow_internet_access,
        // As E2B shows it: never the proxy's password.
        network: req.network.map(|mut n| {
            n.egress_proxy = n.egress_proxy.map(network::without_password);
            n
        }),
        traffic_token,
        warm: false,
    };
    let state2 = state.clone();
    let mounts = req.volume_mounts.unwrap_or_default();
    let sb = tokio::task::spawn_blocking(move || -> Result<Arc<E2bSandbox>, E2bError> {
        let mut config = CreateConfig {
            volumes: volumes::requests(&state2.manager, &tenant, &mounts)?,
            ..config
        };
        let mut wanted = wanted;
        // The code interpreter restored ready where its tier keeps a warm
        // start (made by the first such create).
        if interpreter::wanted(&wanted.template_id) {
            let key = interpreter::warm_key(
                &state2.manager,
                &wanted.template_id,
                config.isolation,
                &config,
            );
            if let Some(key) = key {
                interpreter::prepare_warm(&state2.manager, &tenant, &key, &config)?;
                config.warm = Some(key);
                wanted.warm = true;
            }
        }
        let record = state2.manager.create(&tenant, config)?;
        register(&state2, tenant, record, wanted)
    })
    .await
    .map_err(E2bError::from)??;
    Ok((
        StatusCode::CREATED,
        Json(wire::Sandbox::new(&sb, state.domain())),
    )
        .into_response())
}

/// What an E2B create asked for beyond the sandbox itself: what the
/// planes keep about it (a fork's are its parent's).
#[derive(Debug, Clone)]
pub(crate) struct Wanted {
    pub template_id: String,
    pub lifecycle: E2bLifecycle,
    pub timeout: Duration,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    pub network: Option<wire::NetworkConfig>,
    pub traffic_token: Option<String>,
    /// Restored from the code interpreter's warm start: its server runs.
    pub warm: bool,
}

/// Make a sandbox the manager just created an E2B sandbox: its pause on
/// timeout, default user, access token, record of what E2B knows of it,
/// and the code interpreter's server where its template wants one.
pub(crate) fn register(
    state: &E2bState,
    tenant: TenantId,
    record: brig_runtime::SandboxRecord,
    wanted: Wanted,
) -> Result<Arc<E2bSandbox>, E2bError> {
    let manager = &state.manager;
    let registry = &state.sandboxes;
    let users = &state.users;
    let Wanted {
        template_id,
        lifecycle,
        timeout,
        env,
        metadata,
        allow_internet_access,
        network,
        traffic_token,
        warm,
    } = wanted;
    if lifecycle.on_timeout.is_some() {
        manager.pause_on_timeout(&tenant, &record.id, lifecycle.on_timeout, timeout)?;
    }
    // A named template's versioned build (`…/rootfs-N`, what the spec
    // names) never changes.
    let build = record
        .spec
        .get("template")
        .filter(|t| {
            brig_template::recipe(&template_id).is_ok()
                && t["path"].as_str().is_some_and(|p| {
                    std::path::Path::new(p)
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("rootfs-"))
                })
        })
        .cloned();
    let cached = build.as_ref().and_then(|b| lock(users).get(b).cloned());
    let (default_user, home) = match cached {
        Some(known) => known,
        None => {
            let found = default_user(manager, &tenant, &record.id);
            if let Some(b) = build {
                lock(users).insert(b, found.clone());
            }
            found
        }
    };
    // A template built through E2B: its user and working directory are
    // the defaults, its start command runs (below).
    let startup = templates::startup(manager, &template_id);
    let default_user = startup
        .as_ref()
        .and_then(|s| s.user.clone())
        .unwrap_or(default_user);
    let sb = registry.insert(E2bSandbox {
        id: record.id,
        tenant,
        template: template_id,
        access_token: access_token(),
        default_user,
        home,
        workdir: startup.as_ref().and_then(|s| s.workdir.clone()),
        lifecycle,
        env,
        metadata,
        allow_internet_access,
        network,
        traffic_token,
    });
    // Kept on its record: a restarted daemon knows it again.
    crate::keep(manager, &sb);
    // Ended before it was registered: its end was published before
    // (or while) it went in, so the registry's follower may have missed
    // it; not live is the same as gone.
    if !manager.is_live(&sb.id) {
        registry.remove(sb.id.as_str());
    }
    if let Some(startup) = &startup {
        let cwd = sb.workdir.clone().unwrap_or_else(|| sb.home.clone());
        let started = templates::run_startup(
            manager,
            &sb.tenant,
            &sb.id,
            &sb.default_user,
            &cwd,
            &sb.env,
            startup,
        );
        if let Err(why) = started {
            registry.remove(sb.id.as_str());
            let _ = manager.delete(&sb.tenant, &sb.id);
            return Err(E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, why));
        }
    }
    if interpreter::wanted(&sb.template) {
        let started = if warm {
            interpreter::resume_warm(manager, &sb)
        } else {
            interpreter::start(manager, &sb)
        };
        if let Err(e) = started {
            tracing::warn!("{e}");
            registry.remove(sb.id.as_str());
            let _ = manager.delete(&sb.tenant, &sb.id);
            return Err(E2bError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                error_chain(&e),
            ));
        }
    }
    Ok(sb)
}

/// What create's `autoPause`, `autoPauseMemory` and `autoResume` ask for,
/// checked as the clients check them.
fn lifecycle(req: &wire::NewSandbox) -> Result<E2bLifecycle, E2bError> {
    let pause = req.auto_pause == Some(true);
    let memory = req.auto_pause_memory.unwrap_or(true);
    let auto_resume = req.auto_resume.as_ref().is_some_and(|a| a.enabled);
    if !pause && req.auto_pause_memory.is_some() {
        return Err(E2bError::bad_request(
            "autoPauseMemory needs autoPause: true (it says what the pause on timeout keeps)",
        ));
    }
    if auto_resume && !pause {
        return Err(E2bError::bad_request(
            "autoResume.enabled needs autoPause: true (only a sandbox paused on timeout can be resumed by traffic)",
        ));
    }
    if auto_resume && !memory {
        return Err(E2bError::bad_request(
            "autoResume cannot be combined with autoPauseMemory: false: a filesystem-only pause is resumed only by connect",
        ));
    }
    Ok(E2bLifecycle {
        on_timeout: pause.then_some(if memory {
            PauseMode::Full
        } else {
            PauseMode::Filesystem
        }),
        auto_resume,
    })
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `err: its source`, for a message that says what went wrong inside.
fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut next = err.source();
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

/// The user commands run as by default, and its home: `user` if the
/// template's /etc/passwd has it (E2B's templates do), else `root`. Read
/// inside the new sandbox, which sees exactly its template's files
/// whatever kind of template it is.
pub fn default_user(
    manager: &SandboxManager,
    tenant: &TenantId,
    id: &SandboxId,
) -> (String, String) {
    let mut passwd = String::new();
    if let Ok(mut f) = manager.read_file(tenant, id, "/etc/passwd") {
        let _ = std::io::Read::read_to_string(&mut f, &mut passwd);
    }
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() >= 7 && f[0] == "user")
        .map(|f| ("user".to_string(), f[5].to_string()))
        .unwrap_or_else(|| ("root".to_string(), "/root".to_string()))
}

/// `POST /v2/sandboxes/{id}/connect` and `POST /sandboxes/{id}/connect`:
/// a running sandbox answers 200 and its time to live is only ever
/// extended; a paused one is resumed (201).
async fn connect(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: wire::Connect = wire::body(&body)?;
    let timeout = seconds(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?;
    let reboot = req.memory == Some(false);
    let (sb, resumed) = on_sandbox(&state, tenant, &id, move |manager, tenant, sid| {
        let record = manager.get(tenant, sid)?;
        if record.state == SandboxState::Paused {
            let (_, resumed) = manager.resume_with(tenant, sid, Some(timeout), reboot)?;
            return Ok(Some(resumed));
        }
        // Saturating: a valid timeout of i64::MAX / 1000 s has milliseconds
        // that overflow the sum (a panic in a debug build; in a release
        // one it wrapped, and the sandbox was not extended).
        let wanted =
            now_millis().saturating_add(i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX));
        if wanted > record.expires_at {
            manager.extend(tenant, sid, timeout)?;
        }
        Ok(None)
    })
    .await?;
    let status = match resumed {
        Some(resumed) => {
            restart_after(&state, &sb, resumed).await?;
            StatusCode::CREATED
        }
        None => StatusCode::OK,
    };
    Ok((status, Json(wire::Sandbox::new(&sb, state.domain()))).into_response())
}

/// After a resume that ended the sandbox's processes (a filesystem-only
/// pause, or `memory: false`), start again what brig runs in it: the code
/// interpreter, as on create.
pub(crate) async fn restart_after(
    state: &E2bState,
    sb: &Arc<E2bSandbox>,
    resumed: Resumed,
) -> Result<(), E2bError> {
    if !resumed.rebooted || !interpreter::wanted(&sb.template) {
        return Ok(());
    }
    let (manager, sb) = (Arc::clone(&state.manager), Arc::clone(sb));
    tokio::task::spawn_blocking(move || interpreter::start(&manager, &sb))
        .await
        .map_err(E2bError::from)?
        .map_err(|e| E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, error_chain(&e)))
}

/// `POST /sandboxes/{id}/resume` (Python 2.0–2.3): 201, or 409 if it is
/// not paused.
async fn resume(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, E2bError> {
    let req: wire::Connect = wire::body(&body)?;
    let timeout = seconds(req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS))?;
    let reboot = req.memory == Some(false);
    let (sb, (_, resumed)) = on_sandbox(&state, tenant, &id, move |manager, tenant, sid| {
        manager.resume_with(tenant, sid, Some(timeout), reboot)
    })
    .await?;
    restart_after(&state, &sb, resumed).await?;
    Ok((
        StatusCode::CREATED,
        Json(wire::Sandbox::new(&sb, state.domain())),
    )
        .into_response())
}

/// A sandbox that ended during the call is not found, as it will be from
/// now on.
fn ended_is_not_found(state: &E2bState, id: &str, e: E2bError) -> E2bError {
    let gone = state
        .sandboxes
        .get(id)
        .is_none_or(|sb| !state.manager.is_live(&sb.id));
    if gone {
        state.sandboxes.remove(id);
        E2bError::not_found(id)
    } else {
        e
    }
}

/// Run `f` on a blocking thread on one of `tenant`'s E2B sandboxes (given
/// the manager, the tenant and its brig id); a sandbox that ended during
/// the call is not found.
async fn on_sandbox<T: Send + 'static>(
    state: &E2bState,
    tenant: TenantId,
    id: &str,
    f: impl FnOnce(&SandboxManager, &TenantId, &SandboxId) -> Result<T, ManagerError> + Send + 'static,
) -> Result<(Arc<E2bSandbox>, T), E2bError> {
    let sb = lookup(state, &tenant, id)?;
    let (manager, sid) = (Arc::clone(&state.manager), sb.id.clone());
    let out = blocking(move || f(&manager, &tenant, &sid))
        .await
        .map_err(|e| ended_is_not_found(state, id, e.into()))?;
    Ok((sb, out))
}

/// `DELETE /sandboxes/{id}`: 204 once it is torn down.
async fn kill(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let (_, ended_already) = on_sandbox(&state, tenant, &id, |manager, tenant, sid| {
        // Its end begun by something else (its timeout ran out): E2B's
        // sandbox is gone then, so a kill finds nothing (the SDKs' false),
        // however long the teardown takes.
        let ended_already = manager.is_ending(sid);
        manager.delete(tenant, sid)?;
        Ok(ended_already)
    })
    .await?;
    state.sandboxes.remove(&id);
    if ended_already {
        return Err(E2bError::not_found(&id));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from
/// now (this may shorten its life). 204.
async fn set_timeout(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, E2bError> {
    let req: wire::SetTimeout = wire::body(&body)?;
    let timeout = seconds(
        req.timeout
            .ok_or_else(|| E2bError::bad_request("timeout (seconds) is required"))?,
    )?;
    on_sandbox(&state, tenant, &id, move |manager, tenant, sid| {
        manager.extend(tenant, sid, timeout)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause` (`{memory?}`; `false` keeps the files
/// only): 204; 409 if already paused (the SDK then returns `False`).
async fn pause(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, E2bError> {
    let req: wire::Pause = wire::body(&body)?;
    let mode = match req.memory {
        Some(false) => PauseMode::Filesystem,
        _ => PauseMode::Full,
    };
    on_sandbox(&state, tenant, &id, move |manager, tenant, sid| {
        manager.pause_with(tenant, sid, mode)
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}`: `SandboxDetail`.
async fn info(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
) -> Result<Json<Detail>, E2bError> {
    let (sb, (record, paused)) = on_sandbox(&state, tenant, &id, |manager, tenant, sid| {
        Ok((manager.get(tenant, sid)?, manager.pause_mode(sid)))
    })
    .await?;
    Ok(Json(
        Detail::with_pause(&sb, &record, true, paused).in_domain(state.domain()),
    ))
}

/// `GET /sandboxes/{id}/metrics?start=&end=` (unix seconds, both
/// optional, as E2B's): the `SandboxMetric`s of the sandbox's series (a
/// sample every 5 s while it runs, the last hour kept) taken from `start`
/// (default: its creation) to `end` (default: now), both included, oldest
/// first.
async fn metrics(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<Metric>>, E2bError> {
    let (start, end) = metrics_range(query.as_deref())?;
    let (sb, (samples, record)) = on_sandbox(&state, tenant, &id, move |manager, tenant, sid| {
        let record = manager.get(tenant, sid)?;
        let from = start.map_or(record.created_at, |s| s.saturating_mul(1000));
        // A sample's `timestampUnix` is its second: `end` takes all of it.
        let to = end.map_or(i64::MAX, |e| e.saturating_mul(1000).saturating_add(999));
        Ok((manager.metrics_series(tenant, sid, from, to)?, record))
    })
    .await?;
    let cpus = Detail::new(&sb, &record, false).cpu_count;
    Ok(Json(samples.iter().map(|s| Metric::new(s, cpus)).collect()))
}

/// `start` and `end` of a metrics query: whole seconds since the epoch,
/// `start` not after `end`.
fn metrics_range(query: Option<&str>) -> Result<(Option<i64>, Option<i64>), E2bError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
        .map_err(|e| E2bError::bad_request(format!("invalid query string: {e}")))?;
    let (mut start, mut end) = (None, None);
    for (k, v) in pairs {
        let slot = match k.as_str() {
            "start" => &mut start,
            "end" => &mut end,
            // Unknown parameters are ignored, as upstream does.
            _ => continue,
        };
        let secs = v.parse::<i64>().ok().filter(|s| *s >= 0).ok_or_else(|| {
            E2bError::bad_request(format!(
                "{k} must be a Unix time in whole seconds (0 or more), not {v:?}"
            ))
        })?;
        *slot = Some(secs);
    }
    if let (Some(s), Some(e)) = (start, end) {
        if s > e {
            return Err(E2bError::bad_request(format!(
                "start ({s}) is after end ({e}): give a range that runs forwards"
            )));
        }
    }
    Ok((start, end))
}

/// What a listing selects.
#[derive(Debug)]
struct ListQuery {
    metadata: BTreeMap<String, String>,
    running: bool,
    paused: bool,
    template: Option<String>,
    started_after: Option<i64>,
    limit: usize,
    /// `(startedAt ms, id)` of the last item of the previous page.
    after: Option<(i64, String)>,
    descending: bool,
}

impl ListQuery {
    /// Parse `GET /v2/sandboxes`' query (reference §1.4, "List query
    /// details"). Unknown parameters are ignored, as upstream does.
    fn parse(query: Option<&str>) -> Result<ListQuery, E2bError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
            .map_err(|e| E2bError::bad_request(format!("invalid query string: {e}")))?;
        let mut q = ListQuery {
            metadata: BTreeMap::new(),
            running: false,
            paused: false,
            template: None,
            started_after: None,
            limit: MAX_PAGE,
            after: None,
            descending: true,
        };
        let mut any_state = false;
        for (k, v) in pairs {
            match k.as_str() {
                // `k=v&k2=v2`, keys and values percent-encoded, sent as one
                // value: decoded by the query parser, then as a form, then
                // each key and value once more (as upstream does).
                "metadata" => {
                    let inner: Vec<(String, String)> =
                        serde_urlencoded::from_str(&v).map_err(|e| {
                            E2bError::bad_request(format!("invalid metadata filter {v:?}: {e}"))
                        })?;
                    for (mk, mv) in inner {
                        match (unescape(&mk), unescape(&mv)) {
                            (Some(mk), Some(mv)) => q.metadata.insert(mk, mv),
                            _ => {
                                return Err(E2bError::bad_request(format!(
                                    "invalid metadata filter {v:?}: bad percent-encoding"
                                )))
                            }
                        };
                    }
                }
                "state" => {
                    for s in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                        any_state = true;
                        match s {
                            "running" => q.running = true,
                            "paused" => q.paused = true,
                            _ => {
                                return Err(E2bError::bad_request(format!(
                                    "invalid state {s:?}: use running, paused or both \
                                     (state=running,paused)"
                                )));
                            }
                        }
                    }
                }
                "template" => q.template = Some(v),
                "startedAfter" => {
                    q.started_after = Some(parse_rfc3339(&v).ok_or_else(|| {
                        E2bError::bad_request(format!(
                            "invalid startedAfter {v:?}: use RFC 3339, e.g. 2026-01-01T00:00:00Z"
                        ))
                    })?)
                }
                "limit" => {
                    q.limit = v
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=MAX_PAGE).contains(n))
                        .ok_or_else(|| {
                            E2bError::bad_request(format!(
                                "invalid limit {v:?}: use a number from 1 to {MAX_PAGE}"
                            ))
                        })?
                }
                "nextToken" if !v.is_empty() => {
                    let bad = || {
                        E2bError::bad_request(format!(
                            "invalid nextToken {v:?}: pass back the X-Next-Token of the previous \
                             page unchanged"
                        ))
                    };
                    let (at, id) = v.split_once('.').ok_or_else(bad)?;
                    q.after = Some((at.parse().map_err(|_| bad())?, id.to_string()));
                }
                "order" => {
                    q.descending = match v.as_str() {
                        "desc" => true,
                        "asc" => false,
                        _ => {
                            return Err(E2bError::bad_request(format!(
                                "invalid order {v:?}: use asc or desc"
                            )));
                        }
                    }
                }
                _ => {}
            }
        }
        if !any_state {
            (q.running, q.paused) = (true, true);
        }
        Ok(q)
    }

    fn selects(&self, sb: &E2bSandbox, record: &SandboxRecord) -> bool {
        let state_ok = match record.state {
            SandboxState::Running => self.running,
            SandboxState::Paused => self.paused,
            _ => false,
        };
        state_ok
            && self
                .metadata
                .iter()
                .all(|(k, v)| sb.metadata.get(k) == Some(v))
            && self.template.as_ref().is_none_or(|t| t == &sb.template)
            && self.started_after.is_none_or(|t| record.created_at >= t)
    }
}

/// The tenant's sandboxes the query selects, in its order, one page: the
/// items and the next page's token.
async fn select(
    state: &E2bState,
    tenant: TenantId,
    q: ListQuery,
) -> Result<(Vec<Detail>, Option<String>), E2bError> {
    let mine: Vec<Arc<E2bSandbox>> = state.sandboxes.of_tenant(&tenant);
    let manager = Arc::clone(&state.manager);
    let domain = state.domain().map(str::to_string);
    blocking(move || {
        let mut rows: Vec<(Arc<E2bSandbox>, SandboxRecord)> = Vec::new();
        for sb in mine {
            // Ended meanwhile: skipped; its end event drops it.
            let Ok(record) = manager.get(&tenant, &sb.id) else {
                continue;
            };
            if q.selects(&sb, &record) {
                rows.push((sb, record));
            }
        }
        let key = |r: &SandboxRecord| (r.created_at, r.id.as_str().to_string());
        rows.sort_by_key(|(_, r)| key(r));
        if q.descending {
            rows.reverse();
        }
        if let Some(after) = &q.after {
            rows.retain(|(_, r)| {
                if q.descending {
                    key(r) < *after
                } else {
                    key(r) > *after
                }
            });
        }
        let next = (rows.len() > q.limit).then(|| {
            let (_, r) = &rows[q.limit - 1];
            format!("{}.{}", r.created_at, r.id)
        });
        rows.truncate(q.limit);
        let items = rows
            .iter()
            .map(|(sb, r)| Detail::new(sb, r, false).in_domain(domain.as_deref()))
            .collect();
        Ok::<_, ManagerError>((items, next))
    })
    .await
    .map_err(E2bError::from)
}

/// `GET /v2/sandboxes`: `ListedSandbox[]`, the next page's token in
/// `X-Next-Token` (absent on the last page).
async fn list(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    RawQuery(query): RawQuery,
) -> Result<Response, E2bError> {
    let q = ListQuery::parse(query.as_deref())?;
    let (items, next) = select(&state, tenant, q).await?;
    let mut headers = HeaderMap::new();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        headers.insert("x-next-token", next);
    }
    Ok((headers, Json(items)).into_response())
}

/// `GET /sandboxes` (deprecated; Python 1.x): every running sandbox,
/// optionally filtered by `metadata`, in one answer.
async fn list_legacy(
    State(state): State<E2bState>,
    ApiKey(tenant): ApiKey,
    RawQuery(query): RawQuery,
) -> Result<Json<Vec<Detail>>, E2bError> {
    let mut q = ListQuery::parse(query.as_deref())?;
    (q.running, q.paused, q.limit, q.after) = (true, false, usize::MAX - 1, None);
    Ok(Json(select(&state, tenant, q).await?.0))
}

/// Undo percent-encoding (`+` is a space, as in a query string); `None`
/// if an escape is malformed or the result is not UTF-8.
fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = s.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
