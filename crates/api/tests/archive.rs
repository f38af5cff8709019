//! `GET`/`PUT /v1/sandboxes/{id}/archive`, in process: a tree (nested
//! directories, an empty one, a 5 MiB file, an executable, a symlink, an
//! mtime) comes out as a tar that says all of it and goes back in whole;
//! names that would leave the target directory, and entries the agent
//! cannot create, are refused by name with nothing written outside; the
//! errors of a missing or wrong path. Needs root (see `support`).

mod support;

use std::collections::BTreeMap;
use std::io::Read;

use axum::http::{Method, StatusCode};
use serde_json::{json, Value};
use support::{assert_error, call, create, fixture, raw, root_or_skip, sh, Fixture};

const BIG: usize = 5 << 20;

async fn get_archive(f: &Fixture, id: &str, path: &str) -> (StatusCode, String, Vec<u8>) {
    raw(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/archive?path={path}"),
        &f.key,
        None,
        Vec::new(),
    )
    .await
}

async fn put_archive(f: &Fixture, id: &str, path: &str, tar: Vec<u8>) -> (StatusCode, Value) {
    let (status, _, body) = raw(
        &f.app,
        Method::PUT,
        &format!("/v1/sandboxes/{id}/archive?path={path}"),
        &f.key,
        Some("application/x-tar"),
        tar,
    )
    .await;
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, body)
}

/// One entry of a tar, as the tests look at it.
#[derive(Debug)]
struct Item {
    kind: tar::EntryType,
    mode: u32,
    mtime: u64,
    link: Option<String>,
    data: Vec<u8>,
}

/// Every entry of an archive by name; fails on anything malformed.
fn entries(tar: &[u8]) -> BTreeMap<String, Item> {
    let mut archive = tar::Archive::new(tar);
    let mut out = BTreeMap::new();
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.expect("a well-formed entry");
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        let header = entry.header();
        let item = Item {
            kind: header.entry_type(),
            mode: header.mode().unwrap(),
            mtime: header.mtime().unwrap(),
            link: entry
                .link_name()
                .unwrap()
                .map(|l| l.to_string_lossy().into_owned()),
            data: {
                let mut d = Vec::new();
                entry.read_to_end(&mut d).unwrap();
                d
            },
        };
        assert!(out.insert(name.clone(), item).is_none(), "{name} twice");
    }
    out
}

/// A tar of `(name, contents)` files, names written as given: the `tar`
/// crate's own setters would refuse the hostile ones.
fn raw_tar(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tree_goes_out_as_a_tar_and_back_in_whole() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    sh(
        &f,
        &id,
        &format!(
            "mkdir -p /tmp/src/a/b /tmp/src/empty && printf hello > /tmp/src/a/b/hi.txt \
             && touch -d @1600000000 /tmp/src/a/b/hi.txt \
             && head -c {BIG} /dev/urandom > /tmp/src/big.bin \
             && printf '#!/bin/sh\\necho ran\\n' > /tmp/src/run.sh && chmod 755 /tmp/src/run.sh \
             && chmod 600 /tmp/src/a/b/hi.txt && ln -s a/b/hi.txt /tmp/src/link"
        ),
    )
    .await;

    let (status, ct, tar) = get_archive(&f, &id, "/tmp/src").await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&tar));
    assert_eq!(ct, "application/x-tar");
    let items = entries(&tar);
    let names: Vec<&str> = items.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "src",
            "src/a",
            "src/a/b",
            "src/a/b/hi.txt",
            "src/big.bin",
            "src/empty",
            "src/link",
            "src/run.sh"
        ]
    );
    use tar::EntryType as T;
    for dir in ["src", "src/a", "src/a/b", "src/empty"] {
        assert_eq!(items[dir].kind, T::Directory, "{dir}");
    }
    let hi = &items["src/a/b/hi.txt"];
    assert_eq!(
        (hi.kind, hi.mode, hi.mtime),
        (T::Regular, 0o600, 1_600_000_000)
    );
    assert_eq!(hi.data, b"hello");
    assert_eq!(items["src/run.sh"].mode, 0o755);
    assert_eq!(items["src/run.sh"].data, b"#!/bin/sh\necho ran\n");
    let link = &items["src/link"];
    assert_eq!(
        (link.kind, link.link.as_deref()),
        (T::Symlink, Some("a/b/hi.txt"))
    );
    let big = &items["src/big.bin"].data;
    assert_eq!(big.len(), BIG);
    let (status, _, direct) = raw(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path=/tmp/src/big.bin"),
        &f.key,
        None,
        Vec::new(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(*big == direct, "the archived file differs from the file");

    // One file: an archive of that file alone, under its name.
    let (status, _, one) = get_archive(&f, &id, "/tmp/src/run.sh").await;
    assert_eq!(status, StatusCode::OK);
    let one = entries(&one);
    assert_eq!(one.keys().collect::<Vec<_>>(), ["run.sh"]);

    // Back in, under another directory: the symlink cannot go (the agent
    // cannot make one) and is refused by name ...
    sh(&f, &id, "mkdir /tmp/dst /tmp/dst2").await;
    let (status, body) = put_archive(&f, &id, "/tmp/dst", tar.clone()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("\"src/link\"") && message.contains("symlink"),
        "{message}"
    );

    // ... so the same archive without it.
    let mut without = tar::Builder::new(Vec::new());
    let mut archive = tar::Archive::new(&tar[..]);
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        if entry.header().entry_type() != T::Symlink {
            let header = entry.header().clone();
            without.append(&header, entry).unwrap();
        }
    }
    let without = without.into_inner().unwrap();
    let (status, body) = put_archive(&f, &id, "/tmp/dst2", without).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({"path": "/tmp/dst2", "files": 3, "dirs": 4, "bytes": BIG + 5 + 19})
    );
    let tree = sh(
        &f,
        &id,
        "cd /tmp/dst2 && find . | sort && stat -c '%n %a' src/run.sh src/a/b/hi.txt \
         && cmp src/big.bin /tmp/src/big.bin && cat src/a/b/hi.txt && src/run.sh",
    )
    .await;
    assert_eq!(
        tree,
        ".\n./src\n./src/a\n./src/a/b\n./src/a/b/hi.txt\n./src/big.bin\n./src/empty\n\
         ./src/run.sh\nsrc/run.sh 755\nsrc/a/b/hi.txt 600\nhelloran\n"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_cannot_write_outside_its_directory() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    sh(&f, &id, "mkdir -p /tmp/t/in").await;

    for (name, says) in [
        ("../evil", "contains `..`"),
        ("in/../../evil", "contains `..`"),
        ("/tmp/abs-evil", "absolute"),
    ] {
        let (status, body) = put_archive(&f, &id, "/tmp/t/in", raw_tar(&[(name, b"x")])).await;
        assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{name:?}")) && message.contains(says),
            "{name}: {message}"
        );
    }
    // A good entry before a bad one is written; the bad one stops there.
    let (status, body) = put_archive(
        &f,
        &id,
        "/tmp/t/in",
        raw_tar(&[("ok.txt", b"ok"), ("../evil2", b"x"), ("after.txt", b"x")]),
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(body["message"].as_str().unwrap().contains("\"../evil2\""));

    // Entry types the agent cannot create, by name.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Link);
    h.set_size(0);
    b.append_link(&mut h, "hard", "ok.txt").unwrap();
    let (status, body) = put_archive(&f, &id, "/tmp/t/in", b.into_inner().unwrap()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("\"hard\" is a hard link"),
        "{body}"
    );

    let left = sh(
        &f,
        &id,
        "find /tmp/t | sort; ls /tmp/evil /tmp/evil2 /tmp/abs-evil /tmp/t/in/tmp 2>&1 | wc -l",
    )
    .await;
    assert_eq!(left, "/tmp/t\n/tmp/t/in\n/tmp/t/in/ok.txt\n4\n", "{left}");
}

#[tokio::test(flavor = "multi_thread")]
async fn archive_errors_say_what_is_wrong() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    sh(&f, &id, "mkdir /tmp/d && printf x > /tmp/f").await;
    let get = |path: &'static str| {
        let (f, id) = (&f, &id);
        async move {
            call(
                &f.app,
                Method::GET,
                &format!("/v1/sandboxes/{id}/archive?path={path}"),
                Some(&f.key),
                None,
            )
            .await
        }
    };

    let (status, body) = get("/tmp/nope").await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(
        body["message"],
        format!("no file or directory /tmp/nope in sandbox {id}")
    );
    let (status, body) = get("tmp/d").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(body["message"].as_str().unwrap().contains("absolute path"));
    let (status, body) = get("/tmp/d/..").await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");

    let (status, body) = put_archive(&f, &id, "/tmp/nope", raw_tar(&[])).await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .starts_with("no directory /tmp/nope in sandbox"),
        "{body}"
    );
    let (status, body) = put_archive(&f, &id, "/tmp/f", raw_tar(&[])).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("/tmp/f is not a directory"),
        "{body}"
    );
    let (status, body) = put_archive(&f, &id, "/tmp/d", vec![0x5a; 1500]).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("not a valid tar archive"),
        "{body}"
    );
    // Cut off inside a file: the file's bytes are missing, not made up.
    let mut cut = raw_tar(&[("whole.txt", &[b'y'; 4000])]);
    cut.truncate(512 + 1000);
    let (status, body) = put_archive(&f, &id, "/tmp/d", cut).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        body["message"].as_str().unwrap().contains("\"whole.txt\""),
        "{body}"
    );
    // No body at all is a mistake; an empty archive is nothing to do.
    let (status, body) = put_archive(&f, &id, "/tmp/d", Vec::new()).await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("the body is empty"),
        "{body}"
    );
    let (status, body) = put_archive(&f, &id, "/tmp/d", raw_tar(&[])).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["files"], 0);

    // Another tenant's key sees no sandbox.
    let (status, body) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/archive?path=/tmp/d"),
        Some(&f.other_key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
}
