//! The index of images (register, get, list, remove) and prune. Layers
//! are stood in for by directories made by hand, so this runs without
//! root: what is checked is which files the store keeps.

mod support;

use std::fs;
use std::sync::Arc;

use brig_image::digest::of_bytes;
use brig_image::testing::{add_layer, Entry};
use brig_image::{Compression, ImageConfig, ImageError, ImageRecord, ImageStore};
use serde_json::json;
use support::{home, store};

/// An image's blobs (a gzip layer per entry list, a config, a manifest) in
/// `store`, its layer directories made by hand; its record, unregistered.
fn image(store: &ImageStore, name: &str, layers: &[Vec<Entry>]) -> ImageRecord {
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for entries in layers {
        let (blob, diff_id) = add_layer(store, entries, Compression::Gzip);
        let size = fs::metadata(store.blob_path(&blob)).unwrap().len();
        descs.push(json!({ "mediaType": brig_image::media_types::LAYER_GZIP, "digest": blob, "size": size }));
        fs::create_dir_all(store.layer_dir(&diff_id)).unwrap();
        diff_ids.push(diff_id);
    }
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
        "config": { "Cmd": [name] },
    }))
    .unwrap();
    let config_digest = of_bytes(&config);
    store.write_blob(&config_digest, &config[..]).unwrap();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len() },
        "layers": descs,
    }))
    .unwrap();
    let digest = of_bytes(&manifest);
    store.write_blob(&digest, &manifest[..]).unwrap();
    ImageRecord {
        base: None,
        name: name.to_string(),
        source: format!("test:{name}"),
        digest,
        config: ImageConfig {
            cmd: vec![name.to_string()],
            ..Default::default()
        },
        layers: diff_ids,
        size: 1,
        created_at: brig_image::now_millis(),
    }
}

fn blob_count(store: &ImageStore) -> usize {
    fs::read_dir(store.root().join("blobs/sha256"))
        .unwrap()
        .count()
}

#[test]
fn images_are_registered_got_listed_and_removed() {
    let (_home, store) = store();
    let b = image(&store, "b:1", &[vec![Entry::file("b", "b")]]);
    let a = image(
        &store,
        "a",
        &[vec![Entry::file("a", "a")], vec![Entry::file("a2", "a")]],
    );
    store.register(&b).unwrap();
    store.register(&a).unwrap();
    assert_eq!(store.get("a").unwrap().as_ref(), Some(&a));
    assert_eq!(store.get("nope").unwrap(), None);
    assert_eq!(store.list().unwrap(), vec![a.clone(), b.clone()], "by name");

    // The same name again replaces it.
    let mut b2 = image(&store, "b:1", &[vec![Entry::file("b", "v2")]]);
    b2.source = "elsewhere".into();
    store.register(&b2).unwrap();
    assert_eq!(store.get("b:1").unwrap(), Some(b2.clone()));
    assert_eq!(store.list().unwrap().len(), 2);

    assert_eq!(store.remove("b:1").unwrap(), b2);
    let err = store.remove("b:1").unwrap_err();
    assert!(matches!(err, ImageError::NotFound { .. }));
    assert!(err.to_string().contains("\"b:1\""), "names it: {err}");
    assert_eq!(store.list().unwrap(), vec![a]);

    // Another store on the same home (a daemon and a `brig run`) sees it.
    let other = ImageStore::open(store.root().parent().unwrap()).unwrap();
    assert_eq!(other.list().unwrap(), store.list().unwrap());
}

#[test]
fn registering_needs_the_layers_and_the_manifest() {
    let (_home, store) = store();
    let img = image(&store, "x", &[vec![Entry::file("x", "x")]]);
    fs::remove_dir(store.layer_dir(&img.layers[0])).unwrap();
    let err = store.register(&img).unwrap_err();
    assert!(matches!(err, ImageError::LayerMissing { .. }), "{err:?}");
    fs::create_dir(store.layer_dir(&img.layers[0])).unwrap();

    let mut bad = img.clone();
    bad.name = "has space".into();
    assert!(matches!(
        store.register(&bad),
        Err(ImageError::InvalidName { .. })
    ));
    let mut bad = img.clone();
    bad.layers.push("sha256:nothex".into());
    assert!(matches!(
        store.register(&bad),
        Err(ImageError::InvalidDigest { .. })
    ));

    fs::remove_file(store.blob_path(&img.digest)).unwrap();
    let err = store.register(&img).unwrap_err();
    assert!(matches!(err, ImageError::ManifestMissing { .. }), "{err:?}");
    assert!(store.list().unwrap().is_empty());
}

#[test]
fn prune_keeps_what_images_use_and_removes_the_rest() {
    let (_home, store) = store();
    let shared = vec![Entry::file("base", "shared")];
    let a = image(&store, "a", &[shared.clone(), vec![Entry::file("a", "a")]]);
    let b = image(&store, "b", &[shared.clone(), vec![Entry::file("b", "b")]]);
    store.register(&a).unwrap();
    store.register(&b).unwrap();
    // Garbage: a blob and a layer nothing names, leftovers of dead writes.
    let stray = b"stray blob".repeat(100);
    store.write_blob(&of_bytes(&stray), &stray[..]).unwrap();
    let stray_layer = store.layer_dir(&of_bytes(b"stray layer"));
    fs::create_dir(&stray_layer).unwrap();
    fs::write(stray_layer.join("f"), "12345").unwrap();
    fs::write(store.root().join("blobs/sha256/.tmp-dead"), "xyz").unwrap();
    fs::create_dir(store.root().join("layers/.tmp-dead")).unwrap();

    let blobs_before = blob_count(&store);
    let pruned = store.prune().unwrap();
    assert_eq!(
        (pruned.blobs, pruned.layers, pruned.in_use),
        (1, 1, 0),
        "{pruned:?}"
    );
    assert_eq!(pruned.bytes, stray.len() as u64 + 5 + 3);
    assert_eq!(blob_count(&store), blobs_before - 2);
    assert!(!stray_layer.exists());
    assert!(!store.root().join("layers/.tmp-dead").exists());
    for img in [&a, &b] {
        assert!(store.has_blob(&img.digest));
        assert!(store.lowers(img).iter().all(|l| l.is_dir()));
    }

    // Without b: its manifest, config, own layer blob and layer go; the
    // shared layer stays for a.
    store.remove("b").unwrap();
    let pruned = store.prune().unwrap();
    assert_eq!((pruned.blobs, pruned.layers), (3, 1), "{pruned:?}");
    assert!(!store.has_blob(&b.digest));
    assert!(!store.layer_dir(&b.layers[1]).exists());
    assert!(store.layer_dir(&b.layers[0]).is_dir(), "shared with a");
    assert!(store.has_blob(&a.digest));
    assert!(store.lowers(&a).iter().all(|l| l.is_dir()));

    // Nothing left to prune.
    assert_eq!(store.prune().unwrap(), Default::default());
}

#[test]
fn a_leased_layer_outlives_its_image_until_the_lease_ends() {
    let (_home, store) = store();
    let img = image(&store, "running", &[vec![Entry::file("x", "x")]]);
    store.register(&img).unwrap();
    let lease = store.lease(&img).unwrap();
    store.remove("running").unwrap();
    let pruned = store.prune().unwrap();
    assert_eq!((pruned.layers, pruned.in_use), (0, 1), "{pruned:?}");
    assert!(store.layer_dir(&img.layers[0]).is_dir());
    drop(lease);
    let pruned = store.prune().unwrap();
    assert_eq!((pruned.layers, pruned.in_use), (1, 0), "{pruned:?}");
    let err = store.lease(&img).unwrap_err();
    assert!(matches!(err, ImageError::LayerMissing { .. }), "{err:?}");
}

#[test]
fn prune_waits_for_a_write_in_progress() {
    let (_home, store) = store();
    let store = Arc::new(store);
    let lease = store.write_lease().unwrap();
    // Written but not yet registered: garbage to a prune that ran now.
    let data = b"half-imported".to_vec();
    let digest = of_bytes(&data);
    store.write_blob(&digest, &data[..]).unwrap();
    let pruner = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || store.prune().unwrap())
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!pruner.is_finished(), "prune ran during the write");
    assert!(store.has_blob(&digest));
    drop(lease);
    let pruned = pruner.join().unwrap();
    assert_eq!(
        pruned.blobs, 1,
        "after the write, unregistered, it is garbage"
    );
}

#[test]
fn two_stores_on_one_home_write_at_once() {
    let home = home();
    let stores: Vec<_> = (0..2)
        .map(|_| Arc::new(ImageStore::open(home.path()).unwrap()))
        .collect();
    let base = image(&stores[0], "base", &[vec![Entry::file("x", "x")]]);
    let threads: Vec<_> = stores
        .iter()
        .enumerate()
        .map(|(i, store)| {
            let store = Arc::clone(store);
            let base = base.clone();
            std::thread::spawn(move || {
                for n in 0..50 {
                    let mut img = base.clone();
                    img.name = format!("img-{i}-{n}");
                    store.register(&img).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(stores[1].list().unwrap().len(), 100);
}
