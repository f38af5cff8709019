//! The official JS clients (npm `e2b` and `@e2b/code-interpreter`, from
//! tests/support/install-node-deps.sh) drive `brig serve --e2b`'s two
//! planes, served in process (support/planes.rs), on the named templates of
//! the shared test home (`base`, `code-interpreter-v1`). Needs root (real
//! sandboxes), the node_modules and the templates; skips otherwise, fails
//! under BRIG_TEST_STRICT=1.

mod support;

use std::path::Path;
use std::process::{Command, Output};

use brig_runtime::ListFilter;
use support::root_or_skip;
use support::{planes_with, skip, template_home, test_cache, Planes};

/// The pinned clients (tests/support/install-node-deps.sh).
const E2B_JS: &str = "2.51.0";
const CODE_INTERPRETER_JS: &str = "2.8.0";

/// The node_modules dir if it holds the package at the pinned version, else
/// a skip (or a failure under BRIG_TEST_STRICT=1) and `None`.
fn node_modules(package: &str, version: &str) -> Option<std::path::PathBuf> {
    let dir = test_cache().join("e2b-node");
    let manifest = dir.join("node_modules").join(package).join("package.json");
    let have = std::fs::read_to_string(&manifest)
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|v| v["version"].as_str().map(str::to_string));
    if have.as_deref() != Some(version) {
        skip(&format!(
            "{} has no {package} {version} (found {have:?}): run tests/support/install-node-deps.sh",
            dir.display()
        ));
        return None;
    }
    Some(dir)
}

/// Planes over the shared template home with `template` built (or waited
/// for) before any client clock starts; `None` after a skip.
fn planes_for(template: &str) -> Option<Planes> {
    if !ensure_template(template) {
        return None;
    }
    Some(planes_with(|c| c.home = Some(template_home())))
}

/// `template` built (or waited for) in the shared template home; false
/// after a skip.
fn ensure_template(template: &str) -> bool {
    if let Err(e) =
        brig_template::ensure(&template_home(), template, brig_template::Progress::Lines)
    {
        skip(&format!("cannot build the {template} template: {e}"));
        return false;
    }
    true
}

/// Runs tests/e2b/`script` with node from `dir` (where node resolves the
/// clients), pointed at the planes.
fn node(dir: &Path, script: &str, p: &Planes, template: &str) -> Output {
    node_on(dir, script, p, template, None)
}

/// [`node`], with `BRIG_ISOLATION` set for the scripts that take a tier.
fn node_on(
    dir: &Path,
    script: &str,
    p: &Planes,
    template: &str,
    isolation: Option<&str>,
) -> Output {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/e2b")
        .join(script);
    // Each run its own copies: tests may run side by side. The script
    // imports the shared checks (tests/e2b/sdk_checks.mjs) by their name.
    let pid = std::process::id();
    let copy = dir.join(format!("{pid}-{script}"));
    let checks = format!("sdk_checks-{pid}.mjs");
    let text = std::fs::read_to_string(&src)
        .unwrap()
        .replace("'./sdk_checks.mjs'", &format!("'./{checks}'"));
    std::fs::write(&copy, text).unwrap();
    std::fs::copy(src.with_file_name("sdk_checks.mjs"), dir.join(&checks)).unwrap();
    let mut cmd = Command::new("node");
    if let Some(isolation) = isolation {
        cmd.env("BRIG_ISOLATION", isolation);
    }
    let out = cmd
        .arg(&copy)
        .current_dir(dir)
        .env("E2B_API_KEY", &p.f.key)
        .env("E2B_API_URL", format!("http://{}", p.api))
        // Volume content requests go here, not to E2B_API_URL.
        .env("E2B_VOLUME_API_URL", format!("http://{}", p.api))
        .env("E2B_SANDBOX_URL", format!("http://{}", p.data))
        .env("E2B_TEMPLATE", template)
        // Names of templates a script builds (js_template.mjs).
        .env("E2B_TEMPLATE_PREFIX", template_prefix())
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        // The clients' "ci" source: error messages carry the server's
        // answer body (`400 Bad Request: <why>`), so a failure says why.
        .env("E2B_USER_AGENT_SOURCE", "ci")
        .output();
    let _ = std::fs::remove_file(&copy);
    let _ = std::fs::remove_file(dir.join(&checks));
    out.expect("run node")
}

/// Every sandbox the script made has ended: none left in the E2B registry,
/// and `made` records in the store, all ended.
fn all_killed(p: &Planes, made: usize, log: &str) {
    assert!(
        p.state.sandboxes.is_empty(),
        "still registered after the script: {log}"
    );
    let tenant = p.f.manager.authenticate(&p.f.key).unwrap().tenant;
    let page =
        p.f.manager
            .list(&tenant, &ListFilter::default(), None, 1000)
            .unwrap();
    assert_eq!(page.items.len(), made, "{:?}", page.items);
    for s in &page.items {
        assert!(s.ended_at.is_some(), "{} still runs: {log}", s.id);
    }
}

/// `e2b` 2.51.0 runs tests/e2b/js_sdk.mjs on `base` (default user `user`
/// with sudo): commands (foreground, background, stdin, list, connect, kill,
/// envs, cwd, user, exit codes, timeouts, multi-MB output), PTY (create,
/// input, resize, kill, cwd/envs), files (text, bytes, blob, stream, gzip,
/// many, list depth, exists, info, makeDir, rename, remove, users), watchDir,
/// signed upload/download URLs, and the lifecycle (getInfo, setTimeout,
/// getMetrics, connect, list paging and filters, pause/betaPause and resume
/// through connect, expiry, kill), snapshots (createSnapshot,
/// listSnapshots, create from one, fork, deleteSnapshot).
#[test]
fn js_sdk_current_generation() {
    if !root_or_skip() {
        return;
    }
    let Some(dir) = node_modules("e2b", E2B_JS) else {
        return;
    };
    let Some(p) = planes_for("base") else {
        return;
    };
    js_sdk_passes(&dir, &p, None, 109);
}

/// The same suite, unchanged but for the metadata key `brig.isolation` on
/// each create, with every sandbox on the gvisor tier (and its kernel
/// checked): snapshots there keep memory only without a network, so the
/// suite's (which have the default internet access) keep files, as the
/// process tier's do.
#[test]
fn js_sdk_on_gvisor() {
    js_sdk_on_tier("gvisor", |tweak| support::gvisor_planes_with(tweak));
}

/// The same suite on the vm tier: every sandbox a QEMU guest with its own
/// kernel (checked). Its snapshots keep memory as well as files; what the
/// suite checks of them (files, independent forks) holds on every tier.
#[test]
fn js_sdk_on_vm() {
    js_sdk_on_tier("vm", |tweak| support::vm_planes_with(tweak));
}

/// The suite with every sandbox on `isolation`, on the planes `planes`
/// makes (a printed skip where the host lacks the tier): 110 checks, its
/// kernel's among them.
fn js_sdk_on_tier(
    isolation: &str,
    planes: impl FnOnce(fn(&mut brig_runtime::ManagerConfig)) -> Option<Planes>,
) {
    if !root_or_skip() {
        return;
    }
    let Some(dir) = node_modules("e2b", E2B_JS) else {
        return;
    };
    if !ensure_template("base") {
        return;
    }
    let Some(p) = planes(|c| c.home = Some(template_home())) else {
        return;
    };
    js_sdk_passes(&dir, &p, Some(isolation), 110);
}

/// Runs tests/e2b/js_sdk.mjs on `base` (on `isolation` when given) and
/// checks that all `checks` passed, through the current generation's
/// paths, and that every sandbox it made has ended.
fn js_sdk_passes(dir: &Path, p: &Planes, isolation: Option<&str>, checks: usize) {
    let out = node_on(dir, "js_sdk.mjs", p, "base", isolation);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = format!("{stdout}\n{stderr}");
    assert!(out.status.success(), "{log}");
    assert!(stdout.contains(&format!("e2b {E2B_JS} (js)")), "{log}");
    let want = format!("{checks} passed, 0 failed");
    assert!(stdout.lines().any(|l| l == want), "want {want:?}: {log}");
    // The current generation's create and connect paths; pause and resume
    // went through the control plane.
    let seen = p.seen.lock().unwrap().clone();
    assert!(seen.iter().any(|l| l == "POST /v2/sandboxes"), "{seen:?}");
    assert!(
        seen.iter()
            .any(|l| l.starts_with("POST /v2/sandboxes/") && l.ends_with("/connect")),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|l| l.starts_with("POST /sandboxes/") && l.ends_with("/pause")),
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|l| l == "POST /sandboxes"),
        "the old create path: {seen:?}"
    );
    all_killed(p, 8, &log);
    if let Some(isolation) = isolation {
        // Every one of them, the snapshot's child and the forks too.
        all_on(p, isolation, &log);
    }
}

/// Every sandbox the script made ran on `isolation`.
fn all_on(p: &Planes, isolation: &str, log: &str) {
    let tenant = p.f.manager.authenticate(&p.f.key).unwrap().tenant;
    let page =
        p.f.manager
            .list(&tenant, &ListFilter::default(), None, 1000)
            .unwrap();
    for s in &page.items {
        assert_eq!(s.isolation, isolation, "{}: {log}", s.id);
    }
}

/// `@e2b/code-interpreter` 2.8.0 runs tests/e2b/js_code_interpreter.mjs on
/// `code-interpreter-v1`: state across calls, execution counts, errors,
/// stdout/stderr, matplotlib PNG, display_data, rich formats, streaming
/// callbacks, contexts (create with cwd/language, list, restart, remove),
/// bash, env vars (per call and create-time), timeouts.
#[test]
fn js_code_interpreter() {
    if !root_or_skip() {
        return;
    }
    let Some(dir) = node_modules("@e2b/code-interpreter", CODE_INTERPRETER_JS) else {
        return;
    };
    if node_modules("e2b", E2B_JS).is_none() {
        return;
    }
    let Some(p) = planes_for("code-interpreter-v1") else {
        return;
    };
    js_code_interpreter_passes(&dir, &p, None);
}

/// The same suite, unchanged but for the metadata key `brig.isolation`, on
/// a gvisor sandbox: the template's Jupyter server and kernels under
/// gVisor's kernel.
#[test]
fn js_code_interpreter_on_gvisor() {
    if !root_or_skip() {
        return;
    }
    let Some(dir) = node_modules("@e2b/code-interpreter", CODE_INTERPRETER_JS) else {
        return;
    };
    if node_modules("e2b", E2B_JS).is_none() || !ensure_template("code-interpreter-v1") {
        return;
    }
    let Some(p) = support::gvisor_planes_with(|c| c.home = Some(template_home())) else {
        return;
    };
    js_code_interpreter_passes(&dir, &p, Some("gvisor"));
}

fn js_code_interpreter_passes(dir: &Path, p: &Planes, isolation: Option<&str>) {
    let out = node_on(
        dir,
        "js_code_interpreter.mjs",
        p,
        "code-interpreter-v1",
        isolation,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = format!("{stdout}\n{stderr}");
    assert!(out.status.success(), "{log}");
    assert!(
        stdout.contains(&format!(
            "@e2b/code-interpreter {CODE_INTERPRETER_JS} (e2b {E2B_JS}, js)"
        )),
        "{log}"
    );
    assert!(stdout.lines().any(|l| l == "55 passed, 0 failed"), "{log}");
    let seen = p.seen.lock().unwrap().clone();
    assert!(seen.iter().any(|l| l == "POST /v2/sandboxes"), "{seen:?}");
    all_killed(p, 1, &log);
    if let Some(isolation) = isolation {
        all_on(p, isolation, &log);
    }
}

/// `e2b` 2.51.0 runs tests/e2b/js_template.mjs: a template built from the
/// base image (copies, runCmd, setEnvs, setUser, setWorkdir, a start
/// command with a ready check) and a sandbox made from it, a rebuild from
/// the cache, a failing step, on the build home (support's `build_home`).
/// The templates go after.
#[test]
fn js_sdk_template_build() {
    if !root_or_skip() {
        return;
    }
    let Some(dir) = node_modules("e2b", E2B_JS) else {
        return;
    };
    if let Err(e) = brig_template::ensure(&template_home(), "base", brig_template::Progress::Lines)
    {
        skip(&format!("cannot build the base template: {e}"));
        return;
    }
    let p = planes_with(|c| c.home = Some(support::build_home()));
    let prefix = template_prefix();
    let tenant = p.f.manager.authenticate(&p.f.key).unwrap().tenant;
    let _cleanup = TemplatesGone {
        prefix: prefix.clone(),
        files: support::build_home()
            .join("e2b/files")
            .join(tenant.as_str()),
    };
    let out = node(&dir, "js_template.mjs", &p, "base");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = format!("{stdout}\n{stderr}");
    assert!(out.status.success(), "{log}");
    assert!(stdout.lines().any(|l| l == "13 passed, 0 failed"), "{log}");
    let seen = p.seen.lock().unwrap().clone();
    for route in [
        "POST /v3/templates",
        "PUT /templates/",
        "POST /v2/templates/",
    ] {
        assert!(seen.iter().any(|s| s.contains(route)), "{route}: {seen:?}");
    }
    all_killed(&p, 1, &log);
}

/// What the templates a script builds are named after: this process.
/// `e2b` 2.51.0 runs tests/e2b/js_volumes.mjs on `host`, with volumes
/// under a home of the test's own: Volume's calls, the content API and
/// `volumeMounts`.
#[test]
fn js_sdk_volumes() {
    if !root_or_skip() {
        return;
    }
    let Some(dir) = node_modules("e2b", E2B_JS) else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let volumes = home.path().to_path_buf();
    let p = planes_with(|c| {
        c.home = Some(volumes);
        c.volume_size = 32 << 20;
    });
    let out = node(&dir, "js_volumes.mjs", &p, "host");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{log}");
    assert!(log.contains("20 passed, 0 failed"), "{log}");
    all_killed(&p, 1, &log);
}

fn template_prefix() -> String {
    format!("brigtestjs{}", std::process::id())
}

/// The templates named `prefix…` and the files `files` gone from the
/// shared home, however the test ends.
struct TemplatesGone {
    prefix: String,
    files: std::path::PathBuf,
}

impl Drop for TemplatesGone {
    fn drop(&mut self) {
        let home = support::build_home();
        let _ = std::fs::remove_dir_all(&self.files);
        let Ok(store) = brig_image::ImageStore::open(&home) else {
            return;
        };
        for image in store.list().unwrap_or_default() {
            if image.name.starts_with(&self.prefix) {
                let _ = store.remove(&image.name);
                let _ = std::fs::remove_file(
                    home.join("e2b/templates")
                        .join(format!("{}.json", image.name)),
                );
            }
        }
    }
}
