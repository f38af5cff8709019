//! The process API in process: background processes, list, signals,
//! re-attach to their output (after they finished, too), stdin streamed to
//! a running process. Needs root (see `support`).

mod support;

use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use support::{assert_error, call, create, fixture, ndjson, output, raw, root_or_skip, Fixture};

async fn start(f: &Fixture, id: &str, argv: &[&str]) -> i64 {
    let (status, body) = call(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(&f.key),
        Some(&json!({ "argv": argv }).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["pid"].as_i64().expect("a pid")
}

async fn list(f: &Fixture, id: &str) -> Vec<Value> {
    let (status, body) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["items"].as_array().unwrap().clone()
}

/// Wait until the agent reports `pid` as no longer running.
async fn wait_finished(f: &Fixture, id: &str, pid: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let items = list(f, id).await;
        let me = items
            .iter()
            .find(|p| p["pid"] == pid)
            .expect("still listed");
        if me["running"] == false {
            return;
        }
        assert!(Instant::now() < deadline, "{pid} still running: {me}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `GET .../output` to its end: status and events.
async fn read_output(f: &Fixture, id: &str, pid: i64) -> (StatusCode, Vec<Value>) {
    let (status, ct, bytes) = raw(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/processes/{pid}/output"),
        &f.key,
        None,
        Vec::new(),
    )
    .await;
    if status == StatusCode::OK {
        assert_eq!(ct, "application/x-ndjson");
        (status, ndjson(&bytes))
    } else {
        (status, vec![serde_json::from_slice(&bytes).unwrap()])
    }
}

async fn signal(f: &Fixture, id: &str, pid: i64, sig: Value) -> (StatusCode, Value) {
    call(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes/{pid}/signal"),
        Some(&f.key),
        Some(&json!({ "signal": sig }).to_string()),
    )
    .await
}

async fn stdin(f: &Fixture, id: &str, pid: i64, query: &str, data: &[u8]) -> (StatusCode, Value) {
    let (status, _, bytes) = raw(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes/{pid}/stdin{query}"),
        &f.key,
        Some("application/octet-stream"),
        data.to_vec(),
    )
    .await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_finished_background_process_replays_its_output_and_exit() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let pid = start(
        &f,
        &id,
        &["sh", "-c", "echo out; echo err >&2; seq 1 20000; exit 3"],
    )
    .await;
    // No client was attached while it ran.
    wait_finished(&f, &id, pid).await;
    let me = list(&f, &id)
        .await
        .into_iter()
        .find(|p| p["pid"] == pid)
        .unwrap();
    assert_eq!(me["background"], true, "{me}");

    let (status, events) = read_output(&f, &id, pid).await;
    assert_eq!(status, StatusCode::OK, "{events:?}");
    assert_eq!(
        events[0],
        json!({"type": "attached", "pid": pid, "dropped": 0})
    );
    let want: String = std::iter::once("out".to_string())
        .chain((1..=20000).map(|n| n.to_string()))
        .map(|l| l + "\n")
        .collect();
    assert_eq!(output(&events, "stdout"), want);
    assert_eq!(output(&events, "stderr"), "err\n");
    assert_eq!(
        events.last().unwrap(),
        &json!({"type": "exited", "code": 3, "signal": null})
    );

    // Its exit was delivered: the agent has forgotten it.
    let (status, body) = read_output(&f, &id, pid).await;
    assert_error(status, &body[0], StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn signals_are_delivered_and_validated() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let pid = start(&f, &id, &["sleep", "60"]).await;
    assert!(list(&f, &id)
        .await
        .iter()
        .any(|p| p["pid"] == pid && p["running"] == true));

    for bad in [
        json!("SIGNOPE"),
        json!(0),
        json!(99),
        json!(-1),
        json!(null),
        json!(["TERM"]),
    ] {
        let (status, body) = signal(&f, &id, pid, bad).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (status, body) = signal(&f, &id, 999_999, json!("TERM")).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    let (status, body) = signal(&f, &id, pid, json!("SIGTERM")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"pid": pid, "signal": 15}));
    let (_, events) = read_output(&f, &id, pid).await;
    assert_eq!(
        events.last().unwrap(),
        &json!({"type": "exited", "code": null, "signal": 15})
    );

    // By number and by short name, too.
    let pid = start(&f, &id, &["sleep", "60"]).await;
    let (status, body) = signal(&f, &id, pid, json!("kill")).await;
    assert_eq!(
        (status, &body["signal"]),
        (StatusCode::OK, &json!(9)),
        "{body}"
    );
    let (_, events) = read_output(&f, &id, pid).await;
    assert_eq!(events.last().unwrap()["signal"], 9);
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_streams_to_a_background_process_and_its_output_reads_back() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let pid = start(&f, &id, &["cat"]).await;

    let (status, body) = stdin(&f, &id, pid, "", b"hello ").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({"pid": pid, "bytes": 6, "eof": false}));
    // Binary, and more than one window's worth.
    let big: Vec<u8> = (0..=255u8).cycle().take(600_000).collect();
    let (status, body) = stdin(&f, &id, pid, "", &big).await;
    assert_eq!(
        (status, &body["bytes"]),
        (StatusCode::OK, &json!(600_000)),
        "{body}"
    );
    let (status, body) = stdin(&f, &id, pid, "?eof=true", b"world").await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let (status, events) = read_output(&f, &id, pid).await;
    assert_eq!(status, StatusCode::OK);
    let b64 = base64::engine::general_purpose::STANDARD;
    let got: Vec<u8> = events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .flat_map(|e| base64::Engine::decode(&b64, e["data"].as_str().unwrap()).unwrap())
        .collect();
    let mut want = b"hello ".to_vec();
    want.extend(&big);
    want.extend(b"world");
    assert_eq!(got.len(), want.len());
    assert!(got == want, "cat echoed its stdin");
    assert_eq!(
        events.last().unwrap(),
        &json!({"type": "exited", "code": 0, "signal": null})
    );

    // The process is gone now.
    let (status, body) = stdin(&f, &id, pid, "", b"late").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_process_requests_are_4xx() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let uri = format!("/v1/sandboxes/{id}/processes");
    for body in [
        json!({"argv": []}),
        json!({"argv": ["sleep", "1"], "background": false}),
        json!({"argv": ["sleep", "1"], "tty": true}),
        json!({"argv": "sleep"}),
    ] {
        let (status, body) = call(
            &f.app,
            Method::POST,
            &uri,
            Some(&f.key),
            Some(&body.to_string()),
        )
        .await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (status, body) = call(
        &f.app,
        Method::POST,
        &uri,
        Some(&f.key),
        Some(&json!({"argv": ["/no/such/program"]}).to_string()),
    )
    .await;
    assert!(status.is_client_error(), "{status} {body}");

    let (status, body) = call(
        &f.app,
        Method::GET,
        &format!("{uri}/notapid/output"),
        Some(&f.key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, body) = read_output(&f, &id, 999_999).await;
    assert_error(status, &body[0], StatusCode::NOT_FOUND, "not_found");
    let (status, body) = stdin(&f, &id, 999_999, "", b"x").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    // Another tenant sees none of it.
    let pid = start(&f, &id, &["sleep", "60"]).await;
    for (method, path, body) in [
        (Method::GET, String::new(), None),
        (
            Method::POST,
            format!("/{pid}/signal"),
            Some(r#"{"signal":"KILL"}"#),
        ),
        (Method::GET, format!("/{pid}/output"), None),
        (Method::POST, format!("/{pid}/stdin"), Some("x")),
    ] {
        let (status, resp) = call(
            &f.app,
            method,
            &format!("{uri}{path}"),
            Some(&f.other_key),
            body,
        )
        .await;
        assert_error(status, &resp, StatusCode::NOT_FOUND, "not_found");
    }
}
