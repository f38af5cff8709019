//! `brig serve --e2b` end to end: the real daemon with both E2B listeners on
//! free loopback ports; their addresses are printed, the control plane
//! creates and kills a sandbox with the daemon's own key, the data plane
//! answers an unknown sandbox with E2B's 502, and SIGTERM stops all three
//! listeners cleanly. The E2B API itself is tested in
//! crates/e2b/tests/e2b_control.rs.

mod support;

use std::time::Duration;

use support::{eventually, processes_of};

#[test]
fn serve_e2b_prints_both_addresses_and_serves_them() {
    require_root!();
    let home = tempfile::tempdir().unwrap();
    let (mut child, _url, mut lines) = support::start_daemon(
        home.path(),
        &[
            "--e2b",
            "--e2b-api",
            "127.0.0.1:0",
            "--e2b-sandbox",
            "127.0.0.1:0",
            // No template builds in the background (this home has none).
            "--prepare",
            "none",
        ],
    );
    let mut addr = |prefix: &str| loop {
        let line = lines.next().expect("brig serve exited").unwrap();
        if let Some(a) = line.strip_prefix(prefix) {
            break a.to_string();
        }
    };
    let api = addr("brig: e2b api on ");
    let data = addr("brig: e2b sandboxes on ");
    std::thread::spawn(move || for _ in lines {});
    let key = std::fs::read_to_string(home.path().join("local.key")).unwrap();
    let key = key.trim();

    let created: serde_json::Value = ureq::post(&format!("{api}/v2/sandboxes"))
        .set("X-API-KEY", key)
        .send_json(serde_json::json!({"templateID": "host"}))
        .expect("create")
        .into_json()
        .unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    assert!(!processes_of(&id).is_empty(), "{created}");

    // The data plane: an unknown sandbox is E2B's 502.
    match ureq::get(&format!("{data}/health"))
        .set("E2b-Sandbox-Id", "nosuch")
        .set("E2b-Sandbox-Port", "49983")
        .call()
    {
        Err(ureq::Error::Status(502, r)) => {
            let body: serde_json::Value = r.into_json().unwrap();
            assert_eq!(body["message"], "The sandbox was not found", "{body}");
        }
        other => panic!("expected 502: {other:?}"),
    }

    let killed = ureq::delete(&format!("{api}/sandboxes/{id}"))
        .set("X-API-KEY", key)
        .call()
        .expect("kill");
    assert_eq!(killed.status(), 204);
    assert!(eventually(Duration::from_secs(5), || processes_of(&id).is_empty()));

    support::signal(child.id(), libc::SIGTERM);
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "brig serve exits 0 on SIGTERM: {status:?}"
    );
}

/// The first start on a fresh machine: `brig serve --e2b` prepares `base`
/// and `code-interpreter-v1` in the background from the start, and an E2B
/// create of either meanwhile is answered at once with a 503 the clients
/// retry (`Retry-After`), saying it is being prepared and for how long,
/// never held past the clients' 60 s timeout. The build is held here by
/// taking its lock first (what a concurrent build of it would hold), so
/// nothing is built; the daemon stays responsive and stops promptly.
#[test]
fn e2b_creates_of_a_template_being_prepared_answer_503_at_once() {
    require_root!();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("templates/base");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = dir.join(".lock");
    // -F: flock execs the sleep itself, so killing it lets the lock go.
    let mut holder = std::process::Command::new("flock")
        .arg("-F")
        .arg(&lock)
        .args(["sleep", "600"])
        .spawn()
        .expect("flock(1)");
    assert!(
        eventually(Duration::from_secs(5), || {
            !std::process::Command::new("flock")
                .args(["-n"])
                .arg(&lock)
                .arg("true")
                .status()
                .unwrap()
                .success()
        }),
        "the build lock is not held"
    );
    let (mut child, url, api, _, lines) = start_e2b(home.path(), &[]);
    std::thread::spawn(move || for _ in lines {});
    let key = std::fs::read_to_string(home.path().join("local.key")).unwrap();
    let key = key.trim();

    for template in ["base", "code-interpreter-v1"] {
        let started = std::time::Instant::now();
        let answer = ureq::post(&format!("{api}/v2/sandboxes"))
            .set("X-API-KEY", key)
            .timeout(Duration::from_secs(20))
            .send_json(serde_json::json!({"templateID": template}));
        let took = started.elapsed();
        match answer {
            Err(ureq::Error::Status(503, r)) => {
                assert_eq!(r.header("retry-after"), Some("10"));
                let body: serde_json::Value = r.into_json().unwrap();
                let message = body["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains(&format!("template {template} is still being prepared"))
                        && message.contains("s so far"),
                    "{body}"
                );
                assert_eq!(body["code"], 503, "{body}");
            }
            other => panic!("{template}: expected 503 at once: {other:?}"),
        }
        assert!(
            took < Duration::from_secs(5),
            "{template}: answered after {took:?}"
        );
    }
    // The daemon serves everything else meanwhile.
    let created: serde_json::Value = ureq::post(&format!("{url}/v1/sandboxes"))
        .set("Authorization", &format!("Bearer {key}"))
        .send_json(serde_json::json!({}))
        .expect("a host create while base is being prepared")
        .into_json()
        .unwrap();
    assert_eq!(created["state"], "running", "{created}");

    // It stops promptly, the build still waiting for its lock; only then
    // is the lock let go (so nothing is ever built here).
    let stopping = std::time::Instant::now();
    support::stop_daemon(&mut child);
    assert!(
        stopping.elapsed() < Duration::from_secs(20),
        "stopping took {:?}",
        stopping.elapsed()
    );
    let _ = holder.kill();
    let _ = holder.wait();
}

/// A background build that fails (here: `templates/base` is a file, so
/// nothing can be built there) is remembered: E2B creates of it are
/// answered at once with the cause and when it is tried again, and only
/// one build is attempted for all of them (one "not prepared" line in the
/// daemon's log), instead of one failing build per create.
#[test]
fn a_failed_background_build_is_reported_not_retried_per_create() {
    require_root!();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("templates")).unwrap();
    std::fs::write(home.path().join("templates/base"), "not a directory").unwrap();
    let (mut child, _url, api, before, lines) = start_e2b(home.path(), &["--prepare", "base"]);
    // Everything it logs, from the start (the build may fail before the
    // address is printed).
    let log = std::sync::Arc::new(std::sync::Mutex::new(before));
    std::thread::spawn({
        let log = log.clone();
        move || {
            for line in lines.map_while(Result::ok) {
                log.lock().unwrap().push(line);
            }
        }
    });
    let key = std::fs::read_to_string(home.path().join("local.key")).unwrap();
    let key = key.trim().to_string();
    let create = || match ureq::post(&format!("{api}/v2/sandboxes"))
        .set("X-API-KEY", &key)
        .timeout(Duration::from_secs(20))
        .send_json(serde_json::json!({"templateID": "base"}))
    {
        Err(ureq::Error::Status(503, r)) => {
            let body: serde_json::Value = r.into_json().unwrap();
            body["message"].as_str().unwrap_or_default().to_string()
        }
        other => panic!("expected 503: {other:?}"),
    };
    assert!(
        eventually(Duration::from_secs(20), || create()
            .contains("template base could not be prepared")),
        "the failure is never reported: {}",
        create()
    );
    for _ in 0..5 {
        let message = create();
        assert!(
            message.contains("could not be prepared")
                && message.contains("tried again")
                && message.contains("brig template build base"),
            "{message}"
        );
    }
    let attempts = log
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("template base: not prepared"))
        .count();
    // One attempt at most: a retry per create would log each. (The first
    // may come before the daemon's address, which start_daemon prints
    // rather than keeps: on a loaded machine the build fails that fast.)
    assert!(
        attempts <= 1,
        "{attempts} attempts: {:?}",
        log.lock().unwrap()
    );
    support::stop_daemon(&mut child);
}

/// `brig serve --e2b` on loopback ports (and `extra`): the daemon, its
/// native URL, its E2B API's URL, the log lines before that address, and
/// the rest of its log.
fn start_e2b(
    home: &std::path::Path,
    extra: &[&str],
) -> (
    std::process::Child,
    String,
    String,
    Vec<String>,
    support::DaemonLog,
) {
    let mut args = vec![
        "--e2b",
        "--e2b-api",
        "127.0.0.1:0",
        "--e2b-sandbox",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let (child, url, mut lines) = support::start_daemon(home, &args);
    let mut before = Vec::new();
    let api = loop {
        let line = lines.next().expect("brig serve exited").unwrap();
        if let Some(a) = line.strip_prefix("brig: e2b api on ") {
            break a.to_string();
        }
        before.push(line);
    };
    (child, url, api, before, lines)
}
