//! The gvisor tier through brig-core's `Tier` boundary, as the daemon
//! drives it: launch a sandbox running brig-agent under runsc, talk to it,
//! let go of it as a dying daemon would and adopt it again from a new
//! tier; pause and resume; kill and wait leave nothing on the host (no
//! runsc process, state, mount or cgroup). Needs root and runsc; skips
//! with a printed reason otherwise (fails under BRIG_TEST_STRICT=1).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use brig_agent_client::{Connection, ExecRequest};
use brig_core::{ByteSize, Launch, Limits, NetworkAttachment, SandboxId, TemplateRef, Tier};
use brig_gvisor::{find_runsc, GvisorConfig, GvisorTier};
use brig_test_support::{agent_bin, root_or_skip, rootfs_or_skip, skip};

/// The owner the tier records: a path that exists while the tests run.
fn owner() -> String {
    std::env::current_exe().unwrap().display().to_string()
}

/// The tier, or `None` (skipped) where runsc is missing.
fn tier(state: &Path) -> Option<GvisorTier> {
    if !root_or_skip() {
        return None;
    }
    let Some(runsc) = find_runsc() else {
        skip("runsc is not installed (apt-get install runsc)");
        return None;
    };
    Some(
        GvisorTier::new(GvisorConfig {
            runsc,
            run_dir: PathBuf::from("/run/brig"),
            state_dir: state.to_path_buf(),
            agent: agent_bin().to_path_buf(),
            owner: owner(),
            platform: None,
        })
        .expect("prepare the gvisor tier"),
    )
}

fn launch(id: &SandboxId, template: TemplateRef) -> Launch {
    Launch {
        id: id.clone(),
        template,
        limits: Limits {
            memory: ByteSize::mib(512),
            disk: ByteSize::mib(64),
            ..Limits::default()
        },
        allow_setuid: false,
        network: NetworkAttachment::Loopback,
        volumes: Vec::new(),
    }
}

fn sh(conn: &Connection, script: &str) -> (String, i32) {
    let p = conn
        .exec(&ExecRequest {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            ..ExecRequest::default()
        })
        .unwrap();
    let (out, _err, status) = p.wait_with_output().unwrap();
    let out = String::from_utf8_lossy(&out).into_owned();
    (out, status.code.unwrap_or(-1))
}

/// Run `f` on its own thread and fail if it takes longer than `secs`.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("did not finish within {secs} s"))
}

/// Nothing of sandbox `id` on the host: no process, runsc state, mount,
/// cgroup or directory.
fn assert_gone(id: &SandboxId, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty()
            || stat[stat.rfind(')').unwrap() + 1..]
                .trim_start()
                .starts_with('Z'),
        "sandbox process {pid} still runs: {stat}"
    );
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines()
            .any(|l| l.contains("runsc") && l.contains(id.as_str())),
        "a runsc process of {id} is left:\n{ps}"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(id.as_str()),
        "a mount of {id} is left:\n{mounts}"
    );
    assert!(!Path::new("/run/brig/gvisor").join(id.as_str()).exists());
    let runsc_state = std::fs::read_dir("/run/brig/gvisor/runsc")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    assert!(
        !runsc_state.iter().any(|n| n.contains(id.as_str())),
        "runsc state left: {runsc_state:?}"
    );
    for c in ["memory", "pids", "cpu", "cpuacct", "freezer", ""] {
        let d = Path::new("/sys/fs/cgroup")
            .join(c)
            .join("brig-gvisor")
            .join(id.as_str());
        assert!(!d.exists(), "cgroup left: {}", d.display());
    }
}

#[test]
fn a_gvisor_sandbox_runs_the_agent_under_gvisors_kernel_and_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    let Some(tier) = tier(state.path()) else {
        return;
    };
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    within(120, move || {
        let id = SandboxId::from_random(rand::random());
        let inst = tier
            .launch(&launch(&id, TemplateRef::Dir(rootfs)))
            .expect("launch");
        let pid = inst.pid().expect("a sandbox pid");
        assert!(tier.running().contains(&id));
        let conn = Connection::new(inst.connect_agent().unwrap()).expect("handshake");

        // gVisor's kernel answers, not the host's.
        let (version, code) = sh(&conn, "cat /proc/version; uname -r");
        assert_eq!(code, 0);
        let host = std::fs::read_to_string("/proc/version").unwrap();
        assert_ne!(version.lines().next().unwrap(), host.trim(), "{version}");
        let (dmesg, _) = sh(
            &conn,
            "dmesg 2>&1 | head -3; cat /proc/1/cmdline | tr '\\0' ' '",
        );
        assert!(dmesg.contains("gVisor"), "dmesg: {dmesg}");
        assert!(dmesg.contains("brig-agent"), "pid 1: {dmesg}");
        let (host_name, _) = sh(&conn, "hostname");
        assert_eq!(host_name.trim(), id.as_str());

        // Files in the writable layer, exit codes, usage.
        let (out, code) = sh(&conn, "echo hi > /root/f && cat /root/f; exit 3");
        assert_eq!((out.trim(), code), ("hi", 3));
        let usage = inst.usage().expect("usage");
        assert!(usage.memory_bytes > 0, "{usage:?}");
        assert_eq!(usage.memory_limit_bytes, 512 << 20, "{usage:?}");
        assert!(
            usage.disk_total_bytes.is_some_and(|t| t >= 63 << 20),
            "{usage:?}"
        );

        // Live limits: the sandbox's groups change at once.
        inst.set_limits(&Limits {
            memory: ByteSize::mib(256),
            pids: 128,
            ..Limits::default()
        })
        .expect("set limits");
        assert_eq!(inst.usage().unwrap().memory_limit_bytes, 256 << 20);

        // Pause stops it; resume goes on.
        inst.pause().expect("pause");
        assert!(inst.is_paused().unwrap());
        inst.resume().expect("resume");
        assert!(!inst.is_paused().unwrap());
        inst.resume()
            .expect("resuming a running sandbox is a no-op");
        let (out, _) = sh(&conn, "echo after");
        assert_eq!(out.trim(), "after");

        // Every process but the agent.
        let bg = conn
            .exec(&ExecRequest {
                argv: vec!["/bin/sleep".into(), "1000".into()],
                background: true,
                ..ExecRequest::default()
            })
            .unwrap();
        drop(bg);
        std::thread::sleep(Duration::from_millis(200));
        assert!(inst.end_all_but_agent().expect("end all but the agent") >= 1);
        conn.ping().expect("the agent lives on");

        drop(conn);
        inst.kill();
        inst.wait().expect("wait");
        assert_gone(&id, pid);
    });
}

#[test]
fn a_gvisor_sandbox_outlives_its_launcher_and_is_adopted_again() {
    let state = tempfile::tempdir().unwrap();
    let Some(tier) = tier(state.path()) else {
        return;
    };
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    let state_dir = state.path().to_path_buf();
    within(120, move || {
        let id = SandboxId::from_random(rand::random());
        let inst = tier
            .launch(&launch(&id, TemplateRef::Dir(rootfs)))
            .expect("launch");
        let pid = inst.pid().unwrap();
        let conn = Connection::new(inst.connect_agent().unwrap()).expect("handshake");
        let ticker = conn
            .exec(&ExecRequest {
                argv: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "while :; do echo tick >> /tmp/ticks; sleep 0.05; done".into(),
                ],
                background: true,
                ..ExecRequest::default()
            })
            .unwrap();
        drop(ticker);
        drop(conn);
        inst.release();
        drop(inst);
        drop(tier);
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "the sandbox lives on"
        );

        let tier = self::tier(&state_dir).unwrap();
        let inst = tier.adopt(&id).expect("adopt").expect("still running");
        assert_eq!(inst.pid(), Some(pid));
        let conn = Connection::new(inst.connect_agent().unwrap()).expect("handshake again");
        let (n1, _) = sh(&conn, "wc -l < /tmp/ticks");
        std::thread::sleep(Duration::from_millis(300));
        let (n2, _) = sh(&conn, "wc -l < /tmp/ticks");
        let (n1, n2): (u32, u32) = (n1.trim().parse().unwrap(), n2.trim().parse().unwrap());
        assert!(n1 >= 5 && n2 > n1, "kept ticking: {n1} then {n2}");

        // A daemon that finds it must not live on discards it.
        drop(conn);
        inst.release();
        drop(inst);
        tier.discard(&id).expect("discard");
        assert_gone(&id, pid);
        tier.discard(&id).expect("discard is idempotent");
        assert!(tier.adopt(&id).unwrap().is_none());
    });
}

#[test]
fn an_unresolved_template_is_refused_and_a_taken_id_too() {
    let state = tempfile::tempdir().unwrap();
    let Some(tier) = tier(state.path()) else {
        return;
    };
    let id = SandboxId::from_random(rand::random());
    let err = match tier.launch(&launch(&id, TemplateRef::Named("base".into()))) {
        Err(e) => e,
        Ok(_) => panic!("an unresolved template launched"),
    };
    assert!(err.to_string().contains("resolve it"), "{err}");
    assert!(!Path::new("/run/brig/gvisor").join(id.as_str()).exists());
}

/// The loop every checkpoint test runs in the background: a counter and a
/// random token held in the shell's memory (variables), written out each
/// tick as "N TOKEN PID" for the test to read; SIGUSR1 draws a new token.
const COUNTER: &str = "new() { tok=$(od -An -N8 -tx8 /dev/urandom | tr -d ' '); }; new; \
                       trap new USR1; n=0; \
                       while :; do n=$((n+1)); echo \"$n $tok $$\" > /tmp/counter.new; \
                       mv /tmp/counter.new /tmp/counter; sleep 0.05; done";

/// What the counter says now: (count, token, pid).
fn counter(conn: &Connection) -> (u64, String, String) {
    let (out, code) = sh(conn, "cat /tmp/counter");
    assert_eq!(code, 0, "no counter: {out}");
    let mut it = out.split_whitespace();
    let n = it.next().unwrap().parse().unwrap();
    (n, it.next().unwrap().into(), it.next().unwrap().into())
}

fn start_counter(conn: &Connection) {
    let bg = conn
        .exec(&ExecRequest {
            argv: vec!["/bin/sh".into(), "-c".into(), COUNTER.into()],
            background: true,
            ..ExecRequest::default()
        })
        .unwrap();
    drop(bg);
    let deadline = Instant::now() + Duration::from_secs(10);
    while sh(conn, "cat /tmp/counter").1 != 0 {
        assert!(Instant::now() < deadline, "the counter did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The count goes on from at least `from`.
fn still_counting(conn: &Connection, from: u64) -> (u64, String) {
    let (a, tok, _) = counter(conn);
    std::thread::sleep(Duration::from_millis(300));
    let (b, tok2, _) = counter(conn);
    assert!(a >= from && b > a, "counting on from {from}: {a} then {b}");
    assert_eq!(tok, tok2);
    (b, tok)
}

#[test]
fn a_checkpoint_keeps_processes_and_memory_and_its_restored_copies_diverge() {
    let state = tempfile::tempdir().unwrap();
    let Some(tier) = tier(state.path()) else {
        return;
    };
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    within(300, move || {
        let id = SandboxId::from_random(rand::random());
        let parent = tier
            .launch(&launch(&id, TemplateRef::Dir(rootfs.clone())))
            .expect("launch");
        let old_pid = parent.pid().unwrap();
        let conn = Connection::new(parent.connect_agent().unwrap()).expect("handshake");
        start_counter(&conn);
        let (out, code) = sh(
            &conn,
            "echo parent > /root/file; cat /etc/machine-id 2>/dev/null; true",
        );
        assert_eq!(code, 0, "{out}");
        let parent_machine = out.trim().to_string();
        let (before, token, _) = counter(&conn);

        let image = tempfile::tempdir().unwrap();
        parent.checkpoint(image.path()).expect("checkpoint");
        // The agent let go of the host's connection for the checkpoint.
        assert!(conn.ping().is_err(), "the old connection is closed");
        let conn = Connection::new(parent.connect_agent().unwrap()).expect("handshake again");
        assert_ne!(
            parent.pid(),
            Some(old_pid),
            "runsc restored it in a new process"
        );
        assert!(
            !Path::new(&format!("/proc/{old_pid}")).exists() || {
                std::thread::sleep(Duration::from_secs(1));
                !Path::new(&format!("/proc/{old_pid}")).exists()
            }
        );
        let (at, tok) = still_counting(&conn, before);
        assert_eq!(tok, token, "the parent's memory is intact");

        // Two copies: the same processes and memory, their own identity.
        let mut copies = Vec::new();
        for _ in 0..2 {
            let cid = SandboxId::from_random(rand::random());
            let inst = tier
                .restore(
                    &launch(&cid, TemplateRef::Dir(rootfs.clone())),
                    image.path(),
                )
                .expect("restore");
            let c = Connection::new(inst.connect_agent().unwrap()).expect("handshake");
            let (n, tok) = still_counting(&c, before);
            assert_eq!(tok, token, "the restored memory is the parent's");
            assert!(n >= before);
            let (name, _) = sh(&c, "hostname");
            assert_eq!(name.trim(), cid.as_str(), "its own host name");
            let (file, _) = sh(&c, "cat /root/file");
            assert_eq!(file.trim(), "parent", "the parent's files");
            let (clock, _) = sh(&c, "date +%s");
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let clock: u64 = clock.trim().parse().unwrap();
            assert!(
                clock.abs_diff(now) <= 5,
                "its clock is the host's: {clock} vs {now}"
            );
            copies.push((cid, inst, c));
        }
        let machine = |c: &Connection| sh(c, "cat /etc/machine-id").0.trim().to_string();
        let (ma, mb) = (machine(&copies[0].2), machine(&copies[1].2));
        assert_eq!(ma.len(), 32, "{ma}");
        assert_ne!(ma, mb, "each copy has its own machine id");
        assert_ne!(ma, parent_machine);
        let entropy = |c: &Connection| sh(c, "od -An -N16 -tx1 /dev/urandom").0;
        assert_ne!(entropy(&copies[0].2), entropy(&copies[1].2));

        // A write in one copy, to a file and to memory, is its own.
        let a = &copies[0].2;
        let (_, _, pid) = counter(a);
        let (out, code) = sh(a, &format!("echo mine > /root/file; kill -USR1 {pid}"));
        assert_eq!(code, 0, "{out}");
        std::thread::sleep(Duration::from_millis(300));
        assert_ne!(counter(a).1, token, "a new token in memory");
        for other in [&copies[1].2, &conn] {
            assert_eq!(counter(other).1, token, "the others keep theirs");
            assert_eq!(sh(other, "cat /root/file").0.trim(), "parent");
        }
        assert_eq!(sh(a, "cat /root/file").0.trim(), "mine");
        assert!(at > 0);

        // A checkpoint is not needed once restored from.
        drop(image);
        still_counting(&copies[1].2, 0);

        let mut ended = vec![(id.clone(), parent.pid().unwrap(), parent, conn)];
        ended.extend(copies.into_iter().map(|(i, inst, c)| {
            let pid = inst.pid().unwrap();
            (i, pid, inst, c)
        }));
        for (i, pid, inst, c) in ended {
            drop(c);
            inst.kill();
            inst.wait().expect("wait");
            assert_gone(&i, pid);
        }
        assert_gone(&id, old_pid);
    });
}

#[test]
fn a_paused_sandbox_is_checkpointed_and_stays_paused_and_no_checkpoint_is_refused() {
    let state = tempfile::tempdir().unwrap();
    let Some(tier) = tier(state.path()) else {
        return;
    };
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    within(300, move || {
        let id = SandboxId::from_random(rand::random());
        let parent = tier
            .launch(&launch(&id, TemplateRef::Dir(rootfs.clone())))
            .expect("launch");
        let conn = Connection::new(parent.connect_agent().unwrap()).expect("handshake");
        start_counter(&conn);
        let (frozen, token, _) = counter(&conn);
        parent.pause().expect("pause");
        drop(conn);
        let image = tempfile::tempdir().unwrap();
        parent
            .checkpoint(image.path())
            .expect("checkpoint a paused sandbox");
        assert!(parent.is_paused().unwrap(), "it stays paused");

        let cid = SandboxId::from_random(rand::random());
        let copy = tier
            .restore(
                &launch(&cid, TemplateRef::Dir(rootfs.clone())),
                image.path(),
            )
            .expect("restore");
        let c = Connection::new(copy.connect_agent().unwrap()).expect("handshake");
        let (_, tok) = still_counting(&c, frozen);
        assert_eq!(tok, token);
        drop(c);

        parent.resume().expect("resume");
        let conn = Connection::new(parent.connect_agent().unwrap()).expect("handshake");
        still_counting(&conn, frozen);
        drop(conn);
        for inst in [parent, copy] {
            inst.kill();
            inst.wait().expect("wait");
        }

        // Not a checkpoint directory.
        let err = match tier.restore(
            &launch(
                &SandboxId::from_random(rand::random()),
                TemplateRef::Dir(rootfs),
            ),
            state.path(),
        ) {
            Err(e) => e,
            Ok(_) => panic!("restored from nothing"),
        };
        assert!(err.to_string().contains("no gvisor checkpoint"), "{err}");
    });
}
