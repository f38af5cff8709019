//! [`brig_jail::CgroupControls`] on a live sandbox: freeze and thaw, the
//! statistics, new limits, and teardown of a frozen sandbox. Needs root;
//! skips with a printed reason otherwise (and fails under
//! BRIG_TEST_STRICT=1).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use brig_core::{ByteSize, Limits, SandboxSpec};
use brig_jail::{CgroupControls, Exit, Sandbox, SpawnOptions};
use brig_test_support::root_or_skip;

fn pausable() -> SpawnOptions {
    SpawnOptions {
        pausable: true,
        ..SpawnOptions::prepare().expect("prepare")
    }
}

fn sh(script: &str) -> SandboxSpec {
    SandboxSpec::new(vec!["/bin/sh".into(), "-c".into(), script.into()])
}

fn cpu(c: &CgroupControls) -> u64 {
    c.stats()
        .unwrap()
        .cpu_usage_ns
        .expect("a pausable sandbox reports its CPU usage")
}

/// Kill the sandbox and wait for its teardown on another thread, failing
/// (instead of hanging) if it does not finish.
fn kill_and_wait(sb: Sandbox) -> Exit {
    sb.kill();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(sb.wait()));
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the sandbox's teardown finished within 10 s")
        .expect("teardown")
}

fn assert_gone(dirs: &[PathBuf]) {
    assert!(!dirs.is_empty());
    for d in dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn freezing_stops_a_busy_loop_and_thawing_lets_it_go_on() {
    if !root_or_skip() {
        return;
    }
    let opts = pausable();
    let sb = Sandbox::spawn(&sh("while :; do :; done"), &opts).unwrap();
    let c = sb.controls().expect("controls");
    eventually("the loop to use CPU", || cpu(&c) > 50_000_000);

    c.freeze().unwrap();
    assert!(c.is_frozen().unwrap());
    let frozen_at = cpu(&c);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(cpu(&c), frozen_at, "CPU time advanced while frozen");
    assert!(c.stats().unwrap().pids >= 2, "sh and its init are counted");

    c.thaw().unwrap();
    assert!(!c.is_frozen().unwrap());
    eventually("the loop to run again", || cpu(&c) > frozen_at + 50_000_000);

    let dirs = c.dirs().to_vec();
    kill_and_wait(sb);
    assert_gone(&dirs);
    assert!(c.stats().is_err(), "the groups are gone with the sandbox");
}

#[test]
fn a_frozen_sandbox_can_be_killed_and_leaves_nothing_behind() {
    if !root_or_skip() {
        return;
    }
    let opts = pausable();
    let sb = Sandbox::spawn(&sh("sleep 1000 & while :; do :; done"), &opts).unwrap();
    let c = sb.controls().unwrap();
    c.freeze().unwrap();
    let dirs = c.dirs().to_vec();
    let exit = kill_and_wait(sb);
    assert_eq!(exit.code, 128 + libc::SIGKILL);
    assert_gone(&dirs);

    // Frozen again by another thread right after the kill (a pause
    // racing a delete): the teardown still finishes.
    let sb = Sandbox::spawn(&sh("while :; do :; done"), &opts).unwrap();
    let c = sb.controls().unwrap();
    c.freeze().unwrap();
    sb.kill();
    let _ = c.freeze();
    let dirs = c.dirs().to_vec();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(sb.wait()));
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the teardown finished within 10 s")
        .unwrap();
    assert_gone(&dirs);

    // Dropped while frozen, without an explicit kill: the same.
    let sb = Sandbox::spawn(&sh("while :; do :; done"), &opts).unwrap();
    let c = sb.controls().unwrap();
    c.freeze().unwrap();
    let dirs = c.dirs().to_vec();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(sb);
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("dropping a frozen sandbox finished within 10 s");
    assert_gone(&dirs);
}

#[test]
fn stats_report_memory_tasks_and_disk() {
    if !root_or_skip() {
        return;
    }
    let opts = pausable();
    // 40 MB in a shell variable, 8 MiB written to the root filesystem.
    let sb = Sandbox::spawn(
        &sh("dd if=/dev/zero of=/fill bs=1M count=8 2>/dev/null; \
             x=$(head -c 40000000 /dev/zero | tr '\\0' a); touch /ready; sleep 1000"),
        &opts,
    )
    .unwrap();
    let c = sb.controls().unwrap();
    let ready = PathBuf::from(format!("/proc/{}/root/ready", sb.pid()));
    eventually("the allocation", || ready.exists());
    let s = c.stats().unwrap();
    assert!(s.memory_bytes > 40_000_000, "{s:?}");
    assert!(
        s.memory_peak_bytes.is_some_and(|p| p >= s.memory_bytes),
        "{s:?}"
    );
    assert_eq!(s.memory_limit, Limits::default().memory.bytes());
    assert!(s.pids >= 3, "init, sh and sleep: {s:?}");
    let d = c.disk().unwrap();
    // The root is the scratch tmpfs, sized by --disk.
    assert_eq!(d.total_bytes, Limits::default().disk.bytes(), "{d:?}");
    assert!(d.used_bytes >= 8 << 20, "the 8 MiB file counts: {d:?}");
    assert!(d.used_bytes < d.total_bytes);
    kill_and_wait(sb);
    assert!(c.disk().is_err() || c.stats().is_err());
}

#[test]
fn set_limits_lowers_the_memory_limit_of_a_live_sandbox() {
    if !root_or_skip() {
        return;
    }
    let opts = pausable();
    // Allocates 200 MB once the host removes /wait: fine under the
    // default 512 MiB. (The host cannot create a file in the sandbox's
    // root: its uid 0 is not mapped there.)
    let sb = Sandbox::spawn(
        &sh("touch /wait; while [ -e /wait ]; do sleep 0.02; done; \
             x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived"),
        &opts,
    )
    .unwrap();
    let c = sb.controls().unwrap();
    let wait = PathBuf::from(format!("/proc/{}/root/wait", sb.pid()));
    eventually("the sandbox to be ready", || wait.exists());
    let limits = Limits {
        memory: ByteSize::mib(32),
        pids: 64,
        cpus: Some(0.5),
        ..Limits::default()
    };
    c.set_limits(&limits).unwrap();
    assert_eq!(c.stats().unwrap().memory_limit, 32 << 20);
    std::fs::remove_file(&wait).unwrap();
    let dirs = c.dirs().to_vec();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(sb.wait()));
    let exit = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the sandbox ended")
        .unwrap();
    assert!(exit.oom, "the allocation ran into the new limit: {exit:?}");
    assert_ne!(exit.code, 0);
    assert_eq!(exit.memory_limit, ByteSize::mib(32), "the limit in force");
    assert_gone(&dirs);
}

#[test]
fn a_one_shot_sandbox_has_no_freezer_on_cgroup_v1() {
    if !root_or_skip() {
        return;
    }
    let opts = SpawnOptions::prepare().unwrap();
    if !matches!(opts.hierarchy, brig_jail::cgroup::Hierarchy::V1 { .. }) {
        eprintln!("skipping: cgroup v2 can always freeze");
        return;
    }
    let sb = Sandbox::spawn(&sh("sleep 1000"), &opts).unwrap();
    let c = sb.controls().unwrap();
    let err = c.freeze().unwrap_err();
    assert!(err.to_string().contains("freezer"), "{err}");
    assert!(c.stats().unwrap().cpu_usage_ns.is_none());
    kill_and_wait(sb);
}
