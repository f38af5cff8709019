//! `brig snapshot create|ls|rm`, `brig create --from-snapshot` and
//! `brig fork` through the real binary against a real daemon, as a user
//! runs them: what a snapshot keeps, names and ids, forks that are their
//! own, and clear errors for what is not a snapshot.

mod support;

use std::process::Output;

use support::{brig, start_daemon, stderr, stdout, stop_daemon};

#[test]
fn snapshots_and_forks_from_the_cli() {
    require_root!();
    let rootfs = require_rootfs!();
    let home = tempfile::tempdir().unwrap();
    let (mut daemon, url, log) = start_daemon(home.path(), &[]);
    std::thread::spawn(move || for _ in log {});
    let cli = |args: &[&str]| -> Output {
        brig()
            .args(args)
            .env("BRIG_HOME", home.path())
            .env("BRIG_URL", &url)
            .output()
            .unwrap()
    };
    let ok = |args: &[&str]| -> String {
        let out = cli(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    let template = format!("dir:{}", rootfs.display());
    let parent = ok(&["create", "--name", "dev", "--template", &template]);
    let parent = parent.trim();
    ok(&["exec", "dev", "--", "sh", "-c", "echo kept > /root/work"]);

    let snap = ok(&["snapshot", "create", "dev", "--name", "ready"]);
    let snap = snap.trim();
    assert!(snap.starts_with("snap-"), "{snap}");
    let listed = ok(&["snapshot", "ls"]);
    assert!(
        listed.contains(snap) && listed.contains("ready") && listed.contains(parent),
        "{listed}"
    );
    // The process tier keeps files: the KEEPS column says so.
    let row = listed.lines().find(|l| l.contains(snap)).unwrap();
    assert!(
        listed.lines().next().unwrap().contains("KEEPS") && row.contains(" files "),
        "{listed}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["snapshot", "ls", "--json", "--sandbox", "dev"])).unwrap();
    assert_eq!(json[0]["id"], snap, "{json}");

    for from in ["ready", snap] {
        let child = ok(&["create", "--from-snapshot", from]);
        assert_eq!(
            ok(&["exec", child.trim(), "--", "cat", "/root/work"]),
            "kept\n"
        );
    }

    ok(&["exec", "dev", "--", "sh", "-c", "echo later > /root/work"]);
    let forks = ok(&["fork", "dev", "-n", "2"]);
    let forks: Vec<&str> = forks.lines().collect();
    assert_eq!(forks.len(), 2, "{forks:?}");
    for f in &forks {
        assert_eq!(ok(&["exec", f, "--", "cat", "/root/work"]), "later\n");
    }
    ok(&[
        "exec",
        forks[0],
        "--",
        "sh",
        "-c",
        "echo fork0 > /root/work",
    ]);
    assert_eq!(
        ok(&["exec", forks[1], "--", "cat", "/root/work"]),
        "later\n"
    );
    assert_eq!(ok(&["exec", "dev", "--", "cat", "/root/work"]), "later\n");

    ok(&["snapshot", "rm", "ready"]);
    let gone = cli(&["create", "--from-snapshot", "ready"]);
    assert!(!gone.status.success());
    assert!(
        stderr(&gone).contains("no snapshot ready"),
        "{}",
        stderr(&gone)
    );
    let host = ok(&["create"]);
    let refused = cli(&["snapshot", "create", host.trim()]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("no files of its own"),
        "{}",
        stderr(&refused)
    );
    stop_daemon(&mut daemon);
}

/// A sandbox made from a snapshot holds the snapshot's layers across a
/// `kill -9` of the daemon: the next daemon re-adopts it and holds them
/// again, so removing the snapshot and pruning leaves the sandbox's files
/// in place; once it ends, the layers go.
#[test]
fn a_sandbox_on_a_snapshot_keeps_its_layers_through_a_daemon_restart() {
    require_root!();
    let rootfs = require_rootfs!();
    let home = tempfile::tempdir().unwrap();
    let start = || {
        let (daemon, url, log) = start_daemon(home.path(), &[]);
        std::thread::spawn(move || for _ in log {});
        (daemon, url)
    };
    let (mut first, url) = start();
    let cli = |url: &str, args: &[&str]| -> String {
        let out = brig()
            .args(args)
            .env("BRIG_HOME", home.path())
            .env("BRIG_URL", url)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    };
    let template = format!("dir:{}", rootfs.display());
    let parent = cli(&url, &["create", "--template", &template]);
    cli(
        &url,
        &[
            "exec",
            parent.trim(),
            "--",
            "sh",
            "-c",
            "echo kept > /root/work",
        ],
    );
    let snap = cli(&url, &["snapshot", "create", parent.trim()]);
    let child = cli(&url, &["create", "--from-snapshot", snap.trim()]);
    let child = child.trim().to_string();
    support::signal(first.id(), libc::SIGKILL);
    let _ = first.wait();

    let (mut second, url) = start();
    let layers = || {
        std::fs::read_dir(home.path().join("images/layers"))
            .unwrap()
            .count()
    };
    cli(&url, &["snapshot", "rm", snap.trim()]);
    cli(&url, &["template", "prune"]);
    assert_eq!(
        cli(&url, &["exec", &child, "--", "cat", "/root/work"]),
        "kept\n",
        "the adopted sandbox lost its snapshot's files"
    );
    let with_child = layers();
    assert!(with_child >= 1, "{with_child}");
    cli(&url, &["kill", &child]);
    assert!(
        support::eventually(std::time::Duration::from_secs(20), || {
            cli(&url, &["template", "prune"]);
            layers() < with_child
        }),
        "the snapshot's layer stayed after its last sandbox ended"
    );
    stop_daemon(&mut second);
}
