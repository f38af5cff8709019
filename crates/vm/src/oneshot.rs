//! `brig run --isolation vm`: one command in a fresh guest, on the
//! caller's stdio, through the same boundary as the daemon's sandboxes
//! ([`brig_core::Tier::run`]).
//!
//! The guest is launched as a daemon's is ([`VmTier::launch`]); the
//! command runs through its agent (an exec over the line), and two threads
//! carry the caller's stdin to it and its output to the caller's stdout and
//! stderr. The command's end makes [`OneShot::exit_fd`] readable; `wait`
//! ends the guest and removes everything of it. A caller killed with
//! SIGKILL leaves its guest running: the tier is owned by the caller's
//! `/proc/<pid>`, so the next vm tier made on this host discards it.
//!
//! With `-t` the command runs on a terminal in the guest (the agent's PTY
//! exec). `brig run` relays the caller's terminal to a local terminal's
//! master, as on every tier; the local slave, raw (no echo, no signals,
//! bytes as they are), is relayed to and from the guest's terminal, whose
//! line discipline is the one that counts. Size changes go to the guest by
//! [`OneShot::resize`].

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use brig_agent_client::{Connection, ExecRequest, Output, PtySize, Stdin};
use brig_core::{
    CommandFault, Ended, Instance, Launch, NetworkAttachment, OneShot, SandboxId, SandboxSpec,
    Tier, TierError, UserSpec,
};

use crate::tier::VmTier;

/// One command's guest.
#[derive(Debug)]
pub struct VmOneShot {
    instance: Box<dyn Instance>,
    /// Readable once the command has ended (its write end closed).
    exit_read: OwnedFd,
    output: Option<JoinHandle<()>>,
    code: Arc<Mutex<Option<i32>>>,
    /// With `-t`: the local terminal's master, until `brig run` takes it.
    master: Option<OwnedFd>,
    /// With `-t`: passes the caller's size changes on to the guest.
    resizer: Option<Stdin>,
    _conn: Connection,
}

pub(crate) fn run(
    tier: &VmTier,
    spec: &SandboxSpec,
    network: &NetworkAttachment,
) -> Result<Box<dyn OneShot>, TierError> {
    let launch = Launch {
        id: SandboxId::from_random(rand::random()),
        template: spec.template.clone(),
        limits: spec.limits.clone(),
        allow_setuid: spec.allow_setuid,
        network: network.clone(),
        volumes: Vec::new(),
    };
    let instance = tier.launch(&launch)?;
    let id = launch.id.clone();
    let conn = Connection::new(instance.connect_agent()?)
        .map_err(|e| TierError::failed(&id, "connect to the agent", e))?;
    let (user, uid, gid) = match &spec.user {
        None => (None, None, None),
        Some(UserSpec::Name(n)) => (Some(n.clone()), None, None),
        Some(UserSpec::Id { uid, gid }) => (None, Some(*uid), Some(gid.unwrap_or(*uid))),
    };
    let process = conn
        .exec(&ExecRequest {
            argv: spec.command.clone(),
            env: spec
                .env
                .iter()
                .map(|e| (e.key.clone(), e.value.clone()))
                .chain(
                    (spec.tty && !spec.env.iter().any(|e| e.key == "TERM"))
                        .then(|| ("TERM".to_string(), brig_core::terminal_type())),
                )
                .collect(),
            cwd: spec.workdir.clone(),
            user,
            uid,
            gid,
            pty: spec.tty.then(|| {
                let (rows, cols) = caller_size().unwrap_or((24, 80));
                PtySize { rows, cols }
            }),
            ..ExecRequest::default()
        })
        .map_err(|e| {
            let message = e.to_string();
            if message.contains("No such file") || message.contains("not found") {
                TierError::Command {
                    fault: CommandFault::NotFound,
                    message: format!("{}: command not found", spec.command[0]),
                }
            } else {
                TierError::failed(&id, "start the command", e)
            }
        })?;

    // With a terminal: the local pair `brig run` relays to (the master)
    // and this side relays to the guest (the slave, raw).
    let local = if spec.tty {
        Some(local_terminal().map_err(|e| TierError::failed(&id, "make a terminal", e))?)
    } else {
        None
    };
    let (master, slave) = match local {
        Some((m, s)) => (Some(m), Some(s)),
        None => (None, None),
    };
    let resizer = spec.tty.then(|| process.stdin());

    // The caller's stdin (or the terminal's input) to the command, or none.
    let stdin = process.stdin();
    if spec.stdin || spec.tty {
        let from = match &slave {
            Some(s) => Some(
                s.try_clone()
                    .map_err(|e| TierError::failed(&id, "share its terminal", e))?,
            ),
            None => None,
        };
        std::thread::spawn(move || {
            let mut stdin = stdin;
            // The caller's stdin as a File of its own (a duplicate:
            // closing it leaves fd 0 alone).
            let input = from.or_else(|| std::io::stdin().as_fd().try_clone_to_owned().ok());
            let Some(input) = input else { return };
            let mut input = File::from(input);
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n) = input.read(&mut buf) {
                if n == 0 || stdin.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = stdin.close();
        });
    } else {
        let _ = process.close_stdin();
    }

    // Its output to the caller's; the write end of the exit pipe closes
    // when it has ended.
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors; the result is checked.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(TierError::failed(
            &id,
            "make its exit pipe",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: pipe2 just returned both; each is owned once.
    let (exit_read, exit_write) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let code = Arc::new(Mutex::new(None));
    let said = Arc::clone(&code);
    let output = std::thread::spawn(move || {
        // A terminal's output (one stream) goes to the local slave, for
        // `brig run` to read from the master; otherwise to duplicates of
        // the caller's stdout and stderr (closing them leaves fds 1 and 2
        // alone).
        let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned().ok().map(File::from);
        let mut out = slave
            .map(File::from)
            .or_else(|| dup(std::io::stdout().as_fd()));
        let mut err = dup(std::io::stderr().as_fd());
        for item in process {
            match item {
                Ok(Output::Stdout(b)) => {
                    let _ = out.as_mut().map(|o| o.write_all(&b));
                }
                Ok(Output::Stderr(b)) => {
                    let _ = err.as_mut().map(|e| e.write_all(&b));
                }
                Ok(Output::Exited { code, signal }) => {
                    *said.lock().unwrap_or_else(|e| e.into_inner()) =
                        code.or(signal.map(|s| 128 + s));
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        drop(out);
        drop(exit_write);
    });
    Ok(Box::new(VmOneShot {
        instance,
        exit_read,
        output: Some(output),
        code,
        master,
        resizer,
        _conn: conn,
    }))
}

/// The caller's terminal size, from whichever of stdin, stdout and stderr
/// is a terminal.
fn caller_size() -> Option<(u16, u16)> {
    (0..3).find_map(|fd| {
        // SAFETY: winsize is plain old data, filled by the ioctl on a
        // standard descriptor.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        (unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0)
            .then_some((ws.ws_row, ws.ws_col))
    })
}

/// A local terminal pair, the slave raw: what is written to one side
/// comes out of the other unchanged (the guest's terminal does the echo,
/// ^C and line editing).
fn local_terminal() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let (mut master, mut slave) = (0, 0);
    // SAFETY: the out-pointers are valid ints; name, termios and size may
    // be null.
    if unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: openpty returned two new descriptors that nothing else owns.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    for fd in [&master, &slave] {
        // SAFETY: fcntl on a descriptor owned here.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: termios is plain old data, filled by tcgetattr before use.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr/cfmakeraw/tcsetattr on the slave owned here, with
    // a termios that outlives the calls.
    unsafe {
        if libc::tcgetattr(slave.as_raw_fd(), &mut t) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::cfmakeraw(&mut t);
        if libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((master, slave))
}

impl OneShot for VmOneShot {
    fn take_pty(&mut self) -> Option<OwnedFd> {
        self.master.take()
    }

    fn resize(&self, rows: u16, cols: u16) {
        if let Some(r) = &self.resizer {
            let _ = r.resize(rows, cols);
        }
    }

    fn exit_fd(&self) -> BorrowedFd<'_> {
        self.exit_read.as_fd()
    }

    fn oom_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    fn kill(&self) {
        self.instance.kill();
    }

    fn wait(mut self: Box<Self>) -> Result<Ended, TierError> {
        self.instance.kill();
        let ended = self.instance.wait()?;
        if let Some(t) = self.output.take() {
            let _ = t.join();
        }
        let code = *self.code.lock().unwrap_or_else(|e| e.into_inner());
        Ok(Ended {
            code,
            oom: ended.oom,
        })
    }
}
