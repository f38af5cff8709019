//! `SandboxSpec::allow_setuid`: setuid binaries of the template work (what
//! `sudo` for E2B's user `user` needs), and what they grant is the
//! sandbox's own root, nobody on the host. Without the flag they grant
//! nothing, as before. Needs root and the test rootfs
//! (`BRIG_TEST_ROOTFS`, built by tests/support/build-rootfs.sh); skips with
//! a printed reason otherwise (a failure under BRIG_TEST_STRICT=1).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brig_core::{SandboxSpec, TemplateRef};
use brig_jail::{Sandbox, SpawnOptions};
use brig_test_support::{root_or_skip, rootfs_or_skip};

fn rootfs() -> Option<PathBuf> {
    if !root_or_skip() {
        return None;
    }
    rootfs_or_skip()
}

/// As sandbox root: make a setuid-root copy of `prog` in the writable
/// layer, then run `then` as uid 1000 (setpriv, from util-linux).
fn as_user_with_suid(rootfs: &Path, prog: &str, then: &str, allow: bool) -> SandboxSpec {
    let script = format!(
        "cp {prog} /suid && chmod 4755 /suid && \
         exec setpriv --reuid=1000 --regid=1000 --clear-groups /bin/sh -c '{then}'"
    );
    let mut spec = SandboxSpec::new(vec!["/bin/sh".into(), "-c".into(), script]);
    spec.template = TemplateRef::Dir(rootfs.to_path_buf());
    spec.allow_setuid = allow;
    spec
}

/// `id -u` prints the effective uid: 0 when the setuid bit took effect.
const EUID: &str = r#"u=$(/suid -u); [ "$(id -u)" = 1000 ] || exit 13; case $u in 0) exit 10;; 1000) exit 11;; *) exit 12;; esac"#;

#[test]
fn setuid_binaries_work_only_with_allow_setuid() {
    let Some(rootfs) = rootfs() else { return };
    let opts = SpawnOptions::prepare().unwrap();
    for (allow, want, what) in [
        (
            true,
            10,
            "with allow_setuid the setuid bit makes the user root",
        ),
        (
            false,
            11,
            "without allow_setuid the setuid bit grants nothing",
        ),
    ] {
        let spec = as_user_with_suid(&rootfs, "/usr/bin/id", EUID, allow);
        let code = Sandbox::spawn(&spec, &opts).unwrap().wait().unwrap().code;
        assert_eq!(code, want, "{what} (exit {code})");
    }
}

/// The sandbox's root, reached through a setuid binary, is an unprivileged
/// uid on the host: the host sees the process's effective uid as the
/// sandbox's slot base (>= 0x10000000), never 0, and it has no capability
/// outside the sandbox's user namespace.
#[test]
fn setuid_root_in_a_sandbox_is_nobody_on_the_host() {
    let Some(rootfs) = rootfs() else { return };
    let opts = SpawnOptions::prepare().unwrap();
    let spec = as_user_with_suid(&rootfs, "/bin/sleep", "exec /suid 30", true);
    let sb = Sandbox::spawn(&spec, &opts).unwrap();
    // Find the setuid sleep among the sandbox's processes, from the host.
    let deadline = Instant::now() + Duration::from_secs(10);
    let found = loop {
        let hit = descendants(sb.pid()).into_iter().find_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (comm.trim() == "suid").then_some(status)
        });
        if let Some(s) = hit {
            break s;
        }
        assert!(Instant::now() < deadline, "the setuid sleep never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    sb.kill();
    let _ = sb.wait();
    let field = |name: &str| -> Vec<u64> {
        found
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {found}"))
            .split_whitespace()
            .skip(1)
            .map(|v| u64::from_str_radix(v, if name.starts_with("Cap") { 16 } else { 10 }).unwrap())
            .collect()
    };
    let uids = field("Uid:");
    // real, effective, saved, fs
    assert_eq!(uids[1], uids[2], "{found}");
    assert!(
        uids[1] >= 0x1000_0000,
        "effective uid on the host: {}",
        uids[1]
    );
    assert_eq!(uids[0], uids[1] + 1000, "real uid is the sandbox's 1000");
    // It did become the sandbox's root (its capabilities, in its own user
    // namespace only), and nothing beyond a container root's set.
    let eff = field("CapEff:")[0];
    assert_ne!(eff, 0, "the setuid binary got no capabilities: {found}");
    assert_eq!(eff & (1 << 21) /* CAP_SYS_ADMIN */, 0, "{found}");
    assert_eq!(field("NoNewPrivs:")[0], 0);
    assert_eq!(field("Seccomp:")[0], 2, "the filter is in: {found}");
}

fn descendants(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let mut out = vec![];
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let path = t.path().join("children");
            if let Ok(kids) = std::fs::read_to_string(path) {
                for k in kids.split_whitespace().filter_map(|k| k.parse().ok()) {
                    out.push(k);
                    stack.push(k);
                }
            }
        }
    }
    out
}
