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
//! Not here yet: a terminal (`-t`).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use brig_agent_client::{Connection, ExecRequest, Output};
use brig_core::{
    CommandFault, Ended, Instance, Isolation, Launch, NetworkAttachment, OneShot, SandboxId,
    SandboxSpec, Tier, TierError, UserSpec,
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
    _conn: Connection,
}

pub(crate) fn run(
    tier: &VmTier,
    spec: &SandboxSpec,
    network: &NetworkAttachment,
) -> Result<Box<dyn OneShot>, TierError> {
    if spec.tty {
        return Err(TierError::Unsupported {
            tier: Isolation::Vm,
            op: "give a one-shot command a terminal",
            reason: "not built yet: run it without -t".into(),
        });
    }
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
                .collect(),
            cwd: spec.workdir.clone(),
            user,
            uid,
            gid,
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

    // The caller's stdin to the command (or none).
    let stdin = process.stdin();
    if spec.stdin {
        std::thread::spawn(move || {
            let mut stdin = stdin;
            // SAFETY: fd 0 stays open for this process's life; the File is
            // forgotten, never closed.
            let mut input = std::mem::ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
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
        // SAFETY: fds 1 and 2 stay open for this process's life; the Files
        // are forgotten, never closed.
        let (mut out, mut err) = unsafe {
            (
                std::mem::ManuallyDrop::new(File::from_raw_fd(1)),
                std::mem::ManuallyDrop::new(File::from_raw_fd(2)),
            )
        };
        for item in process {
            match item {
                Ok(Output::Stdout(b)) => {
                    let _ = out.write_all(&b);
                }
                Ok(Output::Stderr(b)) => {
                    let _ = err.write_all(&b);
                }
                Ok(Output::Exited { code, signal }) => {
                    *said.lock().unwrap_or_else(|e| e.into_inner()) =
                        code.or(signal.map(|s| 128 + s));
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        drop(exit_write);
    });
    Ok(Box::new(VmOneShot {
        instance,
        exit_read,
        output: Some(output),
        code,
        _conn: conn,
    }))
}

impl OneShot for VmOneShot {
    fn take_pty(&mut self) -> Option<OwnedFd> {
        None
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
