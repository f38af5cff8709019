//! File operations, implemented with std::fs. The agent runs inside the
//! sandbox, so a path means what it means to the sandbox's processes; the
//! only checks are for empty paths and NUL bytes, which the kernel would
//! misread.

use std::collections::BTreeMap;
use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use brig_protocol::message::{Entry, ErrorCode, Event, FileKind};

use crate::sys;
use crate::users::Names;

/// Entries per `entries` message, so a big listing never needs a big frame.
const ENTRIES_PER_MESSAGE: usize = 256;
/// Deepest listing the agent walks.
const MAX_DEPTH: u32 = 64;

/// A failed operation, ready to become an `error` event.
pub fn io_error(op: &str, path: &str, err: &io::Error) -> Event {
    let code = match err.raw_os_error() {
        Some(libc::ENOENT) => ErrorCode::NotFound,
        Some(libc::EACCES) | Some(libc::EPERM) => ErrorCode::PermissionDenied,
        Some(libc::EEXIST) => ErrorCode::AlreadyExists,
        Some(libc::ENOTDIR) => ErrorCode::NotADirectory,
        Some(libc::EISDIR) => ErrorCode::IsADirectory,
        Some(libc::ENOTEMPTY) => ErrorCode::DirectoryNotEmpty,
        Some(libc::EINVAL) | Some(libc::ENAMETOOLONG) | Some(libc::ELOOP) => {
            ErrorCode::InvalidRequest
        }
        // A mount point (removing `/`, `/proc`): the caller's mistake, not
        // a host failure.
        Some(libc::EBUSY) => ErrorCode::Busy,
        // The sandbox's own disk limit (or /dev/full): a state of the
        // sandbox (409), not a host failure.
        Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => ErrorCode::Busy,
        Some(libc::EROFS) => ErrorCode::PermissionDenied,
        // Extended attributes: not set, a filesystem without them, a name
        // or value the filesystem refuses.
        Some(libc::ENODATA) => ErrorCode::NotFound,
        Some(libc::EOPNOTSUPP) => ErrorCode::Unsupported,
        Some(libc::E2BIG) | Some(libc::ERANGE) => ErrorCode::InvalidRequest,
        _ => ErrorCode::Io,
    };
    Event::error(code, format!("{op} {path}: {}", describe(err)))
}

/// An io::Error as a lowercase reason without the "(os error N)" suffix.
pub fn describe(err: &io::Error) -> String {
    let text = err.to_string();
    let text = match text.find(" (os error") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Reject paths the kernel cannot take.
pub fn check_path(path: &str) -> Result<(), Event> {
    if path.is_empty() {
        return Err(Event::error(ErrorCode::InvalidRequest, "path is empty"));
    }
    if path.contains('\0') {
        return Err(Event::error(
            ErrorCode::InvalidRequest,
            format!("path {path:?} contains a nul byte"),
        ));
    }
    Ok(())
}

/// What an lstat says an entry is.
pub fn kind(meta: &Metadata) -> FileKind {
    if meta.is_symlink() {
        FileKind::Symlink
    } else if meta.is_dir() {
        FileKind::Dir
    } else if meta.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// An entry as `stat` and `list` report it. `names` turns ids into
/// names; `xattrs` is the prefix of the extended attributes to include, if
/// any were asked for.
pub fn entry(path: &Path, meta: &Metadata, names: &mut Names, xattrs: Option<&str>) -> Entry {
    let text = path.to_string_lossy();
    Entry {
        path: text.clone().into_owned(),
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| text.clone().into_owned()),
        kind: kind(meta),
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        mtime: meta.mtime(),
        symlink_target: meta
            .is_symlink()
            .then(|| fs::read_link(path).ok())
            .flatten()
            .map(|t| t.to_string_lossy().into_owned()),
        uid: Some(meta.uid()),
        gid: Some(meta.gid()),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
        xattrs: xattrs.map_or_else(BTreeMap::new, |prefix| read_xattrs(&text, prefix)),
    }
}

/// The extended attributes of `path` whose names start with `prefix`. A
/// filesystem without them, or one the agent may not read, has none: a
/// listing does not fail over one file's attributes.
fn read_xattrs(path: &str, prefix: &str) -> BTreeMap<String, String> {
    let Ok(names) = sys::list_xattrs(path) else {
        return BTreeMap::new();
    };
    names
        .into_iter()
        .filter(|n| n.starts_with(prefix))
        .filter_map(|n| {
            let value = sys::get_xattr(path, &n).ok()?;
            Some((n, String::from_utf8_lossy(&value).into_owned()))
        })
        .collect()
}

pub fn stat(path: &str, xattrs: Option<&str>) -> Event {
    match fs::symlink_metadata(path) {
        Ok(meta) => Event::Stat {
            entry: Box::new(entry(Path::new(path), &meta, &mut Names::default(), xattrs)),
        },
        Err(e) => io_error("stat", path, &e),
    }
}

/// The most entries one `list` answers with. A deep list of a big tree (`/`
/// of a `host` sandbox: the host's whole root) would otherwise be held
/// whole here, in the daemon and in its HTTP answer (25 MB of JSON and
/// 330 MB of daemon memory for one request).
const MAX_LIST_ENTRIES: usize = 20_000;

/// `entries` messages then `done`, or one `error`.
pub fn list(path: &str, depth: u32, xattrs: Option<&str>) -> Vec<Event> {
    let depth = depth.clamp(1, MAX_DEPTH);
    let mut found = Vec::new();
    let mut names = Names::default();
    let walked = walk(Path::new(path), depth, &mut found, &mut names, xattrs);
    if found.len() > MAX_LIST_ENTRIES {
        return vec![Event::error(
            ErrorCode::InvalidRequest,
            format!(
                "list {path}: more than {MAX_LIST_ENTRIES} entries at depth {depth}: \
                 list a subdirectory or a smaller depth"
            ),
        )];
    }
    if let Err(e) = walked {
        return vec![io_error("list", path, &e)];
    }
    let mut events: Vec<Event> = found
        .chunks(ENTRIES_PER_MESSAGE)
        .map(|c| Event::Entries {
            entries: c.to_vec(),
        })
        .collect();
    events.push(Event::Done);
    events
}

fn walk(
    dir: &Path,
    depth: u32,
    out: &mut Vec<Entry>,
    names: &mut Names,
    xattrs: Option<&str>,
) -> io::Result<()> {
    let mut children: Vec<_> = fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    children.sort_by_key(|c| c.file_name());
    for child in children {
        let path = child.path();
        // The entry may vanish between readdir and lstat; skip it then.
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue;
        };
        out.push(entry(&path, &meta, names, xattrs));
        if out.len() > MAX_LIST_ENTRIES {
            return Ok(());
        }
        // Never follow symlinks: a link to / would list the whole sandbox.
        if depth > 1 && meta.is_dir() {
            // A subdirectory we may not read is listed but not descended.
            let _ = walk(&path, depth - 1, out, names, xattrs);
        }
    }
    Ok(())
}

pub fn mkdir(path: &str, parents: bool) -> Event {
    let result = if parents {
        fs::create_dir_all(path)
    } else {
        fs::create_dir(path)
    };
    match result {
        Ok(()) => Event::Done,
        Err(e) => io_error("mkdir", path, &e),
    }
}

pub fn rename(from: &str, to: &str) -> Event {
    match fs::rename(from, to) {
        Ok(()) => Event::Done,
        Err(e) => io_error("rename", &format!("{from} to {to}"), &e),
    }
}

pub fn remove(path: &str, recursive: bool) -> Event {
    let result = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() && recursive => fs::remove_dir_all(path),
        Ok(meta) if meta.is_dir() => fs::remove_dir(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Ok(()) => Event::Done,
        Err(e) => io_error("remove", path, &e),
    }
}

/// `set_xattrs`: with `replace_prefix`, the attributes under it become
/// exactly `xattrs`.
pub fn set_xattrs(
    path: &str,
    xattrs: &BTreeMap<String, String>,
    replace_prefix: Option<&str>,
) -> Event {
    if let Some(prefix) = replace_prefix {
        let old = match sys::list_xattrs(path) {
            Ok(names) => names,
            // Nothing to clear on a filesystem without extended attributes;
            // setting any is an error below.
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Vec::new(),
            Err(e) => return io_error("list extended attributes of", path, &e),
        };
        for name in old
            .iter()
            .filter(|n| n.starts_with(prefix) && !xattrs.contains_key(*n))
        {
            match sys::remove_xattr(path, name) {
                Ok(()) => {}
                // Removed meanwhile: the result is the same.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => {
                    return io_error(&format!("remove extended attribute {name} of"), path, &e)
                }
            }
        }
    }
    for (name, value) in xattrs {
        if let Err(e) = sys::set_xattr(path, name, value.as_bytes()) {
            let mut event = io_error(&format!("set extended attribute {name} on"), path, &e);
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                if let Event::Error { message, .. } = &mut event {
                    message.push_str(
                        " (the filesystem there does not support this kind of extended attribute)",
                    );
                }
            }
            return event;
        }
    }
    Event::Done
}

pub fn remove_xattr(path: &str, name: &str) -> Event {
    match sys::remove_xattr(path, name) {
        Ok(()) => Event::Done,
        Err(e) => io_error(&format!("remove extended attribute {name} of"), path, &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_lowercase_and_name_the_path() {
        let Event::Error { code, message } = stat("/definitely/not/here", None) else {
            panic!("expected an error")
        };
        assert_eq!(code, ErrorCode::NotFound);
        assert_eq!(
            message,
            "stat /definitely/not/here: no such file or directory"
        );
    }

    #[test]
    fn bad_paths_are_refused() {
        assert!(check_path("").is_err());
        assert!(check_path("a\0b").is_err());
        assert!(check_path("/tmp").is_ok());
    }
}
