//! brig-mcp: brig as a Model Context Protocol server, on the official Rust
//! SDK (`rmcp`). Any MCP client (a desktop assistant, an IDE agent, an agent
//! framework) gets sandboxes as tools.
//!
//! Start reading at [`BrigMcp`], the one [`ServerHandler`]: every tool
//! (`tools.rs` declares them: arguments, schemas, descriptions), the
//! resources (a sandbox's files as `brig://SANDBOX/PATH`, `files.rs`), and
//! what one MCP session owns ([`Session`]: its default sandbox, created on
//! first use, and the sandboxes it created, ended when the session ends
//! unless asked to persist). The tools are thin: each is one action on the
//! runtime's [`SandboxManager`] (`sandboxes.rs`, `command.rs`, `files.rs`),
//! or, for `run_code`, one `POST /execute` to the code interpreter brig-e2b
//! starts in `code-interpreter-v1` sandboxes (`code.rs`). Failures are
//! tool results with `isError: true` ([`ToolError`]), never protocol errors.
//!
//! Two transports, one handler:
//!
//! - [`http::router`]: streamable HTTP at `/mcp`, mounted by `brig serve
//!   --mcp` on the daemon's listener; each request's `Authorization: Bearer
//!   <key>` decides its tenant (brig-http's `Auth`), so a client sees only
//!   its key's sandboxes;
//! - [`serve_stdio`]: MCP over stdin/stdout for one tenant, what `brig mcp`
//!   runs when no daemon is running (an embedded runtime for the session);
//!   with a daemon, `brig mcp` relays stdio to the daemon's `/mcp` instead,
//!   so the tools run in one place.
#![forbid(unsafe_code)]

pub mod code;
pub mod command;
pub mod error;
pub mod files;
pub mod http;
pub mod sandboxes;
pub mod tools;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use brig_core::SandboxId;
use brig_runtime::{SandboxManager, TenantId};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, Implementation, InitializeResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

pub use error::ToolError;

/// What every session of one server shares.
#[derive(Debug)]
pub struct Shared {
    pub manager: Arc<SandboxManager>,
    /// The template of a session's default sandbox.
    pub default_template: String,
    /// Default sandboxes of clients without a session (the stateless
    /// streamable HTTP of protocol 2026-07-28), one per tenant.
    tenant_defaults: Mutex<HashMap<TenantId, SandboxId>>,
    /// Sandboxes whose code interpreter is up.
    interpreters: Mutex<HashMap<SandboxId, code::Interpreter>>,
    /// Sandboxes made without a timeout, which live while they are used
    /// ([`IDLE_TIMEOUT`] from their last use), and when each was last
    /// extended.
    kept_alive: Mutex<HashMap<SandboxId, std::time::Instant>>,
    /// Each sandbox's default user and home (read once from its
    /// /etc/passwd: a template never changes under a sandbox).
    users: Mutex<HashMap<SandboxId, (String, String)>>,
    /// Sessions of stateless clients that name one ([`CLIENT_SESSION`]:
    /// `brig mcp`'s relay), by tenant and name, until they are deleted.
    /// Each with when it was last used: one idle for [`SESSION_IDLE`] is
    /// ended (its client went away without saying so).
    named: Mutex<HashMap<(TenantId, String), NamedSession>>,
}

impl Shared {
    pub fn new(manager: Arc<SandboxManager>, default_template: impl Into<String>) -> Arc<Shared> {
        let shared = Arc::new(Shared {
            manager: Arc::clone(&manager),
            default_template: default_template.into(),
            tenant_defaults: Mutex::default(),
            interpreters: Mutex::default(),
            users: Mutex::default(),
            kept_alive: Mutex::default(),
            named: Mutex::default(),
        });
        brig_http::on_end(&manager, &shared, |s: &Shared, ended| match ended {
            brig_http::Ended::One(id) => {
                lock(&s.interpreters).remove(id);
                lock(&s.users).remove(id);
                lock(&s.kept_alive).remove(id);
                lock(&s.tenant_defaults).retain(|_, d| d != id);
            }
            brig_http::Ended::Missed(m) => {
                lock(&s.interpreters).retain(|id, _| m.is_live(id));
                lock(&s.users).retain(|id, _| m.is_live(id));
                lock(&s.kept_alive).retain(|id, _| m.is_live(id));
                lock(&s.tenant_defaults).retain(|_, d| m.is_live(d));
            }
        });
        shared
    }
}

/// The header with which a client of the stateless revision (2026-07-28)
/// names a session of its own: its default sandbox and the sandboxes it
/// creates are that session's, and end when it sends `DELETE /mcp` with
/// the same header (`brig mcp`'s relay does, when stdin closes).
pub const CLIENT_SESSION: &str = "brig-mcp-session";

/// How long an HTTP session (a handshake's, or a stateless client's named
/// one) lives unused: its client went away without ending it. `brig mcp`'s
/// relay pings while its stdin is open.
pub const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);

/// How long a sandbox made over MCP without a timeout lives after its last
/// use by a tool (a session's sandboxes end with it before that).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// How often such a sandbox's deadline is pushed back while it is used.
const EXTEND_EVERY: Duration = Duration::from_secs(60);

/// A stateless client's named session and when it was last used.
type NamedSession = (Arc<Session>, std::time::Instant);

/// The template `brig mcp` and `brig serve --mcp` give a default sandbox
/// when told none: the one `run_code` needs.
pub const DEFAULT_TEMPLATE: &str = "code-interpreter-v1";

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What one MCP session owns: its default sandbox and the sandboxes it
/// created. When the session ends (stdin closes; the HTTP session is
/// deleted or times out) the handler is dropped, and with it every
/// sandbox the session made that was not asked to persist.
#[derive(Debug)]
pub struct Session {
    shared: Arc<Shared>,
    /// The one tenant this session acts for (the first key it saw).
    tenant: OnceLock<TenantId>,
    /// Its default sandbox; an async lock, so that two first calls at once
    /// create one sandbox, not two.
    default: tokio::sync::Mutex<Option<SandboxId>>,
    /// Sandboxes ended with the session.
    owned: Mutex<Vec<SandboxId>>,
}

impl Session {
    fn new(shared: Arc<Shared>) -> Arc<Session> {
        Arc::new(Session {
            shared,
            tenant: OnceLock::new(),
            default: tokio::sync::Mutex::new(None),
            owned: Mutex::default(),
        })
    }
}

/// End a named session of a stateless client (its `DELETE /mcp`): its
/// sandboxes end as the session is dropped. False if there was none.
pub fn end_named_session(shared: &Shared, tenant: &TenantId, name: &str) -> bool {
    lock(&shared.named)
        .remove(&(tenant.clone(), name.to_string()))
        .is_some()
}

/// A request of a named session's client: it is still there.
pub fn touch_named_session(shared: &Shared, tenant: &TenantId, name: &str) {
    if let Some((_, used)) = lock(&shared.named).get_mut(&(tenant.clone(), name.to_string())) {
        *used = std::time::Instant::now();
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let owned = std::mem::take(&mut *lock(&self.owned));
        let Some(tenant) = self.tenant.get().cloned() else {
            return;
        };
        if owned.is_empty() {
            return;
        }
        let manager = Arc::clone(&self.shared.manager);
        // Each teardown waits for the sandbox's processes to die: off the
        // async workers, and not holding up whatever dropped the session.
        std::thread::spawn(move || {
            for id in owned {
                match manager.delete(&tenant, &id) {
                    Ok(_) => tracing::info!("mcp: ended sandbox {id} with its session"),
                    Err(e) => tracing::debug!("mcp: sandbox {id} at session end: {e}"),
                }
            }
        });
    }
}

/// The MCP server: one per session (stdio: the process; HTTP: each
/// `Mcp-Session-Id`, or each request of a stateless client).
#[derive(Debug, Clone)]
pub struct BrigMcp {
    session: Arc<Session>,
}

impl BrigMcp {
    /// A session whose tenant comes from each request (`Authorization` on
    /// HTTP, checked by [`http::router`]'s middleware).
    pub fn new(shared: Arc<Shared>) -> BrigMcp {
        BrigMcp {
            session: Session::new(shared),
        }
    }

    /// A session that acts for `tenant` (stdio).
    pub fn for_tenant(shared: Arc<Shared>, tenant: TenantId) -> BrigMcp {
        let mcp = BrigMcp::new(shared);
        let _ = mcp.session.tenant.set(tenant);
        mcp
    }

    fn manager(&self) -> &Arc<SandboxManager> {
        &self.session.shared.manager
    }
}

/// What a tool call needs besides its arguments.
pub(crate) struct Call<'a> {
    pub session: Arc<Session>,
    pub tenant: TenantId,
    /// Whether this call belongs to a session that ends (stdio, or HTTP
    /// with the handshake); a stateless request's sandboxes are the
    /// tenant's until their timeout.
    pub sessioned: bool,
    pub ctx: &'a RequestContext<RoleServer>,
}

impl Call<'_> {
    pub fn manager(&self) -> &Arc<SandboxManager> {
        &self.session.shared.manager
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.session.shared
    }

    /// Report progress, if the client asked for it (a progress token).
    pub async fn progress(&self, progress: f64, message: impl Into<String>) {
        if let Some(token) = self.ctx.meta.get_progress_token() {
            let _ = self
                .ctx
                .peer
                .notify_progress(
                    ProgressNotificationParam::new(token, progress).with_message(message),
                )
                .await;
        }
    }

    /// The sandbox a call names, or the session's default (created now
    /// if it has none, or if its default has ended).
    pub async fn sandbox(&self, named: Option<&str>) -> Result<SandboxId, ToolError> {
        let id = self.resolve(named).await?;
        self.used(&id);
        Ok(id)
    }

    /// [`Call::sandbox`] without counting as a use (`extend_timeout` sets
    /// the deadline itself).
    pub async fn resolve(&self, named: Option<&str>) -> Result<SandboxId, ToolError> {
        Ok(match named {
            Some(s) => SandboxId::parse(s).ok_or_else(|| {
                ToolError::Invalid(format!(
                    "sandbox_id {s:?} is not a sandbox id (12 hex digits, as create_sandbox and \
                     list_sandboxes give them); omit it to use this session's default sandbox"
                ))
            })?,
            None => sandboxes::default_sandbox(self).await?,
        })
    }

    /// A sandbox made without a timeout was used: push its deadline back
    /// to [`IDLE_TIMEOUT`] from now (at most every [`EXTEND_EVERY`], off
    /// the call's path).
    fn used(&self, id: &SandboxId) {
        let now = std::time::Instant::now();
        {
            let mut kept = lock(&self.shared().kept_alive);
            match kept.get_mut(id) {
                Some(last) if now.duration_since(*last) >= EXTEND_EVERY => *last = now,
                _ => return,
            }
        }
        let (m, t, i) = (Arc::clone(self.manager()), self.tenant.clone(), id.clone());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = m.extend(&t, &i, IDLE_TIMEOUT) {
                tracing::debug!("mcp: keeping sandbox {i} alive: {e}");
            }
        });
    }

    /// Keep a sandbox made without a timeout alive while it is used.
    pub fn keep_alive(&self, id: &SandboxId) {
        lock(&self.shared().kept_alive).insert(id.clone(), std::time::Instant::now());
    }

    /// Keep `id` for the session's end (unless it persists).
    pub fn own(&self, id: &SandboxId) {
        if self.sessioned {
            lock(&self.session.owned).push(id.clone());
        }
    }

    pub fn disown(&self, id: &SandboxId) {
        lock(&self.session.owned).retain(|o| o != id);
    }
}

/// How long a tool without its own limit may wait on a command.
pub(crate) const DEFAULT_WAIT: Duration = Duration::from_secs(300);

impl BrigMcp {
    /// The tenant of this request: the session's, or the key's the HTTP
    /// middleware checked; a session stays with the tenant that began it.
    fn tenant(&self, ctx: &RequestContext<RoleServer>) -> Result<TenantId, ToolError> {
        let from_request = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<brig_http::Auth>())
            .map(|a| a.0.clone());
        match (self.session.tenant.get(), from_request) {
            (Some(t), None) => Ok(t.clone()),
            (Some(t), Some(r)) if *t == r => Ok(r),
            (Some(_), Some(_)) => Err(ToolError::Invalid(
                "this MCP session was begun with another API key; start a new session with this \
                 one"
                .into(),
            )),
            (None, Some(r)) => Ok(self.session.tenant.get_or_init(|| r).clone()),
            (None, None) => Err(ToolError::Invalid(
                "no API key: send Authorization: Bearer <brig key>".into(),
            )),
        }
    }

    /// The session a request acts in, and whether it ends (see
    /// [`Call::sessioned`]): this handler's, or a stateless client's named
    /// one ([`CLIENT_SESSION`]).
    fn session_for(
        &self,
        ctx: &RequestContext<RoleServer>,
        tenant: &TenantId,
    ) -> (Arc<Session>, bool) {
        let parts = ctx.extensions.get::<axum::http::request::Parts>();
        let stateless =
            parts.is_some() && ctx.protocol_version().is_none_or(|v| !v.has_initialize());
        let named = parts
            .filter(|_| stateless)
            .and_then(|p| p.headers.get(CLIENT_SESSION))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        match named {
            // A stateless client that names its session (the relay).
            Some(name) => {
                let shared = &self.session.shared;
                let now = std::time::Instant::now();
                let mut named = lock(&shared.named);
                // The idle ones end here (dropped after the lock is let go).
                let idle_keys: Vec<_> = named
                    .iter()
                    .filter(|(_, (_, used))| now.duration_since(*used) > SESSION_IDLE)
                    .map(|(k, _)| k.clone())
                    .collect();
                let idle: Vec<_> = idle_keys.iter().filter_map(|k| named.remove(k)).collect();
                let entry = named.entry((tenant.clone(), name)).or_insert_with(|| {
                    let s = Session::new(Arc::clone(shared));
                    let _ = s.tenant.set(tenant.clone());
                    (s, now)
                });
                entry.1 = now;
                let session = Arc::clone(&entry.0);
                drop(named);
                drop(idle);
                (session, true)
            }
            None => (Arc::clone(&self.session), !stateless),
        }
    }

    async fn dispatch(
        &self,
        request: CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let tenant = self.tenant(ctx)?;
        // Stateless HTTP requests (2026-07-28) have no session to end;
        // stdio and handshake sessions do.
        let (session, sessioned) = self.session_for(ctx, &tenant);
        let call = Call {
            session,
            tenant,
            sessioned,
            ctx,
        };
        let name = request.name.as_ref();
        let args = request.arguments;
        use tools::parse;
        match name {
            "run_code" => code::run_code(&call, parse(name, args)?).await,
            "run_command" => command::run_command(&call, parse(name, args)?).await,
            "create_sandbox" => sandboxes::create(&call, parse(name, args)?).await,
            "read_file" => files::read_file(&call, parse(name, args)?).await,
            "write_file" => files::write_file(&call, parse(name, args)?).await,
            "upload_file" => files::upload_file(&call, parse(name, args)?).await,
            "list_files" => files::list_files(&call, parse(name, args)?).await,
            "start_process" => command::start_process(&call, parse(name, args)?).await,
            "read_process_output" => command::read_output(&call, parse(name, args)?).await,
            "kill_process" => command::kill_process(&call, parse(name, args)?).await,
            "list_sandboxes" => sandboxes::list(&call, parse(name, args)?).await,
            "kill_sandbox" => sandboxes::kill(&call, parse(name, args)?).await,
            "extend_timeout" => sandboxes::extend(&call, parse(name, args)?).await,
            other => Err(ToolError::Invalid(format!(
                "no tool named {other:?}; tools/list names them"
            ))),
        }
    }
}

impl ServerHandler for BrigMcp {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(
            Implementation::new("brig", env!("CARGO_PKG_VERSION"))
                .with_title("brig sandboxes")
                .with_description("Run untrusted code in isolated Linux sandboxes"),
        )
        .with_instructions(
            "brig runs code in isolated Linux sandboxes. run_code (stateful Python and other \
             Jupyter kernels, plots as images) and run_command (shell) work at once on this \
             session's default sandbox; pass sandbox_id to use another from create_sandbox. \
             Files are readable as resources brig://SANDBOX_ID/PATH. Sandboxes created here \
             end with the session unless created with persist: true.",
        )
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let result = match self.dispatch(request, &context).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("mcp: {name}: {e}");
                e.into_result()
            }
        };
        Ok(result.into())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list()))
    }

    fn get_tool(&self, name: &str) -> Option<rmcp::model::Tool> {
        tools::list().into_iter().find(|t| t.name == name)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let tenant = self.tenant(&context).map_err(invalid)?;
        let (session, _) = self.session_for(&context, &tenant);
        let default = match session.default.lock().await.clone() {
            Some(d) => Some(d),
            None => lock(&self.session.shared.tenant_defaults)
                .get(&tenant)
                .cloned(),
        };
        Ok(ListResourcesResult::with_all_items(
            files::list_resources(self.manager(), &tenant, default.as_ref()).await,
        ))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(
            files::resource_templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let tenant = self.tenant(&context).map_err(invalid)?;
        files::read_resource(self.manager(), &tenant, &request.uri)
            .await
            .map(ReadResourceResponse::from)
            .map_err(|e| match e {
                files::ResourceError::NotFound(m) => ErrorData::resource_not_found(m, None),
                files::ResourceError::Invalid(m) => ErrorData::invalid_params(m, None),
            })
    }
}

fn invalid(e: ToolError) -> ErrorData {
    ErrorData::invalid_params(e.to_string(), None)
}

/// Serve MCP over stdin/stdout for `tenant` until the client closes stdin;
/// then the session's sandboxes end.
pub async fn serve_stdio(shared: Arc<Shared>, tenant: TenantId) -> Result<(), ServeError> {
    use rmcp::ServiceExt;
    let server = BrigMcp::for_tenant(shared, tenant)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ServeError(e.to_string()))?;
    server
        .waiting()
        .await
        .map_err(|e| ServeError(e.to_string()))?;
    Ok(())
}

/// The MCP session over stdio failed.
#[derive(Debug, thiserror::Error)]
#[error("mcp over stdio: {0}")]
pub struct ServeError(String);

/// A tool result with machine-readable content beside its text (rmcp has
/// no builder for it).
pub(crate) trait Structured {
    fn with_structured_content(self, value: serde_json::Value) -> Self;
}

impl Structured for CallToolResult {
    fn with_structured_content(mut self, value: serde_json::Value) -> Self {
        self.structured_content = Some(value);
        self
    }
}
