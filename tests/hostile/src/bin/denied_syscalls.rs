//! Call every syscall brig's seccomp policy denies, each with harmless
//! arguments, each in a forked child (so a KILL action or a changed process
//! state stays there).
//!
//! The arguments are chosen so that even an *unfiltered* call, run as real
//! root, changes nothing: reboot with bad magic, kexec with invalid flags,
//! clock_settime with an invalid timespec, adjtimex with an out-of-range
//! tick, swapon/acct/mount on nonexistent paths, ioctl TIOCSTI on fd -1,
//! bpf with an invalid command, NULL pointers elsewhere. So a call that was
//! not filtered shows up as a different errno (EINVAL, ENOENT, EBADF,
//! EFAULT...) or success instead of EPERM.
//!
//! Contained: every call in the policy's list answers EPERM (clone3:
//! ENOSYS, so libcs fall back to clone) or the child is killed by SIGSYS.
//! Escaped: any listed call reached the kernel; in the attribution pass
//! (`--seccomp-mark`) also a listed call the kernel refused rather than
//! the filter (clone3 aside, whose ENOSYS stays unmarked). Calls that
//! Docker-style profiles also block but brig's list does not name are
//! reported as information. Destructive only if mis-run: needs `--armed` and a user
//! namespace.

use brig_hostile::{
    child_denied, describe_child, exit_code_for, filter_refusals, guard_destructive, in_child,
    Args, Report,
};

type Call = fn() -> libc::c_long;

const NOWHERE: &[u8] = b"/nonexistent/brig-hostile\0";

fn p() -> *const libc::c_char {
    NOWHERE.as_ptr().cast()
}

fn null() -> *const libc::c_void {
    std::ptr::null()
}

/// clone(CLONE_NEWUSER) with fork semantics; the new child exits at once.
fn clone_newuser() -> libc::c_long {
    // SAFETY: stack 0 means fork-like semantics; the child only calls _exit.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
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
        unsafe { libc::waitpid(pid as libc::pid_t, &mut st, 0) };
        return 0;
    }
    pid
}

// Every closure below passes integers, NULL, pointers to live locals or
// static NUL-terminated strings, as its syscall expects; one note here
// instead of one identical SAFETY comment per call.
#[rustfmt::skip]
#[allow(clippy::undocumented_unsafe_blocks)]
fn required() -> Vec<(&'static str, Call)> {
    vec![
        ("init_module", || unsafe { libc::syscall(libc::SYS_init_module, null(), 0, c"".as_ptr()) }),
        ("finit_module", || unsafe { libc::syscall(libc::SYS_finit_module, -1, c"".as_ptr(), 0) }),
        ("delete_module", || unsafe { libc::syscall(libc::SYS_delete_module, c"brig_hostile_none".as_ptr(), libc::O_NONBLOCK) }),
        ("kexec_load", || unsafe { libc::syscall(libc::SYS_kexec_load, 0, 0, null(), 0xdead_0000u64) }),
        ("kexec_file_load", || unsafe { libc::syscall(libc::SYS_kexec_file_load, -1, -1, 0, null(), 0xdead_0000u64) }),
        ("bpf", || unsafe { libc::syscall(libc::SYS_bpf, 0xffff, null(), 0) }),
        ("perf_event_open", || unsafe { libc::syscall(libc::SYS_perf_event_open, null(), 0, -1, -1, 0) }),
        ("keyctl", || unsafe { libc::syscall(libc::SYS_keyctl, 0 /* GET_KEYRING_ID */, -1 /* thread keyring */, 0) }),
        ("add_key", || unsafe { libc::syscall(libc::SYS_add_key, null(), null(), null(), 0, 0) }),
        ("request_key", || unsafe { libc::syscall(libc::SYS_request_key, null(), null(), null(), 0) }),
        ("userfaultfd", || unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | 1 /* UFFD_USER_MODE_ONLY */) }),
        ("io_uring_setup", || unsafe { libc::syscall(libc::SYS_io_uring_setup, 0, null()) }),
        ("io_uring_enter", || unsafe { libc::syscall(libc::SYS_io_uring_enter, -1, 0, 0, 0, null(), 0) }),
        ("io_uring_register", || unsafe { libc::syscall(libc::SYS_io_uring_register, -1, 0, null(), 0) }),
        ("clock_settime", || {
            let ts = libc::timespec { tv_sec: 0, tv_nsec: -1 };
            unsafe { libc::syscall(libc::SYS_clock_settime, libc::CLOCK_REALTIME, &ts) }
        }),
        ("settimeofday", || unsafe { libc::syscall(libc::SYS_settimeofday, null(), null()) }),
        ("adjtimex", || {
            let mut tx: libc::timex = unsafe { std::mem::zeroed() };
            tx.modes = libc::ADJ_TICK;
            tx.tick = 0;
            unsafe { libc::syscall(libc::SYS_adjtimex, &mut tx) }
        }),
        ("clock_adjtime", || {
            let mut tx: libc::timex = unsafe { std::mem::zeroed() };
            tx.modes = libc::ADJ_TICK;
            tx.tick = 0;
            unsafe { libc::syscall(libc::SYS_clock_adjtime, libc::CLOCK_REALTIME, &mut tx) }
        }),
        ("swapon", || unsafe { libc::syscall(libc::SYS_swapon, p(), 0) }),
        ("swapoff", || unsafe { libc::syscall(libc::SYS_swapoff, p()) }),
        ("reboot", || unsafe { libc::syscall(libc::SYS_reboot, 0, 0, 0, null()) }),
        ("acct", || unsafe { libc::syscall(libc::SYS_acct, p()) }),
        ("mount", || unsafe { libc::syscall(libc::SYS_mount, null(), p(), null(), 0, null()) }),
        ("umount2", || unsafe { libc::syscall(libc::SYS_umount2, p(), 0) }),
        ("pivot_root", || unsafe { libc::syscall(libc::SYS_pivot_root, p(), p()) }),
        ("move_mount", || unsafe { libc::syscall(libc::SYS_move_mount, -1, p(), -1, p(), 0) }),
        ("open_tree", || unsafe { libc::syscall(libc::SYS_open_tree, -1, p(), 0) }),
        ("fsopen", || unsafe { libc::syscall(libc::SYS_fsopen, c"brig-hostile-nofs".as_ptr(), 0) }),
        ("fsmount", || unsafe { libc::syscall(libc::SYS_fsmount, -1, 0, 0) }),
        ("fsconfig", || unsafe { libc::syscall(libc::SYS_fsconfig, -1, 0, null(), null(), 0) }),
        ("fspick", || unsafe { libc::syscall(libc::SYS_fspick, -1, p(), 0) }),
        ("mount_setattr", || unsafe { libc::syscall(libc::SYS_mount_setattr, -1, p(), 0, null(), 0) }),
        ("setns", || unsafe { libc::syscall(libc::SYS_setns, -1, 0) }),
        ("unshare(CLONE_NEWUSER)", || unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER) }),
        ("clone(CLONE_NEWUSER)", clone_newuser),
        ("clone3", || unsafe { libc::syscall(libc::SYS_clone3, null(), 0) }),
        ("ioctl(TIOCSTI)", || {
            let c = b'#';
            unsafe { libc::syscall(libc::SYS_ioctl, -1, libc::TIOCSTI, &c) }
        }),
        ("ioctl(TIOCLINUX)", || {
            let c = 2u8;
            unsafe { libc::syscall(libc::SYS_ioctl, -1, 0x541c /* TIOCLINUX */, &c) }
        }),
        ("syslog", || unsafe { libc::syscall(libc::SYS_syslog, 10 /* SIZE_BUFFER */, null(), 0) }),
        ("open_by_handle_at", || unsafe { libc::syscall(libc::SYS_open_by_handle_at, -1, null(), 0) }),
        ("socket(AF_PACKET)", || unsafe { libc::syscall(libc::SYS_socket, libc::AF_PACKET, libc::SOCK_DGRAM, 0) }),
        ("mbind", || unsafe { libc::syscall(libc::SYS_mbind, null(), 0, 0, null(), 0, 0) }),
        ("set_mempolicy", || unsafe { libc::syscall(libc::SYS_set_mempolicy, 0, null(), 0) }),
        ("migrate_pages", || unsafe { libc::syscall(libc::SYS_migrate_pages, 0, 0, null(), null()) }),
        ("move_pages", || unsafe { libc::syscall(libc::SYS_move_pages, 0, 0, null(), null(), null(), 0) }),
        ("set_mempolicy_home_node", || unsafe { libc::syscall(450, 0, 0, 0, 0) }),
        ("quotactl", || unsafe { libc::syscall(libc::SYS_quotactl, 0, null(), 0, null()) }),
        ("quotactl_fd", || unsafe { libc::syscall(libc::SYS_quotactl_fd, -1, 0xff, 0, null()) }),
        ("iopl(3)", || unsafe { libc::syscall(libc::SYS_iopl, 3) }),
        ("ioperm", || unsafe { libc::syscall(libc::SYS_ioperm, 0x80, 1, 1) }),
        ("lookup_dcookie", || unsafe { libc::syscall(libc::SYS_lookup_dcookie, 0, null(), 0) }),
        ("nfsservctl", || unsafe { libc::syscall(libc::SYS_nfsservctl, 0, null(), null()) }),
        ("uselib", || unsafe { libc::syscall(libc::SYS_uselib, p()) }),
        ("fanotify_init", || unsafe { libc::syscall(libc::SYS_fanotify_init, 0, libc::O_RDONLY) }),
        ("name_to_handle_at", || unsafe { libc::syscall(libc::SYS_name_to_handle_at, -1, null(), null(), null(), 0) }),
        ("_sysctl", || unsafe { libc::syscall(libc::SYS__sysctl, null()) }),
        ("create_module", || unsafe { libc::syscall(174, null(), 0) }),
        ("get_kernel_syms", || unsafe { libc::syscall(177, null()) }),
        ("query_module", || unsafe { libc::syscall(178, null(), 0, null(), 0, null()) }),
        ("sysfs", || unsafe { libc::syscall(libc::SYS_sysfs, 0xff) }),
        ("ustat", || unsafe { libc::syscall(libc::SYS_ustat, 0, null()) }),
        ("lsm_set_self_attr", || unsafe { libc::syscall(460, 0, null(), 0, 0) }),
        // Without a controlling terminal (setsid), vhangup has nothing to hang up.
        ("vhangup", || unsafe {
            libc::setsid();
            libc::syscall(libc::SYS_vhangup)
        }),
        ("socketpair(AF_INET)", || {
            let mut fds = [-1i32; 2];
            unsafe { libc::syscall(libc::SYS_socketpair, libc::AF_INET, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) }
        }),
        // READ_IMPLIES_EXEC, at or above the policy's 0x80000.
        ("personality(READ_IMPLIES_EXEC)", || unsafe { libc::syscall(libc::SYS_personality, 0x40_0000) }),
    ]
}

/// Blocked by Docker's default profile but not named in brig's list.
#[rustfmt::skip]
#[allow(clippy::undocumented_unsafe_blocks)] // as for required()
fn extra() -> Vec<(&'static str, Call)> {
    vec![
        ("get_mempolicy", || unsafe { libc::syscall(libc::SYS_get_mempolicy, null(), null(), 0, null(), 0) }),
        ("unshare(CLONE_NEWNS)", || unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNS) }),
        ("unshare(CLONE_NEWNET)", || unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWNET) }),
        ("personality(query)", || unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu64) }),
        ("ptrace(TRACEME)", || unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0) }),
        ("process_vm_readv", || unsafe { libc::syscall(libc::SYS_process_vm_readv, 1, null(), 0, null(), 0, 0) }),
    ]
}

fn main() {
    let args = Args::get();
    guard_destructive("denied_syscalls", &args);
    let mut report = Report::new("denied_syscalls");
    let mut denied = 0;
    let mut total = 0;
    let mut how = std::collections::BTreeMap::<String, u32>::new();
    for (name, call) in required() {
        total += 1;
        let before = filter_refusals();
        let end = in_child(|| exit_code_for(brig_hostile::check(call())));
        // The attribution pass: a listed call refused by the kernel's own
        // EPERM (a missing capability) reached the kernel. clone3's ENOSYS
        // is left unmarked (glibc's fallback needs it): judged by its value.
        let by_kernel = before.is_some_and(|b| {
            name != "clone3"
                && matches!(end, Ok(brig_hostile::ChildEnd::Exited(e)) if e != 0)
                && filter_refusals() == Some(b)
        });
        if by_kernel {
            report.escape(format!(
                "{name} reached the kernel, which refused it: {}",
                describe_child(end)
            ));
        } else if child_denied(&end) {
            denied += 1;
            *how.entry(describe_child(end)).or_default() += 1;
            if name == "clone3" && end != Ok(brig_hostile::ChildEnd::Exited(libc::ENOSYS)) {
                report.note(format!(
                    "clone3: {} (ENOSYS expected, so libcs fall back to clone)",
                    describe_child(end)
                ));
            }
        } else {
            report.escape(format!(
                "{name} reached the kernel: {}",
                describe_child(end)
            ));
        }
    }
    report.note(format!(
        "{denied} of {total} policy-denied syscalls refused ({how:?})"
    ));
    let mut info = Vec::new();
    for (name, call) in extra() {
        let end = in_child(|| exit_code_for(brig_hostile::check(call())));
        info.push(format!("{name}={}", describe_child(end)));
    }
    report.note(format!(
        "not in the policy's list (info): {}",
        info.join(", ")
    ));
    report.finish()
}
