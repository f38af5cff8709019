//! What this host offers: the kernel features the process tier is built
//! from, the cgroup controllers its limits need, KVM, and the helper
//! programs behind the gvisor and vm tiers.
//!
//! - [`probe`] produces the full [`HostReport`] for `brig doctor` (and, later,
//!   daemon start-up and `GET /v1/info`).
//! - [`check_process_tier`] is the quick subset `brig run` checks before it
//!   starts: only what the process tier needs, returning the first missing
//!   piece as a [`Feature`] whose `fix` says what to do.
//!
//! Every probe is cheap: a file read, a syscall made with arguments the
//! kernel must reject (so ENOSYS tells "absent" from "present"), or one
//! short-lived forked child that creates namespaces and mounts an overlay.
//! The only slow parts are the optional `--version` runs of `runsc` and
//! `qemu-system-x86_64`, which are bounded by a timeout.
//!
//! Reading the host (`Host::read`, `CgroupFacts::read`, `Kvm::detect`) is
//! kept apart from judging what was read (`cgroup_features`,
//! `userns_feature`, ...), so the judging is unit-tested with sample text
//! from v1, v2 and hybrid hosts, without root.

use std::collections::BTreeSet;
use std::ffi::CStr;
use std::fmt::Write as _;
use std::io::{self, Read as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cgroup::{CgroupLayout, CgroupMount, CgroupVersion, Hierarchy, V1Hierarchy};

/// How a feature stands on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Present and usable.
    Ok,
    /// Absent. Fatal for the process tier if the feature is `required`.
    Missing,
    /// Usable with a limitation that `detail` names.
    Degraded,
}

/// One thing brig looked for on this host.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Feature {
    /// Stable identifier; also the key clients see in `brig doctor --json`.
    pub name: &'static str,
    pub status: Status,
    /// What was found, in words a person can check.
    pub detail: String,
    /// For anything not `Ok`: what to do, naming the package, sysctl or boot
    /// parameter.
    pub fix: Option<String>,
    /// Whether the process tier (and so `brig run`) cannot work without it.
    pub required: bool,
}

impl Feature {
    fn ok(name: &'static str, required: bool, detail: impl Into<String>) -> Self {
        Self {
            name,
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
            required,
        }
    }

    fn missing(
        name: &'static str,
        required: bool,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            name,
            status: Status::Missing,
            detail: detail.into(),
            fix: Some(fix.into()),
            required,
        }
    }

    fn degraded(
        name: &'static str,
        required: bool,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            name,
            status: Status::Degraded,
            detail: detail.into(),
            fix: Some(fix.into()),
            required,
        }
    }

    /// True if the process tier cannot run without this feature and it is
    /// missing.
    pub fn blocks_process_tier(&self) -> bool {
        self.required && self.status == Status::Missing
    }
}

/// Everything [`probe`] found, and which tiers that adds up to.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostReport {
    pub features: Vec<Feature>,
    pub tiers: Tiers,
}

impl HostReport {
    pub fn feature(&self, name: &str) -> Option<&Feature> {
        self.features.iter().find(|f| f.name == name)
    }

    /// Why the process tier is unavailable: the first missing required
    /// feature, or `None` if the tier is usable.
    pub fn process_blocker(&self) -> Option<&Feature> {
        self.features.iter().find(|f| f.blocks_process_tier())
    }
}

/// Which isolation tiers this host can run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Tiers {
    pub process: bool,
    pub gvisor: bool,
    /// How the gvisor tier runs (runsc's version and platform) or why it
    /// cannot, and how to get it.
    pub gvisor_detail: String,
    pub vm: VmTier,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct VmTier {
    pub available: bool,
    pub accel: Accel,
    pub detail: String,
    /// Forks of one memory snapshot share its RAM copy-on-write (QEMU 8.2
    /// or later); otherwise each loads a copy.
    pub copy_on_write_forks: bool,
}

/// How the vm tier would run guests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Accel {
    /// Hardware virtualization (VT-x / AMD-V) through /dev/kvm.
    #[serde(rename = "kvm")]
    Kvm,
    /// /dev/kvm is PVM (nested, shadow paging). It runs tiny guests but a
    /// stock Linux kernel fails in KVM's instruction emulator, so guests run
    /// under TCG (reference/vm-feasibility.md, section 0).
    #[serde(rename = "pvm-kvm (cannot boot stock guests; TCG used)")]
    PvmKvm,
    /// QEMU's emulator: a real VM boundary, seconds to boot.
    #[serde(rename = "tcg")]
    Tcg,
    /// No QEMU: no vm tier.
    #[serde(rename = "none")]
    Unavailable,
}

/// Probe everything: the process tier's requirements, the optional
/// features, KVM and the helper programs.
pub fn probe() -> HostReport {
    let host = Host::read();
    let mut features = process_features(&host, Scope::All);

    let kvm = Kvm::detect();
    // The two `--version` runs are the slowest probes (tens of ms each for a
    // Go binary and QEMU); run them side by side.
    let (runsc, qemu) = std::thread::scope(|s| {
        let runsc = s.spawn(|| Tool::find("runsc", true));
        let qemu = Tool::find("qemu-system-x86_64", true);
        (
            runsc.join().unwrap_or(Tool {
                path: None,
                version: None,
            }),
            qemu,
        )
    });
    features.push(kvm.feature());
    features.push(runsc_feature(&runsc, &kvm));
    features.push(qemu_feature(&qemu));
    features.push(helper_feature(
        "mmdebstrap",
        &Tool::find("mmdebstrap", false),
        "builds Debian templates",
        "apt-get install mmdebstrap",
    ));
    features.push(helper_feature(
        "bubblewrap",
        &Tool::find("bwrap", false),
        "benchmark peer only",
        "apt-get install bubblewrap",
    ));
    features.push(helper_feature(
        "crun",
        &Tool::find("crun", false),
        "benchmark peer only",
        "apt-get install crun",
    ));

    features.extend(density_features(&DensityFacts::read()));
    features.push(localhost_names_feature(resolve(LOCALHOST_PROBE)));

    let runsc_platforms = runsc.path.as_deref().map(runsc_platforms);
    let tiers = tiers(&features, &kvm, runsc_platforms.as_deref());
    HostReport { features, tiers }
}

// Density: the host limits that cap how many sandboxes run at once.

/// How many live sandboxes brig aims to hold on one host; the density
/// checks judge the host's limits against it.
pub const DENSITY_TARGET: u64 = 10_000;

/// The host limits that cap density, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DensityFacts {
    /// `kernel.pid_max`: every process of every sandbox is a host pid (an
    /// idle sandbox: one, its agent).
    pub pid_max: Option<u64>,
    /// `kernel.threads-max`.
    pub threads_max: Option<u64>,
    /// The smallest of `user.max_{user,pid,net,mnt,ipc,uts,cgroup}_namespaces`:
    /// each sandbox takes one of each.
    pub namespaces_max: Option<(String, u64)>,
    /// `fs.nr_open`: how far root can raise the daemon's open-file limit
    /// (about five descriptors per sandbox).
    pub nr_open: Option<u64>,
    /// cgroup v1 hierarchies, and no cgroup mount with `favordynmods`:
    /// moving a new sandbox's init into its cgroup then waits for an RCU
    /// grace period.
    pub v1_without_favordynmods: bool,
    /// Where cgroup2 is mounted, if it is: the one mount whose
    /// `favordynmods` can change on a remount (v1 mounts refuse).
    pub v2_mount: Option<String>,
}

impl DensityFacts {
    pub fn read() -> DensityFacts {
        let sysctl = |name: &str| read_number(&format!("/proc/sys/{}", name.replace('.', "/")));
        let namespaces_max = ["user", "pid", "net", "mnt", "ipc", "uts", "cgroup"]
            .iter()
            .filter_map(|k| {
                let name = format!("user.max_{k}_namespaces");
                sysctl(&name).map(|v| (name, v))
            })
            .min_by_key(|(_, v)| *v);
        let layout = CgroupLayout::read().unwrap_or_default();
        DensityFacts {
            pid_max: sysctl("kernel.pid_max"),
            threads_max: sysctl("kernel.threads-max"),
            namespaces_max,
            nr_open: sysctl("fs.nr_open"),
            v1_without_favordynmods: layout.v1_without_favordynmods(),
            v2_mount: layout.v2.map(|m| m.mount_point),
        }
    }
}

/// The density checks: none is required, each names the setting that
/// lifts its limit.
pub fn density_features(facts: &DensityFacts) -> Vec<Feature> {
    let target = DENSITY_TARGET;
    let mut out = Vec::new();
    let mut limit = |name: &'static str, value: Option<u64>, need: u64, what: &str, fix: String| {
        out.push(match value {
            Some(v) if v >= need => Feature::ok(name, false, format!("{v} ({what})")),
            Some(v) => Feature::degraded(
                name,
                false,
                format!("{v}: fewer than the {need} that {target} live sandboxes need ({what})"),
                fix,
            ),
            None => Feature::degraded(name, false, "cannot read it", fix),
        });
    };
    limit(
        "pid_max",
        facts.pid_max,
        4 * target,
        "each process in a sandbox is a host pid; an idle sandbox costs one",
        "sysctl -w kernel.pid_max=4194304 (persist it in /etc/sysctl.d/)".into(),
    );
    limit(
        "threads_max",
        facts.threads_max,
        4 * target,
        "threads on the host, sandboxes' included",
        "sysctl -w kernel.threads-max=1000000".into(),
    );
    let (ns_name, ns_value) = match &facts.namespaces_max {
        Some((n, v)) => (n.clone(), Some(*v)),
        None => ("user.max_user_namespaces".to_owned(), None),
    };
    limit(
        "namespaces_max",
        ns_value,
        target,
        &format!("{ns_name}; each sandbox takes one namespace of each kind"),
        format!("sysctl -w {ns_name}=100000"),
    );
    limit(
        "nr_open",
        facts.nr_open,
        8 * target,
        "the daemon holds about five descriptors per sandbox and raises its limit up to this",
        "sysctl -w fs.nr_open=1048576".into(),
    );
    out.push(if facts.v1_without_favordynmods {
        // v1 mounts cannot change the option on a remount (the kernel
        // refuses: "option or name mismatch"); cgroup2 can, and the lock
        // it acts on is kernel-wide.
        let fix = match &facts.v2_mount {
            Some(v2) => format!(
                "mount -o remount,favordynmods {v2} (one mount is enough: the setting is \
                 kernel-wide); or boot with cgroup_favordynmods=true (Linux >= 6.7)"
            ),
            None => "boot with cgroup_favordynmods=true (Linux >= 6.7); or mount a \
                     controller-less hierarchy with it (the setting is kernel-wide): mkdir -p \
                     /run/brig/favordynmods && mount -t cgroup -o none,name=brig,favordynmods \
                     cgroup /run/brig/favordynmods"
                .to_string(),
        };
        Feature::degraded(
            "cgroup_favordynmods",
            false,
            "cgroups are v1 and no cgroup mount has favordynmods: creating a sandbox waits \
             up to 3-20 ms for an RCU grace period when its first process joins its cgroup",
            &fix,
        )
    } else {
        Feature::ok(
            "cgroup_favordynmods",
            false,
            "no cgroup v1 controller mount makes cgroup attaches wait",
        )
    });
    out
}

/// Check only what the process tier needs, and return the first required
/// feature that is missing. Costs one forked child and a few file reads.
pub fn check_process_tier() -> Result<(), Feature> {
    let host = Host::read();
    match process_features(&host, Scope::Required)
        .into_iter()
        .find(Feature::blocks_process_tier)
    {
        Some(feature) => Err(feature),
        None => Ok(()),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scope {
    Required,
    All,
}

/// The process tier's features, in report order. With [`Scope::Required`]
/// the optional ones are skipped (and not probed).
fn process_features(host: &Host, scope: Scope) -> Vec<Feature> {
    let all = scope == Scope::All;
    let mut out = vec![root_feature(host.privilege)];

    let knobs = UsernsKnobs::read();
    out.push(userns_feature(
        host.ns_test.as_ref(),
        &knobs,
        host.privilege,
    ));
    out.extend(
        NAMESPACES
            .iter()
            .map(|ns| namespace_feature(ns, host.ns_test.as_ref(), ns_present(ns))),
    );

    out.push(overlayfs_feature(host));
    if all {
        out.push(overlay_in_userns_feature(
            host.ns_test.as_ref(),
            host.kernel,
        ));
    }
    out.push(open_tree_feature(host.privilege));
    if all {
        out.push(idmapped_mounts_feature(host.kernel, host.privilege));
    }
    out.push(seccomp_feature(&host.status));
    out.push(no_new_privs_feature());
    if all {
        out.push(pidfd_feature());
    }

    let cgroups = CgroupFacts::read(host.kernel);
    out.extend(
        cgroup_features(&cgroups)
            .into_iter()
            .filter(|f| all || f.required),
    );

    out.push(tmpfs_feature(&host.filesystems));
    out.push(devpts_feature(&host.filesystems, host.kernel));
    out
}

// ---------------------------------------------------------------------------
// Facts read once per probe.

struct Host {
    /// `/proc/sys/kernel/osrelease`, e.g. `6.1.0-28-amd64`.
    release: String,
    kernel: Option<KernelVersion>,
    privilege: Privilege,
    /// `/proc/filesystems`.
    filesystems: String,
    /// `/proc/self/status`.
    status: String,
    ns_test: Option<NsTest>,
}

impl Host {
    fn read() -> Self {
        let release = read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default();
        let status = read_string("/proc/self/status").unwrap_or_default();
        Host {
            kernel: KernelVersion::parse(&release),
            release,
            privilege: Privilege::of(&status),
            filesystems: read_string("/proc/filesystems").unwrap_or_default(),
            status,
            ns_test: NsTest::run(),
        }
    }
}

/// A kernel release, compared numerically: `6.18.44-fc-v669` is (6, 18, 44).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct KernelVersion {
    major: u32,
    minor: u32,
    patch: u32,
}

impl KernelVersion {
    const fn new(major: u32, minor: u32) -> Self {
        Self {
            major,
            minor,
            patch: 0,
        }
    }

    fn parse(release: &str) -> Option<Self> {
        // Take the leading "X.Y[.Z]"; distributions append anything after it
        // ("-28-amd64", "-rc1", "+").
        let mut parts = release.trim().split('.').map(|p| {
            let digits: String = p.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u32>().ok()
        });
        let major = parts.next()??;
        let minor = parts.next()??;
        let patch = parts.next().flatten().unwrap_or(0);
        Some(Self {
            major,
            minor,
            patch,
        })
    }

    /// True if the kernel is known to be at least `major.minor`.
    fn at_least(kernel: Option<Self>, major: u32, minor: u32) -> bool {
        kernel.is_some_and(|k| k >= Self::new(major, minor))
    }
}

impl std::fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

fn kernel_str(kernel: Option<KernelVersion>) -> String {
    kernel.map_or_else(|| "unknown".to_owned(), |k| k.to_string())
}

/// The capability number of CAP_SYS_ADMIN (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Privilege {
    Root,
    CapSysAdmin,
    Unprivileged,
}

impl Privilege {
    fn of(proc_status: &str) -> Self {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            return Privilege::Root;
        }
        let cap_eff =
            status_field(proc_status, "CapEff").and_then(|v| u64::from_str_radix(v, 16).ok());
        if cap_eff.is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0) {
            Privilege::CapSysAdmin
        } else {
            Privilege::Unprivileged
        }
    }
}

/// The value of `field` in a `/proc/<pid>/status`-style text.
fn status_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == field).then(|| value.trim())
    })
}

fn read_string(path: impl AsRef<Path>) -> io::Result<String> {
    std::fs::read_to_string(path)
}

fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    read_string(path).ok().map(|s| s.trim().to_owned())
}

fn read_number(path: &str) -> Option<u64> {
    read_trimmed(path)?.parse().ok()
}

fn errno_str(errno: i32) -> String {
    io::Error::from_raw_os_error(errno).to_string()
}

fn last_errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Privilege.

fn root_feature(privilege: Privilege) -> Feature {
    const NAME: &str = "root";
    match privilege {
        Privilege::Root => Feature::ok(NAME, true, "running as uid 0"),
        Privilege::CapSysAdmin => {
            Feature::ok(NAME, true, "not uid 0, but CAP_SYS_ADMIN is effective")
        }
        Privilege::Unprivileged => Feature::missing(
            NAME,
            true,
            "not root and no CAP_SYS_ADMIN: the process tier needs them (for now) to set up \
             cgroups and map sandbox uids",
            "run with sudo",
        ),
    }
}

// ---------------------------------------------------------------------------
// Namespaces, tested for real in a forked child.

/// What a throwaway child managed: create a user namespace, map itself to
/// root in it, create each other namespace inside it, and mount an overlay
/// there. Each slot is 0 (worked), an errno, or `NOT_TRIED`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NsTest {
    user: i32,
    /// Writing setgroups/uid_map/gid_map for the new user namespace.
    maps: i32,
    /// One slot per entry of [`NAMESPACES`], in that order.
    others: [i32; 6],
    /// The first overlay step that failed (an index into [`OVERLAY_STEPS`])
    /// and its errno; `errno == 0` if the overlay was mounted.
    overlay_step: i32,
    overlay_errno: i32,
}

const NOT_TRIED: i32 = -1;

/// The steps of the overlay-in-a-user-namespace test, for messages.
const OVERLAY_STEPS: [&str; 5] = [
    "unshare(CLONE_NEWNS)",
    "making the mount tree private",
    "mounting a scratch tmpfs",
    "creating the overlay directories",
    "mounting the overlay",
];

struct Namespace {
    feature: &'static str,
    /// The file under /proc/self/ns/.
    file: &'static str,
    flag: libc::c_int,
    fix: &'static str,
}

const NAMESPACES: [Namespace; 6] = [
    Namespace {
        feature: "mount_namespace",
        file: "mnt",
        flag: libc::CLONE_NEWNS,
        fix: "upgrade to Linux >= 3.8 (mount namespaces are always built in)",
    },
    Namespace {
        feature: "pid_namespace",
        file: "pid",
        flag: libc::CLONE_NEWPID,
        fix: "rebuild the kernel with CONFIG_PID_NS=y",
    },
    Namespace {
        feature: "net_namespace",
        file: "net",
        flag: libc::CLONE_NEWNET,
        fix: "rebuild the kernel with CONFIG_NET_NS=y",
    },
    Namespace {
        feature: "ipc_namespace",
        file: "ipc",
        flag: libc::CLONE_NEWIPC,
        fix: "rebuild the kernel with CONFIG_IPC_NS=y",
    },
    Namespace {
        feature: "uts_namespace",
        file: "uts",
        flag: libc::CLONE_NEWUTS,
        fix: "rebuild the kernel with CONFIG_UTS_NS=y",
    },
    Namespace {
        feature: "cgroup_namespace",
        file: "cgroup",
        flag: libc::CLONE_NEWCGROUP,
        fix: "upgrade to Linux >= 4.6 with CONFIG_CGROUPS=y",
    },
];

fn ns_present(ns: &Namespace) -> bool {
    Path::new("/proc/self/ns")
        .join(ns.file)
        .symlink_metadata()
        .is_ok()
}

impl NsTest {
    /// Fork a child that tries it all; `None` if the child could not be
    /// started or was killed half-way (by a seccomp filter, say).
    fn run() -> Option<Self> {
        // Everything the child needs is prepared here: after fork in a
        // possibly multi-threaded process the child may only make raw
        // system calls, never allocate.
        // SAFETY: geteuid/getegid have no preconditions and cannot fail.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let uid_map = format!("0 {uid} 1");
        let gid_map = format!("0 {gid} 1");

        let slots = in_child::<10>(|r| {
            // SAFETY: unshare takes plain flags.
            r[0] = errno_of(unsafe { libc::unshare(libc::CLONE_NEWUSER) });
            if r[0] != 0 {
                return;
            }
            // Map ourselves to root in the new namespace, as the sandbox
            // bring-up does; without a mapping, files cannot be created.
            r[1] = write_all(c"/proc/self/setgroups", b"deny")
                .and_then(|()| write_all(c"/proc/self/uid_map", uid_map.as_bytes()))
                .and_then(|()| write_all(c"/proc/self/gid_map", gid_map.as_bytes()))
                .err()
                .unwrap_or(0);
            // The mount namespace first, because the overlay test runs in it.
            for (slot, ns) in r[2..8].iter_mut().zip(NAMESPACES.iter()) {
                // SAFETY: unshare takes plain flags.
                *slot = errno_of(unsafe { libc::unshare(ns.flag) });
            }
            if r[2] == 0 && r[1] == 0 {
                match overlay_steps() {
                    Ok(()) => (r[8], r[9]) = (0, 0),
                    Err((step, errno)) => (r[8], r[9]) = (step, errno),
                }
            } else if r[2] != 0 {
                (r[8], r[9]) = (0, r[2]);
            }
        })?;
        Some(NsTest {
            user: slots[0],
            maps: slots[1],
            others: slots[2..8].try_into().expect("six slots"),
            overlay_step: slots[8],
            overlay_errno: slots[9],
        })
    }
}

/// Inside the test child, already in a fresh user and mount namespace:
/// mount a scratch tmpfs over /tmp and an overlay inside it. Nothing is
/// visible outside — the mount tree is made private first, and it all
/// disappears with the child. Runs after fork: raw syscalls only.
fn overlay_steps() -> Result<(), (i32, i32)> {
    let step = |index: i32, ret: libc::c_int| {
        if ret == 0 {
            Ok(())
        } else {
            Err((index, last_errno()))
        }
    };
    // SAFETY: mount with valid C strings, or null where MS_PRIVATE allows
    // it; the kernel does not keep the pointers.
    step(1, unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })?;
    // SAFETY: mount with valid C strings; the kernel does not keep them.
    step(2, unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            c"/tmp".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"mode=0700".as_ptr().cast(),
        )
    })?;
    for dir in [c"/tmp/l", c"/tmp/u", c"/tmp/w", c"/tmp/m"] {
        // SAFETY: mkdir with a valid C string.
        step(3, unsafe { libc::mkdir(dir.as_ptr(), 0o700) })?;
    }
    // `userxattr` (Linux >= 5.11, the same release that allows the mount at
    // all) keeps overlayfs from warning in dmesg about trusted.* xattrs it
    // cannot set from inside a user namespace.
    // SAFETY: mount with valid C strings; the kernel does not keep them.
    step(4, unsafe {
        libc::mount(
            c"overlay".as_ptr(),
            c"/tmp/m".as_ptr(),
            c"overlay".as_ptr(),
            0,
            c"userxattr,lowerdir=/tmp/l,upperdir=/tmp/u,workdir=/tmp/w"
                .as_ptr()
                .cast(),
        )
    })
}

fn errno_of(ret: libc::c_int) -> i32 {
    if ret == 0 {
        0
    } else {
        last_errno()
    }
}

/// Write `data` to `path` with raw syscalls (safe after fork); the errno on
/// failure.
fn write_all(path: &CStr, data: &[u8]) -> Result<(), i32> {
    // SAFETY: path is a valid C string.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: data is a live slice of data.len() bytes; fd is ours.
    let written = unsafe { libc::write(fd, data.as_ptr().cast(), data.len()) };
    let result = if written == data.len() as isize {
        Ok(())
    } else {
        Err(last_errno())
    };
    // SAFETY: fd is ours and closed once.
    unsafe { libc::close(fd) };
    result
}

/// Run `check` in a forked child and return the `N` numbers it filled in,
/// or `None` if the child could not be forked or died without answering.
///
/// `check` runs after `fork` in a process that may have other threads (the
/// daemon, the test harness): it may only make raw system calls — any
/// allocation could deadlock on a lock another thread held at fork time.
fn in_child<const N: usize>(check: impl FnOnce(&mut [i32; N])) -> Option<[i32; N]> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array we own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return None;
    }
    let [read_fd, write_fd] = fds;
    // SAFETY: the child runs only `check` (raw syscalls, per this function's
    // contract), one write and _exit; it never returns into Rust code that
    // the parent's other threads might have left in an inconsistent state.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut slots = [NOT_TRIED; N];
        check(&mut slots);
        // SAFETY: writes from a local array to our pipe, then exits without
        // running destructors or atexit handlers that belong to the parent.
        unsafe {
            libc::write(
                write_fd,
                slots.as_ptr().cast(),
                std::mem::size_of_val(&slots),
            );
            libc::_exit(0);
        }
    }
    // SAFETY: write_fd is ours; the parent never writes, and closing it lets
    // the read below see EOF if the child dies without writing.
    unsafe { libc::close(write_fd) };
    if pid < 0 {
        // SAFETY: read_fd is ours and closed once.
        unsafe { libc::close(read_fd) };
        return None;
    }

    let mut slots = [0i32; N];
    let want = std::mem::size_of_val(&slots);
    let mut got = 0;
    while got < want {
        // SAFETY: reads into the remaining bytes of our own array.
        let n = unsafe {
            libc::read(
                read_fd,
                slots.as_mut_ptr().cast::<u8>().add(got).cast(),
                want - got,
            )
        };
        if n > 0 {
            got += n as usize;
        } else if n < 0 && last_errno() == libc::EINTR {
            continue;
        } else {
            break;
        }
    }
    // SAFETY: read_fd is ours and closed once; waitpid reaps our own child.
    unsafe {
        libc::close(read_fd);
        while libc::waitpid(pid, std::ptr::null_mut(), 0) < 0 && last_errno() == libc::EINTR {}
    }
    (got == want).then_some(slots)
}

/// The sysctls that gate user namespaces.
#[derive(Debug, Default, Clone)]
struct UsernsKnobs {
    /// `user.max_user_namespaces`.
    max: Option<u64>,
    /// `kernel.unprivileged_userns_clone` (Debian and Ubuntu kernels only).
    unprivileged_clone: Option<u64>,
    /// `kernel.apparmor_restrict_unprivileged_userns` (Ubuntu >= 23.10).
    apparmor_restrict: Option<u64>,
}

impl UsernsKnobs {
    fn read() -> Self {
        UsernsKnobs {
            max: read_number("/proc/sys/user/max_user_namespaces"),
            unprivileged_clone: read_number("/proc/sys/kernel/unprivileged_userns_clone"),
            apparmor_restrict: read_number(
                "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
            ),
        }
    }
}

fn userns_feature(test: Option<&NsTest>, knobs: &UsernsKnobs, privilege: Privilege) -> Feature {
    const NAME: &str = "user_namespace";
    let mut notes = Vec::new();
    if let Some(max) = knobs.max {
        notes.push(format!("user.max_user_namespaces={max}"));
    }
    // These two only restrict unprivileged users; root is not affected, so
    // they are worth a note but only become the fix when brig is not root.
    if knobs.unprivileged_clone == Some(0) {
        notes.push("kernel.unprivileged_userns_clone=0".to_owned());
    }
    if knobs.apparmor_restrict == Some(1) {
        notes.push("kernel.apparmor_restrict_unprivileged_userns=1".to_owned());
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join(", "))
    };

    let Some(test) = test else {
        return Feature::missing(
            NAME,
            true,
            format!("the test child could not be started or was killed{notes}"),
            "check that fork is allowed and no seccomp policy kills unshare (docker: \
             --security-opt seccomp=unconfined)",
        );
    };
    if test.user == 0 && test.maps == 0 {
        return Feature::ok(
            NAME,
            true,
            format!("created one and mapped root in it{notes}"),
        );
    }
    if test.user == 0 {
        return Feature::missing(
            NAME,
            true,
            format!(
                "created one but could not write its uid/gid map: {}{notes}",
                errno_str(test.maps)
            ),
            "allow writing /proc/self/uid_map (a container's seccomp or LSM policy blocks it)",
        );
    }
    let unprivileged = privilege != Privilege::Root;
    let fix = if knobs.max == Some(0) {
        "sysctl -w user.max_user_namespaces=15000".to_owned()
    } else if unprivileged && knobs.unprivileged_clone == Some(0) {
        "sysctl -w kernel.unprivileged_userns_clone=1, or run with sudo".to_owned()
    } else if unprivileged && knobs.apparmor_restrict == Some(1) {
        "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or run with sudo".to_owned()
    } else {
        match test.user {
            libc::EINVAL => "rebuild the kernel with CONFIG_USER_NS=y".to_owned(),
            libc::ENOSPC => "raise the limit: sysctl -w user.max_user_namespaces=15000".to_owned(),
            _ => "allow unshare(CLONE_NEWUSER): in a container, run with --security-opt \
                  seccomp=unconfined or --privileged"
                .to_owned(),
        }
    };
    Feature::missing(
        NAME,
        true,
        format!(
            "unshare(CLONE_NEWUSER) failed: {}{notes}",
            errno_str(test.user)
        ),
        fix,
    )
}

fn namespace_feature(ns: &Namespace, test: Option<&NsTest>, present: bool) -> Feature {
    let index = NAMESPACES
        .iter()
        .position(|n| n.feature == ns.feature)
        .expect("listed namespace");
    let tested = test.map_or(NOT_TRIED, |t| t.others[index]);
    match (present, tested) {
        (false, _) => Feature::missing(
            ns.feature,
            true,
            format!("no /proc/self/ns/{}", ns.file),
            ns.fix,
        ),
        (true, 0) => Feature::ok(ns.feature, true, "created one inside a user namespace"),
        (true, NOT_TRIED) => Feature::ok(
            ns.feature,
            true,
            format!(
                "/proc/self/ns/{} present (not test-created: no user namespace)",
                ns.file
            ),
        ),
        (true, errno) => Feature::missing(
            ns.feature,
            true,
            format!(
                "the kernel has it, but creating one failed: {}",
                errno_str(errno)
            ),
            "allow unshare of this namespace: in a container, run with --security-opt \
             seccomp=unconfined or --privileged",
        ),
    }
}

// ---------------------------------------------------------------------------
// Filesystems and mount APIs.

/// The filesystem types named in `/proc/filesystems`.
fn filesystems(text: &str) -> BTreeSet<&str> {
    text.lines()
        .filter_map(|line| line.split_whitespace().last())
        .collect()
}

fn overlayfs_feature(host: &Host) -> Feature {
    const NAME: &str = "overlayfs";
    if filesystems(&host.filesystems).contains("overlay") {
        return Feature::ok(NAME, true, "overlay is in /proc/filesystems");
    }
    // A module that is not loaded yet is loaded on the first mount (the
    // kernel asks modprobe for "fs-overlay"), so a present module is usable.
    let module_dir = Path::new("/lib/modules")
        .join(&host.release)
        .join("kernel/fs/overlayfs");
    if module_dir.is_dir() {
        Feature::degraded(
            NAME,
            true,
            "overlay is not loaded; the kernel loads the module on first mount",
            "modprobe overlay",
        )
    } else {
        Feature::missing(
            NAME,
            true,
            "overlay is not in /proc/filesystems and no overlay module was found",
            "modprobe overlay (the kernel needs CONFIG_OVERLAY_FS)",
        )
    }
}

fn overlay_in_userns_feature(test: Option<&NsTest>, kernel: Option<KernelVersion>) -> Feature {
    const NAME: &str = "overlayfs_in_userns";
    let too_old = !KernelVersion::at_least(kernel, 5, 11);
    let fix = if too_old {
        "upgrade to Linux >= 5.11, which allows overlay mounts inside user namespaces"
    } else {
        "check dmesg for overlayfs errors"
    };
    let Some(test) = test.filter(|t| t.user == 0 && t.maps == 0) else {
        return Feature::degraded(NAME, false, "not tested: no user namespace", fix);
    };
    if test.overlay_errno == 0 {
        return Feature::ok(
            NAME,
            false,
            format!(
                "mounted one inside a user namespace (Linux {})",
                kernel_str(kernel)
            ),
        );
    }
    let step = OVERLAY_STEPS
        .get(test.overlay_step as usize)
        .copied()
        .unwrap_or("the test");
    Feature::degraded(
        NAME,
        false,
        format!(
            "{step} failed: {} (Linux {})",
            errno_str(test.overlay_errno),
            kernel_str(kernel)
        ),
        fix,
    )
}

/// Whether a syscall exists: call it with arguments it must reject and see
/// whether the kernel answers ENOSYS (absent) or something else (present).
/// EPERM is ambiguous: the mount API syscalls check CAP_SYS_ADMIN before
/// their arguments, so unprivileged it means "present", while a privileged
/// caller only gets it from a seccomp policy that denies the syscall.
#[derive(Debug, PartialEq, Eq)]
enum Syscall {
    Present,
    Absent,
    Blocked,
}

fn syscall_status(ret: libc::c_long, privilege: Privilege) -> Syscall {
    match (ret, last_errno()) {
        (r, _) if r >= 0 => Syscall::Present,
        (_, libc::ENOSYS) => Syscall::Absent,
        (_, libc::EPERM) if privilege != Privilege::Unprivileged => Syscall::Blocked,
        _ => Syscall::Present,
    }
}

fn open_tree_feature(privilege: Privilege) -> Feature {
    const NAME: &str = "open_tree";
    // SAFETY: an invalid dirfd and an empty path: the kernel rejects the call
    // (EBADF/ENOENT) without touching anything.
    let open_tree = unsafe { libc::syscall(libc::SYS_open_tree, -1, c"".as_ptr(), 0) };
    let open_tree = syscall_status(open_tree, privilege);
    // SAFETY: as above, for both directory/path pairs.
    let move_mount =
        unsafe { libc::syscall(libc::SYS_move_mount, -1, c"".as_ptr(), -1, c"".as_ptr(), 0) };
    let move_mount = syscall_status(move_mount, privilege);
    match (open_tree, move_mount) {
        (Syscall::Present, Syscall::Present) => {
            Feature::ok(NAME, true, "open_tree and move_mount are available")
        }
        (Syscall::Blocked, _) | (_, Syscall::Blocked) => Feature::missing(
            NAME,
            true,
            "open_tree/move_mount are blocked (EPERM), probably by a container's seccomp policy",
            "allow them: in a container, run with --security-opt seccomp=unconfined",
        ),
        _ => Feature::missing(
            NAME,
            true,
            "open_tree/move_mount are not available (ENOSYS)",
            "upgrade to Linux >= 5.2",
        ),
    }
}

fn idmapped_mounts_feature(kernel: Option<KernelVersion>, privilege: Privilege) -> Feature {
    const NAME: &str = "idmapped_mounts";
    // SAFETY: an invalid dirfd, an empty path, a null attribute with size 0:
    // the kernel rejects the call (EINVAL/EBADF) without touching anything.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1,
            c"".as_ptr(),
            0,
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    match syscall_status(ret, privilege) {
        Syscall::Present if KernelVersion::at_least(kernel, 5, 12) => Feature::ok(
            NAME,
            false,
            "mount_setattr is available (MOUNT_ATTR_IDMAP; per-filesystem support varies)",
        ),
        Syscall::Present => Feature::missing(
            NAME,
            false,
            format!(
                "mount_setattr answers, but Linux {} predates idmapped mounts",
                kernel_str(kernel)
            ),
            "upgrade to Linux >= 5.12",
        ),
        Syscall::Blocked => Feature::missing(
            NAME,
            false,
            "mount_setattr is blocked (EPERM), probably by a container's seccomp policy",
            "allow it: in a container, run with --security-opt seccomp=unconfined",
        ),
        Syscall::Absent => Feature::missing(
            NAME,
            false,
            "mount_setattr is not available (ENOSYS)",
            "upgrade to Linux >= 5.12",
        ),
    }
}

fn tmpfs_feature(filesystems_text: &str) -> Feature {
    if filesystems(filesystems_text).contains("tmpfs") {
        Feature::ok("tmpfs", true, "tmpfs is in /proc/filesystems")
    } else {
        Feature::missing(
            "tmpfs",
            true,
            "tmpfs is not in /proc/filesystems",
            "rebuild the kernel with CONFIG_TMPFS=y",
        )
    }
}

fn devpts_feature(filesystems_text: &str, kernel: Option<KernelVersion>) -> Feature {
    const NAME: &str = "devpts";
    if !filesystems(filesystems_text).contains("devpts") {
        return Feature::missing(
            NAME,
            true,
            "devpts is not in /proc/filesystems",
            "rebuild the kernel with CONFIG_UNIX98_PTYS=y",
        );
    }
    // Since Linux 4.7 every devpts mount is a private instance, so a
    // sandbox's ptys are invisible to the host and to other sandboxes.
    if KernelVersion::at_least(kernel, 4, 7) {
        Feature::ok(
            NAME,
            true,
            "every devpts mount is a new instance (Linux >= 4.7)",
        )
    } else {
        Feature::degraded(
            NAME,
            true,
            format!(
                "Linux {} shares one devpts unless mounted with newinstance",
                kernel_str(kernel)
            ),
            "upgrade to Linux >= 4.7, or a kernel with CONFIG_DEVPTS_MULTIPLE_INSTANCES=y",
        )
    }
}

// ---------------------------------------------------------------------------
// seccomp, no_new_privs, pidfd.

fn seccomp_feature(proc_status: &str) -> Feature {
    const NAME: &str = "seccomp";
    // SAFETY: PR_GET_SECCOMP takes no pointers.
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    if mode < 0 || status_field(proc_status, "Seccomp").is_none() {
        return Feature::missing(
            NAME,
            true,
            "prctl(PR_GET_SECCOMP) failed and /proc/self/status has no Seccomp field",
            "rebuild the kernel with CONFIG_SECCOMP=y and CONFIG_SECCOMP_FILTER=y",
        );
    }
    let action_avail = |action: libc::c_uint| {
        // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 from a pointer to a
        // live local.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_GET_ACTION_AVAIL,
                0,
                &action as *const libc::c_uint,
            )
        };
        if ret == 0 {
            Ok(())
        } else {
            Err(last_errno())
        }
    };
    let mut actions = Vec::new();
    for (action, name) in [
        (libc::SECCOMP_RET_KILL_PROCESS, "kill_process"),
        (libc::SECCOMP_RET_ERRNO, "errno"),
        (libc::SECCOMP_RET_TRAP, "trap"),
        (libc::SECCOMP_RET_LOG, "log"),
        (libc::SECCOMP_RET_USER_NOTIF, "user_notif"),
    ] {
        match action_avail(action) {
            Ok(()) => actions.push(name),
            // Linux < 4.14 has no SECCOMP_GET_ACTION_AVAIL; filter mode itself
            // may still work, but brig cannot verify it.
            Err(libc::EINVAL) => {
                return Feature::degraded(
                    NAME,
                    true,
                    "seccomp is present but the kernel cannot report filter actions (Linux < 4.14)",
                    "upgrade to Linux >= 4.14",
                )
            }
            Err(_) => {}
        }
    }
    let current = match mode {
        0 => "none",
        1 => "strict",
        _ => "a filter (new filters stack on it)",
    };
    if !actions.contains(&"errno") {
        return Feature::missing(
            NAME,
            true,
            "seccomp filter mode is not available",
            "rebuild the kernel with CONFIG_SECCOMP_FILTER=y",
        );
    }
    Feature::ok(
        NAME,
        true,
        format!(
            "filter mode; actions: {}; brig's current mode: {current}",
            actions.join(", ")
        ),
    )
}

fn no_new_privs_feature() -> Feature {
    const NAME: &str = "no_new_privs";
    // SAFETY: PR_GET_NO_NEW_PRIVS takes no pointers.
    match unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } {
        0 => Feature::ok(NAME, true, "available"),
        1 => Feature::ok(NAME, true, "available (already set on brig itself)"),
        _ => Feature::missing(
            NAME,
            true,
            "prctl(PR_GET_NO_NEW_PRIVS) failed",
            "upgrade to Linux >= 3.5",
        ),
    }
}

fn pidfd_feature() -> Feature {
    const NAME: &str = "pidfd_open";
    // SAFETY: getpid cannot fail; pidfd_open takes plain integers.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if fd >= 0 {
        // SAFETY: the descriptor was just returned to us and is closed once.
        unsafe { libc::close(fd as libc::c_int) };
        return Feature::ok(NAME, false, "available");
    }
    let errno = last_errno();
    let fix = if errno == libc::ENOSYS {
        "upgrade to Linux >= 5.3"
    } else {
        "allow pidfd_open: in a container, run with --security-opt seccomp=unconfined"
    };
    Feature::missing(
        NAME,
        false,
        format!("pidfd_open failed: {}", errno_str(errno)),
        fix,
    )
}

// ---------------------------------------------------------------------------
// cgroups.

/// The controllers the kernel has, from `/proc/cgroups`: name and whether
/// it is enabled (a `cgroup_disable=` boot parameter turns it off).
fn parse_proc_cgroups(text: &str) -> Vec<(String, bool)> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            Some((fields.first()?.to_string(), *fields.get(3)? == "1"))
        })
        .collect()
}

/// Everything the cgroup features are judged on.
#[derive(Debug, Default, Clone)]
struct CgroupFacts {
    layout: CgroupLayout,
    /// `/proc/cgroups`.
    kernel_controllers: Vec<(String, bool)>,
    /// The v2 root's `cgroup.controllers` and `cgroup.subtree_control`.
    v2_controllers: Vec<String>,
    v2_subtree: Vec<String>,
    /// Whether memory+swap can be limited; `None` if it could not be told.
    swap_accounting: Option<bool>,
    /// Whether any swap is active (`/proc/swaps`).
    swap_active: bool,
    kernel: Option<KernelVersion>,
}

impl CgroupFacts {
    fn read(kernel: Option<KernelVersion>) -> Self {
        let layout = CgroupLayout::read().unwrap_or_default();
        let words = |path: PathBuf| -> Vec<String> {
            read_string(path)
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect()
        };
        let (v2_controllers, v2_subtree) = match &layout.v2 {
            Some(m) => {
                let root = Path::new(&m.mount_point);
                (
                    words(root.join("cgroup.controllers")),
                    words(root.join("cgroup.subtree_control")),
                )
            }
            None => Default::default(),
        };
        let swap_accounting = swap_accounting(&layout, &v2_controllers);
        let swap_active = read_string("/proc/swaps")
            .map(|s| s.lines().count() > 1)
            .unwrap_or(false);
        CgroupFacts {
            kernel_controllers: parse_proc_cgroups(
                &read_string("/proc/cgroups").unwrap_or_default(),
            ),
            layout,
            v2_controllers,
            v2_subtree,
            swap_accounting,
            swap_active,
            kernel,
        }
    }
}

/// Whether memory limits can cover swap: v1 has `memory.memsw.*` at the
/// memory hierarchy's root; v2 has `memory.swap.max` in every non-root
/// cgroup, so look at brig's own cgroup or any child of the root.
fn swap_accounting(layout: &CgroupLayout, v2_controllers: &[String]) -> Option<bool> {
    if let Some(h) = layout.v1_hierarchy("memory") {
        return Some(
            Path::new(&h.mount.mount_point)
                .join("memory.memsw.limit_in_bytes")
                .exists(),
        );
    }
    let v2 = layout
        .v2
        .as_ref()
        .filter(|_| v2_controllers.iter().any(|c| c == "memory"))?;
    let root = Path::new(&v2.mount_point);
    let own = read_string("/proc/self/cgroup").ok().and_then(|text| {
        text.lines().find_map(|l| {
            l.strip_prefix("0::")
                .map(|p| p.trim_start_matches('/').to_owned())
        })
    });
    let mut candidates: Vec<PathBuf> = own
        .filter(|p| !p.is_empty())
        .map(|p| root.join(p))
        .into_iter()
        .collect();
    if let Ok(entries) = std::fs::read_dir(root) {
        candidates.extend(
            entries
                .flatten()
                .take(64)
                .map(|e| e.path())
                .filter(|p| p.is_dir()),
        );
    }
    if candidates
        .iter()
        .any(|dir| dir.join("memory.swap.max").exists())
    {
        return Some(true);
    }
    // No child with the memory controller enabled: nothing to tell from.
    candidates
        .iter()
        .any(|dir| dir.join("memory.max").exists())
        .then_some(false)
}

/// Where a controller is usable.
enum Site<'a> {
    V1(&'a V1Hierarchy),
    V2 {
        mount: &'a CgroupMount,
        enabled: bool,
    },
}

impl CgroupFacts {
    fn site(&self, controller: &str) -> Option<Site<'_>> {
        if let Some(h) = self.layout.v1_hierarchy(controller) {
            return Some(Site::V1(h));
        }
        let mount = self.layout.v2.as_ref()?;
        self.v2_controllers
            .iter()
            .any(|c| c == controller)
            .then(|| Site::V2 {
                mount,
                enabled: self.v2_subtree.iter().any(|c| c == controller),
            })
    }

    /// Why `controller` is nowhere to be found, and what to do about it.
    fn absent(&self, controller: &str, config: &str) -> (String, String) {
        match self.kernel_controllers.iter().find(|(name, _)| name == controller) {
            None => (
                format!("the kernel has no {controller} controller"),
                format!("rebuild the kernel with {config}=y"),
            ),
            Some((_, false)) => (
                format!("the {controller} controller is disabled on the kernel command line"),
                format!("boot without cgroup_disable={controller} (or with cgroup_enable={controller})"),
            ),
            Some((_, true)) => match self.layout.version() {
                CgroupVersion::V2 => (
                    format!("{controller} is not in the cgroup2 root's cgroup.controllers (bound to a v1 hierarchy elsewhere?)"),
                    "boot with cgroup_no_v1=all so every controller is available to cgroup2".to_owned(),
                ),
                CgroupVersion::None => (
                    "no cgroup hierarchy is mounted".to_owned(),
                    "mount cgroup2: mount -t cgroup2 cgroup2 /sys/fs/cgroup".to_owned(),
                ),
                CgroupVersion::V1 | CgroupVersion::Hybrid => (
                    format!("the kernel has {controller} but no v1 hierarchy mounts it"),
                    format!(
                        "mkdir -p /sys/fs/cgroup/{controller} && mount -t cgroup -o {controller} cgroup /sys/fs/cgroup/{controller}"
                    ),
                ),
            },
        }
    }
}

/// Judge one controller. `degraded` is what brig loses without an optional
/// controller; `None` makes it required.
fn controller_feature(
    facts: &CgroupFacts,
    name: &'static str,
    controller: &str,
    config: &str,
    degraded: Option<&str>,
) -> Feature {
    let required = degraded.is_none();
    let not_ok = |detail: String, fix: String| match degraded {
        None => Feature::missing(name, required, detail, fix),
        Some(loss) => Feature::degraded(name, required, format!("{detail}: {loss}"), fix),
    };
    let read_only = |mount: &CgroupMount| {
        not_ok(
            format!("{} is mounted read-only", mount.mount_point),
            format!(
                "mount -o remount,rw {} (in a container: give it a writable cgroup mount)",
                mount.mount_point
            ),
        )
    };
    match facts.site(controller) {
        Some(Site::V1(h)) if h.mount.read_only => read_only(&h.mount),
        Some(Site::V1(h)) => Feature::ok(name, required, format!("v1 at {}", h.mount.mount_point)),
        Some(Site::V2 { mount, .. }) if mount.read_only => read_only(mount),
        Some(Site::V2 {
            mount,
            enabled: true,
        }) => Feature::ok(
            name,
            required,
            format!(
                "v2 at {}, enabled in cgroup.subtree_control",
                mount.mount_point
            ),
        ),
        Some(Site::V2 {
            mount,
            enabled: false,
        }) => Feature::ok(
            name,
            required,
            format!(
                "v2 at {}, available but not yet enabled in cgroup.subtree_control (root can: \
                 echo +{controller} > {}/cgroup.subtree_control)",
                mount.mount_point, mount.mount_point
            ),
        ),
        None => {
            let (detail, fix) = facts.absent(controller, config);
            not_ok(detail, fix)
        }
    }
}

/// The cgroup features, required ones first within each kind: the layout,
/// memory, pids, cpu, freezer, swap accounting.
fn cgroup_features(facts: &CgroupFacts) -> Vec<Feature> {
    let layout = &facts.layout;
    let v2_detail = |m: &CgroupMount| {
        let controllers = if facts.v2_controllers.is_empty() {
            "none".to_owned()
        } else {
            facts.v2_controllers.join(" ")
        };
        let mut s = format!("cgroup2 at {} (controllers: {controllers}", m.mount_point);
        if !facts.v2_subtree.is_empty() {
            let _ = write!(s, "; enabled for children: {}", facts.v2_subtree.join(" "));
        }
        s.push(')');
        s
    };
    let layout_feature = match (layout.version(), &layout.v2) {
        (CgroupVersion::V1, _) => Feature::ok(
            "cgroups",
            true,
            format!("v1 (controllers: {})", layout.v1_controllers().join(" ")),
        ),
        (CgroupVersion::V2, Some(m)) => {
            Feature::ok("cgroups", true, format!("v2: {}", v2_detail(m)))
        }
        (CgroupVersion::Hybrid, Some(m)) => Feature::ok(
            "cgroups",
            true,
            format!(
                "hybrid: v1 controllers {}; {}; brig uses {}",
                layout.v1_controllers().join(" "),
                v2_detail(m),
                // The jail's decision, from the same layout.
                match Hierarchy::from_layout(layout) {
                    Ok(Hierarchy::V1 { .. }) => "v1",
                    _ => "cgroup2",
                }
            ),
        ),
        _ => Feature::missing(
            "cgroups",
            true,
            "no cgroup or cgroup2 mount in /proc/self/mountinfo",
            "mount cgroup2: mount -t cgroup2 cgroup2 /sys/fs/cgroup",
        ),
    };

    // In v2 the freezer is not a controller but `cgroup.freeze` in every
    // non-root cgroup (Linux >= 5.2); in v1 it is the freezer hierarchy.
    let freezer = if layout.v1_hierarchy("freezer").is_none()
        && layout.v2.as_ref().is_some_and(|m| !m.read_only)
        && KernelVersion::at_least(facts.kernel, 5, 2)
    {
        let mount = layout
            .v2
            .as_ref()
            .map(|m| m.mount_point.as_str())
            .unwrap_or_default();
        Feature::ok(
            "cgroup_freezer",
            false,
            format!("v2 cgroup.freeze at {mount}"),
        )
    } else {
        controller_feature(
            facts,
            "cgroup_freezer",
            "freezer",
            "CONFIG_CGROUP_FREEZER",
            Some("pausing sandboxes is unavailable"),
        )
    };

    let swap = match (facts.site("memory").is_some(), facts.swap_accounting) {
        (false, _) => Feature::missing(
            "memory_swap_accounting",
            false,
            "no memory controller",
            "see cgroup_memory",
        ),
        (true, Some(true)) => Feature::ok(
            "memory_swap_accounting",
            false,
            "memory limits can include swap",
        ),
        (true, _) if !facts.swap_active => Feature::ok(
            "memory_swap_accounting",
            false,
            "not verified, but no swap is active, so memory limits are exact",
        ),
        (true, Some(false)) => Feature::degraded(
            "memory_swap_accounting",
            false,
            "swap is active but not accounted: a sandbox can swap beyond its memory limit",
            "boot with swapaccount=1 (the kernel needs CONFIG_MEMCG_SWAP=y)",
        ),
        (true, None) => Feature::degraded(
            "memory_swap_accounting",
            false,
            "could not tell: no cgroup below the v2 root has the memory controller enabled",
            "enable it: echo +memory > <cgroup2 mount>/cgroup.subtree_control",
        ),
    };

    vec![
        layout_feature,
        controller_feature(facts, "cgroup_memory", "memory", "CONFIG_MEMCG", None),
        controller_feature(facts, "cgroup_pids", "pids", "CONFIG_CGROUP_PIDS", None),
        controller_feature(
            facts,
            "cgroup_cpu",
            "cpu",
            "CONFIG_CGROUP_SCHED",
            Some("--cpus is unavailable"),
        ),
        freezer,
        swap,
    ]
}

// ---------------------------------------------------------------------------
// KVM.

/// What `/dev/kvm` is, if anything.
#[derive(Debug)]
struct Kvm {
    device: KvmDevice,
    /// The PVM backend module (nested, shadow paging) is loaded.
    pvm: bool,
    /// `vmx` or `svm` in /proc/cpuinfo.
    hw_flag: Option<&'static str>,
}

#[derive(Debug)]
enum KvmDevice {
    Absent,
    Unopenable(io::Error),
    /// Opened; the answer to KVM_GET_API_VERSION (or the ioctl's errno).
    Opened(Result<i32, i32>),
}

/// The only KVM API version there has ever been.
const KVM_API_VERSION: i32 = 12;
/// `_IO(KVMIO, 0x00)`.
const KVM_GET_API_VERSION: libc::c_ulong = 0xAE00;

impl Kvm {
    fn detect() -> Self {
        let device = if !Path::new("/dev/kvm").exists() {
            KvmDevice::Absent
        } else {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
            {
                Err(err) => KvmDevice::Unopenable(err),
                Ok(file) => {
                    // SAFETY: KVM_GET_API_VERSION takes no argument and only
                    // returns an integer; the fd is open for the call.
                    let version = unsafe { libc::ioctl(file.as_raw_fd(), KVM_GET_API_VERSION, 0) };
                    KvmDevice::Opened(if version < 0 {
                        Err(last_errno())
                    } else {
                        Ok(version)
                    })
                }
            }
        };
        let pvm = Path::new("/sys/module/kvm_pvm").exists()
            || read_string("/proc/modules")
                .is_ok_and(|m| m.lines().any(|l| l.starts_with("kvm_pvm ")));
        let hw_flag = cpu_virt_flag(&read_string("/proc/cpuinfo").unwrap_or_default());
        Kvm {
            device,
            pvm,
            hw_flag,
        }
    }

    /// True if /dev/kvm works and is backed by hardware virtualization.
    fn hardware(&self) -> bool {
        matches!(self.device, KvmDevice::Opened(Ok(KVM_API_VERSION)))
            && !self.pvm
            && self.hw_flag.is_some()
    }

    fn usable_pvm(&self) -> bool {
        matches!(self.device, KvmDevice::Opened(Ok(KVM_API_VERSION))) && self.pvm
    }

    fn feature(&self) -> Feature {
        const NAME: &str = "kvm";
        let module = match self.hw_flag {
            Some("svm") => "kvm_amd",
            _ => "kvm_intel",
        };
        match &self.device {
            KvmDevice::Absent if self.hw_flag.is_some() => Feature::missing(
                NAME,
                false,
                format!("no /dev/kvm, though the CPU has {}", self.hw_flag.unwrap_or_default()),
                format!("modprobe {module}"),
            ),
            KvmDevice::Absent => Feature::missing(
                NAME,
                false,
                "no /dev/kvm and no vmx/svm flag in /proc/cpuinfo: the vm tier can only use TCG",
                "enable VT-x/AMD-V in the firmware, or nested virtualization on the hypervisor, then \
                 modprobe kvm_intel (or kvm_amd)",
            ),
            KvmDevice::Unopenable(err) => Feature::missing(
                NAME,
                false,
                format!("/dev/kvm exists but cannot be opened: {err}"),
                "run as root, or add the user to the kvm group: usermod -aG kvm $USER",
            ),
            KvmDevice::Opened(Err(errno)) => Feature::missing(
                NAME,
                false,
                format!("KVM_GET_API_VERSION failed: {}", errno_str(*errno)),
                "check dmesg for kvm errors",
            ),
            KvmDevice::Opened(Ok(v)) if *v != KVM_API_VERSION => Feature::missing(
                NAME,
                false,
                format!("unexpected KVM API version {v} (expected {KVM_API_VERSION})"),
                "check the kernel's kvm module",
            ),
            KvmDevice::Opened(Ok(_)) if self.pvm => Feature::degraded(
                NAME,
                false,
                "pvm (nested, cannot boot a stock Linux guest; the vm tier would use TCG)",
                "for KVM-speed VMs use bare metal or a VM with nested VT-x/AMD-V",
            ),
            KvmDevice::Opened(Ok(_)) => match self.hw_flag {
                Some(flag) => Feature::ok(NAME, false, format!("hardware virtualization ({flag}), API version {KVM_API_VERSION}")),
                None => Feature::degraded(
                    NAME,
                    false,
                    "/dev/kvm works but the CPU shows no vmx/svm and no kvm_pvm module: an unknown \
                     backend, so the vm tier uses TCG",
                    "for KVM-speed VMs use bare metal or a VM with nested VT-x/AMD-V",
                ),
            },
        }
    }
}

/// `vmx` or `svm` if any `flags` line of /proc/cpuinfo has it.
fn cpu_virt_flag(cpuinfo: &str) -> Option<&'static str> {
    cpuinfo
        .lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == "flags").then_some(value)
        })
        .flat_map(str::split_whitespace)
        .find_map(|flag| match flag {
            "vmx" => Some("vmx"),
            "svm" => Some("svm"),
            _ => None,
        })
}

// ---------------------------------------------------------------------------
// Helper programs.

/// A program looked up on PATH, and the first line of its `--version`.
#[derive(Debug)]
struct Tool {
    path: Option<PathBuf>,
    version: Option<Result<String, String>>,
}

/// `--version` of a healthy runsc or QEMU answers in tens of milliseconds;
/// this only bounds a broken one.
const VERSION_TIMEOUT: Duration = Duration::from_secs(3);

impl Tool {
    fn find(binary: &str, ask_version: bool) -> Self {
        match find_on_path(binary) {
            Some(path) if ask_version => Tool::at(path),
            path => Tool {
                path,
                version: None,
            },
        }
    }

    /// The program at `path`, with what `--version` says.
    fn at(path: PathBuf) -> Self {
        let version = Some(first_output_line(&path, &["--version"], VERSION_TIMEOUT));
        Tool {
            path: Some(path),
            version,
        }
    }
}

/// QEMU's version, `(major, minor)`, from the line `--version` starts with
/// ("QEMU emulator version 10.0.2 (Debian …)").
pub fn qemu_version(said: &str) -> Option<(u32, u32)> {
    let v = said.split("version ").nth(1)?.split_whitespace().next()?;
    let mut parts = v.split('.').map(str::parse::<u32>);
    Some((parts.next()?.ok()?, parts.next()?.ok()?))
}

/// The QEMU whose `memory-backend-file` maps a read-only file private and
/// writable (`rom=off`): what the vm tier's copy-on-write forks need.
const QEMU_COPY_ON_WRITE: (u32, u32) = (8, 2);

fn find_on_path(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Run `program args` and return the first non-empty line of its stdout,
/// killing it if it has not exited within `timeout`.
fn first_output_line(program: &Path, args: &[&str], timeout: Duration) -> Result<String, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|err| format!("could not run it: {err}"))?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("no answer within {} ms", timeout.as_millis()));
            }
            Err(err) => return Err(format!("waiting for it failed: {err}")),
        }
    };
    // The version text is far smaller than a pipe buffer, so the child could
    // exit before anything was read.
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = stdout.read_to_string(&mut out);
    }
    match out.lines().map(str::trim).find(|l| !l.is_empty()) {
        Some(line) if status.success() => Ok(line.to_owned()),
        _ => Err(format!("exited with {status} and no version")),
    }
}

fn runsc_feature(tool: &Tool, kvm: &Kvm) -> Feature {
    const NAME: &str = "runsc";
    match (&tool.path, &tool.version) {
        (Some(path), Some(Ok(version))) => {
            // gVisor's KVM platform hangs on a PVM /dev/kvm; ptrace works
            // (reference/measured-limits.md, section 5).
            let platform = if kvm.hardware() {
                ""
            } else if kvm.usable_pvm() {
                "; use --platform=ptrace (--platform=kvm hangs on this PVM /dev/kvm)"
            } else {
                "; use --platform=ptrace (--platform=kvm needs hardware KVM)"
            };
            Feature::ok(
                NAME,
                false,
                format!("{version} at {}{platform}", path.display()),
            )
        }
        (Some(path), Some(Err(why))) => Feature::missing(
            NAME,
            false,
            format!("{} --version failed: {why}", path.display()),
            "apt-get install --reinstall runsc",
        ),
        _ => Feature::missing(
            NAME,
            false,
            "runsc is not on PATH: no gvisor tier",
            "apt-get install runsc",
        ),
    }
}

fn qemu_feature(tool: &Tool) -> Feature {
    const NAME: &str = "qemu";
    match (&tool.path, &tool.version) {
        (Some(path), Some(Ok(version)))
            if qemu_version(version).is_some_and(|v| v < QEMU_COPY_ON_WRITE) =>
        {
            Feature::degraded(
                NAME,
                false,
                format!(
                    "{version} at {}: forks of a vm snapshot each load a copy of its memory \
                     (QEMU 8.2 or later shares it copy-on-write)",
                    path.display()
                ),
                "Debian 12: add bookworm-backports to apt's sources, then apt-get install -t \
                 bookworm-backports qemu-system-x86",
            )
        }
        (Some(path), Some(Ok(version))) => {
            Feature::ok(NAME, false, format!("{version} at {}", path.display()))
        }
        (Some(path), Some(Err(why))) => Feature::missing(
            NAME,
            false,
            format!("{} --version failed: {why}", path.display()),
            "apt-get install --reinstall qemu-system-x86",
        ),
        _ => Feature::missing(
            NAME,
            false,
            "qemu-system-x86_64 is not on PATH: no vm tier",
            "apt-get install qemu-system-x86",
        ),
    }
}

fn helper_feature(name: &'static str, tool: &Tool, purpose: &str, install: &str) -> Feature {
    match &tool.path {
        Some(path) => Feature::ok(name, false, format!("{} ({purpose})", path.display())),
        None => Feature::missing(name, false, format!("not on PATH ({purpose})"), install),
    }
}

/// A name under `localhost` of the kind `brig serve --e2b-domain
/// brig.localhost` serves (`PORT-ID.brig.localhost`).
const LOCALHOST_PROBE: &str = "49983-probe.brig.localhost";

/// The addresses `name` resolves to here, as clients' resolvers
/// (getaddrinfo) find them; empty if it does not resolve.
fn resolve(name: &str) -> Vec<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    (name, 443)
        .to_socket_addrs()
        .map(|addrs| addrs.map(|a| a.ip()).collect())
        .unwrap_or_default()
}

/// Whether names under `localhost` reach this host: what E2B's clients
/// need when they are given only `E2B_DOMAIN` (docs/e2b.md).
fn localhost_names_feature(found: Vec<std::net::IpAddr>) -> Feature {
    const NAME: &str = "localhost-names";
    const FIX: &str = "apt-get install libnss-myhostname (or use systemd-resolved); needed only \
                       for `brig serve --e2b-domain brig.localhost`";
    if found.is_empty() {
        Feature::missing(
            NAME,
            false,
            format!("{LOCALHOST_PROBE} does not resolve"),
            FIX,
        )
    } else if found.iter().all(|ip| ip.is_loopback()) {
        Feature::ok(
            NAME,
            false,
            format!("names under localhost resolve to this host ({LOCALHOST_PROBE})"),
        )
    } else {
        Feature::degraded(
            NAME,
            false,
            format!("{LOCALHOST_PROBE} resolves to {found:?}, not only loopback"),
            FIX,
        )
    }
}

// ---------------------------------------------------------------------------
// Tiers.

/// The platforms `runsc` was built with (`runsc help platforms`: `ptrace`,
/// `kvm`, and `systrap` in builds from 2023 on).
pub fn runsc_platforms(runsc: &Path) -> Vec<String> {
    std::process::Command::new(runsc)
        .args(["help", "platforms"])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// The platform brig's gvisor tier runs runsc on, given the platforms
/// runsc was built with: `wanted` if given (`BRIG_GVISOR_PLATFORM`) and
/// built in; else systrap where this runsc has it (gVisor's default since
/// 2023: seccomp traps, fast), else ptrace (works everywhere, slowest).
/// KVM is never picked unasked: it hangs on nested hypervisors that still
/// offer /dev/kvm (this repository's CI machines: measured-limits §5).
pub fn runsc_platform(built: &[String], wanted: Option<&str>) -> Result<&'static str, String> {
    const KNOWN: [&str; 3] = ["systrap", "ptrace", "kvm"];
    let has = |p: &str| built.iter().any(|b| b == p);
    if let Some(w) = wanted {
        let Some(known) = KNOWN.into_iter().find(|k| *k == w) else {
            return Err(format!(
                "unknown gVisor platform {w:?}: expected systrap, ptrace or kvm"
            ));
        };
        if !has(w) {
            return Err(format!(
                "this runsc has no {w} platform (it has: {})",
                built.join(", ")
            ));
        }
        return Ok(known);
    }
    ["systrap", "ptrace"]
        .into_iter()
        .find(|p| has(p))
        .ok_or_else(|| {
            format!(
                "this runsc offers neither systrap nor ptrace (it has: {})",
                built.join(", ")
            )
        })
}

fn tiers(features: &[Feature], kvm: &Kvm, runsc_platforms: Option<&[String]>) -> Tiers {
    let ok = |name: &str| {
        features
            .iter()
            .any(|f| f.name == name && f.status == Status::Ok)
    };
    let process = !features.iter().any(Feature::blocks_process_tier);
    // runsc itself needs root to set up its sandbox, and a platform.
    let wanted = std::env::var("BRIG_GVISOR_PLATFORM").ok();
    let platform = runsc_platforms.map(|b| runsc_platform(b, wanted.as_deref()));
    let (gvisor, gvisor_detail) = match (ok("runsc"), ok("root"), platform) {
        (false, _, _) | (_, _, None) => (
            false,
            "runsc is not installed or does not run (apt-get install runsc)".to_owned(),
        ),
        (true, false, _) => (false, "runsc needs root: run brig as root".to_owned()),
        (true, true, Some(Err(why))) => (false, why),
        (true, true, Some(Ok(p))) => (
            true,
            format!(
                "runsc on the {p} platform{}",
                if p == "ptrace" {
                    ": system calls intercepted with ptrace, slow; a runsc from 2023 on has \
                     systrap"
                } else {
                    ""
                }
            ),
        ),
    };
    let qemu = features
        .iter()
        .find(|f| f.name == "qemu")
        .map_or(Status::Missing, |f| f.status);
    let vm = vm_tier_from(qemu, kvm);
    Tiers {
        process,
        gvisor,
        gvisor_detail,
        vm,
    }
}

/// The vm tier alone (what `probe().tiers.vm` says), without probing the
/// rest: for the tier's own start, with the QEMU it runs.
pub fn vm_tier(qemu: &Path) -> VmTier {
    let qemu = qemu_feature(&Tool::at(qemu.to_path_buf()));
    vm_tier_from(qemu.status, &Kvm::detect())
}

/// The vm tier, from what the probe of QEMU found (`Degraded`: older
/// than 8.2) and of /dev/kvm.
fn vm_tier_from(qemu: Status, kvm: &Kvm) -> VmTier {
    let copy_on_write_forks = qemu == Status::Ok;
    let (available, accel, detail) = if qemu == Status::Missing {
        return VmTier {
            available: false,
            accel: Accel::Unavailable,
            detail: "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)"
                .to_owned(),
            copy_on_write_forks,
        };
    } else if kvm.hardware() {
        (
            true,
            Accel::Kvm,
            format!("QEMU with KVM ({})", kvm.hw_flag.unwrap_or_default()),
        )
    } else if kvm.usable_pvm() {
        (
            true,
            Accel::PvmKvm,
            "QEMU with TCG emulation (slow, seconds to boot): /dev/kvm is PVM and cannot boot a \
             stock Linux guest"
                .to_owned(),
        )
    } else {
        (
            true,
            Accel::Tcg,
            "QEMU with TCG emulation (slow, seconds to boot): no hardware KVM".to_owned(),
        )
    };
    let forks = if copy_on_write_forks {
        "launches start from a snapshot of a booted guest; forks of a snapshot share its \
         memory copy-on-write"
    } else {
        "every launch boots, and forks of a snapshot each load a copy of its memory (QEMU older \
         than 8.2)"
    };
    VmTier {
        available,
        accel,
        detail: format!("{detail}; {forks}"),
        copy_on_write_forks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::samples::*;

    #[test]
    fn the_runsc_platform_is_systrap_then_ptrace_never_kvm_unasked() {
        let built = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            runsc_platform(&built(&["kvm", "ptrace", "systrap"]), None),
            Ok("systrap")
        );
        // Debian 12's runsc (2022-12): no systrap.
        assert_eq!(
            runsc_platform(&built(&["kvm", "ptrace"]), None),
            Ok("ptrace")
        );
        assert_eq!(
            runsc_platform(&built(&["kvm", "ptrace"]), Some("kvm")),
            Ok("kvm")
        );
        let err = runsc_platform(&built(&["kvm", "ptrace"]), Some("systrap")).unwrap_err();
        assert!(err.contains("no systrap platform"), "{err}");
        let err = runsc_platform(&built(&["ptrace"]), Some("fast")).unwrap_err();
        assert!(err.contains("unknown gVisor platform"), "{err}");
        assert!(runsc_platform(&built(&["kvm"]), None).is_err());
    }

    #[test]
    fn density_limits_are_judged_against_the_target() {
        let low = DensityFacts {
            pid_max: Some(32768),
            threads_max: Some(192731),
            namespaces_max: Some(("user.max_net_namespaces".into(), 96365)),
            nr_open: Some(1048576),
            v1_without_favordynmods: true,
            v2_mount: Some("/sys/fs/cgroup/unified".into()),
        };
        let f = density_features(&low);
        let get = |n: &str| f.iter().find(|x| x.name == n).unwrap();
        assert_eq!(get("pid_max").status, Status::Degraded);
        assert!(get("pid_max")
            .fix
            .as_ref()
            .unwrap()
            .contains("kernel.pid_max"));
        assert_eq!(get("threads_max").status, Status::Ok);
        assert_eq!(get("namespaces_max").status, Status::Ok);
        assert_eq!(get("nr_open").status, Status::Ok);
        assert_eq!(get("cgroup_favordynmods").status, Status::Degraded);
        // The remount that works (cgroup2's), never one v1 refuses.
        let fix = get("cgroup_favordynmods").fix.clone().unwrap();
        assert!(
            fix.starts_with("mount -o remount,favordynmods /sys/fs/cgroup/unified"),
            "{fix}"
        );
        let pure_v1 = density_features(&DensityFacts {
            v2_mount: None,
            ..low.clone()
        });
        let fix = pure_v1
            .iter()
            .find(|x| x.name == "cgroup_favordynmods")
            .and_then(|x| x.fix.clone())
            .unwrap();
        assert!(
            fix.contains("cgroup_favordynmods=true") && fix.contains("name=brig,favordynmods"),
            "{fix}"
        );
        assert!(f.iter().all(|x| !x.required), "density never blocks a tier");
        let unknown = density_features(&DensityFacts::default());
        assert!(unknown
            .iter()
            .filter(|x| x.name != "cgroup_favordynmods")
            .all(|x| x.status == Status::Degraded));
    }

    const PROC_CGROUPS: &str = "\
#subsys_name	hierarchy	num_cgroups	enabled
cpuset	3	1	1
cpu	1	1	1
memory	4	3	1
pids	8	1	1
freezer	6	1	1
";

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    fn facts(mountinfo: &str, v2_controllers: &str, v2_subtree: &str) -> CgroupFacts {
        CgroupFacts {
            layout: CgroupLayout::parse(mountinfo),
            kernel_controllers: parse_proc_cgroups(PROC_CGROUPS),
            v2_controllers: words(v2_controllers),
            v2_subtree: words(v2_subtree),
            swap_accounting: Some(true),
            swap_active: true,
            kernel: KernelVersion::parse("6.1.0-28-amd64"),
        }
    }

    fn find<'a>(features: &'a [Feature], name: &str) -> &'a Feature {
        features
            .iter()
            .find(|f| f.name == name)
            .unwrap_or_else(|| panic!("no feature {name}"))
    }

    /// The doctor and the jail read one layout: on each kind of host, the
    /// controllers the doctor reports are where the jail's [`Hierarchy`]
    /// makes its groups.
    #[test]
    fn doctor_and_jail_agree_on_each_sample() {
        for (sample, v2_controllers) in [
            (V1_MOUNTINFO, ""),
            (V2_MOUNTINFO, "cpu memory pids"),
            (HYBRID_MOUNTINFO, "hugetlb"),
        ] {
            let t = tempfile::tempdir().unwrap();
            let text = crate::cgroup::samples::rooted_at(sample, t.path());
            let facts = facts(&text, v2_controllers, v2_controllers);
            let features = cgroup_features(&facts);
            let hierarchy = Hierarchy::from_layout(&facts.layout).unwrap();
            for (feature, controller) in [
                ("cgroup_memory", "memory"),
                ("cgroup_pids", "pids"),
                ("cgroup_cpu", "cpu"),
                ("cgroup_freezer", "freezer"),
            ] {
                let mount = hierarchy.mount(controller).expect(controller);
                let version = match hierarchy {
                    Hierarchy::V1 { .. } => "v1",
                    Hierarchy::V2 { .. } => "v2",
                };
                let detail = &find(&features, feature).detail;
                assert!(
                    detail.starts_with(&format!("{version} at {}", mount.display()))
                        || (controller == "freezer"
                            && *detail == format!("v2 cgroup.freeze at {}", mount.display())),
                    "{feature}: doctor says {detail:?}, jail uses {mount:?}"
                );
            }
        }
        let hybrid = facts(HYBRID_MOUNTINFO, "hugetlb", "");
        assert!(find(&cgroup_features(&hybrid), "cgroups")
            .detail
            .ends_with("brig uses v1"));
    }

    #[test]
    fn hybrid_controllers_come_from_v1() {
        let facts = facts(HYBRID_MOUNTINFO, "hugetlb", "");
        let features = cgroup_features(&facts);
        assert!(find(&features, "cgroups")
            .detail
            .starts_with("hybrid: v1 controllers cpu cpuacct freezer memory pids"));
        for name in [
            "cgroups",
            "cgroup_memory",
            "cgroup_pids",
            "cgroup_cpu",
            "cgroup_freezer",
        ] {
            assert_eq!(find(&features, name).status, Status::Ok, "{name}");
        }
        assert_eq!(
            find(&features, "cgroup_memory").detail,
            "v1 at /sys/fs/cgroup/memory"
        );
    }

    #[test]
    fn v2_controllers_enabled_or_only_available() {
        let facts = facts(V2_MOUNTINFO, "cpuset cpu io memory pids", "memory pids");
        let features = cgroup_features(&facts);
        assert_eq!(find(&features, "cgroup_memory").status, Status::Ok);
        assert!(find(&features, "cgroup_memory")
            .detail
            .contains("enabled in cgroup.subtree_control"));
        let cpu = find(&features, "cgroup_cpu");
        assert_eq!(cpu.status, Status::Ok);
        assert!(cpu.detail.contains("not yet enabled"), "{}", cpu.detail);
        // Freezing is cgroup.freeze in v2, not a controller.
        assert_eq!(find(&features, "cgroup_freezer").status, Status::Ok);
    }

    #[test]
    fn missing_required_controller_blocks_and_optional_degrades() {
        let facts = facts(V2_MOUNTINFO, "io", "");
        let features = cgroup_features(&facts);
        let memory = find(&features, "cgroup_memory");
        assert!(memory.blocks_process_tier());
        assert!(memory
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("cgroup_no_v1=all"));
        let cpu = find(&features, "cgroup_cpu");
        assert_eq!(cpu.status, Status::Degraded);
        assert!(!cpu.blocks_process_tier());
        assert!(cpu.detail.ends_with("--cpus is unavailable"));
    }

    #[test]
    fn missing_v1_controller_fixes_name_the_cause() {
        let mut facts = facts(V1_MOUNTINFO, "", "");
        facts
            .layout
            .v1
            .retain(|h| !h.controllers.iter().any(|c| c == "pids" || c == "freezer"));
        // pids is enabled but unmounted: mount it.
        let features = cgroup_features(&facts);
        assert!(find(&features, "cgroup_pids")
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("mount -t cgroup -o pids"));
        let freezer = find(&features, "cgroup_freezer");
        assert_eq!(freezer.status, Status::Degraded);
        assert!(freezer.detail.contains("pausing sandboxes is unavailable"));
        // memory disabled on the command line: say so.
        facts.kernel_controllers = parse_proc_cgroups("memory\t0\t1\t0\n");
        facts
            .layout
            .v1
            .retain(|h| !h.controllers.iter().any(|c| c == "memory"));
        let features = cgroup_features(&facts);
        assert!(find(&features, "cgroup_memory")
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("cgroup_disable=memory"));
        // pids not in /proc/cgroups at all: a kernel config problem.
        assert!(find(&features, "cgroup_pids")
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("CONFIG_CGROUP_PIDS"));
    }

    #[test]
    fn read_only_cgroup_mount_is_missing() {
        let text = V2_MOUNTINFO.replace(
            "shared:8 - cgroup2 cgroup2 rw",
            "shared:8 - cgroup2 cgroup2 ro",
        );
        let facts = facts(&text, "memory pids", "memory pids");
        let features = cgroup_features(&facts);
        assert!(find(&features, "cgroup_pids").blocks_process_tier());
        assert!(find(&features, "cgroup_pids")
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("remount,rw"));
    }

    #[test]
    fn no_cgroups_at_all() {
        let facts = facts("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n", "", "");
        let features = cgroup_features(&facts);
        assert!(find(&features, "cgroups").blocks_process_tier());
        assert!(find(&features, "cgroup_memory").blocks_process_tier());
    }

    #[test]
    fn swap_accounting_judgement() {
        let mut facts = facts(HYBRID_MOUNTINFO, "", "");
        assert_eq!(
            find(&cgroup_features(&facts), "memory_swap_accounting").status,
            Status::Ok
        );
        facts.swap_accounting = Some(false);
        assert_eq!(
            find(&cgroup_features(&facts), "memory_swap_accounting").status,
            Status::Degraded
        );
        facts.swap_active = false;
        assert_eq!(
            find(&cgroup_features(&facts), "memory_swap_accounting").status,
            Status::Ok
        );
    }

    #[test]
    fn parses_proc_cgroups() {
        let controllers = parse_proc_cgroups(
            "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t1\t1\nmemory\t0\t1\t0\n",
        );
        assert_eq!(
            controllers,
            [("cpu".to_owned(), true), ("memory".to_owned(), false)]
        );
    }

    #[test]
    fn kernel_versions_parse_and_compare() {
        let k = |s| KernelVersion::parse(s).unwrap_or_else(|| panic!("parse {s}"));
        assert_eq!(
            k("6.18.44-fc-v669"),
            KernelVersion {
                major: 6,
                minor: 18,
                patch: 44
            }
        );
        assert_eq!(
            k("5.10.0-28-amd64"),
            KernelVersion {
                major: 5,
                minor: 10,
                patch: 0
            }
        );
        assert_eq!(
            k("6.1-rc1\n"),
            KernelVersion {
                major: 6,
                minor: 1,
                patch: 0
            }
        );
        assert_eq!(
            k("4.19+"),
            KernelVersion {
                major: 4,
                minor: 19,
                patch: 0
            }
        );
        assert!(KernelVersion::parse("garbage").is_none());
        assert!(KernelVersion::parse("6").is_none());
        // Numeric, not lexical: 5.9 < 5.11 < 5.12 < 6.0.
        assert!(k("5.9.16") < k("5.11.0"));
        assert!(k("5.11.22") < k("5.12.0"));
        assert!(k("5.19.17") < k("6.0.0"));
        assert!(KernelVersion::at_least(Some(k("5.11.0")), 5, 11));
        assert!(!KernelVersion::at_least(Some(k("5.10.200")), 5, 11));
        assert!(!KernelVersion::at_least(None, 3, 0));
    }

    #[test]
    fn cpuinfo_flags() {
        let intel = "processor\t: 0\nflags\t\t: fpu vme de pse vmx smx est\nbugs\t\t: spectre_v1\n";
        let amd = "processor\t: 0\nflags\t\t: fpu svm extapic\n";
        let nested = "processor\t: 0\nflags\t\t: fpu vme hypervisor avx512f amx_tile\n\nprocessor\t: 1\nflags\t\t: fpu hypervisor\n";
        assert_eq!(cpu_virt_flag(intel), Some("vmx"));
        assert_eq!(cpu_virt_flag(amd), Some("svm"));
        assert_eq!(cpu_virt_flag(nested), None);
        // "vmx" must be a whole flag, and only flags lines count.
        assert_eq!(
            cpu_virt_flag("flags\t: vmx_tpr\nmodel name\t: vmx svm\n"),
            None
        );
    }

    #[test]
    fn status_fields() {
        let status = "Name:\tbrig\nSeccomp:\t2\nCapEff:\t000001ffffffffff\n";
        assert_eq!(status_field(status, "Seccomp"), Some("2"));
        assert_eq!(status_field(status, "CapEff"), Some("000001ffffffffff"));
        assert_eq!(status_field(status, "Cap"), None);
    }

    #[test]
    fn filesystems_list() {
        let fs = filesystems("nodev\tsysfs\nnodev\ttmpfs\n\text4\nnodev\toverlay\n");
        assert!(fs.contains("tmpfs") && fs.contains("ext4") && fs.contains("overlay"));
        assert!(!fs.contains("nodev"));
    }

    fn ns_test(user: i32) -> NsTest {
        NsTest {
            user,
            maps: 0,
            others: [0; 6],
            overlay_step: 0,
            overlay_errno: 0,
        }
    }

    #[test]
    fn userns_fixes() {
        let knobs = UsernsKnobs {
            max: Some(0),
            ..Default::default()
        };
        let f = userns_feature(Some(&ns_test(libc::ENOSPC)), &knobs, Privilege::Root);
        assert!(f.blocks_process_tier());
        assert_eq!(
            f.fix.as_deref(),
            Some("sysctl -w user.max_user_namespaces=15000")
        );

        // The Debian knob only matters to unprivileged users.
        let knobs = UsernsKnobs {
            max: Some(100),
            unprivileged_clone: Some(0),
            apparmor_restrict: None,
        };
        let f = userns_feature(Some(&ns_test(libc::EPERM)), &knobs, Privilege::Unprivileged);
        assert!(f
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("unprivileged_userns_clone=1"));
        let f = userns_feature(Some(&ns_test(libc::EPERM)), &knobs, Privilege::Root);
        assert!(f
            .fix
            .as_deref()
            .unwrap_or_default()
            .contains("seccomp=unconfined"));

        let f = userns_feature(Some(&ns_test(0)), &knobs, Privilege::Root);
        assert_eq!(f.status, Status::Ok);
        assert!(f.detail.contains("kernel.unprivileged_userns_clone=0"));

        assert!(userns_feature(None, &knobs, Privilege::Root).blocks_process_tier());
    }

    #[test]
    fn namespace_judgement() {
        let net = &NAMESPACES[2];
        assert_eq!(net.feature, "net_namespace");
        let mut test = ns_test(0);
        assert_eq!(namespace_feature(net, Some(&test), true).status, Status::Ok);
        test.others[2] = libc::EPERM;
        assert!(namespace_feature(net, Some(&test), true).blocks_process_tier());
        assert!(namespace_feature(net, None, false).blocks_process_tier());
        assert_eq!(namespace_feature(net, None, true).status, Status::Ok);
    }

    #[test]
    fn overlay_in_userns_judgement() {
        let new = KernelVersion::parse("6.1.0");
        let old = KernelVersion::parse("5.10.0");
        assert_eq!(
            overlay_in_userns_feature(Some(&ns_test(0)), new).status,
            Status::Ok
        );
        let failed = NsTest {
            overlay_step: 4,
            overlay_errno: libc::EPERM,
            ..ns_test(0)
        };
        let f = overlay_in_userns_feature(Some(&failed), old);
        assert_eq!(f.status, Status::Degraded);
        assert!(!f.required);
        assert!(
            f.detail.starts_with("mounting the overlay failed"),
            "{}",
            f.detail
        );
        assert!(f.fix.as_deref().unwrap_or_default().contains("5.11"));
    }

    #[test]
    fn version_line_and_timeout() {
        let sh = Path::new("/bin/sh");
        assert_eq!(
            first_output_line(
                sh,
                &[
                    "-c",
                    "echo; echo 'runsc version release-20221219.0'; echo spec: 1.0.2"
                ],
                VERSION_TIMEOUT
            ),
            Ok("runsc version release-20221219.0".to_owned())
        );
        assert!(first_output_line(sh, &["-c", "exit 3"], VERSION_TIMEOUT).is_err());
        let started = Instant::now();
        let slow = first_output_line(sh, &["-c", "sleep 10"], Duration::from_millis(100));
        assert!(slow.is_err_and(|e| e.contains("no answer")));
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// Runs the real probes (no root needed): names are unique, and the
    /// quick check agrees with the full report.
    #[test]
    fn check_process_tier_agrees_with_probe() {
        let report = probe();
        let names: BTreeSet<&str> = report.features.iter().map(|f| f.name).collect();
        assert_eq!(
            names.len(),
            report.features.len(),
            "duplicate feature names"
        );
        match check_process_tier() {
            Ok(()) => assert!(report.tiers.process, "{report:#?}"),
            Err(missing) => {
                assert!(!report.tiers.process);
                assert_eq!(report.process_blocker().map(|f| f.name), Some(missing.name));
            }
        }
    }

    #[test]
    fn a_qemu_older_than_8_2_offers_the_vm_tier_without_copy_on_write_forks() {
        assert_eq!(
            qemu_version(
                "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\n\
                 Copyright (c) 2003-2025 Fabrice Bellard and the QEMU Project developers\n"
            ),
            Some((10, 0))
        );
        assert_eq!(qemu_version("qemu-system-x86_64: no such option"), None);
        let tool = |line: &str| Tool {
            path: Some(PathBuf::from("/usr/bin/qemu-system-x86_64")),
            version: Some(Ok(line.to_owned())),
        };
        let kvm = Kvm {
            device: KvmDevice::Absent,
            pvm: false,
            hw_flag: None,
        };
        let old = qemu_feature(&tool(
            "QEMU emulator version 7.2.15 (Debian 1:7.2+dfsg-7+deb12u18)",
        ));
        assert_eq!(old.status, Status::Degraded);
        assert!(old.fix.unwrap().contains("bookworm-backports"));
        let vm = vm_tier_from(old.status, &kvm);
        assert!(vm.available && !vm.copy_on_write_forks, "{vm:?}");
        assert!(vm.detail.contains("each load a copy"), "{}", vm.detail);
        let new = qemu_feature(&tool("QEMU emulator version 8.2.2 (Debian 1:8.2.2+ds-0)"));
        assert_eq!(new.status, Status::Ok);
        let vm = vm_tier_from(new.status, &kvm);
        assert!(vm.available && vm.copy_on_write_forks, "{vm:?}");
        assert!(vm.detail.contains("copy-on-write"), "{}", vm.detail);
        let vm = vm_tier_from(Status::Missing, &kvm);
        assert!(!vm.available && !vm.copy_on_write_forks);
    }

    #[test]
    fn status_serializes_lowercase_and_accel_as_documented() {
        let json = serde_json::to_string(&[Status::Ok, Status::Missing, Status::Degraded])
            .expect("serialize");
        assert_eq!(json, r#"["ok","missing","degraded"]"#);
        let json =
            serde_json::to_string(&[Accel::Kvm, Accel::PvmKvm, Accel::Tcg, Accel::Unavailable])
                .expect("serialize");
        assert_eq!(
            json,
            r#"["kvm","pvm-kvm (cannot boot stock guests; TCG used)","tcg","none"]"#
        );
    }

    #[test]
    fn localhost_names_must_all_be_loopback() {
        use std::net::IpAddr;
        let ips = |l: &[&str]| l.iter().map(|s| s.parse::<IpAddr>().unwrap()).collect();
        assert_eq!(localhost_names_feature(vec![]).status, Status::Missing);
        let ok = localhost_names_feature(ips(&["::1", "127.0.0.1"]));
        assert_eq!(ok.status, Status::Ok);
        assert!(ok.fix.is_none());
        let off = localhost_names_feature(ips(&["127.0.0.1", "192.0.2.7"]));
        assert_eq!(off.status, Status::Degraded);
        assert!(off.fix.unwrap().contains("libnss-myhostname"));
    }
}
