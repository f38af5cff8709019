//! `/v1/sandboxes/{id}/ports/{port}/…` over a real socket: servers started
//! inside a sandbox (python3's http.server, a small POST echo server, a
//! stdlib WebSocket echo server) reached through the daemon's proxy; a
//! closed port; another tenant's key; a big response streamed without the
//! daemon's memory growing; published host ports and raw TCP over an
//! upgrade (a TCP echo server); ports by host name with and without the
//! traffic token. Needs root (real sandboxes); skips otherwise,
//! fails under BRIG_TEST_STRICT=1.

mod support;

use std::io::Read;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use support::{call, create, fixture, root_or_skip, serve, sh, Fixture};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// Start a background process in the sandbox.
async fn start(f: &Fixture, id: &str, argv: &[&str]) {
    let (status, body) = call(
        &f.app,
        Method::POST,
        &format!("/v1/sandboxes/{id}/processes"),
        Some(&f.key),
        Some(&json!({ "argv": argv }).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// One blocking request with ureq: status, headers we look at, body.
async fn http(
    method: &'static str,
    url: String,
    key: String,
    body: Option<Vec<u8>>,
) -> (u16, Option<String>, Vec<u8>) {
    tokio::task::spawn_blocking(move || {
        let req = ureq::request(method, &url).set("Authorization", &format!("Bearer {key}"));
        let resp = match body {
            Some(b) => req.send_bytes(&b),
            None => req.call(),
        };
        let resp = match resp {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {url}: {e}"),
        };
        let status = resp.status();
        let ct = resp.header("content-type").map(str::to_string);
        let mut bytes = Vec::new();
        resp.into_reader().read_to_end(&mut bytes).unwrap();
        (status, ct, bytes)
    })
    .await
    .unwrap()
}

/// Wait until something listens on `port` in the sandbox (the proxy stops
/// answering `port_closed`).
async fn wait_port(addr: SocketAddr, f: &Fixture, id: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let url = format!("http://{addr}/v1/sandboxes/{id}/ports/{port}/");
        let (status, _, body) = http("GET", url, f.key.clone(), None).await;
        if status != 502 {
            return;
        }
        let body: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["code"], "port_closed", "{body}");
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn http_server_in_a_sandbox_is_reached_through_the_proxy() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let addr = serve(&f).await;
    let id = create(&f, "{}").await;
    sh(
        &f,
        &id,
        "mkdir -p /tmp/www/sub && printf 'hello from the sandbox\\n' > /tmp/www/hello.txt \
         && printf 'spaced' > '/tmp/www/sub/a b.txt'",
    )
    .await;
    start(
        &f,
        &id,
        &[
            "python3",
            "-m",
            "http.server",
            "8000",
            "--bind",
            "127.0.0.1",
            "--directory",
            "/tmp/www",
        ],
    )
    .await;
    wait_port(addr, &f, &id, 8000).await;
    let base = format!("http://{addr}/v1/sandboxes/{id}/ports/8000");

    let (status, _, body) = http("GET", format!("{base}/hello.txt"), f.key.clone(), None).await;
    assert_eq!(status, 200);
    assert_eq!(body, b"hello from the sandbox\n");
    // Escapes reach the server as sent.
    let (status, _, body) = http("GET", format!("{base}/sub/a%20b.txt"), f.key.clone(), None).await;
    assert_eq!((status, body.as_slice()), (200, &b"spaced"[..]));
    // The root lists the directory; a query string goes through.
    let (status, ct, body) = http("GET", format!("{base}/?x=1"), f.key.clone(), None).await;
    assert_eq!(status, 200);
    assert!(ct.unwrap_or_default().starts_with("text/html"));
    assert!(String::from_utf8_lossy(&body).contains("hello.txt"));
    let (status, _, _) = http("GET", format!("{base}/missing"), f.key.clone(), None).await;
    assert_eq!(status, 404, "the server's own 404 comes through");
    // Every proxied connection ends with its exchange.
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_connections() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} proxied connections left",
            open_connections()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Proxied connections into sandboxes this process holds open.
fn open_connections() -> usize {
    brig_http::ports::open_connections()
}

/// A POST echo server: the body comes back, with the Host and
/// Authorization headers the server saw.
const POST_ECHO: &str = r#"
import http.server
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_POST(self):
        n = int(self.headers.get('Content-Length', 0))
        body = self.rfile.read(n)
        self.send_response(201)
        self.send_header('Content-Length', str(len(body)))
        self.send_header('X-Seen-Host', self.headers.get('Host', ''))
        self.send_header('X-Seen-Auth', self.headers.get('Authorization', 'none'))
        self.send_header('X-Seen-Path', self.path)
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(('127.0.0.1', 8001), H).serve_forever()
"#;

#[tokio::test(flavor = "multi_thread")]
async fn post_bodies_and_headers_go_through() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let addr = serve(&f).await;
    let id = create(&f, "{}").await;
    start(&f, &id, &["python3", "-c", POST_ECHO]).await;
    // wait_port sends a GET, which this server answers 501: it listens.
    wait_port(addr, &f, &id, 8001).await;
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let url = format!("http://{addr}/v1/sandboxes/{id}/ports/8001/echo/x?y=z");
    let key = f.key.clone();
    let sent = body.clone();
    let (status, host, auth, path, back) = tokio::task::spawn_blocking(move || {
        let resp = ureq::post(&url)
            .set("Authorization", &format!("Bearer {key}"))
            .send_bytes(&sent)
            .unwrap();
        let h = |n: &str| resp.header(n).unwrap_or_default().to_string();
        let (host, auth, path) = (h("x-seen-host"), h("x-seen-auth"), h("x-seen-path"));
        let status = resp.status();
        let mut back = Vec::new();
        resp.into_reader().read_to_end(&mut back).unwrap();
        (status, host, auth, path, back)
    })
    .await
    .unwrap();
    assert_eq!(status, 201);
    assert_eq!(host, "127.0.0.1:8001");
    assert_eq!(auth, "none", "the brig key is not forwarded");
    assert_eq!(path, "/echo/x?y=z");
    assert!(back == body, "300 kB echoed");
}

/// A WebSocket echo server on python3's stdlib: the handshake, then
/// every text or binary message back, until a close.
const WS_ECHO: &str = r#"
import base64, hashlib, socket, struct, threading
G = b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
def exact(c, n):
    b = b''
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d: raise EOFError
        b += d
    return b
def serve(c):
    req = b''
    while b'\r\n\r\n' not in req: req += c.recv(4096)
    key = [l.split(b':', 1)[1].strip() for l in req.split(b'\r\n') if l.lower().startswith(b'sec-websocket-key:')][0]
    acc = base64.b64encode(hashlib.sha1(key + G).digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ' + acc + b'\r\n\r\n')
    try:
        while True:
            h = exact(c, 2); op = h[0] & 15; n = h[1] & 127
            if n == 126: n = struct.unpack('>H', exact(c, 2))[0]
            elif n == 127: n = struct.unpack('>Q', exact(c, 8))[0]
            m = exact(c, 4); p = bytes(x ^ m[i % 4] for i, x in enumerate(exact(c, n)))
            hdr = bytes([0x80 | op]) + (bytes([n]) if n < 126 else (bytes([126]) + struct.pack('>H', n) if n < 65536 else bytes([127]) + struct.pack('>Q', n)))
            c.sendall(hdr + p)
            if op == 8: break
    except EOFError: pass
    c.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', 8765)); s.listen(16)
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,)).start()
"#;

#[tokio::test(flavor = "multi_thread")]
async fn websockets_are_spliced_through() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let addr = serve(&f).await;
    let id = create(&f, "{}").await;
    start(&f, &id, &["python3", "-c", WS_ECHO]).await;
    // Wait with a plain connect attempt through the proxy.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ws = loop {
        let mut req = format!("ws://{addr}/v1/sandboxes/{id}/ports/8765/chat")
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "authorization",
            format!("Bearer {}", f.key).parse().unwrap(),
        );
        match tokio_tungstenite::connect_async(req).await {
            Ok((ws, resp)) => {
                assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
                break ws;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "no websocket: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let limit = Duration::from_secs(20);
    for text in ["hello", "through the agent"] {
        ws.send(Message::text(text)).await.unwrap();
        let back = tokio::time::timeout(limit, ws.next()).await.unwrap();
        assert_eq!(back.unwrap().unwrap(), Message::text(text));
    }
    let blob: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
    ws.send(Message::binary(blob.clone())).await.unwrap();
    let back = tokio::time::timeout(limit, ws.next()).await.unwrap();
    assert_eq!(back.unwrap().unwrap(), Message::binary(blob));
    ws.close(None).await.unwrap();
    // The server echoes the close; then the stream ends.
    let end = tokio::time::timeout(limit, async {
        while let Some(m) = ws.next().await {
            if m.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the spliced connection ends after the close");
}

#[tokio::test(flavor = "multi_thread")]
async fn closed_ports_other_tenants_and_bad_ports_are_refused() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let addr = serve(&f).await;
    let id = create(&f, "{}").await;
    let url = format!("http://{addr}/v1/sandboxes/{id}/ports/9/");
    let (status, ct, body) = http("GET", url.clone(), f.key.clone(), None).await;
    assert_eq!(status, 502);
    assert_eq!(ct.as_deref(), Some("application/json"));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        json!({"code": "port_closed", "message": format!("sandbox {id}: nothing listens on port 9")})
    );
    // Another tenant's key: the sandbox does not exist for it.
    let (status, _, body) = http("GET", url.clone(), f.other_key.clone(), None).await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    // No key at all.
    let (status, _) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/ports/9/"),
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    for bad in ["0", "65536", "http"] {
        let (status, body) = call(
            &f.app,
            Method::GET,
            &format!("/v1/sandboxes/{id}/ports/{bad}/x"),
            Some(&f.key),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
}

/// A 256 MiB response streams through while the daemon's resident set
/// grows by far less than that.
#[tokio::test(flavor = "multi_thread")]
async fn a_big_response_streams_without_memory_growth() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let addr = serve(&f).await;
    let id = create(&f, "{}").await;
    const SIZE: u64 = 256 << 20;
    sh(
        &f,
        &id,
        &format!("mkdir -p /tmp/big && yes 0123456789abcdef | head -c {SIZE} > /tmp/big/blob"),
    )
    .await;
    start(
        &f,
        &id,
        &[
            "python3",
            "-m",
            "http.server",
            "8002",
            "--bind",
            "127.0.0.1",
            "--directory",
            "/tmp/big",
        ],
    )
    .await;
    wait_port(addr, &f, &id, 8002).await;
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let base = status_kib("VmRSS");
    let url = format!("http://{addr}/v1/sandboxes/{id}/ports/8002/blob");
    let key = f.key.clone();
    let got = tokio::task::spawn_blocking(move || {
        let resp = ureq::get(&url)
            .set("Authorization", &format!("Bearer {key}"))
            .call()
            .unwrap();
        let mut reader = resp.into_reader();
        let mut buf = vec![0u8; 1 << 16];
        let (mut total, mut offset) = (0u64, 0usize);
        let line = b"0123456789abcdef\n";
        loop {
            let n = reader.read(&mut buf).unwrap();
            if n == 0 {
                return total;
            }
            for &b in &buf[..n] {
                assert_eq!(b, line[offset], "byte {total}");
                offset = (offset + 1) % line.len();
                total += 1;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(got, SIZE);
    let growth = status_kib("VmHWM").saturating_sub(base);
    eprintln!("256 MiB through the proxy: daemon peak RSS growth {growth} KiB");
    assert!(
        growth < 32 << 10,
        "the daemon grew by {growth} KiB while streaming 256 MiB"
    );
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// An HTTP/1.1 server that says which client port each request came from,
/// and sleeps `?sleep=S` seconds first.
const WHO: &str = r#"
import http.server, time, urllib.parse
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def do_GET(self):
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        time.sleep(float(q.get('sleep', ['0'])[0]))
        body = str(self.client_address[1]).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(('127.0.0.1', 8002), H).serve_forever()
"#;

/// Requests one after another reuse one kept connection (the server sees
/// one client port); requests at the same time get their own; the kept
/// connections go with the sandbox.
#[tokio::test(flavor = "multi_thread")]
async fn connections_are_kept_for_the_next_request_and_end_with_the_sandbox() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let addr = serve(&f).await;
    let id = create(&f, "{}").await;
    start(&f, &id, &["python3", "-c", WHO]).await;
    wait_port(addr, &f, &id, 8002).await;
    let url = |q: &str| format!("http://{addr}/v1/sandboxes/{id}/ports/8002/{q}");
    let mut ports = Vec::new();
    for _ in 0..5 {
        let (status, _, body) = http("GET", url(""), f.key.clone(), None).await;
        assert_eq!(status, 200);
        ports.push(String::from_utf8(body).unwrap());
    }
    assert!(
        ports.windows(2).all(|w| w[0] == w[1]),
        "a new connection per request: {ports:?}"
    );
    // Two at once: the busy connection is not shared.
    let (a, b) = tokio::join!(
        http("GET", url("?sleep=0.5"), f.key.clone(), None),
        http("GET", url("?sleep=0.5"), f.key.clone(), None)
    );
    assert_eq!((a.0, b.0), (200, 200));
    assert_ne!(a.2, b.2, "two requests at once shared a connection");
    assert!(open_connections() >= 2, "no connection kept");
    // Gone with the sandbox.
    let (status, _) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(10);
    while open_connections() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} proxied connections left after the sandbox ended",
            open_connections()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A TCP echo server that marks what it sends back as the sandbox's:
/// `sandbox:` + every byte it got, then it closes.
const TCP_ECHO: &str = r#"
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
def one(c):
    got = b""
    while True:
        b = c.recv(65536)
        if not b:
            break
        got += b
    c.sendall(b"sandbox:" + got)
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=one, args=(c,), daemon=True).start()
"#;

/// Send `data` on `stream`, half-close, read everything back.
fn exchange(mut stream: std::net::TcpStream, data: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Write;
    stream.set_read_timeout(Some(Duration::from_secs(20)))?;
    stream.write_all(data)?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut back = Vec::new();
    stream.read_to_end(&mut back)?;
    Ok(back)
}

/// The echo through 127.0.0.1:`host_port`, retried until the server in
/// the sandbox listens.
async fn echo_via_host_port(host_port: u16, data: &'static [u8]) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let tried = tokio::task::spawn_blocking(move || {
            let s = std::net::TcpStream::connect(("127.0.0.1", host_port))?;
            exchange(s, data)
        })
        .await
        .unwrap();
        match tried {
            Ok(back) if !back.is_empty() => return back,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "no echo on {host_port}: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn published_ports_carry_raw_tcp_and_go_with_the_sandbox() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let (status, sb) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&f.key),
        Some(r#"{"publish": ["7000"]}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{sb}");
    let id = sb["id"].as_str().unwrap().to_string();
    assert_eq!(sb["ports"]["public"], false, "{sb}");
    assert_eq!(sb["ports"]["token"].as_str().unwrap().len(), 32, "{sb}");
    let published = &sb["ports"]["published"][0];
    assert_eq!(published["port"], 7000, "{sb}");
    let host_port = published["host_port"].as_u64().unwrap() as u16;
    assert_ne!(host_port, 0);
    start(&f, &id, &["python3", "-c", TCP_ECHO, "7000"]).await;
    let back = echo_via_host_port(host_port, b"raw bytes \x00\xff").await;
    assert_eq!(back, b"sandbox:raw bytes \x00\xff");
    // GET shows the same.
    let (_, got) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(got["ports"], sb["ports"]);

    // A taken host port: 409 naming it, and nothing made.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    let live = f.manager.live_count();
    let (status, body) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&f.key),
        Some(&json!({"publish": [format!("{taken_port}:7000")]}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["code"], "port_in_use", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains(&taken_port.to_string()),
        "{body}"
    );
    assert_eq!(f.manager.live_count(), live);
    // Bad specs, and the count at and past its limit.
    for bad in [
        json!(["x"]),
        json!(["7000:0"]),
        json!(["70000"]),
        json!(vec!["7000"; 33]),
    ] {
        let (status, body) = call(
            &f.app,
            Method::POST,
            "/v1/sandboxes",
            Some(&f.key),
            Some(&json!({ "publish": bad }).to_string()),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    assert_eq!(f.manager.live_count(), live);
    let full = create(&f, &json!({ "publish": vec!["7000"; 32] }).to_string()).await;
    let (_, got) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{full}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(
        got["ports"]["published"].as_array().unwrap().len(),
        32,
        "{got}"
    );

    // The listener goes with the sandbox.
    let (status, _) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::net::TcpStream::connect(("127.0.0.1", host_port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "127.0.0.1:{host_port} still listens"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An HTTP/1.1 request written by hand on a new connection to the
/// daemon: the answer's status line and the socket, positioned after the
/// answer's head.
fn raw_request(addr: SocketAddr, head: &str) -> (String, std::io::BufReader<std::net::TcpStream>) {
    use std::io::{BufRead, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    (status.trim_end().to_string(), r)
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_tcp_goes_through_an_upgrade_with_the_key() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let addr = serve(&f).await;
    let id = create(&f, "{}").await;
    start(&f, &id, &["python3", "-c", TCP_ECHO, "7001"]).await;
    let key = f.key.clone();
    let path = format!("/v1/sandboxes/{id}/tcp/7001");
    let back = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, r) = raw_request(
                addr,
                &format!(
                    "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n\
                     Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
                ),
            );
            if status.starts_with("HTTP/1.1 101") {
                assert!(r.buffer().is_empty());
                return exchange(r.into_inner(), b"over the api").unwrap();
            }
            assert!(status.contains("502"), "{status}");
            assert!(Instant::now() < deadline, "the echo server never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await
    .unwrap();
    assert_eq!(back, b"sandbox:over the api");
    // Without the upgrade headers, without a key, to a closed port.
    let url = format!("http://{addr}/v1/sandboxes/{id}/tcp/7001");
    let (status, _, body) = http("GET", url, f.key.clone(), None).await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    assert!(String::from_utf8_lossy(&body).contains("Upgrade: tcp"));
    let (status, _) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{id}/tcp/7001"),
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (key, other) = (f.key.clone(), f.other_key.clone());
    let id2 = id.clone();
    let (closed, foreign) = tokio::task::spawn_blocking(move || {
        let ask = |key: &str, port: u16| {
            raw_request(
                addr,
                &format!(
                    "GET /v1/sandboxes/{id2}/tcp/{port} HTTP/1.1\r\nHost: x\r\nAuthorization: \
                     Bearer {key}\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
                ),
            )
            .0
        };
        (ask(&key, 9), ask(&other, 7001))
    })
    .await
    .unwrap();
    assert!(closed.starts_with("HTTP/1.1 502"), "{closed}");
    assert!(foreign.starts_with("HTTP/1.1 404"), "{foreign}");
}

/// `GET /hello.txt` with `Host: {host}` and extra header lines: status
/// line and body.
async fn get_by_host(addr: SocketAddr, host: String, extra: String) -> (String, String) {
    tokio::task::spawn_blocking(move || {
        let (status, mut r) = raw_request(
            addr,
            &format!("GET /hello.txt HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"),
        );
        let mut body = String::new();
        r.read_to_string(&mut body).unwrap();
        (status, body)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn ports_by_host_name_need_the_traffic_token_unless_public() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let addr = serve(&f).await;
    let server = [
        "python3",
        "-m",
        "http.server",
        "8000",
        "--bind",
        "127.0.0.1",
        "--directory",
        "/tmp/www",
    ];
    let mut ids = Vec::new();
    for body in [r#"{}"#, r#"{"public_ports": true}"#] {
        let id = create(&f, body).await;
        sh(
            &f,
            &id,
            "mkdir -p /tmp/www && printf 'by name\\n' > /tmp/www/hello.txt",
        )
        .await;
        start(&f, &id, &server).await;
        wait_port(addr, &f, &id, 8000).await;
        ids.push(id);
    }
    let (private, public) = (&ids[0], &ids[1]);
    let (_, sb) = call(
        &f.app,
        Method::GET,
        &format!("/v1/sandboxes/{private}"),
        Some(&f.key),
        None,
    )
    .await;
    let token = sb["ports"]["token"].as_str().unwrap().to_string();
    let host = |id: &str| format!("8000-{id}.localhost:{}", addr.port());

    let (status, body) = get_by_host(addr, host(private), String::new()).await;
    assert!(status.contains(" 401 "), "{status} {body}");
    assert!(body.contains("X-Brig-Traffic-Token"), "{body}");
    let wrong = format!("X-Brig-Traffic-Token: {}\r\n", "x".repeat(32));
    let (status, _) = get_by_host(addr, host(private), wrong).await;
    assert!(status.contains(" 401 "), "{status}");
    let with_token = format!("X-Brig-Traffic-Token: {token}\r\n");
    let (status, body) = get_by_host(addr, host(private), with_token).await;
    assert!(status.contains(" 200 "), "{status} {body}");
    assert_eq!(body, "by name\n");
    let (status, body) = get_by_host(
        addr,
        host(private),
        format!("Authorization: Bearer {}\r\n", f.key),
    )
    .await;
    assert_eq!(
        (status.contains(" 200 "), body.as_str()),
        (true, "by name\n")
    );
    // Another tenant's key, or a token of another sandbox: nothing.
    let (status, _) = get_by_host(
        addr,
        host(private),
        format!("Authorization: Bearer {}\r\n", f.other_key),
    )
    .await;
    assert!(status.contains(" 404 "), "{status}");
    // Public: no token needed.
    let (status, body) = get_by_host(addr, host(public), String::new()).await;
    assert_eq!(
        (status.contains(" 200 "), body.as_str()),
        (true, "by name\n"),
        "{status}"
    );
    // An unknown sandbox by name; the API itself is untouched by other hosts.
    let (status, _) = get_by_host(addr, host("0123456789ab"), String::new()).await;
    assert!(status.contains(" 404 "), "{status}");
    let (status, _) = get_by_host(addr, format!("localhost:{}", addr.port()), String::new()).await;
    assert!(
        status.contains(" 404 "),
        "the API's own not-found: {status}"
    );

    // WebSocket by host name, with the token.
    let ws_id = private.clone();
    start(&f, &ws_id, &["python3", "-c", WS_ECHO]).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut ws = loop {
        let mut req = format!("ws://{addr}/chat").into_client_request().unwrap();
        let h = req.headers_mut();
        h.insert("host", format!("8765-{ws_id}.localhost").parse().unwrap());
        h.insert("x-brig-traffic-token", token.parse().unwrap());
        match tokio_tungstenite::connect_async(req).await {
            Ok((ws, _)) => break ws,
            Err(e) => {
                assert!(Instant::now() < deadline, "no websocket by host name: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    ws.send(Message::text("named")).await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .unwrap();
    assert_eq!(back.unwrap().unwrap(), Message::text("named"));
}
