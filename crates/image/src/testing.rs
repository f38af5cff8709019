//! Images for tests (feature `testing`): layer tars from a list of
//! [`Entry`]s, written as an OCI layout, a multi-platform OCI layout, an
//! oci-archive or a docker-archive, or straight into a store.
//!
//! Everything here is deterministic (fixed mtimes, gzip without a
//! timestamp), so the same entries always give the same digests. Paths
//! are written into the tar exactly as given, `..` and absolute ones
//! included, so hostile layers can be made too. These helpers panic on
//! I/O errors: they are for tests.
//!
//! ```no_run
//! use brig_image::testing::{write_oci_layout, Entry};
//! use brig_image::ImageConfig;
//! let dir = std::path::Path::new("/tmp/layout");
//! let manifest = write_oci_layout(
//!     dir,
//!     &[
//!         vec![Entry::dir("etc"), Entry::file("etc/motd", "hi\n"), Entry::file("etc/old", "x")],
//!         vec![Entry::whiteout("etc/old"), Entry::opaque("var/cache")],
//!     ],
//!     ImageConfig { cmd: vec!["/bin/sh".into()], ..Default::default() },
//! );
//! // skopeo copy oci:/tmp/layout docker://localhost:5000/test:latest
//! // skopeo copy oci:/tmp/layout docker-archive:/tmp/test.tar
//! # let _ = manifest;
//! ```

use std::io::Write;
use std::path::Path;

use serde_json::json;

use crate::digest::{hex_of, of_bytes};
use crate::{host_platform, media_types, Compression, ImageConfig, ImageStore};

/// The mtime every entry has unless [`Entry::mtime`] says otherwise.
pub const DEFAULT_MTIME: u64 = 1_700_000_000;

/// One entry of a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// As written in the tar (for whiteouts and opaque markers, the path
    /// of the thing deleted, or of the directory).
    pub path: String,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    pub mtime: u64,
    /// Written as PAX `SCHILY.xattr.NAME` records.
    pub xattrs: Vec<(String, Vec<u8>)>,
}

/// What an [`Entry`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(String),
    /// A hard link to an earlier entry's path.
    Hardlink(String),
    CharDevice(u32, u32),
    BlockDevice(u32, u32),
    Fifo,
    /// `.wh.NAME`: deletes `path` of the layers below.
    Whiteout,
    /// `path/.wh..wh..opq`: hides what the layers below have in `path`.
    Opaque,
}

impl Entry {
    fn new(path: &str, kind: Kind, mode: u32) -> Entry {
        Entry {
            path: path.to_string(),
            kind,
            mode,
            uid: 0,
            gid: 0,
            mtime: DEFAULT_MTIME,
            xattrs: Vec::new(),
        }
    }

    /// A directory, mode 0755.
    pub fn dir(path: &str) -> Entry {
        Entry::new(path, Kind::Dir, 0o755)
    }

    /// A regular file, mode 0644.
    pub fn file(path: &str, contents: impl Into<Vec<u8>>) -> Entry {
        Entry::new(path, Kind::File(contents.into()), 0o644)
    }

    pub fn symlink(path: &str, target: &str) -> Entry {
        Entry::new(path, Kind::Symlink(target.to_string()), 0o777)
    }

    pub fn hardlink(path: &str, target: &str) -> Entry {
        Entry::new(path, Kind::Hardlink(target.to_string()), 0o644)
    }

    pub fn char_device(path: &str, major: u32, minor: u32) -> Entry {
        Entry::new(path, Kind::CharDevice(major, minor), 0o666)
    }

    pub fn block_device(path: &str, major: u32, minor: u32) -> Entry {
        Entry::new(path, Kind::BlockDevice(major, minor), 0o660)
    }

    pub fn fifo(path: &str) -> Entry {
        Entry::new(path, Kind::Fifo, 0o644)
    }

    /// Delete `path` (of a lower layer): `.wh.NAME` in its directory.
    pub fn whiteout(path: &str) -> Entry {
        Entry::new(path, Kind::Whiteout, 0o644)
    }

    /// Make directory `dir` opaque: `dir/.wh..wh..opq`.
    pub fn opaque(dir: &str) -> Entry {
        Entry::new(dir, Kind::Opaque, 0o644)
    }

    pub fn mode(mut self, mode: u32) -> Entry {
        self.mode = mode;
        self
    }

    pub fn owner(mut self, uid: u64, gid: u64) -> Entry {
        self.uid = uid;
        self.gid = gid;
        self
    }

    pub fn mtime(mut self, mtime: u64) -> Entry {
        self.mtime = mtime;
        self
    }

    pub fn xattr(mut self, name: &str, value: impl Into<Vec<u8>>) -> Entry {
        self.xattrs.push((name.to_string(), value.into()));
        self
    }

    /// The path in the tar: whiteouts and opaque markers get their names.
    fn tar_path(&self) -> String {
        let marker = |name: &str| match self.path.trim_end_matches('/') {
            "" | "." => name.to_string(),
            dir => format!("{dir}/{name}"),
        };
        match self.kind {
            Kind::Whiteout => match self.path.rsplit_once('/') {
                Some((dir, name)) => format!("{dir}/.wh.{name}"),
                None => format!(".wh.{}", self.path),
            },
            Kind::Opaque => marker(crate::OPAQUE_MARKER),
            _ => self.path.clone(),
        }
    }
}

/// An uncompressed layer tar of `entries`, in order, paths as given.
pub fn layer_tar(entries: &[Entry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for e in entries {
        let (kind, data, link): (tar::EntryType, &[u8], Option<&str>) = match &e.kind {
            Kind::Dir => (tar::EntryType::Directory, &[], None),
            Kind::File(data) => (tar::EntryType::Regular, data, None),
            Kind::Symlink(t) => (tar::EntryType::Symlink, &[], Some(t)),
            Kind::Hardlink(t) => (tar::EntryType::Link, &[], Some(t)),
            Kind::CharDevice(..) => (tar::EntryType::Char, &[], None),
            Kind::BlockDevice(..) => (tar::EntryType::Block, &[], None),
            Kind::Fifo => (tar::EntryType::Fifo, &[], None),
            Kind::Whiteout | Kind::Opaque => (tar::EntryType::Regular, &[], None),
        };
        let path = e.tar_path();
        let mut pax: Vec<(String, Vec<u8>)> = e
            .xattrs
            .iter()
            .map(|(k, v)| (format!("SCHILY.xattr.{k}"), v.clone()))
            .collect();
        let mut header = tar::Header::new_ustar();
        set_name(
            &mut header.as_old_mut().name,
            "path",
            path.as_bytes(),
            &mut pax,
        );
        if let Some(link) = link {
            set_name(
                &mut header.as_old_mut().linkname,
                "linkpath",
                link.as_bytes(),
                &mut pax,
            );
        }
        if !pax.is_empty() {
            append_pax(&mut builder, &pax);
        }
        header.set_entry_type(kind);
        header.set_mode(e.mode);
        header.set_uid(e.uid);
        header.set_gid(e.gid);
        header.set_mtime(e.mtime);
        header.set_size(data.len() as u64);
        if let Kind::CharDevice(major, minor) | Kind::BlockDevice(major, minor) = e.kind {
            header.set_device_major(major).unwrap();
            header.set_device_minor(minor).unwrap();
        }
        header.set_cksum();
        builder.append(&header, data).unwrap();
    }
    builder.into_inner().unwrap()
}

/// Put `value` in a 100-byte header field, or, longer, in a PAX record.
fn set_name(field: &mut [u8; 100], key: &str, value: &[u8], pax: &mut Vec<(String, Vec<u8>)>) {
    if value.len() <= field.len() {
        field[..value.len()].copy_from_slice(value);
    } else {
        let n = field.len();
        field.copy_from_slice(&value[..n]);
        pax.push((key.to_string(), value.to_vec()));
    }
}

/// A PAX extended header (`x`) with `records`, for the entry that follows.
fn append_pax(builder: &mut tar::Builder<Vec<u8>>, records: &[(String, Vec<u8>)]) {
    let mut data = Vec::new();
    for (key, value) in records {
        // "LEN KEY=VALUE\n", LEN counting itself.
        let rest = key.len() + value.len() + 3;
        let mut len = rest + 1;
        while len != rest + len.to_string().len() {
            len = rest + len.to_string().len();
        }
        data.extend_from_slice(format!("{len} {key}=").as_bytes());
        data.extend_from_slice(value);
        data.push(b'\n');
    }
    let mut header = tar::Header::new_ustar();
    let name = b"././@PaxHeader";
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.set_entry_type(tar::EntryType::XHeader);
    header.set_mode(0o644);
    header.set_size(data.len() as u64);
    header.set_cksum();
    builder.append(&header, &data[..]).unwrap();
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

pub fn zstd(bytes: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(bytes, 3).unwrap()
}

/// A layer of `entries` written into `store` as a blob compressed with
/// `compression`: (blob digest, diff id), for `unpack_layer`.
pub fn add_layer(
    store: &ImageStore,
    entries: &[Entry],
    compression: Compression,
) -> (String, String) {
    let tar = layer_tar(entries);
    let diff_id = of_bytes(&tar);
    let blob = match compression {
        Compression::None => tar,
        Compression::Gzip => gzip(&tar),
        Compression::Zstd => zstd(&tar),
    };
    let digest = of_bytes(&blob);
    store.write_blob(&digest, &blob[..]).unwrap();
    (digest, diff_id)
}

/// An image config (OCI JSON) for `layers` (their tars) and `config`.
pub fn config_json(os: &str, arch: &str, layer_tars: &[Vec<u8>], config: &ImageConfig) -> Vec<u8> {
    let diff_ids: Vec<String> = layer_tars.iter().map(|t| of_bytes(t)).collect();
    let mut section =
        json!({ "Env": config.env, "Entrypoint": config.entrypoint, "Cmd": config.cmd });
    if let Some(dir) = &config.working_dir {
        section["WorkingDir"] = json!(dir);
    }
    if let Some(user) = &config.user {
        section["User"] = json!(user);
    }
    serde_json::to_vec(&json!({
        "architecture": arch,
        "os": os,
        "config": section,
        "rootfs": { "type": "layers", "diff_ids": diff_ids },
    }))
    .unwrap()
}

/// Write an OCI layout of one image for this host's platform into `dir`
/// (made if missing), gzip layers; the manifest's digest. `index.json`
/// names it `latest` (`org.opencontainers.image.ref.name`), so both
/// `oci:DIR` and `oci:DIR:latest` find it.
pub fn write_oci_layout(dir: &Path, layers: &[Vec<Entry>], config: ImageConfig) -> String {
    let (os, arch) = host_platform();
    let manifest = write_image(dir, os, arch, layers, &config);
    write_index(
        dir,
        vec![with_ref(with_platform(manifest.clone(), os, arch))],
    );
    manifest["digest"].as_str().unwrap().to_string()
}

/// One image of a multi-platform layout.
#[derive(Debug, Clone)]
pub struct PlatformImage {
    pub os: String,
    pub architecture: String,
    pub layers: Vec<Vec<Entry>>,
    pub config: ImageConfig,
}

/// Write an OCI layout whose `index.json` names one image index (as
/// `skopeo copy --all` writes a multi-platform image) listing `images`;
/// their manifests' digests, in order.
pub fn write_multi_platform_layout(dir: &Path, images: &[PlatformImage]) -> Vec<String> {
    let mut manifests = Vec::new();
    for image in images {
        let m = write_image(
            dir,
            &image.os,
            &image.architecture,
            &image.layers,
            &image.config,
        );
        manifests.push(with_platform(m, &image.os, &image.architecture));
    }
    let digests = manifests
        .iter()
        .map(|m| m["digest"].as_str().unwrap().to_string())
        .collect();
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }))
    .unwrap();
    let desc = write_blob(dir, "application/vnd.oci.image.index.v1+json", &index);
    write_index(dir, vec![with_ref(desc)]);
    digests
}

/// Write a docker-archive (`docker save`'s classic format: `<hex>.json`,
/// `<n>/layer.tar` uncompressed, `manifest.json` with the tag
/// `test:latest`) of one image for this host to `file`. A layer equal to
/// an earlier one is a symlink to it, as `docker save` writes them.
pub fn write_docker_archive(file: &Path, layers: &[Vec<Entry>], config: ImageConfig) {
    let (os, arch) = host_platform();
    let tars: Vec<Vec<u8>> = layers.iter().map(|l| layer_tar(l)).collect();
    let config = config_json(os, arch, &tars, &config);
    let config_name = format!("{}.json", hex_of(&of_bytes(&config)).unwrap());
    let mut builder = tar::Builder::new(Vec::new());
    let mut names: Vec<String> = Vec::new();
    let mut seen: Vec<(Vec<u8>, String)> = Vec::new();
    for (i, tar) in tars.iter().enumerate() {
        let name = format!("{i}/layer.tar");
        match seen.iter().find(|(t, _)| t == tar) {
            Some((_, first)) => {
                let mut h = tar::Header::new_ustar();
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                h.set_mode(0o777);
                builder
                    .append_link(&mut h, &name, format!("../{first}"))
                    .unwrap();
            }
            None => {
                append_file(&mut builder, &name, tar);
                seen.push((tar.clone(), name.clone()));
            }
        }
        names.push(name);
    }
    append_file(&mut builder, &config_name, &config);
    let manifest = serde_json::to_vec(&json!([{
        "Config": config_name,
        "RepoTags": ["test:latest"],
        "Layers": names,
    }]))
    .unwrap();
    append_file(&mut builder, "manifest.json", &manifest);
    std::fs::write(file, builder.into_inner().unwrap()).unwrap();
}

/// Tar the layout in `dir` into `file`: an oci-archive.
pub fn write_oci_archive(dir: &Path, file: &Path) {
    let mut builder = tar::Builder::new(std::fs::File::create(file).unwrap());
    builder.append_dir_all(".", dir).unwrap();
    builder.into_inner().unwrap().flush().unwrap();
}

fn append_file(builder: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    builder.append_data(&mut h, name, data).unwrap();
}

/// The blobs of one image (gzip layers, config, manifest); the manifest's
/// descriptor.
fn write_image(
    dir: &Path,
    os: &str,
    arch: &str,
    layers: &[Vec<Entry>],
    config: &ImageConfig,
) -> serde_json::Value {
    let tars: Vec<Vec<u8>> = layers.iter().map(|l| layer_tar(l)).collect();
    let layer_descs: Vec<_> = tars
        .iter()
        .map(|t| write_blob(dir, media_types::LAYER_GZIP, &gzip(t)))
        .collect();
    let config = write_blob(
        dir,
        "application/vnd.oci.image.config.v1+json",
        &config_json(os, arch, &tars, config),
    );
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config,
        "layers": layer_descs,
    }))
    .unwrap();
    write_blob(dir, "application/vnd.oci.image.manifest.v1+json", &manifest)
}

/// `blobs/sha256/<hex>` in the layout; its descriptor.
fn write_blob(dir: &Path, media_type: &str, bytes: &[u8]) -> serde_json::Value {
    let digest = of_bytes(bytes);
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(blobs.join(hex_of(&digest).unwrap()), bytes).unwrap();
    json!({ "mediaType": media_type, "digest": digest, "size": bytes.len() })
}

fn with_platform(mut desc: serde_json::Value, os: &str, arch: &str) -> serde_json::Value {
    desc["platform"] = json!({ "architecture": arch, "os": os });
    desc
}

fn with_ref(mut desc: serde_json::Value) -> serde_json::Value {
    desc["annotations"] = json!({ "org.opencontainers.image.ref.name": "latest" });
    desc
}

fn write_index(dir: &Path, manifests: Vec<serde_json::Value>) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let index = json!({ "schemaVersion": 2, "manifests": manifests });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}
