//! brig-jail: the process tier. It turns a validated
//! [`brig_core::SandboxSpec`] into a running, isolated process tree and
//! tears it down again without leaving anything behind.
//!
//! Where to start reading:
//! - [`sandbox::Sandbox::spawn`] is the host side: it takes a uid slot,
//!   clones the sandbox's init into fresh namespaces, writes its uid/gid
//!   maps, hands it the template's mounts, and creates its cgroups while
//!   it builds its root.
//! - [`bringup::run_init`] is the sandbox side, read top to bottom: mounts,
//!   pivot_root, hostname, loopback, rlimits, cgroup namespace, then the
//!   command's process: capabilities, no_new_privs, seccomp, exec — with
//!   the reason for each step at the step.
//! - [`sys::Syscalls`] is the one trait every privileged call goes through;
//!   [`sys::Recording`] is its fake, so most tests run unprivileged.
//! - [`cgroup`] (v1 and v2, in the hierarchy brig-host detects),
//!   [`seccomp`] (policy compiled at build time from
//!   `resources/seccomp/`), [`slot`] (uid ranges and liveness locks),
//!   [`reconcile`] (reaping what a killed brig left behind), [`netpool`]
//!   (pre-made network namespaces for the warm path), [`fdpass`]
//!   (descriptors between host and init) and [`trace`]
//!   (`BRIG_TRACE_SPAWN=1`). What the host offers (`brig doctor`) is
//!   brig-host's.

pub mod bringup;
pub mod cgroup;
pub mod cpus;
pub mod error;
pub mod fdpass;
pub mod knockout;
pub mod netpool;
pub mod plan;
pub mod reconcile;
pub mod sandbox;
pub mod seccomp;
pub mod slot;
pub mod sys;
pub mod template;
pub mod tier;
pub mod trace;
pub mod views;

pub use cgroup::{CgroupControls, CgroupStats, DiskStats};
pub use error::JailError;
pub use netpool::NetnsPool;
pub use sandbox::{raise_fd_limit, Exit, Extras, Killer, Sandbox, SpawnOptions};
pub use tier::{find_agent, NoAgent, ProcessTier};
