//! Reach the host's filesystem through /proc magic links: /proc/<pid>/root
//! and /proc/<pid>/cwd of every visible process (including pid 1 and self),
//! /proc/thread-self/root, and `..` walks below them.
//!
//! Contained: every such link resolves to the sandbox's own root (same
//! device and inode as `/`), or cannot be followed, and no host canary is
//! reachable through them. Escaped: a link leads to a different, listable
//! root, or a canary is found through one.

use brig_hostile::{
    dev_ino, errno_name, list_dir, read_file, readlink, visible_pids, Args, Report,
};

fn main() {
    let args = Args::get();
    let canary = args.canary();
    let mut report = Report::new("proc_root_tricks");
    let root = match dev_ino("/") {
        Ok(r) => r,
        Err(e) => {
            report.note(format!("stat /: {}", errno_name(e)));
            report.finish()
        }
    };
    let mut bases: Vec<String> = vec![
        "/proc/self".into(),
        "/proc/thread-self".into(),
        "/proc/1".into(),
    ];
    for pid in visible_pids() {
        bases.push(format!("/proc/{pid}"));
    }
    bases.dedup();
    let mut same = 0;
    for base in &bases {
        for link in ["root", "cwd"] {
            let l = format!("{base}/{link}");
            // A cwd may be anywhere inside; only its far ancestor must be our root.
            let probes = if link == "root" {
                vec![l.clone(), format!("{l}/.."), format!("{l}/../../../..")]
            } else {
                vec![format!("{l}{}", "/..".repeat(40))]
            };
            for probe in probes {
                match dev_ino(&probe) {
                    Ok(di) if di == root => same += 1,
                    Ok(di) => {
                        let listing = list_dir(&probe).map(|n| n.len());
                        let target = readlink(&l).unwrap_or_default();
                        report.record(
                            listing.is_ok(),
                            format!("{probe} (-> {target}) is a different root {di:?} (ours {root:?}), listing: {:?}", listing.map_err(errno_name)),
                        );
                    }
                    Err(e) if e == libc::ENOENT || e == libc::ESRCH => {}
                    Err(e) => report.note(format!(
                        "{}: {}",
                        probe.replace(&"/..".repeat(40), "/..(x40)"),
                        errno_name(e)
                    )),
                }
            }
            for file in [
                format!("{l}/root/{canary}"),
                format!("{l}/var/tmp/{canary}"),
                format!("{l}/../../root/{canary}"),
            ] {
                if let Ok(b) = read_file(&file) {
                    report.escape(format!(
                        "read host canary through {file} ({} bytes)",
                        b.len()
                    ));
                }
            }
        }
    }
    report.note(format!(
        "{} processes' root/cwd links checked, {same} walks resolved inside the sandbox root",
        bases.len()
    ));

    // Directory fds held by any visible process (a runtime's init may keep
    // one on the old root or the template) lead out just like a cwd would.
    let (mut dir_fds, mut fd_dirs_denied) = (0, 0);
    for base in &bases {
        match list_dir(&format!("{base}/fd")) {
            Ok(fds) => {
                for fd in fds {
                    let p = format!("{base}/fd/{fd}");
                    if std::fs::metadata(&p).map(|m| m.is_dir()).unwrap_or(false) {
                        dir_fds += 1;
                        let top = format!("{p}{}", "/..".repeat(40));
                        match dev_ino(&top) {
                            Ok(di) if di == root => {}
                            Ok(di) => report.escape(format!(
                                "{p} (-> {}) climbs to {di:?}, not the sandbox root",
                                readlink(&p).unwrap_or_default()
                            )),
                            Err(e) => report.note(format!("{p}/..: {}", errno_name(e))),
                        }
                    }
                }
            }
            Err(_) => fd_dirs_denied += 1,
        }
    }
    report.note(format!(
        "{dir_fds} directory fds found in visible processes; {fd_dirs_denied} fd tables unreadable"
    ));
    match readlink("/proc/1/root") {
        Ok(t) => report.note(format!("/proc/1/root -> {t}")),
        Err(e) => report.note(format!("/proc/1/root: {}", errno_name(e))),
    }
    report.finish()
}
