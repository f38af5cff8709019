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

fn main() {
    let _args = Args::get();
    let mut report = Report::new("env_leak");
    let mut unexpected = Vec::new();
    for (k, v) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let up = k.to_uppercase();
        if k == CANARY_ENV {
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
