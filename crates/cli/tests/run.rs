//! End-to-end tests of `brig run`: the real binary, real namespaces, on
//! both templates (`host`, and the Debian rootfs the test script builds).
//! They need root; without it each test says so and returns.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

#[test]
fn output_streams_and_exit_status_pass_through() {
    require_root!();
    for t in templates() {
        let o = run(&t, &[], &["sh", "-c", "echo out; echo err >&2; exit 3"]);
        assert_eq!(o.status.code(), Some(3), "{t}: {}", stderr(&o));
        assert_eq!(stdout(&o), "out\n", "{t}");
        assert_eq!(stderr(&o), "err\n", "{t}");
    }
}

#[test]
fn python_prints_42_on_the_default_template() {
    require_root!();
    let o = brig()
        .args(["run", "--", "python3", "-c", "print(6*7)"])
        .output()
        .unwrap();
    assert_eq!(
        (o.status.code(), stdout(&o).as_str()),
        (Some(0), "42\n"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn output_is_not_buffered() {
    require_root!();
    let mut child = brig()
        .args(["run", "--", "sh", "-c", "echo first; sleep 3; echo second"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    assert!(
        start.elapsed() < Duration::from_millis(2500),
        "first line took {:?}",
        start.elapsed()
    );
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert!(child.wait().unwrap().success());
}

#[test]
fn stdin_reaches_the_command_only_with_dash_i() {
    require_root!();
    for (flag, expect) in [(Some("-i"), "hello sandbox\n"), (None, "")] {
        let mut cmd = brig();
        cmd.arg("run");
        if let Some(f) = flag {
            cmd.arg(f);
        }
        let mut child = cmd
            .args(["--", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"hello sandbox\n")
            .unwrap();
        let o = child.wait_with_output().unwrap();
        assert_eq!(stdout(&o), expect, "flag {flag:?}");
    }
}

#[test]
fn a_missing_command_is_127_with_a_clear_message() {
    require_root!();
    for t in templates() {
        let o = run(&t, &[], &["definitely-not-a-command"]);
        assert_eq!(o.status.code(), Some(127), "{t}");
        assert_eq!(
            stderr(&o),
            "brig: command not found in sandbox: definitely-not-a-command\n"
        );
    }
}

#[test]
fn a_non_executable_command_is_126() {
    require_root!();
    let o = run("host", &[], &["/etc/passwd"]);
    assert_eq!(o.status.code(), Some(126));
    assert!(
        stderr(&o).starts_with("brig: cannot execute /etc/passwd in sandbox: "),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_input_gets_one_line_a_person_can_act_on() {
    require_root!();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--template", "ubuntu"],
            "no template or image named \"ubuntu\": the named templates are base, code-interpreter-v1, and pulling it as an image failed: the registry index.docker.io is not among those BRIG_REGISTRIES allows",
        ),
        (
            &["--template", "dir:/no/such/rootfs"],
            "template directory \"/no/such/rootfs\" is not usable",
        ),
        (&["--memory", "12Q"], "--memory: invalid size \"12Q\""),
        (
            &["--memory", "1M"],
            "--memory 1 MiB is out of range: the minimum is 16M",
        ),
        (&["--disk", "x"], "--disk: invalid size \"x\""),
        (
            &["--timeout", "forever"],
            "--timeout: invalid duration \"forever\"",
        ),
        (&["--timeout", "0s"], "--timeout 0s is out of range"),
        (&["--cpus", "0"], "--cpus 0 is out of range"),
        (&["--pids", "1"], "--pids 1 is out of range"),
        (
            &["--env", "1X=2"],
            "invalid environment variable \"1X=2\"",
        ),
        (&["--workdir", "rel/dir"], "invalid --workdir \"rel/dir\""),
        (
            &["--user", "ghost"],
            "user \"ghost\" does not exist in the template's /etc/passwd",
        ),
    ];
    for (args, expect) in cases {
        let o = brig()
            .arg("run")
            .args(*args)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(125), "{args:?}: {err}");
        assert!(
            err.starts_with("brig: ") && err.contains(expect),
            "{args:?}: got {err:?}, want {expect:?}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains(" { "),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_host_template_shows_exactly_the_documented_paths() {
    require_root!();
    std::fs::write("/root/.brig-test-canary", "secret").unwrap();
    let o = run(
        "host",
        &[],
        &[
            "sh",
            "-c",
            "ls -A /; echo ---; ls -A /root /home /run /var; echo ---; \
             cat /root/.brig-test-canary 2>&1; cat /etc/shadow 2>&1; ls /opt /srv /boot /mnt /media 2>&1",
        ],
    );
    let out = stdout(&o);
    let parts: Vec<&str> = out.split("---\n").collect();
    let top: Vec<&str> = parts[0].lines().collect();
    for p in &top {
        assert!(
            [
                "bin", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32", "proc", "root",
                "run", "sbin", "sys", "tmp", "usr", "var"
            ]
            .contains(p),
            "unexpected top-level entry {p:?} in {top:?}"
        );
    }
    assert!(
        parts[1]
            .lines()
            .all(|l| l.ends_with(':') || l.is_empty() || l == "tmp"),
        "{}",
        parts[1]
    );
    assert!(
        parts[2].contains("/root/.brig-test-canary: No such file or directory"),
        "{}",
        parts[2]
    );
    assert!(
        parts[2].contains("/etc/shadow: Permission denied"),
        "{}",
        parts[2]
    );
    for p in ["/opt", "/srv", "/boot", "/mnt", "/media"] {
        assert!(
            parts[2].contains(&format!("{p}': No such file or directory")),
            "{p}: {}",
            parts[2]
        );
    }
}

#[test]
fn templates_are_never_written() {
    require_root!();
    let o = run(
        "host",
        &[],
        &["sh", "-c", "touch /usr/bin/brig-x; echo x >> /etc/hostname"],
    );
    // Read-only mounts; host-owned files also fail the permission check first.
    let refused = stderr(&o)
        .lines()
        .filter(|l| l.contains("Read-only file system") || l.contains("Permission denied"))
        .count();
    assert_eq!(refused, 2, "{}", stderr(&o));
    assert!(!std::path::Path::new("/usr/bin/brig-x").exists());
    if let Some(rootfs) = rootfs() {
        let before = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
        let t = format!("dir:{}", rootfs.display());
        let o = run(
            &t,
            &[],
            &[
                "sh",
                "-c",
                "echo hacked >> /etc/passwd && touch /usr/bin/brig-x && tail -1 /etc/passwd",
            ],
        );
        assert_eq!(
            stdout(&o),
            "hacked\n",
            "writes land in the sandbox's own layer: {}",
            stderr(&o)
        );
        assert_eq!(
            std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap(),
            before
        );
        assert!(!rootfs.join("usr/bin/brig-x").exists());
    }
}

#[test]
fn dir_templates_belong_to_the_sandboxs_root() {
    require_root!();
    let rootfs = require_rootfs!();
    let t = format!("dir:{}", rootfs.display());
    let o = run(
        &t,
        &[],
        &[
            "sh",
            "-c",
            "stat -c '%U %G' /etc/passwd /usr/bin; id -u; head -1 /etc/os-release",
        ],
    );
    assert_eq!(
        stdout(&o),
        "root root\nroot root\n0\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_sandbox_has_its_own_hostname_network_and_identity() {
    require_root!();
    for t in templates() {
        let script = "hostname; echo $(cat /proc/net/dev | tail -n +3 | cut -d: -f1); cat /proc/self/uid_map; ls /proc | grep -c '^[0-9]'";
        // --network none: loopback only; by default also the link to its
        // gateway (docs/server.md "Network").
        let none = run(&t, &["--network", "none"], &["sh", "-c", script]);
        let none = stdout(&none);
        assert_eq!(
            none.lines().nth(1),
            Some("lo"),
            "{t}: only loopback: {none}"
        );
        let o = run(&t, &[], &["sh", "-c", script]);
        let out = stdout(&o);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].len() == 12 && lines[0].bytes().all(|b| b.is_ascii_hexdigit()),
            "{t}: hostname {:?}",
            lines[0]
        );
        let mut links: Vec<&str> = lines[1].split_whitespace().collect();
        links.sort_unstable();
        assert_eq!(
            links,
            ["eth0", "lo"],
            "{t}: loopback and the gateway's link"
        );
        let map: Vec<u64> = lines[2]
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(map[0], 0);
        assert!(
            map[1] >= 0x1000_0000,
            "{t}: sandbox root maps to host uid {} (must never be 0)",
            map[1]
        );
        assert_eq!(map[2], 65536);
        // Only the sandbox's own processes: init, sh, and the pipeline.
        assert!(
            lines[3].parse::<u32>().unwrap() <= 6,
            "{t}: {} pids visible",
            lines[3]
        );
    }
}

/// A sandbox looks like a machine that booted when it started: a boot id
/// of its own (not the host's, not another sandbox's; read-only), and an
/// uptime counted from its start (a time namespace).
#[test]
fn the_sandbox_has_its_own_boot_id_and_uptime() {
    require_root!();
    let host_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let host_up: f64 = std::fs::read_to_string("/proc/uptime")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    for t in templates() {
        let script = "cat /proc/sys/kernel/random/boot_id; cut -d' ' -f1 /proc/uptime; \
                      echo x > /proc/sys/kernel/random/boot_id || echo refused";
        let ids: Vec<String> = (0..2)
            .map(|_| {
                let o = run(&t, &[], &["sh", "-c", script]);
                let out = stdout(&o);
                let lines: Vec<&str> = out.lines().collect();
                assert_eq!(lines.len(), 3, "{t}: {out}");
                let up: f64 = lines[1].parse().unwrap();
                assert!(up < 30.0, "{t}: uptime {up} s, the host's is {host_up}");
                if host_up > 60.0 {
                    assert!(up < host_up - 30.0, "{t}: the host's uptime: {up}");
                }
                assert_eq!(lines[2], "refused", "{t}: the boot id is writable");
                lines[0].to_string()
            })
            .collect();
        for id in &ids {
            assert_eq!(id.len(), 36, "{t}: {id}");
            assert_eq!(&id[14..15], "4", "{t}: a version 4 UUID: {id}");
            assert_ne!(id.as_str(), host_boot.trim(), "{t}: the host's boot id");
        }
        assert_ne!(ids[0], ids[1], "{t}: two sandboxes, one boot id");
    }
}

/// A sandbox limited to fewer CPUs than the host has runs on that many
/// (its affinity: `nproc`) and shows the same ones online
/// (`/sys/devices/system/cpu/online`, read-only), so Python's
/// `os.cpu_count()` (and the pools sized by it) count its limit; without a
/// limit, the host's.
#[test]
fn the_cpu_limit_is_the_cpu_count_libraries_see() {
    require_root!();
    let host = std::thread::available_parallelism().unwrap().get();
    let count = |args: &[&str]| {
        let mut argv = vec!["run"];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&[
            "--",
            "sh",
            "-c",
            "python3 -c 'import os; print(os.cpu_count())'; \
             echo 0 > /sys/devices/system/cpu/online 2>/dev/null || echo refused; \
             grep -c ^processor /proc/cpuinfo; nproc; \
             test \"$(grep Cpus_allowed_list /proc/self/status | cut -f2)\" = \
                  \"$(cat /sys/devices/system/cpu/online)\" && echo same-cpus",
        ]);
        let out = brig().args(&argv).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(count(&["--cpus", "1"]), "1\nrefused\n1\n1\nsame-cpus\n");
    assert_eq!(count(&["--cpus", "0.5"]), "1\nrefused\n1\n1\nsame-cpus\n");
    assert_eq!(
        count(&[]),
        format!("{host}\nrefused\n{host}\n{host}\nsame-cpus\n")
    );
    if host > 2 {
        assert_eq!(count(&["--cpus", "1.5"]), "2\nrefused\n2\n2\nsame-cpus\n");
    } else {
        println!("skipped: --cpus 1.5 shows 2 CPUs only on a host with more than 2 ({host} here)");
    }
}

/// A sandbox's memory limit is its machine's memory to `free` and psutil
/// (/proc/meminfo, read-only); a limit above the host's hides nothing.
#[test]
fn the_memory_limit_is_the_memory_free_shows() {
    require_root!();
    let script = "free -b | awk '/^Mem:/ {print $2, $4}'; \
                  grep -c . /proc/meminfo; \
                  echo x > /proc/meminfo 2>/dev/null || echo refused";
    let free = |memory: &str| {
        let out = brig()
            .args(["run", "--memory", memory, "--", "sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let host_lines = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .count();
    let shown = free("256m");
    let mut lines = shown.lines();
    let (total, free_now) = lines.next().unwrap().split_once(' ').unwrap();
    assert_eq!(total, (256u64 << 20).to_string(), "{shown}");
    assert!(free_now.parse::<u64>().unwrap() <= 256 << 20, "{shown}");
    assert_eq!(
        lines.next(),
        Some(host_lines.to_string().as_str()),
        "{shown}"
    );
    assert_eq!(lines.next(), Some("refused"), "{shown}");
    // Above the host's memory: the host's figures.
    let host_total = std::fs::read_to_string("/proc/meminfo").unwrap();
    let host_kb: u64 = host_total
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let big = free(&format!("{}m", host_kb / 1024 + 1024));
    assert_eq!(
        big.split_once(' ').unwrap().0,
        (host_kb * 1024).to_string(),
        "{big}"
    );
}

#[test]
fn env_workdir_and_user_apply() {
    require_root!();
    for t in templates() {
        let o = run(
            &t,
            &[
                "--env",
                "GREETING=hi there",
                "--workdir",
                "/work/dir",
                "--user",
                "nobody",
            ],
            &["sh", "-c", "echo \"$GREETING\"; pwd; id -un; echo $HOME"],
        );
        assert_eq!(
            stdout(&o),
            "hi there\n/work/dir\nnobody\n/nonexistent\n",
            "{t}: {}",
            stderr(&o)
        );
        let o = run(&t, &["--user", "1234:5678"], &["id"]);
        assert!(
            stdout(&o).starts_with("uid=1234 gid=5678"),
            "{t}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn workdir_symlinks_and_dotdot_stay_inside() {
    require_root!();
    let o = run(
        "host",
        &["--workdir", "/tmp/../../../../root"],
        &["sh", "-c", "pwd; ls -A"],
    );
    assert_eq!(stdout(&o), "/root\n", "{}", stderr(&o));
}

#[test]
fn memory_limit_kills_the_sandbox_with_137() {
    require_root!();
    for t in templates() {
        let o = run(
            &t,
            &["--memory", "64M"],
            &[
                "sh",
                "-c",
                "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo survived",
            ],
        );
        assert_eq!(o.status.code(), Some(137), "{t}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("brig: out of memory (limit 64 MiB)"),
            "{t}: {}",
            stderr(&o)
        );
        assert!(!stdout(&o).contains("survived"));
    }
}

#[test]
fn timeout_kills_everything_with_124() {
    require_root!();
    let start = Instant::now();
    let o = run(
        "host",
        &["--timeout", "1s"],
        &["sh", "-c", "sleep 30 & sleep 30"],
    );
    assert_eq!(o.status.code(), Some(124));
    assert!(
        stderr(&o).contains("brig: timed out after 1s; the sandbox was killed"),
        "{}",
        stderr(&o)
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn disk_limit_gives_enospc_inside() {
    require_root!();
    for t in templates() {
        for dir in ["/", "/tmp"] {
            let script =
                format!("dd if=/dev/zero of={dir}/fill bs=1M count=64 2>&1; stat -c %s {dir}/fill");
            let o = run(&t, &["--disk", "16M"], &["sh", "-c", &script]);
            let out = stdout(&o);
            assert!(out.contains("No space left on device"), "{t} {dir}: {out}");
            let size: u64 = out.lines().last().unwrap().trim().parse().unwrap();
            assert!(size <= 16 << 20, "{t} {dir}: wrote {size} bytes");
        }
    }
}

#[test]
fn pids_limit_contains_a_fork_storm() {
    require_root!();
    // The storm runs in an inner shell (dash exits when a fork fails); the
    // outer one counts with builtins only, since forking is exhausted.
    let script = "sh -c 'for i in $(seq 60); do sleep 3 & done' 2>/dev/null; n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n";
    let o = run(
        "host",
        &["--pids", "16", "--timeout", "20s"],
        &["sh", "-c", script],
    );
    let n: u32 = stdout(&o)
        .trim()
        .lines()
        .last()
        .unwrap_or("999")
        .parse()
        .unwrap_or(999);
    assert!(
        n <= 16,
        "{n} processes alive under --pids 16: {}",
        stderr(&o)
    );
    // And the host can still fork.
    assert!(std::process::Command::new("true")
        .status()
        .unwrap()
        .success());
}

#[test]
fn cpus_sets_a_cfs_quota() {
    require_root!();
    let mut child = brig()
        .args([
            "run",
            "--cpus",
            "0.25",
            "--timeout",
            "5s",
            "--",
            "sh",
            "-c",
            "hostname; while :; do :; done",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut id = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut id)
        .unwrap();
    let quota = ["/sys/fs/cgroup/cpu/brig", "/sys/fs/cgroup/brig"]
        .iter()
        .find_map(|base| {
            let id = id.trim();
            std::fs::read_to_string(format!("{base}/{id}/cpu.cfs_quota_us"))
                .or_else(|_| std::fs::read_to_string(format!("{base}/{id}/cpu.max")))
                .ok()
        })
        .expect("a cpu cgroup for the sandbox");
    assert!(quota.trim().starts_with("25000"), "quota {quota:?}");
    signal(child.id(), libc::SIGTERM);
    assert_eq!(child.wait().unwrap().code(), Some(143));
}

/// The quota is enforced, not only written: a command that spins for 1.5 s
/// of wall time under `--cpus 0.25` gets at most a quarter of it (CFS: 25
/// ms per 100 ms period), where unthrottled it would take a whole core.
#[test]
fn cpus_bounds_the_cpu_time_a_spinning_command_gets() {
    require_root!();
    let script = "import os, time\n\
                  t = time.monotonic()\n\
                  while time.monotonic() - t < 1.5: pass\n\
                  c = os.times()\n\
                  print(c.user + c.system, time.monotonic() - t)";
    let out = brig()
        .args(["run", "--cpus", "0.25", "--", "python3", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut nums = text.split_whitespace().map(|n| n.parse::<f64>().unwrap());
    let (cpu, wall) = (nums.next().unwrap(), nums.next().unwrap());
    // 0.25 x wall, plus one period of slack.
    assert!(
        cpu <= 0.25 * wall + 0.1,
        "{cpu:.2} s of CPU in {wall:.2} s under --cpus 0.25"
    );
    assert!(cpu > 0.1, "it did run: {cpu:.2} s");
}

/// Start `brig run -- sh -c 'hostname; <rest>'` and return the child and
/// the sandbox id it printed.
fn start_with_id(args: &[&str], rest: &str) -> (std::process::Child, String) {
    let mut child = brig()
        .arg("run")
        .args(args)
        .args(["--", "sh", "-c", &format!("hostname; {rest}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut id = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut id)
        .unwrap();
    (child, id.trim().to_string())
}

fn assert_nothing_left(id: &str, how: &str) {
    assert!(id.len() == 12, "{how}: bad id {id:?}");
    assert!(
        eventually(Duration::from_secs(5), || processes_of(id).is_empty()),
        "{how}: processes left: {:?}",
        processes_of(id)
    );
    // Reconcile runs at the start of every brig run.
    let _ = run("host", &[], &["true"]);
    for d in cgroup_dirs(id) {
        assert!(!d.exists(), "{how}: cgroup {} left behind", d.display());
    }
    assert!(
        host_mounts_matching("/run/brig/mnt").is_empty(),
        "{how}: host mounts {:?}",
        host_mounts_matching("/run/brig")
    );
    let staging: Vec<_> = std::fs::read_dir("/run/brig/mnt").unwrap().collect();
    assert!(staging.is_empty(), "{how}: staging dir not empty");
    // The liveness lock file goes with the sandbox (or with reconcile).
    assert!(
        !std::path::Path::new("/run/brig/live").join(id).exists(),
        "{how}: liveness file left"
    );
}

#[test]
fn nothing_remains_after_a_normal_exit() {
    require_root!();
    let (child, id) = start_with_id(&[], "sleep 0.2 & exit 0");
    assert!(child.wait_with_output().unwrap().status.success());
    assert_nothing_left(&id, "normal exit");
}

#[test]
fn nothing_remains_after_a_timeout() {
    require_root!();
    let (child, id) = start_with_id(&["--timeout", "1s"], "sleep 60 & sleep 60");
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(124));
    assert_nothing_left(&id, "timeout");
}

#[test]
fn nothing_remains_after_an_oom_kill() {
    require_root!();
    let (child, id) = start_with_id(
        &["--memory", "32M"],
        "sleep 30 & x=$(head -c 200000000 /dev/zero | tr '\\0' a)",
    );
    assert_eq!(child.wait_with_output().unwrap().status.code(), Some(137));
    assert_nothing_left(&id, "oom");
}

#[test]
fn nothing_remains_after_brig_is_sigkilled() {
    require_root!();
    let (mut child, id) = start_with_id(&[], "sleep 60 & sleep 60");
    assert!(
        !processes_of(&id).is_empty(),
        "the sandbox should be running"
    );
    child.kill().unwrap(); // SIGKILL: brig gets no chance to clean up
    child.wait().unwrap();
    assert_nothing_left(&id, "SIGKILL of brig");
}

#[test]
fn sigterm_to_brig_tears_the_sandbox_down() {
    require_root!();
    let (mut child, id) = start_with_id(&[], "trap '' TERM; sleep 60");
    signal(child.id(), libc::SIGTERM);
    assert_eq!(child.wait().unwrap().code(), Some(143));
    assert_nothing_left(&id, "SIGTERM to brig");
}

#[test]
fn two_sandboxes_get_disjoint_host_uids() {
    require_root!();
    let spawn = || {
        brig()
            .args([
                "run",
                "--",
                "sh",
                "-c",
                "hostname; cat /proc/self/uid_map; sleep 1",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (oa, ob) = (
        stdout(&a.wait_with_output().unwrap()),
        stdout(&b.wait_with_output().unwrap()),
    );
    // hostname, then "0 <host base> 65536"
    let fields = |o: &str| o.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let (fa, fb) = (fields(&oa), fields(&ob));
    assert_ne!(fa[0], fb[0], "sandbox ids");
    let (ba, bb): (u64, u64) = (fa[2].parse().unwrap(), fb[2].parse().unwrap());
    assert!(ba.abs_diff(bb) >= 65536, "uid ranges overlap: {ba} {bb}");
}

/// A pty pair for driving `brig run -t` as a terminal would.
fn openpty(rows: u16, cols: u16) -> (OwnedFd, OwnedFd) {
    let (mut m, mut s) = (0, 0);
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: valid out-pointers and winsize.
    let r = unsafe { libc::openpty(&mut m, &mut s, std::ptr::null_mut(), std::ptr::null(), &ws) };
    assert_eq!(r, 0, "openpty");
    // SAFETY: fresh descriptors from openpty.
    unsafe { (OwnedFd::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
}

/// In `run_on_pty` input: resize the terminal to 50x120 instead of typing.
const RESIZE: &[u8] = b"\0resize";

fn run_on_pty(cmd: &[&str], input: &[(&str, &[u8])]) -> (String, Option<i32>) {
    run_on_pty_with(&[], cmd, input)
}

/// [`run_on_pty`] with `brig run` options before the command.
fn run_on_pty_with(
    options: &[&str],
    cmd: &[&str],
    input: &[(&str, &[u8])],
) -> (String, Option<i32>) {
    let (master, slave) = openpty(33, 101);
    let mut c = brig();
    c.args(["run", "-t"]).args(options).arg("--").args(cmd);
    // The vm tier's guest kernel and images, fetched and built once for
    // every test.
    c.env("BRIG_VM_HOME", brig_test_support::test_cache().join("vm"));
    // The caller's terminal type, which every tier passes on.
    c.env("TERM", "xterm-256color");
    c.stdin(Stdio::from(slave.try_clone().unwrap()))
        .stdout(Stdio::from(slave.try_clone().unwrap()))
        .stderr(Stdio::from(slave));
    // SAFETY: setsid/ioctl in the child before exec are async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::setsid();
            libc::ioctl(0, libc::TIOCSCTTY, 0);
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    drop(c);
    let mut m = std::fs::File::from(master);
    let mut reader = m.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = String::new();
    for (wait_for, send) in input {
        // Long enough for a vm guest to boot under TCG on a loaded host;
        // a passing run waits only as long as the output takes.
        let end = Instant::now() + Duration::from_secs(60);
        while !seen.contains(wait_for) && Instant::now() < end {
            if let Ok(chunk) = rx.recv_timeout(Duration::from_millis(100)) {
                seen.push_str(&String::from_utf8_lossy(&chunk));
            }
        }
        if *send == RESIZE {
            // As a terminal emulator does: set the size on our side; the
            // kernel tells brig (SIGWINCH), brig tells the sandbox.
            let ws = libc::winsize {
                ws_row: 50,
                ws_col: 120,
                ws_xpixel: 0,
                ws_ypixel: 0,
            };
            use std::os::fd::AsRawFd;
            // SAFETY: ioctl on our pty master with a valid winsize.
            unsafe { libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        } else {
            m.write_all(send).unwrap();
        }
    }
    let status = child.wait().unwrap();
    while let Ok(chunk) = rx.recv_timeout(Duration::from_millis(300)) {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    (seen, status.code())
}

#[test]
fn tty_gives_a_terminal_with_the_callers_size() {
    require_root!();
    let (out, code) = run_on_pty(
        &[
            "sh",
            "-c",
            "tty; stty size; test -t 0 && echo stdin-is-tty; echo term=$TERM",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("term=xterm-256color"),
        "the caller's TERM: {out}"
    );
    assert!(out.contains("/dev/pts/0"), "{out}");
    assert!(out.contains("33 101"), "{out}");
    assert!(out.contains("stdin-is-tty"), "{out}");
}

#[test]
fn ctrl_c_reaches_the_command_through_the_tty() {
    require_root!();
    let script = "trap 'echo got-sigint; exit 3' INT; echo ready; sleep 20 & wait";
    let (out, code) = run_on_pty(&["sh", "-c", script], &[("ready", b"\x03")]);
    assert!(out.contains("got-sigint"), "{out}");
    assert_eq!(code, Some(3), "{out}");
}

#[test]
fn an_interactive_shell_reads_from_the_tty() {
    require_root!();
    let (out, code) = run_on_pty(&["sh"], &[("#", b"echo $((40+2))\n"), ("42", b"exit 5\n")]);
    assert!(out.contains("42"), "{out}");
    assert_eq!(code, Some(5), "{out}");
}

/// `-t` on the gvisor tier: runsc's terminal (its master over the
/// console socket) of the caller's size, both standard streams terminals,
/// ^C and a resize (its size and SIGWINCH) reaching the command, a shell
/// reading from it, its exit status; nothing left.
#[test]
fn tty_works_on_gvisor_too() {
    require_root!();
    if !support::tier_or_skip("gvisor") {
        return;
    }
    tty_works_on(
        &["--isolation", "gvisor", "--network", "none"],
        "gVisor",
        "gvisor",
    );
}

/// `-t` on the vm tier: the guest's own terminal (the agent's PTY exec),
/// relayed through a raw local one; the same checks as on gvisor.
#[test]
fn tty_works_on_vm_too() {
    require_root!();
    if !support::tier_or_skip("vm") {
        return;
    }
    let Some(rootfs) = support::rootfs() else {
        support::skip(
            "BRIG_TEST_ROOTFS is not set; scripts/test builds a Debian rootfs and sets it",
        );
        return;
    };
    let template = format!("dir:{}", rootfs.display());
    tty_works_on(
        &[
            "--isolation",
            "vm",
            "--network",
            "none",
            "--template",
            &template,
        ],
        "Linux version",
        "vm",
    );
}

/// The terminal checks of a tier other than the process tier (`brig run
/// -t OPTIONS`): two sandboxes, one run through, one interactive.
/// `kernel` is what the sandbox's kernel log starts with; its state lives
/// in `/run/brig/<dir>/<id>`.
fn tty_works_on(options: &[&str], kernel: &str, dir: &str) {
    let (out, code) = run_on_pty_with(
        options,
        &[
            "sh",
            "-c",
            "stty size; test -t 0 && test -t 1 && echo both-are-ttys; dmesg | head -1; \
             echo term=$TERM; echo id=$(hostname)",
        ],
        &[],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("33 101"), "{out}");
    assert!(out.contains("both-are-ttys"), "{out}");
    assert!(out.contains(kernel), "{out}");
    assert!(
        out.contains("term=xterm-256color"),
        "the caller's TERM: {out}"
    );
    // Its sandbox (named by its host name) is gone: directory, console
    // socket, the tier's processes.
    let id = out
        .split("id=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .expect("the sandbox's id")
        .to_string();
    assert!(
        eventually(Duration::from_secs(10), || {
            !std::path::Path::new("/run/brig")
                .join(dir)
                .join(&id)
                .exists()
                && support::pids_by_cmdline(|c| support::holds(c, &id)).is_empty()
        }),
        "sandbox {id} left something behind"
    );

    // Interactive: ^C to a trap, a line read from the terminal, a resize
    // seen by size and SIGWINCH, the exit status.
    // The INT trap ends the `sleep` itself: gVisor (this runsc) runs the
    // trap at once but does not interrupt bash's `wait` for it, which then
    // waits for the sleep to end (20 s).
    // No command substitution after the resize: bash 5.2 may run the
    // WINCH trap while it parses one and then fails it ("unexpected EOF
    // while looking for matching `)'"), the trap's line lost.
    let script = "trap 'echo got-winch' WINCH; trap 'echo got-sigint; kill $!' INT; echo ready; \
                  sleep 20 & wait; echo after-wait; read x; echo read:$x; \
                  i=0; while [ $i -lt 50 ]; do stty size > /tmp/size; read s < /tmp/size; \
                  [ \"$s\" = '50 120' ] && break; sleep 0.1; i=$((i+1)); done; echo size $s; exit 5";
    let (out, code) = run_on_pty_with(
        options,
        &["bash", "-c", script],
        &[
            ("ready", b"\x03"),
            ("after-wait", RESIZE),
            ("after-wait", b"typed\n"),
        ],
    );
    assert!(out.contains("got-sigint"), "{out}");
    assert!(out.contains("read:typed"), "{out}");
    assert!(out.contains("size 50 120"), "{out}");
    assert!(out.contains("got-winch"), "the resize's SIGWINCH: {out}");
    assert_eq!(code, Some(5), "{out}");
}

#[test]
fn a_missing_kernel_feature_is_named_with_its_fix() {
    require_root!();
    // cgroups hidden (a private mount namespace with an empty tmpfs over
    // /sys/fs/cgroup), as on a host without the controllers mounted.
    let o = std::process::Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            &format!("mount -t tmpfs none /sys/fs/cgroup && exec {BRIG} run -- true"),
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no usable cgroup hierarchy") && stderr(&o).contains("brig doctor"),
        "{}",
        stderr(&o)
    );
    // Root of a nested user namespace is not root enough.
    let o = std::process::Command::new("unshare")
        .args(["-Ur", BRIG, "run", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("needs root in the host's user namespace"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn window_size_changes_reach_the_command() {
    require_root!();
    // The resize travels the host terminal -> SIGWINCH to brig -> the
    // sandbox's terminal, concurrently with the newline that follows it:
    // wait up to 5 s for it to land (it never does if brig drops it).
    let script = "echo ready; read x; for i in $(seq 50); do s=$(stty size); \
                  [ \"$s\" = '50 120' ] && break; sleep 0.1; done; echo $s";
    let (out, code) = run_on_pty(
        &["sh", "-c", script],
        &[("ready", RESIZE), ("ready", b"\n")],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("50 120"), "{out}");
}

/// `-t` with stdin a pipe: refused at once, as docker does (the terminal in
/// the sandbox would never see an end of input, and `cat` would wait
/// forever).
#[test]
fn a_tty_needs_a_terminal_on_stdin() {
    require_root!();
    let mut child = brig()
        .args(["run", "-t", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // brig may refuse (and close its stdin) before this is written.
    let _ = child.stdin.take().unwrap().write_all(b"x\n");
    let ended = eventually(Duration::from_secs(10), || {
        child.try_wait().unwrap().is_some()
    });
    if !ended {
        let _ = child.kill();
        panic!("brig run -t with piped stdin hung");
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("the input device is not a TTY"),
        "{}",
        stderr(&out)
    );
}
