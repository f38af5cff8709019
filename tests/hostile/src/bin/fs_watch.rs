//! Watch the host through the template: fanotify (which can see and even
//! block every file access on a mount or the whole filesystem), and
//! inotify on the host template's directories (/usr/bin, /etc), then as
//! many inotify watches as the kernel grants (kernel memory each).
//!
//! Contained: fanotify_init fails (it needs CAP_SYS_ADMIN of the host's
//! user namespace), and the inotify watches stop at the per-user limit of
//! the sandbox's own uid (`max_user_watches`, ENOSPC) before `--cap`
//! (default 2000000). inotify on the host template's directories is
//! allowed — a sandbox can see that the host changed its /usr, as a
//! Docker container with a bind mount can — and is reported for
//! information. Escaped: fanotify worked, or the cap was reached.

use brig_hostile::{cstr, errno, errno_name, Args, Report};

fn main() {
    let args = Args::get();
    let mut report = Report::new("fs_watch");
    let cap = args.u64_value("--cap").unwrap_or(2_000_000) as usize;
    // SAFETY: fanotify_init with integer arguments.
    let fan = unsafe { libc::fanotify_init(libc::FAN_CLASS_NOTIF, libc::O_RDONLY as u32) };
    report.record(
        fan >= 0,
        format!(
            "fanotify_init: {}",
            if fan >= 0 {
                "ok".into()
            } else {
                errno_name(errno())
            }
        ),
    );
    // SAFETY: inotify_init1 with a flag.
    let ino = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    if ino < 0 {
        report.note(format!("inotify_init1: {}", errno_name(errno())));
        report.finish()
    }
    for dir in ["/usr/bin", "/etc"] {
        let p = cstr(dir);
        // SAFETY: a NUL-terminated path.
        let w = unsafe { libc::inotify_add_watch(ino, p.as_ptr(), libc::IN_ALL_EVENTS) };
        report.note(format!(
            "inotify on {dir}: {}",
            if w >= 0 {
                "allowed (information)".into()
            } else {
                errno_name(errno())
            }
        ));
    }
    // Many watches: one directory per watch, in the writable /tmp.
    let base = "/tmp/brig-hostile-watch";
    let _ = std::fs::create_dir_all(base);
    let mut n = 0usize;
    let mut stop = String::from("cap reached");
    while n < cap {
        let d = format!("{base}/{n}");
        if let Err(e) = std::fs::create_dir(&d) {
            stop = format!("mkdir: {e}");
            break;
        }
        let p = cstr(&d);
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::inotify_add_watch(ino, p.as_ptr(), libc::IN_CREATE) } < 0 {
            stop = errno_name(errno());
            break;
        }
        n += 1;
    }
    report.record(n >= cap, format!("{n} inotify watches, then {stop}"));
    report.finish()
}
