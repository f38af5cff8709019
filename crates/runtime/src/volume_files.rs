//! A volume's files without a sandbox: the content API's operations
//! (E2B's `/volumecontent`), on the volume's host mount.
//!
//! A volume's files are written by sandboxes, so its links and names are
//! untrusted: every path is resolved with `openat2(RESOLVE_IN_ROOT)` under
//! the volume's root (a link to `/etc/shadow` means the volume's own
//! `/etc/shadow`, `..` stops at the root, no other mount is crossed), and
//! every change is made through a descriptor opened without following a
//! final link. Owners are the ids sandboxes see (the volume stores them
//! so: see `volumes.rs`); a new entry gets its parent's unless told.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use crate::error::ErrorKind;
use crate::manager::{ManagerError, SandboxManager};
use crate::volumes::{VolumeHold, VolumeInfo};

/// The highest uid or gid an entry may be given: sandboxes see 65536.
pub const MAX_ID: u32 = 65535;
/// How deep a listing may go.
pub const MAX_DEPTH: u32 = 32;

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Unknown,
}

/// One entry of a volume, as its stat says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Entry {
    pub name: String,
    pub kind: EntryKind,
    /// From the volume's root, starting with `/`.
    pub path: String,
    pub size: u64,
    /// Permission bits (`0o644`), without the type.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Milliseconds since the epoch.
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    /// A link's target, as written.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// Why a content operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: no such file or directory in the volume")]
    NotFound { path: String },
    #[error("{path} exists already{hint}")]
    Exists { path: String, hint: &'static str },
    #[error("{path} is not a directory")]
    NotADirectory { path: String },
    #[error("{path} is a directory")]
    IsADirectory { path: String },
    #[error("the volume is full (its size is its quota): remove files or use a larger volume")]
    NoSpace,
    #[error("{0}")]
    Invalid(String),
    #[error("cannot {op} {path} in the volume")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
}

impl FileError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            FileError::NotFound { .. } => ErrorKind::NotFound,
            FileError::Exists { .. } => ErrorKind::Conflict,
            FileError::NotADirectory { .. }
            | FileError::IsADirectory { .. }
            | FileError::Invalid(_) => ErrorKind::BadRequest,
            FileError::NoSpace => ErrorKind::NoSpace,
            FileError::Io { .. } => ErrorKind::Internal,
        }
    }

    /// An I/O error of `op` on `path`, classified.
    pub fn io(op: &'static str, path: &str, e: io::Error) -> FileError {
        let path = display(path);
        match e.raw_os_error() {
            Some(libc::ENOENT) => FileError::NotFound { path },
            Some(libc::EEXIST) => FileError::Exists { path, hint: "" },
            Some(libc::ENOTDIR) => FileError::NotADirectory { path },
            Some(libc::EISDIR) => FileError::IsADirectory { path },
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => FileError::NoSpace,
            Some(libc::ELOOP) => FileError::Invalid(format!(
                "{path} is a symbolic link: change what it points to instead"
            )),
            Some(libc::ENOTEMPTY) => FileError::Exists {
                path,
                hint: " and is not empty",
            },
            _ => FileError::Io {
                op,
                path,
                source: e,
            },
        }
    }
}

/// Owner and mode for a new entry or a change; `None`: as it is (or the
/// parent's owner and 0644/0755 for a new one).
#[derive(Debug, Clone, Copy, Default)]
pub struct Meta {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub mode: Option<u32>,
}

impl Meta {
    fn check(&self) -> Result<(), FileError> {
        for (what, id) in [("uid", self.uid), ("gid", self.gid)] {
            if id.is_some_and(|id| id > MAX_ID) {
                return Err(FileError::Invalid(format!(
                    "{what} {}: ids are 0 to {MAX_ID}, as sandboxes see them",
                    id.unwrap_or_default()
                )));
            }
        }
        if self.mode.is_some_and(|m| m > 0o7777) {
            return Err(FileError::Invalid(format!(
                "mode {:o}: permission bits are 0 to 7777 (octal)",
                self.mode.unwrap_or_default()
            )));
        }
        Ok(())
    }
}

/// A volume's files, mounted and held while this lives.
pub struct VolumeFiles<'a> {
    root: OwnedFd,
    _hold: VolumeHold<'a>,
}

impl std::fmt::Debug for VolumeFiles<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VolumeFiles").finish_non_exhaustive()
    }
}

impl SandboxManager {
    /// The files of volume `info` (the caller checked it is the caller's).
    pub fn volume_files(&self, info: &VolumeInfo) -> Result<VolumeFiles<'_>, ManagerError> {
        let (hold, mnt) = self.hold_volume(info)?;
        let root = rustix::fs::open(
            &mnt,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ManagerError::Io {
            op: "open the volume's root",
            source: e.into(),
        })?;
        Ok(VolumeFiles { root, _hold: hold })
    }
}

/// `path` as shown: from the root, with a leading `/`.
fn display(path: &str) -> String {
    format!("/{}", components(path).join("/"))
}

/// The components of `path` under the root: `.` and empty ones dropped,
/// `..` going up no further than the root.
fn components(path: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

fn check_path(path: &str) -> Result<(), FileError> {
    if path.contains('\0') {
        return Err(FileError::Invalid(
            "a path cannot contain a NUL byte".into(),
        ));
    }
    if path.len() > 4096 {
        return Err(FileError::Invalid("a path is at most 4096 bytes".into()));
    }
    Ok(())
}

/// Scoped to a directory already resolved: nothing may lead out of it.
const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

fn open_beneath(dir: impl AsFd, name: &str, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        name,
        flags | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
        BENEATH,
    )?)
}

impl VolumeFiles<'_> {
    /// Open `rel` (components from the root) resolved inside the volume.
    fn open(&self, rel: &[&str], flags: OFlags) -> io::Result<OwnedFd> {
        let rel = if rel.is_empty() {
            ".".to_string()
        } else {
            rel.join("/")
        };
        Ok(rustix::fs::openat2(
            &self.root,
            &rel,
            flags | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV,
        )?)
    }

    /// The directory holding `path`'s last component, and that component.
    fn parent<'p>(&self, path: &'p str) -> Result<(OwnedFd, &'p str), FileError> {
        check_path(path)?;
        let parts = components(path);
        let Some((name, dirs)) = parts.split_last() else {
            return Err(FileError::Invalid(
                "the volume's root itself cannot be changed so: name a path inside it".into(),
            ));
        };
        let dir = self
            .open(dirs, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|e| FileError::io("open the directory of", path, e))?;
        Ok((dir, name))
    }

    /// What `path` is (a link itself, not what it points to).
    pub fn stat(&self, path: &str) -> Result<Entry, FileError> {
        check_path(path)?;
        let parts = components(path);
        match parts.split_last() {
            None => {
                let st = rustix::fs::fstat(&self.root)
                    .map_err(|e| FileError::io("stat", path, e.into()))?;
                Ok(entry("", "/".into(), &st, None))
            }
            Some(_) => {
                let (dir, name) = self.parent(path)?;
                stat_at(&dir, name, display(path))
            }
        }
    }

    /// The entries of directory `path`, `depth` levels down (1: its own).
    pub fn list(&self, path: &str, depth: u32) -> Result<Vec<Entry>, FileError> {
        check_path(path)?;
        if !(1..=MAX_DEPTH).contains(&depth) {
            return Err(FileError::Invalid(format!(
                "depth {depth}: list 1 to {MAX_DEPTH} levels"
            )));
        }
        let parts = components(path);
        let dir = self
            .open(&parts, OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|e| FileError::io("list", path, e))?;
        let mut out = Vec::new();
        list_into(&dir, &display(path), depth, &mut out)?;
        Ok(out)
    }

    /// Make directory `path` (and its missing parents if `parents`).
    pub fn make_dir(&self, path: &str, meta: Meta, parents: bool) -> Result<Entry, FileError> {
        meta.check()?;
        check_path(path)?;
        let parts = components(path);
        if parts.is_empty() {
            return Err(FileError::Exists {
                path: "/".into(),
                hint: " (the volume's root)",
            });
        }
        let start = if parents { 0 } else { parts.len() - 1 };
        let mut dir = self
            .open(&parts[..start], OFlags::PATH | OFlags::DIRECTORY)
            .map_err(|e| FileError::io("open the directory of", path, e))?;
        for (i, name) in parts.iter().enumerate().skip(start) {
            let last = i + 1 == parts.len();
            let shown = display(&parts[..=i].join("/"));
            let made = match rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(0o700)) {
                Ok(()) => true,
                Err(e) if e == rustix::io::Errno::EXIST && !last => false,
                Err(e) => return Err(FileError::io("create directory", &shown, e.into())),
            };
            let child = open_beneath(&dir, name, OFlags::RDONLY | OFlags::DIRECTORY, 0)
                .map_err(|e| FileError::io("open", &shown, e))?;
            if made {
                set_meta(&dir, &child, meta, 0o755, &shown)?;
            }
            dir = child;
        }
        self.stat(path)
    }

    /// Create (or with `overwrite`, truncate) file `path` for writing; its
    /// owner and mode set. The caller writes, then [`Self::stat`]s.
    pub fn create_file(&self, path: &str, meta: Meta, overwrite: bool) -> Result<File, FileError> {
        meta.check()?;
        let (dir, name) = self.parent(path)?;
        let mut flags = OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW;
        flags |= if overwrite {
            OFlags::TRUNC
        } else {
            OFlags::EXCL
        };
        let fd = open_beneath(&dir, name, flags, 0o600).map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST) => FileError::Exists {
                path: display(path),
                hint: ": write it with force (overwrite) to replace it",
            },
            _ => FileError::io("create", path, e),
        })?;
        set_meta(&dir, &fd, meta, 0o644, path)?;
        Ok(File::from(fd))
    }

    /// Open file `path` for reading (through links inside the volume).
    pub fn open_file(&self, path: &str) -> Result<File, FileError> {
        check_path(path)?;
        let fd = self
            .open(&components(path), OFlags::RDONLY | OFlags::NONBLOCK)
            .map_err(|e| FileError::io("open", path, e))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| FileError::io("stat", path, e.into()))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                FileError::IsADirectory {
                    path: display(path),
                }
            } else {
                FileError::Invalid(format!("{} is not a regular file", display(path)))
            });
        }
        Ok(File::from(fd))
    }

    /// Change `path`'s owner and/or mode (not a link's).
    pub fn set_meta(&self, path: &str, meta: Meta) -> Result<Entry, FileError> {
        meta.check()?;
        let (dir, name) = self.parent(path)?;
        let fd = open_beneath(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK,
            0,
        )
        .map_err(|e| FileError::io("open", path, e))?;
        if let Some(mode) = meta.mode {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
                .map_err(|e| FileError::io("change the mode of", path, e.into()))?;
        }
        if meta.uid.is_some() || meta.gid.is_some() {
            rustix::fs::fchown(
                &fd,
                meta.uid.map(rustix::fs::Uid::from_raw),
                meta.gid.map(rustix::fs::Gid::from_raw),
            )
            .map_err(|e| FileError::io("change the owner of", path, e.into()))?;
        }
        stat_at(&dir, name, display(path))
    }

    /// Remove `path`, a directory with everything in it.
    pub fn remove(&self, path: &str) -> Result<(), FileError> {
        let (dir, name) = self.parent(path)?;
        remove_at(&dir, name, &display(path))
    }
}

/// New entry `fd` (in `dir`): owner as `meta` says or `dir`'s, mode as
/// `meta` says or `default`.
fn set_meta(
    dir: &OwnedFd,
    fd: &OwnedFd,
    meta: Meta,
    default: u32,
    path: &str,
) -> Result<(), FileError> {
    let parent = rustix::fs::fstat(dir).map_err(|e| FileError::io("stat", path, e.into()))?;
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(meta.uid.unwrap_or(parent.st_uid))),
        Some(rustix::fs::Gid::from_raw(meta.gid.unwrap_or(parent.st_gid))),
    )
    .map_err(|e| FileError::io("set the owner of", path, e.into()))?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(meta.mode.unwrap_or(default)))
        .map_err(|e| FileError::io("set the mode of", path, e.into()))
}

fn stat_at(dir: &OwnedFd, name: &str, shown: String) -> Result<Entry, FileError> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| FileError::io("stat", &shown, e.into()))?;
    let target = (st.st_mode & libc::S_IFMT == libc::S_IFLNK)
        .then(|| rustix::fs::readlinkat(dir, name, Vec::new()).ok())
        .flatten()
        .map(|t| t.to_string_lossy().into_owned());
    Ok(entry(name, shown, &st, target))
}

fn entry(name: &str, path: String, st: &rustix::fs::Stat, target: Option<String>) -> Entry {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => EntryKind::File,
        libc::S_IFDIR => EntryKind::Directory,
        libc::S_IFLNK => EntryKind::Symlink,
        _ => EntryKind::Unknown,
    };
    let ms = |s: i64, ns: u64| s * 1000 + (ns / 1_000_000) as i64;
    Entry {
        name: name.to_string(),
        kind,
        path,
        size: st.st_size.max(0) as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime: ms(st.st_atime, st.st_atime_nsec),
        mtime: ms(st.st_mtime, st.st_mtime_nsec),
        ctime: ms(st.st_ctime, st.st_ctime_nsec),
        target,
    }
}

fn names(dir: &OwnedFd, shown: &str) -> Result<Vec<String>, FileError> {
    let mut out = Vec::new();
    let dup = dir
        .try_clone()
        .map_err(|e| FileError::io("list", shown, e))?;
    let mut iter = rustix::fs::Dir::new(dup).map_err(|e| FileError::io("list", shown, e.into()))?;
    while let Some(item) = iter.read() {
        let item = item.map_err(|e| FileError::io("list", shown, e.into()))?;
        let name = item.file_name().to_string_lossy().into_owned();
        if name != "." && name != ".." {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn list_into(
    dir: &OwnedFd,
    shown: &str,
    depth: u32,
    out: &mut Vec<Entry>,
) -> Result<(), FileError> {
    for name in names(dir, shown)? {
        let path = join(shown, &name);
        let Ok(e) = stat_at(dir, &name, path.clone()) else {
            // Removed meanwhile (by a sandbox): not there to list.
            continue;
        };
        let is_dir = e.kind == EntryKind::Directory;
        out.push(e);
        if is_dir && depth > 1 {
            if let Ok(sub) = open_beneath(dir, &name, OFlags::RDONLY | OFlags::DIRECTORY, 0) {
                list_into(&sub, &path, depth - 1, out)?;
            }
        }
    }
    Ok(())
}

fn remove_at(dir: &OwnedFd, name: &str, shown: &str) -> Result<(), FileError> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| FileError::io("remove", shown, e.into()))?;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        let sub = open_beneath(dir, name, OFlags::RDONLY | OFlags::DIRECTORY, 0)
            .map_err(|e| FileError::io("remove", shown, e))?;
        for child in names(&sub, shown)? {
            remove_at(&sub, &child, &join(shown, &child))?;
        }
        rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
    } else {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())
    }
    .map_err(|e| FileError::io("remove", shown, e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_root() {
        assert_eq!(components("/a/./b//c/"), ["a", "b", "c"]);
        assert_eq!(components("../../etc/passwd"), ["etc", "passwd"]);
        assert_eq!(components("/a/../../b"), ["b"]);
        assert!(components("/").is_empty());
        assert_eq!(display("a/b/../c"), "/a/c");
        assert!(check_path("a\0b").is_err());
        assert!(check_path(&"x".repeat(4097)).is_err());
        check_path(&"x".repeat(4096)).unwrap();
    }

    #[test]
    fn ids_and_modes_are_bounded() {
        let ok = Meta {
            uid: Some(MAX_ID),
            gid: Some(0),
            mode: Some(0o7777),
        };
        ok.check().unwrap();
        for bad in [
            Meta {
                uid: Some(MAX_ID + 1),
                ..Meta::default()
            },
            Meta {
                gid: Some(MAX_ID + 1),
                ..Meta::default()
            },
            Meta {
                mode: Some(0o10000),
                ..Meta::default()
            },
        ] {
            assert!(matches!(bad.check(), Err(FileError::Invalid(_))), "{bad:?}");
        }
    }

    #[test]
    fn errors_are_classified_for_clients() {
        let kind = |errno| FileError::io("x", "/p", io::Error::from_raw_os_error(errno)).kind();
        assert_eq!(kind(libc::ENOENT), ErrorKind::NotFound);
        assert_eq!(kind(libc::EEXIST), ErrorKind::Conflict);
        assert_eq!(kind(libc::ENOSPC), ErrorKind::NoSpace);
        assert_eq!(kind(libc::ELOOP), ErrorKind::BadRequest);
        assert_eq!(kind(libc::EIO), ErrorKind::Internal);
    }
}
