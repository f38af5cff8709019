//! Take over pid 1 — brig's init under `brig run`, brig-agent in a daemon
//! sandbox, which holds the connection to the daemon and (in a daemon
//! sandbox) the writable layer's mount: ptrace it, read and write its
//! memory (process_vm_readv, /proc/1/mem), take its descriptors
//! (pidfd_getfd, /proc/1/fd/*), and signal it to death.
//!
//! Contained: every attempt fails (pid 1 is non-dumpable, and no process of
//! the sandbox holds CAP_SYS_PTRACE; SIGKILL to a namespace's init from
//! inside is ignored) and pid 1 is still alive afterwards. Escaped: any
//! attempt succeeded (each is named). Destructive if mis-run (it signals
//! pid 1): needs `--armed` and a user namespace.

use brig_hostile::{errno, errno_name, guard_destructive, open, outcome, Args, Report};

fn main() {
    let args = Args::get();
    guard_destructive("pid1_attack", &args);
    let mut report = Report::new("pid1_attack");
    let who = brig_hostile::cmdline(1);
    report.note(format!("pid 1: {who}"));

    // SAFETY: PTRACE_ATTACH/DETACH with integer arguments.
    let r = unsafe { libc::ptrace(libc::PTRACE_ATTACH, 1, 0, 0) };
    if r == 0 {
        let mut st = 0;
        // SAFETY: a valid out-pointer.
        unsafe {
            libc::waitpid(1, &mut st, libc::__WALL);
            libc::ptrace(libc::PTRACE_DETACH, 1, 0, 0);
        }
    }
    report.record(
        r == 0,
        format!(
            "ptrace attach: {}",
            if r == 0 {
                "ok".into()
            } else {
                errno_name(errno())
            }
        ),
    );

    let mut buf = [0u8; 64];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Somewhere mapped in every process: the start of its stack's page is
    // unknown, so read its auxv-named entry point's page instead; any
    // readable address would do, EFAULT is as much a success of access.
    let remote = libc::iovec {
        iov_base: 0x400000 as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: valid iovecs of the given lengths.
    let r = unsafe { libc::process_vm_readv(1, &local, 1, &remote, 1, 0) };
    let e = errno();
    // EFAULT means the access check passed (only the address was wrong).
    let allowed = r >= 0 || e == libc::EFAULT;
    report.record(
        allowed,
        format!(
            "process_vm_readv: {}",
            if r >= 0 { "ok".into() } else { errno_name(e) }
        ),
    );

    let m = open("/proc/1/mem", libc::O_RDONLY);
    report.record(m.is_ok(), format!("open /proc/1/mem: {}", outcome(&m)));
    let environ = open("/proc/1/environ", libc::O_RDONLY);
    report.record(
        environ.is_ok(),
        format!("open /proc/1/environ: {}", outcome(&environ)),
    );

    // The directory itself may be listable (brig-agent exec'd inside the
    // sandbox's user namespace, so a non-dumpable pid 1's /proc files are
    // owned by sandbox root): the numbers say nothing; following one, or
    // reading where it points, is the escape.
    let mut numbers: Vec<String> = std::fs::read_dir("/proc/1/fd")
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    for n in ["0", "1", "2", "3", "100"] {
        if !numbers.iter().any(|x| x == n) {
            numbers.push(n.to_string());
        }
    }
    let mut followed = Vec::new();
    for n in &numbers {
        let p = format!("/proc/1/fd/{n}");
        if open(&p, libc::O_RDONLY | libc::O_NONBLOCK).is_ok() || open(&p, libc::O_PATH).is_ok() {
            followed.push(format!("open {p}"));
        }
        if let Ok(target) = brig_hostile::readlink(&p) {
            followed.push(format!("readlink {p} = {target}"));
        }
    }
    report.record(
        !followed.is_empty(),
        format!(
            "pid 1's descriptors ({} tried): {followed:?}",
            numbers.len()
        ),
    );

    // SAFETY: pidfd_open with integer arguments.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, 1, 0) };
    if pidfd >= 0 {
        let mut taken = Vec::new();
        for fd in 0..128 {
            // SAFETY: pidfd_getfd with integer arguments.
            let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) };
            if got >= 0 {
                taken.push(fd);
                // SAFETY: closing the descriptor we just got.
                unsafe { libc::close(got as i32) };
            }
        }
        report.record(
            !taken.is_empty(),
            format!(
                "pidfd_getfd from pid 1: {} ({taken:?})",
                if taken.is_empty() {
                    errno_name(errno())
                } else {
                    "ok".into()
                }
            ),
        );
        // SAFETY: closing our pidfd.
        unsafe { libc::close(pidfd as i32) };
    } else {
        report.note(format!("pidfd_open(1): {}", errno_name(errno())));
    }

    for sig in [libc::SIGKILL, libc::SIGTERM, libc::SIGSEGV] {
        // SAFETY: kill with integer arguments.
        unsafe { libc::kill(1, sig) };
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    // SAFETY: signal 0 only checks (EPERM: alive, just not ours).
    let alive = unsafe { libc::kill(1, 0) } == 0 || errno() == libc::EPERM;
    report.record(
        !alive,
        format!(
            "pid 1 after SIGKILL, SIGTERM, SIGSEGV: {}",
            if alive { "alive" } else { "gone" }
        ),
    );
    report.finish()
}
