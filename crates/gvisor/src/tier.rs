//! [`GvisorTier`] and [`GvisorInstance`]: the gvisor tier behind
//! brig-core's boundary.
//!
//! A launch, top to bottom ([`GvisorTier::launch`]):
//!
//! 1. the sandbox's directory appears with its owner in it (made aside and
//!    renamed, as the process tier does), so a daemon dying at any later
//!    step leaves something its successor recognises and discards;
//! 2. its root: the template under a tmpfs-backed writable layer
//!    (`rootfs.rs`);
//! 3. its bundle: `config.json` (`bundle.rs`);
//! 4. `runsc run --detach`: gVisor's kernel starts in a session of its own,
//!    brig-agent its init, which binds its socket in the directory shared
//!    with the host;
//! 5. its sandbox process (pid and start time) is recorded, and the launch
//!    returns once the agent's socket answers.
//!
//! Ending one ([`GvisorInstance::kill`], then `wait`): SIGKILL to the
//! sandbox process (gVisor's kernel: every program in the sandbox dies
//! with it, the gofer follows), then `runsc delete --force` (runsc's state,
//! cgroups), the mounts, the directory.

use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use brig_core::{
    Checkpoints, Ended, Instance, Isolation, Launch, Limits, NetworkAttachment, SandboxId, Tier,
    TierError, Usage,
};
use brig_host::Hierarchy;

use crate::bundle::{self, BundleSpec};
use crate::cgroup::Groups;
use crate::rootfs;
use crate::runsc::{self, Platform, Runsc};

/// The default period of a CPU quota (CFS), in microseconds.
pub(crate) const CFS_PERIOD_US: u64 = 100_000;
/// How long a launch waits for the agent's socket to answer.
const AGENT_READY: Duration = Duration::from_secs(30);
pub(crate) const STATE_FILE: &str = "state";
const AGENT_DIR: &str = "agent";
const AGENT_SOCKET: &str = "agent.sock";
/// What the agent writes beside its socket once it let go of it (the
/// agent's `session::RELEASED`).
const AGENT_RELEASED: &str = "released";
pub(crate) const LOG_FILE: &str = "log";
/// In a checkpoint's directory: runsc's image of the sandbox (its kernel,
/// processes and memory), and a copy of its writable layer (gVisor keeps
/// the files of a gofer-served root on the host, outside its image).
const CHECKPOINT_STATE: &str = "state";
const CHECKPOINT_LAYER: &str = "layer";
/// How long a checkpoint waits for the agent to let go of its socket.
const AGENT_LET_GO: Duration = Duration::from_secs(10);

/// How a [`GvisorTier`] is made.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    /// The runsc binary.
    pub runsc: PathBuf,
    /// brig's runtime directory (`/run/brig`): sandboxes live in
    /// `gvisor/<id>`, runsc's state in `gvisor/runsc`.
    pub run_dir: PathBuf,
    /// Where the agent binary is kept for sandboxes to run (a file system
    /// that allows exec: `/run/brig` does not). The daemon's home.
    pub state_dir: PathBuf,
    /// The brig-agent to run in every sandbox.
    pub agent: PathBuf,
    /// Names the launching daemon (its database), as for the process tier.
    pub owner: String,
    /// A platform to insist on (`BRIG_GVISOR_PLATFORM`), else the best this
    /// runsc has ([`brig_host::probe::runsc_platform`]).
    pub platform: Option<String>,
}

/// The gvisor tier: sandboxes under gVisor's `runsc`.
#[derive(Debug)]
pub struct GvisorTier {
    pub(crate) runsc: Runsc,
    pub(crate) dir: PathBuf,
    /// The agent's copy every sandbox binds; `None` for a tier that runs
    /// one-shot commands only ([`GvisorTier::for_commands`]).
    agent: Option<PathBuf>,
    pub(crate) owner: String,
    pub(crate) hierarchy: Hierarchy,
}

/// Where to find runsc: `$BRIG_RUNSC`, else `runsc` on PATH.
pub fn find_runsc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BRIG_RUNSC") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("runsc"))
        .find(|p| p.is_file())
}

pub(crate) fn unavailable(reason: impl Into<String>) -> TierError {
    TierError::Unavailable {
        tier: Isolation::Gvisor,
        reason: reason.into(),
    }
}

impl GvisorTier {
    /// The tier, if this host can offer it: runsc, root, a platform, the
    /// cgroup hierarchy. Removes what dead daemons' sandboxes left.
    pub fn new(config: GvisorConfig) -> Result<GvisorTier, TierError> {
        // SAFETY: geteuid takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(unavailable("runsc needs root"));
        }
        let built = brig_host::probe::runsc_platforms(&config.runsc);
        if built.is_empty() {
            return Err(unavailable(format!(
                "{} does not run (install it: apt-get install runsc)",
                config.runsc.display()
            )));
        }
        let platform = brig_host::probe::runsc_platform(&built, config.platform.as_deref())
            .map(|p| Platform::parse(p).expect("brig-host names known platforms"))
            .map_err(unavailable)?;
        let hierarchy = Hierarchy::detect().map_err(|e| unavailable(e.to_string()))?;
        let dir = config.run_dir.join("gvisor");
        let root = dir.join("runsc");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(|e| unavailable(format!("cannot create {}: {e}", root.display())))?;
        let agent = install_agent(&config.agent, &config.state_dir.join("gvisor"))
            .map_err(|e| unavailable(format!("cannot install the agent for runsc: {e}")))?;
        let tier = GvisorTier {
            runsc: Runsc {
                binary: config.runsc,
                root,
                platform,
            },
            dir,
            agent: Some(agent),
            owner: config.owner,
            hierarchy,
        };
        tier.discard_orphans();
        Ok(tier)
    }

    /// A tier for one-shot commands only (`brig run --isolation gvisor`):
    /// no agent. Its sandboxes are owned by this process (`/proc/<pid>`):
    /// one its caller's death left running is discarded by the next tier
    /// made on this host.
    pub fn for_commands(runsc_bin: PathBuf, run_dir: PathBuf) -> Result<GvisorTier, TierError> {
        // SAFETY: geteuid takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(unavailable("runsc needs root"));
        }
        let built = brig_host::probe::runsc_platforms(&runsc_bin);
        if built.is_empty() {
            return Err(unavailable(format!(
                "{} does not run (install it: apt-get install runsc)",
                runsc_bin.display()
            )));
        }
        let wanted = std::env::var("BRIG_GVISOR_PLATFORM").ok();
        let platform = brig_host::probe::runsc_platform(&built, wanted.as_deref())
            .map(|p| Platform::parse(p).expect("brig-host names known platforms"))
            .map_err(unavailable)?;
        let hierarchy = Hierarchy::detect().map_err(|e| unavailable(e.to_string()))?;
        let dir = run_dir.join("gvisor");
        let root = dir.join("runsc");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(|e| unavailable(format!("cannot create {}: {e}", root.display())))?;
        let tier = GvisorTier {
            runsc: Runsc {
                binary: runsc_bin,
                root,
                platform,
            },
            dir,
            agent: None,
            owner: format!("/proc/{}", std::process::id()),
            hierarchy,
        };
        tier.discard_orphans();
        Ok(tier)
    }

    fn agent(&self) -> Result<&Path, TierError> {
        self.agent.as_deref().ok_or_else(|| TierError::Unsupported {
            tier: Isolation::Gvisor,
            op: "launch a daemon's sandbox",
            reason: "this tier was made for one-shot commands (GvisorTier::for_commands)".into(),
        })
    }

    /// The platform sandboxes run on.
    pub fn platform(&self) -> Platform {
        self.runsc.platform
    }

    pub fn runsc(&self) -> &Runsc {
        &self.runsc
    }

    fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(id.as_str())
    }

    /// Discard sandboxes whose owner's database is gone, or that have no
    /// readable state: no daemon will adopt them.
    fn discard_orphans(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            let Some(id) = e.file_name().to_str().and_then(SandboxId::parse) else {
                continue;
            };
            let orphaned = read_state(&e.path()).is_none_or(|s| !Path::new(&s.owner).exists());
            if orphaned {
                let _ = self.discard(&id);
            }
        }
        // runsc's own files of sandboxes brig has no directory for (a
        // directory is made before runsc is asked for anything): what a
        // create killed early left, such as its lock file.
        if let Ok(files) = fs::read_dir(&self.runsc.root) {
            for f in files.flatten() {
                let name = f.file_name();
                let name = name.to_string_lossy();
                let stray = name
                    .split_once("_sandbox:")
                    .and_then(|(id, _)| SandboxId::parse(id))
                    .is_some_and(|id| !self.sandbox_dir(&id).exists());
                if stray {
                    let _ = fs::remove_file(f.path());
                }
            }
        }
    }

    /// Launch `launch` in `dir`: a new sandbox, or one restored from the
    /// checkpoint in `from`.
    fn start(
        &self,
        launch: &Launch,
        dir: &Path,
        from: Option<&Path>,
    ) -> Result<GvisorInstance, TierError> {
        let id = &launch.id;
        let io = |op: &'static str| move |e: std::io::Error| TierError::failed(id, op, e);
        let aside = self.dir.join(format!(".{id}"));
        let _ = fs::remove_dir_all(&aside);
        fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(aside.join(AGENT_DIR))
            .map_err(io("create its runtime directory"))?;
        fs::write(aside.join(STATE_FILE), format!("{}\n0 0\n", self.owner))
            .and_then(|()| fs::rename(&aside, dir))
            .map_err(io("record its owner"))?;

        let netns = match &launch.network {
            NetworkAttachment::Loopback => None,
            NetworkAttachment::Namespace(ns) => Some(format!(
                "/proc/{}/fd/{}",
                std::process::id(),
                ns.as_raw_fd()
            )),
            other => {
                return Err(TierError::Unsupported {
                    tier: Isolation::Gvisor,
                    op: "attach a sandbox to this network",
                    reason: format!("{other:?} is not known to this tier"),
                })
            }
        };

        if from.is_some() && netns.is_some() {
            return Err(TierError::Invalid(
                "a gvisor sandbox restored from a checkpoint has no network namespace (this \
                 runsc checkpoints gVisor's loopback only): restore it with network none"
                    .into(),
            ));
        }
        let seed = from.map(|f| f.join(CHECKPOINT_LAYER));
        let root = rootfs::prepare(
            dir,
            &launch.template,
            launch.limits.disk.bytes(),
            seed.as_deref(),
        )
        .map_err(|e| match e {
            rootfs::RootfsError::Unresolved(_) => TierError::Invalid(e.to_string()),
            e => TierError::failed(id, "prepare its root filesystem", e),
        })?;
        let compat = crate::compat::install(dir, &root).map_err(io("install its statx shim"))?;
        let bundle_dir = dir.join("bundle");
        fs::create_dir_all(&bundle_dir).map_err(io("create its bundle"))?;
        let config = bundle::config(&BundleSpec {
            id,
            root: &root.path,
            binds: &root.binds,
            masks: &root.masks,
            init: bundle::Init::Agent {
                dir: &dir.join(AGENT_DIR),
                bin: self.agent()?,
            },
            limits: &launch.limits,
            allow_setuid: launch.allow_setuid,
            netns: netns.as_deref(),
            cfs_period_us: CFS_PERIOD_US,
            volumes: &launch.volumes,
            compat: Some(&compat),
        });
        fs::write(
            bundle_dir.join("config.json"),
            serde_json::to_vec_pretty(&config).unwrap_or_default(),
        )
        .map_err(io("write its bundle"))?;

        let log_path = dir.join(LOG_FILE);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io("open its log"))?;
        // With a namespace of its own (brig-net's, linked to the gateway
        // where its policy is enforced): gVisor's host networking *inside
        // that namespace* (runsc joins it for the sandbox process). runsc's
        // own network stack (`sandbox`) is what a newer runsc would use;
        // the 2022 builds refuse it on kernels whose every namespace has
        // net.core.rmem_default, which they take for the host's namespace.
        let network = if netns.is_some() { "host" } else { "none" };
        let pid_file = dir.join("pid");
        let started = match from {
            Some(from) => self.runsc.restore_detached(
                id.as_str(),
                &bundle_dir,
                &from.join(CHECKPOINT_STATE),
                log,
                &pid_file,
            ),
            None => self
                .runsc
                .run_detached(id.as_str(), &bundle_dir, network, log, &pid_file),
        };
        if let Err(e) = started {
            // runsc's stderr went to the log: its last lines say why.
            return Err(TierError::failed(
                id,
                "start runsc",
                format!("{e}: {}", log_tail(dir)),
            ));
        }
        let pid = record_pid(id, dir, &self.owner)?;
        let instance = self.instance(id, dir, pid)?;
        if from.is_some() {
            // Its own identity, then its agent listens again.
            instance.refresh_identity()?;
            instance.wake_agent()?;
        }
        instance.wait_for_agent()?;
        Ok(instance)
    }

    fn instance(
        &self,
        id: &SandboxId,
        dir: &Path,
        pid: libc::pid_t,
    ) -> Result<GvisorInstance, TierError> {
        let pidfd = pidfd_open(pid).map_err(|e| TierError::failed(id, "watch its process", e))?;
        let config = bundle_config(dir);
        Ok(GvisorInstance {
            id: id.clone(),
            process: Mutex::new(SandboxProcess {
                pid,
                pidfd: Arc::new(pidfd),
            }),
            loopback: !joins_netns(&config),
            volumes: bundle::volume_paths(&config),
            owner: self.owner.clone(),
            dir: dir.to_path_buf(),
            runsc: self.runsc.clone(),
            groups: Groups::new(&self.hierarchy, id),
            state: Mutex::new(Phase::Live),
            ended: Mutex::new(None),
        })
    }
}

/// The sandbox process's pid runsc wrote to `dir/pid`, recorded (with its
/// start time) in `dir/state` for a later daemon.
fn record_pid(id: &SandboxId, dir: &Path, owner: &str) -> Result<libc::pid_t, TierError> {
    let pid = fs::read_to_string(dir.join("pid"))
        .ok()
        .and_then(|p| p.trim().parse::<libc::pid_t>().ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            TierError::failed(
                id,
                "start its agent",
                format!("runsc wrote no sandbox pid: {}", log_tail(dir)),
            )
        })?;
    let start = start_time(pid).unwrap_or(0);
    let tmp = dir.join(".state");
    fs::write(&tmp, format!("{owner}\n{pid} {start}\n"))
        .and_then(|()| fs::rename(&tmp, dir.join(STATE_FILE)))
        .map_err(|e| TierError::failed(id, "record its state", e))?;
    Ok(pid)
}

/// Whether the sandbox in `dir` runs in a network namespace of its own
/// (its bundle names one): gVisor's host networking, which this runsc
/// cannot checkpoint.
fn joins_netns(config: &serde_json::Value) -> bool {
    config["linux"]["namespaces"].as_array().is_some_and(|ns| {
        ns.iter()
            .any(|n| n["type"] == "network" && n.get("path").is_some())
    })
}

/// The `config.json` of the sandbox in `dir` (null if unreadable).
fn bundle_config(dir: &Path) -> serde_json::Value {
    fs::read(dir.join("bundle").join("config.json"))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok())
        .unwrap_or_default()
}

/// Copy the agent where sandboxes can exec it (runsc maps binaries from
/// the host file, and `/run/brig` is mounted noexec), replacing an older
/// copy by rename: running sandboxes keep the one they bound.
fn install_agent(agent: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    let bytes = fs::read(agent)?;
    let target = dir.join("brig-agent");
    if fs::read(&target).is_ok_and(|b| b == bytes) {
        return Ok(target);
    }
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".brig-agent.{}", std::process::id()));
    fs::write(&tmp, &bytes)?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o555))?;
    fs::rename(&tmp, &target)?;
    Ok(target)
}

/// The last lines of a sandbox's log (runsc's and the agent's own
/// messages), as one line.
pub(crate) fn log_tail(dir: &Path) -> String {
    let said = fs::read_to_string(dir.join(LOG_FILE)).unwrap_or_default();
    let mut tail: Vec<&str> = said.lines().rev().take(5).collect();
    tail.reverse();
    tail.join(" / ")
}

/// What `state` says.
#[derive(Debug)]
pub(crate) struct Recorded {
    owner: String,
    pid: libc::pid_t,
    start: u64,
}

pub(crate) fn read_state(dir: &Path) -> Option<Recorded> {
    let text = fs::read_to_string(dir.join(STATE_FILE)).ok()?;
    let (owner, rest) = text.split_once('\n')?;
    let mut it = rest.split_whitespace().map(str::parse::<u64>);
    Some(Recorded {
        owner: owner.to_string(),
        pid: libc::pid_t::try_from(it.next()?.ok()?).ok()?,
        start: it.next()?.ok()?,
    })
}

/// The start time of `pid` (field 22 of /proc/PID/stat), to tell it from
/// a later process given the same pid.
pub(crate) fn start_time(pid: libc::pid_t) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub(crate) fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open with a pid and no flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned here alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Wait up to `timeout` for the process behind `pidfd` to end.
pub(crate) fn pidfd_wait(pidfd: &OwnedFd, timeout: Option<Duration>) -> bool {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return false;
                }
                left.as_millis().min(i32::MAX as u128) as i32
            }
            None => -1,
        };
        let mut p = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return true;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            return true;
        }
    }
}

pub(crate) fn kill_pidfd(pidfd: &OwnedFd) {
    // SAFETY: pidfd_send_signal on a pidfd we hold, no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

impl Tier for GvisorTier {
    fn isolation(&self) -> Isolation {
        Isolation::Gvisor
    }

    fn volume_access(&self) -> brig_core::VolumeAccess {
        brig_core::VolumeAccess::Shared
    }

    fn launch(&self, launch: &Launch) -> Result<Box<dyn Instance>, TierError> {
        let dir = self.sandbox_dir(&launch.id);
        if dir.exists() {
            return Err(TierError::Invalid(format!(
                "sandbox {} exists already",
                launch.id
            )));
        }
        match self.start(launch, &dir, None) {
            Ok(instance) => Ok(Box::new(instance)),
            Err(e) => {
                let _ = self.discard(&launch.id);
                Err(e)
            }
        }
    }

    fn checkpoints(&self) -> Checkpoints {
        Checkpoints::MemoryOnLoopback
    }

    fn restore(&self, launch: &Launch, image: &Path) -> Result<Box<dyn Instance>, TierError> {
        let dir = self.sandbox_dir(&launch.id);
        if dir.exists() {
            return Err(TierError::Invalid(format!(
                "sandbox {} exists already",
                launch.id
            )));
        }
        if !launch.volumes.is_empty() {
            return Err(TierError::Unsupported {
                tier: Isolation::Gvisor,
                op: "mount volumes into a sandbox restored from a memory snapshot",
                reason: "its processes resume with the mounts they had when it was \
                         snapshotted: create it without volumes"
                    .into(),
            });
        }
        if !image.join(CHECKPOINT_STATE).is_dir() {
            return Err(TierError::Invalid(format!(
                "{} holds no gvisor checkpoint",
                image.display()
            )));
        }
        match self.start(launch, &dir, Some(image)) {
            Ok(instance) => Ok(Box::new(instance)),
            Err(e) => {
                let _ = self.discard(&launch.id);
                Err(e)
            }
        }
    }

    fn adopt(&self, id: &SandboxId) -> Result<Option<Box<dyn Instance>>, TierError> {
        let dir = self.sandbox_dir(id);
        let live = read_state(&dir).filter(|s| {
            s.pid > 0
                && start_time(s.pid) == Some(s.start)
                && self
                    .runsc
                    .state(id.as_str())
                    .ok()
                    .flatten()
                    .is_some_and(|st| st.pid == i64::from(s.pid) && st.status != "stopped")
        });
        match live {
            Some(s) => Ok(Some(Box::new(self.instance(id, &dir, s.pid)?))),
            None => {
                self.discard(id)?;
                Ok(None)
            }
        }
    }

    fn discard(&self, id: &SandboxId) -> Result<(), TierError> {
        let dir = self.sandbox_dir(id);
        if let Some(s) = read_state(&dir) {
            if s.pid > 0 && start_time(s.pid) == Some(s.start) {
                if let Ok(fd) = pidfd_open(s.pid) {
                    kill_pidfd(&fd);
                    pidfd_wait(&fd, Some(Duration::from_secs(5)));
                }
            }
        }
        // A create a daemon's death cut short may have left a runsc still
        // making the sandbox (`run --detach` outlives its caller): every
        // runsc process naming its directory goes first, or it would
        // finish the sandbox after this teardown.
        kill_processes_naming(&dir);
        teardown(&self.runsc, &Groups::new(&self.hierarchy, id), id, &dir)
    }

    /// `runsc run` of the command, on this process's stdio; see
    /// `oneshot.rs`.
    fn run(
        &self,
        spec: &brig_core::SandboxSpec,
        network: &NetworkAttachment,
    ) -> Result<Box<dyn brig_core::OneShot>, TierError> {
        crate::oneshot::run(self, spec, network)
    }

    fn running(&self) -> Vec<SandboxId> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| read_state(&e.path()).is_some_and(|s| s.owner == self.owner))
            .filter_map(|e| e.file_name().to_str().and_then(SandboxId::parse))
            .collect()
    }
}

/// SIGKILL every process whose command line names `dir` (runsc, its gofer
/// and sandbox carry `--bundle=<dir>/bundle`), and wait (up to 5 s) for
/// them to be gone. A scan of /proc: for discards, which are rare.
fn kill_processes_naming(dir: &Path) {
    let needle = dir.as_os_str().as_encoded_bytes().to_vec();
    let naming = || -> Vec<libc::pid_t> {
        let Ok(entries) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_slice()))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = naming();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            // SAFETY: kill takes integers only.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Remove everything of a sandbox whose processes are dead or dying:
/// runsc's state and cgroups (`runsc delete --force` kills the gofer too),
/// whatever is left in the groups, the mounts, the directory.
pub(crate) fn teardown(
    runsc: &Runsc,
    groups: &Groups,
    id: &SandboxId,
    dir: &Path,
) -> Result<(), TierError> {
    let deleted = runsc.delete(id.as_str());
    groups.remove();
    let unmounted = rootfs::unmount(dir);
    let _ = fs::remove_dir_all(dir);
    let _ = fs::remove_dir_all(dir.with_file_name(format!(".{id}")));
    deleted.map_err(|e| TierError::failed(id, "delete its runsc state", e))?;
    unmounted.map_err(|e| TierError::failed(id, "unmount its root", e))
}

/// Where a [`GvisorInstance`] is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Live,
    /// Let go for a later daemon.
    Released,
    /// Torn down.
    Done,
}

/// The sandbox process (gVisor's kernel) on the host: a checkpoint
/// replaces it (runsc restores the sandbox in a new one).
#[derive(Debug)]
struct SandboxProcess {
    pid: libc::pid_t,
    pidfd: Arc<OwnedFd>,
}

/// One sandbox of the gvisor tier.
#[derive(Debug)]
pub struct GvisorInstance {
    id: SandboxId,
    process: Mutex<SandboxProcess>,
    /// Runs on gVisor's loopback (no namespace): it can be checkpointed.
    loopback: bool,
    /// Where volumes are mounted in it (then it cannot be checkpointed).
    volumes: Vec<String>,
    /// Names the daemon in its state file.
    owner: String,
    dir: PathBuf,
    runsc: Runsc,
    groups: Groups,
    state: Mutex<Phase>,
    ended: Mutex<Option<Ended>>,
}

impl GvisorInstance {
    fn socket(&self) -> PathBuf {
        self.dir.join(AGENT_DIR).join(AGENT_SOCKET)
    }

    /// Until the agent's socket accepts a connection (the agent binds it
    /// a few milliseconds after gVisor's kernel booted), or the sandbox
    /// died, or [`AGENT_READY`] passed.
    fn wait_for_agent(&self) -> Result<(), TierError> {
        let deadline = Instant::now() + AGENT_READY;
        let pidfd = self.pidfd();
        loop {
            if UnixStream::connect(self.socket()).is_ok() {
                return Ok(());
            }
            if pidfd_wait(&pidfd, Some(Duration::from_millis(2))) {
                return Err(TierError::failed(
                    &self.id,
                    "start its agent",
                    format!(
                        "the sandbox ended before its agent listened: {}",
                        log_tail(&self.dir)
                    ),
                ));
            }
            if Instant::now() > deadline {
                return Err(TierError::failed(
                    &self.id,
                    "start its agent",
                    format!("its socket did not answer within {AGENT_READY:?}"),
                ));
            }
        }
    }

    fn pidfd(&self) -> Arc<OwnedFd> {
        Arc::clone(&lock(&self.process).pidfd)
    }

    /// A sandbox restored from another's checkpoint has that one's host
    /// name and machine id: its own, set by the agent's binary run with
    /// CAP_SYS_ADMIN (which the agent itself does not hold).
    fn refresh_identity(&self) -> Result<(), TierError> {
        self.runsc
            .exec_admin(
                self.id.as_str(),
                &[bundle::AGENT_BIN_INSIDE, "--identity", self.id.as_str()],
            )
            .map_err(self.runsc_err("give it its own host name and machine id"))
    }

    /// Tell the agent to bind its socket again (after a checkpoint).
    fn wake_agent(&self) -> Result<(), TierError> {
        self.runsc
            .signal_init(self.id.as_str(), "USR1")
            .map_err(self.runsc_err("wake its agent"))
    }

    /// Have the agent let go of its socket and the host's connection
    /// (gVisor cannot save a host socket), and wait until it says it has
    /// (a file beside the socket, which the sandbox may write but not
    /// remove: the host removes both).
    fn agent_let_go(&self) -> Result<(), TierError> {
        let released = self.dir.join(AGENT_DIR).join(AGENT_RELEASED);
        let _ = fs::remove_file(&released);
        self.runsc
            .signal_init(self.id.as_str(), "USR2")
            .map_err(self.runsc_err("ask its agent to let go of its socket"))?;
        let deadline = Instant::now() + AGENT_LET_GO;
        while !released.exists() {
            if Instant::now() > deadline {
                let _ = self.wake_agent();
                return Err(TierError::Busy {
                    id: self.id.clone(),
                    op: "checkpoint it",
                    reason: format!(
                        "its agent did not let go of its socket within {AGENT_LET_GO:?}: {}",
                        log_tail(&self.dir)
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = fs::remove_file(&released);
        let _ = fs::remove_file(self.socket());
        Ok(())
    }

    /// The checkpoint of a running sandbox: `runsc checkpoint` stops it,
    /// its files are copied while nothing runs, then it is restored in a
    /// new sandbox process from its own image (this runsc's
    /// `--leave-running` does the same, but waits in the foreground).
    fn checkpoint_running(&self, image: &Path) -> Result<(), TierError> {
        let id = self.id.as_str();
        let state = image.join(CHECKPOINT_STATE);
        fs::create_dir_all(&state)
            .map_err(|e| TierError::failed(&self.id, "create the checkpoint's directory", e))?;
        self.agent_let_go()?;
        if let Err(e) = self.runsc.checkpoint(id, &state) {
            // Still running as it was: its agent listens again.
            let _ = self.wake_agent();
            return Err(TierError::failed(&self.id, "checkpoint it", e));
        }
        let saved = rootfs::save_layer(&self.dir, &image.join(CHECKPOINT_LAYER))
            .map_err(|e| TierError::failed(&self.id, "copy its files", e));
        let back = self.restart_from(&state);
        saved.and(back)
    }

    /// Bring the checkpointed (stopped) sandbox back from `state`.
    fn restart_from(&self, state: &Path) -> Result<(), TierError> {
        let id = self.id.as_str();
        self.runsc
            .delete(id)
            .map_err(self.runsc_err("forget its stopped sandbox"))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(LOG_FILE))
            .map_err(|e| TierError::failed(&self.id, "open its log", e))?;
        let pid_file = self.dir.join("pid");
        let _ = fs::remove_file(&pid_file);
        self.runsc
            .restore_detached(id, &self.dir.join("bundle"), state, log, &pid_file)
            .map_err(|e| {
                TierError::failed(
                    &self.id,
                    "restore it after its checkpoint",
                    format!("{e}: {}", log_tail(&self.dir)),
                )
            })?;
        let pid = record_pid(&self.id, &self.dir, &self.owner)?;
        let pidfd =
            pidfd_open(pid).map_err(|e| TierError::failed(&self.id, "watch its process", e))?;
        *lock(&self.process) = SandboxProcess {
            pid,
            pidfd: Arc::new(pidfd),
        };
        self.wake_agent()?;
        self.wait_for_agent()
    }

    fn runsc_err(&self, op: &'static str) -> impl FnOnce(runsc::RunscError) -> TierError + '_ {
        move |e| TierError::failed(&self.id, op, e)
    }

    fn status(&self) -> Result<String, TierError> {
        match self.runsc.state(self.id.as_str()) {
            Ok(Some(s)) => Ok(s.status),
            Ok(None) => Err(TierError::Gone {
                id: self.id.clone(),
            }),
            Err(e) => Err(TierError::failed(&self.id, "read its state", e)),
        }
    }

    fn disk(&self) -> Option<(u64, u64)> {
        let path = std::ffi::CString::new(
            self.dir
                .join("upper")
                .as_os_str()
                .as_encoded_bytes()
                .to_vec(),
        )
        .ok()?;
        // SAFETY: zeroed statvfs is a valid out-parameter.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and out-parameter; the result is checked.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return None;
        }
        let total = st.f_blocks * st.f_frsize;
        Some((total - st.f_bfree * st.f_frsize, total))
    }
}

impl Instance for GvisorInstance {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn pid(&self) -> Option<u32> {
        u32::try_from(lock(&self.process).pid).ok()
    }

    fn connect_agent(&self) -> Result<UnixStream, TierError> {
        UnixStream::connect(self.socket()).map_err(|e| {
            if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused) {
                TierError::Gone {
                    id: self.id.clone(),
                }
            } else {
                TierError::failed(&self.id, "connect to the agent", e)
            }
        })
    }

    fn pause(&self) -> Result<(), TierError> {
        self.runsc
            .pause(self.id.as_str())
            .map_err(self.runsc_err("pause the sandbox"))
    }

    /// A no-op on a sandbox that is not paused (the runtime resumes every
    /// sandbox it adopts).
    fn resume(&self) -> Result<(), TierError> {
        if self.status()? != "paused" {
            return Ok(());
        }
        self.runsc
            .resume(self.id.as_str())
            .map_err(self.runsc_err("resume the sandbox"))
    }

    fn is_paused(&self) -> Result<bool, TierError> {
        Ok(self.status()? == "paused")
    }

    /// Every process but gVisor's pid 1 (the agent), killed through runsc.
    fn end_all_but_agent(&self) -> Result<usize, TierError> {
        let pids = self
            .runsc
            .pids(self.id.as_str())
            .map_err(self.runsc_err("list the sandbox's processes"))?;
        let mut ended = 0;
        for pid in pids.into_iter().filter(|p| *p != 1) {
            // One that exited meanwhile is fine.
            if self.runsc.kill_pid(self.id.as_str(), pid, "KILL").is_ok() {
                ended += 1;
            }
        }
        Ok(ended)
    }

    fn usage(&self) -> Result<Usage, TierError> {
        let mut usage = self
            .groups
            .usage()
            .map_err(|e| TierError::failed(&self.id, "read the sandbox's cgroups", e))?;
        if let Some((used, total)) = self.disk() {
            usage.disk_used_bytes = Some(used);
            usage.disk_total_bytes = Some(total);
        }
        Ok(usage)
    }

    /// The host's groups: gVisor's kernel keeps the memory size it booted
    /// with in its own /proc/meminfo, but what it may take is bounded by
    /// the new limit at once.
    /// A paused sandbox is resumed for the checkpoint (its agent must let
    /// go of its socket) and paused again after: its copies run.
    fn checkpoint(&self, image: &Path) -> Result<(), TierError> {
        self.checkpointable()?;
        let paused = self.is_paused()?;
        if paused {
            self.resume()?;
        }
        let made = self.checkpoint_running(image);
        if paused {
            self.pause()?;
        }
        made
    }

    /// Not with a network (this runsc cannot checkpoint gVisor's host
    /// networking) nor with volumes (they would not be in it): the
    /// runtime then snapshots its files ([`Instance::writable_layer`]).
    fn checkpointable(&self) -> Result<(), TierError> {
        if !self.loopback {
            return Err(TierError::Unsupported {
                tier: Isolation::Gvisor,
                op: "checkpoint a sandbox with a network",
                reason: "this runsc cannot checkpoint gVisor's host networking, which a sandbox \
                         linked to the network runs on: create it with network none to \
                         snapshot its memory"
                    .into(),
            });
        }
        if !self.volumes.is_empty() {
            return Err(TierError::Unsupported {
                tier: Isolation::Gvisor,
                op: "checkpoint a sandbox with volumes",
                reason: format!(
                    "its volumes ({}) live outside it and would not be in the snapshot: \
                     snapshot a gvisor sandbox created without volumes",
                    self.volumes.join(", ")
                ),
            });
        }
        Ok(())
    }

    /// The overlay's upper directory on the host (`<dir>/upper/upper`,
    /// rootfs.rs), its files stored under the ids the sandbox sees (no
    /// user namespace maps them). What gVisor's kernel writes reaches it
    /// at once: this runsc writes regular files through to the gofer's
    /// host file (checked: a file written and held open in a sandbox has
    /// its bytes in the upper before it is closed). Left out: the mount
    /// points of the agent's directory, the statx shim and its
    /// `/etc/ld.so.preload` (runsc makes them in the upper where the
    /// template has none; the sandbox cannot write under a read-only bind).
    fn writable_layer(&self) -> Result<brig_core::WritableLayer, TierError> {
        let upper = self.dir.join("upper").join("upper");
        let dir = std::fs::File::open(&upper)
            .map(OwnedFd::from)
            .map_err(|e| TierError::failed(&self.id, "open its writable layer", e))?;
        let inside = |p: &str| PathBuf::from(p.trim_start_matches('/'));
        Ok(brig_core::WritableLayer {
            dir,
            uid_base: 0,
            gid_base: 0,
            ids: u32::MAX,
            skip: vec![
                inside(bundle::AGENT_DIR),
                inside(crate::compat::STATX_SHIM_INSIDE),
                inside("/etc/ld.so.preload"),
            ],
        })
    }

    fn set_limits(&self, limits: &Limits) -> Result<(), TierError> {
        self.groups
            .set_limits(limits, CFS_PERIOD_US)
            .map_err(|e| TierError::failed(&self.id, "change the sandbox's limits", e))
    }

    fn kill(&self) {
        kill_pidfd(&self.pidfd());
    }

    fn release(&self) {
        let mut state = lock(&self.state);
        if *state == Phase::Live {
            *state = Phase::Released;
        }
    }

    fn wait(&self) -> Result<Ended, TierError> {
        let mut state = lock(&self.state);
        if *state != Phase::Done {
            pidfd_wait(&self.pidfd(), None);
            // The sandbox process is not brig's child: its status is its
            // parent's (init's) to read.
            let oom = self
                .groups
                .usage()
                .ok()
                .and_then(|u| u.oom_kills)
                .is_some_and(|n| n > 0);
            let torn = teardown(&self.runsc, &self.groups, &self.id, &self.dir);
            *state = Phase::Done;
            *lock(&self.ended) = Some(Ended { code: None, oom });
            torn?;
        }
        drop(state);
        Ok(lock(&self.ended).clone().unwrap_or_default())
    }
}

impl Drop for GvisorInstance {
    /// A handle dropped without `wait` or `release` ends its sandbox: an
    /// error path never leaks one.
    fn drop(&mut self) {
        if *lock(&self.state) == Phase::Live {
            self.kill();
            let _ = Instance::wait(self);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
