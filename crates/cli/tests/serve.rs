//! `brig serve` end to end: the real daemon on a free loopback port with a
//! fresh home, driven by the real CLI (`brig create`, `exec`, `ls`, `kill`)
//! with the key the daemon wrote for it; then nothing of the sandbox may
//! remain on the host, and SIGTERM stops the daemon cleanly.

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use support::{cgroup_dirs, eventually, processes_of, BRIG};

/// The agent binary cargo built next to brig (the workspace build makes it
/// for the agent's own tests).
fn agent() -> PathBuf {
    Path::new(BRIG).with_file_name("brig-agent")
}

struct Daemon {
    child: Child,
    url: String,
    home: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let home = tempfile::tempdir().unwrap();
        let mut child = Command::new(BRIG)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env("BRIG_HOME", home.path())
            .env("BRIG_AGENT", agent())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start brig serve");
        // The daemon prints the address it chose; read up to it.
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines
                .next()
                .expect("brig serve exited before listening")
                .unwrap();
            if let Some(url) = line.strip_prefix("brig: listening on ") {
                break url.to_string();
            }
        };
        // Keep draining stderr so the daemon never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Daemon { child, url, home }
    }

    fn brig(&self, args: &[&str]) -> Output {
        Command::new(BRIG)
            .args(args)
            .env("BRIG_URL", &self.url)
            .env("BRIG_HOME", self.home.path())
            .env_remove("BRIG_API_KEY")
            .output()
            .unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn the_cli_drives_sandboxes_on_a_real_daemon() {
    require_root!();
    assert!(
        agent().exists(),
        "{} is missing: build the workspace (cargo build) first",
        agent().display()
    );
    let mut daemon = Daemon::start();

    // The first key was written for the local CLI, readable by root only.
    let key = daemon.home.path().join("local.key");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);

    let out = daemon.brig(&["create", "--label", "test=serve"]);
    assert!(out.status.success(), "create: {}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    assert_eq!(id.len(), 12, "create prints the id: {id:?}");

    let out = daemon.brig(&["exec", &id, "--", "echo", "hi"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n");

    let out = daemon.brig(&["exec", &id, "--", "sh", "-c", "echo bye >&2; exit 3"]);
    assert_eq!(out.status.code(), Some(3), "the command's status");
    assert_eq!(text(&out.stderr), "bye\n");

    // A missing command is 127, as with `brig run`.
    let out = daemon.brig(&["exec", &id, "--", "definitely-not-a-command"]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("definitely-not-a-command"),
        "{}",
        text(&out.stderr)
    );

    // The sandbox's processes are where its cgroups are.
    assert!(
        !processes_of(&id).is_empty(),
        "the agent runs in the sandbox's cgroups"
    );

    let out = daemon.brig(&["ls", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["id"], id.as_str(), "{list}");
    assert_eq!(list[0]["state"], "running", "{list}");

    let out = daemon.brig(&["kill", &id]);
    assert!(out.status.success(), "kill: {}", text(&out.stderr));
    // `kill` answers once the teardown is done: nothing may be left.
    assert!(
        processes_of(&id).is_empty(),
        "processes left: {:?}",
        processes_of(&id)
    );
    let left: Vec<_> = cgroup_dirs(&id)
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(left.is_empty(), "cgroups left: {left:?}");
    let out = daemon.brig(&["ls", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["state"], "stopped", "{list}");

    let out = daemon.brig(&["exec", &id, "--", "true"]);
    assert_eq!(
        out.status.code(),
        Some(125),
        "exec in an ended sandbox fails"
    );
    assert!(
        text(&out.stderr).contains("not running"),
        "{}",
        text(&out.stderr)
    );

    // A sandbox still running when the daemon is told to stop is ended.
    let out = daemon.brig(&["create"]);
    let second = text(&out.stdout).trim().to_string();
    assert!(!processes_of(&second).is_empty());
    support::signal(daemon.child.id(), libc::SIGTERM);
    let status = daemon.child.wait().unwrap();
    assert!(
        status.success(),
        "brig serve exits 0 on SIGTERM: {status:?}"
    );
    assert!(eventually(Duration::from_secs(5), || processes_of(&second).is_empty()));
    let left: Vec<_> = cgroup_dirs(&second)
        .into_iter()
        .filter(|d| d.exists())
        .collect();
    assert!(left.is_empty(), "cgroups left after shutdown: {left:?}");
}

#[test]
fn client_commands_without_a_key_say_what_to_set() {
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(BRIG)
        .args(["ls"])
        .env("BRIG_HOME", home.path())
        .env("BRIG_URL", "http://127.0.0.1:9")
        .env_remove("BRIG_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("BRIG_API_KEY"),
        "{}",
        text(&out.stderr)
    );
}
