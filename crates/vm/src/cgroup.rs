//! A guest's QEMU in cgroups of its own (`brig-vm/<id>` in each
//! controller brig uses): its memory bounded by the guest's memory plus
//! QEMU's own overhead, its tasks and (where asked) its CPU time bounded
//! too. QEMU joins them before it runs (the launcher writes itself into
//! `cgroup.procs` between fork and exec), so nothing it allocates escapes.
//!
//! What these groups count is the machine: the guest's memory as QEMU
//! touched it, QEMU's threads, the CPU time of emulation.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use brig_core::{SandboxId, Usage};
use brig_host::cgroup::Hierarchy;

/// The parent group of every guest's.
pub const PARENT: &str = "brig-vm";

#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {path}")]
pub struct CgroupError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// What the groups are to bound.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub memory_bytes: u64,
    pub tasks: u64,
    /// (quota, period) in microseconds.
    pub cpu: Option<(u64, u64)>,
}

/// One guest's groups.
#[derive(Debug, Clone)]
pub struct Groups {
    hierarchy: Hierarchy,
    id: SandboxId,
}

impl Groups {
    pub fn new(hierarchy: &Hierarchy, id: &SandboxId) -> Groups {
        Groups {
            hierarchy: hierarchy.clone(),
            id: id.clone(),
        }
    }

    fn v1(&self) -> bool {
        matches!(self.hierarchy, Hierarchy::V1 { .. })
    }

    fn dir(&self, controller: &str) -> Option<PathBuf> {
        self.hierarchy
            .mount(controller)
            .map(|m| m.join(PARENT).join(self.id.as_str()))
    }

    /// Every distinct group directory (one on v2).
    fn dirs(&self) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for c in ["memory", "pids", "cpu", "cpuacct"] {
            if let Some(d) = self.dir(c) {
                if !dirs.contains(&d) {
                    dirs.push(d);
                }
            }
        }
        dirs
    }

    /// Make the groups with their bounds, and return each one's
    /// `cgroup.procs`, open for the launcher to join.
    pub fn create(&self, b: &Bounds) -> Result<Vec<File>, CgroupError> {
        if !self.v1() {
            // v2: the parent hands its children the controllers.
            if let Some(root) = self.hierarchy.mount("memory") {
                let parent = root.join(PARENT);
                fs::create_dir_all(&parent).map_err(err("create", &parent))?;
                let control = parent.join("cgroup.subtree_control");
                for c in ["+memory", "+pids", "+cpu"] {
                    let _ = fs::write(&control, c);
                }
            }
        }
        for d in self.dirs() {
            fs::create_dir_all(&d).map_err(err("create", &d))?;
        }
        let file = |c: &str, v1: &str, v2: &str| {
            self.dir(c).map(|d| d.join(if self.v1() { v1 } else { v2 }))
        };
        if let Some(p) = file("memory", "memory.limit_in_bytes", "memory.max") {
            fs::write(&p, b.memory_bytes.to_string()).map_err(err("write", &p))?;
        }
        if let Some(p) = file("pids", "pids.max", "pids.max") {
            fs::write(&p, b.tasks.to_string()).map_err(err("write", &p))?;
        }
        if let Some((quota, period)) = b.cpu {
            if self.v1() {
                if let Some(d) = self.dir("cpu") {
                    let p = d.join("cpu.cfs_period_us");
                    fs::write(&p, period.to_string()).map_err(err("write", &p))?;
                    let p = d.join("cpu.cfs_quota_us");
                    fs::write(&p, quota.to_string()).map_err(err("write", &p))?;
                }
            } else if let Some(p) = file("cpu", "", "cpu.max") {
                fs::write(&p, format!("{quota} {period}")).map_err(err("write", &p))?;
            }
        }
        self.dirs()
            .into_iter()
            .map(|d| {
                let p = d.join("cgroup.procs");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .map_err(err("open", &p))
            })
            .collect()
    }

    fn read_u64(&self, controller: &str, v1: &str, v2: &str) -> Option<u64> {
        let d = self.dir(controller)?;
        let s = fs::read_to_string(d.join(if self.v1() { v1 } else { v2 })).ok()?;
        let s = s.trim();
        Some(if s == "max" {
            u64::MAX
        } else {
            s.parse().ok()?
        })
    }

    /// What QEMU uses now.
    pub fn usage(&self) -> Usage {
        let cpu_ns = if self.v1() {
            let ctl = if self.hierarchy.mount("cpuacct").is_some() {
                "cpuacct"
            } else {
                "cpu"
            };
            self.read_u64(ctl, "cpuacct.usage", "")
        } else {
            self.dir("cpu")
                .and_then(|d| fs::read_to_string(d.join("cpu.stat")).ok())
                .and_then(|s| keyed(&s, "usage_usec"))
                .map(|us| us * 1000)
        };
        let oom_kills = self
            .dir("memory")
            .and_then(|d| {
                fs::read_to_string(d.join(if self.v1() {
                    "memory.oom_control"
                } else {
                    "memory.events"
                }))
                .ok()
            })
            .and_then(|s| keyed(&s, "oom_kill"));
        Usage {
            cpu_ns,
            memory_bytes: self
                .read_u64("memory", "memory.usage_in_bytes", "memory.current")
                .unwrap_or(0),
            memory_peak_bytes: self.read_u64("memory", "memory.max_usage_in_bytes", "memory.peak"),
            memory_limit_bytes: self
                .read_u64("memory", "memory.limit_in_bytes", "memory.max")
                .unwrap_or(u64::MAX),
            pids: self
                .read_u64("pids", "pids.current", "pids.current")
                .unwrap_or(0),
            disk_used_bytes: None,
            disk_total_bytes: None,
            oom_kills,
        }
    }

    /// A new CPU quota (the only bound a running guest can change: its
    /// memory is fixed at boot).
    pub fn set_cpu(&self, quota: u64, period: u64) -> Result<(), CgroupError> {
        let Some(d) = self.dir("cpu") else {
            return Ok(());
        };
        if self.v1() {
            let p = d.join("cpu.cfs_quota_us");
            fs::write(&p, quota.to_string()).map_err(err("write", &p))
        } else {
            let p = d.join("cpu.max");
            fs::write(&p, format!("{quota} {period}")).map_err(err("write", &p))
        }
    }

    /// Kill whatever is still in the groups and remove them. Missing
    /// groups are fine.
    pub fn remove(&self) {
        let dirs: Vec<PathBuf> = self.dirs().into_iter().filter(|d| d.is_dir()).collect();
        brig_host::cgroup::kill_and_remove(&dirs);
    }
}

/// `key N` from a flat keyed file (`cpu.stat`, `memory.events`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}
