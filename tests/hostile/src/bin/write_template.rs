//! Write into the template: create /usr/bin/brig-hostile-x and
//! /etc/brig-hostile-x, open /etc/passwd and the C library for writing,
//! chmod and set an xattr on /etc/passwd, and remount /usr read-write.
//!
//! With `--template host` the template is the host's own /usr and /etc, so
//! every attempt must fail (EROFS, EACCES, EPERM); the program never writes
//! a byte to a host file, and removes anything it managed to create.
//! Escaped: any attempt succeeded. With `--template dir` writes are expected
//! to land in the sandbox's private upper layer; the program appends a
//! marker line to /etc/passwd and creates /usr/bin/brig-hostile-x, and the
//! harness checks that the template directory on the host is unchanged.

use std::io::Write as _;

use brig_hostile::{cstr, errno, errno_name, io_errno, open, open_mode, Args, Report, CANARY};

fn main() {
    let args = Args::get();
    let host = args.template().as_deref() != Some("dir");
    let mut report = Report::new("write_template");

    for path in [
        "/usr/bin/brig-hostile-x",
        "/etc/brig-hostile-x",
        "/usr/lib/brig-hostile-x",
    ] {
        match open_mode(path, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o755) {
            Ok(fd) => {
                drop(fd);
                if host {
                    let _ = std::fs::remove_file(path);
                    report.escape(format!(
                        "created {path} in the host template (removed again)"
                    ));
                } else {
                    report.note(format!(
                        "created {path} (dir template: private upper layer)"
                    ));
                }
            }
            Err(e) => report.note(format!("create {path}: {}", errno_name(e))),
        }
    }
    match std::fs::create_dir("/usr/brig-hostile-dir") {
        Ok(()) if host => {
            let _ = std::fs::remove_dir("/usr/brig-hostile-dir");
            report.escape("mkdir /usr/brig-hostile-dir in the host template (removed again)");
        }
        Ok(()) => report.note("mkdir /usr/brig-hostile-dir: ok (upper layer)"),
        Err(e) => report.note(format!(
            "mkdir /usr/brig-hostile-dir: {}",
            errno_name(io_errno(&e))
        )),
    }

    let libc_paths = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "/bin/sh",
        "/usr/bin/env",
    ];
    for path in ["/etc/passwd"].iter().chain(libc_paths.iter()) {
        match open(path, libc::O_WRONLY | libc::O_APPEND) {
            Ok(fd) if host => {
                // Never write: closing without a byte leaves the host file as it was.
                drop(fd);
                report.escape(format!("opened host {path} for writing (nothing written)"));
            }
            Ok(fd) if *path == "/etc/passwd" => {
                let mut f = std::fs::File::from(fd);
                let r = f.write_all(
                    format!("{CANARY}:x:4242:4242::/nonexistent:/bin/false\n").as_bytes(),
                );
                report.note(format!("appended a marker to /etc/passwd: {r:?} (upper layer; harness checks the template)"));
            }
            Ok(_) => report.note(format!("opened {path} for writing (upper layer)")),
            Err(e) if e == libc::ENOENT => {}
            Err(e) => report.note(format!("open {path} for writing: {}", errno_name(e))),
        }
    }

    let passwd = cstr("/etc/passwd");
    // Mode 0644 is what /etc/passwd has everywhere; chmod to the same mode changes nothing.
    // SAFETY: NUL-terminated path.
    let r = unsafe { libc::chmod(passwd.as_ptr(), 0o644) };
    let chmod = if r == 0 { Ok(()) } else { Err(errno()) };
    report.record(
        host && chmod.is_ok(),
        format!("chmod 0644 /etc/passwd: {}", brig_hostile::outcome(&chmod)),
    );

    let (name, value) = (cstr("user.brig-hostile"), b"1");
    // SAFETY: NUL-terminated name, value pointer and length match.
    let r = unsafe {
        libc::setxattr(
            passwd.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        // SAFETY: as above.
        unsafe { libc::removexattr(passwd.as_ptr(), name.as_ptr()) };
        report.record(
            host,
            "setxattr user.brig-hostile on /etc/passwd: ok (removed again)",
        );
    } else {
        report.note(format!("setxattr on /etc/passwd: {}", errno_name(errno())));
    }

    let usr = cstr("/usr");
    // SAFETY: NUL-terminated path, NULL source/type/data are allowed for a remount.
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            usr.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND,
            std::ptr::null(),
        )
    };
    let remount = if r == 0 { Ok(()) } else { Err(errno()) };
    report.record(
        remount.is_ok(),
        format!(
            "remount /usr read-write: {}",
            brig_hostile::outcome(&remount)
        ),
    );
    report.finish()
}
