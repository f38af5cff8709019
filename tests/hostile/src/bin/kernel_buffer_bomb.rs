//! Kernel memory that no mmap shows: pipes filled to their capacity (with
//! F_SETPIPE_SZ raised as far as allowed), unix socket pairs whose send
//! buffers are filled and never read, and descriptors sent over a unix
//! socket and never received (SCM_RIGHTS in flight, which the kernel keeps
//! alive and which RLIMIT_NOFILE does not count once sent).
//!
//! Contained: the buffers are charged to the sandbox's memory cgroup and
//! bounded by its limits: the program stops on EMFILE/ENOMEM/EAGAIN, or
//! the memory limit ends the sandbox (exit 137), before `--cap MIB`
//! (default 2048) of buffered data or `--cap-fds` (default 1000000)
//! descriptors in flight. Escaped: a cap was reached. Destructive: needs
//! `--armed` and a user namespace.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use brig_hostile::{errno, errno_name, guard_destructive, Args, Report};

fn pair(kind: i32) -> Result<(OwnedFd, OwnedFd), i32> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            kind | libc::SOCK_NONBLOCK,
            0,
            fds.as_mut_ptr(),
        )
    } < 0
    {
        return Err(errno());
    }
    // SAFETY: both were just created.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Fill pipes; returns the bytes buffered.
fn pipes(report: &mut Report, cap: usize, keep: &mut Vec<OwnedFd>) -> usize {
    let chunk = vec![0x5au8; 1 << 16];
    let mut total = 0usize;
    while total < cap {
        let mut fds = [0; 2];
        // SAFETY: fds has room for two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK) } < 0 {
            report.note(format!(
                "pipes: stopped at {} MiB: {}",
                total >> 20,
                errno_name(errno())
            ));
            return total;
        }
        // SAFETY: both were just created.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl with integer arguments.
        unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20) };
        loop {
            // SAFETY: chunk is valid for its length.
            let n = unsafe { libc::write(w.as_raw_fd(), chunk.as_ptr().cast(), chunk.len()) };
            if n <= 0 {
                break;
            }
            total += n as usize;
        }
        keep.push(r);
        keep.push(w);
    }
    report.escape(format!(
        "buffered {} MiB in pipes without being stopped",
        total >> 20
    ));
    total
}

fn sockets(report: &mut Report, cap: usize, keep: &mut Vec<OwnedFd>) {
    let chunk = vec![0x5au8; 1 << 16];
    let mut total = 0usize;
    while total < cap {
        let (a, b) = match pair(libc::SOCK_STREAM) {
            Ok(p) => p,
            Err(e) => {
                report.note(format!(
                    "socket buffers: stopped at {} MiB: {}",
                    total >> 20,
                    errno_name(e)
                ));
                return;
            }
        };
        let big: libc::c_int = 1 << 30;
        // SAFETY: setsockopt with a valid int.
        unsafe {
            libc::setsockopt(
                a.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&big as *const libc::c_int).cast(),
                4,
            );
        }
        loop {
            // SAFETY: chunk is valid for its length.
            let n = unsafe { libc::write(a.as_raw_fd(), chunk.as_ptr().cast(), chunk.len()) };
            if n <= 0 {
                break;
            }
            total += n as usize;
        }
        keep.push(a);
        keep.push(b);
    }
    report.escape(format!(
        "buffered {} MiB in unix sockets without being stopped",
        total >> 20
    ));
}

/// Send descriptors over a socket nobody reads, closing ours each time.
fn in_flight(report: &mut Report, cap: usize, keep: &mut Vec<OwnedFd>) {
    let mut sent = 0usize;
    while sent < cap {
        let (a, b) = match pair(libc::SOCK_DGRAM) {
            Ok(p) => p,
            Err(e) => {
                report.note(format!(
                    "SCM_RIGHTS: stopped at {sent} descriptors in flight: {}",
                    errno_name(e)
                ));
                return;
            }
        };
        loop {
            let (x, y) = match pair(libc::SOCK_DGRAM) {
                Ok(p) => p,
                Err(e) => {
                    report.note(format!(
                        "SCM_RIGHTS: stopped at {sent} descriptors in flight: {}",
                        errno_name(e)
                    ));
                    return;
                }
            };
            let fds = [x.as_raw_fd(), y.as_raw_fd()];
            let mut cbuf = [0u8; 64];
            let mut byte = [0u8; 1];
            let mut iov = libc::iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            // SAFETY: an all-zero msghdr is valid; the fields are set below.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            // SAFETY: CMSG_SPACE is a pure computation.
            msg.msg_controllen = unsafe { libc::CMSG_SPACE(8) } as usize;
            // SAFETY: msg_control holds room for one header with two ints.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(8) as usize;
                std::ptr::copy_nonoverlapping(fds.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), 8);
            }
            // SAFETY: msg is fully initialised.
            let n = unsafe { libc::sendmsg(a.as_raw_fd(), &msg, 0) };
            if n < 0 {
                break;
            }
            sent += 2;
            if sent >= cap {
                break;
            }
        }
        keep.push(a);
        keep.push(b);
    }
    report.escape(format!(
        "{sent} descriptors in flight without being stopped"
    ));
}

fn main() {
    let args = Args::get();
    guard_destructive("kernel_buffer_bomb", &args);
    let mut report = Report::new("kernel_buffer_bomb");
    let cap = args.u64_value("--cap").unwrap_or(2048) as usize * (1 << 20);
    let cap_fds = args.u64_value("--cap-fds").unwrap_or(1_000_000) as usize;
    let mut keep = Vec::new();
    pipes(&mut report, cap, &mut keep);
    keep.clear();
    sockets(&mut report, cap, &mut keep);
    keep.clear();
    in_flight(&mut report, cap_fds, &mut keep);
    report.finish()
}
