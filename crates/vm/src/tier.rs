//! [`VmTier`] and [`VmInstance`]: the vm tier behind brig-core's boundary.
//!
//! A launch, top to bottom ([`VmTier::launch`]):
//!
//! 1. the sandbox's directory appears with its owner and its uid in it
//!    (made aside and renamed, as the other tiers do), so a daemon dying at
//!    any later step leaves something its successor recognises and
//!    discards;
//! 2. the template's read-only image, made once per template and cached
//!    (`disk.rs`), and the sandbox's writable disk, the `--disk` size;
//! 3. its cgroups, bounding QEMU's memory (the guest's plus QEMU's own),
//!    tasks and CPU (`cgroup.rs`);
//! 4. QEMU (`qemu.rs`), started so that before it runs it is in those
//!    groups, in a session of its own, and a uid of its own with no
//!    capabilities: it reaches the shared read-only files (kernel,
//!    initramfs, template image) and its own directory only through
//!    descriptors brig opened for it, and owns nothing but that directory;
//!    parented by nobody brig runs (the launcher forks it and exits);
//! 5. its pid and start time are recorded, and the launch returns once the
//!    guest's agent answers on its line (`line.rs`): the kernel booted,
//!    loaded its modules, mounted the root and started the agent.
//!
//! A restore ([`VmTier::restore`]) is a launch whose disk is a copy of the
//! checkpoint's, whose machine (RAM, vCPUs) is the saved one, and whose
//! QEMU waits for the saved state (`-incoming defer -S`) instead of
//! booting: step 5 loads it through a descriptor, runs it and renews the
//! guest's identity (`VmInstance::load`). A checkpoint
//! ([`VmInstance::checkpoint`]): stop, migrate to a file through a
//! descriptor, copy the disk, cont (`VmInstance::save`).
//!
//! Ending one ([`VmInstance::kill`], then `wait`): SIGKILL to QEMU (the
//! guest, its memory and its devices go with it), then its groups and its
//! directory (sockets, disk, logs).

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use brig_core::{
    Checkpoints, Ended, Instance, Isolation, Launch, Limits, NetworkAttachment, SandboxId, Tier,
    TierError, Usage,
};
use brig_host::Hierarchy;

use crate::cgroup::{Bounds, Groups};
use crate::disk;
use crate::initramfs;
use crate::kernel::GuestKernel;
use crate::line;
use crate::qemu::{self, Accelerator, Machine};
use crate::qmp::Qmp;

/// The first uid QEMU processes run as: above the process tier's range
/// (brig-jail's slots end at 0x5000_0000).
pub const UID_BASE: u32 = 0x6000_0000;
/// How many guests may run at once (one uid each).
pub const UID_COUNT: u32 = 65536;
/// The period of a CPU quota, in microseconds.
const CFS_PERIOD_US: u64 = 100_000;
/// The least memory a guest boots with (the kernel and the agent).
pub const MIN_MEMORY: u64 = 128 << 20;
const STATE_FILE: &str = "state";

/// How a [`VmTier`] is made.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The qemu-system-x86_64 binary.
    pub qemu: PathBuf,
    /// brig's runtime directory (`/run/brig`): sandboxes live in `vm/<id>`.
    pub run_dir: PathBuf,
    /// Where the kernel, the initramfs and the templates' images live:
    /// `$BRIG_HOME/vm`.
    pub home: PathBuf,
    /// The static brig-agent, the guests' init.
    pub agent: PathBuf,
    /// Names the launching daemon (its database), as for the other tiers.
    pub owner: String,
}

/// What every guest boots: the kernel and the initramfs.
#[derive(Debug)]
pub struct Guest {
    pub kernel: GuestKernel,
    pub initramfs: PathBuf,
}

/// The vm tier: sandboxes as QEMU virtual machines.
#[derive(Debug)]
pub struct VmTier {
    qemu: PathBuf,
    accel: Accelerator,
    /// Forks map their checkpoint's RAM copy-on-write: QEMU is 8.2 or
    /// later (`rom=off`). Older, every guest's RAM is QEMU's own, and a
    /// restore loads a copy of it from the checkpoint's stream.
    copy_on_write: bool,
    /// Where the kernel, the initramfs, images and disks live.
    home: PathBuf,
    agent: PathBuf,
    /// The guest's kernel and initramfs, made ready at the first launch
    /// (not at the daemon's start: a daemon that never starts a guest
    /// never fetches a kernel).
    guest: OnceLock<Guest>,
    preparing: Mutex<()>,
    images: PathBuf,
    /// The writable disks, `<home>/disks/<id>.ext4`: on a disk, not in
    /// /run (a tmpfs, whose pages a guest writing its disk would charge to
    /// QEMU's memory, and be killed for).
    disks: PathBuf,
    dir: PathBuf,
    owner: String,
    hierarchy: Hierarchy,
    /// Held while a uid is picked and a directory made, and while a
    /// template's image is made (two launches of one template build it
    /// once).
    picking: Mutex<()>,
    imaging: Mutex<()>,
    /// Boot snapshots, `<home>/boots/<machine>` ([`VmTier::booted`]), and
    /// the lock held while one is made.
    boots: PathBuf,
    booting: Mutex<()>,
}

/// Where to find QEMU: `$BRIG_QEMU`, else `qemu-system-x86_64` on PATH.
/// How guests of `qemu` would run on this host (`None`: not at all), as
/// the tier decides it.
pub fn accelerator(qemu: &Path) -> Option<Accelerator> {
    Accelerator::detect(brig_host::probe::vm_tier(qemu).accel)
}

pub fn find_qemu() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BRIG_QEMU") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("qemu-system-x86_64"))
        .find(|p| p.is_file())
}

fn unavailable(reason: impl Into<String>) -> TierError {
    TierError::Unavailable {
        tier: Isolation::Vm,
        reason: reason.into(),
    }
}

impl VmTier {
    /// The tier, if this host can offer it: QEMU, root, the cgroup
    /// hierarchy (the guest kernel comes at the first launch: [`guest`]).
    /// Removes what dead daemons' guests left.
    ///
    /// [`guest`]: VmTier::guest
    pub fn new(config: VmConfig) -> Result<VmTier, TierError> {
        // SAFETY: geteuid takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            return Err(unavailable(
                "brig runs QEMU as a uid of its own per guest, which needs root",
            ));
        }
        let probed = brig_host::probe::vm_tier(&config.qemu);
        let accel = Accelerator::detect(probed.accel).ok_or_else(|| unavailable(probed.detail))?;
        let hierarchy = Hierarchy::detect().map_err(|e| unavailable(e.to_string()))?;
        let home = config.home;
        let dir = config.run_dir.join("vm");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&dir)
            .map_err(|e| unavailable(format!("cannot create {}: {e}", dir.display())))?;
        let tier = VmTier {
            qemu: config.qemu,
            accel,
            copy_on_write: probed.copy_on_write_forks,
            home: home.clone(),
            agent: config.agent,
            guest: OnceLock::new(),
            preparing: Mutex::new(()),
            images: home.join("images"),
            disks: home.join("disks"),
            dir,
            owner: config.owner,
            hierarchy,
            picking: Mutex::new(()),
            imaging: Mutex::new(()),
            boots: home.join("boots"),
            booting: Mutex::new(()),
        };
        tier.discard_orphans();
        tier.forget_stale_boots();
        Ok(tier)
    }

    /// A tier for one-shot commands (`brig run --isolation vm`): its
    /// guests are owned by this process (`/proc/<pid>`), so one its
    /// caller's death left running is discarded by the next tier made on
    /// this host.
    pub fn for_commands(
        qemu: PathBuf,
        run_dir: PathBuf,
        home: PathBuf,
        agent: PathBuf,
    ) -> Result<VmTier, TierError> {
        VmTier::new(VmConfig {
            qemu,
            run_dir,
            home,
            agent,
            owner: format!("/proc/{}", std::process::id()),
        })
    }

    /// How guests run here: `kvm` or `tcg`.
    pub fn accel(&self) -> Accelerator {
        self.accel
    }

    /// Whether forks of one checkpoint share its RAM copy-on-write (QEMU
    /// 8.2 or later), or each loads a copy.
    pub fn copy_on_write(&self) -> bool {
        self.copy_on_write
    }

    /// The guest kernel (fetched from Debian's archive the first time:
    /// seconds, once per home) and the initramfs (written once per daemon:
    /// the agent may have changed), ready for launches.
    pub fn guest(&self) -> Result<&Guest, TierError> {
        if let Some(g) = self.guest.get() {
            return Ok(g);
        }
        let _held = lock(&self.preparing);
        if let Some(g) = self.guest.get() {
            return Ok(g);
        }
        let kernel = GuestKernel::get(&self.home.join("kernel"))
            .map_err(|e| unavailable(format!("no guest kernel: {}", chain(&e))))?;
        // Named by what it holds: daemons of other builds (another agent)
        // sharing this home keep theirs.
        let agent = fs::read(&self.agent).map_err(|e| {
            unavailable(format!(
                "cannot read the agent {}: {e}",
                self.agent.display()
            ))
        })?;
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            (&agent, &kernel.version).hash(&mut h);
            h.finish()
        };
        let initramfs = self.home.join(format!("initramfs-{key:016x}.cpio"));
        initramfs::build(&kernel, &self.agent, &initramfs)
            .map_err(|e| unavailable(format!("cannot write {}: {e}", initramfs.display())))?;
        // Other builds' initramfs files nobody wrote for a day, and halves
        // a killed daemon left for ten minutes: gone (a daemon rewrites its
        // own at its first launch).
        for f in fs::read_dir(&self.home).into_iter().flatten().flatten() {
            let name = f.file_name();
            let Some(name) = name.to_str().filter(|n| n.starts_with("initramfs")) else {
                continue;
            };
            let keep = Duration::from_secs(if name.contains(".tmp") {
                600
            } else {
                24 * 3600
            });
            let stale = f
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > keep));
            if stale {
                let _ = fs::remove_file(f.path());
            }
        }
        Ok(self.guest.get_or_init(|| Guest { kernel, initramfs }))
    }

    fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(id.as_str())
    }

    /// Discard guests whose owner's database is gone, or that have no
    /// readable state, and groups no directory names: no daemon will
    /// adopt them.
    fn discard_orphans(&self) {
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let Some(id) = e.file_name().to_str().and_then(SandboxId::parse) else {
                    continue;
                };
                let orphaned = read_state(&e.path()).is_none_or(|s| !Path::new(&s.owner).exists());
                if orphaned {
                    let _ = self.discard(&id);
                }
            }
        }
        // Disks of guests no directory names (a daemon died between the
        // two, or the host rebooted and /run was emptied).
        for f in fs::read_dir(&self.disks).into_iter().flatten().flatten() {
            let id = f
                .file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".ext4"))
                .and_then(SandboxId::parse);
            if id.is_some_and(|id| {
                !self.sandbox_dir(&id).exists() && !self.dir.join(format!(".{id}")).exists()
            }) {
                let _ = fs::remove_file(f.path());
            }
        }
        for c in ["memory", "pids", "cpu", "cpuacct"] {
            let Some(parent) = self
                .hierarchy
                .mount(c)
                .map(|m| m.join(crate::cgroup::PARENT))
            else {
                continue;
            };
            for g in fs::read_dir(&parent).into_iter().flatten().flatten() {
                let id = g.file_name().to_str().and_then(SandboxId::parse);
                if let Some(id) = id.filter(|id| !self.sandbox_dir(id).exists()) {
                    Groups::new(&self.hierarchy, &id).remove();
                }
            }
        }
    }

    /// A uid no other guest of this host runs as, recorded in a new
    /// directory for `id` (step 1).
    fn make_dir(&self, id: &SandboxId, dir: &Path) -> Result<u32, TierError> {
        let io = |op: &'static str| move |e: std::io::Error| TierError::failed(id, op, e);
        let _held = lock(&self.picking);
        // Other daemons of this host pick from the same range: an exclusive
        // lock on the directory all guests live in, held until this one's
        // uid is recorded.
        let _all = File::open(&self.dir)
            .and_then(lock_exclusive)
            .map_err(io("lock the guests' directory"))?;
        let used: Vec<u32> = fs::read_dir(&self.dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| read_state(&e.path()).map(|s| s.uid))
                    .collect()
            })
            .unwrap_or_default();
        let uid = (UID_BASE..UID_BASE + UID_COUNT)
            .find(|u| !used.contains(u))
            .ok_or_else(|| {
                TierError::Invalid(format!("all {UID_COUNT} vm guests' uids are in use"))
            })?;
        let aside = self.dir.join(format!(".{id}"));
        let _ = fs::remove_dir_all(&aside);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&aside)
            .map_err(io("create its runtime directory"))?;
        fs::write(
            aside.join(STATE_FILE),
            format!("{}\n0 0 {uid}\n", self.owner),
        )
        .and_then(|()| fs::rename(&aside, dir))
        .map_err(io("record its owner"))?;
        Ok(uid)
    }

    fn start(
        &self,
        launch: &Launch,
        dir: &Path,
        uid: u32,
        from: Option<&Saved>,
        unplugged_nic: bool,
    ) -> Result<VmInstance, TierError> {
        let id = &launch.id;
        let io = |op: &'static str| move |e: std::io::Error| TierError::failed(id, op, e);
        let netns = match &launch.network {
            NetworkAttachment::Namespace(ns) => Some(Arc::clone(ns)),
            _ => None,
        };
        if netns.is_some() && from.is_some_and(|s| !s.nic) {
            return Err(TierError::Unsupported {
                tier: Isolation::Vm,
                op: "restore a snapshot onto a network",
                reason: "the snapshot is of a vm sandbox that had no network (its machine has \
                         no network device): restore it with network none"
                    .into(),
            });
        }
        // A restored machine is the saved one: its RAM and vCPUs.
        let memory = from.map_or(launch.limits.memory.bytes(), |s| s.memory_mib << 20);
        if memory < MIN_MEMORY {
            return Err(TierError::Invalid(format!(
                "a vm sandbox needs at least {} MiB of memory (its kernel's and the agent's)",
                MIN_MEMORY >> 20
            )));
        }

        // Where its RAM lives: a memory file of its own, mapped shared
        // (its checkpoints copy the RAM from it), or, for a fork, its
        // checkpoint's RAM file mapped private. A QEMU older than 8.2
        // keeps RAM of its own, as do restores of the checkpoints it made.
        let (ram, ram_file) = match (from, self.copy_on_write) {
            (Some(s), false) if s.ram == SavedRam::Apart => {
                return Err(TierError::Unsupported {
                    tier: Isolation::Vm,
                    op: "restore this snapshot",
                    reason: "it keeps the machine's RAM in a file of its own, which this host's \
                             QEMU cannot map (it needs QEMU 8.2 or later): install a newer QEMU \
                             (Debian 12: bookworm-backports)"
                        .into(),
                });
            }
            (Some(s), true) if s.ram == SavedRam::Apart => (
                qemu::Ram::CopyOnWrite,
                Some(
                    File::open(s.dir.join(SAVED_RAM))
                        .and_then(|f| high_dup(&f))
                        .map_err(io("open its snapshot's RAM"))?,
                ),
            ),
            (Some(s), _) if s.ram == SavedRam::Anonymous => (qemu::Ram::Anonymous, None),
            (None, false) => (qemu::Ram::Anonymous, None),
            // In the stream, or a new guest with QEMU 8.2+.
            _ => (
                qemu::Ram::Shared,
                Some(memory_file(id, memory).map_err(io("make its memory file"))?),
            ),
        };

        // 2. The disks: the template's image (shared, read-only), the
        //    sandbox's writable one.
        let image = {
            let _held = lock(&self.imaging);
            disk::template_image(&self.images, &launch.template).map_err(|e| match e {
                disk::DiskError::Unsupported(_) => TierError::Invalid(e.to_string()),
                e => TierError::failed(id, "make its template's disk image", e),
            })?
        };
        let writable = self.disks.join(format!("{id}.ext4"));
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.disks)
            .map_err(io("create the disks' directory"))?;
        if let Some(saved) = from {
            if image.file_name() != Some(saved.image.as_os_str()) {
                return Err(TierError::Invalid(format!(
                    "snapshot cannot be restored: its template's disk image changed since it \
                     was taken (it ran on {}, the template is now {}); take a new snapshot",
                    saved.image.display(),
                    image.display()
                )));
            }
            disk::copy_sparse(&saved.dir.join(SAVED_DISK), &writable)
                .map_err(|e| TierError::failed(id, "copy its snapshot's disk", e))?;
        } else {
            disk::writable(&writable, launch.limits.disk.bytes())
                .map_err(|e| TierError::failed(id, "make its writable disk", e))?;
        }
        // QEMU owns its directory and what it writes there, nothing else.
        for p in [dir, writable.as_path()] {
            std::os::unix::fs::chown(p, Some(uid), Some(uid)).map_err(io("hand over its files"))?;
        }

        // 3. Its groups: the guest's memory plus QEMU's own.
        let cpus = from.map_or_else(|| vcpus(&launch.limits), |s| s.cpus);
        let groups = Groups::new(&self.hierarchy, id);
        let procs = groups
            .create(&Bounds {
                memory_bytes: memory + self.accel.overhead_bytes(),
                // QEMU's threads: its main loop, a vCPU each, I/O workers.
                tasks: 64 + u64::from(cpus),
                cpu: launch
                    .limits
                    .cpus
                    .map(|c| ((c * CFS_PERIOD_US as f64).round() as u64, CFS_PERIOD_US)),
            })
            .map_err(|e| TierError::failed(id, "make its cgroups", e))?;

        // 4. QEMU. The shared files go in as descriptors 3, 4, 5; a
        //    networked guest's tap as 8 (`net.rs`).
        let guest = self.guest()?;
        let (netns, tap, network) = match (netns, from) {
            (Some(ns), _) => {
                let nic = crate::net::plug(&ns).map_err(io("give the guest its network device"))?;
                let network = qemu::Network::Tap {
                    addr: nic.addr,
                    gateway: brig_net::GATEWAY_ADDR,
                };
                (Some(ns), Some(nic.tap), network)
            }
            (None, from) if from.map_or(unplugged_nic, |s| s.nic) => {
                let (ns, tap) = crate::net::unplugged()
                    .map_err(io("give the guest its (unconnected) network device"))?;
                (Some(Arc::new(ns)), Some(tap), qemu::Network::Unplugged)
            }
            (None, _) => (None, None, qemu::Network::None),
        };
        let shared = [guest.kernel.vmlinuz.as_path(), &guest.initramfs, &image]
            .map(|p| File::open(p).and_then(|f| high_dup(&f)));
        let [kernel, initrd, root] = shared;
        let (kernel, initrd, root) = (
            kernel.map_err(io("open its kernel"))?,
            initrd.map_err(io("open its initramfs"))?,
            root.map_err(io("open its template's image"))?,
        );
        // Its own directory too (descriptor 6): QEMU names its files
        // through it, whoever may traverse brig's directories above.
        let own = File::open(dir)
            .and_then(|f| high_dup(&f))
            .map_err(io("open its directory"))?;
        let rw = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&writable)
            .and_then(|f| high_dup(&f))
            .map_err(io("open its writable disk"))?;
        // Its volumes' images (the runtime saw to it that nothing else
        // mounts them), from descriptor 9 on.
        let volumes = launch
            .volumes
            .iter()
            .flat_map(|v| [true, false].map(|write| (v, write)))
            .map(|(v, write)| {
                fs::OpenOptions::new()
                    .read(true)
                    .write(write)
                    .open(&v.source)
                    .and_then(|f| high_dup(&f))
            })
            .collect::<Result<Vec<OwnedFd>, _>>()
            .map_err(io("open a volume's image"))?;
        let volume_paths: Vec<String> = launch.volumes.iter().map(|v| v.path.clone()).collect();
        let machine = Machine {
            name: id.as_str(),
            accel: self.accel,
            memory_mib: memory >> 20,
            cpus,
            kernel: Path::new("/proc/self/fd/3"),
            initramfs: Path::new("/proc/self/fd/4"),
            root_image: Path::new("/proc/self/fd/5"),
            disk: Path::new("/proc/self/fd/7"),
            dir: Path::new("/proc/self/fd/6"),
            hostname: id.as_str(),
            incoming: from.is_some(),
            network,
            ram,
            cpu: from.map_or(qemu::TcgCpu::Max, |s| s.cpu),
            volumes: &volume_paths,
        };
        // What QEMU says (why it refused to start) goes to its log.
        let log = File::create(dir.join("qemu.log")).map_err(io("create its log"))?;
        let mut cmd = Command::new(&self.qemu);
        cmd.args(qemu::args(&machine))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let fds = [
            kernel.as_raw_fd(),
            initrd.as_raw_fd(),
            root.as_raw_fd(),
            own.as_raw_fd(),
            rw.as_raw_fd(),
        ];
        let procs_fds: Vec<RawFd> = procs.iter().map(AsRawFd::as_raw_fd).collect();
        let volume_fds: Vec<RawFd> = volumes.iter().map(AsRawFd::as_raw_fd).collect();
        let net_fds = (
            netns.as_deref().map(AsRawFd::as_raw_fd),
            tap.as_ref().map(AsRawFd::as_raw_fd),
        );
        let ram_fd = ram_file.as_ref().map(AsRawFd::as_raw_fd);
        let kvm_gid = (self.accel == Accelerator::Kvm)
            .then(|| fs::metadata("/dev/kvm").ok().map(|m| m.gid()))
            .flatten();
        // SAFETY: the hook runs in the forked child before exec, and makes
        // only async-signal-safe system calls on data built before the
        // fork (descriptors, integers); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                confine(&procs_fds, &fds, ram_fd, &volume_fds, net_fds, uid, kvm_gid)
            });
        }
        // The child forks QEMU and exits at once (`confine`): QEMU is
        // parented by nobody brig runs.
        let status = cmd.status().map_err(io("start QEMU"))?;
        // QEMU holds the tap now: brig's copy goes (the device goes with
        // QEMU's).
        drop((kernel, initrd, root, own, rw, procs, tap, netns, volumes));
        drop(ram_file);
        if !status.success() {
            return Err(TierError::failed(id, "start QEMU", status.to_string()));
        }

        // 5. Its pid, recorded; then the agent's answer.
        let pid = wait_for_pid(&dir.join("qemu.pid")).ok_or_else(|| {
            TierError::failed(
                id,
                "start QEMU",
                format!("QEMU wrote no pid file: {}", tail(&dir.join("qemu.log"))),
            )
        })?;
        let start = start_time(pid).unwrap_or(0);
        let tmp = dir.join(".state");
        fs::write(&tmp, format!("{}\n{pid} {start} {uid}\n", self.owner))
            .and_then(|()| fs::rename(&tmp, dir.join(STATE_FILE)))
            .map_err(io("record its state"))?;
        let instance = self.instance(id, dir, pid)?;
        if let Some(saved) = from {
            instance.load(saved, network)?;
        }
        instance.wait_for_agent()?;
        Ok(instance)
    }

    fn instance(
        &self,
        id: &SandboxId,
        dir: &Path,
        pid: libc::pid_t,
    ) -> Result<VmInstance, TierError> {
        let pidfd = pidfd_open(pid).map_err(|e| TierError::failed(id, "watch QEMU", e))?;
        Ok(VmInstance {
            id: id.clone(),
            pid,
            pidfd,
            dir: dir.to_path_buf(),
            disk: self.disks.join(format!("{id}.ext4")),
            groups: Groups::new(&self.hierarchy, id),
            overhead: self.accel.overhead_bytes(),
            boot_timeout: match self.accel {
                Accelerator::Kvm => Duration::from_secs(30),
                // Emulated: seconds per boot, more on a loaded host.
                Accelerator::Tcg => Duration::from_secs(120),
            },
            line: Mutex::new(None),
            state: Mutex::new(Phase::Live),
            ended: Mutex::new(None),
        })
    }
}

/// Between fork and exec: join the groups, take the shared files as
/// descriptors 3–5, the sandbox's directory as 6, its disk as 7, its tap
/// (if it has one) as 8, its RAM's file (if it has one) as 9, enter the
/// sandbox's network namespace (or, with none, a new empty one: QEMU
/// never sees the host's network), fork
/// once more (QEMU must not be brig's child), leave brig's session,
/// become `uid` (no supplementary groups but /dev/kvm's where KVM is
/// used; no capabilities left after).
fn confine(
    procs: &[RawFd],
    fds: &[RawFd; 5],
    ram: Option<RawFd>,
    volumes: &[RawFd],
    (netns, tap): (Option<RawFd>, Option<RawFd>),
    uid: u32,
    kvm_gid: Option<u32>,
) -> std::io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    for &p in procs {
        // SAFETY: writing two bytes from a static buffer to an open fd.
        let n = unsafe { libc::write(p, b"0".as_ptr().cast(), 1) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    for (i, &fd) in fds.iter().enumerate() {
        // SAFETY: dup2 on descriptors open in this process; the sources
        // are above 100 (high_dup), so never equal to their targets.
        check(unsafe { libc::dup2(fd, 3 + i as RawFd) })?;
    }
    if let Some(tap) = tap {
        // SAFETY: as above.
        check(unsafe { libc::dup2(tap, 8) })?;
    }
    if let Some(ram) = ram {
        // SAFETY: as above.
        check(unsafe { libc::dup2(ram, qemu::RAM_FD) })?;
    }
    for (i, &fd) in volumes.iter().enumerate() {
        // SAFETY: as above (at most 16 volumes, two each: 10..=41, below
        // 100).
        check(unsafe { libc::dup2(fd, qemu::VOLUME_FD + i as RawFd) })?;
    }
    // SAFETY: setns on a namespace descriptor brig holds, or unshare;
    // integers only.
    check(unsafe {
        match netns {
            Some(ns) => libc::setns(ns, libc::CLONE_NEWNET),
            None => libc::unshare(libc::CLONE_NEWNET),
        }
    })?;
    // Detach: this child exits, its child goes on to exec QEMU, which
    // init inherits. (std's spawn still learns of a failed exec: the
    // grandchild holds its error pipe until the exec.)
    // SAFETY: fork in a single-threaded child; the parent side only exits.
    match unsafe { libc::fork() } {
        -1 => return Err(std::io::Error::last_os_error()),
        0 => {}
        // SAFETY: _exit ends this child without running anything else.
        _ => unsafe { libc::_exit(0) },
    }
    // SAFETY: integer-only system calls.
    unsafe {
        check(libc::setsid())?;
        match kvm_gid {
            Some(g) => check(libc::setgroups(1, &g))?,
            None => check(libc::setgroups(0, std::ptr::null()))?,
        }
        check(libc::setgid(uid))?;
        check(libc::setuid(uid))?;
    }
    Ok(())
}

/// QEMU's pid, once it wrote it (it does so before it opens a device):
/// `None` after 10 s.
fn wait_for_pid(file: &Path) -> Option<libc::pid_t> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pid = fs::read_to_string(file)
            .ok()
            .and_then(|p| p.trim().parse::<libc::pid_t>().ok())
            .filter(|p| *p > 0);
        if pid.is_some() || Instant::now() > deadline {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether a migration leaves out the RAM in shared memory files
/// (`x-ignore-shared`): a checkpoint whose RAM is kept apart, on both
/// sides.
fn ignore_shared(q: &mut Qmp, on: bool) -> Result<serde_json::Value, crate::qmp::QmpError> {
    q.execute(
        "migrate-set-capabilities",
        Some(serde_json::json!({
            "capabilities": [{ "capability": "x-ignore-shared", "state": on }]
        })),
    )
}

/// `file`, once this process holds the exclusive `flock` on it (released
/// when it closes).
fn lock_exclusive(file: File) -> std::io::Result<File> {
    // SAFETY: flock on a descriptor we hold.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

/// A guest's vCPUs for `limits`: its CPU quota rounded up, at least one.
fn vcpus(limits: &Limits) -> u32 {
    limits.cpus.map_or(1, |c| c.ceil().max(1.0) as u32)
}

/// A guest's RAM: an empty memory file of `bytes` (its pages are charged
/// to the memory group of the QEMU that touches them), at descriptor 100
/// or above.
fn memory_file(id: &SandboxId, bytes: u64) -> std::io::Result<OwnedFd> {
    let name = std::ffi::CString::new(format!("brig-ram-{id}")).unwrap_or_default();
    // SAFETY: memfd_create with a NUL-terminated name; the result is
    // checked.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned here alone.
    let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.set_len(bytes)?;
    high_dup(&file)
}

/// A copy of `f` at descriptor 100 or above, close-on-exec.
fn high_dup(f: &File) -> std::io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor; the result is checked.
    let fd = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 100) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor fcntl just returned, owned here alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(c) = source {
        s.push_str(": ");
        s.push_str(&c.to_string());
        source = c.source();
    }
    s
}

/// The last lines of a file (a log), as one line.
fn tail(path: &Path) -> String {
    let said = fs::read_to_string(path).unwrap_or_default();
    let mut tail: Vec<&str> = said.lines().rev().take(6).collect();
    tail.reverse();
    tail.join(" / ")
}

/// What `state` says.
#[derive(Debug)]
struct Recorded {
    owner: String,
    pid: libc::pid_t,
    start: u64,
    uid: u32,
}

fn read_state(dir: &Path) -> Option<Recorded> {
    let text = fs::read_to_string(dir.join(STATE_FILE)).ok()?;
    let (owner, rest) = text.split_once('\n')?;
    let mut it = rest.split_whitespace().map(str::parse::<u64>);
    Some(Recorded {
        owner: owner.to_string(),
        pid: libc::pid_t::try_from(it.next()?.ok()?).ok()?,
        start: it.next()?.ok()?,
        uid: u32::try_from(it.next()?.ok()?).ok()?,
    })
}

/// The start time of `pid` (field 22 of /proc/PID/stat), to tell it from
/// a later process given the same pid.
fn start_time(pid: libc::pid_t) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open with a pid and no flags; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned here alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Wait up to `timeout` for the process behind `pidfd` to end.
fn pidfd_wait(pidfd: &OwnedFd, timeout: Option<Duration>) -> bool {
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let ms = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return false;
                }
                left.as_millis().min(i32::MAX as u128) as i32
            }
            None => -1,
        };
        let mut p = libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            return true;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != ErrorKind::Interrupted {
            return true;
        }
    }
}

fn kill_pidfd(pidfd: &OwnedFd) {
    // SAFETY: pidfd_send_signal on a pidfd we hold, no siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
}

/// SIGKILL every QEMU named for sandbox `id` (`-name brig-<id>`: one a
/// launch cut short started before its pid was recorded), and wait (up to
/// 5 s) for them to be gone. A scan of /proc: for discards, which are
/// rare.
fn kill_processes_naming(id: &SandboxId) {
    let needle = format!("\0brig-{id}\0").into_bytes();
    let naming = || -> Vec<libc::pid_t> {
        let Ok(entries) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
            .filter(|pid| {
                fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.windows(needle.len()).any(|w| w == needle.as_slice()))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let pids = naming();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            // SAFETY: kill takes integers only.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Remove everything of a guest whose QEMU is dead or dying.
fn teardown(groups: &Groups, id: &SandboxId, dir: &Path, disk: &Path) -> Result<(), TierError> {
    groups.remove();
    let _ = fs::remove_file(disk);
    let removed = match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    let _ = fs::remove_dir_all(dir.with_file_name(format!(".{id}")));
    removed.map_err(|e| TierError::failed(id, "remove its directory", e))
}

impl VmTier {
    /// A new guest: booted, or restored `from` a checkpoint.
    fn create(
        &self,
        launch: &Launch,
        from: Option<&Saved>,
    ) -> Result<Box<dyn Instance>, TierError> {
        self.create_with(launch, from, false)
            .map(|i| Box::new(i) as Box<dyn Instance>)
    }

    /// [`create`](VmTier::create), and a booted guest given a network
    /// device on nothing where `unplugged_nic` (a boot snapshot's, whose
    /// restores are given their networks).
    fn create_with(
        &self,
        launch: &Launch,
        from: Option<&Saved>,
        unplugged_nic: bool,
    ) -> Result<VmInstance, TierError> {
        if !launch.volumes.is_empty() && from.is_some() {
            return Err(TierError::Unsupported {
                tier: Isolation::Vm,
                op: "mount volumes in a sandbox restored from a memory snapshot",
                reason: "a restored machine has the saved one's devices, and a volume is a disk \
                         of its own: create it without volumes"
                    .into(),
            });
        }
        let paths: usize = launch.volumes.iter().map(|v| v.path.len()).sum();
        if paths > qemu::MAX_VOLUME_PATHS {
            return Err(TierError::Invalid(format!(
                "a vm sandbox's volume paths take at most {} bytes in all (its guest's kernel \
                 command line carries them); these take {paths}: use shorter paths",
                qemu::MAX_VOLUME_PATHS
            )));
        }
        let dir = self.sandbox_dir(&launch.id);
        if dir.exists() {
            return Err(TierError::Invalid(format!(
                "sandbox {} exists already",
                launch.id
            )));
        }
        let started = self
            .make_dir(&launch.id, &dir)
            .and_then(|uid| self.start(launch, &dir, uid, from, unplugged_nic));
        match started {
            Ok(instance) => Ok(instance),
            Err(e) => {
                let _ = self.discard(&launch.id);
                Err(e)
            }
        }
    }
}

/// How long a boot snapshot no launch used is kept.
const BOOT_KEPT: Duration = Duration::from_secs(24 * 3600);

impl VmTier {
    /// The boot snapshot `launch` starts from: a checkpoint of a guest of
    /// the same machine (template image, kernel and initramfs, RAM, vCPUs,
    /// disk size, a network device or none, QEMU) taken just after it
    /// booted, before anyone used it. Made the first time a machine is
    /// launched: a guest of no sandbox's (its own host name, no network,
    /// its device on nothing) is booted, checkpointed and ended. Every
    /// later launch is a restore in a fraction of a boot: the saved state
    /// and RAM loaded into a memory file of its own (so that its own
    /// checkpoints keep their RAM apart and their forks share it), its
    /// identity and address renewed (`load`).
    /// `None` with a QEMU older than 8.2 (whose guests' RAM is QEMU's
    /// own: the machines' state is kept as it always was), or volumes
    /// (disks of their own, which a restored machine cannot have).
    fn booted(&self, launch: &Launch) -> Result<Option<Saved>, TierError> {
        if !self.copy_on_write || !launch.volumes.is_empty() {
            return Ok(None);
        }
        let guest = self.guest()?;
        let image = {
            let _held = lock(&self.imaging);
            disk::template_image(&self.images, &launch.template)
                .map_err(|e| TierError::failed(&launch.id, "make its template's disk image", e))?
        };
        let nic = matches!(launch.network, NetworkAttachment::Namespace(_));
        let machine = {
            use std::hash::{Hash, Hasher};
            let qemu = fs::metadata(&self.qemu).map_or((0, 0), |m| (m.len(), m.mtime()));
            let mut h = std::hash::DefaultHasher::new();
            (
                &guest.kernel.version,
                guest.initramfs.file_name(),
                image.file_name(),
                launch.limits.memory.bytes(),
                vcpus(&launch.limits),
                launch.limits.disk.bytes(),
                nic,
                self.accel.as_str(),
                qemu::TcgCpu::Max,
                qemu,
            )
                .hash(&mut h);
            format!("{:016x}", h.finish())
        };
        let dir = self.boots.join(&machine);
        let used = |saved: Saved| {
            // Kept while launches use it (`forget_stale_boots`).
            let _ = File::open(dir.join(SAVED_MACHINE))
                .and_then(|f| f.set_modified(std::time::SystemTime::now()));
            Some(saved)
        };
        // Its RAM in the stream, as `checkpoint_as` keeps it here.
        let read = || {
            Saved::read(&dir)
                .ok()
                .filter(|s| s.ram == SavedRam::InStream)
        };
        if let Some(saved) = read() {
            return Ok(used(saved));
        }
        let io = |op: &'static str| move |e: std::io::Error| TierError::failed(&launch.id, op, e);
        // One maker at a time, in this daemon and any other sharing the
        // home (a lock file's flock, released as it closes).
        let _held = lock(&self.booting);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.boots)
            .map_err(io("make the boot snapshots' directory"))?;
        let _locked = File::create(self.boots.join(".lock"))
            .and_then(lock_exclusive)
            .map_err(io("lock the boot snapshots"))?;
        if let Some(saved) = read() {
            return Ok(used(saved));
        }
        // One of another kind (an older brig's) is made again.
        let _ = fs::remove_dir_all(&dir);
        let aside = self
            .boots
            .join(format!(".{machine}-{:08x}", rand::random::<u32>()));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&aside)
            .map_err(io("make its boot snapshot's directory"))?;
        let neutral = Launch {
            id: SandboxId::from_random(rand::random()),
            template: launch.template.clone(),
            limits: launch.limits.clone(),
            allow_setuid: launch.allow_setuid,
            network: NetworkAttachment::Loopback,
            volumes: Vec::new(),
        };
        let made = self.create_with(&neutral, None, nic).and_then(|guest| {
            let saved = guest.checkpoint_as(&aside, false);
            guest.kill();
            let _ = guest.wait();
            saved
        });
        let kept =
            made.and_then(|()| fs::rename(&aside, &dir).map_err(io("keep its boot snapshot")));
        if let Err(e) = kept {
            let _ = fs::remove_dir_all(&aside);
            return Err(e);
        }
        Saved::read(&dir).map(used)
    }

    /// Boot snapshots no launch used for a day, and halves a killed daemon
    /// left: gone (a launch reads one only while it restores).
    fn forget_stale_boots(&self) {
        for e in fs::read_dir(&self.boots).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name == ".lock" {
                continue;
            }
            let half = name.starts_with('.');
            let age = fs::metadata(e.path().join(SAVED_MACHINE))
                .or_else(|_| e.metadata())
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok());
            let stale = age.is_some_and(|a| {
                a > if half {
                    Duration::from_secs(600)
                } else {
                    BOOT_KEPT
                }
            });
            if stale {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A checkpoint's files (in the directory the runtime gives
/// [`Instance::checkpoint`]).
const SAVED_MEMORY: &str = "memory";
const SAVED_DISK: &str = "disk.ext4";
const SAVED_MACHINE: &str = "machine.json";
/// The machine's RAM, where it is kept apart from the stream
/// ([`SavedRam::Apart`]): mapped by each restore, shared until written.
const SAVED_RAM: &str = "ram";
/// The most vCPUs a saved machine may name.
const MAX_CPUS: u32 = 64;
/// How long saving or loading a machine's state may take (TCG, a loaded
/// host, a large guest).
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(300);

/// What a checkpoint says of its machine: a restore must be the same one.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Saved {
    memory_mib: u64,
    cpus: u32,
    /// The template's disk image's file name (in the images directory).
    image: PathBuf,
    /// It has a network device (a restore must have one too).
    #[serde(default)]
    nic: bool,
    /// Where its RAM is.
    #[serde(default)]
    ram: SavedRam,
    /// Its vCPUs' model under TCG (a restore's must be the same).
    #[serde(default)]
    cpu: qemu::TcgCpu,
    #[serde(skip)]
    dir: PathBuf,
}

/// Where a checkpoint keeps the machine's RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
enum SavedRam {
    /// In the stream, of a machine whose RAM was QEMU's own
    /// ([`qemu::Ram::Anonymous`]): a QEMU older than 8.2, or brig before
    /// it kept RAM apart.
    #[default]
    Anonymous,
    /// In the stream, of a machine whose RAM was a memory backend: a
    /// checkpoint of a fork (its RAM, mapped private, is not a file brig
    /// can copy).
    InStream,
    /// In [`SAVED_RAM`], copied while the machine was stopped; the stream
    /// holds the devices' state alone (`x-ignore-shared`).
    Apart,
}

impl Saved {
    fn read(dir: &Path) -> Result<Saved, TierError> {
        let file = dir.join(SAVED_MACHINE);
        let bad = |why: String| {
            TierError::Invalid(format!(
                "{} is not a vm checkpoint ({why}): delete the snapshot and take another",
                dir.display()
            ))
        };
        let text = fs::read(&file).map_err(|e| bad(format!("{}: {e}", file.display())))?;
        let mut saved: Saved =
            serde_json::from_slice(&text).map_err(|e| bad(format!("{}: {e}", file.display())))?;
        if !(1..=MAX_CPUS).contains(&saved.cpus) || (saved.memory_mib << 20) < MIN_MEMORY {
            return Err(bad(format!(
                "a machine of {} vCPUs and {} MiB",
                saved.cpus, saved.memory_mib
            )));
        }
        saved.dir = dir.to_path_buf();
        Ok(saved)
    }
}

impl Tier for VmTier {
    fn isolation(&self) -> Isolation {
        Isolation::Vm
    }

    /// Restored from the boot snapshot of its machine where there is one
    /// (made first if not: [`VmTier::booted`]), else booted.
    fn launch(&self, launch: &Launch) -> Result<Box<dyn Instance>, TierError> {
        match self.booted(launch) {
            Ok(Some(boot)) => self.create(launch, Some(&boot)),
            Ok(None) => self.create(launch, None),
            Err(e) => {
                tracing::warn!(
                    "sandbox {}: booting its guest (no boot snapshot: {})",
                    launch.id,
                    chain(&e)
                );
                self.create(launch, None)
            }
        }
    }

    /// A memory snapshot is the whole machine: its devices' state and RAM
    /// as QEMU migrates them, and its writable disk; on any network (a
    /// restore's guest is given its new address: `load`).
    /// Each volume's image as a disk the guest's kernel mounts: the
    /// runtime lets nothing else mount it meanwhile.
    fn volume_access(&self) -> brig_core::VolumeAccess {
        brig_core::VolumeAccess::Exclusive
    }

    fn checkpoints(&self) -> Checkpoints {
        Checkpoints::Memory
    }

    /// A new QEMU of the saved machine (its RAM and vCPUs: `launch`'s
    /// memory limit is not used), on a copy of its disk, loads the saved
    /// state, runs on, and is given its own identity (see `load`).
    fn restore(&self, launch: &Launch, image: &Path) -> Result<Box<dyn Instance>, TierError> {
        let saved = Saved::read(image)?;
        self.create(launch, Some(&saved))
    }

    fn adopt(&self, id: &SandboxId) -> Result<Option<Box<dyn Instance>>, TierError> {
        let dir = self.sandbox_dir(id);
        let live = read_state(&dir).filter(|s| s.pid > 0 && start_time(s.pid) == Some(s.start));
        match live {
            Some(s) => Ok(Some(Box::new(self.instance(id, &dir, s.pid)?))),
            None => {
                self.discard(id)?;
                Ok(None)
            }
        }
    }

    fn discard(&self, id: &SandboxId) -> Result<(), TierError> {
        let dir = self.sandbox_dir(id);
        if let Some(s) = read_state(&dir) {
            if s.pid > 0 && start_time(s.pid) == Some(s.start) {
                if let Ok(fd) = pidfd_open(s.pid) {
                    kill_pidfd(&fd);
                    pidfd_wait(&fd, Some(Duration::from_secs(5)));
                }
            }
        }
        kill_processes_naming(id);
        teardown(
            &Groups::new(&self.hierarchy, id),
            id,
            &dir,
            &self.disks.join(format!("{id}.ext4")),
        )
    }

    /// One command in a fresh guest, on this process's stdio; see
    /// `oneshot.rs`.
    fn run(
        &self,
        spec: &brig_core::SandboxSpec,
        network: &NetworkAttachment,
    ) -> Result<Box<dyn brig_core::OneShot>, TierError> {
        crate::oneshot::run(self, spec, network)
    }

    fn running(&self) -> Vec<SandboxId> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| read_state(&e.path()).is_some_and(|s| s.owner == self.owner))
            .filter_map(|e| e.file_name().to_str().and_then(SandboxId::parse))
            .collect()
    }
}

/// Where a [`VmInstance`] is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Live,
    /// Let go for a later daemon.
    Released,
    /// Torn down.
    Done,
}

/// The resident bytes of the guest's RAM in QEMU's `smaps`: the mapping
/// of exactly `ram` bytes (QEMU maps the guest's RAM as one region, its
/// own allocations are smaller; a guard page may follow it, so the
/// largest mapping of at least `ram` bytes and below `ram` + 2 MiB).
/// `None` when there is no such mapping.
fn guest_ram_resident(smaps: &str, ram: u64) -> Option<u64> {
    let kib = |line: &str, key: &str| -> Option<u64> {
        line.strip_prefix(key)?
            .trim()
            .strip_suffix("kB")?
            .trim()
            .parse::<u64>()
            .ok()
            .map(|k| k << 10)
    };
    let mut best: Option<(u64, u64)> = None;
    let mut size = None;
    for line in smaps.lines() {
        if let Some(bytes) = kib(line, "Size:") {
            size = Some(bytes);
        } else if let Some(rss) = kib(line, "Rss:") {
            if let Some(bytes) = size.take().filter(|b| (ram..ram + (2 << 20)).contains(b)) {
                if best.is_none_or(|(b, _)| bytes > b) {
                    best = Some((bytes, rss));
                }
            }
        }
    }
    best.map(|(_, rss)| rss)
}

/// One guest of the vm tier.
#[derive(Debug)]
pub struct VmInstance {
    id: SandboxId,
    /// QEMU on the host.
    pid: libc::pid_t,
    pidfd: OwnedFd,
    dir: PathBuf,
    disk: PathBuf,
    groups: Groups,
    /// What QEMU's memory limit holds beyond the guest's RAM.
    overhead: u64,
    /// How long the guest's agent may take to first answer.
    boot_timeout: Duration,
    /// The line under the current agent connection: shut down before a
    /// new one is made (QEMU serves one client at a time).
    line: Mutex<Option<UnixStream>>,
    state: Mutex<Phase>,
    ended: Mutex<Option<Ended>>,
}

impl VmInstance {
    fn qmp(&self) -> Result<Qmp, TierError> {
        Qmp::connect(&self.dir.join("qmp.sock")).map_err(|e| {
            if pidfd_wait(&self.pidfd, Some(Duration::ZERO)) {
                TierError::Gone {
                    id: self.id.clone(),
                }
            } else {
                TierError::failed(&self.id, "reach QEMU's control socket", e)
            }
        })
    }

    fn status(&self) -> Result<String, TierError> {
        self.qmp()?
            .status()
            .map_err(|e| TierError::failed(&self.id, "read the machine's state", e))
    }

    /// Until the guest's agent answers on its line (the kernel booted and
    /// the agent listens), or QEMU died, or the boot took too long.
    fn wait_for_agent(&self) -> Result<(), TierError> {
        let deadline = Instant::now() + self.boot_timeout;
        let failed = |why: String| {
            TierError::failed(
                &self.id,
                "start its agent",
                format!(
                    "{why}; QEMU says: {}; the guest's console says: {}",
                    tail(&self.dir.join("qemu.log")),
                    tail(&self.dir.join("console.log"))
                ),
            )
        };
        loop {
            if pidfd_wait(&self.pidfd, Some(Duration::ZERO)) {
                return Err(failed("QEMU ended".into()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.connect_line(left) {
                Ok(c) => {
                    drop(c);
                    return Ok(());
                }
                // QEMU has not made its socket yet.
                Err(line::LineError::Dial { ref source, .. })
                    if matches!(
                        source.kind(),
                        ErrorKind::NotFound | ErrorKind::ConnectionRefused
                    ) && !left.is_zero() =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(failed(chain(&e))),
            }
        }
    }

    /// QMP, once QEMU listens (a QEMU just started may not yet).
    fn qmp_when_up(&self) -> Result<Qmp, TierError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.qmp() {
                Err(TierError::Failed { .. }) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                r => return r,
            }
        }
    }

    /// Restore (step 5 of a launch from a checkpoint): the saved state
    /// into this QEMU (started `-incoming defer -S`) through a descriptor
    /// (QEMU's seccomp filter forbids the `exec:` transport's fork, and
    /// 7.2 has no `file:` one), then run, then the guest's own identity
    /// over its line (the relay in its init answers `Renew`: the host's
    /// clock, fresh kernel randomness, host name, machine id). Its agent
    /// needs nothing else: the port shows no host while the old line is
    /// gone, and the next `Hello` is a connection like any other.
    fn load(&self, saved: &Saved, network: qemu::Network) -> Result<(), TierError> {
        let failed = |op: &'static str| {
            let dir = self.dir.clone();
            let id = self.id.clone();
            move |e: &dyn std::fmt::Display| {
                TierError::failed(
                    &id,
                    op,
                    format!(
                        "{e}; QEMU says: {}; the guest's console says: {}",
                        tail(&dir.join("qemu.log")),
                        tail(&dir.join("console.log"))
                    ),
                )
            }
        };
        let memory = File::open(saved.dir.join(SAVED_MEMORY))
            .map_err(|e| TierError::failed(&self.id, "open its snapshot's memory", e))?;
        let mut q = self.qmp_when_up()?;
        let load = failed("load its snapshot's memory");
        ignore_shared(&mut q, saved.ram == SavedRam::Apart)
            .and_then(|_| q.pass_fd("brig-load", std::os::fd::AsFd::as_fd(&memory)))
            .and_then(|()| {
                q.execute(
                    "migrate-incoming",
                    Some(serde_json::json!({ "uri": "fd:brig-load" })),
                )
            })
            .and_then(|_| q.wait_for_migration(MIGRATION_TIMEOUT))
            .map_err(|e| load(&chain(&e)))?;
        drop(memory);
        q.execute("cont", None)
            .map_err(|e| failed("run the restored machine")(&chain(&e)))?;
        drop(q);
        line::renew(
            &self.dir.join("agent.sock"),
            self.id.as_str(),
            self.boot_timeout,
        )
        .map_err(|e| failed("give the restored guest its identity")(&chain(&e)))?;
        // A new namespace, a new address: the guest's own must follow.
        if let qemu::Network::Tap { addr, gateway } = network {
            line::readdress(
                &self.dir.join("agent.sock"),
                addr,
                gateway,
                self.boot_timeout,
            )
            .map_err(|e| failed("give the restored guest its network address")(&chain(&e)))?;
        }
        Ok(())
    }

    /// The machine as a restore must make it again: its RAM (its group's
    /// limit, which brig set), its vCPUs (its command line), its
    /// template's image (descriptor 5).
    fn machine(&self) -> Result<Saved, TierError> {
        let memory = self
            .groups
            .usage()
            .memory_limit_bytes
            .saturating_sub(self.overhead);
        let cmdline = fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let cpus = args
            .iter()
            .position(|a| *a == b"-smp")
            .and_then(|i| std::str::from_utf8(args.get(i + 1)?).ok()?.parse().ok());
        let image = fs::read_link(format!("/proc/{}/fd/5", self.pid))
            .ok()
            .and_then(|p| p.file_name().map(PathBuf::from));
        match (cpus, image) {
            (Some(cpus), Some(image)) if memory > 0 => Ok(Saved {
                memory_mib: memory >> 20,
                cpus,
                image,
                nic: args.iter().any(|a| a.starts_with(b"virtio-net-pci")),
                ram: match args.iter().find(|a| a.starts_with(b"memory-backend-file,")) {
                    Some(a) if a.ends_with(b",share=on") => SavedRam::Apart,
                    Some(_) => SavedRam::InStream,
                    None => SavedRam::Anonymous,
                },
                cpu: match args.windows(2).any(|w| w == [&b"-cpu"[..], &b"max"[..]]) {
                    true => qemu::TcgCpu::Max,
                    false => qemu::TcgCpu::Qemu64,
                },
                dir: PathBuf::new(),
            }),
            _ => Err(TierError::failed(
                &self.id,
                "describe its machine",
                "its QEMU's memory limit, vCPUs or template image cannot be read",
            )),
        }
    }

    /// [`Instance::checkpoint`], its RAM kept apart where it can be
    /// (`apart`) or in the stream (a boot snapshot: each launch loads its
    /// own copy into its own memory file, so that its checkpoints can
    /// keep theirs apart).
    fn checkpoint_as(&self, image: &Path, apart: bool) -> Result<(), TierError> {
        self.checkpointable()?;
        let mut q = self.qmp()?;
        let running = !stopped(
            &q.status()
                .map_err(|e| TierError::failed(&self.id, "read the machine's state", e))?,
        );
        if running {
            q.execute("stop", None)
                .map_err(|e| TierError::failed(&self.id, "pause the machine", e))?;
        }
        let saved = self.save(&mut q, image, apart);
        if running {
            let resumed = q
                .execute("cont", None)
                .map_err(|e| TierError::failed(&self.id, "resume the machine", e));
            saved?;
            return resumed.map(drop);
        }
        saved
    }

    /// The machine's state, RAM and disk into `image` (QEMU stopped; see
    /// [`Instance::checkpoint`]). A RAM kept in a memory file of brig's
    /// is copied from it (its pages written, zeros left as holes) and left
    /// out of the stream.
    fn save(&self, q: &mut Qmp, image: &Path, apart: bool) -> Result<(), TierError> {
        let mut machine = self.machine()?;
        if !apart && machine.ram == SavedRam::Apart {
            machine.ram = SavedRam::InStream;
        }
        let io = |op: &'static str| move |e: std::io::Error| TierError::failed(&self.id, op, e);
        // Only root reads what the guest held (its forks' QEMUs are handed
        // the files they map).
        fs::set_permissions(image, fs::Permissions::from_mode(0o700))
            .map_err(io("keep its checkpoint to root"))?;
        let apart = machine.ram == SavedRam::Apart;
        if apart {
            let from = Path::new("/proc")
                .join(self.pid.to_string())
                .join("fd")
                .join(qemu::RAM_FD.to_string());
            disk::copy_memory(&from, &image.join(SAVED_RAM))
                .map_err(|e| TierError::failed(&self.id, "copy its RAM", e))?;
        }
        let memory = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(image.join(SAVED_MEMORY))
            .map_err(io("create its checkpoint's memory file"))?;
        // QEMU's default cap (32 MiB/s) is for live migration over a
        // network; the machine is stopped and the file local.
        q.execute(
            "migrate-set-parameters",
            Some(serde_json::json!({ "max-bandwidth": 1u64 << 40 })),
        )
        .and_then(|_| ignore_shared(q, apart))
        .and_then(|_| q.pass_fd("brig-save", std::os::fd::AsFd::as_fd(&memory)))
        .and_then(|()| {
            q.execute(
                "migrate",
                Some(serde_json::json!({ "uri": "fd:brig-save" })),
            )
        })
        .and_then(|_| q.wait_for_migration(MIGRATION_TIMEOUT))
        .map_err(|e| TierError::failed(&self.id, "save its memory", chain(&e)))?;
        memory
            .sync_all()
            .map_err(io("write its checkpoint's memory"))?;
        drop(memory);
        disk::copy_sparse(&self.disk, &image.join(SAVED_DISK))
            .map_err(|e| TierError::failed(&self.id, "copy its disk", e))?;
        let text = serde_json::to_vec(&machine).unwrap_or_default();
        fs::write(image.join(SAVED_MACHINE), text).map_err(io("describe its machine"))
    }

    fn connect_line(&self, timeout: Duration) -> Result<UnixStream, line::LineError> {
        let mut current = lock(&self.line);
        if let Some(old) = current.take() {
            let _ = old.shutdown(std::net::Shutdown::Both);
        }
        let c = line::connect(&self.dir.join("agent.sock"), timeout)?;
        *current = c.line.try_clone().ok();
        Ok(c.stream)
    }
}

impl Instance for VmInstance {
    fn id(&self) -> &SandboxId {
        &self.id
    }

    fn pid(&self) -> Option<u32> {
        u32::try_from(self.pid).ok()
    }

    fn connect_agent(&self) -> Result<UnixStream, TierError> {
        if pidfd_wait(&self.pidfd, Some(Duration::ZERO)) {
            return Err(TierError::Gone {
                id: self.id.clone(),
            });
        }
        self.connect_line(self.boot_timeout).map_err(|e| match e {
            line::LineError::Dial { ref source, .. }
                if matches!(
                    source.kind(),
                    ErrorKind::NotFound | ErrorKind::ConnectionRefused
                ) =>
            {
                TierError::Gone {
                    id: self.id.clone(),
                }
            }
            e => TierError::failed(&self.id, "connect to the agent", e),
        })
    }

    /// QMP `stop`: the vCPUs stop where they are; the guest's clock and
    /// processes with them.
    fn pause(&self) -> Result<(), TierError> {
        self.qmp()?
            .execute("stop", None)
            .map(drop)
            .map_err(|e| TierError::failed(&self.id, "pause the machine", e))
    }

    /// A no-op on a machine that is not paused (the runtime resumes every
    /// sandbox it adopts).
    fn resume(&self) -> Result<(), TierError> {
        if !stopped(&self.status()?) {
            return Ok(());
        }
        self.qmp()?
            .execute("cont", None)
            .map(drop)
            .map_err(|e| TierError::failed(&self.id, "resume the machine", e))
    }

    fn is_paused(&self) -> Result<bool, TierError> {
        Ok(stopped(&self.status()?))
    }

    /// QMP `stop` (unless it is paused), the machine migrated to a file
    /// through a descriptor, its disk copied (holes kept), `cont` (unless
    /// it was paused). The guest's agent connection survives it: nothing
    /// in the guest noticed.
    /// Not with volumes: they are disks of their own, outside what a
    /// checkpoint holds (its memory and its writable disk).
    fn checkpointable(&self) -> Result<(), TierError> {
        let cmdline = fs::read(format!("/proc/{}/cmdline", self.pid)).unwrap_or_default();
        let volumes = cmdline
            .split(|b| *b == 0)
            .filter(|a| a.starts_with(b"virtio-blk-pci,drive=vol"))
            .count();
        if volumes > 0 {
            return Err(TierError::Unsupported {
                tier: Isolation::Vm,
                op: "snapshot a sandbox with volumes",
                reason: "its volumes are disks of their own, which a snapshot of the machine \
                         would not hold: snapshot a vm sandbox created without volumes"
                    .into(),
            });
        }
        Ok(())
    }

    fn checkpoint(&self, image: &Path) -> Result<(), TierError> {
        self.checkpoint_as(image, true)
    }

    fn end_all_but_agent(&self) -> Result<usize, TierError> {
        Err(TierError::Unsupported {
            tier: Isolation::Vm,
            op: "end every process but the agent",
            reason: "the guest's processes are not visible from the host (not built yet)".into(),
        })
    }

    /// QEMU's groups (QEMU's threads, the CPU time of the machine); the
    /// memory: the guest's RAM as the guest touched it (the resident part
    /// of QEMU's mapping of it), out of the guest's RAM — not QEMU's whole
    /// group, which holds its own overhead too (TCG's translation cache,
    /// its heap) and would read as more than the machine has; the disk:
    /// blocks the writable disk's file holds, out of its size.
    fn usage(&self) -> Result<Usage, TierError> {
        let mut usage = self.groups.usage();
        usage.memory_limit_bytes = usage.memory_limit_bytes.saturating_sub(self.overhead);
        let guest = fs::read_to_string(format!("/proc/{}/smaps", self.pid))
            .ok()
            .and_then(|smaps| guest_ram_resident(&smaps, usage.memory_limit_bytes));
        usage.memory_bytes = guest
            .unwrap_or(usage.memory_bytes)
            .min(usage.memory_limit_bytes);
        if let Ok(m) = fs::metadata(&self.disk) {
            usage.disk_used_bytes = Some(m.blocks() * 512);
            usage.disk_total_bytes = Some(m.len());
        }
        Ok(usage)
    }

    /// The guest's kernel knows what of its RAM it uses; QEMU only which
    /// pages it touched (all of them, after a restore).
    fn memory_in_guest(&self) -> bool {
        true
    }

    /// The CPU quota changes live; memory is the guest's RAM, fixed when it
    /// booted (no balloon yet): another memory limit is refused.
    fn set_limits(&self, limits: &Limits) -> Result<(), TierError> {
        let booted = self
            .groups
            .usage()
            .memory_limit_bytes
            .saturating_sub(self.overhead);
        if limits.memory.bytes() != booted {
            return Err(TierError::Unsupported {
                tier: Isolation::Vm,
                op: "change a running machine's memory",
                reason: "its RAM is fixed when it boots".into(),
            });
        }
        if let Some(c) = limits.cpus {
            self.groups
                .set_cpu((c * CFS_PERIOD_US as f64).round() as u64, CFS_PERIOD_US)
                .map_err(|e| TierError::failed(&self.id, "change the machine's CPU quota", e))?;
        }
        Ok(())
    }

    fn kill(&self) {
        kill_pidfd(&self.pidfd);
    }

    fn release(&self) {
        let mut state = lock(&self.state);
        if *state == Phase::Live {
            *state = Phase::Released;
        }
    }

    fn wait(&self) -> Result<Ended, TierError> {
        let mut state = lock(&self.state);
        if *state != Phase::Done {
            pidfd_wait(&self.pidfd, None);
            if let Some(l) = lock(&self.line).take() {
                let _ = l.shutdown(std::net::Shutdown::Both);
            }
            let oom = self.groups.usage().oom_kills.is_some_and(|n| n > 0);
            let torn = teardown(&self.groups, &self.id, &self.dir, &self.disk);
            *state = Phase::Done;
            *lock(&self.ended) = Some(Ended { code: None, oom });
            torn?;
        }
        drop(state);
        Ok(lock(&self.ended).clone().unwrap_or_default())
    }
}

impl Drop for VmInstance {
    /// A handle dropped without `wait` or `release` ends its guest: an
    /// error path never leaks one.
    fn drop(&mut self) {
        if *lock(&self.state) == Phase::Live {
            self.kill();
            let _ = Instance::wait(self);
        }
    }
}

/// A QMP status of a machine that does not run and will on `cont`:
/// paused, or (its state saved to a checkpoint while paused) past a
/// migration.
fn stopped(status: &str) -> bool {
    matches!(status, "paused" | "postmigrate")
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::guest_ram_resident;

    #[test]
    fn the_guest_ram_is_the_mapping_of_its_size() {
        // QEMU's heap (bigger resident set, smaller mapping), the guest's
        // 512 MiB, its guard page, TCG's 64 MiB translation cache.
        let smaps = "\
55d0c0000000-55d0c8000000 rw-p 00000000 00:00 0 [heap]
Size:             131072 kB
Rss:              120000 kB
7f0000000000-7f0020000000 rw-s 00000000 00:01 1234 /memfd:brig-ram (deleted)
Size:             524288 kB
KernelPageSize:        4 kB
Rss:              204800 kB
7f0020000000-7f0020001000 ---p 00000000 00:00 0
Size:                  4 kB
Rss:                   0 kB
7f0030000000-7f0034000000 rwxp 00000000 00:00 0
Size:              65536 kB
Rss:               65536 kB
";
        assert_eq!(guest_ram_resident(smaps, 512 << 20), Some(204800 << 10));
        // No mapping of the guest's size: not known.
        assert_eq!(guest_ram_resident(smaps, 1 << 30), None);
    }
}
