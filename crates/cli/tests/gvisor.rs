//! The gvisor tier through the real binary: a daemon (`brig serve`)
//! offers it where runsc is installed, and it is driven through the CLI and
//! the native API as any sandbox is: create, exec, files, limits, usage;
//! the sandbox runs under gVisor's kernel, not the host's; it survives a
//! `kill -9` of the daemon and is adopted by the next; and once it ends
//! (deleted, or ended by a daemon's SIGTERM after a crash) nothing of it is
//! left on the host: no runsc process, runsc state, mount, cgroup or
//! directory.
//!
//! The exec and pause suites of `serve.rs` run on this tier too (their
//! `_on_gvisor` variants). Needs root and runsc: skips with a printed
//! reason otherwise (fails under BRIG_TEST_STRICT=1).

mod support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, host_mounts_matching, ok, text, BRIG};

type Daemon = support::TestDaemon;

/// Root, runsc and the test rootfs, or a printed skip.
fn ready() -> Option<String> {
    if support::euid() != 0 {
        support::skip("the gvisor tier needs root");
        return None;
    }
    if !support::tier_or_skip("gvisor") {
        return None;
    }
    let Some(rootfs) = support::rootfs() else {
        support::skip(
            "BRIG_TEST_ROOTFS is not set; scripts/test builds a Debian rootfs and sets it",
        );
        return None;
    };
    Some(format!("dir:{}", rootfs.display()))
}

/// The gvisor tier as the shared scenarios (support/tiers.rs) drive it.
fn tier(template: String) -> support::tiers::TierUnderTest {
    support::tiers::TierUnderTest {
        isolation: "gvisor",
        template,
        create_args: &[],
        create_body: json!({"isolation": "gvisor"}),
        assert_nothing_left,
    }
}

/// The host pid of a gvisor sandbox's sandbox process (gVisor's kernel),
/// from the runsc processes that name it.
fn runsc_pids(id: &str) -> Vec<u32> {
    let ps = Command::new("ps")
        .args(["-eo", "pid=,args="])
        .output()
        .unwrap();
    text(&ps.stdout)
        .lines()
        .filter(|l| l.contains("runsc") && l.contains(id))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Nothing of sandbox `id` on the host.
fn assert_nothing_left(id: &str) {
    let gone = eventually(Duration::from_secs(10), || runsc_pids(id).is_empty());
    assert!(gone, "runsc processes of {id} left: {:?}", runsc_pids(id));
    assert!(
        host_mounts_matching(id).is_empty(),
        "mounts left: {:?}",
        host_mounts_matching(id)
    );
    assert!(
        !Path::new("/run/brig/gvisor").join(id).exists(),
        "directory left"
    );
    // runsc removes its state files (the sandbox's lock last) as its own
    // delete ends, a moment after its processes.
    let state = || -> Vec<String> {
        std::fs::read_dir("/run/brig/gvisor/runsc")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains(id))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert!(
        eventually(Duration::from_secs(10), || state().is_empty()),
        "runsc state left: {:?}",
        state()
    );
    // Every hierarchy runsc may have made a group in (`name=systemd`
    // included), and the v2 root.
    let hierarchies = std::fs::read_dir("/sys/fs/cgroup")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .chain([Path::new("/sys/fs/cgroup").to_path_buf()]);
    for h in hierarchies {
        let d = h.join("brig-gvisor").join(id);
        assert!(!d.exists(), "cgroup left: {}", d.display());
    }
}

#[test]
fn a_gvisor_sandbox_through_the_cli_and_the_api() {
    let Some(template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(home.path());

    // The daemon says it offers the tier, and how it runs it.
    let (status, info) = daemon.call("GET", "/v1/info", None);
    assert_eq!(status, 200, "{info}");
    assert!(
        info["offered"]
            .as_array()
            .unwrap()
            .contains(&json!("gvisor")),
        "{info}"
    );
    assert_eq!(info["tiers"]["gvisor"], true, "{info}");
    assert!(
        info["tiers"]["gvisor_detail"]
            .as_str()
            .unwrap()
            .contains("platform"),
        "{info}"
    );

    let id = ok(
        daemon.brig(&[
            "create",
            "--isolation",
            "gvisor",
            "--template",
            &template,
            "--memory",
            "384M",
        ]),
        "create",
    )
    .trim()
    .to_string();
    let (_, sb) = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(sb["isolation"], "gvisor", "{sb}");

    // It runs under gVisor's kernel: another kernel version, gVisor's boot
    // messages, the agent as pid 1.
    let host = std::fs::read_to_string("/proc/version").unwrap();
    let out = ok(
        daemon.brig(&[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "cat /proc/version; dmesg | head -2",
        ]),
        "exec",
    );
    assert!(
        !out.contains(host.trim()),
        "the host's kernel answered: {out}"
    );
    assert!(out.contains("gVisor"), "{out}");
    let out = ok(
        daemon.brig(&["exec", &id, "--", "cat", "/proc/1/cmdline"]),
        "pid 1",
    );
    assert!(out.contains("brig-agent"), "{out}");

    // Exit codes, both streams, stdin; files both ways.
    support::tiers::execs_and_files_work(&daemon, &id, home.path());

    // Limits and usage: the memory limit is the sandbox's (its kernel's
    // too), usage is read from its cgroups.
    let out = ok(
        daemon.brig(&["exec", &id, "--", "sh", "-c", "grep MemTotal /proc/meminfo"]),
        "meminfo",
    );
    let kib: u64 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(kib <= 384 * 1024, "MemTotal {kib} kB over the limit");
    let (status, m) = daemon.call("GET", &format!("/v1/sandboxes/{id}/metrics"), None);
    assert_eq!(status, 200, "{m}");
    assert!(m["memory_bytes"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["memory_limit_bytes"], 384u64 << 20, "{m}");

    // A background process, and a daemon killed with -9: the sandbox runs
    // on, the next daemon adopts it, the process kept going meanwhile.
    let out = ok(
        daemon.brig(&[
            "exec",
            &id,
            "-d",
            "--",
            "sh",
            "-c",
            "while :; do echo t >> /root/ticks; sleep 0.1; done",
        ]),
        "background",
    );
    let bg: i32 = out.trim().parse().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let sandbox_pids = runsc_pids(&id);
    assert!(!sandbox_pids.is_empty());
    daemon.kill9();
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        runsc_pids(&id),
        sandbox_pids,
        "the sandbox outlives its daemon"
    );

    let daemon = Daemon::start(home.path());
    let count = |d: &Daemon| -> u32 {
        ok(
            d.brig(&["exec", &id, "--", "sh", "-c", "wc -l < /root/ticks"]),
            "ticks",
        )
        .trim()
        .parse()
        .unwrap()
    };
    let first = count(&daemon);
    assert!(first >= 8, "ticked while no daemon ran: {first}");
    std::thread::sleep(Duration::from_millis(400));
    assert!(count(&daemon) > first, "still ticking");
    let (_, procs) = daemon.call("GET", &format!("/v1/sandboxes/{id}/processes"), None);
    assert!(procs.to_string().contains(&format!("{bg}")), "{procs}");

    // Deleted: nothing of it stays.
    ok(daemon.brig(&["rm", "-f", &id]), "rm");
    assert_nothing_left(&id);
}

#[test]
fn the_native_api_creates_gvisor_sandboxes_and_refuses_unknown_tiers() {
    let Some(template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(home.path());

    let (status, err) = daemon.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"isolation": "firecracker"})),
    );
    assert_eq!(status, 400, "{err}");
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("process, gvisor, vm"),
        "{err}"
    );
    // The vm tier is offered where QEMU is (crates/cli/tests/vm.rs), but
    // not on the host template (a guest needs a root of its own); without
    // QEMU it is not offered at all.
    let (status, err) = daemon.call("POST", "/v1/sandboxes", Some(json!({"isolation": "vm"})));
    assert!((400..500).contains(&status), "{status} {err}");
    if brig_vm::find_qemu().is_some() {
        assert!(
            err.to_string().contains("root file system of its own"),
            "{err}"
        );
    } else {
        assert_eq!(err["code"], "unsupported", "{err}");
    }

    let (status, sb) = daemon.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"isolation": "gvisor", "template": template, "disk": "64M"})),
    );
    assert_eq!(status, 201, "{sb}");
    assert_eq!(sb["isolation"], "gvisor");
    let id = sb["id"].as_str().unwrap().to_string();
    // Its writable layer is bounded by the disk limit.
    let out = daemon.brig(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/root/big bs=1M count=100 2>&1; echo rc=$?",
    ]);
    let said = text(&out.stdout);
    assert!(
        said.contains("No space left") && !said.contains("rc=0"),
        "{said}"
    );

    // The host template works too (the host's /usr, /etc… read-only).
    let (status, host_sb) = daemon.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"isolation": "gvisor", "template": "host"})),
    );
    assert_eq!(status, 201, "{host_sb}");
    let host_id = host_sb["id"].as_str().unwrap().to_string();
    let out = ok(
        daemon.brig(&[
            "exec",
            &host_id,
            "--",
            "sh",
            "-c",
            "touch /usr/x 2>&1; echo hi > /tmp/y && cat /tmp/y",
        ]),
        "host template",
    );
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(out.contains("hi"), "{out}");

    let (status, _) = daemon.call("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert!(status < 300, "delete: {status}");
    assert_nothing_left(&id);
    // The other one is ended by the daemon's SIGTERM.
    drop(daemon);
    assert_nothing_left(&host_id);
}

/// A daemon killed with -9, then a new one that ends everything (SIGTERM):
/// the gvisor sandboxes the first left are adopted and then torn down
/// without a trace; a sandbox no record names (the daemon died between the
/// launch and the record) is discarded at the start.
#[test]
fn nothing_is_left_after_a_daemon_crash() {
    let Some(template) = ready() else { return };
    tier(template).nothing_is_left_after_a_daemon_crash();
}

/// The official E2B Python SDK creates a gvisor sandbox with the metadata
/// key `brig.isolation` and runs commands and files in it, snapshots it
/// with its memory (no internet) or its files (with), and mounts a volume
/// in it (`Volume`, `volume_mounts`) (tests/e2b/tier_sdk.py).
#[test]
fn e2b_clients_pick_gvisor_with_a_metadata_key() {
    let Some(template) = ready() else { return };
    tier(template).e2b_clients_pick_it_with_a_metadata_key(26);
}

/// `brig run --isolation gvisor`: one command under gVisor's kernel on
/// brig's stdio, with its status, as on the process tier; nothing left
/// after it.
#[test]
fn brig_run_runs_one_command_under_gvisor() {
    let Some(template) = ready() else { return };
    let run = |args: &[&str], input: &[u8]| -> Output {
        let mut child = Command::new(BRIG)
            .arg("run")
            .args(["--isolation", "gvisor", "--network", "none"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _ = child.stdin.take().unwrap().write_all(input);
        child.wait_with_output().unwrap()
    };

    let out = run(
        &[
            "--template",
            &template,
            "--",
            "sh",
            "-c",
            "cat /proc/version; echo err >&2; exit 3",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));

    // coreutils 9 passes statx AT_NO_AUTOMOUNT, which this runsc refuses
    // (EINVAL): the tier's preloaded statx drops it, so `ls -l` and
    // `stat` work, on the Debian template and on the host's.
    for (t, user) in [
        (template.as_str(), "0"),
        (template.as_str(), "nobody"),
        ("host", "0"),
    ] {
        let listed = run(
            &[
                "--template",
                t,
                "--user",
                user,
                "--",
                "sh",
                "-c",
                "ls -ld /tmp && stat -c '%U %a' /etc/passwd",
            ],
            b"",
        );
        // Every user loads the shim: no loader complaint on any stream.
        assert!(
            listed.status.success()
                && text(&listed.stdout).ends_with("root 644\n")
                && !text(&listed.stdout).contains("ld.so")
                && !text(&listed.stderr).contains("ld.so"),
            "ls -l and stat on {t} as {user}: {}{}",
            text(&listed.stdout),
            text(&listed.stderr)
        );
    }
    let host = std::fs::read_to_string("/proc/version").unwrap();
    assert!(
        !text(&out.stdout).contains(host.trim()),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(text(&out.stderr), "err\n");

    // stdin with -i, megabytes of it; the user.
    let big = vec![b'x'; 3 << 20];
    let out = run(&["-i", "--", "wc", "-c"], &big);
    assert_eq!(
        text(&out.stdout).trim(),
        (3 << 20).to_string(),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["-u", "nobody", "--", "id", "-u"], b"");
    assert_eq!(text(&out.stdout), "65534\n", "{}", text(&out.stderr));

    // The command's faults and limits, as on the process tier.
    let out = run(&["--", "no-such-command"], b"");
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    let out = run(&["--timeout", "1s", "--", "sleep", "30"], b"");
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    // -t with a pipe for stdin: refused as on every tier (run.rs has the
    // terminal on gvisor).
    let out = run(&["-t", "--", "true"], b"");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("not a TTY"),
        "{}",
        text(&out.stderr)
    );

    // No one-shot sandbox outlived its `brig run` (their owner is the
    // run's /proc/<pid>; other tests' sandboxes may be there, alive).
    let orphans: Vec<String> = std::fs::read_dir("/run/brig/gvisor")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("state")).ok())
        .filter_map(|s| s.lines().next().map(String::from))
        .filter(|o| o.starts_with("/proc/") && !Path::new(o).exists())
        .collect();
    assert!(orphans.is_empty(), "one-shot sandboxes left: {orphans:?}");

    // A `brig run` killed with -9 leaves its sandbox (this runsc cannot
    // tie it to its caller); the next gvisor `brig run` discards it.
    let mut killed = Command::new(BRIG)
        .args([
            "run",
            "--isolation",
            "gvisor",
            "--network",
            "none",
            "--",
            "sleep",
            "300",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    // Its sandbox: the one whose recorded owner is the killed `brig run`
    // (other tests' sandboxes may be there too).
    let owner = format!("/proc/{}\n", killed.id());
    let left: Vec<String> = std::fs::read_dir("/run/brig/gvisor")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("state")).is_ok_and(|s| s.starts_with(&owner))
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left.len(), 1, "the killed run's sandbox: {left:?}");
    let _ = killed.kill();
    let _ = killed.wait();
    let out = run(&["--", "true"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for id in &left {
        assert_nothing_left(id);
    }
}

/// A `--network none` gvisor sandbox has gVisor's own loopback and no
/// link at all (so that it can be checkpointed: this runsc cannot
/// checkpoint host networking): a connection out fails inside and never
/// reaches the gateway, and the port proxy reaches a server on its
/// loopback.
#[test]
fn the_network_policy_and_the_port_proxy_apply_on_gvisor() {
    let Some(_template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(home.path());
    let id = ok(
        daemon.brig(&["create", "--isolation", "gvisor", "--network", "none"]),
        "create",
    )
    .trim()
    .to_string();
    let probe = "import socket\n\
                 s = socket.create_connection(('1.1.1.1', 80), timeout=5)\n\
                 s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n\
                 print('got', len(s.recv(100)))";
    let out = daemon.brig(&["exec", &id, "--", "python3", "-c", probe]);
    assert!(
        !text(&out.stdout).contains("got") || text(&out.stdout).contains("got 0"),
        "egress with networking off: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let (status, log) = daemon.call(
        "GET",
        &format!("/v1/sandboxes/{id}/network/connections"),
        None,
    );
    assert_eq!(status, 200, "{log}");
    assert_eq!(
        log["connections"],
        serde_json::json!([]),
        "a connection reached the gateway"
    );
    let links = ok(
        daemon.brig(&["exec", &id, "--", "cat", "/proc/net/dev"]),
        "read the links",
    );
    let names: Vec<&str> = links
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(str::trim))
        .collect();
    assert_eq!(names, ["lo"], "{links}");

    // A server on the sandbox's loopback, through the port proxy.
    ok(
        daemon.brig(&[
            "exec",
            &id,
            "-d",
            "--",
            "python3",
            "-m",
            "http.server",
            "8000",
            "--bind",
            "127.0.0.1",
            "--directory",
            "/etc",
        ]),
        "server",
    );
    let url = format!("{}/v1/sandboxes/{id}/ports/8000/os-release", daemon.url);
    let got = eventually(Duration::from_secs(15), || {
        ureq::get(&url)
            .set("Authorization", &format!("Bearer {}", daemon.key))
            .call()
            .ok()
            .and_then(|r| r.into_string().ok())
            .is_some_and(|b| b.contains("ID="))
    });
    assert!(
        got,
        "the port proxy reached the server in the gvisor sandbox"
    );
    ok(daemon.brig(&["rm", "-f", &id]), "rm");
    assert_nothing_left(&id);
}

/// A daemon killed with -9 in the middle of gvisor creates (after a
/// different delay each round) leaves nothing half-made: the next daemon
/// discards what a `creating` record names, adopts what was answered, and
/// its SIGTERM ends it all without a trace.
#[test]
fn a_daemon_killed_mid_create_leaves_nothing_half_made() {
    let Some(template) = ready() else { return };
    tier(template)
        .a_daemon_killed_mid_create_leaves_nothing_half_made(&[40, 90, 140, 200], |_, _| {});
}

/// An E2B sandbox on gvisor through a `kill -9` of the daemon, with the
/// official Python client (tests/e2b/live_restore_sdk.py, as
/// live_restore.rs runs it on the process tier): a background command and
/// a PTY keep running while no daemon runs, and re-attach and stream after.
#[test]
fn an_e2b_gvisor_sandbox_survives_a_daemon_restart() {
    let Some(_template) = ready() else { return };
    let python = brig_test_support::test_cache().join("e2b-venv/bin/python");
    if !python.exists() {
        support::skip(&format!(
            "{} is missing: tests/support/install-python-deps.sh makes it",
            python.display()
        ));
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let e2b = [
        "--e2b",
        "--e2b-api",
        "127.0.0.1:0",
        "--e2b-sandbox",
        "127.0.0.1:0",
        "--prepare",
        "none",
    ];
    let state = home.path().join("sdk-state.json");
    let sdk = |daemon: &Daemon, phase: &str| {
        let (api, data) = daemon.e2b.clone().unwrap();
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2b/live_restore_sdk.py");
        let out = Command::new(&python)
            .arg(script)
            .arg(phase)
            .arg(&state)
            .env("E2B_API_KEY", &daemon.key)
            .env("E2B_API_URL", api)
            .env("E2B_SANDBOX_URL", data)
            .env("E2B_TEMPLATE", "host")
            .env("E2B_ISOLATION", "gvisor")
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN")
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(" passed, 0 failed"),
            "live_restore_sdk.py {phase}:\n{stdout}\n{}",
            text(&out.stderr)
        );
    };
    let daemon = Daemon::start_with(home.path(), &e2b);
    sdk(&daemon, "before");
    let id: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let id = id["id"].as_str().unwrap().to_string();
    let (_, sb) = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(sb["isolation"], "gvisor", "{sb}");
    daemon.kill9();
    std::thread::sleep(Duration::from_secs(1));
    let daemon = Daemon::start_with(home.path(), &e2b);
    sdk(&daemon, "after");
    drop(daemon);
    assert_nothing_left(&id);
}

/// Memory snapshots of a gvisor sandbox through the CLI: `snapshot
/// create` keeps its processes and memory, `create --from-snapshot` and
/// `fork` restore them (each copy with its own host name and machine id,
/// its files and memory its own), the parent runs on; restored sandboxes
/// survive a `kill -9` of the daemon; a deleted snapshot leaves the
/// sandboxes restored from it running and its checkpoint gone; nothing is
/// left after. A sandbox with a network cannot be checkpointed by this
/// runsc: its snapshot keeps its files (`memory: false`) — a file it holds
/// open with unflushed-looking writes, owners and modes — without brig's
/// own mount points and certificate authority, and sandboxes on every
/// tier start from them.
#[test]
fn memory_snapshots_restores_and_forks_of_a_gvisor_sandbox() {
    let Some(template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(home.path());
    let brig = |args: &[&str]| ok(daemon.brig(args), &args.join(" "));
    let parent = brig(&[
        "create",
        "--isolation",
        "gvisor",
        "--template",
        &template,
        "--network",
        "none",
    ]);
    let parent = parent.trim().to_string();
    let (daemon, copies) = support::memory_snapshots_through_the_cli(daemon, home.path(), &parent);

    // A sandbox with a network: its files. (An injection, so that it
    // holds its CA, which the snapshot must leave out.)
    let networked = ok(
        daemon.brig(&[
            "create",
            "--isolation",
            "gvisor",
            "--template",
            &template,
            "--inject",
            "example.test:X-Test=1",
        ]),
        "create",
    );
    let networked = networked.trim();
    ok(
        daemon.brig(&[
            "exec",
            networked,
            "--background",
            "--",
            "sh",
            "-c",
            "exec 3>/root/held; printf held-open >&3; \
             echo kept > /root/kept; chown 1234:1234 /root/kept; chmod 600 /root/kept; \
             rm /etc/debian_version && echo done > /root/ready; exec sleep 600",
        ]),
        "write in the networked sandbox",
    );
    assert!(
        eventually(Duration::from_secs(20), || daemon
            .brig(&["exec", networked, "--", "cat", "/root/ready"])
            .status
            .success()),
        "the writer did not run"
    );
    let snap = ok(daemon.brig(&["snapshot", "create", networked]), "snapshot");
    let snap = snap.trim();
    let listed: serde_json::Value = serde_json::from_str(&ok(
        daemon.brig(&["snapshot", "ls", "--json", "--sandbox", networked]),
        "snapshot ls",
    ))
    .unwrap();
    assert_eq!(listed[0]["id"], snap, "{listed}");
    assert_eq!(listed[0]["memory"], false, "{listed}");
    assert!(!home.path().join("checkpoints").join(snap).exists());
    let mut from_files = Vec::new();
    for isolation in ["gvisor", "process"] {
        let child = ok(
            daemon.brig(&["create", "--isolation", isolation, "--from-snapshot", snap]),
            &format!("create on {isolation} from the files snapshot"),
        );
        let child = child.trim().to_string();
        let seen = ok(
            daemon.brig(&[
                "exec",
                &child,
                "--",
                "sh",
                "-c",
                "cat /root/held; echo; stat -c '%u:%g %a' /root/kept; cat /root/kept; \
                 test -e /etc/debian_version && echo deleted-file-back; \
                 cat /proc/[0-9]*/comm 2>/dev/null | grep -qx sleep && echo sleeper-kept; echo end",
            ]),
            &format!("read on {isolation}"),
        );
        assert_eq!(seen, "held-open\n1234:1234 600\nkept\nend\n", "{isolation}");
        from_files.push(child);
    }
    // Brig's own files in the layer were left out of it.
    let tar = support::snapshot_layer_names(home.path(), snap);
    for own in [
        "run/brig-agent",
        "run/brig-statx.so",
        "run/brig-ca.crt",
        "etc/ld.so.preload",
    ] {
        assert!(
            !tar.iter()
                .any(|n| n.trim_end_matches('/') == own || n.starts_with(&format!("{own}/"))),
            "{own} is in the snapshot: {tar:?}"
        );
    }
    assert!(tar.iter().any(|n| n == "root/kept"), "{tar:?}");

    drop(daemon);
    for id in copies
        .iter()
        .map(|s| s.as_str())
        .chain(from_files.iter().map(|s| s.as_str()))
        .chain([parent.as_str(), networked])
    {
        assert_nothing_left(id);
    }
    let left: Vec<_> = std::fs::read_dir(home.path().join("checkpoints"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "checkpoints left: {left:?}");
}

/// Volumes on gvisor: a volume mounted into a gvisor sandbox and a
/// process-tier one at once shows each the other's files with the owners
/// the sandbox gave them; its size is the limit inside gVisor too; a
/// memory snapshot of it is refused saying why (its volume would not be
/// in it); once both end, the volume's mount and loop device go and its
/// files stay for the next sandbox.
#[test]
fn volumes_mount_into_gvisor_sandboxes() {
    let Some(template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_with(home.path(), &["--volume-size", "32MiB"]);
    ok(daemon.brig(&["volume", "create", "data"]), "volume create");
    let create = |isolation: &str, path: &str| {
        ok(
            daemon.brig(&[
                "create",
                "--isolation",
                isolation,
                "--network",
                "none",
                "--template",
                &template,
                "--volume",
                &format!("data:{path}"),
            ]),
            &format!("create {isolation} with a volume"),
        )
        .trim()
        .to_string()
    };
    let g = create("gvisor", "/mnt/data");
    let p = create("process", "/srv/d");
    ok(
        daemon.brig(&[
            "exec",
            &g,
            "--",
            "sh",
            "-c",
            "echo from-gvisor > /mnt/data/g && chown 1234:1234 /mnt/data/g",
        ]),
        "write in the gvisor sandbox",
    );
    assert_eq!(
        ok(
            daemon.brig(&["exec", &p, "--", "stat", "-c", "%u:%g %s", "/srv/d/g"]),
            "stat in the process sandbox"
        ),
        "1234:1234 12\n"
    );
    ok(
        daemon.brig(&["exec", &p, "--", "sh", "-c", "echo from-process > /srv/d/p"]),
        "write in the process sandbox",
    );
    assert_eq!(
        ok(
            daemon.brig(&["exec", &g, "--", "cat", "/mnt/data/p"]),
            "read in gvisor"
        ),
        "from-process\n"
    );
    let kernel = ok(daemon.brig(&["exec", &g, "--", "dmesg"]), "dmesg");
    assert!(kernel.contains("gVisor"), "not gVisor: {kernel}");

    // 32 MiB: writing 40 fails with ENOSPC inside gVisor.
    let fill = daemon.brig(&[
        "exec",
        &g,
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/mnt/data/big bs=1M count=40 2>&1; echo rc=$?",
    ]);
    let said = text(&fill.stdout);
    assert!(
        said.contains("No space left") && !said.contains("rc=0"),
        "{said}"
    );
    ok(
        daemon.brig(&["exec", &g, "--", "rm", "/mnt/data/big"]),
        "rm big",
    );

    // Its snapshot keeps its own files, not its volume's (on every tier).
    ok(
        daemon.brig(&["exec", &g, "--", "sh", "-c", "echo own > /root/own"]),
        "write outside the volume",
    );
    let snap = ok(daemon.brig(&["snapshot", "create", &g]), "snapshot");
    let copy = ok(
        daemon.brig(&[
            "create",
            "--isolation",
            "gvisor",
            "--network",
            "none",
            "--from-snapshot",
            snap.trim(),
        ]),
        "create from it",
    );
    let copy = copy.trim().to_string();
    assert_eq!(
        ok(
            daemon.brig(&[
                "exec",
                &copy,
                "--",
                "sh",
                "-c",
                "cat /root/own; test -e /mnt/data/g || echo no-volume-files",
            ]),
            "read the copy"
        ),
        "own\nno-volume-files\n"
    );
    ok(daemon.brig(&["rm", "-f", &copy]), "rm the copy");
    assert_nothing_left(&copy);

    ok(daemon.brig(&["rm", "-f", &g, &p]), "rm both");
    assert_nothing_left(&g);
    let volumes = home.path().join("volumes");
    let gone = eventually(Duration::from_secs(15), || {
        brig_test_support::volume_leftovers(&volumes).is_empty()
    });
    assert!(gone, "{:?}", brig_test_support::volume_leftovers(&volumes));
    let again = create("gvisor", "/data");
    assert_eq!(
        ok(
            daemon.brig(&["exec", &again, "--", "cat", "/data/g", "/data/p"]),
            "read in a new gvisor sandbox"
        ),
        "from-gvisor\nfrom-process\n"
    );
    ok(daemon.brig(&["rm", "-f", &again]), "rm");
    assert_nothing_left(&again);
}
