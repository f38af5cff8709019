//! Memory beyond anonymous mmap, part 1: a memfd grown by writing 1 MiB
//! at a time (its pages are shmem, charged to the writer's memory cgroup).
//!
//! Contained: the memory limit stops it (the OOM killer ends the sandbox,
//! exit 137, or a write fails with ENOMEM/ENOSPC) before `--cap MIB`
//! (default 2048). Escaped: the cap was reached. Destructive: needs
//! `--armed` and a user namespace.

use brig_hostile::{errno, errno_name, guard_destructive, Args, Report};

fn memfd(report: &mut Report, cap: usize) {
    // SAFETY: a NUL-terminated name, no flags.
    let fd = unsafe { libc::memfd_create(c"brig-hostile".as_ptr(), 0) };
    if fd < 0 {
        report.note(format!("memfd_create: {}", errno_name(errno())));
        return;
    }
    let chunk = vec![0x5au8; 1 << 20];
    let mut total = 0usize;
    while total < cap {
        // SAFETY: chunk is valid for its length.
        let n = unsafe { libc::write(fd, chunk.as_ptr().cast(), chunk.len()) };
        if n <= 0 {
            report.note(format!(
                "memfd write stopped at {} MiB: {}",
                total >> 20,
                errno_name(errno())
            ));
            return;
        }
        total += n as usize;
    }
    report.escape(format!(
        "wrote {} MiB into a memfd without being stopped",
        total >> 20
    ));
}

fn main() {
    let args = Args::get();
    guard_destructive("memfd_bomb", &args);
    let mut report = Report::new("memfd_bomb");
    let cap = args.u64_value("--cap").unwrap_or(2048) as usize * (1 << 20);
    let threads_cap = args.u64_value("--cap-threads").unwrap_or(4096) as usize;
    let _ = (cap, threads_cap);
    memfd(&mut report, cap);
    report.finish()
}
