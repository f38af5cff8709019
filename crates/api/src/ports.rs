//! `ANY /v1/sandboxes/{id}/ports/{port}/{*path}`: HTTP and WebSocket to a
//! server listening on a port inside a sandbox, through brig-http's
//! [`proxy`] (see there for how bodies, upgrades and headers go).
//!
//! Nothing listening on the port: `502 {"code":"port_closed",
//! "message":"sandbox ID: nothing listens on port P"}`. The server closing
//! without an answer: `502 bad_gateway`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use brig_http::ports::{proxy, ProxyError};

use super::{sandbox_id, ApiError, AppState, Auth};

/// The routes: the port's root and every path below it, any method.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sandboxes/{id}/ports/{port}/", any(route))
        .route("/v1/sandboxes/{id}/ports/{port}/{*path}", any(route))
        // Uploads stream through to the sandbox, never held here.
        .layer(axum::extract::DefaultBodyLimit::disable())
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
    let port = match params.get("port").and_then(|p| p.parse::<u16>().ok()) {
        Some(p) if p > 0 => p,
        _ => {
            return ApiError::bad_request("the port must be a number from 1 to 65535")
                .into_response()
        }
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
            ProxyError::Manager(m) => m.into(),
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
