//! The process tier through brig-core's `Tier` boundary, as the daemon
//! drives it: launch a sandbox running brig-agent `--listen`, talk to it,
//! let go of it as a dying daemon would, and adopt it again from a new
//! `ProcessTier` — the running processes, their output and the files
//! survive; killing and waiting afterwards leaves nothing on the host.
//! Needs root; skips with a printed reason otherwise (fails under
//! BRIG_TEST_STRICT=1).

mod support;

use std::path::Path;
use std::time::Duration;

use brig_agent_client::{Call, Connection, ExecRequest, Output, Reply};
use brig_core::{Launch, Limits, NetworkAttachment, SandboxId, TemplateRef, Tier};
use brig_jail::ProcessTier;
use brig_test_support::root_or_skip;
use support::{agent_bin, within};

/// The owner the tier records: a path that exists for as long as the
/// tests run (a tier discards the sandboxes of owners that are gone).
fn owner() -> String {
    std::env::current_exe().unwrap().display().to_string()
}

fn launch(id: &SandboxId) -> Launch {
    Launch {
        id: id.clone(),
        template: TemplateRef::Host,
        limits: Limits::default(),
        allow_setuid: false,
        network: NetworkAttachment::Loopback,
        volumes: Vec::new(),
    }
}

fn sh(script: &str, background: bool) -> ExecRequest {
    ExecRequest {
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
        background,
        ..ExecRequest::default()
    }
}

fn read(conn: &Connection, path: &str) -> String {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut conn.read_file(path).unwrap(), &mut s).unwrap();
    s
}

fn lines(conn: &Connection) -> usize {
    read(conn, "/tmp/ticks").lines().count()
}

#[test]
fn a_sandbox_outlives_its_launcher_and_is_adopted_again() {
    if !root_or_skip() {
        return;
    }
    within(60, || {
        let tier = ProcessTier::new(agent_bin().to_path_buf(), &owner()).expect("prepare the tier");
        let id = SandboxId::from_random(rand_bits());
        let inst = tier.launch(&launch(&id)).expect("launch");
        assert_eq!(inst.id(), &id);
        let pid = inst.pid().expect("an init pid");
        assert!(tier.running().contains(&id), "listed as running");

        let conn = Connection::new(inst.connect_agent().unwrap()).expect("handshake");
        let ticker = conn
            .exec(&sh(
                "while :; do echo tick >> /tmp/ticks; sleep 0.02; done",
                true,
            ))
            .unwrap();
        let ticker_pid = ticker.pid().unwrap();
        drop(ticker);
        // A foreground process dies with its client; the background one
        // does not.
        let fg = conn.exec(&sh("exec sleep 1000", false)).unwrap();
        let fg_pid = fg.pid().unwrap();
        std::thread::sleep(Duration::from_millis(200));

        // The daemon goes away: its connection closes and it lets go of
        // the instance without ending it.
        drop(conn);
        inst.release();
        drop(inst);
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "the init lives on"
        );

        // A new daemon: a new tier, adopting by id.
        let tier = ProcessTier::new(agent_bin().to_path_buf(), &owner()).expect("prepare again");
        let inst = tier.adopt(&id).expect("adopt").expect("still running");
        assert_eq!(inst.pid(), Some(pid));
        let conn = Connection::new(inst.connect_agent().unwrap()).expect("handshake again");
        let Reply::Processes(list) = conn.call(&Call::ListProcesses).unwrap() else {
            panic!("expected a process list");
        };
        let pids: Vec<i32> = list.iter().map(|p| p.pid).collect();
        assert!(
            pids.contains(&ticker_pid),
            "background process kept: {pids:?}"
        );
        assert!(
            !pids.contains(&fg_pid),
            "foreground process ended: {pids:?}"
        );
        // It kept writing while nobody was connected, and goes on.
        let before = lines(&conn);
        assert!(before >= 10, "ticks while detached: {before}");
        std::thread::sleep(Duration::from_millis(200));
        assert!(lines(&conn) > before, "still ticking after adoption");
        // Re-attach to its output stream.
        let attached = conn.attach(ticker_pid).expect("re-attach");
        conn.call(&Call::Signal {
            pid: ticker_pid,
            sig: libc::SIGTERM,
        })
        .unwrap();
        let mut saw_exit = false;
        for item in attached {
            if let Output::Exited { .. } = item.unwrap() {
                saw_exit = true;
            }
        }
        assert!(saw_exit, "the re-attached stream reports the exit");

        // A second connection replaces the first.
        let conn2 = Connection::new(inst.connect_agent().unwrap()).expect("replace");
        conn2.ping().expect("the new connection is served");
        std::thread::sleep(Duration::from_millis(100));
        assert!(conn.is_closed(), "the replaced connection is closed");

        inst.kill();
        let ended = inst.wait().expect("wait");
        assert_eq!(ended.code, None, "an adopted sandbox's status is unknown");
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "init gone");
        assert!(!tier.running().contains(&id), "runtime directory removed");
        for parent in tier.options().hierarchy.parents() {
            assert!(
                !parent.join(id.as_str()).exists(),
                "cgroup left in {parent:?}"
            );
        }
        assert!(tier.adopt(&id).unwrap().is_none(), "nothing to adopt");
    });
}

#[test]
fn launch_refuses_a_taken_id_and_discard_is_idempotent() {
    if !root_or_skip() {
        return;
    }
    within(60, || {
        let tier = ProcessTier::new(agent_bin().to_path_buf(), &owner()).expect("prepare the tier");
        let id = SandboxId::from_random(rand_bits());
        let inst = tier.launch(&launch(&id)).expect("launch");
        let err = tier.launch(&launch(&id)).unwrap_err();
        assert!(err.to_string().contains("exists already"), "{err}");
        // Discard kills a running sandbox and removes every trace.
        let pid = inst.pid().unwrap();
        inst.release();
        drop(inst);
        tier.discard(&id).expect("discard");
        std::thread::sleep(Duration::from_millis(100));
        // Our child still (this test is also the launcher): a zombie.
        assert!(dead(pid), "init killed");
        assert!(!tier.running().contains(&id));
        tier.discard(&id).expect("discard again");
        let never = SandboxId::from_random(rand_bits());
        assert!(tier.adopt(&never).unwrap().is_none());
    });
}

/// Gone, or a zombie waiting for its parent.
fn dead(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z')
    })
}

fn rand_bits() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    t.as_nanos() as u64 ^ u64::from(std::process::id()) << 20
}
