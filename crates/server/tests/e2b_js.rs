//! The official JS clients (npm `e2b` and `@e2b/code-interpreter`, from
//! tests/support/install-node-deps.sh) drive `brig serve --e2b`'s two
//! planes, served in process (support/planes.rs). Needs root (real
//! sandboxes) and the node_modules; skips otherwise, fails under
//! BRIG_TEST_STRICT=1.

mod support;

use std::path::Path;
use std::process::Command;

use support::planes::{missing, planes, test_cache};
use support::root_or_skip;

/// The official JS client (npm `e2b` 2.51.0, tests/support/install-node-deps.sh)
/// runs tests/e2b/js_sdk.mjs: create with env and metadata, commands (output,
/// exit codes, background + kill), files, getInfo, list, isRunning, kill.
#[test]
fn js_sdk_current_generation() {
    if !root_or_skip() {
        return;
    }
    // The node_modules the install script made; the script runs from there,
    // where node resolves `e2b`.
    let dir = test_cache().join("e2b-node");
    if !dir.join("node_modules/e2b/package.json").exists() {
        let why = format!(
            "{} has no e2b: run tests/support/install-node-deps.sh",
            dir.display()
        );
        missing(&why);
        return;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2b/js_sdk.mjs");
    // Each run its own copy: tests may run side by side.
    let script = dir.join(format!("js_sdk-{}.mjs", std::process::id()));
    std::fs::copy(&src, &script).unwrap();
    let p = planes();
    let out = Command::new("node")
        .arg(&script)
        .current_dir(&dir)
        .env("E2B_API_KEY", &p.f.key)
        .env("E2B_API_URL", format!("http://{}", p.api))
        .env("E2B_SANDBOX_URL", format!("http://{}", p.data))
        .env("E2B_TEMPLATE", "host")
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .output();
    let _ = std::fs::remove_file(&script);
    let out = out.expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("e2b 2.51.0 (js)"), "{stdout}");
    assert!(stdout.contains("15 passed, 0 failed"), "{stdout}");
    // It spoke the current generation's create path, and killed what it made.
    let seen = p.seen.lock().unwrap().clone();
    assert!(seen.iter().any(|l| l == "POST /v2/sandboxes"), "{seen:?}");
    assert!(p.state.sandboxes.is_empty(), "{stdout}");
}
