//! Named templates through the API: `"template": "base"` is resolved by the
//! manager to `$BRIG_HOME/templates/base/rootfs` (brig-template), an
//! unknown name is a 400 that lists the known ones. The built template is
//! stood in for by the test rootfs with a current recipe stamp, so this
//! runs in seconds; building for real is crates/template/tests/build.rs.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::json;
use support::{assert_error, call, create, fixture, root_or_skip, sh};

/// A home whose `base` template is the test rootfs, stamped as current.
fn home_with_base() -> Option<tempfile::TempDir> {
    let rootfs = brig_test_support::rootfs_or_skip()?;
    let home = tempfile::tempdir().unwrap();
    let paths = brig_template::Paths::new(home.path(), "base");
    std::fs::create_dir_all(&paths.dir).unwrap();
    std::os::unix::fs::symlink(&rootfs, &paths.rootfs).unwrap();
    std::fs::write(
        &paths.stamp,
        brig_template::stamp_for(&brig_template::recipes::BASE),
    )
    .unwrap();
    Some(home)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_named_template_resolves_to_its_built_rootfs() {
    if !root_or_skip() {
        return;
    }
    let Some(home) = home_with_base() else { return };
    let path = home.path().to_path_buf();
    let f = fixture(move |c| c.home = Some(path));
    let id = create(&f, &json!({ "template": "base" }).to_string()).await;
    // The test rootfs is Debian; the host template is whatever the host is,
    // so this tells them apart only by the overlay: the sandbox's root is
    // writable (the host template's /usr is read-only).
    let out = sh(&f, &id, "touch /usr/brig-was-here && echo ok").await;
    assert_eq!(out, "ok\n");
    assert!(!home
        .path()
        .join("templates/base/rootfs/usr/brig-was-here")
        .exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_or_disabled_named_templates_are_400() {
    if !root_or_skip() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let path = home.path().to_path_buf();
    let f = fixture(move |c| c.home = Some(path));
    let (status, err) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&f.key),
        Some(r#"{"template": "ubuntu"}"#),
    )
    .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "bad_request");
    let msg = err["message"].as_str().unwrap();
    assert!(msg.contains("base, code-interpreter-v1"), "{msg}");
    // Nothing was built or created for it.
    assert!(!home.path().join("templates/ubuntu").exists());

    // A daemon without a home for templates refuses names it knows, too.
    let f = fixture(|c| c.home = None);
    let (status, err) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&f.key),
        Some(r#"{"template": "base"}"#),
    )
    .await;
    assert_error(status, &err, StatusCode::BAD_REQUEST, "bad_request");
}
