//! Exhaust file descriptors: raise RLIMIT_NOFILE's hard limit, then open
//! /dev/null until the kernel refuses, to see whether one sandbox can eat
//! the host's global file table.
//!
//! Contained: the hard limit is at most brig's 65536 (the host's own when
//! lower), cannot be raised (no CAP_SYS_RESOURCE) and
//! opening stops with EMFILE at the per-process limit. Escaped: the hard
//! limit was raised, or opening stopped with ENFILE (the host-wide table
//! ran out). Destructive: needs `--armed` and a user namespace.

use brig_hostile::{errno, errno_name, guard_destructive, Args, Report};

fn main() {
    let args = Args::get();
    guard_destructive("fd_exhaust", &args);
    let mut report = Report::new("fd_exhaust");
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid out-pointer.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let (soft, hard) = (lim.rlim_cur, lim.rlim_max);
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open").unwrap_or_default();
    // brig's bound: the host's hard limit, at most 65536.
    report.record(
        hard > 65536,
        format!(
            "RLIMIT_NOFILE soft {soft} hard {hard} (brig's bound: 65536); fs.nr_open {}",
            nr_open.trim()
        ),
    );
    let want = libc::rlimit {
        rlim_cur: 1 << 20,
        rlim_max: 1 << 20,
    };
    // SAFETY: want is a valid rlimit.
    let r = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) };
    if r == 0 && hard < (1 << 20) {
        report.escape(format!(
            "raised the hard RLIMIT_NOFILE from {hard} to {}",
            1 << 20
        ));
    } else {
        report.note(format!(
            "raise hard limit to 1048576: {}",
            if r == 0 {
                "ok (was already that high)".into()
            } else {
                errno_name(errno())
            }
        ));
        let soft_to_hard = libc::rlimit {
            rlim_cur: hard,
            rlim_max: hard,
        };
        // SAFETY: valid rlimit; raising soft up to hard is always allowed.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft_to_hard) };
    }
    let path = brig_hostile::cstr("/dev/null");
    let mut opened = 0u64;
    let stop = loop {
        // SAFETY: NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY) };
        if fd < 0 {
            break errno();
        }
        opened += 1;
        if opened >= 4 << 20 {
            break 0;
        }
    };
    if stop == libc::ENFILE {
        report.escape(format!(
            "opened {opened} fds, then ENFILE: the host-wide file table is exhausted"
        ));
    } else {
        report.note(format!(
            "opened {opened} fds, then {}",
            if stop == 0 {
                "stopped at 4M".into()
            } else {
                errno_name(stop)
            }
        ));
    }
    report.finish()
}
