//! Reaping what a killed brig left behind.
//!
//! A sandbox's namespaces, mounts and processes die with its init, and its
//! init dies with its owner (`PR_SET_PDEATHSIG`). The one thing the kernel
//! does not clean up is the cgroup directories. [`reap`] removes every
//! `brig/<id>` group whose owner no longer holds its liveness lock
//! ([`crate::slot::is_live`]), killing anything still inside first.
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
        .filter(|(id, _)| !slot::is_live(run_dir, id))
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
