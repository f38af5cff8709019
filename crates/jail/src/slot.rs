//! Host uid ranges for sandboxes, and the locks that say a sandbox's owner
//! is alive.
//!
//! Every live sandbox holds one slot: an exclusive `flock` on
//! `<run>/slots/<n>.lock`, whose content is the sandbox id. Slot `n` owns the
//! host uid/gid range `BASE + n·65536 .. +65536`, so sandbox root is never
//! host root and two sandboxes never share a host uid. The kernel drops the
//! lock when the owner dies, however it dies, which is what lets
//! [`crate::reconcile`] tell leftovers from live sandboxes.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use brig_core::SandboxId;

/// First host uid handed to sandboxes (268435456): far above any uid a
/// distribution or `/etc/subuid` allocates.
pub const BASE: u32 = 0x1000_0000;
/// Ids mapped per sandbox: the full 16-bit range a Linux distribution uses.
pub const RANGE: u32 = 65536;
/// Number of slots, i.e. concurrent sandboxes per host.
pub const COUNT: u32 = 16384;

#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    #[error("all {COUNT} sandbox slots are in use; wait for sandboxes to finish or remove some")]
    Exhausted,
    #[error("cannot use the slot directory {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A held slot. Dropping it releases the lock.
#[derive(Debug)]
pub struct Slot {
    index: u32,
    file: File,
}

impl Slot {
    pub fn index(&self) -> u32 {
        self.index
    }

    /// First host uid (and gid) of this slot's range; sandbox uid 0 maps here.
    pub fn host_base(&self) -> u32 {
        BASE + self.index * RANGE
    }

    /// Release the lock and empty the file, so reconcile does not mistake
    /// the old id for a leftover.
    pub fn release(self) {
        let _ = self.file.set_len(0);
    }
}

fn try_lock(file: &File) -> bool {
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

pub fn slots_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("slots")
}

/// Take a free slot for sandbox `id`, starting the search at a random slot
/// so concurrent callers rarely contend.
pub fn acquire(run_dir: &Path, id: &SandboxId) -> Result<Slot, SlotError> {
    let dir = slots_dir(run_dir);
    let io_err = |source| SlotError::Io { path: dir.clone(), source };
    let start = rand::random::<u32>() % COUNT;
    for i in 0..COUNT {
        let index = (start + i) % COUNT;
        let path = dir.join(format!("{index}.lock"));
        let file = match OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir_all(&dir).map_err(io_err)?;
                OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io_err)?
            }
            Err(e) => return Err(io_err(e)),
        };
        if try_lock(&file) {
            let mut f = &file;
            f.set_len(0).map_err(io_err)?;
            f.write_all(id.as_str().as_bytes()).map_err(io_err)?;
            return Ok(Slot { index, file });
        }
    }
    Err(SlotError::Exhausted)
}

/// Ids of sandboxes whose owner is alive: the content of every slot file
/// someone else holds locked. (A file we can lock has no living owner.)
pub fn live_ids(run_dir: &Path) -> Vec<SandboxId> {
    let Ok(entries) = fs::read_dir(slots_dir(run_dir)) else { return Vec::new() };
    let mut live = Vec::new();
    for entry in entries.flatten() {
        let Ok(mut file) = OpenOptions::new().read(true).write(true).open(entry.path()) else { continue };
        if try_lock(&file) {
            // Nobody holds it: whatever id it names is dead. Clear it; the
            // lock is released when `file` drops.
            let _ = file.set_len(0);
            continue;
        }
        let mut s = String::new();
        if file.rewind().is_ok() && file.read_to_string(&mut s).is_ok() {
            if let Some(id) = SandboxId::parse(s.trim()) {
                live.push(id);
            }
        }
    }
    live
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_and_map_to_disjoint_ranges() {
        let t = tempfile::tempdir().unwrap();
        let a = acquire(t.path(), &SandboxId::from_random(1)).unwrap();
        let b = acquire(t.path(), &SandboxId::from_random(2)).unwrap();
        assert_ne!(a.index(), b.index());
        assert!(a.host_base() >= BASE && a.host_base() % RANGE == 0);
        assert!(a.host_base().abs_diff(b.host_base()) >= RANGE);
    }

    #[test]
    fn live_ids_lists_held_slots_only() {
        let t = tempfile::tempdir().unwrap();
        let id = SandboxId::from_random(0xabc);
        let slot = acquire(t.path(), &id).unwrap();
        // flock locks belong to the open file description, so a second open
        // in the same process does conflict, as a separate process would.
        assert_eq!(live_ids(t.path()), vec![id]);
        slot.release();
        assert!(live_ids(t.path()).is_empty());
    }
}
