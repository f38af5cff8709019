//! Every `runsc` invocation, in one small type.
//!
//! runsc is a command-line OCI runtime: each operation is a process that
//! reloads the sandbox's state from `--root` (a `meta.json` and a control
//! socket per sandbox) and talks to the running sandbox over that socket.
//! The global flags must be the same for every call on one sandbox, so
//! they live here and nowhere else.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// One runsc failure: which operation, on which sandbox, and what runsc
/// said.
#[derive(Debug, thiserror::Error)]
pub enum RunscError {
    #[error("cannot run {binary}")]
    Spawn {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("runsc {op} {id} failed ({status}): {stderr}")]
    Failed {
        op: &'static str,
        id: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("runsc state {id} printed what brig cannot read")]
    BadState {
        id: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The execution platform gVisor intercepts system calls with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    /// seccomp traps, gVisor's default since 2023: fast, needs a newer runsc.
    Systrap,
    /// ptrace(2): works everywhere runsc runs, the slowest.
    Ptrace,
    /// Hardware virtualisation through /dev/kvm: fast on bare metal, hangs
    /// on some nested hosts (this repository's CI machines), so only taken
    /// when asked for.
    Kvm,
}

impl Platform {
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Systrap => "systrap",
            Platform::Ptrace => "ptrace",
            Platform::Kvm => "kvm",
        }
    }

    pub fn parse(s: &str) -> Option<Platform> {
        match s {
            "systrap" => Some(Platform::Systrap),
            "ptrace" => Some(Platform::Ptrace),
            "kvm" => Some(Platform::Kvm),
            _ => None,
        }
    }
}

/// What `runsc state` says of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct State {
    /// `created`, `running`, `paused` or `stopped`.
    pub status: String,
    /// The host pid of the sandbox process (gVisor's kernel).
    #[serde(default)]
    pub pid: i64,
}

/// How to invoke runsc: the binary, its state directory and the flags
/// every call shares.
#[derive(Debug, Clone)]
pub struct Runsc {
    pub binary: PathBuf,
    /// `--root`: runsc's state, one `meta.json` and socket per sandbox.
    pub root: PathBuf,
    pub platform: Platform,
}

impl Runsc {
    fn command(&self) -> Command {
        self.command_logging(None)
    }

    /// With runsc's own messages to `log` instead of its stderr.
    fn command_logging(&self, log: Option<&Path>) -> Command {
        let mut cmd = Command::new(&self.binary);
        if let Some(log) = log {
            cmd.arg(format!("--log={}", log.display()));
        }
        cmd.arg(format!("--root={}", self.root.display()))
            .arg(format!("--platform={}", self.platform.as_str()))
            // The agent binds its socket in a directory shared with the
            // host, which the host dials: the one way a host process
            // reaches a server inside gVisor without a network. `create`
            // allows binding only, not connecting out to host sockets.
            .arg("--host-uds=create")
            // The root is an overlay brig mounted on the host, with a
            // bounded writable layer (see rootfs.rs): no second overlay in
            // gVisor's memory.
            .arg("--overlay2=none")
            // gVisor's kernel shows as many CPUs as the sandbox's quota
            // allows (rounded up; runsc's floor is 2), not the host's:
            // what `nproc` and thread pools count inside. Without a quota,
            // the host's.
            .arg("--cpu-num-from-quota")
            .stdin(Stdio::null());
        cmd
    }

    /// Run and collect; a non-zero exit is a [`RunscError::Failed`].
    fn run(&self, op: &'static str, id: &str, args: &[&OsStr]) -> Result<Output, RunscError> {
        let out = self
            .command()
            .args(args)
            .output()
            .map_err(|source| RunscError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        if !out.status.success() {
            return Err(RunscError::Failed {
                op,
                id: id.to_string(),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out)
    }

    /// Create and start the sandbox of `bundle` as `id`, detached: runsc
    /// returns once its init (brig-agent) runs. The sandbox is started in
    /// its own session and belongs to no brig process, so it outlives the
    /// daemon. `network`: `none` (gVisor's loopback only) or `host` (the
    /// host kernel's network stack in the namespace the bundle names). The
    /// init's stdout and stderr go to `log`; the sandbox process's pid to
    /// `pid_file` (saving a `runsc state`, a few tens of milliseconds).
    pub fn run_detached(
        &self,
        id: &str,
        bundle: &Path,
        network: &str,
        log: File,
        pid_file: &Path,
    ) -> Result<(), RunscError> {
        self.start_detached(id, bundle, network, None, log, pid_file)
    }

    /// As [`Runsc::run_detached`], from the checkpoint in `image` (`runsc
    /// restore`): the sandbox's processes go on where the checkpoint
    /// stopped them, in the root and mounts of `bundle`.
    pub fn restore_detached(
        &self,
        id: &str,
        bundle: &Path,
        image: &Path,
        log: File,
        pid_file: &Path,
    ) -> Result<(), RunscError> {
        self.start_detached(id, bundle, "none", Some(image), log, pid_file)
    }

    fn start_detached(
        &self,
        id: &str,
        bundle: &Path,
        network: &str,
        image: Option<&Path>,
        log: File,
        pid_file: &Path,
    ) -> Result<(), RunscError> {
        let err = log.try_clone().map_err(|source| RunscError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        let mut cmd = self.command();
        cmd.arg(format!("--network={network}"));
        match image {
            Some(image) => cmd
                .arg("restore")
                .arg(format!("--image-path={}", image.display())),
            None => cmd.arg("run"),
        };
        // runsc's own messages (why a create failed) go to stderr, which
        // is the log as well: read back on failure.
        let status = cmd
            .arg("--detach")
            .arg(format!("--bundle={}", bundle.display()))
            .arg(format!("--pid-file={}", pid_file.display()))
            .arg(id)
            .stdout(log)
            .stderr(err)
            .status()
            .map_err(|source| RunscError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        if !status.success() {
            return Err(RunscError::Failed {
                op: if image.is_some() { "restore" } else { "run" },
                id: id.to_string(),
                status,
                stderr: String::new(),
            });
        }
        Ok(())
    }

    /// Save the sandbox's state to `image` (`runsc checkpoint`): its
    /// kernel, processes and memory. The sandbox is stopped after
    /// (`--leave-running` in this runsc restores it in the foreground and
    /// waits for it: brig restores it detached itself).
    pub fn checkpoint(&self, id: &str, image: &Path) -> Result<(), RunscError> {
        let path = format!("--image-path={}", image.display());
        self.run(
            "checkpoint",
            id,
            &[OsStr::new("checkpoint"), OsStr::new(&path), OsStr::new(id)],
        )
        .map(drop)
    }

    /// Send `signal` to the sandbox's init (the agent).
    pub fn signal_init(&self, id: &str, signal: &str) -> Result<(), RunscError> {
        self.run(
            "kill",
            id,
            &[OsStr::new("kill"), OsStr::new(id), OsStr::new(signal)],
        )
        .map(drop)
    }

    /// Run `args` in the sandbox as root with CAP_SYS_ADMIN too (`runsc
    /// exec --cap`), to its end; its stderr is in the error.
    pub fn exec_admin(&self, id: &str, args: &[&str]) -> Result<(), RunscError> {
        let mut all: Vec<&OsStr> = vec![
            OsStr::new("exec"),
            OsStr::new("--cap=CAP_SYS_ADMIN"),
            OsStr::new(id),
        ];
        all.extend(args.iter().map(OsStr::new));
        self.run("exec", id, &all).map(drop)
    }

    /// `runsc run` of `bundle` in the foreground, as the caller spawns it
    /// (its stdio the command's; runsc's own messages to `log`): it
    /// returns the command's exit status (128+N for a signal) once the
    /// sandbox has ended.
    pub fn run_foreground(
        &self,
        id: &str,
        bundle: &Path,
        network: &str,
        pid_file: &Path,
        log: &Path,
        console_socket: Option<&Path>,
    ) -> Command {
        let mut cmd = self.command_logging(Some(log));
        cmd.stdin(Stdio::inherit())
            .arg(format!("--network={network}"))
            .arg("run");
        if let Some(socket) = console_socket {
            cmd.arg(format!("--console-socket={}", socket.display()));
        }
        cmd.arg(format!("--bundle={}", bundle.display()))
            .arg(format!("--pid-file={}", pid_file.display()))
            .arg(id);
        cmd
    }

    /// The sandbox's state, `None` if runsc does not know it.
    pub fn state(&self, id: &str) -> Result<Option<State>, RunscError> {
        match self.run("state", id, &[OsStr::new("state"), OsStr::new(id)]) {
            Ok(out) => serde_json::from_slice(&out.stdout)
                .map(Some)
                .map_err(|source| RunscError::BadState {
                    id: id.to_string(),
                    source,
                }),
            Err(RunscError::Failed { stderr, .. })
                if stderr.contains("does not exist") || stderr.contains("not found") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Stop every task in the sandbox where it is (gVisor's kernel stops
    /// scheduling them).
    pub fn pause(&self, id: &str) -> Result<(), RunscError> {
        self.run("pause", id, &[OsStr::new("pause"), OsStr::new(id)])
            .map(drop)
    }

    pub fn resume(&self, id: &str) -> Result<(), RunscError> {
        self.run("resume", id, &[OsStr::new("resume"), OsStr::new(id)])
            .map(drop)
    }

    /// The pids (gVisor's, inside the sandbox) of every process in it.
    pub fn pids(&self, id: &str) -> Result<Vec<i64>, RunscError> {
        let out = self.run(
            "ps",
            id,
            &[
                OsStr::new("ps"),
                OsStr::new("--format=json"),
                OsStr::new(id),
            ],
        )?;
        serde_json::from_slice(&out.stdout).map_err(|source| RunscError::BadState {
            id: id.to_string(),
            source,
        })
    }

    /// Send `signal` to one process (gVisor's pid) of the sandbox.
    pub fn kill_pid(&self, id: &str, pid: i64, signal: &str) -> Result<(), RunscError> {
        let pid = format!("--pid={pid}");
        self.run(
            "kill",
            id,
            &[
                OsStr::new("kill"),
                OsStr::new(&pid),
                OsStr::new(id),
                OsStr::new(signal),
            ],
        )
        .map(drop)
    }

    /// Forget the sandbox: kill what is left of it, remove its state and
    /// cgroups. Idempotent (runsc not knowing it is fine).
    pub fn delete(&self, id: &str) -> Result<(), RunscError> {
        let deleted = match self.run(
            "delete",
            id,
            &[OsStr::new("delete"), OsStr::new("--force"), OsStr::new(id)],
        ) {
            Ok(_) => Ok(()),
            Err(RunscError::Failed { stderr, .. })
                if stderr.contains("does not exist") || stderr.contains("not found") =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        };
        if deleted.is_ok() {
            self.forget_files(id);
        }
        deleted
    }

    /// What runsc may leave under its root of a sandbox it no longer knows:
    /// a create killed before it wrote the state keeps its lock file
    /// (`ID_sandbox:ID.lock`), which `delete` does not remove.
    fn forget_files(&self, id: &str) {
        let prefix = format!("{id}_sandbox:");
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// The ids runsc has state for under its root.
    pub fn list(&self) -> Vec<String> {
        self.run("list", "", &[OsStr::new("list"), OsStr::new("--quiet")])
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    }
}
