//! The bring-up plan: every path, string and number the sandbox's init
//! needs, computed on the host before `clone`.
//!
//! The cloned child must not allocate (the parent may be multi-threaded, and
//! a fork copies a malloc lock in whatever state another thread left it), so
//! everything it touches is prepared here as C strings and plain integers.
//! Building a plan is pure apart from `statvfs`/`stat` of host paths, which
//! makes it easy to test.

use crate::knockout::{Knockouts, Protection};
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use brig_core::{SandboxId, SandboxSpec};

use crate::template::{HostEntry, Identity, Layout};
use crate::views::{
    self, cpus_online, random_boot_id, BOOT_ID, BOOT_ID_FILE, CPUS_ONLINE, CPUS_ONLINE_FILE,
};

/// Capabilities a container's root normally keeps (Docker's default set)
/// minus CAP_NET_RAW: CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID,
/// SETUID, SETPCAP, NET_BIND_SERVICE, SYS_CHROOT, MKNOD, AUDIT_WRITE,
/// SETFCAP. They act only inside the sandbox's user namespace.
pub const DEFAULT_CAPS: u64 = (1 << 0)
    | (1 << 1)
    | (1 << 3)
    | (1 << 4)
    | (1 << 5)
    | (1 << 6)
    | (1 << 7)
    | (1 << 8)
    | (1 << 10)
    | (1 << 18)
    | (1 << 27)
    | (1 << 29)
    | (1 << 31);

/// Device nodes bound from the host into the sandbox's /dev. These are the
/// harmless character devices every program expects.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// The PATH a command gets unless the caller sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// /proc paths made read-only. Docker also masks kcore, keys, timer_list,
/// sched_debug and freezes irq, bus, fs; it must, because its container
/// root is host root. Here sandbox root is an unmapped uid to every host
/// root-owned /proc file, so plain permissions already refuse them (the
/// hostile suite checks). /proc/sys is frozen anyway: part of it (the
/// sandbox's own network namespace's sysctls) belongs to sandbox root, and
/// nothing in there needs changing from inside.
pub const READONLY_PROC: &[&str] = &["sys", "sysrq-trigger"];

/// One mount-namespace operation before `pivot_root`.
#[derive(Debug)]
pub enum Step {
    Mount {
        what: &'static str,
        source: Option<CString>,
        target: CString,
        fstype: Option<CString>,
        flags: libc::c_ulong,
        data: Option<CString>,
    },
    /// Attach the n-th detached mount the host sent (an idmapped template).
    Attach {
        what: &'static str,
        index: usize,
        target: CString,
    },
    Mkdir {
        target: CString,
        mode: libc::mode_t,
    },
    Touch {
        target: CString,
    },
    /// A file with contents (the spec's `run_files`).
    Write {
        target: CString,
        data: Vec<u8>,
        mode: u32,
    },
    Symlink {
        link: CString,
        target: CString,
    },
}

impl Step {
    /// A short description for error messages.
    pub fn describe(&self) -> String {
        let t = |c: &CString| c.to_string_lossy().into_owned();
        match self {
            Step::Mount { what, target, .. } => format!("{what} at {}", t(target)),
            Step::Attach { what, target, .. } => format!("{what} at {}", t(target)),
            Step::Mkdir { target, .. } => format!("create directory {}", t(target)),
            Step::Touch { target } => format!("create file {}", t(target)),
            Step::Write { target, .. } => format!("write file {}", t(target)),
            Step::Symlink { link, .. } => format!("create symlink {}", t(link)),
        }
    }
}

/// What the workload process does between `fork` and `execve`.
#[derive(Debug)]
pub struct ExecPlan {
    /// Protections left out (test builds only: [`crate::knockout`]).
    pub knockouts: Knockouts,
    /// The command as given, for messages.
    pub display: String,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    /// Paths to try with execve, in PATH order.
    pub candidates: Vec<CString>,
    pub workdir: CString,
    /// `/a`, `/a/b`, … for creating a missing workdir.
    pub workdir_prefixes: Vec<CString>,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    pub caps: u64,
    /// The bounding set: `caps`, or with `allow_setuid` a container root's
    /// set for everyone, so a setuid-root program (sudo) run by a user gets
    /// root's capabilities in the sandbox's user namespace, no more.
    pub bounding: u64,
    /// Skip no_new_privs (see [`brig_core::SandboxSpec::allow_setuid`]).
    pub allow_setuid: bool,
    /// Run the program the host sent (index among the received
    /// descriptors) with execveat, instead of looking argv[0] up on PATH.
    pub program_fd: Option<usize>,
    /// Connect stdin and stdout to the socket the host sent (index among
    /// the received descriptors).
    pub stdio_fd: Option<usize>,
    /// Received descriptors (indices) the command keeps open across its
    /// exec: a sandbox that outlives its host holds its own slot and
    /// liveness locks (see [`crate::Extras::detach`]).
    pub inherit_fds: [Option<usize>; 2],
    /// The CPUs it may run on ([`crate::cpus`]); empty: as brig's.
    pub cpus: Vec<usize>,
    argv_ptrs: Vec<*const libc::c_char>,
    env_ptrs: Vec<*const libc::c_char>,
}

impl ExecPlan {
    /// NULL-terminated argv for execve. Valid as long as `self` is.
    pub fn argv_ptr(&self) -> *const *const libc::c_char {
        self.argv_ptrs.as_ptr()
    }
    pub fn env_ptr(&self) -> *const *const libc::c_char {
        self.env_ptrs.as_ptr()
    }
}

/// The descriptor number a daemon's sandbox's pid 1 holds its scratch
/// tmpfs at (see [`Plan::keep_layer`]): high enough that nothing the host
/// sends lands there first.
pub const LAYER_FD: i32 = 100;

/// Everything the sandbox's init needs.
#[derive(Debug)]
pub struct Plan {
    /// Protections left out (test builds only: [`crate::knockout`]).
    pub knockouts: Knockouts,
    /// Host directory the sandbox mounts its scratch tmpfs on (in its own
    /// mount namespace; the host never sees the mount).
    pub staging: CString,
    pub staging_opts: CString,
    pub steps: Vec<Step>,
    /// The directory that becomes `/`.
    pub new_root: CString,
    pub hostname: Vec<u8>,
    pub rlimits: Vec<(libc::c_int, u64, u64)>,
    pub tty: bool,
    pub stdin: bool,
    /// How many of the received descriptors are mounts (attached, then
    /// closed before the command starts); the rest are for the command.
    pub mount_fds: usize,
    /// Bring loopback up (not needed in a pooled namespace, where it is).
    pub loopback: bool,
    /// The host process's argv area (`arg_start..arg_end`), which the init
    /// overwrites so the sandbox cannot read brig's command line.
    pub argv_area: Option<(usize, usize)>,
    /// Record step timestamps and send them with "ready"
    /// (`BRIG_TRACE_SPAWN=1`).
    pub trace: bool,
    /// Exec the command in place of the init instead of in a child: the
    /// command becomes the sandbox's pid 1 and must reap orphans itself
    /// (see [`crate::Extras::as_init`]).
    pub as_init: bool,
    /// Die when the host thread that cloned the init dies
    /// (`PR_SET_PDEATHSIG`): `brig run`'s sandboxes do; those of a daemon,
    /// which outlive it, do not (see [`crate::Extras::detach`]).
    pub die_with_host: bool,
    /// Keep the scratch tmpfs (the overlay's upper and work directories)
    /// open in the command as descriptor [`LAYER_FD`], so the host can
    /// reach the writable layer of a sandbox that outlives it (a
    /// snapshot: see `tier::writable_layer`). For a daemon's sandboxes
    /// on an overlay.
    pub keep_layer: bool,
    /// Stack for the command's process between clone and execve.
    pub workload_stack: Stack,
    pub exec: ExecPlan,
}

// SAFETY: the raw pointers in ExecPlan point into CStrings owned by the same
// ExecPlan; they are never mutated after construction.
unsafe impl Send for Plan {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for Plan {}

fn c(s: impl AsRef<[u8]>) -> CString {
    // Every string here comes from validated input (no NULs) or from paths
    // brig builds itself.
    CString::new(s.as_ref().to_vec()).expect("NUL byte in a validated string")
}

fn cp(p: &Path) -> CString {
    c(p.as_os_str().as_bytes())
}

struct Builder {
    root: String,
    steps: Vec<Step>,
}

impl Builder {
    fn at(&self, inside: &str) -> CString {
        c(format!("{}{}", self.root, inside))
    }
    fn mkdir(&mut self, inside: &str, mode: libc::mode_t) {
        let target = self.at(inside);
        self.steps.push(Step::Mkdir { target, mode });
    }
    fn mount(
        &mut self,
        what: &'static str,
        src: Option<&str>,
        inside: &str,
        fs: Option<&str>,
        flags: libc::c_ulong,
        data: Option<String>,
    ) {
        let target = self.at(inside);
        self.steps.push(Step::Mount {
            what,
            source: src.map(c),
            target,
            fstype: fs.map(c),
            flags,
            data: data.map(c),
        });
    }
    /// A read-only bind: bind, then remount read-only keeping the flags
    /// the kernel locks in a user namespace (nosuid, nodev, noexec, atime).
    fn bind_ro(&mut self, what: &'static str, src: &str, inside: &str, locked: libc::c_ulong) {
        self.mount(
            what,
            Some(src),
            inside,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        );
        self.mount(
            what,
            None,
            inside,
            None,
            libc::MS_BIND
                | libc::MS_REMOUNT
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | locked,
            None,
        );
    }
}

/// The mount flags a user namespace may not clear on a bind of `path`.
pub fn locked_flags(path: &Path) -> libc::c_ulong {
    let Ok(cpath) = CString::new(path.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs is plain old data; all-zero is valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    if unsafe { libc::statvfs(cpath.as_ptr(), &mut st) } != 0 {
        return 0;
    }
    let mut flags = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    flags
}

/// Inputs to [`Plan::build`] besides the spec.
#[allow(missing_debug_implementations)] // holds a closure
pub struct PlanInput<'a> {
    pub spec: &'a SandboxSpec,
    pub id: &'a SandboxId,
    pub layout: &'a Layout,
    pub identity: &'a Identity,
    pub staging: &'a Path,
    /// The host's RLIMIT_NOFILE hard limit: the sandbox cannot go above it.
    pub nofile_hard: u64,
    /// Which optional /proc files exist on this kernel.
    pub proc_has: &'a dyn Fn(&str) -> bool,
    /// The mount flags a user namespace may not clear on a bind of a host
    /// path (see [`locked_flags`]).
    pub locked_flags: &'a dyn Fn(&Path) -> libc::c_ulong,
    /// The host process's argv area (see [`argv_area`]).
    pub argv_area: Option<(usize, usize)>,
    /// The host's /proc/meminfo and /proc/cpuinfo, for the sandbox's views.
    pub host_meminfo: Option<&'a str>,
    pub host_cpuinfo: Option<&'a str>,
    /// The sandbox joins a pooled network namespace and gets its sysfs as a
    /// detached mount (after the template's, if any).
    pub pooled_net: bool,
    /// The host sends the program to run as a descriptor (after the mounts).
    pub program_fd: bool,
    /// The host sends a socket for the command's stdin and stdout (last).
    pub stdio_fd: bool,
    /// Where volumes appear inside: the host sends each as a detached
    /// (idmapped) mount, in this order, after the network's sysfs.
    pub volumes: &'a [String],
    /// The host CPUs it is placed on, where its limit is below the host's
    /// count ([`crate::cpus`]): its affinity and its views of the CPUs.
    pub cpus: Option<&'a [usize]>,
}

/// Bytes of --disk per inode of a sandbox's tmpfs mounts.
const INODE_RATIO: u64 = 8 << 10;
/// The fewest inodes a sandbox's tmpfs mounts get.
const MIN_INODES: u64 = 4096;

impl Plan {
    pub fn build(input: &PlanInput<'_>) -> Plan {
        let spec = input.spec;
        let staging = input.staging.to_string_lossy().into_owned();
        let disk = spec.limits.disk.bytes();
        // Files as well as bytes are bounded by --disk: a tmpfs's inodes
        // otherwise default to half the host's RAM in pages (millions,
        // each costing kernel memory), so 300,000 empty files fit in a
        // 1 GiB sandbox. One inode per 8 KiB is twice ext4's default
        // density (E2B's sandboxes run on ext4), at least 4096.
        let inodes = (disk / INODE_RATIO).max(MIN_INODES);
        let knocked = Knockouts::current();
        let disk = if knocked.has(Protection::DiskLimit) {
            "0,nr_inodes=0".to_string() // 0: unlimited
        } else {
            format!("{disk},nr_inodes={inodes}")
        };
        let nosuid_nodev = libc::MS_NOSUID | libc::MS_NODEV;

        // The scratch tmpfs holds the writable layer (and, for overlays, the
        // overlay's upper and work directories). Its size is --disk.
        // Detached mounts the host sends, in order: the template (overlay
        // layouts), then the pooled network namespace's sysfs.
        let mut next_fd = 0;
        let (root, mut b) = match input.layout {
            Layout::Host(entries) => {
                let mut b = Builder {
                    root: staging.clone(),
                    steps: Vec::new(),
                };
                for e in entries {
                    match e {
                        HostEntry::Bind(p) if knocked.has(Protection::TemplateReadOnly) => {
                            let inside = p.to_string_lossy().into_owned();
                            b.mkdir(&inside, 0o755);
                            b.mount(
                                "bind the host's directory (knockout: writable)",
                                Some(&inside),
                                &inside,
                                None,
                                libc::MS_BIND | libc::MS_REC,
                                None,
                            );
                        }
                        HostEntry::Bind(p) => {
                            let inside = p.to_string_lossy().into_owned();
                            b.mkdir(&inside, 0o755);
                            b.bind_ro(
                                "bind the host's directory read-only",
                                &inside,
                                &inside,
                                (input.locked_flags)(p),
                            );
                        }
                        HostEntry::Symlink(link, target) => {
                            b.steps.push(Step::Symlink {
                                link: b.at(&link.to_string_lossy()),
                                target: cp(target),
                            });
                        }
                    }
                }
                (staging.clone(), b)
            }
            Layout::Overlay { lowers } => {
                let mut b = Builder {
                    root: staging.clone(),
                    steps: Vec::new(),
                };
                b.mkdir("/root", 0o755);
                if spec.upper_dir.is_none() {
                    b.mkdir("/upper", 0o755);
                    b.mkdir("/work", 0o755);
                }
                // Each lower layer (a `dir:` template's one, an image's
                // layers top first) attached idmapped and read-only at
                // /lower, /lower1, /lower2…, in the order the host sends
                // them.
                let mut lowerdir = Vec::with_capacity(lowers.len());
                for i in 0..lowers.len().max(1) {
                    let at = if i == 0 {
                        "/lower".to_string()
                    } else {
                        format!("/lower{i}")
                    };
                    b.mkdir(&at, 0o755);
                    b.steps.push(Step::Attach {
                        what: "attach the template (idmapped, read-only)",
                        index: next_fd,
                        target: b.at(&at),
                    });
                    next_fd += 1;
                    lowerdir.push(format!("{staging}{at}"));
                }
                // The writable layer: on the scratch tmpfs, or a host
                // directory sent after the lower layers (`/keep`).
                let rw = if spec.upper_dir.is_some() {
                    b.mkdir("/keep", 0o755);
                    b.steps.push(Step::Attach {
                        what: "attach the kept writable layer (idmapped)",
                        index: next_fd,
                        target: b.at("/keep"),
                    });
                    next_fd += 1;
                    format!("{staging}/keep")
                } else {
                    staging.clone()
                };
                let opts = format!(
                    "lowerdir={},upperdir={rw}/upper,workdir={rw}/work,userxattr",
                    lowerdir.join(":"),
                );
                // nosuid unless the spec lets setuid binaries work (then
                // no_new_privs is off too; see bringup::drop_privileges).
                let overlay_flags = if spec.allow_setuid {
                    libc::MS_NODEV
                } else {
                    nosuid_nodev
                };
                b.mount(
                    "mount the overlay (template below, writable layer above)",
                    Some("overlay"),
                    "/root",
                    Some("overlay"),
                    overlay_flags,
                    Some(opts),
                );
                let root = format!("{staging}/root");
                b.root = root.clone();
                (root, b)
            }
        };

        // Directories every program expects, created in the writable layer.
        // /tmp is one of them: private, memory-backed, and sharing the
        // --disk budget with the rest of the writable layer (as a
        // container's /tmp does).
        for (d, mode) in [
            ("/proc", 0o555),
            ("/dev", 0o755),
            ("/sys", 0o555),
            ("/tmp", 0o1777),
            ("/root", 0o700),
            ("/home", 0o755),
            ("/run", 0o755),
            ("/var", 0o755),
            ("/var/tmp", 0o1777),
        ] {
            b.mkdir(d, mode);
        }
        // Files the caller put in /run (validated names: no path escapes).
        for f in &spec.run_files {
            let target = b.at(&f.path());
            b.steps.push(Step::Write {
                target,
                data: f.contents.clone(),
                mode: f.mode,
            });
        }

        // A fresh /proc for the sandbox's own pid namespace: host processes
        // are invisible. Then mask or freeze the host-wide parts of it.
        if knocked.has(Protection::PidNs) {
            // Knockout: no pid namespace of its own may mount a proc, so
            // the host's is bound in (every host process visible).
            b.mount(
                "bind the host's proc (knockout: no pid namespace)",
                Some("/proc"),
                "/proc",
                None,
                libc::MS_BIND | libc::MS_REC,
                None,
            );
        } else {
            b.mount(
                "mount proc",
                Some("proc"),
                "/proc",
                Some("proc"),
                nosuid_nodev | libc::MS_NOEXEC,
                None,
            );
        }

        // A minimal /dev on its own tmpfs (it hides a template's own /dev):
        // only the harmless character devices (bound from the host, since a
        // user namespace may not mknod), a private devpts instance, and
        // /dev/shm as a directory of the same tmpfs. One tmpfs, not two:
        // each superblock costs 0.1-0.3 ms on the spawn path.
        b.mount(
            "mount /dev",
            Some("tmpfs"),
            "/dev",
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(format!("mode=755,size={disk}")),
        );
        for d in DEVICES {
            let inside = format!("/dev/{d}");
            b.steps.push(Step::Touch {
                target: b.at(&inside),
            });
            b.mount(
                "bind a device node",
                Some(&inside),
                &inside,
                None,
                libc::MS_BIND,
                None,
            );
        }
        b.mkdir("/dev/pts", 0o755);
        b.mount(
            "mount devpts",
            Some("devpts"),
            "/dev/pts",
            Some("devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620".into()),
        );
        b.mkdir("/dev/shm", 0o1777);
        for (link, target) in [
            ("/dev/ptmx", "pts/ptmx"),
            ("/dev/fd", "/proc/self/fd"),
            ("/dev/stdin", "/proc/self/fd/0"),
            ("/dev/stdout", "/proc/self/fd/1"),
            ("/dev/stderr", "/proc/self/fd/2"),
        ] {
            b.steps.push(Step::Symlink {
                link: b.at(link),
                target: c(target),
            });
        }

        for f in READONLY_PROC
            .iter()
            .filter(|f| (input.proc_has)(f))
            .filter(|_| !knocked.has(Protection::ProcReadOnly))
        {
            let inside = format!("/proc/{f}");
            let src = format!("{root}{inside}");
            b.bind_ro(
                "make a /proc path read-only",
                &src,
                &inside,
                libc::MS_NOEXEC,
            );
        }
        // A boot id of its own: the host's names the host's boot, the
        // same in every sandbox. A random one, kept in the sandbox's /dev
        // tmpfs (where the host can renew it when the sandbox "reboots":
        // `renew_boot_id`) and bound read-only over the kernel's, after
        // /proc/sys was frozen (a bind there first would be hidden).
        if (input.proc_has)(BOOT_ID) {
            b.steps.push(Step::Write {
                target: b.at(BOOT_ID_FILE),
                data: random_boot_id().into_bytes(),
                mode: 0o444,
            });
            b.bind_ro(
                "give the sandbox a boot id of its own",
                &format!("{root}{BOOT_ID_FILE}"),
                &format!("/proc/{BOOT_ID}"),
                libc::MS_NOSUID | libc::MS_NOEXEC,
            );
        }

        // sysfs read-only: programs read CPU topology from it; nothing may
        // be written. It shows the sandbox's own network namespace: mounted
        // here when the namespace is the sandbox's own, attached ready-made
        // when it comes from the pool (only its owner may mount one).
        if input.pooled_net {
            b.steps.push(Step::Attach {
                what: "attach the network namespace's sysfs",
                index: next_fd,
                target: b.at("/sys"),
            });
        } else {
            b.mount(
                "mount /sys read-only",
                Some("sysfs"),
                "/sys",
                Some("sysfs"),
                if knocked.has(Protection::SysReadOnly) {
                    nosuid_nodev | libc::MS_NOEXEC
                } else {
                    nosuid_nodev | libc::MS_NOEXEC | libc::MS_RDONLY
                },
                None,
            );
        }
        if input.pooled_net {
            next_fd += 1;
        }
        // The CPUs it is placed on as the ones online, for the libraries
        // that size their pools by them (`os.cpu_count()`); `nproc` asks
        // the scheduler's affinity, which the workload gets (ExecPlan).
        if let Some(cpus) = input.cpus {
            b.steps.push(Step::Write {
                target: b.at(CPUS_ONLINE_FILE),
                data: cpus_online(cpus).into_bytes(),
                mode: 0o444,
            });
            b.bind_ro(
                "show the sandbox's CPU limit as its online CPUs",
                &format!("{root}{CPUS_ONLINE_FILE}"),
                CPUS_ONLINE,
                libc::MS_NOSUID | libc::MS_NOEXEC,
            );
        }
        // Its memory limit as the machine's memory (`free`, psutil), and
        // as many CPUs in /proc/cpuinfo as are online. The memory view
        // starts empty and follows the sandbox's use at each usage
        // reading (`tier`'s `usage`).
        let meminfo = input
            .host_meminfo
            .filter(|_| (input.proc_has)(views::MEMINFO))
            .and_then(|host| {
                views::meminfo(host, spec.limits.memory.bytes(), 0, &Default::default())
            });
        if let Some(view) = meminfo {
            b.steps.push(Step::Write {
                target: b.at(views::MEMINFO_FILE),
                data: view.into_bytes(),
                mode: 0o444,
            });
            b.bind_ro(
                "show the sandbox's memory limit as its memory",
                &format!("{root}{}", views::MEMINFO_FILE),
                &format!("/proc/{}", views::MEMINFO),
                libc::MS_NOSUID | libc::MS_NOEXEC,
            );
        }
        let cpuinfo = input
            .host_cpuinfo
            .filter(|_| (input.proc_has)(views::CPUINFO))
            .zip(input.cpus)
            .map(|(host, cpus)| views::cpuinfo(host, cpus));
        if let Some(view) = cpuinfo {
            b.steps.push(Step::Write {
                target: b.at(views::CPUINFO_FILE),
                data: view.into_bytes(),
                mode: 0o444,
            });
            b.bind_ro(
                "describe only the sandbox's CPUs",
                &format!("{root}{}", views::CPUINFO_FILE),
                &format!("/proc/{}", views::CPUINFO),
                libc::MS_NOSUID | libc::MS_NOEXEC,
            );
        }
        // Volumes last, over everything else: a volume under /tmp goes on
        // the sandbox's /tmp. Their mount points are made on the way.
        for path in input.volumes {
            let mut prefix = String::new();
            for part in path.split('/').filter(|p| !p.is_empty()) {
                prefix.push('/');
                prefix.push_str(part);
                b.mkdir(&prefix, 0o755);
            }
            b.steps.push(Step::Attach {
                what: "attach a volume",
                index: next_fd,
                target: b.at(path),
            });
            next_fd += 1;
        }
        let mount_fds = next_fd;
        let program_fd = input.program_fd.then(|| {
            next_fd += 1;
            next_fd - 1
        });
        let stdio_fd = input.stdio_fd.then_some(next_fd);

        let mut exec = exec_plan(input);
        exec.program_fd = program_fd;
        exec.stdio_fd = stdio_fd;
        Plan {
            staging: c(&staging),
            staging_opts: c(format!("mode=755,size={disk}")),
            steps: b.steps,
            new_root: c(&root),
            hostname: input.id.as_str().as_bytes().to_vec(),
            rlimits: [
                // No core dumps into the writable layer.
                (
                    Protection::CoreLimit,
                    (libc::RLIMIT_CORE as libc::c_int, 0, 0),
                ),
                (
                    Protection::NofileLimit,
                    (
                        libc::RLIMIT_NOFILE as libc::c_int,
                        input.nofile_hard.min(65536),
                        input.nofile_hard.min(65536),
                    ),
                ),
            ]
            .into_iter()
            .filter(|(p, _)| !knocked.has(*p))
            .map(|(_, r)| r)
            .collect(),
            knockouts: knocked,
            tty: spec.tty,
            stdin: spec.stdin,
            mount_fds,
            loopback: !input.pooled_net,
            argv_area: input.argv_area,
            trace: false,
            as_init: false,
            die_with_host: true,
            keep_layer: false,
            workload_stack: Stack::new(256 * 1024),
            exec,
        }
    }

    /// The C string form of a host path, for callers that build plans by hand.
    pub fn cstr(s: &str) -> CString {
        c(s)
    }
}

fn exec_plan(input: &PlanInput<'_>) -> ExecPlan {
    let spec = input.spec;
    let id = input.identity;
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), id.home.clone()),
        ("HOSTNAME".into(), input.id.to_string()),
    ];
    if let Some(name) = &id.name {
        env.push(("USER".into(), name.clone()));
        env.push(("LOGNAME".into(), name.clone()));
    }
    if spec.tty {
        env.push(("TERM".into(), brig_core::terminal_type()));
    }
    for v in &spec.env {
        env.retain(|(k, _)| k != &v.key);
        env.push((v.key.clone(), v.value.clone()));
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let cmd = &spec.command[0];
    let candidates: Vec<CString> = if cmd.contains('/') {
        vec![c(cmd)]
    } else {
        path.split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| c(format!("{}/{cmd}", d.trim_end_matches('/'))))
            .collect()
    };
    let workdir = spec.workdir.clone().unwrap_or_else(|| "/".into());
    let mut prefixes = Vec::new();
    let mut acc = String::new();
    for part in workdir.split('/').filter(|p| !p.is_empty()) {
        acc.push('/');
        acc.push_str(part);
        prefixes.push(c(&acc));
    }
    let argv: Vec<CString> = spec.command.iter().map(c).collect();
    let env: Vec<CString> = env.iter().map(|(k, v)| c(format!("{k}={v}"))).collect();
    let argv_ptrs = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let env_ptrs = env
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    ExecPlan {
        knockouts: Knockouts::current(),
        display: cmd.clone(),
        argv,
        env,
        candidates,
        workdir: c(&workdir),
        workdir_prefixes: prefixes,
        uid: id.uid,
        gid: id.gid,
        groups: id.groups.clone(),
        caps: if id.uid == 0 { DEFAULT_CAPS } else { 0 },
        bounding: if id.uid == 0 || spec.allow_setuid {
            DEFAULT_CAPS
        } else {
            0
        },
        allow_setuid: spec.allow_setuid,
        program_fd: None,
        stdio_fd: None,
        inherit_fds: [None, None],
        cpus: input.cpus.map(<[usize]>::to_vec).unwrap_or_default(),
        argv_ptrs,
        env_ptrs,
    }
}

/// Memory for a child's stack, allocated before clone so the child need
/// not allocate.
pub struct Stack(std::cell::UnsafeCell<Vec<u8>>);

impl Stack {
    pub fn new(size: usize) -> Self {
        Stack(std::cell::UnsafeCell::new(vec![0; size]))
    }

    /// The top of the stack (stacks grow down), 16-byte aligned.
    pub fn top(&self) -> *mut libc::c_void {
        // SAFETY: only the one child that runs on this stack writes to it;
        // the pointer is derived from the UnsafeCell, not from a shared
        // reference to the Vec's contents.
        let v = unsafe { &mut *self.0.get() };
        let end = v.as_mut_ptr() as usize + v.len();
        (end & !15) as *mut libc::c_void
    }
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stack")
    }
}

/// `arg_start` and `arg_end` of this process, from /proc/self/stat (fields
/// 48 and 49, counted after the parenthesised command name).
pub fn argv_area() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let start: usize = fields.get(45)?.parse().ok()?;
    let end: usize = fields.get(46)?.parse().ok()?;
    (end > start && end - start < 1 << 20).then_some((start, end))
}

/// Helper for tests and messages: a C string as &str.
pub fn lossy(c: &CStr) -> String {
    c.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use brig_core::EnvVar;
    use std::path::PathBuf;

    fn build(spec: &SandboxSpec, layout: &Layout) -> Plan {
        let id = SandboxId::from_random(0x1234);
        Plan::build(&PlanInput {
            spec,
            id: &id,
            layout,
            identity: &Identity::root(),
            staging: Path::new("/run/brig/mnt"),
            nofile_hard: 1 << 20,
            proc_has: &|f| f != "sched_debug",
            locked_flags: &|_| 0,
            argv_area: None,
            host_meminfo: None,
            host_cpuinfo: None,
            pooled_net: false,
            program_fd: false,
            stdio_fd: false,
            volumes: &[],
            cpus: None,
        })
    }

    #[test]
    fn host_layout_binds_only_the_listed_host_paths() {
        let layout = Layout::Host(vec![
            HostEntry::Bind("/usr".into()),
            HostEntry::Symlink("/bin".into(), "usr/bin".into()),
        ]);
        let plan = build(&SandboxSpec::new(vec!["true".into()]), &layout);
        let binds: Vec<String> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Mount {
                    source: Some(src),
                    flags,
                    ..
                } if flags & libc::MS_BIND != 0 && flags & libc::MS_REMOUNT == 0 => {
                    Some(lossy(src))
                }
                _ => None,
            })
            // Host paths only: not devices, not the sandbox's own files
            // (under the staging root: its /proc, its boot id).
            .filter(|s| {
                !s.starts_with("/dev/")
                    && !s.starts_with("/run/brig/mnt/")
                    && !s.ends_with("/dev/null")
            })
            .collect();
        assert_eq!(binds, vec!["/usr"]);
        assert_eq!(lossy(&plan.new_root), "/run/brig/mnt");
        assert!(plan.steps.iter().any(
            |s| matches!(s, Step::Symlink { link, .. } if lossy(link) == "/run/brig/mnt/bin")
        ));
    }

    #[test]
    fn overlay_layout_attaches_the_template_below_a_writable_layer() {
        let layout = Layout::Overlay {
            lowers: vec![PathBuf::from("/srv/rootfs")],
        };
        let plan = build(&SandboxSpec::new(vec!["true".into()]), &layout);
        assert_eq!(lossy(&plan.new_root), "/run/brig/mnt/root");
        let overlay = plan.steps.iter().find_map(|s| match s {
            Step::Mount {
                fstype: Some(f),
                data: Some(d),
                ..
            } if f.as_bytes() == b"overlay" => Some(lossy(d)),
            _ => None,
        });
        assert_eq!(
            overlay.unwrap(),
            "lowerdir=/run/brig/mnt/lower,upperdir=/run/brig/mnt/upper,workdir=/run/brig/mnt/work,userxattr"
        );
    }

    #[test]
    fn every_mount_but_the_root_is_nosuid() {
        let plan = build(
            &SandboxSpec::new(vec!["true".into()]),
            &Layout::Host(vec![HostEntry::Bind("/usr".into())]),
        );
        for s in &plan.steps {
            if let Step::Mount {
                flags,
                target,
                what,
                ..
            } = s
            {
                let is_plain_bind = flags & libc::MS_BIND != 0 && flags & libc::MS_REMOUNT == 0;
                if !is_plain_bind {
                    assert!(
                        flags & libc::MS_NOSUID != 0,
                        "{what} at {target:?} lacks nosuid"
                    );
                }
            }
        }
    }

    #[test]
    fn env_user_values_override_defaults_and_path_drives_lookup() {
        let mut spec = SandboxSpec::new(vec!["python3".into(), "-c".into(), "pass".into()]);
        spec.env.push(EnvVar {
            key: "PATH".into(),
            value: "/opt/bin:relative:/usr/bin/".into(),
        });
        spec.env.push(EnvVar {
            key: "X".into(),
            value: "1".into(),
        });
        let plan = build(&spec, &Layout::Host(vec![]));
        let cands: Vec<String> = plan.exec.candidates.iter().map(|c| lossy(c)).collect();
        assert_eq!(cands, vec!["/opt/bin/python3", "/usr/bin/python3"]);
        let env: Vec<String> = plan.exec.env.iter().map(|c| lossy(c)).collect();
        assert!(env.contains(&"X=1".to_string()));
        assert_eq!(env.iter().filter(|e| e.starts_with("PATH=")).count(), 1);
        assert!(env.contains(&"HOSTNAME=000000001234".to_string()));
    }

    #[test]
    fn workdir_prefixes_and_argv_are_null_terminated() {
        let mut spec = SandboxSpec::new(vec!["ls".into()]);
        spec.workdir = Some("/a/b/c".into());
        let plan = build(&spec, &Layout::Host(vec![]));
        let p: Vec<String> = plan
            .exec
            .workdir_prefixes
            .iter()
            .map(|c| lossy(c))
            .collect();
        assert_eq!(p, vec!["/a", "/a/b", "/a/b/c"]);
        // SAFETY: argv_ptr points at argv.len()+1 pointers, the last null.
        unsafe {
            assert!((*plan.exec.argv_ptr().add(1)).is_null());
        }
        assert_eq!(plan.exec.caps, DEFAULT_CAPS);
    }

    #[test]
    fn readonly_proc_paths_follow_the_kernel() {
        let id = SandboxId::from_random(1);
        let plan = Plan::build(&PlanInput {
            spec: &SandboxSpec::new(vec!["true".into()]),
            id: &id,
            layout: &Layout::Host(vec![]),
            identity: &Identity::root(),
            staging: Path::new("/st"),
            nofile_hard: 1024,
            proc_has: &|f| f == "sys",
            locked_flags: &|_| 0,
            argv_area: None,
            host_meminfo: None,
            host_cpuinfo: None,
            pooled_net: false,
            program_fd: false,
            stdio_fd: false,
            volumes: &[],
            cpus: None,
        });
        let frozen: Vec<String> = plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Mount {
                    what: "make a /proc path read-only",
                    target,
                    flags,
                    ..
                } if flags & libc::MS_RDONLY != 0 => Some(lossy(target)),
                _ => None,
            })
            .collect();
        assert_eq!(frozen, vec!["/st/proc/sys"]);
    }
}
