//! The vm tier through brig-core's `Tier` boundary, as the daemon drives
//! it: launch a guest running brig-agent as its init, talk to it over the
//! line; a new connection replaces the last (the old one's streams end, a
//! background process lives on); let go of it as a dying daemon would and
//! adopt it from a new tier; limits refused or changed; kill and wait
//! leave nothing on the host. One guest (a boot is seconds under TCG).
//! And a memory checkpoint of a guest restored twice: its processes and
//! memory in each copy, each copy its own from then on.
//! Needs root, QEMU and the test rootfs; skips with a printed reason
//! otherwise (fails under BRIG_TEST_STRICT=1).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use brig_agent_client::{Connection, ExecRequest};
use brig_core::{ByteSize, Launch, Limits, NetworkAttachment, SandboxId, TemplateRef, Tier};
use brig_test_support::{root_or_skip, rootfs_or_skip, skip, test_cache};
use brig_vm::{find_qemu, VmConfig, VmTier};

/// The owner the tier records: a path that exists while the tests run.
fn owner() -> String {
    std::env::current_exe().unwrap().display().to_string()
}

fn static_agent() -> PathBuf {
    brig_test_support::static_agent_bin()
}

/// The tier, or `None` (skipped) where QEMU is missing.
fn tier() -> Option<VmTier> {
    if !root_or_skip() {
        return None;
    }
    let Some(qemu) = find_qemu() else {
        skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)");
        return None;
    };
    Some(
        VmTier::new(VmConfig {
            qemu,
            run_dir: PathBuf::from("/run/brig"),
            home: test_cache().join("vm"),
            agent: static_agent(),
            owner: owner(),
        })
        .expect("prepare the vm tier"),
    )
}

/// A guest of the test rootfs: 256 MiB, a 64 MiB disk, no network.
fn launch(id: &SandboxId, rootfs: &Path) -> Launch {
    Launch {
        id: id.clone(),
        template: TemplateRef::Dir(rootfs.to_path_buf()),
        limits: Limits {
            memory: ByteSize::mib(256),
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
    (
        String::from_utf8_lossy(&out).into_owned(),
        status.code.unwrap_or(-1),
    )
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

/// Nothing of guest `id` on the host: no QEMU, directory, disk or cgroup.
fn assert_gone(id: &SandboxId, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'))
    };
    while running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!running(), "QEMU {pid} still runs");
    assert!(!Path::new("/run/brig/vm").join(id.as_str()).exists());
    let disk = test_cache().join(format!("vm/disks/{id}.ext4"));
    assert!(!disk.exists(), "disk left: {}", disk.display());
    for c in ["memory", "pids", "cpu", "cpuacct", ""] {
        let d = Path::new("/sys/fs/cgroup")
            .join(c)
            .join("brig-vm")
            .join(id.as_str());
        assert!(!d.exists(), "cgroup left: {}", d.display());
    }
}

/// Launches of one machine start from its boot snapshot (made by the
/// first, from a guest of its own): each guest is a restore (QEMU waits
/// for a saved state instead of booting), its own (host name, machine
/// id, no trace of the guest the snapshot was taken of), and its
/// checkpoints keep their RAM apart all the same.
#[test]
fn launches_of_a_machine_start_from_its_boot_snapshot() {
    let Some(tier) = tier() else { return };
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    if !tier.copy_on_write() {
        skip("QEMU older than 8.2: every launch boots (no boot snapshots)");
        return;
    }
    within(300, move || {
        let ids = [(); 2].map(|()| SandboxId::from_random(rand::random()));
        let guests: Vec<_> = ids
            .iter()
            .map(|id| tier.launch(&launch(id, &rootfs)).expect("launch"))
            .collect();
        let mut machine_ids = Vec::new();
        for (id, g) in ids.iter().zip(&guests) {
            let cmdline = std::fs::read(format!("/proc/{}/cmdline", g.pid().unwrap())).unwrap();
            assert!(
                cmdline.split(|b| *b == 0).any(|a| a == b"-incoming"),
                "{id} was booted, not restored"
            );
            let conn = Connection::new(g.connect_agent().unwrap()).expect("handshake");
            let (out, _) = sh(&conn, "hostname; cat /etc/machine-id /proc/cmdline");
            let l: Vec<&str> = out.lines().collect();
            assert_eq!(l[0], id.as_str(), "{out}");
            machine_ids.push(l[1].to_owned());
            for other in &ids {
                assert!(!l[2].contains(other.as_str()), "{out}");
            }
        }
        assert_ne!(machine_ids[0], machine_ids[1]);
        let image = tempfile::tempdir().unwrap();
        guests[0].checkpoint(image.path()).expect("checkpoint");
        assert!(image.path().join("ram").is_file(), "its RAM kept apart");
        for (id, g) in ids.iter().zip(&guests) {
            let pid = g.pid().unwrap();
            g.kill();
            g.wait().unwrap();
            assert_gone(id, pid);
        }
    });
}

#[test]
fn a_guest_serves_its_agent_over_the_line_and_leaves_nothing() {
    let Some(tier) = tier() else { return };
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    within(300, move || {
        let id = SandboxId::from_random(rand::random());
        let inst = tier.launch(&launch(&id, &rootfs)).expect("launch");
        let pid = inst.pid().expect("QEMU's pid");
        assert!(tier.running().contains(&id));
        let conn = Connection::new(inst.connect_agent().unwrap()).expect("handshake");

        // The guest's own kernel; its hostname is its id.
        let (out, code) = sh(&conn, "uname -r; hostname; exit 4");
        assert_eq!(code, 4);
        let mut lines = out.lines();
        assert!(lines.next().unwrap().ends_with("-cloud-amd64"), "{out}");
        assert_eq!(lines.next().unwrap(), id.as_str());
        let usage = inst.usage().unwrap();
        assert_eq!(usage.memory_limit_bytes, 256 << 20, "{usage:?}");
        assert_eq!(usage.disk_total_bytes, Some(64 << 20), "{usage:?}");

        // A new connection replaces the last: the old one ends, a
        // background process started on it lives on.
        let bg = conn
            .exec(&ExecRequest {
                argv: vec!["/bin/sleep".into(), "1000".into()],
                background: true,
                ..ExecRequest::default()
            })
            .unwrap();
        let bg_pid = bg.pid().expect("started");
        drop(bg);
        let conn2 = Connection::new(inst.connect_agent().unwrap()).expect("replace");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !conn.is_closed() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(conn.is_closed(), "the replaced connection ended");
        let (out, _) = sh(&conn2, &format!("kill -0 {bg_pid} && echo alive"));
        assert_eq!(out.trim(), "alive");

        // Memory is fixed at boot: another limit is refused.
        let e = inst
            .set_limits(&Limits {
                memory: ByteSize::mib(512),
                ..Limits::default()
            })
            .unwrap_err();
        assert!(e.to_string().contains("fixed when it boots"), "{e}");

        // Let go, as a dying daemon does: a new tier adopts it, and its
        // agent (and the background process) are still there.
        drop(conn2);
        inst.release();
        drop(inst);
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "released, it runs on"
        );
        let again = self::tier().unwrap();
        let inst = again.adopt(&id).unwrap().expect("adopted");
        let conn = Connection::new(inst.connect_agent().unwrap()).expect("reconnect");
        let (out, _) = sh(&conn, &format!("kill -0 {bg_pid} && echo alive"));
        assert_eq!(out.trim(), "alive");

        // Paused, then resumed.
        inst.pause().unwrap();
        assert!(inst.is_paused().unwrap());
        inst.resume().unwrap();
        assert!(!inst.is_paused().unwrap());

        // Killed: nothing left; adopting it again finds nothing.
        inst.kill();
        inst.wait().unwrap();
        assert_gone(&id, pid);
        assert!(again.adopt(&id).unwrap().is_none());
        again.discard(&id).expect("discarding a gone guest is fine");
    });
}

#[test]
fn a_template_of_the_host_is_refused() {
    let Some(tier) = tier() else { return };
    let id = SandboxId::from_random(rand::random());
    let e = tier
        .launch(&Launch {
            id: id.clone(),
            template: TemplateRef::Host,
            limits: Limits::default(),
            allow_setuid: false,
            network: NetworkAttachment::Loopback,
            volumes: Vec::new(),
        })
        .unwrap_err();
    assert!(e.to_string().contains("root file system of its own"), "{e}");
    assert!(!Path::new("/run/brig/vm").join(id.as_str()).exists());
}

/// The token and count a guest's heartbeat loop last wrote.
fn beat(conn: &Connection) -> (String, u64) {
    let (out, _) = sh(conn, "cat /tmp/beat");
    let (token, n) = out.trim().split_once(' ').unwrap_or(("", ""));
    (token.to_owned(), n.parse().unwrap_or(0))
}

/// What process `pid` maps of `file`: resident KiB, and of those the KiB
/// another process maps too (`/proc/PID/smaps`).
fn mapped(pid: u32, file: &Path) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let name = file.to_str()?;
    let (mut rss, mut shared, mut found, mut inside) = (0, 0, false, false);
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields
            .first()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            inside = fields.len() >= 6 && fields[5] == name;
            found |= inside;
            continue;
        }
        let kib = || {
            fields
                .get(1)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match fields.first() {
            Some(&"Rss:") if inside => rss += kib(),
            Some(&"Shared_Clean:" | &"Shared_Dirty:") if inside => shared += kib(),
            _ => {}
        }
    }
    found.then_some((rss, shared))
}

/// The heartbeat rewritten by the loop itself (the file removed first, so
/// a copy of the old one does not count): its token and a later count.
fn beats_on(conn: &Connection, token: &str, after: u64) {
    sh(conn, "rm -f /tmp/beat");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (t, n) = beat(conn);
        if !t.is_empty() {
            assert_eq!(t, token, "the loop kept its token");
            assert!(n > after, "counting on: {n} after {after}");
            return;
        }
        assert!(Instant::now() < deadline, "the loop runs no more");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_checkpoint_restores_twice_with_processes_memory_and_own_identities() {
    let Some(tier) = tier() else { return };
    let Some(rootfs) = rootfs_or_skip() else {
        return;
    };
    within(600, move || {
        let launch = |id: &SandboxId| launch(id, &rootfs);
        let parent_id = SandboxId::from_random(rand::random());
        let parent = tier.launch(&launch(&parent_id)).expect("launch");
        let conn = Connection::new(parent.connect_agent().unwrap()).expect("handshake");
        // A token held only by a shell loop's variable, written out with
        // a count every 200 ms (renamed into place: a reader never finds
        // the file truncated and not yet rewritten).
        conn.exec(&ExecRequest {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "t=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \\n'); n=0; \
                 while :; do n=$((n+1)); echo \"$t $n\" > /tmp/beat.new; \
                 mv /tmp/beat.new /tmp/beat; sleep 0.2; done"
                    .into(),
            ],
            background: true,
            ..ExecRequest::default()
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while beat(&conn).0.is_empty() {
            assert!(Instant::now() < deadline, "the loop never wrote");
            std::thread::sleep(Duration::from_millis(100));
        }
        let image = tempfile::tempdir().unwrap();
        parent.checkpoint(image.path()).expect("checkpoint");
        let (token, at) = beat(&conn);
        assert_eq!(token.len(), 16, "{token:?}");
        for f in ["memory", "disk.ext4", "machine.json"] {
            assert!(image.path().join(f).is_file(), "{f} in the checkpoint");
        }
        let cow = tier.copy_on_write();
        if cow {
            // The RAM kept apart, its untouched pages holes; the stream
            // holds the devices' state alone.
            use std::os::unix::fs::MetadataExt;
            let ram = std::fs::metadata(image.path().join("ram")).expect("the RAM's file");
            assert_eq!(ram.len(), 256 << 20, "the guest's RAM");
            assert!(ram.blocks() * 512 < ram.len(), "sparse: {ram:?}");
            let stream = std::fs::metadata(image.path().join("memory"))
                .unwrap()
                .len();
            assert!(stream < 8 << 20, "no RAM in the stream: {stream} bytes");
            eprintln!(
                "checkpoint: RAM file {} KiB written of {} KiB, stream {} KiB",
                ram.blocks() / 2,
                ram.len() >> 10,
                stream >> 10
            );
        } else {
            skip("QEMU older than 8.2: forks load copies of the RAM, not checked for sharing");
        }
        // The parent runs on, its connection too.
        beats_on(&conn, &token, at);

        let ids = [(); 2].map(|()| SandboxId::from_random(rand::random()));
        let copies: Vec<_> = ids
            .iter()
            .map(|id| tier.restore(&launch(id), image.path()).expect("restore"))
            .collect();
        // A machine saved without a network device cannot be restored
        // onto a network: refused before anything is made.
        let ns = std::thread::spawn(|| {
            // SAFETY: unshare on this short-lived thread only.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0);
            brig_net::sys::current().unwrap()
        })
        .join()
        .unwrap();
        let onto = SandboxId::from_random(rand::random());
        let mut networked = launch(&onto);
        networked.network = NetworkAttachment::Namespace(std::sync::Arc::new(ns));
        let e = tier.restore(&networked, image.path()).unwrap_err();
        assert!(e.to_string().contains("network none"), "{e}");
        assert!(!Path::new("/run/brig/vm").join(onto.as_str()).exists());
        let conns: Vec<Connection> = copies
            .iter()
            .map(|c| Connection::new(c.connect_agent().unwrap()).expect("restored handshake"))
            .collect();
        let mut machine_ids = vec![sh(&conn, "cat /etc/machine-id").0];
        let mut random = Vec::new();
        for (id, c) in ids.iter().zip(&conns) {
            beats_on(c, &token, at);
            let (out, _) = sh(
                c,
                "hostname; cat /etc/machine-id; od -An -N16 -tx1 /dev/urandom | tr -d ' \\n'; \
                 echo; date +%s",
            );
            let l: Vec<&str> = out.lines().collect();
            assert_eq!(l[0], id.as_str(), "its own host name: {out}");
            machine_ids.push(l[1].to_owned());
            random.push(l[2].to_owned());
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64;
            let guest: i64 = l[3].parse().unwrap();
            assert!(
                (guest - now).abs() <= 3,
                "its clock is the host's: {guest} vs {now}"
            );
        }
        if cow {
            // Both copies map the checkpoint's RAM file, and share its
            // pages: what each wrote is its own (the divergence below).
            let ram = image.path().join("ram").canonicalize().unwrap();
            for c in &copies {
                let (rss, shared) = mapped(c.pid().unwrap(), &ram)
                    .unwrap_or_else(|| panic!("copy maps {}", ram.display()));
                eprintln!("a copy maps {rss} KiB of the checkpoint's RAM, {shared} KiB shared");
                assert!(
                    shared >= 8 << 10,
                    "pages shared with the other copy: {shared} of {rss} KiB"
                );
            }
        }
        machine_ids.sort();
        machine_ids.dedup();
        assert_eq!(machine_ids.len(), 3, "three machine ids: {machine_ids:?}");
        assert_ne!(
            random[0], random[1],
            "each copy's random numbers are its own"
        );

        // They diverge: a file on the disk and one in memory (tmpfs) in
        // the first copy are in neither the second nor the parent.
        sh(&conns[0], "echo a > /root/only-a; echo a > /dev/shm/only-a");
        for c in [&conns[1], &conn] {
            let (out, _) = sh(
                c,
                "ls /root/only-a /dev/shm/only-a 2>&1 | grep -c 'No such'",
            );
            assert_eq!(out.trim(), "2", "not seen elsewhere");
        }
        let (out, _) = sh(&conns[0], "cat /root/only-a /dev/shm/only-a");
        assert_eq!(out, "a\na\n");

        // A copy's own checkpoint (its RAM, mapped private, goes in the
        // stream) restores with what it held.
        let of_copy = tempfile::tempdir().unwrap();
        copies[1]
            .checkpoint(of_copy.path())
            .expect("checkpoint a copy");
        let grandchild_id = SandboxId::from_random(rand::random());
        let grandchild = tier
            .restore(&launch(&grandchild_id), of_copy.path())
            .expect("restore a copy's checkpoint");
        let c = Connection::new(grandchild.connect_agent().unwrap()).expect("handshake");
        beats_on(&c, &token, at);
        let pid = grandchild.pid().unwrap();
        grandchild.kill();
        grandchild.wait().unwrap();
        assert_gone(&grandchild_id, pid);

        // A paused guest's checkpoint leaves it paused; it resumes.
        parent.pause().unwrap();
        let again = tempfile::tempdir().unwrap();
        parent
            .checkpoint(again.path())
            .expect("checkpoint while paused");
        assert!(parent.is_paused().unwrap(), "still paused");
        parent.resume().unwrap();
        let conn = Connection::new(parent.connect_agent().unwrap()).expect("reconnect");
        beats_on(&conn, &token, at);

        // A restored guest is adopted like any other.
        let pid = copies[0].pid().unwrap();
        drop(conns);
        copies[0].release();
        let other = self::tier().unwrap();
        let adopted = other.adopt(&ids[0]).unwrap().expect("adopted");
        let c = Connection::new(adopted.connect_agent().unwrap()).expect("reconnect");
        beats_on(&c, &token, at);
        adopted.kill();
        adopted.wait().unwrap();
        assert_gone(&ids[0], pid);
        let pids: Vec<u32> = [&parent, &copies[1]].map(|i| i.pid().unwrap()).to_vec();
        for (inst, (id, pid)) in [&parent, &copies[1]]
            .iter()
            .zip([&parent_id, &ids[1]].into_iter().zip(pids))
        {
            inst.kill();
            inst.wait().unwrap();
            assert_gone(id, pid);
        }
    });
}
