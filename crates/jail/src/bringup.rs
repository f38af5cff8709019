//! The sandbox side of the bring-up: what the sandbox's init (pid 1 of its
//! pid namespace) does from `clone` to the user's `execve`.
//!
//! [`run_init`] is the whole sequence, top to bottom, with the reason for
//! each step at the step. It runs in a freshly cloned child, so it only
//! reads the pre-built [`Plan`] and makes system calls; it never allocates.
//! Every failure is a [`Failure`] (which step, which errno) written to the
//! error pipe, where the host turns it into a message.

use crate::knockout::Protection;
use std::os::fd::RawFd;

use crate::fdpass::{self, MAX_FDS};
use crate::plan::{ExecPlan, Plan, Step};
use crate::seccomp;
use crate::sys::{Errno, Linux, SysResult, Syscalls};
use crate::trace::{self, Marks};

/// Which step of the bring-up failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    WaitForHost = 1,
    CgroupNamespace,
    PrivateMounts,
    ScratchFs,
    /// A [`Step`] of the plan; `Failure::index` says which.
    MountStep,
    PivotRoot,
    Hostname,
    Loopback,
    Rlimit,
    Terminal,
    Fork,
    Session,
    Stdio,
    Workdir,
    BoundingSet,
    Identity,
    Capabilities,
    NoNewPrivs,
    Seccomp,
    Exec,
}

impl Stage {
    pub fn from_u32(v: u32) -> Option<Self> {
        use Stage::*;
        [
            WaitForHost,
            CgroupNamespace,
            PrivateMounts,
            ScratchFs,
            MountStep,
            PivotRoot,
            Hostname,
            Loopback,
            Rlimit,
            Terminal,
            Fork,
            Session,
            Stdio,
            Workdir,
            BoundingSet,
            Identity,
            Capabilities,
            NoNewPrivs,
            Seccomp,
            Exec,
        ]
        .into_iter()
        .find(|s| *s as u32 == v)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Stage::WaitForHost => "wait for the host to finish set-up",
            Stage::CgroupNamespace => "enter a new cgroup namespace",
            Stage::PrivateMounts => "make the mount namespace private",
            Stage::ScratchFs => "mount the writable layer (tmpfs)",
            Stage::MountStep => "prepare the root filesystem",
            Stage::PivotRoot => "pivot_root into the sandbox's root",
            Stage::Hostname => "set the hostname",
            Stage::Loopback => "bring up the loopback interface",
            Stage::Rlimit => "set resource limits",
            Stage::Terminal => "create the pseudo-terminal",
            Stage::Fork => "fork the command's process",
            Stage::Session => "start a new session",
            Stage::Stdio => "set up standard input/output",
            Stage::Workdir => "enter the working directory",
            Stage::BoundingSet => "drop capabilities from the bounding set",
            Stage::Identity => "switch to the requested user",
            Stage::Capabilities => "set capabilities",
            Stage::NoNewPrivs => "set no_new_privs",
            Stage::Seccomp => "install the seccomp filter",
            Stage::Exec => "execute the command",
        }
    }
}

/// A failed step, small and `Copy` so the child can send it without
/// allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failure {
    pub stage: Stage,
    /// Index into [`Plan::steps`] for [`Stage::MountStep`], else 0.
    pub index: u32,
    pub errno: Errno,
}

impl Failure {
    pub const SIZE: usize = 12;

    fn at(stage: Stage) -> impl Fn(Errno) -> Failure {
        move |errno| Failure {
            stage,
            index: 0,
            errno,
        }
    }

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&(self.stage as u32).to_ne_bytes());
        b[4..8].copy_from_slice(&self.index.to_ne_bytes());
        b[8..12].copy_from_slice(&self.errno.0.to_ne_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() != Self::SIZE {
            return None;
        }
        let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Some(Failure {
            stage: Stage::from_u32(word(0))?,
            index: word(4),
            errno: Errno(word(8) as i32),
        })
    }
}

/// The descriptors the init shares with the host.
#[derive(Debug, Clone, Copy)]
pub struct Channels {
    /// SOCK_SEQPACKET to the host: "go" (+ template mount fds) in, "ready"
    /// (+ pty master) out.
    pub sync: RawFd,
    /// Write end of the error pipe (close-on-exec): a [`Failure`], or EOF
    /// once the command has been executed.
    pub error: RawFd,
}

/// The init's entry point right after `clone`. Never returns.
pub fn init_main(plan: &Plan, ch: Channels) -> ! {
    let code = match run_init(plan, &Linux, ch) {
        Ok(code) => code,
        Err(f) => {
            write_failure(ch.error, f);
            crate::sandbox::SETUP_FAILED_EXIT
        }
    };
    // SAFETY: leaving the child without running the parent's atexit
    // handlers or destructors, which belong to the parent.
    unsafe { libc::_exit(code) }
}

/// The sandbox's init, from clone to the command's exit status.
pub fn run_init(plan: &Plan, sys: &dyn Syscalls, ch: Channels) -> Result<i32, Failure> {
    // 0. Forget brig's command line: /proc/1/cmdline is read from this
    //    process's own memory, which still holds the host's argv (brig's
    //    path, the template's host path, every flag). Not for an init
    //    that execs its command in place: it shares the host's memory until
    //    then (so this would rewrite the host's own command line), and the
    //    exec replaces the argv area anyway.
    if let (false, Some((start, end))) = (plan.as_init, plan.argv_area) {
        // SAFETY: [start, end) is this process's argv area as the kernel
        // reports it (copied by fork); it is writable stack memory that
        // nothing reads after this point (std's args() is not used here).
        unsafe {
            let area = std::slice::from_raw_parts_mut(start as *mut u8, end - start);
            area.fill(0);
            let name = b"brig-init";
            let n = name.len().min(area.len().saturating_sub(1));
            area[..n].copy_from_slice(&name[..n]);
        }
    }

    // 1. Die with the host process from the first instruction on: if brig
    //    dies, the kernel kills this init and, with it (pid namespace),
    //    every process of the sandbox. (Set again in 2c: the credential
    //    change in 2b clears it.) Not for a sandbox that outlives its host
    //    (a daemon's): a host that dies before "go" or "joined" still ends
    //    the bring-up, since the channel reads EOF.
    if plan.die_with_host {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    }

    // 1b. Keep only the two channels to the host. Anything else inherited
    //    from brig (notably its slot lock, whose release is how a dead
    //    owner is detected) must not live on in the sandbox.
    close_other_fds(ch.sync, ch.error);

    // 2. Wait for the host: it writes our uid/gid maps (until then we have
    //    no identity in our user namespace) and sends the template's
    //    detached mounts, which only it can make (idmapping needs privilege
    //    in the host's namespace).
    let mut marks = Marks::new(plan.trace);
    marks.hit(0);
    let mut fds = [-1; MAX_FDS];
    let mut go = [0u8; 1];
    let n = fdpass::recv(ch.sync, &mut go, &mut fds).map_err(Failure::at(Stage::WaitForHost))?;
    marks.hit(Stage::WaitForHost as u32);
    if n.0 == 0 {
        return Err(Failure::at(Stage::WaitForHost)(Errno(libc::EPIPE)));
    }

    // 2b. Become root *of our user namespace*. clone(CLONE_NEWUSER) keeps
    //     the host credentials (host uid 0, unmapped in here); switching
    //     to uid 0 now that the map exists makes us the slot's host uid,
    //     so every file we create belongs to the sandbox, not host root.
    sys.set_ids(0, 0, &[])
        .map_err(Failure::at(Stage::Identity))?;

    // 2c. Die with the host process, again: the credential change cleared
    //     the setting of step 1. If the host died in between, its end of
    //     the channel is closed: check, so no window is left open.
    if plan.die_with_host {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    }
    if host_gone(ch.sync) {
        return Err(Failure::at(Stage::WaitForHost)(Errno(libc::EPIPE)));
    }

    // 3. The root filesystem: private mounts, the writable layer, the
    //    template, /proc, /dev, /tmp, /sys; then pivot_root into it. With
    //    umask 0, so /tmp and /dev/shm get exactly mode 1777.
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0) };
    prepare_root(plan, sys, &fds[..n.1])?;
    marks.hit(Stage::PivotRoot as u32);
    let mounts = plan.mount_fds.min(n.1);
    for fd in &fds[..mounts] {
        // SAFETY: the received mount descriptors are ours; attached already.
        unsafe { libc::close(*fd) };
    }
    // The rest are for the command: a program to run, a socket for stdio.
    let received = |i: Option<usize>| i.filter(|i| *i < n.1).map(|i| fds[i]);
    let program = received(plan.exec.program_fd);
    let stdio = received(plan.exec.stdio_fd);
    // The command keeps the host's locks and the writable layer held in
    // 3b (an EBADF there if the hold failed is harmless).
    let [slot, alive] = plan.exec.inherit_fds.map(received);
    let inherit = [
        slot,
        alive,
        plan.keep_layer.then_some(crate::plan::LAYER_FD),
    ];

    // 4. The machine's identity: hostname = sandbox id (in our own uts
    //    namespace), and a working loopback in our own network namespace,
    //    which has no other interface: no route leaves the sandbox.
    // (Knockout: without a uts namespace the hostname is the host's.)
    if !plan.knockouts.has(Protection::UtsNs) {
        sys.sethostname(&plan.hostname)
            .map_err(Failure::at(Stage::Hostname))?;
    }
    if plan.loopback {
        sys.loopback_up().map_err(Failure::at(Stage::Loopback))?;
    }
    marks.hit(Stage::Loopback as u32);

    // 5. Resource limits the cgroup does not cover (open files, core size).
    //    Set in init so every process of the sandbox inherits them.
    for (res, soft, hard) in &plan.rlimits {
        sys.setrlimit(*res, *soft, *hard)
            .map_err(Failure::at(Stage::Rlimit))?;
    }

    // 6. Wait until the host has moved us into the sandbox's cgroups (it
    //    creates them while we build the root): nothing may fork or run
    //    before the limits apply. Then a cgroup namespace, so
    //    /proc/self/cgroup shows "/" and the host's tree is not named.
    let mut joined = [0u8; 1];
    let n =
        fdpass::recv(ch.sync, &mut joined, &mut fds).map_err(Failure::at(Stage::WaitForHost))?;
    if n.0 == 0 {
        return Err(Failure::at(Stage::WaitForHost)(Errno(libc::EPIPE)));
    }
    marks.hit(Stage::WaitForHost as u32);
    if !plan.knockouts.has(Protection::CgroupNs) {
        sys.unshare(libc::CLONE_NEWCGROUP)
            .map_err(Failure::at(Stage::CgroupNamespace))?;
    }
    marks.hit(Stage::CgroupNamespace as u32);

    // 6b. A clock of its own: what this process execs or starts next (the
    //    agent, the command) is in a new time namespace whose boot time is
    //    now, so uptime (/proc/uptime, CLOCK_BOOTTIME) counts from the
    //    sandbox's start as a machine's does from its boot, not the host's.
    //    CLOCK_MONOTONIC is left alone. Not a protection, so a kernel
    //    without time namespaces (before 5.6) just keeps the host's uptime.
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    let _ = sys.new_clock(now.tv_sec);

    // 7. A pseudo-terminal from the sandbox's own devpts, if asked for. The
    //    host gets the master; the command gets the slave as its
    //    controlling terminal. "Ready" carries the trace marks, if any.
    marks.hit(Stage::Rlimit as u32);
    let mut ready = [0u8; 12 * trace::MAX_MARKS];
    let len = marks.encode(&mut ready);
    let slave = if plan.tty {
        let (master, slave) = open_pty().map_err(Failure::at(Stage::Terminal))?;
        fdpass::send(ch.sync, &ready[..len], &[master]).map_err(Failure::at(Stage::Terminal))?;
        // SAFETY: the host has its copy now.
        unsafe { libc::close(master) };
        Some(slave)
    } else {
        fdpass::send(ch.sync, &ready[..len], &[]).map_err(Failure::at(Stage::WaitForHost))?;
        None
    };

    // 8'. A host that runs a reaper of its own as the command (brig-agent
    //     under `brig serve`) has it replace this process: nothing of the
    //     host's memory stays behind in the sandbox (see Extras::as_init).
    //     exec closes the channels (close-on-exec): EOF on the error pipe
    //     says it started, and the host reads the end from the pidfd.
    if plan.as_init {
        let f = exec_workload(
            &plan.exec,
            plan.stdin,
            Stdio {
                tty: slave,
                socket: stdio,
                inherit,
            },
            program,
            sys,
        );
        return Err(f);
    }

    // 8. The command runs in a child: init stays behind as pid 1 to reap
    //    orphans (zombies would otherwise fill the pid limit), and its exit
    //    (when the command exits) makes the kernel kill what is left. The
    //    child shares our memory until it execs (CLONE_VM|CLONE_VFORK, on
    //    its own pre-allocated stack; we are suspended meanwhile): nothing
    //    to copy, nothing to tear down.
    let args = WorkloadArgs {
        exec: &plan.exec,
        stdin: plan.stdin,
        tty: slave,
        stdio,
        inherit,
        program,
        error: ch.error,
        sys,
    };
    let stack_top = plan.workload_stack.top();
    // SAFETY: workload_entry runs on its own stack (owned by the plan, not
    // used by anyone else), reads only `args` (alive: we are suspended
    // until it execs or exits) and ends in execve or _exit.
    let pid = unsafe {
        libc::clone(
            workload_entry,
            stack_top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            &args as *const WorkloadArgs<'_> as *mut libc::c_void,
        )
    };
    if pid < 0 {
        return Err(Failure::at(Stage::Fork)(Errno::last()));
    }

    // 9. Init keeps nothing the command could use: the error pipe is closed
    //    (its EOF tells the host the command started), and init becomes
    //    non-dumpable so even a same-uid process cannot ptrace it, read its
    //    memory or take its descriptors. It keeps the channel to the host
    //    only to report the command's status.
    // SAFETY: closing our own descriptors; prctl with integers.
    unsafe {
        libc::close(ch.error);
        for fd in [slave, stdio, program].into_iter().flatten() {
            libc::close(fd);
        }
        if !plan.knockouts.has(Protection::Dumpable) {
            libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        }
        libc::prctl(libc::PR_SET_NAME, c"brig-init".as_ptr(), 0, 0, 0);
    }
    let status = reap_until(pid);

    // 10. Tell the host the command's status before this process exits:
    //     tearing the namespaces down (unmounting the whole tree) takes
    //     about a millisecond, which a long-lived host can leave to the
    //     background.
    let _ = fdpass::send(ch.sync, &status.to_ne_bytes(), &[]);
    Ok(libc::WEXITSTATUS(status))
}

/// What the command's process needs; passed by pointer through clone.
struct WorkloadArgs<'a> {
    exec: &'a ExecPlan,
    stdin: bool,
    tty: Option<RawFd>,
    stdio: Option<RawFd>,
    inherit: [Option<RawFd>; 3],
    program: Option<RawFd>,
    error: RawFd,
    sys: &'a dyn Syscalls,
}

extern "C" fn workload_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at the WorkloadArgs on the suspended init's
    // stack, alive until this process execs or exits.
    let a = unsafe { &*(arg as *const WorkloadArgs<'_>) };
    let f = exec_workload(
        a.exec,
        a.stdin,
        Stdio {
            tty: a.tty,
            socket: a.stdio,
            inherit: a.inherit,
        },
        a.program,
        a.sys,
    );
    write_failure(a.error, f);
    // SAFETY: see init_main.
    unsafe { libc::_exit(crate::sandbox::SETUP_FAILED_EXIT) }
}

/// Steps 3a–3d: build the root and pivot into it.
pub fn prepare_root(plan: &Plan, sys: &dyn Syscalls, fds: &[RawFd]) -> Result<(), Failure> {
    // 3a. Our mount namespace is a copy of the host's; make every mount
    //     private so nothing we mount propagates back to the host (or
    //     from it into the sandbox).
    sys.mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(Failure::at(Stage::PrivateMounts))?;

    // 3b. The scratch tmpfs: the writable layer, sized by --disk. It lives
    //     only in this namespace, so it disappears with the sandbox.
    //     nosuid: no_new_privs already voids setuid bits; this is the
    //     second lock on the same door.
    sys.mount(
        Some(c"tmpfs"),
        &plan.staging,
        Some(c"tmpfs"),
        libc::MS_NODEV | libc::MS_NOSUID,
        Some(&plan.staging_opts),
    )
    .map_err(Failure::at(Stage::ScratchFs))?;
    // Held for the host of a sandbox that outlives it: after pivot_root
    // no path leads to the writable layer, and a snapshot reads it. Best
    // effort: a sandbox without it only cannot be snapshotted.
    if plan.keep_layer {
        let _ = sys.hold_dir(&plan.staging, crate::plan::LAYER_FD);
    }

    // 3c. The plan's steps: the template, /proc, /dev, /tmp, /sys.
    for (i, step) in plan.steps.iter().enumerate() {
        run_step(step, sys, fds).map_err(|errno| Failure {
            stage: Stage::MountStep,
            index: i as u32,
            errno,
        })?;
    }

    // 3d. pivot_root, not chroot: the old root is detached entirely, so no
    //     path (nor a chroot-breakout trick) leads back to the host's files.
    if plan.knockouts.has(Protection::PivotRoot) {
        sys.chdir(&plan.new_root)
            .map_err(Failure::at(Stage::PivotRoot))?;
        // SAFETY: chroot to ".", a NUL-terminated constant.
        return match unsafe { libc::chroot(c".".as_ptr()) } {
            0 => Ok(()),
            _ => Err(Failure::at(Stage::PivotRoot)(Errno::last())),
        };
    }
    sys.pivot_root_here(&plan.new_root)
        .map_err(Failure::at(Stage::PivotRoot))
}

fn run_step(step: &Step, sys: &dyn Syscalls, fds: &[RawFd]) -> SysResult {
    match step {
        Step::Mount {
            source,
            target,
            fstype,
            flags,
            data,
            ..
        } => sys.mount(
            source.as_deref(),
            target,
            fstype.as_deref(),
            *flags,
            data.as_deref(),
        ),
        Step::Attach { index, target, .. } => {
            sys.move_mount(*fds.get(*index).ok_or(Errno(libc::EBADF))?, target)
        }
        Step::Mkdir { target, mode } => sys.mkdir(target, *mode),
        Step::Touch { target } => sys.touch(target),
        Step::Write { target, data, mode } => sys.write_file(target, data, *mode),
        Step::Symlink { link, target } => match sys.symlink(target, link) {
            Err(Errno(libc::EEXIST)) => Ok(()),
            r => r,
        },
    }
}

/// The command's process, from fork to execve. Returns only on failure.
pub fn exec_workload(
    exec: &ExecPlan,
    stdin: bool,
    stdio: Stdio,
    program: Option<RawFd>,
    sys: &dyn Syscalls,
) -> Failure {
    // a. A new session: the command has no controlling terminal from the
    //    host, so TIOCSTI on an inherited host terminal is refused.
    // SAFETY: setsid takes no arguments.
    if unsafe { libc::setsid() } < 0 {
        return Failure::at(Stage::Session)(Errno::last());
    }
    // a'. A clean signal state (brig blocks the signals it handles and
    //     Rust ignores SIGPIPE; both would otherwise survive execve) and
    //     the conventional umask.
    reset_signals();
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0o022) };
    // a''. The CPUs it is placed on, inherited by everything it starts:
    //      what `nproc` and thread pools count (crate::cpus). A hint, not
    //      a protection: a CPU gone offline meanwhile leaves it as it was.
    if !exec.cpus.is_empty() {
        let _ = crate::cpus::set_affinity(0, &exec.cpus);
    }
    // b. Standard streams: the pty slave, or the caller's streams with
    //    stdin replaced by /dev/null unless -i.
    let inherit = stdio.inherit;
    if let Err(e) = setup_stdio(stdin, stdio) {
        return Failure::at(Stage::Stdio)(e);
    }
    // c. Nothing of brig's reaches the command: every descriptor above
    //    stderr closes on exec (the error pipe included, which is how the
    //    host learns the exec succeeded).
    //    Except what the host asked the command to keep: a sandbox that
    //    outlives its host holds its own slot and liveness locks, so they
    //    are released exactly when it ends (brig-agent marks them
    //    close-on-exec for its own children).
    // SAFETY: close_range with constant arguments.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        )
    };
    for fd in inherit.into_iter().flatten() {
        // SAFETY: fcntl on a descriptor the host sent us.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
    }

    match (drop_privileges(exec, sys), program) {
        (Err(f), _) => f,
        (Ok(()), Some(fd)) => exec_program_fd(exec, fd),
        (Ok(()), None) => exec_command(exec),
    }
}

/// Steps d–h of the command's process: everything between its set-up and
/// execve that goes through [`Syscalls`], so it can be tested with a fake.
pub fn drop_privileges(exec: &ExecPlan, sys: &dyn Syscalls) -> Result<(), Failure> {
    // d. The working directory exists (created as root, then handed to the
    //    user). The path is resolved inside the sandbox's root, so `..`
    //    and symlinks cannot leave it.
    for dir in &exec.workdir_prefixes {
        let _ = sys.mkdir(dir, 0o755);
    }
    if let Some(last) = exec.workdir_prefixes.last() {
        let _ = sys.chown(last, exec.uid, exec.gid);
    }

    // e. Capabilities: shrink the bounding set first (needs CAP_SETPCAP,
    //    which we still have), then switch user (needs CAP_SETUID/SETGID),
    //    then set what the command keeps: a container root's set for uid 0,
    //    nothing for anyone else. All of them are capabilities of the
    //    sandbox's user namespace only.
    let knocked = exec.knockouts;
    let all_caps = knocked.has(Protection::Capabilities);
    if !all_caps {
        sys.drop_bounding_set(exec.bounding)
            .map_err(Failure::at(Stage::BoundingSet))?;
    }
    let filter = !knocked.has(Protection::Seccomp);
    let no_new_privs = !exec.allow_setuid && !knocked.has(Protection::NoNewPrivs);

    // With allow_setuid there is no no_new_privs, and installing a filter
    // without it takes CAP_SYS_ADMIN (in the sandbox's user namespace),
    // which we hold only until the user switch below. So the filter goes
    // in now; what remains (setgroups, setres[ug]id, capset, chdir, and
    // the descriptor moves and exec after this function) is all allowed
    // by it (checked by `the_filter_allows_what_follows_it`).
    if !no_new_privs && filter {
        sys.install_seccomp(seccomp::sandbox_filter())
            .map_err(Failure::at(Stage::Seccomp))?;
    }

    sys.set_ids(exec.uid, exec.gid, &exec.groups)
        .map_err(Failure::at(Stage::Identity))?;
    // Knockout: every capability of the sandbox's user namespace.
    let caps = if all_caps && exec.uid == 0 {
        (1u64 << 41) - 1 // through CAP_CHECKPOINT_RESTORE (40)
    } else {
        exec.caps
    };
    sys.set_capabilities(caps)
        .map_err(Failure::at(Stage::Capabilities))?;

    // f. Enter the working directory as the user: a directory the user may
    //    not enter is an error, not a silent privilege.
    sys.chdir(&exec.workdir)
        .map_err(Failure::at(Stage::Workdir))?;
    if !no_new_privs {
        return Ok(());
    }

    // g. no_new_privs: setuid bits and file capabilities grant nothing,
    //    and it is the precondition for an unprivileged seccomp filter.
    sys.set_no_new_privs()
        .map_err(Failure::at(Stage::NoNewPrivs))?;

    // h. seccomp last, so the steps above may use what it denies.
    if !filter {
        return Ok(());
    }
    sys.install_seccomp(seccomp::sandbox_filter())
        .map_err(Failure::at(Stage::Seccomp))
}

/// Run the program the host sent as a descriptor. It need not exist in the
/// sandbox's filesystem (this is how brig-agent gets into every sandbox).
fn exec_program_fd(exec: &ExecPlan, fd: RawFd) -> Failure {
    // SAFETY: fd is an open executable; the empty path with AT_EMPTY_PATH
    // means "this descriptor"; argv and envp are NULL-terminated arrays
    // owned by `exec`.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            c"".as_ptr(),
            exec.argv_ptr(),
            exec.env_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    Failure {
        stage: Stage::Exec,
        index: 0,
        errno: Errno::last(),
    }
}

/// execve each PATH candidate in turn, as execvp does: remember a
/// permission error but keep looking; stop on anything else.
fn exec_command(exec: &ExecPlan) -> Failure {
    let mut err = Errno(libc::ENOENT);
    for cand in &exec.candidates {
        // SAFETY: cand, argv and envp are NUL-terminated strings and
        // NULL-terminated pointer arrays owned by `exec`.
        unsafe { libc::execve(cand.as_ptr(), exec.argv_ptr(), exec.env_ptr()) };
        match Errno::last() {
            Errno(libc::ENOENT) | Errno(libc::ENOTDIR) => {}
            Errno(libc::EACCES) => err = Errno(libc::EACCES),
            other => {
                return Failure {
                    stage: Stage::Exec,
                    index: 0,
                    errno: other,
                }
            }
        }
    }
    Failure {
        stage: Stage::Exec,
        index: 0,
        errno: err,
    }
}

/// Close every descriptor above stderr except `a` and `b`.
fn close_other_fds(a: RawFd, b: RawFd) {
    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
    let close = |from: RawFd, to: RawFd| {
        if from <= to {
            // SAFETY: close_range on a range of our own descriptors.
            unsafe { libc::syscall(libc::SYS_close_range, from as u32, to as u32, 0u32) };
        }
    };
    close(3, lo - 1);
    close(lo + 1, hi - 1);
    close(hi + 1, RawFd::MAX);
}

/// Whether the host's end of the channel has been closed.
fn host_gone(sock: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd: sock,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: poll on one valid pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) };
    p.revents & (libc::POLLHUP | libc::POLLRDHUP | libc::POLLERR) != 0
}

fn reset_signals() {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it, and
    // signal() with SIG_DFL is async-signal-safe. Errors (SIGKILL, SIGSTOP,
    // and the unused numbers) are expected and ignored.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        for sig in 1..libc::SIGRTMIN() {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// Where the command's standard streams come from.
#[derive(Debug, Clone, Copy)]
pub struct Stdio {
    /// The pty slave (`-t`): all three streams, and the controlling tty.
    pub tty: Option<RawFd>,
    /// A socket from the host for stdin and stdout (stderr stays).
    pub socket: Option<RawFd>,
    /// Descriptors the command keeps as they are (the sandbox's own locks,
    /// when it outlives its host).
    pub inherit: [Option<RawFd>; 3],
}

fn setup_stdio(stdin: bool, stdio: Stdio) -> SysResult {
    // SAFETY: dup2/ioctl/open on descriptors we own and a constant path.
    unsafe {
        if let Some(slave) = stdio.tty {
            if libc::ioctl(slave, libc::TIOCSCTTY, 0) < 0 {
                return Err(Errno::last());
            }
            for fd in 0..3 {
                if libc::dup2(slave, fd) < 0 {
                    return Err(Errno::last());
                }
            }
            if slave > 2 {
                libc::close(slave);
            }
        } else if let Some(sock) = stdio.socket {
            for fd in 0..2 {
                if libc::dup2(sock, fd) < 0 {
                    return Err(Errno::last());
                }
            }
        } else if !stdin {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
            if null < 0 || libc::dup2(null, 0) < 0 {
                return Err(Errno::last());
            }
            libc::close(null);
        }
    }
    Ok(())
}

/// Open a pty pair on the sandbox's devpts: (master, slave).
fn open_pty() -> SysResult<(RawFd, RawFd)> {
    // SAFETY: open/ioctl on a constant path and our own descriptors.
    unsafe {
        let master = libc::open(
            c"/dev/ptmx".as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if master < 0 {
            return Err(Errno::last());
        }
        let unlock: libc::c_int = 0;
        if libc::ioctl(master, libc::TIOCSPTLCK, &unlock) < 0 {
            return Err(Errno::last());
        }
        // TIOCGPTPEER opens the slave without a path lookup.
        const TIOCGPTPEER: libc::c_ulong = 0x5441;
        let slave = libc::ioctl(master, TIOCGPTPEER as _, libc::O_RDWR | libc::O_NOCTTY);
        if slave < 0 {
            return Err(Errno::last());
        }
        Ok((master, slave))
    }
}

/// Wait for `main` (the command); reap every other child meanwhile. Returns
/// the command's status as an exit status a shell would report (128+N for
/// signal N), encoded as a wait status so the host can decode it.
fn reap_until(main: libc::pid_t) -> i32 {
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out-pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == main {
            let code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
            return (code & 0xff) << 8;
        }
        if pid < 0 && Errno::last() != Errno(libc::EINTR) {
            return 1 << 8;
        }
    }
}

fn write_failure(fd: RawFd, f: Failure) {
    let b = f.encode();
    // SAFETY: writing a stack buffer to our pipe; a short write cannot
    // happen for 12 bytes on a pipe.
    unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PlanInput, DEFAULT_CAPS};
    use crate::sys::{Call, Recording};
    use crate::template::{HostEntry, Identity, Layout};
    use brig_core::{SandboxId, SandboxSpec};
    use std::path::Path;

    fn plan(layout: &Layout, identity: &Identity) -> Plan {
        let id = SandboxId::from_random(7);
        Plan::build(&PlanInput {
            spec: &SandboxSpec::new(vec!["true".into()]),
            id: &id,
            layout,
            identity,
            staging: Path::new("/st"),
            nofile_hard: 4096,
            proc_has: &|_| true,
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
    fn root_is_private_then_scratch_then_steps_then_pivot() {
        let p = plan(
            &Layout::Host(vec![HostEntry::Bind("/usr".into())]),
            &Identity::root(),
        );
        let sys = Recording::default();
        prepare_root(&p, &sys, &[]).unwrap();
        let calls = sys.calls();
        assert_eq!(
            calls[0],
            Call::Mount {
                source: None,
                target: "/".into(),
                fstype: None,
                flags: libc::MS_REC | libc::MS_PRIVATE,
                data: None
            }
        );
        assert!(
            matches!(&calls[1], Call::Mount { fstype: Some(f), target, .. } if f == "tmpfs" && target == "/st")
        );
        assert_eq!(
            calls.last().unwrap(),
            &Call::PivotRoot {
                new_root: "/st".into()
            }
        );
        // The /usr bind is read-only after its remount.
        assert!(calls.iter().any(|c| matches!(c, Call::Mount { target, flags, .. }
            if target == "/st/usr" && flags & libc::MS_RDONLY != 0 && flags & libc::MS_REMOUNT != 0)));
        assert!(calls
            .iter()
            .any(|c| matches!(c, Call::Mount { fstype: Some(f), .. } if f == "proc")));
        assert!(calls.iter().any(|c| matches!(c, Call::Mount { fstype: Some(f), data: Some(d), .. } if f == "devpts" && d.contains("newinstance"))));
    }

    #[test]
    fn overlay_attaches_the_host_supplied_fd() {
        let p = plan(
            &Layout::Overlay {
                lowers: vec!["/rootfs".into()],
            },
            &Identity::root(),
        );
        let sys = Recording::default();
        prepare_root(&p, &sys, &[42]).unwrap();
        assert!(sys.calls().contains(&Call::MoveMount {
            fd: 42,
            target: "/st/lower".into()
        }));
        // Without the fd, the step fails and names itself.
        let err = prepare_root(&p, &Recording::default(), &[]).unwrap_err();
        assert_eq!(err.stage, Stage::MountStep);
        assert!(p.steps[err.index as usize]
            .describe()
            .contains("attach the template"));
    }

    #[test]
    fn a_failing_mount_reports_its_step() {
        let p = plan(&Layout::Host(vec![]), &Identity::root());
        let sys = Recording {
            fail_on: Some("\"proc\"".into()),
            ..Default::default()
        };
        let err = prepare_root(&p, &sys, &[]).unwrap_err();
        assert_eq!(
            (err.stage, err.errno),
            (Stage::MountStep, Errno(libc::EPERM))
        );
        assert_eq!(
            p.steps[err.index as usize].describe(),
            "mount proc at /st/proc"
        );
    }

    #[test]
    fn privileges_drop_in_order_for_root_and_for_users() {
        for (identity, caps) in [
            (Identity::root(), DEFAULT_CAPS),
            (
                Identity {
                    uid: 1000,
                    gid: 1000,
                    groups: vec![1000],
                    home: "/home/u".into(),
                    name: Some("u".into()),
                },
                0,
            ),
        ] {
            let p = plan(&Layout::Host(vec![]), &identity);
            let sys = Recording::default();
            drop_privileges(&p.exec, &sys).unwrap();
            assert_eq!(
                sys.calls(),
                vec![
                    Call::DropBoundingSet { keep: caps },
                    Call::SetIds {
                        uid: identity.uid,
                        gid: identity.gid,
                        groups: identity.groups.clone()
                    },
                    Call::SetCapabilities(caps),
                    Call::Chdir("/".into()),
                    Call::NoNewPrivs,
                    Call::Seccomp {
                        len: seccomp::sandbox_filter().len()
                    },
                ]
            );
        }
    }

    #[test]
    fn with_allow_setuid_seccomp_goes_in_before_the_user_switch_and_nnp_is_skipped() {
        let identity = Identity {
            uid: 1000,
            gid: 1000,
            groups: vec![1000],
            home: "/home/u".into(),
            name: Some("u".into()),
        };
        let mut p = plan(&Layout::Host(vec![]), &identity);
        p.exec.allow_setuid = true;
        p.exec.bounding = DEFAULT_CAPS;
        let sys = Recording::default();
        drop_privileges(&p.exec, &sys).unwrap();
        assert_eq!(
            sys.calls(),
            vec![
                Call::DropBoundingSet { keep: DEFAULT_CAPS },
                Call::Seccomp {
                    len: seccomp::sandbox_filter().len()
                },
                Call::SetIds {
                    uid: 1000,
                    gid: 1000,
                    groups: vec![1000]
                },
                Call::SetCapabilities(0),
                Call::Chdir("/".into()),
            ]
        );
    }

    #[test]
    fn the_filter_allows_what_follows_it() {
        // What drop_privileges and the exec path call after the filter is
        // in when allow_setuid reorders it.
        let denied = seccomp::DENIED;
        for name in [
            "setgroups",
            "setresgid",
            "setresuid",
            "capset",
            "chdir",
            "prctl",
            "dup2",
            "dup3",
            "close_range",
            "execve",
            "execveat",
            "write",
            "exit_group",
        ] {
            assert!(!denied.contains(&name), "the filter denies {name}");
        }
    }

    #[test]
    fn failures_round_trip_through_bytes() {
        let f = Failure {
            stage: Stage::Exec,
            index: 3,
            errno: Errno(libc::ENOENT),
        };
        assert_eq!(Failure::decode(&f.encode()), Some(f));
        assert_eq!(Failure::decode(&[0; 12]), None);
        assert_eq!(Failure::decode(&[1, 2, 3]), None);
    }
}
