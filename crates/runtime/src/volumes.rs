//! Volumes: persistent filesystems a tenant mounts into its sandboxes.
//!
//! A volume is one ext4 image file, `$BRIG_HOME/volumes/<id>.img`, made
//! at its full size with `fallocate` (so a volume never fills the host's
//! disk later: the space is the volume's from the start) and formatted
//! with `mkfs.ext4`. Its size is its quota, enforced by the kernel: a
//! write past it fails with ENOSPC, inside a sandbox as through the
//! content API.
//!
//! While something uses it — a live sandbox that mounts it, a content
//! request, a create starting — the image is loop-mounted on the host at
//! `$BRIG_HOME/volumes/mnt/<id>` (one mount per volume: `mount -o loop`
//! reuses the loop device a file already has, so two mounts never write
//! one image through two filesystems). A sandbox gets a copy of that
//! mount, idmapped through its user namespace (brig-jail), so files are
//! stored under the ids the sandbox sees: uid 1000 inside is 1000 on
//! disk, in every sandbox and through the content API. The sweeper
//! unmounts what nothing uses any more; the loop device goes with the
//! last mount of its filesystem (autoclear), in the host's namespace or
//! a sandbox's, so a sandbox that outlives the daemon keeps its volume.
//!
//! Records (id, name, size, the content API's token) are per tenant in
//! the `volumes` table; names are unique per tenant.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use brig_core::volume as rules;
use brig_core::{Isolation, VolumeAccess, VolumeMount};
use rusqlite::OptionalExtension;

use crate::manager::{lock, ManagerError, SandboxManager};
use crate::store::Cached;
use crate::store::{Store, StoreError, UnixMillis};
use crate::TenantId;

/// A volume's size when a create names none (`brig serve --volume-size`).
pub const DEFAULT_SIZE: u64 = 1 << 30;
/// The smallest volume: ext4's own structures need a few MiB.
pub const MIN_SIZE: u64 = 16 << 20;
/// The largest volume.
pub const MAX_SIZE: u64 = 1 << 40;

/// The most volumes one tenant keeps.
pub const MAX_PER_TENANT: usize = 100;

/// The record attribute that lists a sandbox's volumes.
pub const ATTR: &str = "volumes";

/// What is known of a volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VolumeInfo {
    /// `vol-` and 20 lowercase letters and digits.
    pub id: String,
    pub name: String,
    /// Its quota: the size of its filesystem.
    pub size_bytes: u64,
    pub created_at: UnixMillis,
    /// The bearer token of its content API (E2B's), shown to its tenant.
    #[serde(skip)]
    pub token: String,
    /// A vm sandbox's kernel has had it: only vm sandboxes may use it
    /// ([`SandboxManager::take_alone`]).
    #[serde(default)]
    pub vm_only: bool,
}

/// A create's request to mount a volume (by id or name) at `path`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeRequest {
    pub volume: String,
    pub path: String,
}

/// A volume as a sandbox's record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MountedVolume {
    pub id: String,
    pub name: String,
    pub path: String,
}

/// The volumes a sandbox record mounts.
pub fn mounted(attrs: &serde_json::Map<String, serde_json::Value>) -> Vec<MountedVolume> {
    attrs
        .get(ATTR)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// Content requests and creates using a volume now, by volume id: the
/// sweeper leaves their mounts alone.
#[derive(Debug, Default)]
pub(crate) struct InUse {
    users: HashMap<String, usize>,
}

/// A hold on volumes' host mounts: they stay mounted while it lives.
#[derive(Debug)]
pub struct VolumeHold<'a> {
    manager: &'a SandboxManager,
    ids: Vec<String>,
    /// Guest marks this hold made ([`guest_mark`]), for
    /// [`VolumeHold::never_started`].
    marked: Vec<PathBuf>,
}

impl VolumeHold<'_> {
    /// The launch failed before any guest could run (the tier refused it
    /// as invalid): the volumes it would have had alone are not a guest's
    /// after all.
    pub(crate) fn never_started(&self) {
        for mark in &self.marked {
            let _ = fs::remove_file(mark);
        }
    }
}

impl Drop for VolumeHold<'_> {
    fn drop(&mut self) {
        let mut in_use = lock(&self.manager.volumes_in_use);
        for id in &self.ids {
            if let Some(n) = in_use.users.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    in_use.users.remove(id);
                }
            }
        }
    }
}

fn io_err(op: &'static str) -> impl FnOnce(std::io::Error) -> ManagerError {
    move |source| ManagerError::Io { op, source }
}

impl SandboxManager {
    fn volumes_dir(&self) -> Result<PathBuf, ManagerError> {
        self.config()
            .home
            .as_ref()
            .map(|h| h.join("volumes"))
            .ok_or_else(|| ManagerError::BadRequest {
                reason: "volumes need a home directory: this daemon has none".into(),
            })
    }

    /// Create `tenant`'s volume `name` of `size` bytes (the daemon's
    /// default if `None`).
    pub fn create_volume(
        &self,
        tenant: &TenantId,
        name: &str,
        size: Option<u64>,
    ) -> Result<VolumeInfo, ManagerError> {
        rules::check_name(name).map_err(bad)?;
        let size = size.unwrap_or(self.config().volume_size);
        if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
            return Err(ManagerError::BadRequest {
                reason: format!(
                    "volume size {size} bytes: a volume is {} to {} (e.g. --size 2GiB)",
                    brig_core::ByteSize(MIN_SIZE),
                    brig_core::ByteSize(MAX_SIZE)
                ),
            });
        }
        let dir = self.volumes_dir()?;
        if self.store().list_volumes(Some(tenant))?.len() >= MAX_PER_TENANT {
            return Err(ManagerError::BadRequest {
                reason: format!(
                    "you have {MAX_PER_TENANT} volumes, the most a tenant keeps: remove one first"
                ),
            });
        }
        fs::create_dir_all(&dir).map_err(io_err("create the volumes directory"))?;
        let info = VolumeInfo {
            id: format!("vol-{}", crate::store::random_alnum(20)),
            name: name.to_string(),
            size_bytes: size,
            created_at: self.store().now(),
            token: format!("brigvol_{}", crate::store::random_alnum(40)),
            vm_only: false,
        };
        // The record first: a crash from here on leaves an image reconcile
        // can name (and one without a record is removed at start).
        self.store().insert_volume(tenant, &info)?;
        if let Err(e) = make_image(&image_path(&dir, &info.id), size) {
            let _ = self.store().delete_volume(&info.id);
            let _ = fs::remove_file(image_path(&dir, &info.id));
            return Err(e);
        }
        tracing::info!("volume {} ({}): created, {size} bytes", info.id, info.name);
        Ok(info)
    }

    /// `tenant`'s volumes, oldest first.
    pub fn volumes(&self, tenant: &TenantId) -> Result<Vec<VolumeInfo>, ManagerError> {
        let mut all = self.store().list_volumes(Some(tenant))?;
        for v in &mut all {
            self.mark_vm_only(v);
        }
        Ok(all)
    }

    /// `tenant`'s volume `key` (its id or name).
    pub fn volume(&self, tenant: &TenantId, key: &str) -> Result<VolumeInfo, ManagerError> {
        let mut info =
            self.store()
                .find_volume(tenant, key)?
                .ok_or_else(|| ManagerError::VolumeNotFound {
                    volume: key.to_string(),
                })?;
        self.mark_vm_only(&mut info);
        Ok(info)
    }

    fn mark_vm_only(&self, info: &mut VolumeInfo) {
        info.vm_only = self
            .volumes_dir()
            .is_ok_and(|dir| guest_mark(&dir, &info.id).exists());
    }

    /// The volume `id` whose content token is `token`, with its tenant.
    pub fn volume_by_token(
        &self,
        id: &str,
        token: &str,
    ) -> Result<Option<(TenantId, VolumeInfo)>, ManagerError> {
        Ok(self.store().volume_by_token(id, token)?)
    }

    /// Remove `tenant`'s volume `key` and its data. Refused while a live
    /// sandbox mounts it or a content request uses it.
    pub fn delete_volume(&self, tenant: &TenantId, key: &str) -> Result<VolumeInfo, ManagerError> {
        let info = self.volume(tenant, key)?;
        let dir = self.volumes_dir()?;
        // Under the in-use lock: no create or content request can start
        // using it between the check and the removal.
        let in_use = lock(&self.volumes_in_use);
        let users = self.volume_users()?;
        if let Some(sandboxes) = users.get(&info.id) {
            return Err(ManagerError::VolumeInUse {
                volume: info.name.clone(),
                sandboxes: sandboxes.iter().cloned().collect(),
            });
        }
        if in_use.users.contains_key(&info.id) {
            return Err(ManagerError::VolumeInUse {
                volume: info.name.clone(),
                sandboxes: Vec::new(),
            });
        }
        unmount(&mount_path(&dir, &info.id))?;
        self.store().delete_volume(&info.id)?;
        fs::remove_file(image_path(&dir, &info.id))
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .map_err(io_err("remove the volume's image"))?;
        let _ = fs::remove_file(guest_mark(&dir, &info.id));
        tracing::info!("volume {} ({}): removed", info.id, info.name);
        Ok(info)
    }

    /// The volumes a create asks for, each `tenant`'s and each path valid:
    /// a bad path or an unknown volume is the client's error, naming which.
    pub fn resolve_volumes(
        &self,
        tenant: &TenantId,
        requests: &[VolumeRequest],
    ) -> Result<Vec<MountedVolume>, ManagerError> {
        rules::check_paths(requests.iter().map(|r| r.path.as_str())).map_err(bad)?;
        requests
            .iter()
            .map(|r| {
                // The create is what is not found: its request is wrong.
                let info = self.volume(tenant, &r.volume).map_err(|e| match e {
                    ManagerError::VolumeNotFound { .. } => ManagerError::BadRequest {
                        reason: e.to_string(),
                    },
                    e => e,
                })?;
                Ok(MountedVolume {
                    id: info.id,
                    name: info.name,
                    path: r.path.clone(),
                })
            })
            .collect()
    }

    /// Mount `volumes` on the host (if they are not) and keep them mounted
    /// while the hold lives; what a tier needs to mount them in a sandbox.
    pub(crate) fn hold_volumes(
        &self,
        isolation: Isolation,
        volumes: &[MountedVolume],
    ) -> Result<(VolumeHold<'_>, Vec<VolumeMount>), ManagerError> {
        if volumes.is_empty() {
            return Ok((
                VolumeHold {
                    manager: self,
                    ids: Vec::new(),
                    marked: Vec::new(),
                },
                Vec::new(),
            ));
        }
        let access = self.tier(isolation)?.volume_access();
        if access == VolumeAccess::None {
            let offer: Vec<String> = self
                .tiers()
                .into_iter()
                .filter(|&t| {
                    self.tier(t)
                        .is_ok_and(|t| t.volume_access() != VolumeAccess::None)
                })
                .map(|t| t.to_string())
                .collect();
            return Err(ManagerError::BadRequest {
                reason: format!(
                    "the {isolation} tier cannot mount volumes: create the sandbox with \
                     isolation {}, or without volumes",
                    offer.join(" or ")
                ),
            });
        }
        let ids: Vec<String> = volumes.iter().map(|v| v.id.clone()).collect();
        let (mounts, marked) = match access {
            VolumeAccess::Exclusive => self.take_alone(volumes)?,
            _ => (self.hold_ids(&ids)?, Vec::new()),
        };
        let hold = VolumeHold {
            manager: self,
            ids,
            marked,
        };
        let mounts = volumes
            .iter()
            .zip(mounts)
            .map(|(v, source)| VolumeMount {
                name: v.name.clone(),
                source,
                path: v.path.clone(),
            })
            .collect();
        Ok((hold, mounts))
    }

    /// One volume's host mount, held: for the content API.
    pub fn hold_volume(
        &self,
        info: &VolumeInfo,
    ) -> Result<(VolumeHold<'_>, PathBuf), ManagerError> {
        let ids = vec![info.id.clone()];
        let mut mounts = self.hold_ids(&ids)?;
        let hold = VolumeHold {
            manager: self,
            ids,
            marked: Vec::new(),
        };
        Ok((hold, mounts.remove(0)))
    }

    fn hold_ids(&self, ids: &[String]) -> Result<Vec<PathBuf>, ManagerError> {
        let dir = self.volumes_dir()?;
        let mut in_use = lock(&self.volumes_in_use);
        // Not one a vm guest's kernel has (or has had: `take_alone` marks
        // it before the guest starts): two kernels never write one file
        // system, and the host's never parses one a guest could have
        // shaped to attack it.
        if let Some(id) = ids.iter().find(|id| guest_mark(&dir, id).exists()) {
            return Err(ManagerError::VolumeExclusive {
                volume: self.volume_name(id),
                reason: "was mounted by a vm sandbox's kernel, which could have shaped its file \
                         system to attack the host's: the host does not mount it again, so only \
                         vm sandboxes may use it (copy its files out through one, or delete it to \
                         start over)"
                    .into(),
            });
        }
        let mut mounts = Vec::new();
        for id in ids {
            let mnt = mount_path(&dir, id);
            mount(&image_path(&dir, id), &mnt)?;
            mounts.push(mnt);
        }
        for id in ids {
            *in_use.users.entry(id.clone()).or_default() += 1;
        }
        Ok(mounts)
    }

    /// `volumes` for a tier whose guest kernel mounts them
    /// ([`VolumeAccess::Exclusive`]): each used by nothing else (no live
    /// sandbox, no create or content request), its host mount undone and
    /// no loop device left on its image; their image files, and the guest
    /// marks made now. They count as in use from here (the hold), and by
    /// the sandbox's record after.
    fn take_alone(
        &self,
        volumes: &[MountedVolume],
    ) -> Result<(Vec<PathBuf>, Vec<PathBuf>), ManagerError> {
        let dir = self.volumes_dir()?;
        let mut in_use = lock(&self.volumes_in_use);
        let users = self.volume_users()?;
        let mut images = Vec::new();
        for v in volumes {
            let sandboxes: Vec<&str> = users
                .get(&v.id)
                .into_iter()
                .flatten()
                .map(String::as_str)
                .collect();
            let reason = if !sandboxes.is_empty() {
                Some(format!("is in use by sandbox {}", sandboxes.join(", ")))
            } else if in_use.users.contains_key(&v.id) {
                Some("is in use by a create or a content request now".to_string())
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(ManagerError::VolumeExclusive {
                    volume: v.name.clone(),
                    reason: format!(
                        "{reason}: a vm sandbox's kernel mounts a volume alone (two kernels \
                         writing one file system would corrupt it); end them first, or create \
                         this sandbox on the process or gvisor tier, which share volumes"
                    ),
                });
            }
            unmount(&mount_path(&dir, &v.id))?;
            let image = image_path(&dir, &v.id);
            if loop_device_of(&image) {
                return Err(ManagerError::VolumeExclusive {
                    volume: v.name.clone(),
                    reason: "is still mounted on the host (by a sandbox that has just ended): \
                             try again in a moment"
                        .into(),
                });
            }
            images.push(image);
        }
        let mut marked = Vec::new();
        for v in volumes {
            // From now on a guest's kernel writes its blocks as it likes.
            let mark = guest_mark(&dir, &v.id);
            if !mark.exists() {
                fs::write(&mark, b"").map_err(io_err("mark the volume as a guest's"))?;
                marked.push(mark);
            }
            *in_use.users.entry(v.id.clone()).or_default() += 1;
        }
        Ok((images, marked))
    }

    fn volume_name(&self, id: &str) -> String {
        self.store()
            .list_volumes(None)
            .ok()
            .and_then(|all| all.into_iter().find(|v| v.id == id).map(|v| v.name))
            .unwrap_or_else(|| id.to_string())
    }

    /// Live sandboxes by the volumes they mount.
    fn volume_users(&self) -> Result<HashMap<String, BTreeSet<String>>, ManagerError> {
        let mut users: HashMap<String, BTreeSet<String>> = HashMap::new();
        for record in self.store().live_sandboxes()? {
            for v in mounted(&record.attrs) {
                users.entry(v.id).or_default().insert(record.id.to_string());
            }
        }
        Ok(users)
    }

    /// Unmount the host mounts of volumes nothing uses (the sweeper's,
    /// every pass, and reconcile's at start). A sandbox that still has a
    /// copy keeps its filesystem: the kernel frees it with its last mount.
    pub fn release_volumes(&self) {
        let Ok(dir) = self.volumes_dir() else {
            return;
        };
        let Ok(entries) = fs::read_dir(dir.join("mnt")) else {
            return;
        };
        let in_use = lock(&self.volumes_in_use);
        let users = match self.volume_users() {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!("cannot tell which volumes are in use: {e}");
                return;
            }
        };
        for entry in entries.flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            if users.contains_key(&id) || in_use.users.contains_key(&id) {
                continue;
            }
            if let Err(e) = unmount(&entry.path()) {
                tracing::warn!("volume {id}: {}", crate::chain(&e));
            }
        }
    }

    /// At start: unmount what nothing uses, remove images no record names
    /// (a create or delete a crash cut short) and records whose image is
    /// gone.
    pub(crate) fn reconcile_volumes(&self) {
        let Ok(dir) = self.volumes_dir() else {
            return;
        };
        self.release_volumes();
        let Ok(records) = self.store().list_volumes(None) else {
            return;
        };
        let known: BTreeSet<String> = records.iter().map(|v| v.id.clone()).collect();
        if let Ok(entries) = fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(id) = name.strip_suffix(".img") else {
                    continue;
                };
                if !known.contains(id) {
                    tracing::info!("volume {id}: removing its image, which no record names");
                    let _ = unmount(&mount_path(&dir, id));
                    let _ = fs::remove_file(entry.path());
                    let _ = fs::remove_file(guest_mark(&dir, id));
                }
            }
        }
        for v in records {
            if !image_path(&dir, &v.id).exists() {
                tracing::warn!(
                    "volume {} ({}): its image is gone; forgetting it",
                    v.id,
                    v.name
                );
                let _ = self.store().delete_volume(&v.id);
            }
        }
    }
}

fn bad(e: rules::VolumeRuleError) -> ManagerError {
    ManagerError::BadRequest {
        reason: e.to_string(),
    }
}

fn image_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.img"))
}

/// Beside a volume's image once a vm guest's kernel has had it: the host
/// never mounts it again ([`SandboxManager::take_alone`]).
fn guest_mark(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.guest"))
}

fn mount_path(dir: &Path, id: &str) -> PathBuf {
    dir.join("mnt").join(id)
}

/// Run a host tool; its stderr is the error.
fn run(what: &'static str, cmd: &mut Command) -> Result<(), ManagerError> {
    let out = cmd.output().map_err(|e| ManagerError::Volume {
        op: what,
        reason: format!(
            "cannot run {:?}: {e} (install e2fsprogs and util-linux)",
            cmd.get_program()
        ),
    })?;
    if out.status.success() {
        return Ok(());
    }
    Err(ManagerError::Volume {
        op: what,
        reason: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    })
}

/// A new image of `size` bytes, all of it reserved on the host, with an
/// ext4 filesystem whose root belongs to uid and gid 1000 (E2B's `user`;
/// root inside can use it too) and no lost+found.
fn make_image(path: &Path, size: u64) -> Result<(), ManagerError> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io_err("create the volume's image"))?;
    rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, size).map_err(
        |e| match e {
            rustix::io::Errno::NOSPC | rustix::io::Errno::DQUOT => {
                ManagerError::HostDiskFull { size }
            }
            e => ManagerError::Volume {
                op: "reserve the volume's space",
                reason: e.to_string(),
            },
        },
    )?;
    drop(file);
    run(
        "format the volume",
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "nodiscard,root_owner=1000:1000",
            ])
            .arg(path),
    )?;
    // lost+found is ext4's, not the volume's: E2B's volumes have none.
    run(
        "prepare the volume",
        Command::new("debugfs")
            .args(["-w", "-R", "rmdir lost+found"])
            .arg(path),
    )
}

fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(dir), dir.parent().map(fs::metadata)) {
        (Ok(d), Some(Ok(p))) => d.dev() != p.dev(),
        _ => false,
    }
}

/// Mount `image` at `mnt` unless it is mounted there.
fn mount(image: &Path, mnt: &Path) -> Result<(), ManagerError> {
    if is_mount_point(mnt) {
        return Ok(());
    }
    if !image.exists() {
        return Err(ManagerError::Volume {
            op: "mount the volume",
            reason: format!("its image {} is gone", image.display()),
        });
    }
    fs::create_dir_all(mnt).map_err(io_err("create the volume's mount point"))?;
    run(
        "mount the volume",
        Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev"])
            .arg(image)
            .arg(mnt),
    )
}

/// Whether a loop device is backed by `image` (a mount of it, in any
/// namespace, keeps one).
fn loop_device_of(image: &Path) -> bool {
    let image = fs::canonicalize(image).unwrap_or_else(|_| image.to_path_buf());
    let Ok(devices) = fs::read_dir("/sys/block") else {
        return false;
    };
    devices.flatten().any(|d| {
        fs::read_to_string(d.path().join("loop/backing_file"))
            .is_ok_and(|f| Path::new(f.trim_end_matches('\n')) == image)
    })
}

/// Unmount `mnt` if it is mounted, and remove it.
fn unmount(mnt: &Path) -> Result<(), ManagerError> {
    if is_mount_point(mnt) {
        run("unmount the volume", Command::new("umount").arg(mnt))?;
    }
    match fs::remove_dir(mnt) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove the volume's mount point")(e)),
    }
}

impl Store {
    fn insert_volume(&self, tenant: &TenantId, info: &VolumeInfo) -> Result<(), ManagerError> {
        let r = self.conn.execute_cached(
            "INSERT INTO volumes (id, tenant_id, name, size, token, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            (
                &info.id,
                tenant.as_str(),
                &info.name,
                info.size_bytes as i64,
                &info.token,
                info.created_at,
            ),
        );
        match r {
            Ok(_) => Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                Err(ManagerError::VolumeExists {
                    name: info.name.clone(),
                })
            }
            Err(e) => Err(StoreError::query("keep a volume")(e).into()),
        }
    }

    fn list_volumes(&self, tenant: Option<&TenantId>) -> Result<Vec<VolumeInfo>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, name, size, token, created_at FROM volumes
                 WHERE (?1 IS NULL OR tenant_id = ?1) ORDER BY created_at, id",
            )
            .map_err(StoreError::query("list volumes"))?;
        let rows = stmt
            .query_map([tenant.map(|t| t.as_str())], row)
            .map_err(StoreError::query("list volumes"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::query("list volumes"))?;
        Ok(rows)
    }

    fn find_volume(&self, tenant: &TenantId, key: &str) -> Result<Option<VolumeInfo>, StoreError> {
        self.conn
            .query_row_cached(
                "SELECT id, name, size, token, created_at FROM volumes
                 WHERE tenant_id = ?1 AND (id = ?2 OR name = ?2)",
                (tenant.as_str(), key),
                row,
            )
            .optional()
            .map_err(StoreError::query("find a volume"))
    }

    fn volume_by_token(
        &self,
        id: &str,
        token: &str,
    ) -> Result<Option<(TenantId, VolumeInfo)>, StoreError> {
        let found: Option<(String, VolumeInfo)> = self
            .conn
            .query_row_cached(
                "SELECT id, name, size, token, created_at, tenant_id FROM volumes WHERE id = ?1",
                [id],
                |r| Ok((r.get(5)?, row(r)?)),
            )
            .optional()
            .map_err(StoreError::query("find a volume"))?;
        Ok(found.and_then(|(tenant, info)| {
            use sha2::Digest;
            // Compared as digests: the time taken says nothing of the token.
            let same = sha2::Sha256::digest(info.token.as_bytes())
                == sha2::Sha256::digest(token.as_bytes());
            same.then_some((TenantId(tenant), info))
        }))
    }

    fn delete_volume(&self, id: &str) -> Result<(), StoreError> {
        self.conn
            .execute_cached("DELETE FROM volumes WHERE id = ?1", [id])
            .map_err(StoreError::query("remove a volume"))?;
        Ok(())
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<VolumeInfo> {
    Ok(VolumeInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        size_bytes: r.get::<_, i64>(2)?.max(0) as u64,
        token: r.get(3)?,
        created_at: r.get(4)?,
        vm_only: false,
    })
}
