//! Header injection: requests a sandbox sends to a host its policy names
//! in `inject` get headers whose values may hold secrets the sandbox never
//! sees (`--inject 'api.openai.com:Authorization=Bearer ${secrets.openai}'`).
//!
//! For such a connection the proxy ends the sandbox's TLS itself, with a
//! certificate for the host signed by the sandbox's own CA (`tls.rs`, which
//! the sandbox trusts and nothing else does), opens its own TLS connection
//! to the real host (checked against the host's trust store), and relays
//! HTTP/1.1 request by request: each request gets the headers (replacing
//! any of the same name the sandbox sent), rendered with the tenant's
//! secrets at that moment. Plain HTTP to such a host is relayed the same
//! way, without TLS.
//!
//! The secret stays out of the sandbox:
//! - it exists only in the daemon's memory and on the wire to that host;
//! - a response that repeats it (an echo service, a redirect) has every
//!   occurrence masked with `*`, in headers and body, and requests to the
//!   host ask for no compression, so a body cannot hide one;
//! - a secret that is not set fails the request with a 502 saying which,
//!   rather than sending it without.
//!
//! Not relayed this way: HTTP/2 (the proxy offers only HTTP/1.1, which
//! every client falls back to) and protocol upgrades (WebSocket).

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use memchr::memmem;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::gateway::SandboxNet;

/// Where a sandbox's secrets come from: its tenant's, as the runtime sees
/// them now (`brig run --secret` gives its own).
pub trait SecretSource: Send + Sync {
    /// The current value of secret `name` (lower-cased), if it is set.
    fn secret(&self, name: &str) -> Option<Vec<u8>>;
}

type BoxIo = Box<dyn Io>;
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

type ReplyBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

/// Relay `client`'s connection (of which `first` was already read) to
/// `upstream` for `host`, injecting headers; `tls`: the client spoke TLS.
/// Returns the bytes from and to the sandbox.
pub(crate) async fn relay(
    net: Arc<SandboxNet>,
    client: TcpStream,
    first: Vec<u8>,
    upstream: TcpStream,
    host: String,
    tls: bool,
) -> io::Result<(u64, u64)> {
    let counted = Counted::new(Replay::new(first, client));
    let counts = counted.counts();
    let (client, upstream): (BoxIo, BoxIo) = if tls {
        let config = net
            .ca()
            .and_then(|ca| ca.server_config(&host))
            .map_err(io::Error::other)?;
        let server_name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // Both handshakes at once: each waits mostly on its peer's round
        // trips, so side by side a connection pays for about one.
        let (accepted, connected) = tokio::try_join!(
            tokio_rustls::TlsAcceptor::from(config).accept(counted),
            tokio_rustls::TlsConnector::from(crate::tls::client_config())
                .connect(server_name, upstream),
        )?;
        (Box::new(accepted), Box::new(connected))
    } else {
        (Box::new(counted), Box::new(upstream))
    };
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(upstream))
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(conn);
    let sender = Arc::new(Mutex::new(sender));
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (net, sender, host) = (Arc::clone(&net), Arc::clone(&sender), host.clone());
        async move { Ok::<_, Infallible>(forward(&net, &sender, &host, req).await) }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .await;
    if let Err(e) = served {
        tracing::debug!("header injection: the connection ended: {e}");
    }
    Ok(counts.get())
}

/// One request: headers set, sent on, the response scrubbed of secrets.
async fn forward(
    net: &SandboxNet,
    sender: &Mutex<hyper::client::conn::http1::SendRequest<Incoming>>,
    host: &str,
    mut req: Request<Incoming>,
) -> Response<ReplyBody> {
    let policy = net.policy();
    let source = net.secrets();
    let mut secrets: Vec<Vec<u8>> = Vec::new();
    for injection in policy.injections_for(host) {
        let rendered = injection.render(|name| {
            let value = source.as_ref().and_then(|s| s.secret(name))?;
            secrets.push(value.clone());
            Some(value)
        });
        let value = match rendered {
            Ok(v) => v,
            Err(name) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    format!(
                        "brig: secret {name:?} is not set for this sandbox (its header {} for \
                         {host} was not sent; set it with `brig secrets set {name}`)",
                        injection.header
                    ),
                );
            }
        };
        let (Ok(name), Ok(mut value)) = (
            HeaderName::from_bytes(injection.header.as_bytes()),
            HeaderValue::from_bytes(&value),
        ) else {
            return error(
                StatusCode::BAD_GATEWAY,
                format!(
                    "brig: the header {} for {host} cannot be sent",
                    injection.header
                ),
            );
        };
        value.set_sensitive(true);
        req.headers_mut().insert(name, value);
    }
    secrets.retain(|s| !s.is_empty());
    // Uncompressed answers, so that a secret in one can be masked.
    if !secrets.is_empty() {
        req.headers_mut().remove(hyper::header::ACCEPT_ENCODING);
    }
    let sent = {
        let mut sender = sender.lock().await;
        match sender.ready().await {
            Ok(()) => sender.send_request(req).await,
            Err(e) => Err(e),
        }
    };
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            return error(
                StatusCode::BAD_GATEWAY,
                format!("brig: the request to {host} failed: {e}"),
            )
        }
    };
    let (mut parts, body) = resp.into_parts();
    let secrets = Secrets::new(&secrets);
    for value in parts.headers.values_mut() {
        let mut bytes = value.as_bytes().to_vec();
        if secrets.mask(&mut bytes) {
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                *value = v;
            }
        }
    }
    Response::from_parts(parts, Scrub::new(body, secrets).boxed())
}

fn error(status: StatusCode, message: String) -> Response<ReplyBody> {
    tracing::debug!("{message}");
    let mut resp = Response::new(
        Full::new(Bytes::from(message + "\n"))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp
}

/// The secrets a reply is scanned for, each with a prepared substring
/// search (SIMD, `memchr::memmem`): a download through the injecting proxy
/// passes every byte through here. A byte-by-byte comparison held a 32 MiB
/// download to about a third of a plain TLS connection's speed.
struct Secrets {
    finders: Vec<memmem::Finder<'static>>,
    /// The longest secret's length, less one: the bytes of a frame held
    /// back in case a secret continues in the next.
    overlap: usize,
}

impl Secrets {
    fn new(secrets: &[Vec<u8>]) -> Secrets {
        let finders: Vec<_> = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| memmem::Finder::new(s).into_owned())
            .collect();
        let overlap = finders.iter().map(|f| f.needle().len()).max().unwrap_or(1) - 1;
        Secrets { finders, overlap }
    }

    fn is_empty(&self) -> bool {
        self.finders.is_empty()
    }

    /// Replace every occurrence of each secret in `data` by `*`s; whether
    /// there was one.
    fn mask(&self, data: &mut [u8]) -> bool {
        let mut found = false;
        for f in &self.finders {
            let len = f.needle().len();
            let mut at = 0;
            while let Some(i) = f.find(&data[at..]) {
                data[at + i..at + i + len].fill(b'*');
                at += i + len;
                found = true;
            }
        }
        found
    }
}

/// A response body with the secrets masked, even across frames: the last
/// (longest secret - 1) bytes are held back until the next frame.
struct Scrub<B> {
    inner: B,
    secrets: Secrets,
    held: BytesMut,
    done: bool,
}

impl<B> Scrub<B> {
    fn new(inner: B, secrets: Secrets) -> Scrub<B> {
        Scrub {
            inner,
            secrets,
            held: BytesMut::new(),
            done: false,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Scrub<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if this.secrets.is_empty() {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    this.held.extend_from_slice(&data);
                    this.secrets.mask(&mut this.held);
                    let out = this.held.len().saturating_sub(this.secrets.overlap);
                    let ready = this.held.split_to(out).freeze();
                    Poll::Ready(Some(Ok(Frame::data(ready))))
                }
                Err(frame) => Poll::Ready(Some(Ok(frame))),
            },
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => {
                this.done = true;
                let mut rest = std::mem::take(&mut this.held);
                this.secrets.mask(&mut rest);
                if rest.is_empty() {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Ok(Frame::data(rest.freeze()))))
                }
            }
        }
    }
}

/// A stream that yields `first` before reading `inner` (the bytes the
/// proxy read to learn the host name).
struct Replay<S> {
    first: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Replay<S> {
    fn new(first: Vec<u8>, inner: S) -> Replay<S> {
        Replay {
            first,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Replay<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.at < this.first.len() {
            let n = buf.remaining().min(this.first.len() - this.at);
            buf.put_slice(&this.first[this.at..this.at + n]);
            this.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replay<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, b)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The bytes read from and written to the sandbox's side.
#[derive(Clone, Default)]
struct Counts(Arc<(std::sync::atomic::AtomicU64, std::sync::atomic::AtomicU64)>);

impl Counts {
    fn get(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.0 .0.load(Relaxed), self.0 .1.load(Relaxed))
    }
}

struct Counted<S> {
    inner: S,
    counts: Counts,
}

impl<S> Counted<S> {
    fn new(inner: S) -> Counted<S> {
        Counted {
            inner,
            counts: Counts::default(),
        }
    }
    fn counts(&self) -> Counts {
        self.counts.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = (buf.filled().len() - before) as u64;
        self.counts
            .0
             .0
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        b: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, b);
        if let Poll::Ready(Ok(n)) = &r {
            self.counts
                .0
                 .1
                .fetch_add(*n as u64, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked(data: &[u8], secrets: &[&[u8]]) -> Vec<u8> {
        let secrets: Vec<Vec<u8>> = secrets.iter().map(|s| s.to_vec()).collect();
        let mut out = data.to_vec();
        Secrets::new(&secrets).mask(&mut out);
        out
    }

    #[test]
    fn secrets_are_masked_wherever_they_are() {
        let s: &[&[u8]] = &[b"sk-123"];
        assert_eq!(masked(b"a sk-123 b sk-123", s), b"a ****** b ******");
        assert_eq!(masked(b"sk-123sk-123", s), b"************");
        assert_eq!(masked(b"sk-12", s), b"sk-12");
        assert_eq!(masked(b"", s), b"");
        // Several secrets, one inside another's occurrence, and none.
        let two: &[&[u8]] = &[b"sk-123", b"123"];
        assert_eq!(masked(b"x sk-123 y 123", two), b"x ****** y ***");
        assert_eq!(masked(b"sk-123", &[b"" as &[u8]]), b"sk-123");
    }

    /// A secret cut across two, or three, frames of a reply is masked all
    /// the same, and every other byte arrives in order.
    #[tokio::test]
    async fn a_secret_split_across_frames_is_masked() {
        let frames: Vec<Result<Frame<Bytes>, Infallible>> =
            ["head sk-", "1", "23 mid sk-12", "3 tail"]
                .into_iter()
                .map(|f| Ok(Frame::data(Bytes::from(f))))
                .collect();
        let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let scrub = Scrub::new(body, Secrets::new(&[b"sk-123".to_vec()]));
        let got = scrub.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"head ****** mid ****** tail");
    }
}
