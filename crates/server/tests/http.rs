//! The HTTP API in process: `app(state)` driven with `tower::ServiceExt`,
//! no socket. The manager behind it starts real sandboxes, so these need
//! root; they skip with a printed reason otherwise, and fail instead under
//! BRIG_TEST_STRICT=1.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use base64::Engine;
use brig_server::http::{app, AppState};
use brig_server::manager::ManagerConfig;
use brig_server::{SandboxManager, Store};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

fn root_or_skip() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        if std::env::var("BRIG_TEST_STRICT").is_ok_and(|v| v == "1") {
            panic!("BRIG_TEST_STRICT=1 and this test needs root (it starts sandboxes)");
        }
        eprintln!("skipping: the sandbox manager needs root");
    }
    root
}

/// target/debug/brig-agent, built if missing.
fn agent_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(t) if Path::new(&t).is_absolute() => PathBuf::from(t),
            Some(t) => root.join(t),
            None => root.join("target"),
        };
        let bin = target.join("debug/brig-agent");
        if !bin.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .current_dir(&root)
                .args(["build", "-p", "brig-agent"])
                .env("CARGO_TARGET_DIR", &target)
                .status()
                .expect("spawn cargo to build brig-agent");
            assert!(status.success(), "cargo build -p brig-agent failed");
        }
        bin
    })
}

/// A manager on a fresh home, its router, and keys of two tenants.
struct Fixture {
    _home: tempfile::TempDir,
    manager: Arc<SandboxManager>,
    app: Router,
    key: String,
    other_key: String,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.manager.shutdown();
    }
}

fn fixture(tweak: impl FnOnce(&mut ManagerConfig)) -> Fixture {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_in(home.path()).unwrap();
    let key = store.ensure_initial_key().unwrap().unwrap();
    let other = store.create_tenant("other").unwrap();
    let (_, other_key) = store.create_key(&other).unwrap();
    let mut config = ManagerConfig::new(agent_bin().to_path_buf());
    tweak(&mut config);
    let manager = SandboxManager::start(store, config).unwrap();
    let app = app(AppState::new(Arc::clone(&manager)));
    Fixture {
        _home: home,
        manager,
        app,
        key,
        other_key,
    }
}

/// One request; the status and the body (JSON if it parses, else a string).
async fn call(
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
fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "a message for people: {body}"
    );
}

async fn create(f: &Fixture, body: &str) -> String {
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

/// Exec through the API; the NDJSON events, parsed.
async fn exec(f: &Fixture, key: &str, id: &str, body: Value) -> (StatusCode, Vec<Value>) {
    let (status, raw) = call(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(key),
        Some(&body.to_string()),
    )
    .await;
    let events = match raw {
        Value::String(s) => s
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect(),
        other => vec![other],
    };
    (status, events)
}

fn output(events: &[Value], kind: &str) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let bytes: Vec<u8> = events
        .iter()
        .filter(|e| e["type"] == kind)
        .flat_map(|e| b64.decode(e["data"].as_str().unwrap()).unwrap())
        .collect();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_but_healthz_needs_a_valid_key() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let (status, body) = call(&f.app, Method::GET, "/healthz", None, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let routes = [
        (Method::GET, "/v1/info"),
        (Method::GET, "/v1/sandboxes"),
        (Method::POST, "/v1/sandboxes"),
        (Method::GET, "/v1/sandboxes/0123456789ab"),
        (Method::DELETE, "/v1/sandboxes/0123456789ab"),
        (Method::POST, "/v1/sandboxes/0123456789ab/timeout"),
        (Method::POST, "/v1/sandboxes/0123456789ab/exec"),
        (
            Method::GET,
            "/v1/sandboxes/0123456789ab/files?path=/etc/hostname",
        ),
        (Method::PUT, "/v1/sandboxes/0123456789ab/files?path=/tmp/x"),
    ];
    let wrong = "brig_0123456789ab_0123456789012345678901234567890123456789012";
    for (method, uri) in routes {
        for key in [None, Some("not-a-key"), Some(wrong)] {
            let (status, body) = call(&f.app, method.clone(), uri, key, Some("{}")).await;
            assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
        }
    }
    let (status, info) = call(&f.app, Method::GET, "/v1/info", Some(&f.key), None).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert_eq!(info["tiers"]["process"], true, "{info}");
    assert_eq!(info["limits"]["default_timeout_secs"], 300, "{info}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_400_with_a_message() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let cases = [
        ("{not json", "JSON"),
        (r#"{"bogus": 1}"#, "bogus"),
        (r#"{"memory": "lots"}"#, "memory"),
        (r#"{"template": "ubuntu"}"#, "template"),
        (r#"{"timeout": "0s"}"#, "timeout"),
        (r#"{"env": {"1BAD": "x"}}"#, "1BAD"),
    ];
    for (body, mentions) in cases {
        let (status, err) = call(
            &f.app,
            Method::POST,
            "/v1/sandboxes",
            Some(&f.key),
            Some(body),
        )
        .await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "bad_request");
        assert!(
            err["message"].as_str().unwrap().contains(mentions),
            "{body}: {err}"
        );
    }
    for uri in [
        "/v1/sandboxes?state=sleeping",
        "/v1/sandboxes?limit=0",
        "/v1/sandboxes?cursor=nonsense",
        "/v1/sandboxes?colour=red",
    ] {
        let (status, err) = call(&f.app, Method::GET, uri, Some(&f.key), None).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "bad_request");
    }
    assert_eq!(
        f.manager.live_count(),
        0,
        "no sandbox was made for bad input"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_ids_are_404() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    for id in ["0123456789ab", "not-an-id", "..%2F..%2Fetc"] {
        for (method, uri) in [
            (Method::GET, format!("/v1/sandboxes/{id}")),
            (Method::DELETE, format!("/v1/sandboxes/{id}")),
        ] {
            let (status, err) = call(&f.app, method, &uri, Some(&f.key), None).await;
            assert_error(status, &err, StatusCode::NOT_FOUND, "not_found");
        }
    }
    let (status, err) = call(&f.app, Method::GET, "/v2/nothing", Some(&f.key), None).await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cannot_see_or_touch_another_tenants_sandbox() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, r#"{"labels": {"owner": "first"}}"#).await;
    let other = f.other_key.clone();

    for (method, uri, body) in [
        (Method::GET, format!("/v1/sandboxes/{id}"), None),
        (Method::DELETE, format!("/v1/sandboxes/{id}"), None),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/timeout"),
            Some(r#"{"timeout": "1h"}"#),
        ),
        (
            Method::POST,
            format!("/v1/sandboxes/{id}/exec"),
            Some(r#"{"argv": ["true"]}"#),
        ),
        (
            Method::GET,
            format!("/v1/sandboxes/{id}/files?path=/etc/hostname"),
            None,
        ),
    ] {
        let (status, err) = call(&f.app, method, &uri, Some(&other), body).await;
        assert_error(status, &err, StatusCode::NOT_FOUND, "not_found");
    }
    let (_, list) = call(&f.app, Method::GET, "/v1/sandboxes", Some(&other), None).await;
    assert_eq!(list["items"], json!([]), "{list}");

    // The owner still has it, untouched.
    let (_, list) = call(
        &f.app,
        Method::GET,
        "/v1/sandboxes?label=owner=first&state=running",
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(list["items"][0]["id"], id.as_str(), "{list}");
    let (status, events) = exec(&f, &f.key, &id, json!({"argv": ["hostname"]})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(output(&events, "stdout").trim(), id);
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_streams_output_and_exit_status_then_delete_ends_it() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, r#"{"env": {"GREETING": "hi"}, "timeout": "2m"}"#).await;

    let (status, events) = exec(
        &f,
        &f.key,
        &id,
        json!({"argv": ["sh", "-c", "echo $GREETING $X; echo oops >&2; exit 3"], "env": {"X": "there"}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events[0]["type"], "started", "{events:?}");
    assert_eq!(output(&events, "stdout"), "hi there\n");
    assert_eq!(output(&events, "stderr"), "oops\n");
    let last = events.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["code"].as_i64()),
        (Some("exited"), Some(3))
    );

    let stdin = base64::engine::general_purpose::STANDARD.encode("from stdin");
    let (_, events) = exec(&f, &f.key, &id, json!({"argv": ["cat"], "stdin": stdin})).await;
    assert_eq!(output(&events, "stdout"), "from stdin");

    let (status, err) = exec(&f, &f.key, &id, json!({"argv": ["/no/such"]})).await;
    assert_error(status, &err[0], StatusCode::NOT_FOUND, "not_found");

    // Files, both directions.
    let upload = Request::builder()
        .method(Method::PUT)
        .uri(format!("/v1/sandboxes/{id}/files?path=/tmp/up"))
        .header(header::AUTHORIZATION, format!("Bearer {}", f.key))
        .body(Body::from(vec![0u8, 255, 1, 2]))
        .unwrap();
    let resp = f.app.clone().oneshot(upload).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let (status, back) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path=/tmp/up"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        back,
        Value::String(String::from_utf8_lossy(&[0, 255, 1, 2]).into_owned())
    );
    let (status, err) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path=/no/such"),
        Some(&f.key),
        None,
    )
    .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "not_found");

    let (status, sb) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{sb}");
    assert_eq!(sb["state"], "stopped", "{sb}");
    assert_eq!(f.manager.live_count(), 0);
    let (status, err) = exec(&f, &f.key, &id, json!({"argv": ["true"]})).await;
    assert_error(status, &err[0], StatusCode::CONFLICT, "conflict");
    // Deleting again is harmless.
    let (status, _) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expired_sandbox_is_killed_with_no_client_connected() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|c| c.sweep_interval = Duration::from_millis(100));
    let id = create(&f, r#"{"timeout": "1s"}"#).await;
    let kept = create(&f, r#"{"timeout": "1s"}"#).await;
    let (status, sb) = call(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{kept}/timeout"),
        Some(&f.key),
        Some(r#"{"timeout": "10m"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{sb}");

    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, sb) = call(
            &f.app,
            Method::GET,
            &format!("/v1/sandboxes/{id}"),
            Some(&f.key),
            None,
        )
        .await;
        if sb["state"] == "stopped" {
            break;
        }
        assert!(Instant::now() < end, "never expired: {sb}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, sb) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{kept}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(sb["state"], "running", "the extended one lives on: {sb}");
}
