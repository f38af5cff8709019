//! brig-image: container images on disk, for sandboxes to run.
//!
//! An image is a manifest, a config and a stack of layers (tars). brig
//! keeps them content-addressed under `$BRIG_HOME/images/` in an
//! [`ImageStore`]:
//!
//! - **blobs** (`blobs/sha256/<hex>`): compressed layers, configs and
//!   manifests, each checked against its digest before it gets its name
//!   ([`ImageStore::write_blob`]);
//! - **layers** (`layers/<diff-id hex>/`): each layer unpacked once, as
//!   the directory overlayfs uses as a lower layer, whiteouts turned into
//!   what overlayfs understands under `userxattr` ([`ImageStore::unpack_layer`],
//!   the details and the defences against hostile tars in `unpack.rs`);
//! - **the index** (`images.db`, SQLite): [`ImageRecord`]s by name, each
//!   with its [`ImageConfig`] (env, working dir, user, entrypoint, cmd) and
//!   its diff ids ([`ImageStore::register`], [`get`](ImageStore::get),
//!   [`list`](ImageStore::list), [`remove`](ImageStore::remove)). Removing
//!   an image leaves its files; [`ImageStore::prune`] deletes what no
//!   image references.
//!
//! Images get in two ways. [`import`] reads an OCI layout, an oci-archive
//! or a docker-archive from disk. A registry pull ([`pull::pull`]) fetches
//! blobs itself and calls the same three steps: `write_blob` for the
//! manifest, config and layers, `unpack_layer` for each layer, `register`
//! last, holding a [`WriteLease`] throughout.
//!
//! A sandbox mounts [`ImageStore::lowers`] (top first) as the overlay's
//! `lowerdir`, holding a [`LayerLease`] while it runs.
//!
//! ```no_run
//! # fn main() -> Result<(), brig_image::ImageError> {
//! use brig_image::{import, ImageStore};
//! let store = ImageStore::open("/var/lib/brig".as_ref())?;
//! let image = import(&store, "alpine.tar".as_ref(), "alpine:3.20")?;
//! let lowerdir = store.lowers(&image); // for mount -t overlay -o lowerdir=...,userxattr
//! let _lease = store.lease(&image)?;   // while a sandbox uses them
//! # Ok(()) }
//! ```
//!
//! Unpacking needs root (ownership, whiteout device nodes); everything
//! else works for any user that owns the home.

#![forbid(unsafe_code)]

pub mod build;
mod config;
mod db;
pub mod digest;
mod error;
mod import;
pub mod layer;
pub mod pull;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod unpack;

/// The names of the images that are sandboxes' snapshots start so (the
/// daemon's `snapshots.rs`): their layers are leased by the sandboxes
/// running on them, not for a process's life.
pub const SNAPSHOT_PREFIX: &str = "snapshots/";

pub use config::{host_platform, now_millis, parse_config, ImageConfig, ImageRecord, ParsedConfig};
pub use error::ImageError;
pub use import::import;
pub use store::{media_types, Compression, ImageStore, LayerLease, Pruned, WriteLease};
pub use unpack::{OPAQUE_MARKER, OPAQUE_XATTR, WHITEOUT_PREFIX};
