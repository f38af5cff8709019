//! Bad input gets errors, never panics: truncated and bit-flipped
//! archives and layers, random bytes, and JSON of the wrong shape.

mod support;

use std::fs;
use std::path::Path;

use brig_image::digest::of_bytes;
use brig_image::testing::{
    gzip, layer_tar, write_docker_archive, write_oci_archive, write_oci_layout, Entry,
};
use brig_image::{import, media_types, ImageConfig, ImageStore};
use support::{root_or_skip, store};

/// A small deterministic generator (xorshift), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn layers() -> Vec<Vec<Entry>> {
    vec![
        vec![
            Entry::dir("etc"),
            Entry::file("etc/a", "a".repeat(3000)),
            Entry::symlink("etc/l", "a"),
        ],
        vec![
            Entry::whiteout("etc/a"),
            Entry::opaque("etc"),
            Entry::file("etc/b", "b"),
        ],
    ]
}

/// Cuts to try in a file of `len` bytes: the first and last blocks
/// closely, the rest every `step`.
fn cuts(len: usize, step: usize) -> Vec<usize> {
    let mut c: Vec<usize> = (0..len).step_by(step).collect();
    c.extend([1, 100, 511, 512, 513, 1023, 1024, 1025]);
    c.extend((1..=1024).step_by(97).map(|d| len.saturating_sub(d)));
    c.retain(|&n| n < len);
    c.sort_unstable();
    c.dedup();
    c
}

/// Where the last file's bytes end in the tar `archive`: past it come only
/// directory entries and the end marker, which an import can lose.
fn end_of_files(archive: &[u8]) -> usize {
    let mut ar = tar::Archive::new(archive);
    ar.entries()
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.header().entry_type() != tar::EntryType::Directory)
        .map(|e| (e.raw_file_position() + e.size()) as usize)
        .max()
        .unwrap()
}

/// Import every truncation of `archive` that loses some of a file: each
/// must fail, and nothing may be registered.
fn truncations_fail(store: &ImageStore, archive: &Path) {
    let full = fs::read(archive).unwrap();
    let end = end_of_files(&full);
    let cut_file = archive.with_extension("cut");
    for cut in cuts(full.len(), 211) {
        fs::write(&cut_file, &full[..cut]).unwrap();
        let result = import(store, &cut_file, "cut");
        if cut < end {
            assert!(
                result.is_err(),
                "{} cut at {cut} of {} imported",
                archive.display(),
                full.len()
            );
        }
        let _ = store.remove("cut");
    }
}

#[test]
fn truncated_archives_are_errors() {
    if !root_or_skip() {
        return;
    }
    let (home, store) = store();
    let layout = home.path().join("layout");
    write_oci_layout(&layout, &layers(), ImageConfig::default());
    let oci = home.path().join("oci.tar");
    write_oci_archive(&layout, &oci);
    truncations_fail(&store, &oci);
    let docker = home.path().join("docker.tar");
    write_docker_archive(&docker, &layers(), ImageConfig::default());
    truncations_fail(&store, &docker);
}

#[test]
fn flipped_bytes_and_random_files_do_not_panic() {
    if !root_or_skip() {
        return;
    }
    let (home, store) = store();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let layout = home.path().join("layout");
    write_oci_layout(&layout, &layers(), ImageConfig::default());
    let docker = home.path().join("docker.tar");
    write_docker_archive(&docker, &layers(), ImageConfig::default());
    let oci = home.path().join("oci.tar");
    write_oci_archive(&layout, &oci);
    let bad = home.path().join("bad.tar");
    let mut errors = 0;
    for archive in [&oci, &docker] {
        let full = fs::read(archive).unwrap();
        for _ in 0..150 {
            let mut bytes = full.clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(bytes.len());
                bytes[at] ^= 1 << rng.below(8);
            }
            fs::write(&bad, &bytes).unwrap();
            errors += usize::from(import(&store, &bad, "flipped").is_err());
        }
    }
    assert!(errors > 100, "most flips must be caught ({errors} of 300)");
    for len in [0, 1, 511, 512, 1024, 4096, 70_000] {
        fs::write(&bad, rng.bytes(len)).unwrap();
        assert!(
            import(&store, &bad, "random").is_err(),
            "{len} random bytes imported"
        );
    }
    // A tar of the right shape whose members are random.
    let mut b = tar::Builder::new(Vec::new());
    for name in ["oci-layout", "index.json", "manifest.json"] {
        let data = rng.bytes(300);
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, &data[..]).unwrap();
    }
    fs::write(&bad, b.into_inner().unwrap()).unwrap();
    assert!(import(&store, &bad, "random").is_err());
    assert!(store
        .get("flipped")
        .unwrap()
        .is_none_or(|i| i.layers.len() == 2));
}

#[test]
fn damaged_layers_are_errors() {
    if !root_or_skip() {
        return;
    }
    let (_home, store) = store();
    let mut rng = Rng(42);
    let tar = layer_tar(&layers()[0]);
    let diff_id = of_bytes(&tar);
    let gz = gzip(&tar);
    let mut tried = 0;
    let mut attempt = |blob: Vec<u8>, media_type: &str| {
        let digest = of_bytes(&blob);
        store.write_blob(&digest, &blob[..]).unwrap();
        let result = store.unpack_layer(&digest, media_type, &diff_id);
        assert!(
            result.is_err(),
            "a damaged layer unpacked ({media_type}, {} bytes)",
            blob.len()
        );
        assert!(!store.layer_dir(&diff_id).exists());
        tried += 1;
    };
    for cut in cuts(gz.len(), 37) {
        attempt(gz[..cut].to_vec(), media_types::LAYER_GZIP);
    }
    for cut in cuts(tar.len(), 101) {
        attempt(tar[..cut].to_vec(), media_types::LAYER_TAR);
    }
    for _ in 0..200 {
        let mut t = tar.clone();
        let at = rng.below(t.len());
        t[at] ^= 1 << rng.below(8);
        attempt(t, media_types::LAYER_TAR);
    }
    for len in [0, 10, 512, 5000] {
        attempt(rng.bytes(len), media_types::LAYER_GZIP);
        attempt(rng.bytes(len), media_types::LAYER_ZSTD);
    }
    assert!(tried > 200, "{tried} tried");
}

#[test]
fn json_of_the_wrong_shape_is_an_error() {
    let (home, store) = store();
    let dir = home.path().join("layout");
    fs::create_dir(&dir).unwrap();
    fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let blob = |bytes: &[u8]| {
        let d = of_bytes(bytes);
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs::write(dir.join("blobs/sha256").join(&d[7..]), bytes).unwrap();
        format!(
            r#"{{"mediaType":"MT","digest":"{d}","size":{}}}"#,
            bytes.len()
        )
    };
    let index_of = |desc: String, mt: &str| {
        format!(
            r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
            desc.replace("MT", mt)
        )
    };
    const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    const INDEX: &str = "application/vnd.oci.image.index.v1+json";
    let config_ok =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let mut cases: Vec<(String, String)> = vec![
        ("not json".into(), "".into()),
        ("{}".into(), "".into()),
        ("[]".into(), "".into()),
        (r#"{"schemaVersion":2,"manifests":"x"}"#.into(), "".into()),
        (r#"{"schemaVersion":2,"manifests":[]}"#.into(), "".into()),
        // A manifest that is not one.
        (index_of(blob(b"[1,2,3]"), MANIFEST), "".into()),
        // A manifest whose size lies.
        (
            index_of(blob(b"{}"), MANIFEST).replace(r#""size":2"#, r#""size":99999999999"#),
            "".into(),
        ),
    ];
    // Manifests whose config is garbage, or whose layers and diff ids
    // disagree.
    for (config, layers) in [
        (&b"{\"os\":1}"[..], "[]".to_string()),
        (
            &config_ok[..],
            format!(
                "[{}]",
                blob(b"layer").replace("MT", media_types::LAYER_GZIP)
            ),
        ),
    ] {
        let manifest = format!(
            r#"{{"schemaVersion":2,"config":{},"layers":{layers}}}"#,
            blob(config).replace("MT", "application/vnd.oci.image.config.v1+json")
        );
        cases.push((index_of(blob(manifest.as_bytes()), MANIFEST), String::new()));
    }
    // Indexes nested past the limit.
    let mut desc = blob(br#"{"schemaVersion":2,"manifests":[]}"#);
    for _ in 0..6 {
        desc = blob(index_of(desc, INDEX).as_bytes());
    }
    cases.push((index_of(desc, INDEX), String::new()));
    // A docker-archive manifest.json of the wrong shape.
    cases.push((String::new(), r#"{"Config":1}"#.into()));
    cases.push((String::new(), "[]".into()));
    cases.push((
        String::new(),
        r#"[{"Config":"missing.json","Layers":[]}]"#.into(),
    ));

    for (index, manifest) in cases {
        let _ = fs::remove_file(dir.join("index.json"));
        let _ = fs::remove_file(dir.join("manifest.json"));
        if !index.is_empty() {
            fs::write(dir.join("index.json"), &index).unwrap();
        }
        if !manifest.is_empty() {
            fs::write(dir.join("manifest.json"), &manifest).unwrap();
        }
        let err = import(&store, &dir, "shape").expect_err(&format!("{index}{manifest} imported"));
        assert!(!err.to_string().is_empty());
    }
    assert!(store.list().unwrap().is_empty());
}
