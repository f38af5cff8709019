//! Read host files that are outside the template: /root, /home, /var,
//! /run, /srv, /opt, /mnt, /media, /boot and brig's own state under
//! /var/lib/brig, plus the canary files the harness plants on the host
//! (`/root/brig-hostile-canary`, `/var/tmp/brig-hostile-canary`).
//!
//! Contained: the canaries do not exist in the sandbox, /var/lib/brig does
//! not exist, and with `--template host` (where /etc *is* the host's,
//! read-only) secrets such as /etc/shadow are unreadable because host root
//! is not mapped into the sandbox. Listings of the template's own
//! directories are reported for information only.

use brig_hostile::{errno_name, list_dir, read_file, Args, Report};

fn main() {
    let args = Args::get();
    let canary = args.canary();
    let host_template = args.template().as_deref() != Some("dir");
    let mut report = Report::new("read_host_files");

    for dir in [
        "/root", "/home", "/var", "/var/lib", "/var/tmp", "/var/log", "/run", "/srv", "/opt",
        "/mnt", "/media", "/boot",
    ] {
        match list_dir(dir) {
            Ok(names) => {
                let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
                report.note(format!(
                    "{dir}: {} entries [{}]",
                    names.len(),
                    shown.join(",")
                ));
                if names.iter().any(|n| n.contains(&canary)) {
                    report.escape(format!("{dir} lists the host canary {canary}"));
                }
            }
            Err(e) => report.note(format!("{dir}: {}", errno_name(e))),
        }
    }

    for path in [
        format!("/root/{canary}"),
        format!("/var/tmp/{canary}"),
        format!("/home/{canary}"),
    ] {
        match read_file(&path) {
            Ok(b) => report.escape(format!("read host canary {path} ({} bytes)", b.len())),
            Err(e) => report.note(format!("{path}: {}", errno_name(e))),
        }
    }

    match list_dir("/var/lib/brig") {
        Ok(names) => report.escape(format!(
            "brig's state dir /var/lib/brig is visible: {names:?}"
        )),
        Err(e) => report.note(format!("/var/lib/brig: {}", errno_name(e))),
    }

    // In the host template /etc is the host's own; these must stay unreadable.
    // In a dir template they belong to the template, so reading them is fine.
    for path in [
        "/etc/shadow",
        "/etc/gshadow",
        "/etc/sudoers",
        "/etc/ssh/ssh_host_ed25519_key",
        "/etc/ssh/ssh_host_rsa_key",
    ] {
        match read_file(path) {
            // The gvisor tier covers root-only host files with an empty
            // stand-in (its sandbox root reads through a gofer that is host
            // root): opening it shows nothing.
            Ok(b) if host_template && b.is_empty() => {
                report.note(format!("{path}: an empty stand-in"))
            }
            Ok(b) if host_template => {
                report.escape(format!("read host secret {path} ({} bytes)", b.len()))
            }
            Ok(b) => report.note(format!(
                "{path}: readable ({} bytes, the template's own)",
                b.len()
            )),
            Err(e) => report.note(format!("{path}: {}", errno_name(e))),
        }
    }
    report.finish()
}
