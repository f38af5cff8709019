//! Race the daemon's file API: while the harness uploads, downloads,
//! lists, renames, removes and watches paths under `/tmp/race/d`, this
//! program swaps `d` (and the file `d/f` inside it) in a tight loop with
//! `renameat2(RENAME_EXCHANGE)` for: a real directory, symlinks to `/`,
//! `/proc/1/root`, `/root` and `/var/tmp` (where the host keeps its
//! canaries), a FIFO it holds open for reading (so a non-blocking open for
//! writing succeeds), and a symlink to a device (`/dev/zero`); it also
//! tries to make a real device node there (mknod).
//!
//! `race --seconds N` prints a ready line, swaps for N seconds, then
//! reports. The harness (`crates/cli/tests/hostile.rs`, `file_api` tests)
//! judges: every request returned (none blocked on the FIFO), nothing of
//! the host was written or read (canary files unchanged, nothing new in the
//! host's `/`, `/root`, `/var/tmp`, no download carrying the canary), and
//! the daemon and sandbox still answer.
//!
//! Contained here: mknod of a device fails (EPERM: no device nodes in a
//! user namespace). Escaped: a file the API wrote appears with the host
//! canary's content, or this program finds a planted host canary.

use std::ffi::CString;
use std::time::{Duration, Instant};

use brig_hostile::{cstr, errno, errno_name, Args, Report, CANARY};

const BASE: &str = "/tmp/race";

fn main() {
    let args = Args::get();
    let mut report = Report::new("file_race");
    let seconds = args.u64_value("--seconds").unwrap_or(20);
    if let Err(e) = prepare() {
        report.note(format!("preparing {BASE}: {e}"));
        report.finish()
    }
    // A real device node where the API will look: refused in a user
    // namespace (and the overlay is nodev).
    let dev = cstr(&format!("{BASE}/dev"));
    // SAFETY: a valid path; makedev of /dev/mem's numbers.
    let r = unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 1)) };
    if r == 0 {
        report.escape("mknod made a character device (1,1) in the sandbox");
    } else {
        report.note(format!("mknod of a device: {}", errno_name(errno())));
    }
    // Keep both FIFOs open for reading (non-blocking), so that an open for
    // writing that lands on one succeeds instead of failing with ENXIO.
    let _readers: Vec<_> = ["fifo", "dfifo/f"]
        .iter()
        .filter_map(|f| {
            brig_hostile::open(
                &format!("{BASE}/cand-{f}"),
                libc::O_RDONLY | libc::O_NONBLOCK,
            )
            .ok()
        })
        .collect();
    println!("{{\"program\":\"file_race\",\"escaped\":false,\"detail\":\"ready\"}}");
    let dir_candidates = [
        "dir",
        "root-link",
        "proc-link",
        "hostroot-link",
        "vartmp-link",
        "fifo",
        "dev-link",
        "dfifo",
    ];
    let file_candidates = ["file", "ffifo", "fdev"];
    let until = Instant::now() + Duration::from_secs(seconds);
    let (mut swaps, mut failed) = (0u64, 0u64);
    let mut i = 0usize;
    while Instant::now() < until {
        let c = dir_candidates[i % dir_candidates.len()];
        // Swap d with the candidate, and back a moment later: d is each
        // kind in turn, mostly a real directory.
        for _ in 0..2 {
            if exchange(&format!("{BASE}/cand-{c}"), &format!("{BASE}/d")) {
                swaps += 1;
            } else {
                failed += 1;
            }
        }
        let f = file_candidates[i % file_candidates.len()];
        for _ in 0..2 {
            if exchange(&format!("{BASE}/cand-{f}"), &format!("{BASE}/cand-dir/f")) {
                swaps += 1;
            } else {
                failed += 1;
            }
        }
        i += 1;
    }
    report.note(format!("{swaps} swaps ({failed} failed)"));
    // The host's canary content showing up here would mean the API read a
    // host file into the sandbox.
    for p in [
        "/tmp/race/cand-dir/f",
        "/tmp/race/d/f",
        "/tmp/race/cand-dir/up",
    ] {
        if let Ok(b) = std::fs::read(p) {
            if String::from_utf8_lossy(&b).contains(CANARY) {
                report.escape(format!("{p} holds the host canary"));
            }
        }
    }
    report.finish()
}

/// The candidates: `cand-<kind>` for `d`, `cand-<kind>` for `d/f` (kept
/// inside `cand-dir`, which starts as `d`).
fn prepare() -> std::io::Result<()> {
    use std::os::unix::fs::symlink;
    let _ = std::fs::remove_dir_all(BASE);
    std::fs::create_dir_all(format!("{BASE}/cand-dir"))?;
    std::fs::write(format!("{BASE}/cand-dir/f"), b"sandbox-file\n")?;
    std::fs::rename(format!("{BASE}/cand-dir"), format!("{BASE}/d"))?;
    std::fs::create_dir_all(format!("{BASE}/cand-dir"))?;
    std::fs::write(format!("{BASE}/cand-dir/f"), b"sandbox-file\n")?;
    symlink("/", format!("{BASE}/cand-root-link"))?;
    symlink("/proc/1/root", format!("{BASE}/cand-proc-link"))?;
    symlink("/root", format!("{BASE}/cand-hostroot-link"))?;
    symlink("/var/tmp", format!("{BASE}/cand-vartmp-link"))?;
    symlink("/dev/zero", format!("{BASE}/cand-dev-link"))?;
    symlink("/dev/zero", format!("{BASE}/cand-fdev"))?;
    std::fs::write(format!("{BASE}/cand-file"), b"sandbox-other-file\n")?;
    std::fs::create_dir_all(format!("{BASE}/cand-dfifo"))?;
    for f in ["cand-fifo", "cand-ffifo", "cand-dfifo/f"] {
        let p = cstr(&format!("{BASE}/{f}"));
        // SAFETY: a valid path.
        if unsafe { libc::mkfifo(p.as_ptr(), 0o666) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// renameat2(RENAME_EXCHANGE): both names stay, their inodes swap.
fn exchange(a: &str, b: &str) -> bool {
    let (a, b): (CString, CString) = (cstr(a), cstr(b));
    // SAFETY: valid paths; RENAME_EXCHANGE = 2.
    unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            2,
        ) == 0
    }
}
