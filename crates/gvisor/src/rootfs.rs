//! A sandbox's root on the host: the template read-only under a writable
//! layer bounded by `--disk`, as the process tier gives its sandboxes.
//!
//! ```text
//! <dir>/upper    a tmpfs of the disk limit's size: upper/ and work/
//! <dir>/rootfs   an overlay: lower = the template (its layers, top first),
//!                upper and work in the tmpfs; runsc's gofer serves it
//! ```
//!
//! For the `host` template the root is a directory in the tmpfs and the
//! host's /usr, /etc, /bin… are bound read-only by runsc (the bundle's
//! mounts); its symlinks (`/bin -> usr/bin` on merged-/usr hosts) are
//! recreated in the root.
//!
//! Both mounts are made in the host's mount namespace (runsc's gofer
//! opens the root by path), so they outlive a daemon crash; the next
//! daemon's `discard` unmounts them ([`unmount`]).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use brig_core::TemplateRef;

/// Host paths the `host` template shows (the process tier's list).
pub const HOST_PATHS: &[&str] = &[
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// A mount step that failed.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("cannot {op} at {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the gvisor tier cannot run template {0}: resolve it to a directory or an image first"
    )]
    Unresolved(String),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RootfsError + 'a {
    move |source| RootfsError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What [`prepare`] made: the root for the bundle, and host directories
/// runsc binds read-only (the `host` template's).
#[derive(Debug)]
pub struct Root {
    pub path: PathBuf,
    pub binds: Vec<PathBuf>,
    /// What covers the host's root-only files under those binds: (host
    /// path, empty file or directory to bind over it).
    pub masks: Vec<(PathBuf, PathBuf)>,
}

/// The tmpfs and overlay of a sandbox in `dir`, its writable layer a copy
/// of `seed` (what [`save_layer`] kept of a checkpointed sandbox's) if
/// given. On error what was mounted is unmounted again.
pub fn prepare(
    dir: &Path,
    template: &TemplateRef,
    disk: u64,
    seed: Option<&Path>,
) -> Result<Root, RootfsError> {
    let upper = dir.join("upper");
    let root = dir.join("rootfs");
    fs::create_dir_all(&upper).map_err(io_err("create", &upper))?;
    fs::create_dir_all(&root).map_err(io_err("create", &root))?;
    // Whole pages; at least one MiB, so a tiny limit still holds the
    // overlay's work directory.
    let size = disk.max(1 << 20);
    mount(
        "tmpfs",
        &upper,
        "tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("size={size},mode=0755"),
    )
    .map_err(io_err("mount the writable layer's tmpfs", &upper))?;
    if let Some(seed) = seed {
        if let Err(e) = copy_tree(seed, &upper) {
            let _ = unmount(dir);
            return Err(e);
        }
    }
    let made = match template {
        TemplateRef::Host => host_root(&upper),
        TemplateRef::Dir(path) => overlay(&upper, &root, std::slice::from_ref(path)),
        TemplateRef::Layers { lowers, .. } => overlay(&upper, &root, lowers),
        other => Err(RootfsError::Unresolved(other.to_string())),
    };
    if made.is_err() {
        let _ = unmount(dir);
    }
    made
}

fn overlay(upper: &Path, root: &Path, lowers: &[PathBuf]) -> Result<Root, RootfsError> {
    let (u, w) = (upper.join("upper"), upper.join("work"));
    for d in [&u, &w] {
        fs::create_dir_all(d).map_err(io_err("create", d))?;
    }
    let lowerdir = lowers
        .iter()
        .map(|l| l.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    // userxattr: brig-image marks opaque directories with
    // user.overlay.opaque (the process tier's overlays, in a user
    // namespace, can only read those).
    let opts = format!(
        "lowerdir={lowerdir},upperdir={},workdir={},userxattr",
        u.display(),
        w.display()
    );
    mount(
        "overlay",
        root,
        "overlay",
        libc::MS_NOSUID | libc::MS_NODEV,
        &opts,
    )
    .map_err(io_err("mount the sandbox's overlay", root))?;
    Ok(Root {
        path: root.to_path_buf(),
        binds: Vec::new(),
        masks: Vec::new(),
    })
}

fn host_root(upper: &Path) -> Result<Root, RootfsError> {
    let root = upper.join("root");
    fs::create_dir_all(&root).map_err(io_err("create", &root))?;
    let mut binds = Vec::new();
    for p in HOST_PATHS {
        let host = Path::new(p);
        let Ok(meta) = fs::symlink_metadata(host) else {
            continue;
        };
        let inside = root.join(p.trim_start_matches('/'));
        if meta.file_type().is_symlink() {
            let target = fs::read_link(host).map_err(io_err("read the link", host))?;
            match std::os::unix::fs::symlink(&target, &inside) {
                // A restored root has it already.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                made => made.map_err(io_err("recreate the link", &inside))?,
            }
        } else if meta.is_dir() {
            binds.push(host.to_path_buf());
        }
    }
    let masks = mask_root_only(upper, MASKED_TREES)?;
    for d in ["tmp", "root", "run", "home", "var/tmp"] {
        let d = root.join(d);
        fs::create_dir_all(&d).map_err(io_err("create", &d))?;
    }
    use std::os::unix::fs::PermissionsExt;
    for d in ["tmp", "var/tmp"] {
        let d = root.join(d);
        fs::set_permissions(&d, fs::Permissions::from_mode(0o1777))
            .map_err(io_err("make world-writable", &d))?;
    }
    Ok(Root {
        path: root,
        binds,
        masks,
    })
}

/// Host trees whose root-only entries are masked in a `host`-template
/// sandbox: where a host keeps its secrets (shadow, private keys, service
/// credentials). `/usr` and `/lib` hold the system's programs, readable by
/// everyone; scanning them at every create would cost about a second.
pub const MASKED_TREES: &[&str] = &["/etc"];

/// The stand-ins' names in the sandbox's tmpfs (beside its root).
const MASK_FILE: &str = ".masked-file";
const MASK_DIR: &str = ".masked-dir";

/// gVisor's sandbox root reads the host's files through runsc's gofer,
/// which runs as host root: where the process tier's sandbox root is an
/// unmapped uid to the host's root-only files (`/etc/shadow` 0640
/// root:shadow), gVisor's would read them. So every entry under `trees`
/// that others may not read (a file without o+r, a directory without o+r
/// or o+x) is covered by an empty file or directory made in `upper` (the
/// sandbox's tmpfs, gone with it): what an unprivileged reader sees of it
/// is what the sandbox sees. A directory masked is not descended.
fn mask_root_only(upper: &Path, trees: &[&str]) -> Result<Vec<(PathBuf, PathBuf)>, RootfsError> {
    use std::os::unix::fs::PermissionsExt;
    let (file, dir) = (upper.join(MASK_FILE), upper.join(MASK_DIR));
    fs::write(&file, b"").map_err(io_err("create", &file))?;
    fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
    for p in [&file, &dir] {
        fs::set_permissions(p, fs::Permissions::from_mode(0o000)).map_err(io_err("restrict", p))?;
    }
    let mut masks = Vec::new();
    let mut todo: Vec<PathBuf> = trees.iter().map(PathBuf::from).collect();
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            let mode = meta.permissions().mode();
            if meta.is_dir() {
                if mode & 0o005 != 0o005 {
                    masks.push((e.path(), dir.clone()));
                } else {
                    todo.push(e.path());
                }
            } else if meta.is_file() && mode & 0o004 == 0 {
                masks.push((e.path(), file.clone()));
            }
        }
    }
    masks.sort();
    Ok(masks)
}

/// Copy the writable layer of the sandbox in `dir` (its overlay's upper,
/// or the `host` template's root; not the overlay's work directory) to
/// `to`, for [`prepare`] to seed another sandbox's with: every file with
/// its owner, mode, times and extended attributes (overlay whiteouts and
/// opaque marks too). Only while the sandbox is stopped.
pub fn save_layer(dir: &Path, to: &Path) -> Result<(), RootfsError> {
    let upper = dir.join("upper");
    fs::create_dir_all(to).map_err(io_err("create", to))?;
    let entries = fs::read_dir(&upper).map_err(io_err("read", &upper))?;
    for e in entries.flatten() {
        // Not the overlay's work directory, nor the stand-ins of
        // `mask_root_only` (made again by the next prepare).
        let name = e.file_name();
        if name != "work" && name != MASK_FILE && name != MASK_DIR {
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
    }
    Ok(())
}

/// `cp -a` of `from` (a directory's contents) into `to`.
fn copy_tree(from: &Path, to: &Path) -> Result<(), RootfsError> {
    fs::create_dir_all(to).map_err(io_err("create", to))?;
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg("--no-target-directory")
        .arg(from)
        .arg(to)
        .output()
        .map_err(io_err("run cp -a to copy a writable layer", to))?;
    if !out.status.success() {
        return Err(RootfsError::Io {
            op: "copy a writable layer",
            path: to.to_path_buf(),
            source: io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        });
    }
    Ok(())
}

/// Unmount the overlay and the tmpfs of the sandbox in `dir` (lazily: a
/// gofer that has not exited yet keeps them busy). What is not mounted is
/// skipped.
pub fn unmount(dir: &Path) -> io::Result<()> {
    let mut first = None;
    for p in [dir.join("rootfs"), dir.join("upper")] {
        if let Err(e) = umount(&p) {
            if !matches!(e.raw_os_error(), Some(libc::EINVAL) | Some(libc::ENOENT)) {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other)
}

fn mount(
    source: &str,
    target: &Path,
    fstype: &str,
    flags: libc::c_ulong,
    data: &str,
) -> io::Result<()> {
    let (source, target, fstype, data) = (
        CString::new(source).map_err(io::Error::other)?,
        cstr(target)?,
        CString::new(fstype).map_err(io::Error::other)?,
        CString::new(data).map_err(io::Error::other)?,
    );
    // SAFETY: valid C strings that outlive the call; the result is checked.
    let r = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn umount(target: &Path) -> io::Result<()> {
    let target = cstr(target)?;
    // SAFETY: a valid C string; the result is checked.
    let r = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unresolved_template_is_refused_and_nothing_stays_mounted() {
        if !brig_test_support::root_or_skip() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let err = prepare(
            dir.path(),
            &TemplateRef::Named("base".into()),
            1 << 20,
            None,
        )
        .unwrap_err();
        assert!(matches!(err, RootfsError::Unresolved(_)), "{err}");
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(dir.path().to_str().unwrap()), "{mounts}");
    }
}
