//! Get a userfaultfd, the primitive that turns kernel race conditions into
//! reliable exploits (it lets user space stall a kernel copy mid-way):
//! userfaultfd(0), userfaultfd(UFFD_USER_MODE_ONLY), and /dev/userfaultfd.
//!
//! Contained: the syscall answers EPERM (seccomp) and /dev/userfaultfd
//! does not exist in the sandbox. Escaped: a userfaultfd was obtained (it is
//! closed at once; nothing is registered).

use brig_hostile::{check, open, outcome, Args, Report};

fn main() {
    let _args = Args::get();
    let mut report = Report::new("userfaultfd");
    for (what, flags) in [
        ("userfaultfd(O_CLOEXEC)", libc::O_CLOEXEC),
        ("userfaultfd(UFFD_USER_MODE_ONLY)", libc::O_CLOEXEC | 1),
    ] {
        // SAFETY: integer flags only.
        let r = check(unsafe { libc::syscall(libc::SYS_userfaultfd, flags) });
        if let Ok(fd) = r {
            // SAFETY: fd was just returned.
            unsafe { libc::close(fd as i32) };
        }
        report.record(r.is_ok(), format!("{what}: {}", outcome(&r)));
    }
    let dev = open("/dev/userfaultfd", libc::O_RDWR);
    report.record(
        dev.is_ok(),
        format!("open /dev/userfaultfd: {}", outcome(&dev)),
    );
    report.finish()
}
