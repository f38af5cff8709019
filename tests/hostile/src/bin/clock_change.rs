//! Change the host's clock: clock_settime(CLOCK_REALTIME) and settimeofday
//! 1000 s ahead, adjtimex/clock_adjtime setting the max-error field, and
//! clock_settime on CLOCK_MONOTONIC.
//!
//! Contained: every call fails with EPERM (seccomp, and no CAP_SYS_TIME).
//! Escaped: any of them succeeded — the program then sets the clock back at
//! once. The harness independently checks the host clock stayed within 2 s
//! of its own monotonic reckoning. Destructive: needs `--armed` and a user
//! namespace.

use brig_hostile::{check, guard_destructive, outcome, Args, Report};

fn realtime() -> libc::timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts
}

fn set_back(report: &mut Report, ahead: libc::time_t) {
    let mut ts = realtime();
    ts.tv_sec -= ahead;
    // SAFETY: ts is a valid timespec.
    let r = unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
    report.note(format!(
        "set the clock back: {}",
        if r == 0 { "ok" } else { "FAILED" }
    ));
}

fn main() {
    let args = Args::get();
    guard_destructive("clock_change", &args);
    let mut report = Report::new("clock_change");
    const AHEAD: libc::time_t = 1000;

    let mut ts = realtime();
    ts.tv_sec += AHEAD;
    // SAFETY: ts is a valid timespec.
    let r = check(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) } as libc::c_long);
    report.record(
        r.is_ok(),
        format!("clock_settime(REALTIME, +{AHEAD}s): {}", outcome(&r)),
    );
    if r.is_ok() {
        set_back(&mut report, AHEAD);
    }

    let now = realtime();
    let tv = libc::timeval {
        tv_sec: now.tv_sec + AHEAD,
        tv_usec: 0,
    };
    // SAFETY: tv is a valid timeval, NULL timezone.
    let r = check(unsafe { libc::settimeofday(&tv, std::ptr::null()) } as libc::c_long);
    report.record(
        r.is_ok(),
        format!("settimeofday(+{AHEAD}s): {}", outcome(&r)),
    );
    if r.is_ok() {
        set_back(&mut report, AHEAD);
    }

    // SAFETY: zeroed timex is valid; ADJ_MAXERROR only changes a statistic.
    let mut tx: libc::timex = unsafe { std::mem::zeroed() };
    tx.modes = libc::ADJ_MAXERROR;
    tx.maxerror = 16_000;
    // SAFETY: tx is a valid timex.
    let r = check(unsafe { libc::adjtimex(&mut tx) } as libc::c_long);
    report.record(
        r.is_ok(),
        format!("adjtimex(ADJ_MAXERROR): {}", outcome(&r)),
    );
    // SAFETY: as above.
    let r = check(unsafe { libc::syscall(libc::SYS_clock_adjtime, libc::CLOCK_REALTIME, &mut tx) });
    report.record(
        r.is_ok(),
        format!("clock_adjtime(REALTIME, ADJ_MAXERROR): {}", outcome(&r)),
    );

    let mut mono = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer, then a valid timespec.
    let r = check(unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut mono);
        libc::clock_settime(libc::CLOCK_MONOTONIC, &mono)
    } as libc::c_long);
    report.record(
        r.is_ok(),
        format!("clock_settime(MONOTONIC): {}", outcome(&r)),
    );
    report.finish()
}
