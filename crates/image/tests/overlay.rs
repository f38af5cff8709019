//! The real thing: two unpacked layers mounted as an overlay with
//! `userxattr`, as the jail mounts an image, and what the merged view shows.
//!
//! The mount is made where the jail makes it, inside a user namespace
//! (`unshare --user --map-root-user --mount`, in a child that lists the
//! merged tree for the test to check): there overlayfs reads only
//! `user.overlay.*` xattrs, and the mount, in the child's own mount
//! namespace, goes away with it. (Some kernels also accept `userxattr`
//! from the initial namespace; this one is the case that matters.)

mod support;

use std::fs;
use std::process::Command;

use brig_image::testing::{write_oci_layout, Entry};
use brig_image::{import, ImageConfig};
use support::{home, root_or_skip};

#[test]
fn a_two_layer_image_merges_as_overlayfs_shows_it() {
    if !root_or_skip() {
        return;
    }
    if Command::new("unshare").arg("--help").output().is_err() {
        brig_test_support::skip("unshare (util-linux) is not installed");
        return;
    }
    let home = home();
    let layout = home.path().join("layout");
    write_oci_layout(
        &layout,
        &[
            vec![
                Entry::dir("etc"),
                Entry::file("etc/keep", "kept"),
                Entry::file("etc/gone", "deleted by layer 2"),
                Entry::dir("opt"),
                Entry::dir("opt/app"),
                Entry::file("opt/app/old", "hidden by layer 2"),
                Entry::dir("opt/app/sub"),
                Entry::file("opt/app/sub/old2", "hidden too"),
                Entry::dir("srv"),
                Entry::file("srv/a", "merged"),
            ],
            vec![
                Entry::dir("etc"),
                Entry::whiteout("etc/gone"),
                Entry::dir("opt"),
                Entry::dir("opt/app"),
                Entry::opaque("opt/app"),
                Entry::file("opt/app/new", "layer 2"),
                Entry::dir("srv"),
                Entry::file("srv/b", "merged"),
            ],
        ],
        ImageConfig::default(),
    );
    let store = brig_image::ImageStore::open(home.path()).unwrap();
    let image = import(&store, &layout, "overlay-test").unwrap();
    let lowers = store.lowers(&image);
    assert_eq!(lowers.len(), 2);
    assert_eq!(lowers[0], store.layer_dir(&image.layers[1]), "top first");

    let lowerdir = lowers
        .iter()
        .map(|p| p.to_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let (upper, work, merged) = (
        home.path().join("upper"),
        home.path().join("work"),
        home.path().join("merged"),
    );
    for d in [&upper, &work, &merged] {
        fs::create_dir(d).unwrap();
    }
    let script = format!(
        "set -e
         mount -t overlay overlay -o lowerdir={lowerdir},upperdir={u},workdir={w},userxattr {m}
         cd {m}
         find . -mindepth 1 | sort
         echo ---
         cat etc/keep opt/app/new srv/a srv/b",
        u = upper.display(),
        w = work.display(),
        m = merged.display(),
    );
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "overlay mount failed: {stderr}");
    let (tree, contents) = stdout.split_once("---\n").unwrap();
    assert_eq!(
        tree.lines().collect::<Vec<_>>(),
        [
            "./etc",
            "./etc/keep",
            "./opt",
            "./opt/app",
            "./opt/app/new",
            "./srv",
            "./srv/a",
            "./srv/b",
        ],
        "etc/gone deleted, opt/app only layer 2's, srv merged"
    );
    assert_eq!(contents, "keptlayer 2mergedmerged");
}
