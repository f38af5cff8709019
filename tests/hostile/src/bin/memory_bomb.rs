//! Memory bomb: allocate and touch memory in 16 MiB steps until stopped.
//!
//! Contained: the sandbox's memory limit kills it (brig exits 137 and says
//! `out of memory (limit ...)`), or allocation fails with ENOMEM. Escaped:
//! it touched `--cap MIB` (default 2048) without being stopped. Destructive:
//! needs `--armed` and a user namespace.

use brig_hostile::{errno, errno_name, guard_destructive, Args, Report};

const STEP: usize = 16 << 20;

fn main() {
    let args = Args::get();
    guard_destructive("memory_bomb", &args);
    let cap_mib = args.u64_value("--cap").unwrap_or(2048) as usize;
    let mut report = Report::new("memory_bomb");
    let mut total = 0usize;
    while total < cap_mib << 20 {
        // SAFETY: anonymous private mapping, no address hint.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                STEP,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = errno();
            report.note(format!(
                "mmap failed with {} after {} MiB",
                errno_name(e),
                total >> 20
            ));
            report.finish();
        }
        // Touch every page with non-zero data so nothing is shared or
        // deduplicated.
        // SAFETY: p points to STEP writable bytes just mapped.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0xa5, STEP) };
        total += STEP;
    }
    report.escape(format!(
        "allocated and touched {} MiB without being stopped",
        total >> 20
    ));
    report.finish()
}
