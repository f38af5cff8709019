//! A pool of pre-made network namespaces, so that creating one (0.3-0.5 ms
//! here, with multi-millisecond stalls while the kernel tears earlier ones
//! down) happens off the spawn path.
//!
//! A filler thread keeps `target` namespaces ready. Each is made by the
//! thread `unshare(CLONE_NEWNET)`-ing itself, bringing loopback up, and
//! keeping two descriptors: the namespace, and a detached read-only sysfs
//! mount made while inside it. The sysfs is needed because a pooled
//! namespace belongs to the host's user namespace, and only the owner of a
//! network namespace may mount a sysfs for it; the sandbox attaches the
//! ready-made one instead (as it attaches its template).
//!
//! A pooled namespace is used once and dropped with its sandbox: reusing
//! one would let a sandbox see traces of the previous one (sockets in
//! TIME_WAIT, counters).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

use crate::sys::{Errno, Linux, Syscalls};

/// One ready network namespace.
#[derive(Debug)]
pub struct PooledNet {
    pub ns: OwnedFd,
    /// A detached, read-only sysfs mount of this namespace.
    pub sysfs: OwnedFd,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<PooledNet>,
    stop: bool,
    failed: Option<Errno>,
}

/// Pre-made network namespaces, refilled in the background.
#[derive(Debug)]
pub struct NetnsPool {
    target: usize,
    state: Mutex<State>,
    wake: Condvar,
}

impl NetnsPool {
    /// Start a pool keeping `target` namespaces ready.
    pub fn start(target: usize) -> std::io::Result<Arc<Self>> {
        let pool = Arc::new(NetnsPool {
            target: target.max(1),
            state: Mutex::default(),
            wake: Condvar::new(),
        });
        let filler = Arc::clone(&pool);
        std::thread::Builder::new()
            .name("brig-netns-pool".into())
            .spawn(move || filler.fill_forever())?;
        Ok(pool)
    }

    /// A ready namespace, if any. Never blocks on creating one.
    pub fn take(&self) -> Option<PooledNet> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let net = st.ready.pop_front();
        self.wake.notify_one();
        net
    }

    /// Wait until the pool is full (for benchmarks and warm starts).
    pub fn wait_full(&self) -> Result<(), Errno> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while st.ready.len() < self.target {
            if let Some(e) = st.failed {
                return Err(e);
            }
            st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        Ok(())
    }

    fn fill_forever(&self) {
        loop {
            {
                let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
                while !st.stop && st.ready.len() >= self.target {
                    st = self.wake.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                if st.stop {
                    return;
                }
            }
            let made = make_one();
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            match made {
                Ok(net) => st.ready.push_back(net),
                Err(e) => {
                    // Remember why, stop trying: spawns fall back to a
                    // fresh namespace each.
                    st.failed = Some(e);
                    st.stop = true;
                }
            }
            self.wake.notify_all();
        }
    }
}

impl Drop for NetnsPool {
    fn drop(&mut self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
        self.wake.notify_all();
    }
}

impl PooledNet {
    /// Ready a namespace made elsewhere (brig-net's, linked to the
    /// gateway) for a spawn: its sysfs is made from inside it, on a
    /// short-lived thread.
    pub fn for_namespace(ns: OwnedFd) -> Result<PooledNet, Errno> {
        let inside = ns
            .try_clone()
            .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
        let sysfs = std::thread::spawn(move || {
            enter(&inside)?;
            detached_sysfs()
        })
        .join()
        .map_err(|_| Errno(libc::EIO))??;
        Ok(PooledNet { ns, sysfs })
    }
}

/// The calling thread's network namespace.
pub(crate) fn current() -> Result<OwnedFd, Errno> {
    std::fs::File::open("/proc/thread-self/ns/net")
        .map(OwnedFd::from)
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// Make one namespace on the calling (filler) thread, which moves into it
/// and stays there until the next one: the thread's own network namespace
/// is of no use to anything else.
fn make_one() -> Result<PooledNet, Errno> {
    let sys = Linux;
    sys.unshare(libc::CLONE_NEWNET)?;
    sys.loopback_up()?;
    let sysfs = detached_sysfs()?;
    let ns = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(|e| Errno(e.raw_os_error().unwrap_or(libc::EIO)))?;
    Ok(PooledNet {
        ns: OwnedFd::from(ns),
        sysfs,
    })
}

/// fsopen/fsconfig/fsmount: a sysfs instance of the current network
/// namespace, read-only, not attached anywhere yet.
fn detached_sysfs() -> Result<OwnedFd, Errno> {
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const MOUNT_ATTR_RDONLY: libc::c_uint = 0x1;
    const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
    const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
    const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x8;
    // The new mount API has its own close-on-exec flags (not O_CLOEXEC).
    const FSOPEN_CLOEXEC: libc::c_uint = 0x1;
    const FSMOUNT_CLOEXEC: libc::c_uint = 0x1;
    // SAFETY: fsopen with a constant name; returns a new descriptor.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"sysfs".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fresh descriptor.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    // SAFETY: fsconfig CMD_CREATE takes no key or value.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            0usize,
            0usize,
            0,
        )
    };
    if r < 0 {
        return Err(Errno::last());
    }
    let attrs = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
    // SAFETY: fsmount on the configured context; returns a mount fd.
    let m = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) };
    if m < 0 {
        return Err(Errno::last());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(m as i32) })
}

/// Enter `ns` on the calling thread (network namespaces are per thread).
pub(crate) fn enter(ns: &OwnedFd) -> Result<(), Errno> {
    // SAFETY: setns with a namespace descriptor we own.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(Errno::last());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_fills_and_hands_out_distinct_namespaces() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            assert!(
                std::env::var("BRIG_TEST_STRICT").map_or(true, |v| v != "1"),
                "BRIG_TEST_STRICT=1 and creating network namespaces needs root"
            );
            eprintln!("skipping: creating network namespaces needs root");
            return;
        }
        let pool = NetnsPool::start(2).unwrap();
        pool.wait_full().unwrap();
        let a = pool.take().unwrap();
        let b = pool.take().unwrap();
        let ino = |fd: &OwnedFd| {
            std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd())).map(|m| {
                use std::os::unix::fs::MetadataExt;
                m.ino()
            })
        };
        assert_ne!(ino(&a.ns).unwrap(), ino(&b.ns).unwrap());
        let host = std::fs::metadata("/proc/self/ns/net").map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.ino()
        });
        assert_ne!(
            ino(&a.ns).unwrap(),
            host.unwrap(),
            "the test thread stays in its own namespace"
        );
        pool.wait_full().unwrap();
    }
}
