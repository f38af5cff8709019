//! Building the named templates for real (mmdebstrap, from Debian's
//! archive): minutes the first time, then cached. The home they are built
//! in is shared by every run on this machine: `$BRIG_TEST_TEMPLATE_HOME`,
//! else `${BRIG_TEST_CACHE:-$HOME/.cache/brig-test}/home` (scripts/test
//! builds them there before the tests, so no test pays for it).
//!
//! Needs root and network the first time; skips with a printed reason
//! otherwise (a failure under BRIG_TEST_STRICT=1).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brig_core::{SandboxSpec, TemplateRef, UserSpec};
use brig_jail::{Sandbox, SpawnOptions};
use brig_template::{ensure, Progress};
use brig_test_support::{root_or_skip, template_home};

fn home() -> Option<PathBuf> {
    root_or_skip().then(template_home)
}

fn exists(root: &Path, p: &str) {
    assert!(
        root.join(p.trim_start_matches('/'))
            .symlink_metadata()
            .is_ok(),
        "{p} missing in {}",
        root.display()
    );
}

/// Run `script` as `user` in a sandbox on `rootfs`; its exit code.
fn as_user(rootfs: &Path, script: &str, allow_setuid: bool) -> i32 {
    let opts = SpawnOptions::prepare().unwrap();
    let mut spec = SandboxSpec::new(vec!["/bin/sh".into(), "-c".into(), script.into()]);
    spec.template = TemplateRef::Dir(rootfs.to_path_buf());
    spec.user = Some(UserSpec::Name("user".into()));
    spec.allow_setuid = allow_setuid;
    Sandbox::spawn(&spec, &opts).unwrap().wait().unwrap().code
}

#[test]
fn base_has_what_e2b_sandboxes_need_and_is_cached() {
    let Some(home) = home() else { return };
    let start = Instant::now();
    let rootfs = ensure(&home, "base", Progress::Lines).unwrap();
    eprintln!("base: ready in {:.1} s", start.elapsed().as_secs_f64());
    for p in [
        "/usr/bin/python3",
        "/usr/bin/pip3",
        "/usr/bin/node",
        "/usr/bin/npm",
        "/usr/bin/git",
        "/usr/bin/curl",
        "/usr/bin/sudo",
        "/usr/bin/ps",
        "/bin/bash",
        "/etc/ssl/certs/ca-certificates.crt",
    ] {
        exists(&rootfs, p);
    }
    let sudo = std::fs::metadata(rootfs.join("usr/bin/sudo")).unwrap();
    assert_eq!(sudo.uid(), 0);
    assert_ne!(sudo.permissions().mode() & 0o4000, 0, "sudo is not setuid");
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    assert!(
        passwd
            .lines()
            .any(|l| l == "user:x:1000:1000::/home/user:/bin/bash"),
        "{passwd}"
    );
    let home_dir = std::fs::metadata(rootfs.join("home/user")).unwrap();
    assert_eq!((home_dir.uid(), home_dir.gid()), (1000, 1000));
    let sudoers = std::fs::read_to_string(rootfs.join("etc/sudoers.d/user")).unwrap();
    assert!(sudoers.contains("NOPASSWD: ALL"), "{sudoers}");

    // Cached: the second call does not build.
    let again = Instant::now();
    assert_eq!(ensure(&home, "base", Progress::Lines).unwrap(), rootfs);
    assert!(again.elapsed() < Duration::from_secs(1));

    // In a sandbox: the tools run as `user` in its home, and passwordless
    // sudo works with allow_setuid, and only with it.
    assert_eq!(
        as_user(
            &rootfs,
            r#"[ "$HOME" = /home/user ] && [ "$(id -un)" = user ] && touch ~/x &&
               python3 -c 'print(1)' >/dev/null && node -e '1' && git --version >/dev/null"#,
            false
        ),
        0
    );
    // sudo -n: no password asked; and nothing on stderr (no "unable to
    // resolve host" or audit noise in every E2B command's output).
    assert_eq!(
        as_user(
            &rootfs,
            r#"[ "$(sudo -n id -u 2>/tmp/err)" = 0 ] || exit 1; [ ! -s /tmp/err ] || { cat /tmp/err >&2; exit 2; }"#,
            true
        ),
        0
    );
    assert_ne!(as_user(&rootfs, "sudo -n true 2>/dev/null", false), 0);
}

#[test]
fn code_interpreter_has_jupyter_and_the_data_stack() {
    let Some(home) = home() else { return };
    let start = Instant::now();
    let rootfs = ensure(&home, "code-interpreter-v1", Progress::Lines).unwrap();
    eprintln!(
        "code-interpreter-v1: ready in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    exists(&rootfs, "/usr/bin/sudo");
    exists(&rootfs, "/usr/bin/node");
    assert_eq!(
        as_user(
            &rootfs,
            "python3 -c 'import ipykernel, jupyter_client, numpy, pandas, matplotlib, pexpect, bash_kernel' && \
             python3 -m ipykernel --version >/dev/null",
            false
        ),
        0
    );
}
