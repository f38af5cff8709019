//! The hostile-program suite (STYLE.md habit 12): every program of
//! `tests/hostile` (crate `brig-hostile`) runs inside a real `brig run`
//! sandbox on every template, and each is judged twice — by the one JSON
//! line it prints (`"escaped": false`), and by looking at the host
//! afterwards, because a program only sees its own side.
//!
//! How a run works:
//! 1. The programs are built once per test process as static binaries
//!    (`cargo build -p brig-hostile --release --target
//!    x86_64-unknown-linux-gnu` with `+crt-static`, into `target/hostile`),
//!    or taken from `BRIG_HOSTILE_DIR`.
//! 2. [`HostWatch::start`] plants canaries on the host — files in /root and
//!    /var/tmp, a process with argv[0] `brig-hostile-canary` and a secret in
//!    its environment, an abstract unix socket, a pseudo-terminal — and
//!    notes the hostname, the clock and the canary contents.
//! 3. The binary is uploaded through stdin: `brig run -i [limits] -- /bin/sh
//!    -c 'cat > /tmp/h && chmod +x /tmp/h && exec /tmp/h "$@"' sh ARGS`,
//!    with `BRIG_HOSTILE_HOST_SECRET` set in brig's own environment and a
//!    unique `--run-id=...` among the arguments.
//! 4. The verdict: the expected exit (0 and a report, or 137 / 124 for the
//!    bombs), `escaped == false`, then [`HostWatch::finish`]: the host can
//!    fork, hostname and clock unchanged, canaries intact and the canary
//!    process alive, no process carrying the run id left anywhere, and the
//!    template (host /usr and /etc, or the rootfs directory) unmodified.
//! 5. In the attribution pass (`BRIG_HOSTILE_SECCOMP_MARK`, a knockout
//!    build of brig; `tests/hostile/matrix.sh --attribution`), also the
//!    layer that refused the program, against the one [`layer`] declares.
//!
//! One test per program and template (`host_template::fork_bomb`,
//! `dir_template::fork_bomb`, ...), so a failure names both. Without root
//! each test prints why it skips; when brig reports that a sandbox cannot
//! start on this host (exit 125) likewise, unless `BRIG_HOSTILE_REQUIRE=1`;
//! the `dir` tests skip without `BRIG_TEST_ROOTFS`.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime};

use support::{eventually, rootfs};

/// The brig under attack: cargo's, or `BRIG_HOSTILE_BRIG` (the matrix
/// script's build with a protection left out, `tests/hostile/matrix.sh`).
fn brig() -> Command {
    match std::env::var_os("BRIG_HOSTILE_BRIG") {
        Some(b) => Command::new(b),
        None => Command::new(support::BRIG),
    }
}

/// Name of everything planted on the host; see `brig_hostile::CANARY`.
const CANARY: &str = "brig-hostile-canary";
/// Variable set in brig's environment; see `brig_hostile::CANARY_ENV`.
const CANARY_ENV: &str = "BRIG_HOSTILE_HOST_SECRET";
const CANARY_FILES: &[&str] = &["/root/brig-hostile-canary", "/var/tmp/brig-hostile-canary"];
const CANARY_CONTENT: &str = "brig-hostile-canary: planted by crates/cli/tests/hostile.rs; if a sandbox can read this, it escaped\n";
/// Host uids at and above this belong to sandboxes.
const SANDBOX_UID_BASE: u32 = 0x1000_0000;
/// Files the programs create inside the sandbox; none may appear in a
/// template on the host.
const PLANTED_IN_TEMPLATE: &[&str] = &[
    "usr/bin/brig-hostile-x",
    "etc/brig-hostile-x",
    "usr/lib/brig-hostile-x",
    "usr/brig-hostile-dir",
    "brig-hostile-fill",
    "brig-hostile-suid",
    "tmp/brig-hostile-fill",
    "tmp/brig-hostile-suid",
];

// ---------------------------------------------------------------------------
// Preconditions: root, a working brig, the programs built.

/// Whether brig can start a sandbox here: `Err(reason)` if brig says it
/// cannot (exit 125). Any other failure of `brig run -- /bin/true` is a bug
/// and fails the test.
fn sandbox_available() -> &'static Result<(), String> {
    static AVAILABLE: OnceLock<Result<(), String>> = OnceLock::new();
    AVAILABLE.get_or_init(|| {
        let o = brig()
            .args(["run", "--", "/bin/true"])
            .output()
            .expect("spawn brig");
        match o.status.code() {
            Some(0) => Ok(()),
            Some(125) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
            other => panic!(
                "`brig run -- /bin/true` failed with {other:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
        }
    })
}

/// The directory holding the built programs.
fn programs_dir() -> &'static Path {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("BRIG_HOSTILE_DIR") {
            return Ok(PathBuf::from(d));
        }
        build_programs()
    });
    match dir {
        Ok(d) => d,
        Err(e) => panic!("building the hostile programs failed:\n{e}"),
    }
}

/// Build `brig-hostile` as static binaries with the workspace's `hostile`
/// profile (release without LTO and with parallel codegen: dozens of small
/// binaries would otherwise take minutes). scripts/test builds them the same
/// way in its build stage. When every binary is newer than every source file, cargo is
/// not even asked: under nextest each test is its own process and would
/// otherwise pay for a no-op cargo run.
fn build_programs() -> Result<PathBuf, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target_dir = root.join("target/hostile");
    let out_dir = target_dir.join("x86_64-unknown-linux-gnu/hostile");
    if built_programs_are_fresh(&root.join("tests/hostile"), &out_dir) {
        return Ok(out_dir);
    }
    let cargo = std::env::var("CARGO")
        .ok()
        .or(option_env!("CARGO").map(str::to_string))
        .unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "-p",
            "brig-hostile",
            "--profile",
            "hostile",
            "--target",
            "x86_64-unknown-linux-gnu",
        ])
        .env("CARGO_TARGET_DIR", &target_dir)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .map_err(|e| format!("spawning cargo: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(out_dir)
}

/// Whether a binary exists for every program and none is older than any
/// file of the crate's sources.
fn built_programs_are_fresh(crate_dir: &Path, out_dir: &Path) -> bool {
    fn newest(dir: &Path) -> Option<SystemTime> {
        let mut t = std::fs::metadata(dir).ok()?.modified().ok()?;
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let m = e.metadata().ok()?;
            let sub = if m.is_dir() {
                newest(&e.path())?
            } else {
                m.modified().ok()?
            };
            t = t.max(sub);
        }
        Some(t)
    }
    let Some(src) = newest(&crate_dir.join("src")) else {
        return false;
    };
    let Ok(manifest) = std::fs::metadata(crate_dir.join("Cargo.toml")).and_then(|m| m.modified())
    else {
        return false;
    };
    let sources = src.max(manifest);
    PROGRAMS.iter().all(|p| {
        std::fs::metadata(out_dir.join(p))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= sources)
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Template {
    /// The host's /usr, /etc… bound read-only (`brig run`'s and `brig
    /// create`'s default).
    Host,
    /// The test rootfs as `dir:PATH`, under a private writable layer.
    Dir,
    /// The named template `base` that E2B sandboxes get (built by
    /// scripts/test into the shared template home), under a private
    /// writable layer.
    Base,
}

impl Template {
    /// The `--template` value for brig, or `None` (with the skip reason
    /// printed) when this template is unavailable.
    fn brig_arg(self) -> Option<String> {
        match self {
            Template::Host => Some("host".into()),
            Template::Dir => match rootfs() {
                Some(r) => Some(format!("dir:{}", r.display())),
                None => {
                    support::skip("BRIG_TEST_ROOTFS is not set (scripts/test builds a Debian rootfs and sets it)");
                    None
                }
            },
            Template::Base => {
                if base_rootfs().join("etc/passwd").is_file() {
                    Some("base".into())
                } else {
                    support::skip(&format!(
                        "the template `base` is not built in {} (scripts/test's templates stage builds it)",
                        support::template_home().display()
                    ));
                    None
                }
            }
        }
    }

    /// What the programs are told (`--template host|dir`).
    fn program_arg(self) -> &'static str {
        match self {
            Template::Host => "host",
            Template::Dir | Template::Base => "dir",
        }
    }

    /// Where this template's files live on the host.
    fn host_root(self) -> PathBuf {
        match self {
            Template::Host => PathBuf::from("/"),
            Template::Dir => rootfs().expect("rootfs checked in brig_arg"),
            Template::Base => base_rootfs(),
        }
    }
}

/// Where the template `base` keeps its files on the host.
fn base_rootfs() -> PathBuf {
    let link = support::template_home().join("templates/base/rootfs");
    std::fs::canonicalize(&link).unwrap_or(link)
}

/// The sandbox configurations a user can get, each attacked by the whole
/// corpus (see `brig_hostile::Mode` for what each does differently; the
/// programs are told with `--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `brig run` on a template.
    Run(Template),
    /// A native daemon sandbox on the default (host) template: `brig
    /// create`, then `brig exec`.
    Daemon,
    /// An E2B sandbox (created through E2B's API, on `base`) running the
    /// program as its user `user`, with `brig exec -u user` (the runtime's
    /// exec that envd's process start uses too).
    E2bUser,
    /// The same, after `sudo` to the sandbox's root.
    E2bRoot,
    /// A daemon sandbox of another tier (`brig create --isolation gvisor`
    /// on the host template, `vm` on the test rootfs), then `brig exec`
    /// as in `Daemon`.
    Tier(Isolation),
}

/// The tiers besides the process tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    Gvisor,
    Vm,
}

impl Isolation {
    fn name(self) -> &'static str {
        match self {
            Isolation::Gvisor => "gvisor",
            Isolation::Vm => "vm",
        }
    }
}

impl Mode {
    fn template(self) -> Template {
        match self {
            Mode::Run(t) => t,
            Mode::Daemon | Mode::Tier(Isolation::Gvisor) => Template::Host,
            // The guest boots an image of a directory template.
            Mode::Tier(Isolation::Vm) => Template::Dir,
            Mode::E2bUser | Mode::E2bRoot => Template::Base,
        }
    }

    /// The program's `--mode`.
    fn program_arg(self) -> &'static str {
        match self {
            Mode::Run(_) => "run",
            Mode::Daemon => "daemon",
            Mode::E2bUser => "e2b-user",
            Mode::E2bRoot => "e2b-root",
            Mode::Tier(t) => t.name(),
        }
    }

    fn describe(self) -> String {
        match self {
            Mode::Run(t) => format!("brig run on the {} template", t.program_arg()),
            Mode::Daemon => "a daemon sandbox".into(),
            Mode::E2bUser => "an E2B sandbox as user".into(),
            Mode::E2bRoot => "an E2B sandbox as root (sudo)".into(),
            Mode::Tier(t) => format!("a daemon sandbox of the {} tier", t.name()),
        }
    }

    fn e2b(self) -> bool {
        matches!(self, Mode::E2bUser | Mode::E2bRoot)
    }
}

/// Root, a sandbox-capable host and the template; `None` means skip (the
/// reason is already printed).
fn mode_prerequisites(mode: Mode) -> Option<String> {
    if let Mode::Tier(t) = mode {
        if !support::tier_or_skip(t.name()) {
            return None;
        }
    }
    prerequisites(mode.template())
}

fn prerequisites(template: Template) -> Option<String> {
    if support::euid() != 0 {
        support::skip(&format!(
            "the hostile suite needs root (brig's process tier); running as uid {}",
            support::euid()
        ));
        return None;
    }
    if let Err(reason) = sandbox_available() {
        if std::env::var_os("BRIG_HOSTILE_REQUIRE").is_some() {
            panic!("brig cannot start a sandbox here and BRIG_HOSTILE_REQUIRE is set: {reason}");
        }
        support::skip(&format!(
            "brig cannot start a sandbox on this host: {reason}"
        ));
        return None;
    }
    template.brig_arg()
}

// ---------------------------------------------------------------------------
// What each program needs and what counts as contained.

#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Exit 0 with a report that did not escape.
    Report,
    /// A clean report, or the memory limit killed the sandbox (exit 137).
    ReportOrOom,
    /// The exec's process killed by SIGKILL (137); a report, if any,
    /// clean.
    Killed,
    /// Killed by the memory limit (of this size): exit 137 and
    /// `out of memory (limit SIZE)` on stderr.
    Oom(&'static str),
    /// Killed by --timeout: exit 124 within this long, stderr says so.
    Timeout(Duration),
    /// Any end, the sandbox with it or not (a tier where the attack may
    /// end the whole sandbox: gVisor's OOM, pid 1 killed from inside); a
    /// report, if any, clean unless `own_kernel` says why not. The
    /// daemon and host checks still apply.
    Ends,
}

#[derive(Debug, Clone)]
struct Case {
    program: &'static str,
    args: Vec<String>,
    /// The sandbox's limits and network (`brig run` / `brig create`
    /// flags). E2B sandboxes have E2B's defaults instead: 512 MiB, 256
    /// pids, 1 GiB of disk, a network.
    limits: Vec<&'static str>,
    /// The command's `--timeout`.
    timeout: &'static str,
    expect: Expect,
    /// The whole run must end within this (brig start-up included).
    within: Duration,
    /// The report's detail must contain each of these.
    detail_contains: Vec<&'static str>,
    /// disk_fill's bound: each target's bytes at most about this.
    disk: Option<u64>,
    /// In a tier with a kernel of its own (gVisor's, a vm guest's), why
    /// the program's own verdict is not the tier's: what it calls an
    /// escape is that kernel's answer inside the sandbox (a call gVisor
    /// implements, a limit counted differently). The report is then
    /// information; the host checks (canaries, clock, hostname, modules,
    /// processes, template, the daemon) still judge.
    own_kernel: Option<&'static str>,
}

impl Case {
    /// What `brig run` is given.
    fn run_args(&self) -> Vec<&'static str> {
        let mut a = self.limits.clone();
        a.extend(["--timeout", self.timeout]);
        a
    }
}

/// E2B's defaults, which contain the bombs in E2B sandboxes.
const E2B_MEMORY: &str = "512 MiB";
const E2B_PIDS: &str = "256";
const E2B_DISK: u64 = 1 << 30;

fn case(program: &'static str, mode: Mode) -> Case {
    let e2b = mode.e2b();
    let mut c = Case {
        program,
        args: vec![],
        limits: vec![],
        timeout: "60s",
        expect: Expect::Report,
        within: Duration::from_secs(90),
        detail_contains: vec![],
        disk: None,
        own_kernel: None,
    };
    match program {
        "fork_bomb" => {
            c.args = vec!["--cap".into(), if e2b { E2B_PIDS } else { "64" }.into()];
            c.limits = vec!["--pids", "64"];
            c.timeout = "20s";
            c.within = Duration::from_secs(25);
            // Each fork the pids limit refuses has already allocated its
            // task, stack and page tables; they are freed after an RCU
            // grace period, and a tight loop of failing forks on a busy
            // 2-core host can pile up 500 MB of such kernel memory in the
            // sandbox's memory cgroup (measured: kmem 528 MB, user 5 MB).
            // Then the memory limit kills the sandbox, which is containment
            // too; the host checks below still apply.
            c.expect = Expect::ReportOrOom;
        }
        "memory_bomb" | "memfd_bomb" | "shm_bomb" => {
            c.limits = vec!["--memory", "64M"];
            c.expect = Expect::Oom(if e2b { E2B_MEMORY } else { "64 MiB" });
        }
        "kernel_buffer_bomb" => {
            c.limits = vec!["--memory", "64M"];
            c.expect = Expect::ReportOrOom;
        }
        "fs_watch" => c.limits = vec!["--disk", "64M"],
        "thread_bomb" => {
            c.limits = vec!["--pids", "64"];
            c.args = vec![
                "--cap-threads".into(),
                if e2b { E2B_PIDS } else { "64" }.into(),
            ];
        }
        "disk_fill" => {
            let disk: u64 = if e2b { E2B_DISK } else { 32 << 20 };
            c.args = vec!["--limit-bytes".into(), disk.to_string()];
            c.limits = vec!["--disk", "32M"];
            c.detail_contains = vec!["/: wrote", "/tmp: wrote", "/dev/shm: wrote", "ENOSPC"];
            c.disk = Some(disk);
            if e2b {
                // 1 GiB of disk in memory-backed layers under a 512 MiB
                // memory limit: the memory limit may end it first.
                c.expect = Expect::ReportOrOom;
                c.detail_contains.clear();
            }
        }
        "inode_fill" => {
            c.limits = vec!["--disk", "32M", "--memory", "64M"];
            c.expect = Expect::ReportOrOom;
        }
        "fd_exhaust" => c.expect = Expect::ReportOrOom,
        // A sandbox with no network must have nothing but loopback. (What a
        // networked sandbox can reach is attacked in tests/network.rs and
        // crates/net/tests/world.rs: the host, private ranges, metadata,
        // other sandboxes; in E2B's networked sandboxes the program tries
        // a listener on the host.)
        "network_egress" => c.limits = vec!["--network", "none"],
        // The daemon it leaves must not keep brig (or the sandbox) alive.
        "orphan_daemon" => c.within = Duration::from_secs(20),
        // As the sandbox's root, kill(-1, SIGKILL) takes `sudo` (its
        // parent, the exec's process) with it: the exec ends with 137
        // before the program reports. What is judged is the rest: pid 1
        // (the agent) survived, so the sandbox still runs commands, and
        // the host is intact.
        "kill_all" if mode == Mode::E2bRoot => c.expect = Expect::Killed,
        "cpu_spin" => {
            c.timeout = "2s";
            c.expect = Expect::Timeout(Duration::from_secs(5));
        }
        _ => {}
    }
    if let Mode::Tier(tier) = mode {
        own_kernel_expectations(&mut c, tier);
    }
    c
}

/// Where a tier with its own kernel legitimately differs from the process
/// tier (docs/threat-model.md, "The corpus on the gvisor and vm tiers").
fn own_kernel_expectations(c: &mut Case, tier: Isolation) {
    let gvisor = tier == Isolation::Gvisor;
    let why: Option<&'static str> = match c.program {
        // brig's seccomp policy is the process tier's; inside gVisor its
        // kernel answers every call itself (ENOSYS, EACCES, or an
        // implementation of its own), and in a guest the guest's kernel.
        "denied_syscalls" | "seccomp_abi_bypass" | "io_uring" | "keyring" | "nested_userns"
        | "perf_event" | "bpf" | "userfaultfd" | "kernel_modules" | "open_by_handle"
        | "mount_escape" | "clock_change" | "raw_socket" | "setns_escape" => {
            Some("the sandbox's own kernel answers these calls; brig's seccomp policy is not applied there")
        }
        // Its /proc/self/status has no NoNewPrivs/Seccomp/CapAmb lines and
        // uid_map is the identity of gVisor's own user namespace.
        "capabilities" | "setuid_escalation" | "ptrace_attach" | "cgroup_escape" | "chroot_breakout" => Some(
            "the identity is that kernel's (gVisor: its own initial user namespace, no NoNewPrivs or Seccomp lines; a guest: the command is the guest's root, the guest is the boundary)",
        ),
        "dev_access" => Some("the devices are that kernel's (gVisor's own FUSE, whose mknod'ed nodes open nothing; the guest's own /dev)"),
        // The guest's own processes (its init, the agent) have the
        // guest's root; /sys is the guest kernel's.
        "proc_root_tricks" if !gvisor => Some("other processes of the guest have the guest's own root, not the host's"),
        "sysfs_write" if !gvisor => Some("/sys is the guest kernel's: what it changes is the guest"),
        "kernel_info_leak" => Some("syslog reads that kernel's own log (gVisor's invented one, the guest's boot)"),
        "proc_environ" => Some("pid 1 (the agent) is in that kernel's root pid namespace; the canary is never seen"),
        "proc_sys_write" => Some("/proc/sys is that kernel's: writes change the sandbox's own kernel"),
        "proc_exe_overwrite" => Some("/proc/*/exe is the program's own copy in the sandbox; no host binary is there"),
        "core_dump" => Some("RLIMIT_CORE and core_pattern are that kernel's (gVisor writes no core files; a guest's land in the guest)"),
        "fd_exhaust" => Some("descriptors are that kernel's (gVisor's table, bounded by the memory limit), not the host's file table"),
        // Limits counted by gVisor's kernel or by the host's cgroup on
        // gVisor's threads, not per sandbox task.
        "fork_bomb" | "thread_bomb" if gvisor => {
            c.expect = Expect::Ends;
            Some("the pids limit counts gVisor's host threads, not the sandbox's tasks: a bomb runs until --timeout or the memory limit")
        }
        "disk_fill" if gvisor => {
            c.detail_contains.clear();
            c.disk = None;
            c.expect = Expect::Ends;
            Some("/tmp and /dev/shm are gVisor's memory-backed tmpfs, bounded by --memory, not --disk")
        }
        _ => None,
    };
    if why.is_some() {
        c.own_kernel = why;
    }
    // Killing pid 1 from inside, or gVisor's OOM (which takes the whole
    // sandbox), ends that sandbox; it must not harm the daemon or the host.
    if gvisor
        && matches!(
            c.program,
            "kill_all" | "pid1_attack" | "fs_watch" | "kernel_buffer_bomb" | "inode_fill"
        )
    {
        c.expect = Expect::Ends;
    }
    if gvisor && matches!(c.program, "memory_bomb" | "memfd_bomb" | "shm_bomb") {
        c.expect = Expect::Ends;
    }
    // gVisor's descriptor table holds 1048576 (runsc's RLIMIT_NOFILE):
    // opening them all on the ptrace platform takes 30 s quiet, more than
    // a minute on a loaded host. What matters is that the host's file
    // table never notices: 15 s of it, then --timeout.
    if gvisor && c.program == "fd_exhaust" {
        c.expect = Expect::Ends;
        c.timeout = "15s";
    }
}

// ---------------------------------------------------------------------------
// Which layer refuses: the attribution pass.

/// The attribution pass's mark (`BRIG_HOSTILE_SECCOMP_MARK`), if this run
/// is one: `tests/hostile/matrix.sh --attribution` runs the `brig run`
/// modes with a knockout build of brig whose seccomp filter adds the mark
/// to every errno it returns (clone3's ENOSYS aside:
/// `brig_jail::seccomp::with_errnos_shifted_but_hide`), and each program's
/// errno helper counts the refusals it met by layer
/// (`brig_hostile::attribute`), ending its report's detail with "refused
/// by the seccomp filter: F, by the kernel: K".
fn seccomp_mark() -> Option<String> {
    std::env::var("BRIG_HOSTILE_SECCOMP_MARK").ok()
}

/// Which layer must refuse a program in the attribution pass, judged from
/// its F and K. Refusals by the kernel are EPERM, EACCES and EROFS; other
/// errnos (ENOENT, ESRCH, EAGAIN, ENOSPC, EMFILE, ENETUNREACH, ETXTBSY,
/// ENOSYS...) are a view without the thing or a limit, and count for no
/// layer.
#[derive(Debug, Clone, Copy)]
enum Layer {
    /// The seccomp filter alone: F ≥ 1, K = 0.
    Filter,
    /// The kernel alone: K ≥ 1, F = 0; the rule that refuses.
    Kernel(&'static str),
    /// Both: F ≥ 1 and K ≥ 1; which calls each refuses.
    Both(&'static str),
    /// No refusal at all: F = K = 0; what contains the program instead (a
    /// limit, a view, the timeout).
    Neither(&'static str),
}

impl Layer {
    fn holds(self, filter: u64, kernel: u64) -> bool {
        match self {
            Layer::Filter => filter > 0 && kernel == 0,
            Layer::Kernel(_) => filter == 0 && kernel > 0,
            Layer::Both(_) => filter > 0 && kernel > 0,
            Layer::Neither(_) => filter == 0 && kernel == 0,
        }
    }

    /// The name matrix.sh's table shows.
    fn name(self) -> &'static str {
        match self {
            Layer::Filter => "filter",
            Layer::Kernel(_) => "kernel",
            Layer::Both(_) => "both",
            Layer::Neither(_) => "neither",
        }
    }

    fn describe(self) -> String {
        match self {
            Layer::Filter => "the seccomp filter alone (F ≥ 1, K = 0)".into(),
            Layer::Kernel(why) => format!("the kernel alone (F = 0, K ≥ 1): {why}"),
            Layer::Both(why) => format!("both (F ≥ 1, K ≥ 1): {why}"),
            Layer::Neither(why) => format!("neither (F = K = 0): {why}"),
        }
    }
}

/// pid 1 of a `brig run` sandbox is brig's init, cloned before the
/// sandbox's user namespace existed: it belongs to the host's.
const PID1: &str = "pid 1 (brig's init) belongs to the host's user namespace: access to it needs CAP_SYS_PTRACE there";
const MEMORY_KILLS_IT: &str =
    "the memory limit kills it (exit 137) before it reports: no errno to count";

/// The layer each program meets under `brig run` on `template` (measured:
/// docs/threat-model.md, "Which layer refused"); `None` for a program
/// without an entry, which `every_hostile_program_has_a_layer` refuses.
/// Other modes are not judged: the mark reaches only sandboxes that a
/// marked brig builds, and those modes differ by design (brig-agent as pid
/// 1, E2B's capabilities, another kernel). file_race runs only in a
/// daemon's sandbox (`file_api::daemon`), whose daemon carries the mark.
fn layer(program: &str, template: Template) -> Option<Layer> {
    use Layer::*;
    let host = template == Template::Host;
    Some(match program {
        // The filter, and nothing reaches a kernel check.
        "bpf" | "clock_change" | "io_uring" | "kernel_modules" | "keyring" | "mount_escape"
        | "open_by_handle" | "perf_event" => Filter,
        // Mounting cgroupfs; no cgroup filesystem is in the view to write.
        "cgroup_escape" => Filter,
        // fanotify_init; inotify watches end at the tmpfs's inode count
        // (ENOSPC, a limit).
        "fs_watch" => Filter,
        // The family rule refuses AF_CAN, TIPC, RDS... and AF_ALG. SCTP, DCCP
        // and the unknown binary format reach the kernel, whose answers
        // (EPROTONOSUPPORT, ESOCKTNOSUPPORT, ENOEXEC) are no refusal: what
        // keeps a module from loading there is the harness's /proc/modules
        // check (and, on a kernel without modules, that kernel).
        "module_autoload" => Filter,
        // x32 numbers meet the filter's horizon (the program checks each
        // under the mark); int 0x80 is killed by its arch check (SIGSYS,
        // not an errno).
        "seccomp_abi_bypass" => Filter,
        // TIOCSTI and TIOCLINUX on the piped descriptors: the ioctl rules.
        "tiocsti" => Filter,
        // /dev/userfaultfd is not in the view (ENOENT).
        "userfaultfd" => Filter,
        "write_template" if !host => Filter, // writes land in the private layer; the remount is the mount rule's

        "write_template" => Both("filter: the remount of /usr (mount); kernel: creating files, mkdir, chmod and setxattr meet the read-only binds (EROFS), opening for writing meets files of host root, unmapped (EACCES)"),
        "raw_socket" => Both("filter: the three AF_PACKET sockets (the family rule); kernel: AF_INET and AF_INET6 SOCK_RAW need CAP_NET_RAW, which the set drops (EPERM), and the ICMP ping socket (information) is outside net.ipv4.ping_group_range (EACCES)"),
        "kernel_info_leak" => Both("filter: syslog(2); kernel: /proc/kmsg, /proc/self/stack and the root-only tables listed for information are host root's, unmapped (EACCES)"),
        "setns_escape" => Both("filter: every setns (the namespace files of self and pid 1, and pid 1's pidfd); kernel: opening /proc/1/ns/*, pid 1 being the host user namespace's (EACCES)"),
        "denied_syscalls" => Both("filter: every call of the policy (the program checks each one under the mark; clone3's ENOSYS stays unmarked); kernel: unshare(CLONE_NEWNS) and unshare(CLONE_NEWNET), listed for information, need CAP_SYS_ADMIN (EPERM)"),
        "nested_userns" => Both("filter: unshare and clone with CLONE_NEWUSER (each checked by the program; clone3's ENOSYS stays unmarked); kernel: unshare of the other namespaces alone, listed for information, needs CAP_SYS_ADMIN (EPERM)"),

        "capabilities" => Kernel("capset and the ambient raise of CAP_SYS_ADMIN: not in the bounding set (EPERM)"),
        "core_dump" => Kernel("raising RLIMIT_CORE's hard limit needs CAP_SYS_RESOURCE, not in the set (EPERM)"),
        "fd_exhaust" => Kernel("raising RLIMIT_NOFILE's hard limit needs CAP_SYS_RESOURCE, not in the set (EPERM); then EMFILE, the limit"),
        "dev_access" => Kernel("mknod of a device needs CAP_MKNOD in the initial user namespace (EPERM); the host's devices are not in the view (ENOENT)"),
        "hostname_change" => Kernel("sethostname and setdomainname need CAP_SYS_ADMIN, not in the set (EPERM); the uts namespace is the second layer"),
        "proc_sys_write" => Kernel("/proc/sys is bound read-only (EROFS) and the host-wide knobs are host root's, unmapped (EACCES)"),
        "sysfs_write" => Kernel("/sys is read-only (EROFS) and its files are host root's, unmapped (EACCES)"),
        "setuid_escalation" => Kernel("/dev/shm is noexec (EACCES); elsewhere the setuid and file-capability copies run, unprivileged under no_new_privs and nosuid, which no errno shows"),
        "pid1_attack" | "proc_environ" | "proc_root_tricks" | "ptrace_attach" => Kernel(PID1),
        // /proc/1/exe is brig itself on the host; our own exe is busy
        // (ETXTBSY, no refusal).
        "proc_exe_overwrite" => Kernel(PID1),
        "symlink_tricks" if host => Kernel("links through /proc/1/root and /proc/1/cwd: pid 1 is the host user namespace's (EACCES); /etc/shadow is host root's, unmapped (EACCES)"),
        "symlink_tricks" => Kernel("links through /proc/1/root and /proc/1/cwd: pid 1 is the host user namespace's (EACCES)"),
        "read_host_files" if host => Kernel("/etc/shadow and /etc/gshadow are host root's, unmapped (EACCES); the rest of the host is not in the view (ENOENT)"),
        "file_race" => Kernel("mknod of a device needs CAP_MKNOD in the initial user namespace (EPERM)"),

        "read_host_files" => Neither("a view: nothing of the host is in the dir template's root, whose /etc/shadow is its own"),
        "fork_bomb" | "thread_bomb" => Neither("the pids limit: EAGAIN (fork_bomb: or the memory limit's kill)"),
        "memory_bomb" | "memfd_bomb" | "shm_bomb" => Neither(MEMORY_KILLS_IT),
        "kernel_buffer_bomb" => Neither("the memory cgroup and RLIMIT_NOFILE: EMFILE, ENOMEM, EAGAIN, or the memory limit's kill"),
        "disk_fill" => Neither("the tmpfs sizes (--disk): ENOSPC"),
        "inode_fill" => Neither("the tmpfs inode count: ENOSPC (or the memory limit's kill)"),
        "cpu_spin" => Neither("--timeout kills it (exit 124) before it reports"),
        "dotdot_traversal" => Neither("pivot_root: `..` of the root is the root, nothing to refuse"),
        "chroot_breakout" => Neither("chroot is allowed (CAP_SYS_CHROOT of the sandbox's user namespace); pivot_root left nothing above the root for the walk to reach"),
        "network_egress" => Neither("a network namespace with only lo: ENETUNREACH, a view"),
        "unix_socket_escape" => Neither("the network namespace scopes abstract sockets (ECONNREFUSED); the host's socket paths are not in the view (ENOENT)"),
        "cross_sandbox" => Neither("the other sandbox's namespaces: the probe finds nothing (ENOENT, ECONNREFUSED)"),
        "kill_all" => Neither("the pid namespace: kill(-1) reaches only the sandbox's processes; pid 1 ignores signals it has no handler for"),
        "orphan_daemon" => Neither("the pid namespace: the daemon dies with the sandbox's init"),
        "cgroup_leak" => Neither("a view: the cgroup namespace shows /"),
        "inherited_fds" | "env_leak" => Neither("brig passes nothing beyond stdio and the command's own environment"),
        "mountinfo" => Neither("information only"),
        _ => return None,
    })
}

/// The attribution pass's check of one report: its counts against the
/// program's declared layer. Each check also prints one line, `attribution:
/// WHERE PROGRAM: filter F, kernel K; declared LAYER: ok|MISMATCH` (WHERE:
/// `host` or `dir` for `brig run`, else the mode), from which
/// tests/hostile/matrix.sh makes its table. Nothing outside the pass; the
/// callers call it for the modes [`layer`] covers.
fn layer_failures(program: &str, mode: Mode, report: Option<&serde_json::Value>) -> Vec<String> {
    if seccomp_mark().is_none() {
        return vec![];
    }
    let declared = layer(program, mode.template())
        .unwrap_or_else(|| panic!("{program} has no entry in layer()"));
    let counts = report.map(|r| refusal_counts(r["detail"].as_str().unwrap_or_default()));
    let failure = match counts {
        None if matches!(declared, Layer::Neither(_)) => None,
        None => Some("no report to count refusals in".to_string()),
        Some(None) => {
            Some("the report has no refusal counts (was the program given --seccomp-mark?)".into())
        }
        Some(Some((f, k))) if !declared.holds(f, k) => Some(format!(
            "refused by the seccomp filter {f} times and by the kernel {k} times"
        )),
        Some(Some(_)) => None,
    };
    eprintln!(
        "attribution: {} {program}: {}; declared {}: {}",
        match mode {
            Mode::Run(t) => t.program_arg(),
            other => other.program_arg(),
        },
        match counts {
            Some(Some((f, k))) => format!("filter {f}, kernel {k}"),
            _ => "no counts".into(),
        },
        declared.name(),
        if failure.is_some() { "MISMATCH" } else { "ok" }
    );
    failure
        .map(|f| {
            format!(
                "LAYER: {f}, but the declared layer is {} (a brig that is not a knockout build \
                 marks nothing: the filter's refusals then count as the kernel's)",
                declared.describe()
            )
        })
        .into_iter()
        .collect()
}

/// F and K from a report's detail, which ends "refused by the seccomp
/// filter: F, by the kernel: K" in the attribution pass.
fn refusal_counts(detail: &str) -> Option<(u64, u64)> {
    let (_, counts) = detail.rsplit_once("refused by the seccomp filter: ")?;
    let (f, k) = counts.split_once(", by the kernel: ")?;
    let number = |s: &str| {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    };
    Some((number(f)?, number(k)?))
}

// ---------------------------------------------------------------------------
// Running a program in a sandbox.

/// A running `brig run` with a hostile program uploaded into it.
struct Launch {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    started: Instant,
}

/// The outcome of one sandbox run.
#[derive(Debug)]
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
    hung: bool,
}

impl Finished {
    /// The program's JSON report: the last stdout line that parses.
    fn report(&self) -> Option<serde_json::Value> {
        self.stdout.lines().rev().find_map(|l| {
            // On a terminal the line may follow other output.
            let l = l.find("{\"program\"").map_or(l, |at| &l[at..]);
            serde_json::from_str::<serde_json::Value>(l.trim())
                .ok()
                .filter(|v| v.get("program").is_some())
        })
    }

    fn describe(&self) -> String {
        format!(
            "exit {:?} after {:.1?}{}\n--- stdout\n{}\n--- stderr\n{}",
            self.code,
            self.elapsed,
            if self.hung { " (HUNG, killed)" } else { "" },
            self.stdout.trim_end(),
            self.stderr.trim_end()
        )
    }
}

/// The shell line that receives the program on stdin and runs it (with
/// `sudo` in front for the E2B root mode).
const UPLOAD: &str = "cat > /tmp/h && chmod +x /tmp/h && exec /tmp/h \"$@\"";
const UPLOAD_SUDO: &str = "cat > /tmp/h && chmod +x /tmp/h && exec sudo -n /tmp/h \"$@\"";

/// `brig run` with the program uploaded into it.
fn launch_run(
    template_arg: &str,
    brig_args: &[&str],
    program: &str,
    program_args: &[String],
) -> Launch {
    let mut cmd = brig();
    cmd.arg("run")
        .arg("-i")
        .arg("--template")
        .arg(template_arg)
        .args(brig_args)
        .args(["--", "/bin/sh", "-c", UPLOAD, "sh"])
        .args(program_args);
    launch(cmd, program)
}

/// Start `cmd` (a brig that runs [`UPLOAD`] in a sandbox) and feed it the
/// program's binary on stdin.
fn launch(cmd: Command, program: &str) -> Launch {
    launch_with(cmd, program, true, true)
}

/// [`launch`], with the program fed on stdin only if `feed`, and stdout
/// and stderr captured only if `capture` (else they stay as `cmd` has
/// them: a terminal).
fn launch_with(mut cmd: Command, program: &str, feed: bool, capture: bool) -> Launch {
    let exe = programs_dir().join(program);
    let binary = std::fs::read(&exe).unwrap_or_else(|e| panic!("read {}: {e}", exe.display()));
    if let Some(mark) = seccomp_mark() {
        cmd.env("BRIG_SECCOMP_MARK", mark);
    }
    cmd.env(CANARY_ENV, "host-secret-that-must-not-leak");
    if feed {
        cmd.stdin(Stdio::piped());
    }
    if capture {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("spawn brig");
    if let Some(mut stdin) = child.stdin.take() {
        std::thread::spawn(move || {
            // A sandbox that fails early closes the pipe; its exit tells why.
            let _ = stdin.write_all(&binary);
        });
    }
    let (tx, lines) = mpsc::channel();
    if let Some(stdout) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
    }
    let (tx, stderr) = mpsc::channel();
    if let Some(mut err) = child.stderr.take() {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            let _ = tx.send(s);
        });
    }
    Launch {
        child,
        lines,
        stderr,
        started: Instant::now(),
    }
}

impl Launch {
    /// Wait for brig to exit, killing it after `limit`.
    fn finish(mut self, limit: Duration) -> Finished {
        let mut hung = false;
        let status = loop {
            if let Some(st) = self.child.try_wait().expect("wait for brig") {
                break st;
            }
            if self.started.elapsed() > limit {
                hung = true;
                let _ = self.child.kill();
                break self.child.wait().expect("wait for brig");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = self.started.elapsed();
        // brig has exited, but its output may still be in the pipes: read
        // to end of file. A sandbox process that outlived brig could hold
        // the pipes open, so give up after a few seconds (the leftover
        // check reports such a process).
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut stdout = Vec::new();
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            stdout.push(line);
        }
        let stderr = self
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .unwrap_or_default();
        Finished {
            code: status.code(),
            stdout: stdout.join("\n"),
            stderr,
            elapsed,
            hung,
        }
    }

    /// The next stdout line, waiting at most `limit`.
    fn next_line(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }
}

/// A fresh marker for one run, passed as `--run-id=...` so that every
/// process of the run carries it in its argv.
fn run_id(program: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "brighostile{}{}x{}",
        std::process::id(),
        nanos % 1_000_000_000,
        program.len()
    )
}

fn program_args(case: &Case, mode: Mode, id: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    a.extend(case.args.iter().cloned());
    // --armed: destructive programs run only when told, and only inside a
    // user namespace; here they are meant to run.
    a.extend([
        "--armed".to_string(),
        "--template".to_string(),
        mode.template().program_arg().to_string(),
        "--mode".to_string(),
        mode.program_arg().to_string(),
        format!("--run-id={id}"),
        // How the own-kernel tiers' programs tell they are not on the host.
        "--host-kernel".to_string(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
    ]);
    // The attribution pass (a knockout build of brig; see [`layer`]).
    if let Some(mark) = seccomp_mark() {
        a.extend(["--seccomp-mark".to_string(), mark]);
    }
    a
}

// ---------------------------------------------------------------------------
// The host, before and after.

/// The host's state before a run, and the canaries planted for it.
struct HostWatch {
    hostname: String,
    proc_hostname: String,
    wall: SystemTime,
    mono: Instant,
    canary_process: Child,
    /// A host terminal, so that a sandbox sharing the host's devpts would
    /// see one.
    _canary_pty: Option<std::os::fd::OwnedFd>,
    passwd: Vec<u8>,
    /// The host's loaded modules (a sandbox must not get one loaded).
    modules: std::collections::BTreeSet<String>,
    template_root: PathBuf,
    template_passwd: Vec<u8>,
}

impl HostWatch {
    fn start(template: Template) -> HostWatch {
        plant_canary_files();
        canary_socket();
        let canary_process = Command::new("/bin/sleep")
            .arg0(CANARY)
            .arg("600")
            .env(CANARY_ENV, "host-secret-that-must-not-leak")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn the canary process");
        let template_root = template.host_root();
        HostWatch {
            hostname: hostname(),
            proc_hostname: std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default(),
            wall: SystemTime::now(),
            mono: Instant::now(),
            canary_process,
            _canary_pty: host_pty(),
            passwd: std::fs::read("/etc/passwd").unwrap_or_default(),
            modules: host_modules(),
            template_passwd: std::fs::read(template_root.join("etc/passwd")).unwrap_or_default(),
            template_root,
        }
    }

    /// Everything wrong with the host now; empty if all is well. Waits up
    /// to 5 s for the run's processes to disappear.
    fn finish(mut self, ids: &[&str]) -> Vec<String> {
        let mut problems = Vec::new();
        match Command::new("/bin/true").status() {
            Ok(s) if s.success() => {}
            other => problems.push(format!(
                "the host cannot fork/exec /bin/true afterwards: {other:?}"
            )),
        }
        let now = hostname();
        if now != self.hostname {
            problems.push(format!(
                "host hostname changed: {:?} -> {now:?} (restored)",
                self.hostname
            ));
            // SAFETY: a valid buffer and length; we are root.
            unsafe { libc::sethostname(self.hostname.as_ptr().cast(), self.hostname.len()) };
        }
        let proc_now = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        if proc_now.trim() != self.proc_hostname.trim() {
            problems.push(format!(
                "/proc/sys/kernel/hostname changed: {:?} -> {proc_now:?}",
                self.proc_hostname
            ));
        }
        let wall = SystemTime::now()
            .duration_since(self.wall)
            .map(|d| d.as_secs_f64())
            .unwrap_or_else(|e| -e.duration().as_secs_f64());
        let mono = self.mono.elapsed().as_secs_f64();
        if (wall - mono).abs() > 2.0 {
            problems.push(format!(
                "host clock moved: {wall:.1}s of wall time passed during {mono:.1}s"
            ));
        }
        for f in CANARY_FILES {
            match std::fs::read_to_string(f) {
                Ok(s) if s == CANARY_CONTENT => {}
                other => problems.push(format!("canary {f} changed: {other:?}")),
            }
        }
        match self.canary_process.try_wait() {
            Ok(None) => {}
            other => problems.push(format!("the host canary process died: {other:?}")),
        }
        let loaded: Vec<String> = host_modules().difference(&self.modules).cloned().collect();
        if !loaded.is_empty() {
            problems.push(format!("kernel modules were loaded meanwhile: {loaded:?}"));
        }
        if std::fs::read("/etc/passwd").unwrap_or_default() != self.passwd {
            problems.push("host /etc/passwd changed".into());
        }
        if std::fs::read(self.template_root.join("etc/passwd")).unwrap_or_default()
            != self.template_passwd
        {
            problems.push(format!(
                "{}/etc/passwd changed",
                self.template_root.display()
            ));
        }
        for rel in PLANTED_IN_TEMPLATE {
            let p = self.template_root.join(rel);
            if p.symlink_metadata().is_ok() {
                problems.push(format!("{} appeared on the host", p.display()));
            }
        }
        if !eventually(Duration::from_secs(5), || {
            orphaned_sandbox_processes().is_empty()
        }) {
            problems.push(format!(
                "processes with sandbox uids run with no brig above them: {:?}",
                orphaned_sandbox_processes()
            ));
        }
        let leftovers = |ids: &[&str]| -> Vec<String> {
            ids.iter().flat_map(|id| processes_with(id)).collect()
        };
        if !eventually(Duration::from_secs(5), || leftovers(ids).is_empty()) {
            problems.push(format!(
                "processes of the sandbox outlived brig: {:?}",
                leftovers(ids)
            ));
        }
        problems
    }
}

impl Drop for HostWatch {
    fn drop(&mut self) {
        let _ = self.canary_process.kill();
        let _ = self.canary_process.wait();
    }
}

/// Write the canary files once per test process. Another process may be
/// doing the same: each writes a private temporary file and renames it over
/// the canary, so readers only ever see the full content.
fn plant_canary_files() {
    static PLANTED: OnceLock<()> = OnceLock::new();
    PLANTED.get_or_init(|| {
        use std::os::unix::fs::PermissionsExt;
        for f in CANARY_FILES {
            if std::fs::read_to_string(f).ok().as_deref() != Some(CANARY_CONTENT) {
                let tmp = format!("{f}.tmp{}", std::process::id());
                std::fs::write(&tmp, CANARY_CONTENT).unwrap_or_else(|e| panic!("plant {f}: {e}"));
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
                    .unwrap_or_else(|e| panic!("plant {f}: {e}"));
                std::fs::rename(&tmp, f).unwrap_or_else(|e| panic!("plant {f}: {e}"));
            }
        }
    });
}

/// The names of the host's loaded kernel modules.
fn host_modules() -> std::collections::BTreeSet<String> {
    std::fs::read_to_string("/proc/modules")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn hostname() -> String {
    // SAFETY: zeroed utsname is valid; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid out-pointer.
    unsafe { libc::uname(&mut u) };
    // SAFETY: the kernel NUL-terminates nodename.
    unsafe { std::ffi::CStr::from_ptr(u.nodename.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// Open a pseudo-terminal on the host (its /dev/pts/N exists while the
/// master is open).
fn host_pty() -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: posix_openpt takes flags only.
    let fd = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    // SAFETY: fd was just opened and is owned by nobody else.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Listen on the abstract socket `@brig-hostile-canary` for the rest of
/// this process. Another test process may hold it already: then the
/// canary exists all the same.
fn canary_socket() {
    static SOCKET: OnceLock<Option<std::os::unix::net::UnixListener>> = OnceLock::new();
    SOCKET.get_or_init(|| {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(CANARY.as_bytes()).ok()?;
        std::os::unix::net::UnixListener::bind_addr(&addr).ok()
    });
}

/// A field of /proc/<pid>/status, first number only.
fn status_number(pid: u32, field: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Processes running under a sandbox uid (host uid >= 0x10000000) whose
/// nearest ancestor outside that range is pid 1: sandbox processes that
/// outlived whatever spawned them. Unlike the run-id check this
/// also catches processes of other sandboxes (this suite runs several at
/// once, so only orphans count).
fn orphaned_sandbox_processes() -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if status_number(pid, "Uid:").is_none_or(|u| u < SANDBOX_UID_BASE) {
            continue;
        }
        let mut p = pid;
        let anchored = loop {
            let Some(parent) = status_number(p, "PPid:") else {
                break true; // gone meanwhile
            };
            if parent == 0 {
                break false;
            }
            // The first host process above: the brig (or test binary, or
            // daemon) that spawned the sandbox. An orphan, whose spawner
            // died without taking it along, hangs from pid 1 instead.
            // (Another test binary's live sandboxes are not this test's
            // business: the suites run side by side.)
            if status_number(parent, "Uid:").is_none_or(|u| u < SANDBOX_UID_BASE) {
                // A daemon's sandbox outlives the daemon by design (it
                // waits to be re-adopted): not an orphan while the home
                // that owns it exists; once that is gone, nobody will.
                break parent != 1 || daemon_owned(p);
            }
            p = parent;
        };
        if !anchored {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            found.push(format!("pid {pid} ({})", comm.trim()));
        }
    }
    found
}

/// Whether `pid` (a sandbox's top process) is a daemon's sandbox whose
/// daemon home still exists: the first line of its state file names the
/// daemon's database (`/run/brig/sb/<id>/state` for the process tier, in
/// cgroup `brig/<id>`; `/run/brig/vm/<id>/state` for a vm's QEMU, in
/// `brig-vm/<id>`).
fn daemon_owned(pid: u32) -> bool {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let Some((tier, id)) = cgroups.lines().find_map(|l| {
        let path = l.rsplit(':').next()?;
        [("/brig/", "sb"), ("/brig-vm/", "vm")]
            .iter()
            .find_map(|(parent, tier)| {
                let after = &path[path.find(parent)? + parent.len()..];
                after.split('/').next().map(|id| (*tier, id.to_string()))
            })
    }) else {
        return false;
    };
    std::fs::read_to_string(format!("/run/brig/{tier}/{id}/state")).is_ok_and(|s| {
        s.lines()
            .next()
            .is_some_and(|db| std::path::Path::new(db).exists())
    })
}

/// Host processes whose argv carries `id`, with their uid.
fn processes_with(id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let argv = String::from_utf8_lossy(&argv).replace('\0', " ");
        if argv.contains(id) {
            let uid = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| {
                    l.strip_prefix("Uid:")
                        .and_then(|v| v.split_whitespace().next())
                        .and_then(|u| u.parse::<u32>().ok())
                })
                .unwrap_or(0);
            let range = if uid >= SANDBOX_UID_BASE {
                "sandbox uid"
            } else {
                "uid"
            };
            found.push(format!("pid {pid} ({range} {uid}): {}", argv.trim()));
        }
    }
    found
}

// ---------------------------------------------------------------------------
// Sandboxes of a daemon.

/// A `brig serve` of this test's own (with E2B's API for the E2B modes) in
/// a fresh home that shares the built templates, started with the host
/// secret in its environment.
struct Daemon {
    child: Child,
    url: String,
    e2b_api: Option<String>,
    /// The E2B data plane (`host:port`) and each E2B sandbox's envd token.
    e2b_sandboxes: Option<String>,
    tokens: std::sync::Mutex<std::collections::HashMap<String, String>>,
    key: String,
    home: tempfile::TempDir,
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Daemon {
    fn start(e2b: bool) -> Daemon {
        let home = tempfile::tempdir().expect("a daemon home");
        std::os::unix::fs::symlink(
            support::template_home().join("templates"),
            home.path().join("templates"),
        )
        .expect("link the built templates");
        let mut cmd = brig();
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--prepare", "none"])
            .env(CANARY_ENV, "host-secret-that-must-not-leak");
        // The attribution pass: the daemon builds the sandboxes, so it is
        // the brig that must mark its filter (file_race's layer).
        if let Some(mark) = seccomp_mark() {
            cmd.env("BRIG_SECCOMP_MARK", mark);
        }
        if e2b {
            cmd.args([
                "--e2b",
                "--e2b-api",
                "127.0.0.1:0",
                "--e2b-sandbox",
                "127.0.0.1:0",
            ]);
        }
        let (child, url, mut lines) = support::start_daemon_with(cmd, home.path());
        let e2b_api = e2b.then(|| loop {
            let line = lines.next().expect("brig serve exited").unwrap();
            if let Some(a) = line.strip_prefix("brig: e2b api on ") {
                break a.to_string();
            }
        });
        let e2b_sandboxes = e2b.then(|| loop {
            let line = lines.next().expect("brig serve exited").unwrap();
            if let Some(a) = line.strip_prefix("brig: e2b sandboxes on http://") {
                break a.to_string();
            }
        });
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&log);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let key = std::fs::read_to_string(home.path().join("local.key"))
            .expect("the daemon's local key")
            .trim()
            .to_string();
        Daemon {
            child,
            url,
            e2b_api,
            e2b_sandboxes,
            tokens: Default::default(),
            key,
            home,
            log,
        }
    }

    fn brig(&self) -> Command {
        let mut c = brig();
        c.env("BRIG_URL", &self.url)
            .env("BRIG_HOME", self.home.path())
            .env_remove("BRIG_API_KEY");
        c
    }

    /// A sandbox for `case`: through E2B's API (E2B's defaults) in the
    /// E2B modes, else `brig create` with the case's limits.
    fn create(&self, mode: Mode, case: &Case) -> String {
        if let Some(api) = &self.e2b_api {
            let reply: serde_json::Value = ureq::post(&format!("{api}/sandboxes"))
                .set("X-API-Key", &self.key)
                .send_json(serde_json::json!({ "templateID": "base", "timeout": 300 }))
                .unwrap_or_else(|e| {
                    panic!("E2B create for {}: {e}\n{}", mode.describe(), self.log())
                })
                .into_json()
                .expect("E2B create's answer");
            let id = reply["sandboxID"]
                .as_str()
                .unwrap_or_else(|| panic!("no sandboxID in {reply}"))
                .to_string();
            if let Some(token) = reply["envdAccessToken"].as_str() {
                self.tokens
                    .lock()
                    .unwrap()
                    .insert(id.clone(), token.to_string());
            }
            return id;
        }
        let mut cmd = self.brig();
        cmd.args(["create", "--timeout", "5m"]);
        if let Mode::Tier(t) = mode {
            cmd.args(["--isolation", t.name()]);
            if let Some(template) = mode.template().brig_arg() {
                cmd.args(["--template", &template]);
            }
        }
        let out = cmd.args(&case.limits).output().expect("run brig create");
        assert!(
            out.status.success(),
            "brig create {:?}: {}\n{}",
            case.limits,
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `brig exec -i` of the program in `sandbox` (as `user`, and through
    /// `sudo` for the E2B root mode).
    fn exec(&self, mode: Mode, sandbox: &str, case: &Case, program_args: &[String]) -> Launch {
        let mut cmd = self.brig();
        cmd.args(["exec", "-i", "--timeout", case.timeout]);
        if mode.e2b() {
            cmd.args(["-u", "user"]);
        }
        let upload = if mode == Mode::E2bRoot {
            UPLOAD_SUDO
        } else {
            UPLOAD
        };
        cmd.arg(sandbox)
            .args(["--", "/bin/sh", "-c", upload, "sh"])
            .args(program_args);
        launch(cmd, case.program)
    }

    /// An E2B sandbox's envd: the data plane's address and its token.
    fn envd(&self, sandbox: &str) -> (String, String) {
        let plane = self.e2b_sandboxes.clone().expect("an E2B daemon");
        let token = self.tokens.lock().unwrap()[sandbox].clone();
        (plane, token)
    }

    /// Put `program` at /tmp/h in `sandbox` (as `user` in the E2B modes),
    /// through `brig exec -i`; what went wrong, if anything.
    fn upload(&self, mode: Mode, sandbox: &str, program: &str) -> Option<String> {
        let mut cmd = self.brig();
        cmd.args(["exec", "-i"]);
        if mode.e2b() {
            cmd.args(["-u", "user"]);
        }
        cmd.arg(sandbox)
            .args(["--", "/bin/sh", "-c", "cat > /tmp/h && chmod +x /tmp/h"]);
        let done = launch(cmd, program).finish(Duration::from_secs(60));
        (done.code != Some(0)).then(|| format!("uploading {program} failed: {}", done.describe()))
    }

    /// Delete `sandbox`; what went wrong, if anything.
    fn remove(&self, sandbox: &str) -> Option<String> {
        let out = self
            .brig()
            .args(["rm", "-f", sandbox])
            .output()
            .expect("run brig rm");
        (!out.status.success()).then(|| {
            format!(
                "brig rm -f {sandbox} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }

    /// Whether `sandbox` still runs commands.
    fn still_answers(&self, sandbox: &str) -> Option<String> {
        let out = self
            .brig()
            .args(["exec", sandbox, "--", "/bin/echo", "alive"])
            .output()
            .expect("run brig exec");
        (String::from_utf8_lossy(&out.stdout).trim() != "alive").then(|| {
            format!(
                "the sandbox no longer runs commands: exit {:?}: {}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }

    /// Whether the daemon still runs and answers.
    fn problems(&mut self) -> Option<String> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(format!("brig serve exited: {status}"));
        }
        let out = self.brig().arg("ls").output().expect("run brig ls");
        (!out.status.success()).then(|| {
            format!(
                "brig ls failed afterwards: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        support::stop_daemon(&mut self.child);
    }
}

/// A TCP listener on all of the host's addresses that greets whoever
/// connects with the canary's name: a sandbox must never get to it.
struct CanaryListener {
    port: u16,
    accepted: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl CanaryListener {
    fn start() -> CanaryListener {
        let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("bind a host listener");
        let port = listener.local_addr().unwrap().port();
        let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = std::sync::Arc::clone(&accepted);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                log.lock().unwrap().push(peer);
                let _ = (&conn).write_all(format!("{CANARY}\n").as_bytes());
            }
        });
        CanaryListener { port, accepted }
    }

    /// What reached it, as host problems.
    fn reached(&self) -> Vec<String> {
        self.accepted
            .lock()
            .unwrap()
            .iter()
            .map(|peer| {
                format!(
                    "a connection from {peer} reached the host's listener on port {}",
                    self.port
                )
            })
            .collect()
    }
}

/// The host's own IPv4 addresses (not loopback).
fn host_addresses() -> Vec<String> {
    let out = Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .expect("run ip addr");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().skip_while(|w| *w != "inet");
            f.nth(1)?.split('/').next().map(str::to_string)
        })
        .filter(|a| !a.starts_with("127."))
        .collect()
}

// ---------------------------------------------------------------------------
// The verdict.

/// Run one program in one mode and check everything.
fn run_case(program: &'static str, mode: Mode) {
    let template = mode.template();
    let Some(template_arg) = mode_prerequisites(mode) else {
        return;
    };
    let case = case(program, mode);
    programs_dir(); // build before the clock starts
    let mut daemon = (!matches!(mode, Mode::Run(_))).then(|| Daemon::start(mode.e2b()));
    let watch = HostWatch::start(template);
    let id = run_id(program);
    // A networked sandbox's network_egress tries to reach this listener
    // on every address of the host.
    let listener = CanaryListener::start();
    let mut extra = Vec::new();
    if program == "network_egress" && !matches!(mode, Mode::Run(_)) {
        extra.push("--host-port".to_string());
        extra.push(listener.port.to_string());
        for a in host_addresses() {
            extra.extend(["--host-addr".to_string(), a]);
        }
    }
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let args = program_args(&case, mode, &id, &extra);
    let limit = case.within + Duration::from_secs(30);
    let mut daemon_problems = Vec::new();
    let run = match &mut daemon {
        None => launch_run(&template_arg, &case.run_args(), case.program, &args).finish(limit),
        Some(d) => {
            let sandbox = d.create(mode, &case);
            let run = d.exec(mode, &sandbox, &case, &args).finish(limit);
            // A sandbox the attack did not end must still work (its agent,
            // pid 1, survived).
            if matches!(case.expect, Expect::Report | Expect::Killed) {
                daemon_problems.extend(d.still_answers(&sandbox));
            }
            // The attack must leave the daemon answering, and the
            // sandbox deletable with nothing of it left.
            daemon_problems.extend(d.remove(&sandbox));
            daemon_problems.extend(d.problems());
            run
        }
    };
    let mut host = watch.finish(&[&id]);
    host.extend(listener.reached());
    eprintln!("{program} in {}: {}", mode.describe(), run.describe());
    if let Some(d) = &daemon {
        eprintln!("--- daemon log\n{}", d.log());
    }

    let mut failures = judge(program, mode, &case, &run);
    failures.extend(daemon_problems.into_iter().map(|p| format!("DAEMON: {p}")));
    failures.extend(host.into_iter().map(|p| format!("HOST: {p}")));
    assert!(
        failures.is_empty(),
        "{program} in {}:\n  {}\n{}",
        mode.describe(),
        failures.join("\n  "),
        run.describe()
    );
}

/// What is wrong with one program's run: its timing, its report and how
/// it ended, against the case's expectations.
fn judge(program: &'static str, mode: Mode, case: &Case, run: &Finished) -> Vec<String> {
    let mut failures = Vec::new();
    if run.hung {
        failures.push(format!(
            "brig did not finish within {:?}",
            case.within + Duration::from_secs(30)
        ));
    } else if run.elapsed > case.within {
        failures.push(format!(
            "took {:.1?}, more than {:?}",
            run.elapsed, case.within
        ));
    }
    let report = run.report();
    if let Some(r) = &report {
        if r["program"] != program {
            failures.push(format!(
                "report names program {} instead of {program}",
                r["program"]
            ));
        }
        if r["escaped"] != serde_json::Value::Bool(false) {
            match case.own_kernel {
                Some(why) => eprintln!(
                    "{program}: its verdict is the {} kernel's, not the host's ({why}): {}",
                    mode.program_arg(),
                    r["detail"]
                ),
                None => failures.push(format!("ESCAPED: {}", r["detail"])),
            }
        }
        let detail = r["detail"].as_str().unwrap_or_default();
        for needle in &case.detail_contains {
            if !detail.contains(needle) {
                failures.push(format!("report detail lacks {needle:?}"));
            }
        }
    }
    match case.expect {
        Expect::Report => {
            if run.code != Some(0) {
                failures.push(format!("expected exit 0, got {:?}", run.code));
            }
            if report.is_none() {
                failures.push("no JSON report on stdout".into());
            }
        }
        Expect::ReportOrOom => match run.code {
            Some(0) if report.is_some() => {}
            Some(137) if run.stderr.contains("out of memory") => {}
            other => failures.push(format!(
                "expected a report (exit 0) or an OOM kill (137), got {other:?}"
            )),
        },
        Expect::Killed => {
            if run.code != Some(137) {
                failures.push(format!("expected exit 137 (SIGKILL), got {:?}", run.code));
            }
        }
        Expect::Oom(size) => {
            if run.code != Some(137) {
                failures.push(format!(
                    "expected the memory limit to kill it (exit 137), got {:?}",
                    run.code
                ));
            }
            // `brig run`: "out of memory (limit 64 MiB)"; `brig exec`:
            // "killed by the kernel's OOM killer: the sandbox's memory
            // limit is 64 MiB", or, when the kill ended the sandbox, "the
            // sandbox ended: out of memory: … its memory limit (64 MiB)".
            let said = (run.stderr.contains("out of memory") || run.stderr.contains("OOM killer"))
                && run.stderr.contains(size);
            if !said {
                failures.push(format!("stderr does not name the memory limit of {size}"));
            }
        }
        Expect::Ends => {}
        Expect::Timeout(within) => {
            if run.code != Some(124) {
                failures.push(format!(
                    "expected --timeout to kill it (exit 124), got {:?}",
                    run.code
                ));
            }
            if run.elapsed > within {
                failures.push(format!(
                    "the timeout took {:.1?} to act, more than {within:?}",
                    run.elapsed
                ));
            }
            let e = run.stderr.to_lowercase();
            if !e.contains("timed out") && !e.contains("timeout") {
                failures.push("stderr does not mention the timeout".into());
            }
        }
    }
    if let Some(disk) = case.disk {
        failures.extend(disk_fill_bounds(report.as_ref(), disk));
    }
    if let Mode::Run(_) = mode {
        failures.extend(layer_failures(program, mode, report.as_ref()));
    }
    failures
}

/// The harness's own check of disk_fill's numbers: each target must stop
/// with ENOSPC, and each "wrote N bytes" be within the --disk size (plus
/// rounding).
fn disk_fill_bounds(report: Option<&serde_json::Value>, disk: u64) -> Vec<String> {
    let Some(detail) = report.and_then(|r| r["detail"].as_str()) else {
        return vec![];
    };
    let mut out = Vec::new();
    for part in detail.split("; ").filter(|p| p.contains(": wrote ")) {
        if !part.ends_with("then ENOSPC") {
            out.push(format!("disk_fill target did not end with ENOSPC: {part}"));
        }
    }
    for part in detail.split("wrote ").skip(1) {
        let bytes: u64 = part
            .split_whitespace()
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(u64::MAX);
        if bytes > disk + disk / 8 + (2 << 20) {
            out.push(format!("disk_fill wrote {bytes} bytes with --disk {disk}"));
        }
    }
    out
}

/// Two sandboxes at once: `serve` plants markers, `probe` (in a second
/// sandbox) must find none of them; then the serving brig gets SIGTERM and
/// its whole sandbox must go.
fn run_cross_sandbox(mode: Mode) {
    let template = mode.template();
    let Some(template_arg) = mode_prerequisites(mode) else {
        return;
    };
    let case = case("cross_sandbox", mode);
    programs_dir();
    let mut daemon = (!matches!(mode, Mode::Run(_))).then(|| Daemon::start(mode.e2b()));
    let watch = HostWatch::start(template);
    let (serve_id, probe_id) = (run_id("serve"), run_id("probe"));
    let serve_args = program_args(&case, mode, &serve_id, &["serve", "--seconds", "30"]);
    let probe_args = program_args(&case, mode, &probe_id, &["probe"]);
    let mut daemon_problems = Vec::new();
    let (ready, served, probe) = match &mut daemon {
        None => {
            let serve = launch_run(
                &template_arg,
                &case.run_args(),
                "cross_sandbox",
                &serve_args,
            );
            let ready = serve.next_line(Duration::from_secs(20));
            let probe = launch_run(
                &template_arg,
                &case.run_args(),
                "cross_sandbox",
                &probe_args,
            )
            .finish(Duration::from_secs(60));
            support::signal(serve.child.id(), libc::SIGTERM);
            (ready, serve.finish(Duration::from_secs(15)), probe)
        }
        // Two sandboxes of one daemon; deleting the serving one must end
        // it whole (and its exec with it).
        Some(d) => {
            let (a, b) = (d.create(mode, &case), d.create(mode, &case));
            let serve = d.exec(mode, &a, &case, &serve_args);
            let ready = serve.next_line(Duration::from_secs(20));
            let probe = d
                .exec(mode, &b, &case, &probe_args)
                .finish(Duration::from_secs(60));
            daemon_problems.extend(d.remove(&a));
            let served = serve.finish(Duration::from_secs(15));
            daemon_problems.extend(d.remove(&b));
            daemon_problems.extend(d.problems());
            (ready, served, probe)
        }
    };
    let host = watch.finish(&[&serve_id, &probe_id]);
    eprintln!(
        "serve: {ready:?}\n{}\nprobe: {}",
        served.describe(),
        probe.describe()
    );

    let mut failures = Vec::new();
    match ready
        .as_deref()
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    {
        Some(r) if r["escaped"] == serde_json::Value::Bool(false) => {}
        other => failures.push(format!("serve did not report ready: {other:?}")),
    }
    match probe.report() {
        Some(r) if r["escaped"] == serde_json::Value::Bool(false) => {}
        Some(r) => failures.push(format!(
            "ESCAPED: the probe reached the other sandbox: {}",
            r["detail"]
        )),
        None => failures.push("the probe printed no report".into()),
    }
    if let Mode::Run(_) = mode {
        failures.extend(layer_failures(
            "cross_sandbox",
            mode,
            probe.report().as_ref(),
        ));
    }
    if probe.code != Some(0) {
        failures.push(format!("probe exited {:?}", probe.code));
    }
    if served.hung {
        failures.push(
            "the serving brig did not end within 15 s of SIGTERM (or of its sandbox's deletion)"
                .into(),
        );
    }
    failures.extend(daemon_problems.into_iter().map(|p| format!("DAEMON: {p}")));
    failures.extend(host.into_iter().map(|p| format!("HOST: {p}")));
    assert!(
        failures.is_empty(),
        "cross_sandbox in {}:\n  {}",
        mode.describe(),
        failures.join("\n  ")
    );
}

// ---------------------------------------------------------------------------
// A real terminal: `tiocsti` with a host pty as brig's controlling terminal.

/// How the host pty is given to brig.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TtyUse {
    /// `-t`: the pty is brig's stdin, stdout, stderr and controlling
    /// terminal; the sandbox gets a pty of its own that brig relays.
    Relayed,
    /// No `-t`: the program arrives on a pipe (stdin), and the pty is
    /// brig's stdout, stderr and controlling terminal — what a user's
    /// `brig run -i -- prog < file` in an interactive shell does. brig
    /// passes its stdout and stderr to the sandbox as they are.
    Output,
}

/// A host pseudo-terminal held by the harness: the master, where the
/// "user's terminal emulator" would be, and the slave, brig's terminal.
/// Everything the master receives is collected.
struct HostTerminal {
    master: std::os::fd::OwnedFd,
    slave: std::os::fd::OwnedFd,
    output: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What a process on the host could notice about its terminal.
#[derive(Debug, PartialEq, Eq)]
struct TerminalState {
    /// iflag, oflag, cflag, lflag, ispeed, ospeed.
    flags: [u32; 6],
    cc: Vec<u8>,
    /// rows, cols.
    window: (u16, u16),
    line_discipline: i32,
    exclusive: i32,
}

impl HostTerminal {
    fn open() -> HostTerminal {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: posix_openpt/grantpt/unlockpt/ptsname_r on our own fd
        // and a live buffer.
        let (master, slave) = unsafe {
            let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
            assert!(m >= 0, "posix_openpt: {}", std::io::Error::last_os_error());
            let master = std::os::fd::OwnedFd::from_raw_fd(m);
            assert_eq!(libc::grantpt(m), 0);
            assert_eq!(libc::unlockpt(m), 0);
            let mut name = [0 as libc::c_char; 64];
            assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
            let s = libc::open(
                name.as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            );
            assert!(
                s >= 0,
                "open the pty slave: {}",
                std::io::Error::last_os_error()
            );
            (master, std::os::fd::OwnedFd::from_raw_fd(s))
        };
        // A known window size, to see whether it changes.
        let ws = libc::winsize {
            ws_row: 40,
            ws_col: 100,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize; master is ours.
        unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        let output = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (sink, done) = (std::sync::Arc::clone(&output), std::sync::Arc::clone(&stop));
        let fd = master.as_raw_fd();
        std::thread::spawn(move || {
            let mut buf = [0u8; 16384];
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd; the master outlives this thread's
                // use of it (HostTerminal's drop sets `stop` first and waits
                // out one poll period before closing).
                if unsafe { libc::poll(&mut p, 1, 50) } <= 0 || p.revents & libc::POLLIN == 0 {
                    if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    continue;
                }
                // SAFETY: reading into a stack buffer.
                let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if n > 0 {
                    sink.lock().unwrap().extend_from_slice(&buf[..n as usize]);
                }
            }
        });
        HostTerminal {
            master,
            slave,
            output,
            stop,
        }
    }

    /// `--host-tty DEV:RDEV`: how the program recognises this terminal.
    fn identity(&self) -> String {
        use std::os::fd::AsRawFd;
        // SAFETY: an all-zero stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our open slave and a valid out-pointer.
        assert_eq!(unsafe { libc::fstat(self.slave.as_raw_fd(), &mut st) }, 0);
        format!("{}:{}", st.st_dev, st.st_rdev)
    }

    fn state(&self) -> TerminalState {
        use std::os::fd::AsRawFd;
        let fd = self.slave.as_raw_fd();
        // SAFETY: termios/winsize are plain old data filled by the calls on
        // our open slave.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            libc::tcgetattr(fd, &mut t);
            let mut ws: libc::winsize = std::mem::zeroed();
            libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws);
            let mut ld: libc::c_int = -1;
            libc::ioctl(fd, libc::TIOCGETD, &mut ld);
            const TIOCGEXCL: libc::c_ulong = 0x8004_5440;
            let mut excl: libc::c_int = -1;
            libc::ioctl(fd, TIOCGEXCL, &mut excl);
            TerminalState {
                flags: [
                    t.c_iflag,
                    t.c_oflag,
                    t.c_cflag,
                    t.c_lflag,
                    libc::cfgetispeed(&t),
                    libc::cfgetospeed(&t),
                ],
                cc: t.c_cc.to_vec(),
                window: (ws.ws_row, ws.ws_col),
                line_discipline: ld,
                exclusive: excl,
            }
        }
    }

    /// `cmd` with this terminal as its controlling terminal, stdout and
    /// stderr (and stdin when `Relayed`).
    fn attach(&self, cmd: &mut Command, how: TtyUse) {
        let dup = || Stdio::from(self.slave.try_clone().expect("dup the pty slave"));
        cmd.stdout(dup()).stderr(dup());
        if how == TtyUse::Relayed {
            cmd.stdin(dup());
        }
        // SAFETY: setsid and ioctl are async-signal-safe; fd 1 is the
        // slave, dup2'd by Command before this runs.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(1, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Type `bytes` on the keyboard.
    fn type_in(&self, bytes: &[u8]) {
        use std::os::fd::AsRawFd;
        let mut rest = bytes;
        while !rest.is_empty() {
            // SAFETY: writing from a live slice to our master.
            let n =
                unsafe { libc::write(self.master.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                panic!("type into the host pty: {e}");
            }
            rest = &rest[n as usize..];
        }
    }

    fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Wait until the terminal has shown `needle`.
    fn wait_for(&self, needle: &str, limit: Duration) -> bool {
        eventually(limit, || self.output().contains(needle))
    }

    /// After brig has exited: what the sandbox left behind on the host
    /// terminal, compared with `before`.
    fn damage(&self, before: &TerminalState) -> Vec<String> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let mut problems = Vec::new();
        let after = self.state();
        if after != *before {
            problems.push(format!(
                "the host terminal's state changed: {before:?} -> {after:?}"
            ));
        }
        // Anything waiting in the host terminal's input queue would be read
        // by the user's shell next. Canonical mode hides a partial line
        // from FIONREAD and read: switch to non-canonical (which releases
        // it) and read without waiting.
        let fd = self.slave.as_raw_fd();
        // SAFETY: termios filled by tcgetattr; ioctl/read on our slave
        // with a live buffer.
        let pending = unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            libc::tcgetattr(fd, &mut t);
            let saved = t;
            t.c_lflag &= !libc::ICANON;
            t.c_cc[libc::VMIN] = 0;
            t.c_cc[libc::VTIME] = 0;
            libc::tcsetattr(fd, libc::TCSANOW, &t);
            let mut buf = [0u8; 4096];
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            libc::tcsetattr(fd, libc::TCSANOW, &saved);
            buf[..n.max(0) as usize].to_vec()
        };
        if !pending.is_empty() {
            problems.push(format!(
                "INJECTED: the host terminal's input queue holds {:?}",
                String::from_utf8_lossy(&pending)
            ));
        }
        // Output must still flow (TCOOFF stops it until TCOON).
        let path = format!("/proc/self/fd/{fd}");
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)
        {
            Ok(mut w) => {
                let wrote = w.write(b"brig-hostile-still-flows\n");
                if !matches!(wrote, Ok(n) if n > 0)
                    || !self.wait_for("brig-hostile-still-flows", Duration::from_secs(3))
                {
                    problems.push(format!(
                        "the host terminal's output no longer flows ({wrote:?})"
                    ));
                }
            }
            Err(e) => problems.push(format!("cannot reopen the host terminal: {e}")),
        }
        problems
    }
}

impl Drop for HostTerminal {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The shell line that receives the program through the terminal
/// (base64, one line at a time, ended by ^D) and runs it.
const UPLOAD_TTY: &str =
    "stty -echo && echo BRIG-HOSTILE-READY && base64 -d > /tmp/h && chmod +x /tmp/h && exec /tmp/h \"$@\"";

/// Start `cmd` on `term` and, for `brig run -t`, type the program in.
fn launch_on_terminal(
    mut cmd: Command,
    term: &HostTerminal,
    how: TtyUse,
    program: &str,
    typed: bool,
) -> Launch {
    term.attach(&mut cmd, how);
    let launch = launch_with(cmd, program, how == TtyUse::Output, false);
    if typed {
        use base64::Engine as _;
        assert!(
            term.wait_for("BRIG-HOSTILE-READY", Duration::from_secs(30)),
            "the sandbox's shell never got ready: {}",
            term.output()
        );
        let binary = std::fs::read(programs_dir().join(program)).expect("read the program");
        let text = base64::engine::general_purpose::STANDARD.encode(binary);
        let mut typed = String::with_capacity(text.len() + text.len() / 76 + 4);
        for chunk in text.as_bytes().chunks(76) {
            typed.push_str(std::str::from_utf8(chunk).unwrap());
            typed.push('\n');
        }
        typed.push('\u{4}');
        term.type_in(typed.as_bytes());
    }
    launch
}

/// `tiocsti` with a real terminal in `mode`, the host pty used `how`.
fn run_terminal_case(mode: Mode, how: TtyUse) {
    let template = mode.template();
    let Some(template_arg) = mode_prerequisites(mode) else {
        return;
    };
    let case = case("tiocsti", mode);
    programs_dir();
    let mut daemon = (!matches!(mode, Mode::Run(_))).then(|| Daemon::start(mode.e2b()));
    let watch = HostWatch::start(template);
    let term = HostTerminal::open();
    let before = term.state();
    let id = run_id("tiocsti");
    let host_tty = term.identity();
    let args = program_args(&case, mode, &id, &["--host-tty", &host_tty]);
    let limit = case.within + Duration::from_secs(30);
    let mut daemon_problems = Vec::new();
    let run = match &mut daemon {
        None => {
            let mut cmd = brig();
            cmd.arg("run")
                .arg("--template")
                .arg(&template_arg)
                .args(case.run_args());
            let upload = match how {
                TtyUse::Relayed => {
                    cmd.arg("-t");
                    UPLOAD_TTY
                }
                TtyUse::Output => {
                    cmd.arg("-i");
                    UPLOAD
                }
            };
            cmd.args(["--", "/bin/sh", "-c", upload, "sh"]).args(&args);
            launch_on_terminal(cmd, &term, how, "tiocsti", how == TtyUse::Relayed).finish(limit)
        }
        Some(d) => {
            let sandbox = d.create(mode, &case);
            daemon_problems.extend(d.upload(mode, &sandbox, "tiocsti"));
            let mut cmd = d.brig();
            cmd.args(["exec", "-t", "--timeout", case.timeout]);
            if mode.e2b() {
                cmd.args(["-u", "user"]);
            }
            cmd.arg(&sandbox).arg("--");
            if mode == Mode::E2bRoot {
                cmd.args(["sudo", "-n"]);
            }
            cmd.arg("/tmp/h").args(&args);
            let run = launch_on_terminal(cmd, &term, how, "tiocsti", false).finish(limit);
            daemon_problems.extend(d.still_answers(&sandbox));
            daemon_problems.extend(d.remove(&sandbox));
            daemon_problems.extend(d.problems());
            run
        }
    };
    // With -t everything the sandbox said came through the host terminal.
    let run = Finished {
        stdout: format!("{}\n{}", run.stdout, term.output()),
        ..run
    };
    let mut host = watch.finish(&[&id]);
    host.extend(term.damage(&before));
    eprintln!(
        "tiocsti on a terminal ({how:?}) in {}: {}",
        mode.describe(),
        run.describe()
    );

    let mut failures = Vec::new();
    if run.hung {
        failures.push(format!("brig did not finish within {limit:?}"));
    }
    if run.code != Some(0) {
        failures.push(format!("expected exit 0, got {:?}", run.code));
    }
    match run.report() {
        None => failures.push("no JSON report on the terminal".into()),
        Some(r) => {
            if r["escaped"] != serde_json::Value::Bool(false) {
                failures.push(format!("ESCAPED: {}", r["detail"]));
            }
            let detail = r["detail"].as_str().unwrap_or_default();
            // The program must really have had a terminal, and the one
            // this run means.
            let expected = match how {
                TtyUse::Relayed => "stdin is a terminal of the sandbox's own devpts",
                TtyUse::Output => "stdout is the caller's host terminal, passed through",
            };
            if !detail.contains(expected) {
                failures.push(format!("the report does not say {expected:?}"));
            }
        }
    }
    failures.extend(daemon_problems.into_iter().map(|p| format!("DAEMON: {p}")));
    failures.extend(host.into_iter().map(|p| format!("HOST: {p}")));
    assert!(
        failures.is_empty(),
        "tiocsti on a terminal ({how:?}) in {}:\n  {}\n{}",
        mode.describe(),
        failures.join("\n  "),
        run.describe()
    );
}

/// `tiocsti` where a terminal really exists: `brig run -t` and `brig run`
/// with the caller's terminal as stdout (both templates), `brig exec -t`
/// in each daemon mode (the native `/pty` session).
mod terminal {
    use super::{run_terminal_case, Mode, Template, TtyUse};

    #[test]
    fn host_template_tty() {
        run_terminal_case(Mode::Run(Template::Host), TtyUse::Relayed)
    }
    #[test]
    fn host_template_caller_terminal() {
        run_terminal_case(Mode::Run(Template::Host), TtyUse::Output)
    }
    #[test]
    fn dir_template_tty() {
        run_terminal_case(Mode::Run(Template::Dir), TtyUse::Relayed)
    }
    #[test]
    fn dir_template_caller_terminal() {
        run_terminal_case(Mode::Run(Template::Dir), TtyUse::Output)
    }
    #[test]
    fn daemon_tty() {
        run_terminal_case(Mode::Daemon, TtyUse::Relayed)
    }
    #[test]
    fn e2b_user_tty() {
        run_terminal_case(Mode::E2bUser, TtyUse::Relayed)
    }
    #[test]
    fn e2b_root_tty() {
        run_terminal_case(Mode::E2bRoot, TtyUse::Relayed)
    }
}

// ---------------------------------------------------------------------------
// The file API raced by the sandbox (`file_race`).

/// Names the file API writes under the raced path; none may appear in the
/// host directories the race's symlinks name.
const RACE_NAMES: &[&str] = &["up", "up2", "f", "brig-hostile-race"];
const RACE_HOST_DIRS: &[&str] = &["/", "/root", "/var/tmp", "/proc/1/root"];

/// One file-API request's outcome: its status, or how it failed to
/// return.
fn answered(r: Result<ureq::Response, ureq::Error>) -> Result<(u16, String), String> {
    match r {
        Ok(resp) => {
            let status = resp.status();
            let mut body = String::new();
            let _ = resp.into_reader().take(1 << 20).read_to_string(&mut body);
            Ok((status, body))
        }
        Err(ureq::Error::Status(s, resp)) => Ok((s, resp.into_string().unwrap_or_default())),
        Err(e) => Err(e.to_string()),
    }
}

/// Drive every file-API operation on paths under `/tmp/race/d` `rounds`
/// times while `file_race` swaps it. Returns problems (a request that did
/// not return, a download carrying a host canary) and the status tally.
fn race_file_api(
    d: &Daemon,
    mode: Mode,
    sandbox: &str,
    rounds: usize,
) -> (Vec<String>, std::collections::BTreeMap<String, usize>) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build();
    let base = format!("{}/v1/sandboxes/{sandbox}", d.url);
    let auth = format!("Bearer {}", d.key);
    let mut problems = Vec::new();
    let mut tally = std::collections::BTreeMap::new();
    let mut note = |op: &str, r: Result<(u16, String), String>, problems: &mut Vec<String>| match r
    {
        Ok((status, body)) => {
            if body.contains(CANARY) || body.contains(CANARY_CONTENT.trim()) {
                problems.push(format!("{op} answered the host canary: {body}"));
            }
            if status >= 500 {
                problems.push(format!("{op}: {status} {body}"));
            }
            *tally.entry(format!("{op} {status}")).or_insert(0) += 1;
        }
        Err(e) => problems.push(format!("{op} did not return: {e}")),
    };
    let e2b = mode.e2b().then(|| d.envd(sandbox));
    for round in 0..rounds {
        let upload = format!("brig-hostile-race {round}\n");
        let q = |p: &str| format!("path={}", urlencode(p));
        let get = |url: String| answered(agent.get(&url).set("Authorization", &auth).call());
        note(
            "upload d/up",
            answered(
                agent
                    .put(&format!("{base}/files?{}", q("/tmp/race/d/up")))
                    .set("Authorization", &auth)
                    .send_bytes(upload.as_bytes()),
            ),
            &mut problems,
        );
        note(
            "upload d/f",
            answered(
                agent
                    .put(&format!("{base}/files?{}", q("/tmp/race/d/f")))
                    .set("Authorization", &auth)
                    .send_bytes(upload.as_bytes()),
            ),
            &mut problems,
        );
        note(
            "download d/f",
            get(format!("{base}/files?{}", q("/tmp/race/d/f"))),
            &mut problems,
        );
        note(
            "download d",
            get(format!("{base}/files?{}", q("/tmp/race/d"))),
            &mut problems,
        );
        note(
            "download cand-ffifo",
            get(format!("{base}/files?{}", q("/tmp/race/cand-ffifo"))),
            &mut problems,
        );
        note(
            "list d",
            get(format!("{base}/files/list?{}&depth=2", q("/tmp/race/d"))),
            &mut problems,
        );
        note(
            "stat d/f",
            get(format!("{base}/files/stat?{}", q("/tmp/race/d/f"))),
            &mut problems,
        );
        note(
            "rename d/up",
            answered(
                agent
                    .post(&format!("{base}/files/rename"))
                    .set("Authorization", &auth)
                    .send_json(
                        serde_json::json!({"from": "/tmp/race/d/up", "to": "/tmp/race/d/up2"}),
                    ),
            ),
            &mut problems,
        );
        note(
            "mkdir d/brig-hostile-race",
            answered(
                agent
                    .post(&format!("{base}/files/mkdir"))
                    .set("Authorization", &auth)
                    .send_json(serde_json::json!({"path": "/tmp/race/d/brig-hostile-race"})),
            ),
            &mut problems,
        );
        note(
            "remove d/up2",
            answered(
                agent
                    .delete(&format!("{base}/files?{}", q("/tmp/race/d/up2")))
                    .set("Authorization", &auth)
                    .call(),
            ),
            &mut problems,
        );
        note(
            "remove d/brig-hostile-race",
            answered(
                agent
                    .delete(&format!(
                        "{base}/files?{}&recursive=true",
                        q("/tmp/race/d/brig-hostile-race")
                    ))
                    .set("Authorization", &auth)
                    .call(),
            ),
            &mut problems,
        );
        // A watch streams until the client leaves: its headers must come
        // back; dropping the response ends it.
        if round % 5 == 0 {
            let w = agent
                .get(&format!("{base}/files/watch?{}", q("/tmp/race/d")))
                .set("Authorization", &auth)
                .call();
            let w = match w {
                Ok(r) => Ok((r.status(), String::new())),
                Err(ureq::Error::Status(s, _)) => Ok((s, String::new())),
                Err(e) => Err(e.to_string()),
            };
            note("watch d", w, &mut problems);
        }
        // envd's own /files as E2B's `user` (raw HTTP, as the SDKs send it).
        if let Some((plane, token)) = &e2b {
            let envd = |m: &str, p: &str| {
                agent
                    .request(m, &format!("http://{plane}/files?{}&username=user", q(p)))
                    .set("E2b-Sandbox-Id", sandbox)
                    .set("E2b-Sandbox-Port", "49983")
                    .set("X-Access-Token", token)
            };
            note(
                "envd upload d/up",
                answered(envd("POST", "/tmp/race/d/up").send_bytes(upload.as_bytes())),
                &mut problems,
            );
            note(
                "envd upload d/f",
                answered(envd("POST", "/tmp/race/d/f").send_bytes(upload.as_bytes())),
                &mut problems,
            );
            note(
                "envd download d/f",
                answered(envd("GET", "/tmp/race/d/f").call()),
                &mut problems,
            );
            note(
                "envd download d",
                answered(envd("GET", "/tmp/race/d").call()),
                &mut problems,
            );
        }
    }
    (problems, tally)
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Which of the race's names exist in the host directories its symlinks
/// name.
fn race_names_on_host() -> Vec<String> {
    RACE_HOST_DIRS
        .iter()
        .flat_map(|dir| RACE_NAMES.iter().map(move |n| Path::new(dir).join(n)))
        .filter(|p| p.symlink_metadata().is_ok())
        .map(|p| p.display().to_string())
        .collect()
}

/// `file_race` in a daemon sandbox while the harness drives the file API
/// on the paths it swaps.
fn run_file_api_case(mode: Mode) {
    let template = mode.template();
    if prerequisites(template).is_none() {
        return;
    }
    let case = case("file_race", mode);
    programs_dir();
    let mut d = Daemon::start(mode.e2b());
    let watch = HostWatch::start(template);
    let before = race_names_on_host();
    let sandbox = d.create(mode, &case);
    let id = run_id("file_race");
    let args = program_args(&case, mode, &id, &["race", "--seconds", "600"]);
    let racer = d.exec(mode, &sandbox, &case, &args);
    let ready = racer.next_line(Duration::from_secs(30));
    let mut failures = Vec::new();
    if !ready.as_deref().is_some_and(|l| l.contains("\"ready\"")) {
        failures.push(format!("file_race did not get ready: {ready:?}"));
    }
    let (problems, tally) = race_file_api(&d, mode, &sandbox, 40);
    // Tell the racer to stop (a file it looks for) and take its report:
    // what reached the FIFOs and the device it reads.
    let stop = ureq::put(&format!(
        "{}/v1/sandboxes/{sandbox}/files?path=/tmp/race-stop",
        d.url
    ))
    .set("Authorization", &format!("Bearer {}", d.key))
    .send_bytes(b"stop");
    if let Err(e) = stop {
        failures.push(format!("uploading /tmp/race-stop failed: {e}"));
    }
    let run = racer.finish(Duration::from_secs(30));
    match run.report() {
        Some(r) if r["escaped"] == serde_json::Value::Bool(false) => {}
        Some(r) => failures.push(format!("ESCAPED: {}", r["detail"])),
        None => failures.push("file_race printed no final report".into()),
    }
    // The daemon's own sandbox, on the host template: its filter carries
    // the mark (see `Daemon::start`).
    if mode == Mode::Daemon {
        failures.extend(layer_failures("file_race", mode, run.report().as_ref()));
    }
    let mut daemon_problems: Vec<String> = d.still_answers(&sandbox).into_iter().collect();
    daemon_problems.extend(d.remove(&sandbox));
    daemon_problems.extend(d.problems());
    let mut host = watch.finish(&[&id]);
    let after = race_names_on_host();
    if after != before {
        host.push(format!(
            "the race's names appeared on the host: {before:?} -> {after:?}"
        ));
    }
    eprintln!(
        "file_race in {}: {tally:?}\n{}\n--- daemon log\n{}",
        mode.describe(),
        run.describe(),
        d.log()
    );
    failures.extend(problems.into_iter().map(|p| format!("API: {p}")));
    // The race must really have raced: requests got through to every
    // kind of answer, not only errors.
    if !tally
        .iter()
        .any(|(k, n)| k.starts_with("upload d/up 200") && *n > 0)
    {
        failures.push(format!(
            "no upload ever succeeded, so nothing was raced: {tally:?}"
        ));
    }
    failures.extend(daemon_problems.into_iter().map(|p| format!("DAEMON: {p}")));
    failures.extend(host.into_iter().map(|p| format!("HOST: {p}")));
    assert!(
        failures.is_empty(),
        "file_race in {}:\n  {}\n{tally:?}",
        mode.describe(),
        failures.join("\n  ")
    );
}

/// E2B's `user` writing through envd's `/files` where the sandbox's root
/// planted a hard link and a symlink to a root-owned file in the user's
/// home: the kernel refuses both, as it would refuse `user` writing them
/// in a shell; a new file is the user's from the start.
fn run_e2b_user_writes(mode: Mode) {
    let template = mode.template();
    if prerequisites(template).is_none() {
        return;
    }
    let case = case("file_race", mode);
    let mut d = Daemon::start(true);
    let sandbox = d.create(mode, &case);
    let sh = |user: &str, script: &str| {
        let out = d
            .brig()
            .args(["exec", "-u", user, &sandbox, "--", "/bin/sh", "-c", script])
            .output()
            .expect("run brig exec");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    };
    let (code, _) = sh(
        "root",
        "printf 'root-owned\\n' > /etc/brig-hostile-root && chmod 644 /etc/brig-hostile-root \
         && ln /etc/brig-hostile-root /home/user/hard \
         && ln -s /etc/brig-hostile-root /home/user/soft",
    );
    assert_eq!(code, Some(0), "planting the links failed");
    let (plane, token) = d.envd(&sandbox);
    let upload = |path: &str| {
        answered(
            ureq::post(&format!(
                "http://{plane}/files?path={}&username=user",
                urlencode(path)
            ))
            .set("E2b-Sandbox-Id", &sandbox)
            .set("E2b-Sandbox-Port", "49983")
            .set("X-Access-Token", &token)
            .timeout(Duration::from_secs(30))
            .send_bytes(b"written by user through the API\n"),
        )
    };
    let mut failures = Vec::new();
    for path in [
        "/home/user/hard",
        "/home/user/soft",
        "/etc/brig-hostile-new",
    ] {
        match upload(path) {
            Ok((status, body)) if (400..500).contains(&status) => {
                eprintln!("upload {path} as user: {status} {body}")
            }
            other => failures.push(format!("upload {path} as user was not refused: {other:?}")),
        }
    }
    match upload("/home/user/new") {
        Ok((200, _)) => {}
        other => failures.push(format!("upload /home/user/new as user: {other:?}")),
    }
    let (_, target) = sh(
        "root",
        "cat /etc/brig-hostile-root; stat -c %u:%g /etc/brig-hostile-root",
    );
    if target != "root-owned\n0:0" {
        failures.push(format!("the root-owned file changed: {target:?}"));
    }
    let (_, new) = sh(
        "root",
        "stat -c %u:%g /home/user/new; test -e /etc/brig-hostile-new || echo absent",
    );
    if new != "1000:1000\nabsent" {
        failures.push(format!(
            "/home/user/new is not user's, or /etc got a file: {new:?}"
        ));
    }
    failures.extend(d.remove(&sandbox));
    failures.extend(d.problems());
    assert!(failures.is_empty(), "{}\n{}", failures.join("\n"), d.log());
}

/// The daemon's file API (native, and envd's `/files` as `user` in the
/// E2B modes) on paths a hostile program swaps for symlinks, FIFOs and
/// devices.
mod file_api {
    use super::{run_file_api_case, Mode};

    #[test]
    fn daemon() {
        run_file_api_case(Mode::Daemon)
    }
    #[test]
    fn e2b_user() {
        run_file_api_case(Mode::E2bUser)
    }
    #[test]
    fn e2b_user_writes_as_user() {
        super::run_e2b_user_writes(Mode::E2bUser)
    }
}

/// The programs run in one vm guest, one after another (a boot is seconds
/// of TCG, and each program's upload and run into the guest one or two
/// more): those whose verdict still means something there, or that reach
/// for what the host checks watch (files, the template, the clock, the
/// hostname, modules, sockets, the terminal). Left out: the programs whose
/// every finding is the guest kernel's own answer (the seccomp, identity
/// and capability programs: in the guest the command is its root, and the
/// guest is the boundary), those that exhaust or end the guest (the
/// bombs, the CPU spin, kill_all, pid1_attack, orphan_daemon, fs_watch,
/// fd_exhaust), and those with a setup of their own (cross_sandbox;
/// file_race). The guest is on the daemon's default network, so
/// network_egress tries the host's listener through it (at the gateway and
/// at every host address): the guest's NIC leads to the gateway and
/// nowhere else.
const VM_PROGRAMS: &[&str] = &[
    "network_egress",
    "read_host_files",
    "proc_root_tricks",
    "dotdot_traversal",
    "symlink_tricks",
    "proc_environ",
    "write_template",
    "mount_escape",
    "dev_access",
    "unix_socket_escape",
    "proc_sys_write",
    "sysfs_write",
    "clock_change",
    "hostname_change",
    "kernel_modules",
    "kernel_info_leak",
    "tiocsti",
    "inherited_fds",
    "mountinfo",
    "env_leak",
    "cgroup_leak",
    "module_autoload",
];

/// The corpus in one guest of the vm tier: each program uploaded and run
/// by `brig exec` in turn, judged as in the other modes (with the
/// own-kernel expectations); then the guest still answers, its deletion
/// leaves nothing, and the host is untouched.
fn run_vm_corpus() {
    let mode = Mode::Tier(Isolation::Vm);
    if mode_prerequisites(mode).is_none() {
        return;
    }
    programs_dir();
    let mut d = Daemon::start(false);
    let watch = HostWatch::start(mode.template());
    let started = Instant::now();
    let sandbox = d.create(mode, &case("mountinfo", mode));
    let booted = started.elapsed();
    // network_egress tries to reach this listener on every host address.
    let listener = CanaryListener::start();
    let mut reach = vec!["--host-port".to_string(), listener.port.to_string()];
    for a in host_addresses() {
        reach.extend(["--host-addr".to_string(), a]);
    }
    let mut failures = Vec::new();
    let mut ids = Vec::new();
    let mut verdicts = Vec::new();
    for &program in VM_PROGRAMS {
        let case = case(program, mode);
        let id = run_id(program);
        let extra: Vec<&str> = match program {
            "network_egress" => reach.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        let args = program_args(&case, mode, &id, &extra);
        let run = d
            .exec(mode, &sandbox, &case, &args)
            .finish(case.within + Duration::from_secs(30));
        let wrong = judge(program, mode, &case, &run);
        verdicts.push(format!(
            "{program}: {:.1?} {}",
            run.elapsed,
            if wrong.is_empty() {
                "contained"
            } else {
                "FAILED"
            }
        ));
        if !wrong.is_empty() {
            failures.push(format!(
                "{program}: {}\n{}",
                wrong.join("; "),
                run.describe()
            ));
        }
        ids.push(id);
    }
    failures.extend(d.still_answers(&sandbox));
    failures.extend(d.remove(&sandbox));
    failures.extend(d.problems());
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    failures.extend(watch.finish(&ids).into_iter().map(|p| format!("HOST: {p}")));
    failures.extend(listener.reached().into_iter().map(|p| format!("HOST: {p}")));
    eprintln!(
        "the corpus in one vm guest (booted in {booted:.1?}, all in {:.1?}):\n  {}",
        started.elapsed(),
        verdicts.join("\n  ")
    );
    assert!(
        failures.is_empty(),
        "{}\n--- daemon log\n{}",
        failures.join("\n"),
        d.log()
    );
}

/// The vm tier: the corpus in one guest.
mod vm {
    #[test]
    fn corpus_in_one_guest() {
        super::run_vm_corpus()
    }
}

/// One test per program and mode.
macro_rules! hostile_tests {
    ($($program:ident),* $(,)?) => {
        hostile_tests!(@mode host_template, super::Mode::Run(super::Template::Host); $($program),*);
        hostile_tests!(@mode dir_template, super::Mode::Run(super::Template::Dir); $($program),*);
        hostile_tests!(@mode daemon, super::Mode::Daemon; $($program),*);
        hostile_tests!(@mode e2b_user, super::Mode::E2bUser; $($program),*);
        hostile_tests!(@mode e2b_root, super::Mode::E2bRoot; $($program),*);
        hostile_tests!(@mode gvisor, super::Mode::Tier(super::Isolation::Gvisor); $($program),*);
        /// Every program in tests/hostile/src/bin has a test here.
        const PROGRAMS: &[&str] = &[$(stringify!($program),)* "cross_sandbox", "file_race"];
    };
    (@mode $module:ident, $mode:expr; $($program:ident),*) => {
        mod $module {
            $( #[test] fn $program() { super::run_case(stringify!($program), $mode) } )*
            #[test] fn cross_sandbox() { super::run_cross_sandbox($mode) }
        }
    };
}

hostile_tests!(
    fork_bomb,
    memory_bomb,
    disk_fill,
    inode_fill,
    cpu_spin,
    fd_exhaust,
    read_host_files,
    proc_root_tricks,
    dotdot_traversal,
    symlink_tricks,
    proc_environ,
    write_template,
    mount_escape,
    chroot_breakout,
    dev_access,
    raw_socket,
    network_egress,
    unix_socket_escape,
    denied_syscalls,
    seccomp_abi_bypass,
    ptrace_attach,
    kill_all,
    setns_escape,
    setuid_escalation,
    capabilities,
    proc_sys_write,
    sysfs_write,
    clock_change,
    hostname_change,
    cgroup_escape,
    keyring,
    userfaultfd,
    io_uring,
    bpf,
    perf_event,
    kernel_modules,
    kernel_info_leak,
    tiocsti,
    open_by_handle,
    nested_userns,
    inherited_fds,
    mountinfo,
    env_leak,
    proc_exe_overwrite,
    orphan_daemon,
    core_dump,
    cgroup_leak,
    pid1_attack,
    memfd_bomb,
    shm_bomb,
    thread_bomb,
    module_autoload,
    kernel_buffer_bomb,
    fs_watch,
);

#[test]
fn every_hostile_program_has_a_test() {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/hostile/src/bin");
    let mut on_disk: Vec<String> = std::fs::read_dir(&bin)
        .expect("tests/hostile/src/bin")
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".rs"))
                .map(str::to_string)
        })
        .collect();
    on_disk.sort();
    let mut tested: Vec<String> = PROGRAMS.iter().map(|s| s.to_string()).collect();
    tested.sort();
    assert_eq!(
        on_disk, tested,
        "add new programs to hostile_tests! (and remove deleted ones)"
    );
}

#[test]
fn every_hostile_program_has_a_layer() {
    let missing: Vec<String> = PROGRAMS
        .iter()
        .flat_map(|p| [(p, Template::Host), (p, Template::Dir)])
        .filter(|(p, t)| layer(p, *t).is_none())
        .map(|(p, t)| format!("{p} ({})", t.program_arg()))
        .collect();
    assert!(
        missing.is_empty(),
        "declare in layer() which layer refuses {missing:?} (the attribution pass measures it: tests/hostile/matrix.sh --attribution)"
    );
}
