//! [`proxy`]: HTTP and WebSocket to a server listening on a port inside a
//! sandbox, for every front-end (the native API's
//! `ANY /v1/sandboxes/{id}/ports/{port}/{*path}`; the E2B data plane, for
//! every port that is not envd's).
//!
//! A sandbox's network is loopback only, so the daemon cannot connect to
//! its servers; the agent does, and relays the bytes over a `CONNECT`
//! stream ([`PortStream`]). Each proxied request gets its own connection
//! inside the sandbox, and hyper's HTTP/1.1 client speaks over it:
//!
//! - Bodies are streamed both ways, never held whole: the request body
//!   goes up as the client sends it, the response body comes down as the
//!   server writes it, paced by the stream's credit (a slow client slows
//!   the server inside the sandbox, not the daemon's memory).
//! - `Upgrade` (WebSocket and anything else): the request goes up with its
//!   `Upgrade`/`Connection` headers; on `101 Switching Protocols` both
//!   connections are spliced byte for byte until either side closes
//!   (each direction's EOF is passed on as a half-close).
//! - Headers: `Authorization` (the brig key) and hop-by-hop headers are not
//!   forwarded; `Host` becomes `127.0.0.1:PORT`, as the server would see
//!   from a local client.
//! - Nothing listening on the port: [`ProxyError::PortClosed`]. The server
//!   closing without an answer: [`ProxyError::BadGateway`]. Each front-end
//!   answers them in its own shape.
//!
//! A connection whose exchange ended cleanly is kept (HTTP/1.1
//! keep-alive) for the next request to the same port of the same sandbox
//! ([`idle`]): a new one costs an agent stream and a TCP connect inside
//! the sandbox, about a millisecond, which every
//! `run_code` through the E2B data plane paid. Kept connections are
//! dropped after [`IDLE_FOR`], and go with their sandbox.
//!
//! hyper's async IO ([`PortIo`]) polls the [`PortStream`] directly: no
//! thread per connection; what is in flight is the stream's window.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::Response;
use brig_agent_client::{ClientError, ErrorCode, PortStream};
use brig_core::SandboxId;
use brig_runtime::{ManagerError, SandboxManager, TenantId};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a kept connection waits for its next request.
const IDLE_FOR: Duration = Duration::from_secs(30);
/// Connections kept per port of a sandbox (busy or idle).
const KEPT_PER_PORT: usize = 4;

/// Why a request could not be proxied.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// Nothing listens on the port inside the sandbox.
    #[error("sandbox {id}: nothing listens on port {port}")]
    PortClosed { id: SandboxId, port: u16 },
    /// The server inside the sandbox broke the exchange (closed without an
    /// answer, sent something that is not HTTP).
    #[error("sandbox {id}: port {port}: {reason}")]
    BadGateway {
        id: SandboxId,
        port: u16,
        reason: String,
    },
    /// A raw TCP request that does not ask for the upgrade.
    #[error(
        "a raw TCP connection is asked for with the headers 'Connection: Upgrade' and 'Upgrade: {TCP_UPGRADE}'"
    )]
    NotAnUpgrade,
    /// The sandbox is unknown (or another tenant's), not running, paused,
    /// or its agent failed.
    #[error(transparent)]
    Manager(#[from] ManagerError),
}

/// Forward `req` to `port` on the loopback of sandbox `id` (which must be
/// `tenant`'s and running) and stream the answer back; WebSocket and other
/// upgrades included. `req`'s URI is sent as its path and query (the
/// caller strips any prefix of its own); `Authorization` is not forwarded,
/// `Host` becomes `127.0.0.1:PORT` (or the request's [`UpstreamHost`]). A failure is a [`ProxyError`], which
/// each front-end answers in its own shape (the native API's
/// `502 port_closed`, E2B's `port is not open`).
/// A request extension: the `Host` [`proxy`] sends instead of
/// `127.0.0.1:PORT` (E2B's `maskRequestHost`).
#[derive(Debug, Clone)]
pub struct UpstreamHost(pub HeaderValue);

pub async fn proxy(
    manager: Arc<SandboxManager>,
    tenant: TenantId,
    id: SandboxId,
    port: u16,
    mut req: Request,
) -> Result<Response, ProxyError> {
    let upgrade = req.headers().contains_key(header::UPGRADE);
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let upgrade_to = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers);
    parts.headers.remove(header::AUTHORIZATION);
    if let Some(proto) = upgrade_to {
        parts.headers.insert(header::UPGRADE, proto);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    let host = match parts.extensions.remove::<UpstreamHost>() {
        Some(UpstreamHost(host)) => host,
        None => HeaderValue::from_str(&format!("127.0.0.1:{port}")).expect("a valid header value"),
    };
    parts.headers.insert(header::HOST, host);
    parts.uri = parts
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
    parts.version = axum::http::Version::HTTP_11;
    let out = Request::from_parts(parts, body);

    // A kept connection, if the sandbox is still the tenant's and running
    // (an upgrade takes its connection for good: always a new one).
    let usable = !upgrade && manager.is_running(&tenant, &id);
    let kept = if usable { idle::take(&id, port) } else { None };
    let reused = kept.is_some();
    let mut sender = match kept {
        Some(s) => s,
        None => connect(&manager, &tenant, &id, port).await?,
    };
    let mut resp = match sender.try_send_request(out).await {
        Ok(resp) => resp,
        // The kept connection was closed by the server meanwhile, before
        // the request went out: send it on a new one.
        Err(mut e) if reused && e.message().is_some() => {
            let out = e.take_message().expect("checked above");
            sender = connect(&manager, &tenant, &id, port).await?;
            sender
                .send_request(out)
                .await
                .map_err(|e| bad_gateway(&id, port, describe(&e)))?
        }
        Err(e) => return Err(bad_gateway(&id, port, describe(e.error()))),
    };
    if !upgrade {
        // Ready again once this response's body has been read whole.
        idle::put(&id, port, sender);
    }
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_side) = client_side else {
            return Err(bad_gateway(
                &id,
                port,
                "the server switched protocols without being asked to".into(),
            ));
        };
        let server_side = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (Ok(client), Ok(server)) = tokio::join!(client_side, server_side) else {
                return;
            };
            let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// A new HTTP/1.1 connection to `port` inside the sandbox, through its
/// agent.
async fn connect(
    manager: &Arc<SandboxManager>,
    tenant: &TenantId,
    id: &SandboxId,
    port: u16,
) -> Result<hyper::client::conn::http1::SendRequest<Body>, ProxyError> {
    let io = open(manager, tenant, id, port).await?;
    let (sender, conn) = hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(io))
        .await
        .map_err(|e| bad_gateway(id, port, e.to_string()))?;
    tokio::spawn(async move {
        // Ends when the server closes, the sender is dropped with no
        // exchange left, or the upgraded IO is taken.
        let _ = conn.with_upgrades().await;
    });
    Ok(sender)
}

/// A TCP connection to `port` on the loopback of sandbox `id` (which must
/// be `tenant`'s and running), made by its agent, as tokio IO. Nothing
/// listening there is [`ProxyError::PortClosed`].
pub async fn open(
    manager: &Arc<SandboxManager>,
    tenant: &TenantId,
    id: &SandboxId,
    port: u16,
) -> Result<PortIo, ProxyError> {
    let stream = {
        let (manager, tenant) = (Arc::clone(manager), tenant.clone());
        let sandbox = id.clone();
        tokio::task::spawn_blocking(move || -> Result<PortStream, ProxyError> {
            let id = sandbox;
            let conn = manager.connection(&tenant, &id)?;
            conn.connect_port(port).map_err(|source| {
                if source.agent_code() == Some(ErrorCode::ConnectionRefused) {
                    ProxyError::PortClosed {
                        id: id.clone(),
                        port,
                    }
                } else if let ClientError::Agent { message, .. } = &source {
                    // The agent could not connect (a connect timeout):
                    // the server's fault, not the daemon's.
                    bad_gateway(&id, port, message.clone())
                } else {
                    ManagerError::Agent {
                        id: id.clone(),
                        source,
                    }
                    .into()
                }
            })
        })
        .await
        .map_err(|e| bad_gateway(id, port, format!("connect task failed: {e}")))??
    };
    Ok(PortIo::new(stream))
}

/// `{port}-{id}.{domain}[:port]` → (id, port): a sandbox's port by host
/// name, as E2B's `get_host(port)` builds it and the native API takes it
/// (`http://8000-ID.localhost:7777/` reaches port 8000 of sandbox ID from a
/// browser or curl, since every `*.localhost` name is the loopback).
pub fn host_route(host: &str) -> Option<(&str, u16)> {
    let (label, _domain) = host.split_once('.')?;
    let (port, id) = label.split_once('-')?;
    let port = port.parse().ok().filter(|p| *p > 0)?;
    let id_ok = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    id_ok.then_some((id, port))
}

/// The protocol name of a raw TCP upgrade (`Upgrade: tcp`).
pub const TCP_UPGRADE: &str = "tcp";

/// Raw TCP to `port` inside the sandbox over an HTTP/1.1 upgrade: `req`
/// must ask for `Connection: Upgrade` and `Upgrade: tcp`. The port is
/// connected first, so a closed one is an ordinary error answer
/// ([`ProxyError::PortClosed`]); then `101 Switching Protocols`, and the
/// bytes of the client's connection and the sandbox's are relayed until
/// either side closes (each EOF passed on as a half-close).
pub async fn tcp_upgrade(
    manager: Arc<SandboxManager>,
    tenant: TenantId,
    id: SandboxId,
    port: u16,
    mut req: Request,
) -> Result<Response, ProxyError> {
    let asked = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(TCP_UPGRADE));
    if !asked {
        return Err(ProxyError::NotAnUpgrade);
    }
    let mut inside = open(&manager, &tenant, &id, port).await?;
    let client_side = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(client) = client_side.await else {
            return;
        };
        let mut client = TokioIo::new(client);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut inside).await;
    });
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, TCP_UPGRADE)
        .body(Body::empty())
        .expect("a valid response"))
}

/// Relay `client` both ways with `port` inside the sandbox until either
/// side closes (a published host port's connections, `publish.rs`).
pub async fn tunnel<IO>(
    manager: &Arc<SandboxManager>,
    tenant: &TenantId,
    id: &SandboxId,
    port: u16,
    client: &mut IO,
) -> Result<(), ProxyError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut inside = open(manager, tenant, id, port).await?;
    let _ = tokio::io::copy_bidirectional(client, &mut inside).await;
    Ok(())
}

/// The kept connections: by sandbox and port, with when each was put back.
mod idle {
    use super::*;
    use hyper::client::conn::http1::SendRequest;

    type Kept = Vec<(Instant, SendRequest<Body>)>;

    static KEPT: LazyLock<Mutex<HashMap<(SandboxId, u16), Kept>>> = LazyLock::new(|| {
        // Drops what waited too long, even if no request comes again.
        std::thread::Builder::new()
            .name("brig-port-idle".into())
            .spawn(|| loop {
                std::thread::sleep(IDLE_FOR / 2);
                let mut kept = lock();
                kept.retain(|_, v| {
                    v.retain(|(since, s)| !s.is_closed() && since.elapsed() < IDLE_FOR);
                    !v.is_empty()
                });
            })
            .expect("start the idle-connection sweeper");
        Mutex::default()
    });

    fn lock() -> std::sync::MutexGuard<'static, HashMap<(SandboxId, u16), Kept>> {
        KEPT.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A kept connection ready for a request now.
    pub(super) fn take(id: &SandboxId, port: u16) -> Option<SendRequest<Body>> {
        let mut kept = lock();
        let key = (id.clone(), port);
        let list = kept.get_mut(&key)?;
        list.retain(|(since, s)| !s.is_closed() && since.elapsed() < IDLE_FOR);
        let found = list
            .iter()
            .position(|(_, s)| s.is_ready())
            .map(|i| list.swap_remove(i).1);
        if list.is_empty() {
            kept.remove(&key);
        }
        found
    }

    /// Keep `sender` for the next request (it serves one once its current
    /// exchange is over); the oldest goes beyond [`KEPT_PER_PORT`].
    pub(super) fn put(id: &SandboxId, port: u16, sender: SendRequest<Body>) {
        if sender.is_closed() {
            return;
        }
        let mut kept = lock();
        let list = kept.entry((id.clone(), port)).or_default();
        list.push((Instant::now(), sender));
        if list.len() > KEPT_PER_PORT {
            list.remove(0);
        }
    }
}

fn bad_gateway(id: &SandboxId, port: u16, reason: String) -> ProxyError {
    ProxyError::BadGateway {
        id: id.clone(),
        port,
        reason,
    }
}

/// hyper's error with its cause (`connection closed before message
/// completed`, …).
fn describe(e: &hyper::Error) -> String {
    let mut out = e.to_string();
    let mut next = std::error::Error::source(e);
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

/// Headers about one connection, not the message (RFC 9110 §7.6.1), and
/// those the `Connection` header names.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// A [`PortStream`] as tokio IO, for hyper: reads and writes wait on the
/// stream without a thread (the agent client's reactor wakes the task).
/// Dropped, it aborts the connection unless both sides closed it.
pub struct PortIo {
    stream: PortStream,
    /// This side shut its write half.
    shut: bool,
}

impl std::fmt::Debug for PortIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortIo").field("shut", &self.shut).finish()
    }
}

/// Connections into sandboxes open now (kept or busy), for tests and
/// metrics.
static OPEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many proxied connections into sandboxes are open now, kept ones
/// included; each ends with its exchange, its keep-alive, or its sandbox.
pub fn open_connections() -> usize {
    OPEN.load(std::sync::atomic::Ordering::Relaxed)
}

impl PortIo {
    fn new(stream: PortStream) -> PortIo {
        OPEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        PortIo {
            stream,
            shut: false,
        }
    }
}

impl Drop for PortIo {
    fn drop(&mut self) {
        // A finished exchange whose both sides closed is left alone; one
        // still open (a keep-alive server) is reset.
        self.stream.abort();
        OPEN.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl AsyncRead for PortIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = ready!(self.stream.poll_read(cx, buf.initialize_unfilled()))?;
        buf.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PortIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.shut {
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the connection into the sandbox is shut for writing",
            )));
        }
        self.stream.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        // Every write hands its bytes to the agent's socket before it
        // returns.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if !self.shut {
            self.shut = true;
            self.stream.shutdown_write()?;
        }
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Hop"),
        );
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str().to_string()).collect();
        left.sort();
        assert_eq!(left, ["content-length", "content-type"]);
    }
}
