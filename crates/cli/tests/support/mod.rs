//! Shared helpers for the `brig` end-to-end tests: finding the binary,
//! starting a daemon, and looking at the host after a sandbox is gone; on
//! top of brig-test-support (skipping loudly where the host lacks what a
//! test needs, the test rootfs).
#![allow(dead_code, unused_imports)] // each test file uses a different subset

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
