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
