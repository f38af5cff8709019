//! Disk fill: write to the sandbox's writable root layer (`/`), to `/tmp`
//! and to `/dev/shm` until the filesystem refuses.
//!
//! Contained: each write stops with ENOSPC (or EFBIG/EDQUOT) after at most
//! `--limit-bytes` (plus slack for metadata rounding); the program deletes
//! its file before the next target. Escaped: a target took more than that
//! (without `--limit-bytes`: more than 4 GiB, where it stops writing).
//! Destructive: needs `--armed` and a user namespace.

use std::io::Write as _;

use brig_hostile::{errno_name, guard_destructive, Args, Report};

fn fill(path: &str, stop_at: u64) -> (u64, Result<(), i32>) {
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => return (0, Err(e.raw_os_error().unwrap_or(libc::EIO))),
    };
    let buf = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    while written < stop_at {
        match f.write(&buf) {
            Ok(0) => return (written, Err(libc::ENOSPC)),
            Ok(n) => written += n as u64,
            Err(e) => return (written, Err(e.raw_os_error().unwrap_or(libc::EIO))),
        }
    }
    (written, Ok(()))
}

fn main() {
    let args = Args::get();
    guard_destructive("disk_fill", &args);
    let limit = args.u64_value("--limit-bytes");
    // Rounding and metadata: allow 1/8 over plus 2 MiB before calling it an escape.
    let allowed = limit.map(|l| l + l / 8 + (2 << 20)).unwrap_or(4 << 30);
    let mut report = Report::new("disk_fill");
    let mut targets = args.positional();
    if targets.is_empty() {
        targets = vec!["/".to_string(), "/tmp".to_string(), "/dev/shm".to_string()];
    }
    for dir in targets {
        let path = format!("{}/brig-hostile-fill", dir.trim_end_matches('/'));
        let (written, end) = fill(&path, allowed + (1 << 20));
        let mib = written as f64 / (1 << 20) as f64;
        match end {
            Err(e) => {
                let stopped = format!(
                    "{dir}: wrote {written} bytes ({mib:.1} MiB), then {}",
                    errno_name(e)
                );
                report.record(written > allowed, stopped);
            }
            Ok(()) => report.escape(format!(
                "{dir}: wrote {written} bytes ({mib:.1} MiB) without any error"
            )),
        }
        let _ = std::fs::remove_file(&path);
    }
    report.finish()
}
