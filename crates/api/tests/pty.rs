//! `GET /v1/sandboxes/{id}/pty` over a real socket: the router served on
//! `127.0.0.1:0`, driven by tokio-tungstenite. Terminal sessions (tty,
//! resize, echo, ^C as a signal, exit codes, raw bytes), pipes sessions
//! (tagged stdout/stderr, binary stdin), authentication before the upgrade
//! (header or `Sec-WebSocket-Protocol`) and a departed client's process
//! being killed. Needs root (real sandboxes); skips otherwise, fails under
//! BRIG_TEST_STRICT=1.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::http::StatusCode;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use support::{create, fixture, root_or_skip, serve, sh, Fixture};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long any one session may take before the test fails.
const LIMIT: Duration = Duration::from_secs(20);

/// How a test presents its key.
enum Key<'a> {
    None,
    Bearer(&'a str),
    Protocol(&'a str),
}

async fn connect(
    addr: SocketAddr,
    id: &str,
    key: Key<'_>,
) -> Result<(Ws, tungstenite::handshake::client::Response), tungstenite::Error> {
    let mut req = format!("ws://{addr}/v1/sandboxes/{id}/pty")
        .into_client_request()
        .unwrap();
    let headers = req.headers_mut();
    match key {
        Key::None => {}
        Key::Bearer(k) => {
            headers.insert("authorization", format!("Bearer {k}").parse().unwrap());
        }
        Key::Protocol(k) => {
            headers.insert(
                "sec-websocket-protocol",
                format!("brig, brig.key.{k}").parse().unwrap(),
            );
        }
    }
    tokio_tungstenite::connect_async(req).await
}

/// Connect with the bearer key and send the start message; the `started`
/// frame is checked.
async fn start(addr: SocketAddr, f: &Fixture, id: &str, start: Value) -> Ws {
    let (mut ws, _) = connect(addr, id, Key::Bearer(&f.key)).await.unwrap();
    ws.send(Message::text(start.to_string())).await.unwrap();
    let first = next_text(&mut ws).await;
    assert_eq!(first["type"], "started", "{first}");
    assert!(first["pid"].as_i64().is_some_and(|p| p > 0), "{first}");
    ws
}

async fn next_text(ws: &mut Ws) -> Value {
    match tokio::time::timeout(LIMIT, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("expected a text frame, got {other:?}"),
    }
}

/// Everything a session prints until its end: (output, final frame).
/// Output of a pipes session is returned tagged per frame.
async fn finish(ws: &mut Ws) -> (Vec<u8>, Value) {
    read_until(ws, |_| false).await
}

/// Read until `stop(output so far)` or the final text frame.
async fn read_until(ws: &mut Ws, stop: impl Fn(&[u8]) -> bool) -> (Vec<u8>, Value) {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "session did not end in time; output so far: {:?}",
                    String::from_utf8_lossy(&out)
                )
            });
        match msg {
            Some(Ok(Message::Binary(b))) => {
                out.extend_from_slice(&b);
                if stop(&out) {
                    return (out, Value::Null);
                }
            }
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap();
                // After the final frame, the server closes.
                match ws.next().await {
                    Some(Ok(Message::Close(_))) | None => {}
                    other => panic!("expected a close after {v}, got {other:?}"),
                }
                return (out, v);
            }
            other => panic!("unexpected {other:?}; output so far {out:?}"),
        }
    }
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn control(v: Value) -> Message {
    Message::text(v.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_terminal_session() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let addr = serve(&f).await;

    // The process is on a terminal.
    let mut ws = start(
        addr,
        &f,
        &id,
        json!({"argv": ["tty"], "cols": 80, "rows": 24}),
    )
    .await;
    let (out, exit) = finish(&mut ws).await;
    assert!(
        contains(&out, "/dev/pts/"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(exit, json!({"type": "exited", "code": 0, "signal": null}));

    // The start size, then a resize, as `stty size` sees them.
    let script = "stty size; read x; stty size";
    let mut ws = start(
        addr,
        &f,
        &id,
        json!({"argv": ["sh", "-c", script], "cols": 100, "rows": 30}),
    )
    .await;
    let (out, _) = read_until(&mut ws, |o| contains(o, "30 100")).await;
    assert!(contains(&out, "30 100"));
    ws.send(control(json!({"type": "resize", "cols": 132, "rows": 43})))
        .await
        .unwrap();
    ws.send(Message::binary(b"go\n".to_vec())).await.unwrap();
    let (out, exit) = finish(&mut ws).await;
    assert!(
        contains(&out, "43 132"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
    assert_eq!(exit["code"], 0, "{exit}");

    // Input reaches the process and comes back (the terminal's echo and
    // cat's copy); eof is ^D.
    let mut ws = start(
        addr,
        &f,
        &id,
        json!({"argv": ["cat"], "cols": 80, "rows": 24}),
    )
    .await;
    ws.send(Message::binary(b"round trip\n".to_vec()))
        .await
        .unwrap();
    let (out, _) = read_until(&mut ws, |o| {
        o.windows(10).filter(|w| w == b"round trip").count() >= 2
    })
    .await;
    assert!(contains(&out, "round trip\r\n"), "{out:?}");
    ws.send(control(json!({"type": "eof"}))).await.unwrap();
    let (_, exit) = finish(&mut ws).await;
    assert_eq!(exit["code"], 0, "{exit}");

    // A signal by name interrupts a long sleep.
    let mut ws = start(addr, &f, &id, json!({"argv": ["sleep", "100"]})).await;
    ws.send(control(json!({"type": "signal", "signal": "SIGINT"})))
        .await
        .unwrap();
    let (_, exit) = finish(&mut ws).await;
    assert_eq!(exit, json!({"type": "exited", "code": null, "signal": 2}));

    // ^C typed on the terminal does the same, through the remote tty.
    let mut ws = start(addr, &f, &id, json!({"argv": ["sleep", "100"]})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    ws.send(Message::binary(vec![3u8])).await.unwrap();
    let (_, exit) = finish(&mut ws).await;
    assert_eq!(exit["signal"], 2, "{exit}");

    // The exit code is delivered.
    let mut ws = start(addr, &f, &id, json!({"argv": ["sh", "-c", "exit 7"]})).await;
    let (_, exit) = finish(&mut ws).await;
    assert_eq!(exit, json!({"type": "exited", "code": 7, "signal": null}));

    // Bytes that are not text arrive as they are (no newline in them for
    // the terminal to translate).
    let mut ws = start(
        addr,
        &f,
        &id,
        json!({"argv": ["sh", "-c", "printf '\\377\\000\\001\\200\\033'"]}),
    )
    .await;
    let (out, exit) = finish(&mut ws).await;
    assert_eq!(out, b"\xff\x00\x01\x80\x1b", "{exit}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pipes_session_tags_output_and_takes_binary_input() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let addr = serve(&f).await;

    // Every byte value through stdin and back on stdout, in frames tagged 1.
    let all: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    let mut ws = start(addr, &f, &id, json!({"argv": ["cat"], "pty": false})).await;
    for chunk in all.chunks(7000) {
        ws.send(Message::binary(chunk.to_vec())).await.unwrap();
    }
    ws.send(control(json!({"type": "eof"}))).await.unwrap();
    let mut stdout = Vec::new();
    let exit = loop {
        match tokio::time::timeout(LIMIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Binary(b))) => {
                assert_eq!(b[0], 1, "cat writes stdout only");
                stdout.extend_from_slice(&b[1..]);
            }
            Some(Ok(Message::Text(t))) => break serde_json::from_str::<Value>(t.as_str()).unwrap(),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(exit["code"], 0, "{exit}");
    assert!(
        stdout == all,
        "stdout is stdin, byte for byte ({} bytes)",
        stdout.len()
    );

    // stderr is tagged 2, and the environment, cwd and user are applied.
    let mut ws = start(
        addr,
        &f,
        &id,
        json!({
            "argv": ["sh", "-c", "echo \"$GREETING $(pwd) $(id -u)\"; echo oops >&2; exit 3"],
            "env": {"GREETING": "hello"},
            "cwd": "/tmp",
            "user": "nobody",
            "pty": false,
        }),
    )
    .await;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let exit = loop {
        match tokio::time::timeout(LIMIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Binary(b))) => match b[0] {
                1 => stdout.extend_from_slice(&b[1..]),
                2 => stderr.extend_from_slice(&b[1..]),
                t => panic!("unknown tag {t}"),
            },
            Some(Ok(Message::Text(t))) => break serde_json::from_str::<Value>(t.as_str()).unwrap(),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(String::from_utf8_lossy(&stdout), "hello /tmp 65534\n");
    assert_eq!(String::from_utf8_lossy(&stderr), "oops\n");
    assert_eq!(exit["code"], 3, "{exit}");

    // Signals still reach a process whose stdin is closed.
    let mut ws = start(
        addr,
        &f,
        &id,
        json!({"argv": ["sleep", "100"], "pty": false}),
    )
    .await;
    ws.send(control(json!({"type": "eof"}))).await.unwrap();
    ws.send(control(json!({"type": "signal", "signal": 15})))
        .await
        .unwrap();
    let (_, exit) = finish(&mut ws).await;
    assert_eq!(exit, json!({"type": "exited", "code": null, "signal": 15}));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_key_is_checked_before_the_upgrade() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let addr = serve(&f).await;

    let refused = |r: Result<_, tungstenite::Error>| match r {
        Err(tungstenite::Error::Http(resp)) => {
            let body: Value = serde_json::from_slice(resp.body().as_deref().unwrap_or_default())
                .unwrap_or_default();
            (resp.status(), body)
        }
        Err(e) => panic!("expected an HTTP answer, got {e}"),
        Ok(_) => panic!("the upgrade was accepted"),
    };
    let (status, body) = refused(connect(addr, &id, Key::None).await);
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["code"], "unauthorized", "{body}");
    let (status, _) = refused(connect(addr, &id, Key::Bearer("not-a-key")).await);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = refused(connect(addr, &id, Key::Protocol("not-a-key")).await);
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Another tenant's sandbox is not found, like a missing one.
    let (status, body) = refused(connect(addr, &id, Key::Bearer(&f.other_key)).await);
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = refused(connect(addr, "0123456789ab", Key::Bearer(&f.key)).await);
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The key as a subprotocol (what a browser can send); `brig` comes back.
    let (mut ws, resp) = connect(addr, &id, Key::Protocol(&f.key)).await.unwrap();
    assert_eq!(
        resp.headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap()),
        Some("brig")
    );
    ws.send(Message::text(json!({"argv": ["echo", "hi"]}).to_string()))
        .await
        .unwrap();
    assert_eq!(next_text(&mut ws).await["type"], "started");
    let (out, exit) = finish(&mut ws).await;
    assert_eq!(out, b"hi\r\n");
    assert_eq!(exit["code"], 0);

    // Errors before the start are an error frame and a close.
    for (start, code) in [
        (json!({"argv": []}), "bad_request"),
        (json!({"argv": ["true"], "bogus": 1}), "bad_request"),
        (json!({"argv": ["no-such-command"]}), "command_not_found"),
        (json!({"argv": ["echo", "a\0b"]}), "bad_request"),
        (
            json!({"argv": ["true"], "user": "no-such-user"}),
            "bad_request",
        ),
    ] {
        let (mut ws, _) = connect(addr, &id, Key::Bearer(&f.key)).await.unwrap();
        ws.send(Message::text(start.to_string())).await.unwrap();
        let (_, end) = finish(&mut ws).await;
        assert_eq!(end["type"], "error", "{start}: {end}");
        assert_eq!(end["code"], code, "{start}: {end}");
        assert!(end["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_leaves_takes_its_process_with_it() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let id = create(&f, "{}").await;
    let addr = serve(&f).await;

    let mut ws = start(
        addr,
        &f,
        &id,
        json!({"argv": ["sh", "-c", "echo $$; exec sleep 1000"], "pty": false}),
    )
    .await;
    let (out, _) = read_until(&mut ws, |o| o.ends_with(b"\n")).await;
    let pid: i32 = String::from_utf8_lossy(&out[1..]).trim().parse().unwrap();
    assert_eq!(
        sh(&f, &id, &format!("kill -0 {pid} && echo alive")).await,
        "alive\n"
    );
    // Its stdin is over (so the stream takes no more control messages from
    // the daemon), and then the client is gone without a close handshake.
    ws.send(control(json!({"type": "eof"}))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(ws);
    let check = format!("kill -0 {pid} 2>/dev/null && echo alive || echo gone");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if sh(&f, &id, &check).await == "gone\n" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "process {pid} still runs after its client left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
