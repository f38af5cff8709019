//! The few raw syscalls the agent needs, each behind a safe function.
//! Everything unsafe in the agent is in this file or in the two `pre_exec`
//! hooks in `process.rs` (the PTY's session, and the user switch).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub fn set_nonblocking(fd: &impl AsRawFd) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: F_GETFL takes no pointer argument; a bad fd yields EBADF.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFL) })?;
    // SAFETY: F_SETFL takes an integer argument; no memory is touched.
    check(unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    Ok(())
}

pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD take integer arguments; a bad fd yields EBADF.
    let flags = check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: as above.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) })?;
    Ok(())
}

/// For a listening agent: point fd 1 (the listening socket too) and fd 2
/// (the launcher's stderr, which a sandbox outliving its launcher must not
/// hold open) at /dev/null, and mark every descriptor above stderr
/// close-on-exec, so what the launcher left for the agent alone (its
/// locks) never reaches a process it starts.
pub fn detach_inherited() -> io::Result<()> {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    for fd in [1, 2] {
        // SAFETY: dup2 between descriptors we own.
        check(unsafe { libc::dup2(null.as_raw_fd(), fd) })?;
    }
    cloexec_above_stderr()
}

/// Mark every descriptor above stderr close-on-exec, so what the launcher
/// left open stays out of the agent's children.
pub fn cloexec_above_stderr() -> io::Result<()> {
    // SAFETY: close_range with constant arguments; marks, closes nothing.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    // gVisor (2022 builds) has close_range without CLOSE_RANGE_CLOEXEC:
    // mark each open descriptor instead.
    if !matches!(err.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOSYS)) {
        return Err(err);
    }
    let fds: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // The directory's own descriptor is closed by now: EBADF is fine.
        let _ = set_cloexec(fd);
    }
    Ok(())
}

/// Take ownership of an inherited descriptor (fd 3, or 0 and 1 with
/// `--stdio`) after checking that it is open.
pub fn adopt_fd(fd: RawFd) -> io::Result<OwnedFd> {
    set_cloexec(fd)?;
    // SAFETY: the launcher handed this fd to the agent for its exclusive use,
    // fcntl just proved it is open, and nothing else in this process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// poll(2). EINTR counts as "nothing ready".
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: `fds` is a valid, exclusively borrowed array of `fds.len()`
    // pollfd structs for the duration of the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(err);
    }
    Ok(n as usize)
}

/// Block SIGCHLD (and `also`) and return a signalfd that becomes readable
/// when a child changes state (or one of `also` arrives). Children started
/// with std::process::Command get an empty signal mask again, so blocking
/// here does not leak into them.
pub fn sigchld_fd(also: &[libc::c_int]) -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data, all zeroes is a valid value, and
    // sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for sig in also {
            libc::sigaddset(&mut set, *sig);
        }
    }
    // A handler that never runs (the signals stay blocked, read from the
    // descriptor): as pid 1, a signal left at its default action would be
    // dropped before it could be read (gVisor does so even when blocked).
    extern "C" fn never(_: libc::c_int) {}
    for sig in also {
        // SAFETY: a zeroed sigaction is valid; the handler is a plain
        // function that does nothing; the result is checked.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = never as extern "C" fn(libc::c_int) as usize;
            if libc::sigaction(*sig, &act, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error());
            }
        }
    }
    // SAFETY: `set` is valid; the old mask is not wanted (null is allowed).
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: `set` is valid; -1 asks for a new descriptor.
    let fd = check(unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) })?;
    // SAFETY: signalfd just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    Exited(i32),
    Signaled(i32),
}

/// Reap every child that has ended, without blocking.
pub fn reap_children() -> Vec<(i32, WaitStatus)> {
    let mut out = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; WNOHANG never blocks.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return out;
        }
        if libc::WIFEXITED(status) {
            out.push((pid, WaitStatus::Exited(libc::WEXITSTATUS(status))));
        } else if libc::WIFSIGNALED(status) {
            out.push((pid, WaitStatus::Signaled(libc::WTERMSIG(status))));
        }
    }
}

pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill(2) takes no pointers.
    check(unsafe { libc::kill(pid, sig) })?;
    Ok(())
}

/// Kill a whole process group (every child is started as a group leader).
pub fn kill_group(pgid: i32, sig: i32) {
    if pgid > 0 {
        // SAFETY: killpg(2) takes no pointers. Failure (the group is gone)
        // is fine: there is nothing left to kill.
        unsafe { libc::killpg(pgid, sig) };
    }
}

/// A new PTY pair of the given size: (master, slave), both close-on-exec.
pub fn openpty(rows: u16, cols: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    let (mut master, mut slave) = (-1, -1);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: the out-pointers are valid ints; name and termios may be null;
    // `ws` is a valid winsize that outlives the call.
    check(unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &ws,
        )
    })?;
    // SAFETY: openpty returned two new descriptors that nothing else owns.
    let pair = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    set_cloexec(pair.0.as_raw_fd())?;
    set_cloexec(pair.1.as_raw_fd())?;
    Ok(pair)
}

/// Whether a PTY master reports the slave side's close (EIO on read), as
/// Linux's does. gVisor's (2022 builds) never does: its reads say EAGAIN
/// for ever. Tried once, on a PTY of its own.
pub fn pty_reports_hangup() -> bool {
    static HANGUP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HANGUP.get_or_init(|| {
        let Ok((master, slave)) = openpty(24, 80) else {
            return true;
        };
        drop(slave);
        let mut master = std::fs::File::from(master);
        if set_nonblocking(&master).is_err() {
            return true;
        }
        let mut buf = [0u8; 16];
        !matches!(
            std::io::Read::read(&mut master, &mut buf),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        )
    })
}

pub fn set_winsize(fd: &impl AsRawFd, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize through the pointer, which is
    // valid for the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) })?;
    Ok(())
}

/// A terminal's size: (rows, columns).
pub fn winsize(fd: &impl AsRawFd) -> io::Result<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize through the pointer, which is
    // valid for the call.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) })?;
    Ok((ws.ws_row, ws.ws_col))
}

/// A new inotify instance, non-blocking and close-on-exec.
pub fn inotify_init() -> io::Result<OwnedFd> {
    // SAFETY: inotify_init1 takes only flags.
    let fd = check(unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) })?;
    // SAFETY: inotify_init1 just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Watch `path` on `inotify` for the events in `mask`; returns the watch
/// descriptor (the same one again for an inode already watched).
pub fn inotify_add_watch(
    inotify: &impl AsRawFd,
    path: &std::path::Path,
    mask: u32,
) -> io::Result<i32> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `path` is a NUL-terminated string that outlives the call.
    check(unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), path.as_ptr(), mask) })
}

/// Stop a watch. Failure (the kernel already dropped it) is fine.
pub fn inotify_rm_watch(inotify: &impl AsRawFd, wd: i32) {
    // SAFETY: inotify_rm_watch takes no pointers.
    unsafe { libc::inotify_rm_watch(inotify.as_raw_fd(), wd) };
}

/// Start a non-blocking TCP connection to `addr`. Returns the socket and
/// whether it is already connected; otherwise it becomes writable when the
/// connection is made or fails (then `TcpStream::take_error` says why).
pub fn tcp_connect(addr: &std::net::SocketAddr) -> io::Result<(std::net::TcpStream, bool)> {
    let (family, storage, len) = match addr {
        std::net::SocketAddr::V4(a) => {
            // SAFETY: sockaddr_in is plain old data; all-zero is valid.
            let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            // SAFETY: sockaddr_storage is plain old data; all-zero is valid.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and
            // suitably aligned for it.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(ss).cast(), sin) };
            (libc::AF_INET, ss, std::mem::size_of::<libc::sockaddr_in>())
        }
        std::net::SocketAddr::V6(a) => {
            // SAFETY: sockaddr_in6 is plain old data; all-zero is valid.
            let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            // SAFETY: as above.
            let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            // SAFETY: sockaddr_storage is larger than sockaddr_in6 and
            // suitably aligned for it.
            unsafe { std::ptr::write(std::ptr::addr_of_mut!(ss).cast(), sin6) };
            (
                libc::AF_INET6,
                ss,
                std::mem::size_of::<libc::sockaddr_in6>(),
            )
        }
    };
    let fd = check(
        // SAFETY: socket takes no pointers.
        unsafe {
            libc::socket(
                family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        },
    )?;
    // SAFETY: socket just returned this fd; nothing else owns it.
    let sock = unsafe { std::net::TcpStream::from_raw_fd(fd) };
    // SAFETY: `storage` holds a valid address of `len` bytes for the call.
    let rc = unsafe {
        libc::connect(
            fd,
            std::ptr::addr_of!(storage).cast(),
            len as libc::socklen_t,
        )
    };
    if rc == 0 {
        return Ok((sock, true));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EINPROGRESS) {
        return Ok((sock, false));
    }
    Err(err)
}

/// Make the next close of `sock` send RST instead of FIN (an abort).
pub fn set_linger_zero(sock: &impl AsRawFd) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `linger` is a valid struct of the size passed, read during
    // the call only. Failure leaves a graceful close, which is fine.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

/// A path as a C string; a path with a NUL byte is refused earlier
/// (`files::check_path`), so this only fails for a caller's bug.
fn c_path(path: &str) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Names of the extended attributes of `path` (not following a symlink).
pub fn list_xattrs(path: &str) -> io::Result<Vec<String>> {
    let p = c_path(path)?;
    loop {
        // SAFETY: a null buffer of size 0 asks only for the needed size.
        let size = unsafe { libc::llistxattr(p.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        if size == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; size as usize];
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes during the
        // call; the kernel writes at most that many.
        let n = unsafe { libc::llistxattr(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let err = io::Error::last_os_error();
            // An attribute was added between the two calls: ask again.
            if err.raw_os_error() == Some(libc::ERANGE) {
                continue;
            }
            return Err(err);
        }
        buf.truncate(n as usize);
        return Ok(buf
            .split(|b| *b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect());
    }
}

/// The value of one extended attribute of `path` (not following a symlink).
pub fn get_xattr(path: &str, name: &str) -> io::Result<Vec<u8>> {
    let (p, n) = (c_path(path)?, c_path(name)?);
    loop {
        // SAFETY: a null buffer of size 0 asks only for the needed size.
        let size = unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), std::ptr::null_mut(), 0) };
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize];
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes during the
        // call; the kernel writes at most that many.
        let got =
            unsafe { libc::lgetxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if got < 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ERANGE) {
                continue;
            }
            return Err(err);
        }
        buf.truncate(got as usize);
        return Ok(buf);
    }
}

/// Set one extended attribute of `path` (not following a symlink).
pub fn set_xattr(path: &str, name: &str, value: &[u8]) -> io::Result<()> {
    let (p, n) = (c_path(path)?, c_path(name)?);
    // SAFETY: the strings are NUL-terminated and `value` is valid for reads
    // of `value.len()` bytes during the call.
    check(unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })?;
    Ok(())
}

/// Remove one extended attribute of `path` (not following a symlink).
pub fn remove_xattr(path: &str, name: &str) -> io::Result<()> {
    let (p, n) = (c_path(path)?, c_path(name)?);
    // SAFETY: both strings are NUL-terminated and live through the call.
    check(unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) })?;
    Ok(())
}

/// The calling thread's filesystem identity switched to `uid`:`gid` with
/// no supplementary groups, until dropped: files it opens or creates
/// meanwhile are checked and owned as that user's. Raw syscalls, so only
/// this thread changes (glibc's wrappers would change every thread). From
/// root, a non-zero fsuid also clears the file capabilities (DAC override,
/// fowner...) from the effective set; going back to 0 restores them.
#[derive(Debug)]
pub struct FsIdentity {
    groups: Vec<libc::gid_t>,
}

impl FsIdentity {
    pub fn assume(uid: u32, gid: u32) -> io::Result<FsIdentity> {
        // SAFETY: getgroups with a zero size only counts.
        let n = check(unsafe { libc::getgroups(0, std::ptr::null_mut()) })?;
        let mut groups = vec![0 as libc::gid_t; n as usize];
        // SAFETY: the buffer holds `n` gids.
        let n = check(unsafe { libc::getgroups(n, groups.as_mut_ptr()) })?;
        groups.truncate(n as usize);
        let identity = FsIdentity { groups };
        // SAFETY: plain integer arguments; a null list with size 0.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0 {
                return Err(io::Error::last_os_error());
            }
            // gVisor (this host's runsc) has no setfsuid: ENOSYS, and the
            // caller opens through [`open_as`] instead.
            if libc::syscall(libc::SYS_setfsgid, gid) < 0 {
                return Err(io::Error::last_os_error());
            }
            libc::syscall(libc::SYS_setfsuid, uid);
            // Both calls answer the previous value and cannot fail
            // visibly: ask again (an invalid id changes nothing) to see
            // whether they took.
            let now_gid = libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32;
            let now_uid = libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32;
            if (now_uid, now_gid) != (uid, gid) {
                return Err(io::Error::from_raw_os_error(libc::EPERM));
            }
        }
        Ok(identity)
    }
}

/// Open `path` with `opts` as `uid`:`gid` (no supplementary groups) on a
/// thread of its own that takes those ids for good and then ends: for
/// kernels without `setfsuid` (gVisor). Raw system calls, so only that
/// thread's credentials change (glibc's wrappers would change every
/// thread's).
pub fn open_as(
    uid: u32,
    gid: u32,
    opts: &std::fs::OpenOptions,
    path: &str,
) -> io::Result<std::fs::File> {
    let (opts, path) = (opts.clone(), path.to_string());
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                // SAFETY: plain integer arguments and a null list with size
                // 0; each changes this thread's credentials only.
                unsafe {
                    if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) < 0
                        || libc::syscall(libc::SYS_setresgid, gid, gid, gid) < 0
                        || libc::syscall(libc::SYS_setresuid, uid, uid, uid) < 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                opts.open(&path)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the opening thread panicked")))
    })
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        // SAFETY: as in assume; the saved list is live for the call.
        unsafe {
            libc::syscall(libc::SYS_setfsuid, libc::geteuid());
            libc::syscall(libc::SYS_setfsgid, libc::getegid());
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr());
        }
    }
}

/// Become `uid`:`gid` with supplementary `groups`, in a child between fork
/// and exec. Only async-signal-safe calls, no allocation: `groups` was
/// built before the fork. Groups first, then the gid, then the uid, since
/// each later step gives up the privilege the earlier ones need.
///
/// An unprivileged agent cannot set groups (EPERM); as std's
/// `Command::uid` does, that is tolerated, and setgid/setuid then fail on
/// their own if they would change anything.
pub fn switch_user(uid: u32, gid: u32, groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: `groups` is a valid slice of `groups.len()` gids, read during
    // the call only.
    if unsafe { libc::setgroups(groups.len(), groups.as_ptr()) } < 0 {
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EPERM) {
            return Err(err);
        }
    }
    // SAFETY: setgid and setuid take plain integers. In the single-threaded
    // child they change this process only.
    check(unsafe { libc::setgid(gid) })?;
    // SAFETY: as above.
    check(unsafe { libc::setuid(uid) })?;
    Ok(())
}

/// The agent's own real uid and gid.
pub fn current_ids() -> (u32, u32) {
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    unsafe { (libc::getuid(), libc::getgid()) }
}

// The vm tier's init (`vm.rs`): what a guest's pid 1 does before it
// serves.

fn cstr(s: &str) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// mount(2) of `source` (a device or a file system's name) at `target`.
pub fn mount(
    source: &str,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let (source, target) = (cstr(source)?, cstr(target)?);
    let fstype = fstype.map(cstr).transpose()?;
    let data = data.map(cstr).transpose()?;
    // SAFETY: NUL-terminated strings that outlive the call, or null where
    // mount(2) allows it (no type for MS_MOVE, no data).
    check(unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ref().map_or(std::ptr::null(), |t| t.as_ptr()),
            flags,
            data.as_ref()
                .map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    })?;
    Ok(())
}

/// Load the kernel module in `file` (finit_module(2), no parameters).
pub fn finit_module(file: &std::fs::File) -> io::Result<()> {
    let params = c"";
    // SAFETY: a valid descriptor and an empty NUL-terminated parameter
    // string; flags 0.
    let rc = unsafe { libc::syscall(libc::SYS_finit_module, file.as_raw_fd(), params.as_ptr(), 0) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        // Built into this kernel, or loaded already: what was wanted.
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// chroot(2).
pub fn chroot(dir: &str) -> io::Result<()> {
    let dir = cstr(dir)?;
    // SAFETY: a NUL-terminated path that outlives the call.
    check(unsafe { libc::chroot(dir.as_ptr()) })?;
    Ok(())
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: a pointer and the length of a live byte slice.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
    Ok(())
}

/// Power the machine off (the VM ends; its QEMU exits). Returns only if
/// the kernel refused.
pub fn power_off() -> io::Error {
    // SAFETY: sync and reboot take integers only.
    unsafe {
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    io::Error::last_os_error()
}

/// The signal numbers read from a signalfd (each `signalfd_siginfo` is
/// 128 bytes, its first field the number), until it has no more.
pub fn read_signals(fd: &mut std::fs::File) -> Vec<u32> {
    use std::io::Read;
    let mut signals = Vec::new();
    let mut buf = [0u8; 128 * 8];
    while let Ok(n) = fd.read(&mut buf) {
        if n == 0 {
            break;
        }
        signals.extend(
            buf[..n]
                .chunks_exact(128)
                .map(|info| u32::from_ne_bytes([info[0], info[1], info[2], info[3]])),
        );
    }
    signals
}

/// Set the UTS namespace's host name (needs CAP_SYS_ADMIN in it).
pub fn set_hostname(name: &str) -> io::Result<()> {
    // SAFETY: a pointer and length to bytes that outlive the call.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// Mix `bytes` into the kernel's entropy pool, credited, then force its
/// random generator to reseed from the pool (`RNDADDENTROPY`,
/// `RNDRESEEDCRNG`): a guest restored from a snapshot stops producing its
/// parent's random numbers. Needs CAP_SYS_ADMIN.
pub fn add_entropy_and_reseed(bytes: &[u8; 32]) -> io::Result<()> {
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    /// `struct rand_pool_info` with its buffer.
    #[repr(C)]
    struct PoolInfo {
        entropy_count: libc::c_int,
        buf_size: libc::c_int,
        buf: [u8; 32],
    }
    let info = PoolInfo {
        entropy_count: 256,
        buf_size: 32,
        buf: *bytes,
    };
    let random = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    // SAFETY: ioctls on a descriptor we hold, with a struct that outlives
    // the call (the first) and no argument (the second).
    unsafe {
        check(libc::ioctl(
            random.as_raw_fd(),
            RNDADDENTROPY,
            &info as *const PoolInfo,
        ))?;
        check(libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG))?;
    }
    Ok(())
}

/// Set the wall clock to `ns` since the Unix epoch.
pub fn set_realtime(ns: u64) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a timespec that outlives the call.
    check(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) }).map(drop)
}

/// An IPv4 interface request: `struct ifreq`, its name and then 24 bytes
/// of union (a `sockaddr_in` or the flags).
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

impl IfReq {
    fn new(name: &str) -> io::Result<IfReq> {
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: [0; 24],
        };
        if name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad interface name {name:?}"),
            ));
        }
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        Ok(req)
    }

    fn with_addr(name: &str, addr: std::net::Ipv4Addr) -> io::Result<IfReq> {
        let mut req = IfReq::new(name)?;
        req.data[..16].copy_from_slice(&sockaddr_in(addr));
        Ok(req)
    }
}

/// A `struct sockaddr_in` for `addr`, port 0, as bytes.
fn sockaddr_in(addr: std::net::Ipv4Addr) -> [u8; 16] {
    let mut sa = [0u8; 16];
    sa[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    sa[4..8].copy_from_slice(&addr.octets());
    sa
}

/// An IPv4 datagram socket, to name interfaces and routes to the kernel.
fn inet_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket takes integers; the result is checked and owned once.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: a descriptor socket just returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn ifreq_ioctl(sock: &OwnedFd, request: libc::c_ulong, req: &mut IfReq) -> io::Result<()> {
    // SAFETY: an interface ioctl with a struct ifreq-sized buffer that
    // outlives the call.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), request as _, req as *mut IfReq) }).map(drop)
}

/// Set interface `name` up (`ip link set NAME up`).
pub fn link_up(name: &str) -> io::Result<()> {
    let sock = inet_socket()?;
    let mut req = IfReq::new(name)?;
    ifreq_ioctl(&sock, libc::SIOCGIFFLAGS, &mut req)?;
    let flags = i16::from_ne_bytes([req.data[0], req.data[1]]) | libc::IFF_UP as i16;
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    ifreq_ioctl(&sock, libc::SIOCSIFFLAGS, &mut req)
}

/// Give interface `name` the single address `addr`/32 (replacing the one
/// it had), set it up, route `gateway` on-link through it and everything
/// else via `gateway`; and forget `gateway`'s link-layer address (a
/// restored guest's gateway is a new link).
pub fn set_ipv4(
    name: &str,
    addr: std::net::Ipv4Addr,
    gateway: std::net::Ipv4Addr,
) -> io::Result<()> {
    let sock = inet_socket()?;
    let what =
        |op: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{op}: {e}"));
    ifreq_ioctl(&sock, libc::SIOCSIFADDR, &mut IfReq::with_addr(name, addr)?)
        .map_err(what("set the address"))?;
    let all = std::net::Ipv4Addr::BROADCAST;
    ifreq_ioctl(
        &sock,
        libc::SIOCSIFNETMASK,
        &mut IfReq::with_addr(name, all)?,
    )
    .map_err(what("set the netmask"))?;
    link_up(name).map_err(what("set the link up"))?;
    let unspecified = std::net::Ipv4Addr::UNSPECIFIED;
    add_route(&sock, name, gateway, all, None).map_err(what("route to the gateway"))?;
    add_route(&sock, name, unspecified, unspecified, Some(gateway))
        .map_err(what("route via the gateway"))?;
    forget_neighbour(&sock, name, gateway).map_err(what("forget the gateway's old link"))
}

/// `struct rtentry` (route(8)'s ioctl), as the kernel lays it out.
#[repr(C)]
struct RtEntry {
    pad1: libc::c_ulong,
    dst: [u8; 16],
    gateway: [u8; 16],
    genmask: [u8; 16],
    flags: libc::c_ushort,
    pad2: libc::c_short,
    pad3: libc::c_ulong,
    pad4: *mut libc::c_void,
    metric: libc::c_short,
    dev: *mut libc::c_char,
    mtu: libc::c_ulong,
    window: libc::c_ulong,
    irtt: libc::c_ushort,
}

/// A route to `dst`/`mask` out of `dev`, via `gateway` if given (else
/// on-link); one there already is fine.
fn add_route(
    sock: &OwnedFd,
    dev: &str,
    dst: std::net::Ipv4Addr,
    mask: std::net::Ipv4Addr,
    gateway: Option<std::net::Ipv4Addr>,
) -> io::Result<()> {
    const RTF_UP: libc::c_ushort = 0x1;
    const RTF_GATEWAY: libc::c_ushort = 0x2;
    const RTF_HOST: libc::c_ushort = 0x4;
    let dev = cstr(dev)?;
    let mut flags = RTF_UP;
    if gateway.is_some() {
        flags |= RTF_GATEWAY;
    }
    if mask == std::net::Ipv4Addr::BROADCAST {
        flags |= RTF_HOST;
    }
    let mut rt = RtEntry {
        pad1: 0,
        dst: sockaddr_in(dst),
        gateway: sockaddr_in(gateway.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED)),
        genmask: sockaddr_in(mask),
        flags,
        pad2: 0,
        pad3: 0,
        pad4: std::ptr::null_mut(),
        metric: 0,
        dev: dev.as_ptr().cast_mut(),
        mtu: 0,
        window: 0,
        irtt: 0,
    };
    // SAFETY: SIOCADDRT with a struct rtentry and a device name that
    // outlive the call.
    ioctl_unless(
        unsafe {
            libc::ioctl(
                sock.as_raw_fd(),
                libc::SIOCADDRT as _,
                &mut rt as *mut RtEntry,
            )
        },
        libc::EEXIST,
    )
}

/// An ioctl's result, where `fine` (the state asked for is there already)
/// is no error.
fn ioctl_unless(rc: libc::c_int, fine: libc::c_int) -> io::Result<()> {
    match check(rc) {
        Err(e) if e.raw_os_error() == Some(fine) => Ok(()),
        r => r.map(drop),
    }
}

/// Drop the ARP entry of `addr` on `dev` (none is fine).
fn forget_neighbour(sock: &OwnedFd, dev: &str, addr: std::net::Ipv4Addr) -> io::Result<()> {
    /// `struct arpreq`.
    #[repr(C)]
    struct ArpReq {
        pa: [u8; 16],
        ha: [u8; 16],
        flags: libc::c_int,
        netmask: [u8; 16],
        dev: [u8; 16],
    }
    let mut req = ArpReq {
        pa: sockaddr_in(addr),
        ha: [0; 16],
        flags: 0,
        netmask: [0; 16],
        dev: IfReq::new(dev)?.name,
    };
    // SAFETY: SIOCDARP with a struct arpreq that outlives the call.
    ioctl_unless(
        unsafe {
            libc::ioctl(
                sock.as_raw_fd(),
                libc::SIOCDARP as _,
                &mut req as *mut ArpReq,
            )
        },
        libc::ENXIO,
    )
}
