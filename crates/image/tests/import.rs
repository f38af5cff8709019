//! Importing each format: OCI layout, oci-archive, docker-archive (ours
//! and skopeo's), a multi-platform index, and what must not be imported.

mod support;

use std::fs;
use std::process::Command;

use brig_image::digest::hex_of;
use brig_image::testing::{
    write_docker_archive, write_multi_platform_layout, write_oci_archive, write_oci_layout, Entry,
    PlatformImage,
};
use brig_image::{host_platform, import, ImageConfig, ImageError, ImageRecord, ImageStore};
use support::{home, root_or_skip, store};

fn layers() -> Vec<Vec<Entry>> {
    vec![
        vec![
            Entry::dir("etc"),
            Entry::file("etc/os-release", "ID=test\n"),
            Entry::file("etc/old", "x"),
            Entry::dir("bin"),
            Entry::file("bin/tool", "#!/bin/sh\n").mode(0o755),
        ],
        vec![
            Entry::whiteout("etc/old"),
            Entry::file("etc/motd", "hello\n"),
        ],
    ]
}

fn config() -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/usr/bin:/bin".into(), "LANG=C.UTF-8".into()],
        working_dir: Some("/srv".into()),
        user: Some("1000:1000".into()),
        entrypoint: vec!["/bin/tool".into()],
        cmd: vec!["--serve".into()],
    }
}

/// The image is registered as returned, its layers unpacked and in place.
fn check_imported(store: &ImageStore, image: &ImageRecord, name: &str) {
    assert_eq!(image.name, name);
    assert_eq!(image.config, config());
    assert_eq!(image.layers.len(), 2);
    assert!(image.size > 0);
    assert!(store.has_blob(&image.digest), "manifest stored");
    assert_eq!(store.get(name).unwrap().as_ref(), Some(image));
    let lowers = store.lowers(image);
    assert_eq!(fs::read(lowers[0].join("etc/motd")).unwrap(), b"hello\n");
    assert_eq!(
        fs::read(lowers[1].join("etc/os-release")).unwrap(),
        b"ID=test\n"
    );
    // Nothing imported is garbage.
    let pruned = store.prune().unwrap();
    assert_eq!((pruned.blobs, pruned.layers), (0, 0), "{pruned:?}");
    assert!(lowers.iter().all(|l| l.is_dir()));
}

#[test]
fn an_oci_layout_directory() {
    if !root_or_skip() {
        return;
    }
    let (home, store) = store();
    let layout = home.path().join("layout");
    let manifest = write_oci_layout(&layout, &layers(), config());
    let image = import(&store, &layout, "test:1").unwrap();
    check_imported(&store, &image, "test:1");
    assert_eq!(image.digest, manifest);
    assert_eq!(image.source, format!("oci:{}", layout.display()));
}

#[test]
fn an_oci_archive() {
    if !root_or_skip() {
        return;
    }
    let (home, store) = store();
    let layout = home.path().join("layout");
    let manifest = write_oci_layout(&layout, &layers(), config());
    let archive = home.path().join("image.tar");
    write_oci_archive(&layout, &archive);
    let image = import(&store, &archive, "test").unwrap();
    check_imported(&store, &image, "test");
    assert_eq!(image.digest, manifest);
    assert_eq!(image.source, format!("oci-archive:{}", archive.display()));
}

#[test]
fn a_docker_archive_with_a_shared_layer() {
    if !root_or_skip() {
        return;
    }
    let (home, store) = store();
    let archive = home.path().join("docker.tar");
    let mut l = layers();
    l.push(l[0].clone()); // written as a symlink to 0/layer.tar
    write_docker_archive(&archive, &l, config());
    let image = import(&store, &archive, "docker-test").unwrap();
    assert_eq!(image.layers.len(), 3);
    assert_eq!(image.layers[0], image.layers[2]);
    assert_eq!(store.lowers(&image).len(), 2, "the repeated layer once");
    assert_eq!(
        image.source,
        format!("docker-archive:{}", archive.display())
    );
    // The manifest the import wrote names the config and every layer.
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(store.blob_path(&image.digest)).unwrap()).unwrap();
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 3);
    assert!(store.has_blob(manifest["config"]["digest"].as_str().unwrap()));
    let pruned = store.prune().unwrap();
    assert_eq!((pruned.blobs, pruned.layers), (0, 0), "{pruned:?}");

    // The same archive unpacked into a directory imports too.
    let dir = home.path().join("unpacked");
    fs::create_dir(&dir).unwrap();
    let status = Command::new("tar")
        .args([
            "-xf",
            archive.to_str().unwrap(),
            "-C",
            dir.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let again = import(&store, &dir, "docker-dir").unwrap();
    assert_eq!(
        again.digest, image.digest,
        "the same manifest, so the same digest"
    );

    // Layers may come compressed (found by their magic), with no digest
    // but the diff id to check them by.
    let layer = dir.join("1/layer.tar");
    fs::write(
        &layer,
        brig_image::testing::gzip(&fs::read(&layer).unwrap()),
    )
    .unwrap();
    let fresh = brig_image::ImageStore::open(&home.path().join("fresh")).unwrap();
    let gz = import(&fresh, &dir, "docker-gzip").unwrap();
    assert_eq!(gz.layers, image.layers);
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(fresh.blob_path(&gz.digest)).unwrap()).unwrap();
    assert_eq!(
        manifest["layers"][1]["mediaType"],
        brig_image::media_types::LAYER_GZIP
    );
    assert_eq!(
        fs::read(fresh.lowers(&gz)[1].join("etc/motd")).unwrap(),
        b"hello\n"
    );
    // A damaged compressed layer is caught by its diff id.
    let mut bytes = fs::read(&layer).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    fs::write(&layer, bytes).unwrap();
    let other = brig_image::ImageStore::open(&home.path().join("other")).unwrap();
    let err = import(&other, &dir, "docker-bad").unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::DiffIdMismatch { .. } | ImageError::LayerStream { .. }
        ),
        "{err:?}"
    );
    assert!(other.list().unwrap().is_empty());
}

#[test]
fn archives_written_by_skopeo() {
    if !root_or_skip() {
        return;
    }
    if Command::new("skopeo").arg("--version").output().is_err() {
        brig_test_support::skip(
            "skopeo is not installed (tests/support/install-deps.sh installs it)",
        );
        return;
    }
    let (home, store) = store();
    let layout = home.path().join("layout");
    write_oci_layout(&layout, &layers(), config());
    for (transport, name) in [
        ("docker-archive", "skopeo-docker"),
        ("oci-archive", "skopeo-oci"),
    ] {
        let file = home.path().join(format!("{name}.tar"));
        let out = Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--quiet"])
            .arg(format!("oci:{}:latest", layout.display()))
            .arg(format!("{transport}:{}", file.display()))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "skopeo: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let image = import(&store, &file, name).unwrap();
        check_imported(&store, &image, name);
    }
}

#[test]
fn a_multi_platform_index_gives_this_hosts_image() {
    if !root_or_skip() {
        return;
    }
    let (home, store) = store();
    let (_, arch) = host_platform();
    let other = if arch == "arm64" { "amd64" } else { "arm64" };
    let image_for = |arch: &str| PlatformImage {
        os: "linux".into(),
        architecture: arch.into(),
        layers: vec![vec![Entry::file("arch", arch)]],
        config: ImageConfig {
            cmd: vec![arch.into()],
            ..Default::default()
        },
    };
    let layout = home.path().join("multi");
    let digests = write_multi_platform_layout(
        &layout,
        &[image_for(other), image_for(arch), image_for("s390x")],
    );
    let image = import(&store, &layout, "multi").unwrap();
    assert_eq!(image.digest, digests[1]);
    assert_eq!(image.config.cmd, vec![arch.to_string()]);
    assert_eq!(
        fs::read(store.lowers(&image)[0].join("arch")).unwrap(),
        arch.as_bytes()
    );

    // Only other platforms: an error that lists them; nothing registered.
    let foreign = home.path().join("foreign");
    write_multi_platform_layout(&foreign, &[image_for(other), image_for("s390x")]);
    let err = import(&store, &foreign, "foreign").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ImageError::NoPlatform { .. }), "{err:?}");
    assert!(
        msg.contains(&format!("linux/{other}"))
            && msg.contains("linux/s390x")
            && msg.contains(arch),
        "{msg}"
    );
    assert_eq!(store.get("foreign").unwrap(), None);
}

#[test]
fn a_corrupt_blob_registers_nothing() {
    if !root_or_skip() {
        return;
    }
    let (home, store) = store();
    let layout = home.path().join("layout");
    let manifest = write_oci_layout(&layout, &layers(), config());
    let good = import(&store, &layout, "victim").unwrap();

    // A new version of the image whose second layer is damaged on disk.
    let layout2 = home.path().join("layout2");
    let mut l = layers();
    l[1].push(Entry::file("etc/v2", "2"));
    write_oci_layout(&layout2, &l, config());
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout2.join("index.json")).unwrap()).unwrap();
    let m = index["manifests"][0]["digest"].as_str().unwrap();
    let m: serde_json::Value = serde_json::from_slice(
        &fs::read(layout2.join("blobs/sha256").join(hex_of(m).unwrap())).unwrap(),
    )
    .unwrap();
    let layer = layout2
        .join("blobs/sha256")
        .join(hex_of(m["layers"][1]["digest"].as_str().unwrap()).unwrap());
    let mut bytes = fs::read(&layer).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&layer, &bytes).unwrap();

    let err = import(&store, &layout2, "victim").unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert_eq!(
        store.get("victim").unwrap(),
        Some(good),
        "the old image stays"
    );
    let err = import(&store, &layout2, "fresh").unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");
    assert_eq!(store.get("fresh").unwrap(), None);
    assert_eq!(store.list().unwrap().len(), 1);
    assert_eq!(store.list().unwrap()[0].digest, manifest);
}

#[test]
fn what_is_not_an_image_is_named() {
    let (home, store) = store();
    let empty = home.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let err = import(&store, &empty, "x").unwrap_err();
    assert!(matches!(err, ImageError::NotAnImage { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!(
            "not an OCI layout, oci-archive or docker-archive: {} has neither index.json nor manifest.json",
            empty.display()
        )
    );

    let gz = home.path().join("image.tar.gz");
    fs::write(&gz, brig_image::testing::gzip(b"whatever")).unwrap();
    let err = import(&store, &gz, "x").unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::CompressedArchive {
                compression: "gzip",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("decompress it first"));

    fs::write(empty.join("index.json"), "{}").unwrap();
    let err = import(&store, &empty, "x").unwrap_err();
    assert!(err.to_string().contains("no oci-layout file"), "{err}");

    let missing = home.path().join("missing.tar");
    assert!(matches!(
        import(&store, &missing, "x"),
        Err(ImageError::Io { .. })
    ));
    assert!(matches!(
        import(&store, &empty, "bad name"),
        Err(ImageError::InvalidName { .. })
    ));
}

#[test]
fn a_layout_pointing_outside_itself_is_refused() {
    let home = home();
    let store = ImageStore::open(home.path()).unwrap();
    // A docker-archive whose config path leaves the archive.
    let dir = home.path().join("evil");
    fs::create_dir(&dir).unwrap();
    fs::write(
        dir.join("manifest.json"),
        r#"[{"Config":"../../etc/hostname","Layers":[]}]"#,
    )
    .unwrap();
    let err = import(&store, &dir, "evil").unwrap_err();
    assert!(matches!(err, ImageError::BadLayout { .. }), "{err:?}");
    assert!(err.to_string().contains("not a path inside it"), "{err}");

    // An index naming a manifest with a digest that is not sha256 hex.
    let dir = home.path().join("evil2");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let bogus = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha512:{}","size":2}}]}}"#,
        "0".repeat(128)
    );
    fs::write(dir.join("index.json"), bogus).unwrap();
    let err = import(&store, &dir, "evil2").unwrap_err();
    assert!(matches!(err, ImageError::InvalidDigest { .. }), "{err:?}");
    assert!(store.list().unwrap().is_empty());
}
