//! Two sandboxes looking at each other. The harness starts this program in
//! one sandbox as `serve` and, while it runs, in a second one as `probe`.
//!
//! `serve` plants everything a neighbour could find: marker files in /tmp
//! and /dev/shm, an abstract unix socket `@brig-hostile-serve`, a TCP
//! listener on 127.0.0.1:47999, a SysV shared memory segment and message
//! queue with key 0x62726967; it prints its report line at once (so the
//! harness knows it is ready), then sleeps `--seconds N` (default 20).
//!
//! `probe` scans /proc for a process running `serve`, signals (and then
//! SIGKILLs) any it finds, reads the marker files, connects to both
//! sockets and looks up the IPC key. Contained: the probe finds nothing —
//! separate pid, mount, network and ipc namespaces. Escaped: it sees,
//! reaches or kills anything of the serving sandbox.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use brig_hostile::{cmdline, errno, errno_name, read_file, visible_pids, Args, Report};

const ABSTRACT: &[u8] = b"\0brig-hostile-serve";
const TCP_PORT: u16 = 47999;
const IPC_KEY: libc::key_t = 0x6272_6967;
const MARKERS: &[&str] = &[
    "/tmp/brig-hostile-serve-marker",
    "/dev/shm/brig-hostile-serve-marker",
];

fn sock(domain: i32) -> OwnedFd {
    // SAFETY: socket takes plain integers.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    // SAFETY: fd was just created (a failure shows up on the next call as EBADF).
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn unix_addr() -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in ABSTRACT.iter().enumerate() {
        sa.sun_path[i] = *b as libc::c_char;
    }
    (
        sa,
        (std::mem::size_of::<libc::sa_family_t>() + ABSTRACT.len()) as libc::socklen_t,
    )
}

fn tcp_addr() -> libc::sockaddr_in {
    // SAFETY: all-zero is a valid sockaddr_in.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = TCP_PORT.to_be();
    sa.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
    sa
}

fn res(r: libc::c_int) -> String {
    if r == 0 {
        "ok".into()
    } else {
        errno_name(errno())
    }
}

fn serve(args: &Args) -> ! {
    let mut report = Report::new("cross_sandbox");
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    for m in MARKERS {
        let r = std::fs::write(m, format!("brig-hostile-serve pid {me}\n"));
        report.note(format!(
            "wrote {m}: {}",
            if r.is_ok() { "ok" } else { "failed" }
        ));
    }
    let u = sock(libc::AF_UNIX);
    let (sa, len) = unix_addr();
    // SAFETY: sa valid for len; u is a socket.
    let r = unsafe { libc::bind(u.as_raw_fd(), (&sa as *const libc::sockaddr_un).cast(), len) };
    // SAFETY: listen on our socket.
    let r2 = unsafe { libc::listen(u.as_raw_fd(), 8) };
    report.note(format!(
        "abstract @brig-hostile-serve: bind {} listen {}",
        res(r),
        res(r2)
    ));
    let t = sock(libc::AF_INET);
    let sa = tcp_addr();
    // SAFETY: sa valid for its size.
    let r = unsafe {
        libc::bind(
            t.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    // SAFETY: listen on our socket.
    let r2 = unsafe { libc::listen(t.as_raw_fd(), 8) };
    report.note(format!(
        "tcp 127.0.0.1:{TCP_PORT}: bind {} listen {}",
        res(r),
        res(r2)
    ));
    // SAFETY: SysV IPC with integer arguments.
    let shm = unsafe { libc::shmget(IPC_KEY, 4096, libc::IPC_CREAT | 0o666) };
    // SAFETY: as above.
    let msg = unsafe { libc::msgget(IPC_KEY, libc::IPC_CREAT | 0o666) };
    report.note(format!(
        "shm id {shm}, msg queue id {msg}, serving as pid {me}"
    ));
    let secs = args.u64_value("--seconds").unwrap_or(20);
    // Print the line now so the harness knows the plants are in place, then wait.
    let line = report.to_json();
    println!("{line}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    std::thread::sleep(std::time::Duration::from_secs(secs));
    // SAFETY: remove what we created; the ipc namespace would drop it anyway.
    unsafe {
        libc::shmctl(shm, libc::IPC_RMID, std::ptr::null_mut());
        libc::msgctl(msg, libc::IPC_RMID, std::ptr::null_mut());
    }
    std::process::exit(0)
}

fn probe() -> ! {
    let mut report = Report::new("cross_sandbox");
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let pids = visible_pids();
    report.note(format!("probe pid {me}; visible pids {pids:?}"));
    for pid in pids.iter().copied().filter(|p| *p != me) {
        let argv = cmdline(pid);
        if argv.contains("serve") {
            // SAFETY: kill with integer arguments; the target is the neighbour.
            let r = unsafe { libc::kill(pid, libc::SIGKILL) };
            report.escape(format!(
                "sees the serving sandbox's pid {pid} ({argv}); SIGKILL: {}",
                res(r)
            ));
        }
    }
    let mut signalable = 0;
    for pid in 1..=400 {
        // SAFETY: signal 0 only checks for existence and permission.
        if pid != me && unsafe { libc::kill(pid, 0) } == 0 {
            signalable += 1;
        }
    }
    report.note(format!(
        "{signalable} other pids in 1..=400 signalable (all must be our own sandbox's)"
    ));
    for m in MARKERS {
        match read_file(m) {
            Ok(b) => report.escape(format!(
                "read the neighbour's {m}: {}",
                String::from_utf8_lossy(&b).trim()
            )),
            Err(e) => report.note(format!("{m}: {}", errno_name(e))),
        }
    }
    let u = sock(libc::AF_UNIX);
    let (sa, len) = unix_addr();
    // SAFETY: sa valid for len.
    let r = unsafe { libc::connect(u.as_raw_fd(), (&sa as *const libc::sockaddr_un).cast(), len) };
    report.record(r == 0, format!("connect @brig-hostile-serve: {}", res(r)));
    let t = sock(libc::AF_INET);
    let sa = tcp_addr();
    // SAFETY: sa valid for its size.
    let r = unsafe {
        libc::connect(
            t.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    report.record(r == 0, format!("connect 127.0.0.1:{TCP_PORT}: {}", res(r)));
    // SAFETY: lookups only (no IPC_CREAT).
    let shm = unsafe { libc::shmget(IPC_KEY, 0, 0) };
    report.record(
        shm >= 0,
        format!(
            "shmget(key): {}",
            if shm >= 0 {
                format!("found id {shm}")
            } else {
                errno_name(errno())
            }
        ),
    );
    // SAFETY: as above.
    let msg = unsafe { libc::msgget(IPC_KEY, 0) };
    report.record(
        msg >= 0,
        format!(
            "msgget(key): {}",
            if msg >= 0 {
                format!("found id {msg}")
            } else {
                errno_name(errno())
            }
        ),
    );
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    report.record(
        unix.contains("brig-hostile-serve"),
        "looked for @brig-hostile-serve in /proc/net/unix".to_string(),
    );
    report.finish()
}

fn main() {
    let args = Args::get();
    match args.positional().first().map(String::as_str) {
        Some("serve") => serve(&args),
        Some("probe") => probe(),
        _ => {
            eprintln!("usage: cross_sandbox serve [--seconds N] | probe");
            std::process::exit(2)
        }
    }
}
