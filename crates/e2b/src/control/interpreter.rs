//! The code interpreter of `code-interpreter-v1` sandboxes: brig's server
//! (`resources/code-interpreter/server.py`) written into the sandbox and
//! started on port 49999 before create answers, because the SDK sends
//! `run_code` right after (reference §1.5).
//!
//! On a tier that restores a checkpoint onto any network (vm), the server
//! and its default kernel are started once, in a sandbox given nothing of
//! anyone's, and checkpointed as a warm start (brig-runtime's `warm.rs`),
//! as E2B snapshots its code-interpreter template once it is ready: every
//! create then restores it (a Python kernel takes about a minute to start
//! in a vm guest under TCG), and brig tells the restored server the
//! sandbox's env vars ([`resume_warm`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use brig_agent_client::ExecRequest;

use crate::{E2bSandbox, CODE_INTERPRETER_PORT};
use brig_core::{Isolation, SandboxId};
use brig_runtime::{CreateConfig, ManagerError, SandboxManager, TenantId, WarmKey};

/// The server's source, shipped in the brig binary.
const SERVER_PY: &str = include_str!("../../resources/code-interpreter/server.py");
/// Where it is written in the sandbox.
pub const SERVER_PATH: &str = "/opt/brig/code-interpreter/server.py";
/// How long the server (and its first kernel) may take to listen.
const READY_WAIT: Duration = Duration::from_secs(45);
/// How long a warm-up's server and default kernel may take to be ready (a
/// vm guest under TCG: five to ten minutes for its kernels).
const WARM_UP_WAIT: Duration = Duration::from_secs(1500);
/// How long a create waits for a warm start being made before it answers
/// 503 (its client retries: see `wire::PREPARING_RETRY_SECS`).
const WARM_WAIT: Duration = Duration::from_secs(20);
/// The server of a warm start: every language's default context, and
/// spare kernels for new contexts and restarts, ready in the checkpoint (a kernel takes
/// 30 to 60 s to start in a vm guest under TCG; restored, none waits).
const WARM_ARGS: &[&str] = &[
    "--default-kernels",
    "python,bash,javascript",
    "--spare-kernels",
    "python,python,bash",
    // Started side by side on one emulated vCPU, each takes minutes.
    "--kernel-start-timeout",
    "900",
];
/// Changed when what a warm start holds changes beyond its key's other
/// parts (2: vm guests have QEMU's `max` CPU under TCG).
const WARM_REVISION: &str = "2";
/// The label of the sandbox a warm start is taken of (its value: what
/// the warm start is for); front-ends leave it out of their lists.
pub const WARM_UP_LABEL: &str = "brig.warm-up";
/// Where brig tells a restored server the sandbox's env vars (the
/// server's `RESTORED_FILE`).
const RESTORED_PATH: &str = "/opt/brig/code-interpreter/restored.json";

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
    #[error(
        "the code interpreter restored from its warm start in sandbox {id} does not accept \
         connections on port {port}: create the sandbox again (if it keeps failing, the \
         operator can remove $BRIG_HOME/warm so that the daemon makes it afresh)"
    )]
    RestoredNotListening { id: String, port: u16 },
}

/// Write the server, start it in the background as the sandbox's default
/// user with the sandbox's environment (the manager adds it to every
/// process), and wait until its port accepts connections. Blocking.
pub fn start(manager: &SandboxManager, sb: &E2bSandbox) -> Result<(), InterpreterError> {
    start_in(manager, &sb.tenant, &sb.id, &sb.default_user, &sb.home)
}

/// The warm start code-interpreter sandboxes of `template` on `isolation`
/// restore, where that tier keeps them and the template is built (else
/// the create builds it first, and the next one warms). Everything a
/// restored sandbox depends on is in the key: the template's build, the
/// tier, the limits, whether it has a network device, whether setuid
/// programs work, the server.
pub fn warm_key(
    manager: &SandboxManager,
    template: &str,
    isolation: Isolation,
    config: &CreateConfig,
) -> Option<WarmKey> {
    if !manager.warms(isolation) || !config.volumes.is_empty() {
        return None;
    }
    let home = manager.config().home.as_ref()?;
    let build = brig_template::ready(home, template)?;
    let networked = config
        .network
        .as_ref()
        .is_some_and(|p| p.mode != brig_net::Mode::None);
    let limits = format!("{:?} {:?}", config.limits, manager.config().default_cpus);
    Some(WarmKey::new(
        &format!("code interpreter of {template} on {isolation}"),
        &[
            &build.to_string_lossy(),
            &limits,
            if networked { "network" } else { "loopback" },
            // E2B's creates allow setuid (sudo), brig-mcp's do not.
            if config.allow_setuid {
                "setuid"
            } else {
                "no setuid"
            },
            SERVER_PY,
            &WARM_ARGS.join(" "),
            env!("CARGO_PKG_VERSION"),
            WARM_REVISION,
        ],
    ))
}

/// What an E2B create of the code interpreter on `isolation` asks for by
/// default, as far as its warm start depends on it (see `control::create`).
fn default_config(manager: &SandboxManager, template: &str, isolation: Isolation) -> CreateConfig {
    CreateConfig {
        template: brig_core::TemplateRef::Named(template.to_string()),
        isolation,
        limits: brig_core::Limits {
            memory: MEMORY,
            ..brig_core::Limits::default()
        },
        allow_setuid: true,
        network: manager
            .config()
            .gateway
            .is_some()
            .then(super::network::open),
        ..CreateConfig::default()
    }
}

/// `brig serve --e2b`: make the warm starts E2B's default creates of
/// `template` restore, on every tier that keeps them, in the background
/// once the template is built (the daemon prepares it from its start), so
/// that the first client does not wait on them. The tiers it warms for.
pub fn warm_ahead(manager: &std::sync::Arc<SandboxManager>, template: &str) -> Vec<Isolation> {
    let tiers: Vec<Isolation> = manager
        .tiers()
        .into_iter()
        .filter(|&t| manager.warms(t))
        .collect();
    if tiers.is_empty() || !wanted(template) {
        return Vec::new();
    }
    let Some(home) = manager.config().home.clone() else {
        return Vec::new();
    };
    let tenant = match manager.store().tenant_by_name(brig_runtime::DEFAULT_TENANT) {
        Ok(Some(t)) => t.id,
        _ => return Vec::new(),
    };
    let manager = std::sync::Arc::clone(manager);
    let template = template.to_string();
    let for_tiers = tiers.clone();
    let spawned = std::thread::Builder::new()
        .name("brig-warm-ahead".into())
        .spawn(move || {
            // Built, or given up on: its preparation is over.
            let deadline = Instant::now() + Duration::from_secs(2 * 3600);
            while brig_template::ready(&home, &template).is_none() {
                let building = manager.preparing().iter().any(|(n, _)| *n == template);
                if !building || Instant::now() >= deadline {
                    tracing::info!("{template} is not built: no warm start made ahead");
                    return;
                }
                std::thread::sleep(Duration::from_secs(2));
            }
            for isolation in for_tiers {
                let config = default_config(&manager, &template, isolation);
                if let Some(key) = warm_key(&manager, &template, isolation, &config) {
                    // Made on a thread of its own: waited for only a while.
                    if let Err(e) = prepare_warm(&manager, &tenant, &key, &config) {
                        tracing::info!("{}", brig_runtime::chain(&e));
                    }
                }
            }
        });
    match spawned {
        Ok(_) => tiers,
        Err(e) => {
            tracing::warn!("cannot start making warm starts ahead: {e}");
            Vec::new()
        }
    }
}

/// For a create of `config` that restores `key`: `Ok` once it is kept;
/// otherwise made in the background from a sandbox like `config`'s (see
/// [`warm_up`]), waited for a while, then a 503 its client retries.
pub fn prepare_warm(
    manager: &std::sync::Arc<SandboxManager>,
    tenant: &TenantId,
    key: &WarmKey,
    config: &CreateConfig,
) -> Result<(), ManagerError> {
    prepare_warm_within(manager, tenant, key, config, WARM_WAIT)
}

/// For a front-end that would rather start the server cold than wait
/// (brig-mcp's `run_code`): whether `key` is kept; if not, it is made in
/// the background for the creates after this one.
pub fn warm_kept_or_make(
    manager: &std::sync::Arc<SandboxManager>,
    tenant: &TenantId,
    key: &WarmKey,
    config: &CreateConfig,
) -> bool {
    prepare_warm_within(manager, tenant, key, config, Duration::ZERO).is_ok()
}

fn prepare_warm_within(
    manager: &std::sync::Arc<SandboxManager>,
    tenant: &TenantId,
    key: &WarmKey,
    config: &CreateConfig,
    wait: Duration,
) -> Result<(), ManagerError> {
    let maker = std::sync::Arc::clone(manager);
    let (tenant, key2) = (tenant.clone(), key.clone());
    let like = CreateConfig {
        template: config.template.clone(),
        limits: config.limits.clone(),
        isolation: config.isolation,
        allow_setuid: config.allow_setuid,
        // A network device where the sandboxes restored from it have one,
        // with nowhere to go.
        network: config.network.as_ref().map(|p| match p.mode {
            brig_net::Mode::None => brig_net::Policy::none(),
            // Allowed nothing.
            _ => brig_net::Policy {
                mode: brig_net::Mode::Allow,
                ..brig_net::Policy::default()
            },
        }),
        labels: [(WARM_UP_LABEL.to_string(), key.label().to_string())].into(),
        timeout: Some(WARM_UP_WAIT + Duration::from_secs(120)),
        wait_for_template: true,
        ..CreateConfig::default()
    };
    manager.prepare_with(
        &key.to_string(),
        wait,
        || manager.warm_kept(key),
        move || warm_up(&maker, &tenant, &key2, like),
    )
}

/// Make `key`'s warm start: a sandbox of `config`, its server started and
/// its default kernel ready, checkpointed; then the sandbox is deleted.
pub fn warm_up(
    manager: &SandboxManager,
    tenant: &TenantId,
    key: &WarmKey,
    config: CreateConfig,
) -> Result<(), String> {
    let record = manager
        .create(tenant, config)
        .map_err(|e| format!("cannot create its sandbox: {}", brig_runtime::chain(&e)))?;
    let id = record.id;
    let made = (|| {
        let (user, home) = super::default_user(manager, tenant, &id);
        launch(manager, tenant, &id, &user, &home, WARM_UP_WAIT, WARM_ARGS)?;
        let at = Where {
            manager,
            tenant,
            id: &id,
        };
        // Its default kernel: the minute a create would otherwise wait.
        let ready = format!(
            "import sys, urllib.error, urllib.request\n\
             try:\n    urllib.request.urlopen('http://127.0.0.1:{CODE_INTERPRETER_PORT}/brig/ready', timeout={})\n\
             except urllib.error.HTTPError as e:\n    sys.exit(e.read().decode())",
            WARM_UP_WAIT.as_secs()
        );
        at.run(&user, &["python3", "-c", &ready])
            .map_err(|e| InterpreterError::Start {
                id: id.to_string(),
                source: Box::new(e),
            })?;
        manager
            .keep_warm(tenant, &id, key)
            .map_err(|e| InterpreterError::Start {
                id: id.to_string(),
                source: Box::new(e),
            })
    })();
    if let Err(e) = manager.delete(tenant, &id) {
        tracing::warn!("{key}: cannot delete its sandbox {id}: {e}");
    }
    made.map_err(|e| brig_runtime::chain(&e))
}

/// A sandbox restored from a warm start: its server runs already; it is
/// told the sandbox's env vars (its kernels started before they were
/// given) and to reseed their random numbers, and checked to listen.
pub fn resume_warm(manager: &SandboxManager, sb: &E2bSandbox) -> Result<(), InterpreterError> {
    resume_warm_in(manager, &sb.tenant, &sb.id, &sb.default_user, &sb.env)
}

/// [`resume_warm`] for any front-end: sandbox `id` of `tenant`, restored
/// from a warm start, with the create's env vars `envs`; checked as `user`.
pub fn resume_warm_in(
    manager: &SandboxManager,
    tenant: &TenantId,
    id: &SandboxId,
    user: &str,
    envs: &BTreeMap<String, String>,
) -> Result<(), InterpreterError> {
    let sid = id.to_string();
    let err = |source| InterpreterError::Start {
        id: sid.clone(),
        source: Box::new(source),
    };
    let restored = serde_json::json!({ "envs": envs });
    manager
        .write_file(tenant, id, RESTORED_PATH, restored.to_string().as_bytes())
        .map_err(err)?;
    let at = Where {
        manager,
        tenant,
        id,
    };
    let listening = format!("exec 3<>/dev/tcp/127.0.0.1/{CODE_INTERPRETER_PORT}");
    at.run(user, &["bash", "-c", &listening])
        .map_err(|_| InterpreterError::RestoredNotListening {
            id: sid.clone(),
            port: CODE_INTERPRETER_PORT,
        })
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
    launch(manager, tenant, id, user, home, READY_WAIT, &[])
}

/// [`start_in`], waiting up to `wait` for the port.
fn launch(
    manager: &SandboxManager,
    tenant: &TenantId,
    id: &SandboxId,
    user: &str,
    home: &str,
    wait: Duration,
    args: &[&str],
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
            .iter()
            .chain(args)
            .map(|a| a.to_string())
            .collect(),
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
    let deadline = Instant::now() + wait;
    loop {
        if at.run(user, &["python3", "-c", &probe]).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(InterpreterError::NotReady {
                id: sid,
                port: CODE_INTERPRETER_PORT,
                secs: wait.as_secs(),
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
