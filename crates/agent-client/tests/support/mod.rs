//! Shared by the integration tests: the real `brig-agent` binary, started
//! on the host with `--stdio` over a socketpair, and a watchdog so a hang
//! fails the test instead of stalling the run.
#![allow(dead_code)] // each test file uses a different part

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

use brig_agent_client::{Connection, ExecRequest};

/// The `brig-agent` binary: `target/debug/brig-agent` (honouring
/// `CARGO_TARGET_DIR`). scripts/test builds it in its build stage; if it is
/// missing, it is built here once.
pub fn agent_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(t) if Path::new(&t).is_absolute() => PathBuf::from(t),
            Some(t) => root.join(t),
            None => root.join("target"),
        };
        let bin = target.join("debug/brig-agent");
        if !bin.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let out = Command::new(cargo)
                .current_dir(&root)
                .args(["build", "-p", "brig-agent"])
                .env("CARGO_TARGET_DIR", &target)
                .output()
                .expect("spawn cargo to build brig-agent");
            assert!(
                out.status.success(),
                "cargo build -p brig-agent failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(bin.exists(), "{} missing after the build", bin.display());
        bin
    })
}

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
