//! brig-hostile: a corpus of small programs that try to escape or exhaust a
//! sandbox (STYLE.md habit 12). Each binary under `src/bin/` attacks one
//! thing and ends by printing exactly one JSON line on stdout:
//!
//! ```text
//! {"program":"<name>","escaped":false,"detail":"<what it tried, what happened, errnos>"}
//! ```
//!
//! `"escaped": true` means the program managed something a sandbox must
//! prevent. The security suite (`crates/cli/tests/hostile.rs`) uploads every
//! program into a sandbox of every configuration a user can get (`brig run`
//! on each template, a native daemon sandbox, an E2B sandbox as `user` and
//! as root after `sudo`: see [`Mode`]), reads that line and
//! then checks the host independently (canaries, clock, hostname, leftover
//! processes), because a program can only see its own side.
//!
//! This library is deliberately tiny and depends on `libc` only, so the
//! programs build as static binaries that run in any template:
//! - [`Report`] collects findings and prints the final line;
//! - [`Args`] reads the few flags the harness passes (`--armed`,
//!   `--template host|dir`, `--mode` (a [`Mode`]), `--canary NAME`,
//!   positional modes);
//! - [`guard_destructive`] refuses to run an exhaustion or state-changing
//!   program outside a sandbox;
//! - small wrappers ([`open`], [`read_file`], [`errno_name`], [`in_child`],
//!   [`visible_pids`]) keep the programs short and their reports uniform;
//! - in the attribution pass (`--seccomp-mark`), [`errno`], [`check`],
//!   [`io_errno`] and those wrappers count every refusal by the layer that
//!   answered it (the seccomp filter, or the kernel), and the report ends
//!   with the two counts.
//!
//! Nothing here uses NSS (no getpwnam, no getaddrinfo): those do not work in
//! a static glibc binary.

use std::ffi::CString;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::{FromRawFd, OwnedFd};

/// The name the harness gives everything it plants on the host (a file in
/// /root, an environment variable, a process's argv[0], an abstract unix
/// socket). Seeing it from inside a sandbox is an escape.
pub const CANARY: &str = "brig-hostile-canary";

/// The environment variable the harness sets on `brig` itself. It must never
/// reach the sandboxed command.
pub const CANARY_ENV: &str = "BRIG_HOSTILE_HOST_SECRET";

/// Findings of one program, printed as the single final JSON line.
#[derive(Debug)]
pub struct Report {
    program: &'static str,
    escaped: bool,
    notes: Vec<String>,
}

impl Report {
    pub fn new(program: &'static str) -> Self {
        // The attribution pass's counters, before any fork: children share
        // them.
        counters();
        Report {
            program,
            escaped: false,
            notes: Vec::new(),
        }
    }

    /// Record something that happened and is fine (a denied call, a count).
    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    /// Record something a sandbox must prevent; the report will say
    /// `"escaped": true`.
    pub fn escape(&mut self, what: impl Into<String>) {
        self.escaped = true;
        self.notes.push(format!("ESCAPE: {}", what.into()));
    }

    /// Either [`Report::escape`] or [`Report::note`], depending on `escaped`.
    pub fn record(&mut self, escaped: bool, what: impl Into<String>) {
        if escaped {
            self.escape(what)
        } else {
            self.note(what)
        }
    }

    pub fn escaped(&self) -> bool {
        self.escaped
    }

    /// The JSON line, without printing it.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"program\":\"{}\",\"escaped\":{},\"detail\":\"{}\"}}",
            json_escape(self.program),
            self.escaped,
            json_escape(&self.notes.join("; "))
        )
    }

    /// Print the final line and exit 0. The exit status never carries the
    /// verdict: the harness reads it from the JSON (and from brig's status
    /// where the sandbox kills the program).
    pub fn finish(mut self) -> ! {
        self.print();
        // SAFETY: _exit ends the process at once; nothing in these programs
        // relies on destructors or atexit handlers.
        unsafe { libc::_exit(0) }
    }

    /// Print the final line without exiting, for a program whose last act
    /// must come after its report (tiocsti stops its terminal's output).
    pub fn print(&mut self) {
        if let Some(c) = counters() {
            use std::sync::atomic::Ordering::Relaxed;
            self.note(format!(
                "refused by the seccomp filter: {}, by the kernel: {}",
                c[BY_FILTER].load(Relaxed),
                c[BY_KERNEL].load(Relaxed)
            ));
        }
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", self.to_json());
        let _ = out.flush();
    }
}

/// Escape a string for a JSON string literal.
pub fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// The flags the harness passes. Unknown flags (such as the harness's
/// `--run-id=...` marker) are ignored.
#[derive(Debug, Clone)]
pub struct Args {
    args: Vec<String>,
}

impl Args {
    pub fn get() -> Self {
        Args {
            args: std::env::args().skip(1).collect(),
        }
    }

    pub fn has(&self, flag: &str) -> bool {
        self.args.iter().any(|a| a == flag)
    }

    /// The value after `--name`, or of `--name=value`.
    pub fn value(&self, name: &str) -> Option<String> {
        let prefix = format!("{name}=");
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            if a == name {
                return it.next().cloned();
            }
            if let Some(v) = a.strip_prefix(&prefix) {
                return Some(v.to_string());
            }
        }
        None
    }

    /// Positional arguments (those not starting with `--`, and not the value
    /// of a flag that takes one).
    pub fn positional(&self) -> Vec<String> {
        const TAKES_VALUE: &[&str] = &[
            "--template",
            "--canary",
            "--limit-bytes",
            "--seconds",
            "--cap",
            "--cap-threads",
            "--cap-fds",
            "--mode",
            "--host-port",
            "--host-addr",
            "--seccomp-mark",
            "--host-kernel",
            "--host-tty",
        ];
        let mut out = Vec::new();
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            if TAKES_VALUE.contains(&a.as_str()) {
                it.next();
            } else if !a.starts_with("--") {
                out.push(a.clone());
            }
        }
        out
    }

    /// `host` or `dir`, as told by the harness; `None` if not told.
    pub fn template(&self) -> Option<String> {
        self.value("--template")
    }

    /// The sandbox configuration the harness runs this program in
    /// (`--mode`; [`Mode::Run`] when not told).
    pub fn mode(&self) -> Mode {
        match self.value("--mode").as_deref() {
            None | Some("run") => Mode::Run,
            Some("daemon") => Mode::Daemon,
            Some("e2b-user") => Mode::E2bUser,
            Some("e2b-root") => Mode::E2bRoot,
            Some("gvisor") => Mode::Gvisor,
            Some("vm") => Mode::Vm,
            Some(other) => {
                eprintln!("unknown --mode {other}: run, daemon, e2b-user, e2b-root, gvisor or vm");
                std::process::exit(2);
            }
        }
    }

    /// The canary file name planted on the host (default [`CANARY`]).
    pub fn canary(&self) -> String {
        self.value("--canary").unwrap_or_else(|| CANARY.to_string())
    }

    pub fn u64_value(&self, name: &str) -> Option<u64> {
        self.value(name).and_then(|v| v.parse().ok())
    }
}

/// The sandbox configurations a user can get, each with what brig
/// deliberately does differently there. A program's expectations per mode
/// are written next to it, in its doc comment, and are phrased through
/// these properties rather than through the mode's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `brig run`: brig's own init as pid 1, no_new_privs, no network
    /// unless asked, the command as the sandbox's root.
    Run,
    /// A native daemon sandbox (`brig create`, then `brig exec`): brig-agent
    /// as pid 1 holding the daemon's connection, no_new_privs, the command
    /// as the sandbox's root.
    Daemon,
    /// An E2B sandbox (created through E2B's API) running the program as
    /// its user `user` (uid 1000): no no_new_privs and setuid binaries
    /// working (so that `sudo` does), a network attachment by default.
    E2bUser,
    /// The same E2B sandbox after `sudo` to the sandbox's root: the
    /// container-root capability set ([`ROOT_CAPS`]) in effect.
    E2bRoot,
    /// A daemon sandbox of the gvisor tier: the program's system calls are
    /// answered by gVisor's kernel (brig's seccomp policy is not applied
    /// inside; gVisor refuses or implements each call itself).
    Gvisor,
    /// A daemon sandbox of the vm tier: the program runs on the guest's
    /// own kernel, in a QEMU guest; what it does to that kernel stays in
    /// the guest, and the harness checks that the host is untouched.
    Vm,
}

impl Mode {
    /// Whether no_new_privs is set on the program: everywhere but E2B
    /// sandboxes, whose user needs setuid `sudo`.
    pub fn no_new_privs(self) -> bool {
        matches!(self, Mode::Run | Mode::Daemon | Mode::Gvisor | Mode::Vm)
    }

    /// Whether another kernel than the host's answers the program's calls
    /// (gVisor's, or the guest's): then brig's own seccomp policy and
    /// namespaces are not what stands between it and the host.
    pub fn own_kernel(self) -> bool {
        matches!(self, Mode::Gvisor | Mode::Vm)
    }

    /// Whether the sandbox has a network interface by design: a daemon's
    /// sandboxes always do (even `--network none` is a policy, enforced
    /// outside the sandbox, that can be opened later); E2B's have the open
    /// internet.
    pub fn networked(self) -> bool {
        self != Mode::Run
    }

    /// Whether `sudo` put us here (it sets SUDO_* variables of its own).
    pub fn via_sudo(self) -> bool {
        self == Mode::E2bRoot
    }
}

/// The most a sandbox's root may hold (bounding, permitted and effective):
/// Docker's default set minus NET_RAW — CHOWN DAC_OVERRIDE FOWNER FSETID
/// KILL SETGID SETUID SETPCAP NET_BIND_SERVICE SYS_CHROOT MKNOD AUDIT_WRITE
/// SETFCAP, all confined to the sandbox's user namespace. Written out here
/// on purpose rather than taken from `brig_jail::plan::DEFAULT_CAPS`: the
/// attacker's idea of "allowed" must not move when the jail's does (and
/// these programs depend on libc only, to build static).
pub const ROOT_CAPS: u64 = (1 << 0)
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

/// Whether this process is in the host's initial user namespace, judged by
/// its uid_map being the identity over the whole range. `None` if the map
/// cannot be read.
pub fn in_initial_userns() -> Option<bool> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    let fields: Vec<&str> = map.split_whitespace().collect();
    Some(fields == ["0", "0", "4294967295"])
}

/// Refuse to run an exhaustion or state-changing program anywhere but inside
/// a sandbox: it needs `--armed` on the command line (the harness passes it)
/// and must not be in the initial user namespace. Being in the initial user
/// namespace while armed means the sandbox did not isolate uids at all, so
/// that is reported as an escape (and nothing destructive is attempted).
pub fn guard_destructive(program: &'static str, args: &Args) {
    if !args.has("--armed") {
        eprintln!("{program}: refusing to run without --armed (it exhausts or changes the machine it runs on)");
        std::process::exit(2);
    }
    // gVisor's kernel and a vm guest's show their own initial user
    // namespace (or none: a guest kernel may lack them): there the sign of
    // a sandbox is another kernel than the host's (the harness passes the
    // host's release).
    if args.mode().own_kernel() && on_another_kernel(args) {
        return;
    }
    match in_initial_userns() {
        Some(false) => {}
        Some(true) => {
            let mut r = Report::new(program);
            r.escape("running in the initial user namespace (uid_map is the identity): not sandboxed, refusing to attack the host");
            r.finish()
        }
        None => {
            let mut r = Report::new(program);
            r.escape("cannot read /proc/self/uid_map to confirm a user namespace; refusing to run");
            r.finish()
        }
    }
}

/// Whether this kernel's release differs from the host's, as the harness
/// gave it (`--host-kernel`).
fn on_another_kernel(args: &Args) -> bool {
    // uname: gVisor has no /proc/sys/kernel/osrelease.
    // SAFETY: an all-zero utsname is valid; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: u is a valid out-pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return false;
    }
    // SAFETY: the kernel NUL-terminates release.
    let here = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy();
    args.value("--host-kernel")
        .is_some_and(|host| !here.is_empty() && here != host.as_str())
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    let raw = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    attribute(raw)
}

/// An [`std::io::Error`]'s errno, counted like [`errno`]'s.
pub fn io_errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().map_or(libc::EIO, attribute)
}

/// The attribution pass (`--seccomp-mark N`, with a knockout build of
/// brig whose filter adds N to every errno it returns but clone3's
/// ENOSYS): which layer refused each failed call that went through
/// [`errno`], [`check`], [`io_errno`] or the file helpers below. The
/// harness (`crates/cli/tests/hostile.rs`, `layer()`) declares per program
/// which layer must have refused it.
fn seccomp_mark() -> Option<i32> {
    static MARK: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    *MARK.get_or_init(|| {
        Args::get()
            .value("--seccomp-mark")
            .and_then(|m| m.parse().ok())
    })
}

const BY_FILTER: usize = 0;
const BY_KERNEL: usize = 1;

/// The attribution pass's counts (refusals by the filter, by the kernel)
/// in a page shared with forked children, so that the attempts made in
/// [`in_child`] (setns_escape's, nested_userns's, denied_syscalls') count
/// too. Set up by [`Report::new`] and [`in_child`], before they fork;
/// `None` without a mark.
fn counters() -> Option<&'static [std::sync::atomic::AtomicUsize; 2]> {
    type Counts = [std::sync::atomic::AtomicUsize; 2];
    static COUNTERS: std::sync::OnceLock<Option<&'static Counts>> = std::sync::OnceLock::new();
    *COUNTERS.get_or_init(|| {
        seccomp_mark()?;
        // SAFETY: a new anonymous mapping; no existing memory is affected.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            page != libc::MAP_FAILED,
            "the attribution pass's counters: mmap failed: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: the mapping is page-aligned, zero-filled (two valid
        // AtomicUsize) and never unmapped.
        Some(unsafe { &*page.cast::<Counts>() })
    })
}

/// How many refusals the filter has answered so far, here and in children
/// forked after [`Report::new`]; `None` outside the attribution pass.
/// Compared before and after one attempt, it tells whether the filter
/// refused that attempt (denied_syscalls, nested_userns and
/// seccomp_abi_bypass check each call they expect the filter to refuse).
pub fn filter_refusals() -> Option<usize> {
    counters().map(|c| c[BY_FILTER].load(std::sync::atomic::Ordering::Relaxed))
}

/// Count a failed call under the layer that refused it, and give back the
/// errno as the program would see it without the mark:
/// - the filter: a marked errno (above the mark);
/// - the kernel: EPERM, EACCES or EROFS, the answers of its permission
///   checks (a capability, a namespace's owner, file modes and unmapped
///   owners, a read-only mount);
/// - neither: every other errno. ENOENT, ESRCH, ENETUNREACH (a view
///   without the thing), EAGAIN, ENOSPC, EMFILE (a limit reached), EINVAL,
///   EBADF, ETXTBSY are not refusals; nor is ENOSYS, which is either the
///   kernel lacking a call or the filter's clone3 answer, left unmarked so
///   that glibc still falls back to clone
///   (`brig_jail::seccomp::with_errnos_shifted_but_hide`).
fn attribute(raw: i32) -> i32 {
    use std::sync::atomic::Ordering::Relaxed;
    let Some(mark) = seccomp_mark() else {
        return raw;
    };
    let (layer, errno) = match raw {
        r if r > mark => (Some(BY_FILTER), r - mark),
        libc::EPERM | libc::EACCES | libc::EROFS => (Some(BY_KERNEL), raw),
        _ => (None, raw),
    };
    if let (Some(layer), Some(counts)) = (layer, counters()) {
        counts[layer].fetch_add(1, Relaxed);
    }
    errno
}

/// `EPERM`, `ENOENT`, ... for the errnos these programs meet; `errno N`
/// otherwise.
pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::ECHILD => "ECHILD",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::ENOTBLK => "ENOTBLK",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::ENFILE => "ENFILE",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::ETXTBSY => "ETXTBSY",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::ESPIPE => "ESPIPE",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::EPIPE => "EPIPE",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENOMSG => "ENOMSG",
        libc::EIDRM => "EIDRM",
        libc::ENODATA => "ENODATA",
        libc::EOVERFLOW => "EOVERFLOW",
        libc::EBADMSG => "EBADMSG",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::EPROTOTYPE => "EPROTOTYPE",
        libc::ENOPROTOOPT => "ENOPROTOOPT",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::ESOCKTNOSUPPORT => "ESOCKTNOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETDOWN => "ENETDOWN",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOBUFS => "ENOBUFS",
        libc::EISCONN => "EISCONN",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EALREADY => "EALREADY",
        libc::EINPROGRESS => "EINPROGRESS",
        libc::ESTALE => "ESTALE",
        libc::EDQUOT => "EDQUOT",
        libc::ENOKEY => "ENOKEY",
        libc::EKEYREJECTED => "EKEYREJECTED",
        libc::EUSERS => "EUSERS",
        _ => return format!("errno {e}"),
    };
    name.to_string()
}

/// Whether an errno is what a seccomp deny rule answers (EPERM) or what an
/// unknown/blocked syscall answers (ENOSYS).
pub fn policy_denied(e: i32) -> bool {
    e == libc::EPERM || e == libc::ENOSYS
}

/// Turn a raw syscall return into `Ok(value)` or `Err(errno)`.
pub fn check(ret: libc::c_long) -> Result<libc::c_long, i32> {
    if ret < 0 {
        Err(errno())
    } else {
        Ok(ret)
    }
}

/// `ok` or the errno name, for reports.
pub fn outcome<T>(r: &Result<T, i32>) -> String {
    match r {
        Ok(_) => "ok".to_string(),
        Err(e) => errno_name(*e),
    }
}

pub fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in path")
}

/// open(2) returning an owned fd or the errno.
pub fn open(path: &str, flags: libc::c_int) -> Result<OwnedFd, i32> {
    open_mode(path, flags, 0o600)
}

pub fn open_mode(path: &str, flags: libc::c_int, mode: libc::mode_t) -> Result<OwnedFd, i32> {
    let p = cstr(path);
    // SAFETY: p is a valid NUL-terminated string for the duration of the call.
    let fd = unsafe { libc::open(p.as_ptr(), flags | libc::O_CLOEXEC, mode as libc::c_uint) };
    if fd < 0 {
        Err(errno())
    } else {
        // SAFETY: fd was just returned by open and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// Read a whole file, reporting the errno on failure.
pub fn read_file(path: &str) -> Result<Vec<u8>, i32> {
    std::fs::read(path).map_err(|e| io_errno(&e))
}

/// Read at most `max` bytes of a file (for /proc files that never end or
/// devices).
pub fn read_prefix(path: &str, max: usize) -> Result<Vec<u8>, i32> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).map_err(|e| io_errno(&e))?;
    let mut buf = Vec::new();
    f.take(max as u64)
        .read_to_end(&mut buf)
        .map_err(|e| io_errno(&e))?;
    Ok(buf)
}

/// Names in a directory, or the errno.
pub fn list_dir(path: &str) -> Result<Vec<String>, i32> {
    let rd = std::fs::read_dir(path).map_err(|e| io_errno(&e))?;
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// stat(2): (st_dev, st_ino), or the errno.
pub fn dev_ino(path: &str) -> Result<(u64, u64), i32> {
    let p = cstr(path);
    // SAFETY: an all-zero stat is a valid value for the out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: p is NUL-terminated and st is a valid out-pointer.
    if unsafe { libc::stat(p.as_ptr(), &mut st) } < 0 {
        return Err(errno());
    }
    Ok((st.st_dev, st.st_ino))
}

/// readlink(2) as a string, or the errno.
pub fn readlink(path: &str) -> Result<String, i32> {
    std::fs::read_link(path)
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| io_errno(&e))
}

/// Numeric entries of /proc: the pids this process can see.
pub fn visible_pids() -> Vec<i32> {
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    pids
}

/// A field of /proc/<pid>/status ("Uid", "NoNewPrivs", ...).
pub fn status_field(pid: &str, field: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

/// argv of a process with NULs replaced by spaces ("" if unreadable).
pub fn cmdline(pid: i32) -> String {
    read_file(&format!("/proc/{pid}/cmdline"))
        .map(|b| {
            String::from_utf8_lossy(&b)
                .replace('\0', " ")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

/// How a forked child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    Exited(i32),
    Signaled(i32),
}

impl std::fmt::Display for ChildEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildEnd::Exited(c) => write!(f, "exited {c}"),
            ChildEnd::Signaled(s) => write!(f, "killed by signal {s}"),
        }
    }
}

/// Run `f` in a forked child and return how it ended; the child exits with
/// the value `f` returns. Used for attempts that change the calling process
/// (unshare, setns, setuid) or may get it killed (a seccomp KILL action).
/// The programs are single-threaded when they call this, so the child may
/// run ordinary Rust code.
pub fn in_child(f: impl FnOnce() -> i32) -> Result<ChildEnd, i32> {
    counters();
    // SAFETY: fork in a single-threaded program; the child only runs `f`
    // and then _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(errno());
    }
    if pid == 0 {
        let code = f();
        // SAFETY: leave the child without running the parent's destructors.
        unsafe { libc::_exit(code) }
    }
    wait_child(pid)
}

/// waitpid for one child.
pub fn wait_child(pid: libc::pid_t) -> Result<ChildEnd, i32> {
    let mut status = 0;
    loop {
        // SAFETY: status is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            break;
        }
        let e = errno();
        if e != libc::EINTR {
            return Err(e);
        }
    }
    if libc::WIFSIGNALED(status) {
        Ok(ChildEnd::Signaled(libc::WTERMSIG(status)))
    } else {
        Ok(ChildEnd::Exited(libc::WEXITSTATUS(status)))
    }
}

/// Encode a syscall outcome as a child exit code: 0 for success, the errno
/// otherwise (errnos fit in 1..=133).
pub fn exit_code_for(r: Result<libc::c_long, i32>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.clamp(1, 255),
    }
}

/// Decode [`exit_code_for`] as a report string.
pub fn describe_child(end: Result<ChildEnd, i32>) -> String {
    match end {
        Ok(ChildEnd::Exited(0)) => "ok".to_string(),
        Ok(ChildEnd::Exited(e)) => errno_name(e),
        Ok(ChildEnd::Signaled(s)) => format!("child killed by signal {s}"),
        Err(e) => format!("fork failed: {}", errno_name(e)),
    }
}

/// Whether the child ended as a policy denial: EPERM/ENOSYS, or killed by
/// SIGSYS (a seccomp KILL action).
pub fn child_denied(end: &Result<ChildEnd, i32>) -> bool {
    match end {
        Ok(ChildEnd::Exited(e)) => policy_denied(*e),
        Ok(ChildEnd::Signaled(s)) => *s == libc::SIGSYS,
        Err(_) => false,
    }
}

/// Current wall-clock time in seconds since the epoch.
pub fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_is_one_json_line() {
        let mut r = Report::new("x");
        r.note("tried \"a\"\nthen b");
        assert_eq!(
            r.to_json(),
            r#"{"program":"x","escaped":false,"detail":"tried \"a\"\nthen b"}"#
        );
        r.escape("got in");
        assert!(r.to_json().contains("\"escaped\":true"));
    }

    #[test]
    fn args_find_values_and_positionals() {
        let a = Args {
            args: vec![
                "probe".into(),
                "--template".into(),
                "dir".into(),
                "--armed".into(),
                "--run-id=z".into(),
            ],
        };
        assert_eq!(a.template().as_deref(), Some("dir"));
        assert!(a.has("--armed"));
        assert_eq!(a.positional(), vec!["probe".to_string()]);
        assert_eq!(a.value("--run-id").as_deref(), Some("z"));
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(libc::EPERM), "EPERM");
        assert_eq!(errno_name(9999), "errno 9999");
    }
}
