//! Look for host secrets in the environment: brig must build the sandboxed
//! command's environment from scratch rather than pass its own on. The
//! harness runs brig with `BRIG_HOSTILE_HOST_SECRET` set in brig's own
//! environment.
//!
//! Contained: the canary variable is absent, and so is anything that looks
//! like a host credential or build-tool variable (names containing SECRET,
//! TOKEN, PASSWORD, CREDENTIAL, or starting with CARGO, RUSTUP, SSH_,
//! AWS_, GITHUB_, SUDO_, DBUS_, XDG_). Escaped: any of those is present.
//! All variable names are listed; values only for the expected ones.
//! After `sudo` in an E2B sandbox (mode e2b-root), sudo's own SUDO_USER,
//! SUDO_UID, SUDO_GID and SUDO_COMMAND are expected and must name the
//! sandbox's `user` (uid 1000).

use brig_hostile::{Args, Report, CANARY_ENV};

const EXPECTED: &[&str] = &[
    "PATH",
    "HOME",
    "TERM",
    "HOSTNAME",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "LANG",
    "LC_ALL",
    "USER",
    "LOGNAME",
    "container",
];
const SUSPICIOUS_PARTS: &[&str] = &[
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "API_KEY",
];
const SUSPICIOUS_PREFIXES: &[&str] = &[
    "CARGO", "RUSTUP", "RUST_", "SSH_", "AWS_", "GITHUB_", "SUDO_", "DBUS_", "XDG_", "GPG_",
    "KUBE", "DOCKER_",
];

/// What `sudo` inside the sandbox sets (mode e2b-root): expected there,
/// with the sandbox's own user in them.
const SUDO_OWN: &[&str] = &["SUDO_COMMAND", "SUDO_USER", "SUDO_UID", "SUDO_GID"];

fn main() {
    let args = Args::get();
    let via_sudo = args.mode().via_sudo();
    let mut report = Report::new("env_leak");
    let mut unexpected = Vec::new();
    for (k, v) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let up = k.to_uppercase();
        if via_sudo && SUDO_OWN.contains(&k.as_str()) {
            // Set by the sandbox's own sudo, naming the sandbox's user.
            let v = v.to_string_lossy();
            let ours = match k.as_str() {
                "SUDO_USER" => v == "user",
                "SUDO_UID" | "SUDO_GID" => v == "1000",
                _ => !v.contains(CANARY_ENV),
            };
            report.record(!ours, format!("{k}={v} (from the sandbox's sudo)"));
        } else if k == CANARY_ENV {
            report.escape(format!("the host's {CANARY_ENV} reached the sandbox"));
        } else if SUSPICIOUS_PARTS.iter().any(|p| up.contains(p))
            || SUSPICIOUS_PREFIXES.iter().any(|p| up.starts_with(p))
        {
            report.escape(format!("host-looking variable {k} is set"));
        } else if EXPECTED.contains(&k.as_str()) {
            report.note(format!("{k}={}", v.to_string_lossy()));
        } else {
            unexpected.push(k);
        }
    }
    report.note(format!("other variables (names only): {unexpected:?}"));
    report.finish()
}
