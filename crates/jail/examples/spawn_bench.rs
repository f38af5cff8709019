//! In-process benchmark of the jail library: create a sandbox, run a
//! static binary in it, wait, destroy — N times — and print p50/p99.
//!
//! Runs two shapes side by side:
//! - `dir` template (overlay over a tiny rootfs, idmapped) running a static
//!   musl `true` (no glibc start-up, so it measures brig, not CPUID traps);
//! - `host` template running the host's `/bin/true` (glibc).
//!
//! Usage (root): `cargo run --release -p brig-jail --example spawn_bench -- [N]`.
//! Needs `musl-gcc` (Debian: musl-tools) to build the static binary.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use brig_core::{SandboxSpec, TemplateRef};
use brig_jail::{Sandbox, SpawnOptions};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn bench(name: &str, spec: &SandboxSpec, opts: &SpawnOptions, n: usize) {
    for _ in 0..n / 10 {
        Sandbox::spawn(spec, opts)
            .expect("spawn")
            .wait()
            .expect("wait");
    }
    let mut times = Vec::with_capacity(n);
    let mut spawn_only = Vec::with_capacity(n);
    for _ in 0..n {
        let t0 = Instant::now();
        let sb = Sandbox::spawn(spec, opts).expect("spawn");
        spawn_only.push(t0.elapsed());
        let exit = sb.wait().expect("wait");
        times.push(t0.elapsed());
        assert_eq!(exit.code, 0);
    }
    times.sort();
    spawn_only.sort();
    println!(
        "{name:<34} create+run+destroy p50 {:>7.3} ms  p99 {:>7.3} ms  | create->exec p50 {:>7.3} ms  p99 {:>7.3} ms  (n={n})",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        percentile(&spawn_only, 0.5).as_secs_f64() * 1e3,
        percentile(&spawn_only, 0.99).as_secs_f64() * 1e3,
    );
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

    let opts = SpawnOptions::prepare().expect("prepare (are you root?)");
    let mut dir_spec = SandboxSpec::new(vec!["/bin/true".into()]);
    dir_spec.template = TemplateRef::Dir(root.clone());
    let host_spec = SandboxSpec::new(vec!["/bin/true".into()]);
    let _ = Path::new("/");
    bench("dir template, static musl true", &dir_spec, &opts, n);
    bench("host template, glibc /bin/true", &host_spec, &opts, n);

    // The warm path: network namespaces from a pool, refilled by a
    // background thread (as a long-lived daemon would run it).
    let pool = brig_jail::NetnsPool::start(8).expect("netns pool");
    pool.wait_full().expect("fill the netns pool");
    let pooled = SpawnOptions {
        net_pool: Some(pool),
        ..opts.clone()
    };
    bench("dir template, musl, pooled netns", &dir_spec, &pooled, n);
    bench(
        "host template, /bin/true, pooled netns",
        &host_spec,
        &pooled,
        n,
    );
}
