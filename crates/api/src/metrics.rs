//! `GET /metrics` and [`track`], the middleware that feeds the runtime's
//! Prometheus registry ([`brig_runtime::metrics`], where the metrics are
//! listed) from the whole router, so handlers do not know about metrics.

use std::time::Instant;

use axum::extract::{FromRequestParts, MatchedPath, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use brig_runtime::metrics::{Metrics, CONTENT_TYPE};

use super::{ApiError, AppState, Auth};

/// Middleware over the whole API: count every answer, and creates and
/// execs by their route. (An exec's stream may still fail later; it counts
/// once the command has started, when the response begins.)
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string());
    let response = next.run(req).await;
    record(
        &state.metrics,
        &method,
        path.as_deref(),
        response.status(),
        started,
    );
    response
}

fn record(
    metrics: &Metrics,
    method: &Method,
    path: Option<&str>,
    status: StatusCode,
    started: Instant,
) {
    metrics.answered(status.as_u16());
    if !status.is_success() || method != Method::POST {
        return;
    }
    match path {
        Some("/v1/sandboxes") => metrics.created(started.elapsed()),
        Some("/v1/sandboxes/{id}/exec" | "/v1/sandboxes/{id}/processes") => metrics.exec_started(),
        _ => {}
    }
}

/// `GET /metrics`. Needs an API key (any tenant's: the numbers are the
/// daemon's, not a tenant's) unless the server was started with
/// `--metrics-public`.
pub async fn serve(State(state): State<AppState>, req: Request) -> Result<Response, ApiError> {
    if !state.metrics_public {
        let (mut parts, _) = req.into_parts();
        Auth::from_request_parts(&mut parts, &state).await?;
    }
    let body = state.metrics.encode(&state.manager);
    Ok(([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response())
}
