//! A sandbox's ports from outside, three ways (brig-http's [`proxy`] and
//! [`tcp_upgrade`] do the relaying; see there for how bodies, upgrades and
//! headers go):
//!
//! - `ANY /v1/sandboxes/{id}/ports/{port}/{*path}`: HTTP and WebSocket,
//!   with the tenant's key.
//! - `GET /v1/sandboxes/{id}/tcp/{port}` with `Connection: Upgrade`,
//!   `Upgrade: tcp`: raw TCP after `101`, with the tenant's key.
//! - By host name ([`by_host`]): any request whose `Host` is
//!   `{port}-{id}.{domain}` (`http://8000-ID.localhost:7777/`) goes to that
//!   port, path and all — what a browser, a webhook or a preview link
//!   needs. It carries the sandbox's traffic token (`X-Brig-Traffic-Token`,
//!   shown to its tenant as `ports.token`) or the tenant's key, unless the
//!   sandbox was created with `public_ports: true`.
//!
//! Nothing listening on the port: `502 {"code":"port_closed",
//! "message":"sandbox ID: nothing listens on port P"}`. The server closing
//! without an answer: `502 bad_gateway`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use brig_core::SandboxId;
use brig_http::ports::{host_route, proxy, tcp_upgrade, ProxyError};
use brig_http::publish::{PublishError, Published};
use serde::{Deserialize, Serialize};

use super::{blocking, sandbox_id, ApiError, AppState, Auth};

/// The key of what the record keeps about its ports (its `attrs`).
pub const ATTR: &str = "ports";
/// The header a request by host name carries the traffic token in.
pub const TRAFFIC_TOKEN_HEADER: &str = "x-brig-traffic-token";

/// What the record keeps about a sandbox's ports, and `GET` shows its
/// tenant as `ports`.
#[derive(Debug, Serialize, Deserialize)]
pub struct Kept {
    /// Requests by host name need no token.
    pub public: bool,
    /// The token requests by host name carry otherwise.
    pub token: String,
    /// Its ports on the host's loopback.
    pub published: Vec<Published>,
}

/// The routes: the port's root and every path below it, any method; raw
/// TCP.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/ports/{port}/", any(route))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(route))
        .route("/v1/sandboxes/{id}/tcp/{port}", get(tcp))
        // Uploads stream through to the sandbox, never held here.
        .layer(axum::extract::DefaultBodyLimit::disable())
}

/// The port of a path, 1 to 65535.
fn port_of(params: &HashMap<String, String>) -> Result<u16, ApiError> {
    match params.get("port").and_then(|p| p.parse::<u16>().ok()) {
        Some(p) if p > 0 => Ok(p),
        _ => Err(ApiError::bad_request(
            "the port must be a number from 1 to 65535",
        )),
    }
}

/// `GET /v1/sandboxes/{id}/tcp/{port}`: raw TCP over an upgrade.
async fn tcp(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    Path(params): Path<HashMap<String, String>>,
    req: Request,
) -> Result<Response, ApiError> {
    let id = sandbox_id(params.get("id").map_or("", String::as_str))?;
    let port = port_of(&params)?;
    Ok(tcp_upgrade(Arc::clone(&state.manager), tenant, id, port, req).await?)
}

/// A middleware before every route: a request whose `Host` names a
/// sandbox's port (`{port}-{id}.{domain}`) is proxied there, whatever its
/// path; any other goes on to the API.
pub async fn by_host(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let routed = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(host_route)
        .and_then(|(id, port)| Some((SandboxId::parse(id)?, port)));
    match routed {
        Some((id, port)) => match routed_request(state, id, port, req).await {
            Ok(resp) => resp,
            Err(e) => e.into_response(),
        },
        None => next.run(req).await,
    }
}

/// Who may reach sandbox `id`'s port by host name, then the proxy.
async fn routed_request(
    state: AppState,
    id: SandboxId,
    port: u16,
    mut req: Request,
) -> Result<Response, ApiError> {
    let unknown = || ApiError::not_found(format!("no running sandbox {id}"));
    let Some(tenant) = state.manager.live_tenant(&id) else {
        return Err(unknown());
    };
    let has_key = req.headers().contains_key(header::AUTHORIZATION);
    if has_key {
        // The tenant's key (any other tenant's sees nothing).
        let (mut parts, body) = req.into_parts();
        let Auth(caller) = Auth::from_request_parts(&mut parts, &state).await?;
        if caller != tenant {
            return Err(unknown());
        }
        req = Request::from_parts(parts, body);
    } else {
        let manager = Arc::clone(&state.manager);
        let (owner, sandbox) = (tenant.clone(), id.clone());
        let record = blocking(move || manager.get(&owner, &sandbox)).await?;
        let kept: Option<Kept> = record
            .attrs
            .get(ATTR)
            .and_then(|k| serde_json::from_value(k.clone()).ok());
        let given = req
            .headers_mut()
            .remove(TRAFFIC_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok().map(str::to_owned));
        let allowed = match &kept {
            Some(k) if k.public => true,
            Some(k) => {
                given.is_some_and(|t| brig_http::constant_time_eq(t.as_bytes(), k.token.as_bytes()))
            }
            None => false,
        };
        if !allowed {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!(
                    "sandbox {id}'s ports are not public: send its traffic token (`ports.token` \
                     in brig inspect {id} --json) in the X-Brig-Traffic-Token header, or an API \
                     key as Authorization: Bearer KEY"
                ),
            ));
        }
    }
    Ok(proxy(Arc::clone(&state.manager), tenant, id, port, req).await?)
}

/// Check the key and the port, strip the route's prefix from the path, and
/// [`proxy`].
async fn route(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    Path(params): Path<HashMap<String, String>>,
    mut req: Request,
) -> Response {
    let id = match sandbox_id(params.get("id").map_or("", String::as_str)) {
        Ok(id) => id,
        Err(e) => return e.into_response(),
    };
    let port = match port_of(&params) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    // The raw path, not axum's decoded `{*path}`: percent-escapes reach the
    // server as the client sent them.
    let rest = req
        .uri()
        .path()
        .splitn(7, '/')
        .nth(6)
        .unwrap_or_default()
        .to_string();
    let target = match req.uri().query() {
        Some(q) => format!("/{rest}?{q}"),
        None => format!("/{rest}"),
    };
    match target.parse::<Uri>() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(e) => return ApiError::bad_request(format!("bad path {target}: {e}")).into_response(),
    }
    match proxy(Arc::clone(&state.manager), tenant, id, port, req).await {
        Ok(resp) => resp,
        Err(e) => ApiError::from(e).into_response(),
    }
}

impl From<ProxyError> for ApiError {
    fn from(e: ProxyError) -> ApiError {
        match e {
            ProxyError::PortClosed { .. } => {
                ApiError::new(StatusCode::BAD_GATEWAY, "port_closed", e.to_string())
            }
            ProxyError::BadGateway { .. } => {
                ApiError::new(StatusCode::BAD_GATEWAY, "bad_gateway", e.to_string())
            }
            ProxyError::NotAnUpgrade => ApiError::bad_request(e.to_string()),
            ProxyError::Manager(m) => m.into(),
        }
    }
}

impl From<PublishError> for ApiError {
    fn from(e: PublishError) -> ApiError {
        match e {
            PublishError::Taken { .. } => {
                ApiError::new(StatusCode::CONFLICT, "port_in_use", e.to_string())
            }
            PublishError::Invalid { .. } => ApiError::bad_request(e.to_string()),
            PublishError::Bind { .. } => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_core::SandboxId;

    #[test]
    fn errors_have_the_api_shape() {
        let id = SandboxId::from_random(42);
        let e = ApiError::from(ProxyError::PortClosed {
            id: id.clone(),
            port: 8000,
        });
        assert_eq!((e.status, e.code), (StatusCode::BAD_GATEWAY, "port_closed"));
        assert_eq!(
            e.message,
            format!("sandbox {id}: nothing listens on port 8000")
        );
    }
}
