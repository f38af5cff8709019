//! Streamable HTTP at `/mcp`, for `brig serve --mcp`: rmcp's
//! [`StreamableHttpService`] behind a middleware that checks the brig key
//! in `Authorization: Bearer <key>` (brig-http's [`Auth`]) before the MCP
//! layer sees the request, and hands the tenant on in the request's
//! extensions, where [`BrigMcp`](crate::BrigMcp) reads it for every call.
//!
//! Sessions (protocol revisions with the `initialize` handshake, up to
//! 2025-11-25) get an `Mcp-Session-Id`; a session's sandboxes end when the
//! client deletes it (the SDKs do on close) or after it has been idle for
//! [`SESSION_IDLE`](crate::SESSION_IDLE). A client of the stateless revision
//! (2026-07-28) has no session: its default sandbox is one per key, and
//! its sandboxes live until their timeout.
//!
//! The `Host` check rmcp makes against DNS rebinding is off: every request
//! must carry a brig key, which a page in a browser does not have, and a
//! daemon may serve on any address its operator chooses.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use brig_http::{Auth, AuthRejection};
use brig_runtime::SandboxManager;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;

use crate::{BrigMcp, Shared};

/// Where the daemon serves MCP.
pub const PATH: &str = "/mcp";
/// The largest MCP request: an `upload_file` of a few tens of MiB.
const MAX_BODY: usize = 64 << 20;

/// `/mcp`, to merge into the daemon's router.
pub fn router(shared: Arc<Shared>) -> Router {
    let named = Arc::clone(&shared);
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(MAX_BODY);
    let factory_shared = Arc::clone(&shared);
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(crate::SESSION_IDLE);
    let service = StreamableHttpService::new(
        move || Ok(BrigMcp::new(Arc::clone(&factory_shared))),
        Arc::new(sessions),
        config,
    );
    Router::new()
        .route_service(PATH, service)
        // Inside the key check: a named session's end.
        .layer(axum::middleware::from_fn_with_state(named, end_named))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared.manager),
            authenticate,
        ))
}

/// `DELETE /mcp` with [`CLIENT_SESSION`](crate::CLIENT_SESSION): the end of
/// a stateless client's named session (rmcp knows nothing of it); 204
/// whether or not it had made anything.
async fn end_named(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let name = req
        .headers()
        .get(crate::CLIENT_SESSION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let tenant = req.extensions().get::<Auth>().map(|a| a.0.clone());
    match (req.method() == axum::http::Method::DELETE, name, tenant) {
        (true, Some(name), Some(tenant)) if !req.headers().contains_key("mcp-session-id") => {
            crate::end_named_session(&shared, &tenant, &name);
            StatusCode::NO_CONTENT.into_response()
        }
        (false, Some(name), Some(tenant)) => {
            // Any request of the client (the relay's pings too) keeps its
            // session.
            crate::touch_named_session(&shared, &tenant, &name);
            next.run(req).await
        }
        _ => next.run(req).await,
    }
}

/// Refuse a request without a valid key (401, a JSON body saying what to
/// send); put the key's tenant in the request's extensions.
async fn authenticate(
    State(manager): State<Arc<SandboxManager>>,
    mut req: Request,
    next: Next,
) -> Response {
    let key = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|k| k.trim().to_string());
    let refused = |message: String, status: StatusCode| {
        let mut r = (
            status,
            axum::Json(json!({ "code": "unauthorized", "message": message })),
        )
            .into_response();
        r.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer realm=\"brig\""),
        );
        r
    };
    let Some(key) = key else {
        return refused(
            "no api key: send Authorization: Bearer <brig key> (the local one is in \
             $BRIG_HOME/local.key; `brig keys create` makes more)"
                .into(),
            StatusCode::UNAUTHORIZED,
        );
    };
    match Auth::with_key(&manager, key).await {
        Ok(auth) => {
            let delete = req.method() == axum::http::Method::DELETE;
            req.extensions_mut().insert(auth);
            let mut resp = next.run(req).await;
            // rmcp accepts a session's end with 202; the SDKs look for
            // 200 or 204 (the Python one warns "Session termination
            // failed: 202"). The session is gone either way.
            if delete && resp.status() == StatusCode::ACCEPTED {
                *resp.status_mut() = StatusCode::NO_CONTENT;
            }
            resp
        }
        Err(AuthRejection::Key(e)) if e.is_rejection() => refused(
            format!("{e}: send Authorization: Bearer <a valid brig key>"),
            StatusCode::UNAUTHORIZED,
        ),
        Err(e) => refused(
            format!("cannot check the api key: {e}"),
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
    }
}
