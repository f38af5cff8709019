//! Directory watches through the client against the real agent on the
//! host: the order and kinds of changes, recursive watches following new
//! subdirectories, errors, an unread watcher turning into one `overflow`,
//! many watches at once, and that ending a watch removes its inotify
//! watches from the agent.

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use brig_agent_client::{ChangeKind, ClientError, ErrorCode, FileKind, WatchEvent, Watcher};
use support::{within, Agent};

use ChangeKind::{Chmod, Create, Remove, Rename, Write};

fn tempdir() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "brig-watch-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).unwrap();
    dir.to_str().unwrap().to_string()
}

/// Read a watcher on its own thread, so the test can wait with a timeout.
fn pipe(w: Watcher) -> mpsc::Receiver<Result<WatchEvent, ClientError>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for item in w {
            if tx.send(item).is_err() {
                return;
            }
        }
    });
    rx
}

/// (kind, name) of every change until `want` arrived (or 10 s passed).
fn until(
    rx: &mpsc::Receiver<Result<WatchEvent, ClientError>>,
    want: (ChangeKind, &str),
) -> Vec<(ChangeKind, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Ok(WatchEvent::Change { kind, name, .. })) => {
                let done = kind == want.0 && name == want.1;
                seen.push((kind, name));
                if done {
                    return seen;
                }
            }
            Ok(other) => panic!("unexpected {other:?} after {seen:?}"),
            Err(_) => panic!("no {want:?} within 10s; saw {seen:?}"),
        }
    }
}

fn changes(list: &[(ChangeKind, &str)]) -> Vec<(ChangeKind, String)> {
    list.iter().map(|(k, n)| (*k, n.to_string())).collect()
}

/// The inotify watches the agent process holds (from /proc fdinfo).
fn agent_watches(agent: &Agent) -> usize {
    let dir = format!("/proc/{}/fdinfo", agent.child.id());
    fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| fs::read_to_string(e.ok()?.path()).ok())
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("inotify wd:"))
                .count()
        })
        .sum()
}

/// Poll `f` for up to 5 s until it is true.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "not within 5s: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn changes_arrive_in_order_with_their_kinds() {
    within(30, || {
        let agent = Agent::start();
        let dir = tempdir();
        let rx = pipe(agent.conn.watch(&dir, false).unwrap());

        let a = format!("{dir}/a.txt");
        fs::write(&a, b"one").unwrap();
        fs::set_permissions(&a, fs::Permissions::from_mode(0o600)).unwrap();
        fs::rename(&a, format!("{dir}/b.txt")).unwrap();
        fs::remove_file(format!("{dir}/b.txt")).unwrap();
        fs::create_dir(format!("{dir}/sub")).unwrap();
        fs::write(format!("{dir}/sub/deep"), b"not watched").unwrap();
        fs::remove_file(format!("{dir}/sub/deep")).unwrap();
        fs::remove_dir(format!("{dir}/sub")).unwrap();

        let seen = until(&rx, (Remove, "sub"));
        assert_eq!(
            seen,
            changes(&[
                (Create, "a.txt"),
                (Write, "a.txt"),
                (Chmod, "a.txt"),
                (Rename, "a.txt"),
                (Create, "b.txt"),
                (Remove, "b.txt"),
                (Create, "sub"),
                // Not recursive: nothing from inside sub.
                (Remove, "sub"),
            ])
        );
        fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn file_types_are_reported_when_known() {
    within(30, || {
        let agent = Agent::start();
        let dir = tempdir();
        let mut w = agent.conn.watch(&dir, false).unwrap();
        fs::create_dir(format!("{dir}/d")).unwrap();
        std::os::unix::fs::symlink("/nowhere", format!("{dir}/l")).unwrap();
        fs::write(format!("{dir}/f"), b"").unwrap();
        fs::remove_dir(format!("{dir}/d")).unwrap();
        let mut got = Vec::new();
        for _ in 0..4 {
            match w.recv().unwrap().unwrap() {
                WatchEvent::Change {
                    kind,
                    name,
                    file_type,
                } => got.push((kind, name, file_type)),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            got,
            [
                (Create, "d".to_string(), Some(FileKind::Dir)),
                (Create, "l".to_string(), Some(FileKind::Symlink)),
                (Create, "f".to_string(), Some(FileKind::File)),
                (Remove, "d".to_string(), Some(FileKind::Dir)),
            ]
        );
        fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn recursive_watches_follow_new_and_moved_directories() {
    within(30, || {
        let agent = Agent::start();
        let dir = tempdir();
        fs::create_dir_all(format!("{dir}/old/inner")).unwrap();
        let rx = pipe(agent.conn.watch(&dir, true).unwrap());

        // Existing subdirectories are watched from the start.
        fs::write(format!("{dir}/old/inner/x"), b"1").unwrap();
        assert_eq!(
            until(&rx, (Create, "old/inner/x")),
            changes(&[(Create, "old/inner/x")])
        );

        // A new directory filled at once: whatever the watch missed while
        // being added is reported by the listing that follows it.
        fs::create_dir_all(format!("{dir}/new/a/b")).unwrap();
        fs::write(format!("{dir}/new/a/b/f"), b"hi").unwrap();
        let seen = until(&rx, (Create, "new/a/b/f"));
        for want in ["new", "new/a", "new/a/b"] {
            assert!(
                seen.contains(&(Create, want.to_string())),
                "{want}: {seen:?}"
            );
        }
        // And it is watched from then on.
        fs::write(format!("{dir}/new/a/b/g"), b"").unwrap();
        until(&rx, (Create, "new/a/b/g"));

        // A directory moved away stops being watched under its old name;
        // moved back in under a new one, it is watched under that.
        let outside = tempdir();
        fs::rename(format!("{dir}/old"), format!("{outside}/old")).unwrap();
        until(&rx, (Rename, "old"));
        fs::write(format!("{outside}/old/inner/ignored"), b"").unwrap();
        fs::rename(format!("{outside}/old"), format!("{dir}/back")).unwrap();
        fs::write(format!("{dir}/back/inner/y"), b"").unwrap();
        let seen = until(&rx, (Create, "back/inner/y"));
        assert!(
            !seen
                .iter()
                .any(|(_, n)| n.contains("ignored") && !n.starts_with("back/")),
            "{seen:?}"
        );
        assert_eq!(
            seen.first(),
            Some(&(Create, "back".to_string())),
            "{seen:?}"
        );
        fs::remove_dir_all(&dir).unwrap();
        fs::remove_dir_all(&outside).unwrap();
    });
}

#[test]
fn bad_paths_are_refused_with_the_agents_message() {
    within(30, || {
        let agent = Agent::start();
        let dir = tempdir();
        let err = agent.conn.watch(&format!("{dir}/nope"), false).unwrap_err();
        assert_eq!(err.agent_code(), Some(ErrorCode::NotFound), "{err}");
        assert_eq!(
            err.to_string(),
            format!("watch {dir}/nope: no such file or directory")
        );
        fs::write(format!("{dir}/file"), b"").unwrap();
        let err = agent.conn.watch(&format!("{dir}/file"), true).unwrap_err();
        assert_eq!(err.agent_code(), Some(ErrorCode::NotADirectory), "{err}");
        let err = agent.conn.watch("", false).unwrap_err();
        assert_eq!(err.agent_code(), Some(ErrorCode::InvalidRequest), "{err}");
        // The failed attempts left no watch behind.
        assert_eq!(agent_watches(&agent), 0);
        fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn removing_the_watched_directory_ends_the_watch_with_not_found() {
    within(30, || {
        let agent = Agent::start();
        let dir = tempdir();
        fs::create_dir(format!("{dir}/w")).unwrap();
        fs::write(format!("{dir}/w/f"), b"").unwrap();
        let mut w = agent.conn.watch(&format!("{dir}/w"), true).unwrap();
        fs::remove_dir_all(format!("{dir}/w")).unwrap();
        let mut last = None;
        loop {
            match w.recv() {
                Ok(Some(e)) => last = Some(e),
                Ok(None) => panic!("ended without an error; last {last:?}"),
                Err(e) => {
                    assert_eq!(e.agent_code(), Some(ErrorCode::NotFound), "{e}");
                    assert!(e.to_string().contains("was removed or moved"), "{e}");
                    break;
                }
            }
        }
        assert_eq!(
            last,
            Some(WatchEvent::Change {
                kind: Remove,
                name: "f".into(),
                file_type: None
            })
        );
        assert!(w.recv().unwrap().is_none());
        eventually("the agent dropped the watch", || agent_watches(&agent) == 0);
        fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn an_unread_watch_overflows_once_and_then_goes_on() {
    within(60, || {
        let agent = Agent::start();
        let dir = tempdir();
        let mut w = agent.conn.watch(&dir, false).unwrap();
        // Far more than the stream window (256 KiB) plus the agent's queue
        // (64 KiB) hold, with nobody reading.
        let long = "x".repeat(200);
        for i in 0..8000 {
            fs::write(format!("{dir}/{long}-{i:05}"), b"").unwrap();
        }
        // Let the agent take in the whole burst before anything is read.
        std::thread::sleep(Duration::from_millis(500));
        let mut changes = 0;
        loop {
            match w.recv().unwrap().unwrap() {
                WatchEvent::Overflow => break,
                WatchEvent::Change { .. } => changes += 1,
            }
        }
        // Changes after the overflow (once read) arrive again, and the
        // burst made exactly one overflow. (Burst changes the agent had not
        // read from the kernel yet may come first on a slow machine.)
        fs::write(format!("{dir}/after"), b"").unwrap();
        loop {
            match w.recv().unwrap().unwrap() {
                WatchEvent::Change { name, .. } if name == "after" => break,
                WatchEvent::Change { name, .. } => assert!(name.starts_with(&long), "{name}"),
                WatchEvent::Overflow => panic!("a second overflow"),
            }
        }
        // 8000 creates and 0 writes: some were dropped, not all.
        assert!(changes > 100 && changes < 8000, "{changes} changes");
        // VmRSS of the agent stays small.
        let status = fs::read_to_string(format!("/proc/{}/status", agent.child.id())).unwrap();
        let rss_kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        assert!(rss_kib < 32 << 10, "agent VmRSS {rss_kib} KiB");
        drop(w);
        fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn many_watches_at_once_and_ending_them_removes_the_kernel_watches() {
    within(60, || {
        let agent = Agent::start();
        let root = tempdir();
        let dirs: Vec<String> = (0..150)
            .map(|i| {
                let d = format!("{root}/d{i}");
                fs::create_dir(&d).unwrap();
                d
            })
            .collect();
        let mut watchers: Vec<_> = dirs
            .iter()
            .map(|d| agent.conn.watch(d, false).unwrap())
            .collect();
        // A second watch on a directory already watched shares its kernel
        // watch; the recursive one on the root adds 1 + 150 more uses.
        let mut shared = agent.conn.watch(&dirs[0], false).unwrap();
        let recursive = agent.conn.watch(&root, true).unwrap();
        assert_eq!(agent_watches(&agent), 151);

        for d in &dirs {
            fs::write(format!("{d}/f"), b"").unwrap();
        }
        for w in &mut watchers {
            match w.recv().unwrap().unwrap() {
                WatchEvent::Change { kind, name, .. } => {
                    assert_eq!((kind, name.as_str()), (Create, "f"))
                }
                other => panic!("{other:?}"),
            }
        }
        let rx = pipe(recursive);
        until(&rx, (Create, "d149/f"));

        // Ending half (by drop, which resets) and the recursive one leaves
        // the other watches alone.
        let stopper = watchers[1].stopper();
        stopper.stop().unwrap();
        assert!(
            watchers[1].recv().unwrap().is_none(),
            "stopped: the iteration ends"
        );
        watchers.truncate(75);
        drop(rx);
        fs::write(format!("{}/g", dirs[0]), b"").unwrap();
        assert!(matches!(
            shared.recv().unwrap().unwrap(),
            WatchEvent::Change { kind: Create, ref name, .. } if name == "f"
        ));
        assert!(matches!(
            shared.recv().unwrap().unwrap(),
            WatchEvent::Change { kind: Create, ref name, .. } if name == "g"
        ));
        // The recursive watch's thread ends once its receiver is gone and
        // the next change arrives; until then it holds the watch.
        fs::write(format!("{}/h", dirs[100]), b"").unwrap();
        eventually("the ended watches' kernel watches are gone", || {
            agent_watches(&agent) == 74
        });
        drop(watchers);
        drop(shared);
        eventually("no kernel watch left", || agent_watches(&agent) == 0);
        // The agent still serves new watches.
        let mut again = agent.conn.watch(&dirs[3], false).unwrap();
        fs::remove_file(format!("{}/f", dirs[3])).unwrap();
        assert!(matches!(
            again.recv().unwrap().unwrap(),
            WatchEvent::Change { kind: Remove, .. }
        ));
        assert!(Path::new(&root).exists());
        fs::remove_dir_all(&root).unwrap();
    });
}
