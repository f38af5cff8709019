//! Attack the terminal the sandbox was given: inject keystrokes with
//! ioctl(TIOCSTI) — if brig handed the user's terminal to the sandbox, they
//! would be typed into the user's shell after the sandbox exits — take
//! over the console with TIOCLINUX or TIOCCONS, attach line disciplines
//! with TIOCSETD (n_slip, n_hdlc, n_gsm: module autoload and rarely used
//! kernel code), then leave the terminal as damaged as a terminal can be
//! left: TCSETS (no echo, no output processing, no signals, 50 baud),
//! TIOCSWINSZ, TIOCEXCL and output stopped (TCXONC TCOOFF). Tries fds 0, 1,
//! 2 and /dev/tty.
//!
//! The harness runs it three ways besides the corpus's piped run
//! (`crates/cli/tests/hostile.rs`, `terminal_*` tests): `brig run -t`
//! (the sandbox's own pty, relayed by brig to a host pty the harness holds
//! as brig's controlling terminal), `brig run` with that host pty as stdout
//! and stderr (`--host-tty DEV:RDEV` names it: the program reports finding
//! it), and `brig exec -t` (the daemon's `/pty` session). What the program
//! sees is only half; the harness checks the host pty afterwards: nothing
//! in its input queue, the same termios, window size, line discipline, no
//! exclusive mode, output flowing.
//!
//! Contained: TIOCSTI, TIOCLINUX and TIOCSETD answer EPERM from the seccomp
//! filter (on the sandbox's own controlling terminal the kernel would allow
//! TIOCSTI: `dev.tty.legacy_tiocsti` is 1 on this kernel and the sandbox's
//! pty is its controlling tty; on a terminal that is not, the kernel says
//! EPERM too), TIOCCONS EPERM from the kernel (CAP_SYS_ADMIN of the initial
//! user namespace). The damaging calls on the program's own terminal
//! succeed — it is its terminal — and are notes; they are judged on the
//! host side. Escaped: a character was injected, a line discipline or the
//! console taken. ENOTTY/EBADF/EIO mean the call reached the kernel but
//! found no terminal: harmless, reported as a filter gap.

use std::os::fd::AsRawFd;

use brig_hostile::{errno, errno_name, open, Args, Report};

/// Line disciplines worth loading: N_SLIP, N_HDLC, N_GSM0710.
const LDISCS: &[(libc::c_int, &str)] = &[(1, "n_slip"), (13, "n_hdlc"), (21, "n_gsm")];
const TIOCLINUX: libc::c_ulong = 0x541c;

fn main() {
    let args = Args::get();
    let mut report = Report::new("tiocsti");
    let host_tty: Option<(u64, u64)> = args.value("--host-tty").and_then(|v| {
        let (d, r) = v.split_once(':')?;
        Some((d.parse().ok()?, r.parse().ok()?))
    });
    let tty = open("/dev/tty", libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK);
    let mut fds = vec![("stdin", 0), ("stdout", 1), ("stderr", 2)];
    if let Ok(t) = &tty {
        fds.push(("/dev/tty", t.as_raw_fd()));
    } else if let Err(e) = &tty {
        report.note(format!("open /dev/tty: {}", errno_name(*e)));
    }
    let mut gaps = Vec::new();
    let mut terminals = Vec::new();
    for &(name, fd) in &fds {
        // SAFETY: isatty only inspects the descriptor.
        if unsafe { libc::isatty(fd) } == 1 {
            terminals.push((name, fd));
            describe_terminal(&mut report, name, fd, host_tty);
        }
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
        let r = unsafe { libc::ioctl(fd, TIOCLINUX, &sub) };
        if r == 0 {
            report.escape(format!("TIOCLINUX worked on {name}"));
        } else if errno() != libc::EPERM {
            gaps.push(format!("TIOCLINUX {name}: {}", errno_name(errno())));
        }
    }
    if terminals.is_empty() {
        report.note("no terminal attached (piped run)");
    }
    for &(name, fd) in &terminals {
        line_disciplines(&mut report, &mut gaps, name, fd);
        // SAFETY: TIOCCONS takes no argument.
        let r = unsafe { libc::ioctl(fd, libc::TIOCCONS) };
        if r == 0 {
            report.escape(format!("TIOCCONS redirected the console to {name}"));
        } else {
            report.note(format!("TIOCCONS {name}: {}", errno_name(errno())));
        }
    }
    // Last: leave each terminal as broken as possible. Allowed on the
    // program's own terminal; the harness checks the host's afterwards.
    for &(name, fd) in &terminals {
        damage(&mut report, name, fd);
    }
    if !gaps.is_empty() {
        report.note(format!(
            "reached the kernel without a terminal to abuse (seccomp gap, harmless here): {}",
            gaps.join(", ")
        ));
    }
    // Stopping output would block the report itself: print it first, then
    // stop every terminal's output and exit (the harness checks that the
    // host's flows again).
    report.print();
    for &(_, fd) in &terminals {
        // SAFETY: tcflow on an open descriptor.
        unsafe { libc::tcflow(fd, libc::TCOOFF) };
    }
    // SAFETY: _exit ends the process at once.
    unsafe { libc::_exit(0) }
}

/// Which terminal `fd` is: the host's (named by the harness), or one of
/// the sandbox's own devpts.
fn describe_terminal(report: &mut Report, name: &str, fd: libc::c_int, host: Option<(u64, u64)>) {
    // SAFETY: an all-zero stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open; st is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return;
    }
    let ctty = {
        let mut pgrp: libc::pid_t = 0;
        // SAFETY: TIOCGPGRP writes one pid_t.
        unsafe { libc::ioctl(fd, libc::TIOCGPGRP, &mut pgrp) == 0 }
    };
    let whose = if host == Some((st.st_dev, st.st_rdev)) {
        "the caller's host terminal, passed through"
    } else {
        "a terminal of the sandbox's own devpts"
    };
    report.note(format!(
        "{name} is {whose} (rdev {}:{}{})",
        libc::major(st.st_rdev),
        libc::minor(st.st_rdev),
        if ctty {
            ", our controlling terminal"
        } else {
            ", not our controlling terminal"
        }
    ));
}

/// TIOCSETD to each interesting line discipline; the terminal must stay on
/// N_TTY.
fn line_disciplines(report: &mut Report, gaps: &mut Vec<String>, name: &str, fd: libc::c_int) {
    for &(ld, ld_name) in LDISCS {
        // SAFETY: TIOCSETD reads one int.
        let r = unsafe { libc::ioctl(fd, libc::TIOCSETD, &ld) };
        if r == 0 {
            report.escape(format!("TIOCSETD {ld_name} on {name} worked"));
            let n_tty: libc::c_int = 0;
            // SAFETY: as above; put N_TTY back.
            unsafe { libc::ioctl(fd, libc::TIOCSETD, &n_tty) };
        } else {
            let e = errno();
            if e == libc::EPERM {
                report.note(format!("TIOCSETD {ld_name} {name}: EPERM"));
            } else {
                gaps.push(format!("TIOCSETD {ld_name} {name}: {}", errno_name(e)));
            }
        }
    }
    let mut now: libc::c_int = -1;
    // SAFETY: TIOCGETD writes one int.
    if unsafe { libc::ioctl(fd, libc::TIOCGETD, &mut now) } == 0 && now != 0 {
        report.escape(format!("{name}'s line discipline is {now}, not N_TTY"));
    }
}

/// Change everything about the terminal a process may change on its own
/// terminal; each outcome is a note.
fn damage(report: &mut Report, name: &str, fd: libc::c_int) {
    let mut done = Vec::new();
    // SAFETY: termios is plain old data filled by tcgetattr.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    if unsafe { libc::tcgetattr(fd, &mut t) } == 0 {
        t.c_lflag &= !(libc::ECHO | libc::ICANON | libc::ISIG);
        t.c_oflag &= !libc::OPOST;
        t.c_iflag |= libc::IXOFF;
        // 50 baud (cfsetospeed does not link statically: set the bits).
        t.c_cflag = (t.c_cflag & !libc::CBAUD) | libc::B50;
        // SAFETY: as above.
        let r = unsafe { libc::tcsetattr(fd, libc::TCSANOW, &t) };
        done.push(format!("TCSETS: {}", ok_or_errno(r)));
    }
    let ws = libc::winsize {
        ws_row: 3,
        ws_col: 7,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize.
    let r = unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) };
    done.push(format!("TIOCSWINSZ: {}", ok_or_errno(r)));
    // SAFETY: TIOCEXCL takes no argument.
    let r = unsafe { libc::ioctl(fd, libc::TIOCEXCL) };
    done.push(format!("TIOCEXCL: {}", ok_or_errno(r)));
    report.note(format!("on {name}: {}", done.join(", ")));
}

fn ok_or_errno(r: libc::c_int) -> String {
    if r == 0 {
        "ok".into()
    } else {
        errno_name(errno())
    }
}
