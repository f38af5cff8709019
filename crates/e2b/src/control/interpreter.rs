//! The code interpreter of `code-interpreter-v1` sandboxes: brig's server
//! (`resources/code-interpreter/server.py`) written into the sandbox and
//! started on port 49999 before create answers, because the SDK sends
//! `run_code` right after (reference §1.5).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use brig_agent_client::ExecRequest;

use crate::{E2bSandbox, CODE_INTERPRETER_PORT};
use brig_core::SandboxId;
use brig_runtime::{ManagerError, SandboxManager, TenantId};

/// The server's source, shipped in the brig binary.
const SERVER_PY: &str = include_str!("../../resources/code-interpreter/server.py");
/// Where it is written in the sandbox.
pub const SERVER_PATH: &str = "/opt/brig/code-interpreter/server.py";
/// How long the server (and its first kernel) may take to listen.
const READY_WAIT: Duration = Duration::from_secs(45);

/// The memory limit of a code-interpreter sandbox. A plain sandbox's
/// 512 MiB is not enough for its kernels side by side: a Python kernel that
/// imported pandas and matplotlib (~150 MiB), bash's, the server, and
/// Deno's, which needs ~180 MiB to start (it was OOM-killed at 512 MiB).
pub const MEMORY: brig_core::ByteSize = brig_core::ByteSize::mib(1024);

/// Templates whose sandboxes run the code interpreter.
pub fn wanted(template: &str) -> bool {
    template == "code-interpreter-v1" || template.starts_with("code-interpreter-v1:")
}

/// Why the code interpreter did not come up.
#[derive(Debug, thiserror::Error)]
pub enum InterpreterError {
    #[error("cannot start the code interpreter in sandbox {id}")]
    Start {
        id: String,
        #[source]
        source: Box<ManagerError>,
    },
    #[error(
        "the code interpreter in sandbox {id} did not listen on port {port} within {secs} s \
         (does the template have python3 with jupyter_client and ipykernel?)"
    )]
    NotReady { id: String, port: u16, secs: u64 },
}

/// Write the server, start it in the background as the sandbox's default
/// user with the sandbox's environment (the manager adds it to every
/// process), and wait until its port accepts connections. Blocking.
pub fn start(manager: &SandboxManager, sb: &E2bSandbox) -> Result<(), InterpreterError> {
    start_in(manager, &sb.tenant, &sb.id, &sb.default_user, &sb.home)
}

/// [`start`] for any front-end (brig-mcp's `run_code`): the server in
/// sandbox `id` of `tenant`, run as `user` in `home`.
pub fn start_in(
    manager: &SandboxManager,
    tenant: &TenantId,
    id: &SandboxId,
    user: &str,
    home: &str,
) -> Result<(), InterpreterError> {
    let sid = id.to_string();
    let err = |source| InterpreterError::Start {
        id: sid.clone(),
        source: Box::new(source),
    };
    let at = Where {
        manager,
        tenant,
        id,
    };
    at.run("root", &["mkdir", "-p", "/opt/brig/code-interpreter"])
        .map_err(err)?;
    manager
        .write_file(tenant, id, SERVER_PATH, SERVER_PY.as_bytes())
        .map_err(err)?;
    let port = CODE_INTERPRETER_PORT.to_string();
    let req = ExecRequest {
        argv: ["python3", SERVER_PATH, "--port", &port, "--cwd", home]
            .map(String::from)
            .to_vec(),
        cwd: Some(home.to_string()),
        user: Some(user.to_string()),
        // The agent sets uid, gid and HOME for `user`; the names too, or
        // kernels (and `getpass.getuser()` in them) would say root.
        env: BTreeMap::from(
            [
                ("BRIG_CI_LOG", "WARNING"),
                ("USER", user),
                ("LOGNAME", user),
                ("HOME", home),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        ),
        background: true,
        ..ExecRequest::default()
    };
    // Dropping the handle detaches: a background process keeps running.
    drop(manager.exec(tenant, id, &req).map_err(err)?);

    let probe =
        format!("import socket; socket.create_connection(('127.0.0.1', {port}), 0.5).close()");
    let deadline = Instant::now() + READY_WAIT;
    loop {
        if at.run(user, &["python3", "-c", &probe]).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(InterpreterError::NotReady {
                id: sid,
                port: CODE_INTERPRETER_PORT,
                secs: READY_WAIT.as_secs(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A sandbox to run set-up commands in.
struct Where<'a> {
    manager: &'a SandboxManager,
    tenant: &'a TenantId,
    id: &'a SandboxId,
}

impl Where<'_> {
    /// Run a command to its end; an error unless it exits 0.
    fn run(&self, user: &str, argv: &[&str]) -> Result<(), ManagerError> {
        let req = ExecRequest {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            user: Some(user.to_string()),
            ..ExecRequest::default()
        };
        let process = self.manager.exec(self.tenant, self.id, &req)?;
        let (_, stderr, status) =
            process
                .wait_with_output()
                .map_err(|source| ManagerError::Agent {
                    id: self.id.clone(),
                    source,
                })?;
        if status.success() {
            Ok(())
        } else {
            Err(ManagerError::BadRequest {
                reason: format!(
                    "{} exited with {status:?}: {}",
                    argv.join(" "),
                    String::from_utf8_lossy(&stderr).trim()
                ),
            })
        }
    }
}
