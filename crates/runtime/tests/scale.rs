//! A thousand sandboxes at once, on the manager (no HTTP): all of them
//! start, answer and end, and nothing of them is left on the host. Needs
//! root; skips with a printed reason otherwise, and fails instead under
//! BRIG_TEST_STRICT=1.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use brig_agent_client::ExecRequest;
use brig_runtime::{CreateConfig, SandboxManager, TenantId};
use brig_test_support::{manager_fixture, root_or_skip};

const SANDBOXES: usize = 1000;
const CLIENTS: usize = 8;

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
    let f = manager_fixture(|_| {});
    let m = Arc::clone(&f.manager);
    let tenant = m.authenticate(&f.key).unwrap();

    let started = Instant::now();
    let ids = std::sync::Mutex::new(Vec::new());
    fan_out(SANDBOXES, |_| {
        let record = m
            .create(&tenant, CreateConfig::default())
            .expect("create a sandbox");
        ids.lock().unwrap().push(record.id);
    });
    let ids = ids.into_inner().unwrap();
    assert_eq!(m.live_count(), SANDBOXES);
    eprintln!("{SANDBOXES} sandboxes created in {:?}", started.elapsed());

    // Every one of them answers while all are alive.
    let started = Instant::now();
    fan_out(SANDBOXES, |i| {
        assert_eq!(
            run_true(&m, &tenant, &ids[i]),
            Some(0),
            "sandbox {}",
            ids[i]
        );
    });
    eprintln!("an exec in each in {:?}", started.elapsed());

    let started = Instant::now();
    fan_out(SANDBOXES, |i| {
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
