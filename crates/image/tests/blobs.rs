//! Blobs: written only when their content matches their digest.

mod support;

use std::io::{self, Read};

use brig_image::digest::of_bytes;
use brig_image::ImageError;
use support::{leftovers, store};

#[test]
fn a_blob_is_stored_under_its_digest() {
    let (_home, store) = store();
    let data = b"some layer bytes".repeat(10_000);
    let digest = of_bytes(&data);
    assert!(!store.has_blob(&digest));
    let n = store.write_blob(&digest, &data[..]).unwrap();
    assert_eq!(n, data.len() as u64);
    assert!(store.has_blob(&digest));
    assert_eq!(std::fs::read(store.blob_path(&digest)).unwrap(), data);
    assert!(store
        .blob_path(&digest)
        .ends_with(format!("images/blobs/sha256/{}", &digest[7..])));
    // Again: nothing read, the same answer.
    let n = store
        .write_blob(&digest, FailingReader { left: 0 })
        .unwrap();
    assert_eq!(n, data.len() as u64);
}

#[test]
fn a_mismatch_leaves_nothing() {
    let (_home, store) = store();
    let claimed = of_bytes(b"what the manifest says");
    let err = store
        .write_blob(&claimed, &b"what arrived"[..])
        .unwrap_err();
    match &err {
        ImageError::DigestMismatch { expected, got } => {
            assert_eq!(expected, &claimed);
            assert_eq!(got, &of_bytes(b"what arrived"));
        }
        other => panic!("expected DigestMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains("fetch it again"), "{err}");
    assert!(!store.has_blob(&claimed));
    assert!(!store.blob_path(&claimed).exists());
    assert!(leftovers(&store.root().join("blobs/sha256")).is_empty());
}

#[test]
fn a_truncated_or_failing_reader_leaves_nothing() {
    let (_home, store) = store();
    let data = vec![7u8; 100_000];
    let digest = of_bytes(&data);

    // Ends early: the digest of what came is not the blob's.
    let err = store.write_blob(&digest, &data[..50_000]).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { .. }), "{err:?}");

    // Fails part-way (a dropped connection).
    let err = store
        .write_blob(
            &digest,
            (&data[..]).take(10_000).chain(FailingReader { left: 0 }),
        )
        .unwrap_err();
    assert!(matches!(err, ImageError::Read { .. }), "{err:?}");

    assert!(!store.has_blob(&digest));
    assert!(leftovers(&store.root().join("blobs/sha256")).is_empty());
}

#[test]
fn a_descriptor_size_is_checked() {
    let (_home, store) = store();
    let data = b"0123456789";
    let digest = of_bytes(data);
    let err = store
        .write_blob_sized(&digest, Some(4), &data[..])
        .unwrap_err();
    assert!(
        matches!(
            err,
            ImageError::SizeMismatch {
                expected: 4,
                got: 5,
                ..
            }
        ),
        "read one byte past the size, no more: {err:?}"
    );
    assert!(!store.has_blob(&digest));
    assert_eq!(
        store
            .write_blob_sized(&digest, Some(10), &data[..])
            .unwrap(),
        10
    );
    // A stored blob is checked against the size too.
    assert!(matches!(
        store.write_blob_sized(&digest, Some(11), &data[..]),
        Err(ImageError::SizeMismatch { .. })
    ));
}

#[test]
fn invalid_digests_are_refused_and_name_no_file() {
    let (_home, store) = store();
    for bad in ["sha256:../../etc/passwd", "sha512:00", "latest", ""] {
        assert!(matches!(
            store.write_blob(bad, &b"x"[..]),
            Err(ImageError::InvalidDigest { .. })
        ));
        assert!(!store.has_blob(bad));
        assert_eq!(store.blob_path(bad), store.root().join("blobs/invalid"));
        assert_eq!(store.layer_dir(bad), store.root().join("layers/invalid"));
    }
}

/// Yields `left` zero bytes, then fails.
struct FailingReader {
    left: usize,
}

impl Read for FailingReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "connection reset",
            ));
        }
        let n = buf.len().min(self.left);
        buf[..n].fill(0);
        self.left -= n;
        Ok(n)
    }
}

/// The store's root is its owner's only: layers hold setuid programs that
/// no other user of the host may reach.
#[test]
fn the_store_is_its_owners_only() {
    use std::os::unix::fs::PermissionsExt;
    let (_home, store) = store();
    let mode = std::fs::metadata(store.root())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}
