//! Shared by the E2B tests: both E2B routers (brig-e2b) served in process on
//! loopback sockets over a test manager ([`Planes`]), a sandbox made and
//! driven through the manager itself ([`create`], [`sh`]), and where the
//! official clients live: the venvs and node_modules that
//! tests/support/install-*-deps.sh make ([`venv`], [`test_cache`]), and the
//! home where scripts/test builds the named templates ([`template_home`]).

#![allow(dead_code, unused_imports)] // each test binary uses a different part of it

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use brig_agent_client::ExecRequest;
use brig_core::{Isolation, SandboxId};
use brig_e2b::{control_router, data_router, E2bState};
use brig_runtime::{CreateConfig, ManagerConfig, SandboxState};
use brig_test_support::{manager_fixture, serve, ManagerFixture};

pub use brig_test_support::{root_or_skip, skip, template_home, test_cache};

/// The manager's fixture and both E2B planes on loopback sockets.
pub struct Planes {
    pub f: ManagerFixture,
    pub state: E2bState,
    /// `METHOD /path` of every control-plane request, in order.
    pub seen: Arc<Mutex<Vec<String>>>,
    pub api: SocketAddr,
    pub data: SocketAddr,
    // Dropped last: the servers' tasks run on it.
    _rt: tokio::runtime::Runtime,
}

impl Planes {
    /// `python SCRIPT` (from tests/e2b) pointed at these planes with the
    /// official client's environment (E2B_API_KEY, E2B_API_URL,
    /// E2B_SANDBOX_URL, E2B_TEMPLATE when given); its output.
    pub fn run_sdk_script(
        &self,
        python: &std::path::Path,
        script: &str,
        template: Option<&str>,
    ) -> std::process::Output {
        self.run_sdk_script_with(python, script, template, &[])
    }

    /// [`Planes::run_sdk_script`] with more environment variables.
    pub fn run_sdk_script_with(
        &self,
        python: &std::path::Path,
        script: &str,
        template: Option<&str>,
        envs: &[(&str, &str)],
    ) -> std::process::Output {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/e2b")
            .join(script);
        let mut cmd = std::process::Command::new(python);
        cmd.arg(&path)
            .env("E2B_API_KEY", &self.f.key)
            .env("E2B_API_URL", format!("http://{}", self.api))
            // Volume content requests go here, not to E2B_API_URL.
            .env("E2B_VOLUME_API_URL", format!("http://{}", self.api))
            .env("E2B_SANDBOX_URL", format!("http://{}", self.data))
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN");
        if let Some(t) = template {
            cmd.env("E2B_TEMPLATE", t);
        }
        cmd.envs(envs.iter().copied());
        cmd.output().unwrap()
    }
}

pub fn planes() -> Planes {
    planes_with(|_| {})
}

pub fn planes_with(tweak: impl FnOnce(&mut ManagerConfig)) -> Planes {
    planes_of(manager_fixture(tweak))
}

/// [`planes_with`] on a manager that offers the gvisor tier too (E2B
/// clients pick it with the metadata key `brig.isolation`); `None` (a
/// printed skip) where runsc is missing.
pub fn gvisor_planes_with(tweak: impl FnOnce(&mut ManagerConfig)) -> Option<Planes> {
    brig_test_support::gvisor_manager_fixture(tweak).map(planes_of)
}

/// [`planes_with`] on a manager that offers the vm tier too; `None` (a
/// printed skip) where QEMU is missing.
pub fn vm_planes_with(tweak: impl FnOnce(&mut ManagerConfig)) -> Option<Planes> {
    brig_test_support::vm_manager_fixture(tweak).map(planes_of)
}

fn planes_of(f: ManagerFixture) -> Planes {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let state = E2bState::new(Arc::clone(&f.manager));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = {
        let seen = Arc::clone(&seen);
        axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let seen = Arc::clone(&seen);
                async move {
                    let line = format!("{} {}", req.method(), req.uri().path());
                    seen.lock().unwrap().push(line);
                    next.run(req).await
                }
            },
        )
    };
    let (api, data) = rt.block_on(async {
        (
            serve(control_router(state.clone()).layer(record)).await,
            serve(data_router(state.clone())).await,
        )
    });
    Planes {
        f,
        state,
        seen,
        api,
        data,
        _rt: rt,
    }
}

/// A test venv's Python.
pub fn venv(name: &str) -> PathBuf {
    test_cache().join(name).join("bin/python")
}

/// The venv's python, or a printed skip (a failure under
/// BRIG_TEST_STRICT=1) and `None` when scripts/test has not made it.
pub fn venv_or_skip(name: &str) -> Option<PathBuf> {
    let python = venv(name);
    if !python.exists() {
        skip(&format!(
            "{} is missing: run tests/support/install-python-deps.sh",
            python.display()
        ));
        return None;
    }
    Some(python)
}

/// A new sandbox of the fixture's first tenant, with the defaults (the
/// `host` template); its id.
pub async fn create(f: &ManagerFixture) -> String {
    create_on(f, Isolation::Process).await
}

/// [`create`] on the tier `isolation` (the fixture must offer it).
pub async fn create_on(f: &ManagerFixture, isolation: Isolation) -> String {
    let manager = Arc::clone(&f.manager);
    let tenant = manager.authenticate(&f.key).unwrap().tenant;
    let mut config = CreateConfig {
        isolation,
        ..CreateConfig::default()
    };
    // A guest boots a root file system of its own: the test rootfs.
    if isolation == Isolation::Vm {
        let rootfs = brig_test_support::rootfs().expect("BRIG_TEST_ROOTFS for a vm sandbox");
        config.template = brig_core::TemplateRef::Dir(rootfs);
    }
    let record = tokio::task::spawn_blocking(move || manager.create(&tenant, config))
        .await
        .unwrap()
        .expect("create a sandbox");
    assert_eq!(record.state, SandboxState::Running, "{record:?}");
    record.id.to_string()
}

/// End sandbox `id` of the fixture's first tenant and wait for its
/// teardown.
pub async fn delete(f: &ManagerFixture, id: &str) {
    let manager = Arc::clone(&f.manager);
    let tenant = manager.authenticate(&f.key).unwrap().tenant;
    let id = SandboxId::parse(id).unwrap();
    tokio::task::spawn_blocking(move || manager.delete(&tenant, &id))
        .await
        .unwrap()
        .expect("delete the sandbox");
}

/// Run a shell script in the sandbox as root to its end; its stdout. It
/// must exit 0.
pub async fn sh(f: &ManagerFixture, id: &str, script: &str) -> String {
    let manager = Arc::clone(&f.manager);
    let tenant = manager.authenticate(&f.key).unwrap().tenant;
    let id = SandboxId::parse(id).unwrap();
    let req = ExecRequest {
        argv: ["sh", "-c", script].map(String::from).to_vec(),
        ..ExecRequest::default()
    };
    let script = script.to_string();
    tokio::task::spawn_blocking(move || {
        let process = manager.exec(&tenant, &id, &req).expect("start sh");
        let (stdout, stderr, status) = process.wait_with_output().expect("wait for sh");
        assert_eq!(
            status.code,
            Some(0),
            "{script}: {}",
            String::from_utf8_lossy(&stderr)
        );
        String::from_utf8(stdout).unwrap()
    })
    .await
    .unwrap()
}

/// The home template builds through E2B run on: an image store of their
/// own (the builds' images, layers and cache, kept between runs so that
/// `base` is turned into an image once), with the named templates of the
/// shared [`template_home`] (`templates` links to them). Apart from the
/// shared home's image store, which other suites (and other brig versions
/// sharing the cache) write.
pub fn build_home() -> PathBuf {
    let home = test_cache().join("e2b-build-home");
    std::fs::create_dir_all(&home).expect("create the build home");
    let link = home.join("templates");
    if link.symlink_metadata().is_err() {
        // Another test may have made it meanwhile: that one is as good.
        let _ = std::os::unix::fs::symlink(template_home().join("templates"), &link);
    }
    home
}
