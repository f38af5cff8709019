//! Create a nested user namespace, which hands the creator a full set of
//! capabilities over new namespaces and exposes kernel code otherwise
//! reachable only by root (the usual first step of a kernel exploit):
//! unshare(CLONE_NEWUSER), unshare(CLONE_NEWUSER|CLONE_NEWNS), clone and
//! clone3 with CLONE_NEWUSER. Other unshare flags without a new user
//! namespace are reported for information.
//!
//! Each attempt runs in a forked child. Contained: every CLONE_NEWUSER
//! attempt answers EPERM (clone3: ENOSYS) or SIGSYS; in the attribution
//! pass (`--seccomp-mark`) each EPERM must be the seccomp filter's, not
//! the kernel's. Escaped: a user namespace was created, or the kernel
//! rather than the filter refused one.

use brig_hostile::{
    check, child_denied, describe_child, exit_code_for, filter_refusals, in_child, Args, ChildEnd,
    Report,
};

fn clone_flags(flags: libc::c_int) -> i32 {
    // SAFETY: fork-like clone (stack 0); the child exits at once.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0,
            0,
            0,
            0,
        )
    };
    if pid == 0 {
        // SAFETY: leave the new child immediately.
        unsafe { libc::_exit(0) }
    }
    if pid > 0 {
        let mut st = 0;
        // SAFETY: st is a valid out-pointer.
        unsafe { libc::waitpid(pid as i32, &mut st, 0) };
    }
    exit_code_for(check(pid))
}

fn clone3_newuser() -> i32 {
    // struct clone_args (v0, 64 bytes): flags, pidfd, child_tid, parent_tid,
    // exit_signal, stack, stack_size, tls.
    let args: [u64; 8] = [
        libc::CLONE_NEWUSER as u64,
        0,
        0,
        0,
        libc::SIGCHLD as u64,
        0,
        0,
        0,
    ];
    // SAFETY: args is a valid clone_args of the size passed; fork-like (no stack).
    let pid = unsafe { libc::syscall(libc::SYS_clone3, args.as_ptr(), 64) };
    if pid == 0 {
        // SAFETY: leave the new child immediately.
        unsafe { libc::_exit(0) }
    }
    if pid > 0 {
        let mut st = 0;
        // SAFETY: st is a valid out-pointer.
        unsafe { libc::waitpid(pid as i32, &mut st, 0) };
    }
    exit_code_for(check(pid))
}

fn main() {
    let _args = Args::get();
    let mut report = Report::new("nested_userns");
    let unshare = |flags: libc::c_int| {
        // SAFETY: unshare with integer flags, in a child.
        move || exit_code_for(check(unsafe { libc::unshare(flags) } as libc::c_long))
    };
    type Attempt = Box<dyn Fn() -> i32>;
    let attempts: Vec<(&str, Attempt)> = vec![
        (
            "unshare(CLONE_NEWUSER)",
            Box::new(unshare(libc::CLONE_NEWUSER)),
        ),
        (
            "unshare(CLONE_NEWUSER|CLONE_NEWNS)",
            Box::new(unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS)),
        ),
        (
            "clone(CLONE_NEWUSER)",
            Box::new(|| clone_flags(libc::CLONE_NEWUSER)),
        ),
        ("clone3(CLONE_NEWUSER)", Box::new(clone3_newuser)),
    ];
    for (what, f) in attempts {
        let before = filter_refusals();
        let end = in_child(f);
        // The attribution pass: each must be the filter's refusal (clone3
        // aside: its ENOSYS stays unmarked, so that glibc falls back).
        let by_kernel = before.is_some_and(|b| {
            !what.starts_with("clone3")
                && matches!(end, Ok(ChildEnd::Exited(e)) if e != 0)
                && filter_refusals() == Some(b)
        });
        if by_kernel {
            report.escape(format!(
                "{what}: {} from the kernel, not the seccomp filter",
                describe_child(end)
            ));
        } else {
            report.record(
                !child_denied(&end),
                format!("{what}: {}", describe_child(end)),
            );
        }
    }
    let mut info = Vec::new();
    for (what, flag) in [
        ("NEWNS", libc::CLONE_NEWNS),
        ("NEWNET", libc::CLONE_NEWNET),
        ("NEWPID", libc::CLONE_NEWPID),
        ("NEWUTS", libc::CLONE_NEWUTS),
        ("NEWIPC", libc::CLONE_NEWIPC),
        ("NEWCGROUP", libc::CLONE_NEWCGROUP),
        ("NEWTIME", 0x80),
    ] {
        let end = in_child(unshare(flag));
        info.push(format!("{what}={}", describe_child(end)));
    }
    report.note(format!(
        "unshare without a user namespace (info): {}",
        info.join(" ")
    ));
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    report.note(format!("user.max_user_namespaces (info): {}", max.trim()));
    report.finish()
}
