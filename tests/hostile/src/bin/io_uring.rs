//! Set up an io_uring, a large kernel attack surface that also bypasses
//! per-syscall seccomp filtering (operations submitted through the ring are
//! not system calls): io_uring_setup with 8 entries, plus io_uring_enter
//! and io_uring_register on fd -1.
//!
//! Contained: all three answer EPERM or ENOSYS (seccomp). Escaped:
//! io_uring_setup returned a ring (closed at once) or the others reached
//! the kernel (EBADF).

use brig_hostile::{check, outcome, policy_denied, Args, Report};

fn main() {
    let _args = Args::get();
    let mut report = Report::new("io_uring");
    // struct io_uring_params is 120 bytes; all zero asks for defaults.
    let mut params = [0u8; 120];
    // SAFETY: params is a writable io_uring_params-sized buffer.
    let r = check(unsafe { libc::syscall(libc::SYS_io_uring_setup, 8, params.as_mut_ptr()) });
    if let Ok(fd) = r {
        // SAFETY: fd was just returned.
        unsafe { libc::close(fd as i32) };
    }
    report.record(r.is_ok(), format!("io_uring_setup(8): {}", outcome(&r)));
    // SAFETY: fd -1 and NULL pointers.
    let r = check(unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            -1,
            0,
            0,
            0,
            std::ptr::null::<u8>(),
            0,
        )
    });
    report.record(
        !matches!(r, Err(e) if policy_denied(e)),
        format!("io_uring_enter(-1): {}", outcome(&r)),
    );
    // SAFETY: fd -1 and NULL pointers.
    let r = check(unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            -1,
            0,
            std::ptr::null::<u8>(),
            0,
        )
    });
    report.record(
        !matches!(r, Err(e) if policy_denied(e)),
        format!("io_uring_register(-1): {}", outcome(&r)),
    );
    let disabled =
        std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").unwrap_or_default();
    report.note(format!(
        "kernel.io_uring_disabled (info): {}",
        disabled.trim()
    ));
    report.finish()
}
