//! `kill -9` of `brig serve` at any moment loses nothing and leaks nothing.
//!
//! Sandboxes outlive the daemon (brig-runtime's manager): each round starts
//! the real daemon on a fresh home, gives it work (live sandboxes with a
//! streaming `exec`, a background process and an upload in flight; in some
//! rounds creates in flight too), SIGKILLs it after a different delay, and
//! starts a new daemon on the same home. Then:
//!
//! - every record is `running` or `dead`, none `creating`: a create the
//!   kill cut short left nothing half-made (its processes, namespaces,
//!   mounts and cgroups are gone), and every create that was answered is
//!   `running`, adopted, with its background process still there;
//! - every process the old daemon had started that is still alive belongs
//!   to a `running` sandbox;
//! - a SIGTERM of the new daemon ends them all, and then nothing is left:
//!   no process, no process in the sandboxes' network or mount namespaces
//!   (so the namespaces are gone), no mount naming a sandbox, no cgroup.
//!
//! Needs root.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{eventually, host_mounts_matching, BRIG};

const ROUNDS: u64 = 8;

struct Daemon {
    child: Child,
    url: String,
    key: String,
}

impl Daemon {
    fn start(home: &Path) -> Daemon {
        let (child, url, lines) = support::start_daemon(home, &[]);
        std::thread::spawn(move || for _ in lines {});
        let key = std::fs::read_to_string(home.join("local.key"))
            .unwrap()
            .trim()
            .to_string();
        Daemon { child, url, key }
    }

    fn get(&self, path: &str) -> Result<Value, Box<ureq::Error>> {
        let resp = ureq::get(&format!("{}{path}", self.url))
            .set("Authorization", &format!("Bearer {}", self.key))
            .call()?;
        Ok(resp.into_json().unwrap_or(Value::Null))
    }

    fn post(&self, path: &str, body: Value) -> Result<Value, Box<ureq::Error>> {
        let resp = ureq::post(&format!("{}{path}", self.url))
            .set("Authorization", &format!("Bearer {}", self.key))
            .send_json(body)?;
        Ok(resp.into_json().unwrap_or(Value::Null))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        support::stop_daemon(&mut self.child);
    }
}

/// A process as seen just before the kill: enough to tell it from a later
/// process that reuses its pid, and the namespaces it was in.
#[derive(Debug)]
struct Seen {
    pid: u32,
    start_time: String,
    net: String,
    mnt: String,
    cgroups: Vec<String>,
}

fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22, counted after the command name's closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19).map(str::to_string)
}

/// When `pid` started, in clock ticks since boot.
fn start_ticks(pid: u32) -> Option<u64> {
    start_time(pid)?.parse().ok()
}

/// Now, in clock ticks since boot (the unit of a process's start time).
fn uptime_ticks() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let secs: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: sysconf only reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (secs * hz).ceil() as u64
}

fn ppid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

fn ns(pid: u32, kind: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .map(|l| l.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Every descendant of `root`.
fn descendants(root: u32) -> Vec<Seen> {
    let parents: BTreeMap<u32, u32> = all_pids()
        .into_iter()
        .filter_map(|p| Some((p, ppid(p)?)))
        .collect();
    let mut found = BTreeSet::from([root]);
    loop {
        let more: Vec<u32> = parents
            .iter()
            .filter(|(p, pp)| found.contains(pp) && !found.contains(p))
            .map(|(p, _)| *p)
            .collect();
        if more.is_empty() {
            break;
        }
        found.extend(more);
    }
    found.remove(&root);
    found
        .into_iter()
        .filter_map(|pid| {
            let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(':').nth(2))
                .filter(|p| p.contains("/brig/"))
                .map(str::to_string)
                .collect();
            Some(Seen {
                pid,
                start_time: start_time(pid)?,
                net: ns(pid, "net"),
                mnt: ns(pid, "mnt"),
                cgroups,
            })
        })
        .collect()
}

/// A sandbox id from a cgroup path `.../brig/<id>[/...]`.
fn id_of(cgroup: &str) -> Option<String> {
    let after = &cgroup[cgroup.find("/brig/")? + "/brig/".len()..];
    Some(after.split('/').next()?.to_string())
}

/// `brig ls --json -a` against `daemon`: every record.
fn ls(daemon: &Daemon, home: &Path, round: u64) -> Value {
    let out = Command::new(BRIG)
        .args(["ls", "--json"])
        .env("BRIG_URL", &daemon.url)
        .env("BRIG_HOME", home)
        .env_remove("BRIG_API_KEY")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "round {round}: brig ls: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The cgroup directories of sandbox `id` that exist.
fn cgroups_left(id: &str) -> Vec<PathBuf> {
    support::cgroup_dirs(id)
        .into_iter()
        .filter(|d| d.exists())
        .collect()
}

/// A request body that is written slowly and never ends on its own.
struct Trickle(Arc<AtomicBool>);

impl Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.0.load(Ordering::Relaxed) {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_millis(5));
        let n = buf.len().min(16 * 1024);
        buf[..n].fill(b'x');
        Ok(n)
    }
}

/// Give the daemon work: live sandboxes, each with a streaming exec and a
/// background process, one with an upload in flight. The ids.
fn load(daemon: &Daemon, sandboxes: usize, stop: &Arc<AtomicBool>) -> Vec<String> {
    let mut ids = Vec::new();
    for n in 0..sandboxes {
        let sb = daemon.post("/v1/sandboxes", json!({})).expect("create");
        let id = sb["id"].as_str().unwrap().to_string();
        ids.push(id.clone());
        let _ = daemon.post(
            &format!("/v1/sandboxes/{id}/processes"),
            json!({"argv": ["sleep", "1000"], "background": true}),
        );
        let (url, key) = (daemon.url.clone(), daemon.key.clone());
        let exec_id = id.clone();
        std::thread::spawn(move || {
            let resp = ureq::post(&format!("{url}/v1/sandboxes/{exec_id}/exec"))
                .set("Authorization", &format!("Bearer {key}"))
                .send_json(json!({"argv": ["sh", "-c", "echo up; exec sleep 1000"]}));
            if let Ok(resp) = resp {
                // Read until the daemon dies under us.
                let _ = std::io::copy(&mut resp.into_reader(), &mut std::io::sink());
            }
        });
        if n == 0 {
            let (url, key, stop) = (daemon.url.clone(), daemon.key.clone(), Arc::clone(stop));
            std::thread::spawn(move || {
                let _ = ureq::put(&format!("{url}/v1/sandboxes/{id}/files?path=/tmp/upload"))
                    .set("Authorization", &format!("Bearer {key}"))
                    .send(Trickle(stop));
            });
        }
    }
    ids
}

#[test]
fn kill_9_of_the_daemon_at_any_moment_leaks_nothing() {
    require_root!();
    let host_net = ns(std::process::id(), "net");
    let host_mnt = ns(std::process::id(), "mnt");
    let started = Instant::now();

    for round in 0..ROUNDS {
        let home = tempfile::tempdir().unwrap();
        let mut daemon = Daemon::start(home.path());
        let stop = Arc::new(AtomicBool::new(false));

        let created = load(&daemon, 2, &stop);
        // Every other round, creates are in flight when the kill comes.
        if round % 2 == 1 {
            let (url, key) = (daemon.url.clone(), daemon.key.clone());
            std::thread::spawn(move || {
                while ureq::post(&format!("{url}/v1/sandboxes"))
                    .set("Authorization", &format!("Bearer {key}"))
                    .send_json(json!({}))
                    .is_ok()
                {}
            });
        }
        // A different moment in every round: 0 to ~350 ms into the load.
        std::thread::sleep(Duration::from_millis(round * 47 % 360));

        let seen = descendants(daemon.child.id());
        support::signal(daemon.child.id(), libc::SIGKILL);
        let killed_at = uptime_ticks();
        daemon.child.wait().unwrap();
        stop.store(true, Ordering::Relaxed);
        assert!(
            seen.iter().any(|s| !s.cgroups.is_empty()),
            "round {round}: the daemon had no sandbox when it was killed: {seen:?}"
        );
        let ids: BTreeSet<String> = seen
            .iter()
            .flat_map(|s| s.cgroups.iter().filter_map(|c| id_of(c)))
            .collect();

        // A new daemon on the same home settles every record.
        let mut daemon = Daemon::start(home.path());
        let list = ls(&daemon, home.path(), round);
        let records = list.as_array().unwrap();
        let running: BTreeSet<&str> = records
            .iter()
            .filter(|r| r["state"] == "running")
            .filter_map(|r| r["id"].as_str())
            .collect();
        for r in records {
            assert!(
                r["state"] == "running" || r["state"] == "dead",
                "round {round}: not settled: {r}"
            );
        }
        for id in &created {
            assert!(
                running.contains(id.as_str()),
                "round {round}: {id} was created but is not running after the restart: {list}"
            );
            let procs = daemon
                .get(&format!("/v1/sandboxes/{id}/processes"))
                .expect("list the processes of an adopted sandbox");
            assert!(
                procs.to_string().contains("sleep"),
                "round {round}: {id} lost its background process: {procs}"
            );
        }
        // Whatever still runs is an adopted sandbox's; the rest is gone.
        let alive = |s: &Seen| start_time(s.pid).is_some_and(|t| t == s.start_time);
        let stray = |s: &&Seen| {
            alive(s)
                && !s.cgroups.is_empty()
                && !s
                    .cgroups
                    .iter()
                    .filter_map(|c| id_of(c))
                    .any(|id| running.contains(id.as_str()))
        };
        assert!(
            eventually(Duration::from_secs(10), || !seen.iter().any(|s| stray(&s))),
            "round {round}: processes of no running sandbox: {:?}",
            seen.iter().filter(stray).collect::<Vec<_>>()
        );
        for id in ids.iter().filter(|id| !running.contains(id.as_str())) {
            assert_eq!(
                cgroups_left(id),
                Vec::<PathBuf>::new(),
                "round {round}: {id}"
            );
            assert!(
                host_mounts_matching(id).is_empty(),
                "round {round}: mounts of {id}"
            );
        }

        // SIGTERM ends them all; then nothing of any of them is left.
        support::stop_daemon(&mut daemon.child);
        assert!(
            eventually(Duration::from_secs(10), || !seen.iter().any(alive)),
            "round {round}: processes left: {:?}",
            seen.iter().filter(|s| alive(s)).collect::<Vec<_>>()
        );
        let sandbox_ns: BTreeSet<&str> = seen
            .iter()
            .flat_map(|s| [s.net.as_str(), s.mnt.as_str()])
            .filter(|n| !n.is_empty() && *n != host_net && *n != host_mnt)
            .collect();
        // Only processes started before the kill count: the kernel reuses a
        // freed namespace's inode number, and another test's new sandbox
        // may get one of these.
        let in_sandbox_ns = || -> Vec<(u32, String, String)> {
            all_pids()
                .into_iter()
                .filter(|&p| start_ticks(p).is_some_and(|t| t <= killed_at))
                .flat_map(|p| [(p, ns(p, "net")), (p, ns(p, "mnt"))])
                .filter(|(_, n)| sandbox_ns.contains(n.as_str()))
                .map(|(p, n)| {
                    let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                    (p, n, String::from_utf8_lossy(&cmd).replace('\0', " "))
                })
                .collect()
        };
        assert!(
            eventually(Duration::from_secs(10), || in_sandbox_ns().is_empty()),
            "round {round}: processes still in a sandbox's namespaces: {:?}",
            in_sandbox_ns()
        );
        let recorded: BTreeSet<&str> = records.iter().filter_map(|r| r["id"].as_str()).collect();
        for id in ids
            .iter()
            .map(String::as_str)
            .chain(recorded.iter().copied())
        {
            assert_eq!(
                cgroups_left(id),
                Vec::<PathBuf>::new(),
                "round {round}: {id}"
            );
            assert!(
                host_mounts_matching(id).is_empty(),
                "round {round}: mounts of {id}"
            );
            assert!(
                !Path::new(&format!("/run/brig/sb/{id}")).exists(),
                "round {round}: runtime directory of {id} left"
            );
        }
        eprintln!(
            "round {round}: {} sandboxes through the kill, {} adopted, {:?} so far",
            ids.len(),
            running.len(),
            started.elapsed()
        );
    }
}
