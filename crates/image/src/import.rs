//! [`import`]: an image from a file or directory into the store.
//!
//! Three formats, told apart by what they hold:
//!
//! - an **OCI layout** directory (`oci-layout`, `index.json`, `blobs/`;
//!   `oci-layout` is required, as the spec says),
//!   as `skopeo copy ... oci:DIR` or `buildah push ... oci:DIR` write it;
//! - an **oci-archive**: the same layout in a tar;
//! - a **docker-archive**: what `docker save`, `podman save` and `skopeo
//!   copy ... docker-archive:FILE` write, a tar (or its unpacked
//!   directory) with `manifest.json` naming a config and layer files.
//!   Newer `docker save` writes an OCI layout and `manifest.json` side by
//!   side; the layout (`index.json`) is preferred because it has digests.
//!
//! An archive is read in place: one pass over its headers records where
//! each member's bytes are, and blobs are then read at those offsets
//! (symlinks between members, which docker-archives use for shared layers,
//! are followed inside the archive only).
//!
//! Every blob is checked against its digest on the way into the store,
//! layers against their diff ids as they are unpacked, and the image is
//! registered last: a failure anywhere leaves no image registered (and an
//! image of the same name as it was). Blobs and layers that were checked
//! stay, for the next attempt; [`crate::ImageStore::prune`] reclaims them.
//!
//! From an index with several manifests the one for this host's platform
//! ([`crate::host_platform`]) is chosen; nested indexes (a multi-platform
//! image inside a layout) are followed. A docker-archive has no manifest
//! of its own: the import writes an OCI manifest for it (the image's
//! `digest`), so every image in the store is a manifest, a config and
//! layers.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use oci_spec::image::{
    Descriptor, DescriptorBuilder, ImageIndex, ImageManifest, ImageManifestBuilder, MediaType,
    SCHEMA_VERSION,
};
use serde::Deserialize;

use crate::config::{host_platform, now_millis, parse_config, ParsedConfig};
use crate::store::{check_name, Compression};
use crate::{digest, ImageError, ImageRecord, ImageStore};

/// The largest JSON document (index, manifest, config) an import reads.
const MAX_JSON: u64 = 16 << 20;
/// How deep indexes may nest (an index of indexes of ...).
const MAX_INDEX_DEPTH: usize = 4;
/// Symlinks followed to reach one member of an archive.
const MAX_LINKS: usize = 16;

const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Import the image at `path` (an OCI layout directory, an oci-archive or
/// a docker-archive; see the module docs) into `store` as `name`,
/// replacing an image of that name.
pub fn import(store: &ImageStore, path: &Path, name: &str) -> Result<ImageRecord, ImageError> {
    check_name(name)?;
    let _lease = store.write_lease()?;
    let src = Source::open(path)?;
    let record = if src.exists("index.json") && src.exists("oci-layout") {
        import_oci(store, &src, name)?
    } else if src.exists("manifest.json") {
        import_docker(store, &src, name)?
    } else if src.exists("index.json") {
        // The spec requires the file, and a layout cut short (a truncated
        // archive) can lose it: import nothing rather than guess.
        return Err(src
            .bad("has index.json but no oci-layout file, so it is not a whole OCI layout".into()));
    } else {
        return Err(ImageError::NotAnImage {
            path: path.to_path_buf(),
        });
    };
    store.register(&record)?;
    Ok(record)
}

/// A manifest an index offers, with the platform it says it is for.
struct Candidate {
    desc: Descriptor,
    platform: Option<String>,
    ref_name: Option<String>,
}

fn import_oci(store: &ImageStore, src: &Source, name: &str) -> Result<ImageRecord, ImageError> {
    let layout: serde_json::Value = parse_json(
        &src.read_small("oci-layout")?,
        format!("oci-layout of {}", src.path.display()),
    )?;
    let version = layout["imageLayoutVersion"].as_str().unwrap_or("");
    if !version.starts_with("1.") {
        return Err(src.bad(format!(
            "oci-layout has imageLayoutVersion {version:?}; brig reads version 1 layouts"
        )));
    }
    let index: ImageIndex = parse_json(
        &src.read_small("index.json")?,
        format!("index.json of {}", src.path.display()),
    )?;
    let mut candidates = Vec::new();
    collect(src, &index, 0, None, &mut candidates)?;
    if candidates.is_empty() {
        return Err(src.bad("index.json lists no image manifest".into()));
    }

    // Platforms the descriptors do not give come from the configs.
    for c in &mut candidates {
        if c.platform.is_none() {
            let (_, _, parsed) = load_manifest(src, &c.desc)?;
            c.platform = Some(format!("{}/{}", parsed.os, parsed.architecture));
        }
    }
    let (os, arch) = host_platform();
    let wanted = format!("{os}/{arch}");
    let matching: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| c.platform.as_deref() == Some(wanted.as_str()))
        .collect();
    let chosen = choose(src, name, &matching).ok_or_else(|| {
        let mut found: Vec<&str> = candidates
            .iter()
            .filter_map(|c| c.platform.as_deref())
            .collect();
        found.sort_unstable();
        found.dedup();
        ImageError::NoPlatform {
            path: src.path.clone(),
            wanted: wanted.clone(),
            found: found.join(", "),
        }
    })??;

    let (manifest_bytes, manifest, parsed) = load_manifest(src, &chosen.desc)?;
    check_platform(src, &parsed)?;
    let layers = manifest.layers();
    if layers.len() != parsed.diff_ids.len() {
        return Err(src.bad(format!(
            "manifest {} has {} layers but its config lists {} diff ids",
            chosen.desc.digest(),
            layers.len(),
            parsed.diff_ids.len()
        )));
    }
    for layer in layers {
        Compression::of_media_type(layer.media_type().as_ref())?;
    }
    store.write_blob(chosen.desc.digest().as_ref(), &manifest_bytes[..])?;
    let config = manifest.config();
    store.write_blob(config.digest().as_ref(), &src.read_blob(config)?[..])?;
    let mut size: u64 = 0;
    for (layer, diff_id) in layers.iter().zip(&parsed.diff_ids) {
        let digest = layer.digest().to_string();
        if !store.has_blob(&digest) {
            let reader = src.reader(&blob_member(&digest)?)?;
            store.write_blob_sized(&digest, Some(layer.size()), reader)?;
        }
        store.unpack_layer(&digest, layer.media_type().as_ref(), diff_id)?;
        size = size.saturating_add(layer.size());
    }
    Ok(ImageRecord {
        base: None,
        name: name.to_string(),
        source: format!("{}:{}", src.transport(), src.path.display()),
        digest: chosen.desc.digest().to_string(),
        config: parsed.config,
        layers: parsed.diff_ids,
        size,
        created_at: now_millis(),
    })
}

/// The image manifests under `index`, following nested indexes.
fn collect(
    src: &Source,
    index: &ImageIndex,
    depth: usize,
    ref_name: Option<&str>,
    out: &mut Vec<Candidate>,
) -> Result<(), ImageError> {
    for desc in index.manifests() {
        let ref_name = desc
            .annotations()
            .as_ref()
            .and_then(|a| a.get(REF_NAME))
            .map(String::as_str)
            .or(ref_name);
        let platform = desc
            .platform()
            .as_ref()
            .map(|p| format!("{}/{}", p.os(), p.architecture()));
        match desc.media_type() {
            MediaType::ImageIndex => {}
            MediaType::Other(t) if t == DOCKER_MANIFEST_LIST => {}
            MediaType::ImageManifest => {
                out.push(Candidate {
                    desc: desc.clone(),
                    platform,
                    ref_name: ref_name.map(str::to_string),
                });
                continue;
            }
            MediaType::Other(t) if t == DOCKER_MANIFEST => {
                out.push(Candidate {
                    desc: desc.clone(),
                    platform,
                    ref_name: ref_name.map(str::to_string),
                });
                continue;
            }
            // Artifacts, signatures: not images.
            _ => continue,
        }
        if depth + 1 >= MAX_INDEX_DEPTH {
            return Err(src.bad(format!(
                "indexes nest more than {MAX_INDEX_DEPTH} deep at {}",
                desc.digest()
            )));
        }
        let nested: ImageIndex = parse_json(
            &src.read_blob(desc)?,
            format!("index {} of {}", desc.digest(), src.path.display()),
        )?;
        collect(src, &nested, depth + 1, ref_name, out)?;
    }
    Ok(())
}

/// One of the host's manifests: the only one, or the one whose ref name is
/// the image's name (or its tag) when the layout holds several images.
/// None if there is none for the host.
fn choose<'a>(
    src: &Source,
    name: &str,
    matching: &[&'a Candidate],
) -> Option<Result<&'a Candidate, ImageError>> {
    let first = *matching.first()?;
    let mut refs: Vec<&str> = matching
        .iter()
        .filter_map(|c| c.ref_name.as_deref())
        .collect();
    refs.sort_unstable();
    refs.dedup();
    if refs.len() <= 1 {
        return Some(Ok(first));
    }
    let tag = name
        .rsplit_once(':')
        .map(|(_, t)| t)
        .filter(|t| !t.contains('/'));
    let by_ref = matching.iter().find(|c| {
        c.ref_name
            .as_deref()
            .is_some_and(|r| r == name || Some(r) == tag)
    });
    Some(by_ref.copied().ok_or_else(|| {
        src.bad(format!(
            "holds several images for this platform ({}); import it under one of these names, or as NAME:REF",
            refs.join(", ")
        ))
    }))
}

/// A manifest's bytes, the manifest, and its config (read, not stored).
fn load_manifest(
    src: &Source,
    desc: &Descriptor,
) -> Result<(Vec<u8>, ImageManifest, ParsedConfig), ImageError> {
    let bytes = src.read_blob(desc)?;
    let manifest: ImageManifest = parse_json(
        &bytes,
        format!("manifest {} of {}", desc.digest(), src.path.display()),
    )?;
    let parsed = parse_config(&src.read_blob(manifest.config())?)?;
    Ok((bytes, manifest, parsed))
}

fn check_platform(src: &Source, parsed: &ParsedConfig) -> Result<(), ImageError> {
    let (os, arch) = host_platform();
    if parsed.os == os && parsed.architecture == arch {
        return Ok(());
    }
    Err(ImageError::NoPlatform {
        path: src.path.clone(),
        wanted: format!("{os}/{arch}"),
        found: format!("{}/{}", parsed.os, parsed.architecture),
    })
}

/// One image of a docker-archive's `manifest.json`.
#[derive(Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

fn import_docker(store: &ImageStore, src: &Source, name: &str) -> Result<ImageRecord, ImageError> {
    let entries: Vec<DockerEntry> = parse_json(
        &src.read_small("manifest.json")?,
        format!("manifest.json of {}", src.path.display()),
    )?;
    let entry = match entries.as_slice() {
        [] => return Err(src.bad("manifest.json lists no image".into())),
        [only] => only,
        several => {
            let latest = format!("{name}:latest");
            let tagged = |e: &&DockerEntry| {
                e.repo_tags
                    .iter()
                    .flatten()
                    .any(|t| *t == name || *t == latest)
            };
            match several.iter().find(tagged) {
                Some(e) => e,
                None => {
                    let tags: Vec<&str> = several
                        .iter()
                        .flat_map(|e| e.repo_tags.iter().flatten())
                        .map(String::as_str)
                        .collect();
                    return Err(src.bad(format!(
                        "holds {} images (tags: {}); import it under one of those tags",
                        several.len(),
                        if tags.is_empty() {
                            "none".to_string()
                        } else {
                            tags.join(", ")
                        }
                    )));
                }
            }
        }
    };

    let config_bytes = src.read_small(&entry.config)?;
    let config_digest = digest::of_bytes(&config_bytes);
    // `<hex>.json` (classic docker save) or `blobs/sha256/<hex>` (newer):
    // the name is the digest, and must be right.
    let named = Path::new(&entry.config)
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| format!("sha256:{}", n.trim_end_matches(".json")))
        .filter(|d| digest::hex_of(d).is_some());
    if let Some(named) = named {
        if named != config_digest {
            return Err(ImageError::DigestMismatch {
                expected: named,
                got: config_digest,
            });
        }
    }
    let parsed = parse_config(&config_bytes)?;
    check_platform(src, &parsed)?;
    if entry.layers.len() != parsed.diff_ids.len() {
        return Err(src.bad(format!(
            "manifest.json names {} layers but the config lists {} diff ids",
            entry.layers.len(),
            parsed.diff_ids.len()
        )));
    }
    store.write_blob(&config_digest, &config_bytes[..])?;

    let mut descriptors = Vec::new();
    let mut size: u64 = 0;
    for (member, diff_id) in entry.layers.iter().zip(&parsed.diff_ids) {
        let mut magic = [0u8; 4];
        let got = read_up_to(&mut src.reader(member)?, &mut magic).map_err(|source| {
            ImageError::Read {
                what: format!("{member} in {}", src.path.display()),
                source,
            }
        })?;
        let compression = Compression::sniff(&magic[..got]);
        // The digest, where the archive gives one: a `blobs/sha256/<hex>`
        // member's name, or an uncompressed layer's diff id.
        let known = blob_digest_of_member(member)
            .or_else(|| (compression == Compression::None).then(|| diff_id.clone()));
        let (digest, n) = match known {
            Some(d) => {
                let n = store.write_blob(&d, src.reader(member)?)?;
                (d, n)
            }
            None => store.write_blob_unknown(
                src.reader(member)?,
                &format!("{member} in {}", src.path.display()),
            )?,
        };
        let media_type = compression.oci_media_type();
        store.unpack_layer(&digest, media_type, diff_id)?;
        descriptors.push(descriptor(media_type, &digest, n)?);
        size = size.saturating_add(n);
    }

    let manifest = ImageManifestBuilder::default()
        .schema_version(SCHEMA_VERSION)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(
            "application/vnd.oci.image.config.v1+json",
            &config_digest,
            config_bytes.len() as u64,
        )?)
        .layers(descriptors)
        .build()
        .map_err(|e| src.bad(format!("cannot describe it as an OCI manifest: {e}")))?;
    let manifest_bytes = serde_json::to_vec(&manifest).map_err(|source| ImageError::Json {
        what: "the manifest made for a docker-archive".into(),
        source,
    })?;
    let manifest_digest = digest::of_bytes(&manifest_bytes);
    store.write_blob(&manifest_digest, &manifest_bytes[..])?;
    Ok(ImageRecord {
        base: None,
        name: name.to_string(),
        source: format!("docker-archive:{}", src.path.display()),
        digest: manifest_digest,
        config: parsed.config,
        layers: parsed.diff_ids,
        size,
        created_at: now_millis(),
    })
}

fn descriptor(media_type: &str, digest: &str, size: u64) -> Result<Descriptor, ImageError> {
    let invalid = || ImageError::InvalidDigest {
        digest: digest.to_string(),
    };
    let parsed: oci_spec::image::Digest = digest.parse().map_err(|_| invalid())?;
    DescriptorBuilder::default()
        .media_type(MediaType::from(media_type))
        .digest(parsed)
        .size(size)
        .build()
        .map_err(|_| invalid())
}

/// `blobs/sha256/<hex>` for `digest`, which must be sha256.
fn blob_member(digest: &str) -> Result<String, ImageError> {
    Ok(format!("blobs/sha256/{}", digest::check(digest)?))
}

/// The digest a member named `blobs/sha256/<hex>` must have.
fn blob_digest_of_member(member: &str) -> Option<String> {
    let hex = normalize(member)?
        .strip_prefix("blobs/sha256/")?
        .to_string();
    let d = format!("sha256:{hex}");
    digest::hex_of(&d).is_some().then_some(d)
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: String) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|source| ImageError::Json { what, source })
}

/// Fill as much of `buf` as the reader has.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A path inside a layout, made plain: no `.`, no empty parts, `..`
/// resolved. None if it is absolute or leaves the layout.
fn normalize(path: &str) -> Option<String> {
    if path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

/// Where an import reads from: a directory, or a tar read in place.
struct Source {
    path: PathBuf,
    kind: SourceKind,
}

enum SourceKind {
    Dir,
    Tar {
        file: File,
        members: HashMap<String, Member>,
    },
}

enum Member {
    /// A regular file's bytes: offset and length in the archive.
    File { offset: u64, size: u64 },
    /// A symlink or hard link to another member (already normalized).
    Link(String),
}

impl Source {
    fn open(path: &Path) -> Result<Source, ImageError> {
        let meta = std::fs::metadata(path).map_err(ImageError::io("read", path))?;
        if meta.is_dir() {
            return Ok(Source {
                path: path.to_path_buf(),
                kind: SourceKind::Dir,
            });
        }
        let file = File::open(path).map_err(ImageError::io("open", path))?;
        let mut magic = [0u8; 6];
        let got = file
            .read_at(&mut magic, 0)
            .map_err(ImageError::io("read", path))?;
        let compression = match Compression::sniff(&magic[..got]) {
            Compression::Gzip => Some("gzip"),
            Compression::Zstd => Some("zstd"),
            Compression::None if magic[..got].starts_with(b"BZh") => Some("bzip2"),
            Compression::None if magic[..got].starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) => {
                Some("xz")
            }
            Compression::None => None,
        };
        if let Some(compression) = compression {
            return Err(ImageError::CompressedArchive {
                path: path.to_path_buf(),
                compression,
            });
        }
        let members = index_tar(&file).map_err(|e| ImageError::BadLayout {
            path: path.to_path_buf(),
            reason: format!("not a tar archive, or a truncated one: {e}"),
        })?;
        Ok(Source {
            path: path.to_path_buf(),
            kind: SourceKind::Tar { file, members },
        })
    }

    /// `oci` or `oci-archive` (skopeo's names), for an OCI record's source.
    fn transport(&self) -> &'static str {
        match self.kind {
            SourceKind::Dir => "oci",
            SourceKind::Tar { .. } => "oci-archive",
        }
    }

    fn exists(&self, member: &str) -> bool {
        match &self.kind {
            SourceKind::Dir => self.path.join(member).is_file(),
            SourceKind::Tar { members, .. } => members.contains_key(member),
        }
    }

    fn bad(&self, reason: String) -> ImageError {
        ImageError::BadLayout {
            path: self.path.clone(),
            reason,
        }
    }

    /// The bytes of `member`.
    fn reader(&self, member: &str) -> Result<Box<dyn Read + '_>, ImageError> {
        let plain = normalize(member)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| self.bad(format!("{member:?} is not a path inside it")))?;
        let missing = || self.bad(format!("{member} is missing"));
        match &self.kind {
            SourceKind::Dir => {
                let path = self.path.join(&plain);
                match File::open(&path) {
                    Ok(f) => Ok(Box::new(f)),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Err(missing()),
                    Err(e) => Err(ImageError::io("open", &path)(e)),
                }
            }
            SourceKind::Tar { file, members } => {
                let mut at = plain;
                for _ in 0..MAX_LINKS {
                    match members.get(&at) {
                        Some(Member::File { offset, size }) => {
                            return Ok(Box::new(Section {
                                file,
                                pos: *offset,
                                end: offset.saturating_add(*size),
                            }))
                        }
                        Some(Member::Link(target)) => at = target.clone(),
                        None => return Err(missing()),
                    }
                }
                Err(self.bad(format!(
                    "{member} is a chain of more than {MAX_LINKS} links"
                )))
            }
        }
    }

    /// A small document, whole (at most [`MAX_JSON`] bytes).
    fn read_small(&self, member: &str) -> Result<Vec<u8>, ImageError> {
        let mut out = Vec::new();
        self.reader(member)?
            .take(MAX_JSON + 1)
            .read_to_end(&mut out)
            .map_err(|source| ImageError::Read {
                what: format!("{member} in {}", self.path.display()),
                source,
            })?;
        if out.len() as u64 > MAX_JSON {
            return Err(self.bad(format!("{member} is larger than {MAX_JSON} bytes")));
        }
        Ok(out)
    }

    /// A JSON blob a descriptor names, checked against its digest and size.
    fn read_blob(&self, desc: &Descriptor) -> Result<Vec<u8>, ImageError> {
        let digest = desc.digest().to_string();
        if desc.size() > MAX_JSON {
            return Err(self.bad(format!("{digest} is larger than {MAX_JSON} bytes")));
        }
        let bytes = self.read_small(&blob_member(&digest)?)?;
        if bytes.len() as u64 != desc.size() {
            return Err(ImageError::SizeMismatch {
                digest,
                expected: desc.size(),
                got: bytes.len() as u64,
            });
        }
        let got = digest::of_bytes(&bytes);
        if got != digest {
            return Err(ImageError::DigestMismatch {
                expected: digest,
                got,
            });
        }
        Ok(bytes)
    }
}

/// Where each member of the tar `file` is.
fn index_tar(file: &File) -> io::Result<HashMap<String, Member>> {
    let mut members = HashMap::new();
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries_with_seek()? {
        let entry = entry?;
        let Ok(raw) = std::str::from_utf8(&entry.path_bytes()).map(str::to_string) else {
            continue;
        };
        let Some(path) = normalize(&raw) else {
            continue;
        };
        let link = |target: &str, relative: bool| {
            let base = match (relative, path.rsplit_once('/')) {
                (true, Some((dir, _))) => format!("{dir}/{target}"),
                _ => target.to_string(),
            };
            normalize(&base)
        };
        let target = entry
            .link_name_bytes()
            .and_then(|t| std::str::from_utf8(&t).ok().map(str::to_string));
        let member = match entry.header().entry_type() {
            tar::EntryType::Regular | tar::EntryType::Continuous => Member::File {
                offset: entry.raw_file_position(),
                size: entry.size(),
            },
            // Symlinks are relative to their directory, hard links name a
            // member; either may not leave the archive.
            tar::EntryType::Symlink => match target.and_then(|t| link(&t, true)) {
                Some(t) => Member::Link(t),
                None => continue,
            },
            tar::EntryType::Link => match target.and_then(|t| link(&t, false)) {
                Some(t) => Member::Link(t),
                None => continue,
            },
            _ => continue,
        };
        members.insert(path, member);
    }
    Ok(members)
}

/// A member's bytes, read at their offset (so several can be open at once
/// over one file).
struct Section<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for Section<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end - self.pos;
        if left == 0 {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the archive ends inside this member",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_paths_stay_inside() {
        assert_eq!(
            normalize("./blobs//sha256/./ab").as_deref(),
            Some("blobs/sha256/ab")
        );
        assert_eq!(normalize("a/../b").as_deref(), Some("b"));
        assert_eq!(normalize("../b"), None);
        assert_eq!(normalize("/etc/passwd"), None);
    }

    #[test]
    fn blob_members_name_their_digest() {
        let d = digest::of_bytes(b"x");
        let hex = digest::hex_of(&d).unwrap();
        assert_eq!(
            blob_digest_of_member(&format!("./blobs/sha256/{hex}")),
            Some(d)
        );
        assert_eq!(blob_digest_of_member("abc/layer.tar"), None);
        assert_eq!(blob_digest_of_member("blobs/sha256/zz"), None);
    }
}
