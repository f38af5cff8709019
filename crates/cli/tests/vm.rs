//! The vm tier through the real binary: a daemon (`brig serve`) offers it
//! where QEMU is installed, says whether it runs on KVM or TCG, and it is
//! driven through the CLI, the native API and E2B's as any sandbox is:
//! create, exec, files, limits, pause and resume. The sandbox runs its own
//! kernel (Debian's cloud kernel, not the host's); it survives a `kill -9`
//! of the daemon and is adopted by the next; and once it ends (deleted, or
//! ended by a daemon's SIGTERM after a crash) nothing of it is left on the
//! host: no QEMU process, socket, disk file, directory or cgroup.
//!
//! Each test boots as few guests as it can (a boot is seconds under TCG).
//! Needs root and QEMU: skips with a printed reason otherwise (fails under
//! BRIG_TEST_STRICT=1). The guest kernel and the templates' images are
//! kept in the test cache (`BRIG_VM_HOME`), fetched and built once.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::json;
use support::{eventually, ok, text, BRIG};

/// Where the guest kernel and the templates' images are kept between runs.
fn vm_home() -> PathBuf {
    brig_test_support::test_cache().join("vm")
}

type Daemon = support::TestDaemon;

/// Root, QEMU and the test rootfs, or a printed skip.
fn ready() -> Option<String> {
    if support::euid() != 0 {
        support::skip("the vm tier needs root");
        return None;
    }
    if brig_vm::find_qemu().is_none() {
        support::skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)");
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

/// The vm tier as the shared scenarios (support/tiers.rs) drive it:
/// small guests with no network.
fn tier(template: String) -> support::tiers::TierUnderTest {
    support::tiers::TierUnderTest {
        isolation: "vm",
        create_body: json!({
            "isolation": "vm",
            "template": template,
            "memory": "256M",
            "network": {"mode": "none"},
        }),
        template,
        create_args: &["--memory", "256M", "--network", "none"],
        assert_nothing_left,
    }
}

/// The pids of the QEMU processes of sandbox `id` (`-name brig-<id>`).
fn qemu_pids(id: &str) -> Vec<u32> {
    let name = format!("brig-{id}");
    support::pids_by_cmdline(|c| c.split(|b| *b == 0).any(|arg| arg == name.as_bytes()))
        .into_iter()
        // A zombie (reaped by init a moment later) runs nothing.
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
        })
        .collect()
}

/// Nothing of sandbox `id` on the host: no QEMU, no directory (sockets,
/// disk, logs), no cgroup, no link to any daemon's gateway (its network
/// namespace, tap and bridge went with QEMU, its last user).
fn assert_nothing_left(id: &str) {
    let gone = eventually(Duration::from_secs(15), || qemu_pids(id).is_empty());
    assert!(gone, "QEMU processes of {id} left: {:?}", qemu_pids(id));
    let dir = Path::new("/run/brig/vm").join(id);
    assert!(
        eventually(Duration::from_secs(10), || !dir.exists()),
        "directory left: {:?}",
        std::fs::read_dir(&dir).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    assert!(
        !Path::new("/run/brig/vm").join(format!(".{id}")).exists(),
        "a half-made directory left"
    );
    let disk = vm_home().join("disks").join(format!("{id}.ext4"));
    assert!(!disk.exists(), "disk left: {}", disk.display());
    for c in ["memory", "pids", "cpu", "cpuacct", ""] {
        let d = Path::new("/sys/fs/cgroup").join(c).join("brig-vm").join(id);
        assert!(!d.exists(), "cgroup left: {}", d.display());
    }
    let link = format!("b-{id}");
    let linked = || -> Vec<String> {
        let pins = std::fs::read_dir("/run/brig/net")
            .into_iter()
            .flatten()
            .flatten();
        pins.filter(|p| p.file_name().to_string_lossy().starts_with("gw-"))
            .filter(|p| p.path().extension().is_none())
            .filter_map(|p| {
                let net = format!("--net={}", p.path().display());
                let out = Command::new("nsenter")
                    .args([net.as_str(), "ip", "-o", "link", "show", "dev", &link])
                    .output()
                    .ok()?;
                out.status.success().then(|| text(&out.stdout))
            })
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(15), || linked().is_empty()),
        "its gateway link is left: {:?}",
        linked()
    );
}

/// `brig create --isolation vm` on `template`, with `--network none`
/// unless `extra` names a network.
fn create(daemon: &Daemon, template: &str, extra: &[&str]) -> String {
    let mut args = vec!["create", "--isolation", "vm", "--template", template];
    if !extra.contains(&"--network") {
        args.extend(["--network", "none"]);
    }
    args.extend_from_slice(extra);
    ok(daemon.brig(&args), "create").trim().to_string()
}

/// The network links the guest of sandbox `id` sees.
fn links(daemon: &Daemon, id: &str) -> String {
    ok(
        daemon.brig(&["exec", id, "--", "ls", "/sys/class/net"]),
        "ls /sys/class/net",
    )
}

/// The guest of `id` tries a connection to a private address (which the
/// gateway refuses whatever the policy: nothing leaves the host), and its
/// sandbox's gateway log shows it: the guest's packets leave with the
/// sandbox's own address. Its eth0 is at that address.
fn reaches_its_gateway(daemon: &Daemon, id: &str, port: u16) {
    let dial = format!("timeout 10 bash -c 'echo > /dev/tcp/10.0.0.1/{port}' || true");
    ok(daemon.brig(&["exec", id, "--", "sh", "-c", &dial]), "dial");
    let want = format!("denied  10.0.0.1:{port}");
    let logged = eventually(Duration::from_secs(10), || {
        text(&daemon.brig(&["net", id, "--connections"]).stdout).contains(&want)
    });
    let log = text(&daemon.brig(&["net", id, "--connections"]).stdout);
    assert!(logged, "{id}: no `{want}` in its gateway log: {log}");
}

/// One guest, all the way: it runs its own kernel; exec with stdout,
/// stderr and exit codes; files both ways; its memory limit is its RAM;
/// pause and resume; a daemon killed with -9 leaves it running and the
/// next adopts it (a background process ticked meanwhile); deleted,
/// nothing of it stays.
#[test]
fn a_vm_sandbox_through_the_cli_and_the_api() {
    let Some(template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(home.path());

    // The daemon offers the tier and says how it runs it: TCG here, where
    // /dev/kvm cannot boot a stock guest.
    let (status, info) = daemon.call("GET", "/v1/info", None);
    assert_eq!(status, 200, "{info}");
    assert!(
        info["offered"].as_array().unwrap().contains(&json!("vm")),
        "{info}"
    );
    assert_eq!(info["tiers"]["vm"]["available"], true, "{info}");
    let accel = info["tiers"]["vm"]["accel"].as_str().unwrap().to_owned();
    assert!(
        accel == "kvm" || accel.to_lowercase().contains("tcg"),
        "{info}"
    );
    let doctor = ok(daemon.brig(&["doctor"]), "doctor");
    assert!(
        doctor
            .lines()
            .any(|l| l.trim_start().starts_with("vm:") && (l.contains("TCG") || l.contains("KVM"))),
        "{doctor}"
    );

    let id = create(&daemon, &template, &["--memory", "384M", "--disk", "256M"]);
    let (_, sb) = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(sb["isolation"], "vm", "{sb}");
    assert_eq!(qemu_pids(&id).len(), 1, "one QEMU for the sandbox");

    // Its own kernel: Debian's cloud kernel, not the host's; the agent is
    // the guest's pid 1.
    let host = ok(
        Command::new("uname").arg("-r").output().unwrap(),
        "host uname",
    );
    let guest = ok(daemon.brig(&["exec", &id, "--", "uname", "-r"]), "uname");
    assert_ne!(guest.trim(), host.trim(), "the host's kernel answered");
    assert!(guest.trim().ends_with("-cloud-amd64"), "{guest}");
    let kept = std::fs::read_to_string(vm_home().join("kernel/current")).unwrap();
    assert_eq!(guest.trim(), kept.trim(), "the kernel brig fetched");
    let pid1 = ok(
        daemon.brig(&["exec", &id, "--", "cat", "/proc/1/cmdline"]),
        "pid 1",
    );
    assert!(pid1.starts_with("/init\0--vm-init"), "{pid1:?}");

    // Exit codes, both streams, stdin; files both ways, bytes the line's
    // packets must escape (0xC0, 0xDB) among them.
    support::tiers::execs_and_files_work(&daemon, &id, home.path());
    // The template is read-only below the writable disk, which --disk
    // bounds.
    let out = daemon.brig(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/root/big bs=1M count=400 2>&1; echo rc=$?",
    ]);
    let said = text(&out.stdout);
    assert!(
        said.contains("No space left") && !said.contains("rc=0"),
        "{said}"
    );
    ok(
        daemon.brig(&["exec", &id, "--", "rm", "/root/big"]),
        "rm big",
    );

    // The memory limit is the guest's RAM (less what its kernel keeps),
    // and QEMU's cgroup holds it with QEMU's own overhead.
    let out = ok(
        daemon.brig(&["exec", &id, "--", "sh", "-c", "grep MemTotal /proc/meminfo"]),
        "meminfo",
    );
    let kib: u64 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        kib <= 384 * 1024 && kib > 256 * 1024,
        "MemTotal {kib} kB for a 384M guest"
    );
    let limit: u64 = std::fs::read_to_string(
        Path::new("/sys/fs/cgroup/memory/brig-vm")
            .join(&id)
            .join("memory.limit_in_bytes"),
    )
    .or_else(|_| {
        std::fs::read_to_string(
            Path::new("/sys/fs/cgroup/brig-vm")
                .join(&id)
                .join("memory.max"),
        )
    })
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    assert!(limit > 384 << 20 && limit < 1 << 30, "QEMU's limit {limit}");
    let (status, m) = daemon.call("GET", &format!("/v1/sandboxes/{id}/metrics"), None);
    assert_eq!(status, 200, "{m}");
    assert!(m["memory_bytes"].as_u64().unwrap() > 0, "{m}");
    assert_eq!(m["memory_limit_bytes"], 384u64 << 20, "{m}");

    // Pause and resume: a paused guest's clock stands still, so a ticking
    // process makes no progress while paused.
    ok(
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
    std::thread::sleep(Duration::from_millis(800));
    let ticks = |d: &Daemon| -> u32 {
        ok(
            d.brig(&["exec", &id, "--", "sh", "-c", "wc -l < /root/ticks"]),
            "ticks",
        )
        .trim()
        .parse()
        .unwrap()
    };
    ok(daemon.brig(&["pause", &id]), "pause");
    let (_, sb) = daemon.call("GET", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(sb["state"], "paused", "{sb}");
    let qemu = qemu_pids(&id)[0];
    let stat = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let cpu = |s: &str| -> u64 {
        let f: Vec<&str> = s.rsplit_once(") ").unwrap().1.split(' ').collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let before = cpu(&stat(qemu));
    std::thread::sleep(Duration::from_secs(1));
    let after = cpu(&stat(qemu));
    // A stopped machine's QEMU idles (a running TCG guest burns ticks).
    assert!(
        after - before < 30,
        "QEMU ran {} ticks while paused",
        after - before
    );
    ok(daemon.brig(&["resume", &id]), "resume");
    let first = ticks(&daemon);
    assert!(first >= 3, "ticked before the pause: {first}");

    // A daemon killed with -9: the guest runs on, the next daemon adopts
    // it and reaches its agent over the same line.
    daemon.kill9();
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(qemu_pids(&id), vec![qemu], "the guest outlives its daemon");
    let daemon = Daemon::start(home.path());
    let adopted = ticks(&daemon);
    assert!(
        adopted > first,
        "ticking while no daemon ran: {adopted} after {first}"
    );
    let out = ok(daemon.brig(&["exec", &id, "--", "echo", "adopted"]), "exec");
    assert_eq!(out, "adopted\n");

    // Deleted: nothing of it stays.
    ok(daemon.brig(&["rm", "-f", &id]), "rm");
    assert_nothing_left(&id);
}

/// The native API and E2B's make vm sandboxes (E2B's through the
/// `brig.isolation` metadata key): with a network (the native API's
/// default) the guest has eth0 and its packets reach the sandbox's
/// gateway; without one (`network: none`, E2B's
/// `allow_internet_access: false`) it has loopback only, no device at all.
#[test]
fn the_native_and_e2b_apis_create_vm_sandboxes_with_and_without_a_network() {
    let Some(template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_e2b(home.path(), &[]);

    // The host template is not a root file system of the guest's own.
    let (status, err) = daemon.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({"isolation": "vm", "template": "host", "network": {"mode": "none"}})),
    );
    assert!((400..500).contains(&status), "{status} {err}");
    assert!(
        err.to_string().contains("root file system of its own"),
        "{err}"
    );

    let (status, sb) = daemon.call(
        "POST",
        "/v1/sandboxes",
        Some(json!({
            "isolation": "vm",
            "template": template,
            "memory": "256M",
        })),
    );
    assert_eq!(status, 201, "{sb}");
    assert_eq!(sb["isolation"], "vm");
    let native = sb["id"].as_str().unwrap().to_string();

    // E2B: the metadata key picks the tier; no internet access asked.
    let (api, _) = daemon.e2b.clone().unwrap();
    let (status, e2b) = daemon.call(
        "POST",
        &format!("{api}/sandboxes"),
        Some(json!({
            "templateID": template,
            "metadata": {"brig.isolation": "vm"},
            "allow_internet_access": false,
        })),
    );
    assert_eq!(status, 201, "{e2b}");
    let e2b_id = e2b["sandboxID"].as_str().unwrap().to_string();
    let (_, sb) = daemon.call("GET", &format!("/v1/sandboxes/{e2b_id}"), None);
    assert_eq!(sb["isolation"], "vm", "{sb}");

    // Both run their own kernel.
    let host = ok(
        Command::new("uname").arg("-r").output().unwrap(),
        "host uname",
    );
    for id in [&native, &e2b_id] {
        let out = ok(daemon.brig(&["exec", id, "--", "uname", "-r"]), "uname");
        assert_ne!(out.trim(), host.trim());
    }
    // The native one on its network; E2B's without any.
    assert!(links(&daemon, &native).contains("eth0"), "no eth0");
    reaches_its_gateway(&daemon, &native, 9);
    assert_eq!(
        links(&daemon, &e2b_id)
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["lo"]
    );

    let (status, _) = daemon.call("DELETE", &format!("{api}/sandboxes/{e2b_id}"), None);
    assert!(status < 300, "E2B kill: {status}");
    assert_nothing_left(&e2b_id);
    // The other one is ended by the daemon's SIGTERM.
    drop(daemon);
    assert_nothing_left(&native);
}

/// A daemon killed with -9, then a new one that ends everything (SIGTERM):
/// a guest the first left is adopted and then torn down without a trace;
/// one no record names (the daemon died between the launch and the record)
/// is discarded at the start.
#[test]
fn nothing_is_left_after_a_daemon_crash() {
    let Some(template) = ready() else { return };
    tier(template).nothing_is_left_after_a_daemon_crash();
}

/// A daemon killed while guests are being made (their disks made, QEMU
/// starting, the guest booting): the next daemon leaves none of them
/// `creating`, and once it ends nothing of them is left on the host.
#[test]
fn a_daemon_killed_mid_create_leaves_nothing_half_made() {
    let Some(template) = ready() else { return };
    tier(template).a_daemon_killed_mid_create_leaves_nothing_half_made(
        &[150, 1500],
        |delay_ms, ids| {
            if delay_ms >= 1500 {
                // Mid-boot: guests' QEMUs run, their daemon gone (the two
                // sandboxes' restores, or the first launch's boot of the
                // machine's boot snapshot, which the other waits for).
                assert!(!ids.is_empty(), "after {delay_ms} ms: no guest");
                assert!(
                    ids.iter().all(|id| qemu_pids(id).len() == 1),
                    "after {delay_ms} ms: no QEMU for some of {ids:?}"
                );
            }
        },
    );
}

/// `brig run --isolation vm`: one command in a fresh guest on brig's
/// stdio (stdin in, stdout and stderr out, its exit status), its own
/// kernel; nothing left after it. A terminal (`-t`) and a network are
/// refused, said so.
#[test]
fn brig_run_runs_one_command_in_a_guest() {
    let Some(template) = ready() else { return };
    let run = |args: &[&str], input: &[u8]| -> Output {
        let mut child = Command::new(BRIG)
            .arg("run")
            .args(args)
            .env("BRIG_VM_HOME", vm_home())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        let _ = child.stdin.take().unwrap().write_all(input);
        child.wait_with_output().unwrap()
    };
    let out = run(
        &[
            "-i",
            "--isolation",
            "vm",
            "--network",
            "none",
            "--template",
            &template,
            "--",
            "sh",
            "-c",
            "read x; echo got:$x; hostname; uname -r; echo $(ls /sys/class/net); echo err >&2; exit 3",
        ],
        b"piped\n",
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "got:piped", "{stdout}");
    let host = ok(
        Command::new("uname").arg("-r").output().unwrap(),
        "host uname",
    );
    assert_ne!(lines[2], host.trim(), "the host's kernel answered");
    assert!(lines[2].ends_with("-cloud-amd64"), "{stdout}");
    assert_eq!(lines[3], "lo", "--network none: no network device");
    assert!(text(&out.stderr).contains("err"), "{}", text(&out.stderr));
    // The guest's hostname is its sandbox's id.
    assert_nothing_left(lines[1]);

    // With a network (the default): the guest has eth0 at the sandbox's
    // address, routed via the gateway.
    let out = run(
        &[
            "--isolation",
            "vm",
            "--template",
            &template,
            "--",
            "sh",
            "-c",
            "hostname; ls /sys/class/net; cat /proc/net/route",
        ],
        b"",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("eth0"), "{said}");
    assert_nothing_left(said.lines().next().unwrap_or_default());
    // The default route via 10.87.0.1 (little-endian hex).
    assert!(said.contains("eth0\t00000000\t0100570A"), "{said}");
}

/// The official E2B Python SDK on a vm sandbox (tests/e2b/tier_sdk.py, as
/// gvisor.rs runs it on gvisor): picked with the metadata key
/// `brig.isolation`; `allow_internet_access` honoured (eth0 with it, no
/// network device without); commands, files, a background command, the
/// guest's own kernel; a memory snapshot
/// (`create_snapshot`, `Sandbox.create(snapshot_id)`: a process runs on
/// with its memory; the parent too); a volume through `Volume` and
/// `volume_mounts` (the guest has it alone: the host's content API refuses
/// it after); nothing left after its kill.
#[test]
fn e2b_clients_pick_vm_with_a_metadata_key() {
    let Some(template) = ready() else { return };
    tier(template).e2b_clients_pick_it_with_a_metadata_key(26);
}

/// Memory snapshots of a vm sandbox through the CLI: `snapshot create`
/// keeps the machine (its processes, memory and disk), `create
/// --from-snapshot` and `fork` restore it (each copy with its own host
/// name, machine id, random numbers and the host's clock; its files and
/// memory its own from then on), the parent runs on; restored guests
/// survive a `kill -9` of the daemon; a deleted snapshot leaves the
/// sandboxes restored from it running and its files gone; nothing is left
/// after.
#[test]
fn memory_snapshots_restores_and_forks_of_a_vm_sandbox() {
    let Some(template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(home.path());
    // On a network: each copy lands in a namespace of its own, at an
    // address of its own, which its guest is given (`Readdress`).
    let parent = create(
        &daemon,
        &template,
        &["--memory", "256M", "--network", "public"],
    );
    let (daemon, copies) = support::memory_snapshots_through_the_cli(daemon, home.path(), &parent);
    for (port, id) in (1u16..).zip(copies.iter().chain([&parent])) {
        reaches_its_gateway(&daemon, id, port);
    }
    // Restored with no network, a machine saved with a device keeps it
    // (its state must match), leading nowhere.
    let snap = ok(daemon.brig(&["snapshot", "create", &parent]), "snapshot");
    let cut = ok(
        daemon.brig(&[
            "create",
            "--from-snapshot",
            snap.trim(),
            "--network",
            "none",
        ]),
        "restore with network none",
    );
    let cut = cut.trim();
    assert!(links(&daemon, cut).contains("eth0"), "the saved device");
    let dial = "timeout 8 bash -c 'echo > /dev/tcp/10.0.0.1/80' && echo reached || echo not";
    let said = ok(daemon.brig(&["exec", cut, "--", "sh", "-c", dial]), "dial");
    assert_eq!(
        said.trim(),
        "not",
        "a guest restored with no network reached out"
    );
    ok(daemon.brig(&["rm", "-f", cut]), "rm");
    assert_nothing_left(cut);
    ok(daemon.brig(&["snapshot", "rm", snap.trim()]), "snapshot rm");
    drop(daemon);
    for id in copies.iter().map(|s| s.as_str()).chain([parent.as_str()]) {
        assert_nothing_left(id);
    }
    let left: Vec<_> = std::fs::read_dir(home.path().join("checkpoints"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "checkpoints left: {left:?}");
}

/// Volumes in a vm sandbox: the volume's image is a disk of the guest,
/// mounted at its path by the guest's own kernel; files keep the ids the
/// guest gave them (a process-tier sandbox sees the same), and the volume's
/// size is its limit in the guest too. While the guest has it, nothing
/// else may mount it (a process-tier create or a second vm is refused,
/// saying why); a snapshot is refused, saying why; a daemon killed with -9
/// leaves the guest and its volume to the next one. Once a guest has had
/// it, the host never mounts it again (only vm sandboxes may use it: the
/// next finds the files with their owners). Its
/// path rides on the guest kernel's command line: a very long one is
/// refused up front.
#[test]
fn volumes_are_disks_of_a_vm_sandbox_alone() {
    let Some(template) = ready() else { return };
    let home = tempfile::tempdir().unwrap();
    let daemon = Daemon::start_with(home.path(), &["--volume-size", "32MiB"]);
    ok(daemon.brig(&["volume", "create", "data"]), "volume create");
    let vm_create = |daemon: &Daemon, volume: &str| {
        daemon.brig(&[
            "create",
            "--isolation",
            "vm",
            "--network",
            "none",
            "--template",
            &template,
            "--volume",
            volume,
        ])
    };
    let long = format!("data:/mnt/{}", "a".repeat(800));
    let refused = vm_create(&daemon, &long);
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("at most 768 bytes"),
        "{}",
        text(&refused.stderr)
    );

    // The process tier writes first: the guest sees its files and owners.
    let p = ok(
        daemon.brig(&["create", "--network", "none", "--volume", "data:/srv/d"]),
        "create a process sandbox",
    );
    let p = p.trim().to_string();
    ok(
        daemon.brig(&[
            "exec",
            &p,
            "--",
            "sh",
            "-c",
            "echo from-process > /srv/d/p; chown 1234:1234 /srv/d/p",
        ]),
        "write in the process sandbox",
    );
    // Taken by a live sandbox: a vm cannot have it.
    let refused = vm_create(&daemon, "data:/mnt/data");
    assert!(!refused.status.success());
    let said = text(&refused.stderr);
    assert!(said.contains(&p) && said.contains("alone"), "{said}");
    ok(daemon.brig(&["rm", "-f", &p]), "rm the process sandbox");

    // Its mount copies go with it; the vm may then take the volume.
    let mut vm = None;
    for _ in 0..50 {
        let out = vm_create(&daemon, "data:/mnt/data");
        if out.status.success() {
            vm = Some(text(&out.stdout).trim().to_string());
            break;
        }
        assert!(
            text(&out.stderr).contains("try again"),
            "{}",
            text(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let vm = vm.expect("the vm sandbox took the volume");
    assert_eq!(
        ok(
            daemon.brig(&[
                "exec",
                &vm,
                "--",
                "sh",
                "-c",
                "stat -c '%u:%g' /mnt/data/p; cat /mnt/data/p; \
                 findmnt -rno FSTYPE,OPTIONS /mnt/data | cut -d, -f1-3",
            ]),
            "read in the guest"
        ),
        "1234:1234\nfrom-process\next4 rw,nosuid,nodev\n"
    );
    ok(
        daemon.brig(&[
            "exec",
            &vm,
            "--",
            "sh",
            "-c",
            "echo from-vm > /mnt/data/v && chown 1000:1000 /mnt/data/v && sync",
        ]),
        "write in the guest",
    );
    // 32 MiB: writing 40 fails with ENOSPC in the guest too.
    let fill = daemon.brig(&[
        "exec",
        &vm,
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/mnt/data/big bs=1M count=40 2>&1; echo rc=$?; rm -f /mnt/data/big",
    ]);
    let filled = text(&fill.stdout);
    assert!(
        filled.contains("No space left") && !filled.contains("rc=0"),
        "{filled}"
    );

    // Nothing else may mount it meanwhile.
    let shared = daemon.brig(&["create", "--network", "none", "--volume", "data:/srv/d"]);
    assert!(!shared.status.success());
    let said = text(&shared.stderr);
    assert!(said.contains("does not mount it again"), "{said}");
    let second = vm_create(&daemon, "data:/data");
    assert!(!second.status.success());
    assert!(
        text(&second.stderr).contains(&vm),
        "{}",
        text(&second.stderr)
    );
    let snap = daemon.brig(&["snapshot", "create", &vm]);
    assert!(!snap.status.success());
    assert!(
        text(&snap.stderr).contains("volumes"),
        "{}",
        text(&snap.stderr)
    );

    // A crash of the daemon: the next one adopts the guest, which keeps
    // its volume, and still keeps others off it.
    daemon.kill9();
    let daemon = Daemon::start_with(home.path(), &["--volume-size", "32MiB"]);
    assert_eq!(
        ok(
            daemon.brig(&["exec", &vm, "--", "cat", "/mnt/data/v"]),
            "read after the restart"
        ),
        "from-vm\n"
    );
    let shared = daemon.brig(&["create", "--network", "none", "--volume", "data:/srv/d"]);
    assert!(
        !shared.status.success(),
        "the adopted guest still has it alone"
    );

    ok(daemon.brig(&["rm", "-f", &vm]), "rm the vm sandbox");
    assert_nothing_left(&vm);
    // A guest's kernel has had it: the host's never mounts it again (a
    // guest could have shaped its file system to attack the host's), so
    // only vm sandboxes may use it; the next one finds the files.
    let listed: serde_json::Value =
        serde_json::from_str(&ok(daemon.brig(&["volume", "ls", "--json"]), "volume ls")).unwrap();
    assert_eq!(listed[0]["vm_only"], true, "{listed}");
    let host = daemon.brig(&["create", "--network", "none", "--volume", "data:/srv/d"]);
    assert!(!host.status.success());
    assert!(
        text(&host.stderr).contains("does not mount it again"),
        "{}",
        text(&host.stderr)
    );
    let next = vm_create(&daemon, "data:/srv/d");
    let next = ok(next, "a second vm sandbox on the volume");
    let next = next.trim().to_string();
    assert_eq!(
        ok(
            daemon.brig(&["exec", &next, "--", "stat", "-c", "%u:%g %n", "/srv/d/v", "/srv/d/p"]),
            "read the first guest's files"
        ),
        "1000:1000 /srv/d/v\n1234:1234 /srv/d/p\n"
    );
    ok(daemon.brig(&["rm", "-f", &next]), "rm");
    assert_nothing_left(&next);
    // Deleting it clears the mark with the volume.
    ok(daemon.brig(&["volume", "rm", "data"]), "volume rm");
    let left = brig_test_support::volume_files_left(&home.path().join("volumes"));
    assert!(left.is_empty(), "{left:?}");
}
