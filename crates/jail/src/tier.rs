//! The process tier behind brig-core's [`Tier`] boundary: how a daemon
//! starts, finds again and ends its sandboxes.
//!
//! Every sandbox runs brig-agent as its pid 1 (`--listen`) and **outlives
//! the daemon** that launched it ([`Extras::detach`]): no
//! `PR_SET_PDEATHSIG`, and the sandbox holds its own uid-slot and liveness
//! locks. What a later daemon needs to find it is a name on disk, as
//! containerd's shims and runsc do:
//!
//! ```text
//! /run/brig/sb/<id>/agent.sock   the agent's listening socket (0700 dir)
//! /run/brig/sb/<id>/state        "<owner>\n<pid> <start time>\n": which daemon
//!                                launched it (its database), its pid 1
//! ```
//!
//! (One small file, one tmpfs page per sandbox: ten thousand fit easily.)
//!
//! `/run/brig` is host-wide (uid ranges and cgroups are); the owner tag
//! keeps two daemons on one host (two homes, or parallel tests) from
//! taking each other's sandboxes for leftovers.
//!
//! [`Tier::launch`] binds the socket, hands the listener to the agent as
//! its stdio, spawns, and records the init; [`Instance::connect_agent`]
//! dials the socket (the agent serves one host at a time, a new one
//! replaces the last); [`Tier::adopt`] reads the record, checks the pid is
//! still that init (start time, cgroup) and opens a pidfd on it;
//! [`Tier::discard`] kills and removes whatever is left of an id.
//!
//! No thread and one descriptor (its agent connection, the runtime's) per
//! sandbox: spawning may happen on any thread (the init no longer dies with
//! the thread that cloned it), pidfds are opened only to kill or wait, and
//! the runtime learns of an end from the agent connection closing.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use brig_core::{
    CommandFault, Ended, Instance, Isolation, Launch, Limits, NetworkAttachment, OneShot,
    SandboxId, SandboxSpec, Tier, TierError, Usage,
};

use crate::cgroup::{Cgroup, CgroupControls, CgroupError};
use crate::error::JailError;
use crate::sandbox::{self, Extras, Killer, Sandbox, SpawnOptions};
use crate::slot;

/// The process tier: sandboxes made of namespaces, seccomp and cgroups.
#[derive(Debug)]
pub struct ProcessTier {
    opts: SpawnOptions,
    /// What a daemon's sandboxes need; `None` for a tier that only runs
    /// one-shot commands ([`ProcessTier::for_commands`]).
    daemon: Option<DaemonSide>,
}

#[derive(Debug)]
struct DaemonSide {
    /// The brig-agent executable started in every sandbox.
    agent: PathBuf,
    /// Names the launching daemon (see the module documentation).
    owner: String,
}

impl ProcessTier {
    /// A tier whose sandboxes run `agent`, for the daemon `owner` names
    /// (its home; [`Tier::running`] lists only the owner's sandboxes).
    /// Prepares the host (runtime directory, cgroup detection, removal of
    /// what dead sandboxes left).
    ///
    /// A daemon holds a descriptor per sandbox (its agent connection), so
    /// this also raises the process's open-file limit as far as it may.
    pub fn new(agent: PathBuf, owner: &str) -> Result<ProcessTier, JailError> {
        let mut opts = SpawnOptions::prepare()?;
        // Not fatal if it fails: fewer sandboxes fit, which doctor's
        // density checks (nr_open) explain.
        let _ = crate::sandbox::raise_fd_limit();
        // Every daemon sandbox can be paused and reports its CPU use.
        opts.pausable = true;
        let tier = ProcessTier {
            opts,
            daemon: Some(DaemonSide {
                agent,
                owner: owner.to_string(),
            }),
        };
        tier.discard_orphans();
        Ok(tier)
    }

    /// A tier for one-shot commands only ([`Tier::run`], `brig run`): no
    /// agent, no daemon to own sandboxes; each dies with this process.
    /// Prepares the host as [`ProcessTier::new`] does, without touching
    /// any daemon's sandboxes.
    pub fn for_commands() -> Result<ProcessTier, TierError> {
        let opts = SpawnOptions::prepare().map_err(|e| TierError::Unavailable {
            tier: Isolation::Process,
            reason: chain(&e),
        })?;
        let mut opts = opts;
        opts.cpus = crate::cpus::CpuPlacer::starting_here();
        Ok(ProcessTier { opts, daemon: None })
    }

    /// The daemon side, or why this tier cannot launch a daemon sandbox.
    fn daemon(&self) -> Result<&DaemonSide, TierError> {
        self.daemon.as_ref().ok_or_else(|| TierError::Unsupported {
            tier: Isolation::Process,
            op: "launch a daemon's sandbox",
            reason: "this tier was made for one-shot commands (ProcessTier::for_commands)".into(),
        })
    }

    /// Discard the sandboxes of daemons whose home is gone (deleted while
    /// they ran), and any without a readable state: no daemon will ever
    /// adopt them. Owners are paths to their database; one that no longer
    /// exists names nobody.
    fn discard_orphans(&self) {
        let Ok(entries) = fs::read_dir(sandboxes_dir(&self.opts.run_dir)) else {
            return;
        };
        for e in entries.flatten() {
            let Some(id) = e.file_name().to_str().and_then(SandboxId::parse) else {
                continue;
            };
            // A directory appears with its state in it (see `spawn`): one
            // without is an older brig's leftover, which nobody can adopt.
            let orphaned =
                read_state(&e.path()).is_none_or(|(owner, _, _)| !Path::new(&owner).exists());
            if orphaned {
                let _ = self.discard(&id);
            }
        }
    }

    pub fn options(&self) -> &SpawnOptions {
        &self.opts
    }

    fn dir(&self, id: &SandboxId) -> PathBuf {
        sandboxes_dir(&self.opts.run_dir).join(id.as_str())
    }

    /// The ready network namespace of `network`, if it is not loopback.
    fn network_of(
        &self,
        id: &SandboxId,
        network: &NetworkAttachment,
    ) -> Result<Option<crate::netpool::PooledNet>, TierError> {
        Ok(match network {
            NetworkAttachment::Loopback => None,
            NetworkAttachment::Namespace(ns) => Some(
                ns.try_clone()
                    .map_err(|e| TierError::failed(id, "take the sandbox's network namespace", e))
                    .and_then(|ns| {
                        crate::netpool::PooledNet::for_namespace(ns).map_err(|e| {
                            TierError::failed(
                                id,
                                "ready the sandbox's network namespace",
                                std::io::Error::from_raw_os_error(e.0),
                            )
                        })
                    })?,
            ),
            other => {
                return Err(TierError::Unsupported {
                    tier: Isolation::Process,
                    op: "attach a sandbox to this network",
                    reason: format!("{other:?} is not known to this tier"),
                })
            }
        })
    }

    fn spawn(&self, launch: &Launch, dir: &Path) -> Result<Sandbox, TierError> {
        let id = &launch.id;
        let DaemonSide { agent, owner } = self.daemon()?;
        let net = self.network_of(id, &launch.network)?;
        let io = |op: &'static str| move |e: std::io::Error| TierError::failed(id, op, e);
        // The directory appears with its owner already in it (made aside,
        // then renamed into place): a daemon that dies at any point from
        // here on leaves a sandbox its successor finds as its own, to
        // adopt or discard, never one nobody owns.
        let aside = sandboxes_dir(&self.opts.run_dir).join(format!(".{id}"));
        let _ = fs::remove_dir_all(&aside);
        fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&aside)
            .map_err(io("create its runtime directory"))?;
        fs::write(aside.join(STATE_FILE), format!("{owner}\n0 0\n"))
            .and_then(|()| fs::rename(&aside, dir))
            .map_err(io("record its owner"))?;

        let listener =
            UnixListener::bind(dir.join(AGENT_SOCKET)).map_err(io("bind the agent's socket"))?;
        let program = File::open(agent).map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                TierError::Unavailable {
                    tier: Isolation::Process,
                    reason: format!(
                        "the agent binary {} does not exist: build it (cargo build -p \
                         brig-agent) or set BRIG_AGENT to its path",
                        agent.display()
                    ),
                }
            } else {
                TierError::failed(id, "open the agent binary", e)
            }
        })?;
        let mut spec = SandboxSpec::new(vec!["brig-agent".into(), "--listen".into()]);
        spec.template = launch.template.clone();
        spec.limits = launch.limits.clone();
        // The runtime ends the sandbox when its time is up.
        spec.limits.timeout = None;
        spec.allow_setuid = launch.allow_setuid;
        let extras = Extras {
            program: Some(OwnedFd::from(program)),
            stdio: Some(OwnedFd::from(listener)),
            as_init: true,
            id: Some(id.clone()),
            detach: true,
            net,
            volumes: launch
                .volumes
                .iter()
                .map(|v| (v.source.clone(), v.path.clone()))
                .collect(),
        };
        let sandbox =
            Sandbox::spawn_with(&spec, &self.opts, extras).map_err(|e| from_jail(id, e))?;
        let start = sandbox::start_time(sandbox.pid()).unwrap_or(0);
        // Written whole, then renamed: a reader never sees half of it.
        let tmp = dir.join(".state");
        fs::write(&tmp, format!("{owner}\n{} {start}\n", sandbox.pid()))
            .and_then(|()| fs::rename(&tmp, dir.join(STATE_FILE)))
            .map_err(io("record its state"))?;
        Ok(sandbox)
    }
}

/// The environment variable that overrides where the agent binary is.
pub const AGENT_ENV: &str = "BRIG_AGENT";

/// The agent binary named by `$BRIG_AGENT` or found next to the running
/// executable does not exist.
#[derive(Debug, thiserror::Error)]
#[error(
    "the agent binary {path} does not exist: build it (cargo build -p brig-agent) or set \
     BRIG_AGENT to its path"
)]
pub struct NoAgent {
    pub path: PathBuf,
}

/// Where the agent binary is: `$BRIG_AGENT`, else `brig-agent` next to the
/// running executable (how it is installed and how cargo builds it).
pub fn find_agent() -> Result<PathBuf, NoAgent> {
    let path = match std::env::var_os(AGENT_ENV) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()
            .map(|exe| exe.with_file_name("brig-agent"))
            .unwrap_or_else(|_| PathBuf::from("brig-agent")),
    };
    if !path.is_file() {
        return Err(NoAgent { path });
    }
    Ok(path)
}

/// Where the process tier keeps one directory per live sandbox.
pub fn sandboxes_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("sb")
}

const AGENT_SOCKET: &str = "agent.sock";
const STATE_FILE: &str = "state";

/// What `state` says: (owner, init pid, init start time).
fn read_state(dir: &Path) -> Option<(String, u64, u64)> {
    let text = fs::read_to_string(dir.join(STATE_FILE)).ok()?;
    let (owner, init) = text.split_once('\n')?;
    let mut it = init.split_whitespace().map(str::parse::<u64>);
    Some((owner.to_string(), it.next()?.ok()?, it.next()?.ok()?))
}

impl Tier for ProcessTier {
    fn isolation(&self) -> Isolation {
        Isolation::Process
    }

    fn volume_access(&self) -> brig_core::VolumeAccess {
        brig_core::VolumeAccess::Shared
    }

    fn launch(&self, launch: &Launch) -> Result<Box<dyn Instance>, TierError> {
        let dir = self.dir(&launch.id);
        if dir.exists() {
            return Err(TierError::Invalid(format!(
                "sandbox {} exists already",
                launch.id
            )));
        }
        match self.spawn(launch, &dir) {
            Ok(sandbox) => Ok(Box::new(ProcessInstance::new(
                sandbox,
                dir,
                &self.opts.cpus,
            ))),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }

    fn adopt(&self, id: &SandboxId) -> Result<Option<Box<dyn Instance>>, TierError> {
        let dir = self.dir(id);
        let adopted = match read_state(&dir) {
            Some((_, pid, start)) => Sandbox::adopt(id, pid as libc::pid_t, start, &self.opts)
                .map_err(|e| from_jail(id, e))?,
            None => None,
        };
        match adopted {
            Some(sandbox) => Ok(Some(Box::new(ProcessInstance::new(
                sandbox,
                dir,
                &self.opts.cpus,
            )))),
            None => {
                self.discard(id)?;
                Ok(None)
            }
        }
    }

    fn discard(&self, id: &SandboxId) -> Result<(), TierError> {
        if let Some(cg) = Cgroup::open(&self.opts.hierarchy, id.as_str()) {
            // Killing its init ends the whole pid namespace; destroy waits
            // for the groups to empty.
            cg.kill_all();
            cg.destroy()
                .map_err(|e| TierError::failed(id, "remove its cgroups", e))?;
        }
        let _ = fs::remove_dir_all(self.dir(id));
        // Removes the liveness file once nothing holds it.
        let _ = slot::is_live(&self.opts.run_dir, id);
        Ok(())
    }

    fn running(&self) -> Vec<SandboxId> {
        let Ok(owner) = self.daemon().map(|d| &d.owner) else {
            return Vec::new();
        };
        let Ok(entries) = fs::read_dir(sandboxes_dir(&self.opts.run_dir)) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| read_state(&e.path()).is_some_and(|(o, _, _)| &o == owner))
            .filter_map(|e| e.file_name().to_str().and_then(SandboxId::parse))
            .collect()
    }

    /// The command runs under brig's init inside the sandbox, which is
    /// tied to this process by `PR_SET_PDEATHSIG`: a `brig run` that dies
    /// takes its sandbox with it.
    fn run(
        &self,
        spec: &SandboxSpec,
        network: &NetworkAttachment,
    ) -> Result<Box<dyn OneShot>, TierError> {
        let id = SandboxId::from_random(rand::random());
        let extras = Extras {
            id: Some(id.clone()),
            net: self.network_of(&id, network)?,
            ..Extras::default()
        };
        let sandbox =
            Sandbox::spawn_with(spec, &self.opts, extras).map_err(|e| command_error(&id, e))?;
        Ok(Box::new(ProcessRun { sandbox }))
    }
}

/// A `brig run` sandbox of the process tier.
#[derive(Debug)]
struct ProcessRun {
    sandbox: Sandbox,
}

impl OneShot for ProcessRun {
    fn take_pty(&mut self) -> Option<OwnedFd> {
        self.sandbox.take_pty()
    }

    fn exit_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: a sandbox that is not detached holds its init's pidfd
        // until it is waited for, which takes `self`: the descriptor
        // outlives the borrow.
        unsafe { BorrowedFd::borrow_raw(self.sandbox.pidfd()) }
    }

    fn oom_fd(&self) -> Option<BorrowedFd<'_>> {
        self.sandbox.oom_fd()
    }

    fn kill(&self) {
        self.sandbox.kill();
    }

    fn wait(self: Box<Self>) -> Result<Ended, TierError> {
        let id = self.sandbox.id().clone();
        let exit = self
            .sandbox
            .wait()
            .map_err(|e| TierError::failed(&id, "wait for the sandbox", e))?;
        Ok(Ended {
            code: Some(exit.code),
            oom: exit.oom,
        })
    }
}

/// A one-shot spawn's error as its caller needs it: the command's fault
/// (127/126), the request's, the host's (the caller may probe the host to
/// explain it), or another failure.
fn command_error(id: &SandboxId, e: JailError) -> TierError {
    match e {
        JailError::CommandNotFound { .. } => TierError::Command {
            fault: CommandFault::NotFound,
            message: e.to_string(),
        },
        JailError::CommandNotExecutable { .. } | JailError::Workdir { .. } => TierError::Command {
            fault: CommandFault::NotExecutable,
            message: e.to_string(),
        },
        JailError::Spec(_)
        | JailError::Template(_)
        | JailError::NoCpuController
        | JailError::Volume(_) => TierError::Invalid(chain(&e)),
        JailError::Namespaces { .. }
        | JailError::Setup { .. }
        | JailError::Cgroup(_)
        | JailError::HostCall { .. }
        | JailError::Host { .. } => TierError::Unavailable {
            tier: Isolation::Process,
            reason: chain(&e),
        },
        e => TierError::failed(id, "start the sandbox", e),
    }
}

/// One sandbox of the process tier.
#[derive(Debug)]
struct ProcessInstance {
    id: SandboxId,
    pid: libc::pid_t,
    killer: Killer,
    controls: Option<CgroupControls>,
    dir: PathBuf,
    /// Taken by the first [`Instance::wait`].
    sandbox: Mutex<Option<Sandbox>>,
    ended: Mutex<Option<Ended>>,
    /// The CPUs it is placed on (none: it may run on all), and where
    /// another placement comes from on a limit change.
    cpus: Mutex<Option<crate::cpus::Placement>>,
    placer: Arc<crate::cpus::CpuPlacer>,
}

impl ProcessInstance {
    /// One adopted from an earlier daemon counts the CPUs its init runs
    /// on as its placement, if they are not all of this host's.
    fn new(
        mut sandbox: Sandbox,
        dir: PathBuf,
        placer: &Arc<crate::cpus::CpuPlacer>,
    ) -> ProcessInstance {
        let cpus = sandbox.take_cpus().or_else(|| {
            crate::cpus::affinity_of(sandbox.pid())
                .ok()
                .and_then(|set| placer.adopt(set))
        });
        ProcessInstance {
            id: sandbox.id().clone(),
            pid: sandbox.pid(),
            killer: sandbox.killer(),
            controls: sandbox.controls(),
            dir,
            sandbox: Mutex::new(Some(sandbox)),
            ended: Mutex::new(None),
            cpus: Mutex::new(cpus),
            placer: Arc::clone(placer),
        }
    }

    fn controls(&self) -> Result<&CgroupControls, TierError> {
        self.controls
            .as_ref()
            .ok_or_else(|| TierError::Unsupported {
                tier: Isolation::Process,
                op: "control the sandbox",
                reason: "it has no cgroups".into(),
            })
    }

    /// A group this host does not have (v1 without a freezer) makes the
    /// operation unsupported here; anything else is a failure.
    fn cgroup_err(&self, op: &'static str) -> impl FnOnce(CgroupError) -> TierError + '_ {
        move |e| match e {
            CgroupError::NoGroup { .. } => TierError::Unsupported {
                tier: Isolation::Process,
                op,
                reason: e.to_string(),
            },
            e => TierError::failed(&self.id, op, e),
        }
    }
}

impl Instance for ProcessInstance {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn pid(&self) -> Option<u32> {
        u32::try_from(self.pid).ok()
    }

    fn connect_agent(&self) -> Result<UnixStream, TierError> {
        UnixStream::connect(self.dir.join(AGENT_SOCKET)).map_err(|e| {
            if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) {
                TierError::Gone {
                    id: self.id.clone(),
                }
            } else {
                TierError::failed(&self.id, "connect to the agent", e)
            }
        })
    }

    /// A freeze that did not settle (the v1 freezer, now and then under
    /// load, after the sandbox was thawed again) is tried once more; a
    /// second miss leaves the sandbox running and says "try again".
    fn pause(&self) -> Result<(), TierError> {
        let controls = self.controls()?;
        let err = match controls.freeze() {
            Err(CgroupError::FreezeTimeout { .. }) => match controls.freeze() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            },
            other => return other.map_err(self.cgroup_err("freeze the sandbox")),
        };
        match err {
            CgroupError::FreezeTimeout { .. } => Err(TierError::Busy {
                id: self.id.clone(),
                op: "pause the sandbox",
                reason: err.to_string(),
            }),
            e => Err(self.cgroup_err("freeze the sandbox")(e)),
        }
    }

    fn resume(&self) -> Result<(), TierError> {
        self.controls()?
            .thaw()
            .map_err(self.cgroup_err("thaw the sandbox"))
    }

    fn is_paused(&self) -> Result<bool, TierError> {
        self.controls()?
            .is_frozen()
            .map_err(self.cgroup_err("read the sandbox's freezer"))
    }

    /// What a reboot leaves: the agent and the files. The sandbox gets a
    /// new boot id too, as a machine that booted again has.
    fn end_all_but_agent(&self) -> Result<usize, TierError> {
        let controls = self.controls()?;
        let ended = controls
            .end_all_but_init()
            .map_err(self.cgroup_err("end the sandbox's processes"))?;
        // Cosmetic (the sandbox's own view): a failure is not the reboot's.
        let _ = write_view(
            controls.init_pid(),
            crate::views::BOOT_ID_FILE,
            &crate::views::random_boot_id(),
        );
        Ok(ended)
    }

    fn usage(&self) -> Result<Usage, TierError> {
        let controls = self.controls()?;
        let stats = controls
            .stats()
            .map_err(self.cgroup_err("read the sandbox's cgroups"))?;
        // Gone with a sandbox that ended meanwhile: report none.
        let disk = controls.disk().ok();
        // Its view of its memory follows each reading (the sampler's every
        // few seconds). Cosmetic: a failure is not the reading's.
        refresh_meminfo(controls, stats.memory_bytes, stats.memory_limit);
        Ok(Usage {
            cpu_ns: stats.cpu_usage_ns,
            memory_bytes: stats.memory_bytes,
            memory_peak_bytes: stats.memory_peak_bytes,
            memory_limit_bytes: stats.memory_limit,
            pids: stats.pids,
            disk_used_bytes: disk.map(|d| d.used_bytes),
            disk_total_bytes: disk.map(|d| d.total_bytes),
            oom_kills: stats.oom_kills,
        })
    }

    fn writable_layer(&self) -> Result<brig_core::WritableLayer, TierError> {
        let controls = self.controls()?;
        writable_layer(controls.init_pid())
            .map_err(|e| TierError::failed(&self.id, "reach the sandbox's writable layer", e))
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), TierError> {
        let controls = self.controls()?;
        controls
            .set_limits(limits)
            .map_err(self.cgroup_err("change the sandbox's limits"))?;
        // Its CPUs follow: placed again (or on all of them without a
        // limit below the host's), every thread moved, and its views of
        // them rewritten where it has them (a sandbox made without a limit
        // has none: it shows the host's and keeps them).
        let mut placed = lock(&self.cpus);
        let wanted = crate::cpus::count(limits.cpus, self.placer.host_count());
        if wanted != placed.as_ref().map(|p| p.cpus().len()) {
            let new = self.placer.place(limits.cpus);
            let set = new
                .as_ref()
                .map_or_else(|| self.placer.allowed().to_vec(), |p| p.cpus().to_vec());
            let pids = controls.processes().unwrap_or_default();
            crate::cpus::set_affinity_of_all(&pids, &set);
            let init = controls.init_pid();
            let _ = write_view(
                init,
                crate::views::CPUS_ONLINE_FILE,
                &crate::views::cpus_online(&set),
            );
            if let Ok(host) = std::fs::read_to_string("/proc/cpuinfo") {
                let _ = write_view(
                    init,
                    crate::views::CPUINFO_FILE,
                    &crate::views::cpuinfo(&host, &set),
                );
            }
            *placed = new;
        }
        drop(placed);
        if let Ok(stats) = controls.stats() {
            refresh_meminfo(controls, stats.memory_bytes, stats.memory_limit);
        }
        Ok(())
    }

    fn kill(&self) {
        self.killer.kill();
    }

    fn wait(&self) -> Result<Ended, TierError> {
        let mut sandbox = lock(&self.sandbox);
        if let Some(sb) = sandbox.take() {
            let adopted = sb.is_adopted();
            let exit = sb.wait();
            let _ = fs::remove_dir_all(&self.dir);
            let ended = match exit {
                Ok(exit) => Ended {
                    code: (!adopted).then_some(exit.code),
                    oom: exit.oom,
                },
                Err(e) => return Err(from_jail(&self.id, e)),
            };
            *lock(&self.ended) = Some(ended);
        }
        drop(sandbox);
        Ok(lock(&self.ended).clone().unwrap_or_default())
    }

    fn release(&self) {
        if let Some(sb) = lock(&self.sandbox).take() {
            sb.release();
        }
    }
}

impl Drop for ProcessInstance {
    /// A handle dropped without `wait` or `release` ends its sandbox: an
    /// error path never leaks one.
    fn drop(&mut self) {
        if lock(&self.sandbox).is_some() {
            self.kill();
            let _ = Instance::wait(self);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A spawn error as the runtime sees it: the request's fault (a bad spec,
/// template, a CPU limit this host cannot enforce) or a failure.
fn from_jail(id: &SandboxId, e: JailError) -> TierError {
    match e {
        JailError::Spec(_) | JailError::Template(_) | JailError::NoCpuController => {
            TierError::Invalid(chain(&e))
        }
        e => TierError::failed(id, "start the sandbox", e),
    }
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// The writable layer of the sandbox whose pid 1 is `init_pid`: its pid 1
/// holds the scratch tmpfs open as [`crate::plan::LAYER_FD`] (the plan's
/// `keep_layer`); the host takes a copy of that descriptor (pidfd_getfd,
/// which needs ptrace rights over it: the host's root has them), checks
/// it is a tmpfs, and opens `upper` under it without following links.
/// Ids from the sandbox's uid and gid maps.
fn writable_layer(init_pid: libc::pid_t) -> std::io::Result<brig_core::WritableLayer> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let err = std::io::Error::last_os_error;
    let unsupported = |why: &str| {
        std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            format!(
                "{why}: it was started by a brig without snapshots, or not on an overlay \
                 (the host template has no layer of its own)"
            ),
        )
    };
    // SAFETY: pidfd_open with a pid and no flags; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, init_pid, 0) };
    if pidfd < 0 {
        return Err(err());
    }
    // SAFETY: a descriptor pidfd_open just returned, owned here alone.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd on the pidfd above; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            pidfd.as_raw_fd(),
            crate::plan::LAYER_FD,
            0,
        )
    };
    if fd < 0 {
        return Err(unsupported("the sandbox holds no writable layer"));
    }
    // SAFETY: a descriptor pidfd_getfd just returned, owned here alone.
    let tmpfs = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // SAFETY: a plain C struct, all zeroes valid.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs on a descriptor we own into that struct; checked.
    if unsafe { libc::fstatfs(tmpfs.as_raw_fd(), &mut st) } != 0 {
        return Err(err());
    }
    if st.f_type != libc::TMPFS_MAGIC {
        return Err(unsupported(
            "the sandbox's descriptor is not its scratch tmpfs",
        ));
    }
    // SAFETY: openat relative to the tmpfs's descriptor with a constant
    // name; the result is checked.
    let upper = unsafe {
        libc::openat(
            tmpfs.as_raw_fd(),
            c"upper".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if upper < 0 {
        return Err(unsupported(
            "the sandbox's scratch tmpfs has no overlay upper",
        ));
    }
    // SAFETY: a descriptor openat just returned, owned here alone.
    let dir = unsafe { OwnedFd::from_raw_fd(upper) };
    let map = |file: &str| -> std::io::Result<(u32, u32)> {
        let text = std::fs::read_to_string(format!("/proc/{init_pid}/{file}"))?;
        let mut f = text.split_whitespace().map(str::parse::<u32>);
        match (f.next(), f.next(), f.next()) {
            (Some(Ok(0)), Some(Ok(base)), Some(Ok(count))) => Ok((base, count)),
            _ => Err(std::io::Error::other(format!(
                "unexpected {file}: {text:?}"
            ))),
        }
    };
    let (uid_base, uids) = map("uid_map")?;
    let (gid_base, gids) = map("gid_map")?;
    Ok(brig_core::WritableLayer {
        dir,
        uid_base,
        gid_base,
        ids: uids.min(gids),
        // Its /run, /tmp and /dev are tmpfs mounts of their own, not in
        // this layer.
        skip: Vec::new(),
    })
}

/// Rewrite the sandbox's /proc/meminfo from its cgroup's figures, where it
/// has one (made when its limit was below the host's memory).
/// The host's text is read once: only its layout and the lines brig has no
/// figure for come from it (every sandbox is sampled every few seconds).
fn refresh_meminfo(controls: &CgroupControls, used: u64, limit: u64) {
    static HOST: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let Some(host) = HOST.get_or_init(|| std::fs::read_to_string("/proc/meminfo").ok()) else {
        return;
    };
    let stat = controls.memory_stat().unwrap_or_default();
    if let Some(view) = crate::views::meminfo(host, limit, used, &stat) {
        let _ = write_view(controls.init_pid(), crate::views::MEMINFO_FILE, &view);
    }
}

/// Rewrite one of the files the sandbox of `init_pid` sees in place of the
/// host's (`views::BOOT_ID_FILE` and the rest of [`crate::views`]), which exists
/// already (a missing one is an error: nothing is created). The path is
/// the sandbox's to change, so it is resolved inside its root with no
/// symlink followed (openat2 `RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS`),
/// opened without blocking (a FIFO put there cannot hold the host), and
/// written only if it is a regular file.
pub(crate) fn write_view(init_pid: libc::pid_t, file: &str, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let root = std::fs::File::open(format!("/proc/{init_pid}/root"))?;
    /// `struct open_how` (libc's is non-exhaustive).
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow {
        flags: (libc::O_WRONLY | libc::O_TRUNC | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    let path =
        std::ffi::CString::new(file.trim_start_matches('/')).map_err(std::io::Error::other)?;
    // SAFETY: openat2 with a valid directory fd, C string and open_how of
    // the size passed; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            std::os::fd::AsRawFd::as_raw_fd(&root),
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor openat2 just returned, owned here alone.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd as i32) };
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    file.write_all(contents.as_bytes())
}
