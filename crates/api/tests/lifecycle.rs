//! Pause, resume, per-sandbox metrics and the Prometheus `/metrics`, in
//! process. Needs root (see `support`).

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use brig_api::{app, AppState};
use serde_json::{json, Value};
use support::{assert_error, call, create, fixture, ndjson, raw, root_or_skip, sh, Fixture};

async fn post(f: &Fixture, key: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    call(&f.app, Method::POST, uri, Some(key), body).await
}

async fn pause(f: &Fixture, id: &str) -> Value {
    let (status, sb) = post(f, &f.key, &format!("/v1/sandboxes/{id}/pause"), None).await;
    assert_eq!(status, StatusCode::OK, "{sb}");
    assert_eq!(sb["state"], "paused", "{sb}");
    sb
}

async fn resume(f: &Fixture, id: &str, body: Option<&str>) -> Value {
    let (status, sb) = post(f, &f.key, &format!("/v1/sandboxes/{id}/resume"), body).await;
    assert_eq!(status, StatusCode::OK, "{sb}");
    assert_eq!(sb["state"], "running", "{sb}");
    sb
}

async fn metrics(f: &Fixture, id: &str) -> Value {
    let (status, m) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/metrics"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{m}");
    m
}

fn cpu(m: &Value) -> u64 {
    m["cpu_usage_ns"].as_u64().expect("cpu_usage_ns")
}

async fn start(f: &Fixture, id: &str, script: &str) -> i64 {
    let (status, body) = post(
        f,
        &f.key,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(&json!({ "argv": ["sh", "-c", script] }).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["pid"].as_i64().expect("a pid")
}

async fn count(f: &Fixture, id: &str) -> u64 {
    sh(f, id, "cat /tmp/count")
        .await
        .trim()
        .parse()
        .expect("a number in /tmp/count")
}

/// The sandbox's cgroup directories that exist now.
fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for d in [entry.path().join("brig").join(id), entry.path().join(id)] {
            if d.is_dir() {
                found.push(d);
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_freezes_the_sandbox_and_resume_continues_the_same_processes() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, r#"{"timeout": "10m"}"#).await;
    // A counter ten times a second, and a busy loop.
    let counter = start(
        &f,
        &id,
        "i=0; while :; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.1; done",
    )
    .await;
    start(&f, &id, "while :; do :; done").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh(&f, &id, "cat /tmp/count 2>/dev/null || echo 0")
        .await
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
        < 3
    {
        assert!(Instant::now() < deadline, "the counter never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let before = count(&f, &id).await;
    let running = metrics(&f, &id).await;
    let paused = pause(&f, &id).await;
    // While paused its timeout is suspended; it only expires after the
    // server's maximum (24 h by default).
    let now = paused["created_at"].as_i64().unwrap();
    assert!(
        paused["expires_at"].as_i64().unwrap() > now + 23 * 3600 * 1000,
        "{paused}"
    );
    let (status, sb) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!((status, &sb["state"]), (StatusCode::OK, &json!("paused")));

    // The agent is frozen too: calls that need it say so at once.
    let t = Instant::now();
    let (status, body) = post(
        &f,
        &f.key,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(r#"{"argv": ["true"]}"#),
    )
    .await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    let msg = body["message"].as_str().unwrap();
    assert!(msg.contains("paused") && msg.contains("/resume"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(2), "answered, not hung");

    // Pausing again is a conflict, with a message saying what to do.
    let (status, body) = post(&f, &f.key, &format!("/v1/sandboxes/{id}/pause"), None).await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(
        body["message"].as_str().unwrap().contains("already paused"),
        "{body}"
    );

    // No CPU time while frozen; metrics still answer.
    let a = metrics(&f, &id).await;
    assert_eq!(a["state"], "paused", "{a}");
    assert!(cpu(&a) >= cpu(&running));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b = metrics(&f, &id).await;
    assert_eq!(cpu(&b), cpu(&a), "CPU time advanced while paused");
    assert_eq!(b["cpu_percent"].as_f64(), Some(0.0), "{b}");

    let resumed = resume(&f, &id, None).await;
    // Back to the (almost ten minutes) it had left.
    let left = resumed["expires_at"].as_i64().unwrap() - now;
    assert!(
        (9 * 60 * 1000..=10 * 60 * 1000 + 5000).contains(&left),
        "expires {left} ms after creation: {resumed}"
    );
    // The same counter goes on from where it stopped: it was not
    // restarted (it would be back near 1) and did not count while paused
    // (it would be ~15 further).
    let after = count(&f, &id).await;
    assert!(
        after >= before && after < before + 8,
        "counter was {before} before the pause and {after} right after the resume"
    );
    let (_, procs) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(&f.key),
        None,
    )
    .await;
    assert!(
        procs["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == counter && p["running"] == true),
        "{procs}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while cpu(&metrics(&f, &id).await) < cpu(&b) + 100_000_000 {
        assert!(
            Instant::now() < deadline,
            "CPU time never advanced after resume"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        count(&f, &id).await > after || {
            tokio::time::sleep(Duration::from_millis(500)).await;
            count(&f, &id).await > after
        }
    );

    // Resuming a running sandbox is a conflict.
    let (status, body) = post(&f, &f.key, &format!("/v1/sandboxes/{id}/resume"), None).await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(
        body["message"].as_str().unwrap().contains("not paused"),
        "{body}"
    );

    // A timeout given with the resume replaces the time left; bad ones are
    // 400.
    pause(&f, &id).await;
    let (status, body) = post(
        &f,
        &f.key,
        &format!("/v1/sandboxes/{id}/resume"),
        Some(r#"{"timeout": "soon"}"#),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let resumed = resume(&f, &id, Some(r#"{"timeout": "30s"}"#)).await;
    let ttl = resumed["expires_at"].as_i64().unwrap() - now;
    assert!(ttl < 5 * 60 * 1000, "{resumed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_report_plausible_numbers() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, r#"{"memory": "256M", "disk": "128M"}"#).await;
    sh(
        &f,
        &id,
        "dd if=/dev/zero of=/fill bs=1M count=4 2>/dev/null",
    )
    .await;
    let m = metrics(&f, &id).await;
    assert!(
        m["memory_bytes"].as_u64().unwrap() > 4 << 20,
        "the file is in memory: {m}"
    );
    assert_eq!(m["memory_limit_bytes"], 256u64 << 20, "{m}");
    assert!(m["pids"].as_u64().unwrap() >= 1, "{m}");
    assert_eq!(m["disk_total_bytes"], 128u64 << 20, "{m}");
    assert!(m["disk_used_bytes"].as_u64().unwrap() >= 4 << 20, "{m}");
    assert!(cpu(&m) > 0, "the agent has run: {m}");
    let pct = m["cpu_percent"].as_f64().expect("cpu_percent");
    assert!((0.0..=100.0 * 64.0).contains(&pct), "{m}");
    let ts = m["timestamp"].as_i64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((now - ts).abs() < 10_000, "{m}");

    // An ended sandbox has no metrics: 409, with its state.
    let (status, _) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/metrics"),
        Some(&f.key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
}

/// The metrics series: a sample every interval while the sandbox runs
/// (none while it is paused), oldest first; `since`/`until` select exactly
/// the samples in the range; a backwards range is 400.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_series_samples_at_the_interval_and_selects_ranges() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|c| c.metrics_interval = Duration::from_millis(200));
    let id = create(&f, "{}").await;
    let series = |query: String| {
        let f = &f;
        let uri = format!("/v1/sandboxes/{id}/metrics/series{query}");
        async move {
            let (status, body) = call(&f.app, Method::GET, &uri, Some(&f.key), None).await;
            (status, body)
        }
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, all) = series(String::new()).await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(all["interval_ms"], 200, "{all}");
    let stamps: Vec<i64> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["timestamp"].as_i64().unwrap())
        .collect();
    assert!(stamps.len() >= 5, "{stamps:?}");
    for gap in stamps.windows(2).map(|w| w[1] - w[0]) {
        assert!(
            (150..=500).contains(&gap),
            "gaps at the interval: {stamps:?}"
        );
    }
    assert!(
        all["items"][0]["memory_bytes"].as_u64().unwrap() > 0,
        "{all}"
    );

    let (lo, hi) = (stamps[1], stamps[stamps.len() - 2]);
    let (status, some) = series(format!("?since={lo}&until={hi}")).await;
    assert_eq!(status, StatusCode::OK, "{some}");
    let got: Vec<i64> = some["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["timestamp"].as_i64().unwrap())
        .collect();
    assert_eq!(got, stamps[1..stamps.len() - 1].to_vec());

    let (status, body) = series("?since=20&until=10".into()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, body) = series("?since=soon".into()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");

    // Paused: no samples; running again: samples again.
    pause(&f, &id).await;
    let paused_at = stamps_now();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (_, during) = series(format!("?since={paused_at}")).await;
    assert_eq!(during["items"], json!([]), "samples while paused: {during}");
    resume(&f, &id, None).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (_, after) = series(format!("?since={paused_at}")).await;
    assert!(after["items"].as_array().unwrap().len() >= 2, "{after}");
}

/// A sandbox's /proc/meminfo shows its limit as the machine's memory and
/// follows what it uses: 96 MiB held by a process shows as used after the
/// next sample (`free` in the sandbox, as E2B's VM would show it).
#[tokio::test(flavor = "multi_thread")]
async fn meminfo_shows_the_limit_and_follows_use() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|c| c.metrics_interval = Duration::from_millis(200));
    let id = create(&f, r#"{"memory": "256M"}"#).await;
    let free = || async {
        let out = sh(&f, &id, "free -b | awk '/^Mem:/ {print $2, $3}'").await;
        let (total, used) = out.trim().split_once(' ').unwrap();
        (total.parse::<u64>().unwrap(), used.parse::<u64>().unwrap())
    };
    let (total, before) = free().await;
    assert_eq!(total, 256 << 20);
    start(
        &f,
        &id,
        "python3 -c 'import time; b = bytearray(96 << 20); time.sleep(600)'",
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, used) = free().await;
        if used >= before + (90 << 20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "96 MiB held, /proc/meminfo still says {used} used ({before} before)"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn stamps_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tenant_can_neither_pause_resume_nor_read_metrics() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    for (method, path) in [
        (Method::POST, "pause"),
        (Method::POST, "resume"),
        (Method::GET, "metrics"),
    ] {
        let uri = format!("/v1/sandboxes/{id}/{path}");
        let (status, body) = call(&f.app, method.clone(), &uri, Some(&f.other_key), None).await;
        assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
        let (status, body) = call(&f.app, method, &uri, None, None).await;
        assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    }
    // Untouched: still running, and its owner can pause it.
    assert_eq!(sh(&f, &id, "echo ok").await, "ok\n");
    pause(&f, &id).await;
    let (status, body) = post(
        &f,
        &f.other_key,
        &format!("/v1/sandboxes/{id}/resume"),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, body) = post(&f, &f.key, "/v1/sandboxes/0123456789ab/pause", None).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_sandbox_is_torn_down_by_delete_expiry_and_shutdown() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|c| {
        c.sweep_interval = Duration::from_millis(100);
        c.max_timeout = Duration::from_secs(3);
    });

    // Delete.
    let id = create(&f, "{}").await;
    sh(&f, &id, "sleep 1000 >/dev/null 2>&1 & echo").await;
    pause(&f, &id).await;
    assert!(
        cgroup_dirs(&id)
            .iter()
            .any(|d| d.starts_with("/sys/fs/cgroup/freezer") || d.join("cgroup.freeze").exists()),
        "a freezable group exists: {:?}",
        cgroup_dirs(&id)
    );
    let t = Instant::now();
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
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(cgroup_dirs(&id), Vec::<PathBuf>::new(), "left behind");

    // Expiry: a paused sandbox outlives its own timeout (1 s) but not the
    // server's maximum (3 s here).
    let id = create(&f, r#"{"timeout": "1s"}"#).await;
    pause(&f, &id).await;
    let paused_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let (_, sb) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(
        sb["state"], "paused",
        "did not expire by its running timeout: {sb}"
    );
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
        assert!(
            paused_at.elapsed() < Duration::from_secs(15),
            "never expired: {sb}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(paused_at.elapsed() >= Duration::from_millis(2500));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cgroup_dirs(&id).is_empty() {
        assert!(
            Instant::now() < deadline,
            "left behind: {:?}",
            cgroup_dirs(&id)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Shutdown.
    let id = create(&f, "{}").await;
    pause(&f, &id).await;
    f.manager.shutdown();
    assert_eq!(cgroup_dirs(&id), Vec::<PathBuf>::new(), "left behind");
}

/// `brig_name{labels} value` lines: every sample, parsed; panics on a line
/// that is not valid text exposition.
fn parse_prometheus(text: &str) -> Vec<(String, f64)> {
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            let mut parts = line.splitn(4, ' ');
            let _hash = parts.next();
            let kind = parts.next().unwrap_or_default();
            assert!(
                ["HELP", "TYPE", "UNIT", "EOF"].contains(&kind),
                "bad comment line {line:?}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value: {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "bad labels in {line:?}");
        }
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        samples.push((series.to_string(), value));
    }
    samples
}

fn sample(samples: &[(String, f64)], series: &str) -> f64 {
    samples
        .iter()
        .find(|(s, _)| s == series)
        .unwrap_or_else(|| panic!("no {series} in {samples:?}"))
        .1
}

async fn scrape(app: &axum::Router, key: Option<&str>) -> Vec<(String, f64)> {
    let (status, body) = call(app, Method::GET, "/metrics", key, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    parse_prometheus(body.as_str().expect("text"))
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_metrics_count_creates_execs_and_live_sandboxes() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    // A key is needed by default.
    let (status, body) = call(&f.app, Method::GET, "/metrics", None, None).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");

    let before = scrape(&f.app, Some(&f.key)).await;
    assert_eq!(sample(&before, "brig_sandbox_creates_total"), 0.0);
    assert_eq!(sample(&before, r#"brig_sandboxes{state="running"}"#), 0.0);
    assert_eq!(
        sample(
            &before,
            &format!(
                r#"brig_build_info{{version="{}"}}"#,
                env!("CARGO_PKG_VERSION")
            )
        ),
        1.0
    );

    let id = create(&f, "{}").await;
    sh(&f, &id, "true").await;
    let other = create(&f, "{}").await;
    pause(&f, &other).await;
    let (status, _) = call(
        &f.app,
        Method::GET,
        "/v1/sandboxes/0123456789ab",
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let after = scrape(&f.app, Some(&f.key)).await;
    assert_eq!(sample(&after, "brig_sandbox_creates_total"), 2.0);
    assert_eq!(sample(&after, "brig_sandbox_create_seconds_count"), 2.0);
    assert!(sample(&after, "brig_sandbox_create_seconds_sum") > 0.0);
    assert_eq!(sample(&after, "brig_execs_total"), 1.0);
    assert_eq!(sample(&after, r#"brig_sandboxes{state="running"}"#), 1.0);
    assert_eq!(sample(&after, r#"brig_sandboxes{state="paused"}"#), 1.0);
    assert!(sample(&after, r#"brig_http_requests_total{code="2xx"}"#) >= 5.0);
    assert!(sample(&after, r#"brig_http_requests_total{code="4xx"}"#) >= 2.0);

    // One series per live sandbox, labelled with its id and tenant name.
    let of = |samples: &[(String, f64)], metric: &str, id: &str| {
        samples
            .iter()
            .find(|(s, _)| {
                s.starts_with(&format!("{metric}{{"))
                    && s.contains(&format!(r#"id="{id}""#))
                    && s.contains(r#"tenant="default""#)
            })
            .map(|(_, v)| *v)
    };
    for sb in [&id, &other] {
        assert!(
            of(&after, "brig_sandbox_pids", sb).unwrap_or(0.0) >= 1.0,
            "{after:?}"
        );
        assert!(of(&after, "brig_sandbox_memory_bytes", sb).unwrap_or(0.0) > 0.0);
        assert!(of(&after, "brig_sandbox_memory_limit_bytes", sb).unwrap_or(0.0) > 0.0);
        assert!(of(&after, "brig_sandbox_cpu_seconds_total", sb).is_some());
        assert_eq!(of(&after, "brig_sandbox_oom_kills_total", sb), Some(0.0));
    }
    // An exec killed at its timeout is counted.
    assert_eq!(sample(&after, "brig_exec_timeouts_total"), 0.0);
    let body = serde_json::json!({ "argv": ["sleep", "30"], "timeout": "200ms" }).to_string();
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
    assert_eq!(ndjson(&bytes).last().unwrap()["code"], 124);
    let timed = scrape(&f.app, Some(&f.key)).await;
    assert_eq!(sample(&timed, "brig_exec_timeouts_total"), 1.0);

    // Ends are counted by cause.
    assert_eq!(
        sample(&after, r#"brig_sandbox_ends_total{cause="deleted"}"#),
        0.0
    );
    let (status, _) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let short = create(&f, r#"{"timeout": "1s"}"#).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (_, sb) = call(
            &f.app,
            Method::GET,
            &format!("/v1/sandboxes/{short}"),
            Some(&f.key),
            None,
        )
        .await;
        if sb["state"] == "stopped" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the short sandbox never expired: {sb}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = scrape(&f.app, Some(&f.key)).await;
    assert_eq!(
        sample(&ended, r#"brig_sandbox_ends_total{cause="deleted"}"#),
        1.0
    );
    // An ended sandbox's series are gone; a live one's stay.
    assert_eq!(of(&ended, "brig_sandbox_pids", &id), None);
    assert!(of(&ended, "brig_sandbox_pids", &other).is_some());
    assert_eq!(
        sample(&ended, r#"brig_sandbox_ends_total{cause="timeout"}"#),
        1.0
    );
    assert_eq!(
        sample(&ended, r#"brig_sandbox_ends_total{cause="out_of_memory"}"#),
        0.0
    );

    // `--metrics-public`: no key needed.
    let public = app(AppState::new(Arc::clone(&f.manager)).with_public_metrics(true));
    let open = scrape(&public, None).await;
    assert_eq!(sample(&open, r#"brig_sandboxes{state="paused"}"#), 1.0);
}

/// `mode: filesystem` ends every process but the agent and keeps the
/// files; memory drops to what the agent and the files hold. `reboot` on
/// a resume does the same to a full pause. Bad bodies are 400s.
#[tokio::test(flavor = "multi_thread")]
async fn a_filesystem_pause_keeps_files_and_ends_processes() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, r#"{"timeout": "10m"}"#).await;
    let probe = "cat /tmp/mark; ps -eo comm= | grep -c '^sleep$' || true";
    let uri = format!("/v1/sandboxes/{id}/pause");
    // A hungry process: 64 MiB held in memory.
    sh(&f, &id, "echo kept > /tmp/mark").await;
    start(&f, &id, "exec sleep 1000").await;
    start(&f, &id, "python3 -c 'import time; b = bytearray(64 << 20); b[::4096] = b\"x\" * (len(b) // 4096); time.sleep(1000)'").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics(&f, &id).await["memory_bytes"].as_u64().unwrap() < 64 << 20 {
        assert!(Instant::now() < deadline, "the hungry process never grew");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, sb) = post(&f, &f.key, &uri, Some(r#"{"mode": "filesystem"}"#)).await;
    assert_eq!(
        (status, &sb["state"]),
        (StatusCode::OK, &json!("paused")),
        "{sb}"
    );
    let m = metrics(&f, &id).await;
    assert_eq!(m["pids"], 1, "only the agent is left: {m}");
    assert!(m["memory_bytes"].as_u64().unwrap() < 32 << 20, "{m}");
    resume(&f, &id, None).await;
    assert_eq!(sh(&f, &id, probe).await, "kept\n0\n");

    // A full pause resumed with reboot.
    start(&f, &id, "exec sleep 1000").await;
    let (status, _) = post(&f, &f.key, &uri, Some(r#"{"mode": "full"}"#)).await;
    assert_eq!(status, StatusCode::OK);
    resume(&f, &id, Some(r#"{"reboot": true}"#)).await;
    assert_eq!(sh(&f, &id, probe).await, "kept\n0\n");
    // And a plain one keeps them.
    start(&f, &id, "exec sleep 1000").await;
    pause(&f, &id).await;
    resume(&f, &id, Some("{}")).await;
    assert_eq!(sh(&f, &id, probe).await, "kept\n1\n");

    for bad in [
        r#"{"mode": "disk"}"#,
        r#"{"mode": 1}"#,
        r#"{"extra": 1}"#,
        "nope",
    ] {
        let (status, body) = post(&f, &f.key, &uri, Some(bad)).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (status, body) = post(
        &f,
        &f.key,
        &format!("/v1/sandboxes/{id}/resume"),
        Some(r#"{"reboot": "yes"}"#),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
}
