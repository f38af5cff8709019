//! Memory beyond anonymous mmap, part 2: SysV shared memory, 16 MiB
//! segments created, attached and touched (IPC_RMID at once, so nothing
//! outlives the program).
//!
//! Contained: the memory limit stops it (the OOM killer ends the sandbox,
//! exit 137, or shmget/shmat fails) before `--cap MIB` (default 2048).
//! Escaped: the cap was reached. Destructive: needs `--armed` and a user
//! namespace.

use brig_hostile::{errno, errno_name, guard_destructive, Args, Report};

const STEP: usize = 16 << 20;

fn shm(report: &mut Report, cap: usize) {
    let mut total = 0usize;
    while total < cap {
        // SAFETY: shmget with integer arguments.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, STEP, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            report.note(format!(
                "shmget stopped at {} MiB: {}",
                total >> 20,
                errno_name(errno())
            ));
            return;
        }
        // SAFETY: attaching the segment we just made; mark it for removal
        // so it goes with the last detach.
        let p = unsafe { libc::shmat(id, std::ptr::null(), 0) };
        // SAFETY: as above.
        unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
        if p as isize == -1 {
            report.note(format!(
                "shmat stopped at {} MiB: {}",
                total >> 20,
                errno_name(errno())
            ));
            return;
        }
        // SAFETY: p maps STEP bytes of the segment.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0x5a, STEP) };
        total += STEP;
    }
    report.escape(format!(
        "touched {} MiB of SysV shared memory without being stopped",
        total >> 20
    ));
}

fn main() {
    let args = Args::get();
    guard_destructive("shm_bomb", &args);
    let mut report = Report::new("shm_bomb");
    let cap = args.u64_value("--cap").unwrap_or(2048) as usize * (1 << 20);
    let threads_cap = args.u64_value("--cap-threads").unwrap_or(4096) as usize;
    let _ = (cap, threads_cap);
    shm(&mut report, cap);
    report.finish()
}
