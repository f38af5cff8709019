//! Abuse file descriptors brig might have leaked into the sandbox: list
//! /proc/self/fd, describe every fd, and for any beyond 0-2 check whether
//! it points outside the sandbox (a directory fd allows fchdir + `..` out of
//! the root; a socket or pipe may reach brig itself).
//!
//! Contained: only fds 0, 1 and 2 are open (they are the harness's pipes or
//! a pty). Escaped: any other fd was inherited; the report says what it is
//! and, for a directory, where `..` from it leads.

use brig_hostile::{cstr, dev_ino, errno, readlink, Args, Report};

fn describe(fd: i32) -> (String, u32) {
    let target = readlink(&format!("/proc/self/fd/{fd}"))
        .unwrap_or_else(|e| format!("? ({})", brig_hostile::errno_name(e)));
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    let mode = if unsafe { libc::fstat(fd, &mut st) } == 0 {
        st.st_mode & libc::S_IFMT
    } else {
        0
    };
    (target, mode)
}

fn main() {
    let _args = Args::get();
    let mut report = Report::new("inherited_fds");
    let names: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    // read_dir's own fd is closed again by now: keep the fds that are still open.
    // SAFETY: F_GETFD only queries flags.
    let open: Vec<i32> = names
        .into_iter()
        .filter(|fd| unsafe { libc::fcntl(*fd, libc::F_GETFD) } >= 0)
        .collect();
    let root = dev_ino("/").ok();
    for fd in open {
        let (target, mode) = describe(fd);
        let kind = match mode {
            libc::S_IFDIR => "directory",
            libc::S_IFREG => "file",
            libc::S_IFSOCK => "socket",
            libc::S_IFIFO => "pipe",
            libc::S_IFCHR => "char device",
            libc::S_IFBLK => "block device",
            _ => "other",
        };
        if fd <= 2 {
            report.note(format!("fd {fd}: {kind} {target}"));
            continue;
        }
        let mut what = format!("inherited fd {fd}: {kind} {target}");
        if mode == libc::S_IFDIR {
            let up = cstr("..");
            // SAFETY: fd is an open directory; ".." is NUL-terminated.
            unsafe {
                libc::fchdir(fd);
                for _ in 0..64 {
                    libc::chdir(up.as_ptr());
                }
            }
            let top = dev_ino(".").ok();
            what.push_str(&format!(
                "; fchdir + 64x .. ends at {}",
                if top == root {
                    "the sandbox root"
                } else {
                    "A DIFFERENT ROOT"
                }
            ));
            let slash = cstr("/");
            // SAFETY: NUL-terminated path.
            unsafe { libc::chdir(slash.as_ptr()) };
        }
        let _ = errno();
        report.escape(what);
    }
    report.finish()
}
