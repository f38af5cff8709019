//! A thread bomb: threads with small stacks until creation fails. Each
//! thread is a task of the pids limit (and its stack is memory).
//!
//! Contained: creation fails (EAGAIN at the pids limit) before
//! `--cap-threads` (default 4096). Escaped: the cap was reached.
//! Destructive: needs `--armed` and a user namespace.

use brig_hostile::{guard_destructive, Args, Report};

fn threads(report: &mut Report, cap: usize) {
    let mut handles = Vec::new();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut failed = None;
    while handles.len() < cap {
        let s = std::sync::Arc::clone(&stop);
        match std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || {
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
            }) {
            Ok(h) => handles.push(h),
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    let n = handles.len();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    match failed {
        Some(e) => report.note(format!("thread creation failed after {n} threads: {e}")),
        None => report.escape(format!("started {n} threads without being stopped")),
    }
}

fn main() {
    let args = Args::get();
    guard_destructive("thread_bomb", &args);
    let mut report = Report::new("thread_bomb");
    let cap = args.u64_value("--cap").unwrap_or(2048) as usize * (1 << 20);
    let threads_cap = args.u64_value("--cap-threads").unwrap_or(4096) as usize;
    let _ = (cap, threads_cap);
    threads(&mut report, threads_cap);
    report.finish()
}
