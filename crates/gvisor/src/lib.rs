//! brig's gvisor tier: every sandbox runs under gVisor's `runsc`, an
//! application kernel written in Go that implements Linux's system calls
//! itself, so the sandbox's programs never make a system call to the host
//! kernel directly.
//!
//! The principal types: [`GvisorTier`] (brig-core's [`brig_core::Tier`]:
//! launch, adopt, discard, running) and its sandboxes' [`GvisorInstance`]
//! (pause, resume, usage, limits, kill, wait); [`runsc::Runsc`], every
//! runsc invocation; [`bundle::config`], the OCI configuration a sandbox
//! runs from; [`rootfs`], its root on the host.
//!
//! On the host, per sandbox (`/run/brig` is brig's runtime directory):
//!
//! ```text
//! /run/brig/gvisor/<id>/state        "<owner>\n<pid> <start time>\n": the
//!                                    daemon (database) that launched it, its
//!                                    sandbox process (gVisor's kernel)
//! /run/brig/gvisor/<id>/agent/       shared with the sandbox at /run/brig-agent:
//!                                    agent.sock, bound by brig-agent inside
//!                                    (runsc --host-uds=create), dialled by
//!                                    the daemon
//! /run/brig/gvisor/<id>/upper        tmpfs (the disk limit): the writable layer,
//!                                    and compat/ (the statx shim and the
//!                                    /etc/ld.so.preload naming it: [`compat`])
//! /run/brig/gvisor/<id>/rootfs       overlay: the template under that layer
//! /run/brig/gvisor/<id>/bundle/      config.json
//! /run/brig/gvisor/runsc/            runsc --root: runsc's own state
//! /sys/fs/cgroup/.../brig-gvisor/<id> the sandbox's cgroups (runsc makes them)
//! $BRIG_HOME/gvisor/brig-agent       the agent sandboxes bind (exec-able)
//! ```
//!
//! Like the process tier's, a gvisor sandbox outlives the daemon: runsc
//! starts it in a session of its own, parented by nobody brig runs, and a
//! later daemon finds it by that name on disk ([`brig_core::Tier::adopt`]:
//! the recorded pid and start time, and runsc's state agree).
//!
//! `brig run --isolation gvisor` crosses the same boundary
//! ([`brig_core::Tier::run`], `oneshot.rs`): `runsc run` of the command on
//! the caller's stdio. What is not here yet: a terminal for it (`-t`).

pub mod bundle;
pub mod cgroup;
pub mod compat;
mod oneshot;
pub mod rootfs;
pub mod runsc;
pub mod tier;

pub use runsc::Platform;
pub use tier::{find_runsc, GvisorConfig, GvisorInstance, GvisorTier};
