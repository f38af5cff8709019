//! Inject keystrokes into a terminal with ioctl(TIOCSTI) — if brig handed
//! the user's terminal to the sandbox, this would type commands into the
//! user's shell after the sandbox exits — and take over the console with
//! TIOCLINUX. Tries fds 0, 1, 2 and /dev/tty.
//!
//! Contained: every ioctl answers EPERM (seccomp). Escaped: a character was
//! injected or TIOCLINUX worked. ENOTTY/EBADF/EIO mean the call reached the
//! kernel but found no terminal: harmless, reported as a filter gap.

use std::os::fd::AsRawFd;

use brig_hostile::{errno, errno_name, open, Args, Report};

fn main() {
    let _args = Args::get();
    let mut report = Report::new("tiocsti");
    let tty = open("/dev/tty", libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK);
    let mut fds = vec![("stdin", 0), ("stdout", 1), ("stderr", 2)];
    if let Ok(t) = &tty {
        fds.push(("/dev/tty", t.as_raw_fd()));
    } else if let Err(e) = &tty {
        report.note(format!("open /dev/tty: {}", errno_name(*e)));
    }
    let mut gaps = Vec::new();
    for (name, fd) in fds {
        let c = b'#';
        // SAFETY: fd is 0..2 or our open tty; c is a valid byte.
        let r = unsafe { libc::ioctl(fd, libc::TIOCSTI, &c) };
        if r == 0 {
            report.escape(format!("TIOCSTI injected a character into {name}"));
        } else {
            let e = errno();
            if e == libc::EPERM {
                report.note(format!("TIOCSTI {name}: EPERM"));
            } else {
                gaps.push(format!("TIOCSTI {name}: {}", errno_name(e)));
            }
        }
        // TIOCLINUX subcode 12 (get shift state) is read-only on a real console.
        let sub = 12u8;
        // SAFETY: as above.
        let r = unsafe { libc::ioctl(fd, 0x541c, &sub) };
        if r == 0 {
            report.escape(format!("TIOCLINUX worked on {name}"));
        } else if errno() != libc::EPERM {
            gaps.push(format!("TIOCLINUX {name}: {}", errno_name(errno())));
        }
    }
    if !gaps.is_empty() {
        report.note(format!(
            "reached the kernel without a terminal to abuse (seccomp gap, harmless here): {}",
            gaps.join(", ")
        ));
    }
    report.finish()
}
