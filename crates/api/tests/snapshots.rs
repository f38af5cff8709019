//! Snapshots and forks through the native API, on a real daemon's manager
//! and the process tier: what a snapshot keeps (files written, deleted,
//! linked; not processes), that sandboxes from it and forks are
//! independent of each other and of the parent, that they are a tenant's
//! own, and that deleting one leaves nothing in the image store.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use support::{assert_error, call, create, fixture, root_or_skip, sh, Fixture};

async fn post(f: &Fixture, key: &str, uri: &str, body: Value) -> (StatusCode, Value) {
    call(
        &f.app,
        Method::POST,
        uri,
        Some(key),
        Some(&body.to_string()),
    )
    .await
}

async fn get(f: &Fixture, key: &str, uri: &str) -> (StatusCode, Value) {
    call(&f.app, Method::GET, uri, Some(key), None).await
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_keep_files_and_forks_are_independent() {
    if !root_or_skip() {
        return;
    }
    let Some(rootfs) = brig_test_support::rootfs_or_skip() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let roots = rootfs.parent().unwrap().to_path_buf();
    let f = fixture(|c| {
        c.home = Some(home.path().to_path_buf());
        c.template_roots = vec![roots.clone()];
    });
    let template = format!("dir:{}", rootfs.display());
    let parent = create(&f, &json!({ "template": template }).to_string()).await;
    sh(
        &f,
        &parent,
        "echo one > /root/a.txt && mkdir -p /data/deep && echo x > /data/deep/f && \
         rm /etc/debian_version && ln -s /etc /root/etc-link && \
         (sleep 600 >/dev/null 2>&1 &)",
    )
    .await;

    let (status, snap) = post(
        &f,
        &f.key,
        &format!("/v1/sandboxes/{parent}/snapshots"),
        json!({"name": "First"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{snap}");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    assert!(snap_id.starts_with("snap-"), "{snap}");
    assert_eq!(snap["name"], "first", "{snap}");
    assert_eq!(snap["sandbox_id"], parent.as_str(), "{snap}");
    assert!(snap["size_bytes"].as_u64().unwrap() > 0, "{snap}");
    assert!(snap["frozen_ms"].is_u64(), "{snap}");
    // The parent runs on, and changes after the snapshot are its own.
    sh(&f, &parent, "echo two > /root/a.txt").await;

    let check = "cat /root/a.txt; cat /data/deep/f; \
                 test -e /etc/debian_version && echo present || echo deleted; \
                 readlink /root/etc-link; pgrep -x sleep >/dev/null && echo sleeping || echo no-sleep";
    let from_name = create(&f, &json!({ "template": "first" }).to_string()).await;
    assert_eq!(
        sh(&f, &from_name, check).await,
        "one\nx\ndeleted\n/etc\nno-sleep\n"
    );
    sh(&f, &from_name, "echo mine > /root/b.txt").await;
    let from_id = create(&f, &json!({ "template": snap_id }).to_string()).await;
    assert_eq!(
        sh(
            &f,
            &from_id,
            "cat /root/a.txt; test -e /root/b.txt && echo leaked || echo alone"
        )
        .await,
        "one\nalone\n"
    );
    assert_eq!(
        sh(
            &f,
            &parent,
            "cat /root/a.txt; test -e /root/b.txt && echo leaked || echo alone"
        )
        .await,
        "two\nalone\n"
    );

    // Listed, by sandbox and by name; another tenant sees none of it.
    let (status, all) = get(&f, &f.key, "/v1/snapshots").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(all["items"].as_array().unwrap().len(), 1, "{all}");
    let (_, by_sandbox) = get(&f, &f.key, &format!("/v1/snapshots?sandbox={parent}")).await;
    assert_eq!(by_sandbox["items"][0]["id"], snap_id.as_str());
    let (_, by_name) = get(&f, &f.key, "/v1/snapshots?name=first").await;
    assert_eq!(by_name["items"][0]["id"], snap_id.as_str());
    let (_, theirs) = get(&f, &f.other_key, "/v1/snapshots").await;
    assert_eq!(theirs["items"], json!([]), "{theirs}");
    let (status, body) = get(&f, &f.other_key, &format!("/v1/snapshots/{snap_id}")).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, body) = post(
        &f,
        &f.other_key,
        "/v1/sandboxes",
        json!({ "template": format!("snapshots/{snap_id}") }),
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    // Forks: of the parent as it is now, each on its own.
    let (status, forks) = post(
        &f,
        &f.key,
        &format!("/v1/sandboxes/{parent}/fork"),
        json!({"count": 3}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{forks}");
    let ids: Vec<String> = forks
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["sandbox"]["id"].as_str().expect("a sandbox").to_string())
        .collect();
    assert_eq!(ids.len(), 3);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(sh(&f, id, "cat /root/a.txt").await, "two\n");
        sh(&f, id, &format!("echo {i} > /root/fork")).await;
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(sh(&f, id, "cat /root/fork").await, format!("{i}\n"));
    }
    assert_eq!(
        sh(&f, &parent, "cat /root/fork 2>/dev/null || echo none").await,
        "none\n"
    );
    // A fork's snapshot is not one of the tenant's.
    let (_, all) = get(&f, &f.key, "/v1/snapshots").await;
    assert_eq!(all["items"].as_array().unwrap().len(), 1, "{all}");
    let (status, body) = post(
        &f,
        &f.key,
        &format!("/v1/sandboxes/{parent}/fork"),
        json!({"count": 0}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");

    // Deleted: gone, twice 404, its layer pruned from the store (the
    // sandboxes made from it run on).
    let store = brig_image::ImageStore::open(home.path()).unwrap();
    let layers_before = std::fs::read_dir(store.root().join("layers"))
        .unwrap()
        .count();
    let (status, _) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/snapshots/{snap_id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = call(
        &f.app,
        Method::DELETE,
        "/v1/snapshots/first",
        Some(&f.key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    assert!(store
        .get(&format!("snapshots/{snap_id}"))
        .unwrap()
        .is_none());
    assert_eq!(sh(&f, &from_name, "cat /root/a.txt").await, "one\n");
    for id in [&from_name, &from_id] {
        let (status, _) = call(
            &f.app,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            Some(&f.key),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    // The sandboxes' teardowns (which let their leases go) run on threads
    // of their own after the answers.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        assert!(store.prune().is_ok());
        let layers_after = std::fs::read_dir(store.root().join("layers"))
            .unwrap()
            .count();
        if layers_after < layers_before {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the snapshot's layer stayed: {layers_before} -> {layers_after}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_sandbox_has_no_files_of_its_own_to_snapshot() {
    if !root_or_skip() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let f = fixture(|c| c.home = Some(home.path().to_path_buf()));
    let id = create(&f, "{}").await;
    let (status, body) = post(
        &f,
        &f.key,
        &format!("/v1/sandboxes/{id}/snapshots"),
        json!({}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(body["message"].as_str().unwrap().contains("host"), "{body}");
    let (status, body) = post(
        &f,
        &f.key,
        &format!("/v1/sandboxes/{id}/snapshots"),
        json!({"name": "snap-x"}),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, body) = post(
        &f,
        &f.key,
        "/v1/sandboxes/000000000000/snapshots",
        json!({}),
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
}
