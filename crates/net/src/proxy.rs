//! The egress proxy: every TCP connection a sandbox opens arrives here
//! (see `gateway.rs`), is decided by the sandbox's policy, and is either
//! refused (closed at once) or dialled from the daemon's namespace and
//! spliced. A connection to port 53 is DNS over TCP, whatever its
//! address: the resolver answers it (`dns.rs`), as it answers UDP.
//!
//! A connection is decided on its address first. Only when that is not
//! enough — the policy has domain rules and the address alone is not
//! allowed, or a deny rule names a domain — does the proxy read the
//! client's first bytes for the TLS SNI or HTTP Host (without consuming
//! them: they are sent on once the connection is allowed). A name counts
//! only together with an address that name resolved to *for this sandbox*
//! through brig's resolver, so a forged Host or SNI, an IP literal, or a
//! DNS answer rebound to another address gains nothing.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::gateway::{Gateway, SandboxNet};
use crate::peek::{self, Peeked};
use crate::policy::{Destination, Mode, Policy, Verdict};

/// How long a client may take to send the bytes that name its
/// destination.
const PEEK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a dial may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Entries kept in a sandbox's connection log.
pub const LOG_ENTRIES: usize = 1000;

/// Bytes and connections of one sandbox, since it was attached.
#[derive(Debug, Default)]
pub struct Counters {
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
}

/// One connection a sandbox tried.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Entry {
    /// Milliseconds since the epoch.
    pub at: u64,
    pub protocol: &'static str,
    pub destination: SocketAddr,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub bytes_out: u64,
    pub bytes_in: u64,
}

/// The last [`LOG_ENTRIES`] connections of a sandbox.
#[derive(Debug, Default)]
pub struct ConnectionLog {
    entries: VecDeque<Entry>,
}

impl ConnectionLog {
    pub fn push(&mut self, entry: Entry) {
        if self.entries.len() == LOG_ENTRIES {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.entries.iter().cloned().collect()
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Start accepting on `listener` (made in the gateway namespace).
pub(crate) fn spawn(gateway: Arc<Gateway>, listener: std::net::TcpListener) -> std::io::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let gateway = Arc::clone(&gateway);
                    tokio::spawn(async move { serve(gateway, stream, peer).await });
                }
                Err(e) => {
                    // Out of descriptors, most likely: back off, go on.
                    tracing::warn!("egress proxy: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    Ok(())
}

/// Does deciding need the name the client will send?
fn needs_name(policy: &Policy, verdict: &Verdict) -> bool {
    let has_domains = |rules: &[crate::policy::Rule]| {
        rules
            .iter()
            .any(|r| !matches!(r.target, crate::policy::Target::Net(_)))
    };
    match verdict {
        // A connection that may get headers is known by its name.
        Verdict::Allow => has_domains(&policy.deny) || !policy.inject.is_empty(),
        Verdict::Deny(_) => policy.mode == Mode::Allow && has_domains(&policy.allow),
    }
}

async fn serve(gateway: Arc<Gateway>, mut client: TcpStream, peer: SocketAddr) {
    let IpAddr::V4(from) = peer.ip() else {
        return;
    };
    let Some(net) = gateway.sandbox(from) else {
        // Not (or no longer) a sandbox of this gateway.
        return;
    };
    let Ok(dst) = client.local_addr() else {
        return;
    };
    // DNS over TCP, to any address, is the resolver's, as over UDP.
    if dst.port() == 53 {
        crate::dns::serve_tcp(net, client, gateway.config.upstream_dns.clone()).await;
        return;
    }
    let policy = net.policy();
    let mut first = Vec::new();
    let mut name = None;
    let mut verdict = decide(&policy, &net, dst, None);
    if needs_name(&policy, &verdict) {
        name = read_name(&mut client, &mut first).await;
        verdict = decide(&policy, &net, dst, name.as_deref());
    }
    // The host itself is never a destination, whatever the policy says:
    // its addresses are the daemon namespace's own.
    if matches!(verdict, Verdict::Allow) && is_local(dst.ip()) {
        verdict = Verdict::Deny(crate::policy::DenyReason::Special("the host itself"));
    }
    // A connection that would get a secret goes only to an address its name
    // resolved to for this sandbox: a forged Host or SNI towards another
    // address (plain HTTP has no certificate to give it away) gets nothing.
    if let (Verdict::Allow, Some(n)) = (&verdict, name.as_deref()) {
        if !policy.injections_for(n).is_empty() && !net.resolved_to(n, dst.ip()) {
            verdict = Verdict::Deny(crate::policy::DenyReason::NameMismatch);
        }
    }
    let mut entry = Entry {
        at: now_ms(),
        protocol: "tcp",
        destination: dst,
        name: name.clone(),
        allowed: false,
        reason: None,
        bytes_out: 0,
        bytes_in: 0,
    };
    if let Verdict::Deny(reason) = verdict {
        net.counters.denied.fetch_add(1, Ordering::Relaxed);
        entry.reason = Some(reason.to_string());
        tracing::debug!(sandbox = net.id, %dst, ?name, %reason, "egress refused");
        log(&net, entry);
        return;
    }
    net.counters.allowed.fetch_add(1, Ordering::Relaxed);
    let dial = dial(policy.egress_proxy.as_ref(), dst, name.as_deref());
    let upstream = match tokio::time::timeout(DIAL_TIMEOUT, dial).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            entry.allowed = true;
            entry.reason = Some(format!("dial failed: {e}"));
            log(&net, entry);
            return;
        }
        Err(_) => {
            entry.allowed = true;
            entry.reason = Some("dial timed out".into());
            log(&net, entry);
            return;
        }
    };
    entry.allowed = true;
    let injecting = name
        .as_deref()
        .filter(|n| !policy.injections_for(n).is_empty())
        .map(str::to_string);
    let (out, inn) = match injecting {
        Some(host) => {
            let tls = matches!(peek::tls_sni(&first), Peeked::Name(_));
            crate::inject::relay(Arc::clone(&net), client, first, upstream, host, tls)
                .await
                .unwrap_or_else(|e| {
                    tracing::debug!(sandbox = net.id, "header injection: {e}");
                    (0, 0)
                })
        }
        None => pass_through(client, upstream, &first).await,
    };
    net.counters.bytes_out.fetch_add(out, Ordering::Relaxed);
    net.counters.bytes_in.fetch_add(inn, Ordering::Relaxed);
    entry.bytes_out = out;
    entry.bytes_in = inn;
    log(&net, entry);
}

/// A connection to `dst`: directly, or through the SOCKS5 `proxy` (to
/// `name` when the connection named its host, as E2B's proxy does), never
/// around it.
async fn dial(
    proxy: Option<&crate::policy::EgressProxy>,
    dst: SocketAddr,
    name: Option<&str>,
) -> std::io::Result<TcpStream> {
    let Some(proxy) = proxy else {
        return TcpStream::connect(dst).await;
    };
    // The proxy's address, resolved here and checked like any destination.
    let at = tokio::net::lookup_host(&proxy.address)
        .await?
        .find(|a| {
            crate::policy::special_range(crate::policy::canonical_addr(a.ip())).is_none()
                && !is_local(a.ip())
        })
        .ok_or_else(|| {
            std::io::Error::other(format!(
                "the egress proxy {} resolves to no address a sandbox may reach",
                proxy.address
            ))
        })?;
    let socks = |e: tokio_socks::Error| {
        std::io::Error::other(format!("egress proxy {}: {e}", proxy.address))
    };
    let target = match name {
        Some(n) => tokio_socks::TargetAddr::Domain(n.into(), dst.port()),
        None => tokio_socks::TargetAddr::Ip(dst),
    };
    let stream = match &proxy.username {
        Some(user) => {
            let password = proxy.password.as_deref().unwrap_or("");
            tokio_socks::tcp::Socks5Stream::connect_with_password(at, target, user, password).await
        }
        None => tokio_socks::tcp::Socks5Stream::connect(at, target).await,
    }
    .map_err(socks)?;
    Ok(stream.into_inner())
}

pub(crate) fn log(net: &SandboxNet, entry: Entry) {
    net.log
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(entry);
}

fn decide(policy: &Policy, net: &SandboxNet, dst: SocketAddr, name: Option<&str>) -> Verdict {
    let names = net.names_of(dst.ip());
    let resolved = |n: &str, a: IpAddr| net.resolved_to(n, a);
    policy.decide(&Destination {
        addr: dst.ip(),
        port: dst.port(),
        name,
        resolved: &resolved,
        names_of_addr: &names,
    })
}

/// Read (and keep) the client's first bytes until they name a host, say
/// there is none, or [`peek::PEEK_LIMIT`] or the timeout is reached.
async fn read_name(client: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let deadline = tokio::time::Instant::now() + PEEK_TIMEOUT;
    let mut chunk = [0u8; 4096];
    loop {
        let (tls, http) = (peek::tls_sni(buf), peek::http_host(buf));
        if let Peeked::Name(n) = tls {
            return Some(n);
        }
        if let Peeked::Name(n) = http {
            return Some(n);
        }
        let more =
            buf.is_empty() || matches!(tls, Peeked::NeedMore) || matches!(http, Peeked::NeedMore);
        if !more || buf.len() >= peek::PEEK_LIMIT {
            return None;
        }
        let n = match tokio::time::timeout_at(deadline, client.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) | Err(_) => return None,
            Ok(Ok(n)) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Relay both ways until both sides are done (`relay.rs`); the bytes each
/// way. `first`: what the client sent while its name was read.
async fn pass_through(client: TcpStream, mut upstream: TcpStream, first: &[u8]) -> (u64, u64) {
    if !first.is_empty() && upstream.write_all(first).await.is_err() {
        return (0, 0);
    }
    match crate::relay::relay(&client, &upstream).await {
        Ok((out, inn)) => (out + first.len() as u64, inn),
        Err(_) => (first.len() as u64, 0),
    }
}

/// Is `addr` one of the daemon namespace's own addresses?
fn is_local(addr: IpAddr) -> bool {
    crate::sys::local_addresses().contains(&addr)
}
