//! Layers made on this host from a directory tree (an image build's step,
//! a sandbox's writable layer for a snapshot): the tree as an OCI layer
//! tar — overlayfs's whiteouts and opaque directories turned into OCI's —
//! stored as a blob and unpacked like a pulled layer; and the image
//! records (config and manifest blobs) for images made here.

use std::collections::HashMap;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rustix::fs as rfs;

use sha2::{Digest as _, Sha256};

use crate::store::media_types;
use crate::{ImageConfig, ImageError, ImageRecord, ImageStore};

/// Who the entries of a layer made from a tree belong to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// As the files are owned on the host (a tree written through an
    /// idmapped mount holds the image's own ids).
    AsStored,
    /// Every entry owned by this uid and gid (a COPY's `--chown`).
    All(u32, u32),
    /// The host's ids minus a sandbox's bases (a sandbox's writable layer,
    /// written through its user namespace); an id outside its `count`
    /// becomes nobody (65534).
    Shifted {
        uid_base: u32,
        gid_base: u32,
        count: u32,
    },
}

impl Owners {
    fn of(self, uid: u32, gid: u32) -> (u32, u32) {
        match self {
            Owners::AsStored => (uid, gid),
            Owners::All(u, g) => (u, g),
            Owners::Shifted {
                uid_base,
                gid_base,
                count,
            } => {
                let shift = |id: u32, base: u32| {
                    id.checked_sub(base).filter(|i| *i < count).unwrap_or(65534)
                };
                (shift(uid, uid_base), shift(gid, gid_base))
            }
        }
    }
}

/// Write the tree at `dir` to `out` as an OCI layer tar.
pub fn write_tar(dir: &Path, owners: Owners, out: impl Write) -> std::io::Result<()> {
    let root = rfs::open(
        dir,
        rfs::OFlags::RDONLY | rfs::OFlags::DIRECTORY | rfs::OFlags::CLOEXEC,
        rfs::Mode::empty(),
    )?;
    write_tar_at(root.as_fd(), owners, &[], out)
}

/// [`write_tar`] of the directory open as `dir` (a sandbox's writable
/// layer, reached by descriptor), leaving out the entries at the relative
/// paths in `skip` (and whatever is below them).
pub fn write_tar_at(
    dir: BorrowedFd<'_>,
    owners: Owners,
    skip: &[PathBuf],
    out: impl Write,
) -> std::io::Result<()> {
    let mut tar = tar::Builder::new(out);
    tar.follow_symlinks(false);
    let mut walk = Walk {
        owners,
        existing: &[],
        skip,
        links: HashMap::new(),
    };
    add_tree(&mut tar, dir, Path::new(""), &mut walk)?;
    tar.finish()
}

impl ImageStore {
    /// The tree at `dir` as a layer of this store: a tar blob, unpacked.
    /// Returns its diff id.
    pub fn add_layer_from_dir(&self, dir: &Path, owners: Owners) -> Result<String, ImageError> {
        self.add_layer_from_dir_over(dir, owners, &[])
    }

    /// [`add_layer_from_dir`](Self::add_layer_from_dir) of a layer going
    /// over `existing` (the image's layer directories, top first): a
    /// directory they already have keeps its owner and mode from there,
    /// as with docker (a COPY into `/home/user/` must not hand
    /// `/home/user` to root).
    pub fn add_layer_from_dir_over(
        &self,
        dir: &Path,
        owners: Owners,
        existing: &[PathBuf],
    ) -> Result<String, ImageError> {
        let mut tmp = tempfile::NamedTempFile::new_in(self.root())
            .map_err(ImageError::io("make a layer file", self.root()))?;
        let root = rfs::open(
            dir,
            rfs::OFlags::RDONLY | rfs::OFlags::DIRECTORY | rfs::OFlags::CLOEXEC,
            rfs::Mode::empty(),
        )
        .map_err(|e| ImageError::io("open", dir)(e.into()))?;
        let mut tar = tar::Builder::new(&mut tmp);
        tar.follow_symlinks(false);
        let mut walk = Walk {
            owners,
            existing,
            skip: &[],
            links: HashMap::new(),
        };
        add_tree(&mut tar, root.as_fd(), Path::new(""), &mut walk)
            .and_then(|_| tar.finish())
            .map_err(ImageError::io("write a layer", dir))?;
        drop(tar);
        tmp.flush().map_err(ImageError::io("write a layer", dir))?;
        self.add_layer_tar(tmp)
    }

    /// The first half of [`add_layer_from_dir`](Self::add_layer_from_dir):
    /// the tar written to a temporary file in the store (what must happen
    /// while the tree cannot change).
    pub fn layer_tar_from_dir(
        &self,
        dir: &Path,
        owners: Owners,
    ) -> Result<tempfile::NamedTempFile, ImageError> {
        let mut tmp = tempfile::NamedTempFile::new_in(self.root())
            .map_err(ImageError::io("make a layer file", self.root()))?;
        write_tar(dir, owners, &mut tmp).map_err(ImageError::io("write a layer", dir))?;
        tmp.flush().map_err(ImageError::io("write a layer", dir))?;
        Ok(tmp)
    }

    /// [`layer_tar_from_dir`](Self::layer_tar_from_dir) of a directory
    /// open as `dir`, without the relative paths in `skip` (a tier's own
    /// files in a sandbox's writable layer).
    pub fn layer_tar_from_fd(
        &self,
        dir: BorrowedFd<'_>,
        owners: Owners,
        skip: &[PathBuf],
    ) -> Result<tempfile::NamedTempFile, ImageError> {
        let mut tmp = tempfile::NamedTempFile::new_in(self.root())
            .map_err(ImageError::io("make a layer file", self.root()))?;
        let what = Path::new("(a sandbox's writable layer)");
        write_tar_at(dir, owners, skip, &mut tmp).map_err(ImageError::io("write a layer", what))?;
        tmp.flush().map_err(ImageError::io("write a layer", what))?;
        Ok(tmp)
    }

    /// The second half: the tar's digest, the tar itself made the blob
    /// (synced, then renamed: no copy) and its unpacked layer.
    pub fn add_layer_tar(&self, tmp: tempfile::NamedTempFile) -> Result<String, ImageError> {
        let mut file = tmp
            .reopen()
            .map_err(ImageError::io("read a layer", tmp.path()))?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = file
                .read(&mut buf)
                .map_err(ImageError::io("read a layer", tmp.path()))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        let digest = format!("sha256:{}", hex::encode(h.finalize()));
        let path = self.blob_path(&digest);
        if !path.exists() {
            tmp.as_file()
                .sync_all()
                .map_err(ImageError::io("sync", tmp.path()))?;
            let _lock = self.write_lease()?;
            fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o644))
                .map_err(ImageError::io("set the mode of", tmp.path()))?;
            tmp.persist(&path)
                .map_err(|e| ImageError::io("rename a blob into", &path)(e.error))?;
        }
        self.unpack_layer(&digest, media_types::LAYER_TAR, &digest)?;
        Ok(digest)
    }

    /// Register an image made on this host from `layers` (bottom first,
    /// each in the store) over `base` (a directory below them all, e.g. a
    /// named template's build; `None` for none), with `config`: its OCI
    /// config and manifest are written as blobs, as a pulled image has.
    pub fn register_local(
        &self,
        name: &str,
        source: &str,
        layers: Vec<String>,
        config: ImageConfig,
        base: Option<PathBuf>,
    ) -> Result<ImageRecord, ImageError> {
        let (os, arch) = crate::host_platform();
        let config_json = serde_json::json!({
            "architecture": arch,
            "os": os,
            "config": {
                "Env": config.env,
                "WorkingDir": config.working_dir.clone().unwrap_or_default(),
                "User": config.user.clone().unwrap_or_default(),
                "Entrypoint": (!config.entrypoint.is_empty()).then(|| config.entrypoint.clone()),
                "Cmd": (!config.cmd.is_empty()).then(|| config.cmd.clone()),
            },
            "rootfs": {"type": "layers", "diff_ids": layers},
        })
        .to_string();
        let config_digest = format!(
            "sha256:{}",
            hex::encode(Sha256::digest(config_json.as_bytes()))
        );
        self.write_blob(&config_digest, config_json.as_bytes())?;
        let size_of = |d: &str| fs::metadata(self.blob_path(d)).map_or(0, |m| m.len());
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config_json.len(),
            },
            "layers": layers.iter().map(|d| serde_json::json!({
                "mediaType": media_types::LAYER_TAR, "digest": d, "size": size_of(d),
            })).collect::<Vec<_>>(),
        })
        .to_string();
        let digest = format!(
            "sha256:{}",
            hex::encode(Sha256::digest(manifest.as_bytes()))
        );
        self.write_blob(&digest, manifest.as_bytes())?;
        let record = ImageRecord {
            name: name.to_string(),
            source: source.to_string(),
            digest,
            size: layers.iter().map(|d| size_of(d)).sum(),
            config,
            layers,
            base,
            created_at: crate::now_millis(),
        };
        self.register(&record)?;
        Ok(record)
    }
}

/// What [`add_tree`] carries down the tree.
struct Walk<'a> {
    owners: Owners,
    /// The layers below, top first (a directory they have keeps its
    /// owner and mode).
    existing: &'a [PathBuf],
    /// Relative paths left out, with everything below them.
    skip: &'a [PathBuf],
    /// Hard links met: (device, inode) to the first path.
    links: HashMap<(u64, u64), PathBuf>,
}

/// The entries of the directory `dir_fd` (at `rel` in the layer) into
/// `tar`: overlayfs's 0/0 whiteouts as `.wh.NAME`, opaque directories
/// with `.wh..wh..opq`, hard links once; owned as `owners` says.
///
/// Every step is relative to an open directory and never follows a
/// symlink (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`), and files are opened
/// without blocking and read only if they are regular files: the tree may
/// be a sandbox's (its writable layer), and nothing put in it may lead the
/// host's read outside it or hold it up.
fn add_tree<W: Write>(
    tar: &mut tar::Builder<W>,
    dir_fd: BorrowedFd<'_>,
    rel: &Path,
    walk: &mut Walk<'_>,
) -> std::io::Result<()> {
    let (owners, existing) = (walk.owners, walk.existing);
    let mut names: Vec<std::ffi::CString> = Vec::new();
    for entry in rfs::Dir::read_from(dir_fd)? {
        let entry = entry?;
        let name = entry.file_name();
        if name != c"." && name != c".." {
            names.push(name.to_owned());
        }
    }
    names.sort();
    for name in names {
        let os_name = std::ffi::OsStr::from_bytes(name.as_bytes());
        let path = rel.join(os_name);
        if walk.skip.contains(&path) {
            continue;
        }
        let st = rfs::statat(dir_fd, name.as_c_str(), rfs::AtFlags::SYMLINK_NOFOLLOW)?;
        let kind = rfs::FileType::from_raw_mode(st.st_mode);
        let mut header = tar::Header::new_gnu();
        header.set_mode(st.st_mode & 0o7777);
        let (uid, gid) = owners.of(st.st_uid, st.st_gid);
        header.set_uid(uid.into());
        header.set_gid(gid.into());
        header.set_mtime(st.st_mtime.max(0) as u64);
        header.set_size(0);
        match kind {
            rfs::FileType::CharacterDevice if st.st_rdev == 0 => {
                // Deleted in this layer.
                let wh = rel.join(format!(
                    "{}{}",
                    crate::WHITEOUT_PREFIX,
                    os_name.to_string_lossy()
                ));
                tar.append_data(&mut marker(), wh, std::io::empty())?;
            }
            rfs::FileType::Directory => {
                header.set_entry_type(tar::EntryType::Directory);
                // The image below has it: its owner and mode stay.
                let below = existing
                    .iter()
                    .find_map(|l| l.join(&path).symlink_metadata().ok())
                    .filter(|m| m.is_dir());
                if let Some(m) = below {
                    use std::os::unix::fs::MetadataExt;
                    header.set_mode(m.mode() & 0o7777);
                    header.set_uid(m.uid().into());
                    header.set_gid(m.gid().into());
                }
                tar.append_data(&mut header, &path, std::io::empty())?;
                let sub = rfs::openat(
                    dir_fd,
                    name.as_c_str(),
                    rfs::OFlags::RDONLY
                        | rfs::OFlags::DIRECTORY
                        | rfs::OFlags::NOFOLLOW
                        | rfs::OFlags::CLOEXEC,
                    rfs::Mode::empty(),
                )?;
                let mut buf = [0u8; 4];
                let opaque = rfs::fgetxattr(&sub, crate::OPAQUE_XATTR, &mut buf)
                    .is_ok_and(|n| &buf[..n] == b"y");
                if opaque {
                    tar.append_data(
                        &mut marker(),
                        path.join(crate::OPAQUE_MARKER),
                        std::io::empty(),
                    )?;
                }
                add_tree(tar, sub.as_fd(), &path, walk)?;
            }
            rfs::FileType::Symlink => {
                header.set_entry_type(tar::EntryType::Symlink);
                let target = rfs::readlinkat(dir_fd, name.as_c_str(), Vec::new())?;
                let target = std::ffi::OsStr::from_bytes(target.as_bytes());
                tar.append_link(&mut header, &path, target)?;
            }
            rfs::FileType::RegularFile => {
                let key = (st.st_dev, st.st_ino);
                if st.st_nlink > 1 {
                    if let Some(first) = walk.links.get(&key) {
                        header.set_entry_type(tar::EntryType::Link);
                        tar.append_link(&mut header, &path, first)?;
                        continue;
                    }
                    walk.links.insert(key, path.clone());
                }
                let file = rfs::openat(
                    dir_fd,
                    name.as_c_str(),
                    rfs::OFlags::RDONLY
                        | rfs::OFlags::NOFOLLOW
                        | rfs::OFlags::NONBLOCK
                        | rfs::OFlags::CLOEXEC,
                    rfs::Mode::empty(),
                )?;
                let opened = rfs::fstat(&file)?;
                if rfs::FileType::from_raw_mode(opened.st_mode) != rfs::FileType::RegularFile
                    || (opened.st_dev, opened.st_ino) != key
                {
                    return Err(std::io::Error::other(format!(
                        "{}: changed while it was read",
                        path.display()
                    )));
                }
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(opened.st_size.max(0) as u64);
                let file = fs::File::from(file);
                tar.append_data(&mut header, &path, file.take(opened.st_size.max(0) as u64))?;
            }
            rfs::FileType::Fifo | rfs::FileType::CharacterDevice | rfs::FileType::BlockDevice => {
                header.set_entry_type(match kind {
                    rfs::FileType::Fifo => tar::EntryType::Fifo,
                    rfs::FileType::CharacterDevice => tar::EntryType::Char,
                    _ => tar::EntryType::Block,
                });
                header.set_device_major(rfs::major(st.st_rdev))?;
                header.set_device_minor(rfs::minor(st.st_rdev))?;
                tar.append_data(&mut header, &path, std::io::empty())?;
            }
            // Sockets and the like: not file content.
            _ => {}
        }
    }
    Ok(())
}

/// An empty regular file's header, root's: a whiteout or opaque marker.
fn marker() -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(0);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// A tier's own paths are left out with everything below them; a
    /// sibling whose name merely starts the same is kept.
    #[test]
    fn skipped_paths_are_left_out_of_a_layer() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["run/brig-agent/sub", "run/other", "etc"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        for f in [
            "run/brig-agent/sub/f",
            "run/brig-agent-not",
            "run/other/f",
            "etc/ld.so.preload",
            "etc/keep",
        ] {
            std::fs::write(dir.path().join(f), "x").unwrap();
        }
        let root = std::fs::File::open(dir.path()).unwrap();
        let mut out = Vec::new();
        let skip = [
            PathBuf::from("run/brig-agent"),
            PathBuf::from("etc/ld.so.preload"),
        ];
        write_tar_at(root.as_fd(), Owners::AsStored, &skip, &mut out).unwrap();
        let mut names: Vec<String> = entries(&out).into_iter().map(|e| e.0).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "etc",
                "etc/keep",
                "run",
                "run/brig-agent-not",
                "run/other",
                "run/other/f"
            ]
        );
    }

    fn entries(tar_bytes: &[u8]) -> Vec<(String, tar::EntryType, u64, u64, String)> {
        let mut a = tar::Archive::new(tar_bytes);
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                let link = e
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned())
                    .unwrap_or_default();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.entry_type(),
                    h.uid().unwrap(),
                    h.gid().unwrap(),
                    link,
                )
            })
            .collect()
    }

    /// An overlay upper as a layer: whiteouts and opaque directories in
    /// OCI's spelling, symlinks stored (never followed, even to a
    /// directory outside), hard links once, ids shifted back from a
    /// sandbox's range (outside it: nobody).
    #[test]
    fn an_upper_becomes_an_oci_layer() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path();
        fs::create_dir(root.join("etc")).unwrap();
        fs::write(root.join("etc/conf"), "x").unwrap();
        fs::hard_link(root.join("etc/conf"), root.join("etc/conf2")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("escape")).unwrap();
        fs::create_dir(root.join("opaque")).unwrap();
        let opaque = rustix::fs::setxattr(
            root.join("opaque").as_path(),
            crate::OPAQUE_XATTR,
            b"y",
            rustix::fs::XattrFlags::empty(),
        );
        let whiteout = rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join("gone").as_path(),
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        );
        fs::set_permissions(root.join("etc/conf"), fs::Permissions::from_mode(0o640)).unwrap();
        let base = fs::metadata(root).unwrap().uid();
        let mut out = Vec::new();
        write_tar(
            root,
            Owners::Shifted {
                uid_base: base,
                gid_base: fs::metadata(root).unwrap().gid(),
                count: 65536,
            },
            &mut out,
        )
        .unwrap();
        let got = entries(&out);
        let find = |p: &str| got.iter().find(|e| e.0.trim_end_matches('/') == p).cloned();
        let conf = find("etc/conf").expect("etc/conf");
        assert_eq!((conf.1, conf.2, conf.3), (tar::EntryType::Regular, 0, 0));
        let conf2 = find("etc/conf2").expect("etc/conf2");
        assert_eq!(
            (conf2.1, conf2.4.as_str()),
            (tar::EntryType::Link, "etc/conf")
        );
        let escape = find("escape").expect("escape");
        assert_eq!(
            (escape.1, escape.4.as_str()),
            (tar::EntryType::Symlink, "/etc")
        );
        assert!(
            !got.iter().any(|e| e.0.starts_with("escape/")),
            "a symlink was followed: {got:?}"
        );
        if opaque.is_ok() {
            assert!(find("opaque/.wh..wh..opq").is_some(), "{got:?}");
        } else {
            println!("skipped: no user xattrs on this filesystem");
        }
        match whiteout {
            Ok(()) => assert!(find(".wh.gone").is_some(), "{got:?}"),
            Err(e) => println!("skipped whiteout: mknod 0/0: {e}"),
        }
        // Ids outside the range: nobody.
        let mut out = Vec::new();
        write_tar(
            root,
            Owners::Shifted {
                uid_base: base + 1,
                gid_base: base + 1,
                count: 10,
            },
            &mut out,
        )
        .unwrap();
        let conf = entries(&out)
            .into_iter()
            .find(|e| e.0 == "etc/conf")
            .unwrap();
        assert_eq!((conf.2, conf.3), (65534, 65534));
    }
}
