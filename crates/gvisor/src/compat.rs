//! What gvisor sandboxes need to run everyday programs on the runsc this
//! host has: a `statx` that drops `AT_NO_AUTOMOUNT`, which gVisor builds
//! before 2023 (Debian 12's) refuse — and coreutils 9 (`ls -l`, `stat`,
//! `cp -a`, `du`) passes it on every call (`statx_compat.c`). The tier
//! installs it beside its agent, binds it read-only into each sandbox and
//! names it in the sandbox's `/etc/ld.so.preload` (its own lines kept).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::rootfs::Root;

/// The shared object, built from `statx_compat.c` by build.rs.
pub const STATX_SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/brig-statx.so"));

/// Where sandboxes see it: readable by every user (the agent's directory,
/// 0700, is root's alone; a user's programs could not load it there).
pub const STATX_SHIM_INSIDE: &str = "/run/brig-statx.so";

/// The preload's files of one sandbox, on the host.
#[derive(Debug, Clone)]
pub struct Compat {
    /// The shim, bound read-only at [`STATX_SHIM_INSIDE`].
    pub shim: PathBuf,
    /// Its `/etc/ld.so.preload`, bound read-only there.
    pub preload: PathBuf,
}

/// Write the shim and the `/etc/ld.so.preload` of the sandbox in `dir`
/// (whose root [`crate::rootfs::prepare`] made) into `dir/upper/compat`:
/// on the sandbox's own tmpfs (runsc maps shared objects from the host
/// file, which `/run/brig`'s noexec would refuse), beside its writable
/// layer, not in it.
pub fn install(dir: &Path, root: &Root) -> io::Result<Compat> {
    let compat = dir.join("upper").join("compat");
    fs::create_dir_all(&compat)?;
    let shim = compat.join("statx.so");
    fs::write(&shim, STATX_SHIM)?;
    fs::set_permissions(&shim, fs::Permissions::from_mode(0o555))?;
    // The host template's /etc is the host's.
    let etc_root = if root.binds.iter().any(|b| b == Path::new("/etc")) {
        Path::new("/")
    } else {
        root.path.as_path()
    };
    let preload = compat.join("ld.so.preload");
    fs::write(&preload, preload_for(etc_root))?;
    fs::set_permissions(&preload, fs::Permissions::from_mode(0o444))?;
    Ok(Compat { shim, preload })
}

/// The `/etc/ld.so.preload` a sandbox whose root is `root` (on the host)
/// gets: the shim, then what the template's own file names.
pub fn preload_for(root: &Path) -> String {
    let own = fs::read_to_string(root.join("etc/ld.so.preload")).unwrap_or_default();
    let mut text = format!("{STATX_SHIM_INSIDE}\n");
    for line in own.lines().filter(|l| l.trim() != STATX_SHIM_INSIDE) {
        text.push_str(line);
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shim_is_a_shared_object() {
        assert_eq!(&STATX_SHIM[..4], b"\x7fELF");
        // e_type ET_DYN
        assert_eq!(STATX_SHIM[16], 3);
    }

    #[test]
    fn a_template_s_own_preloads_are_kept_after_the_shim() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(preload_for(dir.path()), format!("{STATX_SHIM_INSIDE}\n"));
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        fs::write(
            dir.path().join("etc/ld.so.preload"),
            format!("/usr/lib/libfoo.so\n{STATX_SHIM_INSIDE}\n"),
        )
        .unwrap();
        assert_eq!(
            preload_for(dir.path()),
            format!("{STATX_SHIM_INSIDE}\n/usr/lib/libfoo.so\n")
        );
    }
}
