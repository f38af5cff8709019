//! E2B's template builder (`Template.build` and friends) through the
//! official Python client against both E2B planes served in process
//! (support/mod.rs) on the build home (support's `build_home`: an image
//! store of its own, the shared test home's named templates): a
//! template from the base image with every kind of step, a cached rebuild,
//! a background build polled with its logs, a Dockerfile, an image pulled
//! from Debian's `docker-registry` on loopback, and the errors
//! (tests/e2b/template_sdk.py). Needs root, the venv, the `base` template,
//! docker-registry and skopeo; skips otherwise (fails under
//! BRIG_TEST_STRICT=1).
//!
//! The templates it builds are removed at the end (their layers stay, as
//! the build cache of the next run).

mod support;

use std::path::Path;
use std::process::Command;

use brig_image::testing::{write_oci_layout, Entry};
use brig_image::{ImageConfig, ImageStore};
use brig_test_support::registry::Registry;
use support::{build_home, planes_with, root_or_skip, skip, template_home};

/// A two-layer busybox image (the second layer deletes and adds files),
/// pushed as `e2b/busy:1` (with `creds`, `USER:PASS`, if given); its
/// reference.
fn push_image(registry: &Registry, creds: Option<&str>) -> String {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut base = vec![
        Entry::dir("bin"),
        Entry::dir("etc"),
        Entry::dir("tmp").mode(0o1777),
        Entry::dir("data"),
        Entry::file("bin/busybox", busybox).mode(0o755),
        Entry::file(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
        ),
        Entry::file("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        Entry::file("data/old", "old\n"),
    ];
    for applet in ["sh", "cat", "echo", "id", "pwd", "sleep", "test", "ps"] {
        base.push(Entry::symlink(&format!("bin/{applet}"), "busybox"));
    }
    // E2B's clients run every command with `/bin/bash -l -c`.
    base.push(Entry::file("bin/bash", "#!/bin/sh\nexec /bin/sh \"$@\"\n").mode(0o755));
    // glibc's loader and the libraries a dynamically linked (debug)
    // brig-agent needs, so the sandbox's agent starts in this image.
    base.push(Entry::dir("lib64"));
    base.push(Entry::dir("lib"));
    base.push(Entry::dir("lib/x86_64-linux-gnu"));
    for lib in [
        "lib64/ld-linux-x86-64.so.2",
        "lib/x86_64-linux-gnu/libc.so.6",
        "lib/x86_64-linux-gnu/libgcc_s.so.1",
    ] {
        if let Ok(bytes) = std::fs::read(Path::new("/").join(lib)) {
            base.push(Entry::file(lib, bytes).mode(0o755));
        }
    }
    let top = vec![
        Entry::whiteout("data/old"),
        Entry::file("data/file", "from the top layer\n"),
    ];
    let config = ImageConfig {
        env: vec!["PATH=/bin".into(), "GREETING=hello from the image".into()],
        working_dir: Some("/data".into()),
        ..ImageConfig::default()
    };
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(layout.path(), &[base, top], config);
    registry.push(layout.path(), "e2b/busy:1", creds);
    let reference = format!("{}/e2b/busy:1", registry.addr);
    reference
}

/// Removes this run's templates from the shared home, however the test
/// ends.
struct Cleanup {
    prefix: String,
    /// Images the builds pulled, by name (the registry's port is this
    /// run's).
    pulled: Vec<String>,
    /// The files this run's tenant uploaded.
    files: Option<std::path::PathBuf>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let home = build_home();
        if let Some(f) = &self.files {
            let _ = std::fs::remove_dir_all(f);
        }
        let Ok(store) = ImageStore::open(&home) else {
            return;
        };
        for name in &self.pulled {
            let _ = store.remove(name);
        }
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

fn tool(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn python_sdk_template_builds() {
    if !root_or_skip() {
        return;
    }
    let Some(python) = support::venv_or_skip("e2b-venv") else {
        return;
    };
    for t in ["docker-registry", "skopeo", "htpasswd"] {
        if !tool(t) {
            skip(&format!(
                "{t} is not installed (tests/support/install-deps.sh installs it)"
            ));
            return;
        }
    }
    if !Path::new("/bin/busybox").exists() {
        skip("/bin/busybox (busybox-static) is missing");
        return;
    }
    if let Err(e) = brig_template::ensure(&template_home(), "base", brig_template::Progress::Lines)
    {
        skip(&format!("cannot build the base template: {e}"));
        return;
    }
    let registry = Registry::start(None);
    let reference = push_image(&registry, None);
    // A registry that wants a user and a password.
    let users = tempfile::tempdir().unwrap();
    let htpasswd = users.path().join("htpasswd");
    let made = Command::new("htpasswd")
        .args(["-Bbc", htpasswd.to_str().unwrap(), "brig", "s3cret"])
        .output()
        .unwrap();
    assert!(made.status.success(), "htpasswd: {made:?}");
    let private = Registry::start(Some(&htpasswd));
    let private_ref = push_image(&private, Some("brig:s3cret"));
    let prefix = format!("brigtest{}", std::process::id());
    let mut cleanup = Cleanup {
        prefix: prefix.clone(),
        pulled: vec![reference.clone()],
        files: None,
    };
    let p = planes_with(|c| {
        c.home = Some(build_home());
        c.pull_images = true;
    });
    let tenant = p.f.manager.authenticate(&p.f.key).unwrap().tenant;
    cleanup.files = Some(build_home().join("e2b/files").join(tenant.as_str()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2b/template_sdk.py");
    let out = Command::new(&python)
        .arg(&script)
        .env("E2B_API_KEY", &p.f.key)
        .env("E2B_API_URL", format!("http://{}", p.api))
        .env("E2B_SANDBOX_URL", format!("http://{}", p.data))
        .env("E2B_TEMPLATE_PREFIX", &prefix)
        .env("E2B_REGISTRY_IMAGE", &reference)
        .env("E2B_AUTH_REGISTRY_IMAGE", &private_ref)
        .env("E2B_AUTH_REGISTRY_CREDS", "brig:s3cret")
        .env("E2B_OTHER_KEY", &p.f.other_key)
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("64 passed, 0 failed"), "{stdout}\n{stderr}");
    // Every route of the builder was used.
    let seen = p.seen.lock().unwrap().clone();
    for route in [
        "POST /v3/templates",
        "GET /templates/",
        "PUT /templates/",
        "POST /v2/templates/",
        "/status",
        "GET /templates/aliases/",
    ] {
        assert!(
            seen.iter().any(|s| s.contains(route)),
            "{route} never called: {seen:?}"
        );
    }
    // Every sandbox the script made has ended.
    assert!(p.state.sandboxes.is_empty(), "{stdout}");
    // The built template is an image of the store, as `brig template ls`
    // shows it.
    let store = ImageStore::open(&build_home()).unwrap();
    let full = store
        .get(&format!("{prefix}-full"))
        .unwrap()
        .expect("the template's image");
    assert!(full.source.starts_with("e2b template build"), "{full:?}");
    assert_eq!(full.config.user.as_deref(), Some("user"));
    assert_eq!(full.config.working_dir.as_deref(), Some("/home/user/work"));
    // Nothing of the failed builds.
    assert!(store.get(&format!("{prefix}-failing")).unwrap().is_none());
    assert!(store.get(&format!("{prefix}-orphan")).unwrap().is_none());
    // The image pulled with credentials is not left under its reference
    // (or any other name) for keys without them.
    assert!(store.get(&private_ref).unwrap().is_none());
    assert!(
        !store
            .list()
            .unwrap()
            .iter()
            .any(|i| i.name.starts_with("e2b-build-base/")),
        "a credentialed pull's image was left behind"
    );
}
