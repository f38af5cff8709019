//! `brig run --isolation gvisor`: one command in a fresh gvisor sandbox,
//! on the caller's stdio, through brig-core's [`Tier::run`].
//!
//! The sandbox is made as a daemon's is (`tier.rs`: its directory, root
//! and bundle), with the command as its init instead of the agent, and run
//! by `runsc run` in the foreground, a child of this process that exits
//! with the command's status. That child dies with its caller
//! (`PR_SET_PDEATHSIG`); the sandbox process it started does not (this
//! runsc has no `--attached`): a sandbox whose `brig run` was killed is
//! discarded by the next gvisor tier made on this host, whose owner check
//! finds its owner (`/proc/<pid>`) gone.
//!
//! With `-t` the command runs on a terminal runsc makes: its master comes
//! over the console socket (`--console-socket`, SCM_RIGHTS) and `brig run`
//! relays it as the process tier's ([`OneShot::take_pty`]).
//!
//! [`Tier::run`]: brig_core::Tier::run

use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Mutex;

use brig_core::{
    CommandFault, Ended, Isolation, NetworkAttachment, OneShot, SandboxId, SandboxSpec, TierError,
    UserSpec,
};

use crate::bundle::{self, BundleSpec, Init};
use crate::cgroup::Groups;
use crate::rootfs;
use crate::runsc::Runsc;
use crate::tier::{
    kill_pidfd, log_tail, pidfd_open, teardown, GvisorTier, CFS_PERIOD_US, LOG_FILE, STATE_FILE,
};

pub(crate) fn run(
    tier: &GvisorTier,
    spec: &SandboxSpec,
    network: &NetworkAttachment,
) -> Result<Box<dyn OneShot>, TierError> {
    let id = SandboxId::from_random(rand::random());
    let dir = tier.dir.join(id.as_str());
    match start(tier, spec, network, &id, &dir) {
        Ok(run) => Ok(Box::new(run)),
        Err(e) => {
            let _ = teardown(&tier.runsc, &Groups::new(&tier.hierarchy, &id), &id, &dir);
            Err(e)
        }
    }
}

fn start(
    tier: &GvisorTier,
    spec: &SandboxSpec,
    network: &NetworkAttachment,
    id: &SandboxId,
    dir: &Path,
) -> Result<GvisorRun, TierError> {
    let io = |op: &'static str| move |e: std::io::Error| TierError::failed(id, op, e);
    fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
        .map_err(io("create its runtime directory"))?;
    fs::write(dir.join(STATE_FILE), format!("{}\n0 0\n", tier.owner))
        .map_err(io("record its owner"))?;
    let netns = match network {
        NetworkAttachment::Namespace(ns) => Some(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            std::os::fd::AsRawFd::as_raw_fd(ns.as_ref())
        )),
        _ => None,
    };
    let root = rootfs::prepare(dir, &spec.template, spec.limits.disk.bytes(), None).map_err(
        |e| match e {
            rootfs::RootfsError::Unresolved(_) => TierError::Invalid(e.to_string()),
            e => TierError::failed(id, "prepare its root filesystem", e),
        },
    )?;
    // The user, from the template's /etc/passwd (the host's for `host`).
    let passwd_root = if root.binds.iter().any(|b| b == Path::new("/etc")) {
        PathBuf::from("/")
    } else {
        root.path.clone()
    };
    let (uid, gid, home) = lookup_user(&passwd_root, spec.user.as_ref())?;
    let mut env: Vec<String> = spec
        .env
        .iter()
        .map(|e| format!("{}={}", e.key, e.value))
        .collect();
    if !spec.env.iter().any(|e| e.key == "PATH") {
        env.push(format!("PATH={}", bundle::PATH));
    }
    if !spec.env.iter().any(|e| e.key == "HOME") {
        env.push(format!("HOME={home}"));
    }
    if spec.tty && !spec.env.iter().any(|e| e.key == "TERM") {
        env.push(format!("TERM={}", brig_core::terminal_type()));
    }
    let cwd = spec.workdir.clone().unwrap_or_else(|| "/".into());
    let compat = crate::compat::install(dir, &root).map_err(io("install its statx shim"))?;
    let bundle_dir = dir.join("bundle");
    fs::create_dir_all(&bundle_dir).map_err(io("create its bundle"))?;
    let config = bundle::config(&BundleSpec {
        id,
        root: &root.path,
        binds: &root.binds,
        masks: &root.masks,
        init: Init::Command {
            args: &spec.command,
            terminal: spec.tty,
            env,
            cwd: &cwd,
            uid,
            gid,
        },
        limits: &spec.limits,
        allow_setuid: spec.allow_setuid,
        netns: netns.as_deref(),
        cfs_period_us: CFS_PERIOD_US,
        volumes: &[],
        compat: Some(&compat),
    });
    fs::write(
        bundle_dir.join("config.json"),
        serde_json::to_vec_pretty(&config).unwrap_or_default(),
    )
    .map_err(io("write its bundle"))?;
    let network = if netns.is_some() { "host" } else { "none" };
    let pid_file = dir.join("pid");
    // With a terminal, runsc connects here and sends its master side.
    let console = spec.tty.then(|| dir.join(CONSOLE_SOCKET));
    let listener = console
        .as_deref()
        .map(|path| {
            std::os::unix::net::UnixListener::bind(path).map_err(io("listen for its terminal"))
        })
        .transpose()?;
    // runsc's own messages go to the log (read back if it could not start
    // the command); stdin, stdout and stderr are the command's.
    let mut cmd = tier.runsc.run_foreground(
        id.as_str(),
        &bundle_dir,
        network,
        &pid_file,
        &dir.join(LOG_FILE),
        console.as_deref(),
    );
    // Its stdio through pipes brig relays: runsc makes the descriptors it
    // is given non-blocking and writes to them from gVisor's kernel, which
    // on this process's own (a pipe, a terminal) lost and reordered output
    // and left the caller's shell with a non-blocking stdout. The relays
    // end when the sandbox has closed its side (`wait` joins them).
    // With a terminal the command's input comes through the terminal
    // (`brig run` relays its stdin to the master): runsc gets none, or a
    // relay here would race that one for the caller's keystrokes.
    cmd.stdin(if spec.stdin && !spec.tty {
        std::process::Stdio::piped()
    } else {
        std::process::Stdio::null()
    })
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    // SAFETY: the hook runs in the forked child before exec and makes one
    // async-signal-safe system call.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| TierError::Unavailable {
        tier: Isolation::Gvisor,
        reason: format!("cannot run {}: {e}", tier.runsc.binary.display()),
    })?;
    let mut relays = Vec::new();
    if let Some(mut out) = child.stdout.take() {
        relays.push(std::thread::spawn(move || {
            let _ = std::io::copy(&mut out, &mut std::io::stdout().lock());
        }));
    }
    if let Some(mut err) = child.stderr.take() {
        relays.push(std::thread::spawn(move || {
            let _ = std::io::copy(&mut err, &mut std::io::stderr().lock());
        }));
    }
    if let Some(mut input) = child.stdin.take() {
        // Not joined: it may block on this process's stdin for ever; it
        // ends when the sandbox's side closes (EPIPE) or with the process.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut input);
        });
    }
    let pidfd = pidfd_open(child.id() as libc::pid_t)
        .map_err(|e| TierError::failed(id, "watch runsc", e))?;
    let pty = match &listener {
        Some(listener) => Some(receive_terminal(listener, &pidfd, dir).map_err(|e| {
            let _ = child.kill();
            let _ = child.wait();
            TierError::failed(id, "receive its terminal from runsc", e)
        })?),
        None => None,
    };
    Ok(GvisorRun {
        pty,
        id: id.clone(),
        dir: dir.to_path_buf(),
        runsc: tier.runsc.clone(),
        groups: Groups::new(&tier.hierarchy, id),
        pidfd,
        child: Mutex::new(child),
        relays: Mutex::new(relays),
    })
}

/// (uid, gid, home) of `user` in `root`'s /etc/passwd; root's without one.
fn lookup_user(root: &Path, user: Option<&UserSpec>) -> Result<(u32, u32, String), TierError> {
    let passwd = fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    let entry = |pred: &dyn Fn(&[&str]) -> bool| {
        passwd.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 6 && pred(&f)).then(|| {
                (
                    f[2].parse().unwrap_or(0),
                    f[3].parse().unwrap_or(0),
                    f[5].to_string(),
                )
            })
        })
    };
    match user {
        None => Ok(entry(&|f| f[2] == "0").unwrap_or((0, 0, "/root".into()))),
        Some(UserSpec::Id { uid, gid }) => {
            let home = entry(&|f| f[2] == uid.to_string()).map_or("/".into(), |e| e.2);
            Ok((*uid, gid.unwrap_or(*uid), home))
        }
        Some(UserSpec::Name(name)) => entry(&|f| f[0] == name).ok_or_else(|| {
            TierError::Invalid(format!(
                "user {name:?} does not exist in the template's /etc/passwd; use a numeric uid \
                 or a user the template defines"
            ))
        }),
    }
}

/// Where runsc sends a terminal's master side, in the sandbox's directory.
const CONSOLE_SOCKET: &str = "console.sock";

/// How long runsc may take to make the terminal (it does before starting
/// the command: a cold start of gVisor's kernel is well under this).
const CONSOLE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The terminal master runsc sends over `listener` (SCM_RIGHTS on one
/// connection); an error if `runsc` (its `pidfd`) ends first or
/// [`CONSOLE_WAIT`] passes.
fn receive_terminal(
    listener: &std::os::unix::net::UnixListener,
    runsc: &OwnedFd,
    dir: &Path,
) -> std::io::Result<OwnedFd> {
    use rustix::event::{poll, PollFd, PollFlags};
    use rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let deadline = std::time::Instant::now() + CONSOLE_WAIT;
    let stream = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no terminal from runsc in {CONSOLE_WAIT:?}"),
            ));
        }
        let mut fds = [
            PollFd::new(listener, PollFlags::IN),
            PollFd::new(runsc, PollFlags::IN),
        ];
        let timeout = rustix::time::Timespec::try_from(left.min(std::time::Duration::from_secs(1)))
            .unwrap_or(rustix::time::Timespec {
                tv_sec: 1,
                tv_nsec: 0,
            });
        poll(&mut fds, Some(&timeout))?;
        if fds[1].revents().contains(PollFlags::IN) {
            return Err(std::io::Error::other(format!(
                "runsc ended before it made the terminal: {}",
                log_tail(dir)
            )));
        }
        if fds[0].revents().contains(PollFlags::IN) {
            break listener.accept()?.0;
        }
    };
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let mut buf = [0u8; 256];
    recvmsg(
        &stream,
        &mut [std::io::IoSliceMut::new(&mut buf)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message {
            if let Some(fd) = fds.next() {
                // The caller's terminal size from the start (brig run
                // relays later changes): runsc makes the terminal 0x0 and
                // the command may ask before the first relay.
                let caller = [0, 1, 2].into_iter().find_map(|n| {
                    // SAFETY: a standard descriptor, borrowed for the call.
                    let std_fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(n) };
                    rustix::termios::tcgetwinsize(std_fd)
                        .ok()
                        .filter(|w| w.ws_col > 0)
                });
                if let Some(size) = caller {
                    let _ = rustix::termios::tcsetwinsize(&fd, size);
                }
                return Ok(fd);
            }
        }
    }
    Err(std::io::Error::other(
        "runsc connected to the console socket but sent no terminal",
    ))
}

/// A `brig run` sandbox of the gvisor tier.
#[derive(Debug)]
struct GvisorRun {
    /// The terminal's master side, with `-t`, until `brig run` takes it.
    pty: Option<OwnedFd>,
    id: SandboxId,
    dir: PathBuf,
    runsc: Runsc,
    groups: Groups,
    /// `runsc run`'s: readable once it exited (the command has ended).
    pidfd: OwnedFd,
    child: Mutex<Child>,
    /// Copying the sandbox's stdout and stderr to this process's.
    relays: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl OneShot for GvisorRun {
    fn take_pty(&mut self) -> Option<OwnedFd> {
        self.pty.take()
    }

    fn exit_fd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    fn oom_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// The sandbox process (gVisor's kernel: everything in it dies), then
    /// runsc, which then exits.
    fn kill(&self) {
        let sandbox = fs::read_to_string(self.dir.join("pid"))
            .ok()
            .and_then(|p| p.trim().parse::<libc::pid_t>().ok())
            .filter(|p| *p > 0);
        if let Some(fd) = sandbox.and_then(|p| pidfd_open(p).ok()) {
            kill_pidfd(&fd);
        }
        kill_pidfd(&self.pidfd);
    }

    fn wait(self: Box<Self>) -> Result<Ended, TierError> {
        let status = self
            .child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .wait()
            .map_err(|e| TierError::failed(&self.id, "wait for runsc", e))?;
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .or_else(|| status.signal().map(|s| 128 + s))
            .unwrap_or(1);
        let oom = self
            .groups
            .usage()
            .ok()
            .and_then(|u| u.oom_kills)
            .is_some_and(|n| n > 0);
        // A command runsc could not start: say why, as the process tier
        // does (127: not found, 126: not executable).
        let said = log_tail(&self.dir);
        let fault = if said.contains("no such file or directory") && said.contains("exec") {
            Some(CommandFault::NotFound)
        } else if said.contains("permission denied") && said.contains("exec") {
            Some(CommandFault::NotExecutable)
        } else {
            None
        };
        let torn = teardown(&self.runsc, &self.groups, &self.id, &self.dir);
        // Everything the sandbox wrote is out before brig exits.
        for relay in self
            .relays
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = relay.join();
        }
        torn?;
        if let (Some(fault), true) = (fault, code != 0) {
            return Err(TierError::Command {
                fault,
                message: format!("the command could not start: {said}"),
            });
        }
        Ok(Ended {
            code: Some(code),
            oom,
        })
    }
}
