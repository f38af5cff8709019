//! The agent every daemon sandbox runs as its init: built static and
//! carried inside this binary (build.rs), so it runs in any root
//! filesystem (an alpine, busybox or distroless image has no glibc) and
//! `brig` is one file to install.
//!
//! At start `brig serve` copies it into a sealed memfd (no write, grow,
//! shrink or further seals: nothing, not even root in this process, can
//! change it afterwards) and names it `/proc/self/fd/N` for the process
//! tier, which opens it for each sandbox. `BRIG_AGENT=PATH` runs another
//! agent instead (tests run an earlier build's this way).

use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use anyhow::Context;

/// The static agent, as build.rs made it.
static EMBEDDED: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/brig-agent"));

/// Where the process tier finds the agent: `BRIG_AGENT`, else the
/// embedded one in a sealed memfd that stays open (and so valid) for the
/// rest of this process.
pub fn path() -> anyhow::Result<PathBuf> {
    if std::env::var_os(brig_jail::tier::AGENT_ENV).is_some() {
        return Ok(brig_jail::find_agent()?);
    }
    static SEALED: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    if SEALED.get().is_none() {
        let _ = SEALED.set(sealed_copy().context("cannot hold the embedded brig-agent")?);
    }
    let fd = SEALED.get().expect("set above").as_raw_fd();
    Ok(PathBuf::from(format!("/proc/self/fd/{fd}")))
}

fn sealed_copy() -> std::io::Result<OwnedFd> {
    // SAFETY: a valid C string and flags; the result is checked.
    let fd = unsafe {
        libc::memfd_create(
            c"brig-agent".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(EMBEDDED)?;
    let fd = OwnedFd::from(file);
    // Executable by everyone (the sandbox's init runs as the sandbox's
    // root, nobody on the host), written by nobody from now on.
    // SAFETY: fchmod on a descriptor we own.
    if unsafe { libc::fchmod(fd.as_raw_fd(), 0o555) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Sealing against writes waits for the pages' extra references to
    // drop and gives up with EBUSY when they do not in time, which a
    // loaded host's page batching can cause (seen with a dozen daemons
    // starting at once): try again for up to a second.
    for attempt in 0.. {
        // SAFETY: fcntl on a descriptor we own.
        let r = unsafe {
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL,
            )
        };
        if r == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) || attempt == 20 {
            return Err(e);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(fd)
}
