//! brig-agent: the program that does the work inside every sandbox.
//!
//! It speaks the brig protocol (crate `brig-protocol`) over one byte
//! stream: fd 3 by default (a unix socketpair in the process tier,
//! virtio-serial later), or stdin/stdout with `--stdio`. Start reading at
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
mod process;
mod session;
mod sys;
mod users;
mod watch;

use std::fs::File;
use std::process::ExitCode;

use session::{End, Session};

fn main() -> ExitCode {
    // As a sandbox's pid 1 (`brig serve` runs it so), die with the host
    // even if the exec of this program dropped the init's setting; EOF on
    // the connection is the second way the host's death ends the sandbox.
    // SAFETY: getpid takes no arguments.
    if unsafe { libc::getpid() } == 1 {
        // SAFETY: prctl with integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stdio = match args.as_slice() {
        [] => false,
        [flag] if flag == "--stdio" => true,
        [flag] if flag == "--version" => {
            println!("brig-agent {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("usage: brig-agent [--stdio]  (default: the connection is fd 3)");
            return ExitCode::from(1);
        }
    };
    let fds = if stdio {
        sys::adopt_fd(0).and_then(|i| Ok((i, sys::adopt_fd(1)?)))
    } else {
        sys::adopt_fd(3).and_then(|i| Ok((i.try_clone()?, i)))
    };
    let (input, output) = match fds {
        Ok((i, o)) => (File::from(i), File::from(o)),
        Err(e) => {
            let fd = if stdio { "stdin/stdout" } else { "fd 3" };
            eprintln!("brig-agent: no connection on {fd}: {e}");
            return ExitCode::from(1);
        }
    };
    let mut session = match Session::new(input, output) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("brig-agent: cannot set up the event loop: {e}");
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
