//! Attach to other processes with ptrace: PTRACE_ATTACH to pids 1..=400
//! (everything but ourselves), which on the host would let us read and
//! write any process's memory.
//!
//! In a pid namespace only the sandbox's own processes have these numbers,
//! so attaching to one of them is not an escape. Contained: every attach
//! either fails (ESRCH for pids that do not exist, EPERM otherwise) or hits
//! a process in our own pid namespace (checked through /proc/<pid>/ns/pid
//! once attached), none of them is the host canary process, and pid 1
//! (brig's init or brig-agent, holding the host's connection) refuses in
//! every mode, as the sandbox's root too. Escaped: we attached to a process
//! in another pid namespace, to the canary, or to pid 1.
//! Every attached process is detached again at once. Destructive if mis-run
//! (it stops processes briefly): needs `--armed` and a user namespace.

use std::collections::BTreeMap;

use brig_hostile::{cmdline, errno, errno_name, guard_destructive, readlink, Args, Report};

fn main() {
    let args = Args::get();
    guard_destructive("ptrace_attach", &args);
    let canary = args.canary();
    let mut report = Report::new("ptrace_attach");
    let own_ns = readlink("/proc/self/ns/pid").unwrap_or_default();
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let mut errors: BTreeMap<String, u32> = BTreeMap::new();
    let mut attached = Vec::new();
    for pid in 1..=400 {
        if pid == me {
            continue;
        }
        // SAFETY: PTRACE_ATTACH with integer arguments.
        let r = unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) };
        if r < 0 {
            *errors.entry(errno_name(errno())).or_default() += 1;
            continue;
        }
        let mut st = 0;
        // SAFETY: st is a valid out-pointer; __WALL waits for any kind of child.
        unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        let ns = readlink(&format!("/proc/{pid}/ns/pid"))
            .unwrap_or_else(|e| format!("unreadable ({})", errno_name(e)));
        let argv = cmdline(pid);
        // SAFETY: detach the tracee we just attached.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
        // pid 1 is brig's: its init or brig-agent, which holds the
        // connection to the host (the daemon's socket) and, in a daemon
        // sandbox, the writable layer's mount. It makes itself
        // non-dumpable so that no process of the sandbox, not even its
        // root, can trace it.
        let foreign = ns != own_ns || argv.contains(&canary) || pid == 1;
        report.record(
            foreign,
            format!("attached to pid {pid} ({argv}) in pid ns {ns}"),
        );
        attached.push(pid);
    }
    report.note(format!(
        "attached to {} processes (ours: {own_ns}); failures: {errors:?}",
        attached.len()
    ));
    report.finish()
}
