//! The sandboxes' resolver: every DNS datagram a sandbox sends, and every
//! TCP connection to port 53, to any address, arrives here (see
//! `gateway.rs`; the proxy hands TCP over).
//!
//! - A name the sandbox's `--add-host` entries list is answered from them.
//! - A name the policy allows is asked of the upstream resolvers; the
//!   answer goes back unchanged, and the addresses in it are recorded for
//!   this sandbox — the proxy lets a domain rule match only a connection
//!   to an address its name resolved to here.
//! - Any other name is refused (`REFUSED`), so a disallowed name cannot be
//!   used to carry data out through DNS.
//! - `AAAA` questions for allowed names are answered with no records:
//!   sandboxes have no IPv6 route, and an empty answer makes clients use
//!   IPv4 at once instead of trying IPv6 first.
//!
//! The answer is sent from the address the sandbox asked, so a client
//! configured with any resolver (8.8.8.8, the template's resolv.conf) gets
//! its answer from where it expects.
//!
//! Over TCP (RFC 1035 §4.2.2: each message after its 2-byte length;
//! clients retry there when a UDP answer is truncated, or use it from the
//! start) the answers are the same ones, several queries to a connection,
//! answered in order. A connection ends after [`TCP_IDLE`] without a
//! query, or at a query longer than [`MAX_QUERY`]. Its questions are
//! asked of the upstream resolvers over UDP first, and again over TCP if
//! that answer is truncated, so the sandbox gets the whole answer it
//! retried for.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

use crate::gateway::{Gateway, SandboxNet};
use crate::sys;

/// How long an upstream resolver may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// TTL of answers made from `--add-host` entries.
const HOSTS_TTL: u32 = 60;
/// The longest query read, over UDP or TCP (queries are tens of bytes; a
/// longer datagram is dropped, a longer TCP message ends the connection).
pub const MAX_QUERY: usize = 4096;
/// How long a DNS-over-TCP connection may wait for its next query (and a
/// query take to arrive whole).
pub const TCP_IDLE: Duration = Duration::from_secs(10);

/// The `nameserver` lines of `/etc/resolv.conf`, on port 53.
pub fn upstream_from_resolv_conf() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

pub(crate) fn spawn(gateway: Arc<Gateway>, socket: std::net::UdpSocket) -> std::io::Result<()> {
    let socket = Arc::new(UdpSocket::from_std(socket)?);
    tokio::spawn(async move {
        let mut buf = vec![0u8; MAX_QUERY];
        loop {
            let (dg, net) = gateway.next_datagram(&socket, &mut buf, "resolver").await;
            let query = buf[..dg.len].to_vec();
            let socket = Arc::clone(&socket);
            let upstream = gateway.config.upstream_dns.clone();
            tokio::spawn(async move {
                if let Some(answer) = answer(&net, &query, &upstream, false).await {
                    let _ = sys::send_from(socket.as_raw_fd(), &answer, *dg.to.ip(), dg.from);
                }
            });
        }
    });
    Ok(())
}

/// A socket the resolver answers on inside a sandbox.
#[derive(Debug)]
pub(crate) enum Stub {
    Udp(std::net::UdpSocket),
    /// Listening.
    Tcp(std::net::TcpListener),
}

/// UDP and TCP sockets on port 53 of `addrs`, in the calling thread's
/// namespace (a sandbox's, its loopback up). One that cannot be bound is
/// left out: that address answers nothing there, as without brig.
pub(crate) fn bind_stubs(addrs: &[std::net::Ipv4Addr]) -> Vec<Stub> {
    let mut stubs = Vec::new();
    for a in addrs {
        stubs.extend(std::net::UdpSocket::bind((*a, 53)).ok().map(Stub::Udp));
        stubs.extend(std::net::TcpListener::bind((*a, 53)).ok().map(Stub::Tcp));
    }
    stubs
}

/// Answer DNS on `stub`, bound on a loopback address inside sandbox
/// `net`'s namespace (a resolv.conf naming systemd-resolved's 127.0.0.53
/// asks there, where a question would never reach the gateway): the same
/// answers as the gateway's, sent back from that address. Ends when the
/// returned handle is aborted (a DNS-over-TCP connection it accepted
/// lasts until it is idle).
pub(crate) fn serve_stub(
    runtime: &tokio::runtime::Handle,
    net: Arc<SandboxNet>,
    stub: Stub,
    upstream: Vec<SocketAddr>,
) -> std::io::Result<tokio::task::AbortHandle> {
    let _in = runtime.enter();
    let task = match stub {
        Stub::Udp(socket) => {
            socket.set_nonblocking(true)?;
            let socket = Arc::new(UdpSocket::from_std(socket)?);
            runtime.spawn(serve_udp_stub(net, socket, upstream))
        }
        Stub::Tcp(listener) => {
            listener.set_nonblocking(true)?;
            let listener = TcpListener::from_std(listener)?;
            runtime.spawn(async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            tokio::spawn(serve_tcp(Arc::clone(&net), stream, upstream.clone()));
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            })
        }
    };
    Ok(task.abort_handle())
}

async fn serve_udp_stub(net: Arc<SandboxNet>, socket: Arc<UdpSocket>, upstream: Vec<SocketAddr>) {
    let mut buf = vec![0u8; MAX_QUERY];
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let query = buf[..n].to_vec();
        let (socket, net, upstream) = (Arc::clone(&socket), Arc::clone(&net), upstream.clone());
        tokio::spawn(async move {
            if let Some(answer) = answer(&net, &query, &upstream, false).await {
                let _ = socket.send_to(&answer, from).await;
            }
        });
    }
}

/// Answer the DNS-over-TCP connection `stream` from sandbox `net`: each
/// query after its 2-byte length, answered the same way, in order, until
/// the client closes, is idle for [`TCP_IDLE`], sends a query longer than
/// [`MAX_QUERY`] or something that is not a query.
pub(crate) async fn serve_tcp(
    net: Arc<SandboxNet>,
    mut stream: TcpStream,
    upstream: Vec<SocketAddr>,
) {
    let mut query = Vec::with_capacity(512);
    loop {
        let read = async {
            let len = usize::from(stream.read_u16().await?);
            if len == 0 || len > MAX_QUERY {
                return Err(std::io::Error::other("a query of no or too many bytes"));
            }
            query.resize(len, 0);
            stream.read_exact(&mut query).await.map(drop)
        };
        match tokio::time::timeout(TCP_IDLE, read).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) | Err(_) => return,
        }
        let Some(answer) = answer(&net, &query, &upstream, true).await else {
            return;
        };
        let Ok(len) = u16::try_from(answer.len()) else {
            return;
        };
        let mut framed = Vec::with_capacity(2 + answer.len());
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&answer);
        if stream.write_all(&framed).await.is_err() {
            return;
        }
    }
}

/// The answer to one query from `net`, or `None` to stay silent (a
/// message that is not a query). `tcp`: the query came over TCP, where a
/// truncated answer will not do.
async fn answer(
    net: &SandboxNet,
    query: &[u8],
    upstream: &[SocketAddr],
    tcp: bool,
) -> Option<Vec<u8>> {
    let msg = Message::from_vec(query).ok()?;
    if msg.message_type() != MessageType::Query {
        return None;
    }
    let Some(question) = msg.queries().first() else {
        return reply(&msg, ResponseCode::FormErr, Vec::new());
    };
    let name = question.name().to_ascii();
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let policy = net.policy();
    if policy.mode == crate::policy::Mode::None {
        return reply(&msg, ResponseCode::Refused, Vec::new());
    }
    // --add-host entries first, as /etc/hosts would be.
    let hosts: Vec<IpAddr> = policy
        .hosts
        .iter()
        .filter(|(h, _)| h.eq_ignore_ascii_case(&name))
        .map(|(_, a)| *a)
        .collect();
    if !hosts.is_empty() {
        let records = hosts
            .iter()
            .filter_map(|a| match (a, question.query_type()) {
                (IpAddr::V4(v4), RecordType::A) => Some(RData::A((*v4).into())),
                (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA((*v6).into())),
                _ => None,
            })
            .map(|rdata| Record::from_rdata(question.name().clone(), HOSTS_TTL, rdata))
            .collect();
        return reply(&msg, ResponseCode::NoError, records);
    }
    if !policy.allows_name(&name) {
        tracing::debug!(sandbox = net.id, name, "lookup refused");
        return reply(&msg, ResponseCode::Refused, Vec::new());
    }
    if question.query_type() == RecordType::AAAA {
        return reply(&msg, ResponseCode::NoError, Vec::new());
    }
    let Some(raw) = ask_upstream(query, msg.id(), upstream, tcp).await else {
        return reply(&msg, ResponseCode::ServFail, Vec::new());
    };
    if let Ok(got) = Message::from_vec(&raw) {
        // Every address in the answer counts for the name asked (and for
        // the names of the CNAME chain, which the answer also holds).
        let addrs: Vec<IpAddr> = got
            .answers()
            .iter()
            .filter_map(|r| match r.data() {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect();
        net.record(&name, &addrs);
        for r in got.answers() {
            let owner = r.name().to_ascii();
            let owner = owner.trim_end_matches('.').to_ascii_lowercase();
            if owner != name && policy.allows_name(&owner) {
                net.record(&owner, &addrs);
            }
        }
    }
    Some(raw)
}

/// A response to `query` with `code` and `answers`.
fn reply(query: &Message, code: ResponseCode, answers: Vec<Record>) -> Option<Vec<u8>> {
    let mut msg = Message::new();
    msg.set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(query.op_code())
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true)
        .set_response_code(code);
    msg.add_queries(query.queries().to_vec());
    msg.add_answers(answers);
    msg.to_vec().ok()
}

/// Send `query` to each upstream in turn; the first answer with its id.
/// `whole`: an answer truncated over UDP is asked again over TCP.
async fn ask_upstream(
    query: &[u8],
    id: u16,
    upstream: &[SocketAddr],
    whole: bool,
) -> Option<Vec<u8>> {
    for server in upstream {
        let Some(answer) = ask_udp(query, id, *server).await else {
            continue;
        };
        // The TC flag: byte 2, bit 1.
        let truncated = answer.get(2).is_some_and(|b| b & 0x02 != 0);
        if whole && truncated {
            if let Some(full) = ask_tcp(query, id, *server).await {
                return Some(full);
            }
        }
        return Some(answer);
    }
    None
}

async fn ask_udp(query: &[u8], id: u16, server: SocketAddr) -> Option<Vec<u8>> {
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().ok()?
    } else {
        "[::]:0".parse().ok()?
    };
    let sock = UdpSocket::bind(bind).await.ok()?;
    sock.connect(server).await.ok()?;
    sock.send(query).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let deadline = tokio::time::Instant::now() + UPSTREAM_TIMEOUT;
    while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
        if n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == id {
            buf.truncate(n);
            return Some(buf);
        }
    }
    None
}

async fn ask_tcp(query: &[u8], id: u16, server: SocketAddr) -> Option<Vec<u8>> {
    let exchange = async {
        let mut s = TcpStream::connect(server).await?;
        let len = u16::try_from(query.len()).map_err(std::io::Error::other)?;
        let mut framed = len.to_be_bytes().to_vec();
        framed.extend_from_slice(query);
        s.write_all(&framed).await?;
        let n = usize::from(s.read_u16().await?);
        let mut answer = vec![0u8; n];
        s.read_exact(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(UPSTREAM_TIMEOUT, exchange)
        .await
        .ok()?
        .ok()?;
    (answer.len() >= 2 && u16::from_be_bytes([answer[0], answer[1]]) == id).then_some(answer)
}
