//! Reaping what a killed brig left behind.
//!
//! A sandbox's namespaces, mounts and processes die with its init, and its
//! init dies with its owner (`PR_SET_PDEATHSIG`). The one thing the kernel
//! does not clean up is the cgroup directories. [`reap`] removes every
//! `brig/<id>` group whose owner no longer holds its liveness lock
//! ([`crate::slot::is_live`]) and that no existing daemon owns, killing
//! anything still inside first.
//! `brig run` calls it on start; it costs one `readdir` per controller when
//! there is nothing to do.

use std::fs;
use std::path::{Path, PathBuf};

use brig_core::SandboxId;

use crate::cgroup::{self, Hierarchy};
use crate::slot;

/// What a reconcile pass removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    pub cgroups: Vec<PathBuf>,
}

/// Whether a daemon whose home still exists owns `id` (its state file in
/// `sb/<id>/` names the daemon's database). Such a sandbox is that
/// daemon's to settle, even once its processes are gone: between its
/// agent's death and the daemon's teardown, the group still holds what the
/// daemon reads to tell why it ended (the OOM killer's count). Another
/// daemon's or `brig run`'s pass removing it then made an OOM look like a
/// plain exit. A daemon that never comes back leaves its sandboxes to the
/// next one of its home, which settles them by id.
fn daemon_settles(run_dir: &Path, id: &SandboxId) -> bool {
    let state = crate::tier::sandboxes_dir(run_dir)
        .join(id.as_str())
        .join("state");
    fs::read_to_string(state).is_ok_and(|s| {
        s.lines()
            .next()
            .is_some_and(|owner| !owner.is_empty() && Path::new(owner).exists())
    })
}

/// Remove the cgroups of dead sandboxes.
pub fn reap(hierarchy: &Hierarchy, run_dir: &Path) -> Reaped {
    let mut candidates: Vec<(SandboxId, PathBuf)> = Vec::new();
    for parent in hierarchy.parents() {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for e in entries.flatten() {
            if let Some(id) = e.file_name().to_str().and_then(SandboxId::parse) {
                if e.path().is_dir() {
                    candidates.push((id, e.path()));
                }
            }
        }
    }
    if candidates.is_empty() {
        return Reaped::default();
    }
    let dead: Vec<PathBuf> = candidates
        .into_iter()
        .filter(|(id, _)| !slot::is_live(run_dir, id) && !daemon_settles(run_dir, id))
        .map(|(_, p)| p)
        .collect();
    cgroup::kill_procs(&dead);
    let mut reaped = Reaped::default();
    for dir in dead {
        if cgroup::remove_groups(std::slice::from_ref(&dir)).is_ok() {
            reaped.cgroups.push(dir);
        }
    }
    reaped
}
