//! In-process benchmark of the jail library: create a sandbox, run a
//! static binary in it, wait for it, destroy the sandbox — N times — and
//! print p50/p99.
//!
//! Shapes, side by side in one run:
//! - `dir` template (overlay over a tiny rootfs, idmapped) running a static
//!   musl `true`: no glibc start-up, so it measures brig, not the ~0.5 ms of
//!   trapped CPUID instructions every glibc start pays on this VM;
//! - `host` template running the host's `/bin/true` (glibc);
//! - cold (each sandbox creates its own network namespace) and warm
//!   (namespaces from a pool refilled in the background, as a long-lived
//!   daemon runs it);
//! - teardown synchronous (the cycle includes unmounting the sandbox's
//!   tree) or handed to a reaper thread (what a daemon does: the caller has
//!   its answer when the command has exited).
//!
//! The peer, in the same run: bubblewrap doing the same cycle over the same
//! tiny rootfs (`bwrap --unshare-all --die-with-parent --ro-bind R / --dev
//! /dev --proc /proc /bin/true`, started and waited for from this process),
//! and the ratio of medians brig/bwrap.
//!
//! Usage (root): `cargo run --release -p brig-jail --example spawn_bench -- [N]`.
//! Needs `musl-gcc` (Debian: musl-tools) to build the static binary.

use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use brig_core::{SandboxSpec, TemplateRef};
use brig_jail::{NetnsPool, Sandbox, SpawnOptions};

fn pct(sorted: &[Duration], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e3
}

#[derive(Clone, Copy, PartialEq)]
enum Teardown {
    Sync,
    Reaper,
}

/// Run the cycle and return the median create->exit time in ms.
fn bench(name: &str, spec: &SandboxSpec, opts: &SpawnOptions, n: usize, mode: Teardown) -> f64 {
    let (tx, rx) = mpsc::channel::<Sandbox>();
    let reaper = std::thread::spawn(move || {
        for sb in rx {
            sb.wait().expect("teardown");
        }
    });
    let run = |record: bool, exec: &mut Vec<Duration>, total: &mut Vec<Duration>| {
        let t0 = Instant::now();
        let mut sb = Sandbox::spawn(spec, opts).expect("spawn");
        let t_exec = t0.elapsed();
        let exit = match mode {
            Teardown::Sync => sb.wait().expect("wait"),
            Teardown::Reaper => {
                let exit = sb.wait_command().expect("wait for the command");
                tx.send(sb).expect("reaper alive");
                exit
            }
        };
        let t_total = t0.elapsed();
        assert_eq!(exit.code, 0);
        if record {
            exec.push(t_exec);
            total.push(t_total);
        }
    };
    let (mut exec, mut total) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n / 10 {
        run(false, &mut exec, &mut total);
    }
    let start = Instant::now();
    for _ in 0..n {
        run(true, &mut exec, &mut total);
    }
    let elapsed = start.elapsed();
    drop(tx);
    reaper.join().expect("reaper");
    exec.sort();
    total.sort();
    println!(
        "{name:<44} create->exec p50 {:>6.3} p99 {:>6.3} | create->exit p50 {:>6.3} p99 {:>6.3} ms | {:>5.0} cycles/s",
        pct(&exec, 0.5),
        pct(&exec, 0.99),
        pct(&total, 0.5),
        pct(&total, 0.99),
        n as f64 / elapsed.as_secs_f64()
    );
    pct(&total, 0.5)
}

/// The same cycle with bubblewrap: start, run, wait. Returns the median in
/// ms, or None when bwrap is not installed.
fn bench_bwrap(name: &str, argv: &[&str], n: usize) -> Option<f64> {
    let run = || {
        Command::new(argv[0])
            .args(&argv[1..])
            .status()
            .map(|s| s.success())
    };
    if !matches!(run(), Ok(true)) {
        println!(
            "{name:<44} skipped: `{}` did not run (apt-get install bubblewrap)",
            argv.join(" ")
        );
        return None;
    }
    for _ in 0..n / 10 {
        let _ = run();
    }
    let mut total = Vec::with_capacity(n);
    let start = Instant::now();
    for _ in 0..n {
        let t0 = Instant::now();
        assert!(run().expect("bwrap"));
        total.push(t0.elapsed());
    }
    let elapsed = start.elapsed();
    total.sort();
    println!(
        "{name:<44} {:>41} | create->exit p50 {:>6.3} p99 {:>6.3} ms | {:>5.0} cycles/s",
        "",
        pct(&total, 0.5),
        pct(&total, 0.99),
        n as f64 / elapsed.as_secs_f64()
    );
    Some(pct(&total, 0.5))
}

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("rootfs");
    for d in ["bin", "etc"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let src = dir.path().join("true.c");
    std::fs::write(&src, "int main(void){return 0;}\n").unwrap();
    let status = Command::new("musl-gcc")
        .args(["-static", "-O2", "-o"])
        .arg(root.join("bin/true"))
        .arg(&src)
        .status();
    if !status.is_ok_and(|s| s.success()) {
        eprintln!("spawn_bench: musl-gcc not found (apt-get install musl-tools)");
        std::process::exit(2);
    }
    std::os::unix::fs::symlink("true", root.join("bin/sh")).unwrap();
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();

    let cold = SpawnOptions::prepare().expect("prepare (are you root?)");
    let pool = NetnsPool::start(16).expect("netns pool");
    pool.wait_full().expect("fill the netns pool");
    let warm = SpawnOptions {
        net_pool: Some(pool),
        ..cold.clone()
    };

    let mut musl = SandboxSpec::new(vec!["/bin/true".into()]);
    musl.template = TemplateRef::Dir(root.clone());
    let glibc = SandboxSpec::new(vec!["/bin/true".into()]);

    for d in ["dev", "proc"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let r = root.to_str().expect("utf-8 temp path");
    let common = [
        "bwrap",
        "--unshare-all",
        "--die-with-parent",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ];
    let bwrap_musl: Vec<&str> = common
        .iter()
        .copied()
        .chain(["--ro-bind", r, "/", "/bin/true"])
        .collect();
    let bwrap_host: Vec<&str> = common
        .iter()
        .copied()
        .chain(["--ro-bind", "/", "/", "/bin/true"])
        .collect();

    use Teardown::{Reaper, Sync};
    println!("jail: create a sandbox, run a program, wait; n={n} per row (times in ms)");
    let musl_cold = bench(
        "brig dir+musl   cold netns, sync teardown",
        &musl,
        &cold,
        n,
        Sync,
    );
    bench(
        "brig dir+musl   warm netns, sync teardown",
        &musl,
        &warm,
        n,
        Sync,
    );
    let musl_warm = bench(
        "brig dir+musl   warm netns, reaper teardown",
        &musl,
        &warm,
        n,
        Reaper,
    );
    let bw_musl = bench_bwrap("bwrap tiny rootfs + musl (same cycle)", &bwrap_musl, n);
    let glibc_cold = bench(
        "brig host+glibc cold netns, sync teardown",
        &glibc,
        &cold,
        n,
        Sync,
    );
    let glibc_warm = bench(
        "brig host+glibc warm netns, reaper teardown",
        &glibc,
        &warm,
        n,
        Reaper,
    );
    let bw_host = bench_bwrap("bwrap / + /bin/true (same cycle)", &bwrap_host, n);
    if let (Some(bm), Some(bh)) = (bw_musl, bw_host) {
        println!(
            "ratio of medians brig/bwrap: musl cold {:.2}, musl warm {:.2}; glibc cold {:.2}, glibc warm {:.2}",
            musl_cold / bm,
            musl_warm / bm,
            glibc_cold / bh,
            glibc_warm / bh
        );
    }
}
