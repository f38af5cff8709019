//! Snapshots and forks: a sandbox's files kept as an image, and sandboxes
//! started from it.
//!
//! A snapshot is the sandbox's writable layer (the tier's
//! [`Instance::writable_layer`]: on the process tier, the overlay's upper
//! directory its pid 1 holds open) captured with the sandbox frozen for
//! the capture only, as one more layer over the layers it runs on, and
//! registered in the image store as `snapshots/<id>` — over the image's
//! layers, or over the named template's build it runs on (the image's
//! `base`, which `brig template prune` then keeps). Its record here says
//! whose it is: a tenant names its snapshots by id or by its own name, and
//! no other tenant can use them. A create naming one (`template`) starts
//! from it like from any image; its processes and memory are not kept
//! (the process tier has none to keep: a filesystem snapshot).
//!
//! A fork is a hidden snapshot and N creates from it with the parent's
//! settings; the snapshot is removed once no sandbox runs on it.
//!
//! What a snapshot keeps is the tier's to say ([`Tier::checkpoints`]): on
//! a tier that checkpoints memory (gvisor, vm), a snapshot is the sandbox's
//! checkpoint ([`Instance::checkpoint`]: its processes, memory and files)
//! in `$BRIG_HOME/checkpoints/<snapshot id>` (its record's image is
//! `checkpoint:<snapshot id>`), and a create naming it restores it
//! ([`Tier::restore`]) on that tier, from the template the sandbox ran
//! on, with no network. A checkpoint is not needed once restored from: a
//! fork's is removed as soon as its forks run, and deleting a snapshot
//! others were restored from leaves them running.
//!
//! [`Instance::writable_layer`]: brig_core::Instance::writable_layer
//! [`Instance::checkpoint`]: brig_core::Instance::checkpoint
//! [`Tier::checkpoints`]: brig_core::Tier::checkpoints
//! [`Tier::restore`]: brig_core::Tier::restore

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use brig_core::{Isolation, SandboxId, SandboxSpec, TemplateRef};
use brig_image::layer::Owners;
use brig_image::{ImageConfig, ImageStore};
use rusqlite::OptionalExtension;

use crate::manager::{lock, CreateConfig, Live, ManagerError, SandboxManager};
use crate::sandboxes::SandboxRecord;
use crate::store::Cached;
use crate::store::{Store, StoreError, UnixMillis};
use crate::TenantId;

/// The image store's names for snapshots start so; no create may name
/// one directly (a tenant names its own by id or name).
pub const IMAGE_PREFIX: &str = brig_image::SNAPSHOT_PREFIX;

/// How long a fork's snapshot is kept even with no sandbox on it (its
/// creates may still be starting).
const FORK_GRACE: Duration = Duration::from_secs(600);

/// The most forks one request makes (E2B's limit).
pub const MAX_FORKS: u32 = 100;

/// A memory snapshot's record names its checkpoint so (`image`).
const CHECKPOINT_PREFIX: &str = "checkpoint:";
/// Checkpoints live in `$BRIG_HOME/checkpoints/<snapshot id>`: `image/` the
/// tier's, `meta.json` what a restore needs besides.
const CHECKPOINT_DIR: &str = "checkpoints";

/// What a restore from a memory snapshot needs besides the tier's image.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Checkpoint {
    /// The tier that took it (and alone can restore it).
    pub isolation: Isolation,
    /// The resolved template its sandbox ran on.
    pub template: TemplateRef,
    #[serde(skip)]
    pub image: PathBuf,
}

/// What is known of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotInfo {
    /// `snap-` and 20 lowercase letters and digits.
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The sandbox it was taken of.
    pub sandbox_id: SandboxId,
    /// The template that sandbox was created from.
    pub template: String,
    /// Bytes of its own layer (what the sandbox had written), or of its
    /// checkpoint (memory, processes and written files).
    pub size_bytes: u64,
    /// It keeps the sandbox's memory and processes (a checkpoint), not
    /// only its files.
    pub memory: bool,
    pub created_at: UnixMillis,
    /// How long the sandbox was frozen for the capture (this daemon's
    /// snapshots only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen_ms: Option<u64>,
    #[serde(skip)]
    pub(crate) image: String,
}

/// A snapshot name: 1 to 128 of `a-z 0-9 _ - . : /`, kept lower-cased
/// (E2B's alias[:tag] rule, with its namespace).
pub fn check_name(name: &str) -> Result<String, ManagerError> {
    let lower = name.trim().to_ascii_lowercase();
    let ok = !lower.is_empty()
        && lower.len() <= 128
        && !lower.starts_with("snap-")
        && lower
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.:/".contains(&b));
    if ok {
        Ok(lower)
    } else {
        Err(ManagerError::BadRequest {
            reason: format!(
                "invalid snapshot name {name:?}: use 1 to 128 letters, digits, '_', '-', '.', ':' \
                 or '/' (not starting with snap-)"
            ),
        })
    }
}

impl SandboxManager {
    /// Snapshot the files of `tenant`'s sandbox `id` (running or paused),
    /// as `name` if given (a snapshot of that name is replaced).
    pub fn snapshot(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        name: Option<&str>,
    ) -> Result<SnapshotInfo, ManagerError> {
        let name = name.map(check_name).transpose()?;
        self.capture(tenant, id, name, false)
    }

    fn capture(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        name: Option<String>,
        hidden: bool,
    ) -> Result<SnapshotInfo, ManagerError> {
        let live = self.owned_live(tenant, id)?;
        let record = self.get(tenant, id)?;
        let spec: SandboxSpec =
            serde_json::from_value(record.spec.clone()).map_err(|e| ManagerError::BadRequest {
                reason: format!("sandbox {id} has no spec this daemon can read: {e}"),
            })?;
        let isolation: Isolation = record.isolation.parse().unwrap_or_default();
        // Its memory where its tier keeps memory and this sandbox allows
        // it (a gvisor sandbox with a network or volumes does not): else
        // its files.
        let mut no_memory = None;
        if self.tier(isolation)?.checkpoints().memory() {
            match live.instance.checkpointable() {
                Ok(()) => return self.checkpoint(tenant, id, &live, &record, spec, name, hidden),
                Err(why) => {
                    tracing::info!("sandbox {id}: its files only are snapshotted: {why}");
                    no_memory = Some(why);
                }
            }
        }
        let store = self.image_store()?;
        let (mut layers, base, config): (Vec<String>, Option<PathBuf>, ImageConfig) =
            match &spec.template {
                TemplateRef::Layers { image, .. } => {
                    let parent = store.get(image).map_err(image_err(id))?.ok_or_else(|| {
                        ManagerError::BadRequest {
                            reason: format!(
                                "sandbox {id} runs on image {image}, which is no longer in the \
                                 store: it cannot be snapshotted"
                            ),
                        }
                    })?;
                    (parent.layers, parent.base, parent.config)
                }
                TemplateRef::Dir(dir) => (Vec::new(), Some(dir.clone()), ImageConfig::default()),
                other => {
                    return Err(ManagerError::BadRequest {
                        reason: format!(
                            "sandbox {id} runs on the {other} template, which shares the host's \
                             files: it has no files of its own to snapshot (create it from a \
                             named template or an image)"
                        ),
                    })
                }
            };
        let _busy = Busy::take(self, id)?;
        let layer = live
            .instance
            .writable_layer()
            .map_err(|source| ManagerError::Tier {
                id: id.clone(),
                op: "reach its writable layer",
                // Where a memory snapshot was refused first, why: a tier
                // with no files snapshot has nothing better to say.
                source: no_memory.unwrap_or(source),
            })?;
        let owners = Owners::Shifted {
            uid_base: layer.uid_base,
            gid_base: layer.gid_base,
            count: layer.ids,
        };
        // Nor the certificate authority the runtime gave it (where its /run
        // is in the layer: gvisor's): the next sandbox gets its own.
        let mut skip = layer.skip.clone();
        skip.extend(
            [brig_net::tls::CA_FILE, brig_net::tls::CA_BUNDLE]
                .map(|p| PathBuf::from(p.trim_start_matches('/'))),
        );
        let (tar, frozen) = live.frozen_for(id, || {
            store.layer_tar_from_fd(layer.dir.as_fd(), owners, &skip)
        })?;
        drop(layer);
        let diff_id = store
            .add_layer_tar(tar.map_err(image_err(id))?)
            .map_err(image_err(id))?;
        let size = std::fs::metadata(store.blob_path(&diff_id)).map_or(0, |m| m.len());
        layers.push(diff_id);

        let snap = new_id();
        let image = format!("{IMAGE_PREFIX}{snap}");
        store
            .register_local(
                &image,
                &format!("snapshot of sandbox {id}"),
                layers,
                config,
                base,
            )
            .map_err(image_err(id))?;
        let info = SnapshotInfo {
            id: snap,
            name,
            sandbox_id: id.clone(),
            template: record.template.clone(),
            size_bytes: size,
            memory: false,
            created_at: self.store().now(),
            frozen_ms: Some(frozen.as_millis() as u64),
            image,
        };
        let replaced = self.store().insert_snapshot(tenant, &info, hidden);
        match replaced {
            Ok(old) => {
                if let Some(old) = old {
                    self.forget(&old);
                }
                tracing::info!(
                    "sandbox {id}: snapshot {} ({} bytes, frozen {} ms)",
                    info.id,
                    info.size_bytes,
                    frozen.as_millis()
                );
                Ok(info)
            }
            Err(e) => {
                self.forget_image(&store, &info.image);
                Err(e.into())
            }
        }
    }

    /// A memory snapshot of `live` (see the module's notes): the tier's
    /// checkpoint, then a new agent connection (the agent let go of the
    /// last one for it).
    #[allow(clippy::too_many_arguments)]
    fn checkpoint(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        live: &Arc<Live>,
        record: &SandboxRecord,
        spec: SandboxSpec,
        name: Option<String>,
        hidden: bool,
    ) -> Result<SnapshotInfo, ManagerError> {
        let root = self.checkpoint_root()?;
        let snap = new_id();
        let dir = root.join(&snap);
        let held = self.checkpoint_into(id, live, record, &spec, &dir)?;
        let info = SnapshotInfo {
            id: snap.clone(),
            name,
            sandbox_id: id.clone(),
            template: record.template.clone(),
            size_bytes: tree_size(&dir),
            memory: true,
            created_at: self.store().now(),
            frozen_ms: Some(held.as_millis() as u64),
            image: format!("{CHECKPOINT_PREFIX}{snap}"),
        };
        match self.store().insert_snapshot(tenant, &info, hidden) {
            Ok(old) => {
                if let Some(old) = old {
                    self.forget(&old);
                }
                tracing::info!(
                    "sandbox {id}: memory snapshot {snap} ({} bytes, checkpointed in {} ms)",
                    info.size_bytes,
                    held.as_millis()
                );
                Ok(info)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e.into())
            }
        }
    }

    /// Checkpoint `live` into `dir` (made here: `image/`, the tier's, and
    /// `meta.json`), then connect to its agent again (it let go of the
    /// last connection for it). How long the sandbox was held; on an
    /// error `dir` is gone.
    pub(crate) fn checkpoint_into(
        &self,
        id: &SandboxId,
        live: &Arc<Live>,
        record: &SandboxRecord,
        spec: &SandboxSpec,
        dir: &std::path::Path,
    ) -> Result<Duration, ManagerError> {
        let _busy = Busy::take(self, id)?;
        let meta = Checkpoint {
            isolation: record.isolation.parse().unwrap_or_default(),
            template: spec.template.clone(),
            image: PathBuf::new(),
        };
        let made = std::fs::create_dir_all(dir.join("image")).and_then(|()| {
            std::fs::write(
                dir.join("meta.json"),
                serde_json::to_vec(&meta).unwrap_or_default(),
            )
        });
        if let Err(e) = made {
            let _ = std::fs::remove_dir_all(dir);
            return Err(ManagerError::Tier {
                id: id.clone(),
                op: "keep its checkpoint",
                source: brig_core::TierError::failed(id, "create its directory", e),
            });
        }
        let started = std::time::Instant::now();
        let taken = {
            // Paused or not, it stays so meanwhile.
            let _lifecycle = lock(&live.lifecycle);
            live.instance.checkpoint(&dir.join("image"))
        };
        let held = started.elapsed();
        // Its agent let go of the connection (a failed checkpoint too may
        // have): connect again.
        let reconnected = if live.conn.is_closed() || taken.is_ok() {
            self.reconnect(id, live, spec)
        } else {
            Ok(())
        };
        if let Err(source) = taken {
            let _ = std::fs::remove_dir_all(dir);
            reconnected?;
            return Err(ManagerError::Tier {
                id: id.clone(),
                op: "checkpoint it",
                source,
            });
        }
        if let Err(e) = reconnected {
            let _ = std::fs::remove_dir_all(dir);
            return Err(e);
        }
        Ok(held)
    }

    /// Where checkpoints are kept: `$BRIG_HOME/checkpoints`.
    fn checkpoint_root(&self) -> Result<PathBuf, ManagerError> {
        let home = self
            .config()
            .home
            .as_ref()
            .ok_or_else(|| ManagerError::BadRequest {
                reason: "snapshots need a home to keep them in: this daemon has none".into(),
            })?;
        Ok(home.join(CHECKPOINT_DIR))
    }

    /// A create's template, if it names one of `tenant`'s memory
    /// snapshots (by id or name, or as a fork names it): what restoring it
    /// needs.
    pub(crate) fn checkpoint_template(
        &self,
        tenant: &TenantId,
        template: &TemplateRef,
    ) -> Result<Option<Checkpoint>, ManagerError> {
        let (TemplateRef::Named(key) | TemplateRef::Image(key)) = template else {
            return Ok(None);
        };
        let key = key.strip_prefix(CHECKPOINT_PREFIX).unwrap_or(key);
        let Some(snap) = self.store().find_snapshot(tenant, key)? else {
            return Ok(None);
        };
        let Some(snap_id) = snap.image.strip_prefix(CHECKPOINT_PREFIX) else {
            return Ok(None);
        };
        let dir = self.checkpoint_root()?.join(snap_id);
        let meta: Checkpoint = std::fs::read(dir.join("meta.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| ManagerError::BadRequest {
                reason: format!(
                    "snapshot {} has lost its checkpoint ({} is unreadable): delete it and take \
                     another",
                    snap.id,
                    dir.display()
                ),
            })?;
        Ok(Some(Checkpoint {
            image: dir.join("image"),
            ..meta
        }))
    }

    /// Remove checkpoints no snapshot record names (a daemon that died
    /// taking or deleting one left them); at start.
    pub(crate) fn collect_checkpoints(&self) {
        let Ok(root) = self.checkpoint_root() else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(&root) else {
            return;
        };
        let mut known = std::collections::HashSet::new();
        for hidden in [false, true] {
            match self.store().list_snapshots(None, hidden) {
                Ok(all) => known.extend(all.into_iter().map(|s| s.id)),
                // Unsure what is kept: keep everything.
                Err(_) => return,
            }
        }
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !known.contains(&name) {
                tracing::info!("removing checkpoint {name}: no snapshot names it");
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    /// Drop what a snapshot's record named: its checkpoint, or its image
    /// (and prune what nothing uses).
    fn forget(&self, image: &str) {
        if let Some(snap) = image.strip_prefix(CHECKPOINT_PREFIX) {
            if let Ok(root) = self.checkpoint_root() {
                if let Err(e) = std::fs::remove_dir_all(root.join(snap)) {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        tracing::warn!("cannot remove checkpoint {snap}: {e}");
                    }
                }
            }
            return;
        }
        match self.image_store() {
            Ok(store) => self.forget_image(&store, image),
            Err(e) => tracing::warn!("cannot remove snapshot image {image}: {e}"),
        }
    }

    /// `tenant`'s snapshots, newest first: of one sandbox, and/or of one
    /// name, if asked.
    pub fn snapshots(
        &self,
        tenant: &TenantId,
        sandbox: Option<&SandboxId>,
        name: Option<&str>,
    ) -> Result<Vec<SnapshotInfo>, ManagerError> {
        let name = name.map(|n| n.trim().to_ascii_lowercase());
        Ok(self
            .store()
            .list_snapshots(Some(tenant), false)?
            .into_iter()
            .filter(|s| sandbox.is_none_or(|id| &s.sandbox_id == id))
            .filter(|s| {
                name.as_deref()
                    .is_none_or(|n| s.name.as_deref() == Some(n) || s.id == n)
            })
            .collect())
    }

    /// `tenant`'s snapshot called `key` (its id or name).
    pub fn snapshot_info(
        &self,
        tenant: &TenantId,
        key: &str,
    ) -> Result<SnapshotInfo, ManagerError> {
        self.store()
            .find_snapshot(tenant, key)?
            .ok_or_else(|| ManagerError::SnapshotNotFound {
                snapshot: key.to_string(),
            })
    }

    /// Remove `tenant`'s snapshot `key` (its id or name). Sandboxes running
    /// on it run on (their layers are held until they end); its layers
    /// go with the store's next prune, done here.
    pub fn delete_snapshot(
        &self,
        tenant: &TenantId,
        key: &str,
    ) -> Result<SnapshotInfo, ManagerError> {
        let info = self.snapshot_info(tenant, key)?;
        self.store().delete_snapshot(&info.id)?;
        self.forget(&info.image);
        Ok(info)
    }

    /// Fork `tenant`'s sandbox `id` `count` times: a snapshot of it, then
    /// a create per fork from `config` (given the snapshot as its
    /// template). The parent runs on. One result per fork.
    pub fn fork(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        count: u32,
        config: impl Fn(TemplateRef) -> CreateConfig,
    ) -> Result<Vec<Result<SandboxRecord, ManagerError>>, ManagerError> {
        if !(1..=MAX_FORKS).contains(&count) {
            return Err(ManagerError::BadRequest {
                reason: format!("count {count}: fork makes 1 to {MAX_FORKS} sandboxes at a time"),
            });
        }
        let snap = self.capture(tenant, id, None, true)?;
        let forks = (0..count)
            .map(|_| self.create(tenant, config(TemplateRef::Image(snap.image.clone()))))
            .collect();
        // A checkpoint is not needed once restored from.
        if snap.memory && self.store().delete_snapshot(&snap.id).is_ok() {
            self.forget(&snap.image);
        }
        Ok(forks)
    }

    /// What a fork of `tenant`'s sandbox `id` is created with unless a
    /// front-end says otherwise: the parent's limits, create-time
    /// environment, labels, tier and network policy; `timeout`.
    pub fn fork_config(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        timeout: Option<Duration>,
    ) -> Result<impl Fn(TemplateRef) -> CreateConfig + use<>, ManagerError> {
        let live = self.owned_live(tenant, id)?;
        let record = self.get(tenant, id)?;
        let spec: Option<SandboxSpec> = serde_json::from_value(record.spec.clone()).ok();
        let limits = spec.as_ref().map(|s| s.limits.clone()).unwrap_or_default();
        let allow_setuid = spec.as_ref().is_some_and(|s| s.allow_setuid);
        let env = brig_core::EnvVar::from_map(&live.env).map_err(|e| ManagerError::BadRequest {
            reason: e.to_string(),
        })?;
        let network = record
            .attrs
            .get("network")
            .and_then(|v| serde_json::from_value::<brig_net::Policy>(v.clone()).ok());
        let isolation = record.isolation.parse().unwrap_or_default();
        let labels = record.labels.clone();
        // A fork mounts its parent's volumes (their files are not copied).
        let volumes: Vec<crate::volumes::VolumeRequest> = crate::volumes::mounted(&record.attrs)
            .into_iter()
            .map(|v| crate::volumes::VolumeRequest {
                volume: v.id,
                path: v.path,
            })
            .collect();
        Ok(move |template| CreateConfig {
            template,
            limits: brig_core::Limits {
                timeout: None,
                ..limits.clone()
            },
            env: env.clone(),
            labels: labels.clone(),
            timeout,
            allow_setuid,
            isolation,
            network: network.clone(),
            volumes: volumes.clone(),
            ..CreateConfig::default()
        })
    }

    /// A create's template, if it names one of `tenant`'s snapshots (by
    /// id or name): the snapshot's image. A name of the image store's
    /// snapshots that is not the tenant's is refused.
    pub(crate) fn snapshot_template(
        &self,
        tenant: &TenantId,
        template: TemplateRef,
    ) -> Result<TemplateRef, ManagerError> {
        let (TemplateRef::Named(key) | TemplateRef::Image(key)) = &template else {
            return Ok(template);
        };
        if let Some(snap) = self.store().find_snapshot(tenant, key)? {
            return Ok(TemplateRef::Image(snap.image));
        }
        if let Some(id) = key.strip_prefix(IMAGE_PREFIX) {
            if let Some(snap) = self.store().find_snapshot(tenant, id)? {
                return Ok(TemplateRef::Image(snap.image));
            }
            return Err(ManagerError::SnapshotNotFound {
                snapshot: key.clone(),
            });
        }
        Ok(template)
    }

    /// Remove the snapshots made for forks that no live sandbox runs on
    /// any more (the sweeper's, every pass).
    pub fn collect_fork_snapshots(&self) {
        let hidden = match self.store().list_snapshots(None, true) {
            Ok(all) => all,
            Err(e) => {
                tracing::warn!("cannot list fork snapshots: {e}");
                return;
            }
        };
        if hidden.is_empty() {
            return;
        }
        let now = self.store().now();
        for snap in hidden {
            // A fork's creates may still be starting on it.
            if now - snap.created_at < FORK_GRACE.as_millis() as i64 {
                continue;
            }
            let used = self
                .store()
                .live_on_template(&snap.image)
                .map(|l| !l.is_empty())
                .unwrap_or(true);
            if !used && self.store().delete_snapshot(&snap.id).is_ok() {
                self.forget(&snap.image);
            }
        }
    }

    /// The lease a sandbox on `template` holds on a snapshot's layers
    /// (other images are leased for the daemon's life when resolved).
    pub(crate) fn snapshot_lease(&self, template: &TemplateRef) -> Option<brig_image::LayerLease> {
        let TemplateRef::Layers { image, .. } = template else {
            return None;
        };
        if !image.starts_with(IMAGE_PREFIX) {
            return None;
        }
        let store = self.image_store().ok()?;
        let record = store.get(image).ok()??;
        match store.lease(&record) {
            Ok(lease) => Some(lease),
            Err(e) => {
                tracing::warn!("cannot hold the layers of {image}: {e}");
                None
            }
        }
    }

    fn image_store(&self) -> Result<ImageStore, ManagerError> {
        let home = self
            .config()
            .home
            .as_ref()
            .ok_or_else(|| ManagerError::BadRequest {
                reason: "snapshots need an image store: this daemon has no home".into(),
            })?;
        ImageStore::open(home).map_err(|source| ManagerError::Image {
            op: "open the image store",
            source,
        })
    }

    /// Drop `image` from the store's index and prune what nothing uses.
    fn forget_image(&self, store: &ImageStore, image: &str) {
        if let Err(e) = store.remove(image) {
            tracing::warn!("cannot remove snapshot image {image}: {e}");
        }
        if let Err(e) = store.prune() {
            tracing::warn!("cannot prune the image store: {e}");
        }
    }
}

fn image_err(id: &SandboxId) -> impl FnOnce(brig_image::ImageError) -> ManagerError + '_ {
    move |source| {
        ManagerError::Image {
            op: "store the snapshot",
            source,
        }
        .with_sandbox(id)
    }
}

impl ManagerError {
    fn with_sandbox(self, id: &SandboxId) -> ManagerError {
        tracing::warn!("sandbox {id}: snapshot failed: {self}");
        self
    }
}

/// Bytes the files under `dir` take on disk (a vm checkpoint's disk is
/// sparse: its size says nothing of what it holds).
fn tree_size(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.blocks() * 512),
            _ => 0,
        })
        .sum()
}

/// `snap-` and 20 random lowercase letters and digits.
fn new_id() -> String {
    format!("snap-{}", crate::store::random_alnum(20))
}

/// One capture at a time per sandbox: a second is a conflict.
struct Busy<'a> {
    manager: &'a SandboxManager,
    id: SandboxId,
}

impl<'a> Busy<'a> {
    fn take(manager: &'a SandboxManager, id: &SandboxId) -> Result<Busy<'a>, ManagerError> {
        if !lock(&manager.snapshotting).insert(id.clone()) {
            return Err(ManagerError::Snapshotting { id: id.clone() });
        }
        Ok(Busy {
            manager,
            id: id.clone(),
        })
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        lock(&self.manager.snapshotting).remove(&self.id);
    }
}

impl Store {
    /// Keep `info` as `tenant`'s; the image of a snapshot it replaces (one
    /// of the same name) is returned for removal.
    fn insert_snapshot(
        &self,
        tenant: &TenantId,
        info: &SnapshotInfo,
        hidden: bool,
    ) -> Result<Option<String>, StoreError> {
        self.immediate("keep a snapshot", |s| {
            let old: Option<(String, String)> = match &info.name {
                Some(name) => s
                    .conn
                    .query_row_cached(
                        "SELECT id, image FROM snapshots WHERE tenant_id = ?1 AND name = ?2",
                        (tenant.as_str(), name),
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()
                    .map_err(StoreError::query("find a snapshot"))?,
                None => None,
            };
            if let Some((old_id, _)) = &old {
                s.conn
                    .execute_cached("DELETE FROM snapshots WHERE id = ?1", [old_id])
                    .map_err(StoreError::query("replace a snapshot"))?;
            }
            s.conn
                .execute_cached(
                    "INSERT INTO snapshots (id, tenant_id, name, sandbox_id, template, image, size,
                                            hidden, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                    (
                        &info.id,
                        tenant.as_str(),
                        &info.name,
                        info.sandbox_id.as_str(),
                        &info.template,
                        &info.image,
                        info.size_bytes as i64,
                        hidden as i64,
                        info.created_at,
                    ),
                )
                .map_err(StoreError::query("keep a snapshot"))?;
            Ok(old.map(|(_, image)| image))
        })
    }

    /// Snapshots, newest first: of `tenant` (or everyone's), the hidden
    /// (fork) ones or the others.
    fn list_snapshots(
        &self,
        tenant: Option<&TenantId>,
        hidden: bool,
    ) -> Result<Vec<SnapshotInfo>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, name, sandbox_id, template, image, size, created_at FROM snapshots
                 WHERE (?1 IS NULL OR tenant_id = ?1) AND hidden = ?2
                 ORDER BY created_at DESC, id",
            )
            .map_err(StoreError::query("list snapshots"))?;
        let rows = stmt
            .query_map((tenant.map(|t| t.as_str()), hidden as i64), row)
            .map_err(StoreError::query("list snapshots"))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::query("list snapshots"))?;
        Ok(rows)
    }

    /// `tenant`'s snapshot whose id or name is `key`.
    fn find_snapshot(
        &self,
        tenant: &TenantId,
        key: &str,
    ) -> Result<Option<SnapshotInfo>, StoreError> {
        let key = key.trim().to_ascii_lowercase();
        self.conn
            .query_row_cached(
                "SELECT id, name, sandbox_id, template, image, size, created_at FROM snapshots
                 WHERE tenant_id = ?1 AND (id = ?2 OR name = ?2)",
                (tenant.as_str(), &key),
                row,
            )
            .optional()
            .map_err(StoreError::query("find a snapshot"))
    }

    fn delete_snapshot(&self, id: &str) -> Result<(), StoreError> {
        self.conn
            .execute_cached("DELETE FROM snapshots WHERE id = ?1", [id])
            .map_err(StoreError::query("remove a snapshot"))?;
        Ok(())
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotInfo> {
    let sandbox: String = r.get(2)?;
    Ok(SnapshotInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        sandbox_id: SandboxId::parse(&sandbox).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                2,
                rusqlite::types::Type::Text,
                format!("sandbox id {sandbox:?}").into(),
            )
        })?,
        template: r.get(3)?,
        memory: r.get::<_, String>(4)?.starts_with(CHECKPOINT_PREFIX),
        image: r.get(4)?,
        size_bytes: r.get::<_, i64>(5)?.max(0) as u64,
        created_at: r.get(6)?,
        frozen_ms: None,
    })
}
