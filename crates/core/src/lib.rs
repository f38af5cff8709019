//! brig-core: the domain types every other crate speaks.
//!
//! Start with [`SandboxSpec`]: what a caller asks for (template, limits,
//! command environment). [`Limits`] carries the resource bounds with brig's
//! defaults, [`TemplateRef`] names a root filesystem, and the parsers in
//! [`units`] turn human input (`512M`, `30s`) into typed values with errors a
//! person can act on. Nothing here touches the kernel; the `jail` crate turns
//! a validated spec into a running sandbox.
//!
//! [`tier`] is the boundary between the runtime and the isolation
//! backends: [`Tier`] (launch, adopt, discard) and [`Instance`] (agent
//! connection, pause/resume, usage, limits, kill, wait), with
//! [`Isolation`] naming the tiers.
#![forbid(unsafe_code)]

pub mod spec;
pub mod tier;
pub mod units;
pub mod volume;

pub use spec::{
    terminal_type, EnvVar, Limits, RunFile, SandboxId, SandboxSpec, SpecError, TemplateRef,
    UserSpec,
};
pub use tier::{
    Checkpoints, CommandFault, Ended, Instance, Isolation, Launch, NetworkAttachment, OneShot,
    Tier, TierError, TierErrorKind, UnknownIsolation, Usage, VolumeAccess, VolumeMount,
    WritableLayer,
};
pub use units::{parse_duration, parse_size, ByteSize, UnitError};

/// The CPUs this process may use (`std::thread::available_parallelism`),
/// read once. Every create checks its quota against it and the standard
/// library reads several files under /proc and /sys for each answer
/// (cgroup quotas), which showed in the daemon's profile.
pub fn host_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}
