//! Outlive the sandbox: double-fork a daemon that starts its own session,
//! ignores SIGHUP/SIGTERM/SIGINT, keeps stdout and stderr open (so whoever
//! waits for end-of-file on them waits for it too) and sleeps for
//! `--seconds N` (default 60); then the main program exits at once.
//!
//! Contained: when the command exits, brig tears the whole sandbox down —
//! the daemon dies with it (the pid namespace's init is gone), brig returns
//! the command's status promptly, and the harness finds no process carrying
//! the run's id on the host. Escaped: judged by the harness only (the
//! program cannot see its own fate); the report is always
//! `"escaped": false`. Destructive if mis-run (it leaves a process behind):
//! needs `--armed` and a user namespace.

use brig_hostile::{errno, errno_name, guard_destructive, wait_child, Args, Report};

fn main() {
    let args = Args::get();
    guard_destructive("orphan_daemon", &args);
    let secs = args.u64_value("--seconds").unwrap_or(60);
    let mut report = Report::new("orphan_daemon");
    // SAFETY: fork in a single-threaded program.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: setsid/fork/signal with constant arguments; the
        // intermediate child exits at once so the daemon is orphaned.
        unsafe {
            libc::setsid();
            if libc::fork() != 0 {
                libc::_exit(0);
            }
            for sig in [libc::SIGHUP, libc::SIGTERM, libc::SIGINT] {
                libc::signal(sig, libc::SIG_IGN);
            }
        }
        std::thread::sleep(std::time::Duration::from_secs(secs));
        // SAFETY: end the daemon without running the parent's destructors.
        unsafe { libc::_exit(0) }
    }
    if child < 0 {
        report.note(format!("fork: {}", errno_name(errno())));
        report.finish();
    }
    let _ = wait_child(child);
    report.note(format!(
        "left a session-leader daemon (ignoring SIGHUP/SIGTERM/SIGINT, holding stdout/stderr) that sleeps {secs}s; the harness checks it died with the sandbox"
    ));
    report.finish()
}
