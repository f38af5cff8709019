//! Turning a [`TemplateRef`] into what the bring-up mounts, and looking up
//! users in a template's `/etc/passwd`.
//!
//! The `host` template is a read-only view of exactly these host paths:
//! `/usr`, `/etc`, and `/bin`, `/sbin`, `/lib`, `/lib32`, `/lib64`,
//! `/libx32` (recreated as symlinks where the host has symlinks, as on
//! merged-/usr Debian, and bound read-only where they are directories).
//! Nothing else from the host is visible: not /root, /home, /var, /run, /srv,
//! /opt, /mnt, /media, /boot, nor brig's own state. Host files keep their
//! host ownership, which inside the sandbox is the unmapped `nobody`: so
//! files only root may read on the host (`/etc/shadow`) stay unreadable.
//!
//! A `dir:` template is the lower layer of an overlay. Its files are shown
//! through an idmapped mount, so the template's root-owned files belong to
//! the sandbox's root and package managers work; the template directory
//! itself is never written.

use std::fs;
use std::path::{Path, PathBuf};

use brig_core::{TemplateRef, UserSpec};

/// Host paths the `host` template shows, in mount order.
pub const HOST_PATHS: &[&str] = &[
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    #[error("user {name:?} does not exist in the template's /etc/passwd; use a numeric uid or a user the template defines")]
    UnknownUser { name: String },
    #[error("cannot read {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
}

/// One entry of the `host` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    /// Bind this host directory read-only at the same path.
    Bind(PathBuf),
    /// Recreate a symlink: (link path, target).
    Symlink(PathBuf, PathBuf),
}

/// A template resolved against the host filesystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    Host(Vec<HostEntry>),
    /// The lower layers of an overlay, top first: one for a `dir:`
    /// template, an image's layers for an image.
    Overlay {
        lowers: Vec<PathBuf>,
    },
}

impl Layout {
    pub fn resolve(t: &TemplateRef) -> Self {
        match t {
            TemplateRef::Host => Layout::Host(host_entries(Path::new("/"))),
            TemplateRef::Dir(p) => Layout::Overlay {
                lowers: vec![p.clone()],
            },
            TemplateRef::Layers { lowers, .. } => Layout::Overlay {
                lowers: lowers.clone(),
            },
            // Refused by `SandboxSpec::validate` before anything is
            // resolved; an overlay on a path that cannot exist fails too.
            TemplateRef::Named(_) | TemplateRef::Image(_) => Layout::Overlay {
                lowers: vec![PathBuf::new()],
            },
        }
    }

    /// The template's root as seen from the host, for reading its
    /// `/etc/passwd` before the sandbox exists: of an image's layers, the
    /// topmost that has one.
    pub fn root_on_host(&self) -> &Path {
        match self {
            Layout::Host(_) => Path::new("/"),
            Layout::Overlay { lowers } => lowers
                .iter()
                .find(|l| l.join("etc/passwd").exists())
                .or(lowers.first())
                .map_or(Path::new("/nonexistent"), PathBuf::as_path),
        }
    }
}

/// Which of [`HOST_PATHS`] exist under `root`, and how to show each.
pub fn host_entries(root: &Path) -> Vec<HostEntry> {
    HOST_PATHS
        .iter()
        .filter_map(|p| {
            let on_host = root.join(p.trim_start_matches('/'));
            let meta = fs::symlink_metadata(&on_host).ok()?;
            if meta.file_type().is_symlink() {
                Some(HostEntry::Symlink(
                    PathBuf::from(p),
                    fs::read_link(&on_host).ok()?,
                ))
            } else if meta.is_dir() {
                Some(HostEntry::Bind(PathBuf::from(p)))
            } else {
                None
            }
        })
        .collect()
}

/// The identity a command runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
    pub name: Option<String>,
}

impl Identity {
    pub fn root() -> Self {
        Identity {
            uid: 0,
            gid: 0,
            groups: vec![0],
            home: "/root".into(),
            name: Some("root".into()),
        }
    }
}

/// Resolve a [`UserSpec`] against the template rooted at `root` (on the
/// host). Numeric ids need no passwd entry; names do.
pub fn resolve_user(root: &Path, user: Option<&UserSpec>) -> Result<Identity, TemplateError> {
    let passwd = read_etc(root, "passwd")?;
    let group = read_etc(root, "group")?;
    let entries: Vec<PasswdEntry> = passwd.lines().filter_map(PasswdEntry::parse).collect();
    let found = match user {
        None => {
            return Ok(entries
                .iter()
                .find(|e| e.uid == 0)
                .map(|e| e.identity(&group))
                .unwrap_or_else(Identity::root))
        }
        Some(UserSpec::Name(name)) => entries
            .iter()
            .find(|e| &e.name == name)
            .ok_or_else(|| TemplateError::UnknownUser { name: name.clone() })?,
        Some(UserSpec::Id { uid, gid }) => match entries.iter().find(|e| e.uid == *uid) {
            Some(e) => {
                let mut id = e.identity(&group);
                if let Some(g) = gid {
                    id.gid = *g;
                    id.groups = vec![*g];
                }
                return Ok(id);
            }
            None => {
                let g = gid.unwrap_or(*uid);
                return Ok(Identity {
                    uid: *uid,
                    gid: g,
                    groups: vec![g],
                    home: "/".into(),
                    name: None,
                });
            }
        },
    };
    Ok(found.identity(&group))
}

fn read_etc(root: &Path, name: &str) -> Result<String, TemplateError> {
    let path = root.join("etc").join(name);
    match fs::read_to_string(&path) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(TemplateError::Unreadable {
            path,
            reason: e.to_string(),
        }),
    }
}

#[derive(Debug)]
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

impl PasswdEntry {
    fn parse(line: &str) -> Option<Self> {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 {
            return None;
        }
        Some(PasswdEntry {
            name: f[0].into(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5].into(),
        })
    }

    fn identity(&self, group_file: &str) -> Identity {
        let mut groups = vec![self.gid];
        for line in group_file.lines() {
            let f: Vec<&str> = line.split(':').collect();
            if f.len() >= 4 && f[3].split(',').any(|m| m == self.name) {
                if let Ok(g) = f[2].parse() {
                    if !groups.contains(&g) {
                        groups.push(g);
                    }
                }
            }
        }
        Identity {
            uid: self.uid,
            gid: self.gid,
            groups,
            home: self.home.clone(),
            name: Some(self.name.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootfs() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("etc")).unwrap();
        fs::write(
            t.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\nbroken line\n",
        )
        .unwrap();
        fs::write(
            t.path().join("etc/group"),
            "root:x:0:\nsudo:x:27:user\nuser:x:1000:\n",
        )
        .unwrap();
        t
    }

    #[test]
    fn names_resolve_with_supplementary_groups() {
        let t = rootfs();
        let id = resolve_user(t.path(), Some(&UserSpec::Name("user".into()))).unwrap();
        assert_eq!(
            (id.uid, id.gid, id.groups.clone(), id.home.as_str()),
            (1000, 1000, vec![1000, 27], "/home/user")
        );
        assert_eq!(resolve_user(t.path(), None).unwrap().home, "/root");
    }

    #[test]
    fn unknown_names_are_errors_but_numeric_ids_are_fine() {
        let t = rootfs();
        assert_eq!(
            resolve_user(t.path(), Some(&UserSpec::Name("ghost".into()))),
            Err(TemplateError::UnknownUser {
                name: "ghost".into()
            })
        );
        let id = resolve_user(
            t.path(),
            Some(&UserSpec::Id {
                uid: 4242,
                gid: None,
            }),
        )
        .unwrap();
        assert_eq!((id.uid, id.gid, id.home.as_str()), (4242, 4242, "/"));
    }

    #[test]
    fn host_entries_mirror_symlinks_and_dirs() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("usr/bin")).unwrap();
        fs::create_dir_all(t.path().join("etc")).unwrap();
        std::os::unix::fs::symlink("usr/bin", t.path().join("bin")).unwrap();
        fs::create_dir_all(t.path().join("root")).unwrap();
        let e = host_entries(t.path());
        assert_eq!(
            e,
            vec![
                HostEntry::Bind("/usr".into()),
                HostEntry::Bind("/etc".into()),
                HostEntry::Symlink("/bin".into(), "usr/bin".into()),
            ]
        );
    }
}
