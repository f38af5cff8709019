//! Open perf events, a frequent source of kernel bugs and of side channels
//! on other tenants: a software cpu-clock counter on ourselves (user space
//! only), and system-wide counters on CPU 0 (pid -1), which would observe
//! every process on the host.
//!
//! Contained: perf_event_open answers EPERM (seccomp). Escaped: any event
//! was opened (closed at once).

use brig_hostile::{check, outcome, read_file, Args, Report};

/// A perf_event_attr for PERF_TYPE_SOFTWARE / PERF_COUNT_SW_CPU_CLOCK,
/// disabled, excluding kernel and hypervisor.
fn attr() -> [u64; 16] {
    let mut a = [0u64; 16];
    a[0] = 1 | (128u64 << 32); // type = SOFTWARE, size = 128
    a[1] = 0; // config = CPU_CLOCK
    a[5] = 1 | (1 << 5) | (1 << 6); // disabled, exclude_kernel, exclude_hv
    a
}

fn main() {
    let _args = Args::get();
    let mut report = Report::new("perf_event");
    for (what, pid, cpu) in [("self, any cpu", 0, -1), ("system-wide, cpu 0", -1, 0)] {
        let a = attr();
        // SAFETY: a is a valid perf_event_attr of the declared size.
        let r =
            check(unsafe { libc::syscall(libc::SYS_perf_event_open, a.as_ptr(), pid, cpu, -1, 0) });
        if let Ok(fd) = r {
            // SAFETY: fd was just returned.
            unsafe { libc::close(fd as i32) };
        }
        report.record(
            r.is_ok(),
            format!("perf_event_open({what}): {}", outcome(&r)),
        );
    }
    let paranoid = read_file("/proc/sys/kernel/perf_event_paranoid")
        .map(|b| String::from_utf8_lossy(&b).trim().to_string());
    report.note(format!("perf_event_paranoid (info): {paranoid:?}"));
    report.finish()
}
