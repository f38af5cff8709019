//! The sandbox's seccomp policy, enforced by the real kernel.
//!
//! Each test forks a child that sets no_new_privs, installs a filter and
//! then makes a list of syscalls ("probes"); the child sends every result
//! back through a pipe and the parent checks them. No root is needed.
//!
//! - Every syscall the policy file denies must have an attempt here
//!   ([`attempt`]); the list comes from the generated table, so a new rule
//!   without a test fails. [`MUST_DENY`] catches the opposite: a rule
//!   removed from the policy by mistake.
//! - Refusal is checked twice: once with the shipped program (the errno a
//!   sandboxed program sees), and once with a copy whose errnos are shifted
//!   by [`MARK`]. The kernel never returns errnos that large, so the second
//!   run proves each refusal comes from the filter and not from a missing
//!   capability, which also answers EPERM.
//! - The attempts are harmless even if a rule were missing, because CI runs
//!   them as root: invalid flags, bad magic numbers, nonexistent paths and
//!   descriptors, so an unfiltered call fails inside the kernel before it
//!   changes anything. The few that would create something (a process, a
//!   socket) clean up after themselves.
//!
//! The child only makes raw syscalls on memory allocated before the fork,
//! so forking from the multi-threaded test harness is safe.
//!
//! x86_64 only for now: the attempts use x86_64 syscall numbers, and the
//! policy has x86-only entries (iopl, ioperm, the x32 ABI). Another arch
//! needs its own attempt table before these tests can run there.
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::ffi::{c_int, c_long, CStr};
use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;

use brig_jail::seccomp::{self, DENIALS, DENIED, SYSCALL_HORIZON};

/// Added to the errno of every `RET ERRNO` in the marked program. The
/// kernel's own errnos stay far below it (and the sum below 4096).
const MARK: i32 = 2048;
const X32_SYSCALL_BIT: c_long = 0x4000_0000;
const NO_SUCH_PATH: &CStr = c"/nonexistent/brig-seccomp-test";
const EMPTY_PATH: &CStr = c"";

/// What the policy must refuse whatever else changes in it; a rule
/// dropped from the JSON by mistake fails here.
const MUST_DENY: &[&str] = &[
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "settimeofday",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "lookup_dcookie",
    "nfsservctl",
    "iopl",
    "ioperm",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "personality",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
    "unshare",
    "clone",
    "clone3",
    "ioctl",
    "syslog",
    "vhangup",
    "name_to_handle_at",
    "open_by_handle_at",
    "fanotify_init",
    "lsm_set_self_attr",
    "mbind",
    "set_mempolicy",
    "migrate_pages",
    "move_pages",
    "socket",
];

/// How a probe makes its syscall.
#[derive(Clone, Copy)]
enum Call {
    /// `syscall(nr, args)`.
    Raw(c_long, [c_long; 6]),
    /// A syscall (numbered for the cross-check) made by a function that
    /// cleans up whatever it would create if nothing stopped it.
    Custom(c_long, fn() -> c_long),
}

impl Call {
    fn nr(self) -> c_long {
        match self {
            Call::Raw(nr, _) | Call::Custom(nr, _) => nr,
        }
    }

    fn run(self) -> c_long {
        match self {
            Call::Raw(nr, a) => raw(nr, a),
            Call::Custom(_, f) => f(),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Refused by the filter with this errno.
    Refused(i32),
    /// Reaches the kernel and succeeds.
    Succeeds,
    /// Reaches the kernel, which fails it with this errno.
    KernelErrno(i32),
    /// Reaches the kernel: success or any errno the filter does not return.
    NotRefused,
}

#[derive(Clone, Copy)]
struct Probe {
    label: &'static str,
    call: Call,
    expect: Expect,
}

fn probe(label: &'static str, call: Call, expect: Expect) -> Probe {
    Probe {
        label,
        call,
        expect,
    }
}

/// `syscall(nr, a...)`, the missing arguments zero.
fn sys<const N: usize>(nr: c_long, a: [c_long; N]) -> Call {
    let mut args = [0; 6];
    args[..N].copy_from_slice(&a);
    Call::Raw(nr, args)
}

fn raw(nr: c_long, a: [c_long; 6]) -> c_long {
    // SAFETY: probes pass null pointers, invalid descriptors, or pointers to
    // statics and live locals; the kernel validates every one, so the worst
    // a bad argument gets is an errno.
    unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

fn ptr(s: &'static CStr) -> c_long {
    s.as_ptr() as c_long
}

/// After a fork-like call: the child exits at once, the parent reaps it.
fn reap(ret: c_long) -> c_long {
    if ret == 0 {
        // SAFETY: leaves the new child before it can run anything else.
        unsafe { libc::_exit(0) }
    }
    if ret > 0 {
        // SAFETY: waits for the child created above.
        unsafe { libc::waitpid(ret as libc::pid_t, std::ptr::null_mut(), 0) };
    }
    ret
}

fn close_if_fd(ret: c_long) -> c_long {
    if ret >= 0 {
        // SAFETY: closes the descriptor the probe just created.
        unsafe { libc::close(ret as c_int) };
    }
    ret
}

/// How the tests attempt each denied syscall. The number comes from libc,
/// an independent check on the policy compiler's table; the arguments hit
/// the denying rule yet make an unfiltered call fail harmlessly.
fn attempt(name: &str) -> Option<Call> {
    use libc::*;
    let call = match name {
        "_sysctl" => sys(SYS__sysctl, []),
        "acct" => sys(SYS_acct, [ptr(NO_SUCH_PATH)]),
        "add_key" => sys(SYS_add_key, []),
        "adjtimex" => sys(SYS_adjtimex, []),
        // An unknown command.
        "bpf" => sys(SYS_bpf, [0xffff]),
        // An unknown clock id.
        "clock_adjtime" => sys(SYS_clock_adjtime, [0x7fff]),
        "clock_settime" => sys(SYS_clock_settime, [0x7fff]),
        "clone" => Call::Custom(SYS_clone, || {
            reap(raw(
                SYS_clone,
                [(CLONE_NEWUSER | SIGCHLD).into(), 0, 0, 0, 0, 0],
            ))
        }),
        // A null, zero-sized clone_args: EINVAL if unfiltered.
        "clone3" => Call::Custom(SYS_clone3, || reap(raw(SYS_clone3, [0; 6]))),
        // libc dropped the constants of syscalls the kernel no longer
        // implements; these are the x86_64 numbers.
        "create_module" => sys(174, []),
        "get_kernel_syms" => sys(177, []),
        "query_module" => sys(178, []),
        "delete_module" => sys(
            SYS_delete_module,
            [ptr(c"brig_no_such_module"), O_NONBLOCK.into()],
        ),
        // Unknown flags.
        "fanotify_init" => sys(SYS_fanotify_init, [0xffff_ffff]),
        "finit_module" => sys(SYS_finit_module, [-1, ptr(EMPTY_PATH)]),
        "fsconfig" => sys(SYS_fsconfig, [-1, 0xffff]),
        "fsmount" => sys(SYS_fsmount, [-1, 0xffff]),
        "fsopen" => sys(SYS_fsopen, [ptr(c"brig-no-such-fs"), 0xffff]),
        "fspick" => sys(SYS_fspick, [-1, ptr(EMPTY_PATH), 0xffff]),
        // A zero-length image is not an ELF file.
        "init_module" => sys(SYS_init_module, [0, 0, ptr(EMPTY_PATH)]),
        "io_uring_enter" => sys(SYS_io_uring_enter, [-1]),
        "io_uring_register" => sys(SYS_io_uring_register, [-1]),
        "io_uring_setup" => sys(SYS_io_uring_setup, []),
        "ioctl" => sys(SYS_ioctl, [-1, TIOCSTI as c_long]),
        // Beyond the 64K port space.
        "ioperm" => sys(SYS_ioperm, [0x10000, 1]),
        // Levels go up to 3.
        "iopl" => sys(SYS_iopl, [4]),
        // An unknown flag; never KEXEC_FILE_UNLOAD (bit 0).
        "kexec_file_load" => sys(SYS_kexec_file_load, [-1, -1, 0, 0, 0x100]),
        // Too many segments and an unknown flag; zero segments would unload.
        "kexec_load" => sys(SYS_kexec_load, [0, 17, 0, 0x8000]),
        "keyctl" => sys(SYS_keyctl, [0xffff]),
        "lookup_dcookie" => sys(SYS_lookup_dcookie, []),
        // Not in libc 0.2 yet; 460 on every arch (unified numbering).
        "lsm_set_self_attr" => sys(460, []),
        "mbind" => sys(SYS_mbind, [0, 0, 0xffff]),
        // No such pid.
        "migrate_pages" => sys(SYS_migrate_pages, [0x7fff_ffff]),
        "mount" => sys(SYS_mount, [0, ptr(NO_SUCH_PATH)]),
        "mount_setattr" => sys(SYS_mount_setattr, [-1, ptr(EMPTY_PATH), 0xffff_ffff]),
        "move_mount" => sys(
            SYS_move_mount,
            [-1, ptr(EMPTY_PATH), -1, ptr(EMPTY_PATH), 0xffff_ffff],
        ),
        "move_pages" => sys(SYS_move_pages, [0x7fff_ffff, 0, 0, 0, 0, 0xffff]),
        "name_to_handle_at" => sys(
            SYS_name_to_handle_at,
            [AT_FDCWD.into(), ptr(NO_SUCH_PATH), 0, 0, 0xffff_ffff],
        ),
        "nfsservctl" => sys(SYS_nfsservctl, []),
        "open_by_handle_at" => sys(SYS_open_by_handle_at, [-1]),
        // Unknown flags fail before anything is cloned.
        "open_tree" => sys(SYS_open_tree, [-1, ptr(EMPTY_PATH), 0xffff_ffff]),
        // A null attr.
        "perf_event_open" => sys(SYS_perf_event_open, [0, 0, -1, -1]),
        // READ_IMPLIES_EXEC; it would only affect this child.
        "personality" => sys(SYS_personality, [0x40_0000]),
        "pivot_root" => sys(SYS_pivot_root, [ptr(NO_SUCH_PATH), ptr(NO_SUCH_PATH)]),
        // Quota type 0xff does not exist.
        "quotactl" => sys(SYS_quotactl, [0xff]),
        "quotactl_fd" => sys(SYS_quotactl_fd, [-1, 0xff]),
        // Wrong magic numbers: EINVAL even for root.
        "reboot" => sys(SYS_reboot, []),
        "request_key" => sys(SYS_request_key, []),
        "set_mempolicy" => sys(SYS_set_mempolicy, [0xffff]),
        // Nonzero flags are reserved.
        "set_mempolicy_home_node" => sys(SYS_set_mempolicy_home_node, [0, 0, 0, 1]),
        "setns" => sys(SYS_setns, [-1]),
        // Both null: a no-op even for root.
        "settimeofday" => sys(SYS_settimeofday, []),
        // Protocol 0: an unbound packet socket receives nothing.
        "socket" => Call::Custom(SYS_socket, || {
            close_if_fd(raw(
                SYS_socket,
                [AF_PACKET.into(), SOCK_RAW.into(), 0, 0, 0, 0],
            ))
        }),
        "socketpair" => Call::Custom(SYS_socketpair, || {
            let mut sv = [-1 as c_int; 2];
            let sv_ptr = sv.as_mut_ptr() as c_long;
            raw(
                SYS_socketpair,
                [AF_INET.into(), SOCK_STREAM.into(), 0, sv_ptr, 0, 0],
            )
        }),
        "swapoff" => sys(SYS_swapoff, [ptr(NO_SUCH_PATH)]),
        "swapon" => sys(SYS_swapon, [ptr(NO_SUCH_PATH)]),
        "sysfs" => sys(SYS_sysfs, [0xff]),
        // An unknown action: never "clear" or a console-level change.
        "syslog" => sys(SYS_syslog, [0x7fff]),
        "umount2" => sys(SYS_umount2, [ptr(NO_SUCH_PATH)]),
        // Unfiltered, only this child would enter a new user namespace, and
        // the attempts after it stay harmless there.
        "unshare" => sys(SYS_unshare, [CLONE_NEWUSER.into()]),
        "uselib" => sys(SYS_uselib, [ptr(NO_SUCH_PATH)]),
        "userfaultfd" => sys(SYS_userfaultfd, [0xffff]),
        "ustat" => sys(SYS_ustat, []),
        // The child has called setsid: it has no terminal to hang up.
        "vhangup" => sys(SYS_vhangup, []),
        _ => return None,
    };
    Some(call)
}

fn attempt_or_panic(name: &str) -> Call {
    attempt(name).unwrap_or_else(|| {
        panic!("no attempt for denied syscall {name}; add one to tests/seccomp.rs")
    })
}

/// One probe per denial in the policy file, expecting the policy's errno.
fn denial_probes() -> Vec<Probe> {
    DENIALS
        .iter()
        .map(|d| {
            probe(
                d.syscall,
                attempt_or_panic(d.syscall),
                Expect::Refused(d.errno),
            )
        })
        .collect()
}

/// The refused side of the argument rules, and the horizon.
fn edge_probes() -> Vec<Probe> {
    use libc::*;
    let eperm = Expect::Refused(EPERM);
    let enosys = Expect::Refused(ENOSYS);
    vec![
        probe(
            "ioctl(TIOCLINUX)",
            sys(SYS_ioctl, [-1, TIOCLINUX as c_long]),
            eperm,
        ),
        probe(
            "ioctl(TIOCSETD)",
            sys(SYS_ioctl, [-1, TIOCSETD as c_long]),
            eperm,
        ),
        // The kernel ignores the request's upper 32 bits, and so does the rule.
        probe(
            "ioctl(TIOCSTI | 1 << 32)",
            sys(SYS_ioctl, [-1, TIOCSTI as c_long | 1 << 32]),
            eperm,
        ),
        probe(
            "socket(AF_VSOCK)",
            sys(SYS_socket, [AF_VSOCK.into(), SOCK_STREAM.into()]),
            eperm,
        ),
        probe(
            "socket(family 4095)",
            sys(SYS_socket, [4095, SOCK_STREAM.into()]),
            eperm,
        ),
        probe(
            "personality(0x80000)",
            sys(SYS_personality, [0x8_0000]),
            eperm,
        ),
        probe(
            "clone(CLONE_NEWUSER | CLONE_NEWNS)",
            Call::Custom(SYS_clone, || {
                reap(raw(
                    SYS_clone,
                    [
                        (CLONE_NEWUSER | CLONE_NEWNS | SIGCHLD).into(),
                        0,
                        0,
                        0,
                        0,
                        0,
                    ],
                ))
            }),
            eperm,
        ),
        probe(
            "syscall(SYSCALL_HORIZON)",
            sys(SYSCALL_HORIZON.into(), [-1]),
            enosys,
        ),
        probe("x32 getpid", sys(X32_SYSCALL_BIT | SYS_getpid, []), enosys),
        probe("x32 bpf", sys(X32_SYSCALL_BIT | SYS_bpf, [0xffff]), enosys),
    ]
}

/// Calls the sandbox must keep, including the allowed side of every
/// argument rule.
fn allowed_probes() -> Vec<Probe> {
    use libc::*;
    let ok = Expect::Succeeds;
    vec![
        probe("getpid", sys(SYS_getpid, []), ok),
        probe(
            "read /proc/self/status",
            Call::Custom(SYS_read, read_proc_self_status),
            ok,
        ),
        probe("fork", Call::Custom(SYS_clone, fork_and_reap), ok),
        probe(
            "clone(SIGCHLD)",
            Call::Custom(SYS_clone, || {
                reap(raw(SYS_clone, [SIGCHLD.into(), 0, 0, 0, 0, 0]))
            }),
            ok,
        ),
        // glibc tries clone3 first; ENOSYS must send it to clone.
        probe(
            "pthread_create",
            Call::Custom(SYS_clone3, spawn_and_join_thread),
            ok,
        ),
        probe(
            "unshare(CLONE_FILES)",
            sys(SYS_unshare, [CLONE_FILES.into()]),
            ok,
        ),
        probe(
            "personality(0xffffffff)",
            sys(SYS_personality, [0xffff_ffff]),
            ok,
        ),
        probe("personality(PER_LINUX32)", sys(SYS_personality, [0x8]), ok),
        probe(
            "personality(UNAME26 | PER_LINUX32)",
            sys(SYS_personality, [0x2_0008]),
            ok,
        ),
        probe(
            "personality(ADDR_NO_RANDOMIZE)",
            sys(SYS_personality, [0x4_0000]),
            ok,
        ),
        probe("personality(0)", sys(SYS_personality, [0]), ok),
        probe(
            "socket(AF_UNIX)",
            Call::Custom(SYS_socket, || open_socket(AF_UNIX, SOCK_STREAM, 0)),
            ok,
        ),
        probe(
            "socket(AF_INET)",
            Call::Custom(SYS_socket, || open_socket(AF_INET, SOCK_DGRAM, 0)),
            ok,
        ),
        probe(
            "socket(AF_NETLINK)",
            Call::Custom(SYS_socket, || {
                open_socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)
            }),
            ok,
        ),
        // IPv6 may be disabled on the host: any answer but the filter's.
        probe(
            "socket(AF_INET6)",
            Call::Custom(SYS_socket, || open_socket(AF_INET6, SOCK_DGRAM, 0)),
            Expect::NotRefused,
        ),
        probe(
            "socketpair(AF_UNIX)",
            Call::Custom(SYS_socketpair, unix_socketpair),
            ok,
        ),
        probe(
            "prctl(PR_GET_NO_NEW_PRIVS)",
            sys(SYS_prctl, [PR_GET_NO_NEW_PRIVS.into()]),
            ok,
        ),
        probe(
            "ioctl(pipe, TIOCGWINSZ)",
            Call::Custom(SYS_ioctl, winsize_of_a_pipe),
            Expect::KernelErrno(ENOTTY),
        ),
        // chroot stays allowed (docs/seccomp.md); the path lookup fails first.
        probe(
            "chroot",
            sys(SYS_chroot, [ptr(NO_SUCH_PATH)]),
            Expect::KernelErrno(ENOENT),
        ),
        probe(
            "ptrace(PEEKDATA, no such pid)",
            sys(SYS_ptrace, [PTRACE_PEEKDATA.into(), 0x7fff_ffff]),
            Expect::KernelErrno(ESRCH),
        ),
        probe(
            "process_vm_readv(no such pid)",
            Call::Custom(SYS_process_vm_readv, read_another_process),
            Expect::KernelErrno(ESRCH),
        ),
    ]
}

fn read_proc_self_status() -> c_long {
    use libc::*;
    let fd = raw(
        SYS_openat,
        [
            AT_FDCWD.into(),
            ptr(c"/proc/self/status"),
            O_RDONLY.into(),
            0,
            0,
            0,
        ],
    );
    if fd < 0 {
        return fd;
    }
    let mut buf = [0u8; 256];
    let n = raw(
        SYS_read,
        [fd, buf.as_mut_ptr() as c_long, buf.len() as c_long, 0, 0, 0],
    );
    close_if_fd(fd);
    n
}

fn fork_and_reap() -> c_long {
    // SAFETY: the probing child is single-threaded, and the grandchild
    // only calls _exit (in `reap`).
    let pid = unsafe { libc::fork() };
    reap(pid.into())
}

fn spawn_and_join_thread() -> c_long {
    extern "C" fn thread_main(_: *mut libc::c_void) -> *mut libc::c_void {
        std::ptr::null_mut()
    }
    let mut t: libc::pthread_t = 0;
    // SAFETY: a thread that returns at once, joined right below.
    let rc = unsafe {
        libc::pthread_create(&mut t, std::ptr::null(), thread_main, std::ptr::null_mut())
    };
    if rc != 0 {
        // SAFETY: errno is this thread's and writable.
        unsafe { *libc::__errno_location() = rc };
        return -1;
    }
    // SAFETY: joins the thread created above.
    unsafe { libc::pthread_join(t, std::ptr::null_mut()) };
    0
}

fn open_socket(family: c_int, kind: c_int, protocol: c_int) -> c_long {
    close_if_fd(raw(
        libc::SYS_socket,
        [family.into(), kind.into(), protocol.into(), 0, 0, 0],
    ))
}

fn unix_socketpair() -> c_long {
    let mut sv = [-1 as c_int; 2];
    let sv_ptr = sv.as_mut_ptr() as c_long;
    let r = raw(
        libc::SYS_socketpair,
        [
            libc::AF_UNIX.into(),
            libc::SOCK_STREAM.into(),
            0,
            sv_ptr,
            0,
            0,
        ],
    );
    close_if_fd(sv[0].into());
    close_if_fd(sv[1].into());
    r
}

fn winsize_of_a_pipe() -> c_long {
    let mut p = [-1 as c_int; 2];
    if raw(
        libc::SYS_pipe2,
        [p.as_mut_ptr() as c_long, libc::O_CLOEXEC.into(), 0, 0, 0, 0],
    ) < 0
    {
        return -2;
    }
    let mut ws = [0u16; 4];
    let r = raw(
        libc::SYS_ioctl,
        [
            p[0].into(),
            libc::TIOCGWINSZ as c_long,
            ws.as_mut_ptr() as c_long,
            0,
            0,
            0,
        ],
    );
    close_if_fd(p[0].into());
    close_if_fd(p[1].into());
    r
}

fn read_another_process() -> c_long {
    let mut buf = [0u8; 8];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: buf.len(),
    };
    let (l, r) = (
        &local as *const libc::iovec as c_long,
        &remote as *const libc::iovec as c_long,
    );
    raw(libc::SYS_process_vm_readv, [0x7fff_ffff, l, 1, r, 1, 0])
}

/// The shipped program with every errno shifted by [`MARK`].
fn marked_program() -> Vec<libc::sock_filter> {
    seccomp::with_errnos_shifted(MARK as u16)
}

#[derive(Debug, Clone, Copy)]
struct Outcome {
    ret: i64,
    errno: i32,
}

/// Forks a child that installs `program`, runs `probes` and reports back.
fn run_filtered(program: &[libc::sock_filter], probes: &[Probe]) -> Vec<Outcome> {
    let mut fds = [-1; 2];
    // SAFETY: pipe2 fills the two-element array.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    let fprog = libc::sock_fprog {
        len: u16::try_from(program.len()).expect("program fits a sock_fprog"),
        filter: program.as_ptr().cast_mut(),
    };
    // Everything the child touches exists before the fork.
    let mut slots = vec![[0i64; 2]; probes.len()];

    // SAFETY: the child only makes raw syscalls on memory allocated above
    // and leaves through _exit, so no lock another harness thread held at
    // fork time can matter.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        child(fds[1], &fprog, probes, &mut slots);
    }

    // SAFETY: closes the parent's copy of the write end.
    unsafe { libc::close(fds[1]) };
    // SAFETY: the read end is ours, closed only by this File.
    let mut pipe = unsafe { File::from_raw_fd(fds[0]) };
    let mut bytes = Vec::new();
    pipe.read_to_end(&mut bytes)
        .expect("read the child's report");
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFSIGNALED(status) {
        panic!(
            "filtered child killed by signal {} (SIGSYS is 31)",
            libc::WTERMSIG(status)
        );
    }
    match libc::WEXITSTATUS(status) {
        0 => {}
        10 => panic!("child: prctl(PR_SET_NO_NEW_PRIVS) failed"),
        11 => {
            panic!("child: seccomp(SECCOMP_SET_MODE_FILTER) failed; is CONFIG_SECCOMP_FILTER set?")
        }
        n => panic!("child exited with {n}"),
    }
    assert_eq!(
        bytes.len(),
        probes.len() * 16,
        "short report from the child"
    );
    bytes
        .chunks_exact(16)
        .map(|c| Outcome {
            ret: i64::from_ne_bytes(c[..8].try_into().unwrap()),
            errno: i64::from_ne_bytes(c[8..].try_into().unwrap()) as i32,
        })
        .collect()
}

fn child(out: c_int, fprog: &libc::sock_fprog, probes: &[Probe], slots: &mut [[i64; 2]]) -> ! {
    // SAFETY: plain syscalls on valid arguments; the process ends in _exit.
    unsafe {
        // A new session has no controlling terminal, so vhangup and the
        // terminal ioctls cannot reach the terminal running the tests.
        libc::setsid();
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            libc::_exit(10);
        }
        let fprog: *const libc::sock_fprog = fprog;
        if libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0, fprog) != 0 {
            libc::_exit(11);
        }
    }
    for (probe, slot) in probes.iter().zip(slots.iter_mut()) {
        let ret = probe.call.run();
        let errno = if ret == -1 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        } else {
            0
        };
        *slot = [ret, i64::from(errno)];
    }
    // SAFETY: writes the slots (plain integers) and exits without unwinding.
    unsafe {
        libc::write(out, slots.as_ptr().cast(), std::mem::size_of_val(slots));
        libc::_exit(0)
    }
}

/// Checks outcomes; `mark` is what the program adds to its errnos.
fn check(probes: &[Probe], outcomes: &[Outcome], mark: i32) {
    let mut failures = Vec::new();
    for (p, o) in probes.iter().zip(outcomes) {
        let refused =
            o.ret == -1 && (o.errno == libc::EPERM + mark || o.errno == libc::ENOSYS + mark);
        let ok = match p.expect {
            Expect::Refused(e) => o.ret == -1 && o.errno == e + mark,
            Expect::Succeeds => o.ret >= 0,
            Expect::KernelErrno(e) => o.ret == -1 && o.errno == e,
            Expect::NotRefused => !refused,
        };
        if !ok {
            failures.push(format!(
                "{}: expected {:?}, got ret {} errno {}",
                p.label, p.expect, o.ret, o.errno
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} probe(s) failed (errno mark {mark}):\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

#[test]
fn every_denied_syscall_has_an_attempt_with_the_same_number() {
    for d in DENIALS {
        let nr = attempt_or_panic(d.syscall).nr();
        assert_eq!(
            nr,
            c_long::from(d.nr),
            "{}: libc and the policy compiler disagree",
            d.syscall
        );
    }
}

#[test]
fn the_baseline_denials_are_all_in_the_policy() {
    let missing: Vec<_> = MUST_DENY.iter().filter(|n| !DENIED.contains(n)).collect();
    assert!(
        missing.is_empty(),
        "resources/seccomp/sandbox.json no longer denies {missing:?}"
    );
}

#[test]
fn denied_syscalls_are_refused_with_the_policys_errno() {
    let probes: Vec<Probe> = denial_probes().into_iter().chain(edge_probes()).collect();
    let outcomes = run_filtered(seccomp::sandbox_filter(), &probes);
    check(&probes, &outcomes, 0);
}

#[test]
fn refusals_come_from_the_filter_not_from_missing_capabilities() {
    // pthread_create is left out: glibc falls back from clone3 to clone
    // only on a real ENOSYS, which the marked program no longer returns.
    let allowed = allowed_probes()
        .into_iter()
        .filter(|p| p.label != "pthread_create");
    let probes: Vec<Probe> = denial_probes()
        .into_iter()
        .chain(edge_probes())
        .chain(allowed)
        .collect();
    let outcomes = run_filtered(&marked_program(), &probes);
    check(&probes, &outcomes, MARK);
}

#[test]
fn allowed_syscalls_still_work() {
    let probes = allowed_probes();
    let outcomes = run_filtered(seccomp::sandbox_filter(), &probes);
    check(&probes, &outcomes, 0);
}
