//! Shared by the integration tests: the real `brig-agent` binary
//! (brig-test-support's `agent_bin`), started on the host with `--stdio`
//! over a socketpair, and a watchdog so a hang
//! fails the test instead of stalling the run.
#![allow(dead_code)] // each test file uses a different part

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use brig_agent_client::{Connection, ExecRequest};

pub use brig_test_support::agent_bin;

/// An agent on the host and a connection to it.
#[derive(Debug)]
pub struct Agent {
    pub conn: Connection,
    pub child: Child,
}

impl Agent {
    pub fn start() -> Agent {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let theirs = OwnedFd::from(theirs);
        let child = Command::new(agent_bin())
            .arg("--stdio")
            .stdin(Stdio::from(theirs.try_clone().unwrap()))
            .stdout(Stdio::from(theirs))
            .spawn()
            .expect("start brig-agent");
        let conn = Connection::new(ours).expect("handshake with brig-agent");
        Agent { conn, child }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run `f` on its own thread and fail if it takes longer than `secs`.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => {
            let _ = worker.join();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => match worker.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => unreachable!("the worker sends before it returns"),
        },
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("hung: not done within {secs}s"),
    }
}

pub fn exec(argv: &[&str]) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `len` bytes covering every byte value, in a pattern that shifts so a
/// misplaced chunk shows up.
pub fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}
