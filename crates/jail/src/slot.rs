//! Host uid ranges for sandboxes, and the locks that say a sandbox's owner
//! is alive.
//!
//! Every live sandbox holds two locks, both exclusive `flock`s that the
//! kernel drops when the owner dies, however it dies:
//! - a slot, `<run>/slots/<n>.lock`: slot `n` owns the host uid/gid range
//!   `BASE + n·65536 .. +65536`, so sandbox root is never host root and two
//!   sandboxes never share a host uid;
//! - its liveness lock, `<run>/live/<id>`: what lets [`crate::reconcile`]
//!   tell a leftover from a live sandbox by looking at that one file.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
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

/// A held slot and liveness lock. Dropping it releases both.
#[derive(Debug)]
pub struct Slot {
    index: u32,
    _file: File,
    live: PathBuf,
    _live_file: File,
}

impl Slot {
    pub fn index(&self) -> u32 {
        self.index
    }

    /// First host uid (and gid) of this slot's range; sandbox uid 0 maps here.
    pub fn host_base(&self) -> u32 {
        BASE + self.index * RANGE
    }

    /// The slot lock and the liveness lock, for a sandbox that holds its
    /// own locks: `flock`s belong to the open file, so a copy passed to
    /// the sandbox keeps them held after this process (and this `Slot`)
    /// is gone, until the sandbox's last copy closes — when it ends.
    pub fn lock_fds(&self) -> [BorrowedFd<'_>; 2] {
        [self._file.as_fd(), self._live_file.as_fd()]
    }

    /// Close our copies of the locks but keep the liveness file: the
    /// sandbox was handed copies ([`Slot::lock_fds`]) and holds them now.
    pub fn hand_over(self) {}

    /// Release both locks and remove the liveness file.
    pub fn release(self) {
        let _ = fs::remove_file(&self.live);
    }
}

fn try_lock(file: &File) -> bool {
    // SAFETY: flock on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

pub fn slots_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("slots")
}

fn open_lock(dir: &Path, name: &str) -> Result<File, SlotError> {
    let io_err = |source| SlotError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let path = dir.join(name);
    let open = || {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
    };
    match open() {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dir).map_err(io_err)?;
            open().map_err(io_err)
        }
        Err(e) => Err(io_err(e)),
    }
}

pub fn live_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("live")
}

/// Remove the liveness file of a sandbox that has ended (one whose lock
/// was held by the sandbox itself, not by a [`Slot`] of ours).
pub fn forget(run_dir: &Path, id: &SandboxId) {
    let _ = fs::remove_file(live_dir(run_dir).join(id.as_str()));
}

/// Take a free slot for sandbox `id`, starting the search at a random slot
/// so concurrent callers rarely contend, and lock `id`'s liveness file.
pub fn acquire(run_dir: &Path, id: &SandboxId) -> Result<Slot, SlotError> {
    let live_dir = live_dir(run_dir);
    let live_file = open_lock(&live_dir, id.as_str())?;
    if !try_lock(&live_file) {
        return Err(SlotError::Io {
            path: live_dir.join(id.as_str()),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        });
    }
    let dir = slots_dir(run_dir);
    let start = rand::random::<u32>() % COUNT;
    for i in 0..COUNT {
        let index = (start + i) % COUNT;
        let file = open_lock(&dir, &format!("{index}.lock"))?;
        if try_lock(&file) {
            return Ok(Slot {
                index,
                _file: file,
                live: live_dir.join(id.as_str()),
                _live_file: live_file,
            });
        }
    }
    let _ = fs::remove_file(live_dir.join(id.as_str()));
    Err(SlotError::Exhausted)
}

/// Whether the owner of sandbox `id` is alive: it holds `live/<id>`. A
/// file nobody holds is removed on the way.
pub fn is_live(run_dir: &Path, id: &SandboxId) -> bool {
    let path = live_dir(run_dir).join(id.as_str());
    let Ok(file) = OpenOptions::new().read(true).open(&path) else {
        return false;
    };
    if try_lock(&file) {
        let _ = fs::remove_file(&path);
        return false;
    }
    true
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
        assert!(a.host_base() >= BASE && a.host_base().is_multiple_of(RANGE));
        assert!(a.host_base().abs_diff(b.host_base()) >= RANGE);
    }

    #[test]
    fn liveness_follows_the_lock() {
        let t = tempfile::tempdir().unwrap();
        let id = SandboxId::from_random(0xabc);
        let slot = acquire(t.path(), &id).unwrap();
        // flock locks belong to the open file description, so a second open
        // in the same process does conflict, as a separate process would.
        assert!(is_live(t.path(), &id));
        assert!(!is_live(t.path(), &SandboxId::from_random(0xdef)));
        slot.release();
        assert!(!is_live(t.path(), &id));
    }

    #[test]
    fn a_dead_owners_file_is_not_live() {
        let t = tempfile::tempdir().unwrap();
        let id = SandboxId::from_random(0x77);
        fs::create_dir_all(live_dir(t.path())).unwrap();
        fs::write(live_dir(t.path()).join(id.as_str()), "").unwrap();
        assert!(!is_live(t.path(), &id));
        assert!(!live_dir(t.path()).join(id.as_str()).exists());
    }
}
