//! envd's Connect request messages (process.Process and
//! filesystem.Filesystem), decoded and checked as each handler does
//! before it reaches a sandbox, and their paths resolved for a user.
//!
//! The first byte picks the method and the content type; the rest is the
//! body. Properties: no method panics on any body; every path a
//! filesystem method would hand the agent is absolute and normalised (no
//! empty, `.` or `..` component), whatever the client sent.
#![no_main]

use axum::http::{header::CONTENT_TYPE, HeaderMap, HeaderValue};
use brig_e2b::envd::{filesystem, normalize, process, User};
use libfuzzer_sys::fuzz_target;

const PROCESS: [&str; 9] = [
    "Start",
    "Connect",
    "StreamInput",
    "List",
    "SendInput",
    "SendSignal",
    "CloseStdin",
    "Update",
    "Nope",
];
const FILESYSTEM: [&str; 9] = [
    "Stat",
    "MakeDir",
    "Remove",
    "Move",
    "ListDir",
    "CreateWatcher",
    "WatchDir",
    "GetWatcherEvents",
    "RemoveWatcher",
];
const CONTENT_TYPES: [&str; 4] = [
    "application/json",
    "application/connect+json",
    "",
    "application/proto",
];

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let mut headers = HeaderMap::new();
    let ct = CONTENT_TYPES[usize::from(sel >> 6)];
    if !ct.is_empty() {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    let method = usize::from(sel & 0x1f);
    if method < PROCESS.len() {
        let _ = process::check_request(PROCESS[method], &headers, body);
    } else {
        let user = User {
            name: "user".into(),
            uid: 1000,
            gid: 1000,
            home: "/home/user".into(),
        };
        let method = FILESYSTEM[(method - PROCESS.len()) % FILESYSTEM.len()];
        if let Ok(paths) = filesystem::check_request(method, &user, &headers, body) {
            for p in paths {
                assert!(p.starts_with('/'), "{p:?} is not absolute");
                assert!(
                    p == "/" || p[1..].split('/').all(|c| !matches!(c, "" | "." | "..")),
                    "{p:?} is not normalised"
                );
                assert_eq!(normalize(&p), p);
            }
        }
    }
});
