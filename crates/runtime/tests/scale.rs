//! A thousand sandboxes at once, on the manager (no HTTP): all of them
//! start, answer and end, and nothing of them is left on the host. While
//! they are idle, the daemon's thread count does not grow with them (one
//! reactor reads every agent connection; nothing else waits per sandbox)
//! and each costs the host one process, its agent. Needs root; skips with
//! a printed reason otherwise, and fails instead under BRIG_TEST_STRICT=1.
//!
//! `BRIG_SCALE_SANDBOXES=10000` runs the same at ten thousand (opt-in: a
//! few minutes; figures in bench/README.md).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use brig_agent_client::ExecRequest;
use brig_runtime::{CreateConfig, SandboxManager, TenantId};
use brig_test_support::{manager_fixture, root_or_skip};

const CLIENTS: usize = 8;
/// Threads the process may have with every sandbox idle: the test
/// harness's, the manager's few (sweeper, pool fillers, the agent
/// reactor), and teardown threads still finishing.
const MAX_THREADS: usize = 100;

fn sandboxes() -> usize {
    std::env::var("BRIG_SCALE_SANDBOXES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// This process's threads, as the kernel counts them.
fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap()
}

/// The tasks in sandbox `id`'s pids cgroup (v1 or v2).
fn pids_in(id: &brig_core::SandboxId) -> Option<u64> {
    ["/sys/fs/cgroup/pids/brig", "/sys/fs/cgroup/brig"]
        .iter()
        .find_map(|r| std::fs::read_to_string(format!("{r}/{id}/pids.current")).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// Run `f(i)` for every i in 0..n on `CLIENTS` threads.
fn fan_out(n: usize, f: impl Fn(usize) + Sync) {
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    return;
                }
                f(i);
            });
        }
    });
}

fn run_true(m: &SandboxManager, tenant: &TenantId, id: &brig_core::SandboxId) -> Option<i32> {
    let req = ExecRequest {
        argv: vec!["true".into()],
        ..ExecRequest::default()
    };
    let process = m.exec(tenant, id, &req).expect("exec");
    process.wait_with_output().expect("wait").2.code
}

#[test]
fn a_thousand_sandboxes_run_at_once_and_leave_nothing_behind() {
    if !root_or_skip() {
        return;
    }
    let sandboxes = sandboxes();
    let f = manager_fixture(|_| {});
    let m = Arc::clone(&f.manager);
    let tenant = m.authenticate(&f.key).unwrap().tenant;

    let started = Instant::now();
    let ids = std::sync::Mutex::new(Vec::new());
    fan_out(sandboxes, |_| {
        // Ten thousand take minutes to make: none may reach the default
        // timeout (5 minutes) before the last is made.
        let config = CreateConfig {
            timeout: Some(std::time::Duration::from_secs(3600)),
            ..CreateConfig::default()
        };
        let record = m.create(&tenant, config).expect("create a sandbox");
        ids.lock().unwrap().push(record.id);
    });
    let ids = ids.into_inner().unwrap();
    assert_eq!(m.live_count(), sandboxes);
    eprintln!("{sandboxes} sandboxes created in {:?}", started.elapsed());

    // Idle, they cost the daemon no thread and the host one pid each.
    let idle_threads = threads();
    let fds = std::fs::read_dir("/proc/self/fd").unwrap().count();
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    eprintln!(
        "{}",
        limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap_or("")
    );
    eprintln!(
        "threads with {sandboxes} idle sandboxes: {idle_threads}; descriptors: {fds} ({:.1} each)",
        fds as f64 / sandboxes as f64
    );
    assert!(
        idle_threads < MAX_THREADS,
        "{idle_threads} threads with {sandboxes} idle sandboxes"
    );
    let mut extra = 0u64;
    for id in ids.iter().take(200) {
        let n = pids_in(id).expect("the sandbox's pids cgroup");
        assert!(n >= 1, "{id}: {n} tasks");
        extra += n - 1;
    }
    assert_eq!(extra, 0, "idle sandboxes run more than their agent");

    // An exec round trip in one sandbox among them all.
    let probe = &ids[0];
    let started = Instant::now();
    for _ in 0..50 {
        assert_eq!(run_true(&m, &tenant, probe), Some(0));
    }
    eprintln!(
        "exec round trip with {sandboxes} live: {:?}",
        started.elapsed() / 50
    );

    // Every one of them answers while all are alive.
    let started = Instant::now();
    fan_out(sandboxes, |i| {
        assert_eq!(
            run_true(&m, &tenant, &ids[i]),
            Some(0),
            "sandbox {}",
            ids[i]
        );
    });
    eprintln!("an exec in each in {:?}", started.elapsed());

    let started = Instant::now();
    fan_out(sandboxes, |i| {
        m.delete(&tenant, &ids[i]).expect("delete");
    });
    eprintln!("all deleted in {:?}", started.elapsed());
    assert_eq!(m.live_count(), 0);
    // Every controller's hierarchy (v1) or the one tree (v2).
    let mut roots = vec![std::path::PathBuf::from("/sys/fs/cgroup/brig")];
    for entry in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        roots.push(entry.path().join("brig"));
    }
    for id in &ids {
        let left: Vec<_> = roots
            .iter()
            .map(|r| r.join(id.as_str()))
            .filter(|d| d.exists())
            .collect();
        assert!(left.is_empty(), "{id}: cgroups left: {left:?}");
    }
}
