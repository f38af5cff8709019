//! Fork bomb: every process forks as fast as it can, forever.
//!
//! Contained: the sandbox's pids limit (cgroup `pids.max`) makes fork fail
//! with EAGAIN after a bounded number of processes; the program reports the
//! most processes it ever saw and exits, and the sandbox dies with it.
//! Escaped: more processes than `--cap N` (default 4096) became visible
//! without fork failing. The harness also checks that the host can still
//! fork afterwards. Destructive: needs `--armed` and a user namespace.

use std::time::{Duration, Instant};

use brig_hostile::{errno, errno_name, guard_destructive, visible_pids, Args, Report};

/// What every bomb child does: fork forever, with each new process doing the
/// same. A process whose parent dies dies too, so the tree collapses when
/// the reporting process exits even outside a pid namespace.
fn bomb() -> ! {
    loop {
        // SAFETY: plain fork; the child continues in this same loop.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: prctl/signal with constant arguments.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                libc::signal(libc::SIGTERM, libc::SIG_DFL);
            }
        } else if pid < 0 {
            // SAFETY: usleep has no memory-safety preconditions.
            unsafe { libc::usleep(1000) };
        }
    }
}

fn main() {
    let args = Args::get();
    guard_destructive("fork_bomb", &args);
    let cap = args.u64_value("--cap").unwrap_or(4096) as usize;
    let mut report = Report::new("fork_bomb");

    // The reporter ignores SIGTERM so it can terminate its own process group
    // at the end; children restore the default right after fork.
    // SAFETY: setpgid/signal with constant arguments.
    unsafe {
        libc::setpgid(0, 0);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }

    let start = Instant::now();
    let deadline = start + Duration::from_secs(15);
    let (mut forked, mut failed, mut first_errno) = (0u64, 0u64, 0);
    let (mut max_seen, mut max_at) = (0usize, start);
    let mut last_check = start;
    while Instant::now() < deadline {
        // SAFETY: fork; the child never returns from bomb().
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as in bomb().
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                libc::signal(libc::SIGTERM, libc::SIG_DFL);
            }
            bomb();
        } else if pid < 0 {
            failed += 1;
            if first_errno == 0 {
                first_errno = errno();
            }
            // SAFETY: usleep has no memory-safety preconditions.
            unsafe { libc::usleep(2000) };
        } else {
            forked += 1;
        }
        if last_check.elapsed() >= Duration::from_millis(50) {
            last_check = Instant::now();
            let seen = visible_pids().len();
            if seen > max_seen {
                max_seen = seen;
                max_at = Instant::now();
            }
            if seen > cap {
                break;
            }
            // The count has stopped growing and fork is failing: the limit holds.
            if failed > 0 && max_at.elapsed() > Duration::from_secs(2) {
                break;
            }
        }
    }

    let first = if first_errno == 0 {
        "never failed".to_string()
    } else {
        errno_name(first_errno)
    };
    report.note(format!(
        "reporter forked {forked} bombs, {failed} forks failed (first failure: {first}); at most {max_seen} processes visible after {:.1}s",
        max_at.duration_since(start).as_secs_f64()
    ));
    report.record(
        max_seen > cap,
        format!("process count limit: saw {max_seen}, cap {cap}"),
    );
    if failed == 0 {
        report.note("fork never failed within 15 s");
    }
    // SAFETY: kill our own process group; the reporter ignores SIGTERM.
    unsafe { libc::kill(0, libc::SIGTERM) };
    report.finish()
}
