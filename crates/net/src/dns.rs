//! The sandboxes' resolver: every DNS datagram a sandbox sends, to any
//! address, arrives here (see `gateway.rs`).
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

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};
use tokio::io::Interest;
use tokio::net::UdpSocket;

use crate::gateway::{Gateway, SandboxNet};
use crate::sys;

/// How long an upstream resolver may take.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(3);
/// TTL of answers made from `--add-host` entries.
const HOSTS_TTL: u32 = 60;

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
        let mut buf = vec![0u8; 4096];
        loop {
            let got = socket
                .async_io(Interest::READABLE, || {
                    sys::recv_with_dst(socket.as_raw_fd(), &mut buf)
                })
                .await;
            let dg = match got {
                Ok(dg) => dg,
                Err(e) => {
                    tracing::warn!("resolver: receive failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(net) = gateway.sandbox(*dg.from.ip()) else {
                continue;
            };
            let query = buf[..dg.len].to_vec();
            let socket = Arc::clone(&socket);
            let upstream = gateway.config.upstream_dns.clone();
            tokio::spawn(async move {
                if let Some(answer) = answer(&net, &query, &upstream).await {
                    let _ = sys::send_from(socket.as_raw_fd(), &answer, dg.to, dg.from);
                }
            });
        }
    });
    Ok(())
}

/// Answer DNS on `socket`, bound on a loopback address inside sandbox
/// `net`'s namespace (a resolv.conf naming systemd-resolved's 127.0.0.53
/// asks there, where a question would never reach the gateway): the same
/// answers as the gateway's, sent back from that address. Ends when the
/// returned handle is aborted.
pub(crate) fn serve_stub(
    runtime: &tokio::runtime::Handle,
    net: Arc<SandboxNet>,
    socket: std::net::UdpSocket,
    upstream: Vec<SocketAddr>,
) -> std::io::Result<tokio::task::AbortHandle> {
    socket.set_nonblocking(true)?;
    let socket = {
        let _in = runtime.enter();
        Arc::new(UdpSocket::from_std(socket)?)
    };
    let task = runtime.spawn(async move {
        let mut buf = vec![0u8; 4096];
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
                if let Some(answer) = answer(&net, &query, &upstream).await {
                    let _ = socket.send_to(&answer, from).await;
                }
            });
        }
    });
    Ok(task.abort_handle())
}

/// The answer to one query from `net`, or `None` to stay silent (a
/// datagram that is not a query).
async fn answer(net: &SandboxNet, query: &[u8], upstream: &[SocketAddr]) -> Option<Vec<u8>> {
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
    let Some(raw) = ask_upstream(query, msg.id(), upstream).await else {
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
async fn ask_upstream(query: &[u8], id: u16, upstream: &[SocketAddr]) -> Option<Vec<u8>> {
    for server in upstream {
        let bind: SocketAddr = if server.is_ipv4() {
            "0.0.0.0:0".parse().ok()?
        } else {
            "[::]:0".parse().ok()?
        };
        let Ok(sock) = UdpSocket::bind(bind).await else {
            continue;
        };
        if sock.connect(server).await.is_err() || sock.send(query).await.is_err() {
            continue;
        }
        let mut buf = vec![0u8; 4096];
        let deadline = tokio::time::Instant::now() + UPSTREAM_TIMEOUT;
        while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, sock.recv(&mut buf)).await {
            if n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == id {
                buf.truncate(n);
                return Some(buf);
            }
        }
    }
    None
}
