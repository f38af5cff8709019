//! Warm starts: sandboxes restored from a checkpoint of one that was
//! already ready.
//!
//! Some templates take long to become ready after their sandbox starts:
//! the code interpreter's Jupyter kernel takes about two seconds on the
//! process tier and about a minute in a vm guest under TCG. E2B snapshots
//! a template once its start command is ready and starts every sandbox
//! from that snapshot; brig does the same on a tier that restores a
//! checkpoint onto any network ([`Checkpoints::Memory`]: the vm tier).
//!
//! A front-end makes a sandbox ready (its own steps: the runtime does not
//! know what ready means for it), then [`SandboxManager::keep_warm`]
//! checkpoints it under a [`WarmKey`]: everything the sandboxes restored
//! from it depend on (the template's build, the tier, the limits, whether
//! it has a network device, the front-end's own recipe). A create given
//! the key ([`CreateConfig::warm`]) restores that checkpoint, its identity
//! renewed by the tier. A warm start is no tenant's: the sandbox it was
//! taken of was given nothing of anyone's (no environment, no files, no
//! network of its own), and each tenant's sandboxes restored from it are
//! theirs alone from then on.
//!
//! Kept in `$BRIG_HOME/warm/<family>-<key>/` (`image/`, the tier's;
//! `meta.json`). A new one of a family replaces the others (a rebuilt
//! template, a changed recipe); at start, those not restored from for a
//! week and any left half-made by a daemon that died are removed.
//!
//! [`CreateConfig::warm`]: crate::CreateConfig::warm

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use brig_core::{Checkpoints, SandboxId, SandboxSpec};
use sha2::{Digest, Sha256};

use crate::manager::{ManagerError, SandboxManager};
use crate::snapshots::Checkpoint;
use crate::TenantId;

/// `$BRIG_HOME/warm`.
const WARM_DIR: &str = "warm";
/// A warm start no create restored from for this long is removed at start.
const UNUSED_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// A checkpoint being taken is written here, then renamed into place.
const PART: &str = ".part-";

/// What a warm start is kept under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WarmKey {
    /// What a newer one replaces (e.g. `code interpreter of
    /// code-interpreter-v1 on vm`), for messages.
    label: String,
    /// Hex of the family, then of everything it depends on.
    family: String,
    key: String,
}

impl WarmKey {
    /// The key of `family` for sandboxes that depend on `parts` (each
    /// part is hashed apart, so no two lists run together).
    pub fn new(family: &str, parts: &[&str]) -> WarmKey {
        let mut h = Sha256::new();
        h.update(family.as_bytes());
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p.as_bytes());
        }
        WarmKey {
            label: family.to_string(),
            family: hex(&Sha256::digest(family.as_bytes()))[..16].to_string(),
            key: hex(&h.finalize())[..32].to_string(),
        }
    }

    /// What it is for, as given.
    pub fn label(&self) -> &str {
        &self.label
    }

    fn dir_name(&self) -> String {
        format!("{}-{}", self.family, self.key)
    }
}

impl std::fmt::Display for WarmKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "warm start of the {} ({})", self.label, self.key)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl SandboxManager {
    /// Where warm starts are kept: `$BRIG_HOME/warm`.
    fn warm_root(&self) -> Result<PathBuf, ManagerError> {
        let home = self
            .config()
            .home
            .as_ref()
            .ok_or_else(|| ManagerError::BadRequest {
                reason: "warm starts need a home to keep them in: this daemon has none".into(),
            })?;
        Ok(home.join(WARM_DIR))
    }

    /// Whether a sandbox on `isolation` can be kept as a warm start: its
    /// tier restores memory onto any network.
    pub fn warms(&self, isolation: brig_core::Isolation) -> bool {
        self.tier(isolation)
            .is_ok_and(|t| t.checkpoints() == Checkpoints::Memory)
    }

    /// Whether `key`'s warm start is kept.
    pub fn warm_kept(&self, key: &WarmKey) -> bool {
        self.warm_root()
            .is_ok_and(|root| root.join(key.dir_name()).join("meta.json").is_file())
    }

    /// Checkpoint `tenant`'s ready sandbox `id` as `key`'s warm start (it
    /// runs on), replacing any other of its family.
    pub fn keep_warm(
        &self,
        tenant: &TenantId,
        id: &SandboxId,
        key: &WarmKey,
    ) -> Result<(), ManagerError> {
        let live = self.owned_live(tenant, id)?;
        let record = self.get(tenant, id)?;
        let isolation = record.isolation.parse().unwrap_or_default();
        if !self.warms(isolation) {
            return Err(ManagerError::BadRequest {
                reason: format!(
                    "sandbox {id} runs on the {isolation} tier, which cannot restore a checkpoint \
                     onto a new network: no warm start is kept of it"
                ),
            });
        }
        let spec: SandboxSpec =
            serde_json::from_value(record.spec.clone()).map_err(|e| ManagerError::BadRequest {
                reason: format!("sandbox {id} has no spec this daemon can read: {e}"),
            })?;
        let root = self.warm_root()?;
        let part = root.join(format!("{PART}{}", rand::random::<u64>()));
        let held = self.checkpoint_into(id, &live, &record, &spec, &part)?;
        let dir = root.join(key.dir_name());
        let placed = match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => std::fs::rename(&part, &dir),
        };
        if let Err(e) = placed {
            let _ = std::fs::remove_dir_all(&part);
            return Err(ManagerError::Tier {
                id: id.clone(),
                op: "keep its warm start",
                source: brig_core::TierError::failed(id, "rename its checkpoint into place", e),
            });
        }
        // Those it replaces: sandboxes restored from them keep running
        // (a restore does not need its checkpoint afterwards).
        let mine = key.dir_name();
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name != mine && name.starts_with(&format!("{}-", key.family)) {
                tracing::info!("{}: replacing warm start {name}", key.label);
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        tracing::info!(
            "{key}: kept from sandbox {id} (held {} ms)",
            held.as_millis()
        );
        Ok(())
    }

    /// Forget `key`'s warm start (a restore of it failed: the next create
    /// makes another).
    pub fn forget_warm(&self, key: &WarmKey) {
        if let Ok(root) = self.warm_root() {
            let _ = std::fs::remove_dir_all(root.join(key.dir_name()));
        }
    }

    /// What a create restores for `key` (marked used now).
    pub(crate) fn warm_checkpoint(&self, key: &WarmKey) -> Result<Checkpoint, ManagerError> {
        let dir = self.warm_root()?.join(key.dir_name());
        let meta = dir.join("meta.json");
        let cp: Checkpoint = std::fs::read(&meta)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| ManagerError::BadRequest {
                reason: format!("the {key} is not kept (or unreadable): make it first"),
            })?;
        touch(&meta);
        Ok(Checkpoint {
            image: dir.join("image"),
            ..cp
        })
    }

    /// Remove half-made warm starts and those unused for [`UNUSED_FOR`];
    /// at start.
    pub(crate) fn collect_warm(&self) {
        let Ok(root) = self.warm_root() else {
            return;
        };
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let unused = std::fs::metadata(e.path().join("meta.json"))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_none_or(|age| age > UNUSED_FOR);
            if name.starts_with(PART) || unused {
                tracing::info!("removing warm start {name}: half-made or unused for a week");
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Mark `path` as used now (its modification time).
fn touch(path: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_with_any_part_and_share_their_family() {
        let a = WarmKey::new("ci of t on vm", &["build-1", "1024"]);
        let b = WarmKey::new("ci of t on vm", &["build-2", "1024"]);
        let c = WarmKey::new("ci of t on vm", &["build-1", "10", "24"]);
        assert_ne!(a, b);
        assert_ne!(a.key, c.key, "parts must not run together");
        assert_eq!(a.family, b.family);
        assert_eq!(a, WarmKey::new("ci of t on vm", &["build-1", "1024"]));
        let other = WarmKey::new("ci of t on gvisor", &["build-1", "1024"]);
        assert_ne!(a.family, other.family);
        // A directory name, whatever the label holds.
        let odd = WarmKey::new("../x y/", &["../"]);
        assert!(odd
            .dir_name()
            .chars()
            .all(|c| c.is_ascii_hexdigit() || c == '-'));
    }
}
