//! The boundary between the runtime and the isolation tiers.
//!
//! The runtime (manager, pool, expiry, reconcile) speaks only to a
//! [`Tier`]; everything a tier does differently — namespaces and cgroups
//! (`process`), an application kernel (`gvisor`), a virtual machine
//! (`vm`) — stays behind it. The flow:
//!
//! 1. the runtime picks the sandbox's id and writes its record (state
//!    `creating`) *before* anything exists on the host, so a daemon that
//!    dies mid-create leaves a record that names what to clean up;
//! 2. it asks [`Tier::launch`] for a sandbox from a [`Launch`]: the
//!    resolved template, limits and network attachment. The tier starts
//!    brig-agent inside it and returns an [`Instance`];
//! 3. the runtime reaches the agent through [`Instance::connect_agent`] (a
//!    byte stream speaking the brig protocol) and drives the sandbox's
//!    life through the instance: pause, resume, usage, limits, kill, wait;
//! 4. after a restart, [`Tier::adopt`] finds a sandbox an earlier daemon
//!    left running by its id, and [`Tier::discard`] removes whatever is
//!    left of one that must not live on. Sandboxes outlive the daemon:
//!    a tier never ties a sandbox's life to the daemon process.
//!
//! `brig run` crosses the same boundary with [`Tier::run`]: one command in
//! a fresh sandbox wired to the caller's stdio (no agent), which — unlike
//! a daemon's — dies with the caller and ends when the command does
//! ([`OneShot`]).
//!
//! A tier that cannot do something answers [`TierError::Unsupported`],
//! never a panic or a silent no-op.

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::str::FromStr;

use crate::spec::{Limits, SandboxId, SandboxSpec, TemplateRef};

/// How strongly a sandbox is isolated from the host.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// Namespaces, seccomp, cgroups, no capabilities (brig-jail).
    #[default]
    Process,
    /// The same root filesystem under gVisor's application kernel.
    Gvisor,
    /// A virtual machine with its own Linux kernel.
    Vm,
}

impl Isolation {
    pub const ALL: [Isolation; 3] = [Isolation::Process, Isolation::Gvisor, Isolation::Vm];

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Process => "process",
            Isolation::Gvisor => "gvisor",
            Isolation::Vm => "vm",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An isolation tier name brig does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown isolation tier {input:?}: expected one of process, gvisor, vm")]
pub struct UnknownIsolation {
    pub input: String,
}

impl FromStr for Isolation {
    type Err = UnknownIsolation;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Isolation::ALL
            .into_iter()
            .find(|i| i.as_str() == s)
            .ok_or_else(|| UnknownIsolation {
                input: s.to_string(),
            })
    }
}

/// How a sandbox is attached to the network.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum NetworkAttachment {
    /// Loopback only: nothing leaves the sandbox.
    #[default]
    Loopback,
    /// A network namespace made for the sandbox by brig-net, linked to
    /// its gateway (where the sandbox's policy is enforced) and owned by
    /// the host's user namespace: the tier starts the sandbox inside it.
    Namespace(std::sync::Arc<OwnedFd>),
}

impl PartialEq for NetworkAttachment {
    fn eq(&self, other: &Self) -> bool {
        use std::os::fd::AsRawFd;
        match (self, other) {
            (Self::Loopback, Self::Loopback) => true,
            (Self::Namespace(a), Self::Namespace(b)) => a.as_raw_fd() == b.as_raw_fd(),
            _ => false,
        }
    }
}

/// Everything a tier needs to start one sandbox running brig-agent.
#[derive(Debug, Clone)]
pub struct Launch {
    /// Chosen by the runtime, recorded before the launch.
    pub id: SandboxId,
    /// Resolved: `host` or a directory (never a bare name).
    pub template: TemplateRef,
    /// `limits.timeout` is not the tier's business (the runtime ends the
    /// sandbox when its time is up).
    pub limits: Limits,
    /// Let setuid programs (`sudo`) work inside.
    pub allow_setuid: bool,
    pub network: NetworkAttachment,
    /// Volumes to mount inside, in order. The runtime has validated the
    /// paths ([`VolumeMount`]); a tier that cannot mount them refuses
    /// the launch with [`TierError::Unsupported`].
    pub volumes: Vec<VolumeMount>,
}

/// A persistent volume mounted into a sandbox: a directory on the host
/// (the volume's filesystem, mounted there by the runtime) made to appear
/// at `path` inside, read-write, its files owned on disk by the ids the
/// sandbox sees (the tier maps them to its own host range).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    /// The volume's name, for messages.
    pub name: String,
    /// Where the runtime mounted the volume on the host, or its image
    /// file (as the tier's [`VolumeAccess`] says).
    pub source: std::path::PathBuf,
    /// Absolute, clean, not `/` nor a system directory.
    pub path: String,
}

/// How a tier mounts volumes ([`Tier::volume_access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeAccess {
    /// Not at all.
    None,
    /// The host's mount of each, shared with other sandboxes and the
    /// content API: [`VolumeMount::source`] is that mount's directory.
    Shared,
    /// Each volume's image as a disk of the sandbox's own kernel, which
    /// mounts it: [`VolumeMount::source`] is the image file, and nothing
    /// else may mount the volume meanwhile (two kernels writing one file
    /// system corrupt it).
    Exclusive,
}

/// What a tier keeps of a sandbox in a snapshot ([`Tier::checkpoints`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checkpoints {
    /// Its files only, where it has a writable layer the host can read
    /// ([`Instance::writable_layer`]): processes and memory are not kept.
    Files,
    /// Its memory and processes as well as its files
    /// ([`Instance::checkpoint`], [`Tier::restore`]), for a sandbox on
    /// [`NetworkAttachment::Loopback`] only: the runtime gives one created
    /// with no network no namespace, so that it can be checkpointed, and
    /// restores with no network.
    MemoryOnLoopback,
    /// Its memory and processes as well as its files, whatever its network
    /// attachment: a restore may be given any (the tier moves the restored
    /// sandbox to its new namespace and address).
    Memory,
}

impl Checkpoints {
    /// Whether a snapshot keeps memory and processes.
    pub fn memory(self) -> bool {
        matches!(self, Checkpoints::MemoryOnLoopback | Checkpoints::Memory)
    }
}

/// A sandbox's resource use now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of all its processes since it started, if the tier
    /// accounts it.
    pub cpu_ns: Option<u64>,
    pub memory_bytes: u64,
    pub memory_peak_bytes: Option<u64>,
    /// The memory limit in force (it may have changed since the launch).
    pub memory_limit_bytes: u64,
    /// Tasks alive (processes and threads), the agent included.
    pub pids: u64,
    /// The writable root filesystem, if the tier can tell.
    pub disk_used_bytes: Option<u64>,
    pub disk_total_bytes: Option<u64>,
    /// Processes the kernel's OOM killer killed in it, if the tier can tell.
    pub oom_kills: Option<u64>,
}

/// A sandbox's writable layer (see [`Instance::writable_layer`]): an
/// overlay upper directory (whiteouts as 0/0 character devices, opaque
/// directories marked with `user.overlay.opaque`), open for reading.
#[derive(Debug)]
pub struct WritableLayer {
    pub dir: std::os::fd::OwnedFd,
    /// The host uid and gid its root (uid 0 inside) is stored as: inside
    /// ids are the host's minus these.
    pub uid_base: u32,
    pub gid_base: u32,
    /// How many ids the sandbox has from each base.
    pub ids: u32,
    /// Paths in it (relative to its root) that are the tier's, not the
    /// sandbox's: mount points and files the tier put there, left out of
    /// a snapshot.
    pub skip: Vec<std::path::PathBuf>,
}

/// How a sandbox ended, as far as the tier can tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ended {
    /// The agent's exit status (128+N for a signal), if known: a sandbox
    /// adopted from an earlier daemon has no parent to tell it.
    pub code: Option<i32>,
    /// The kernel's OOM killer fired inside it.
    pub oom: bool,
}

/// Why a tier operation failed. The message is for a person; [`kind`]
/// tells callers how to react.
///
/// [`kind`]: TierError::kind
#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The host lacks what this tier needs (a binary, a kernel feature).
    #[error("the {tier} tier is not available on this host: {reason}")]
    Unavailable { tier: Isolation, reason: String },
    /// The tier cannot do this, at all or on this host (a live memory
    /// change on a VM, a pause without a freezer cgroup).
    #[error("the {tier} tier cannot {op} here: {reason}")]
    Unsupported {
        tier: Isolation,
        op: &'static str,
        reason: String,
    },
    /// The request cannot be satisfied as asked (a CPU limit on a host
    /// without a cpu controller, a template the tier cannot use).
    #[error("{0}")]
    Invalid(String),
    /// The sandbox is gone.
    #[error("sandbox {id} is gone")]
    Gone { id: SandboxId },
    /// The host did not get it done in time this once (a freezer that
    /// did not settle under load); the sandbox is as it was: try again.
    #[error("sandbox {id}: could not {op} this time, try again: {reason}")]
    Busy {
        id: SandboxId,
        op: &'static str,
        reason: String,
    },
    /// A one-shot command ([`Tier::run`]) could not be started: the
    /// message names the command or directory and why.
    #[error("{message}")]
    Command {
        fault: CommandFault,
        message: String,
    },
    /// Anything else: the source says what failed.
    #[error("sandbox {id}: cannot {op}")]
    Failed {
        id: SandboxId,
        op: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why a one-shot command did not start (`brig run` exits 127 or 126, as
/// a shell does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandFault {
    /// No such program on the sandbox's PATH.
    NotFound,
    /// It exists but cannot be executed, or its working directory cannot
    /// be entered.
    NotExecutable,
}

/// What kind of failure a [`TierError`] is, for callers mapping it to a
/// status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierErrorKind {
    Unavailable,
    Unsupported,
    Invalid,
    Gone,
    Busy,
    Command(CommandFault),
    Failed,
}

impl TierError {
    pub fn kind(&self) -> TierErrorKind {
        match self {
            TierError::Unavailable { .. } => TierErrorKind::Unavailable,
            TierError::Unsupported { .. } => TierErrorKind::Unsupported,
            TierError::Invalid(_) => TierErrorKind::Invalid,
            TierError::Gone { .. } => TierErrorKind::Gone,
            TierError::Busy { .. } => TierErrorKind::Busy,
            TierError::Command { fault, .. } => TierErrorKind::Command(*fault),
            TierError::Failed { .. } => TierErrorKind::Failed,
        }
    }

    pub fn failed(
        id: &SandboxId,
        op: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> TierError {
        TierError::Failed {
            id: id.clone(),
            op,
            source: source.into(),
        }
    }
}

/// An isolation backend.
pub trait Tier: Send + Sync + fmt::Debug {
    fn isolation(&self) -> Isolation;

    /// Start a sandbox running brig-agent and return once the agent can be
    /// connected to. On error nothing of the sandbox is left on the host.
    fn launch(&self, launch: &Launch) -> Result<Box<dyn Instance>, TierError>;

    /// Re-attach to a sandbox an earlier daemon launched: `Ok(None)` when
    /// nothing of it is running any more (what is left is cleaned up).
    fn adopt(&self, id: &SandboxId) -> Result<Option<Box<dyn Instance>>, TierError>;

    /// Kill whatever runs of `id` and remove everything it left on the
    /// host. Idempotent: discarding a sandbox that is gone is `Ok`.
    fn discard(&self, id: &SandboxId) -> Result<(), TierError>;

    /// Sandboxes this tier (for this daemon) launched that run on the
    /// host, so that reconcile can tell leftovers no record names.
    fn running(&self) -> Vec<SandboxId>;

    /// Whether and how it mounts volumes ([`Launch::volumes`]); one that
    /// does not is never asked to (the runtime refuses the create first).
    fn volume_access(&self) -> VolumeAccess {
        VolumeAccess::None
    }

    /// What a snapshot of one of its sandboxes keeps.
    fn checkpoints(&self) -> Checkpoints {
        Checkpoints::Files
    }

    /// Start a sandbox from a checkpoint an [`Instance::checkpoint`] of this
    /// tier wrote in `image`: its processes run on where they were, with
    /// their memory and files; `launch` gives its id, template (the one the
    /// checkpointed sandbox ran on), limits and network. Its identity is
    /// its own (host name = its id, a new machine id, fresh kernel
    /// entropy). Returns once the agent can be connected to; on error
    /// nothing of it is left on the host. `image` is not needed after.
    fn restore(&self, launch: &Launch, image: &Path) -> Result<Box<dyn Instance>, TierError> {
        let _ = (launch, image);
        Err(TierError::Unsupported {
            tier: self.isolation(),
            op: "restore a sandbox from a checkpoint",
            reason: "this tier keeps files only in a snapshot (no memory or processes)".into(),
        })
    }

    /// Run `spec.command` in a fresh sandbox of `spec.template`, `limits`,
    /// env, workdir and user, wired to this process's stdin, stdout and
    /// stderr (a new terminal if `spec.tty`): `brig run`. The sandbox dies
    /// with this process and ends when the command does. Returns once the
    /// command is running (or could not start: [`TierError::Command`]).
    /// `network`: as [`Launch::network`].
    fn run(
        &self,
        spec: &SandboxSpec,
        network: &NetworkAttachment,
    ) -> Result<Box<dyn OneShot>, TierError> {
        let _ = (spec, network);
        Err(TierError::Unsupported {
            tier: self.isolation(),
            op: "run a one-shot command",
            reason: "not implemented for this tier".into(),
        })
    }
}

/// A one-shot command's sandbox ([`Tier::run`]), watched by its caller:
/// poll [`OneShot::exit_fd`] (and [`OneShot::oom_fd`]) beside whatever
/// else it waits on, then [`OneShot::wait`].
pub trait OneShot: Send + fmt::Debug {
    /// The terminal's master side, once, if the spec asked for one.
    fn take_pty(&mut self) -> Option<OwnedFd>;
    /// Readable (`POLLIN`) once the command has ended.
    fn exit_fd(&self) -> BorrowedFd<'_>;
    /// Readable once the kernel's OOM killer fired inside, where the tier
    /// learns it by a descriptor (otherwise [`Ended::oom`] tells, after).
    fn oom_fd(&self) -> Option<BorrowedFd<'_>>;
    /// Kill everything in the sandbox; returns at once.
    fn kill(&self);
    /// The caller's terminal is now `rows` × `cols` (with a terminal; the
    /// master [`OneShot::take_pty`] gave has that size already). Only a
    /// tier whose command's terminal is not that master's slave (the vm
    /// tier's is in the guest) has anything to do.
    fn resize(&self, _rows: u16, _cols: u16) {}
    /// Wait for the command and the sandbox's teardown; its status.
    fn wait(self: Box<Self>) -> Result<Ended, TierError>;
}

/// One running sandbox of a tier. Every method takes `&self` and may be
/// called from any thread.
pub trait Instance: Send + Sync + fmt::Debug {
    fn id(&self) -> &SandboxId;

    /// The host pid of its first process, if it has one (for the record
    /// and for people reading `ps`).
    fn pid(&self) -> Option<u32>;

    /// A new connection to the sandbox's agent. The agent serves one
    /// connection at a time: a new one replaces the last (background
    /// processes and PTYs live on; streams of the old one end).
    fn connect_agent(&self) -> Result<UnixStream, TierError>;

    /// Stop every process in the sandbox where it is.
    fn pause(&self) -> Result<(), TierError>;
    fn resume(&self) -> Result<(), TierError>;
    /// Whether it is paused now (after an adoption, the runtime asks).
    fn is_paused(&self) -> Result<bool, TierError>;
    /// Kill every process but the agent (a pause that keeps only the
    /// files). Returns how many were killed.
    fn end_all_but_agent(&self) -> Result<usize, TierError>;

    fn usage(&self) -> Result<Usage, TierError>;
    /// Whether only the sandbox's own kernel can tell how much of its
    /// memory is in use (a vm: the host sees which pages of the guest's
    /// RAM were touched, not which the guest still uses). The runtime then
    /// asks the guest (its `/proc/meminfo`, through the agent) and puts
    /// that in [`Usage::memory_bytes`]; the tier's figure is the fallback.
    fn memory_in_guest(&self) -> bool {
        false
    }
    /// Its writable layer as an overlay upper directory the host may read
    /// (for a filesystem snapshot), with the id mapping its files are
    /// stored under. Read it only while the sandbox is paused: nothing
    /// then changes it. Tiers without one say `Unsupported`.
    fn writable_layer(&self) -> Result<WritableLayer, TierError> {
        Err(TierError::Invalid(
            "this sandbox's tier keeps no writable layer the host can read, so its files \
             cannot be snapshotted (process-tier sandboxes can)"
                .into(),
        ))
    }
    /// Whether [`Instance::checkpoint`] can be taken of it now, on a tier
    /// whose [`Tier::checkpoints`] keep memory; if not, why (the runtime
    /// then snapshots its files, as on a tier that keeps only those).
    fn checkpointable(&self) -> Result<(), TierError> {
        Ok(())
    }
    /// Write the sandbox's memory, processes and files to `image` (an empty
    /// directory) for [`Tier::restore`], and leave it running as it was
    /// (paused if it was). Its agent may let go of every host connection
    /// for the checkpoint (gvisor's does; a vm guest's connection
    /// survives): the caller connects again after. Tiers that cannot
    /// say `Unsupported` (see [`Tier::checkpoints`]).
    fn checkpoint(&self, image: &Path) -> Result<(), TierError> {
        let _ = image;
        Err(TierError::Invalid(
            "this sandbox's tier cannot checkpoint memory and processes (the gvisor and vm tiers can)"
                .into(),
        ))
    }
    /// Change memory and pids limits (and CPU, where given) of the live
    /// sandbox.
    fn set_limits(&self, limits: &Limits) -> Result<(), TierError>;

    /// Kill everything in the sandbox (a paused one too). Returns at once;
    /// [`Instance::wait`] waits for the teardown.
    fn kill(&self);
    /// Let go of the sandbox without ending it: it runs on, for a later
    /// daemon to [`Tier::adopt`]. Dropping an instance that was neither
    /// waited for nor released ends its sandbox.
    fn release(&self);
    /// Block until the sandbox has ended and everything it held on the
    /// host is released. Only the first call reports; later ones return
    /// the same.
    fn wait(&self) -> Result<Ended, TierError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isolation_names_round_trip() {
        for i in Isolation::ALL {
            assert_eq!(i.as_str().parse::<Isolation>().unwrap(), i);
            assert_eq!(serde_json::to_string(&i).unwrap(), format!("\"{i}\""));
        }
        let err = "kvm".parse::<Isolation>().unwrap_err();
        assert!(err.to_string().contains("process, gvisor, vm"), "{err}");
    }
}
