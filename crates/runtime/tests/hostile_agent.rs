//! The agent is untrusted input to the daemon: code in a sandbox that takes
//! over its agent (pid 1) can say anything on the agent's connection.
//! Here a program stands in for such an agent — garbage instead of a
//! Hello, a frame header claiming gigabytes, a flood of frames for streams
//! that were never opened, silence — and the manager must give a clear
//! error for that sandbox alone: never crash, hang another request, or
//! disturb a healthy sandbox beside it. On the fake tier (no root): the
//! agents are host processes, the connection handling is the daemon's own.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brig_agent_client::ExecRequest;
use brig_runtime::{CreateConfig, ManagerConfig, ManagerError, SandboxManager, Store, TenantId};
use brig_test_support::agent_bin;
use brig_test_support::fake_tier::FakeTier;

/// A hostile agent: Python on the listening socket the tier hands over as
/// stdin. `BODY` runs with the accepted connection `c` and helpers `frame`
/// (kind, stream, payload) and `hello`.
fn hostile(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    let script = format!(
        r#"#!/usr/bin/env python3
import os, socket, struct, time
l = socket.socket(fileno=0)
c, _ = l.accept()
def frame(kind, stream, payload=b"", length=None):
    n = len(payload) if length is None else length
    return struct.pack("<BBHII", 0xB1, kind, 0, stream, n) + payload
hello = frame(1, 0, struct.pack("<HH", 1, 4))
{body}
time.sleep(60)
"#
    );
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn echo(m: &SandboxManager, tenant: &TenantId, id: &brig_core::SandboxId) -> Vec<u8> {
    let req = ExecRequest {
        argv: vec!["echo".into(), "fine".into()],
        ..ExecRequest::default()
    };
    m.exec(tenant, id, &req)
        .unwrap()
        .wait_with_output()
        .unwrap()
        .0
}

#[test]
fn a_hostile_agent_fails_its_own_sandbox_and_nothing_else() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_in(home.path()).unwrap();
    let key = store.ensure_initial_key().unwrap().unwrap();
    let tenant = store.authenticate(&key).unwrap().tenant;
    let tier = FakeTier::new(agent_bin());
    let config = ManagerConfig {
        pool: Vec::new(),
        // A request to an agent that never answers fails after this.
        agent_answer_timeout: Duration::from_secs(1),
        ..ManagerConfig::new()
    };
    let m = SandboxManager::start(store, config, vec![std::sync::Arc::new(tier.clone())]).unwrap();
    let healthy = m.create(&tenant, CreateConfig::default()).unwrap().id;
    let scripts = tempfile::tempdir().unwrap();

    let cases = [
        ("garbage", "c.sendall(os.urandom(1 << 16))"),
        (
            "huge frame",
            "c.sendall(hello + frame(3, 1, length=0xFFFFFFF0))",
        ),
        ("bad hello", "c.sendall(frame(1, 0, b'\\xff' * 2000))"),
        (
            "flood of frames for unopened streams",
            "c.sendall(hello)\nwhile True: c.sendall(frame(3, 7, b'\\x01' + b'x' * 65536))",
        ),
        ("hangs up", "c.close()"),
    ];
    for (what, body) in cases {
        tier.use_agent_once(&hostile(scripts.path(), &what.replace(' ', "-"), body));
        let started = Instant::now();
        let result = m.create(&tenant, CreateConfig::default());
        let took = started.elapsed();
        eprintln!(
            "{what}: create {:?} in {took:?}",
            result.as_ref().map(|r| &r.id)
        );
        match result {
            // Refused at the handshake, in words.
            Err(e) => assert!(
                matches!(e, ManagerError::Handshake { .. }),
                "{what}: expected a refused handshake, got {e}"
            ),
            // A valid Hello passes the handshake. A request to that
            // sandbox then fails by itself (a broken connection at once, an
            // agent that never answers at the answer timeout), and the
            // healthy sandbox keeps answering meanwhile.
            Ok(r) => {
                std::thread::scope(|s| {
                    let pending = s.spawn(|| {
                        let asked = Instant::now();
                        let req = ExecRequest {
                            argv: vec!["true".into()],
                            ..ExecRequest::default()
                        };
                        let outcome = match m.exec(&tenant, &r.id, &req) {
                            Err(e) => Err(e.to_string()),
                            Ok(p) => p.wait_with_output().map_err(|e| e.to_string()),
                        };
                        (outcome.err(), asked.elapsed())
                    });
                    std::thread::sleep(Duration::from_millis(100));
                    for _ in 0..5 {
                        let t = Instant::now();
                        assert_eq!(echo(&m, &tenant, &healthy), b"fine\n", "during {what}");
                        assert!(
                            t.elapsed() < Duration::from_secs(1),
                            "{what}: the healthy sandbox took {:?}",
                            t.elapsed()
                        );
                    }
                    eprintln!("{what}: the healthy sandbox answered throughout");
                    // The request gave up on its own at the answer timeout,
                    // before anyone deleted the sandbox.
                    let (error, took) = pending.join().unwrap();
                    let error = error.unwrap_or_else(|| panic!("{what}: an exec succeeded"));
                    eprintln!("{what}: the exec failed in {took:?}: {error}");
                    assert!(took < Duration::from_millis(2500), "{what}: {took:?}");
                    m.delete(&tenant, &r.id).unwrap();
                });
            }
        }
        assert!(
            took < Duration::from_secs(5),
            "{what}: the create took {took:?}"
        );
        // The healthy sandbox beside it is untouched.
        assert_eq!(echo(&m, &tenant, &healthy), b"fine\n", "after {what}");
    }

    // Silence: the handshake times out for that create alone, while the
    // healthy sandbox answers throughout.
    tier.use_agent_once(&hostile(scripts.path(), "silent", "pass"));
    let silent = std::thread::scope(|s| {
        let pending = s.spawn(|| m.create(&tenant, CreateConfig::default()));
        std::thread::sleep(Duration::from_millis(200));
        for _ in 0..20 {
            let t = Instant::now();
            assert_eq!(echo(&m, &tenant, &healthy), b"fine\n");
            assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        }
        pending.join().unwrap()
    });
    let e = silent.expect_err("a silent agent cannot make a sandbox");
    assert!(matches!(e, ManagerError::Handshake { .. }), "{e}");
    assert_eq!(echo(&m, &tenant, &healthy), b"fine\n");
    m.shutdown();
}
