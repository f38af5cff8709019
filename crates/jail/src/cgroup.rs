//! Cgroup limits for one sandbox, on cgroup v1 or v2.
//!
//! Each sandbox gets `brig/<id>` under every controller it uses (v1:
//! `/sys/fs/cgroup/{memory,pids,cpu}/brig/<id>`; v2:
//! `/sys/fs/cgroup/brig/<id>`). The groups sit at the root of each hierarchy,
//! not under the caller's cgroup, so that [`crate::reconcile`] can find every
//! leftover no matter which shell or service started brig.
//!
//! The hierarchy root is a parameter, so tests can point it at a temporary
//! directory and check what would be written.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use brig_core::Limits;

/// Where brig's groups live below each hierarchy root.
pub const PARENT: &str = "brig";

/// A cgroup operation that failed, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable cgroup hierarchy: neither cgroup v2 nor the v1 memory and pids controllers are mounted under {root}; mount them (see `brig doctor`)")]
    NoHierarchy { root: PathBuf },
    #[error("cgroup v2 controller {controller:?} is not available at {root}: enable it in cgroup.subtree_control of the parent (see `brig doctor`)")]
    MissingController {
        controller: &'static str,
        root: PathBuf,
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

/// Which cgroup layout this host uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// One mount per controller under `root` (`root/memory`, `root/pids`…).
    /// `cpu` is optional: without it `--cpus` is refused.
    V1 {
        root: PathBuf,
        cpu: bool,
        freezer: bool,
    },
    /// The unified hierarchy mounted at `root`.
    V2 { root: PathBuf },
}

impl Hierarchy {
    /// Detect the layout under `/sys/fs/cgroup`. A hybrid host (v1
    /// controllers plus an empty unified mount, like this dev machine) is
    /// treated as v1, because that is where the controllers are.
    pub fn detect() -> Result<Self, CgroupError> {
        Self::detect_at(Path::new("/sys/fs/cgroup"))
    }

    pub fn detect_at(root: &Path) -> Result<Self, CgroupError> {
        if root.join("memory/memory.limit_in_bytes").exists() && root.join("pids").is_dir() {
            return Ok(Hierarchy::V1 {
                root: root.to_path_buf(),
                cpu: root.join("cpu/cpu.cfs_quota_us").exists(),
                freezer: root.join("freezer").is_dir(),
            });
        }
        if root.join("cgroup.controllers").exists() {
            return Ok(Hierarchy::V2 {
                root: root.to_path_buf(),
            });
        }
        Err(CgroupError::NoHierarchy {
            root: root.to_path_buf(),
        })
    }

    /// The directories that hold brig's groups (one per controller on v1).
    pub fn parents(&self) -> Vec<PathBuf> {
        match self {
            Hierarchy::V1 { root, cpu, freezer } => {
                let mut v = vec![
                    root.join("memory").join(PARENT),
                    root.join("pids").join(PARENT),
                ];
                if *cpu {
                    v.push(root.join("cpu").join(PARENT));
                }
                if *freezer {
                    v.push(root.join("freezer").join(PARENT));
                }
                v
            }
            Hierarchy::V2 { root } => vec![root.join(PARENT)],
        }
    }

    pub fn supports_cpu_limit(&self) -> bool {
        match self {
            Hierarchy::V1 { cpu, .. } => *cpu,
            Hierarchy::V2 { .. } => true,
        }
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
    pub fn create(hierarchy: &Hierarchy, name: &str, limits: &Limits) -> Result<Self, CgroupError> {
        let mut cg = Cgroup {
            hierarchy: hierarchy.clone(),
            dirs: Vec::new(),
            memory_limit: limits.memory.bytes(),
        };
        match cg.setup(name, limits) {
            Ok(()) => Ok(cg),
            Err(e) => {
                let _ = cg.remove_dirs();
                Err(e)
            }
        }
    }

    fn setup(&mut self, name: &str, limits: &Limits) -> Result<(), CgroupError> {
        let mem = limits.memory.bytes().to_string();
        match self.hierarchy.clone() {
            Hierarchy::V1 { root, cpu, .. } => {
                let memory = self.group(&root, "memory", name)?;
                write(&memory.join("memory.limit_in_bytes"), &mem)?;
                // Without swap accounting the limit covers RAM only; with it,
                // RAM+swap gets the same bound so the sandbox cannot page out
                // past its limit.
                let memsw = memory.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(&memsw, &mem)?;
                }
                let _ = write(&memory.join("memory.swappiness"), "0");

                let pids = self.group(&root, "pids", name)?;
                write(&pids.join("pids.max"), &limits.pids.to_string())?;

                // Only the controllers this sandbox uses: each one costs a
                // mkdir, an attach and an rmdir on the spawn path. (The
                // freezer is for pause/resume, which one-shot runs do not
                // offer; it stays in `parents()` for reconcile.)
                if let (true, Some(cpus)) = (cpu, limits.cpus) {
                    let dir = self.group(&root, "cpu", name)?;
                    write(&dir.join("cpu.cfs_period_us"), "100000")?;
                    write(
                        &dir.join("cpu.cfs_quota_us"),
                        &((cpus * 100_000.0).round() as u64).max(1000).to_string(),
                    )?;
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
                write(&dir.join("pids.max"), &limits.pids.to_string())?;
                if let Some(cpus) = limits.cpus {
                    write(
                        &dir.join("cpu.max"),
                        &format!("{} 100000", ((cpus * 100_000.0).round() as u64).max(1000)),
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Make `<root>/<controller>/brig/<name>` (and `brig` itself on first
    /// use) and remember it for attach and destroy.
    fn group(&mut self, root: &Path, controller: &str, name: &str) -> Result<PathBuf, CgroupError> {
        let parent = root.join(controller).join(PARENT);
        if !parent.exists() {
            mkdir(&parent)?;
        }
        let dir = parent.join(name);
        mkdir(&dir)?;
        self.dirs.push(dir.clone());
        Ok(dir)
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

    /// Remove the group(s). Processes are killed first; the kernel may need
    /// a moment to release a group after its last task exits, so busy
    /// groups are retried briefly.
    pub fn destroy(mut self) -> Result<(), CgroupError> {
        self.remove_dirs()
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

/// Kill every process listed in the groups' `cgroup.procs`.
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

    fn fake_v1(root: &Path, cpu: bool) {
        for c in ["memory", "pids", "cpu"] {
            if c == "cpu" && !cpu {
                continue;
            }
            fs::create_dir_all(root.join(c)).unwrap();
        }
        fs::write(root.join("memory/memory.limit_in_bytes"), "").unwrap();
        if cpu {
            fs::write(root.join("cpu/cpu.cfs_quota_us"), "").unwrap();
        }
    }

    #[test]
    fn detects_v1_v2_and_nothing() {
        let t = tempfile::tempdir().unwrap();
        assert!(matches!(
            Hierarchy::detect_at(t.path()),
            Err(CgroupError::NoHierarchy { .. })
        ));
        fs::write(t.path().join("cgroup.controllers"), "memory pids").unwrap();
        assert_eq!(
            Hierarchy::detect_at(t.path()).unwrap(),
            Hierarchy::V2 {
                root: t.path().into()
            }
        );
        fake_v1(t.path(), true);
        assert!(matches!(
            Hierarchy::detect_at(t.path()).unwrap(),
            Hierarchy::V1 {
                cpu: true,
                freezer: false,
                ..
            }
        ));
    }

    #[test]
    fn v1_writes_limits_into_each_controller() {
        let t = tempfile::tempdir().unwrap();
        fake_v1(t.path(), true);
        let h = Hierarchy::detect_at(t.path()).unwrap();
        let limits = Limits {
            memory: ByteSize::mib(64),
            pids: 32,
            cpus: Some(0.5),
            ..Limits::default()
        };
        let cg = Cgroup::create(&h, "abc", &limits).unwrap();
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
    fn v2_writes_limits_and_group_oom() {
        let t = tempfile::tempdir().unwrap();
        fs::write(
            t.path().join("cgroup.controllers"),
            "cpuset cpu io memory pids",
        )
        .unwrap();
        let h = Hierarchy::detect_at(t.path()).unwrap();
        let limits = Limits {
            memory: ByteSize::mib(128),
            pids: 10,
            cpus: Some(2.0),
            ..Limits::default()
        };
        let cg = Cgroup::create(&h, "x1", &limits).unwrap();
        let read = |p: &str| fs::read_to_string(t.path().join(p)).unwrap();
        assert_eq!(read("brig/cgroup.subtree_control"), "+cpu +memory +pids");
        assert_eq!(read("brig/x1/memory.max"), (128u64 << 20).to_string());
        assert_eq!(read("brig/x1/memory.oom.group"), "1");
        assert_eq!(read("brig/x1/cpu.max"), "200000 100000");
        assert_eq!(read("brig/x1/pids.max"), "10");
        std::mem::forget(cg);
    }

    #[test]
    fn v2_without_memory_controller_is_a_clear_error() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("cgroup.controllers"), "cpu pids").unwrap();
        let h = Hierarchy::detect_at(t.path()).unwrap();
        let err = Cgroup::create(&h, "x", &Limits::default()).unwrap_err();
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
