//! Helpers for brig-image's integration tests.
#![allow(dead_code)] // each test binary uses its own share of them

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use brig_image::ImageStore;

/// A fresh home under the target directory (ext4 here, with user xattrs;
/// /tmp may be a tmpfs without them).
pub fn home() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("brig-image-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap()
}

/// A store in a fresh home; keep the home alive as long as the store.
pub fn store() -> (tempfile::TempDir, ImageStore) {
    let home = home();
    let store = ImageStore::open(home.path()).unwrap();
    (home, store)
}

/// True as root; otherwise skips (loudly, or fails under BRIG_TEST_STRICT=1).
pub fn root_or_skip() -> bool {
    let root = brig_test_support::is_root();
    if !root {
        brig_test_support::skip(
            "this test needs root: unpacking a layer sets ownership and makes whiteout device nodes",
        );
    }
    root
}

/// The value of xattr `name` on `path` (not following a symlink).
pub fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(_) => None,
    }
}

/// Names in `dir` starting with `.tmp-` (leftovers of a failed write).
pub fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp-"))
        .collect()
}

/// (mode & 07777, uid, gid) of `path`, not following a symlink.
pub fn owner_mode(path: &Path) -> (u32, u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.mode() & 0o7777, m.uid(), m.gid())
}
