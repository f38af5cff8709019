//! `brig volume create|ls|rm` and `brig create --volume` through the real
//! binary against a real daemon: names and sizes at and past their
//! limits, files shared by sandboxes under the same inside ids, a volume
//! in use kept, another tenant kept out, and what survives a `kill -9` of
//! the daemon: the files, a sandbox's mount; what does not: a mount or
//! loop device nothing uses (reconcile), the image after `rm`.

mod support;

use std::time::Duration;

use brig_test_support::volume_leftovers;
use support::{eventually, ok, processes_of, signal, text, TestDaemon};

fn fails(out: std::process::Output, what: &str, says: &str) {
    assert!(
        !out.status.success(),
        "{what}: succeeded: {}",
        text(&out.stdout)
    );
    let err = text(&out.stderr);
    assert!(err.contains(says), "{what}: {err}");
}

#[test]
fn volumes_from_the_cli_across_a_daemon_crash() {
    require_root!();
    let rootfs = require_rootfs!();
    let home = tempfile::tempdir().unwrap();
    let volumes = home.path().join("volumes");
    let flags = ["--volume-size", "32MiB"];
    let d = TestDaemon::start_with(home.path(), &flags);
    let template = format!("dir:{}", rootfs.display());

    // Names and sizes, at and past their edges.
    let id = ok(d.brig(&["volume", "create", "data"]), "create data");
    assert!(id.trim().starts_with("vol-"), "{id}");
    fails(
        d.brig(&["volume", "create", "data"]),
        "a taken name",
        "exists already",
    );
    fails(
        d.brig(&["volume", "create", "a.b"]),
        "a bad name",
        "letters, digits",
    );
    let longest = "n".repeat(64);
    ok(
        d.brig(&["volume", "create", &longest]),
        "a 64-character name",
    );
    fails(
        d.brig(&["volume", "create", &"n".repeat(65)]),
        "a 65-character name",
        "1 to 64",
    );
    ok(
        d.brig(&["volume", "create", "small", "--size", "16MiB"]),
        "the smallest size",
    );
    fails(
        d.brig(&["volume", "create", "tiny", "--size", "15MiB"]),
        "under the smallest size",
        "a volume is",
    );
    fails(
        d.brig(&["volume", "create", "huge", "--size", "2TiB"]),
        "over the largest size",
        "a volume is",
    );
    let listed = ok(d.brig(&["volume", "ls"]), "ls");
    assert!(
        listed.contains("data") && listed.contains("32.0M"),
        "{listed}"
    );
    assert!(
        listed.contains("small") && listed.contains("16.0M"),
        "{listed}"
    );
    // No vm guest has had them: every tier may mount them.
    let row = listed.lines().find(|l| l.contains("data")).unwrap();
    assert!(
        listed.lines().next().unwrap().contains("FOR") && row.contains(" all "),
        "{listed}"
    );
    ok(d.brig(&["volume", "rm", &longest, "small"]), "rm two");

    // Two sandboxes share it; files keep their inside owners.
    let s1 = ok(
        d.brig(&[
            "create",
            "--template",
            &template,
            "--volume",
            "data:/mnt/data",
        ]),
        "create s1",
    );
    let s1 = s1.trim();
    ok(
        d.brig(&[
            "exec",
            s1,
            "--",
            "sh",
            "-c",
            "echo one > /mnt/data/f && chown 1234:1234 /mnt/data/f",
        ]),
        "write in s1",
    );
    let s2 = ok(
        d.brig(&["create", "--template", &template, "-v", "data:/srv/d"]),
        "create s2",
    );
    let s2 = s2.trim();
    assert_eq!(
        ok(
            d.brig(&["exec", s2, "--", "stat", "-c", "%u:%g %n", "/srv/d/f"]),
            "stat in s2"
        ),
        "1234:1234 /srv/d/f\n"
    );
    assert_eq!(
        ok(d.brig(&["exec", s2, "--", "cat", "/srv/d/f"]), "read in s2"),
        "one\n"
    );
    let (_, shown) = d.call("GET", &format!("/v1/sandboxes/{s2}"), None);
    assert_eq!(shown["volumes"][0]["name"], "data", "{shown}");
    assert_eq!(shown["volumes"][0]["path"], "/srv/d", "{shown}");
    fails(
        d.brig(&["volume", "rm", "data"]),
        "rm in use",
        "in use by sandbox",
    );

    // Refused mounts: clear errors, before and after the request.
    fails(
        d.brig(&["create", "--volume", "data:/proc"]),
        "a system directory",
        "system",
    );
    fails(
        d.brig(&["create", "--volume", "data"]),
        "no path",
        "VOLUME:PATH",
    );
    fails(
        d.brig(&["create", "--volume", "nosuch:/mnt/x"]),
        "an unknown volume",
        "no volume nosuch",
    );
    let (status, body) = d.call(
        "POST",
        "/v1/sandboxes",
        Some(serde_json::json!({"volumes": [{"volume": "data", "path": "/mnt/a"}, {"volume": "data", "path": "/mnt/a/b"}]})),
    );
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("overlaps"),
        "{body}"
    );
    // Mounted by live sandboxes: a vm sandbox, whose kernel would mount
    // it alone, cannot have it.
    let (status, body) = d.call(
        "POST",
        "/v1/sandboxes",
        Some(serde_json::json!({"isolation": "vm", "network": {"mode": "none"}, "volumes": [{"volume": "data", "path": "/mnt/a"}]})),
    );
    assert_eq!(status, 409, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("alone"),
        "{body}"
    );

    // Another tenant sees none of it.
    let other = ok(d.brig(&["tenants", "create", "other"]), "tenants create");
    let as_other = |method: &str, path: &str, body: Option<serde_json::Value>| {
        let req = ureq::request(method, &format!("{}{path}", d.url))
            .set("Authorization", &format!("Bearer {}", other.trim()));
        let resp = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        match resp {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(as_other("GET", "/v1/volumes/data", None), 404);
    assert_eq!(
        as_other("DELETE", &format!("/v1/volumes/{}", id.trim()), None),
        404
    );
    assert_eq!(
        as_other(
            "POST",
            "/v1/sandboxes",
            Some(serde_json::json!({"volumes": [{"volume": "data", "path": "/mnt/d"}]}))
        ),
        400,
        "a create naming another tenant's volume is refused as one naming none"
    );

    // A crash: the sandboxes keep their mounts, the files stay.
    d.kill9();
    let d = TestDaemon::start_with(home.path(), &flags);
    assert_eq!(
        ok(
            d.brig(&["exec", s1, "--", "cat", "/mnt/data/f"]),
            "read after crash"
        ),
        "one\n"
    );
    ok(
        d.brig(&["exec", s2, "--", "sh", "-c", "echo two > /srv/d/f"]),
        "write after crash",
    );
    assert_eq!(
        ok(
            d.brig(&["exec", s1, "--", "cat", "/mnt/data/f"]),
            "shared after crash"
        ),
        "two\n"
    );
    ok(d.brig(&["rm", "-f", s1, s2]), "rm both");
    assert!(
        eventually(Duration::from_secs(10), || volume_leftovers(&volumes)
            .is_empty()),
        "left after the sandboxes ended: {:?}",
        volume_leftovers(&volumes)
    );

    // A sandbox that dies while no daemon runs: the next daemon's
    // reconcile unmounts its volume.
    let s3 = ok(
        d.brig(&[
            "create",
            "--template",
            &template,
            "--volume",
            "data:/mnt/data",
        ]),
        "create s3",
    );
    let s3 = s3.trim().to_string();
    assert_eq!(
        ok(
            d.brig(&["exec", &s3, "--", "cat", "/mnt/data/f"]),
            "persisted"
        ),
        "two\n"
    );
    d.kill9();
    for pid in processes_of(&s3) {
        signal(pid, libc::SIGKILL);
    }
    assert!(eventually(Duration::from_secs(10), || processes_of(&s3).is_empty()));
    assert!(!volume_leftovers(&volumes).is_empty());
    let d = TestDaemon::start_with(home.path(), &flags);
    assert!(
        eventually(Duration::from_secs(10), || volume_leftovers(&volumes)
            .is_empty()),
        "left after reconcile: {:?}",
        volume_leftovers(&volumes)
    );

    // Removed: its image goes.
    ok(d.brig(&["volume", "rm", "data"]), "rm data");
    let left = brig_test_support::volume_files_left(&volumes);
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(ok(d.brig(&["volume", "ls", "--json"]), "ls"), "[]\n");
}

/// A volume the host's disk has no room for is refused as 507 with what to
/// do, through the API and the CLI; nothing of it is left (no record, no
/// image), and a volume that fits is made after it. The "disk" is a 48 MiB
/// tmpfs mounted on the daemon's volumes directory.
#[test]
fn a_volume_the_host_has_no_room_for_is_refused_and_leaves_nothing() {
    require_root!();
    let home = tempfile::tempdir().unwrap();
    let volumes = home.path().join("volumes");
    std::fs::create_dir(&volumes).unwrap();
    let _disk = SmallDisk::mount(&volumes, "48m");
    let d = TestDaemon::start_with(home.path(), &[]);

    fails(
        d.brig(&["volume", "create", "big", "--size", "1GiB"]),
        "a volume larger than the disk",
        "no room for a volume of 1073741824 bytes: free space",
    );
    let status = match ureq::post(&format!("{}/v1/volumes", d.url))
        .set("Authorization", &format!("Bearer {}", d.key))
        .send_json(serde_json::json!({"name": "big", "size": "512MiB"}))
    {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(code, _)) => code,
        Err(e) => panic!("POST /v1/volumes: {e}"),
    };
    assert_eq!(status, 507, "a volume the disk has no room for");
    assert_eq!(ok(d.brig(&["volume", "ls", "--json"]), "ls"), "[]\n");
    let left = brig_test_support::volume_files_left(&volumes);
    assert!(left.is_empty(), "left by the refused creates: {left:?}");

    ok(
        d.brig(&["volume", "create", "fits", "--size", "16MiB"]),
        "a volume that fits, after",
    );
    ok(d.brig(&["volume", "rm", "fits"]), "rm fits");
    drop(d);
}

/// A tmpfs of `size` on `dir` for one test, unmounted when dropped.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &std::path::Path, size: &str) -> SmallDisk {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount a tmpfs: {}", text(&out.stderr));
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}
