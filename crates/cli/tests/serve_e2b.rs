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

/// A daemon stopped (SIGTERM) or killed (SIGKILL) while it prepares a
/// template in the background leaves no build running and nothing mounted:
/// the builder (a stand-in for mmdebstrap that mounts in its chroot,
/// starts a child and waits, as mmdebstrap's apt and dpkg do) dies with
/// the daemon, its child too. Before, the build ran on as an orphan after
/// its daemon had gone, with its mounts on the host.
#[test]
fn a_template_build_ends_with_its_daemon() {
    require_root!();
    const FAKE: &str = r#"#!/bin/sh
# Called as: mmdebstrap [options] SUITE TARGET MIRROR
eval target=\${$(($# - 1))}
mkdir -p "$target/proc"
mount -t tmpfs brig-fake-build "$target/proc"
sh -c 'sleep 600; true' brig-fake-build-child "$target" &
touch "$target/started"
wait
"#;
    let scratch = tempfile::tempdir().unwrap();
    let fake = scratch.path().join("mmdebstrap");
    std::fs::write(&fake, FAKE).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for signal in [libc::SIGTERM, libc::SIGKILL] {
        let home = tempfile::tempdir().unwrap();
        let templates = home.path().join("templates");
        let mut cmd = std::process::Command::new(support::BRIG);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--e2b"])
            .args(["--e2b-api", "127.0.0.1:0", "--e2b-sandbox", "127.0.0.1:0"])
            .args(["--prepare", "base"])
            .env("BRIG_MMDEBSTRAP", &fake);
        let (mut child, _url, lines) = support::start_daemon_with(cmd, home.path());
        std::thread::spawn(move || for _ in lines {});
        // The builder and its child, found by the build directory in
        // their command lines.
        let needle = templates.to_string_lossy().into_owned();
        let builders = || support::pids_by_cmdline(|c| support::holds(c, &needle));
        let started = || {
            walk(&templates)
                .iter()
                .any(|p| p.file_name().is_some_and(|n| n == "started"))
        };
        assert!(
            eventually(Duration::from_secs(30), started),
            "the build never started ({})",
            signal
        );
        assert!(
            builders().len() >= 2,
            "the builder and its child: {:?}",
            builders()
        );
        support::signal(child.id(), signal);
        let _ = child.wait();
        assert!(
            eventually(Duration::from_secs(10), || builders().is_empty()),
            "signal {signal}: the build outlived its daemon: {:?}",
            builders()
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains("brig-fake-build")
                && !mounts.contains(&*home.path().to_string_lossy()),
            "signal {signal}: mounts left:\n{mounts}"
        );
    }
}

/// Every path below `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
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
    let mut args = support::E2B_PLANES.to_vec();
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

/// E2B's own connection path: `brig serve --e2b --e2b-domain` serves both
/// planes over HTTPS, and the official Python and JS clients, given only
/// `E2B_DOMAIN` (no `E2B_API_URL`, no `E2B_SANDBOX_URL`) and brig's local
/// CA as a trusted certificate (Python: the current release and 2.48),
/// create, run, move files, reach a port of
/// the sandbox by `get_host` and kill (tests/e2b/domain_sdk.py,
/// js_domain.mjs), and use a volume through its content API. A client
/// that does not trust the CA is refused by
/// TLS: the certificate is really checked.
#[test]
fn the_clients_need_only_e2b_domain_over_https() {
    require_root!();
    let resolved = std::net::ToSocketAddrs::to_socket_addrs(&("49983-x.brig.localhost", 443))
        .map(|a| a.count())
        .unwrap_or(0);
    if resolved == 0 {
        support::skip(
            "names under brig.localhost do not resolve here: tests/support/install-deps.sh \
             installs libnss-myhostname",
        );
        return;
    }
    let cache = brig_test_support::test_cache();
    let python = cache.join("e2b-venv/bin/python");
    let node_dir = cache.join("e2b-node");
    if !python.exists()
        || !cache.join("e2b-venv-2.48/bin/python").exists()
        || !node_dir.join("node_modules/e2b").exists()
    {
        support::skip(&format!(
            "the E2B clients are missing from {}: tests/support/install-python-deps.sh and \
             install-node-deps.sh install them",
            cache.display()
        ));
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (mut child, _url, api, before, lines) = start_e2b(
        home.path(),
        &[
            "--e2b-domain",
            "brig.localhost",
            "--e2b-https",
            "127.0.0.1:0",
            "--prepare",
            "none",
        ],
    );
    std::thread::spawn(move || for _ in lines {});
    // brig: e2b over https on ADDR: E2B_DOMAIN=D (trust the CA PATH)
    let https = before
        .iter()
        .find(|l| l.starts_with("brig: e2b over https on "))
        .unwrap_or_else(|| panic!("no https line in {before:?}"));
    let domain = https
        .split("E2B_DOMAIN=")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(domain.starts_with("brig.localhost:"), "{https}");
    let ca = home.path().join("tls/brig.localhost/ca.pem");
    assert!(https.contains(&ca.display().to_string()), "{https}");
    let key = std::fs::read_to_string(home.path().join("local.key")).unwrap();
    let key = brig_runtime::e2b_spelling(key.trim()).unwrap();

    // The host's bundle with brig's CA: what a user's trust store holds
    // once they have added it.
    let bundle = home.path().join("bundle.pem");
    let system = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    std::fs::write(&bundle, system + &std::fs::read_to_string(&ca).unwrap()).unwrap();
    let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2b");
    let client = |cmd: &mut std::process::Command| {
        cmd.env("E2B_API_KEY", &key)
            .env("E2B_DOMAIN", &domain)
            .env("E2B_TEMPLATE", "host")
            .env_remove("E2B_API_URL")
            .env_remove("E2B_SANDBOX_URL")
            .env_remove("E2B_DEBUG")
            .output()
            .unwrap()
    };

    // The current client and the generation before it.
    for venv in ["e2b-venv", "e2b-venv-2.48"] {
        let python = cache.join(venv).join("bin/python");
        let out = client(
            std::process::Command::new(&python)
                .arg(scripts.join("domain_sdk.py"))
                .env("SSL_CERT_FILE", &bundle),
        );
        let stdout = support::text(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("15 passed, 0 failed"),
            "domain_sdk.py with {venv}:\n{stdout}\n{}",
            support::text(&out.stderr)
        );
    }

    // Node resolves the client from its own directory.
    let js = node_dir.join(format!("{}-js_domain.mjs", std::process::id()));
    std::fs::copy(scripts.join("js_domain.mjs"), &js).unwrap();
    let out = client(
        std::process::Command::new("node")
            .arg(&js)
            .current_dir(&node_dir)
            .env("NODE_EXTRA_CA_CERTS", &ca),
    );
    let _ = std::fs::remove_file(&js);
    let stdout = support::text(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("7 passed, 0 failed"),
        "js_domain.mjs:\n{stdout}\n{}",
        support::text(&out.stderr)
    );

    // Without brig's CA, the client refuses the daemon's certificate.
    let out = client(
        std::process::Command::new(&python)
            .args(["-c", "from e2b import Sandbox; Sandbox.create('host')"])
            .env("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt"),
    );
    let stderr = support::text(&out.stderr);
    assert!(!out.status.success(), "created without trusting the CA");
    assert!(
        stderr.to_lowercase().contains("certificate"),
        "not refused by TLS:\n{stderr}"
    );

    // Every sandbox the clients made is gone.
    let (status, listed) = {
        let r = ureq::get(&format!("{api}/sandboxes"))
            .set("X-API-KEY", &key)
            .call()
            .unwrap();
        (r.status(), r.into_json::<serde_json::Value>().unwrap())
    };
    assert_eq!(status, 200);
    assert_eq!(listed, serde_json::json!([]), "left running");
    support::stop_daemon(&mut child);
}
