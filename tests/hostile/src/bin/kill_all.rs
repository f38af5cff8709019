//! Kill everything: kill(-1, SIGKILL) signals every process the caller may
//! signal, and kill(1, SIGKILL) targets init. On the host, as root, that
//! would take the machine down.
//!
//! In a pid namespace kill(-1) only reaches the sandbox's own processes and
//! the namespace's init ignores it. The program first starts three sleeping
//! children so that kill(-1) has something to kill inside, and checks they
//! died. Contained: the program survives to report, and the harness finds
//! the host intact afterwards (its canary process still alive, it can still
//! fork, nothing left behind). The report itself is never an escape.
//! Destructive: needs `--armed` and a user namespace.

use brig_hostile::{errno, errno_name, guard_destructive, visible_pids, Args, Report};

fn main() {
    let args = Args::get();
    guard_destructive("kill_all", &args);
    let mut report = Report::new("kill_all");
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let mut children = Vec::new();
    for _ in 0..3 {
        // SAFETY: fork; the child only sleeps until killed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            loop {
                // SAFETY: pause has no preconditions.
                unsafe { libc::pause() };
            }
        }
        children.push(pid);
    }
    let before = visible_pids();
    // SAFETY: kill takes integers; this is the attack.
    let r = unsafe { libc::kill(-1, libc::SIGKILL) };
    let e = if r == 0 {
        "ok".to_string()
    } else {
        errno_name(errno())
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut reaped = Vec::new();
    for c in &children {
        if let Ok(end) = brig_hostile::wait_child(*c) {
            reaped.push(end.to_string());
        }
    }
    let after = visible_pids();
    report.note(format!("self pid {me}; visible before {before:?}; kill(-1, SIGKILL): {e}; own children: {reaped:?}; visible after {after:?}"));
    if me != 1 {
        // SAFETY: as above.
        let r = unsafe { libc::kill(1, libc::SIGKILL) };
        let e = if r == 0 {
            "ok".to_string()
        } else {
            errno_name(errno())
        };
        std::thread::sleep(std::time::Duration::from_millis(200));
        report.note(format!("kill(1, SIGKILL): {e}; still alive"));
    }
    report.finish()
}
