//! Both E2B routers (`brig_server::e2b`) served in process on loopback
//! sockets over a test manager, and where the official clients live: the
//! venvs and node_modules that tests/support/install-*-deps.sh make, and
//! the home where scripts/test builds the named templates. Used by
//! tests/e2b_control.rs and the SDK suites.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use brig_server::e2b::{self, E2bState};
use brig_server::http::AppState;

use super::{fixture, Fixture};

/// A missing client or template: a skip with the reason, or a failure
/// under BRIG_TEST_STRICT=1.
pub fn missing(why: &str) {
    if std::env::var("BRIG_TEST_STRICT").is_ok_and(|v| v == "1") {
        panic!("BRIG_TEST_STRICT=1 and {why}");
    }
    eprintln!("skipping: {why}");
}

/// The manager's fixture and both E2B planes on loopback sockets.
pub struct Planes {
    pub f: Fixture,
    pub state: E2bState,
    /// `METHOD /path` of every control-plane request, in order.
    pub seen: Arc<Mutex<Vec<String>>>,
    pub api: SocketAddr,
    pub data: SocketAddr,
    // Dropped last: the servers' tasks run on it.
    _rt: tokio::runtime::Runtime,
}

pub fn planes() -> Planes {
    planes_with(|_| {})
}

pub fn planes_with(tweak: impl FnOnce(&mut brig_server::ManagerConfig)) -> Planes {
    let f = fixture(tweak);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let state = E2bState::new(AppState::new(Arc::clone(&f.manager)));
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
        let serve = |router: axum::Router| async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(l, router).await.unwrap() });
            addr
        };
        (
            serve(e2b::control_router(state.clone()).layer(record)).await,
            serve(e2b::data_router(state.clone())).await,
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

/// The tests' cache: venvs (tests/support/install-python-deps.sh) and
/// node_modules (install-node-deps.sh).
pub fn test_cache() -> PathBuf {
    std::env::var_os("BRIG_TEST_CACHE").map_or_else(
        || PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/brig-test"),
        PathBuf::from,
    )
}

/// A test venv's Python.
pub fn venv(name: &str) -> PathBuf {
    test_cache().join(name).join("bin/python")
}

/// Where scripts/test builds the named templates (as crates/cli/tests/template.rs).
pub fn template_home() -> PathBuf {
    match std::env::var_os("BRIG_TEST_TEMPLATE_HOME") {
        Some(h) => h.into(),
        None => match std::env::var_os("BRIG_TEST_CACHE") {
            Some(c) => PathBuf::from(c).join("home"),
            None => PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache/brig-test/home"),
        },
    }
}
