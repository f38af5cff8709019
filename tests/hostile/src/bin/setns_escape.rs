//! Join other namespaces with setns: open /proc/<pid>/ns/* for every
//! visible process (pid 1 and self included) and for every namespace kind,
//! and setns into it; also setns through a pidfd of pid 1, and look for
//! host namespace files under /run/netns.
//!
//! Contained: setns is refused (the seccomp policy answers EPERM), and in
//! any case every namespace reachable from inside is the sandbox's own.
//! Escaped: setns succeeded into a namespace different from ours. Each
//! setns runs in a forked child.

use std::os::fd::AsRawFd;

use brig_hostile::{
    child_denied, describe_child, errno, in_child, list_dir, open, visible_pids, Args, Report,
};

const KINDS: &[&str] = &[
    "mnt",
    "pid",
    "net",
    "user",
    "uts",
    "ipc",
    "cgroup",
    "time",
    "pid_for_children",
    "time_for_children",
];

fn ino_of_fd(fd: i32) -> Option<u64> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_ino)
}

/// setns in a forked child, so that a success cannot change this process.
fn setns_in_child(fd: libc::c_long, nstype: libc::c_int) -> Result<brig_hostile::ChildEnd, i32> {
    in_child(|| {
        // SAFETY: setns takes an fd number and flags; a bad fd is only EBADF.
        let r = unsafe { libc::syscall(libc::SYS_setns, fd, nstype) };
        brig_hostile::exit_code_for(brig_hostile::check(r))
    })
}

fn main() {
    let _args = Args::get();
    let mut report = Report::new("setns_escape");
    let mut pids: Vec<String> = vec!["self".into(), "1".into()];
    pids.extend(visible_pids().iter().map(|p| p.to_string()));
    pids.dedup();
    let (mut tried, mut refused, mut foreign_seen) = (0, 0, 0);
    let mut joined_own = Vec::new();
    for kind in KINDS {
        let own = open(&format!("/proc/self/ns/{kind}"), libc::O_RDONLY)
            .ok()
            .and_then(|f| ino_of_fd(f.as_raw_fd()));
        for pid in &pids {
            let path = format!("/proc/{pid}/ns/{kind}");
            let Ok(fd) = open(&path, libc::O_RDONLY) else {
                continue;
            };
            let ino = ino_of_fd(fd.as_raw_fd());
            let foreign = ino != own;
            if foreign {
                foreign_seen += 1;
                report.note(format!("{path} is a different namespace than ours"));
            }
            tried += 1;
            let raw = fd.as_raw_fd();
            let end = setns_in_child(raw as libc::c_long, 0);
            if child_denied(&end) {
                refused += 1;
            } else if matches!(end, Ok(brig_hostile::ChildEnd::Exited(0))) {
                if foreign {
                    report.escape(format!("setns({path}) joined a foreign namespace"));
                } else {
                    joined_own.push(path);
                }
            } else {
                report.note(format!("setns({path}): {}", describe_child(end)));
            }
        }
    }
    report.note(format!(
        "{tried} setns attempts, {refused} refused, {foreign_seen} foreign namespace files seen"
    ));
    if !joined_own.is_empty() {
        report.note(format!(
            "setns into our own namespaces succeeded (seccomp gap, no escape): {joined_own:?}"
        ));
    }

    // SAFETY: pidfd_open with integer arguments.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, 1, 0) };
    if pidfd >= 0 {
        let flags = libc::CLONE_NEWNS
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWIPC;
        let end = setns_in_child(pidfd, flags);
        report.note(format!("setns(pidfd of pid 1): {}", describe_child(end)));
        // SAFETY: pidfd is ours.
        unsafe { libc::close(pidfd as i32) };
    } else {
        report.note(format!(
            "pidfd_open(1): {}",
            brig_hostile::errno_name(errno())
        ));
    }
    for dir in ["/run/netns", "/var/run/netns"] {
        if let Ok(names) = list_dir(dir) {
            report.escape(format!("{dir} is visible: {names:?}"));
        }
    }
    report.finish()
}
