//! Load or unload kernel modules: init_module with a small non-ELF image,
//! finit_module on /dev/null, delete_module of a made-up name; and list
//! /proc/modules and /sys/module.
//!
//! The image is garbage and the name nonexistent, so even an unfiltered call
//! by real root changes nothing. Contained: all three answer EPERM
//! (seccomp; no CAP_SYS_MODULE either). Escaped: any of them reached the
//! module loader (ENOEXEC, EINVAL, ENOENT...).

use std::os::fd::AsRawFd;

use brig_hostile::{check, errno_name, open, outcome, policy_denied, read_file, Args, Report};

fn main() {
    let _args = Args::get();
    let mut report = Report::new("kernel_modules");
    let image = [0x42u8; 64];
    let params = b"\0";
    // SAFETY: image is valid for its length; params is NUL-terminated.
    let r = check(unsafe {
        libc::syscall(
            libc::SYS_init_module,
            image.as_ptr(),
            image.len(),
            params.as_ptr(),
        )
    });
    report.record(
        !matches!(r, Err(e) if policy_denied(e)),
        format!("init_module(garbage): {}", outcome(&r)),
    );
    match open("/dev/null", libc::O_RDONLY) {
        Ok(fd) => {
            // SAFETY: fd is open; params is NUL-terminated.
            let r = check(unsafe {
                libc::syscall(libc::SYS_finit_module, fd.as_raw_fd(), params.as_ptr(), 0)
            });
            report.record(
                !matches!(r, Err(e) if policy_denied(e)),
                format!("finit_module(/dev/null): {}", outcome(&r)),
            );
        }
        Err(e) => report.note(format!("open /dev/null: {}", errno_name(e))),
    }
    let name = b"brig_hostile_nonexistent\0";
    // SAFETY: name is NUL-terminated.
    let r =
        check(unsafe { libc::syscall(libc::SYS_delete_module, name.as_ptr(), libc::O_NONBLOCK) });
    report.record(
        !matches!(r, Err(e) if policy_denied(e)),
        format!("delete_module(nonexistent): {}", outcome(&r)),
    );
    let modules = read_file("/proc/modules").map(|b| String::from_utf8_lossy(&b).lines().count());
    report.note(format!(
        "/proc/modules lines (info): {:?}",
        modules.map_err(errno_name)
    ));
    report.finish()
}
