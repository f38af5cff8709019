//! Sandboxes outlive the daemon: `kill -9` of `brig serve`, twice, and a
//! new daemon on the same home each time (the second time a copy of the
//! binary at another path, as an upgrade in place installs a new file).
//!
//! Before the first kill: 20 native sandboxes, each with a background
//! process appending a counter to a file every 20 ms, one of them with a
//! short timeout; and an E2B sandbox (through the official Python SDK,
//! tests/e2b/live_restore_sdk.py) with a background command streaming a
//! counter and a PTY running a shell. After each restart:
//!
//! - every sandbox is listed `running` with its record unchanged (id,
//!   labels, creation time, deadline);
//! - every counter kept counting while no daemon ran: no gap, no restart;
//! - files written before are still there;
//! - after the last restart, the E2B command and PTY are re-attached
//!   through the SDK and stream (the script checks);
//! - the short-timeout sandbox is stopped at its original deadline, not
//!   one counted from a restart;
//! - a sandbox paused before the kill is still paused (its counter stood
//!   still) and resumes where it stopped.
//!
//! Finally a SIGTERM ends everything and nothing is left on the host.
//!
//! A port published on the host (`brig create -p`) is published again by
//! the next daemon, and `brig forward` reaches it through the API.
//! Needs root and the E2B SDK venv (scripts/test installs it).
//!
//! And an upgrade across versions: sandboxes started by an earlier build
//! of brig (`BRIG_TEST_PREVIOUS`, built by tests/support/build-previous.sh:
//! an older agent protocol and state schema) are re-adopted by this one.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::{eventually, BRIG};

const SANDBOXES: usize = 20;
/// The short-lived sandbox's time to live.
const SHORT_TTL: Duration = Duration::from_secs(25);

struct Daemon {
    child: Child,
    url: String,
    e2b_api: String,
    e2b_data: String,
    key: String,
}

impl Daemon {
    fn start(bin: &Path, home: &Path) -> Daemon {
        // No template builds in the background either (this home has
        // none): not what this test is about.
        Daemon::start_with(Command::new(bin), home, &["--prepare", "none"])
    }

    /// A daemon of another build, with that build's agent (which knows no
    /// --prepare and builds nothing in the background).
    fn start_build(dir: &Path, home: &Path) -> Daemon {
        let mut cmd = Command::new(dir.join("brig"));
        cmd.env("BRIG_AGENT", dir.join("brig-agent"));
        Daemon::start_with(cmd, home, &[])
    }

    fn start_with(mut cmd: Command, home: &Path, extra: &[&str]) -> Daemon {
        cmd.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--e2b",
            "--e2b-api",
            "127.0.0.1:0",
            "--e2b-sandbox",
            "127.0.0.1:0",
            // Pre-made sandboxes are not what this test is about.
            "--pool",
            "host=0",
            "--pool",
            "base+setuid=0",
        ]);
        cmd.args(extra);
        let (child, url, mut lines) = support::start_daemon_with(cmd, home);
        let mut addr = |prefix: &str| loop {
            let line = lines.next().expect("brig serve exited").unwrap();
            if let Some(a) = line.strip_prefix(prefix) {
                break a.to_string();
            }
        };
        let e2b_api = addr("brig: e2b api on ");
        let e2b_data = addr("brig: e2b sandboxes on ");
        // The daemon's log goes to the test's stderr: shown when it fails.
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                eprintln!("daemon: {line}");
            }
        });
        let key = std::fs::read_to_string(home.join("local.key"))
            .unwrap()
            .trim()
            .to_string();
        Daemon {
            child,
            url,
            e2b_api,
            e2b_data,
            key,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let req = ureq::request(method, &format!("{}{path}", self.url))
            .set("Authorization", &format!("Bearer {}", self.key));
        let resp = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match resp {
            Ok(r) => r.into_json().unwrap_or(Value::Null),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    fn read(&self, id: &str, path: &str) -> String {
        ureq::get(&format!("{}/v1/sandboxes/{id}/files?path={path}", self.url))
            .set("Authorization", &format!("Bearer {}", self.key))
            .call()
            .unwrap_or_else(|e| panic!("read {path} in {id}: {e}"))
            .into_string()
            .unwrap()
    }

    fn sdk(&self, phase: &str, state: &Path) {
        let python = brig_test_support::test_cache().join("e2b-venv/bin/python");
        assert!(
            python.exists(),
            "{} is missing: tests/support/install-python-deps.sh makes it",
            python.display()
        );
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2b/live_restore_sdk.py");
        let out = Command::new(python)
            .arg(script)
            .arg(phase)
            .arg(state)
            .env("E2B_API_KEY", &self.key)
            .env("E2B_API_URL", &self.e2b_api)
            .env("E2B_SANDBOX_URL", &self.e2b_data)
            .env("E2B_TEMPLATE", "host")
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(" passed, 0 failed"),
            "live_restore_sdk.py {phase}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprint!("{stdout}");
    }

    fn kill9(mut self) {
        support::signal(self.child.id(), libc::SIGKILL);
        self.child.wait().unwrap();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        support::stop_daemon(&mut self.child);
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The counter file's numbers, which must be 0, 1, 2, … without a gap.
fn counted(daemon: &Daemon, id: &str) -> usize {
    let text = daemon.read(id, "/tmp/counter");
    let numbers: Vec<usize> = text
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        numbers.iter().enumerate().all(|(i, n)| i == *n),
        "{id}: the counter restarted or skipped: ...{:?}",
        &numbers[numbers.len().saturating_sub(5)..]
    );
    numbers.len()
}

/// The records of `ids`, by id.
fn records(daemon: &Daemon, ids: &[String]) -> Vec<Value> {
    ids.iter()
        .map(|id| daemon.call("GET", &format!("/v1/sandboxes/{id}"), None))
        .collect()
}

#[test]
fn sandboxes_and_their_processes_survive_kill_9_and_an_upgrade() {
    require_root!();
    let home = tempfile::tempdir().unwrap();
    let state_file = home.path().join("e2b-state.json");
    let daemon = Daemon::start(Path::new(BRIG), home.path());

    let mut ids = Vec::new();
    for n in 0..SANDBOXES {
        let timeout = if n == 0 {
            format!("{}s", SHORT_TTL.as_secs())
        } else {
            "10m".into()
        };
        let sb = daemon.call(
            "POST",
            "/v1/sandboxes",
            Some(json!({"timeout": timeout, "labels": {"n": n.to_string()}})),
        );
        let id = sb["id"].as_str().unwrap().to_string();
        daemon.call(
            "POST",
            &format!("/v1/sandboxes/{id}/processes"),
            Some(json!({
                "argv": ["sh", "-c", "i=0; while :; do echo $i >> /tmp/counter; i=$((i+1)); sleep 0.02; done"],
                "background": true,
            })),
        );
        ids.push(id);
    }
    let short = ids[0].clone();
    let short_deadline = daemon.call("GET", &format!("/v1/sandboxes/{short}"), None)["expires_at"]
        .as_i64()
        .unwrap();
    // A file written before: it must be there after.
    ureq::put(&format!(
        "{}/v1/sandboxes/{}/files?path=/tmp/kept",
        daemon.url, ids[1]
    ))
    .set("Authorization", &format!("Bearer {}", daemon.key))
    .send_string("written before the kill")
    .unwrap();
    daemon.sdk("before", &state_file);
    std::thread::sleep(Duration::from_millis(500));
    let paused = ids[3].clone();
    let counted_before_pause = counted(&daemon, &paused);
    let before_pause_ms = Instant::now();
    daemon.call(
        "POST",
        &format!("/v1/sandboxes/{paused}/pause"),
        Some(json!({})),
    );
    let before = records(&daemon, &ids);
    let mut counts: Vec<usize> = ids
        .iter()
        .map(|id| {
            if *id == paused {
                0
            } else {
                counted(&daemon, id)
            }
        })
        .collect();

    // Two restarts: the same binary, then a copy at another path.
    let next = home.path().join("brig-next");
    std::fs::copy(BRIG, &next).unwrap();
    let mut daemon = daemon;
    for (round, bin) in [PathBuf::from(BRIG), next.clone()].iter().enumerate() {
        daemon.kill9();
        // Nobody serves for a while; the sandboxes go on.
        let down = Instant::now();
        std::thread::sleep(Duration::from_secs(2));
        daemon = Daemon::start(bin, home.path());
        let down = down.elapsed();

        let after = records(&daemon, &ids);
        for (b, a) in before.iter().zip(&after) {
            let want = if a["id"] == paused.as_str() {
                "paused"
            } else {
                "running"
            };
            assert_eq!(a["state"], want, "round {round}: {a}");
            for field in ["id", "labels", "created_at", "expires_at", "template"] {
                assert_eq!(
                    a[field], b[field],
                    "round {round}: {field} changed: {b} -> {a}"
                );
            }
        }
        for (i, id) in ids.iter().enumerate() {
            if *id == paused {
                // Frozen: its agent answers nothing until resumed.
                continue;
            }
            let now = counted(&daemon, id);
            // 20 ms per tick: the daemon was down `down`; allow for a
            // loaded host, but demand that it counted through the gap.
            let least = counts[i] + (down.as_millis() as usize / 20) / 4;
            assert!(
                now >= least,
                "round {round}: {id} counted {} -> {now} across {down:?} without a daemon",
                counts[i]
            );
            counts[i] = now;
        }
        assert_eq!(daemon.read(&ids[1], "/tmp/kept"), "written before the kill");
        // New work in an adopted sandbox works as in a new one.
        let out = Command::new(BRIG)
            .args(["exec", &ids[2], "--", "sh", "-c", "echo adopted-$((6*7))"])
            .env("BRIG_URL", &daemon.url)
            .env("BRIG_HOME", home.path())
            .env_remove("BRIG_API_KEY")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "adopted-42\n",
            "{out:?}"
        );
    }
    daemon.sdk("after", &state_file);

    // The paused one stood still through both restarts (a frozen process
    // does not count), and resumes.
    daemon.call(
        "POST",
        &format!("/v1/sandboxes/{paused}/resume"),
        Some(json!({})),
    );
    let resumed_at = counted(&daemon, &paused);
    let paused_for = before_pause_ms.elapsed();
    assert!(
        resumed_at < counted_before_pause + paused_for.as_millis() as usize / 20 / 4,
        "the paused sandbox counted on: {counted_before_pause} -> {resumed_at} in {paused_for:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || counted(&daemon, &paused)
            > resumed_at + 5),
        "the resumed sandbox does not count"
    );

    // The short-lived sandbox ends at the deadline it got at creation.
    assert!(
        eventually(Duration::from_secs(40), || {
            daemon.call("GET", &format!("/v1/sandboxes/{short}"), None)["state"] == "stopped"
        }),
        "the short-lived sandbox outlived its deadline"
    );
    let ended_at = daemon.call("GET", &format!("/v1/sandboxes/{short}"), None)["ended_at"]
        .as_i64()
        .unwrap();
    assert!(
        (ended_at - short_deadline).abs() < 3_000,
        "ended at {ended_at}, deadline {short_deadline} (now {})",
        now_ms()
    );

    // SIGTERM ends the rest; nothing of them is left.
    drop(daemon);
    for id in &ids {
        assert!(
            eventually(Duration::from_secs(10), || support::processes_of(id)
                .is_empty()),
            "processes of {id} left"
        );
        assert!(
            !Path::new(&format!("/run/brig/sb/{id}")).exists(),
            "{id}'s directory left"
        );
        let cgroups: Vec<PathBuf> = support::cgroup_dirs(id)
            .into_iter()
            .filter(|d| d.exists())
            .collect();
        assert!(cgroups.is_empty(), "{id}: cgroups left: {cgroups:?}");
    }
}

/// A native terminal session (`GET /pty`) outlives a `kill -9` of the
/// daemon: its shell keeps its state, and a client re-attaches with
/// `?pid=N` (`attached`, then the session as before, input and all).
#[test]
fn a_native_terminal_session_survives_kill_9_and_is_reattached() {
    require_root!();
    let home = tempfile::tempdir().unwrap();
    let bin = PathBuf::from(BRIG);
    let daemon = Daemon::start(&bin, home.path());
    let id = daemon.call("POST", "/v1/sandboxes", Some(json!({"timeout": "5m"})))["id"]
        .as_str()
        .unwrap()
        .to_string();

    let open = |daemon: &Daemon, query: &str| {
        let url = format!(
            "{}/v1/sandboxes/{id}/pty{query}",
            daemon.url.replacen("http://", "ws://", 1)
        );
        let mut req = tungstenite::client::IntoClientRequest::into_client_request(url).unwrap();
        req.headers_mut().insert(
            "Authorization",
            format!("Bearer {}", daemon.key).parse().unwrap(),
        );
        tungstenite::connect(req).unwrap().0
    };
    type Ws = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<std::net::TcpStream>>;
    let text_of = |ws: &mut Ws| -> Value {
        loop {
            match ws.read().unwrap() {
                tungstenite::Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
                tungstenite::Message::Binary(_) => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    let until = |ws: &mut Ws, want: &str| {
        let mut seen = String::new();
        let deadline = Instant::now() + Duration::from_secs(15);
        while !seen.contains(want) {
            assert!(Instant::now() < deadline, "never saw {want:?}: {seen:?}");
            if let tungstenite::Message::Binary(b) = ws.read().unwrap() {
                seen.push_str(&String::from_utf8_lossy(&b));
            }
        }
    };

    let mut ws = open(&daemon, "");
    ws.send(tungstenite::Message::text(r#"{"argv": ["sh"]}"#))
        .unwrap();
    let started = text_of(&mut ws);
    assert_eq!(started["type"], "started", "{started}");
    let pid = started["pid"].as_i64().unwrap();
    ws.send(tungstenite::Message::binary(
        b"X=kept; echo one-$X\n".to_vec(),
    ))
    .unwrap();
    until(&mut ws, "one-kept");

    daemon.kill9();
    drop(ws);
    let daemon = Daemon::start(&bin, home.path());
    let mut ws = open(&daemon, &format!("?pid={pid}"));
    let attached = text_of(&mut ws);
    assert_eq!(
        (attached["type"].as_str(), attached["pid"].as_i64()),
        (Some("attached"), Some(pid)),
        "{attached}"
    );
    // The same shell, with its variable.
    ws.send(tungstenite::Message::binary(b"echo two-$X\n".to_vec()))
        .unwrap();
    until(&mut ws, "two-kept");
    ws.send(tungstenite::Message::binary(b"exit 7\n".to_vec()))
        .unwrap();
    let exited = loop {
        let v = text_of(&mut ws);
        if v["type"] == "exited" {
            break v;
        }
    };
    assert_eq!(exited["code"], 7, "{exited}");
    drop(daemon);
}

/// A TCP server that answers every connection with `sandbox:` and what
/// it read until the client's half-close.
const TCP_ECHO: &str = "
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 7000))
s.listen(8)
while True:
    c, _ = s.accept()
    got = b''
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
    c.sendall(b'sandbox:' + got)
    c.close()
";

/// `data` to 127.0.0.1:`port` and what comes back (empty: nothing
/// answered), retried for up to 20 s until the answer is not empty.
fn echo(port: u16, data: &[u8]) -> Vec<u8> {
    use std::io::{Read, Write};
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tried = (|| -> std::io::Result<Vec<u8>> {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(data)?;
            s.shutdown(std::net::Shutdown::Write)?;
            let mut back = Vec::new();
            s.read_to_end(&mut back)?;
            Ok(back)
        })();
        match tried {
            Ok(back) if !back.is_empty() => return back,
            other => {
                assert!(Instant::now() < deadline, "no echo on {port}: {other:?}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A free port on the host's loopback, outside the ephemeral range.
fn free_port() -> u16 {
    brig_test_support::child_port()
}

#[test]
fn a_published_port_is_published_again_by_the_next_daemon() {
    require_root!();
    let home = tempfile::tempdir().unwrap();
    let bin = PathBuf::from(BRIG);
    let daemon = Daemon::start(&bin, home.path());
    let cli = |daemon: &Daemon, args: &[&str]| {
        Command::new(BRIG)
            .args(args)
            .env("BRIG_URL", &daemon.url)
            .env("BRIG_API_KEY", &daemon.key)
            .output()
            .unwrap()
    };
    let host_port = free_port();
    let out = cli(
        &daemon,
        &[
            "create",
            "-p",
            &format!("{host_port}:7000"),
            "--timeout",
            "5m",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!(
            "brig: 127.0.0.1:{host_port} -> port 7000 of the sandbox"
        )),
        "{said}"
    );
    let started = cli(
        &daemon,
        &["exec", "-d", &id, "--", "python3", "-c", TCP_ECHO],
    );
    assert!(started.status.success(), "{started:?}");
    assert_eq!(echo(host_port, b"first"), b"sandbox:first");
    // `brig forward` reaches the same port through the API.
    let local = free_port();
    let mut forward = Command::new(BRIG)
        .args(["forward", &id, &format!("{local}:7000")])
        .env("BRIG_URL", &daemon.url)
        .env("BRIG_API_KEY", &daemon.key)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(echo(local, b"forwarded"), b"sandbox:forwarded");
    let _ = forward.kill();
    let _ = forward.wait();
    // A taken host port: refused in words, nothing made.
    let out = cli(&daemon, &["create", "-p", &format!("{host_port}:7000")]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("host port {host_port} is already in use")),
        "{out:?}"
    );

    daemon.kill9();
    // While no daemon runs nothing listens there; the next one listens
    // again and reaches the same server.
    assert!(std::net::TcpStream::connect(("127.0.0.1", host_port)).is_err());
    let daemon = Daemon::start(&bin, home.path());
    assert_eq!(echo(host_port, b"second"), b"sandbox:second");
    let shown = cli(&daemon, &["inspect", &id]);
    assert!(
        String::from_utf8_lossy(&shown.stdout)
            .contains(&format!("Published: 127.0.0.1:{host_port} -> port 7000")),
        "{shown:?}"
    );
    // Gone with the sandbox.
    assert!(cli(&daemon, &["kill", &id]).status.success());
    assert!(eventually(Duration::from_secs(5), || {
        std::net::TcpStream::connect(("127.0.0.1", host_port)).is_err()
    }));
    drop(daemon);
}

/// The earlier build of brig that scripts/test makes
/// (tests/support/build-previous.sh), or a skip with the reason.
fn previous_build() -> Option<PathBuf> {
    match std::env::var_os("BRIG_TEST_PREVIOUS") {
        Some(dir) => Some(PathBuf::from(dir)),
        None => {
            let why = "BRIG_TEST_PREVIOUS is not set: tests/support/build-previous.sh builds an \
                       earlier brig (scripts/test sets it)";
            assert!(!brig_test_support::strict(), "{why}");
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// An upgrade across versions in place: sandboxes an earlier brig started
/// (agent protocol 3, state schema 5) run on under this one, which
/// migrates the store, adopts their agents, keeps their processes, pause
/// and deadlines, and says clearly what their older agent cannot do.
#[test]
fn an_earlier_brigs_sandboxes_run_on_after_an_upgrade() {
    require_root!();
    let Some(previous) = previous_build() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let old = Daemon::start_build(&previous, home.path());
    let counter = "i=0; while :; do echo $i >> /tmp/counter; i=$((i+1)); sleep 0.02; done";
    let mut ids = Vec::new();
    for n in 0..3 {
        let sb = old.call(
            "POST",
            "/v1/sandboxes",
            Some(json!({"timeout": "10m", "labels": {"n": n.to_string()}})),
        );
        let id = sb["id"].as_str().unwrap().to_string();
        old.call(
            "POST",
            &format!("/v1/sandboxes/{id}/processes"),
            Some(json!({"argv": ["sh", "-c", counter], "background": true})),
        );
        ids.push(id);
    }
    std::thread::sleep(Duration::from_millis(300));
    let paused = ids[2].clone();
    old.call(
        "POST",
        &format!("/v1/sandboxes/{paused}/pause"),
        Some(json!({})),
    );
    let before = records(&old, &ids);
    let counts: Vec<usize> = ids[..2].iter().map(|id| counted(&old, id)).collect();
    old.kill9();

    let new = Daemon::start(Path::new(BRIG), home.path());
    let after = records(&new, &ids);
    for (b, a) in before.iter().zip(&after) {
        for field in [
            "id",
            "state",
            "labels",
            "created_at",
            "expires_at",
            "template",
        ] {
            assert_eq!(a[field], b[field], "{field}: {a} (before: {b})");
        }
    }
    // The running ones counted on, without a gap, and answer.
    for (id, was) in ids[..2].iter().zip(&counts) {
        assert!(
            eventually(Duration::from_secs(5), || counted(&new, id) > was + 10),
            "{id}: the counter stood still"
        );
        let lines = ureq::post(&format!("{}/v1/sandboxes/{id}/exec", new.url))
            .set("Authorization", &format!("Bearer {}", new.key))
            .send_json(json!({"argv": ["echo", "adopted"]}))
            .unwrap()
            .into_string()
            .unwrap();
        let last: Value = serde_json::from_str(lines.lines().last().unwrap()).unwrap();
        assert!(
            lines.contains(r#""type":"stdout""#) && last["type"] == "exited" && last["code"] == 0,
            "{lines}"
        );
    }
    // What only the new agent has is refused in words, not broken.
    let refused = ureq::get(&format!("{}/v1/sandboxes/{}/logs", new.url, ids[0]))
        .set("Authorization", &format!("Bearer {}", new.key))
        .call();
    match refused {
        Err(ureq::Error::Status(400, resp)) => {
            let body = resp.into_string().unwrap();
            assert!(body.contains("protocol version 3"), "{body}");
        }
        other => panic!("logs of an older agent: {other:?}"),
    }
    // The paused one resumes where it stopped.
    new.call(
        "POST",
        &format!("/v1/sandboxes/{paused}/resume"),
        Some(json!({})),
    );
    let resumed = counted(&new, &paused);
    assert!(eventually(Duration::from_secs(5), || counted(
        &new, &paused
    ) > resumed + 10));
    // A sandbox made now gets this build's agent: its log works.
    let fresh = new.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"name": "after-upgrade"})),
    );
    assert_eq!(fresh["name"], "after-upgrade", "{fresh}");
    let id = fresh["id"].as_str().unwrap();
    let logs = ureq::get(&format!("{}/v1/sandboxes/{id}/logs", new.url))
        .set("Authorization", &format!("Bearer {}", new.key))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let first: Value = serde_json::from_str(logs.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "logging", "{logs}");
    drop(new);
}
