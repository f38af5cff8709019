//! Inode exhaustion: create empty files in /tmp until the filesystem or the
//! memory limit refuses. Empty files take no blocks, so a size-limited tmpfs
//! does not stop them; each one still costs kernel memory.
//!
//! Contained: creation fails (ENOSPC from an inode limit, ENOMEM) or the
//! sandbox is killed by its memory limit (brig exits 137). Escaped: it
//! created `--cap N` files (default 300000) without being stopped.
//! Destructive: needs `--armed` and a user namespace.

use brig_hostile::{errno, errno_name, guard_destructive, Args, Report};

fn main() {
    let args = Args::get();
    guard_destructive("inode_fill", &args);
    let cap = args.u64_value("--cap").unwrap_or(300_000);
    let mut report = Report::new("inode_fill");
    let dir = "/tmp/brig-hostile-inodes";
    if let Err(e) = std::fs::create_dir_all(dir) {
        report.note(format!("mkdir {dir}: {e}"));
        report.finish();
    }
    let mut created = 0u64;
    while created < cap {
        let path = brig_hostile::cstr(&format!("{dir}/{created}"));
        // SAFETY: path is NUL-terminated.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            report.note(format!(
                "created {created} empty files, then {}",
                errno_name(errno())
            ));
            report.finish();
        }
        // SAFETY: fd was just opened.
        unsafe { libc::close(fd) };
        created += 1;
    }
    report.escape(format!(
        "created {created} empty files without hitting any limit"
    ));
    report.finish()
}
