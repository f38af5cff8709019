//! Which of the host's CPUs a sandbox with a CPU limit runs on.
//!
//! A limit of N cores (a CFS quota) says how much CPU time a sandbox gets,
//! not where; but programs size themselves by the CPUs they may run on:
//! `nproc`, Go's `GOMAXPROCS`, Python's `os.sched_getaffinity` and
//! `os.process_cpu_count`, OpenMP and Rust's `available_parallelism` ask
//! the scheduler's affinity, which a quota leaves at the host's count. So a
//! sandbox limited below the host's CPUs is given ceil(N) of them as its
//! affinity (its views of `/sys/devices/system/cpu/online` and
//! `/proc/cpuinfo` name the same ones, [`crate::views`]): those least used
//! by the other sandboxes of this process, the way a VM's vCPUs are
//! placed. The trade-off, documented in docs/architecture.md: on a host
//! with few CPUs, sandboxes that share one cannot borrow another's idle
//! time beyond their own set, as unpinned ones could within their quota.
//!
//! Affinity is a hint to the scheduler, not a boundary: a process inside
//! may widen its own (its cgroup's quota still holds it).

use std::sync::{Arc, Mutex};

/// Hands out CPUs, counting how many live sandboxes each is given to.
#[derive(Debug)]
pub struct CpuPlacer {
    /// The CPUs this process may run on (what sandboxes are placed on).
    allowed: Vec<usize>,
    /// Sandboxes placed on each of `allowed`, by index.
    load: Mutex<Vec<u32>>,
    /// Where ties start (an index in `allowed`): the lowest CPU for a
    /// daemon, which sees all its sandboxes; for a one-shot `brig run`,
    /// which sees only its own, the CPU the scheduler put it on.
    start: usize,
}

/// CPUs a sandbox was given; they count as used until this is dropped.
#[derive(Debug)]
pub struct Placement {
    cpus: Vec<usize>,
    placer: Arc<CpuPlacer>,
}

impl Placement {
    /// The CPUs, in ascending order.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }
}

impl Drop for Placement {
    fn drop(&mut self) {
        let mut load = self.placer.load.lock().unwrap_or_else(|e| e.into_inner());
        for cpu in &self.cpus {
            if let Some(i) = self.placer.allowed.iter().position(|c| c == cpu) {
                load[i] = load[i].saturating_sub(1);
            }
        }
    }
}

impl CpuPlacer {
    /// A placer over the CPUs this process may run on.
    pub fn new() -> Arc<CpuPlacer> {
        Self::over(allowed_here(), 0)
    }

    /// A placer for a process that places one sandbox and knows nothing of
    /// the others on the host (`brig run`): its ties start at the CPU this
    /// process runs on now, which the kernel chose by load, so that runs
    /// started side by side spread over the CPUs instead of all taking the
    /// lowest.
    pub fn starting_here() -> Arc<CpuPlacer> {
        let allowed = allowed_here();
        // SAFETY: sched_getcpu takes no arguments.
        let cpu = unsafe { libc::sched_getcpu() };
        let start = usize::try_from(cpu)
            .ok()
            .and_then(|c| allowed.iter().position(|&a| a == c))
            .unwrap_or(0);
        Self::over(allowed, start)
    }

    /// A placer over `allowed`, ties starting at index `start` (tests).
    pub fn over(allowed: Vec<usize>, start: usize) -> Arc<CpuPlacer> {
        let load = Mutex::new(vec![0; allowed.len()]);
        let start = if allowed.is_empty() {
            0
        } else {
            start % allowed.len()
        };
        Arc::new(CpuPlacer {
            allowed,
            load,
            start,
        })
    }

    /// How many CPUs there are to place on.
    pub fn host_count(&self) -> usize {
        self.allowed.len()
    }

    /// The CPUs there are to place on.
    pub fn allowed(&self) -> &[usize] {
        &self.allowed
    }

    /// CPUs for a sandbox limited to `cpus` cores: ceil(cpus) of them, the
    /// least used (ties to the first from `start` on); `None` when the limit
    /// is not below the host's count (nothing to pin).
    pub fn place(self: &Arc<Self>, cpus: Option<f64>) -> Option<Placement> {
        let n = count(cpus, self.allowed.len())?;
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        let len = self.allowed.len();
        let mut order: Vec<usize> = (0..len).collect();
        order.sort_by_key(|&i| (load[i], (i + len - self.start) % len));
        let mut picked: Vec<usize> = order[..n].to_vec();
        picked.sort_unstable();
        for &i in &picked {
            load[i] += 1;
        }
        Some(Placement {
            cpus: picked.iter().map(|&i| self.allowed[i]).collect(),
            placer: Arc::clone(self),
        })
    }

    /// Count `cpus` (a sandbox found running, placed by an earlier
    /// process) as used; `None` if they are not a strict subset of what
    /// this process places on (an unpinned sandbox).
    pub fn adopt(self: &Arc<Self>, mut cpus: Vec<usize>) -> Option<Placement> {
        cpus.sort_unstable();
        cpus.dedup();
        if cpus.is_empty()
            || cpus.len() >= self.allowed.len()
            || !cpus.iter().all(|c| self.allowed.contains(c))
        {
            return None;
        }
        let mut load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        for cpu in &cpus {
            if let Some(i) = self.allowed.iter().position(|c| c == cpu) {
                load[i] += 1;
            }
        }
        Some(Placement {
            cpus,
            placer: Arc::clone(self),
        })
    }
}

/// The CPUs this process may run on; if that cannot be read, as many as
/// the host has, from 0.
fn allowed_here() -> Vec<usize> {
    match affinity_of(0) {
        Ok(cpus) if !cpus.is_empty() => cpus,
        _ => (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect(),
    }
}

/// How many CPUs a sandbox limited to `cpus` cores is shown and given on a
/// host of `host` CPUs: ceil(cpus), at least 1; `None` without a limit or
/// with one not below the host's count.
pub fn count(cpus: Option<f64>, host: usize) -> Option<usize> {
    let cpus = cpus.filter(|c| c.is_finite() && *c > 0.0)?;
    let n = (cpus.ceil() as usize).clamp(1, host.max(1));
    (n < host).then_some(n)
}

/// `cpus` as the kernel writes a CPU list ("0-3,6\n").
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    format!("{}\n", parts.join(","))
}

/// The CPUs thread `tid` may run on (0: the calling thread).
pub fn affinity_of(tid: libc::pid_t) -> std::io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `set` is initialised and `c` below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Let thread `tid` (0: the calling thread) run on `cpus` only.
/// Async-signal-safe: called between fork and exec.
pub fn set_affinity(tid: libc::pid_t, cpus: &[usize]) -> Result<(), crate::sys::Errno> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set), &set) } != 0 {
        return Err(crate::sys::Errno::last());
    }
    Ok(())
}

/// Give every thread of the processes `pids` (a sandbox's) the CPUs
/// `cpus`, twice over (a process forked during the first pass inherits
/// its parent's old set; the second catches it). A thread gone meanwhile
/// is skipped.
pub fn set_affinity_of_all(pids: &[libc::pid_t], cpus: &[usize]) {
    for _ in 0..2 {
        for pid in pids {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for tid in tasks
                .flatten()
                .filter_map(|t| t.file_name().to_str()?.parse::<libc::pid_t>().ok())
            {
                let _ = set_affinity(tid, cpus);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_is_the_limit_rounded_up_below_the_host() {
        assert_eq!(count(None, 8), None);
        assert_eq!(count(Some(1.0), 8), Some(1));
        assert_eq!(count(Some(0.2), 8), Some(1));
        assert_eq!(count(Some(2.5), 8), Some(3));
        assert_eq!(count(Some(8.0), 8), None);
        assert_eq!(count(Some(64.0), 8), None);
        assert_eq!(count(Some(f64::NAN), 8), None);
        assert_eq!(count(Some(1.0), 1), None);
    }

    #[test]
    fn cpu_lists_are_written_as_the_kernel_does() {
        assert_eq!(cpu_list(&[0]), "0\n");
        assert_eq!(cpu_list(&[3, 0, 1, 2]), "0-3\n");
        assert_eq!(cpu_list(&[0, 2, 3, 7]), "0,2-3,7\n");
    }

    /// Each sandbox gets the least used CPUs; a sandbox's end frees its
    /// own; one found running counts once adopted.
    #[test]
    fn sandboxes_go_to_the_least_used_cpus() {
        let placer = CpuPlacer::over(vec![0, 1, 2, 3], 0);
        let a = placer.place(Some(2.0)).unwrap();
        assert_eq!(a.cpus(), [0, 1]);
        let b = placer.place(Some(1.0)).unwrap();
        assert_eq!(b.cpus(), [2]);
        let c = placer.place(Some(1.5)).unwrap();
        assert_eq!(c.cpus(), [0, 3]);
        drop(a);
        let d = placer.place(Some(1.0)).unwrap();
        assert_eq!(d.cpus(), [1]);
        assert!(
            placer.place(Some(4.0)).is_none(),
            "the whole host: no pinning"
        );
        let adopted = placer.adopt(vec![1]).unwrap();
        let e = placer.place(Some(1.0)).unwrap();
        assert_ne!(e.cpus(), [1], "cpu 1 carries two sandboxes now");
        assert!(placer.adopt(vec![0, 1, 2, 3]).is_none(), "not pinned");
        assert!(placer.adopt(vec![9]).is_none(), "not a cpu of this host");
        drop((b, c, d, adopted, e));
        assert_eq!(*placer.load.lock().unwrap(), [0, 0, 0, 0]);
    }

    /// A one-shot placer starts where it is told: side-by-side runs
    /// spread instead of piling onto CPU 0.
    #[test]
    fn ties_start_where_the_placer_was_told() {
        let placer = CpuPlacer::over(vec![0, 1, 2, 3], 2);
        assert_eq!(placer.place(Some(1.0)).unwrap().cpus(), [2]);
        let placer = CpuPlacer::over(vec![0, 1, 2, 3], 3);
        assert_eq!(placer.place(Some(2.0)).unwrap().cpus(), [0, 3]);
    }

    #[test]
    fn this_threads_affinity_reads_back_as_set() {
        let mine = affinity_of(0).unwrap();
        assert!(!mine.is_empty());
        std::thread::spawn(move || {
            set_affinity(0, &mine[..1]).unwrap();
            assert_eq!(affinity_of(0).unwrap(), mine[..1]);
        })
        .join()
        .unwrap();
    }
}
