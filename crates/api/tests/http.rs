//! The HTTP API in process: `app(state)` driven with `tower::ServiceExt`,
//! no socket. The manager behind it starts real sandboxes, so these need
//! root; they skip with a printed reason otherwise, and fail instead under
//! BRIG_TEST_STRICT=1.

mod support;

use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use base64::Engine;
use serde_json::{json, Value};
use support::{assert_error, call, create, fixture, output, raw, root_or_skip, sh, Fixture};

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
        // Each group fits, the sum does not: a panic (500) until the
        // spec_limits fuzz target found it.
        (
            r#"{"timeout": "10000000000000000000s10000000000000000000s"}"#,
            "timeout",
        ),
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
    assert_error(status, &err[0], StatusCode::NOT_FOUND, "command_not_found");
    // A missing working directory is named as such, not as a missing
    // command.
    let (status, err) = exec(
        &f,
        &f.key,
        &id,
        json!({"argv": ["true"], "cwd": "/no/such/dir"}),
    )
    .await;
    assert_error(status, &err[0], StatusCode::BAD_REQUEST, "bad_request");
    let message = err[0]["message"].as_str().unwrap();
    assert!(
        message.contains("working directory /no/such/dir does not exist"),
        "{message}"
    );
    let (status, err) = exec(
        &f,
        &f.key,
        &id,
        json!({"argv": ["true"], "cwd": "/etc/passwd"}),
    )
    .await;
    assert_error(status, &err[0], StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        err[0]["message"]
            .as_str()
            .unwrap()
            .contains("is not a directory"),
        "{err:?}"
    );

    // Files, both directions.
    let uri = format!("/v1/sandboxes/{id}/files?path=/tmp/up");
    let (status, _, _) = raw(
        &f.app,
        Method::PUT,
        &uri,
        &f.key,
        None,
        vec![0u8, 255, 1, 2],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, back) = raw(&f.app, Method::GET, &uri, &f.key, None, Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(back, [0u8, 255, 1, 2]);
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

#[tokio::test(flavor = "multi_thread")]
async fn dir_templates_are_allowed_only_under_a_template_root() {
    if !root_or_skip() {
        return;
    }
    let roots = tempfile::tempdir().unwrap();
    let allowed = roots.path().join("t");
    std::fs::create_dir_all(allowed.join("bin")).unwrap();
    let f = fixture(|c| c.template_roots = vec![roots.path().to_path_buf()]);
    // The host's root, a path that climbs out of the root, the root itself:
    // each is refused with 403 and a message naming the fix.
    for template in [
        "dir:/".to_string(),
        format!("dir:{}/t/../../..", roots.path().display()),
        format!("dir:{}", roots.path().display()),
    ] {
        let body = json!({ "template": template }).to_string();
        let (status, err) = call(
            &f.app,
            Method::POST,
            "/v1/sandboxes",
            Some(&f.key),
            Some(&body),
        )
        .await;
        assert_error(status, &err, StatusCode::FORBIDDEN, "forbidden");
        assert!(
            err["message"].as_str().unwrap().contains("--template-root"),
            "{template}: {err}"
        );
    }
    // A missing directory is the client's mistake, not a server error.
    let body = json!({ "template": format!("dir:{}/nope", roots.path().display()) }).to_string();
    let (status, err) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&f.key),
        Some(&body),
    )
    .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "bad_request");
    // One inside a root gets past the check (this one is not a usable
    // rootfs, so the jail refuses it, again as the client's mistake).
    let body = json!({ "template": format!("dir:{}", allowed.display()) }).to_string();
    let (status, err) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&f.key),
        Some(&body),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert!(
        !err["message"].as_str().unwrap().contains("--template-root"),
        "{err}"
    );
    assert_eq!(f.manager.live_count(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn sandboxes_from_the_pool_get_the_limits_and_env_asked_for() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|c| {
        c.pool = vec![brig_runtime::PoolTarget {
            template: brig_core::TemplateRef::Host,
            setuid: false,
            size: 2,
        }]
    });
    // Wait for the filler to make both.
    for _ in 0..200 {
        if f.manager.pool_sizes()[0].1 == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(f.manager.pool_sizes()[0].1, 2, "the pool filled up");
    let id = create(
        &f,
        r#"{"memory": "64M", "pids": 40, "env": {"GREETING": "hi"}}"#,
    )
    .await;
    assert_eq!(f.manager.pool_claims(), 1, "served from the pool");
    assert_eq!(sh(&f, &id, "echo $GREETING").await, "hi\n");
    // The limits asked for, on the pooled sandbox's live cgroups.
    let (status, m) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/metrics"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{m}");
    assert_eq!(m["memory_limit_bytes"], 64u64 << 20, "{m}");
    let pids_max = ["/sys/fs/cgroup/pids/brig", "/sys/fs/cgroup/brig"]
        .iter()
        .find_map(|d| std::fs::read_to_string(format!("{d}/{id}/pids.max")).ok())
        .expect("the sandbox's pids cgroup");
    assert_eq!(pids_max.trim(), "40");
    // A request's own variable wins over the sandbox's.
    let (_, events) = exec(
        &f,
        &f.key,
        &id,
        json!({"argv": ["sh", "-c", "echo $GREETING"], "env": {"GREETING": "yo"}}),
    )
    .await;
    assert_eq!(output(&events, "stdout"), "yo\n");
    // And the pool comes back to its size.
    for _ in 0..200 {
        if f.manager.pool_sizes()[0].1 == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(f.manager.pool_sizes()[0].1, 2, "the pool refilled");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_isolation_tier_is_checked() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    for (tier, want, code) in [
        ("vm", StatusCode::BAD_REQUEST, "unsupported"),
        ("gvisor", StatusCode::BAD_REQUEST, "unsupported"),
        ("firecracker", StatusCode::BAD_REQUEST, "bad_request"),
    ] {
        let body = json!({ "isolation": tier }).to_string();
        let (status, err) = call(
            &f.app,
            Method::POST,
            "/v1/sandboxes",
            Some(&f.key),
            Some(&body),
        )
        .await;
        assert_error(status, &err, want, code);
        assert!(err["message"].as_str().unwrap().contains(tier), "{err}");
    }
    let id = create(&f, r#"{"isolation": "process"}"#).await;
    let (status, sb) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sb["isolation"], "process", "{sb}");
}

/// A command line or environment of megabytes reaches execve (an exec
/// request larger than a protocol Open header continues on its stream),
/// on the streaming exec and the background start alike; what execve
/// itself refuses, or what is past brig's own limit, is a 400 that names
/// the limit.
#[tokio::test(flavor = "multi_thread")]
async fn command_lines_and_environments_of_megabytes_work() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    // 15 arguments of 100 KiB (each under execve's 128 KiB per string):
    // 1.5 MiB, 23 times the old 64 KiB ceiling.
    let arg = "a".repeat(100 << 10);
    let mut argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        "n=0; for a; do n=$((n + ${#a})); done; echo $n ${#BIG1} ${#BIG2}".to_string(),
        "sh".to_string(),
    ];
    argv.extend(std::iter::repeat_n(arg.clone(), 15));
    let env = json!({ "BIG1": "e".repeat(100 << 10), "BIG2": "f".repeat(100 << 10) });
    let (status, events) = exec(&f, &f.key, &id, json!({ "argv": argv, "env": env })).await;
    assert_eq!(status, StatusCode::OK, "{events:?}");
    assert_eq!(
        output(&events, "stdout"),
        format!("{} {} {}\n", 15 * (100 << 10), 100 << 10, 100 << 10),
        "{:?}",
        output(&events, "stderr")
    );
    // A background process gets the same.
    let (status, body) = call(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(&f.key),
        Some(
            &json!({ "argv": ["sh", "-c", "echo ${#1} > /tmp/bg", "sh", arg], "env": env, "background": true })
                .to_string(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let got = sh(&f, &id, "cat /tmp/bg 2>/dev/null || true").await;
        if got == format!("{}\n", 100 << 10) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the background process never wrote: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // One string over execve's 128 KiB: the kernel's limit, named.
    let (status, err) = exec(
        &f,
        &f.key,
        &id,
        json!({ "argv": ["echo", "x".repeat(200 << 10)] }),
    )
    .await;
    assert_error(status, &err[0], StatusCode::BAD_REQUEST, "bad_request");
    let message = err[0]["message"].as_str().unwrap();
    assert!(
        message.contains("E2BIG") && message.contains("128 KiB"),
        "{message}"
    );
    // Past brig's own limit (16 MiB as a request): refused before the
    // agent, naming it.
    let (status, err) = exec(
        &f,
        &f.key,
        &id,
        json!({ "argv": ["echo"], "env": { "HUGE": "h".repeat(16 << 20) } }),
    )
    .await;
    assert_error(status, &err[0], StatusCode::BAD_REQUEST, "bad_request");
    let message = err[0]["message"].as_str().unwrap();
    assert!(message.contains("at most 16 MiB"), "{message}");
    // The sandbox is fine afterwards.
    assert_eq!(sh(&f, &id, "echo still here").await, "still here\n");
}

/// An exec's `timeout` kills the process and what it started at the time
/// limit, keeps what it printed, and ends the stream with `exited` 124
/// (`timed_out`); a bad duration is a 400 naming the field.
#[tokio::test(flavor = "multi_thread")]
async fn an_exec_timeout_kills_the_process_group_and_reports_124() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let started = Instant::now();
    let (status, events) = exec(
        &f,
        &f.key,
        &id,
        json!({"argv": ["sh", "-c", "echo before; sleep 300 & wait"], "timeout": "1s"}),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(output(&events, "stdout"), "before\n");
    let last = events.last().unwrap();
    assert_eq!(
        (
            last["type"].as_str(),
            last["code"].as_i64(),
            last["timed_out"].as_bool()
        ),
        (Some("exited"), Some(124), Some(true)),
        "{events:?}"
    );
    assert_eq!(last["timeout_ms"], 1000);
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    // The group went with it: no `sleep 300` is left in the sandbox.
    let left = sh(&f, &id, "ps -eo args= | grep -c '^sleep 300' || true").await;
    assert_eq!(
        left.trim(),
        "0",
        "the background child outlived the timeout"
    );
    // A command that ends in time is untouched by its limit.
    let (_, events) = exec(&f, &f.key, &id, json!({"argv": ["true"], "timeout": "30s"})).await;
    let last = events.last().unwrap();
    assert_eq!(
        (last["code"].as_i64(), last.get("timed_out")),
        (Some(0), None)
    );
    let (status, err) = exec(
        &f,
        &f.key,
        &id,
        json!({"argv": ["true"], "timeout": "soon"}),
    )
    .await;
    assert_error(status, &err[0], StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        err[0]["message"].as_str().unwrap().starts_with("timeout:"),
        "{err:?}"
    );
}

/// A sandbox's end has a recorded cause, shown by GET and told to an exec
/// that was streaming when it happened.
#[tokio::test(flavor = "multi_thread")]
async fn the_end_of_a_sandbox_is_explained_to_its_streams_and_in_its_record() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, r#"{"timeout": "2s"}"#).await;
    let (status, events) = exec(&f, &f.key, &id, json!({"argv": ["sleep", "30"]})).await;
    assert_eq!(status, StatusCode::OK);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "error", "{events:?}");
    assert_eq!(last["sandbox_end"]["cause"], "timeout", "{last}");
    assert!(
        last["message"]
            .as_str()
            .unwrap()
            .contains("its timeout passed"),
        "{last}"
    );
    let (_, sb) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(sb["end"]["cause"], "timeout", "{sb}");
    assert_eq!(sb["end"]["message"], "its timeout passed", "{sb}");

    let id = create(&f, "{}").await;
    let (_, sb) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(sb["end"]["cause"], "deleted", "{sb}");
    assert!(
        sb["end"]["by"].as_str().is_some_and(|t| !t.is_empty()),
        "{sb}"
    );
    let (_, live) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&f.key),
        Some("{}"),
    )
    .await;
    assert!(
        live.get("end").is_none(),
        "a live sandbox has no end: {live}"
    );
}

/// A process the OOM killer ends is reported as such: `exited` with
/// signal 9, `oom_killed` and a message naming the limit; the sandbox
/// lives on, and its metrics count the kill.
#[tokio::test(flavor = "multi_thread")]
async fn an_exec_killed_by_the_oom_killer_says_so() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, r#"{"memory": "128M"}"#).await;
    let hog =
        "import time; b = bytearray(512 << 20); b[::4096] = b'x' * (len(b) // 4096); time.sleep(5)";
    let (status, events) = exec(&f, &f.key, &id, json!({"argv": ["python3", "-c", hog]})).await;
    assert_eq!(status, StatusCode::OK);
    let last = events.last().unwrap();
    assert_eq!(
        (
            last["type"].as_str(),
            last["signal"].as_i64(),
            last["oom_killed"].as_bool()
        ),
        (Some("exited"), Some(9), Some(true)),
        "{events:?}"
    );
    assert!(
        last["message"].as_str().unwrap().contains("128 MiB"),
        "{last}"
    );
    assert_eq!(sh(&f, &id, "echo alive").await, "alive\n");
    // A plain SIGKILL in a sandbox whose OOM killer never fired is just that.
    let other = create(&f, "{}").await;
    let (_, events) = exec(
        &f,
        &f.key,
        &other,
        json!({"argv": ["sh", "-c", "kill -9 $$"]}),
    )
    .await;
    let last = events.last().unwrap();
    assert_eq!(last["signal"], 9, "{events:?}");
    assert!(last.get("oom_killed").is_none(), "{last}");
}
