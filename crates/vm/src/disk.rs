//! A guest's two disks.
//!
//! - The template's **read-only image**: an ext4 file system made from the
//!   template's directory (or its layers, seen through a read-only overlay)
//!   by `mkfs.ext4 -d`, once per template, kept in brig's state and shared
//!   by every guest of that template (QEMU opens it read-only). ext4
//!   because Debian's cloud kernel has it built in.
//! - The sandbox's **writable disk**: a sparse file of the `--disk` size
//!   with an empty ext4 on it, in `$BRIG_HOME/vm/disks`. The guest puts
//!   it over the template as an overlay, so what the sandbox writes is
//!   bounded by `--disk` and goes when the sandbox does.
//!
//! ```text
//! $BRIG_HOME/vm/images/<key>.ext4   a template's image; <key> names the
//!                                   template (its path and identity)
//! ```

use std::ffi::CString;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use brig_core::TemplateRef;

/// The smallest writable disk brig makes (ext4 needs room for its own
/// metadata).
pub const MIN_DISK: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mkfs.ext4 failed for {path}: {output}")]
    Mkfs { path: PathBuf, output: String },
    #[error(
        "the vm tier cannot run the {0} template: a guest needs a root file system of its \
         own, not a view of the host (use --template base, an image, or dir:PATH)"
    )]
    Unsupported(String),
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> DiskError + 'a {
    move |source| DiskError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The template's image in `images` (`$BRIG_HOME/vm/images`), made first
/// if there is none.
pub fn template_image(images: &Path, template: &TemplateRef) -> Result<PathBuf, DiskError> {
    let lowers: Vec<PathBuf> = match template {
        TemplateRef::Dir(d) => vec![d.clone()],
        TemplateRef::Layers { lowers, .. } => lowers.clone(),
        other => return Err(DiskError::Unsupported(other.to_string())),
    };
    let image = images.join(format!("{}.ext4", key(&lowers)?));
    if image.is_file() {
        return Ok(image);
    }
    fs::create_dir_all(images).map_err(io_err("create", images))?;
    let tmp = images.join(format!(".{}.{}", key(&lowers)?, std::process::id()));
    let made = if let [dir] = lowers.as_slice() {
        mkfs(&tmp, Some(dir), size_for(dir)?)
    } else {
        // Layers, top first: their union is what the guest should see.
        let view = images.join(format!(".view.{}", std::process::id()));
        fs::create_dir_all(&view).map_err(io_err("create", &view))?;
        let made = mount_view(&view, &lowers).and_then(|()| {
            let made = size_for(&view).and_then(|size| mkfs(&tmp, Some(&view), size));
            unmount(&view);
            made
        });
        let _ = fs::remove_dir(&view);
        made
    };
    if let Err(e) = made {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, &image).map_err(io_err("keep the image at", &image))?;
    Ok(image)
}

/// A name for the template: its layers' paths, and for each its inode and
/// change time (a directory replaced at the same path gets a new image).
fn key(lowers: &[PathBuf]) -> Result<String, DiskError> {
    let mut h = std::hash::DefaultHasher::new();
    for l in lowers {
        let m = fs::metadata(l).map_err(io_err("read", l))?;
        l.hash(&mut h);
        (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()).hash(&mut h);
    }
    Ok(format!("{:016x}", h.finish()))
}

/// Room for the files under `dir` (their blocks, an inode each) with a
/// margin for ext4's own metadata.
fn size_for(dir: &Path) -> Result<u64, DiskError> {
    let mut bytes = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(io_err("list", &d))?.flatten() {
            let Ok(m) = e.metadata() else { continue };
            bytes += m.blocks() * 512 + 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(bytes + bytes / 5 + (32 << 20))
}

/// An ext4 file system of `size` bytes in a new sparse file `path`, with
/// `from`'s files if given. No journal: the template's image is never
/// written, a writable disk dies with its sandbox.
pub fn mkfs(path: &Path, from: Option<&Path>, size: u64) -> Result<(), DiskError> {
    let file = fs::File::create(path).map_err(io_err("create", path))?;
    file.set_len(size).map_err(io_err("size", path))?;
    drop(file);
    let mut cmd = Command::new("mkfs.ext4");
    cmd.args(["-q", "-F", "-O", "^has_journal", "-b", "4096", "-m", "0"])
        .args(["-E", "root_owner=0:0,lazy_itable_init=1,nodiscard"]);
    if let Some(dir) = from {
        cmd.arg("-d").arg(dir);
    }
    cmd.arg(path);
    let out = cmd.output().map_err(io_err("run mkfs.ext4 for", path))?;
    if !out.status.success() {
        return Err(DiskError::Mkfs {
            path: path.to_path_buf(),
            output: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// The sandbox's writable disk: `size` bytes (at least [`MIN_DISK`]).
pub fn writable(path: &Path, size: u64) -> Result<(), DiskError> {
    mkfs(path, None, size.max(MIN_DISK))
}

/// Copy a guest's RAM `from` (its memory file, the machine stopped) to a
/// new file `to` that its forks map: only the pages that hold something
/// are written, so a page the guest never touched or left zeroed is a
/// hole (read back as zeros). Readable by all: the forks' QEMUs open it
/// as uids of their own, handed it as a descriptor (the directory it is
/// in keeps it from anyone else).
pub fn copy_memory(from: &Path, to: &Path) -> Result<u64, DiskError> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
    const PAGE: usize = 4096;
    const CHUNK: usize = 1 << 20;
    let src = fs::File::open(from).map_err(io_err("open", from))?;
    let len = src.metadata().map_err(io_err("read", from))?.len();
    let dst = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(to)
        .map_err(io_err("create", to))?;
    dst.set_permissions(fs::Permissions::from_mode(0o644))
        .and_then(|()| dst.set_len(len))
        .map_err(io_err("size", to))?;
    let mut buf = vec![0u8; CHUNK];
    let mut written = 0;
    for (start, end) in data_ranges(&src, len).map_err(io_err("read", from))? {
        let mut at = start;
        while at < end {
            let n = ((end - at) as usize).min(CHUNK);
            src.read_exact_at(&mut buf[..n], at)
                .map_err(io_err("read", from))?;
            // Runs of pages that are not all zeros, each one write.
            let mut page = 0;
            while page < n {
                let zero = |p: usize| buf[p..(p + PAGE).min(n)].iter().all(|b| *b == 0);
                if zero(page) {
                    page += PAGE;
                    continue;
                }
                let run = page;
                while page < n && !zero(page) {
                    page += PAGE;
                }
                let run_end = page.min(n);
                dst.write_all_at(&buf[run..run_end], at + run as u64)
                    .map_err(io_err("write", to))?;
                written += (run_end - run) as u64;
            }
            at += n as u64;
        }
    }
    dst.sync_all().map_err(io_err("write", to))?;
    Ok(written)
}

/// The ranges of `file` (of `len` bytes) that hold data, holes skipped.
fn data_ranges(file: &fs::File, len: u64) -> io::Result<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let mut ranges = Vec::new();
    let mut at: i64 = 0;
    while (at as u64) < len {
        // SAFETY: lseek on a descriptor we hold.
        let data = unsafe { libc::lseek(file.as_raw_fd(), at, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // holes to the end
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(file.as_raw_fd(), data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        ranges.push((data as u64, (hole as u64).min(len)));
        at = hole;
    }
    Ok(ranges)
}

/// Copy the disk `from` to a new file `to`, holes kept: only the blocks
/// written are read and written (a snapshot's disk, a restore's).
pub fn copy_sparse(from: &Path, to: &Path) -> Result<(), DiskError> {
    use std::os::fd::AsRawFd;
    let src = fs::File::open(from).map_err(io_err("open", from))?;
    let len = src.metadata().map_err(io_err("read", from))?.len();
    let dst = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(io_err("create", to))?;
    dst.set_len(len).map_err(io_err("size", to))?;
    for (data, hole) in data_ranges(&src, len).map_err(io_err("read", from))? {
        let (mut off_in, mut off_out) = (data as i64, data as i64);
        while off_in < hole as i64 {
            // SAFETY: copy_file_range between descriptors we hold, with
            // offsets it advances.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    dst.as_raw_fd(),
                    &mut off_out,
                    (hole as i64 - off_in) as usize,
                    0,
                )
            };
            if n < 0 {
                return Err(io_err("copy to", to)(io::Error::last_os_error()));
            }
            if n == 0 {
                break;
            }
        }
    }
    Ok(())
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap_or_default()
}

/// A read-only overlay of `lowers` (top first) at `at`.
fn mount_view(at: &Path, lowers: &[PathBuf]) -> Result<(), DiskError> {
    let dirs: Vec<String> = lowers.iter().map(|l| l.display().to_string()).collect();
    let data = CString::new(format!("lowerdir={}", dirs.join(":"))).unwrap_or_default();
    let target = cstr(at);
    // SAFETY: NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"overlay".as_ptr(),
            target.as_ptr(),
            c"overlay".as_ptr(),
            libc::MS_RDONLY,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(DiskError::Io {
            op: "mount the template's layers at",
            path: at.to_path_buf(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn unmount(at: &Path) {
    let target = cstr(at);
    // SAFETY: a NUL-terminated path that outlives the call.
    unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparse_copy_keeps_the_data_and_the_holes() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let (from, to) = (dir.path().join("a"), dir.path().join("b"));
        let f = fs::File::create(&from).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(&[7u8; 8192], 32 << 20).unwrap();
        f.write_all_at(b"tail", (64 << 20) - 4).unwrap();
        drop(f);
        copy_sparse(&from, &to).unwrap();
        let (a, b) = (fs::read(&from).unwrap(), fs::read(&to).unwrap());
        assert!(a == b, "the same bytes");
        let blocks = fs::metadata(&to).unwrap().blocks() * 512;
        assert!(blocks < 1 << 20, "holes kept: {blocks} bytes allocated");
        // Never over an existing file.
        assert!(copy_sparse(&from, &to).is_err());
    }

    #[test]
    fn the_host_template_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let e = template_image(dir.path(), &TemplateRef::Host).unwrap_err();
        assert!(e.to_string().contains("root file system of its own"), "{e}");
    }

    #[test]
    fn an_image_is_made_once_per_template_and_holds_its_files() {
        let dir = tempfile::tempdir().unwrap();
        let tpl = dir.path().join("tpl");
        fs::create_dir_all(tpl.join("etc")).unwrap();
        fs::write(tpl.join("etc/hello"), "from the template").unwrap();
        let images = dir.path().join("images");
        let t = TemplateRef::Dir(tpl.clone());
        let image = match template_image(&images, &t) {
            Err(DiskError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                eprintln!("skipped: no mkfs.ext4 (apt-get install e2fsprogs)");
                return;
            }
            r => r.unwrap(),
        };
        let made = fs::metadata(&image).unwrap().modified().unwrap();
        assert_eq!(template_image(&images, &t).unwrap(), image);
        assert_eq!(fs::metadata(&image).unwrap().modified().unwrap(), made);
        // debugfs reads the file back out of the image.
        let out = Command::new("debugfs")
            .args(["-R", "cat /etc/hello"])
            .arg(&image)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "from the template");
        // Another directory is another image.
        let other = dir.path().join("other");
        fs::create_dir_all(&other).unwrap();
        assert_ne!(
            template_image(&images, &TemplateRef::Dir(other)).unwrap(),
            image
        );
    }
}
