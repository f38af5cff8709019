//! Unpacking one layer's tar into a directory that overlayfs can use as a
//! lower layer.
//!
//! The `tar` crate reads the archive (long names, PAX records, sparse
//! files); this module writes it, because a layer is not an ordinary tar:
//!
//! - **Whiteouts.** An OCI layer deletes a file of a lower layer with an
//!   empty entry `.wh.NAME`, and hides a whole lower directory with
//!   `DIR/.wh..wh..opq`. Overlayfs says the same with a character device
//!   0/0 named `NAME`, and with the xattr [`OPAQUE_XATTR`] = `y` on `DIR`.
//!   brig mounts its overlays with `userxattr` (unprivileged, inside the
//!   sandbox's user namespace), where overlayfs reads `user.overlay.*` and
//!   ignores `trusted.overlay.*`: so the opaque marker is a `user.` xattr.
//!   Overlay xattrs a layer carries itself (`user.overlay.*`,
//!   `trusted.overlay.*`) are dropped: deletions come only from whiteout
//!   entries, which the OCI spec defines and this code checks.
//! - **Hostile paths.** An entry is placed by walking its parent
//!   directories from the layer's root one `openat(O_NOFOLLOW |
//!   O_DIRECTORY)` at a time, and created relative to the last one
//!   (`mkdirat`, `openat(O_CREAT | O_EXCL | O_NOFOLLOW)`, `symlinkat`,
//!   `mknodat`, `linkat`). Absolute paths and `..` are refused, and so is
//!   any entry whose parent is a symlink, wherever it points: a layer may
//!   carry symlinks (they are resolved inside the sandbox, later), but
//!   nothing is ever written through one. Metadata is set on the open
//!   descriptor, or with `AT_SYMLINK_NOFOLLOW`, never by a path that could
//!   be a link.
//! - **Ownership and metadata.** Files belong to the uid/gid the tar
//!   names (the PAX `uid`/`gid` when present), on the host, as they are:
//!   the jail shows them to the sandbox through an idmapped mount. Modes
//!   (with setuid/setgid/sticky), mtimes (PAX precision), xattrs (PAX
//!   `SCHILY.xattr.*`, e.g. `security.capability`) and device numbers are
//!   kept. Ownership is set before the mode and xattrs because `chown`
//!   clears setuid bits and file capabilities. Directory mtimes are set
//!   last, once nothing more is created in them.
//! - **Later entries win.** An entry replaces whatever an earlier entry of
//!   the same layer made at its path (a directory entry over a directory
//!   only updates its metadata), as `tar -x` does.
//!
//! The caller ([`crate::ImageStore::unpack_layer`]) unpacks into a fresh
//! temporary directory and renames it into place only after the whole
//! stream's digest matched the layer's diff id, so what is written here is
//! never seen half-done.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{
    self as rfs, AtFlags, FileType, Gid, Mode, OFlags, Timespec, Timestamps, Uid, XattrFlags,
};
use rustix::io::Errno;
use tar::EntryType;

use crate::ImageError;

/// The xattr that makes a directory opaque to overlayfs mounted with
/// `userxattr`.
pub const OPAQUE_XATTR: &str = "user.overlay.opaque";
/// The name prefix of an OCI whiteout entry.
pub const WHITEOUT_PREFIX: &str = ".wh.";
/// The OCI entry that makes its directory opaque.
pub const OPAQUE_MARKER: &str = ".wh..wh..opq";

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Unpack the tar stream `reader` into the existing, empty directory
/// `dest`; `blob` names the layer in errors. Returns the reader, positioned
/// after the archive's end marker, so the caller can finish its digest.
pub(crate) fn unpack<R: Read>(reader: R, dest: &Path, blob: &str) -> Result<R, ImageError> {
    let root = rfs::open(dest, DIR_FLAGS, Mode::empty())
        .map_err(|e| ImageError::io("open", dest)(e.into()))?;
    let mut unpacker = Unpacker {
        root,
        dest,
        blob,
        dir_times: Vec::new(),
        root_meta: None,
        buf: vec![0; 64 * 1024],
        open_dirs: std::cell::RefCell::new(Vec::new()),
    };
    let mut archive = tar::Archive::new(reader);
    let entries = archive.entries().map_err(|e| unpacker.stream(e))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| unpacker.stream(e))?;
        unpacker.entry(&mut entry)?;
    }
    unpacker.finish()?;
    Ok(archive.into_inner())
}

/// What an entry says about the file it makes.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Timespec,
    /// Names and values from the PAX `SCHILY.xattr.NAME` records.
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

struct Unpacker<'a> {
    root: OwnedFd,
    dest: &'a Path,
    blob: &'a str,
    /// Directories made or updated, with the mtime to give them once the
    /// layer is unpacked (every entry created inside one changes it).
    dir_times: Vec<(Vec<Vec<u8>>, Timespec)>,
    /// What a `./` entry says about the layer's root, applied last: until
    /// then the root stays as the caller made it (0700, root's), so no
    /// other user can reach into a layer while it is being written.
    root_meta: Option<(Meta, String)>,
    buf: Vec<u8>,
    /// The directories the last entry's parent was reached through, from
    /// the root down (name, descriptor): the next entry under the same
    /// directories starts from them instead of walking from the root again
    /// (a layer's entries come depth first, and the walk was most of an
    /// unpack's system calls). An entry that makes, replaces or deletes a
    /// path drops what is at or below it first.
    open_dirs: std::cell::RefCell<Vec<(Vec<u8>, OwnedFd)>>,
}

impl Unpacker<'_> {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), ImageError> {
        let kind = entry.header().entry_type();
        if matches!(kind, EntryType::XGlobalHeader) {
            // Defaults for the entries that follow (a comment, a charset):
            // nothing a layer's files depend on.
            return Ok(());
        }
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let comps = components(&raw).map_err(|r| self.refuse(&shown, r.to_string()))?;
        self.forget_dirs_at(&comps);
        let meta = self.meta(entry, &shown)?;

        let Some((name, parents)) = comps.split_last() else {
            // `./`: the layer's root directory itself.
            if kind != EntryType::Directory {
                return Err(self.refuse(&shown, "names the layer's root but is not a directory"));
            }
            self.dir_times.push((Vec::new(), meta.mtime));
            self.root_meta = Some((meta, shown));
            return Ok(());
        };
        let parent = self.open_dir(parents, true, &shown)?;

        if let Some(target) = name.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
            return self.whiteout(&parent, parents, target, &meta, &shown);
        }
        let name = OsStr::from_bytes(name);
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.clear(&parent, &comps, false, &shown)?;
                let fd = rfs::openat(
                    &parent,
                    name,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(self.io(&shown, "create the file"))?;
                let mut file = File::from(fd);
                self.copy(entry, &mut file, &shown)?;
                self.set_meta_fd(&file, &meta, &shown, true)?;
            }
            EntryType::Directory => {
                if !self.clear(&parent, &comps, true, &shown)? {
                    rfs::mkdirat(&parent, name, Mode::from_raw_mode(0o700))
                        .map_err(self.io(&shown, "make the directory"))?;
                }
                let fd = rfs::openat(&parent, name, DIR_FLAGS, Mode::empty())
                    .map_err(self.io(&shown, "open the directory"))?;
                self.set_meta_fd(&fd, &meta, &shown, false)?;
                self.dir_times
                    .push((comps.iter().map(|c| c.to_vec()).collect(), meta.mtime));
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| self.refuse(&shown, "is a symlink without a target"))?
                    .into_owned();
                self.clear(&parent, &comps, false, &shown)?;
                rfs::symlinkat(OsStr::from_bytes(&target), &parent, name)
                    .map_err(self.io(&shown, "make the symlink"))?;
                self.set_meta_at(&parent, name, &meta, &shown, None)?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| self.refuse(&shown, "is a hard link without a target"))?
                    .into_owned();
                self.hard_link(&parent, &comps, &target, &shown)?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let (file_type, dev) = match kind {
                    EntryType::Fifo => (FileType::Fifo, 0),
                    _ => {
                        let header = entry.header();
                        let major = header.device_major().ok().flatten().unwrap_or(0);
                        let minor = header.device_minor().ok().flatten().unwrap_or(0);
                        let t = if kind == EntryType::Char {
                            FileType::CharacterDevice
                        } else {
                            FileType::BlockDevice
                        };
                        (t, rfs::makedev(major, minor))
                    }
                };
                self.clear(&parent, &comps, false, &shown)?;
                rfs::mknodat(&parent, name, file_type, Mode::empty(), dev)
                    .map_err(self.io(&shown, "make the device node"))?;
                self.set_meta_at(&parent, name, &meta, &shown, Some(meta.mode))?;
            }
            other => {
                return Err(self.refuse(
                    &shown,
                    format!(
                        "has tar type {:?}, which a layer cannot hold",
                        other.as_byte() as char
                    ),
                ))
            }
        }
        Ok(())
    }

    /// `.wh.NAME` (NAME deleted) or `.wh..wh..opq` (the directory opaque).
    fn whiteout(
        &mut self,
        parent: &OwnedFd,
        parents: &[&[u8]],
        target: &[u8],
        meta: &Meta,
        shown: &str,
    ) -> Result<(), ImageError> {
        if target == &OPAQUE_MARKER.as_bytes()[WHITEOUT_PREFIX.len()..] {
            return rfs::fsetxattr(parent, OPAQUE_XATTR, b"y", XattrFlags::empty()).map_err(
                self.io(
                    shown,
                    "mark the directory opaque (setxattr user.overlay.opaque)",
                ),
            );
        }
        if target.starts_with(WHITEOUT_PREFIX.as_bytes()) {
            // `.wh..wh.plnk` and the like: aufs's own bookkeeping, which
            // some old Docker layers still carry. Nothing to make.
            return Ok(());
        }
        if matches!(target, b"" | b"." | b"..") {
            return Err(self.refuse(shown, "is a whiteout of nothing"));
        }
        let mut comps = parents.to_vec();
        comps.push(target);
        self.clear(parent, &comps, false, shown)?;
        let name = OsStr::from_bytes(target);
        rfs::mknodat(
            parent,
            name,
            FileType::CharacterDevice,
            Mode::empty(),
            rfs::makedev(0, 0),
        )
        .map_err(self.io(shown, "make the whiteout (a character device 0/0)"))?;
        rfs::chownat(
            parent,
            name,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(self.io(shown, "chown the whiteout"))
    }

    fn hard_link(
        &mut self,
        parent: &OwnedFd,
        comps: &[&[u8]],
        target: &[u8],
        shown: &str,
    ) -> Result<(), ImageError> {
        let target_shown = String::from_utf8_lossy(target).into_owned();
        let not_earlier = || {
            self.refuse(
                shown,
                format!("is a hard link to {target_shown:?}, which is not an earlier file of this layer"),
            )
        };
        let tcomps = components(target).map_err(|r| {
            self.refuse(
                shown,
                format!("is a hard link to {target_shown:?}, which {r}"),
            )
        })?;
        let Some((tname, tparents)) = tcomps.split_last() else {
            return Err(not_earlier());
        };
        let tparent = match self.open_dir(tparents, false, shown) {
            Ok(fd) => fd,
            Err(ImageError::EntryIo { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Err(not_earlier())
            }
            Err(e) => return Err(e),
        };
        match rfs::statat(
            &tparent,
            OsStr::from_bytes(tname),
            AtFlags::SYMLINK_NOFOLLOW,
        ) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                return Err(self.refuse(
                    shown,
                    format!("is a hard link to {target_shown:?}, which is a directory"),
                ))
            }
            Ok(_) => {}
            Err(Errno::NOENT) => return Err(not_earlier()),
            Err(e) => return Err(self.io(shown, "look at the hard link's target")(e)),
        }
        if tcomps == comps {
            // A link to itself: what is there already is the answer.
            return Ok(());
        }
        self.clear(parent, comps, false, shown)?;
        let name = OsStr::from_bytes(comps[comps.len() - 1]);
        // Flags 0: a target that is a symlink is linked itself, not followed.
        rfs::linkat(
            &tparent,
            OsStr::from_bytes(tname),
            parent,
            name,
            AtFlags::empty(),
        )
        .map_err(self.io(shown, "make the hard link"))
    }

    /// Uid, gid, mode, mtime and xattrs of `entry`, its PAX records first.
    fn meta<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        shown: &str,
    ) -> Result<Meta, ImageError> {
        let header = entry.header();
        let bad = |e: io::Error| self.stream(e);
        let mut uid = header.uid().map_err(bad)?;
        let mut gid = header.gid().map_err(bad)?;
        let mode = header.mode().map_err(bad)? & 0o7777;
        let mut mtime = Timespec {
            tv_sec: i64::try_from(header.mtime().map_err(bad)?).unwrap_or(i64::MAX),
            tv_nsec: 0,
        };
        let mut xattrs = Vec::new();
        if let Some(pax) = entry.pax_extensions().map_err(|e| self.stream(e))? {
            for ext in pax {
                let ext = ext.map_err(|e| self.stream(e))?;
                let value = ext.value_bytes();
                match ext.key_bytes() {
                    b"uid" => uid = pax_number(value).unwrap_or(uid),
                    b"gid" => gid = pax_number(value).unwrap_or(gid),
                    b"mtime" => mtime = pax_time(value).unwrap_or(mtime),
                    key => {
                        if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                            if !is_overlay_xattr(name) {
                                xattrs.push((name.to_vec(), value.to_vec()));
                            }
                        }
                    }
                }
            }
        }
        let id = |v: u64, what: &str| {
            // u32::MAX is -1, "leave unchanged", to chown.
            u32::try_from(v)
                .ok()
                .filter(|v| *v != u32::MAX)
                .ok_or_else(|| {
                    self.refuse(
                        shown,
                        format!("has {what} {v}, outside the range a file can have"),
                    )
                })
        };
        Ok(Meta {
            mode,
            uid: id(uid, "uid")?,
            gid: id(gid, "gid")?,
            mtime,
            xattrs,
        })
    }

    /// Owner, mode, xattrs and (for all but directories) mtime, on an open
    /// file or directory.
    fn set_meta_fd(
        &self,
        fd: impl AsFd,
        meta: &Meta,
        shown: &str,
        times: bool,
    ) -> Result<(), ImageError> {
        let fd = fd.as_fd();
        rfs::fchown(
            fd,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
        )
        .map_err(self.io(shown, "chown"))?;
        rfs::fchmod(fd, Mode::from_raw_mode(meta.mode)).map_err(self.io(shown, "chmod"))?;
        for (name, value) in &meta.xattrs {
            match rfs::fsetxattr(fd, OsStr::from_bytes(name), value, XattrFlags::empty()) {
                // This filesystem has no such xattr namespace (e.g.
                // security.selinux without SELinux): the file is still
                // what the layer describes everywhere it matters.
                Ok(()) | Err(Errno::NOTSUP) => {}
                Err(e) => return Err(self.io(shown, "set an xattr")(e)),
            }
        }
        if times {
            rfs::futimens(fd, &times_of(meta.mtime)).map_err(self.io(shown, "set the mtime"))?;
        }
        Ok(())
    }

    /// Owner, mode (`mode`, unless a symlink), xattrs and mtime of `name`
    /// in `parent`, never following it: symlinks and device nodes, which
    /// cannot be opened to be changed.
    fn set_meta_at(
        &self,
        parent: &OwnedFd,
        name: &OsStr,
        meta: &Meta,
        shown: &str,
        mode: Option<u32>,
    ) -> Result<(), ImageError> {
        rfs::chownat(
            parent,
            name,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(self.io(shown, "chown"))?;
        if let Some(mode) = mode {
            // A node this unpack just made, not a symlink: nothing to follow.
            rfs::chmodat(parent, name, Mode::from_raw_mode(mode), AtFlags::empty())
                .map_err(self.io(shown, "chmod"))?;
        }
        if !meta.xattrs.is_empty() {
            // lsetxattr by a path that goes through the parent's descriptor
            // (no *at form before Linux 6.13); `l` does not follow `name`.
            let path = PathBuf::from(format!("/proc/self/fd/{}", parent.as_raw_fd())).join(name);
            for (xname, value) in &meta.xattrs {
                match rfs::lsetxattr(&path, OsStr::from_bytes(xname), value, XattrFlags::empty()) {
                    // user.* cannot be set on symlinks and device nodes
                    // (EPERM), nor unknown namespaces anywhere: only
                    // trusted.* and security.* apply to these.
                    Ok(()) | Err(Errno::NOTSUP) | Err(Errno::PERM) => {}
                    Err(e) => return Err(self.io(shown, "set an xattr")(e)),
                }
            }
        }
        rfs::utimensat(
            parent,
            name,
            &times_of(meta.mtime),
            AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(self.io(shown, "set the mtime"))
    }

    /// Copy a regular file's content.
    fn copy<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        file: &mut File,
        shown: &str,
    ) -> Result<(), ImageError> {
        loop {
            let n = match entry.read(&mut self.buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.stream(e)),
            };
            file.write_all(&self.buf[..n])
                .map_err(|source| ImageError::EntryIo {
                    blob: self.blob.to_string(),
                    entry: shown.to_string(),
                    op: "write the file",
                    source,
                })?;
        }
    }

    /// Make room at `comps` (whose parent is `parent`) for a new entry:
    /// remove what an earlier entry made there. With `keep_dir`, a
    /// directory stays (and `true` says so).
    fn clear(
        &self,
        parent: &OwnedFd,
        comps: &[&[u8]],
        keep_dir: bool,
        shown: &str,
    ) -> Result<bool, ImageError> {
        let name = OsStr::from_bytes(comps[comps.len() - 1]);
        let st = match rfs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(self.io(shown, "look at what is already there")(e)),
        };
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            rfs::unlinkat(parent, name, AtFlags::empty())
                .map_err(self.io(shown, "remove the earlier entry"))?;
            return Ok(false);
        }
        if keep_dir {
            return Ok(true);
        }
        // Its parents were just walked without meeting a symlink, and
        // remove_dir_all does not follow the ones inside.
        let path = comps
            .iter()
            .fold(self.dest.to_path_buf(), |p, c| p.join(OsStr::from_bytes(c)));
        std::fs::remove_dir_all(&path).map_err(|source| ImageError::EntryIo {
            blob: self.blob.to_string(),
            entry: shown.to_string(),
            op: "remove the earlier directory",
            source,
        })?;
        Ok(false)
    }

    /// Open the directory `comps` under the root, one component at a time,
    /// refusing symlinks; with `create`, missing ones are made (mode 0755,
    /// as tar does for parents a layer does not list).
    fn open_dir(&self, comps: &[&[u8]], create: bool, shown: &str) -> Result<OwnedFd, ImageError> {
        let mut open = self.open_dirs.borrow_mut();
        // The directories already open on the way are used as they are.
        let common = open
            .iter()
            .zip(comps)
            .take_while(|((n, _), c)| n.as_slice() == **c)
            .count();
        open.truncate(common);
        for (i, c) in comps.iter().enumerate().skip(common) {
            let name = OsStr::from_bytes(c);
            let cur = match open.last() {
                Some((_, fd)) => fd.as_fd(),
                None => self.root.as_fd(),
            };
            let next = match rfs::openat(cur, name, DIR_FLAGS, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if create => {
                    rfs::mkdirat(cur, name, Mode::from_raw_mode(0o755))
                        .map_err(self.io(shown, "make a parent directory"))?;
                    rfs::openat(cur, name, DIR_FLAGS, Mode::empty())
                        .map_err(self.io(shown, "open a parent directory"))?
                }
                Err(Errno::LOOP) | Err(Errno::NOTDIR) => {
                    let prefix = String::from_utf8_lossy(&comps[..=i].join(&b'/')).into_owned();
                    let symlink = rfs::statat(cur, name, AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
                    return Err(self.refuse(
                        shown,
                        if symlink {
                            format!("goes through the symlink {prefix:?}: nothing is written through a symlink")
                        } else {
                            format!("needs {prefix:?} to be a directory, and it is not")
                        },
                    ));
                }
                Err(e) => return Err(self.io(shown, "open a parent directory")(e)),
            };
            open.push((c.to_vec(), next));
        }
        match open.last() {
            Some((_, fd)) => rustix::io::fcntl_dupfd_cloexec(fd, 0)
                .map_err(self.io(shown, "open a parent directory")),
            None => self.reopen_root(shown),
        }
    }

    /// Drop the open directories at or below the path an entry is about
    /// to make, replace or delete (`.wh.NAME` deletes NAME; an opaque
    /// marker empties its directory).
    fn forget_dirs_at(&self, comps: &[&[u8]]) {
        let Some((last, parents)) = comps.split_last() else {
            self.open_dirs.borrow_mut().clear();
            return;
        };
        // The parents stay open; what is at the path (or, for an opaque
        // marker, everything in its directory) goes.
        let keep = parents.len();
        let mut open = self.open_dirs.borrow_mut();
        let under = open.len() > keep
            && open
                .iter()
                .zip(parents)
                .all(|((n, _), c)| n.as_slice() == *c)
            && (*last == OPAQUE_MARKER.as_bytes() || {
                let name = last
                    .strip_prefix(WHITEOUT_PREFIX.as_bytes())
                    .unwrap_or(last);
                open[keep].0.as_slice() == name
            });
        if under {
            open.truncate(keep);
        }
    }

    fn reopen_root(&self, shown: &str) -> Result<OwnedFd, ImageError> {
        rfs::openat(&self.root, ".", DIR_FLAGS, Mode::empty())
            .map_err(self.io(shown, "open the layer's root"))
    }

    /// The root's metadata (a `./` entry's, or 0755), then directories'
    /// mtimes, deepest last-made first; one that a later entry replaced (by
    /// a file, or a symlink) is skipped.
    fn finish(&mut self) -> Result<(), ImageError> {
        match self.root_meta.take() {
            Some((meta, shown)) => self.set_meta_fd(&self.root, &meta, &shown, false)?,
            None => rfs::fchmod(&self.root, Mode::from_raw_mode(0o755))
                .map_err(self.io("./", "chmod the layer's root"))?,
        }
        let dirs = std::mem::take(&mut self.dir_times);
        for (comps, mtime) in dirs.iter().rev() {
            let comps: Vec<&[u8]> = comps.iter().map(Vec::as_slice).collect();
            if let Ok(fd) = self.open_dir(&comps, false, "") {
                // Best effort: an mtime is not worth failing a layer for.
                let _ = rfs::futimens(&fd, &times_of(*mtime));
            }
        }
        Ok(())
    }

    fn refuse(&self, shown: &str, reason: impl Into<String>) -> ImageError {
        ImageError::EntryRefused {
            blob: self.blob.to_string(),
            entry: shown.to_string(),
            reason: reason.into(),
        }
    }

    fn io(&self, shown: &str, op: &'static str) -> impl FnOnce(Errno) -> ImageError {
        let blob = self.blob.to_string();
        let entry = shown.to_string();
        move |e| ImageError::EntryIo {
            blob,
            entry,
            op,
            source: e.into(),
        }
    }

    fn stream(&self, source: io::Error) -> ImageError {
        ImageError::LayerStream {
            blob: self.blob.to_string(),
            source,
        }
    }
}

/// The components of an entry's path, without `.` and empty ones; refuses
/// absolute paths and `..`.
fn components(raw: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if raw.first() == Some(&b'/') {
        return Err("is an absolute path");
    }
    let mut out = Vec::new();
    for c in raw.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("has a .. component"),
            c => out.push(c),
        }
    }
    Ok(out)
}

/// `user.overlay.*` and `trusted.overlay.*`: overlayfs's own.
fn is_overlay_xattr(name: &[u8]) -> bool {
    name.starts_with(b"user.overlay.") || name.starts_with(b"trusted.overlay.")
}

fn pax_number(v: &[u8]) -> Option<u64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

/// A PAX time: seconds, optionally with a fraction (`1700000000.25`).
fn pax_time(v: &[u8]) -> Option<Timespec> {
    let v = std::str::from_utf8(v).ok()?.trim();
    let (secs, frac) = v.split_once('.').unwrap_or((v, ""));
    let secs: i64 = secs.parse().ok()?;
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut nanos: i64 = 0;
    for i in 0..9 {
        nanos = nanos * 10 + frac.as_bytes().get(i).map_or(0, |b| i64::from(b - b'0'));
    }
    // `-1.25` is 1.25 s before the epoch: -2 s + 0.75 s.
    if v.starts_with('-') && nanos > 0 {
        return Some(Timespec {
            tv_sec: secs.checked_sub(1)?,
            tv_nsec: 1_000_000_000 - nanos,
        });
    }
    Some(Timespec {
        tv_sec: secs,
        tv_nsec: nanos,
    })
}

fn times_of(mtime: Timespec) -> Timestamps {
    Timestamps {
        last_access: mtime,
        last_modification: mtime,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_split_and_escapes_refused() {
        assert_eq!(
            components(b"./a//b/./c/").unwrap(),
            vec![&b"a"[..], b"b", b"c"]
        );
        assert!(components(b"./").unwrap().is_empty());
        assert_eq!(components(b"/etc/passwd"), Err("is an absolute path"));
        assert_eq!(components(b"a/../../b"), Err("has a .. component"));
        assert_eq!(components(b".."), Err("has a .. component"));
        // `..x` and `x..` are ordinary names.
        assert_eq!(components(b"..x/x..").unwrap(), vec![&b"..x"[..], b"x.."]);
    }

    #[test]
    fn pax_times_keep_their_fraction() {
        let t = pax_time(b"1700000000.25").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (1_700_000_000, 250_000_000));
        let t = pax_time(b"12").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (12, 0));
        let t = pax_time(b"-1.25").unwrap();
        assert_eq!((t.tv_sec, t.tv_nsec), (-2, 750_000_000));
        assert!(pax_time(b"1.2x").is_none());
        assert!(pax_time(b"soon").is_none());
        assert!(pax_time(b"-9223372036854775808.5").is_none());
    }

    #[test]
    fn overlay_xattrs_are_recognised() {
        assert!(is_overlay_xattr(b"user.overlay.opaque"));
        assert!(is_overlay_xattr(b"trusted.overlay.redirect"));
        assert!(!is_overlay_xattr(b"user.mime_type"));
        assert!(!is_overlay_xattr(b"security.capability"));
    }
}
