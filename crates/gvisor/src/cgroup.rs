//! A gvisor sandbox's cgroups: runsc makes them (`/brig-gvisor/<id>` in
//! each hierarchy, from the bundle's `cgroupsPath` and resources) and
//! puts gVisor's kernel, its gofer and (ptrace platform) the stub
//! processes the sandbox's programs run in, in them. brig reads usage
//! from them and changes limits in them; `runsc delete` removes them,
//! and [`remove`] whatever a crash left.
//!
//! What the host's groups count is the whole sandbox: gVisor's kernel's
//! own memory and threads too, not only the programs'. The memory limit
//! bounds it all; gVisor also shows the limit to the programs as the
//! machine's memory.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use brig_core::{Limits, SandboxId, Usage};
use brig_host::cgroup::Hierarchy;

use crate::bundle::CGROUP_PARENT;

/// A cgroup file that could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {path}")]
pub struct CgroupError {
    pub op: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// The groups of one sandbox.
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

    fn dir(&self, controller: &str) -> Option<PathBuf> {
        self.hierarchy
            .mount(controller)
            .map(|m| m.join(CGROUP_PARENT).join(self.id.as_str()))
    }

    fn file(&self, controller: &str, v1: &str, v2: &str) -> Option<PathBuf> {
        let name = match self.hierarchy {
            Hierarchy::V1 { .. } => v1,
            Hierarchy::V2 { .. } => v2,
        };
        self.dir(controller).map(|d| d.join(name))
    }

    fn read_u64(&self, controller: &str, v1: &str, v2: &str) -> Result<Option<u64>, CgroupError> {
        let Some(path) = self.file(controller, v1, v2) else {
            return Ok(None);
        };
        read_u64(&path)
    }

    /// What the sandbox uses now (disk: the caller's, from its writable
    /// layer).
    pub fn usage(&self) -> Result<Usage, CgroupError> {
        let memory = self
            .read_u64("memory", "memory.usage_in_bytes", "memory.current")?
            .unwrap_or(0);
        let limit = self
            .read_u64("memory", "memory.limit_in_bytes", "memory.max")?
            .unwrap_or(u64::MAX);
        let peak = self.read_u64("memory", "memory.max_usage_in_bytes", "memory.peak")?;
        let pids = self
            .read_u64("pids", "pids.current", "pids.current")?
            .unwrap_or(0);
        let cpu_ns = match self.hierarchy {
            Hierarchy::V1 { .. } => {
                let ctl = if self.hierarchy.mount("cpuacct").is_some() {
                    "cpuacct"
                } else {
                    "cpu"
                };
                self.read_u64(ctl, "cpuacct.usage", "")?
            }
            Hierarchy::V2 { .. } => self
                .file("cpu", "", "cpu.stat")
                .and_then(|p| fs::read_to_string(p).ok())
                .and_then(|s| keyed(&s, "usage_usec"))
                .map(|us| us * 1000),
        };
        let oom_kills = match self.hierarchy {
            Hierarchy::V1 { .. } => self
                .file("memory", "memory.oom_control", "")
                .and_then(|p| fs::read_to_string(p).ok())
                .and_then(|s| keyed(&s, "oom_kill")),
            Hierarchy::V2 { .. } => self
                .file("memory", "", "memory.events")
                .and_then(|p| fs::read_to_string(p).ok())
                .and_then(|s| keyed(&s, "oom_kill")),
        };
        Ok(Usage {
            cpu_ns,
            memory_bytes: memory,
            memory_peak_bytes: peak,
            memory_limit_bytes: limit,
            pids,
            disk_used_bytes: None,
            disk_total_bytes: None,
            oom_kills,
        })
    }

    /// Write the memory, pids and (where given) CPU limits.
    pub fn set_limits(&self, limits: &Limits, cfs_period_us: u64) -> Result<(), CgroupError> {
        let v1 = matches!(self.hierarchy, Hierarchy::V1 { .. });
        let memory = limits.memory.bytes().to_string();
        if let Some(p) = self.file("memory", "memory.limit_in_bytes", "memory.max") {
            write(&p, &memory)?;
        }
        if let Some(p) = self.file("pids", "pids.max", "pids.max") {
            write(&p, &crate::bundle::host_pids(limits.pids).to_string())?;
        }
        if let Some(cpus) = limits.cpus {
            let quota = (cpus * cfs_period_us as f64).round() as u64;
            if v1 {
                if let Some(d) = self.dir("cpu") {
                    write(&d.join("cpu.cfs_period_us"), &cfs_period_us.to_string())?;
                    write(&d.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            } else if let Some(p) = self.file("cpu", "", "cpu.max") {
                write(&p, &format!("{quota} {cfs_period_us}"))?;
            }
        }
        Ok(())
    }

    /// Kill every process in the groups and remove them (what a crash
    /// left when runsc's own state is gone too). Missing groups are fine.
    pub fn remove(&self) {
        let mut dirs: Vec<PathBuf> = Vec::new();
        // runsc makes groups in every v1 hierarchy it finds, not only the
        // controllers brig uses (`name=systemd`, net_cls, perf_event…), and
        // a restored sandbox's `runsc delete` leaves some behind: look in
        // each hierarchy mounted under /sys/fs/cgroup (a co-mounted pair's
        // name links, `cpu -> cpu,cpuacct`, are the same directory once).
        let mounts = fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .chain(
                ["memory", "pids", "cpu", "freezer"]
                    .iter()
                    .filter_map(|c| self.hierarchy.mount(c).map(Path::to_path_buf)),
            );
        for mount in mounts {
            let d = mount.join(CGROUP_PARENT).join(self.id.as_str());
            let Ok(real) = d.canonicalize() else { continue };
            if real.is_dir() && !dirs.contains(&real) {
                dirs.push(real);
            }
        }
        brig_host::cgroup::kill_and_remove(&dirs);
    }
}

fn read_u64(path: &Path) -> Result<Option<u64>, CgroupError> {
    match fs::read_to_string(path) {
        Ok(s) => {
            let s = s.trim();
            Ok(Some(if s == "max" {
                u64::MAX
            } else {
                s.parse().unwrap_or(0)
            }))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CgroupError {
            op: "read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError {
        op: "write",
        path: path.to_path_buf(),
        source,
    })
}

/// `key N` from a flat keyed file (`cpu.stat`, `memory.events`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files_are_read_by_key() {
        let stat = "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n";
        assert_eq!(keyed(stat, "usage_usec"), Some(1500));
        assert_eq!(keyed(stat, "user"), None);
        assert_eq!(
            keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill"),
            Some(3)
        );
    }
}
