//! The E2B data plane's envd (port 49983) over a real socket: routing by
//! the `E2b-Sandbox-Id`/`E2b-Sandbox-Port` headers, the Connect protocol
//! driven by hand (unary JSON, streaming envelopes, end-stream, errors
//! before and after `start`, keepalives, `Connect-Timeout-Ms`, a client
//! leaving without killing its process), the filesystem service, and the
//! plain HTTP endpoints (`/files` with multipart, gzip and signatures).
//! Then the official Python SDK (e2b 2.63, and the older generation 2.48,
//! in the venvs tests/support sets up) against the same daemon, through
//! the real control plane: `tests/e2b/envd_sdk.py`.
//!
//! The sandbox is created with the manager and registered in the E2B
//! registry by the test, so this file does not depend on the control
//! plane's create path. Needs root (real sandboxes); skips otherwise, fails
//! under BRIG_TEST_STRICT=1.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use brig_core::{Isolation, SandboxId};
use brig_e2b::{E2bSandbox, E2bState};
use brig_test_support::{manager_fixture, serve, ManagerFixture};
use serde_json::{json, Value};
use support::{create_on, root_or_skip};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const TOKEN: &str = "envd-test-token";
const LIMIT: Duration = Duration::from_secs(20);

/// A sandbox registered with the E2B planes, both served on loopback.
struct Env {
    f: ManagerFixture,
    state: E2bState,
    id: String,
    data: SocketAddr,
    control: SocketAddr,
}

async fn env() -> Env {
    env_on(manager_fixture(|_| {}), Isolation::Process).await
}

/// [`env`] with its sandbox on the tier `isolation` of `f`.
async fn env_on(f: ManagerFixture, isolation: Isolation) -> Env {
    let id = create_on(&f, isolation).await;
    let tenant = f.manager.authenticate(&f.key).unwrap().tenant;
    let state = E2bState::new(Arc::clone(&f.manager));
    state.sandboxes.insert(E2bSandbox {
        id: SandboxId::parse(&id).unwrap(),
        tenant,
        template: "base".into(),
        access_token: TOKEN.into(),
        default_user: "root".into(),
        home: "/root".into(),
        workdir: None,
        lifecycle: Default::default(),
        env: BTreeMap::from([("SANDBOX_VAR".to_string(), "from-create".to_string())]),
        metadata: BTreeMap::new(),
        allow_internet_access: None,
        network: None,
        traffic_token: None,
    });
    let data = serve(brig_e2b::data_router(state.clone())).await;
    let control = serve(brig_e2b::control_router(state.clone())).await;
    Env {
        f,
        state,
        id,
        data,
        control,
    }
}

// ---- a minimal HTTP/1.1 client: enough to watch a stream arrive ----

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    chunked: bool,
    left: Option<usize>,
    buf: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The next piece of the body; `None` at its end.
    async fn chunk(&mut self) -> Option<Vec<u8>> {
        if self.chunked {
            let mut line = String::new();
            self.reader.read_line(&mut line).await.ok()?;
            let n = usize::from_str_radix(line.trim(), 16).ok()?;
            let mut data = vec![0; n + 2];
            self.reader.read_exact(&mut data).await.ok()?;
            data.truncate(n);
            (n > 0).then_some(data)
        } else {
            let left = self.left.unwrap_or(usize::MAX);
            if left == 0 {
                return None;
            }
            let mut data = vec![0; left.min(65536)];
            let n = self.reader.read(&mut data).await.ok()?;
            if n == 0 {
                return None;
            }
            data.truncate(n);
            self.left = self.left.map(|l| l - n);
            Some(data)
        }
    }

    async fn body(mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.buf);
        while let Some(c) = tokio::time::timeout(LIMIT, self.chunk()).await.unwrap() {
            out.extend(c);
        }
        out
    }

    async fn json(self) -> Value {
        let b = self.body().await;
        serde_json::from_slice(&b).unwrap_or_else(|_| json!(String::from_utf8_lossy(&b)))
    }

    /// The next Connect envelope: (flags, message).
    async fn envelope(&mut self) -> Option<(u8, Value)> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes(self.buf[1..5].try_into().unwrap()) as usize;
                if self.buf.len() >= 5 + len {
                    let flags = self.buf[0];
                    let v = serde_json::from_slice(&self.buf[5..5 + len]).unwrap();
                    self.buf.drain(..5 + len);
                    return Some((flags, v));
                }
            }
            let c = tokio::time::timeout(LIMIT, self.chunk()).await.unwrap()?;
            self.buf.extend(c);
        }
    }

    /// Every envelope to the end of the stream.
    async fn envelopes(&mut self) -> Vec<(u8, Value)> {
        let mut out = Vec::new();
        while let Some(e) = self.envelope().await {
            let end = e.0 & 2 != 0;
            out.push(e);
            if end {
                break;
            }
        }
        out
    }
}

async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    sock.write_all(head.as_bytes()).await.unwrap();
    sock.write_all(body).await.unwrap();
    let mut reader = BufReader::new(sock);
    let mut line = String::new();
    tokio::time::timeout(LIMIT, reader.read_line(&mut line))
        .await
        .unwrap()
        .unwrap();
    let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut headers = Vec::new();
    loop {
        let mut l = String::new();
        reader.read_line(&mut l).await.unwrap();
        let l = l.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let mut resp = Resp {
        status,
        headers,
        reader,
        chunked: false,
        left: None,
        buf: Vec::new(),
    };
    resp.chunked = resp
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"));
    resp.left = resp.header("content-length").and_then(|v| v.parse().ok());
    resp
}

fn envelope(v: &Value) -> Vec<u8> {
    let p = v.to_string();
    let mut out = vec![0];
    out.extend((p.len() as u32).to_be_bytes());
    out.extend(p.as_bytes());
    out
}

/// A signature as it goes in a query string.
fn query_escape(s: &str) -> String {
    s.replace('+', "%2B")
        .replace('/', "%2F")
        .replace('=', "%3D")
}

fn b64(s: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap())
        .unwrap()
}

impl Env {
    fn routed<'a>(&'a self, extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut h = vec![
            ("e2b-sandbox-id", self.id.as_str()),
            ("e2b-sandbox-port", "49983"),
            ("x-access-token", TOKEN),
        ];
        h.extend_from_slice(extra);
        h
    }

    async fn unary(&self, method: &str, body: Value) -> (u16, Value) {
        let h = self.routed(&[("content-type", "application/json")]);
        let r = request(self.data, "POST", method, &h, body.to_string().as_bytes()).await;
        let status = r.status;
        (status, r.json().await)
    }

    async fn stream(&self, method: &str, body: Value, extra: &[(&str, &str)]) -> Resp {
        let mut h = self.routed(&[("content-type", "application/connect+json")]);
        h.extend_from_slice(extra);
        let r = request(self.data, "POST", method, &h, &envelope(&body)).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/connect+json"));
        r
    }

    async fn run(&self, cmd: &str, extra: &[(&str, &str)]) -> Vec<(u8, Value)> {
        let body = json!({"process":{"cmd":"/bin/sh","args":["-c",cmd]},"stdin":false});
        self.stream("/process.Process/Start", body, extra)
            .await
            .envelopes()
            .await
    }
}

/// stdout joined, and the `end` event, of a finished process stream.
fn collect(events: &[(u8, Value)]) -> (String, String, Value) {
    let (mut out, mut err, mut end) = (Vec::new(), Vec::new(), Value::Null);
    for (_, e) in events {
        let ev = &e["event"];
        if let Some(d) = ev.get("data") {
            if let Some(s) = d.get("stdout").or(d.get("pty")) {
                out.extend(unb64(s));
            }
            if let Some(s) = d.get("stderr") {
                err.extend(unb64(s));
            }
        }
        if let Some(e) = ev.get("end") {
            end = e.clone();
        }
    }
    (
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
        end,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn routing_tokens_and_plain_endpoints() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    // Both routing headers are required.
    let r = request(e.data, "GET", "/health", &[], b"").await;
    assert_eq!(r.status, 400);
    // An unknown sandbox: exactly the body the SDKs key on.
    let h = [("e2b-sandbox-id", "nosuch"), ("e2b-sandbox-port", "49983")];
    let r = request(e.data, "GET", "/health", &h, b"").await;
    assert_eq!(r.status, 502);
    assert_eq!(
        r.json().await,
        json!({"sandboxId":"nosuch","message":"The sandbox was not found","code":502})
    );
    // /health needs no token.
    let h = [
        ("e2b-sandbox-id", e.id.as_str()),
        ("e2b-sandbox-port", "49983"),
    ];
    let r = request(e.data, "GET", "/health", &h, b"").await;
    assert_eq!(r.status, 204);
    // Everything else does.
    let r = request(e.data, "GET", "/envs", &h, b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.json().await,
        json!({"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"})
    );
    let bad = [
        ("e2b-sandbox-id", e.id.as_str()),
        ("e2b-sandbox-port", "49983"),
        ("x-access-token", "wrong"),
    ];
    assert_eq!(
        request(e.data, "POST", "/process.Process/List", &bad, b"{}")
            .await
            .status,
        401
    );
    let r = request(e.data, "GET", "/envs", &e.routed(&[]), b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json().await, json!({"SANDBOX_VAR":"from-create"}));
    let r = request(e.data, "GET", "/metrics", &e.routed(&[]), b"").await;
    assert_eq!(r.status, 200);
    let m = r.json().await;
    for k in [
        "ts",
        "cpu_count",
        "cpu_used_pct",
        "mem_total",
        "mem_used",
        "disk_used",
        "disk_total",
    ] {
        assert!(m.get(k).is_some(), "{k} in {m}");
    }
    // Another port with nothing listening.
    let h = [
        ("e2b-sandbox-id", e.id.as_str()),
        ("e2b-sandbox-port", "8123"),
    ];
    let r = request(e.data, "GET", "/", &h, b"").await;
    assert_eq!(r.status, 502);
    let body = r.json().await;
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("port is not open"),
        "{body}"
    );
    assert_eq!(body["port"], 8123);
    // Unknown RPC method: a Connect error.
    let (status, body) = e.unary("/process.Process/Nope", json!({})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (501, Some("unimplemented"))
    );
    // A killed sandbox is "not found" again.
    support::delete(&e.f, &e.id).await;
    let r = request(e.data, "GET", "/health", &e.routed(&[]), b"").await;
    assert_eq!(r.status, 502);
    drop(e.state);
}

#[tokio::test(flavor = "multi_thread")]
async fn start_streams_start_data_end_and_end_stream() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    let events = e
        .run(
            "echo out; echo err >&2; echo $SANDBOX_VAR $REQ_VAR; pwd; exit 3",
            &[],
        )
        .await;
    assert!(
        events[0].1["event"]["start"]["pid"].as_u64().unwrap() > 0,
        "{events:?}"
    );
    let (last_flags, last) = events.last().unwrap();
    assert_eq!((*last_flags, last), (2, &json!({})), "end-stream {{}} last");
    let (out, err, end) = collect(&events);
    assert_eq!(out, "out\nfrom-create\n/root\n");
    assert_eq!(err, "err\n");
    assert_eq!(end["exitCode"], 3);
    assert_eq!(end["exited"], true);
    assert_eq!(end["status"], "exit status 3");

    // Request envs on top of the sandbox's, cwd, and a scoped variable.
    let body = json!({"process":{"cmd":"/bin/sh","args":["-c","echo $SANDBOX_VAR $REQ_VAR; pwd"],
        "envs":{"REQ_VAR":"r","SANDBOX_VAR":"over"},"cwd":"/tmp"},"stdin":false});
    let events = e
        .stream("/process.Process/Start", body, &[])
        .await
        .envelopes()
        .await;
    let (out, _, end) = collect(&events);
    assert_eq!(out, "over r\n/tmp\n");
    assert_eq!(end.get("exitCode").map_or(0, |c| c.as_i64().unwrap()), 0);

    // An error before start: HTTP 200, only an end-stream with the error.
    let body = json!({"process":{"cmd":"/bin/true","cwd":"/no/such/dir"}});
    let events = e
        .stream("/process.Process/Start", body, &[])
        .await
        .envelopes()
        .await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, 2);
    assert_eq!(events[0].1["error"]["code"], "invalid_argument");
    assert_eq!(
        events[0].1["error"]["message"],
        "cwd '/no/such/dir' does not exist"
    );
    // A user that does not exist.
    let user = format!("Basic {}", b64(b"nosuchuser:"));
    let events = e.run("true", &[("authorization", &user)]).await;
    assert_eq!(
        events[0].1["error"]["code"], "unauthenticated",
        "{events:?}"
    );
    // Another user, from Authorization: Basic.
    let user = format!("Basic {}", b64(b"nobody:"));
    let events = e
        .run("id -un; echo $USER $LOGNAME", &[("authorization", &user)])
        .await;
    let (out, _, _) = collect(&events);
    assert_eq!(out, "nobody\nnobody nobody\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn keepalives_timeouts_and_disconnects() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    // Silence longer than the interval: keepalive events, then the end.
    let events = e
        .run("sleep 2.5; echo done", &[("keepalive-ping-interval", "1")])
        .await;
    let keepalives = events
        .iter()
        .filter(|(_, v)| v["event"].get("keepalive").is_some())
        .count();
    assert!(keepalives >= 1, "{events:?}");
    assert_eq!(collect(&events).0, "done\n");

    // Connect-Timeout-Ms bounds the process's life.
    let t = Instant::now();
    let events = e.run("sleep 30", &[("connect-timeout-ms", "1000")]).await;
    let (_, _, end) = collect(&events);
    assert_eq!(end["status"], "signal: killed", "{events:?}");
    assert_eq!(end["exited"], false);
    assert!(t.elapsed() < Duration::from_secs(10));

    // A client leaving does not kill its process; Connect re-attaches.
    let body =
        json!({"process":{"cmd":"/bin/sh","args":["-c","sleep 1.5; echo alive"]},"stdin":false});
    let mut r = e.stream("/process.Process/Start", body, &[]).await;
    let (_, start) = r.envelope().await.unwrap();
    let pid = start["event"]["start"]["pid"].as_u64().unwrap();
    drop(r);
    let (status, list) = e.unary("/process.Process/List", json!({})).await;
    assert_eq!(status, 200);
    let listed: Vec<u64> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert!(listed.contains(&pid), "{list}");
    assert_eq!(list["processes"][0]["config"]["cmd"], "/bin/sh");
    let events = e
        .stream(
            "/process.Process/Connect",
            json!({"process":{"pid":pid}}),
            &[],
        )
        .await
        .envelopes()
        .await;
    assert_eq!(events[0].1["event"]["start"]["pid"], pid);
    let (out, _, end) = collect(&events);
    assert_eq!(out, "alive\n");
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0);
    // After its end, a late Connect still gets start + end.
    let events = e
        .stream(
            "/process.Process/Connect",
            json!({"process":{"pid":pid}}),
            &[],
        )
        .await
        .envelopes()
        .await;
    assert!(collect(&events).2.is_object(), "{events:?}");
    // An unknown pid.
    let events = e
        .stream(
            "/process.Process/Connect",
            json!({"process":{"pid":999999}}),
            &[],
        )
        .await
        .envelopes()
        .await;
    assert_eq!(events[0].1["error"]["code"], "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn stdin_signals_and_pty() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    // SendInput, then CloseStdin ends cat.
    let body = json!({"process":{"cmd":"cat"},"stdin":true});
    let mut r = e.stream("/process.Process/Start", body, &[]).await;
    let pid = r.envelope().await.unwrap().1["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    let (s, _) = e
        .unary(
            "/process.Process/SendInput",
            json!({"process":{"pid":pid},"input":{"stdin":b64(b"hi\n")}}),
        )
        .await;
    assert_eq!(s, 200);
    let (_, ev) = r.envelope().await.unwrap();
    assert_eq!(unb64(&ev["event"]["data"]["stdout"]), b"hi\n");
    // StreamInput: start, then data messages, in one chunked body.
    let mut body = envelope(&json!({"start":{"process":{"pid":pid}}}));
    body.extend(envelope(&json!({"data":{"input":{"stdin":b64(b"a")}}})));
    body.extend(envelope(&json!({"data":{"input":{"stdin":b64(b"b\n")}}})));
    let h = e.routed(&[("content-type", "application/connect+json")]);
    let mut si = request(e.data, "POST", "/process.Process/StreamInput", &h, &body).await;
    assert_eq!(si.status, 200);
    let answer = si.envelopes().await;
    assert_eq!(answer, vec![(0, json!({})), (2, json!({}))]);
    let (s, _) = e
        .unary(
            "/process.Process/CloseStdin",
            json!({"process":{"pid":pid}}),
        )
        .await;
    assert_eq!(s, 200);
    let (out, _, end) = collect(&r.envelopes().await);
    assert_eq!(out, "ab\n");
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0);

    // SendSignal SIGKILL by tag's pid; then NOT_FOUND for the dead process.
    let body = json!({"process":{"cmd":"sleep","args":["30"]},"tag":"sleeper","stdin":false});
    let mut r = e.stream("/process.Process/Start", body, &[]).await;
    let pid = r.envelope().await.unwrap().1["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    let (_, list) = e.unary("/process.Process/List", json!({})).await;
    assert!(
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["tag"] == "sleeper"),
        "{list}"
    );
    let (s, _) = e
        .unary(
            "/process.Process/SendSignal",
            json!({"process":{"tag":"sleeper"},"signal":"SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!(s, 200);
    let (_, _, end) = collect(&r.envelopes().await);
    assert_eq!(end["status"], "signal: killed");
    let (s, body) = e
        .unary(
            "/process.Process/SendSignal",
            json!({"process":{"pid":pid},"signal":"SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!((s, body["code"].as_str()), (404, Some("not_found")));

    // A PTY: output as data.pty, resize, input.
    let body = json!({"process":{"cmd":"/bin/sh","args":["-i"],"envs":{"TERM":"xterm"}},
        "pty":{"size":{"cols":80,"rows":24}}});
    let mut r = e.stream("/process.Process/Start", body, &[]).await;
    let pid = r.envelope().await.unwrap().1["event"]["start"]["pid"]
        .as_u64()
        .unwrap();
    let (s, _) = e
        .unary(
            "/process.Process/Update",
            json!({"process":{"pid":pid},"pty":{"size":{"cols":100,"rows":30}}}),
        )
        .await;
    assert_eq!(s, 200);
    let input = b64(b"stty size; exit 7\n");
    let (s, _) = e
        .unary(
            "/process.Process/SendInput",
            json!({"process":{"pid":pid},"input":{"pty":input}}),
        )
        .await;
    assert_eq!(s, 200);
    let events = r.envelopes().await;
    let (out, _, end) = collect(&events);
    assert!(out.contains("30 100"), "{out:?}");
    assert!(events
        .iter()
        .any(|(_, v)| v["event"]["data"].get("pty").is_some()));
    assert_eq!(end["exitCode"], 7);
}

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_service() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    let fs = |m: &str| format!("/filesystem.Filesystem/{m}");
    let (s, body) = e
        .unary(&fs("MakeDir"), json!({"path":"/tmp/e2b/a/b"}))
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(body["entry"]["path"], "/tmp/e2b/a/b");
    assert!(body["entry"]["permissions"]
        .as_str()
        .unwrap()
        .starts_with('d'));
    let (s, body) = e
        .unary(&fs("MakeDir"), json!({"path":"/tmp/e2b/a/b"}))
        .await;
    assert_eq!((s, body["code"].as_str()), (409, Some("already_exists")));
    support::sh(
        &e.f,
        &e.id,
        "echo hello > /tmp/e2b/a/f.txt; ln -s f.txt /tmp/e2b/a/link",
    )
    .await;
    let (s, body) = e
        .unary(&fs("Stat"), json!({"path":"/tmp/e2b/a/f.txt"}))
        .await;
    assert_eq!(s, 200);
    let entry = &body["entry"];
    assert_eq!(entry["name"], "f.txt");
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["size"], "6");
    assert_eq!(entry["permissions"], "-rw-r--r--");
    assert!(
        entry["modifiedTime"].as_str().unwrap().ends_with('Z'),
        "{entry}"
    );
    let (s, body) = e
        .unary(&fs("Stat"), json!({"path":"/tmp/e2b/a/link"}))
        .await;
    assert_eq!(s, 200);
    assert_eq!(body["entry"]["type"], "FILE_TYPE_SYMLINK");
    // envd reports the target as an absolute path.
    assert_eq!(body["entry"]["symlinkTarget"], "/tmp/e2b/a/f.txt");
    let (s, body) = e.unary(&fs("Stat"), json!({"path":"/tmp/e2b/none"})).await;
    assert_eq!((s, body["code"].as_str()), (404, Some("not_found")));
    // Depth 1 (the default), then 2.
    let names = |v: &Value| {
        let mut n: Vec<String> = v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    let (_, body) = e.unary(&fs("ListDir"), json!({"path":"/tmp/e2b"})).await;
    assert_eq!(names(&body), ["/tmp/e2b/a"]);
    let (_, body) = e
        .unary(&fs("ListDir"), json!({"path":"/tmp/e2b","depth":2}))
        .await;
    assert_eq!(
        names(&body),
        [
            "/tmp/e2b/a",
            "/tmp/e2b/a/b",
            "/tmp/e2b/a/f.txt",
            "/tmp/e2b/a/link"
        ]
    );
    // Relative paths resolve against the user's home (root's here).
    let (s, body) = e.unary(&fs("MakeDir"), json!({"path":"rel-dir"})).await;
    assert_eq!(s, 200);
    assert_eq!(body["entry"]["path"], "/root/rel-dir");
    let (s, body) = e
        .unary(
            &fs("Move"),
            json!({"source":"/tmp/e2b/a/f.txt","destination":"/tmp/e2b/g.txt"}),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(body["entry"]["path"], "/tmp/e2b/g.txt");
    let (s, _) = e.unary(&fs("Remove"), json!({"path":"/tmp/e2b/a"})).await;
    assert_eq!(s, 200);
    let (s, _) = e.unary(&fs("Stat"), json!({"path":"/tmp/e2b/a"})).await;
    assert_eq!(s, 404);
    // Again, now that it is gone: no error, as envd's os.RemoveAll.
    let (s, body) = e.unary(&fs("Remove"), json!({"path":"/tmp/e2b/a"})).await;
    assert_eq!((s, body), (200, json!({})));

    // Polling watchers.
    let (s, body) = e
        .unary(&fs("CreateWatcher"), json!({"path":"/tmp/e2b"}))
        .await;
    assert_eq!(s, 200, "{body}");
    let wid = body["watcherId"].as_str().unwrap().to_string();
    support::sh(&e.f, &e.id, "echo x > /tmp/e2b/new.txt").await;
    let mut events = Vec::new();
    for _ in 0..50 {
        let (_, body) = e
            .unary(&fs("GetWatcherEvents"), json!({"watcherId":wid}))
            .await;
        events.extend(body["events"].as_array().unwrap().clone());
        if events.iter().any(|ev| ev["type"] == "EVENT_TYPE_WRITE") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        events
            .iter()
            .any(|ev| ev["name"] == "new.txt" && ev["type"] == "EVENT_TYPE_CREATE"),
        "{events:?}"
    );
    let (s, _) = e
        .unary(&fs("RemoveWatcher"), json!({"watcherId":wid}))
        .await;
    assert_eq!(s, 200);
    let (s, _) = e
        .unary(&fs("GetWatcherEvents"), json!({"watcherId":wid}))
        .await;
    assert_eq!(s, 404);

    // The streaming watch: {"start":{}} first, then events.
    let mut r = e
        .stream(
            &fs("WatchDir"),
            json!({"path":"/tmp/e2b","includeEntry":true}),
            &[],
        )
        .await;
    assert_eq!(r.envelope().await.unwrap(), (0, json!({"start":{}})));
    support::sh(&e.f, &e.id, "mkdir /tmp/e2b/sub").await;
    let (_, ev) = r.envelope().await.unwrap();
    assert_eq!(ev["filesystem"]["name"], "sub", "{ev}");
    assert_eq!(ev["filesystem"]["type"], "EVENT_TYPE_CREATE");
    assert_eq!(ev["filesystem"]["entry"]["type"], "FILE_TYPE_DIRECTORY");
    // A missing directory: an end-stream error.
    let events = e
        .stream(&fs("WatchDir"), json!({"path":"/tmp/nope"}), &[])
        .await
        .envelopes()
        .await;
    assert_eq!(events[0].1["error"]["code"], "not_found", "{events:?}");
}

/// A watched directory that is removed, then made again, as envd
/// (fsnotify) reports it: a `REMOVE` of "." and then nothing, no error
/// (the stream stays open; polls answer empty), and the new directory of
/// the same name is not watched.
#[tokio::test(flavor = "multi_thread")]
async fn a_removed_watched_directory_reads_as_envd_s() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    let fs = |m: &str| format!("/filesystem.Filesystem/{m}");
    support::sh(&e.f, &e.id, "mkdir -p /tmp/wd /tmp/wp").await;
    let mut r = e
        .stream(&fs("WatchDir"), json!({"path":"/tmp/wd"}), &[])
        .await;
    assert_eq!(r.envelope().await.unwrap(), (0, json!({"start":{}})));
    let (s, body) = e
        .unary(&fs("CreateWatcher"), json!({"path":"/tmp/wp"}))
        .await;
    assert_eq!(s, 200, "{body}");
    let wid = body["watcherId"].as_str().unwrap().to_string();

    support::sh(&e.f, &e.id, "rmdir /tmp/wd /tmp/wp").await;
    let (flags, ev) = r.envelope().await.unwrap();
    assert_eq!(flags, 0, "not the end of the stream: {ev}");
    assert_eq!(
        ev["filesystem"],
        json!({"name": ".", "type": "EVENT_TYPE_REMOVE"})
    );
    let mut seen = Vec::new();
    for _ in 0..50 {
        let (s, body) = e
            .unary(&fs("GetWatcherEvents"), json!({"watcherId": wid}))
            .await;
        assert_eq!(s, 200, "no error after the removal: {body}");
        seen.extend(body["events"].as_array().unwrap().clone());
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(
        seen,
        vec![json!({"name": ".", "type": "EVENT_TYPE_REMOVE"})]
    );

    // Made again, with a file in it: nothing on either watch.
    support::sh(
        &e.f,
        &e.id,
        "mkdir /tmp/wd /tmp/wp; touch /tmp/wd/f /tmp/wp/f",
    )
    .await;
    let quiet = tokio::time::timeout(std::time::Duration::from_millis(700), r.envelope()).await;
    assert!(quiet.is_err(), "an event after the removal: {quiet:?}");
    let (s, body) = e
        .unary(&fs("GetWatcherEvents"), json!({"watcherId": wid}))
        .await;
    assert_eq!((s, body), (200, json!({"events": []})));
}

#[tokio::test(flavor = "multi_thread")]
async fn files_endpoint() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    // Multipart: filenames are full paths; parents are created.
    let boundary = "XbrigX";
    let mut body = Vec::new();
    for (path, data) in [
        ("/tmp/up/one.txt", "first"),
        ("/tmp/up/deep/two.txt", "second"),
    ] {
        body.extend(
            format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n{data}\r\n"
        )
            .as_bytes(),
        );
    }
    body.extend(format!("--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/form-data; boundary={boundary}");
    let r = request(
        e.data,
        "POST",
        "/files",
        &e.routed(&[("content-type", &ct)]),
        &body,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json().await,
        json!([{"path":"/tmp/up/one.txt","name":"one.txt","type":"file"},
               {"path":"/tmp/up/deep/two.txt","name":"two.txt","type":"file"}])
    );
    let r = request(
        e.data,
        "GET",
        "/files?path=%2Ftmp%2Fup%2Fdeep%2Ftwo.txt",
        &e.routed(&[]),
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.body().await, b"second");
    // Raw body with Content-Encoding: gzip.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, b"zipped contents").unwrap();
    let gz = gz.finish().unwrap();
    let h = e.routed(&[
        ("content-type", "application/octet-stream"),
        ("content-encoding", "gzip"),
    ]);
    let r = request(e.data, "POST", "/files?path=/tmp/up/z.txt", &h, &gz).await;
    assert_eq!(r.status, 200);
    // Download with Accept-Encoding: gzip.
    let r = request(
        e.data,
        "GET",
        "/files?path=/tmp/up/z.txt",
        &e.routed(&[("accept-encoding", "gzip")]),
        b"",
    )
    .await;
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    let mut plain = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(&r.body().await[..]),
        &mut plain,
    )
    .unwrap();
    assert_eq!(plain, "zipped contents");
    // Missing: 404 JSON; a directory: 400.
    let r = request(
        e.data,
        "GET",
        "/files?path=/tmp/up/nope",
        &e.routed(&[]),
        b"",
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json().await,
        json!({"code":404,"message":"path '/tmp/up/nope' does not exist"})
    );
    let r = request(e.data, "GET", "/files?path=/tmp/up", &e.routed(&[]), b"").await;
    assert_eq!(r.status, 400);
    // Signed URL, no token: valid, wrong, expired.
    let h = [
        ("e2b-sandbox-id", e.id.as_str()),
        ("e2b-sandbox-port", "49983"),
    ];
    let sig = query_escape(&brig_e2b::envd::files::signature(
        "/tmp/up/one.txt",
        "read",
        "",
        TOKEN,
        None,
    ));
    let r = request(
        e.data,
        "GET",
        &format!("/files?path=/tmp/up/one.txt&signature={sig}"),
        &h,
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body().await, b"first");
    let r = request(
        e.data,
        "GET",
        "/files?path=/tmp/up/one.txt&signature=v1_bad",
        &h,
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    let sig = brig_e2b::envd::files::signature("/tmp/up/one.txt", "read", "", TOKEN, Some(1));
    let r = request(
        e.data,
        "GET",
        &format!("/files?path=/tmp/up/one.txt&signature={sig}&signature_expiration=1"),
        &h,
        b"",
    )
    .await;
    assert_eq!(
        r.json().await,
        json!({"code":401,"message":"signature is already expired"})
    );
    let r = request(e.data, "GET", "/files?path=/tmp/up/one.txt", &h, b"").await;
    assert_eq!(r.status, 401);
    // download_url() names no sandbox: the signature finds it.
    let sig = query_escape(&brig_e2b::envd::files::signature(
        "/tmp/up/one.txt",
        "read",
        "",
        TOKEN,
        None,
    ));
    let url = format!("/files?path=/tmp/up/one.txt&signature={sig}");
    let r = request(e.data, "GET", &url, &[], b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body().await, b"first");
    let r = request(
        e.data,
        "GET",
        "/files?path=/tmp/up/one.txt&signature=v1_x",
        &[],
        b"",
    )
    .await;
    assert_eq!(r.status, 400);
    // Uploads as another user are owned by that user.
    let h = e.routed(&[("content-type", "application/octet-stream")]);
    let r = request(
        e.data,
        "POST",
        "/files?path=/tmp/owned/x.txt&username=nobody",
        &h,
        b"x",
    )
    .await;
    assert_eq!(r.status, 200);
    let owners = support::sh(&e.f, &e.id, "stat -c %U /tmp/owned /tmp/owned/x.txt").await;
    assert_eq!(owners, "nobody\nnobody\n");
}

/// The venv with the current official SDK (tests/support/install-python-deps.sh).
fn sdk_python() -> Option<std::path::PathBuf> {
    sdk_python_in("e2b-venv")
}

/// The python of the test cache's `venv` (`$BRIG_TEST_CACHE`, else
/// ~/.cache/brig-test); `None` (a skip, a failure under
/// BRIG_TEST_STRICT=1) if it is missing.
fn sdk_python_in(venv: &str) -> Option<std::path::PathBuf> {
    let py = support::venv(venv);
    if py.exists() {
        return Some(py);
    }
    support::skip(&format!(
        "{} is missing: run tests/support/install-python-deps.sh",
        py.display()
    ));
    None
}

/// Run `tests/e2b/{script} SANDBOX_ID` with `python` against `e`'s planes,
/// within `limit`; its output. Blocking on a thread of its own: the
/// daemon's runtime keeps serving on its other workers.
async fn run_script(
    python: std::path::PathBuf,
    script: &str,
    e: &Env,
    limit: Duration,
) -> std::process::Output {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/e2b")
        .join(script);
    let (id, key) = (e.id.clone(), e.f.key.clone());
    let (api, sandbox) = (
        format!("http://{}", e.control),
        format!("http://{}", e.data),
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(&script)
            .arg(&id)
            .env("E2B_API_KEY", key)
            .env("E2B_API_URL", api)
            .env("E2B_SANDBOX_URL", sandbox)
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN")
            .output()
    });
    tokio::time::timeout(limit, out)
        .await
        .expect("the SDK script finishes")
        .unwrap()
        .unwrap()
}

/// Run `tests/e2b/envd_sdk.py` with the SDK of `venv` (which must be e2b
/// `version`) against a registered sandbox; it must pass exactly `checks`
/// checks (each generation has its own count: features an older client
/// lacks are skipped with a printed note).
async fn run_envd_sdk(venv: &str, version: &str, checks: usize) {
    if !root_or_skip() {
        return;
    }
    let Some(python) = sdk_python_in(venv) else {
        return;
    };
    let e = env().await;
    let out = run_script(python, "envd_sdk.py", &e, Duration::from_secs(240)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let first = format!("e2b {version}");
    assert!(
        stdout.lines().next() == Some(first.as_str()),
        "the venv's e2b is not {version}: {stdout}"
    );
    let want = format!("{checks} passed, 0 failed");
    assert!(
        stdout.lines().any(|l| l == want),
        "want {want:?}:\n{stdout}"
    );
}

/// The current client, e2b 2.63: commands, PTY, files, watches, signed URLs.
#[tokio::test(flavor = "multi_thread")]
async fn official_python_sdk() {
    run_envd_sdk("e2b-venv", "2.63.0", 116).await;
}

/// The same suite, unchanged, against a sandbox on the gvisor tier: the
/// same agent answers under gVisor's kernel, so every check holds there.
#[tokio::test(flavor = "multi_thread")]
async fn official_python_sdk_on_gvisor() {
    if !root_or_skip() {
        return;
    }
    let Some(python) = sdk_python_in("e2b-venv") else {
        return;
    };
    let Some(f) = brig_test_support::gvisor_manager_fixture(|_| {}) else {
        return;
    };
    let e = env_on(f, Isolation::Gvisor).await;
    let kernel = support::sh(&e.f, &e.id, "dmesg | head -1").await;
    assert!(kernel.contains("gVisor"), "not under gVisor: {kernel}");
    let out = run_script(python, "envd_sdk.py", &e, Duration::from_secs(400)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.lines().any(|l| l == "116 passed, 0 failed"),
        "{stdout}"
    );
}

/// The same suite, unchanged, against a vm sandbox (the test rootfs in a
/// QEMU guest with its own kernel): the same agent answers as the guest's
/// init.
#[tokio::test(flavor = "multi_thread")]
async fn official_python_sdk_on_vm() {
    if !root_or_skip() {
        return;
    }
    let Some(python) = sdk_python_in("e2b-venv") else {
        return;
    };
    let Some(rootfs) = brig_test_support::rootfs_or_skip() else {
        return;
    };
    let Some(f) = brig_test_support::vm_manager_fixture(|c| {
        c.template_roots = rootfs.parent().map(Into::into).into_iter().collect();
    }) else {
        return;
    };
    let e = env_on(f, Isolation::Vm).await;
    let kernel = support::sh(&e.f, &e.id, "uname -r").await;
    assert!(
        kernel.trim().ends_with("-cloud-amd64"),
        "not in a guest: {kernel}"
    );
    let out = run_script(python, "envd_sdk.py", &e, Duration::from_secs(400)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.lines().any(|l| l == "116 passed, 0 failed"),
        "{stdout}"
    );
}

/// The older generation, e2b 2.48 (the v1 create path; no
/// `commands.stream_input`, so one check fewer).
#[tokio::test(flavor = "multi_thread")]
async fn official_python_sdk_2_48() {
    run_envd_sdk("e2b-venv-2.48", "2.48.0", 115).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sandbox_ending_ends_its_streams() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    let body = json!({"process":{"cmd":"sleep","args":["30"]},"stdin":false});
    let mut r = e.stream("/process.Process/Start", body, &[]).await;
    assert!(r.envelope().await.unwrap().1["event"]["start"].is_object());
    let mut w = e
        .stream(
            "/filesystem.Filesystem/WatchDir",
            json!({"path":"/tmp"}),
            &[],
        )
        .await;
    assert_eq!(w.envelope().await.unwrap().1, json!({"start":{}}));
    support::delete(&e.f, &e.id).await;
    // Both streams end (no hang). The process's, as E2B's proxy ends it
    // when a sandbox goes away mid-command: no `end` event (that would
    // read as the process's exit, code -1), an `unavailable` end-stream
    // error instead, which the clients turn into their killed-sandbox
    // error after a /health probe that now answers 502 "was not found".
    let events = r.envelopes().await;
    let (flags, last) = events.last().unwrap();
    assert_eq!(*flags, 2, "{events:?}");
    assert_eq!(last["error"]["code"], "unavailable", "{events:?}");
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ended before the stream completed"),
        "{events:?}"
    );
    assert!(collect(&events).2.is_null(), "an end event: {events:?}");
    let health = request(e.data, "GET", "/health", &e.routed(&[]), b"").await;
    assert_eq!(health.status, 502);
    let said = String::from_utf8_lossy(&health.body().await).into_owned();
    assert!(said.contains("was not found"), "{said}");
    let events = w.envelopes().await;
    assert_eq!(events.last().map(|e| e.0), Some(2), "{events:?}");
}

/// envd's process environment: PATH, then the user's HOME, USER and
/// LOGNAME, then the sandbox's variables, then the request's (last wins);
/// and the user's supplementary groups from the sandbox's /etc/group.
#[tokio::test(flavor = "multi_thread")]
async fn process_environment_and_groups() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    let nobody = format!("Basic {}", b64(b"nobody:"));
    let events = e
        .run(
            "id -u; echo \"$PATH|$HOME|$USER|$LOGNAME|$SANDBOX_VAR\"",
            &[("authorization", &nobody)],
        )
        .await;
    let (out, err, end) = collect(&events);
    assert_eq!(end["exitCode"].as_i64().unwrap_or(0), 0, "{end} {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "65534", "{out}");
    let vars: Vec<&str> = lines[1].split('|').collect();
    assert!(vars[0].split(':').any(|d| d == "/usr/bin"), "PATH: {out}");
    assert_eq!(
        &vars[1..],
        ["/nonexistent", "nobody", "nobody", "from-create"],
        "{out}"
    );
    // Supplementary groups: a user that some group of the sandbox's
    // /etc/group lists as a member (this sandbox's /etc is the host's,
    // read-only; crates/agent/tests/sandboxed.rs writes its own).
    let found = support::sh(
        &e.f,
        &e.id,
        "for line in $(grep -E '^[^:]+:[^:]*:[0-9]+:[^:]+$' /etc/group); do            gid=$(echo $line | cut -d: -f3);            for m in $(echo $line | cut -d: -f4 | tr , ' '); do              if grep -q \"^$m:\" /etc/passwd; then echo \"$m $gid\"; exit 0; fi;            done;          done",
    )
    .await;
    match found.split_whitespace().collect::<Vec<_>>()[..] {
        [member, gid] => {
            let auth = format!("Basic {}", b64(format!("{member}:").as_bytes()));
            let events = e.run("id -G", &[("authorization", &auth)]).await;
            let (out, err, _) = collect(&events);
            assert!(
                out.split_whitespace().any(|g| g == gid),
                "{member} is in group {gid}: {out} {err}"
            );
        }
        _ => eprintln!(
            "note: no group in this sandbox's /etc/group lists a member;              supplementary groups are checked in crates/agent/tests/sandboxed.rs"
        ),
    }
    // The request's variables come last and win, over the user's and the
    // sandbox's alike; they do not stay for the next command.
    let body = json!({
        "process": {
            "cmd": "/bin/sh",
            "args": ["-c", "echo \"$HOME|$USER|$SANDBOX_VAR|$PATH\""],
            "envs": {"HOME": "/tmp", "USER": "someone", "SANDBOX_VAR": "mine", "PATH": "/bin"},
        },
        "stdin": false,
    });
    let events = e
        .stream("/process.Process/Start", body, &[])
        .await
        .envelopes()
        .await;
    assert_eq!(collect(&events).0, "/tmp|someone|mine|/bin\n");
    let events = e.run("echo \"$HOME|$USER|$SANDBOX_VAR\"", &[]).await;
    assert_eq!(collect(&events).0, "/root|root|from-create\n");
}

/// A raw POST /files as `user`, with extra (`X-Metadata-*`) headers.
async fn upload(e: &Env, path: &str, user: &str, meta: &[(&str, &str)], data: &[u8]) -> Resp {
    let mut h = e.routed(&[("content-type", "application/octet-stream")]);
    h.extend_from_slice(meta);
    let q = format!("/files?path={}&username={user}", query_escape(path));
    request(e.data, "POST", &q, &h, data).await
}

/// EntryInfo's owner and group (names, or the id without one), symlinks,
/// and file metadata: set by upload headers, validated, replaced on
/// overwrite, surfaced by Stat, ListDir, Move and the upload's answer.
#[tokio::test(flavor = "multi_thread")]
async fn entry_owners_symlinks_and_metadata() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    let fs = |m: &str| format!("/filesystem.Filesystem/{m}");
    // Both of a sandbox's writable places: /tmp and the root's layer (as
    // root: a write as a user is checked as that user's, and nobody may
    // not enter /root).
    for (dir, user, group) in [
        ("/tmp/meta", "nobody", "nogroup"),
        ("/root/meta", "root", "root"),
    ] {
        let path = format!("{dir}/a.txt");
        let r = upload(
            &e,
            &path,
            user,
            &[("X-Metadata-Author", "mish"), ("x-metadata-tag", "a b")],
            b"hello",
        )
        .await;
        let status = r.status;
        let body = r.json().await;
        if status == 501 {
            let reason = format!(
                "the sandbox's filesystem at {dir} has no user extended attributes \
                 (tmpfs has them from Linux 6.6): {body}"
            );
            brig_test_support::skip(&reason);
            return;
        }
        assert_eq!(status, 200, "{dir}: {body}");
        let want = json!({"author": "mish", "tag": "a b"});
        assert_eq!(
            body,
            json!([{"path": path, "name": "a.txt", "type": "file", "metadata": want}]),
            "{dir}"
        );
        let (s, body) = e.unary(&fs("Stat"), json!({ "path": path })).await;
        assert_eq!(s, 200, "{body}");
        let entry = &body["entry"];
        assert_eq!(entry["metadata"], want, "{dir}: {entry}");
        assert_eq!(
            (&entry["owner"], &entry["group"]),
            (&json!(user), &json!(group)),
            "{entry}"
        );
        let (s, body) = e.unary(&fs("ListDir"), json!({ "path": dir })).await;
        assert_eq!(s, 200, "{body}");
        assert_eq!(body["entries"][0]["metadata"], want, "{body}");
        // Overwriting replaces the whole set: fewer keys, then none.
        let r = upload(&e, &path, user, &[("x-metadata-tag", "b")], b"x").await;
        assert_eq!(r.json().await[0]["metadata"], json!({"tag": "b"}));
        let r = upload(&e, &path, user, &[], b"y").await;
        let body = r.json().await;
        assert!(body[0].get("metadata").is_none(), "{body}");
        let (_, body) = e.unary(&fs("Stat"), json!({ "path": path })).await;
        assert!(body["entry"].get("metadata").is_none(), "{body}");
        // Move keeps it, and says so.
        upload(&e, &path, user, &[("x-metadata-stage", "moved")], b"z").await;
        let to = format!("{dir}/b.txt");
        let (s, body) = e
            .unary(&fs("Move"), json!({"source": path, "destination": to}))
            .await;
        assert_eq!(s, 200, "{body}");
        assert_eq!(body["entry"]["metadata"], json!({"stage": "moved"}));
    }

    // Invalid metadata is refused before anything is written.
    let long = format!("x-metadata-{}", "k".repeat(247));
    let big = "v".repeat(4000);
    let bad: [(&[(&str, &str)], &str); 3] = [
        (&[("x-metadata-ok", "caf\u{e9}")], "printable ASCII"),
        (&[(long.as_str(), "v")], "longer than 246"),
        (
            &[
                ("x-metadata-big", big.as_str()),
                ("x-metadata-more", big.as_str()),
            ],
            "4096",
        ),
    ];
    for (headers, why) in bad {
        let r = upload(&e, "/tmp/meta/bad.txt", "root", headers, b"x").await;
        assert_eq!(r.status, 400, "{why}");
        let body = r.json().await;
        assert!(body["message"].as_str().unwrap().contains(why), "{body}");
    }
    let (s, _) = e
        .unary(&fs("Stat"), json!({"path": "/tmp/meta/bad.txt"}))
        .await;
    assert_eq!(s, 404, "a refused upload writes nothing");

    // Multipart: the same metadata on every file.
    let boundary = "XbrigX";
    let mut body = Vec::new();
    for path in ["/tmp/meta/m1.txt", "/tmp/meta/m2.txt"] {
        body.extend(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{path}\"\r\n\r\ndata\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend(format!("--{boundary}--\r\n").as_bytes());
    let ct = format!("multipart/form-data; boundary={boundary}");
    let h = e.routed(&[("content-type", &ct), ("x-metadata-source", "suite")]);
    let r = request(e.data, "POST", "/files", &h, &body).await;
    assert_eq!(r.status, 200);
    let body = r.json().await;
    assert_eq!(body[0]["metadata"], json!({"source": "suite"}), "{body}");
    assert_eq!(body[1]["metadata"], json!({"source": "suite"}), "{body}");
    let (_, body) = e
        .unary(&fs("Stat"), json!({"path": "/tmp/meta/m2.txt"}))
        .await;
    assert_eq!(body["entry"]["metadata"], json!({"source": "suite"}));

    // An owner and group the sandbox has no names for: their numbers.
    support::sh(
        &e.f,
        &e.id,
        "touch /tmp/meta/anon; chown 4321:4322 /tmp/meta/anon; \
         ln -s m1.txt /tmp/meta/rel; ln -s /tmp/meta/m2.txt /tmp/meta/abs",
    )
    .await;
    let (_, body) = e
        .unary(&fs("Stat"), json!({"path": "/tmp/meta/anon"}))
        .await;
    assert_eq!(
        (&body["entry"]["owner"], &body["entry"]["group"]),
        (&json!("4321"), &json!("4322"))
    );
    let (_, body) = e
        .unary(&fs("Stat"), json!({"path": "/tmp/meta/m1.txt"}))
        .await;
    assert_eq!(
        (&body["entry"]["owner"], &body["entry"]["group"]),
        (&json!("root"), &json!("root"))
    );
    // Symlinks: the link itself, marked both ways, its target absolute.
    for (link, target) in [("rel", "/tmp/meta/m1.txt"), ("abs", "/tmp/meta/m2.txt")] {
        let (_, body) = e
            .unary(&fs("Stat"), json!({ "path": format!("/tmp/meta/{link}") }))
            .await;
        let entry = &body["entry"];
        assert_eq!(entry["type"], "FILE_TYPE_SYMLINK", "{entry}");
        assert_eq!(entry["isSymlink"], true, "{entry}");
        assert_eq!(entry["symlinkTarget"], target, "{entry}");
        assert!(
            entry["permissions"].as_str().unwrap().starts_with('L'),
            "{entry}"
        );
    }
}

/// WatchDir and CreateWatcher with `includeEntry` (envd 0.6.3) carry the
/// entry, owner and metadata included; `allowNetworkMounts` (0.6.4) is
/// accepted.
#[tokio::test(flavor = "multi_thread")]
async fn watch_events_include_entries() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    support::sh(&e.f, &e.id, "mkdir -p /tmp/w").await;
    let mut w = e
        .stream(
            "/filesystem.Filesystem/WatchDir",
            json!({"path": "/tmp/w", "includeEntry": true, "allowNetworkMounts": true}),
            &[],
        )
        .await;
    assert_eq!(w.envelope().await.unwrap().1, json!({"start":{}}));
    let (s, body) = e
        .unary(
            "/filesystem.Filesystem/CreateWatcher",
            json!({"path": "/tmp/w", "includeEntry": true, "allowNetworkMounts": true}),
        )
        .await;
    assert_eq!(s, 200, "{body}");
    let watcher = body["watcherId"].clone();
    let r = upload(
        &e,
        "/tmp/w/new.txt",
        "root",
        &[("x-metadata-k", "v")],
        b"hi",
    )
    .await;
    assert_eq!(r.status, 200);
    let event = loop {
        let (_, msg) = w.envelope().await.expect("an event");
        let ev = &msg["filesystem"];
        if ev["type"] == "EVENT_TYPE_CREATE" && ev["name"] == "new.txt" {
            break ev.clone();
        }
    };
    // The entry as stat'ed when the event was sent: it has an owner.
    let entry = &event["entry"];
    assert_eq!(entry["path"], "/tmp/w/new.txt", "{event}");
    assert_eq!(entry["type"], "FILE_TYPE_FILE", "{event}");
    assert!(!entry["owner"].as_str().unwrap().is_empty(), "{event}");
    // Polled: some event for the file carries its entry (the create may
    // be seen before the metadata is set, so any of them).
    let deadline = Instant::now() + LIMIT;
    loop {
        let (s, body) = e
            .unary(
                "/filesystem.Filesystem/GetWatcherEvents",
                json!({ "watcherId": watcher }),
            )
            .await;
        assert_eq!(s, 200, "{body}");
        let events = body["events"].as_array().cloned().unwrap_or_default();
        if events
            .iter()
            .any(|ev| ev["entry"]["metadata"] == json!({"k": "v"}))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no event with the entry's metadata"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Without includeEntry: no entry.
    let (_, body) = e
        .unary(
            "/filesystem.Filesystem/CreateWatcher",
            json!({"path": "/tmp/w"}),
        )
        .await;
    let plain = body["watcherId"].clone();
    support::sh(&e.f, &e.id, "touch /tmp/w/other").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, body) = e
        .unary(
            "/filesystem.Filesystem/GetWatcherEvents",
            json!({ "watcherId": plain }),
        )
        .await;
    let events = body["events"].as_array().unwrap();
    assert!(!events.is_empty(), "{body}");
    assert!(events.iter().all(|ev| ev.get("entry").is_none()), "{body}");
}

/// File metadata, owner names and watch entries through the official
/// Python client (e2b 2.63), which turns them on by the reported envd
/// version: `tests/e2b/envd_metadata_sdk.py`.
#[tokio::test(flavor = "multi_thread")]
async fn official_python_sdk_metadata_and_owner() {
    if !root_or_skip() {
        return;
    }
    let Some(python) = sdk_python() else {
        return;
    };
    let e = env().await;
    let out = run_script(python, "envd_metadata_sdk.py", &e, Duration::from_secs(120)).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("ALL OK"), "{stdout}");
}

/// A command's whole output reaches a client that reads slowly: the
/// process is paced by the stream (as with envd) instead of losing what
/// the agent's buffer for unattended processes cannot hold, including
/// what it writes before the first read.
#[tokio::test(flavor = "multi_thread")]
async fn long_output_reaches_a_slow_client_whole() {
    if !root_or_skip() {
        return;
    }
    let e = env().await;
    let body = json!({
        "process": {"cmd": "/bin/sh", "args": ["-c", "seq 1 300000; head -c 3000000 /dev/zero | tr '\\0' a"]},
        "stdin": false,
    });
    let mut r = e.stream("/process.Process/Start", body, &[]).await;
    // Let it run ahead of us first, then read slowly for a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut out = Vec::new();
    let mut n = 0;
    while let Some((flags, msg)) = r.envelope().await {
        if flags & 2 != 0 {
            break;
        }
        if let Some(s) = msg["event"]["data"].get("stdout") {
            out.extend(unb64(s));
        }
        n += 1;
        if n < 30 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let text = String::from_utf8(out).unwrap();
    let (numbers, tail) = text.split_at(text.find('a').expect("the a's arrived"));
    let lines: Vec<&str> = numbers.lines().collect();
    assert_eq!(lines.len(), 300_000, "every line of seq");
    assert!(lines
        .iter()
        .enumerate()
        .all(|(i, l)| l.parse() == Ok(i + 1)));
    assert_eq!(tail.len(), 3_000_000);
}
