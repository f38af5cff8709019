//! brig-test-support: the helpers every crate's tests share, in one place.
//! A dev-dependency only; never published.
//!
//! - **Skipping loudly.** A test that cannot run here calls [`skip`]: it
//!   prints why and returns, or, under `BRIG_TEST_STRICT=1` ([`strict`];
//!   scripts/test sets it), fails, since on a machine set up for the tests
//!   a skip means the set-up is broken. [`root_or_skip`] is the usual
//!   first line of a test that starts sandboxes.
//! - **What the test script prepared.** [`rootfs`] (the Debian rootfs of
//!   `BRIG_TEST_ROOTFS`), [`test_cache`] (venvs, node_modules) and
//!   [`template_home`] (the named templates), and [`agent_bin`], the
//!   `brig-agent` binary cargo built.
//! - With the `http` feature, [`serve`]: a router on a `127.0.0.1:0`
//!   socket, as `brig serve` would serve it.
//! - With the `runtime` feature, [`ManagerFixture`]: a sandbox manager on a
//!   fresh home, with API keys of two tenants.
//! - With the `jail` feature, [`agent_in_sandbox`]: `brig-agent --stdio` as
//!   the command of a real sandbox, and the host's end of its socket.
//! - With the `fake-tier` feature, [`fake_tier::FakeTier`]: an isolation
//!   tier without isolation (the real agent as a plain host process), so
//!   the runtime's logic is tested without root.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Whether `BRIG_TEST_STRICT=1`: a test that cannot run fails instead of
/// skipping.
pub fn strict() -> bool {
    std::env::var("BRIG_TEST_STRICT").is_ok_and(|v| v == "1")
}

/// Skip the calling test with `reason` on stderr (the caller returns), or,
/// under [`strict`], fail it.
pub fn skip(reason: &str) {
    if strict() {
        panic!("BRIG_TEST_STRICT=1 and this test cannot run: {reason}");
    }
    eprintln!("skipping: {reason}");
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// True when running as root; otherwise [`skip`]s (sandboxes need root).
pub fn root_or_skip() -> bool {
    let root = is_root();
    if !root {
        skip("this test needs root (it starts sandboxes)");
    }
    root
}

/// The Debian rootfs the test script builds (`BRIG_TEST_ROOTFS`), if it is
/// set and looks like one. Does not skip: see [`rootfs_or_skip`].
pub fn rootfs() -> Option<PathBuf> {
    std::env::var_os("BRIG_TEST_ROOTFS")
        .map(PathBuf::from)
        .filter(|p| p.join("bin/sh").exists())
}

/// [`rootfs`], or a [`skip`] saying it is missing.
pub fn rootfs_or_skip() -> Option<PathBuf> {
    let found = rootfs();
    if found.is_none() {
        skip("BRIG_TEST_ROOTFS is not set (tests/support/build-rootfs.sh builds it; scripts/test sets it)");
    }
    found
}

/// The tests' cache, shared by every run on this machine:
/// `$BRIG_TEST_CACHE`, else `~/.cache/brig-test` (the rootfs, the venvs of
/// tests/support/install-python-deps.sh, the node_modules of
/// install-node-deps.sh).
pub fn test_cache() -> PathBuf {
    std::env::var_os("BRIG_TEST_CACHE").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/brig-test"),
        PathBuf::from,
    )
}

/// Where scripts/test builds the named templates (`base`,
/// `code-interpreter-v1`): `$BRIG_TEST_TEMPLATE_HOME`, else
/// `home` in the [`test_cache`].
/// What is left on the host of volumes under `dir`: mounts whose path
/// mentions it, and loop devices backed by a file under it (`losetup -a`).
pub fn volume_leftovers(dir: &std::path::Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let loops = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    mounts
        .lines()
        .chain(loops.lines())
        .filter(|l| l.contains(&needle))
        .map(str::to_string)
        .collect()
}

/// What is left in a daemon's volumes directory `dir` but its (empty)
/// mount-point directory: images, marks, anything a removed volume left.
pub fn volume_files_left(dir: &std::path::Path) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name())
                .filter(|n| n != "mnt")
                .collect()
        })
        .unwrap_or_default()
}

pub fn template_home() -> PathBuf {
    match std::env::var_os("BRIG_TEST_TEMPLATE_HOME") {
        Some(h) => h.into(),
        None => test_cache().join("home"),
    }
}

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

/// A static `brig-agent` (`<target>/agent-static/…/debug/brig-agent`), as
/// a vm guest's init needs: built by every caller's first call (cargo is
/// quick when nothing changed; a stale agent would be tested otherwise).
pub fn static_agent_bin() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) if Path::new(&t).is_absolute() => PathBuf::from(t),
        Some(t) => root.join(t),
        None => root.join("target"),
    }
    .join("agent-static");
    let triple = "x86_64-unknown-linux-gnu";
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "-p",
            "brig-agent",
            "--target",
            triple,
            "--target-dir",
        ])
        .arg(&target)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("spawn cargo to build the static brig-agent");
    assert!(
        out.status.success(),
        "building the static brig-agent failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    target.join(triple).join("debug/brig-agent")
}

/// Serve `router` on a fresh `127.0.0.1:0` socket from a task of the
/// current runtime, as `brig serve` does; its address.
#[cfg(feature = "http")]
pub async fn serve(router: axum::Router) -> std::net::SocketAddr {
    // The daemon's own listener (its backlog matters to tests that open
    // thousands of connections at once).
    let listener = brig_http::listen(([127, 0, 0, 1], 0).into()).unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// Start `agent` (a `brig-agent` binary, passed to the sandbox as an open
/// file: it need not be in the template) as `brig-agent --stdio` in a new
/// sandbox on `template`; `as_init`: as the sandbox's pid 1, as `brig
/// serve` runs it. Returns the sandbox and the host's end of the agent's
/// socket, for the caller's client to handshake on.
#[cfg(feature = "jail")]
pub fn agent_in_sandbox(
    agent: &Path,
    template: brig_core::TemplateRef,
    as_init: bool,
) -> (brig_jail::Sandbox, std::os::unix::net::UnixStream) {
    use std::os::fd::OwnedFd;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    let program = std::fs::File::open(agent).expect("open the agent binary");
    let mut spec = brig_core::SandboxSpec::new(vec!["brig-agent".into(), "--stdio".into()]);
    spec.template = template;
    let extras = brig_jail::Extras {
        program: Some(OwnedFd::from(program)),
        stdio: Some(OwnedFd::from(theirs)),
        as_init,
        ..Default::default()
    };
    let opts = brig_jail::SpawnOptions::prepare().expect("prepare");
    let sandbox =
        brig_jail::Sandbox::spawn_with(&spec, &opts, extras).expect("spawn the agent in a sandbox");
    (sandbox, ours)
}

#[cfg(feature = "gvisor")]
pub use fixture::gvisor_manager_fixture;
#[cfg(feature = "runtime")]
pub use fixture::{manager_fixture, ManagerFixture};
#[cfg(feature = "vm")]
pub use fixture::{vm_manager_fixture, vm_under_kvm};

/// A loopback port for a child process (a registry, a published port) to
/// listen on: free now, and below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, from 32768 by default), where no
/// test's `bind(":0")` is handed ports. A `:0` port bound and let go is
/// not safe to give a child: it is the next ephemeral port, and another
/// test's listener can get it before the child binds (a hostile test's
/// canary listener once did, and the registry test pushed to it).
pub fn child_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let from = low.saturating_sub(12000).max(1024);
    for _ in 0..1000 {
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let port = from + (r % u64::from(low - from)) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {from}..{low}");
}

#[cfg(feature = "fake-tier")]
pub mod fake_tier;
#[cfg(feature = "networld")]
pub mod networld;
#[cfg(feature = "registry")]
pub mod registry;

#[cfg(feature = "runtime")]
mod fixture {
    use std::sync::Arc;

    use brig_runtime::{ManagerConfig, SandboxManager, Store};

    /// A sandbox manager on a fresh home (the real agent, [`super::agent_bin`]),
    /// and the keys of two tenants. The manager starts real sandboxes, so
    /// tests that use it need root ([`super::root_or_skip`]). Shut down
    /// when dropped.
    #[derive(Debug)]
    pub struct ManagerFixture {
        pub home: tempfile::TempDir,
        pub manager: Arc<SandboxManager>,
        /// The first tenant's key (the one `brig serve` prints at its
        /// first start).
        pub key: String,
        /// A key of another tenant, `other`.
        pub other_key: String,
    }

    impl Drop for ManagerFixture {
        fn drop(&mut self) {
            self.manager.shutdown();
        }
    }

    /// A [`ManagerFixture`] whose manager is configured by `tweak` first.
    pub fn manager_fixture(tweak: impl FnOnce(&mut ManagerConfig)) -> ManagerFixture {
        fixture_with(tweak, |_, _| Vec::new())
    }

    /// A [`ManagerFixture`] that offers the gvisor tier too, as `brig
    /// serve` does where runsc is installed; `None` (a printed skip) where
    /// it is not.
    #[cfg(feature = "gvisor")]
    pub fn gvisor_manager_fixture(
        tweak: impl FnOnce(&mut ManagerConfig),
    ) -> Option<ManagerFixture> {
        let Some(runsc) = brig_gvisor::find_runsc() else {
            super::skip("runsc is not installed (apt-get install runsc): no gvisor tier to test");
            return None;
        };
        Some(fixture_with(tweak, |home, owner| {
            let tier = brig_gvisor::GvisorTier::new(brig_gvisor::GvisorConfig {
                runsc,
                run_dir: std::path::PathBuf::from("/run/brig"),
                state_dir: home.to_path_buf(),
                agent: super::agent_bin().to_path_buf(),
                owner: owner.to_string(),
                platform: None,
            })
            .expect("prepare the gvisor tier");
            vec![Arc::new(tier) as Arc<dyn brig_core::Tier>]
        }))
    }

    /// Whether this host's vm guests run under KVM (not QEMU's emulator).
    #[cfg(feature = "vm")]
    pub fn vm_under_kvm() -> bool {
        brig_vm::find_qemu()
            .and_then(|q| brig_vm::accelerator(&q))
            .is_some_and(|a| a == brig_vm::Accelerator::Kvm)
    }

    /// A [`ManagerFixture`] that offers the vm tier too, as `brig serve`
    /// does where QEMU is installed (guest kernel and images cached in
    /// [`super::test_cache`]`/vm`, shared by every test); `None` (a
    /// printed skip) where it is not.
    #[cfg(feature = "vm")]
    pub fn vm_manager_fixture(tweak: impl FnOnce(&mut ManagerConfig)) -> Option<ManagerFixture> {
        let Some(qemu) = brig_vm::find_qemu() else {
            super::skip("qemu-system-x86_64 is not installed (apt-get install qemu-system-x86): no vm tier to test");
            return None;
        };
        let agent = super::static_agent_bin();
        Some(fixture_with(tweak, |_, owner| {
            let tier = brig_vm::VmTier::new(brig_vm::VmConfig {
                qemu,
                run_dir: std::path::PathBuf::from("/run/brig"),
                home: super::test_cache().join("vm"),
                agent,
                owner: owner.to_string(),
            })
            .expect("prepare the vm tier");
            vec![Arc::new(tier) as Arc<dyn brig_core::Tier>]
        }))
    }

    /// A fixture on the process tier and the tiers `more` makes (given the
    /// home and the daemon's owner name).
    fn fixture_with(
        tweak: impl FnOnce(&mut ManagerConfig),
        more: impl FnOnce(&std::path::Path, &str) -> Vec<Arc<dyn brig_core::Tier>>,
    ) -> ManagerFixture {
        let home = tempfile::tempdir().unwrap();
        let store = Store::open_in(home.path()).unwrap();
        let key = store.ensure_initial_key().unwrap().unwrap();
        let other = store.create_tenant("other").unwrap();
        let (_, other_key) = store.create_key(&other).unwrap();
        let mut config = ManagerConfig::new();
        // In-process tests never pull an image (a template name no recipe
        // has would otherwise send the manager to Docker Hub).
        config.pull_images = false;
        tweak(&mut config);
        // On the process tier, as `brig serve` runs it.
        let owner = store.path().display().to_string();
        let tier = brig_jail::ProcessTier::new(super::agent_bin().to_path_buf(), &owner)
            .expect("prepare the process tier");
        let mut tiers: Vec<Arc<dyn brig_core::Tier>> = vec![Arc::new(tier)];
        tiers.extend(more(home.path(), &owner));
        let manager = SandboxManager::start(store, config, tiers).unwrap();
        ManagerFixture {
            home,
            manager,
            key,
            other_key,
        }
    }
}
