//! Shared helpers for the `brig` end-to-end tests: finding the binary,
//! starting a daemon, and looking at the host after a sandbox is gone; on
//! top of brig-test-support (skipping loudly where the host lacks what a
//! test needs, the test rootfs).
#![allow(dead_code, unused_imports)] // each test file uses a different subset

pub mod tiers;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub const BRIG: &str = env!("CARGO_BIN_EXE_brig");

/// Skipping (loudly: a failure under `BRIG_TEST_STRICT=1`, which
/// scripts/test sets), the test rootfs and the templates' home, as every
/// crate's tests have them.
pub use brig_test_support::{rootfs, skip, template_home};

/// Skip the calling test, with the reason on stderr, unless we are root.
#[macro_export]
macro_rules! require_root {
    () => {
        if $crate::support::euid() != 0 {
            $crate::support::skip(&format!(
                "brig's process tier needs root and this test runs as uid {}",
                $crate::support::euid()
            ));
            return;
        }
    };
}

/// The Debian rootfs the test script builds, or a printed skip.
#[macro_export]
macro_rules! require_rootfs {
    () => {
        match $crate::support::rootfs() {
            Some(r) => r,
            None => {
                $crate::support::skip(
                    "BRIG_TEST_ROOTFS is not set; scripts/test builds a Debian rootfs and sets it",
                );
                return;
            }
        }
    };
}

/// Whether this host can run sandboxes of `isolation` (`process`, or
/// `gvisor` where runsc is installed); otherwise a printed skip (a failure
/// under `BRIG_TEST_STRICT=1`: CI machines have every tier).
pub fn tier_or_skip(isolation: &str) -> bool {
    match isolation {
        "gvisor" if brig_gvisor::find_runsc().is_none() => {
            skip("runsc is not installed (apt-get install runsc): no gvisor tier to test");
            false
        }
        "vm" if brig_vm::find_qemu().is_none() => {
            skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86): no vm tier to test");
            false
        }
        _ => true,
    }
}

pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

/// Send `sig` to a child process.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill with a pid we spawned.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

pub fn brig() -> Command {
    let mut cmd = Command::new(BRIG);
    // A template name that is no recipe is an image to pull: only ever
    // from a registry on this machine.
    if std::env::var_os("BRIG_REGISTRIES").is_none() {
        cmd.env("BRIG_REGISTRIES", "127.0.0.1,localhost");
    }
    cmd
}

/// `brig run [args] -- cmd...` with the given template.
pub fn run(template: &str, args: &[&str], cmd: &[&str]) -> Output {
    brig()
        .arg("run")
        .arg("--template")
        .arg(template)
        .args(args)
        .arg("--")
        .args(cmd)
        .output()
        .expect("spawn brig")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The templates every behaviour is checked on: `host`, and the Debian
/// rootfs when the test script built one.
pub fn templates() -> Vec<String> {
    let mut t = vec!["host".to_string()];
    match rootfs() {
        Some(r) => t.push(format!("dir:{}", r.display())),
        None => skip("BRIG_TEST_ROOTFS not set; checking the host template only"),
    }
    t
}

/// The cgroup directories a sandbox with this id would have.
pub fn cgroup_dirs(id: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for c in ["memory", "pids", "cpu", "freezer", "unified", ""] {
        let base = if c.is_empty() {
            PathBuf::from("/sys/fs/cgroup/brig")
        } else {
            PathBuf::from(format!("/sys/fs/cgroup/{c}/brig"))
        };
        v.push(base.join(id));
    }
    v
}

/// Host pids of processes that belong to sandbox `id`'s cgroups.
pub fn processes_of(id: &str) -> Vec<u32> {
    let needle = format!("/brig/{id}");
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        if cg.contains(&needle) {
            pids.push(pid);
        }
    }
    pids
}

/// Host pids of processes whose command line (its arguments as given,
/// NUL-separated) `matches`.
pub fn pids_by_cmdline(matches: impl Fn(&[u8]) -> bool) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| matches(&c)))
        .collect()
}

/// Whether `haystack` holds `needle` (bytes).
pub fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len().max(1))
        .any(|w| w == needle.as_bytes())
}

/// Poll `f` until it is true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// Mount points on the host whose path mentions `needle`.
pub fn host_mounts_matching(needle: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .map(str::to_string)
        .collect()
}

/// The rest of a daemon's stderr after its "listening" line.
pub type DaemonLog = std::io::Lines<std::io::BufReader<std::process::ChildStderr>>;

/// `brig serve` on a free loopback port with `home` as its home, the agent
/// cargo built next to brig, and the test rootfs's parent allowed as a
/// `--template-root` (when BRIG_TEST_ROOTFS is set). Returns the daemon,
/// its URL and the rest of its stderr, which the caller must keep reading
/// (or drop to a thread that does) so the daemon never blocks on a full
/// pipe.
pub fn start_daemon(
    home: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, String, DaemonLog) {
    let mut cmd = Command::new(BRIG);
    cmd.args(["serve", "--listen", "127.0.0.1:0"]).args(extra);
    start_daemon_with(cmd, home)
}

/// [`start_daemon`] with a command of the caller's (`brig serve …`, from
/// any binary): the home and the template root are added.
pub fn start_daemon_with(
    mut cmd: Command,
    home: &std::path::Path,
) -> (std::process::Child, String, DaemonLog) {
    use std::io::BufRead;
    use std::path::Path;
    if let Some(parent) = rootfs().and_then(|r| r.parent().map(Path::to_path_buf)) {
        cmd.arg("--template-root").arg(parent);
    }
    // The agent this brig carries (static, embedded), unless the caller
    // chose another (the upgrade test's earlier build brings its own).
    // The vm tier's guest kernel and templates' images, fetched and built
    // once for every test daemon (each would otherwise fetch its own).
    if std::env::var_os("BRIG_VM_HOME").is_none() {
        cmd.env("BRIG_VM_HOME", brig_test_support::test_cache().join("vm"));
    }
    let mut child = cmd
        .env("BRIG_HOME", home)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start brig serve");
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("brig serve exited before listening")
            .unwrap();
        if let Some(url) = line.strip_prefix("brig: listening on ") {
            break url.to_string();
        }
        // What it said while starting (re-adoption warnings above all)
        // belongs in the failing test's output.
        eprintln!("daemon: {line}");
    };
    (child, url, lines)
}

/// Stop a `brig serve` the way an operator does, with SIGTERM (it ends its
/// sandboxes and waits for their teardown), and wait for it; SIGKILL only
/// if it has not exited within 30 s.
pub fn stop_daemon(child: &mut std::process::Child) {
    if matches!(child.try_wait(), Ok(Some(_))) {
        return;
    }
    signal(child.id(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// `brig serve`'s arguments for E2B's two planes on loopback ports of
/// their own.
pub const E2B_PLANES: [&str; 5] = [
    "--e2b",
    "--e2b-api",
    "127.0.0.1:0",
    "--e2b-sandbox",
    "127.0.0.1:0",
];

/// A `brig serve` of a test's own, as the tier suites (gvisor.rs, vm.rs)
/// drive it: the CLI and the native API with its key, E2B's planes with
/// `--e2b`. Stopped with SIGTERM when dropped.
pub struct TestDaemon {
    pub child: std::process::Child,
    pub url: String,
    pub home: PathBuf,
    pub key: String,
    /// E2B's control plane and data plane, with `--e2b`.
    pub e2b: Option<(String, String)>,
}

impl TestDaemon {
    pub fn start(home: &std::path::Path) -> TestDaemon {
        Self::start_with(home, &[])
    }

    /// With E2B's planes on loopback ports of their own (`--e2b`), and
    /// `extra`.
    pub fn start_e2b(home: &std::path::Path, extra: &[&str]) -> TestDaemon {
        let mut args = E2B_PLANES.to_vec();
        args.extend_from_slice(extra);
        Self::start_with(home, &args)
    }

    pub fn start_with(home: &std::path::Path, extra: &[&str]) -> TestDaemon {
        let (child, url, mut lines) = start_daemon(home, extra);
        let e2b = extra.contains(&"--e2b").then(|| {
            let mut addr = |prefix: &str| loop {
                let line = lines.next().expect("brig serve exited").unwrap();
                if let Some(a) = line.strip_prefix(prefix) {
                    break a.to_string();
                }
            };
            (addr("brig: e2b api on "), addr("brig: e2b sandboxes on "))
        });
        std::thread::spawn(move || for _ in lines {});
        let key = std::fs::read_to_string(home.join("local.key"))
            .unwrap()
            .trim()
            .to_string();
        TestDaemon {
            child,
            url,
            home: home.to_path_buf(),
            key,
            e2b,
        }
    }

    /// The CLI against this daemon, stdin empty.
    pub fn brig(&self, args: &[&str]) -> Output {
        self.brig_with_input(args, b"")
    }

    pub fn brig_with_input(&self, args: &[&str], input: &[u8]) -> Output {
        use std::io::Write;
        let mut child = Command::new(BRIG)
            .args(args)
            .env("BRIG_URL", &self.url)
            .env("BRIG_HOME", &self.home)
            .env_remove("BRIG_API_KEY")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(input);
        child.wait_with_output().unwrap()
    }

    /// A request with the daemon's key (as a bearer token and as E2B's
    /// `X-API-Key`): `url` is a path of the native API or a whole URL.
    pub fn call(
        &self,
        method: &str,
        url: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let url = if url.starts_with("http") {
            url.to_string()
        } else {
            format!("{}{url}", self.url)
        };
        let req = ureq::request(method, &url)
            .set("Authorization", &format!("Bearer {}", self.key))
            .set("X-API-Key", &self.key);
        let resp = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match resp {
            Ok(r) => (r.status(), r.into_json().unwrap_or(serde_json::Value::Null)),
            Err(ureq::Error::Status(code, r)) => {
                (code, r.into_json().unwrap_or(serde_json::Value::Null))
            }
            Err(e) => panic!("{method} {url}: {e}"),
        }
    }

    /// SIGKILL, as a crash: its sandboxes stay for the next daemon.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::forget(self);
    }

    /// The official E2B Python SDK's tier suite (tests/e2b/tier_sdk.py) on
    /// `isolation`, on this daemon (started with `--e2b`): its stdout,
    /// after checking it passed `checks` checks; `None` (a printed skip)
    /// without the E2B venv.
    pub fn run_tier_sdk(&self, template: &str, isolation: &str, checks: usize) -> Option<String> {
        let python = brig_test_support::test_cache().join("e2b-venv/bin/python");
        if !python.exists() {
            skip(&format!(
                "{} is missing: tests/support/install-python-deps.sh makes it",
                python.display()
            ));
            return None;
        }
        let (api, data) = self.e2b.clone().expect("a daemon started with --e2b");
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2b/tier_sdk.py");
        let out = Command::new(python)
            .arg(&script)
            .env("E2B_API_KEY", &self.key)
            .env("E2B_API_URL", &api)
            .env("E2B_VOLUME_API_URL", &api)
            .env("E2B_SANDBOX_URL", &data)
            .env("E2B_TEMPLATE", template)
            .env("BRIG_ISOLATION", isolation)
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN")
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!("{checks} passed, 0 failed")),
            "tier_sdk.py on {isolation}:\n{stdout}\n{}",
            text(&out.stderr)
        );
        Some(stdout)
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        stop_daemon(&mut self.child);
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `out`'s stdout, after checking it succeeded (`what` names it).
pub fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A counter and a random token held in a shell's memory (variables),
/// written out each tick as "N TOKEN PID"; SIGUSR1 draws a new token.
pub const COUNTER: &str = "new() { tok=$(od -An -N8 -tx8 /dev/urandom | tr -d ' '); }; new; \
                       trap new USR1; n=0; \
                       while :; do n=$((n+1)); echo \"$n $tok $$\" > /tmp/counter.new; \
                       mv /tmp/counter.new /tmp/counter; sleep 0.05; done";

/// The counter of sandbox `id` goes on (read again every 300 ms until it
/// moved, up to 20 s): its count then and its token.
pub fn counting(daemon: &TestDaemon, id: &str) -> (u64, String) {
    let read = || -> (u64, String, String) {
        let out = ok(
            daemon.brig(&["exec", id, "--", "cat", "/tmp/counter"]),
            "read the counter",
        );
        let mut it = out.split_whitespace();
        (
            it.next().unwrap().parse().unwrap(),
            it.next().unwrap().into(),
            it.next().unwrap().into(),
        )
    };
    let (a, tok, _) = read();
    // A tick is a few milliseconds on the host's kernel, hundreds under
    // an emulated guest's on a loaded host.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let (b, tok2, _) = read();
        assert_eq!(tok, tok2, "{id}");
        if b > a {
            return (b, tok);
        }
        assert!(
            Instant::now() < deadline,
            "{id}: the counter goes on: {a} then {b}"
        );
    }
}

/// Memory snapshots through the CLI, as every tier that keeps memory
/// offers them, on `parent` (a running sandbox of such a tier in the
/// daemon at `home`): a [`COUNTER`] started in it and a file written;
/// `snapshot create` keeps its checkpoint; `create --from-snapshot` and
/// `fork -n 2` restore it, each copy counting on with the parent's token,
/// with its file, its own host name, machine id and random numbers and
/// the host's clock; a fork's checkpoint is gone once its forks run; a
/// write in one fork, to a file and to memory, is its own; `snapshot rm`
/// removes the checkpoint and leaves the copies running; restored
/// sandboxes outlive a `kill -9` of the daemon. Returns the daemon that
/// adopted them, and the copies.
pub fn memory_snapshots_through_the_cli(
    daemon: TestDaemon,
    home: &std::path::Path,
    parent: &str,
) -> (TestDaemon, Vec<String>) {
    let brig = |args: &[&str]| ok(daemon.brig(args), &args.join(" "));
    brig(&["exec", parent, "--background", "--", "sh", "-c", COUNTER]);
    assert!(
        eventually(Duration::from_secs(20), || daemon
            .brig(&["exec", parent, "--", "cat", "/tmp/counter"])
            .status
            .success()),
        "the counter did not start"
    );
    brig(&["exec", parent, "--", "sh", "-c", "echo parent > /root/file"]);
    let (before, token) = counting(&daemon, parent);

    let snap = brig(&["snapshot", "create", parent, "--name", "warm"]);
    let snap = snap.trim().to_string();
    let listed: serde_json::Value =
        serde_json::from_str(&brig(&["snapshot", "ls", "--json", "--sandbox", parent])).unwrap();
    assert_eq!(listed[0]["id"], snap.as_str(), "{listed}");
    assert_eq!(listed[0]["memory"], true, "{listed}");
    let checkpoint = home.join("checkpoints").join(&snap);
    assert!(checkpoint.is_dir(), "its checkpoint is kept");
    // The parent runs on, its memory intact, reachable as before.
    assert_eq!(counting(&daemon, parent).1, token);

    let child = brig(&["create", "--from-snapshot", "warm"])
        .trim()
        .to_string();
    let forks: Vec<String> = brig(&["fork", parent, "-n", "2"])
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(forks.len(), 2, "{forks:?}");
    let copies: Vec<String> = std::iter::once(child.clone())
        .chain(forks.clone())
        .collect();
    let (mut machine_ids, mut random) = (Vec::new(), Vec::new());
    for id in &copies {
        let (n, tok) = counting(&daemon, id);
        assert!(n >= before, "{id}: restored where it was");
        assert_eq!(tok, token, "{id}: the parent's memory");
        assert_eq!(brig(&["exec", id, "--", "hostname"]).trim(), id.as_str());
        assert_eq!(brig(&["exec", id, "--", "cat", "/root/file"]), "parent\n");
        machine_ids.push(brig(&["exec", id, "--", "cat", "/etc/machine-id"]));
        random.push(brig(&[
            "exec",
            id,
            "--",
            "od",
            "-An",
            "-N16",
            "-tx1",
            "/dev/urandom",
        ]));
        let clock: u64 = brig(&["exec", id, "--", "date", "+%s"])
            .trim()
            .parse()
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(clock.abs_diff(now) <= 5, "{id}: clock {clock}, host {now}");
    }
    for mut seen in [machine_ids, random] {
        seen.sort();
        seen.dedup();
        assert_eq!(
            seen.len(),
            3,
            "each copy its own machine id and random numbers"
        );
    }
    // A fork's checkpoint is gone once its forks run.
    let kept: Vec<_> = std::fs::read_dir(home.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(kept, vec![std::ffi::OsString::from(&snap)]);

    // A write in one fork, to a file and to memory, is its own.
    let pid = brig(&["exec", &forks[0], "--", "cat", "/tmp/counter"]);
    let pid = pid.split_whitespace().nth(2).unwrap().to_string();
    brig(&[
        "exec",
        &forks[0],
        "--",
        "sh",
        "-c",
        &format!("echo fork0 > /root/file; kill -USR1 {pid}"),
    ]);
    // The shell takes the signal once its `sleep` ends: a tick or two.
    let redrawn = eventually(Duration::from_secs(20), || {
        let out = ok(
            daemon.brig(&["exec", &forks[0], "--", "cat", "/tmp/counter"]),
            "read the counter",
        );
        out.split_whitespace().nth(1) != Some(token.as_str())
    });
    assert!(redrawn, "the fork's token did not change");
    assert_ne!(counting(&daemon, &forks[0]).1, token);
    for id in [&forks[1], &child, &parent.to_string()] {
        assert_eq!(counting(&daemon, id).1, token, "{id}");
        assert_eq!(brig(&["exec", id, "--", "cat", "/root/file"]), "parent\n");
    }

    // Deleting the snapshot leaves the sandboxes restored from it running.
    brig(&["snapshot", "rm", "warm"]);
    assert!(!checkpoint.exists(), "its checkpoint is gone");
    counting(&daemon, &child);
    assert!(!daemon
        .brig(&["create", "--from-snapshot", "warm"])
        .status
        .success());

    // Restored sandboxes outlive the daemon like any other.
    daemon.kill9();
    let daemon = TestDaemon::start(home);
    for id in &copies {
        counting(&daemon, id);
    }
    (daemon, copies)
}

/// The entry names of the layer a files snapshot `snap` added (its
/// image's top layer) in the image store of `home`.
pub fn snapshot_layer_names(home: &std::path::Path, snap: &str) -> Vec<String> {
    let store = brig_image::ImageStore::open(home).unwrap();
    let image = store
        .get(&format!("{}{snap}", brig_image::SNAPSHOT_PREFIX))
        .unwrap()
        .unwrap_or_else(|| panic!("no image for snapshot {snap}"));
    let top = image.layers.last().expect("a snapshot has a layer");
    let file = std::fs::File::open(store.blob_path(top)).unwrap();
    tar::Archive::new(file)
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect()
}
