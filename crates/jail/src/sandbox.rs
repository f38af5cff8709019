//! The host side of a sandbox's life: spawn, watch, kill, reap.
//!
//! [`Sandbox::spawn`] reads top to bottom:
//! 1. validate the spec, resolve the template and the user, build the
//!    [`Plan`] (all before `clone`, since the child may not allocate);
//! 2. take a uid [`slot`];
//! 3. `clone` the sandbox's init into new user, mount, pid, ipc, uts and
//!    network namespaces (the cgroup namespace comes later, from inside);
//! 4. write its uid/gid maps, send the template's idmapped mount and let it
//!    go; then, while it builds its root, create the [`Cgroup`] with its
//!    limits and move it in ("joined");
//! 5. wait until the command is executing, or report why it is not.
//!
//! Afterwards the caller watches [`Sandbox::pidfd`] (readable when the
//! sandbox has ended) and, on cgroup v1, [`Sandbox::oom_fd`], then calls
//! [`Sandbox::wait`]. A long-lived host may instead take the command's
//! status early with [`Sandbox::wait_command`] and finish with `wait` on a
//! reaper thread. Dropping a `Sandbox` kills it and cleans up.
//!
//! **Call `spawn` from a thread that outlives the sandbox.** The init dies
//! with its parent through `PR_SET_PDEATHSIG`, and the kernel's notion of
//! "parent" is the *thread* that cloned it: when that thread exits, every
//! sandbox it spawned is killed. A multi-threaded host (the daemon) needs a
//! long-lived spawner thread; tokio's `spawn_blocking` threads, which exit
//! when idle, would kill their sandboxes.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use brig_core::{ByteSize, SandboxId, SandboxSpec, TemplateRef};

use crate::bringup::{self, Channels, Failure, Stage};
use crate::cgroup::{Cgroup, CgroupControls, CgroupError, Hierarchy};
use crate::error::JailError;
use crate::fdpass;
use crate::netpool::{self, NetnsPool, PooledNet};
use crate::plan::{self, Plan, PlanInput};
use crate::slot::{self, Slot};
use crate::sys::Errno;
use crate::template::{self, HostEntry, Layout};
use crate::trace::{now_ns, Marks};
use crate::views;
use crate::{reconcile, seccomp};

/// Exit status of a sandbox whose set-up failed before the command ran.
pub const SETUP_FAILED_EXIT: i32 = 125;

/// The process tier's runtime state: host-wide, because uid ranges and
/// cgroups are host-wide (two brig homes on one host must not hand out the
/// same uid range), and on tmpfs, because none of it outlives a reboot.
pub const RUNTIME_DIR: &str = "/run/brig";

/// Where a host keeps the process tier's runtime state.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// [`RUNTIME_DIR`]: slot locks and the staging mount point.
    pub run_dir: PathBuf,
    pub hierarchy: Hierarchy,
    /// Pre-made network namespaces (the warm path of a long-lived process);
    /// without one, each sandbox creates its own in `clone`.
    pub net_pool: Option<Arc<NetnsPool>>,
    /// Give every sandbox the cgroups that pause/resume and CPU accounting
    /// need ([`Sandbox::controls`]): on cgroup v1 the freezer, cpuacct and
    /// cpu groups (a few more mkdirs per spawn). The daemon sets it; a
    /// one-shot `brig run` does not.
    pub pausable: bool,
    /// What spawning needs to know about this host and process, read once.
    pub host: Arc<HostFacts>,
    /// Places sandboxes with a CPU limit on CPUs of their own
    /// ([`crate::cpus`]).
    pub cpus: Arc<crate::cpus::CpuPlacer>,
}

/// Facts about the host and this process that do not change while brig
/// runs, read once by [`SpawnOptions::prepare`] instead of on every spawn.
#[derive(Debug)]
pub struct HostFacts {
    /// The `host` template, resolved against `/`.
    host_layout: Layout,
    /// Mount flags locked on each host path the `host` template binds.
    locked: Vec<(PathBuf, libc::c_ulong)>,
    /// Which optional /proc paths this kernel has.
    proc_paths: Vec<String>,
    nofile_hard: u64,
    argv_area: Option<(usize, usize)>,
    /// The host's /proc/meminfo and /proc/cpuinfo, the text a sandbox's
    /// views of them are made from ([`crate::views`]).
    meminfo: Option<String>,
    cpuinfo: Option<String>,
}

impl HostFacts {
    pub fn read() -> Self {
        let host_layout = Layout::resolve(&TemplateRef::Host);
        let locked = match &host_layout {
            Layout::Host(entries) => entries
                .iter()
                .filter_map(|e| match e {
                    HostEntry::Bind(p) => Some((p.clone(), plan::locked_flags(p))),
                    HostEntry::Symlink(..) => None,
                })
                .collect(),
            Layout::Overlay { .. } => Vec::new(),
        };
        let proc_paths = plan::READONLY_PROC
            .iter()
            .chain(&[views::BOOT_ID, views::MEMINFO, views::CPUINFO])
            .filter(|f| Path::new("/proc").join(f).exists())
            .map(|f| f.to_string())
            .collect();
        HostFacts {
            host_layout,
            locked,
            proc_paths,
            nofile_hard: nofile_hard(),
            argv_area: plan::argv_area(),
            meminfo: std::fs::read_to_string("/proc/meminfo").ok(),
            cpuinfo: std::fs::read_to_string("/proc/cpuinfo").ok(),
        }
    }

    fn layout(&self, t: &TemplateRef) -> Layout {
        match t {
            TemplateRef::Host => self.host_layout.clone(),
            other => Layout::resolve(other),
        }
    }

    fn locked_flags(&self, p: &Path) -> libc::c_ulong {
        self.locked
            .iter()
            .find(|(q, _)| q == p)
            .map_or_else(|| plan::locked_flags(p), |(_, f)| *f)
    }
}

impl SpawnOptions {
    /// Detect the cgroup layout, make sure the runtime directory exists,
    /// and reap whatever an earlier, killed brig left behind.
    pub fn prepare() -> Result<Self, JailError> {
        let run_dir = PathBuf::from(RUNTIME_DIR);
        ensure_tmpfs(&run_dir)?;
        let staging = run_dir.join("mnt");
        if !staging.is_dir() {
            fs::create_dir_all(&staging).map_err(|source| JailError::Host {
                op: "create the runtime directory",
                path: staging.clone(),
                source,
            })?;
        }
        let hierarchy = Hierarchy::detect().map_err(CgroupError::from)?;
        reconcile::reap(&hierarchy, &run_dir);
        Ok(SpawnOptions {
            host: Arc::new(HostFacts::read()),
            cpus: crate::cpus::CpuPlacer::new(),
            run_dir,
            hierarchy,
            net_pool: None,
            pausable: false,
        })
    }

    fn staging(&self) -> PathBuf {
        self.run_dir.join("mnt")
    }
}

/// What a long-lived host may hand a sandbox besides its spec.
#[derive(Debug, Default)]
pub struct Extras {
    /// Run this open executable instead of looking `command[0]` up on the
    /// sandbox's PATH (`command` is still its argv). It need not exist in
    /// the sandbox's filesystem: this is how brig-agent enters every
    /// sandbox. It must not be writable by the sandbox's users (a host
    /// file owned by root, or a sealed memfd).
    pub program: Option<OwnedFd>,
    /// Connect the command's stdin and stdout to this socket (stderr stays
    /// the caller's): the byte stream a host speaks the agent protocol on.
    pub stdio: Option<OwnedFd>,
    /// Run the command *as* the sandbox's init (pid 1) instead of in a
    /// child of brig's init. The command must reap orphans (brig-agent
    /// does). What it saves is the init: a clone of a long-lived,
    /// multi-threaded host keeps a copy-on-write image of the host's
    /// memory (page tables and every page the host writes afterwards) for
    /// as long as it lives, about 3 MiB per sandbox measured under
    /// `brig serve`; exec drops it. The command's exit still ends the
    /// sandbox (the kernel kills the rest of its pid namespace), and its
    /// status is the init's.
    pub as_init: bool,
    /// The sandbox's id, chosen by the caller (who may have recorded it
    /// before the spawn); `None`: a random one.
    pub id: Option<SandboxId>,
    /// Let the sandbox outlive this process: its init does not die with
    /// the spawning thread (no `PR_SET_PDEATHSIG`), and it holds its own
    /// slot and liveness locks (passed to it, kept open across the exec of
    /// its command), so the uid range stays taken and reconcile sees it as
    /// live exactly as long as it runs. A later process finds it again
    /// with [`Sandbox::adopt`]. For a daemon's sandboxes (the command must
    /// be a long-lived init such as brig-agent).
    pub detach: bool,
    /// Start the sandbox in this ready-made network namespace (one with a
    /// link to brig's gateway) instead of a fresh one with loopback only.
    pub net: Option<PooledNet>,
    /// Host directories to mount read-write inside, at the paths given
    /// (absolute and clean: [`brig_core::volume::check_paths`]). Each is
    /// idmapped through the sandbox's user namespace, so its files are
    /// stored under the ids the sandbox sees (uid 1000 inside is 1000 on
    /// disk) whichever host range the sandbox has.
    pub volumes: Vec<(PathBuf, String)>,
}

/// How a sandbox ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The command's status as a shell reports it (128+N for signal N).
    pub code: i32,
    /// The kernel's OOM killer fired inside the sandbox.
    pub oom: bool,
    pub memory_limit: ByteSize,
}

/// A running sandbox.
#[derive(Debug)]
pub struct Sandbox {
    id: SandboxId,
    pid: libc::pid_t,
    init: Arc<Init>,
    pty: Option<OwnedFd>,
    oom: Option<OwnedFd>,
    cgroup: Option<Cgroup>,
    slot: Option<Slot>,
    memory_limit: ByteSize,
    reaped: bool,
    /// [`Sandbox::kill`] was called: reaping keeps thawing the cgroup, in
    /// case another thread froze it after the kill's thaw.
    killed: Arc<AtomicBool>,
    /// Found with [`Sandbox::adopt`]: not our child, so its end is read
    /// from the pidfd (no exit status) and its locks are its own.
    adopted: bool,
    /// [`Sandbox::release`]d: dropping it ends nothing.
    released: bool,
    run_dir: PathBuf,
    /// The channel to the init, which reports the command's status on it
    /// before its own (slower) exit.
    status: Option<OwnedFd>,
    command_exit: Option<Exit>,
    /// The CPUs it was placed on, counted as used while this is held.
    cpus: Option<crate::cpus::Placement>,
}

fn os_err(op: &'static str) -> impl FnOnce(Errno) -> JailError {
    move |errno| JailError::HostCall { op, errno }
}

impl Sandbox {
    /// Start `spec.command` in a new sandbox and return once it is
    /// executing.
    pub fn spawn(spec: &SandboxSpec, opts: &SpawnOptions) -> Result<Sandbox, JailError> {
        Self::spawn_with(spec, opts, Extras::default())
    }

    /// [`Sandbox::spawn`], with a program and/or a stdio socket from the
    /// host (see [`Extras`]).
    pub fn spawn_with(
        spec: &SandboxSpec,
        opts: &SpawnOptions,
        extras: Extras,
    ) -> Result<Sandbox, JailError> {
        // 1. Everything the child needs, computed while allocating is safe.
        let mut trace = HostTrace::new();
        spec.validate()?;
        if spec.limits.cpus.is_some() && !opts.hierarchy.supports_cpu_limit() {
            return Err(JailError::NoCpuController);
        }
        let id = match &extras.id {
            Some(id) => id.clone(),
            None => SandboxId::from_random(rand::random()),
        };
        let mut extras = extras;
        let pooled: Option<PooledNet> = extras
            .net
            .take()
            .or_else(|| opts.net_pool.as_ref().and_then(|p| p.take()));
        let layout = opts.host.layout(&spec.template);
        let identity = template::resolve_user(layout.root_on_host(), spec.user.as_ref())?;
        let staging = opts.staging();
        let volume_paths: Vec<String> = extras.volumes.iter().map(|(_, p)| p.clone()).collect();
        brig_core::volume::check_paths(volume_paths.iter().map(String::as_str))
            .map_err(|e| JailError::Volume(e.to_string()))?;
        let placement = opts.cpus.place(spec.limits.cpus);
        let plan = Plan::build(&PlanInput {
            spec,
            id: &id,
            layout: &layout,
            identity: &identity,
            staging: &staging,
            nofile_hard: opts.host.nofile_hard,
            proc_has: &|f| opts.host.proc_paths.iter().any(|p| p == f),
            locked_flags: &|p| opts.host.locked_flags(p),
            argv_area: opts.host.argv_area,
            host_meminfo: opts.host.meminfo.as_deref(),
            host_cpuinfo: opts.host.cpuinfo.as_deref(),
            pooled_net: pooled.is_some(),
            program_fd: extras.program.is_some(),
            stdio_fd: extras.stdio.is_some(),
            volumes: &volume_paths,
            cpus: placement.as_ref().map(crate::cpus::Placement::cpus),
        });
        let mut plan = plan;
        plan.trace = trace.on;
        plan.as_init = extras.as_init;
        plan.die_with_host = !extras.detach;
        // A daemon's sandbox on an overlay keeps its writable layer
        // reachable for snapshots (its pid 1 holds it: plan::LAYER_FD).
        plan.keep_layer = extras.detach
            && extras.as_init
            && spec.upper_dir.is_none()
            && matches!(layout, crate::template::Layout::Overlay { .. });
        if extras.detach {
            // The two locks go last, after the program and stdio socket.
            let first = plan.mount_fds
                + usize::from(extras.program.is_some())
                + usize::from(extras.stdio.is_some());
            plan.exec.inherit_fds = [Some(first), Some(first + 1)];
        }
        seccomp::init();
        trace.hit("plan built");

        // 2. Host resources: a uid range of its own and its cgroups. Both
        //    are released by Drop if anything below fails.
        let slot = slot::acquire(&opts.run_dir, &id)?;
        trace.hit("slot taken");
        let (host_sock, child_sock) = socketpair()?;
        let (err_read, err_write) = pipe()?;

        // 3. The init, in new namespaces. Raw clone with a NULL stack
        //    behaves like fork; CLONE_PIDFD gives a descriptor that cannot
        //    refer to a recycled pid.
        let mut flags = libc::CLONE_NEWUSER
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS
            | libc::CLONE_PIDFD;
        {
            use crate::knockout::{off, Protection};
            for (p, f) in [
                (Protection::PidNs, libc::CLONE_NEWPID),
                (Protection::IpcNs, libc::CLONE_NEWIPC),
                (Protection::UtsNs, libc::CLONE_NEWUTS),
            ] {
                if off(p) {
                    flags &= !f;
                }
            }
        }
        // A pooled network namespace is entered by this thread just for the
        // clone (network namespaces are per thread) and left right after;
        // otherwise the init gets a fresh one.
        let home_net = match &pooled {
            Some(_) => {
                Some(netpool::current().map_err(os_err("open this thread's network namespace"))?)
            }
            None => None,
        };
        if let Some(net) = &pooled {
            netpool::enter(&net.ns).map_err(os_err("enter a pooled network namespace"))?;
        } else if !crate::knockout::off(crate::knockout::Protection::NetNs) {
            flags |= libc::CLONE_NEWNET;
        }
        let mut pidfd: libc::c_int = -1;
        let channels = Channels {
            sync: child_sock.as_raw_fd(),
            error: err_write.as_raw_fd(),
        };
        // Declared before `sandbox` below, so any early return drops (kills
        // and reaps) the sandbox before the stack its init may still run on.
        let init_stack = extras.as_init.then(|| plan::Stack::new(INIT_STACK));
        // Read by that child at its start, concurrently with us: it must
        // live as long as the stack does, not just for the clone call.
        let init_args = InitArgs {
            plan: &plan,
            channels,
        };
        let pid = match &init_stack {
            // An init that will exec its command in place shares our memory
            // until then (CLONE_VM, on a stack of its own), as posix_spawn's
            // child does: a fork would copy the page tables of every mapping
            // of a long-lived host (20 ms with a thousand sandboxes' threads
            // in `brig serve`) only for exec to throw the copy away.
            Some(stack) => {
                // SAFETY: init_entry runs on `stack` (alive until the child
                // has exec'd or been reaped, see above) and, like the fork
                // case, only reads the plan and makes system calls: nothing
                // between here and its execve allocates, takes a lock or
                // writes memory it shares with us beyond its own stack. It
                // shares our thread's TLS, so errno too, which we keep
                // writing meanwhile: its system calls (sys::Linux) take
                // their errors from the kernel's return value, not errno.
                // CLONE_PIDFD stores the pidfd through the parent-tid
                // argument.
                unsafe {
                    libc::clone(
                        init_entry,
                        stack.top(),
                        flags | libc::CLONE_VM | libc::SIGCHLD,
                        &init_args as *const InitArgs<'_> as *mut libc::c_void,
                        &mut pidfd as *mut libc::c_int,
                    ) as libc::c_long
                }
            }
            // SAFETY: clone without CLONE_VM and with a NULL stack is fork
            // with extra namespaces. The child touches only the pre-built
            // plan and makes system calls (bringup::init_main), then _exits
            // or execs.
            None => unsafe {
                libc::syscall(
                    libc::SYS_clone,
                    (flags | libc::SIGCHLD) as libc::c_ulong,
                    0usize,
                    &mut pidfd as *mut libc::c_int,
                    0usize,
                    0usize,
                )
            },
        };
        if pid != 0 {
            if let Some(home) = &home_net {
                // Back to the thread's namespace, whatever clone did. If
                // this fails the thread is unusable for networking; say so
                // rather than carry on in a sandbox's namespace.
                netpool::enter(home).expect("return to the host network namespace after a spawn");
            }
        }
        if pid < 0 {
            return Err(JailError::namespaces(Errno::last()));
        }
        if pid == 0 {
            drop(host_sock);
            drop(err_read);
            bringup::init_main(&plan, channels);
        }
        let pid = pid as libc::pid_t;
        trace.hit("cloned");
        drop(child_sock);
        drop(err_write);
        // SAFETY: the kernel returned a fresh pidfd for the child.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        let init = Arc::new(Init {
            pid,
            // Only a sandbox whose pidfd is closed later needs it (see Init).
            start: if extras.detach {
                start_time(pid).unwrap_or(0)
            } else {
                0
            },
            fd: std::sync::Mutex::new(Some(Arc::new(pidfd))),
            reaped: AtomicBool::new(false),
        });
        let mut sandbox = Sandbox {
            id,
            pid,
            init,
            pty: None,
            oom: None,
            memory_limit: spec.limits.memory,
            cgroup: None,
            slot: Some(slot),
            reaped: false,
            killed: Arc::new(AtomicBool::new(false)),
            adopted: false,
            released: false,
            run_dir: opts.run_dir.clone(),
            status: None,
            command_exit: None,
            cpus: placement,
        };

        // 4. Give the init an identity and its template, then let it go.
        //    Until the maps are written it is nobody in its own namespace
        //    and can do nothing.
        let base = sandbox.slot.as_ref().map_or(slot::BASE, Slot::host_base);
        write_id_map(pid, "uid_map", base)?;
        write_id_map(pid, "gid_map", base)?;
        let mut template_fds = match &layout {
            Layout::Overlay { lowers } => lowers
                .iter()
                .map(|lower| idmapped(lower, pid, true))
                .collect::<Result<Vec<_>, _>>()?,
            Layout::Host(_) => Vec::new(),
        };
        // A kept writable layer (an image build's RUN): writable, and
        // idmapped so what the sandbox's root writes is root's on disk.
        if let Some(upper) = &spec.upper_dir {
            template_fds.push(idmapped(upper, pid, false)?);
        }
        if let Some(net) = pooled {
            // The namespace lives on in the init; our copies go.
            drop(net.ns);
            template_fds.push(net.sysfs);
        }
        for (source, _) in &extras.volumes {
            template_fds.push(idmapped_volume(source, pid)?);
        }
        // In the order the plan expects: mounts, then program, then stdio.
        template_fds.extend(extras.program);
        template_fds.extend(extras.stdio);
        if extras.detach {
            if let Some(slot) = &sandbox.slot {
                for fd in slot.lock_fds() {
                    template_fds.push(fd.try_clone_to_owned().map_err(|e| {
                        JailError::HostCall {
                            op: "duplicate the slot lock for the sandbox",
                            errno: Errno(e.raw_os_error().unwrap_or(libc::EBADF)),
                        }
                    })?);
                }
            }
        }
        trace.hit("maps written, template mounts made");
        let raw: Vec<RawFd> = template_fds.iter().map(|f| f.as_raw_fd()).collect();
        // A failed send means the init already died; its reason is on the
        // error pipe, read below.
        let _ = fdpass::send(host_sock.as_raw_fd(), &[1], &raw);
        drop(template_fds);

        // 4b. While the init builds its root (on the other core), create
        //     the cgroups (a memory cgroup costs the kernel 0.1-0.7 ms
        //     here) and move the init in. It waits for "joined" before it
        //     forks anything or runs a byte of the command.
        let cgroup = Cgroup::create(
            &opts.hierarchy,
            sandbox.id.as_str(),
            &spec.limits,
            opts.pausable,
        )?;
        // Only a host that watches the sandbox (brig run) reads it; a
        // daemon's sandboxes would each hold one more descriptor for
        // nothing (a v1 OOM shows in the group's oom_kill count anyway).
        if !extras.detach {
            sandbox.oom = cgroup.oom_eventfd()?;
        }
        cgroup.attach(pid)?;
        sandbox.cgroup = Some(cgroup);
        let _ = fdpass::send(host_sock.as_raw_fd(), &[2], &[]);
        trace.hit("cgroups created and joined");

        // 5. The init answers "ready" (with the pty master for -t), then the
        //    error pipe reaches EOF when the command is executing, or
        //    carries the step that failed.
        let mut fds = [-1; fdpass::MAX_FDS];
        let mut ready = [0u8; 12 * crate::trace::MAX_MARKS];
        if let Ok((len, n)) = fdpass::recv(host_sock.as_raw_fd(), &mut ready, &mut fds) {
            if trace.on && len > 1 {
                trace.child = Marks::decode(&ready[..len]);
            }
            for (i, fd) in fds.iter().take(n).enumerate() {
                // SAFETY: the kernel installed these descriptors for us.
                let owned = unsafe { OwnedFd::from_raw_fd(*fd) };
                if i == 0 {
                    sandbox.pty = Some(owned);
                }
            }
        }
        sandbox.status = Some(host_sock);
        let failure = read_failure(&err_read);
        trace.hit("command executing");
        trace.print();
        if let Some(failure) = failure {
            return Err(failure_to_error(failure, &plan));
        }
        if extras.detach {
            // The sandbox holds its own locks now, and its init (the
            // command itself) reports no status: two descriptors fewer per
            // sandbox for a host that keeps thousands.
            if let Some(slot) = sandbox.slot.take() {
                slot.hand_over();
            }
            sandbox.status = None;
            sandbox.init.close();
        }
        Ok(sandbox)
    }

    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    /// The init's pid (in the host's pid namespace).
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Readable once the sandbox has ended. Only a sandbox that was not
    /// spawned with [`Extras::detach`] keeps its pidfd open; for one that
    /// was, this is -1.
    pub fn pidfd(&self) -> RawFd {
        self.init.held().map_or(-1, |fd| fd.as_raw_fd())
    }

    /// On cgroup v1: readable when the sandbox ran out of memory (kill it).
    pub fn oom_fd(&self) -> Option<BorrowedFd<'_>> {
        self.oom.as_ref().map(|f| f.as_fd())
    }

    /// The master side of the command's terminal (only with `tty`).
    pub fn take_pty(&mut self) -> Option<OwnedFd> {
        self.pty.take()
    }

    pub fn cgroup_dirs(&self) -> &[PathBuf] {
        self.cgroup.as_ref().map_or(&[], |c| c.dirs())
    }

    /// A handle to the sandbox's cgroups (freeze, thaw, statistics, new
    /// limits) for another thread to keep while this one owns the sandbox.
    /// Pause/resume and CPU usage need [`SpawnOptions::pausable`] on cgroup
    /// v1.
    pub fn controls(&self) -> Option<CgroupControls> {
        self.cgroup.as_ref().map(|c| c.controls(self.pid))
    }

    /// The memory limit in force now (it may have been changed through
    /// [`Sandbox::controls`]).
    fn current_memory_limit(&self) -> ByteSize {
        self.cgroup
            .as_ref()
            .and_then(Cgroup::memory_limit_now)
            .map_or(self.memory_limit, ByteSize)
    }

    /// Kill everything in the sandbox. Its init dies, and the kernel kills
    /// the rest of its pid namespace with it. A frozen (paused) sandbox is
    /// thawed so that it acts on the signal.
    pub fn kill(&self) {
        self.killer().kill();
    }

    /// A handle that kills this sandbox from any thread while another one
    /// waits for it ([`Sandbox::wait`] takes the sandbox).
    pub fn killer(&self) -> Killer {
        Killer {
            init: Arc::clone(&self.init),
            killed: Arc::clone(&self.killed),
            dirs: self.cgroup_dirs().into(),
        }
    }

    /// Find a sandbox an earlier process spawned with [`Extras::detach`]:
    /// `pid` is its init as that process recorded it, `start_time` the
    /// init's start time (field 22 of `/proc/<pid>/stat`, see
    /// [`start_time`]), which tells it from a recycled pid. `Ok(None)`:
    /// it is not running any more.
    ///
    /// The adopted sandbox is not this process's child: its end is read
    /// from a pidfd (without an exit status) and its locks stay its own.
    /// The CPUs it was placed on, for a holder that outlives this value
    /// (the process tier's instance, which may place it again).
    pub fn take_cpus(&mut self) -> Option<crate::cpus::Placement> {
        self.cpus.take()
    }

    pub fn adopt(
        id: &SandboxId,
        pid: libc::pid_t,
        start: u64,
        opts: &SpawnOptions,
    ) -> Result<Option<Sandbox>, JailError> {
        if pid <= 1 {
            return Ok(None);
        }
        // SAFETY: pidfd_open with integer arguments; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
        if fd < 0 {
            return match Errno::last() {
                Errno(libc::ESRCH) => Ok(None),
                e => Err(os_err("open a pidfd for an adopted sandbox")(e)),
            };
        }
        // SAFETY: the kernel returned a fresh descriptor.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        // The pid could have been recycled since it was recorded: the
        // start time (read while the pidfd pins the process) and the
        // cgroup must both be the sandbox's.
        if start_time(pid) != Some(start) || !in_cgroup_of(pid, id) {
            return Ok(None);
        }
        // Opened again when needed (see Init).
        drop(pidfd);
        let cgroup = Cgroup::open(&opts.hierarchy, id.as_str());
        let memory_limit = ByteSize(cgroup.as_ref().map_or(0, Cgroup::memory_limit));
        Ok(Some(Sandbox {
            id: id.clone(),
            pid,
            init: Arc::new(Init {
                pid,
                start,
                fd: std::sync::Mutex::new(None),
                reaped: AtomicBool::new(false),
            }),
            pty: None,
            oom: None,
            cgroup,
            slot: None,
            memory_limit,
            reaped: false,
            killed: Arc::new(AtomicBool::new(false)),
            adopted: true,
            released: false,
            run_dir: opts.run_dir.clone(),
            status: None,
            command_exit: None,
            cpus: None,
        }))
    }

    /// Found with [`Sandbox::adopt`] rather than spawned by this process.
    pub fn is_adopted(&self) -> bool {
        self.adopted
    }

    /// Let go of a sandbox without ending it: it runs on, and a later
    /// process may [`Sandbox::adopt`] it. Only for a sandbox spawned with
    /// [`Extras::detach`] (or adopted); any other dies with its spawning
    /// thread anyway.
    pub fn release(mut self) {
        if let Some(cg) = self.cgroup.take() {
            cg.forget();
        }
        // The sandbox holds its own copies of the locks; ours go, and its
        // liveness file stays (Drop would remove it).
        if let Some(slot) = self.slot.take() {
            slot.hand_over();
        }
        self.released = true;
    }

    /// Readable once the command has exited (its status has arrived) or
    /// the init died.
    pub fn status_fd(&self) -> Option<BorrowedFd<'_>> {
        self.status.as_ref().map(|f| f.as_fd())
    }

    /// Block until the command itself has exited and return how, without
    /// waiting for the sandbox's teardown (about a millisecond of
    /// unmounting in the init's exit). Call [`Sandbox::wait`] afterwards,
    /// possibly on another thread, to finish and release everything.
    pub fn wait_command(&mut self) -> Result<Exit, JailError> {
        if let Some(exit) = &self.command_exit {
            return Ok(exit.clone());
        }
        let mut buf = [0u8; 4];
        let mut fds = [-1; fdpass::MAX_FDS];
        let reported = match &self.status {
            Some(sock) => matches!(
                fdpass::recv(sock.as_raw_fd(), &mut buf, &mut fds),
                Ok((4, _))
            ),
            None => false,
        };
        let exit = if reported {
            let status = i32::from_ne_bytes(buf);
            // The init reports its command's end as an exit status
            // (128 + signal for a signal: `bringup::reap_until`).
            let oom = self.oom_killed(libc::WEXITSTATUS(status) == 128 + libc::SIGKILL);
            Exit {
                code: libc::WEXITSTATUS(status),
                oom,
                memory_limit: self.current_memory_limit(),
            }
        } else {
            // The init died without reporting (killed): its own status is
            // the answer, and the sandbox is gone already.
            let status = self.reap()?;
            self.exit_from(status)
        };
        self.command_exit = Some(exit.clone());
        Ok(exit)
    }

    /// Whether the OOM killer killed something in the sandbox. The kernel
    /// counts a kill after sending its SIGKILL, so the victim's end can be
    /// seen (its connection closing, its parent reaping it) before the
    /// count moves: after a death by SIGKILL in a sandbox that has run
    /// into its memory limit, the count is read again for up to 100 ms.
    /// (Whether brig sent a SIGKILL too says nothing: the daemon kills a
    /// sandbox whose agent's connection ended, which may be the OOM
    /// killer's victim still exiting.)
    fn oom_killed(&self, sigkilled: bool) -> bool {
        let Some(cgroup) = self.cgroup.as_ref() else {
            return false;
        };
        let tries = if sigkilled && cgroup.hit_memory_limit() {
            10
        } else {
            1
        };
        for i in 0..tries {
            if cgroup.oom_killed() {
                return true;
            }
            if i + 1 < tries {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        false
    }

    fn exit_from(&self, status: i32) -> Exit {
        let sigkilled = libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL;
        let oom = self.oom_killed(sigkilled);
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            128 + libc::WTERMSIG(status)
        };
        Exit {
            code,
            oom,
            memory_limit: self.current_memory_limit(),
        }
    }

    /// Block until the sandbox ends, then release everything it held.
    pub fn wait(mut self) -> Result<Exit, JailError> {
        let exit = match self.command_exit.take() {
            Some(exit) => {
                if !self.reaped {
                    self.reap()?;
                }
                exit
            }
            None => {
                let status = self.reap()?;
                self.exit_from(status)
            }
        };
        self.teardown()?;
        Ok(exit)
    }

    fn reap(&mut self) -> Result<i32, JailError> {
        if self.killed.load(Ordering::SeqCst) {
            self.await_death_thawing();
        }
        if self.adopted {
            // Not our child: its parent (pid 1 of the host, or a
            // subreaper) collects the status; we can only see it end.
            if let Some(fd) = self.init.pidfd() {
                await_readable(fd.as_raw_fd(), -1);
            }
            // Reap it if it is ours after all (a process that let go of a
            // sandbox and adopted it again); otherwise ECHILD, harmless.
            // The pidfd keeps the pid from being recycled meanwhile.
            let mut status = 0;
            // SAFETY: waitpid with a valid out-pointer, not blocking.
            unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG | libc::__WALL) };
            self.reaped = true;
            let killed = self.killed.load(Ordering::SeqCst);
            return Ok(if killed { libc::SIGKILL } else { 0 });
        }
        let mut status = 0;
        loop {
            // SAFETY: waitpid on our own child with a valid out-pointer.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::__WALL) };
            if r == self.pid {
                self.reaped = true;
                self.init.reaped.store(true, Ordering::SeqCst);
                self.init.close();
                return Ok(status);
            }
            if r < 0 && Errno::last() != Errno(libc::EINTR) {
                self.reaped = true;
                return Err(os_err("wait for the sandbox")(Errno::last()));
            }
        }
    }

    /// Wait until the killed init has exited, thawing its cgroup every
    /// 50 ms meanwhile: a task frozen (by a pause racing the kill) acts on
    /// its SIGKILL only when thawed.
    fn await_death_thawing(&self) {
        let Some(pidfd) = self.init.pidfd() else {
            return;
        };
        loop {
            let mut pfd = libc::pollfd {
                fd: pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one valid pollfd we own.
            let r = unsafe { libc::poll(&mut pfd, 1, 50) };
            if r > 0 || (r < 0 && Errno::last() != Errno(libc::EINTR)) {
                return;
            }
            if let Some(cg) = &self.cgroup {
                cg.thaw();
            }
        }
    }

    /// The init has been reaped, so (pid namespace semantics) every process
    /// of the sandbox is gone, and with them its mounts and namespaces.
    /// What is left on the host: the cgroups and the slot.
    fn teardown(&mut self) -> Result<(), JailError> {
        let result = match self.cgroup.take() {
            Some(cg) => cg.destroy().map_err(JailError::from),
            None => Ok(()),
        };
        if let Some(slot) = self.slot.take() {
            slot.release();
        } else {
            // A sandbox that held its own locks: they went with it; its
            // liveness file is left to remove.
            slot::forget(&self.run_dir, &self.id);
        }
        result
    }
}

/// Kills one sandbox from any thread (see [`Sandbox::killer`]).
#[derive(Debug, Clone)]
pub struct Killer {
    init: Arc<Init>,
    killed: Arc<AtomicBool>,
    dirs: Arc<[PathBuf]>,
}

impl Killer {
    /// SIGKILL the init (the kernel kills the rest of its pid namespace)
    /// and thaw its groups, so a paused sandbox acts on it.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        if let Some(pidfd) = self.init.pidfd() {
            // SAFETY: signalling through a pidfd we hold.
            unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd.as_raw_fd(),
                    libc::SIGKILL,
                    0usize,
                    0u32,
                )
            };
        }
        crate::cgroup::thaw_groups(&self.dirs);
    }
}

/// A sandbox's init, to signal and watch it. `brig run` keeps a pidfd on
/// it for the sandbox's whole life; a daemon's sandbox (detached) closes
/// it once started — one descriptor less per sandbox, for a daemon with
/// ten thousand of them under a hard limit it may not raise — and opens a
/// new one when it needs it, checking the start time so that a recycled
/// pid is never signalled. Once reaped, there is nothing to open.
#[derive(Debug)]
struct Init {
    pid: libc::pid_t,
    /// Its start time (see [`start_time`]); 0 when the pidfd stays held.
    start: u64,
    fd: std::sync::Mutex<Option<Arc<OwnedFd>>>,
    reaped: AtomicBool,
}

impl Init {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<OwnedFd>>> {
        self.fd.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The held pidfd, if any.
    fn held(&self) -> Option<Arc<OwnedFd>> {
        self.lock().clone()
    }

    /// A pidfd on the init while it exists: the held one, or a new one.
    fn pidfd(&self) -> Option<Arc<OwnedFd>> {
        if let Some(fd) = self.held() {
            return Some(fd);
        }
        if self.reaped.load(Ordering::SeqCst) {
            return None;
        }
        // SAFETY: pidfd_open with integer arguments; the result is checked.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0u32) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the kernel returned a fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        (start_time(self.pid) == Some(self.start)).then(|| Arc::new(fd))
    }

    fn close(&self) {
        self.lock().take();
    }
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/<pid>/stat`): with the pid, it names one process for good.
pub fn start_time(pid: libc::pid_t) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // fields after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether `pid` is in sandbox `id`'s cgroup.
fn in_cgroup_of(pid: libc::pid_t, id: &SandboxId) -> bool {
    let want = format!("/{}/{}", crate::cgroup::PARENT, id.as_str());
    fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|s| {
        s.lines()
            .any(|l| l.rsplit(':').next().is_some_and(|p| p.ends_with(&want)))
    })
}

/// Poll `fd` for readability; `timeout_ms` -1 waits for good. Returns
/// whether it is readable.
fn await_readable(fd: RawFd, timeout_ms: libc::c_int) -> bool {
    loop {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if r > 0 {
            return true;
        }
        if r == 0 || Errno::last() != Errno(libc::EINTR) {
            return false;
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        if !self.reaped {
            self.kill();
            let _ = self.reap();
        }
        let _ = self.teardown();
    }
}

/// Raise this process's soft limit on open files to its hard limit, as
/// long-lived servers do (a daemon holds several descriptors per sandbox).
/// Sandboxes are unaffected: they get their own limit from the plan.
/// Returns the limit now in force.
pub fn raise_fd_limit() -> std::io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer to a local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Root may raise the hard limit too, up to fs.nr_open: a daemon with
    // ten thousand sandboxes holds some fifty thousand descriptors.
    let nr_open = fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok());
    if let Some(max) = nr_open.filter(|m| *m > lim.rlim_max) {
        let raised = libc::rlimit {
            rlim_cur: max,
            rlim_max: max,
        };
        // SAFETY: setrlimit with a valid pointer to a local; EPERM without
        // CAP_SYS_RESOURCE leaves the limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(max);
        }
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit with a valid pointer to a local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(lim.rlim_cur)
}

/// The stack of an init cloned with `CLONE_VM` (see [`Extras::as_init`]):
/// bring-up needs a few KiB; pages never touched cost nothing.
const INIT_STACK: usize = 256 * 1024;

/// What an init cloned with `CLONE_VM` needs; passed by pointer.
struct InitArgs<'a> {
    plan: &'a Plan,
    channels: Channels,
}

extern "C" fn init_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` points at the InitArgs in spawn_with's frame, which
    // outlives this child's use of shared memory (it execs or is reaped
    // before spawn_with returns).
    let a = unsafe { &*(arg as *const InitArgs<'_>) };
    bringup::init_main(a.plan, a.channels)
}

/// The host's half of `BRIG_TRACE_SPAWN=1` (see [`crate::trace`]).
struct HostTrace {
    on: bool,
    host: Vec<(&'static str, u64)>,
    child: Vec<(u32, u64)>,
}

impl HostTrace {
    fn new() -> Self {
        let on = std::env::var_os("BRIG_TRACE_SPAWN").is_some_and(|v| v == "1");
        let mut t = HostTrace {
            on,
            host: Vec::new(),
            child: Vec::new(),
        };
        t.hit("spawn called");
        t
    }

    fn hit(&mut self, what: &'static str) {
        if self.on {
            self.host.push((what, now_ns()));
        }
    }

    fn print(&self) {
        if !self.on {
            return;
        }
        let mut all: Vec<(u64, String)> = self
            .host
            .iter()
            .map(|(w, t)| (*t, format!("host: {w}")))
            .collect();
        for (label, t) in &self.child {
            let what = match *label {
                0 => "init: running".to_string(),
                l => match Stage::from_u32(l) {
                    Some(Stage::WaitForHost) => "init: got go".into(),
                    Some(Stage::PivotRoot) => "init: root filesystem ready (pivoted)".into(),
                    Some(Stage::Loopback) => "init: hostname and loopback set".into(),
                    Some(Stage::Rlimit) => "init: rlimits set, waiting to join the cgroups".into(),
                    Some(Stage::CgroupNamespace) => {
                        "init: in its cgroups (own cgroup namespace), sending ready".into()
                    }
                    Some(s) => format!("init: {} done", s.describe()),
                    None => format!("init: step {l}"),
                },
            };
            all.push((*t, what));
        }
        all.sort_by_key(|(t, _)| *t);
        let start = all.first().map_or(0, |(t, _)| *t);
        let mut prev = start;
        eprintln!("brig: spawn trace (ms since spawn, +ms since previous):");
        for (t, what) in all {
            eprintln!(
                "  {:>8.3} {:>+8.3}  {what}",
                (t - start) as f64 / 1e6,
                (t - prev) as f64 / 1e6
            );
            prev = t;
        }
    }
}

/// Every spawn creates and removes a lock file in the runtime directory. On
/// a disk filesystem that is a journaled metadata update each time (0.3-2 ms
/// here, where /run is not a tmpfs); so if the directory is not on a tmpfs,
/// mount a small one there, once per boot. It holds only locks and an
/// empty mount point, and is shared by every brig on the host.
fn ensure_tmpfs(dir: &Path) -> Result<(), JailError> {
    fs::create_dir_all(dir).map_err(|source| JailError::Host {
        op: "create the runtime directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let cpath = CString::new(dir.as_os_str().as_bytes()).expect("runtime path has no NUL");
    if on_tmpfs(&cpath) {
        return grow_tmpfs(dir, &cpath);
    }
    // Two brigs starting at once (a daemon and `brig run`, tests side by
    // side on a fresh machine) would both find no tmpfs and both mount
    // one: the second would hide what the first's sandboxes keep there.
    // One at a time, under a lock beside the directory, and look again.
    let lock_path = dir.with_extension("lock");
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| JailError::Host {
            op: "open the runtime directory's lock",
            path: lock_path.clone(),
            source,
        })?;
    // SAFETY: flock on a descriptor we own; released when `lock` closes.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } < 0 {
        return Err(os_err("lock the runtime directory")(Errno::last()));
    }
    if on_tmpfs(&cpath) {
        return Ok(());
    }
    // SAFETY: constant strings; mounting a fresh tmpfs on our own directory.
    let r = unsafe {
        libc::mount(
            c"brig-run".as_ptr(),
            cpath.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            c"mode=0755,size=256m".as_ptr().cast(),
        )
    };
    if r < 0 {
        return Err(os_err("mount a tmpfs on the runtime directory /run/brig")(
            Errno::last(),
        ));
    }
    drop(lock);
    Ok(())
}

/// Whether `path` is on a tmpfs (its own, or /run's).
fn on_tmpfs(path: &CString) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    // SAFETY: statfs is plain old data, filled by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    unsafe { libc::statfs(path.as_ptr(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC }
}

/// Ours (a mount of its own, not /run's tmpfs) but made by an older brig
/// with room for fewer sandboxes (a daemon's sandbox keeps a page there):
/// grow it in place, keeping what is in it.
fn grow_tmpfs(dir: &Path, cpath: &CString) -> Result<(), JailError> {
    // SAFETY: statfs is plain old data, filled by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out-pointer.
    if unsafe { libc::statfs(cpath.as_ptr(), &mut st) } != 0 {
        return Ok(());
    }
    let size = st.f_blocks as u64 * st.f_bsize as u64;
    if size < RUNTIME_TMPFS_BYTES && is_mount_point(dir) {
        // SAFETY: constant strings; remounting our own tmpfs.
        unsafe {
            libc::mount(
                c"brig-run".as_ptr(),
                cpath.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=0755,size=256m".as_ptr().cast(),
            )
        };
    }
    Ok(())
}

/// The size of `/run/brig`'s tmpfs: a bound, not a reservation (tmpfs
/// uses what is stored). A daemon's sandbox keeps one page there (its
/// `sb/<id>/state`), so 256 MiB holds some 60,000.
const RUNTIME_TMPFS_BYTES: u64 = 256 << 20;

/// Whether `dir` is a mount point (its device differs from its parent's).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(dir), dir.parent().map(fs::metadata)) {
        (Ok(d), Some(Ok(p))) => d.dev() != p.dev(),
        _ => false,
    }
}

fn nofile_hard() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_max
    } else {
        1024
    }
}

fn socketpair() -> Result<(OwnedFd, OwnedFd), JailError> {
    let mut fds = [-1; 2];
    // SAFETY: valid out-array of two ints.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    } < 0
    {
        return Err(os_err("create a socket pair")(Errno::last()));
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn pipe() -> Result<(OwnedFd, OwnedFd), JailError> {
    let mut fds = [-1; 2];
    // SAFETY: valid out-array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(os_err("create a pipe")(Errno::last()));
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Map sandbox ids 0..65536 to the slot's host range.
fn write_id_map(pid: libc::pid_t, file: &'static str, base: u32) -> Result<(), JailError> {
    let path = PathBuf::from(format!("/proc/{pid}/{file}"));
    fs::write(&path, format!("0 {base} {}\n", slot::RANGE)).map_err(|source| JailError::Host {
        op: "write the sandbox's id map",
        path,
        source,
    })
}

/// A detached, read-only copy of the template directory whose files appear
/// owned by the sandbox's own users (an idmapped mount through the init's
/// user namespace). Falls back to a plain read-only copy on filesystems
/// that cannot be idmapped.
fn idmapped(lower: &Path, pid: libc::pid_t, read_only: bool) -> Result<OwnedFd, JailError> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const AT_RECURSIVE: libc::c_uint = 0x8000;
    const MOUNT_ATTR_RDONLY: u64 = 0x1;
    const MOUNT_ATTR_NOSUID: u64 = 0x2;
    const MOUNT_ATTR_NODEV: u64 = 0x4;
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let path = CString::new(lower.as_os_str().as_bytes()).map_err(|_| JailError::HostCall {
        op: "use the template path",
        errno: Errno(libc::EINVAL),
    })?;
    // SAFETY: open_tree with a valid path; returns a new descriptor.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | AT_RECURSIVE,
        )
    };
    if tree < 0 {
        return Err(os_err("clone the template's mount (open_tree)")(
            Errno::last(),
        ));
    }
    // SAFETY: fresh descriptor from open_tree.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as RawFd) };
    let userns =
        fs::File::open(format!("/proc/{pid}/ns/user")).map_err(|source| JailError::Host {
            op: "open the sandbox's user namespace",
            path: PathBuf::from(format!("/proc/{pid}/ns/user")),
            source,
        })?;
    let setattr = |set: u64, userns_fd: u64| {
        let attr = MountAttr {
            attr_set: set,
            attr_clr: 0,
            propagation: 0,
            userns_fd,
        };
        // SAFETY: a valid mount fd, an empty path with AT_EMPTY_PATH, and a
        // properly sized mount_attr.
        unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_EMPTY_PATH as u32 | AT_RECURSIVE,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        }
    };
    let ro = if read_only { MOUNT_ATTR_RDONLY } else { 0 } | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    if setattr(ro | MOUNT_ATTR_IDMAP, userns.as_raw_fd() as u64) < 0 {
        // A writable layer the sandbox would own under other ids than
        // root's is no use to an image build: say so.
        if !read_only {
            return Err(os_err("idmap the kept writable layer (mount_setattr)")(
                Errno::last(),
            ));
        }
        // EINVAL/EOPNOTSUPP: this filesystem cannot be idmapped. The
        // template still works; its root-owned files show as nobody.
        if setattr(ro, 0) < 0 {
            return Err(os_err("make the template read-only (mount_setattr)")(
                Errno::last(),
            ));
        }
    }
    Ok(tree)
}

/// A volume's host directory as a detached, writable mount idmapped
/// through the sandbox's user namespace.
fn idmapped_volume(source: &Path, pid: libc::pid_t) -> Result<OwnedFd, JailError> {
    idmapped(source, pid, false).map_err(|e| match e {
        JailError::HostCall { errno, .. } => JailError::Volume(format!(
            "cannot mount the volume at {} into the sandbox: {}",
            source.display(),
            std::io::Error::from_raw_os_error(errno.0)
        )),
        other => other,
    })
}

/// Read the error pipe to EOF: nothing means the command is executing.
fn read_failure(fd: &OwnedFd) -> Option<Failure> {
    let mut buf = [0u8; Failure::SIZE];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reading into the unfilled part of a stack buffer.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
            )
        };
        if n == 0 {
            break;
        }
        if n < 0 {
            if Errno::last() == Errno(libc::EINTR) {
                continue;
            }
            break;
        }
        got += n as usize;
    }
    if got == 0 {
        return None;
    }
    Some(Failure::decode(&buf[..got]).unwrap_or(Failure {
        stage: Stage::WaitForHost,
        index: 0,
        errno: Errno(libc::EPIPE),
    }))
}

fn failure_to_error(f: Failure, plan: &Plan) -> JailError {
    let command = plan.exec.display.clone();
    match f.stage {
        Stage::Exec if f.errno == Errno(libc::ENOENT) => JailError::CommandNotFound { command },
        Stage::Exec => JailError::CommandNotExecutable {
            command,
            errno: f.errno,
        },
        Stage::Workdir => JailError::Workdir {
            path: plan.exec.workdir.to_string_lossy().into_owned(),
            errno: f.errno,
        },
        Stage::MountStep => JailError::Setup {
            step: plan
                .steps
                .get(f.index as usize)
                .map_or_else(|| "prepare the root filesystem".into(), |s| s.describe()),
            errno: f.errno,
        },
        stage => JailError::Setup {
            step: stage.describe().into(),
            errno: f.errno,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// brigs starting at once on a host whose runtime directory is on disk
    /// mount one tmpfs there, not one each: a second would hide what the
    /// first's sandboxes keep in it.
    #[test]
    fn brigs_starting_at_once_mount_the_runtime_tmpfs_once() {
        if !brig_test_support::root_or_skip() {
            return;
        }
        let base = tempfile::tempdir_in("/var/tmp").unwrap();
        let base_path = CString::new(base.path().as_os_str().as_bytes()).unwrap();
        if on_tmpfs(&base_path) {
            brig_test_support::skip("/var/tmp is a tmpfs here: nothing to mount over");
            return;
        }
        let dir = base.path().join("run");
        // Without the lock, about one run in three stacks mounts here.
        let starts: Vec<_> = (0..8)
            .map(|_| {
                let dir = dir.clone();
                std::thread::spawn(move || ensure_tmpfs(&dir))
            })
            .collect();
        let results: Vec<_> = starts.into_iter().map(|t| t.join().unwrap()).collect();
        let target = dir.to_str().unwrap().to_string();
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(target.as_str()))
            .count();
        let cdir = CString::new(target.as_bytes()).unwrap();
        // SAFETY: unmounting the test's own mounts, one at a time.
        while unsafe { libc::umount2(cdir.as_ptr(), libc::MNT_DETACH) } == 0 {}
        for r in results {
            r.unwrap();
        }
        assert_eq!(mounts, 1, "tmpfs mounts stacked on {target}");
    }
}
