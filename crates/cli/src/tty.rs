//! Terminal plumbing for `brig run` and `brig exec -it`: a signalfd for signals to brig, raw
//! mode for the caller's terminal, and a non-blocking forwarder between the
//! caller's stdin/stdout and the sandbox's pty master.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use anyhow::Context;

/// Signals delivered through a descriptor instead of handlers.
#[derive(Debug)]
pub struct SignalFd {
    fd: OwnedFd,
}

impl SignalFd {
    /// Block `signals` for this thread (and so for children until they
    /// reset their mask) and receive them on a descriptor.
    pub fn new(signals: &[libc::c_int]) -> anyhow::Result<Self> {
        // SAFETY: sigset_t is plain old data; it is initialised by
        // sigemptyset before use.
        let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointers to our sigset; the signal numbers are valid.
        let fd = unsafe {
            libc::sigemptyset(&mut set);
            for s in signals {
                libc::sigaddset(&mut set, *s);
            }
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("create a signalfd");
        }
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(SignalFd { fd })
    }

    pub fn fd(&self) -> RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// The pending signal, if poll said the descriptor is readable.
    pub fn read_ready(&self, revents: libc::c_short) -> Option<libc::c_int> {
        if revents == 0 {
            return None;
        }
        // SAFETY: signalfd_siginfo is plain old data.
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: reading exactly one siginfo into a stack struct.
        let n = unsafe {
            libc::read(
                self.fd(),
                (&mut info as *mut libc::signalfd_siginfo).cast(),
                size,
            )
        };
        (n == size as isize).then_some(info.ssi_signo as libc::c_int)
    }
}

/// The caller's terminal in raw mode, restored on drop.
#[derive(Debug)]
pub struct RawTerminal {
    fd: RawFd,
    saved: libc::termios,
}

impl RawTerminal {
    /// `None` when `fd` is not a terminal (output piped, CI).
    pub fn enter(fd: RawFd) -> Option<Self> {
        // SAFETY: termios is plain old data, filled by tcgetattr.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd and out-pointer.
        if unsafe { libc::isatty(fd) } != 1 || unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return None;
        }
        let mut raw = saved;
        // SAFETY: raw is a valid termios copy.
        unsafe {
            libc::cfmakeraw(&mut raw);
            libc::tcsetattr(fd, libc::TCSANOW, &raw);
        }
        Some(RawTerminal { fd, saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restoring the attributes we saved on the same fd.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// The caller's terminals that a sandbox is handed as they are (`brig run`
/// without `-t` passes its stdout and stderr, a terminal in an
/// interactive shell): their state before the sandbox, put back on drop.
/// A process may change its own terminal (TCSETS, TIOCSWINSZ, TIOCEXCL,
/// stopping output with TCOOFF); once the sandbox has ended, none of that
/// may stay with the user's shell. (TIOCSTI and TIOCSETD never reach the
/// terminal: the seccomp filter refuses them.)
#[derive(Debug)]
pub struct CallerTerminals {
    saved: Vec<(RawFd, libc::termios, libc::winsize)>,
}

impl CallerTerminals {
    /// Note the state of each of stdin, stdout and stderr that is a
    /// terminal (each terminal once).
    pub fn save() -> Self {
        let mut saved: Vec<(RawFd, libc::termios, libc::winsize)> = Vec::new();
        let mut seen = Vec::new();
        for fd in [0, 1, 2] {
            // SAFETY: termios, winsize and stat are plain old data filled by
            // the calls on a standard descriptor.
            unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                let mut t: libc::termios = std::mem::zeroed();
                let mut ws: libc::winsize = std::mem::zeroed();
                if libc::isatty(fd) != 1
                    || libc::fstat(fd, &mut st) != 0
                    || libc::tcgetattr(fd, &mut t) != 0
                    || seen.contains(&(st.st_dev, st.st_rdev))
                {
                    continue;
                }
                libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws);
                seen.push((st.st_dev, st.st_rdev));
                saved.push((fd, t, ws));
            }
        }
        CallerTerminals { saved }
    }
}

impl Drop for CallerTerminals {
    fn drop(&mut self) {
        for (fd, t, ws) in &self.saved {
            // SAFETY: restoring what we saved, on the same descriptors.
            unsafe {
                libc::ioctl(*fd, libc::TIOCNXCL);
                libc::tcflow(*fd, libc::TCOON);
                libc::tcsetattr(*fd, libc::TCSANOW, t);
                let mut now: libc::winsize = std::mem::zeroed();
                if libc::ioctl(*fd, libc::TIOCGWINSZ, &mut now) == 0
                    && (now.ws_row, now.ws_col, now.ws_xpixel, now.ws_ypixel)
                        != (ws.ws_row, ws.ws_col, ws.ws_xpixel, ws.ws_ypixel)
                {
                    libc::ioctl(*fd, libc::TIOCSWINSZ, ws);
                }
            }
        }
    }
}

/// The caller's terminal with echo off (a secret being typed), restored on
/// drop.
#[derive(Debug)]
pub struct NoEcho {
    fd: RawFd,
    saved: libc::termios,
}

impl NoEcho {
    /// `None` when `fd` is not a terminal.
    pub fn enter(fd: RawFd) -> Option<Self> {
        // SAFETY: termios is plain old data, filled by tcgetattr.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd and out-pointer.
        if unsafe { libc::isatty(fd) } != 1 || unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return None;
        }
        let mut quiet = saved;
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: a valid termios copy for the same fd.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) };
        Some(NoEcho { fd, saved })
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        // SAFETY: restoring the attributes we saved on the same fd.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// Copies stdin → pty master and pty master → stdout without ever blocking
/// the supervise loop: bytes the master cannot take yet wait in a small
/// buffer, and stdin is not read while it is full.
#[derive(Debug)]
pub struct Forwarder {
    master: RawFd,
    pending: Vec<u8>,
    stdin_open: bool,
}

const CHUNK: usize = 16 * 1024;

impl Forwarder {
    pub fn new(master: RawFd) -> anyhow::Result<Self> {
        set_nonblocking(master).context("configure the terminal")?;
        Ok(Forwarder {
            master,
            pending: Vec::new(),
            stdin_open: true,
        })
    }

    /// The descriptors to poll: master (always), stdin (while the buffer
    /// has room), master for writing (while bytes are pending).
    pub fn poll_fds(&self) -> Vec<libc::pollfd> {
        let mut v = vec![libc::pollfd {
            fd: self.master,
            events: libc::POLLIN,
            revents: 0,
        }];
        if self.stdin_open && self.pending.is_empty() {
            v.push(libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        if !self.pending.is_empty() {
            v.push(libc::pollfd {
                fd: self.master,
                events: libc::POLLOUT,
                revents: 0,
            });
        }
        v
    }

    pub fn pump(&mut self, fds: &[libc::pollfd]) {
        for p in fds {
            if p.revents == 0 {
                continue;
            }
            if p.fd == self.master && p.events == libc::POLLIN {
                self.copy_out();
            } else if p.fd == 0 {
                let mut buf = [0u8; CHUNK];
                // SAFETY: reading into a stack buffer.
                let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    self.stdin_open = false;
                } else {
                    self.pending.extend_from_slice(&buf[..n as usize]);
                }
            }
        }
        self.flush_pending();
    }

    fn flush_pending(&mut self) {
        while !self.pending.is_empty() {
            // SAFETY: writing from a live buffer.
            let n = unsafe {
                libc::write(
                    self.master,
                    self.pending.as_ptr().cast(),
                    self.pending.len(),
                )
            };
            if n <= 0 {
                return;
            }
            self.pending.drain(..n as usize);
        }
    }

    /// Master → stdout until the master has nothing more right now.
    fn copy_out(&mut self) -> bool {
        let mut buf = [0u8; CHUNK];
        loop {
            // SAFETY: reading into a stack buffer.
            let n = unsafe { libc::read(self.master, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return n == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN);
            }
            write_all(1, &buf[..n as usize]);
        }
    }

    /// After the sandbox ended: print what the terminal still holds.
    pub fn drain(&mut self) {
        self.copy_out();
    }

    /// Give the sandbox's terminal the caller's window size.
    pub fn sync_window_size(&self) {
        // SAFETY: winsize is plain old data; ioctls on our descriptors.
        unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            for fd in [0, 1, 2] {
                if libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) == 0 {
                    libc::ioctl(self.master, libc::TIOCSWINSZ, &ws);
                    return;
                }
            }
        }
    }
}

/// The caller's window size as (rows, cols), from whichever of stdin,
/// stdout and stderr is a terminal; `None` if none is.
pub fn window_size() -> Option<(u16, u16)> {
    // SAFETY: winsize is plain old data, filled by the ioctl.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    for fd in [0, 1, 2] {
        // SAFETY: TIOCGWINSZ on a standard descriptor into our winsize.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
            return Some((ws.ws_row, ws.ws_col));
        }
    }
    None
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Write everything to a (blocking) descriptor such as stdout.
fn write_all(fd: RawFd, mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: writing from a live slice.
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            return;
        }
        buf = &buf[n as usize..];
    }
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: libc::c_int) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// `-t` reads the keyboard: with stdin a pipe or a file there is none, and
/// the remote terminal would never see an end of input (a `cat` would
/// wait forever). Refuse, as docker does.
pub fn require_terminal_input() -> anyhow::Result<()> {
    if !is_terminal(0) {
        anyhow::bail!(
            "the input device is not a TTY: -t needs a terminal on stdin; drop -t (with -i to \
             pass piped input through)"
        );
    }
    Ok(())
}
