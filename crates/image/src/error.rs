//! [`ImageError`]: every way the store, an unpack or an import can fail.
//!
//! One enum for the crate because the API is one surface (a puller calls
//! `write_blob`, `unpack_layer` and `register` in a row and wants one error
//! type). Each variant carries what failed (the path, digest, layer entry
//! or image name) and its message says what a person can do about it.

use std::path::PathBuf;

/// Why an image operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("invalid image reference {reference:?}: {reason}")]
    BadReference { reference: String, reason: String },
    #[error("cannot pull {reference}: {reason}")]
    Registry { reference: String, reason: String },
    #[error("{reason}")]
    BadImage { reason: String },
    #[error("Dockerfile line {line}: {reason}")]
    Dockerfile { line: usize, reason: String },
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the image index {path}")]
    OpenIndex {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "the image index {path} has schema version {found}, newer than the {supported} this brig \
         understands: it was written by a newer brig; upgrade brig or point --home elsewhere"
    )]
    IndexTooNew {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("image index query failed: {op}")]
    Query {
        op: &'static str,
        #[source]
        source: rusqlite::Error,
    },
    #[error("corrupt row in the image index (image {name:?}): {reason}")]
    CorruptRow { name: String, reason: String },

    #[error("invalid digest {digest:?}: expected sha256:<64 lowercase hex digits> (only sha256 is supported)")]
    InvalidDigest { digest: String },
    #[error("content does not match its digest: expected {expected}, got {got}; the source is corrupt or truncated, fetch it again")]
    DigestMismatch { expected: String, got: String },
    #[error("blob {digest} is {got} bytes but its descriptor says {expected}; the manifest or the blob is corrupt, fetch the image again")]
    SizeMismatch {
        digest: String,
        expected: u64,
        got: u64,
    },
    #[error("cannot read the content of {what}")]
    Read {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("blob {digest} is not in the image store: pull or import the image again")]
    BlobMissing { digest: String },

    #[error("unsupported layer media type {media_type:?}: brig unpacks uncompressed, gzip and zstd tar layers (OCI or Docker media types)")]
    UnsupportedMediaType { media_type: String },
    #[error("cannot read layer {blob}: its stream is corrupt or truncated; pull or import the image again")]
    LayerStream {
        blob: String,
        #[source]
        source: std::io::Error,
    },
    #[error("layer {blob} refused: entry {entry:?} {reason}")]
    EntryRefused {
        blob: String,
        entry: String,
        reason: String,
    },
    #[error("layer {blob}: cannot {op} for entry {entry:?}")]
    EntryIo {
        blob: String,
        entry: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("layer {blob} unpacks to content with digest {got}, not its diff id {expected}; the image's config and layer disagree, fetch the image again")]
    DiffIdMismatch {
        blob: String,
        expected: String,
        got: String,
    },

    #[error(
        "invalid image name {name:?}: use 1 to 255 characters of letters, digits and . _ - : / @"
    )]
    InvalidName { name: String },
    #[error("image {name} needs layer {diff_id}, which is not unpacked in the store: unpack it (unpack_layer) before registering")]
    LayerMissing { name: String, diff_id: String },
    #[error("image {name}'s manifest {digest} is not in the store: write it (write_blob) before registering")]
    ManifestMissing { name: String, digest: String },
    #[error("no image named {name:?}: `brig template ls` lists the images there are")]
    NotFound { name: String },

    #[error("not an OCI layout, oci-archive or docker-archive: {path} has neither index.json nor manifest.json")]
    NotAnImage { path: PathBuf },
    #[error("{path} is a {compression}-compressed file: decompress it first (an oci-archive or docker-archive is a plain tar)")]
    CompressedArchive {
        path: PathBuf,
        compression: &'static str,
    },
    #[error("{path}: {reason}")]
    BadLayout { path: PathBuf, reason: String },
    #[error("{what} is not valid JSON of its kind; the image is corrupt or not an image")]
    Json {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path} has no image for {wanted} (it has {found}); import an image built for this host's platform")]
    NoPlatform {
        path: PathBuf,
        wanted: String,
        found: String,
    },
}

impl ImageError {
    /// An [`ImageError::Io`] for `op` on `path`, for `map_err`.
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> ImageError {
        let path = path.into();
        move |source| ImageError::Io { op, path, source }
    }

    /// An [`ImageError::Query`] for `op`, for `map_err`.
    pub(crate) fn query(op: &'static str) -> impl FnOnce(rusqlite::Error) -> ImageError {
        move |source| ImageError::Query { op, source }
    }
}
