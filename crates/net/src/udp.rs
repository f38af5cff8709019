//! The UDP relay: every datagram a sandbox sends to a port other than 53
//! arrives here (see `gateway.rs` and the steering program of `sys.rs`),
//! and goes on only if the sandbox's policy admits its destination
//! ([`Policy::decide_udp`]: an IP or CIDR allow rule under brig's own
//! precedence; E2B's default accept under E2B's).
//!
//! ```text
//!  sandbox 10.88.0.2:5000 → 203.0.113.10:9999
//!   first datagram ─ BPF ─→ the relay's socket (gateway) ─ decide ─→ open a flow
//!   the flow:  gateway socket                     daemon's namespace
//!              bound 203.0.113.10:9999  ⇄ task ⇄  socket connected to
//!              connected 10.88.0.2:5000           203.0.113.10:9999
//! ```
//!
//! - **A flow** is (the sandbox's address and port, the destination's). Its
//!   first datagram reaches the relay's one socket, which reads where it
//!   was going (`IP_ORIGDSTADDR`), knows the sandbox by its source address
//!   (which it cannot change) and decides. An allowed flow gets two
//!   sockets: one in the daemon's namespace, connected to the destination,
//!   which sends the sandbox's datagrams and receives the replies; and one
//!   in the gateway, bound to the destination's address and port
//!   (transparent) and connected to the sandbox, which sends the replies
//!   *from* where the sandbox sent to — so a connected socket in the
//!   sandbox accepts them — and, being connected, receives the rest of the
//!   flow itself: the kernel finds a connected socket before it runs the
//!   steering program.
//! - **Bounds.** A flow ends after [`IDLE`] without a datagram either way.
//!   A sandbox has at most [`MAX_FLOWS`] open (two descriptors each, so a
//!   sandbox cannot exhaust the daemon's); a new flow past that ends the
//!   sandbox's least recently active one. UDP never says a flow is over, so
//!   refusing new flows instead would lock out, for a whole idle period, a
//!   client that makes many short ones (one socket per query).
//! - **Policy changes** apply to new flows, and re-check the open ones:
//!   those the new policy refuses end at once ([`recheck`], called by
//!   `SandboxNet::set_policy`).
//! - **An egress proxy** does not carry UDP: a sandbox with one sends none
//!   (fail closed; E2B: "UDP (DNS, QUIC) is not tunnelled").
//! - **Accounting.** Bytes count in the sandbox's counters as they move
//!   (`bytes_out` from the sandbox, `bytes_in` to it), and a new flow as an
//!   allowed connection. Each flow is one entry in the connection log
//!   (protocol `udp`) when it ends, with its bytes and, if it was ended
//!   from outside, why; a refused flow is one refused entry, logged once
//!   per [`IDLE`] rather than per datagram.
//!
//! The flows' gateway sockets are made by one thread that lives in the
//! gateway's namespace ([`Maker`]): a socket belongs to the namespace of
//! the thread that makes it, and tokio's threads are in the daemon's.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::{oneshot, Notify};

use crate::gateway::{Gateway, SandboxNet};
use crate::policy::{DenyReason, Policy, Verdict};
use crate::proxy::Entry;
use crate::sys;

/// A flow with no datagram either way for this long ends.
pub const IDLE: Duration = Duration::from_secs(60);
/// The most flows one sandbox has open at once.
pub const MAX_FLOWS: usize = 256;
/// Room for the largest datagram (an IPv4 UDP payload is at most 65,507
/// bytes).
const BUFFER: usize = 1 << 16;

/// (the sandbox's address, the destination's).
type Key = (SocketAddrV4, SocketAddrV4);

/// One sandbox's UDP flows, and the refusals it was lately logged for.
#[derive(Debug, Default)]
pub(crate) struct Flows {
    open: Mutex<HashMap<Key, Arc<Flow>>>,
    /// When each recently refused flow was logged.
    refused: Mutex<HashMap<Key, Instant>>,
}

impl Flows {
    pub(crate) fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn get(&self, key: &Key) -> Option<Arc<Flow>> {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    /// Add `flow`, ending the least recently active one if the sandbox has
    /// [`MAX_FLOWS`] already.
    fn insert(&self, key: Key, flow: Arc<Flow>) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= MAX_FLOWS {
            let oldest = open
                .iter()
                .min_by_key(|(_, f)| f.last.load(Ordering::Relaxed))
                .map(|(k, _)| *k);
            if let Some(old) = oldest.and_then(|k| open.remove(&k)) {
                old.end(format!(
                    "ended to make room: a sandbox has at most {MAX_FLOWS} UDP flows"
                ));
            }
        }
        open.insert(key, flow);
    }

    /// Forget `flow`, if it is still the one at `key`.
    fn remove(&self, key: &Key, flow: &Arc<Flow>) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.get(key).is_some_and(|f| Arc::ptr_eq(f, flow)) {
            open.remove(key);
        }
    }

    /// End every flow (the sandbox is forgotten).
    pub(crate) fn end_all(&self, why: &str) {
        let open: Vec<_> = self
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
            .collect();
        for (_, flow) in open {
            flow.end(why.to_string());
        }
    }

    /// Should the refusal of `key` be logged (not logged in the last
    /// [`IDLE`])? Bounded like the flows: past [`MAX_FLOWS`] remembered,
    /// the stale ones are forgotten, and if none is, all are.
    fn log_refusal(&self, key: Key) -> bool {
        let mut refused = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if refused.get(&key).is_some_and(|t| now - *t < IDLE) {
            return false;
        }
        if refused.len() >= MAX_FLOWS {
            refused.retain(|_, t| now - *t < IDLE);
            if refused.len() >= MAX_FLOWS {
                refused.clear();
            }
        }
        refused.insert(key, now);
        true
    }
}

/// One open flow, shared by its task and the table.
#[derive(Debug)]
struct Flow {
    /// Connected to the destination, in the daemon's namespace.
    upstream: Arc<UdpSocket>,
    /// When it was opened, in milliseconds since the Unix epoch (for the
    /// log).
    opened: u64,
    /// When a datagram last moved, in milliseconds since [`epoch`].
    last: AtomicU64,
    bytes_out: AtomicU64,
    bytes_in: AtomicU64,
    /// Why it was ended from outside; its task then logs it and ends.
    ended: Mutex<Option<String>>,
    stop: Notify,
}

/// The clock flows' activity is measured on.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now() -> u64 {
    epoch().elapsed().as_millis() as u64
}

impl Flow {
    fn end(&self, why: String) {
        *self.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
        // A permit is kept if the task is not waiting yet.
        self.stop.notify_one();
    }

    fn is_ended(&self) -> bool {
        self.ended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// How long since a datagram last moved.
    fn idle(&self) -> Duration {
        Duration::from_millis(now().saturating_sub(self.last.load(Ordering::Relaxed)))
    }

    /// Pass a datagram from the sandbox on to the destination (dropped if
    /// the socket's buffer is full, as a router would).
    fn send_out(&self, net: &SandboxNet, datagram: &[u8]) {
        if self.is_ended() {
            return;
        }
        self.last.store(now(), Ordering::Relaxed);
        if let Ok(n) = sys::send_now(self.upstream.as_raw_fd(), datagram) {
            self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
            net.counters
                .bytes_out
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }
}

/// Makes flows' gateway sockets ([`sys::flow_socket`]) on a thread inside
/// the gateway's namespace; the thread ends with the relay.
struct Maker {
    requests: mpsc::Sender<Request>,
}

/// (bind to, connect to, where the socket goes).
type Request = (
    SocketAddrV4,
    SocketAddrV4,
    oneshot::Sender<io::Result<std::net::UdpSocket>>,
);

impl Maker {
    fn start(netns: &OwnedFd) -> io::Result<Maker> {
        let ns = netns.try_clone()?;
        let (requests, incoming) = mpsc::channel::<Request>();
        let (ready, entered) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("brig-udp-flows".into())
            .spawn(move || {
                let inside = sys::enter(&ns);
                let ok = inside.is_ok();
                let _ = ready.send(inside);
                drop(ns);
                if ok {
                    for (local, peer, reply) in incoming {
                        let _ = reply.send(sys::flow_socket(local, peer));
                    }
                }
            })?;
        entered
            .recv()
            .map_err(|_| io::Error::other("the UDP flows' thread ended at once"))??;
        Ok(Maker { requests })
    }

    /// A gateway socket bound to `local` and connected to `peer`.
    async fn make(&self, local: SocketAddrV4, peer: SocketAddrV4) -> io::Result<UdpSocket> {
        let gone = || io::Error::other("the UDP flows' thread is gone");
        let (reply, socket) = oneshot::channel();
        self.requests
            .send((local, peer, reply))
            .map_err(|_| gone())?;
        UdpSocket::from_std(socket.await.map_err(|_| gone())??)
    }
}

/// Start relaying what reaches `socket` (bound in the gateway namespace
/// `netns`, transparent, with [`sys::set_recv_orig_dst`]).
pub(crate) fn spawn(
    gateway: Arc<Gateway>,
    socket: std::net::UdpSocket,
    netns: &OwnedFd,
) -> io::Result<()> {
    let maker = Maker::start(netns)?;
    let socket = UdpSocket::from_std(socket)?;
    tokio::spawn(async move {
        let mut buf = vec![0u8; BUFFER];
        loop {
            let (dg, net) = gateway.next_datagram(&socket, &mut buf, "UDP relay").await;
            let key = (dg.from, dg.to);
            let datagram = &buf[..dg.len];
            // A flow's datagrams reach its own socket once it is made;
            // those that came before wait here.
            if let Some(flow) = net.udp.get(&key) {
                flow.send_out(&net, datagram);
                continue;
            }
            let locals = sys::local_addresses();
            if let Err(reason) = verdict(&net, &net.policy(), dg.to, &locals) {
                refused(&net, key, reason);
                continue;
            }
            match open(&net, &maker, key, &locals).await {
                Ok(flow) => flow.send_out(&net, datagram),
                Err(e) => {
                    tracing::debug!(sandbox = net.id, dst = %dg.to, "UDP flow: {e}");
                    crate::proxy::log(
                        &net,
                        entry(key, true, Some(format!("cannot open the flow: {e}"))),
                    );
                }
            }
        }
    });
    Ok(())
}

/// Open the allowed flow `key`: its sockets, its place in the table, its
/// task. `locals` as for [`verdict`].
async fn open(
    net: &Arc<SandboxNet>,
    maker: &Maker,
    key: Key,
    locals: &[IpAddr],
) -> io::Result<Arc<Flow>> {
    let (sandbox, dst) = key;
    let upstream = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    upstream.connect(dst)?;
    upstream.set_nonblocking(true)?;
    let upstream = Arc::new(UdpSocket::from_std(upstream)?);
    let inner = maker.make(dst, sandbox).await?;
    let flow = Arc::new(Flow {
        upstream,
        opened: crate::proxy::now_ms(),
        last: AtomicU64::new(now()),
        bytes_out: AtomicU64::new(0),
        bytes_in: AtomicU64::new(0),
        ended: Mutex::default(),
        stop: Notify::new(),
    });
    net.counters.allowed.fetch_add(1, Ordering::Relaxed);
    net.udp.insert(key, Arc::clone(&flow));
    // The policy may have changed since it was read, before the flow was
    // in the table for `recheck` to see: read it again now that it is.
    if let Err(reason) = verdict(net, &net.policy(), dst, locals) {
        flow.end(format!("the policy changed: {reason}"));
    }
    tokio::spawn(run(Arc::clone(net), key, Arc::clone(&flow), inner));
    Ok(flow)
}

/// Relay one flow until it is idle for [`IDLE`] or ended from outside;
/// then log it.
async fn run(net: Arc<SandboxNet>, key: Key, flow: Arc<Flow>, inner: UdpSocket) {
    let upstream = Arc::clone(&flow.upstream);
    let mut buf = vec![0u8; BUFFER];
    let why = loop {
        let idle_at = tokio::time::Instant::now() + IDLE.saturating_sub(flow.idle());
        // Stopping first: a flow ended from outside passes nothing more on.
        tokio::select! {
            biased;
            () = flow.stop.notified() => {
                break flow.ended.lock().unwrap_or_else(|e| e.into_inner()).take();
            }
            () = tokio::time::sleep_until(idle_at) => {
                if flow.idle() >= IDLE {
                    break None;
                }
            }
            ready = inner.readable() => {
                if let Err(e) = ready {
                    break Some(format!("the sandbox's side failed: {e}"));
                }
                // Errors here are ICMP's news from the sandbox (its port
                // closed), reported once: the flow goes on.
                if let Ok(n) = inner.try_recv(&mut buf) {
                    flow.send_out(&net, &buf[..n]);
                }
            }
            ready = upstream.readable() => {
                if let Err(e) = ready {
                    break Some(format!("the destination's side failed: {e}"));
                }
                if let Ok(n) = upstream.try_recv(&mut buf) {
                    if flow.is_ended() {
                        continue;
                    }
                    flow.last.store(now(), Ordering::Relaxed);
                    if let Ok(n) = sys::send_now(inner.as_raw_fd(), &buf[..n]) {
                        flow.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                        net.counters.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
        }
    };
    net.udp.remove(&key, &flow);
    let mut done = entry(key, true, why);
    done.at = flow.opened;
    done.bytes_out = flow.bytes_out.load(Ordering::Relaxed);
    done.bytes_in = flow.bytes_in.load(Ordering::Relaxed);
    crate::proxy::log(&net, done);
}

/// May sandbox `net` send UDP to `dst` under `policy`? `locals`: the
/// daemon namespace's own addresses, never a destination.
fn verdict(
    net: &SandboxNet,
    policy: &Policy,
    dst: SocketAddrV4,
    locals: &[IpAddr],
) -> Result<(), DenyReason> {
    let addr = IpAddr::V4(*dst.ip());
    match policy.decide_udp(addr, dst.port(), &net.names_of(addr)) {
        Verdict::Deny(reason) => Err(reason),
        Verdict::Allow if locals.contains(&addr) => Err(DenyReason::Special("the host itself")),
        Verdict::Allow => Ok(()),
    }
}

/// Count and log a refused flow (once per [`IDLE`]).
fn refused(net: &SandboxNet, key: Key, reason: DenyReason) {
    if !net.udp.log_refusal(key) {
        return;
    }
    net.counters.denied.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(sandbox = net.id, dst = %key.1, %reason, "UDP refused");
    crate::proxy::log(net, entry(key, false, Some(reason.to_string())));
}

fn entry(key: Key, allowed: bool, reason: Option<String>) -> Entry {
    Entry {
        at: crate::proxy::now_ms(),
        protocol: "udp",
        destination: SocketAddr::V4(key.1),
        name: None,
        allowed,
        reason,
        bytes_out: 0,
        bytes_in: 0,
    }
}

/// Sandbox `net`'s policy changed: end the flows it no longer admits, and
/// log refusals afresh.
pub(crate) fn recheck(net: &SandboxNet) {
    let policy = net.policy();
    let locals = sys::local_addresses();
    net.udp
        .refused
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clear();
    let open: Vec<(Key, Arc<Flow>)> = net
        .udp
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(k, f)| (*k, Arc::clone(f)))
        .collect();
    for (key, flow) in open {
        if let Err(reason) = verdict(net, &policy, key.1, &locals) {
            net.udp.remove(&key, &flow);
            flow.end(format!("the policy changed: {reason}"));
        }
    }
}
