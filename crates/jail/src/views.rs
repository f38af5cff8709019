//! What a sandbox sees in place of a few host files, so that it looks like
//! a machine of its own size (as lxcfs does for containers): a boot id of
//! its own, as many CPUs online as its CPU limit allows, and its memory
//! limit as the machine's memory in `/proc/meminfo` (`free`, `psutil`,
//! the JVM and numerical libraries size themselves by these).
//!
//! Each view is a file in the sandbox's /dev tmpfs, bound read-only over
//! the host's file by the plan, and rewritten by the host while the
//! sandbox runs ([`crate::tier`]'s `write_view`): the boot id on a reboot,
//! the CPUs on a limit change, the memory figures at each usage reading.
//! Everything here is pure: it renders text from figures the caller read.

/// The kernel's boot id, under /proc; each sandbox is shown its own.
pub const BOOT_ID: &str = "sys/kernel/random/boot_id";
/// Where a sandbox's boot id is kept, inside it (its /dev tmpfs).
pub const BOOT_ID_FILE: &str = "/dev/.boot_id";

/// The CPUs the kernel says are online (glibc's `get_nprocs`, hence
/// Python's `os.cpu_count()` and `multiprocessing.cpu_count()`, read it).
pub const CPUS_ONLINE: &str = "/sys/devices/system/cpu/online";
/// Where a sandbox's view of it is kept, inside it (its /dev tmpfs).
pub const CPUS_ONLINE_FILE: &str = "/dev/.cpus_online";

/// What a sandbox placed on `cpus` ([`crate::cpus`]: ceil(limit) of the
/// host's, the ones it may run on) is shown as its online CPUs ("2-3\n").
/// Libraries size their thread pools by it: a sandbox of 1 CPU on a
/// 64-CPU host must not start 64 workers.
pub fn cpus_online(cpus: &[usize]) -> String {
    crate::cpus::cpu_list(cpus)
}

/// A boot id as the kernel writes one: a random (version 4) UUID and a
/// newline.
pub fn random_boot_id() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}\n",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The kernel's memory figures (`free` and psutil read them).
pub const MEMINFO: &str = "meminfo";
/// Where a sandbox's view of them is kept, inside it (its /dev tmpfs).
pub const MEMINFO_FILE: &str = "/dev/.meminfo";
/// The kernel's description of each CPU (one block per CPU).
pub const CPUINFO: &str = "cpuinfo";
/// Where a sandbox's view of it is kept, inside it (its /dev tmpfs).
pub const CPUINFO_FILE: &str = "/dev/.cpuinfo";

/// A sandbox's memory by kind, in bytes, from its cgroup's `memory.stat`
/// (v1's hierarchical `total_*` keys or v2's, read into one shape).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStat {
    pub anon: u64,
    /// Page cache, tmpfs files included.
    pub file: u64,
    pub shmem: u64,
    pub mapped: u64,
    pub dirty: u64,
    pub writeback: u64,
    pub active_anon: u64,
    pub inactive_anon: u64,
    pub active_file: u64,
    pub inactive_file: u64,
    pub unevictable: u64,
    pub slab_reclaimable: u64,
    pub slab_unreclaimable: u64,
}

impl MemoryStat {
    /// Read a `memory.stat` of either cgroup version; missing keys are 0.
    pub fn parse(text: &str) -> Self {
        let get = |v2: &str, v1: &str| {
            text.lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == v2 || k == v1)
                        .then(|| v.trim().parse().ok())
                        .flatten()
                })
                .unwrap_or(0)
        };
        MemoryStat {
            anon: get("anon", "total_rss"),
            file: get("file", "total_cache"),
            shmem: get("shmem", "total_shmem"),
            mapped: get("file_mapped", "total_mapped_file"),
            dirty: get("file_dirty", "total_dirty"),
            writeback: get("file_writeback", "total_writeback"),
            active_anon: get("active_anon", "total_active_anon"),
            inactive_anon: get("inactive_anon", "total_inactive_anon"),
            active_file: get("active_file", "total_active_file"),
            inactive_file: get("inactive_file", "total_inactive_file"),
            unevictable: get("unevictable", "total_unevictable"),
            slab_reclaimable: get("slab_reclaimable", "-"),
            slab_unreclaimable: get("slab_unreclaimable", "-"),
        }
    }
}

/// The host's total memory in bytes, from its `/proc/meminfo` text.
pub fn mem_total(host_meminfo: &str) -> Option<u64> {
    meminfo_kb(host_meminfo, "MemTotal").map(|kb| kb * 1024)
}

fn meminfo_kb(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key)
            .then(|| v.trim().trim_end_matches("kB").trim().parse().ok())
            .flatten()
    })
}

/// `/proc/meminfo` as a sandbox limited to `limit` bytes, using `used`
/// (its cgroup's charge) of which `stat` says what, is shown it: the
/// host's lines in the host's order, with the machine-wide figures
/// replaced by the sandbox's (total = its limit, free = limit - used,
/// available = free + reclaimable cache, no swap: brig sandboxes get
/// none). `None` when the limit is not below the host's memory (nothing
/// to hide), or the host text has no MemTotal.
pub fn meminfo(host_meminfo: &str, limit: u64, used: u64, stat: &MemoryStat) -> Option<String> {
    let host_total = mem_total(host_meminfo)?;
    if limit >= host_total {
        return None;
    }
    let kb = |b: u64| b / 1024;
    let free = limit.saturating_sub(used);
    let reclaimable = stat.file.saturating_sub(stat.shmem) + stat.slab_reclaimable;
    let available = (free + reclaimable).min(limit);
    let ours: &[(&str, u64)] = &[
        ("MemTotal", kb(limit)),
        ("MemFree", kb(free)),
        ("MemAvailable", kb(available)),
        ("Buffers", 0),
        (
            "Cached",
            kb(stat.file.saturating_sub(stat.shmem) + stat.shmem),
        ),
        ("SwapCached", 0),
        ("Active", kb(stat.active_anon + stat.active_file)),
        ("Inactive", kb(stat.inactive_anon + stat.inactive_file)),
        ("Active(anon)", kb(stat.active_anon)),
        ("Inactive(anon)", kb(stat.inactive_anon)),
        ("Active(file)", kb(stat.active_file)),
        ("Inactive(file)", kb(stat.inactive_file)),
        ("Unevictable", kb(stat.unevictable)),
        ("Mlocked", 0),
        ("SwapTotal", 0),
        ("SwapFree", 0),
        ("Zswap", 0),
        ("Zswapped", 0),
        ("Dirty", kb(stat.dirty)),
        ("Writeback", kb(stat.writeback)),
        ("AnonPages", kb(stat.anon)),
        ("Mapped", kb(stat.mapped)),
        ("Shmem", kb(stat.shmem)),
        ("KReclaimable", kb(stat.slab_reclaimable)),
        ("Slab", kb(stat.slab_reclaimable + stat.slab_unreclaimable)),
        ("SReclaimable", kb(stat.slab_reclaimable)),
        ("SUnreclaim", kb(stat.slab_unreclaimable)),
        ("CommitLimit", kb(limit)),
    ];
    let mut out = String::with_capacity(host_meminfo.len());
    for line in host_meminfo.lines() {
        let key = line.split_once(':').map_or(line, |(k, _)| k);
        match ours.iter().find(|(k, _)| *k == key) {
            // The kernel's layout: the name and colon in 16 columns, the
            // figure right-aligned in 8, then " kB".
            Some((k, v)) => out.push_str(&format!("{:<16}{v:>8} kB\n", format!("{k}:"))),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Some(out)
}

/// `/proc/cpuinfo` with only the blocks of the CPUs in `cpus` (those
/// [`cpus_online`] says are online), by their `processor` number.
pub fn cpuinfo(host_cpuinfo: &str, cpus: &[usize]) -> String {
    host_cpuinfo
        .split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .filter(|b| {
            b.lines()
                .find_map(|l| l.strip_prefix("processor")?.split(':').nth(1))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .is_some_and(|n| cpus.contains(&n))
        })
        .map(|b| format!("{}\n\n", b.trim_end()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "MemTotal:       24000000 kB\nMemFree:        20000000 kB\n\
MemAvailable:   22000000 kB\nBuffers:          100000 kB\nCached:          1000000 kB\n\
SwapTotal:       1000000 kB\nSwapFree:        1000000 kB\nShmem:             10000 kB\n\
HugePages_Total:       0\nHugepagesize:       2048 kB\n";

    #[test]
    fn meminfo_shows_the_limit_as_the_machine() {
        let stat = MemoryStat {
            anon: 50 << 20,
            file: 30 << 20,
            shmem: 10 << 20,
            slab_reclaimable: 2 << 20,
            ..Default::default()
        };
        let view = meminfo(HOST, 512 << 20, 100 << 20, &stat).unwrap();
        let kb = |k| meminfo_kb(&view, k).unwrap();
        assert_eq!(kb("MemTotal"), 512 * 1024);
        assert_eq!(kb("MemFree"), 412 * 1024);
        // free + (file - shmem) + reclaimable slab
        assert_eq!(kb("MemAvailable"), (412 + 20 + 2) * 1024);
        assert_eq!(kb("Cached"), 30 * 1024);
        assert_eq!(kb("SwapTotal"), 0);
        assert_eq!(kb("Shmem"), 10 * 1024);
        // Lines brig has no figure for stay the host's, in its order.
        assert!(view.contains("HugePages_Total:       0\n"), "{view}");
        assert_eq!(view.lines().count(), HOST.lines().count());
        assert!(view.starts_with("MemTotal:         524288 kB\n"), "{view}");
    }

    #[test]
    fn meminfo_hides_nothing_when_the_limit_is_the_host() {
        assert_eq!(
            meminfo(HOST, 24_000_000 * 1024, 0, &MemoryStat::default()),
            None
        );
        assert_eq!(meminfo("nonsense", 1, 0, &MemoryStat::default()), None);
        // Used above the limit (a v1 charge can pass it briefly): free is 0.
        let view = meminfo(HOST, 1 << 20, 2 << 20, &MemoryStat::default()).unwrap();
        assert_eq!(meminfo_kb(&view, "MemFree"), Some(0));
    }

    #[test]
    fn memory_stat_reads_both_versions() {
        let v1 = "cache 1\nrss 2\ntotal_cache 4096\ntotal_rss 8192\ntotal_shmem 1024\n\
total_active_file 100\n";
        let s = MemoryStat::parse(v1);
        assert_eq!(
            (s.file, s.anon, s.shmem, s.active_file),
            (4096, 8192, 1024, 100)
        );
        let v2 = "anon 8192\nfile 4096\nshmem 1024\nslab_reclaimable 7\nactive_file 100\n";
        let s = MemoryStat::parse(v2);
        assert_eq!(
            (s.file, s.anon, s.shmem, s.slab_reclaimable),
            (4096, 8192, 1024, 7)
        );
    }

    #[test]
    fn cpuinfo_keeps_the_sandboxs_cpus() {
        let host: String = (0..4)
            .map(|i| format!("processor\t: {i}\nmodel name\t: x\n\n"))
            .collect();
        assert_eq!(
            cpuinfo(&host, &[1, 3]),
            "processor\t: 1\nmodel name\t: x\n\nprocessor\t: 3\nmodel name\t: x\n\n"
        );
        assert_eq!(cpus_online(&[1, 3]), "1,3\n");
    }
}
