//! The file API in process: list, stat, mkdir, rename, remove, multipart
//! upload, how each agent error maps to a status, and that paths cannot
//! lead out of the sandbox. Needs root (see `support`).

mod support;

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use support::{assert_error, call, create, fixture, raw, root_or_skip, sh, Fixture};

async fn get(f: &Fixture, uri: &str) -> (StatusCode, Value) {
    call(&f.app, Method::GET, uri, Some(&f.key), None).await
}

async fn post(f: &Fixture, uri: &str, body: Value) -> (StatusCode, Value) {
    call(
        &f.app,
        Method::POST,
        uri,
        Some(&f.key),
        Some(&body.to_string()),
    )
    .await
}

async fn delete(f: &Fixture, uri: &str) -> (StatusCode, Value) {
    call(&f.app, Method::DELETE, uri, Some(&f.key), None).await
}

async fn put(f: &Fixture, id: &str, path: &str, data: &[u8]) {
    let (status, _, body) = raw(
        &f.app,
        Method::PUT,
        &format!("/v1/sandboxes/{id}/files?path={path}"),
        &f.key,
        Some("application/octet-stream"),
        data.to_vec(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
}

async fn read(f: &Fixture, id: &str, path: &str) -> (StatusCode, Vec<u8>) {
    let (status, _, body) = raw(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path={path}"),
        &f.key,
        None,
        Vec::new(),
    )
    .await;
    (status, body)
}

fn names(list: &Value) -> Vec<&str> {
    list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn list_stat_mkdir_rename_remove() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let base = format!("/v1/sandboxes/{id}/files");

    let (status, body) = post(&f, &format!("{base}/mkdir"), json!({"path": "/tmp/d"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = post(
        &f,
        &format!("{base}/mkdir"),
        json!({"path": "/tmp/d/a/b", "parents": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    put(&f, &id, "/tmp/d/f.txt", b"hello").await;

    let (status, list) = get(&f, &format!("{base}/list?path=/tmp/d")).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(names(&list), ["/tmp/d/a", "/tmp/d/f.txt"], "{list}");
    let file = &list["entries"][1];
    assert_eq!(file["name"], "f.txt");
    assert_eq!(file["type"], "file");
    assert_eq!(file["size"], 5);
    assert!(file["mode"].as_u64().is_some() && file["mtime"].as_i64().is_some());
    assert_eq!(list["entries"][0]["type"], "dir");

    let (_, deep) = get(&f, &format!("{base}/list?path=/tmp/d&depth=3")).await;
    assert_eq!(
        names(&deep),
        ["/tmp/d/a", "/tmp/d/a/b", "/tmp/d/f.txt"],
        "{deep}"
    );
    let (_, empty) = get(&f, &format!("{base}/list?path=/tmp/d/a/b")).await;
    assert_eq!(empty, json!({"entries": []}));

    let (status, st) = get(&f, &format!("{base}/stat?path=/tmp/d/f.txt")).await;
    assert_eq!(status, StatusCode::OK, "{st}");
    assert_eq!((&st["type"], &st["size"]), (&json!("file"), &json!(5)));
    // Owner and group, by id and by the sandbox's own names.
    assert_eq!(
        (&st["uid"], &st["gid"], &st["owner"], &st["group"]),
        (&json!(0), &json!(0), &json!("root"), &json!("root")),
        "{st}"
    );

    let (status, body) = post(
        &f,
        &format!("{base}/rename"),
        json!({"from": "/tmp/d/f.txt", "to": "/tmp/d/g.txt"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(read(&f, &id, "/tmp/d/g.txt").await.1, b"hello");
    assert_eq!(read(&f, &id, "/tmp/d/f.txt").await.0, StatusCode::NOT_FOUND);

    // Not empty: refused without `recursive`.
    let (status, body) = delete(&f, &format!("{base}?path=/tmp/d")).await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    let (status, body) = delete(&f, &format!("{base}?path=/tmp/d/g.txt")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = delete(&f, &format!("{base}?path=/tmp/d&recursive=true")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = get(&f, &format!("{base}/stat?path=/tmp/d")).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_errors_map_to_statuses_with_the_agents_message() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let base = format!("/v1/sandboxes/{id}/files");

    // Not found: 404, and the message names the path.
    for (status, body) in [
        get(&f, &format!("{base}/stat?path=/no/such")).await,
        get(&f, &format!("{base}/list?path=/no/such")).await,
        delete(&f, &format!("{base}?path=/no/such")).await,
        post(
            &f,
            &format!("{base}/rename"),
            json!({"from": "/no/such", "to": "/tmp/x"}),
        )
        .await,
        post(
            &f,
            &format!("{base}/mkdir"),
            json!({"path": "/no/such/dir"}),
        )
        .await,
    ] {
        assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
        assert!(
            body["message"].as_str().unwrap().contains("/no/such"),
            "{body}"
        );
    }

    // Already exists: 409.
    let (status, body) = post(&f, &format!("{base}/mkdir"), json!({"path": "/tmp"})).await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");

    // Invalid input: 400.
    for uri in [
        format!("{base}/stat?path="),
        format!("{base}/stat?path=/tmp/a%00b"),
        format!("{base}/list?path=relative"),
        format!("{base}/list?path=/tmp&depth=0"),
        format!("{base}/list?path=/tmp&depth=x"),
        format!("{base}/list?path=/tmp&bogus=1"),
        format!("{base}/stat"),
    ] {
        let (status, body) = get(&f, &uri).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    for (op, body) in [
        ("mkdir", json!({"path": ""})),
        ("mkdir", json!({"path": "/tmp/x", "mode": 7})),
        ("rename", json!({"from": "/tmp"})),
        ("rename", json!({"from": "/tmp/a\u{0}", "to": "/tmp/b"})),
    ] {
        let (status, body) = post(&f, &format!("{base}/{op}"), body).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (status, body) = delete(&f, &format!("{base}?path=/tmp&recursive=maybe")).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");

    // Another tenant's sandbox is not found, as everywhere.
    let (status, body) = call(
        &f.app,
        Method::GET,
        &format!("{base}/stat?path=/tmp"),
        Some(&f.other_key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
}

const BOUNDARY: &str = "brig-test-boundary";

fn multipart(parts: &[(Option<&str>, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, data) in parts {
        body.extend(format!("--{BOUNDARY}\r\n").bytes());
        match name {
            Some(n) => body.extend(
                format!("Content-Disposition: form-data; name=\"file\"; filename=\"{n}\"\r\n")
                    .bytes(),
            ),
            None => body.extend(b"Content-Disposition: form-data; name=\"field\"\r\n"),
        }
        body.extend(b"Content-Type: application/octet-stream\r\n\r\n");
        body.extend(*data);
        body.extend(b"\r\n");
    }
    body.extend(format!("--{BOUNDARY}--\r\n").bytes());
    body
}

async fn upload(f: &Fixture, id: &str, dir: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let (status, _, bytes) = raw(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/files/upload?dir={dir}"),
        &f.key,
        Some(&format!("multipart/form-data; boundary={BOUNDARY}")),
        body,
    )
    .await;
    (status, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn multipart_upload_writes_each_part_and_refuses_paths_in_names() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let binary: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let (status, body) = upload(
        &f,
        &id,
        "/tmp/",
        multipart(&[(Some("a.txt"), b"first"), (Some("b.bin"), &binary)]),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"files": [
            {"path": "/tmp/a.txt", "size": 5},
            {"path": "/tmp/b.bin", "size": 300_000},
        ]})
    );
    assert_eq!(read(&f, &id, "/tmp/a.txt").await.1, b"first");
    assert_eq!(read(&f, &id, "/tmp/b.bin").await.1, binary);

    for name in ["../evil", "x/y", "..", ""] {
        let (status, body) = upload(&f, &id, "/tmp", multipart(&[(Some(name), b"no")])).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    }
    let (status, body) = upload(&f, &id, "/tmp", multipart(&[(None, b"no")])).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, body) = upload(&f, &id, "/no/such", multipart(&[(Some("a"), b"x")])).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    let (status, body) = upload(&f, &id, "/tmp", b"not multipart".to_vec()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
}

/// The agent resolves every path in the sandbox's own mount namespace, so
/// `..` and an absolute symlink that "points out" both land inside it. A
/// canary in the host's /root (not part of the sandbox's view) stays
/// unreachable both ways.
#[tokio::test(flavor = "multi_thread")]
async fn dotdot_and_symlinks_stay_inside_the_sandbox() {
    if !root_or_skip() {
        return;
    }
    let canary = std::path::Path::new("/root/.brig-http-canary");
    std::fs::write(canary, b"host secret").unwrap();
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    sh(&f, &id, "ln -s /root /tmp/r && ln -s / /tmp/top").await;

    for path in [
        "/tmp/r/.brig-http-canary",
        "/tmp/top/root/.brig-http-canary",
        "/tmp/../../../../root/.brig-http-canary",
        "/root/.brig-http-canary",
    ] {
        let (status, body) = read(&f, &id, path).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{path}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    let (status, body) = get(
        &f,
        &format!("/v1/sandboxes/{id}/files/stat?path=/tmp/r/.brig-http-canary"),
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    // The link itself is reported, not followed.
    let (_, st) = get(&f, &format!("/v1/sandboxes/{id}/files/stat?path=/tmp/r")).await;
    assert_eq!(st["type"], "symlink", "{st}");
    assert_eq!(st["symlink_target"], "/root", "{st}");
    let _ = std::fs::remove_file(canary);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_new_file_and_process_routes_need_a_valid_key() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let sb = "/v1/sandboxes/0123456789ab";
    let routes = [
        (Method::DELETE, format!("{sb}/files?path=/tmp/x")),
        (Method::GET, format!("{sb}/files/list?path=/")),
        (Method::GET, format!("{sb}/files/stat?path=/")),
        (Method::POST, format!("{sb}/files/mkdir")),
        (Method::POST, format!("{sb}/files/rename")),
        (Method::POST, format!("{sb}/files/upload?dir=/tmp")),
        (Method::GET, format!("{sb}/files/watch?path=/tmp")),
        (Method::GET, format!("{sb}/processes")),
        (Method::POST, format!("{sb}/processes")),
        (Method::POST, format!("{sb}/processes/1/signal")),
        (Method::GET, format!("{sb}/processes/1/output")),
        (Method::POST, format!("{sb}/processes/1/stdin")),
    ];
    for (method, uri) in routes {
        for key in [None, Some("not-a-key")] {
            let (status, body) = call(&f.app, method.clone(), &uri, key, Some("{}")).await;
            assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
        }
        // With a key: a client error (no such sandbox, or no body), never 5xx.
        let (status, body) = call(&f.app, method.clone(), &uri, Some(&f.key), None).await;
        assert!(
            status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST,
            "{method} {uri}: {status} {body}"
        );
    }
}

/// An open `GET /files/watch` response, read line by line as it streams.
struct WatchLines {
    body: axum::body::Body,
    buf: Vec<u8>,
}

impl WatchLines {
    /// The next NDJSON line, failing the test after 10 s.
    async fn next(&mut self) -> Value {
        use http_body_util::BodyExt;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                return serde_json::from_slice(&line).expect("each line is JSON");
            }
            let frame = tokio::time::timeout(std::time::Duration::from_secs(10), self.body.frame())
                .await
                .expect("a watch line within 10s")
                .expect("the watch stream went on")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    /// (kind, name) of each event until `kind name` arrives.
    async fn until(&mut self, kind: &str, name: &str) -> Vec<(String, String)> {
        let mut seen = Vec::new();
        loop {
            let line = self.next().await;
            assert_eq!(line["type"], "event", "{line} after {seen:?}");
            let got = (
                line["kind"].as_str().unwrap().to_string(),
                line["name"].as_str().unwrap().to_string(),
            );
            let done = got.0 == kind && got.1 == name;
            seen.push(got);
            if done {
                return seen;
            }
        }
    }
}

/// Start a watch; fails the test unless the stream opens with `started`.
async fn watch(f: &Fixture, id: &str, query: &str) -> WatchLines {
    use tower::ServiceExt;
    let req = axum::http::Request::builder()
        .uri(format!("/v1/sandboxes/{id}/files/watch?{query}"))
        .header("authorization", format!("Bearer {}", f.key))
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = f.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let mut lines = WatchLines {
        body: resp.into_body(),
        buf: Vec::new(),
    };
    assert_eq!(lines.next().await, json!({"type": "started"}));
    lines
}

/// inotify watches held by processes in the sandbox (the agent's).
/// The inotify watches the sandbox's agent (pid 1) holds, read from the
/// host: the agent is non-dumpable, so nothing inside may read its fdinfo.
async fn inotify_watches(_f: &Fixture, id: &str) -> usize {
    let state =
        std::fs::read_to_string(format!("/run/brig/sb/{id}/state")).expect("its state file");
    let pid = state
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .expect("the init's pid in its state file");
    let mut n = 0;
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .expect("the agent's fdinfo")
        .flatten()
    {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        n += info.lines().filter(|l| l.starts_with("inotify wd")).count();
    }
    n
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(k, n)| (k.to_string(), n.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_streams_changes_in_order_until_the_client_leaves() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let base = format!("/v1/sandboxes/{id}/files");
    sh(&f, &id, "mkdir /tmp/w").await;
    let mut lines = watch(&f, &id, "path=/tmp/w").await;

    // Through exec, then through the file API.
    sh(
        &f,
        &id,
        "echo hi > /tmp/w/a && chmod 600 /tmp/w/a && mv /tmp/w/a /tmp/w/b && rm /tmp/w/b",
    )
    .await;
    let seen = lines.until("remove", "b").await;
    assert_eq!(
        seen,
        pairs(&[
            ("create", "a"),
            ("write", "a"),
            ("chmod", "a"),
            ("rename", "a"),
            ("create", "b"),
            ("remove", "b"),
        ])
    );
    put(&f, &id, "/tmp/w/c", b"data").await;
    let (status, body) = post(
        &f,
        &format!("{base}/rename"),
        json!({"from": "/tmp/w/c", "to": "/tmp/w/d"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = delete(&f, &format!("{base}?path=/tmp/w/d")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let first = lines.next().await;
    assert_eq!(
        first,
        json!({"type": "event", "kind": "create", "name": "c", "file_type": "file"})
    );
    let seen = lines.until("remove", "d").await;
    assert_eq!(
        seen,
        pairs(&[
            ("write", "c"),
            ("rename", "c"),
            ("create", "d"),
            ("remove", "d")
        ])
    );

    // The agent holds the watch while the client is there, and lets go of
    // it when the client disconnects (even with no change to report).
    assert_eq!(inotify_watches(&f, &id).await, 1);
    drop(lines);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while inotify_watches(&f, &id).await != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the watch outlived its client"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn recursive_watch_sees_files_in_new_subdirectories() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    sh(&f, &id, "mkdir -p /tmp/r/old").await;
    let mut lines = watch(&f, &id, "path=/tmp/r&recursive=true").await;

    sh(&f, &id, "echo 1 > /tmp/r/old/x").await;
    assert_eq!(
        lines.until("write", "old/x").await,
        pairs(&[("create", "old/x"), ("write", "old/x")])
    );
    // A new subdirectory, filled at once: what the watch could not see yet
    // is reported from a listing.
    sh(
        &f,
        &id,
        "mkdir -p /tmp/r/sub/deep && echo 2 > /tmp/r/sub/deep/f",
    )
    .await;
    let seen = lines.until("create", "sub/deep/f").await;
    assert_eq!(seen[0], pairs(&[("create", "sub")])[0], "{seen:?}");
    sh(&f, &id, "echo 3 > /tmp/r/sub/deep/g").await;
    lines.until("create", "sub/deep/g").await;

    // Removing the watched directory ends the stream with an error line.
    sh(&f, &id, "rm -r /tmp/r").await;
    loop {
        let line = lines.next().await;
        if line["type"] == "error" {
            let msg = line["message"].as_str().unwrap();
            assert!(
                msg.contains("watch /tmp/r: the watched directory was removed"),
                "{msg}"
            );
            break;
        }
        assert_eq!(line["type"], "event", "{line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn watch_refuses_what_it_cannot_watch() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    sh(&f, &id, "touch /tmp/file").await;
    let base = format!("/v1/sandboxes/{id}/files/watch");
    let (status, body) = get(&f, &format!("{base}?path=tmp")).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let (status, body) = get(&f, &format!("{base}?path=/tmp/nope")).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("watch /tmp/nope: no such file or directory"),
        "{body}"
    );
    let (status, body) = get(&f, &format!("{base}?path=/tmp/file")).await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    let (status, body) = get(&f, &format!("{base}?path=/tmp&recursive=maybe")).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
}
