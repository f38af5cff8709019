//! [`ImageStore`]: blobs by digest, layers unpacked by diff id, and the
//! index of images, under `<home>/images/`.
//!
//! ```text
//! images/
//!   blobs/sha256/<hex>   compressed layers, configs, manifests
//!   layers/<hex>/        a layer unpacked, named by its diff id
//!   images.db            the index (db.rs)
//!   .lock                flock'ed: shared by writers, exclusive by prune
//! ```
//!
//! Nothing half-written is ever visible under its final name. A blob is
//! written to `blobs/sha256/.tmp-*` while it is hashed, and renamed only if
//! its digest (and size, when known) is right; a layer is unpacked into
//! `layers/.tmp-*` and renamed only once the whole uncompressed stream
//! matched its diff id. Both reach the disk before the rename (a blob by
//! `fsync`, a layer by `syncfs`: one call instead of one per file, at the
//! price of flushing the rest of the filesystem too), so a crash cannot
//! leave a torn file under a good name. Both are idempotent: a blob
//! or layer that exists is not written again (two writers racing rename
//! identical content over each other, or the loser throws its copy away).
//!
//! Locking. [`ImageStore::prune`] deletes what no registered image
//! references, so it must not run while an image is half-imported (its
//! blobs written, not yet registered) nor take the layers of a running
//! sandbox whose image was removed. Hence `.lock`: `write_blob` and
//! `unpack_layer` hold it shared while they run, [`import`](crate::import)
//! for the whole import, and a puller should hold a [`WriteLease`] from its
//! first `write_blob` to its `register`; prune holds it exclusively. A
//! sandbox holds a [`LayerLease`] (a shared flock on each of its layer
//! directories) and prune leaves a locked layer alone.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::Connection;
use rustix::fs::{self as rfs, FlockOperation};

use crate::digest::{self, HashingReader};
use crate::{db, unpack, ImageError, ImageRecord};

/// OCI and Docker media types of layers, by how they are compressed.
pub mod media_types {
    pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
    pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    pub const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
    pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    pub const DOCKER_FOREIGN_LAYER_GZIP: &str =
        "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip";
    pub const DOCKER_LAYER_ZSTD: &str = "application/vnd.docker.image.rootfs.diff.tar.zstd";
    pub const NONDIST_LAYER_TAR: &str = "application/vnd.oci.image.layer.nondistributable.v1.tar";
    pub const NONDIST_LAYER_GZIP: &str =
        "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip";
    pub const NONDIST_LAYER_ZSTD: &str =
        "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd";
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The compression a layer media type names, or
    /// [`ImageError::UnsupportedMediaType`].
    pub fn of_media_type(media_type: &str) -> Result<Compression, ImageError> {
        use media_types::*;
        match media_type {
            LAYER_TAR | DOCKER_LAYER_TAR | NONDIST_LAYER_TAR => Ok(Compression::None),
            LAYER_GZIP | DOCKER_LAYER_GZIP | DOCKER_FOREIGN_LAYER_GZIP | NONDIST_LAYER_GZIP => {
                Ok(Compression::Gzip)
            }
            LAYER_ZSTD | DOCKER_LAYER_ZSTD | NONDIST_LAYER_ZSTD => Ok(Compression::Zstd),
            other => Err(ImageError::UnsupportedMediaType {
                media_type: other.to_string(),
            }),
        }
    }

    /// The compression of a stream that starts with `magic` (a
    /// docker-archive's layers come without media types).
    pub fn sniff(magic: &[u8]) -> Compression {
        if magic.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }

    /// The OCI layer media type for this compression.
    pub fn oci_media_type(self) -> &'static str {
        match self {
            Compression::None => media_types::LAYER_TAR,
            Compression::Gzip => media_types::LAYER_GZIP,
            Compression::Zstd => media_types::LAYER_ZSTD,
        }
    }

    fn decoder<'a, R: Read + 'a>(self, reader: R) -> io::Result<Box<dyn Read + 'a>> {
        Ok(match self {
            Compression::None => Box::new(reader),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
            Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(reader)?),
        })
    }
}

/// The image store of one brig home. `Send` and `Sync`: its index
/// connection is behind a mutex.
#[derive(Debug)]
pub struct ImageStore {
    root: PathBuf,
    db: Mutex<Connection>,
}

/// What [`ImageStore::prune`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// Blobs no registered image references.
    pub blobs: usize,
    /// Layer directories no registered image references.
    pub layers: usize,
    /// Bytes freed: blobs, layers' files, and leftovers of writes that
    /// died half-way.
    pub bytes: u64,
    /// Unreferenced layers kept because a sandbox still uses them (a
    /// [`LayerLease`] is held); the next prune after it ends removes them.
    pub in_use: usize,
}

/// A shared hold on the store that keeps [`ImageStore::prune`] away while
/// an image is written: take it before the first `write_blob` of a pull
/// and drop it after `register`.
#[derive(Debug)]
pub struct WriteLease {
    _lock: File,
}

/// A shared hold on an image's layer directories, for as long as a
/// sandbox has them mounted: [`ImageStore::prune`] does not remove a
/// leased layer even if its image is removed.
#[derive(Debug)]
pub struct LayerLease {
    _dirs: Vec<File>,
}

impl ImageStore {
    /// Open the store of `home` (`home/images`), creating it if needed.
    pub fn open(home: &Path) -> Result<ImageStore, ImageError> {
        let root = home.join("images");
        for dir in [root.join("blobs").join(digest::SHA256), root.join("layers")] {
            fs::create_dir_all(&dir).map_err(ImageError::io("create", &dir))?;
        }
        // The owner's only: layers hold setuid programs (an image's, or
        // what a build step made as the sandbox's root, which is root on
        // disk), which no other user of the host may reach and run.
        // Sandboxes mount the layers as the daemon, so they need no more.
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&root, fs::Permissions::from_mode(0o700))
                .map_err(ImageError::io("restrict", &root))?;
        }
        let db = db::open(&root.join(db::DB_FILE))?;
        Ok(ImageStore {
            root,
            db: Mutex::new(db),
        })
    }

    /// `<home>/images`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether the blob `digest` (`sha256:<hex>`) is in the store. False
    /// for an invalid digest.
    pub fn has_blob(&self, digest: &str) -> bool {
        digest::hex_of(digest).is_some() && self.blob_path(digest).is_file()
    }

    /// Where the blob `digest` is (or would be). An invalid digest gives
    /// `blobs/invalid`, which never exists.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let blobs = self.root.join("blobs");
        match digest::hex_of(digest) {
            Some(hex) => blobs.join(digest::SHA256).join(hex),
            None => blobs.join("invalid"),
        }
    }

    /// Where the layer with diff id `diff_id` is (or would be) unpacked. An
    /// invalid digest gives `layers/invalid`, which never exists.
    pub fn layer_dir(&self, diff_id: &str) -> PathBuf {
        let layers = self.root.join("layers");
        match digest::hex_of(diff_id) {
            Some(hex) => layers.join(hex),
            None => layers.join("invalid"),
        }
    }

    /// Store the blob `expected` from `reader`, checking its digest; the
    /// bytes stored. A mismatch, or a reader that fails, leaves nothing.
    /// A blob the store already has is not written again (`reader` is not
    /// read).
    pub fn write_blob(&self, expected: &str, reader: impl Read) -> Result<u64, ImageError> {
        self.write_blob_sized(expected, None, reader)
    }

    /// [`write_blob`](Self::write_blob), also checking the size a
    /// descriptor gives (and reading no more than one byte past it).
    pub fn write_blob_sized(
        &self,
        expected: &str,
        size: Option<u64>,
        reader: impl Read,
    ) -> Result<u64, ImageError> {
        let hex = digest::check(expected)?;
        let path = self.blobs_dir().join(hex);
        if let Ok(meta) = fs::metadata(&path) {
            return match size {
                Some(size) if size != meta.len() => Err(ImageError::SizeMismatch {
                    digest: expected.to_string(),
                    expected: size,
                    got: meta.len(),
                }),
                _ => Ok(meta.len()),
            };
        }
        let _lock = self.lock(FlockOperation::LockShared)?;
        let limited: Box<dyn Read> = match size {
            Some(size) => Box::new(reader.take(size.saturating_add(1))),
            None => Box::new(reader),
        };
        let (got, n, tmp) = self.spool(limited, expected)?;
        if let Some(size) = size {
            if n != size {
                return Err(ImageError::SizeMismatch {
                    digest: expected.to_string(),
                    expected: size,
                    got: n,
                });
            }
        }
        if got != expected {
            return Err(ImageError::DigestMismatch {
                expected: expected.to_string(),
                got,
            });
        }
        tmp.persist(&path)
            .map_err(|e| ImageError::io("rename a blob into", &path)(e.error))?;
        Ok(n)
    }

    /// Store a blob whose digest is not known beforehand (a
    /// docker-archive's compressed layer); its digest and size.
    pub(crate) fn write_blob_unknown(
        &self,
        reader: impl Read,
        what: &str,
    ) -> Result<(String, u64), ImageError> {
        let _lock = self.lock(FlockOperation::LockShared)?;
        let (digest, n, tmp) = self.spool(reader, what)?;
        let path = self.blob_path(&digest);
        if !path.exists() {
            tmp.persist(&path)
                .map_err(|e| ImageError::io("rename a blob into", &path)(e.error))?;
        }
        Ok((digest, n))
    }

    /// Copy `reader` into a temporary file among the blobs, hashing it.
    fn spool(
        &self,
        reader: impl Read,
        what: &str,
    ) -> Result<(String, u64, tempfile::NamedTempFile), ImageError> {
        let dir = self.blobs_dir();
        let mut tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .permissions(fs::Permissions::from_mode(0o644))
            .tempfile_in(&dir)
            .map_err(ImageError::io("create a temporary blob in", &dir))?;
        let mut reader = HashingReader::new(reader);
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => {
                    return Err(ImageError::Read {
                        what: what.to_string(),
                        source,
                    })
                }
            };
            tmp.write_all(&buf[..n])
                .map_err(ImageError::io("write", tmp.path()))?;
        }
        tmp.as_file()
            .sync_all()
            .map_err(ImageError::io("sync", tmp.path()))?;
        let (digest, n) = reader.finish().map_err(|source| ImageError::Read {
            what: what.to_string(),
            source,
        })?;
        Ok((digest, n, tmp))
    }

    /// Unpack the layer blob `blob` (compressed as `media_type` says) into
    /// [`layer_dir`](Self::layer_dir)`(diff_id)`, checking that the
    /// uncompressed stream's digest is `diff_id`. A layer already unpacked
    /// is reused as it is. On any failure no layer directory appears.
    pub fn unpack_layer(
        &self,
        blob: &str,
        media_type: &str,
        diff_id: &str,
    ) -> Result<PathBuf, ImageError> {
        digest::check(blob)?;
        digest::check(diff_id)?;
        let dest = self.layer_dir(diff_id);
        if dest.is_dir() {
            return Ok(dest);
        }
        let compression = Compression::of_media_type(media_type)?;
        let _lock = self.lock(FlockOperation::LockShared)?;
        let blob_path = self.blob_path(blob);
        let file = match File::open(&blob_path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ImageError::BlobMissing {
                    digest: blob.to_string(),
                })
            }
            Err(e) => return Err(ImageError::io("open", &blob_path)(e)),
        };
        let layers = self.root.join("layers");
        let tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .tempdir_in(&layers)
            .map_err(ImageError::io("create a temporary layer in", &layers))?;
        // The temporary stays 0700 while it is written (no other user can
        // get in and race the unpack); unpack gives the root its mode last.
        let stream_err = |source| ImageError::LayerStream {
            blob: blob.to_string(),
            source,
        };
        let decoder = compression
            .decoder(BufReader::with_capacity(256 * 1024, file))
            .map_err(stream_err)?;
        let reader = unpack::unpack(HashingReader::new(decoder), tmp.path(), blob)?;
        let (got, _) = reader.finish().map_err(stream_err)?;
        if got != diff_id {
            return Err(ImageError::DiffIdMismatch {
                blob: blob.to_string(),
                expected: diff_id.to_string(),
                got,
            });
        }
        // Everything unpacked on disk before the name says it is there.
        let root = File::open(tmp.path()).map_err(ImageError::io("open", tmp.path()))?;
        rfs::syncfs(&root).map_err(|e| ImageError::io("sync", tmp.path())(e.into()))?;
        match fs::rename(tmp.path(), &dest) {
            Ok(()) => {
                let _ = tmp.keep();
                Ok(dest)
            }
            // Another process unpacked the same layer first; ours goes.
            Err(_) if dest.is_dir() => Ok(dest),
            Err(e) => Err(ImageError::io("rename a layer into", &dest)(e)),
        }
    }

    /// Add `image` to the index, replacing an image of the same name. Its
    /// layers must be unpacked and its manifest blob stored.
    pub fn register(&self, image: &ImageRecord) -> Result<(), ImageError> {
        check_name(&image.name)?;
        // Shared: a prune cannot take a layer between the check and the
        // insert.
        let _lock = self.lock(FlockOperation::LockShared)?;
        digest::check(&image.digest)?;
        if !self.has_blob(&image.digest) {
            return Err(ImageError::ManifestMissing {
                name: image.name.clone(),
                digest: image.digest.clone(),
            });
        }
        if let Some(base) = &image.base {
            if !base.is_dir() {
                return Err(ImageError::LayerMissing {
                    name: image.name.clone(),
                    diff_id: base.display().to_string(),
                });
            }
        }
        for diff_id in &image.layers {
            digest::check(diff_id)?;
            if !self.layer_dir(diff_id).is_dir() {
                return Err(ImageError::LayerMissing {
                    name: image.name.clone(),
                    diff_id: diff_id.clone(),
                });
            }
        }
        db::upsert(&self.db(), image)
    }

    /// The image called `name`, if there is one.
    pub fn get(&self, name: &str) -> Result<Option<ImageRecord>, ImageError> {
        db::get(&self.db(), name)
    }

    /// Every image, by name.
    pub fn list(&self) -> Result<Vec<ImageRecord>, ImageError> {
        db::list(&self.db())
    }

    /// Remove the image called `name` from the index and return it. Its
    /// blobs and layers stay until [`prune`](Self::prune).
    pub fn remove(&self, name: &str) -> Result<ImageRecord, ImageError> {
        let db = self.db();
        let image = db::get(&db, name)?.ok_or_else(|| ImageError::NotFound {
            name: name.to_string(),
        })?;
        db::delete(&db, name)?;
        Ok(image)
    }

    /// The layer directories of `image` for overlayfs's `lowerdir`, top
    /// first. A layer that appears twice (an empty layer, say) is given
    /// once, at its topmost place: overlayfs refuses the same directory
    /// twice, and the lower copy could only show what the upper one does.
    pub fn lowers(&self, image: &ImageRecord) -> Vec<PathBuf> {
        let mut seen = HashSet::new();
        image
            .layers
            .iter()
            .rev()
            .filter(|d| seen.insert(d.as_str()))
            .map(|d| self.layer_dir(d))
            .chain(image.base.clone())
            .collect()
    }

    /// Hold `image`'s layers for a sandbox: [`prune`](Self::prune) leaves
    /// them until the lease is dropped. Fails with
    /// [`ImageError::LayerMissing`] if one is gone (pruned after the image
    /// was removed).
    pub fn lease(&self, image: &ImageRecord) -> Result<LayerLease, ImageError> {
        let mut dirs = Vec::new();
        for dir in self.lowers(image) {
            let missing = || ImageError::LayerMissing {
                name: image.name.clone(),
                diff_id: format!(
                    "sha256:{}",
                    dir.file_name().unwrap_or_default().to_string_lossy()
                ),
            };
            let file = match File::open(&dir) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing()),
                Err(e) => return Err(ImageError::io("open", &dir)(e)),
            };
            rfs::flock(&file, FlockOperation::LockShared)
                .map_err(|e| ImageError::io("lock", &dir)(e.into()))?;
            // Prune renames a layer away before removing it: if it did
            // while we waited for the lock, this is not the layer any more.
            let here = fs::metadata(&dir).ok();
            let ours = file.metadata().map_err(ImageError::io("stat", &dir))?;
            if here.is_none_or(|m| m.ino() != ours.ino() || m.dev() != ours.dev()) {
                return Err(missing());
            }
            dirs.push(file);
        }
        Ok(LayerLease { _dirs: dirs })
    }

    /// Hold the store for writing an image (see [`WriteLease`]).
    pub fn write_lease(&self) -> Result<WriteLease, ImageError> {
        Ok(WriteLease {
            _lock: self.lock(FlockOperation::LockShared)?,
        })
    }

    /// Remove the blobs and layer directories no registered image
    /// references, and what writes that died half-way left. Waits for
    /// writes in progress ([`WriteLease`]) to end first; do not call it
    /// while holding one.
    pub fn prune(&self) -> Result<Pruned, ImageError> {
        let _lock = self.lock(FlockOperation::LockExclusive)?;
        let mut keep_blobs = HashSet::new();
        let mut keep_layers = HashSet::new();
        for image in self.list()? {
            keep_blobs.extend(self.referenced_blobs(&image)?);
            keep_layers.extend(image.layers.iter().cloned());
        }
        let mut pruned = Pruned::default();

        let blobs = self.blobs_dir();
        for (name, path) in entries(&blobs)? {
            let leftover = name.starts_with(".tmp-");
            let unused = digest::hex_of(&format!("sha256:{name}"))
                .is_some_and(|_| !keep_blobs.contains(&format!("sha256:{name}")));
            if !(leftover || unused) {
                continue;
            }
            let len = fs::symlink_metadata(&path).map_or(0, |m| m.len());
            fs::remove_file(&path).map_err(ImageError::io("remove", &path))?;
            pruned.bytes += len;
            pruned.blobs += usize::from(unused);
        }

        let layers = self.root.join("layers");
        for (name, path) in entries(&layers)? {
            if name.starts_with(".tmp-") {
                pruned.bytes += disk_usage(&path);
                fs::remove_dir_all(&path).map_err(ImageError::io("remove", &path))?;
                continue;
            }
            let diff_id = format!("sha256:{name}");
            if digest::hex_of(&diff_id).is_none() || keep_layers.contains(&diff_id) {
                continue;
            }
            let dir = File::open(&path).map_err(ImageError::io("open", &path))?;
            match rfs::flock(&dir, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    pruned.in_use += 1;
                    continue;
                }
                Err(e) => return Err(ImageError::io("lock", &path)(e.into())),
            }
            // Renamed first, so a prune that dies half-way leaves a
            // leftover, never a layer with files missing under its name.
            let doomed = layers.join(format!(".tmp-prune-{name}"));
            fs::rename(&path, &doomed).map_err(ImageError::io("rename", &path))?;
            pruned.bytes += disk_usage(&doomed);
            fs::remove_dir_all(&doomed).map_err(ImageError::io("remove", &doomed))?;
            pruned.layers += 1;
        }
        Ok(pruned)
    }

    /// The blobs `image` needs: its manifest, and the config and layers the
    /// manifest names.
    fn referenced_blobs(&self, image: &ImageRecord) -> Result<Vec<String>, ImageError> {
        let mut out = vec![image.digest.clone()];
        let path = self.blob_path(&image.digest);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            // Nothing more to keep for it; its layers are kept by diff id.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(ImageError::io("read", &path)(e)),
        };
        let manifest: oci_spec::image::ImageManifest =
            serde_json::from_slice(&bytes).map_err(|source| ImageError::Json {
                what: format!("the manifest {} of image {}", image.digest, image.name),
                source,
            })?;
        out.push(manifest.config().digest().to_string());
        out.extend(manifest.layers().iter().map(|l| l.digest().to_string()));
        Ok(out)
    }

    fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs").join(digest::SHA256)
    }

    fn db(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the connection leaves it usable: every
        // statement is its own transaction.
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self, op: FlockOperation) -> Result<File, ImageError> {
        let path = self.root.join(".lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(ImageError::io("open", &path))?;
        rfs::flock(&file, op).map_err(|e| ImageError::io("lock", &path)(e.into()))?;
        Ok(file)
    }
}

/// Names brig accepts for images: what registries and tools use.
pub(crate) fn check_name(name: &str) -> Result<(), ImageError> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:/@".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ImageError::InvalidName {
            name: name.to_string(),
        })
    }
}

/// The entries of `dir`: (name, path), names that are not UTF-8 skipped
/// (the store never makes one).
fn entries(dir: &Path) -> Result<Vec<(String, PathBuf)>, ImageError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(ImageError::io("read", dir))? {
        let entry = entry.map_err(ImageError::io("read", dir))?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push((name, entry.path()));
        }
    }
    Ok(out)
}

/// Bytes of the regular files under `path` (hard links once), best effort.
fn disk_usage(path: &Path) -> u64 {
    fn walk(path: &Path, seen: &mut HashSet<(u64, u64)>) -> u64 {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return 0;
        };
        if meta.is_dir() {
            let Ok(rd) = fs::read_dir(path) else {
                return 0;
            };
            return rd.flatten().map(|e| walk(&e.path(), seen)).sum();
        }
        if meta.is_file() && seen.insert((meta.dev(), meta.ino())) {
            return meta.len();
        }
        0
    }
    walk(path, &mut HashSet::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_name_their_compression() {
        use media_types::*;
        for (t, c) in [
            (LAYER_TAR, Compression::None),
            (DOCKER_LAYER_TAR, Compression::None),
            (LAYER_GZIP, Compression::Gzip),
            (DOCKER_LAYER_GZIP, Compression::Gzip),
            (NONDIST_LAYER_GZIP, Compression::Gzip),
            (LAYER_ZSTD, Compression::Zstd),
        ] {
            assert_eq!(Compression::of_media_type(t).unwrap(), c, "{t}");
        }
        assert!(matches!(
            Compression::of_media_type("application/vnd.oci.image.config.v1+json"),
            Err(ImageError::UnsupportedMediaType { .. })
        ));
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(
            Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]),
            Compression::Zstd
        );
        assert_eq!(Compression::sniff(b"etc/"), Compression::None);
    }

    #[test]
    fn image_names_are_checked() {
        for good in [
            "alpine",
            "alpine:3.20",
            "docker.io/library/alpine:latest",
            "a@sha256:00",
        ] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", "a b", "a\nb", "ä", &"x".repeat(256)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lowers_are_top_first_and_each_once() {
        let home = tempfile::tempdir().unwrap();
        let store = ImageStore::open(home.path()).unwrap();
        let (a, b) = (digest::of_bytes(b"a"), digest::of_bytes(b"b"));
        let image = ImageRecord {
            base: None,
            name: "x".into(),
            source: "test".into(),
            digest: digest::of_bytes(b"m"),
            config: Default::default(),
            layers: vec![a.clone(), b.clone(), a.clone()],
            size: 0,
            created_at: 0,
        };
        assert_eq!(
            store.lowers(&image),
            vec![store.layer_dir(&a), store.layer_dir(&b)]
        );
    }
}
