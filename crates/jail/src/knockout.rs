//! Test-only switches that leave out one protection at a time, so the
//! hostile corpus can show that each protection matters (issue 10's
//! matrix: `tests/hostile/matrix.sh`, the table in docs/threat-model.md).
//!
//! They exist only in a debug build with the `knockout` feature, which
//! reads `BRIG_KNOCKOUT=<name>[,<name>...]` (names: [`Protection::name`]).
//! Without the feature [`Knockouts::current`] is the constant "none" and
//! every check below folds away; a release build with the feature does not
//! compile.

#[cfg(all(feature = "knockout", not(debug_assertions)))]
compile_error!(
    "the `knockout` feature removes protections for tests and must never be in a release build"
);

/// One protection the bring-up applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protection {
    /// A pid namespace of the sandbox's own.
    PidNs,
    /// A network namespace of its own (`brig run` without `--network`).
    NetNs,
    /// An IPC namespace (SysV IPC, POSIX message queues) of its own.
    IpcNs,
    /// A UTS namespace (hostname) of its own.
    UtsNs,
    /// A cgroup namespace (/proc/self/cgroup shows `/`).
    CgroupNs,
    /// pivot_root (chroot instead).
    PivotRoot,
    /// /proc/sys, sysrq-trigger and the other host-wide /proc files
    /// read-only.
    ProcReadOnly,
    /// /sys read-only.
    SysReadOnly,
    /// The host template's directories bound read-only.
    TemplateReadOnly,
    /// no_new_privs.
    NoNewPrivs,
    /// The capability set cut to a container root's (the full set of the
    /// sandbox's user namespace otherwise).
    Capabilities,
    /// The seccomp filter.
    Seccomp,
    /// Init (pid 1) non-dumpable.
    Dumpable,
    /// The memory limit.
    MemoryLimit,
    /// The pids limit.
    PidsLimit,
    /// The size of the sandbox's tmpfs mounts (--disk).
    DiskLimit,
    /// RLIMIT_NOFILE.
    NofileLimit,
    /// RLIMIT_CORE = 0.
    CoreLimit,
}

impl Protection {
    pub const ALL: [Protection; 18] = [
        Protection::PidNs,
        Protection::NetNs,
        Protection::IpcNs,
        Protection::UtsNs,
        Protection::CgroupNs,
        Protection::PivotRoot,
        Protection::ProcReadOnly,
        Protection::SysReadOnly,
        Protection::TemplateReadOnly,
        Protection::NoNewPrivs,
        Protection::Capabilities,
        Protection::Seccomp,
        Protection::Dumpable,
        Protection::MemoryLimit,
        Protection::PidsLimit,
        Protection::DiskLimit,
        Protection::NofileLimit,
        Protection::CoreLimit,
    ];

    /// Its name in `BRIG_KNOCKOUT`.
    pub fn name(self) -> &'static str {
        match self {
            Protection::PidNs => "pidns",
            Protection::NetNs => "netns",
            Protection::IpcNs => "ipcns",
            Protection::UtsNs => "utsns",
            Protection::CgroupNs => "cgroupns",
            Protection::PivotRoot => "pivot_root",
            Protection::ProcReadOnly => "proc_ro",
            Protection::SysReadOnly => "sys_ro",
            Protection::TemplateReadOnly => "template_ro",
            Protection::NoNewPrivs => "no_new_privs",
            Protection::Capabilities => "capabilities",
            Protection::Seccomp => "seccomp",
            Protection::Dumpable => "dumpable",
            Protection::MemoryLimit => "memory",
            Protection::PidsLimit => "pids",
            Protection::DiskLimit => "disk",
            Protection::NofileLimit => "nofile",
            Protection::CoreLimit => "core",
        }
    }

    fn bit(self) -> u32 {
        1 << (self as u32)
    }
}

/// The protections left out in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Knockouts(u32);

impl Knockouts {
    /// None: every protection applies.
    pub const NONE: Knockouts = Knockouts(0);

    /// What `BRIG_KNOCKOUT` names (knockout builds only; always
    /// [`Knockouts::NONE`] otherwise). An unknown name aborts: a matrix run
    /// must not silently test the full set.
    #[cfg(feature = "knockout")]
    pub fn current() -> Knockouts {
        static CURRENT: std::sync::OnceLock<Knockouts> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(|| {
            let mut k = Knockouts::NONE;
            let names = std::env::var("BRIG_KNOCKOUT").unwrap_or_default();
            for name in names.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                match Protection::ALL.iter().find(|p| p.name() == name) {
                    Some(p) => k.0 |= p.bit(),
                    None => panic!("BRIG_KNOCKOUT: unknown protection {name:?}"),
                }
            }
            k
        })
    }

    #[cfg(not(feature = "knockout"))]
    #[inline(always)]
    pub fn current() -> Knockouts {
        Knockouts::NONE
    }

    /// Whether `p` is left out.
    #[inline(always)]
    pub fn has(self, p: Protection) -> bool {
        self.0 & p.bit() != 0
    }
}

/// Whether `p` is left out in this process.
#[inline(always)]
pub fn off(p: Protection) -> bool {
    Knockouts::current().has(p)
}
