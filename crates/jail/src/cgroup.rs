//! Cgroup limits for one sandbox, on cgroup v1 or v2.
//!
//! Each sandbox gets `brig/<id>` under every controller it uses (v1:
//! `/sys/fs/cgroup/{memory,pids,cpu}/brig/<id>`; v2:
//! `/sys/fs/cgroup/brig/<id>`). The groups sit at the root of each hierarchy,
//! not under the caller's cgroup, so that [`crate::reconcile`] can find every
//! leftover no matter which shell or service started brig.
//!
//! Where the hierarchies are is brig-host's to find ([`Hierarchy::detect`],
//! re-exported here), the same detector `brig doctor` reports from. Its
//! mount points come from mountinfo text, so tests describe a host whose
//! mounts are temporary directories and check what would be written.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brig_core::Limits;
pub use brig_host::cgroup::{DetectError, Hierarchy, PARENT};

/// A cgroup operation that failed, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(transparent)]
    Detect(#[from] DetectError),
    #[error("cgroup v2 controller {controller:?} is not available at {root}: enable it in cgroup.subtree_control of the parent (see `brig doctor`)")]
    MissingController {
        controller: &'static str,
        root: PathBuf,
    },
    #[error("this sandbox has no {controller} cgroup: on cgroup v1 it needs the {controller} controller mounted under /sys/fs/cgroup and a pausable sandbox (the daemon's)")]
    NoGroup { controller: &'static str },
    #[error("the sandbox's tasks did not all stop within {waited:?} ({path} still not frozen; not stopped: {running}); it was thawed again")]
    FreezeTimeout {
        path: PathBuf,
        waited: Duration,
        /// The tasks that had not stopped: tid, name, state and where in
        /// the kernel they waited.
        running: String,
    },
    #[error(
        "{left} process(es) of the sandbox were still alive {waited:?} after SIGKILL ({path}): \
         they are stuck in the kernel (uninterruptible I/O); delete the sandbox, which waits for them"
    )]
    KillTimeout {
        path: PathBuf,
        left: usize,
        waited: Duration,
    },
    #[error("cgroup {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// One sandbox's cgroup(s), removed by [`Cgroup::destroy`].
#[derive(Debug)]
pub struct Cgroup {
    hierarchy: Hierarchy,
    /// One directory per controller (v1) or exactly one (v2).
    dirs: Vec<PathBuf>,
    memory_limit: u64,
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    // O_CREAT is refused by cgroupfs, so a missing control file still fails;
    // it lets the unit tests run against a plain directory.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(io_err("open", path))?;
    f.write_all(value.as_bytes()).map_err(io_err("write", path))
}

fn mkdir(path: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err("mkdir", path)(e)),
    }
}

impl Cgroup {
    /// Create the sandbox's group(s) and write the limits. On failure,
    /// whatever was created is removed again.
    ///
    /// `pausable` also makes the groups [`CgroupControls`] needs on v1 (the
    /// freezer, cpuacct, and cpu even without a CPU limit, so one can be set
    /// later); v2 needs nothing extra.
    pub fn create(
        hierarchy: &Hierarchy,
        name: &str,
        limits: &Limits,
        pausable: bool,
    ) -> Result<Self, CgroupError> {
        let mut cg = Cgroup {
            hierarchy: hierarchy.clone(),
            dirs: Vec::new(),
            memory_limit: limits.memory.bytes(),
        };
        match cg.setup(name, limits, pausable) {
            Ok(()) => Ok(cg),
            Err(e) => {
                let _ = cg.remove_dirs();
                Err(e)
            }
        }
    }

    /// The groups of a sandbox that already exists (one an earlier brig
    /// created), or `None` if it has none. Its memory group comes first,
    /// as in a created one.
    pub fn open(hierarchy: &Hierarchy, name: &str) -> Option<Self> {
        let dirs: Vec<PathBuf> = hierarchy
            .parents()
            .into_iter()
            .map(|p| p.join(name))
            .filter(|d| d.is_dir())
            .collect();
        if dirs.is_empty() {
            return None;
        }
        let mut cg = Cgroup {
            hierarchy: hierarchy.clone(),
            dirs,
            memory_limit: 0,
        };
        cg.memory_limit = cg.memory_limit_now().unwrap_or(0);
        Some(cg)
    }

    fn setup(&mut self, name: &str, limits: &Limits, pausable: bool) -> Result<(), CgroupError> {
        use crate::knockout::{off, Protection};
        let v2 = matches!(self.hierarchy, Hierarchy::V2 { .. });
        let unlimited = if v2 { "max" } else { "-1" };
        let mem = if off(Protection::MemoryLimit) {
            unlimited.to_string()
        } else {
            limits.memory.bytes().to_string()
        };
        let pids_max = if off(Protection::PidsLimit) {
            "max".to_string()
        } else {
            limits.pids.to_string()
        };
        // Co-mounted with cpu, the cpu group accounts CPU.
        let cpuacct_in_cpu = self.hierarchy.cpuacct_in_cpu();
        match self.hierarchy.clone() {
            Hierarchy::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => {
                let memory = self.group(&memory, name)?;
                write(&memory.join("memory.limit_in_bytes"), &mem)?;
                // Without swap accounting the limit covers RAM only; with it,
                // RAM+swap gets the same bound so the sandbox cannot page out
                // past its limit.
                let memsw = memory.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, &mem)?;
                }
                let _ = write(&memory.join("memory.swappiness"), "0");

                let pids = self.group(&pids, name)?;
                write(&pids.join("pids.max"), &pids_max)?;

                // Only the controllers this sandbox uses: each one costs a
                // mkdir, an attach and an rmdir on the spawn path. (The
                // freezer and cpuacct are for pause/resume and metrics,
                // which one-shot runs do not offer.)
                if let Some(cpu) = cpu.filter(|_| limits.cpus.is_some() || pausable) {
                    let dir = self.group(&cpu, name)?;
                    write(&dir.join("cpu.cfs_period_us"), "100000")?;
                    write(&dir.join("cpu.cfs_quota_us"), &v1_quota(limits.cpus))?;
                }
                if let Some(cpuacct) = cpuacct.filter(|_| pausable && !cpuacct_in_cpu) {
                    self.group(&cpuacct, name)?;
                }
                if let Some(freezer) = freezer.filter(|_| pausable) {
                    self.group(&freezer, name)?;
                }
            }
            Hierarchy::V2 { root } => {
                let parent = root.join(PARENT);
                mkdir(&parent)?;
                let available =
                    fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
                for c in ["memory", "pids", "cpu"] {
                    if !available.split_whitespace().any(|a| a == c) {
                        if c == "cpu" && limits.cpus.is_none() {
                            continue;
                        }
                        return Err(CgroupError::MissingController {
                            controller: c,
                            root: root.clone(),
                        });
                    }
                }
                // Enable the controllers for brig's children. Harmless if
                // already enabled.
                let want = available
                    .split_whitespace()
                    .filter(|c| ["memory", "pids", "cpu"].contains(c))
                    .map(|c| format!("+{c}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                write(&parent.join("cgroup.subtree_control"), &want)?;
                let dir = parent.join(name);
                mkdir(&dir)?;
                self.dirs.push(dir.clone());
                write(&dir.join("memory.max"), &mem)?;
                let swap = dir.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                }
                // Going over the limit kills the whole sandbox, not one
                // arbitrary process inside it.
                write(&dir.join("memory.oom.group"), "1")?;
                write(&dir.join("pids.max"), &pids_max)?;
                if let Some(cpus) = limits.cpus {
                    write(&dir.join("cpu.max"), &v2_cpu_max(Some(cpus)))?;
                }
            }
        }
        Ok(())
    }

    /// Make `<mount>/brig/<name>` on one v1 controller's mount (and `brig`
    /// itself on first use) and remember it for attach and destroy.
    fn group(&mut self, mount: &Path, name: &str) -> Result<PathBuf, CgroupError> {
        let parent = mount.join(PARENT);
        if !parent.exists() {
            mkdir(&parent)?;
        }
        let dir = parent.join(name);
        mkdir(&dir)?;
        self.dirs.push(dir.clone());
        Ok(dir)
    }

    /// A handle to this sandbox's groups that outlives borrows of the
    /// [`Cgroup`] (see [`CgroupControls`]).
    pub fn controls(&self, init_pid: libc::pid_t) -> CgroupControls {
        CgroupControls {
            hierarchy: self.hierarchy.clone(),
            dirs: self.dirs.clone().into(),
            init_pid,
        }
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Move `pid` (the sandbox's init, before it runs anything) into every
    /// group; its descendants inherit the membership.
    pub fn attach(&self, pid: libc::pid_t) -> Result<(), CgroupError> {
        let pid = pid.to_string();
        for dir in &self.dirs {
            write(&dir.join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }

    pub fn memory_limit(&self) -> u64 {
        self.memory_limit
    }

    /// The memory limit in force now, read from the group (it may have
    /// been changed through [`CgroupControls::set_limits`]).
    pub fn memory_limit_now(&self) -> Option<u64> {
        let file = match self.hierarchy {
            Hierarchy::V1 { .. } => "memory.limit_in_bytes",
            Hierarchy::V2 { .. } => "memory.max",
        };
        read_u64(&self.memory_dir().join(file)).ok()
    }

    fn memory_dir(&self) -> &Path {
        &self.dirs[0]
    }

    /// Whether the kernel's OOM killer has killed anything in this group.
    pub fn oom_killed(&self) -> bool {
        let (file, key) = match self.hierarchy {
            Hierarchy::V1 { .. } => ("memory.oom_control", "oom_kill"),
            Hierarchy::V2 { .. } => ("memory.events", "oom_kill"),
        };
        fs::read_to_string(self.memory_dir().join(file))
            .ok()
            .and_then(|s| parse_flat_keyed(&s, key))
            .is_some_and(|n| n > 0)
    }

    /// Whether the group's memory use has ever run into its limit (when
    /// it has, the OOM killer may have fired, or be firing).
    pub fn hit_memory_limit(&self) -> bool {
        match self.hierarchy {
            // failcnt stays 0 on some kernels (6.18's v1): a peak within
            // 1/16 of the limit counts too.
            Hierarchy::V1 { .. } => {
                let dir = self.memory_dir();
                let failed = read_u64(&dir.join("memory.failcnt")).is_ok_and(|n| n > 0);
                let peak = read_u64(&dir.join("memory.max_usage_in_bytes")).unwrap_or(0);
                let limit = read_u64(&dir.join("memory.limit_in_bytes")).unwrap_or(u64::MAX);
                failed || peak >= limit - limit / 16
            }
            Hierarchy::V2 { .. } => fs::read_to_string(self.memory_dir().join("memory.events"))
                .ok()
                .and_then(|s| parse_flat_keyed(&s, "max"))
                .is_some_and(|n| n > 0),
        }
    }

    /// On v1, an eventfd that becomes readable when the group hits an OOM
    /// condition, so the caller can kill the whole sandbox (v1 has no
    /// `memory.oom.group`). On v2 the kernel kills the group by itself and
    /// this returns `None`.
    pub fn oom_eventfd(&self) -> Result<Option<OwnedFd>, CgroupError> {
        if !matches!(self.hierarchy, Hierarchy::V1 { .. }) {
            return Ok(None);
        }
        let control_path = self.memory_dir().join("memory.oom_control");
        let control = fs::File::open(&control_path).map_err(io_err("open", &control_path))?;
        // SAFETY: eventfd with constant flags; the result is checked.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io_err("eventfd for", &control_path)(
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: efd is a fresh descriptor we own.
        let efd = unsafe { OwnedFd::from_raw_fd(efd) };
        // The registration lives as long as the eventfd; the control file
        // may be closed afterwards.
        write(
            &self.memory_dir().join("cgroup.event_control"),
            &format!("{} {}", efd.as_raw_fd(), control.as_raw_fd()),
        )?;
        Ok(Some(efd))
    }

    /// Peak memory use in bytes, if the kernel reports it.
    pub fn memory_peak(&self) -> Option<u64> {
        let file = match self.hierarchy {
            Hierarchy::V1 { .. } => "memory.max_usage_in_bytes",
            Hierarchy::V2 { .. } => "memory.peak",
        };
        fs::read_to_string(self.memory_dir().join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// SIGKILL every process still in the group.
    pub fn kill_all(&self) {
        kill_procs(&self.dirs);
    }

    /// Thaw the group if it is frozen (or freezing), so that a pending
    /// SIGKILL is acted on. Harmless on a group that is not frozen.
    pub fn thaw(&self) {
        thaw_dirs(&self.dirs);
    }

    /// Remove the group(s). Processes are killed first; the kernel may need
    /// a moment to release a group after its last task exits, so busy
    /// groups are retried briefly.
    pub fn destroy(mut self) -> Result<(), CgroupError> {
        self.remove_dirs()
    }

    /// Let go of the groups without removing them: the sandbox lives on
    /// (see `Sandbox::release`).
    pub fn forget(mut self) {
        self.dirs.clear();
    }

    fn remove_dirs(&mut self) -> Result<(), CgroupError> {
        let dirs = std::mem::take(&mut self.dirs);
        remove_groups(&dirs)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = self.remove_dirs();
    }
}

/// Kill every process listed in the groups' `cgroup.procs`, then thaw the
/// groups: a frozen task acts on its SIGKILL only once thawed.
pub(crate) fn kill_procs(dirs: &[PathBuf]) {
    for dir in dirs {
        if let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) {
            for pid in procs
                .lines()
                .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
            {
                // SAFETY: kill with a pid read from the group; at worst the
                // process is already gone (ESRCH).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    thaw_dirs(dirs);
}

/// Thaw whichever of `dirs` can be frozen (see [`thaw_dirs`]).
pub fn thaw_groups(dirs: &[PathBuf]) {
    thaw_dirs(dirs);
}

/// Thaw whichever of `dirs` can be frozen: a v1 freezer group, or a v2
/// group. Only writes where the group is not already thawed.
fn thaw_dirs(dirs: &[PathBuf]) {
    for dir in dirs {
        let v1 = dir.join("freezer.state");
        if let Ok(state) = fs::read_to_string(&v1) {
            if state.trim() != "THAWED" {
                let _ = write_existing(&v1, "THAWED");
            }
            continue;
        }
        let v2 = dir.join("cgroup.freeze");
        if fs::read_to_string(&v2).is_ok_and(|s| s.trim() != "0") {
            let _ = write_existing(&v2, "0");
        }
    }
}

/// Write a control file that must already exist (never creates one).
fn write_existing(path: &Path, value: &str) -> Result<(), CgroupError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(io_err("open", path))?;
    f.write_all(value.as_bytes()).map_err(io_err("write", path))
}

fn read_u64(path: &Path) -> Result<u64, CgroupError> {
    let text = fs::read_to_string(path).map_err(io_err("read", path))?;
    let t = text.trim();
    if t == "max" {
        return Ok(u64::MAX);
    }
    t.parse().map_err(|_| CgroupError::Io {
        op: "parse",
        path: path.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidData, format!("not a number: {t:?}")),
    })
}

/// `cpu.cfs_quota_us` for a CPU limit in cores (`-1`: none).
fn v1_quota(cpus: Option<f64>) -> String {
    match cpus {
        Some(c) => ((c * 100_000.0).round() as u64).max(1000).to_string(),
        None => "-1".into(),
    }
}

/// The tasks of the group at `dir` that are not in the freezer's wait,
/// described for an error message: `tid name state wchan`, comma
/// separated.
fn unfrozen_tasks(dir: &Path) -> String {
    // v1 lists threads in `tasks`, v2 in `cgroup.threads`.
    let tids = fs::read_to_string(dir.join("tasks"))
        .or_else(|_| fs::read_to_string(dir.join("cgroup.threads")))
        .unwrap_or_default();
    let described: Vec<String> = tids
        .split_whitespace()
        .filter_map(|tid| {
            let stat = fs::read_to_string(format!("/proc/{tid}/stat")).ok()?;
            let wchan = fs::read_to_string(format!("/proc/{tid}/wchan")).unwrap_or_default();
            if wchan.contains("refrigerator") || wchan.contains("freezer") {
                return None;
            }
            let (name, rest) = stat.split_once(" (")?.1.rsplit_once(") ")?;
            let state = rest.split_whitespace().next().unwrap_or("?");
            Some(format!("{tid} {name} {state} {wchan}"))
        })
        .collect();
    if described.is_empty() {
        "none found".into()
    } else {
        described.join(", ")
    }
}

/// `cpu.max` for a CPU limit in cores.
fn v2_cpu_max(cpus: Option<f64>) -> String {
    match cpus {
        Some(c) => format!("{} 100000", ((c * 100_000.0).round() as u64).max(1000)),
        None => "max 100000".into(),
    }
}

/// How long [`CgroupControls::freeze`] waits for every task to stop.
const FREEZE_WAIT: Duration = Duration::from_secs(5);
/// How long killed tasks may take to leave the group (their memory is
/// freed, the init reaps them).
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What a sandbox's cgroups report at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupStats {
    /// CPU time used by every task of the sandbox, ever (`None` without a
    /// CPU accounting group: a v1 sandbox that is not pausable).
    pub cpu_usage_ns: Option<u64>,
    /// Memory charged to the sandbox now (including its page cache and
    /// tmpfs files).
    pub memory_bytes: u64,
    pub memory_peak_bytes: Option<u64>,
    /// The memory limit in force.
    pub memory_limit: u64,
    /// Tasks (processes and threads) alive.
    pub pids: u64,
    /// Processes the kernel's OOM killer has killed in it, ever.
    pub oom_kills: Option<u64>,
}

/// Disk use of a sandbox's writable root, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStats {
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// A cheap, clonable handle to one sandbox's cgroups: freeze, thaw,
/// statistics and new limits, usable from any thread while another one
/// owns the [`crate::Sandbox`]. It does not own the groups: once the
/// sandbox is torn down, every call fails (the files are gone).
#[derive(Debug, Clone)]
pub struct CgroupControls {
    hierarchy: Hierarchy,
    dirs: std::sync::Arc<[PathBuf]>,
    init_pid: libc::pid_t,
}

impl CgroupControls {
    /// The sandbox's init, as the host sees it.
    pub fn init_pid(&self) -> libc::pid_t {
        self.init_pid
    }

    /// The group of one v1 controller (the only group on v2).
    fn dir(&self, controller: &'static str) -> Result<&Path, CgroupError> {
        match self.hierarchy {
            Hierarchy::V2 { .. } => self.dirs.first().map(PathBuf::as_path),
            Hierarchy::V1 { .. } => {
                // A co-mounted cpuacct's group is the cpu group: one mount.
                let parent = self.hierarchy.mount(controller).map(|m| m.join(PARENT));
                self.dirs
                    .iter()
                    .find(|d| parent.as_deref() == d.parent())
                    .map(PathBuf::as_path)
            }
        }
        .ok_or(CgroupError::NoGroup { controller })
    }

    /// Stop every task of the sandbox, and return once all are stopped.
    pub fn freeze(&self) -> Result<(), CgroupError> {
        let (file, value, events) = match self.hierarchy {
            Hierarchy::V1 { .. } => (self.dir("freezer")?.join("freezer.state"), "FROZEN", None),
            Hierarchy::V2 { .. } => {
                let dir = self.dir("freezer")?;
                (
                    dir.join("cgroup.freeze"),
                    "1",
                    Some(dir.join("cgroup.events")),
                )
            }
        };
        write_existing(&file, value)?;
        // v1 reads FREEZING until every task has stopped; v2 says
        // `frozen 1` in cgroup.events.
        let deadline = Instant::now() + FREEZE_WAIT;
        let mut polls = 0u32;
        loop {
            if self.is_frozen_via(&file, events.as_deref())? {
                return Ok(());
            }
            polls += 1;
            // The v1 freezer can stay FREEZING for good when a task forks
            // or is woken at the wrong moment (seen here: a sandbox thawed
            // and frozen again at re-adoption, 1 in ~60 under load; runc
            // meets it too). Asking again makes it walk the tasks again;
            // now and then a short thaw lets a task caught half-way finish
            // what it was doing.
            if events.is_none() {
                if polls.is_multiple_of(50) {
                    let _ = self.thaw();
                    std::thread::sleep(Duration::from_millis(10));
                }
                if polls.is_multiple_of(10) {
                    write_existing(&file, value)?;
                }
            }
            if Instant::now() >= deadline {
                let running = unfrozen_tasks(file.parent().unwrap_or(&file));
                let _ = self.thaw();
                return Err(CgroupError::FreezeTimeout {
                    path: file,
                    waited: FREEZE_WAIT,
                    running,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Let the sandbox's tasks run again.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        match self.hierarchy {
            Hierarchy::V1 { .. } => {
                write_existing(&self.dir("freezer")?.join("freezer.state"), "THAWED")
            }
            Hierarchy::V2 { .. } => {
                write_existing(&self.dir("freezer")?.join("cgroup.freeze"), "0")
            }
        }
    }

    /// The processes in the sandbox now.
    pub fn processes(&self) -> Result<Vec<libc::pid_t>, CgroupError> {
        let procs = self.dir("pids")?.join("cgroup.procs");
        Ok(fs::read_to_string(&procs)
            .map_err(io_err("read", &procs))?
            .lines()
            .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
            .collect())
    }

    /// End every process of the sandbox but its init (the agent), and
    /// return how many were killed: a filesystem-only pause, or a resume
    /// that reboots. The sandbox must be frozen, so that no process can
    /// fork or exit (and its pid be reused) while the group is read and
    /// signalled. It is thawed for the kills to land (a frozen v1 task acts
    /// on SIGKILL only once thawed; none of them runs user code again) and
    /// left running, with the init alone, once the kernel has removed them.
    pub fn end_all_but_init(&self) -> Result<usize, CgroupError> {
        let procs = self.dir("freezer")?.join("cgroup.procs");
        let others = |procs: &Path| -> Result<Vec<libc::pid_t>, CgroupError> {
            Ok(fs::read_to_string(procs)
                .map_err(io_err("read", procs))?
                .lines()
                .filter_map(|l| l.trim().parse::<libc::pid_t>().ok())
                .filter(|&pid| pid != self.init_pid)
                .collect())
        };
        let victims = others(&procs)?;
        for &pid in &victims {
            // SAFETY: kill with a pid read from the frozen group: it cannot
            // have exited and been reused meanwhile.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        self.thaw()?;
        // The init reaps them; the group lists a task until it is reaped.
        let deadline = Instant::now() + KILL_WAIT;
        loop {
            let left = others(&procs)?.len();
            if left == 0 {
                self.settle_pids(deadline.min(Instant::now() + Duration::from_millis(250)));
                return Ok(victims.len());
            }
            if Instant::now() >= deadline {
                return Err(CgroupError::KillTimeout {
                    path: procs,
                    left,
                    waited: KILL_WAIT,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A killed task leaves `cgroup.procs` when it exits but stays charged
    /// to `pids.current` until the init reaps it: wait (at most until
    /// `deadline`) for the count to come down to the init alone, so that a
    /// freeze right after does not keep a zombie counted for the whole
    /// pause. Best effort: an init with threads of its own never gets there.
    fn settle_pids(&self, deadline: Instant) {
        let Ok(dir) = self.dir("pids") else {
            return;
        };
        let current = dir.join("pids.current");
        while read_u64(&current).is_ok_and(|n| n > 1) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether every task of the sandbox is stopped.
    pub fn is_frozen(&self) -> Result<bool, CgroupError> {
        match self.hierarchy {
            Hierarchy::V1 { .. } => {
                self.is_frozen_via(&self.dir("freezer")?.join("freezer.state"), None)
            }
            Hierarchy::V2 { .. } => {
                let dir = self.dir("freezer")?;
                self.is_frozen_via(&dir.join("cgroup.freeze"), Some(&dir.join("cgroup.events")))
            }
        }
    }

    fn is_frozen_via(&self, file: &Path, events: Option<&Path>) -> Result<bool, CgroupError> {
        match events {
            None => Ok(fs::read_to_string(file)
                .map_err(io_err("read", file))?
                .trim()
                == "FROZEN"),
            Some(events) => {
                let text = fs::read_to_string(events).map_err(io_err("read", events))?;
                Ok(parse_flat_keyed(&text, "frozen") == Some(1))
            }
        }
    }

    /// CPU, memory and task counts now.
    pub fn stats(&self) -> Result<CgroupStats, CgroupError> {
        match self.hierarchy {
            Hierarchy::V1 { .. } => {
                let memory = self.dir("memory")?;
                let cpu_usage_ns = match self.dir("cpuacct") {
                    Ok(d) => Some(read_u64(&d.join("cpuacct.usage"))?),
                    Err(_) => None,
                };
                Ok(CgroupStats {
                    cpu_usage_ns,
                    memory_bytes: read_u64(&memory.join("memory.usage_in_bytes"))?,
                    memory_peak_bytes: read_u64(&memory.join("memory.max_usage_in_bytes")).ok(),
                    memory_limit: read_u64(&memory.join("memory.limit_in_bytes"))?,
                    pids: read_u64(&self.dir("pids")?.join("pids.current"))?,
                    oom_kills: fs::read_to_string(memory.join("memory.oom_control"))
                        .ok()
                        .and_then(|s| parse_flat_keyed(&s, "oom_kill")),
                })
            }
            Hierarchy::V2 { .. } => {
                let dir = self.dir("memory")?;
                let stat_path = dir.join("cpu.stat");
                let stat = fs::read_to_string(&stat_path).map_err(io_err("read", &stat_path))?;
                Ok(CgroupStats {
                    cpu_usage_ns: parse_flat_keyed(&stat, "usage_usec").map(|u| u * 1000),
                    memory_bytes: read_u64(&dir.join("memory.current"))?,
                    memory_peak_bytes: read_u64(&dir.join("memory.peak")).ok(),
                    memory_limit: read_u64(&dir.join("memory.max"))?,
                    pids: read_u64(&dir.join("pids.current"))?,
                    oom_kills: fs::read_to_string(dir.join("memory.events"))
                        .ok()
                        .and_then(|s| parse_flat_keyed(&s, "oom_kill")),
                })
            }
        }
    }

    /// The sandbox's memory by kind (`memory.stat`), for its view of its
    /// memory ([`crate::views::meminfo`]).
    pub fn memory_stat(&self) -> Result<crate::views::MemoryStat, CgroupError> {
        let path = self.dir("memory")?.join("memory.stat");
        let text = fs::read_to_string(&path).map_err(io_err("read", &path))?;
        Ok(crate::views::MemoryStat::parse(&text))
    }

    /// Apply new memory, task and CPU limits to the live sandbox
    /// (`limits.disk` and `limits.timeout` are not cgroup limits and are
    /// ignored). Lowering memory below what the sandbox uses makes the
    /// kernel reclaim, and where it cannot, refuse (v1, `EBUSY`) or OOM-kill
    /// (v2).
    pub fn set_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        let mem = limits.memory.bytes();
        match self.hierarchy {
            Hierarchy::V1 { .. } => {
                let memory = self.dir("memory")?;
                let limit = memory.join("memory.limit_in_bytes");
                let memsw = memory.join("memory.memsw.limit_in_bytes");
                // RAM+swap may never be below RAM alone: raise it first, or
                // lower it last.
                let has_memsw = memsw.exists();
                let current = read_u64(&limit)?;
                if has_memsw && mem > current {
                    write_existing(&memsw, &mem.to_string())?;
                }
                write_existing(&limit, &mem.to_string())?;
                if has_memsw && mem <= current {
                    write_existing(&memsw, &mem.to_string())?;
                }
                write_existing(
                    &self.dir("pids")?.join("pids.max"),
                    &limits.pids.to_string(),
                )?;
                match self.dir("cpu") {
                    Ok(cpu) => {
                        write_existing(&cpu.join("cpu.cfs_quota_us"), &v1_quota(limits.cpus))?
                    }
                    Err(e) if limits.cpus.is_some() => return Err(e),
                    Err(_) => {}
                }
            }
            Hierarchy::V2 { .. } => {
                let dir = self.dir("memory")?;
                write_existing(&dir.join("memory.max"), &mem.to_string())?;
                write_existing(&dir.join("pids.max"), &limits.pids.to_string())?;
                let cpu_max = dir.join("cpu.max");
                if limits.cpus.is_some() || cpu_max.exists() {
                    write_existing(&cpu_max, &v2_cpu_max(limits.cpus))?;
                }
            }
        }
        Ok(())
    }

    /// Space used on the sandbox's root filesystem (its writable layer: the
    /// scratch tmpfs, or the overlay whose upper directory is on it), as
    /// the host sees it through `/proc/<init>/root`.
    pub fn disk(&self) -> Result<DiskStats, CgroupError> {
        let root = PathBuf::from(format!("/proc/{}/root", self.init_pid));
        let c = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()).map_err(|e| {
            io_err("statvfs", &root)(io::Error::new(io::ErrorKind::InvalidInput, e))
        })?;
        // SAFETY: statvfs with a NUL-terminated path and a zeroed out-struct.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above; the result is checked.
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return Err(io_err("statvfs", &root)(io::Error::last_os_error()));
        }
        let frsize = st.f_frsize as u64;
        Ok(DiskStats {
            total_bytes: st.f_blocks as u64 * frsize,
            used_bytes: (st.f_blocks as u64).saturating_sub(st.f_bfree as u64) * frsize,
        })
    }

    /// The group directories, one per controller on v1.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

/// rmdir each group, killing stragglers and retrying for up to a second.
pub(crate) fn remove_groups(dirs: &[PathBuf]) -> Result<(), CgroupError> {
    let deadline = Instant::now() + Duration::from_secs(1);
    for dir in dirs {
        loop {
            match fs::remove_dir(dir) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    kill_procs(std::slice::from_ref(dir));
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(io_err("rmdir", dir)(e)),
            }
        }
    }
    Ok(())
}

/// Read `key N` from a flat-keyed cgroup file (`memory.events`,
/// `memory.oom_control`).
fn parse_flat_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_core::ByteSize;

    /// The hierarchy of a host whose cgroups are mounted as plain
    /// directories under `root`: v1 with one mount per entry of `mounts`
    /// (`"cpu,cpuacct"` for a co-mount), or cgroup2 at `root` if `mounts`
    /// is empty. Detected by brig-host from mountinfo text, as on a real
    /// host.
    fn fake_host(root: &Path, mounts: &[&str]) -> Result<Hierarchy, CgroupError> {
        // Mount ids from 40, on a parent (31) outside the text.
        let line = |n: usize, mount: &Path, fstype: &str, options: &str| {
            format!(
                "{} 31 0:{n} / {} rw - {fstype} {fstype} rw{options}\n",
                40 + n,
                mount.display()
            )
        };
        let mut mountinfo = String::new();
        for (n, m) in mounts.iter().enumerate() {
            let dir = root.join(m);
            fs::create_dir_all(&dir).unwrap();
            if m.split(',').any(|c| c == "cpu") {
                fs::write(dir.join("cpu.cfs_quota_us"), "").unwrap();
            }
            mountinfo += &line(n, &dir, "cgroup", &format!(",{m}"));
        }
        if mounts.is_empty() {
            mountinfo += &line(0, root, "cgroup2", "");
        }
        let layout = brig_host::cgroup::CgroupLayout::parse(&mountinfo);
        Ok(Hierarchy::from_layout(&layout)?)
    }

    /// v1 with memory and pids, and cpu if asked.
    fn fake_v1(root: &Path, cpu: bool) -> Hierarchy {
        let mounts: &[&str] = if cpu {
            &["memory", "pids", "cpu"]
        } else {
            &["memory", "pids"]
        };
        fake_host(root, mounts).unwrap()
    }

    #[test]
    fn detects_v1_v2_and_nothing() {
        let t = tempfile::tempdir().unwrap();
        let memory_only = fake_host(t.path(), &["memory"]);
        assert!(
            matches!(
                memory_only,
                Err(CgroupError::Detect(DetectError::NoHierarchy))
            ),
            "{memory_only:?}"
        );
        assert_eq!(
            fake_host(t.path(), &[]).unwrap(),
            Hierarchy::V2 {
                root: t.path().into()
            }
        );
        assert!(matches!(
            fake_v1(t.path(), true),
            Hierarchy::V1 {
                cpu: Some(_),
                freezer: None,
                ..
            }
        ));
    }

    /// `cpu,cpuacct` on one mount: the cpu group accounts, no cpuacct
    /// group is made, and the controls find the cpu group for usage.
    #[test]
    fn v1_co_mounted_cpuacct_uses_the_cpu_group() {
        let t = tempfile::tempdir().unwrap();
        let h = fake_host(t.path(), &["memory", "pids", "cpu,cpuacct", "freezer"]).unwrap();
        assert!(h.cpuacct_in_cpu());
        let cg = Cgroup::create(&h, "c", &Limits::default(), true).unwrap();
        let names: Vec<_> = cg
            .dirs()
            .iter()
            .map(|d| d.strip_prefix(t.path()).unwrap().to_path_buf())
            .collect();
        assert_eq!(
            names,
            ["memory", "pids", "cpu,cpuacct", "freezer"].map(|m| Path::new(m).join("brig/c"))
        );
        let controls = cg.controls(1);
        assert_eq!(
            controls.dir("cpuacct").unwrap(),
            t.path().join("cpu,cpuacct/brig/c")
        );
        std::mem::forget(cg);
    }

    #[test]
    fn v1_writes_limits_into_each_controller() {
        let t = tempfile::tempdir().unwrap();
        let h = fake_v1(t.path(), true);
        let limits = Limits {
            memory: ByteSize::mib(64),
            pids: 32,
            cpus: Some(0.5),
            ..Limits::default()
        };
        let cg = Cgroup::create(&h, "abc", &limits, false).unwrap();
        let read = |p: &str| fs::read_to_string(t.path().join(p)).unwrap();
        assert_eq!(
            read("memory/brig/abc/memory.limit_in_bytes"),
            (64u64 << 20).to_string()
        );
        assert_eq!(read("pids/brig/abc/pids.max"), "32");
        assert_eq!(read("cpu/brig/abc/cpu.cfs_quota_us"), "50000");
        assert_eq!(cg.dirs().len(), 3);
        // A plain directory stands in for cgroupfs here; rmdir of a
        // non-empty directory fails, which proves destroy tries to remove
        // exactly the sandbox's groups.
        assert!(cg.destroy().is_err());
    }

    #[test]
    fn v1_pausable_adds_freezer_cpuacct_and_an_unlimited_cpu_group() {
        let t = tempfile::tempdir().unwrap();
        let h = fake_host(t.path(), &["memory", "pids", "cpu", "freezer", "cpuacct"]).unwrap();
        let cg = Cgroup::create(&h, "p", &Limits::default(), true).unwrap();
        let read = |p: &str| fs::read_to_string(t.path().join(p)).unwrap();
        assert_eq!(read("cpu/brig/p/cpu.cfs_quota_us"), "-1");
        let names: Vec<_> = cg
            .dirs()
            .iter()
            .map(|d| d.strip_prefix(t.path()).unwrap().to_path_buf())
            .collect();
        for want in ["memory", "pids", "cpu", "cpuacct", "freezer"] {
            assert!(
                names.contains(&Path::new(want).join("brig/p")),
                "{want} missing from {names:?}"
            );
        }
        // The controls find each controller's group, and new limits land
        // in the right files.
        let controls = cg.controls(1);
        fs::write(t.path().join("memory/brig/p/memory.limit_in_bytes"), "0").unwrap();
        controls
            .set_limits(&Limits {
                memory: ByteSize::mib(32),
                pids: 7,
                cpus: Some(1.5),
                ..Limits::default()
            })
            .unwrap();
        assert_eq!(
            read("memory/brig/p/memory.limit_in_bytes"),
            (32u64 << 20).to_string()
        );
        assert_eq!(read("pids/brig/p/pids.max"), "7");
        assert_eq!(read("cpu/brig/p/cpu.cfs_quota_us"), "150000");
        std::mem::forget(cg);
    }

    #[test]
    fn v1_without_pausable_has_no_freezer_to_use() {
        let t = tempfile::tempdir().unwrap();
        let h = fake_host(t.path(), &["memory", "pids", "freezer"]).unwrap();
        let cg = Cgroup::create(&h, "q", &Limits::default(), false).unwrap();
        assert_eq!(cg.dirs().len(), 2);
        let err = cg.controls(1).freeze().unwrap_err();
        assert!(
            matches!(
                err,
                CgroupError::NoGroup {
                    controller: "freezer"
                }
            ),
            "{err}"
        );
        std::mem::forget(cg);
    }

    #[test]
    fn v2_writes_limits_and_group_oom() {
        let t = tempfile::tempdir().unwrap();
        fs::write(
            t.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids",
        )
        .unwrap();
        let h = fake_host(t.path(), &[]).unwrap();
        let limits = Limits {
            memory: ByteSize::mib(128),
            pids: 10,
            cpus: Some(2.0),
            ..Limits::default()
        };
        let cg = Cgroup::create(&h, "x1", &limits, false).unwrap();
        let read = |p: &str| fs::read_to_string(t.path().join(p)).unwrap();
        assert_eq!(read("brig/cgroup.subtree_control"), "+cpu +memory +pids");
        assert_eq!(read("brig/x1/memory.max"), (128u64 << 20).to_string());
        assert_eq!(read("brig/x1/memory.oom.group"), "1");
        assert_eq!(read("brig/x1/cpu.max"), "200000 100000");
        assert_eq!(read("brig/x1/pids.max"), "10");
        std::mem::forget(cg);
    }

    #[test]
    fn v2_controls_freeze_thaw_and_read_stats() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
        let h = fake_host(t.path(), &[]).unwrap();
        let cg = Cgroup::create(&h, "v", &Limits::default(), true).unwrap();
        let dir = t.path().join("brig/v");
        let put = |f: &str, v: &str| fs::write(dir.join(f), v).unwrap();
        put("cgroup.freeze", "0");
        put("cgroup.events", "populated 1\nfrozen 1\n");
        put(
            "cpu.stat",
            "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n",
        );
        put("memory.current", "4096\n");
        put("memory.peak", "8192\n");
        put("pids.current", "3\n");
        put("cpu.max", "max 100000\n");
        let c = cg.controls(1);
        c.freeze().unwrap();
        assert_eq!(fs::read_to_string(dir.join("cgroup.freeze")).unwrap(), "1");
        assert!(c.is_frozen().unwrap());
        c.thaw().unwrap();
        assert_eq!(fs::read_to_string(dir.join("cgroup.freeze")).unwrap(), "0");
        let s = c.stats().unwrap();
        assert_eq!(
            s,
            CgroupStats {
                cpu_usage_ns: Some(1_500_000),
                memory_bytes: 4096,
                memory_peak_bytes: Some(8192),
                memory_limit: Limits::default().memory.bytes(),
                pids: 3,
                oom_kills: None,
            }
        );
        put("memory.max", "max\n");
        assert_eq!(c.stats().unwrap().memory_limit, u64::MAX);
        c.set_limits(&Limits {
            cpus: Some(0.25),
            ..Limits::default()
        })
        .unwrap();
        assert_eq!(
            fs::read_to_string(dir.join("cpu.max")).unwrap(),
            "25000 100000"
        );
        std::mem::forget(cg);
    }

    #[test]
    fn v2_without_memory_controller_is_a_clear_error() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("cgroup.controllers"), "cpu pids").unwrap();
        let h = fake_host(t.path(), &[]).unwrap();
        let err = Cgroup::create(&h, "x", &Limits::default(), false).unwrap_err();
        assert!(err.to_string().contains("\"memory\""), "{err}");
    }

    #[test]
    fn flat_keyed_files_parse() {
        assert_eq!(
            parse_flat_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
            Some(3)
        );
        assert_eq!(
            parse_flat_keyed("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n", "oom_kill"),
            Some(1)
        );
        assert_eq!(parse_flat_keyed("", "oom_kill"), None);
    }
}
