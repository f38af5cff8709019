//! The build machinery (lock, temp dir, atomic rename, stamp, staleness,
//! errors) with a fake mmdebstrap (`BRIG_MMDEBSTRAP`), so it runs in
//! seconds without the network. Building needs root (mmdebstrap's root
//! mode), so this skips without it (a failure under BRIG_TEST_STRICT=1).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Barrier};

use brig_template::{
    build, ensure, lease, prune, release, stamp_for, state, Paths, Progress, State, TemplateError,
};

const FAKE: &str = r#"#!/bin/sh
# Called as: mmdebstrap [options] SUITE TARGET MIRROR
eval target=\${$(($# - 1))}
echo "I: pretending to build $target" >&2
echo x >> "$FAKE_COUNT"
sleep 1
if [ -e "$FAKE_FAIL" ]; then
    echo "W: Failed to fetch http://deb.example/dists/bookworm/InRelease  Temporary failure resolving 'deb.example'" >&2
    echo "E: apt-get update failed" >&2
    exit 1
fi
mkdir -p "$target/bin" && touch "$target/bin/sh"
"#;

fn builds(count: &Path) -> usize {
    fs::read_to_string(count).map_or(0, |s| s.lines().count())
}

#[test]
fn builds_once_under_concurrency_rebuilds_when_stale_and_reports_failures() {
    if !brig_test_support::root_or_skip() {
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let fake = scratch.path().join("mmdebstrap");
    fs::write(&fake, FAKE).unwrap();
    fs::set_permissions(&fake, fs::Permissions::from_mode(0o755)).unwrap();
    let count = scratch.path().join("count");
    let fail = scratch.path().join("fail");
    // One test function: the environment is the process's, set before
    // any thread starts.
    std::env::set_var(brig_template::MMDEBSTRAP_ENV, &fake);
    std::env::set_var("FAKE_COUNT", &count);
    std::env::set_var("FAKE_FAIL", &fail);
    let home = scratch.path().join("home");
    let paths = Paths::new(&home, "base");

    // Four concurrent callers: one build, all get the same rootfs.
    let barrier = Arc::new(Barrier::new(4));
    let got: Vec<_> = (0..4)
        .map(|_| {
            let (home, barrier) = (home.clone(), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                ensure(&home, "base", Progress::Quiet).unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    // The build's own directory, which `rootfs` links to.
    let first = paths.dir.join("rootfs-1");
    assert!(got.iter().all(|p| p == &first), "{got:?}");
    assert_eq!(fs::read_link(&paths.rootfs).unwrap(), Path::new("rootfs-1"));
    assert_eq!(builds(&count), 1, "concurrent callers built more than once");
    assert!(paths.rootfs.join("bin/sh").exists());
    assert_eq!(
        fs::read_to_string(&paths.stamp).unwrap(),
        stamp_for(&brig_template::recipes::BASE)
    );

    // Cached.
    ensure(&home, "base", Progress::Quiet).unwrap();
    assert_eq!(builds(&count), 1);

    // A stamp from another recipe: stale, rebuilt on next use.
    fs::write(&paths.stamp, "sha256=old\n").unwrap();
    assert_eq!(state(&paths, &brig_template::recipes::BASE), State::Stale);
    ensure(&home, "base", Progress::Quiet).unwrap();
    assert_eq!(builds(&count), 2);
    assert_eq!(state(&paths, &brig_template::recipes::BASE), State::Ready);

    // --force rebuilds a current one.
    let second = paths.dir.join("rootfs-2");
    let leased = lease(&second).unwrap();
    let third = build(&home, "base", true, Progress::Quiet).unwrap();
    assert_eq!(builds(&count), 3);
    assert_eq!(third, paths.dir.join("rootfs-3"));
    assert_eq!(ensure(&home, "base", Progress::Quiet).unwrap(), third);
    // A rebuild never touches the builds sandboxes may still run on.
    assert!(first.join("bin/sh").exists() && second.join("bin/sh").exists());
    // This process was handed all three: prune keeps them.
    prune(&home);
    assert!(
        first.exists() && second.exists(),
        "prune removed a build in use"
    );
    // Released here, the first goes; the second is still leased otherwise.
    release(&first);
    release(&second);
    prune(&home);
    assert!(!first.exists(), "an unused old build survived prune");
    assert!(
        second.join("bin/sh").exists(),
        "prune removed a leased build"
    );
    assert!(
        third.join("bin/sh").exists(),
        "prune removed the current build"
    );
    drop(leased);
    prune(&home);
    assert!(!second.exists(), "a released old build survived prune");
    assert!(third.join("bin/sh").exists());

    // The layout of brig before versioned builds (`rootfs/` a directory)
    // is used as it is, and becomes an old build at the next rebuild.
    fs::remove_file(&paths.rootfs).unwrap();
    fs::rename(&third, &paths.rootfs).unwrap();
    release(&third);
    assert_eq!(
        ensure(&home, "base", Progress::Quiet).unwrap(),
        paths.rootfs
    );
    let fourth = build(&home, "base", true, Progress::Quiet).unwrap();
    assert_eq!(builds(&count), 4);
    assert_eq!(fourth, paths.dir.join("rootfs-1"));
    assert!(paths.dir.join("rootfs-0/bin/sh").exists());
    release(&paths.rootfs);
    prune(&home);
    assert!(!paths.dir.join("rootfs-0").exists());
    assert!(fourth.join("bin/sh").exists());

    // A network failure is reported as one, and leaves no half-built tree
    // (the template that was there stays usable).
    fs::write(&fail, "").unwrap();
    let err = build(&home, "base", true, Progress::Quiet).unwrap_err();
    assert!(matches!(err, TemplateError::Network { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("Temporary failure resolving"), "{msg}");
    let left: Vec<_> = fs::read_dir(&paths.dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".rootfs."))
        .collect();
    assert!(left.is_empty(), "leftovers: {left:?}");
    assert_eq!(state(&paths, &brig_template::recipes::BASE), State::Ready);
    // A missing template that fails to build is still missing.
    let err = ensure(&home, "code-interpreter-v1", Progress::Quiet).unwrap_err();
    assert!(matches!(err, TemplateError::Network { .. }), "{err:?}");
    assert!(!Paths::new(&home, "code-interpreter-v1").rootfs.exists());

    // No mmdebstrap: the message says how to get it.
    std::env::set_var(brig_template::MMDEBSTRAP_ENV, scratch.path().join("nope"));
    let err = build(&home, "base", true, Progress::Quiet).unwrap_err();
    assert!(
        err.to_string().contains("apt-get install mmdebstrap"),
        "{err}"
    );
}
