//! Shared by the in-process tests of the native API: a manager on a fresh
//! home (brig-test-support's [`ManagerFixture`]), its router, keys of two
//! tenants, and one-request helpers. The manager starts real sandboxes, so
//! every test needs root; [`root_or_skip`] skips with a printed reason, or
//! fails under BRIG_TEST_STRICT=1.

#![allow(dead_code, unused_imports)] // each test binary uses a different part of it

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use base64::Engine;
use brig_api::{app, AppState};
use brig_runtime::{ManagerConfig, SandboxManager};
use brig_test_support::{manager_fixture, ManagerFixture};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

pub use brig_test_support::root_or_skip;

/// A manager on a fresh home, its router, and keys of two tenants.
pub struct Fixture {
    pub manager: Arc<SandboxManager>,
    pub app: Router,
    pub key: String,
    pub other_key: String,
    /// Shuts the manager down when the fixture goes.
    _inner: ManagerFixture,
}

pub fn fixture(tweak: impl FnOnce(&mut ManagerConfig)) -> Fixture {
    let inner = manager_fixture(tweak);
    Fixture {
        manager: Arc::clone(&inner.manager),
        app: app(AppState::new(Arc::clone(&inner.manager))),
        key: inner.key.clone(),
        other_key: inner.other_key.clone(),
        _inner: inner,
    }
}

/// The fixture's router on a loopback socket, as `brig serve` serves it.
pub async fn serve(f: &Fixture) -> SocketAddr {
    brig_test_support::serve(f.app.clone()).await
}

/// One request; the status and the body (JSON if it parses, else a string).
pub async fn call(
    app: &Router,
    method: Method,
    uri: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(k) = key {
        req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, value)
}

/// The error shape every failure has.
pub fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "a message for people: {body}"
    );
}

pub async fn create(f: &Fixture, body: &str) -> String {
    let (status, sb) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&f.key),
        Some(body),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{sb}");
    assert_eq!(sb["state"], "running", "{sb}");
    sb["id"].as_str().unwrap().to_string()
}

/// A request with a raw body and content type; the status, the
/// content type and the body bytes.
pub async fn raw(
    app: &Router,
    method: Method,
    uri: &str,
    key: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, String, Vec<u8>) {
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {key}"));
    if let Some(ct) = content_type {
        req = req.header(header::CONTENT_TYPE, ct);
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let ct = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, ct, bytes.to_vec())
}

/// NDJSON lines, parsed.
pub fn ndjson(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

/// The decoded `data` of every event of one kind, joined.
pub fn output(events: &[Value], kind: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let bytes: Vec<u8> = events
        .iter()
        .filter(|e| e["type"] == kind)
        .flat_map(|e| b64.decode(e["data"].as_str().unwrap()).unwrap())
        .collect();
    String::from_utf8(bytes).unwrap()
}

/// Run a command in the sandbox to its end; its stdout.
pub async fn sh(f: &Fixture, id: &str, script: &str) -> String {
    let body = serde_json::json!({ "argv": ["sh", "-c", script] }).to_string();
    let (status, _, bytes) = raw(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        &f.key,
        Some("application/json"),
        body.into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let events = ndjson(&bytes);
    let exit = events.last().unwrap();
    assert_eq!(exit["type"], "exited", "{script}: {events:?}");
    assert_eq!(exit["code"], 0, "{script}: {}", output(&events, "stderr"));
    output(&events, "stdout")
}
