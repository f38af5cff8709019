//! brig-agent: the program that does the work inside every sandbox.
//!
//! It speaks the brig protocol (crate `brig-protocol`) over one byte
//! stream: fd 3 by default (a unix socketpair in the process tier,
//! or a listening socket: `--listen`, `--listen-at`, and `--vm-init`, the
//! vm tier's guest init, whose socket a relay joins to virtio-serial,
//! `vm.rs`), or stdin/stdout with `--stdio`. Start reading at
//! [`session::Session`], the single-threaded poll(2) loop that owns the
//! stream table; `process.rs` starts children and bounds their output;
//! `files.rs` implements file operations (and extended attributes);
//! `users.rs` reads the sandbox's /etc/passwd and /etc/group; `watch.rs`
//! directory watches (inotify); `sys.rs` holds every raw syscall.
//!
//! Exit status: 0 when the host closed the connection, 2 when the host
//! broke the protocol (after reporting it on a NOTICE stream), 1 on an I/O
//! error or bad arguments.

mod files;
mod forward;
mod logs;
mod process;
mod session;
mod sys;
mod users;
mod vm;
mod watch;

use std::fs::File;
use std::os::unix::net::UnixListener;
use std::process::ExitCode;

use session::{End, Session};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = match args.as_slice() {
        [] => Mode::Fd3,
        [flag] if flag == "--stdio" => Mode::Stdio,
        [flag] if flag == "--listen" => Mode::Listen,
        [flag, path] if flag == "--listen-at" => Mode::ListenAt(path.into()),
        // The vm tier's guest: this program is the initramfs's /init.
        [flag] if flag == "--vm-init" => match vm::run() {
            Ok(()) => vm::fail("the bring-up returned"),
            Err(message) => vm::fail(&message),
        },
        [flag, name] if flag == "--identity" => return refresh_identity(name),
        [flag] if flag == "--version" => {
            println!("brig-agent {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!(
                "usage: brig-agent [--stdio | --listen | --listen-at PATH | --vm-init]  (default: \
                 the connection is fd 3; --listen: fd 0 is a listening socket; --listen-at: \
                 bind a unix socket at PATH; --vm-init: a vm-tier guest's init; --identity \
                 HOSTNAME: a restored gvisor sandbox's new host name and machine id)"
            );
            return ExitCode::from(1);
        }
    };
    // As a sandbox's pid 1 on a host connection (stdio, fd 3), die with the
    // host even if the exec of this program dropped the init's setting; EOF
    // on the connection is the second way the host's death ends the
    // sandbox. A listening agent outlives its hosts: a daemon restarting
    // reconnects to it.
    // SAFETY: getpid takes no arguments.
    if !mode.listens() && unsafe { libc::getpid() } == 1 {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    }
    // As pid 1, nothing in the sandbox may trace this process, read its
    // memory or take its descriptors (the host's connection, the writable
    // layer's mount): not even the sandbox's root after `sudo`, which has
    // the same uid but no CAP_SYS_PTRACE. exec made us dumpable again,
    // whatever the init before us had set.
    // SAFETY: getpid takes no arguments.
    if unsafe { libc::getpid() } == 1 {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    }
    let session = match mode {
        Mode::Listen => listen(),
        Mode::ListenAt(ref path) => listen_at(path),
        Mode::Stdio | Mode::Fd3 => connected(mode == Mode::Stdio),
    };
    let mut session = match session {
        Ok(s) => s,
        Err(message) => {
            eprintln!("brig-agent: {message}");
            return ExitCode::from(1);
        }
    };
    let end = session.run();
    session.kill_all();
    match end {
        End::Eof => ExitCode::SUCCESS,
        End::Protocol(message) => {
            eprintln!("brig-agent: protocol error: {message}");
            ExitCode::from(2)
        }
        End::Io(e) => {
            eprintln!("brig-agent: connection failed: {e}");
            ExitCode::from(1)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// The connection is fd 3.
    Fd3,
    /// The connection is stdin and stdout.
    Stdio,
    /// fd 0 is a listening unix socket; hosts connect to it.
    Listen,
    /// Bind a unix socket at this path and serve hosts connecting to it:
    /// the gvisor tier, whose sandboxes cannot be handed a listening
    /// socket (runsc imports donated descriptors as connected files), but
    /// whose agent can bind one in a directory the host shares with it
    /// (`runsc --host-uds=create`), which the host then dials.
    ListenAt(std::path::PathBuf),
}

impl Mode {
    /// A listening agent outlives its hosts.
    fn listens(&self) -> bool {
        matches!(self, Mode::Listen | Mode::ListenAt(_))
    }
}

/// A session on the one connection the launcher handed over.
fn connected(stdio: bool) -> Result<Session, String> {
    let fds = if stdio {
        sys::adopt_fd(0).and_then(|i| Ok((i, sys::adopt_fd(1)?)))
    } else {
        sys::adopt_fd(3).and_then(|i| Ok((i.try_clone()?, i)))
    };
    let (input, output) = fds.map_err(|e| {
        let fd = if stdio { "stdin/stdout" } else { "fd 3" };
        format!("no connection on {fd}: {e}")
    })?;
    Session::new(File::from(input), File::from(output))
        .map_err(|e| format!("cannot set up the event loop: {e}"))
}

/// A session that serves hosts connecting to a socket it binds at `path`
/// (a stale one an earlier agent left is replaced). Only the sandbox's
/// root may connect: the socket is made 0600.
fn listen_at(path: &std::path::Path) -> Result<Session, String> {
    let listener = session::bind_private(path)
        .map_err(|e| format!("cannot bind a socket at {}: {e}", path.display()))?;
    // stdout and stderr stay the launcher's (the sandbox's log: the agent
    // writes there only why it ends); whatever else it left open stays out
    // of the agent's children.
    sys::cloexec_above_stderr().map_err(|e| format!("cannot set up descriptors: {e}"))?;
    Session::listen_at(listener, path.to_path_buf())
        .map_err(|e| format!("cannot set up the event loop: {e}"))
}

/// `--identity HOSTNAME`: what the gvisor tier runs (`runsc exec`, with
/// CAP_SYS_ADMIN for this process only) in a sandbox restored from a
/// checkpoint, which comes back with its parent's identity: its own host
/// name, and a new `/etc/machine-id` (random, from the kernel: gVisor's
/// entropy comes from the host, fresh in every restored sandbox).
fn refresh_identity(hostname: &str) -> ExitCode {
    if let Err(e) = sys::set_hostname(hostname) {
        eprintln!("brig-agent: cannot set the host name {hostname:?}: {e}");
        return ExitCode::from(1);
    }
    match write_machine_id() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("brig-agent: cannot write /etc/machine-id: {e}");
            ExitCode::from(1)
        }
    }
}

/// A new `/etc/machine-id`: 16 random bytes from the kernel, in hex. A
/// root whose /etc is not the sandbox's own (the `host` template's, bound
/// read-only) keeps the machine id it shows.
pub(crate) fn write_machine_id() -> std::io::Result<()> {
    let mut id = [0u8; 16];
    // SAFETY: a buffer of 16 bytes, written by the kernel.
    let n = unsafe { libc::getrandom(id.as_mut_ptr().cast(), id.len(), 0) };
    if n != id.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    match std::fs::write("/etc/machine-id", format!("{hex}\n")) {
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::ReadOnlyFilesystem
                    | std::io::ErrorKind::NotFound
            ) =>
        {
            Ok(())
        }
        r => r,
    }
}

/// A session that serves hosts connecting to the socket on fd 0.
fn listen() -> Result<Session, String> {
    let listener = sys::adopt_fd(0).map_err(|e| format!("no listening socket on fd 0: {e}"))?;
    // fd 1 is the same socket (the launcher's stdio); nothing should be
    // written to it. Whatever else the launcher left open (a sandbox's
    // own locks) stays open in the agent but not in its children.
    sys::detach_inherited().map_err(|e| format!("cannot set up descriptors: {e}"))?;
    Session::listen(UnixListener::from(listener))
        .map_err(|e| format!("cannot set up the event loop: {e}"))
}
