//! Unpacking layers: metadata kept, whiteouts made for overlayfs, hostile
//! entries refused, and a layer directory appears whole or not at all.

mod support;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use brig_image::digest::of_bytes;
use brig_image::testing::{add_layer, gzip, layer_tar, Entry};
use brig_image::{media_types, Compression, ImageError, ImageStore, OPAQUE_XATTR};
use support::{leftovers, owner_mode, root_or_skip, store, xattr};

/// Unpack `entries` as one gzip layer.
fn unpack(store: &ImageStore, entries: &[Entry]) -> Result<std::path::PathBuf, ImageError> {
    let (blob, diff_id) = add_layer(store, entries, Compression::Gzip);
    store.unpack_layer(&blob, media_types::LAYER_GZIP, &diff_id)
}

/// `entries` must be refused, naming `entry`, and leave no layer behind.
fn assert_refused(store: &ImageStore, entries: &[Entry], entry: &str) -> String {
    let (blob, diff_id) = add_layer(store, entries, Compression::Gzip);
    let err = store
        .unpack_layer(&blob, media_types::LAYER_GZIP, &diff_id)
        .unwrap_err();
    match &err {
        ImageError::EntryRefused { entry: e, .. } => assert_eq!(e, entry, "{err}"),
        other => panic!("expected {entry:?} refused, got {other:?}"),
    }
    assert!(!store.layer_dir(&diff_id).exists());
    assert!(leftovers(&store.root().join("layers")).is_empty());
    err.to_string()
}

#[test]
fn files_keep_their_metadata() {
    if !root_or_skip() {
        return;
    }
    let (_home, store) = store();
    let long = format!("opt/{}/file", "d".repeat(120));
    let layer = unpack(
        &store,
        &[
            Entry::dir("etc")
                .mode(0o750)
                .owner(1000, 1001)
                .mtime(1_600_000_000),
            Entry::file("etc/tool", "#!/bin/sh\n")
                .mode(0o4755)
                .owner(1000, 1001)
                .mtime(1_500_000_000)
                .xattr("user.origin", "layer-1")
                .xattr("security.capability", cap_net_raw()),
            Entry::symlink("etc/link", "tool").owner(1000, 1001),
            Entry::hardlink("etc/hard", "etc/tool"),
            Entry::dir("dev"),
            Entry::char_device("dev/null", 1, 3).mode(0o666),
            Entry::block_device("dev/loop9", 7, 9)
                .mode(0o660)
                .owner(0, 6),
            Entry::fifo("dev/pipe").mode(0o600),
            Entry::dir("tmp").mode(0o1777),
            // The layer's own overlay xattrs are not trusted.
            Entry::file("etc/sneaky", "").xattr("user.overlay.opaque", "y"),
            // A later entry replaces an earlier one.
            Entry::file("etc/twice", "first"),
            Entry::file("etc/twice", "second").mode(0o600),
            // No entry for its parents: made 0755.
            Entry::file(&long, "deep"),
        ],
    )
    .unwrap();

    assert_eq!(
        owner_mode(&layer),
        (0o755, 0, 0),
        "a root without a ./ entry"
    );
    assert_eq!(owner_mode(&layer.join("etc")), (0o750, 1000, 1001));
    let dir = fs::metadata(layer.join("etc")).unwrap();
    assert_eq!(
        dir.mtime(),
        1_600_000_000,
        "set after its entries were made"
    );

    let tool = layer.join("etc/tool");
    assert_eq!(
        owner_mode(&tool),
        (0o4755, 1000, 1001),
        "setuid survives chown"
    );
    assert_eq!(fs::metadata(&tool).unwrap().mtime(), 1_500_000_000);
    assert_eq!(fs::read(&tool).unwrap(), b"#!/bin/sh\n");
    assert_eq!(
        xattr(&tool, "user.origin").as_deref(),
        Some(&b"layer-1"[..])
    );
    assert_eq!(
        xattr(&tool, "security.capability"),
        Some(cap_net_raw()),
        "file capabilities survive chown"
    );

    let link = layer.join("etc/link");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("tool"));
    assert_eq!(owner_mode(&link).1, 1000, "lchown, not chown of the target");

    let hard = fs::metadata(layer.join("etc/hard")).unwrap();
    assert_eq!(hard.ino(), fs::metadata(&tool).unwrap().ino());
    assert_eq!(hard.nlink(), 2);

    let null = fs::metadata(layer.join("dev/null")).unwrap();
    assert!(null.file_type().is_char_device());
    assert_eq!(
        (null.rdev(), null.mode() & 0o7777),
        (rustix::fs::makedev(1, 3), 0o666)
    );
    let lo = fs::metadata(layer.join("dev/loop9")).unwrap();
    assert!(lo.file_type().is_block_device());
    assert_eq!((lo.rdev(), lo.gid()), (rustix::fs::makedev(7, 9), 6));
    assert!(fs::metadata(layer.join("dev/pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(owner_mode(&layer.join("tmp")).0, 0o1777);

    assert_eq!(xattr(&layer.join("etc/sneaky"), OPAQUE_XATTR), None);
    assert_eq!(fs::read(layer.join("etc/twice")).unwrap(), b"second");
    assert_eq!(owner_mode(&layer.join("etc/twice")).0, 0o600);
    assert_eq!(fs::read(layer.join(&long)).unwrap(), b"deep");
    assert_eq!(owner_mode(&layer.join("opt")).0, 0o755);
}

#[test]
fn a_root_entry_gives_the_layer_root_its_metadata() {
    if !root_or_skip() {
        return;
    }
    let (_home, store) = store();
    let layer = unpack(
        &store,
        &[
            Entry::dir("./")
                .mode(0o750)
                .owner(5, 6)
                .mtime(1_000_000_000),
            Entry::file("f", "x"),
        ],
    )
    .unwrap();
    assert_eq!(owner_mode(&layer), (0o750, 5, 6));
    assert_eq!(fs::metadata(&layer).unwrap().mtime(), 1_000_000_000);
    let msg = assert_refused(&store, &[Entry::file(".", "x")], ".");
    assert!(msg.contains("root"), "{msg}");
}

#[test]
fn whiteouts_become_what_overlayfs_reads() {
    if !root_or_skip() {
        return;
    }
    let (_home, store) = store();
    let layer = unpack(
        &store,
        &[
            Entry::dir("etc"),
            Entry::whiteout("etc/gone"),
            Entry::whiteout("toplevel"),
            Entry::dir("var"),
            Entry::dir("var/cache"),
            Entry::opaque("var/cache"),
            Entry::file("var/cache/new", "fresh"),
            // Opaque with no entry for the directory itself.
            Entry::opaque("srv/data"),
            // aufs bookkeeping: nothing to make.
            Entry::file("var/.wh..wh.plnk", ""),
        ],
    )
    .unwrap();
    for gone in ["etc/gone", "toplevel"] {
        let m = fs::symlink_metadata(layer.join(gone)).unwrap();
        assert!(m.file_type().is_char_device(), "{gone}");
        assert_eq!(m.rdev(), 0, "{gone} is 0/0");
    }
    assert!(!layer.join("etc/.wh.gone").exists());
    assert_eq!(
        xattr(&layer.join("var/cache"), OPAQUE_XATTR).as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(
        xattr(&layer.join("srv/data"), OPAQUE_XATTR).as_deref(),
        Some(&b"y"[..])
    );
    assert_eq!(xattr(&layer.join("var"), OPAQUE_XATTR), None);
    assert_eq!(
        xattr(&layer.join("var/cache"), "trusted.overlay.opaque"),
        None
    );
    assert!(!layer.join("var/cache/.wh..wh..opq").exists());
    assert!(!layer.join("var/.wh..wh.plnk").exists());
    assert_eq!(fs::read(layer.join("var/cache/new")).unwrap(), b"fresh");
}

#[test]
fn escaping_paths_are_refused_by_name() {
    let (_home, store) = store();
    let msg = assert_refused(&store, &[Entry::file("/etc/passwd", "x")], "/etc/passwd");
    assert!(msg.contains("absolute"), "{msg}");
    // Refused before anything is written, so this runs without root too.
    let msg = assert_refused(
        &store,
        &[Entry::file("a/../../escape", "x")],
        "a/../../escape",
    );
    assert!(msg.contains(".."), "{msg}");
    assert_refused(&store, &[Entry::symlink("../up", "x")], "../up");
    assert_refused(&store, &[Entry::hardlink("h", "../../etc/shadow")], "h");
    assert_refused(&store, &[Entry::hardlink("h", "/etc/shadow")], "h");
    assert_refused(&store, &[Entry::whiteout("a/..")], "a/.wh...");
}

#[test]
fn nothing_is_written_through_a_symlink_of_the_layer() {
    if !root_or_skip() {
        return;
    }
    let (home, store) = store();
    let outside = home.path().join("outside");
    fs::create_dir(&outside).unwrap();
    fs::write(outside.join("keep"), "host file").unwrap();
    let target = outside.to_str().unwrap();

    let msg = assert_refused(
        &store,
        &[Entry::symlink("a", target), Entry::file("a/x", "through")],
        "a/x",
    );
    assert!(msg.contains("symlink"), "{msg}");
    assert!(!outside.join("x").exists(), "written outside the layer");

    // Not even to a symlink that stays inside the layer.
    assert_refused(
        &store,
        &[
            Entry::dir("d"),
            Entry::symlink("b", "d"),
            Entry::file("b/x", "through"),
        ],
        "b/x",
    );
    // Nor a directory made through one.
    assert_refused(
        &store,
        &[Entry::symlink("a", target), Entry::dir("a/sub")],
        "a/sub",
    );
    // Nor through a directory that was open a moment ago and then became
    // a symlink (the unpacker keeps the directories it walked open).
    assert_refused(
        &store,
        &[
            Entry::dir("a"),
            Entry::file("a/x", "inside"),
            Entry::symlink("a", target),
            Entry::file("a/y", "through"),
        ],
        "a/y",
    );
    assert!(
        !outside.join("y").exists(),
        "written through a replaced directory"
    );
    assert!(!outside.join("sub").exists());
    // Nor a hard link whose target path goes through one.
    assert_refused(
        &store,
        &[Entry::symlink("a", target), Entry::hardlink("h", "a/keep")],
        "h",
    );

    // A file over a symlink replaces the symlink; the host file is untouched.
    let keep = format!("{target}/keep");
    let layer = unpack(
        &store,
        &[Entry::symlink("c", &keep), Entry::file("c", "layer's own")],
    )
    .unwrap();
    assert!(fs::symlink_metadata(layer.join("c")).unwrap().is_file());
    assert_eq!(fs::read_to_string(layer.join("c")).unwrap(), "layer's own");
    assert_eq!(
        fs::read_to_string(outside.join("keep")).unwrap(),
        "host file"
    );
    // And a whiteout over a symlink removes the symlink, not its target.
    let layer = unpack(&store, &[Entry::symlink("w", &keep), Entry::whiteout("w")]).unwrap();
    assert!(fs::symlink_metadata(layer.join("w"))
        .unwrap()
        .file_type()
        .is_char_device());
    assert_eq!(
        fs::read_to_string(outside.join("keep")).unwrap(),
        "host file"
    );
}

#[test]
fn a_hard_link_must_name_an_earlier_file_of_the_layer() {
    if !root_or_skip() {
        return;
    }
    let (_home, store) = store();
    let msg = assert_refused(
        &store,
        &[Entry::hardlink("early", "late"), Entry::file("late", "x")],
        "early",
    );
    assert!(msg.contains("not an earlier file"), "{msg}");
    assert_refused(&store, &[Entry::dir("d"), Entry::hardlink("h", "d")], "h");
}

#[test]
fn unpacking_again_reuses_the_layer() {
    if !root_or_skip() {
        return;
    }
    let (_home, store) = store();
    let entries = [Entry::file("f", "x")];
    let first = unpack(&store, &entries).unwrap();
    fs::write(first.join("marker"), "").unwrap();
    let second = unpack(&store, &entries).unwrap();
    assert_eq!(first, second);
    assert!(second.join("marker").exists(), "not unpacked a second time");
    // Even with the blob gone (pruned), the layer is there.
    let (blob, diff_id) = add_layer(&store, &entries, Compression::Gzip);
    fs::remove_file(store.blob_path(&blob)).unwrap();
    assert_eq!(
        store
            .unpack_layer(&blob, media_types::LAYER_GZIP, &diff_id)
            .unwrap(),
        first
    );
}

#[test]
fn a_failed_unpack_leaves_no_layer() {
    if !root_or_skip() {
        return;
    }
    let (_home, store) = store();
    let entries = [Entry::dir("etc"), Entry::file("etc/f", "x")];
    let (blob, _) = add_layer(&store, &entries, Compression::Gzip);
    let wrong = of_bytes(b"another layer");
    let err = store
        .unpack_layer(&blob, media_types::LAYER_GZIP, &wrong)
        .unwrap_err();
    assert!(
        matches!(&err, ImageError::DiffIdMismatch { expected, .. } if *expected == wrong),
        "{err:?}"
    );
    assert!(!store.layer_dir(&wrong).exists());
    assert!(leftovers(&store.root().join("layers")).is_empty());

    // The wrong compression: the stream is garbage to the decoder.
    let tar = layer_tar(&entries);
    let (plain_blob, diff_id) = (of_bytes(&tar), of_bytes(&tar));
    store.write_blob(&plain_blob, &tar[..]).unwrap();
    let err = store
        .unpack_layer(&plain_blob, media_types::LAYER_GZIP, &diff_id)
        .unwrap_err();
    assert!(matches!(err, ImageError::LayerStream { .. }), "{err:?}");
    assert!(!store.layer_dir(&diff_id).exists());
    assert!(leftovers(&store.root().join("layers")).is_empty());
}

#[test]
fn uncompressed_gzip_and_zstd_layers_unpack_alike() {
    if !root_or_skip() {
        return;
    }
    for (compression, media_type) in [
        (Compression::None, media_types::LAYER_TAR),
        (Compression::Gzip, media_types::DOCKER_LAYER_GZIP),
        (Compression::Zstd, media_types::LAYER_ZSTD),
    ] {
        let (_home, store) = store();
        let (blob, diff_id) = add_layer(&store, &[Entry::file("hello", "world")], compression);
        let dir = store.unpack_layer(&blob, media_type, &diff_id).unwrap();
        assert_eq!(
            fs::read(dir.join("hello")).unwrap(),
            b"world",
            "{media_type}"
        );
    }
}

#[test]
fn what_cannot_be_unpacked_says_why() {
    let (_home, store) = store();
    let tar = layer_tar(&[Entry::file("f", "x")]);
    let blob = of_bytes(&gzip(&tar));
    let diff_id = of_bytes(&tar);
    let err = store
        .unpack_layer(&blob, media_types::LAYER_GZIP, &diff_id)
        .unwrap_err();
    assert!(matches!(err, ImageError::BlobMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("pull or import the image again"));
    let err = store
        .unpack_layer(
            &blob,
            "application/vnd.oci.image.layer.v1.tar+bzip2",
            &diff_id,
        )
        .unwrap_err();
    assert!(
        matches!(err, ImageError::UnsupportedMediaType { .. }),
        "{err:?}"
    );
}

/// A `security.capability` value (v2) granting cap_net_raw, as `setcap
/// cap_net_raw+ep` writes it.
fn cap_net_raw() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0x0200_0001u32.to_le_bytes()); // VFS_CAP_REVISION_2 | EFFECTIVE
    v.extend_from_slice(&(1u32 << 13).to_le_bytes()); // permitted: CAP_NET_RAW
    v.extend_from_slice(&0u32.to_le_bytes()); // inheritable
    v.extend_from_slice(&0u32.to_le_bytes()); // permitted, high word
    v.extend_from_slice(&0u32.to_le_bytes()); // inheritable, high word
    v
}
