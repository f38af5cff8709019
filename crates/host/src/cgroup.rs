//! Where this host's cgroup hierarchies are mounted: the one cgroup
//! detector, shared by `brig doctor` ([`crate::probe`]) and the process
//! tier (brig-jail's `cgroup`).
//!
//! [`CgroupLayout`] is what `/proc/self/mountinfo` says: every v1 hierarchy
//! with its controllers (so `cpu,cpuacct` co-mounts and the freezer are
//! read here), and the cgroup2 mount. [`Hierarchy`] is the decision drawn
//! from it: which layout brig makes its groups in, and where each
//! controller it uses lives. The doctor judges the layout; the jail creates
//! groups in the hierarchy. Both read the same parse, so they cannot
//! disagree about a host.
//!
//! Only mounts a path lookup reaches count: a tmpfs mounted over
//! `/sys/fs/cgroup` hides the hierarchies below it, though mountinfo still
//! lists them.
//!
//! A hybrid host (v1 controllers plus a cgroup2 mount, systemd's
//! "hybrid" mode, like brig's development machine, whose unified mount
//! carries no controller) is used as v1, because that is where the
//! controllers are.
//!
//! Parsing is separate from reading, so the decision is unit-tested with
//! sample mountinfo text for v1, v2 and hybrid hosts. A sample may name a
//! temporary directory as its mount points, which is how brig-jail's tests
//! create groups in plain directories.

use std::io;
use std::path::{Path, PathBuf};

/// Where the kernel describes this process's mounts.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// Where brig's groups live below each hierarchy's mount point
/// (`<mount>/brig/<sandbox id>`). At the root, not under the caller's own
/// cgroup, so that a later brig finds every leftover, whichever shell or
/// service started the one that made it.
pub const PARENT: &str = "brig";

/// Finding the cgroup hierarchy failed.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no usable cgroup hierarchy: {MOUNTINFO} shows neither a cgroup2 mount nor v1 mounts of the memory and pids controllers; mount them (see `brig doctor`)")]
    NoHierarchy,
}

/// The v1 controllers brig knows by name; anything else in a cgroup mount's
/// options (`rw`, `name=systemd`, `xattr`, `release_agent=...`) is not one.
const V1_CONTROLLERS: [&str; 14] = [
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

/// The v1 controllers a sandbox's cgroups use.
const BRIG_V1_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

/// Where the cgroup hierarchies are mounted, from `/proc/self/mountinfo`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    /// cgroup v1 hierarchies, one per mount, in mount order.
    pub v1: Vec<V1Hierarchy>,
    /// The first cgroup2 mount.
    pub v2: Option<CgroupMount>,
    /// Some cgroup mount, of either version, reachable or not, has
    /// `favordynmods`. The setting acts on one kernel-wide lock (the one a
    /// task takes to move between groups), so one such mount, or the boot
    /// parameter `cgroup_favordynmods=true`, spares every attach on the
    /// host its RCU grace period.
    pub favordynmods_anywhere: bool,
}

/// One mounted v1 hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V1Hierarchy {
    pub mount: CgroupMount,
    /// The controllers bound to it; more than one when co-mounted
    /// (`cpu,cpuacct`), none for a named hierarchy (`name=systemd`).
    pub controllers: Vec<String>,
    /// Mounted with `favordynmods` (Linux >= 6.0): without it, moving a
    /// task into a group waits for an RCU grace period.
    pub favordynmods: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    pub mount_point: String,
    pub read_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
    /// Controllers on v1 hierarchies plus a cgroup2 mount (systemd's
    /// "hybrid" mode, usually at /sys/fs/cgroup/unified).
    Hybrid,
    None,
}

impl CgroupLayout {
    /// The layout of this host, as this process sees it.
    pub fn read() -> Result<Self, DetectError> {
        std::fs::read_to_string(MOUNTINFO)
            .map(|text| Self::parse(&text))
            .map_err(|source| DetectError::Read {
                path: MOUNTINFO.into(),
                source,
            })
    }

    /// The cgroup mounts in `mountinfo` that a path lookup reaches. A mount
    /// covered by a later one (a tmpfs over `/sys/fs/cgroup`, as in a
    /// container or a test that hides the cgroups) is still listed but is
    /// not where `/sys/fs/cgroup/memory` leads, so it is left out.
    pub fn parse(mountinfo: &str) -> Self {
        let mounts: Vec<Mount> = mountinfo.lines().filter_map(Mount::parse).collect();
        let mut seen = vec![None; mounts.len()];
        let mut layout = CgroupLayout {
            favordynmods_anywhere: mounts.iter().any(|m| {
                matches!(m.fstype, "cgroup" | "cgroup2")
                    && m.super_options.split(',').any(|o| o == "favordynmods")
            }),
            ..CgroupLayout::default()
        };
        for (i, m) in mounts.iter().enumerate() {
            if !matches!(m.fstype, "cgroup" | "cgroup2") || covered(&mounts, i, &mut seen) {
                continue;
            }
            let mount = CgroupMount {
                mount_point: m.mount_point.clone(),
                read_only: m.read_only,
            };
            match m.fstype {
                "cgroup" => {
                    let controllers = m
                        .super_options
                        .split(',')
                        .filter(|o| V1_CONTROLLERS.contains(o))
                        .map(str::to_owned)
                        .collect();
                    let favordynmods = m.super_options.split(',').any(|o| o == "favordynmods");
                    layout.v1.push(V1Hierarchy {
                        mount,
                        controllers,
                        favordynmods,
                    });
                }
                _ if layout.v2.is_none() => layout.v2 = Some(mount),
                _ => {}
            }
        }
        layout
    }

    pub fn version(&self) -> CgroupVersion {
        let v1 = self.v1.iter().any(|h| !h.controllers.is_empty());
        match (v1, self.v2.is_some()) {
            (true, true) => CgroupVersion::Hybrid,
            (true, false) => CgroupVersion::V1,
            (false, true) => CgroupVersion::V2,
            (false, false) => CgroupVersion::None,
        }
    }

    /// The v1 hierarchy `controller` is bound to, if any.
    pub fn v1_hierarchy(&self, controller: &str) -> Option<&V1Hierarchy> {
        self.v1
            .iter()
            .find(|h| h.controllers.iter().any(|c| c == controller))
    }

    /// Every controller on a v1 hierarchy, sorted.
    pub fn v1_controllers(&self) -> Vec<&str> {
        let mut all: Vec<&str> = self
            .v1
            .iter()
            .flat_map(|h| h.controllers.iter().map(String::as_str))
            .collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Whether brig's groups are on v1 hierarchies and nothing put the
    /// kernel in `favordynmods` mode, so a spawn's first attach waits for
    /// an RCU grace period (3-20 ms measured on this kind of VM).
    pub fn v1_without_favordynmods(&self) -> bool {
        !self.favordynmods_anywhere
            && self.v1.iter().any(|h| {
                h.controllers
                    .iter()
                    .any(|c| BRIG_V1_CONTROLLERS.contains(&c.as_str()))
            })
    }
}

/// One line of mountinfo.
struct Mount<'a> {
    id: &'a str,
    parent: &'a str,
    mount_point: String,
    read_only: bool,
    fstype: &'a str,
    super_options: &'a str,
}

impl<'a> Mount<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        // <id> <parent> <maj:min> <root> <mount point> <options> [optional fields...]
        //   - <fstype> <source> <super options>
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let (fstype, _source, super_options) = (right.next()?, right.next()?, right.next()?);
        let options = left.get(5)?;
        Some(Mount {
            id: left.first()?,
            parent: left.get(1)?,
            mount_point: unescape_mount_path(left.get(4)?),
            read_only: options.split(',').any(|o| o == "ro")
                || super_options.split(',').any(|o| o == "ro"),
            fstype,
            super_options,
        })
    }
}

/// Whether a lookup of `mounts[i]`'s mount point ends in another mount:
/// one at or above that path that `mounts[i]` was not mounted on (so it
/// came later, on top), and that is not itself covered. `seen` remembers
/// the answers (`None` while one is being worked out, so text that is not
/// a tree cannot recurse forever).
fn covered(mounts: &[Mount], i: usize, seen: &mut Vec<Option<Option<bool>>>) -> bool {
    match seen[i] {
        Some(Some(answer)) => return answer,
        Some(None) => return false,
        None => seen[i] = Some(None),
    }
    let target = &mounts[i];
    // The mounts `target` was mounted on, by id, down to the root.
    let mut below = Vec::new();
    let mut parent = target.parent;
    while below.len() < mounts.len() {
        let Some(p) = mounts.iter().find(|m| m.id == parent) else {
            break;
        };
        below.push(p.id);
        parent = p.parent;
    }
    let answer = (0..mounts.len()).any(|j| {
        let m = &mounts[j];
        j != i
            && m.id != target.id
            && !below.contains(&m.id)
            && Path::new(&target.mount_point).starts_with(&m.mount_point)
            && !covered(mounts, j, seen)
    });
    seen[i] = Some(Some(answer));
    answer
}

/// Undo the octal escapes mountinfo uses for space, tab, newline and
/// backslash in paths (`\040` and friends).
fn unescape_mount_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if let Some(digits) = octal {
            out.push(
                digits
                    .iter()
                    .fold(0u8, |acc, d| acc.wrapping_mul(8).wrapping_add(d - b'0')),
            );
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The cgroup layout brig makes its groups in: v1 when the memory and pids
/// controllers are on v1 hierarchies (hybrid hosts included), otherwise
/// the cgroup2 mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// One mount point per controller. Co-mounted controllers share one
    /// (`cpu` and `cpuacct` on `cpu,cpuacct`).
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        /// Only with CFS bandwidth control (`cpu.cfs_quota_us`, which
        /// `--cpus` writes); without it `--cpus` is refused.
        cpu: Option<PathBuf>,
        /// For a sandbox's CPU usage (pausable sandboxes only).
        cpuacct: Option<PathBuf>,
        /// For pause and resume (pausable sandboxes only).
        freezer: Option<PathBuf>,
    },
    /// The unified hierarchy mounted at `root`.
    V2 { root: PathBuf },
}

impl Hierarchy {
    /// The hierarchy of this host, from [`MOUNTINFO`].
    pub fn detect() -> Result<Self, DetectError> {
        Self::from_layout(&CgroupLayout::read()?)
    }

    /// The hierarchy `layout` offers. The one look at the file system is
    /// for `cpu.cfs_quota_us` on the cpu mount, which mountinfo cannot show.
    pub fn from_layout(layout: &CgroupLayout) -> Result<Self, DetectError> {
        let mount = |c: &str| {
            layout
                .v1_hierarchy(c)
                .map(|h| PathBuf::from(&h.mount.mount_point))
        };
        if let (Some(memory), Some(pids)) = (mount("memory"), mount("pids")) {
            return Ok(Hierarchy::V1 {
                memory,
                pids,
                cpu: mount("cpu").filter(|p| p.join("cpu.cfs_quota_us").exists()),
                cpuacct: mount("cpuacct"),
                freezer: mount("freezer"),
            });
        }
        match &layout.v2 {
            Some(m) => Ok(Hierarchy::V2 {
                root: PathBuf::from(&m.mount_point),
            }),
            None => Err(DetectError::NoHierarchy),
        }
    }

    /// Where `controller`'s groups go (the cgroup2 root for any controller
    /// on v2), or `None` if this host does not offer it.
    pub fn mount(&self, controller: &str) -> Option<&Path> {
        match self {
            Hierarchy::V2 { root } => Some(root),
            Hierarchy::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => match controller {
                "memory" => Some(memory),
                "pids" => Some(pids),
                "cpu" => cpu.as_deref(),
                "cpuacct" => cpuacct.as_deref(),
                "freezer" => freezer.as_deref(),
                _ => None,
            },
        }
    }

    /// On v1, `cpu` and `cpuacct` are one mount (`cpu,cpuacct`): the cpu
    /// group does the accounting, and there is no cpuacct group to make.
    pub fn cpuacct_in_cpu(&self) -> bool {
        match self {
            Hierarchy::V1 {
                cpu: Some(cpu),
                cpuacct: Some(cpuacct),
                ..
            } => cpu == cpuacct,
            _ => false,
        }
    }

    /// The directories that hold brig's groups (one per mount on v1: a
    /// co-mounted cpuacct shares the cpu one).
    pub fn parents(&self) -> Vec<PathBuf> {
        match self {
            Hierarchy::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => {
                let mut v = vec![memory.join(PARENT), pids.join(PARENT)];
                for mount in [cpu, cpuacct, freezer].into_iter().flatten() {
                    let parent = mount.join(PARENT);
                    if !v.contains(&parent) {
                        v.push(parent);
                    }
                }
                v
            }
            Hierarchy::V2 { root } => vec![root.join(PARENT)],
        }
    }

    pub fn supports_cpu_limit(&self) -> bool {
        match self {
            Hierarchy::V1 { cpu, .. } => cpu.is_some(),
            Hierarchy::V2 { .. } => true,
        }
    }
}

/// Mountinfo of the three kinds of host, for unit tests here and in
/// [`crate::probe`].
#[cfg(test)]
pub(crate) mod samples {
    pub const V1_MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
25 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 25 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
";

    pub const V2_MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
25 22 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 25 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:8 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    /// This development machine: v1 controllers, plus cgroup2 at
    /// /sys/fs/cgroup/unified carrying only hugetlb.
    pub const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// `sample` with its cgroup mounts moved under `root` (a temporary
    /// directory), each mount point created, and `cpu.cfs_quota_us` where
    /// cpu is mounted: a host whose groups can be made in plain
    /// directories.
    pub fn rooted_at(sample: &str, root: &std::path::Path) -> String {
        let root = root.to_str().expect("utf-8 temporary directory");
        let text = sample.replace(" /sys/fs/cgroup", &format!(" {root}"));
        for h in super::CgroupLayout::parse(&text).v1 {
            std::fs::create_dir_all(&h.mount.mount_point).expect("mount point");
            if h.controllers.iter().any(|c| c == "cpu") {
                let quota = std::path::Path::new(&h.mount.mount_point).join("cpu.cfs_quota_us");
                std::fs::write(quota, "-1").expect("cpu.cfs_quota_us");
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::samples::*;
    use super::*;

    #[test]
    fn parses_v1_mountinfo() {
        let layout = CgroupLayout::parse(V1_MOUNTINFO);
        assert_eq!(layout.version(), CgroupVersion::V1);
        assert!(layout.v2.is_none());
        assert_eq!(
            layout.v1_controllers(),
            ["cpu", "cpuacct", "freezer", "memory", "pids"]
        );
        let cpu = layout.v1_hierarchy("cpuacct").expect("cpuacct mounted");
        assert_eq!(cpu.mount.mount_point, "/sys/fs/cgroup/cpu,cpuacct");
        assert_eq!(cpu.controllers, ["cpu", "cpuacct"]);
        // name=systemd is a hierarchy without controllers.
        assert!(layout
            .v1
            .iter()
            .any(|h| h.mount.mount_point == "/sys/fs/cgroup/systemd" && h.controllers.is_empty()));
    }

    #[test]
    fn parses_v2_mountinfo() {
        let layout = CgroupLayout::parse(V2_MOUNTINFO);
        assert_eq!(layout.version(), CgroupVersion::V2);
        assert_eq!(
            layout.v2,
            Some(CgroupMount {
                mount_point: "/sys/fs/cgroup".to_owned(),
                read_only: false
            })
        );
        assert!(layout.v1.is_empty());
    }

    #[test]
    fn parses_hybrid_mountinfo() {
        let layout = CgroupLayout::parse(HYBRID_MOUNTINFO);
        assert_eq!(layout.version(), CgroupVersion::Hybrid);
        assert_eq!(
            layout.v2.as_ref().map(|m| m.mount_point.as_str()),
            Some("/sys/fs/cgroup/unified")
        );
        assert_eq!(
            layout
                .v1_hierarchy("memory")
                .map(|h| h.mount.mount_point.as_str()),
            Some("/sys/fs/cgroup/memory")
        );
    }

    #[test]
    fn mountinfo_read_only_and_escapes() {
        let text = "26 25 0:23 / /sys/fs/my\\040cgroup ro,nosuid - cgroup2 cgroup2 rw\n";
        let layout = CgroupLayout::parse(text);
        assert_eq!(
            layout.v2,
            Some(CgroupMount {
                mount_point: "/sys/fs/my cgroup".to_owned(),
                read_only: true
            })
        );
        assert_eq!(unescape_mount_path("a\\134b\\011c"), "a\\b\tc");
        assert_eq!(unescape_mount_path("trailing\\04"), "trailing\\04");
    }

    /// A tmpfs over /sys/fs/cgroup hides the controllers mounted below it
    /// (their lines stay in mountinfo); controllers mounted again on top of
    /// that tmpfs are visible.
    #[test]
    fn covered_cgroup_mounts_are_not_there() {
        let hidden = format!("{V1_MOUNTINFO}90 31 0:99 / /sys/fs/cgroup rw - tmpfs none rw\n");
        let layout = CgroupLayout::parse(&hidden);
        assert_eq!(layout.version(), CgroupVersion::None, "{layout:?}");
        assert!(matches!(
            Hierarchy::from_layout(&layout),
            Err(DetectError::NoHierarchy)
        ));
        let remounted = format!(
            "{hidden}91 90 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
             92 31 0:23 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
        );
        let layout = CgroupLayout::parse(&remounted);
        assert_eq!(layout.v1_controllers(), ["memory"]);
        // Overmounting one controller's mount point hides just that one.
        let over_memory =
            format!("{V1_MOUNTINFO}93 35 0:99 / /sys/fs/cgroup/memory rw - tmpfs none rw\n");
        assert_eq!(
            CgroupLayout::parse(&over_memory).v1_controllers(),
            ["cpu", "cpuacct", "freezer", "pids"]
        );
    }

    #[test]
    fn favordynmods_is_read_from_v1_controller_mounts() {
        let without = "32 31 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n";
        let with = "32 31 0:29 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory,favordynmods\n";
        let named = "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";
        let v2 = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert!(CgroupLayout::parse(without).v1_without_favordynmods());
        assert!(!CgroupLayout::parse(with).v1_without_favordynmods());
        assert!(!CgroupLayout::parse(named).v1_without_favordynmods());
        assert!(!CgroupLayout::parse(v2).v1_without_favordynmods());
        // The lock is kernel-wide: the option on any other cgroup mount
        // (a hybrid host's cgroup2, a controller-less named hierarchy, even
        // one covered by another mount) is enough.
        let hybrid_v2 =
            "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,favordynmods\n";
        let named_with =
            "42 31 0:39 / /run/brig/favordynmods rw - cgroup cgroup rw,favordynmods,name=brig\n";
        assert!(!CgroupLayout::parse(&format!("{without}{hybrid_v2}")).v1_without_favordynmods());
        assert!(!CgroupLayout::parse(&format!("{without}{named_with}")).v1_without_favordynmods());
    }

    #[test]
    fn v1_hierarchy_names_each_controllers_mount() {
        let t = tempfile::tempdir().unwrap();
        let text = rooted_at(V1_MOUNTINFO, t.path());
        let h = Hierarchy::from_layout(&CgroupLayout::parse(&text)).unwrap();
        let co = t.path().join("cpu,cpuacct");
        assert_eq!(
            h,
            Hierarchy::V1 {
                memory: t.path().join("memory"),
                pids: t.path().join("pids"),
                cpu: Some(co.clone()),
                cpuacct: Some(co.clone()),
                freezer: Some(t.path().join("freezer")),
            }
        );
        assert!(h.cpuacct_in_cpu());
        assert!(h.supports_cpu_limit());
        // One parent per mount: the co-mounted cpuacct adds none.
        assert_eq!(
            h.parents(),
            ["memory", "pids", "cpu,cpuacct", "freezer"].map(|m| t.path().join(m).join(PARENT))
        );
    }

    #[test]
    fn hybrid_is_used_as_v1() {
        let t = tempfile::tempdir().unwrap();
        let text = rooted_at(HYBRID_MOUNTINFO, t.path());
        let h = Hierarchy::from_layout(&CgroupLayout::parse(&text)).unwrap();
        assert!(matches!(h, Hierarchy::V1 { .. }), "{h:?}");
        assert!(!h.cpuacct_in_cpu());
        assert_eq!(h.mount("cpuacct"), Some(t.path().join("cpuacct").as_path()));
    }

    #[test]
    fn v2_and_nothing() {
        let h = Hierarchy::from_layout(&CgroupLayout::parse(V2_MOUNTINFO)).unwrap();
        assert_eq!(
            h,
            Hierarchy::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
        assert_eq!(h.parents(), [Path::new("/sys/fs/cgroup/brig")]);
        assert_eq!(h.mount("freezer"), Some(Path::new("/sys/fs/cgroup")));
        assert!(matches!(
            Hierarchy::from_layout(&CgroupLayout::default()),
            Err(DetectError::NoHierarchy)
        ));
        // v1 memory without pids: not enough for a sandbox, and no v2.
        let memory_only = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert!(Hierarchy::from_layout(&CgroupLayout::parse(memory_only)).is_err());
    }

    #[test]
    fn cpu_without_bandwidth_control_is_no_cpu() {
        let t = tempfile::tempdir().unwrap();
        let text = rooted_at(HYBRID_MOUNTINFO, t.path());
        std::fs::remove_file(t.path().join("cpu/cpu.cfs_quota_us")).unwrap();
        let h = Hierarchy::from_layout(&CgroupLayout::parse(&text)).unwrap();
        assert!(!h.supports_cpu_limit());
        assert_eq!(h.mount("cpu"), None);
    }

    #[test]
    fn this_host_has_a_layout() {
        // Whatever this host is, reading it works; a host without cgroups
        // is the only one without a hierarchy.
        let layout = CgroupLayout::read().expect("read mountinfo");
        assert_eq!(
            Hierarchy::from_layout(&layout).is_err(),
            layout.version() == CgroupVersion::None
                || (layout.v2.is_none()
                    && (layout.v1_hierarchy("memory").is_none()
                        || layout.v1_hierarchy("pids").is_none()))
        );
    }
}

/// Kill every process in `dirs` (a sandbox's groups, one per controller)
/// and remove the groups, waiting up to two seconds for each to empty (a
/// group empties a moment after its last task dies). Missing groups are
/// fine. For tiers whose processes the kernel does not end by itself with
/// the sandbox (QEMU, runsc's); the process tier has its own, which also
/// thaws a frozen group first.
pub fn kill_and_remove(dirs: &[PathBuf]) {
    for d in dirs {
        if let Ok(procs) = std::fs::read_to_string(d.join("cgroup.procs")) {
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill takes integers only; at worst the process is
                // already gone (ESRCH).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
    for d in dirs {
        for _ in 0..200 {
            match std::fs::remove_dir(d) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(10))
                }
                _ => break,
            }
        }
    }
}
