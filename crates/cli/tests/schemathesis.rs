//! The real `brig serve`, fuzzed against its contract: tests/api/schemathesis.sh
//! runs schemathesis (from the venv tests/support/install-python-deps.sh
//! makes) on every operation of api/openapi.yaml, checking each response's
//! status, content type, headers and body against the document; any 5xx
//! fails. The script lists the checks it leaves out and why.
//!
//! Needs root and the venv (scripts/test installs it); skips otherwise, and
//! fails instead under BRIG_TEST_STRICT=1.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The run takes ~10-25 s here; a hung request must not hold CI.
const RUN_LIMIT: Duration = Duration::from_secs(150);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn schemathesis() -> PathBuf {
    let cache = std::env::var_os("BRIG_TEST_CACHE").map_or_else(
        || PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/brig-test"),
        PathBuf::from,
    );
    cache.join("venv/bin/st")
}

#[test]
fn schemathesis_finds_no_server_error_and_no_mismatch_with_the_document() {
    require_root!();
    if !schemathesis().exists() {
        support::skip(&format!(
            "{} is missing: run tests/support/install-python-deps.sh",
            schemathesis().display()
        ));
        return;
    }
    let home = tempfile::tempdir().unwrap();
    // No pulls: a generated template name must not send the daemon to a
    // registry on the internet.
    let (mut daemon, url, lines) = support::start_daemon(
        home.path(),
        // Small volumes: every generated create that is valid makes one.
        &["--pull", "never", "--volume-size", "16MiB"],
    );
    // The daemon's log, shown if the run fails (a 5xx is logged there).
    let log = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let key = std::fs::read_to_string(home.path().join("local.key")).unwrap();

    // A bound of its own, well inside nextest's: a request that never
    // ends would otherwise hold the run until the slow-test limit.
    // A live sandbox for the operations on one (tests/api/schemathesis.toml).
    let sandbox: serde_json::Value = ureq::post(&format!("{url}/v1/sandboxes"))
        .set("Authorization", &format!("Bearer {}", key.trim()))
        .send_json(serde_json::json!({}))
        .expect("create a sandbox")
        .into_json()
        .unwrap();
    let mut st = Command::new(repo().join("tests/api/schemathesis.sh"))
        .args([&url, key.trim()])
        .env("BRIG_SANDBOX_ID", sandbox["id"].as_str().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tests/api/schemathesis.sh");
    let mut stdout = st.stdout.take().unwrap();
    let mut stderr = st.stderr.take().unwrap();
    let report = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + RUN_LIMIT;
    let finished = loop {
        if let Some(status) = st.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            // The script execs st, so this is schemathesis itself.
            let _ = st.kill();
            let _ = st.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    support::signal(daemon.id(), libc::SIGTERM);
    let status = daemon.wait().unwrap();
    let log = log.join().unwrap();
    let (report, errors) = (report.join().unwrap(), errors.join().unwrap());
    let verdict = match finished {
        Some(s) if s.success() => None,
        Some(s) => Some(format!("schemathesis found problems ({s})")),
        None => Some(format!("schemathesis did not finish in {RUN_LIMIT:?}")),
    };
    if let Some(verdict) = verdict {
        panic!(
            "{verdict}:\n{report}\n{errors}\ndaemon log:\n{}",
            log.join("\n")
        );
    }
    assert!(
        status.success(),
        "brig serve exits 0 on SIGTERM: {status:?}"
    );
}
