//! `brig cp` of directory trees against the real daemon, both ways, as
//! `cp -r` and `docker cp` place them: nested directories, an empty one, a
//! 5 MiB file, an executable and a symlink arrive whole; `-` moves a tar
//! on stdin and stdout; a hostile tar on stdin writes nothing outside its
//! directory; what cannot be copied is refused by name, with the exit code
//! of every other `brig cp` error. (Single files: `serve.rs`.)

mod support;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::BRIG;

const BIG: usize = 5 << 20;

struct Daemon {
    child: std::process::Child,
    url: String,
    home: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let home = tempfile::tempdir().unwrap();
        let (child, url, lines) = support::start_daemon(home.path(), &[]);
        // Keep draining stderr so the daemon never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Daemon { child, url, home }
    }

    fn brig(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = Command::new(BRIG)
            .args(args)
            .env("BRIG_URL", &self.url)
            .env("BRIG_HOME", self.home.path())
            .env_remove("BRIG_API_KEY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stdin.take().unwrap();
        let input = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        out
    }

    fn ok(&self, args: &[&str]) -> String {
        ok(self.brig(args, b""), &args.join(" "))
    }

    /// `sh -c script` in the sandbox; its stdout.
    fn sh(&self, id: &str, script: &str) -> String {
        self.ok(&["exec", id, "--", "sh", "-c", script])
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        support::stop_daemon(&mut self.child);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {:?}: {}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A command that must fail with a message containing `says`; its exit
/// code.
fn fails(out: Output, what: &str, says: &str) -> i32 {
    assert!(
        !out.status.success(),
        "{what} succeeded: {}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains(says),
        "{what}: expected {says:?} in: {}",
        text(&out.stderr)
    );
    out.status.code().unwrap()
}

fn noise(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// What a local tree holds, by path below `root`: `d` for a directory,
/// `l -> target` for a symlink, `f MODE <contents' length>:<sum>` for a file.
fn describe(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let what = if meta.is_symlink() {
                format!("l -> {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                dirs.push(path);
                "d".to_string()
            } else {
                let data = std::fs::read(&path).unwrap();
                let sum = data
                    .iter()
                    .fold(0u64, |s, &b| s.wrapping_mul(31).wrapping_add(b.into()));
                format!(
                    "f {:o} {}:{sum:x}",
                    meta.permissions().mode() & 0o7777,
                    data.len()
                )
            };
            out.insert(rel, what);
        }
    }
    out
}

/// A tar of `(name, contents)` files, names written as given (the `tar`
/// crate's setters would refuse the hostile ones).
fn raw_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

#[test]
fn directories_copy_both_ways_as_cp_r_does() {
    require_root!();
    let daemon = Daemon::start();
    let id = daemon.ok(&["create"]).trim().to_string();

    // A local tree: nested directories, an empty one, a big file, an
    // executable.
    let local = tempfile::tempdir().unwrap();
    let tree = local.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b")).unwrap();
    std::fs::create_dir(tree.join("empty")).unwrap();
    std::fs::write(tree.join("a/b/hi.txt"), "hello\n").unwrap();
    std::fs::write(tree.join("big.bin"), noise(BIG)).unwrap();
    std::fs::write(tree.join("run.sh"), "#!/bin/sh\necho ran\n").unwrap();
    std::fs::set_permissions(tree.join("run.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(tree.join("a/b/hi.txt"), PermissionsExt::from_mode(0o640)).unwrap();
    let tree_s = tree.to_str().unwrap();
    let sent = describe(&tree);

    // Up into an existing directory: under its own name.
    daemon.ok(&["cp", tree_s, &format!("{id}:/tmp")]);
    let inside = daemon.sh(
        &id,
        "cd /tmp/tree && find . | sort && stat -c '%n %a' run.sh a/b/hi.txt && ./run.sh \
         && sha256sum big.bin",
    );
    let local_sum = text(
        &Command::new("sha256sum")
            .arg(tree.join("big.bin"))
            .output()
            .unwrap()
            .stdout,
    );
    let (listing, sum) = inside.rsplit_once("ran\n").unwrap();
    assert_eq!(
        listing,
        ".\n./a\n./a/b\n./a/b/hi.txt\n./big.bin\n./empty\n./run.sh\nrun.sh 755\na/b/hi.txt 640\n"
    );
    assert_eq!(
        sum.split_whitespace().next(),
        local_sum.split_whitespace().next(),
        "the 5 MiB file arrived whole"
    );
    // Up to a name that does not exist: that name becomes the copy.
    daemon.ok(&["cp", tree_s, &format!("{id}:/tmp/copy")]);
    assert_eq!(
        daemon.sh(&id, "cd /tmp/copy && find . | sort | tr '\\n' ' '"),
        ". ./a ./a/b ./a/b/hi.txt ./big.bin ./empty ./run.sh "
    );

    // Down, with a symlink added in the sandbox.
    daemon.sh(&id, "ln -s a/b/hi.txt /tmp/tree/link");
    let mut want = sent.clone();
    want.insert("link".into(), "l -> a/b/hi.txt".into());
    let back = tempfile::tempdir().unwrap();
    // A destination that does not exist becomes the copy ...
    let fresh = back.path().join("fresh");
    daemon.ok(&["cp", &format!("{id}:/tmp/tree"), fresh.to_str().unwrap()]);
    assert_eq!(describe(&fresh), want);
    // ... one that exists receives it under its name.
    daemon.ok(&[
        "cp",
        &format!("{id}:/tmp/tree"),
        back.path().to_str().unwrap(),
    ]);
    assert_eq!(describe(&back.path().join("tree")), want);
    // Nothing else was left beside them (no temporary directory).
    let mut names: Vec<_> = std::fs::read_dir(back.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["fresh", "tree"]);

    // To stdout: a tar, rooted at the directory's name.
    let out = daemon.brig(&["cp", &format!("{id}:/tmp/tree"), "-"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut archive = tar::Archive::new(&out.stdout[..]);
    let mut names = BTreeMap::new();
    for entry in archive.entries().expect("stdout is a tar") {
        let mut entry = entry.expect("a well-formed entry");
        let name = entry.path().unwrap().display().to_string();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        names.insert(name, (entry.header().entry_type(), data.len()));
    }
    assert_eq!(names["tree/big.bin"], (tar::EntryType::Regular, BIG));
    assert_eq!(names["tree/link"].0, tar::EntryType::Symlink);
    assert_eq!(names["tree/empty"].0, tar::EntryType::Directory);
    assert_eq!(names.len(), want.len() + 1, "{names:?}");

    // From stdin: unpacked into the directory.
    daemon.sh(&id, "mkdir /tmp/in");
    ok(
        daemon.brig(
            &["cp", "-", &format!("{id}:/tmp/in")],
            &raw_tar(&[("x/y.txt", b"why"), ("z.txt", b"zed")]),
        ),
        "cp - ID:/tmp/in",
    );
    assert_eq!(
        daemon.sh(&id, "cat /tmp/in/x/y.txt /tmp/in/z.txt"),
        "whyzed"
    );
}

#[test]
fn what_cannot_be_copied_is_refused_by_name() {
    require_root!();
    let daemon = Daemon::start();
    let id = daemon.ok(&["create"]).trim().to_string();
    daemon.sh(&id, "mkdir -p /tmp/target");

    // The exit code every `brig cp` error has.
    let usual = fails(
        daemon.brig(&["cp", "a", "b"], b""),
        "cp with no sandbox side",
        "ID:/path",
    );

    // Hostile names on stdin: refused by name, nothing written outside.
    for (name, says) in [("../evil", "contains `..`"), ("/abs-evil", "absolute")] {
        let code = fails(
            daemon.brig(
                &["cp", "-", &format!("{id}:/tmp/target")],
                &raw_tar(&[(name, b"x")]),
            ),
            &format!("a tar with {name}"),
            says,
        );
        assert_eq!(code, usual);
    }
    assert_eq!(
        daemon.sh(
            &id,
            "ls -A /tmp/target; ls /tmp/evil /abs-evil 2>&1 | wc -l"
        ),
        "2\n"
    );

    // A local symlink: refused before anything is sent.
    let local = tempfile::tempdir().unwrap();
    let tree = local.path().join("withlink");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("f"), "f").unwrap();
    std::os::unix::fs::symlink("f", tree.join("l")).unwrap();
    let code = fails(
        daemon.brig(
            &["cp", tree.to_str().unwrap(), &format!("{id}:/tmp/target")],
            b"",
        ),
        "cp of a tree with a symlink",
        "withlink/l is a symlink",
    );
    assert_eq!(code, usual);
    assert_eq!(daemon.sh(&id, "ls -A /tmp/target"), "");

    // A missing source, either side.
    let dst = local.path().join("dst");
    let code = fails(
        daemon.brig(
            &["cp", &format!("{id}:/tmp/nope"), dst.to_str().unwrap()],
            b"",
        ),
        "cp of a missing sandbox path",
        "no file /tmp/nope",
    );
    assert_eq!(code, usual);
    assert!(!dst.exists());
    let code = fails(
        daemon.brig(&["cp", &format!("{id}:/tmp/nope"), "-"], b""),
        "cp of a missing sandbox path to stdout",
        "no file /tmp/nope",
    );
    assert_eq!(code, usual);
    // A destination that is a file, either side.
    std::fs::remove_file(tree.join("l")).unwrap();
    daemon.sh(&id, "mkdir /tmp/src && printf x > /tmp/file");
    let file = local.path().join("file");
    std::fs::write(&file, "x").unwrap();
    fails(
        daemon.brig(
            &["cp", &format!("{id}:/tmp/src"), file.to_str().unwrap()],
            b"",
        ),
        "cp of a directory onto a local file",
        "exists and is not a directory",
    );
    fails(
        daemon.brig(
            &["cp", tree.to_str().unwrap(), &format!("{id}:/tmp/file")],
            b"",
        ),
        "cp of a directory onto a sandbox file",
        "exists and is not a directory",
    );
    // Into a directory that is not there.
    fails(
        daemon.brig(
            &["cp", tree.to_str().unwrap(), &format!("{id}:/no/such/dir")],
            b"",
        ),
        "cp of a tree into a missing directory",
        "no directory /no/such",
    );
}
