//! CPU spin: one busy thread per CPU, forever.
//!
//! Contained: `brig run --timeout` kills the sandbox (exit 124) and the cpu
//! quota keeps the host responsive meanwhile. Escaped: it spun for
//! `--seconds N` (default 120) without being stopped; only then does it
//! print its report. Destructive: needs `--armed` and a user namespace.

use std::time::{Duration, Instant};

use brig_hostile::{guard_destructive, Args, Report};

fn spin(until: Instant) -> u64 {
    let mut n = 0u64;
    while Instant::now() < until {
        for _ in 0..100_000 {
            n = std::hint::black_box(n.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    n
}

fn main() {
    let args = Args::get();
    guard_destructive("cpu_spin", &args);
    let secs = args.u64_value("--seconds").unwrap_or(120);
    let until = Instant::now() + Duration::from_secs(secs);
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let threads: Vec<_> = (1..cpus)
        .map(|_| std::thread::spawn(move || spin(until)))
        .collect();
    spin(until);
    for t in threads {
        let _ = t.join();
    }
    let mut report = Report::new("cpu_spin");
    report.escape(format!(
        "spun {cpus} threads for {secs} s without being stopped"
    ));
    report.finish()
}
