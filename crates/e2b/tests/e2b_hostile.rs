//! Hostile clients against envd (the E2B data plane) over a real socket,
//! byte for byte as an attacker would send them: Connect envelopes that
//! are truncated, declare 4 GiB, carry the compressed or end-stream flag
//! where a message belongs, or come by the hundred thousand; multipart
//! uploads without a boundary, with a megabyte of part headers, or cut
//! off. Each is refused with Connect's or HTTP's error, promptly (a
//! refusal that waits for bytes the client never sends is a hang), and a
//! second sandbox on the same planes answers throughout.
//!
//! The parsers themselves are fuzzed (`fuzz/`, the `connect_envelope` and
//! `envd_messages` targets); this is the same input through a real
//! daemon's sockets. Needs root (real sandboxes); skips otherwise, fails
//! under BRIG_TEST_STRICT=1.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_core::SandboxId;
use brig_e2b::{E2bSandbox, E2bState};
use brig_test_support::{manager_fixture, serve, ManagerFixture};
use serde_json::{json, Value};
use support::{create, root_or_skip, sh};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "envd-hostile-token";
/// How long any refusal may take: far more than one should, far less than
/// a client that waits for a hung daemon would.
const LIMIT: Duration = Duration::from_secs(10);

/// Two sandboxes on one data plane: `a` takes the abuse, `b` must not
/// notice.
struct Two {
    f: ManagerFixture,
    a: String,
    b: String,
    data: SocketAddr,
}

async fn two() -> Two {
    let f = manager_fixture(|_| {});
    let tenant = f.manager.authenticate(&f.key).unwrap().tenant;
    let state = E2bState::new(Arc::clone(&f.manager));
    let (a, b) = (create(&f).await, create(&f).await);
    for id in [&a, &b] {
        state.sandboxes.insert(E2bSandbox {
            id: SandboxId::parse(id).unwrap(),
            tenant: tenant.clone(),
            template: "base".into(),
            access_token: TOKEN.into(),
            default_user: "root".into(),
            home: "/root".into(),
            workdir: None,
            lifecycle: Default::default(),
            env: BTreeMap::new(),
            metadata: BTreeMap::new(),
            allow_internet_access: None,
            network: None,
            traffic_token: None,
        });
    }
    let data = serve(brig_e2b::data_router(state)).await;
    Two { f, a, b, data }
}

/// An HTTP/1.1 request head for envd in sandbox `id`.
fn head(id: &str, path: &str, content_type: &str, length: Option<usize>) -> Vec<u8> {
    let length = match length {
        Some(n) => format!("content-length: {n}\r\n"),
        None => "transfer-encoding: chunked\r\n".to_string(),
    };
    format!(
        "POST {path} HTTP/1.1\r\nhost: envd\r\ne2b-sandbox-id: {id}\r\ne2b-sandbox-port: 49983\r\n\
         x-access-token: {TOKEN}\r\ncontent-type: {content_type}\r\n{length}connection: close\r\n\r\n"
    )
    .into_bytes()
}

/// Send `bytes`, then read the answer to its end within [`LIMIT`]:
/// (status, body with any chunked coding removed). The client's side
/// stays open (hyper takes a half-close for a client gone), so a request
/// whose body is not complete is one the daemon must answer without it.
async fn exchange(addr: SocketAddr, bytes: &[u8]) -> (u16, Vec<u8>) {
    let (mut sock, mut tx) = TcpStream::connect(addr).await.unwrap().into_split();
    // Written alongside the reading: a daemon that refuses early stops
    // reading, and may close, before the client has sent everything.
    let bytes = bytes.to_vec();
    let writer = tokio::spawn(async move {
        let _ = tx.write_all(&bytes).await;
        // Held open until the answer is read.
        std::future::pending::<()>().await;
        drop(tx);
    });
    let _writer = AbortOnDrop(writer);
    let mut raw = Vec::new();
    let started = Instant::now();
    // A response whose body is chunked ends with the zero chunk; read until
    // it or EOF, whichever comes first (a held request keeps the socket
    // open after the answer).
    loop {
        let mut buf = [0u8; 65536];
        let n = tokio::time::timeout(LIMIT.saturating_sub(started.elapsed()), sock.read(&mut buf))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no complete answer within {LIMIT:?}; got {:?}",
                    String::from_utf8_lossy(&raw)
                )
            })
            .unwrap_or(0);
        raw.extend_from_slice(&buf[..n]);
        if n == 0 || complete(&raw) {
            break;
        }
    }
    let at = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| {
            panic!(
                "the connection ended without an answer (a panic in the handler?): {:?}",
                String::from_utf8_lossy(&raw)
            )
        });
    let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut body = raw[at + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    (status, body)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn complete(raw: &[u8]) -> bool {
    let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..at]).to_ascii_lowercase();
    let body = &raw[at + 4..];
    if head.contains("transfer-encoding: chunked") {
        return body.ends_with(b"0\r\n\r\n");
    }
    head.lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .is_some_and(|n| body.len() >= n)
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = body.windows(2).position(|w| w == b"\r\n") {
        let n =
            usize::from_str_radix(std::str::from_utf8(&body[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&body[eol + 2..eol + 2 + n]);
        body = &body[eol + 2 + n + 2..];
    }
    out
}

fn envelope(flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![flags];
    out.extend((payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The envelopes of a streaming answer: (flags, message).
fn envelopes(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        out.push((body[0], serde_json::from_slice(&body[5..5 + len]).unwrap()));
        body = &body[5 + len..];
    }
    out
}

/// A streaming call's answer must be 200 and end with a Connect error of
/// `code` (and nothing else).
fn assert_stream_error(status: u16, body: &[u8], code: &str, case: &str) {
    assert_eq!(status, 200, "{case}: {}", String::from_utf8_lossy(body));
    let envs = envelopes(body);
    assert_eq!(envs.len(), 1, "{case}: {envs:?}");
    assert_eq!(envs[0].0, 2, "{case}: not an end-stream envelope: {envs:?}");
    assert_eq!(envs[0].1["error"]["code"], code, "{case}: {envs:?}");
}

impl Two {
    /// Sandbox `b`, through the same data plane, runs a command and says
    /// so: the abuse of `a` cost it nothing.
    async fn b_answers(&self, case: &str) {
        let started = Instant::now();
        let msg = json!({"process": {"cmd": "/bin/echo", "args": ["still here"]}, "stdin": false});
        let mut req = head(
            &self.b,
            "/process.Process/Start",
            "application/connect+json",
            None,
        );
        let body = envelope(0, msg.to_string().as_bytes());
        req.extend(format!("{:x}\r\n", body.len()).as_bytes());
        req.extend(&body);
        req.extend(b"\r\n0\r\n\r\n");
        let (status, body) = exchange(self.data, &req).await;
        assert_eq!(status, 200, "after {case}");
        let envs = envelopes(&body);
        let out: Vec<u8> = envs
            .iter()
            .filter_map(|(_, e)| e["event"]["data"]["stdout"].as_str())
            .flat_map(|s| {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.decode(s).unwrap()
            })
            .collect();
        assert_eq!(out, b"still here\n", "after {case}: {envs:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "after {case}, sandbox b took {:?} to run echo",
            started.elapsed()
        );
    }

    /// Sandbox `a` itself still works too: a refused request leaves its
    /// sandbox as it was.
    async fn a_answers(&self) {
        assert_eq!(sh(&self.f, &self.a, "echo ok").await, "ok\n");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_connect_envelopes_are_refused_promptly() {
    if !root_or_skip() {
        return;
    }
    let t = two().await;
    let start = json!({"process": {"cmd": "/bin/true"}}).to_string();
    let ct = "application/connect+json";

    // (case, method, body, expected Connect code) with an honest
    // Content-Length: the envelopes inside are what is wrong.
    let mut truncated = envelope(0, start.as_bytes());
    truncated.truncate(12);
    let mut huge = vec![0u8, 0xff, 0xff, 0xff, 0xff];
    huge.extend_from_slice(b"{\"process\":");
    let cases: Vec<(&str, &str, Vec<u8>, &str)> = vec![
        (
            "an envelope cut short",
            "Start",
            truncated.clone(),
            "invalid_argument",
        ),
        ("a prefix alone", "Start", vec![0, 0, 0], "invalid_argument"),
        (
            "a 4 GiB length prefix",
            "Start",
            huge.clone(),
            "resource_exhausted",
        ),
        (
            "the compressed flag",
            "Start",
            envelope(1, start.as_bytes()),
            "unimplemented",
        ),
        (
            "only an end-stream envelope",
            "Start",
            envelope(2, b"{}"),
            "invalid_argument",
        ),
        (
            "a message that is not JSON",
            "Start",
            envelope(0, b"\xff\xfe{{{"),
            "invalid_argument",
        ),
        (
            "a message nested 100000 deep",
            "Start",
            envelope(0, "[".repeat(100_000).as_bytes()),
            "invalid_argument",
        ),
        (
            "an envelope cut short",
            "StreamInput",
            truncated,
            "invalid_argument",
        ),
        (
            "a 4 GiB length prefix",
            "StreamInput",
            huge.clone(),
            "resource_exhausted",
        ),
        (
            "the compressed flag",
            "StreamInput",
            envelope(1, b"{\"keepalive\":{}}"),
            "unimplemented",
        ),
        (
            "data before start",
            "StreamInput",
            envelope(0, b"{\"data\":{\"input\":{\"stdin\":\"aGkK\"}}}"),
            "invalid_argument",
        ),
    ];
    for (case, method, body, code) in cases {
        let mut req = head(
            &t.a,
            &format!("/process.Process/{method}"),
            ct,
            Some(body.len()),
        );
        req.extend(&body);
        let (status, answer) = exchange(t.data, &req).await;
        let case = format!("{method}: {case}");
        assert_stream_error(status, &answer, code, &case);
        t.b_answers(&case).await;
    }

    // A client-streaming body whose first envelope declares 4 GiB, from a
    // client that then sends nothing more and never ends its body: the
    // prefix alone is refused, without waiting for the rest.
    let mut req = head(&t.a, "/process.Process/StreamInput", ct, None);
    req.extend(format!("{:x}\r\n", huge.len()).as_bytes());
    req.extend(&huge);
    req.extend(b"\r\n");
    let (status, answer) = exchange(t.data, &req).await;
    assert_stream_error(status, &answer, "resource_exhausted", "a held 4 GiB prefix");

    // A flood: 200,000 keepalive envelopes in one client stream (4.2 MB
    // of them, which a client sends in well under a second) are read
    // through, in bounded time, and answered as one stream. (The reader
    // once took seconds for them, quadratic in a chunk's envelopes;
    // connect.rs's unit test holds it to linear time.)
    let one = envelope(0, b"{\"keepalive\":{}}");
    let mut body = one.repeat(200_000);
    body.extend(envelope(2, b"{}"));
    let mut req = head(&t.a, "/process.Process/StreamInput", ct, Some(body.len()));
    req.extend(&body);
    let started = Instant::now();
    let (status, answer) = exchange(t.data, &req).await;
    assert_eq!(status, 200);
    let envs = envelopes(&answer);
    assert_eq!(
        envs,
        vec![(0, json!({})), (2, json!({}))],
        "the flood's answer"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "200,000 keepalives took {:?}",
        started.elapsed()
    );
    t.b_answers("a flood of keepalives").await;
    t.a_answers().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_multipart_uploads_are_refused_promptly() {
    if !root_or_skip() {
        return;
    }
    let t = two().await;
    let part =
        |headers: &str, data: &str| format!("--XbrigX\r\n{headers}\r\n\r\n{data}\r\n").into_bytes();
    let disposition = "Content-Disposition: form-data; name=\"file\"; filename=\"/tmp/up.txt\"";
    let good_part = part(disposition, "contents");
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        ("no boundary", "multipart/form-data", good_part.clone()),
        (
            "a boundary the body does not use",
            "multipart/form-data; boundary=other",
            [good_part.clone(), b"--XbrigX--\r\n".to_vec()].concat(),
        ),
        (
            "a part's headers that never end (the client holds on)",
            "multipart/form-data; boundary=XbrigX",
            format!(
                "--XbrigX\r\n{disposition}\r\nX-Pad: {}",
                "a".repeat(9 << 20)
            )
            .into_bytes(),
        ),
        (
            "a preamble that never reaches a boundary",
            "multipart/form-data; boundary=XbrigX",
            vec![b'-'; 9 << 20],
        ),
        (
            "ten thousand part headers",
            "multipart/form-data; boundary=XbrigX",
            [
                part(
                    &format!("{disposition}{}", "\r\nX-Pad: a".repeat(10_000)),
                    "x",
                ),
                b"--XbrigX--\r\n".to_vec(),
            ]
            .concat(),
        ),
        (
            "a body cut off inside a part",
            "multipart/form-data; boundary=XbrigX",
            good_part[..good_part.len() - 6].to_vec(),
        ),
        (
            "a part with no end of its headers",
            "multipart/form-data; boundary=XbrigX",
            format!("--XbrigX\r\n{disposition}\r\n").into_bytes(),
        ),
        (
            "no parts at all",
            "multipart/form-data; boundary=XbrigX",
            b"--XbrigX--\r\n".to_vec(),
        ),
    ];
    for (case, ct, body) in cases {
        // The endless ones declare more than they send, as a client still
        // sending would.
        let declared = if body.len() > 1 << 20 {
            1 << 40
        } else {
            body.len()
        };
        let mut req = head(&t.a, "/files?username=root", ct, Some(declared));
        req.extend(&body);
        let (status, answer) = exchange(t.data, &req).await;
        assert!(
            (400..500).contains(&status),
            "{case}: {status} {}",
            String::from_utf8_lossy(&answer)
        );
        t.b_answers(case).await;
    }
    t.a_answers().await;
}
