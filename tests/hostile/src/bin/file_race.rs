//! Race the daemon's file API: while the harness uploads, downloads,
//! lists, renames, removes and watches paths under `/tmp/race/d`, this
//! program swaps `d` (and the file `d/f` inside it) in a tight loop with
//! `renameat2(RENAME_EXCHANGE)` for: a real directory, symlinks to `/`,
//! `/proc/1/root`, `/root` and `/var/tmp` (where the host keeps its
//! canaries), a FIFO it holds open for reading (so a non-blocking open for
//! writing succeeds), and a symlink to a device (`/dev/zero`); it also
//! tries to make a real device node there (mknod).
//!
//! `race --seconds N` prints a ready line, swaps for N seconds or until
//! the harness uploads `/tmp/race-stop`, then reports (writes that reached
//! a FIFO or the device: it reads them all the while). The harness (`crates/cli/tests/hostile.rs`, `file_api` tests)
//! judges: every request returned (none blocked on the FIFO), nothing of
//! the host was written or read (canary files unchanged, nothing new in the
//! host's `/`, `/root`, `/var/tmp`, no download carrying the canary), and
//! the daemon and sandbox still answer.
//!
//! Contained here: mknod of a device fails (EPERM: no device nodes in a
//! user namespace). Escaped: a file the API wrote appears with the host
//! canary's content, or this program finds a planted host canary.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use brig_hostile::{cstr, errno, errno_name, Args, Report, CANARY};

const BASE: &str = "/tmp/race";
/// The harness uploads this file when it is done.
const STOP: &str = "/tmp/race-stop";

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
    // A device whose writes can be seen: a pty of our own, its slave
    // linked where `d/f` may be swapped to.
    let pty = open_pty();
    match &pty {
        Ok((_, n)) => {
            let _ =
                std::os::unix::fs::symlink(format!("/dev/pts/{n}"), format!("{BASE}/cand-fdev"));
        }
        Err(e) => report.note(format!("no pty to watch: {}", errno_name(*e))),
    }
    // Keep the FIFOs open for reading (non-blocking), so that an open for
    // writing that lands on one succeeds instead of failing with ENXIO.
    let readers: Vec<_> = ["fifo", "ffifo", "dfifo/f"]
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
    let (mut swaps, mut failed, mut leaked) = (0u64, 0u64, 0u64);
    let mut i = 0usize;
    while Instant::now() < until && std::fs::symlink_metadata(STOP).is_err() {
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
        // Whatever the API wrote into a FIFO or the device arrives here.
        for fd in readers
            .iter()
            .map(|r| r.as_raw_fd())
            .chain(pty.as_ref().ok().map(|(m, _)| m.as_raw_fd()))
        {
            let mut buf = [0u8; 4096];
            // SAFETY: a non-blocking read into a stack buffer.
            let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                leaked += n as u64;
            }
        }
    }
    if leaked > 0 {
        report.escape(format!(
            "the file API wrote {leaked} bytes into a FIFO or a device (it must refuse anything but a regular file)"
        ));
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

/// A pty pair of the sandbox's devpts: the master (non-blocking) and the
/// slave's number.
fn open_pty() -> Result<(OwnedFd, u32), i32> {
    let master = brig_hostile::open(
        "/dev/ptmx",
        libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK,
    )?;
    let unlock: libc::c_int = 0;
    let mut n: libc::c_uint = 0;
    // SAFETY: TIOCSPTLCK reads an int, TIOCGPTN writes one.
    unsafe {
        if libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) < 0
            || libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut n) < 0
        {
            return Err(errno());
        }
    }
    // The slave must stay open somewhere for the master to read: keep one
    // (leaked on purpose, for the program's life).
    let slave = brig_hostile::open(&format!("/dev/pts/{n}"), libc::O_RDWR | libc::O_NOCTTY)?;
    std::mem::forget(slave);
    Ok((master, n))
}
