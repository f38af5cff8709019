//! Look at every process visible in /proc: its argv, its environment, its
//! pid namespace. In a sandbox only the sandbox's own processes exist.
//!
//! Contained: no visible process carries the harness's host canary (a host
//! process started with argv[0] `brig-hostile-canary` and the environment
//! variable `BRIG_HOSTILE_HOST_SECRET`), and every pid namespace link that
//! can be read is our own. Escaped: a host process (or its environment) is
//! visible.

use brig_hostile::{
    cmdline, errno_name, read_file, readlink, visible_pids, Args, Report, CANARY_ENV,
};

fn main() {
    let args = Args::get();
    let canary = args.canary();
    let mut report = Report::new("proc_environ");
    let own_ns = readlink("/proc/self/ns/pid").unwrap_or_default();
    let pids = visible_pids();
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    report.note(format!(
        "self is pid {me}, {} pids visible: {:?}",
        pids.len(),
        pids.iter().take(20).collect::<Vec<_>>()
    ));
    let mut environ_read = 0;
    for pid in &pids {
        let argv = cmdline(*pid);
        if argv.contains(&canary) {
            report.escape(format!("pid {pid} is the host canary process: {argv}"));
        }
        match read_file(&format!("/proc/{pid}/environ")) {
            Ok(env) => {
                environ_read += 1;
                if String::from_utf8_lossy(&env).contains(CANARY_ENV) {
                    report.escape(format!(
                        "pid {pid} ({argv}) has the host secret {CANARY_ENV} in its environment"
                    ));
                }
            }
            Err(e) if e == libc::ENOENT || e == libc::ESRCH => {}
            Err(e) => report.note(format!("pid {pid} environ: {}", errno_name(e))),
        }
        match readlink(&format!("/proc/{pid}/ns/pid")) {
            Ok(ns) if ns != own_ns => report.escape(format!(
                "pid {pid} ({argv}) is in another pid namespace {ns} (ours {own_ns})"
            )),
            _ => {}
        }
    }
    report.note(format!("read the environment of {environ_read} processes"));
    // Not an escape, but worth seeing: a process forked from a host
    // program (rather than exec'd inside) shows the host's argv, paths
    // included.
    let argvs: Vec<String> = pids
        .iter()
        .filter(|p| **p != me)
        .take(5)
        .map(|p| format!("{p}: {}", cmdline(*p).chars().take(300).collect::<String>()))
        .collect();
    report.note(format!(
        "argv of the other visible processes (info): {argvs:?}"
    ));
    if pids.len() > 100 {
        report.note("more than 100 processes visible: is this the host's /proc?");
    }
    report.finish()
}
