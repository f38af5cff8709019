//! Climb above the sandbox's root with `..`: stat("/.."), long `../../..`
//! chains, chdir("..") loops, openat(fd, "..") from an O_PATH handle on `/`,
//! and `..` out of /tmp and /proc.
//!
//! Contained: every walk ends at the sandbox's root (same device and inode
//! as `/`) and no host canary is reachable. Escaped: any walk ends
//! somewhere else, or a canary is read.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use brig_hostile::{cstr, dev_ino, errno, errno_name, open, read_file, Args, Report};

fn fstat_di(fd: i32) -> Result<(u64, u64), i32> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return Err(errno());
    }
    Ok((st.st_dev, st.st_ino))
}

fn main() {
    let args = Args::get();
    let canary = args.canary();
    let mut report = Report::new("dotdot_traversal");
    let root = dev_ino("/").expect("stat /");
    let deep = "/..".repeat(40);
    for p in [
        "/..".to_string(),
        deep.clone(),
        "/./../../.".into(),
        "/tmp/../../..".into(),
        "/proc/../..".into(),
        "/dev/../../..".into(),
        "/usr/../../../..".into(),
    ] {
        match dev_ino(&p) {
            Ok(di) => report.record(
                di != root,
                format!(
                    "stat {} -> {}",
                    if p.len() > 30 { "/.. x40" } else { &p },
                    if di == root {
                        "sandbox root"
                    } else {
                        "a different directory"
                    }
                ),
            ),
            Err(e) => report.note(format!("stat {p}: {}", errno_name(e))),
        }
    }

    // chdir("..") many times from /tmp, then look at ".".
    let tmp = cstr("/tmp");
    let up = cstr("..");
    // SAFETY: NUL-terminated paths.
    unsafe {
        libc::chdir(tmp.as_ptr());
        for _ in 0..64 {
            libc::chdir(up.as_ptr());
        }
    }
    match dev_ino(".") {
        Ok(di) => report.record(
            di != root,
            format!(
                "64x chdir(..) from /tmp -> {}",
                if di == root {
                    "sandbox root"
                } else {
                    "a different directory"
                }
            ),
        ),
        Err(e) => report.note(format!("stat . : {}", errno_name(e))),
    }

    // openat(fd, "..") repeatedly from an O_PATH handle on /.
    match open("/", libc::O_PATH | libc::O_DIRECTORY) {
        Ok(mut fd) => {
            for _ in 0..64 {
                // SAFETY: fd is open; the path is a NUL-terminated literal.
                let next = unsafe {
                    libc::openat(
                        fd.as_raw_fd(),
                        up.as_ptr(),
                        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
                    )
                };
                if next < 0 {
                    report.note(format!("openat(..): {}", errno_name(errno())));
                    break;
                }
                // SAFETY: next was just returned by openat.
                fd = unsafe { OwnedFd::from_raw_fd(next) };
            }
            match fstat_di(fd.as_raw_fd()) {
                Ok(di) => report.record(
                    di != root,
                    format!(
                        "64x openat(fd, ..) -> {}",
                        if di == root {
                            "sandbox root"
                        } else {
                            "a different directory"
                        }
                    ),
                ),
                Err(e) => report.note(format!("fstat: {}", errno_name(e))),
            }
        }
        Err(e) => report.note(format!("open / O_PATH: {}", errno_name(e))),
    }

    for file in [
        format!("{deep}/root/{canary}"),
        format!("/../../var/tmp/{canary}"),
        format!("/tmp/../../root/{canary}"),
    ] {
        if let Ok(b) = read_file(&file) {
            report.escape(format!(
                "read host canary via {} ({} bytes)",
                &file[file.len().saturating_sub(40)..],
                b.len()
            ));
        }
    }
    report.finish()
}
