//! The gateway: one network namespace per daemon that every sandbox's
//! link leads to, and nowhere else.
//!
//! ```text
//!  sandbox netns               gateway netns (brig's)                   the daemon's netns
//!  eth0 10.88.x.y/32  ──veth──  b-<id> 10.87.0.1/32                       (the host, or a test world)
//!  default via 10.87.0.1        every address routed as local
//!                               BPF socket lookup:
//!                                 TCP ────────→ proxy ─ accepted socket ─→ proxy dials (port 53: resolver)
//!                                 UDP 53 ─────→ resolver ────────────────→ asks upstream
//!                                 other UDP ──→ UDP relay ─ a flow's socket ⇄ socket to the destination
//! ```
//!
//! Why it is shaped so:
//! - **The sandbox's namespace belongs to the host's user namespace**, not
//!   the sandbox's: root inside a sandbox has no capability over it, so it
//!   cannot change its address, routes or interfaces, or open raw sockets.
//! - **Nothing is forwarded.** The gateway namespace has forwarding off
//!   and no route anywhere but to the sandboxes; packets from a sandbox can
//!   only be delivered to the gateway itself. Every address is routed as
//!   local for packets from the sandboxes' range, and the BPF program of
//!   `sys.rs` hands each TCP connection to the proxy's one listener, each
//!   DNS datagram to the resolver and every other UDP datagram to the UDP
//!   relay (`udp.rs`), whatever the address; the proxy passes connections
//!   to port 53 to the resolver (DNS over TCP). Every other protocol (ICMP,
//!   IPv6) finds no socket and is refused. Sandboxes cannot reach each
//!   other: there is no path between links, and their addresses are in a
//!   private range the proxy and the relay always refuse.
//! - **Decisions and dials happen in the daemon's namespace** (the proxy,
//!   resolver and relay run there, with sockets made inside the gateway),
//!   so the host's firewall and routes are untouched: brig adds no rule to
//!   the host.
//! - **Each sandbox is known by its address**, which it cannot change;
//!   strict reverse-path filtering in the gateway drops a packet whose
//!   source is not the link's (defence in depth).
//!
//! The links are made over rtnetlink (`netlink.rs`), a few system calls
//! per sandbox.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use crate::netlink::{Route, Rtnl, MAIN_TABLE};
use crate::policy::Policy;
use crate::sys;

/// The gateway's address on every link: the sandboxes' next hop and DNS
/// server.
pub const GATEWAY_ADDR: Ipv4Addr = Ipv4Addr::new(10, 87, 0, 1);
/// Sandboxes get addresses from 10.88.0.0/16 (the first and last are not
/// used): 65,534 at once per daemon.
const SANDBOX_NET: [u8; 2] = [10, 88];
const SANDBOX_PREFIX: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 88, 0, 0), 16);
/// The routing table that makes every address local for the sandboxes.
const LOCAL_TABLE: u32 = 100;
/// The loopback link's index, in every namespace.
const LOOPBACK: u32 = 1;
/// The proxy's listening port in the gateway (any port would do: the
/// program assigns connections to the socket, not to the port).
const PROXY_PORT: u16 = 1;
/// The UDP relay's port in the gateway (as above).
const RELAY_PORT: u16 = 1;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot {op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error(
        "cannot {op}: the kernel refused: {source}{hint}",
        hint = if *veth && source.raw_os_error() == Some(libc::EOPNOTSUPP) { " (the kernel has no veth support: load the veth module)" } else { "" }
    )]
    Netlink {
        op: &'static str,
        /// The request made a veth pair.
        veth: bool,
        #[source]
        source: io::Error,
    },
    #[error("all {0} sandbox addresses are in use")]
    Exhausted(usize),
}

fn io_err(op: &'static str) -> impl FnOnce(io::Error) -> NetError {
    move |source| NetError::Io { op, source }
}

/// What the gateway knows of one attached sandbox; shared with the proxy
/// and the resolver.
pub struct SandboxNet {
    pub id: String,
    pub addr: Ipv4Addr,
    pub policy: RwLock<Policy>,
    /// What names resolved to, for this sandbox: address → names.
    pub resolved: RwLock<HashMap<IpAddr, Vec<String>>>,
    pub counters: crate::proxy::Counters,
    pub log: Mutex<crate::proxy::ConnectionLog>,
    /// The resolver's tasks answering on loopback inside the sandbox
    /// (`dns::serve_stub`), stopped when the sandbox is forgotten: each
    /// holds a socket, and with it the sandbox's namespace.
    stubs: Mutex<Vec<tokio::task::AbortHandle>>,
    /// Its UDP flows (`udp.rs`), ended when it is forgotten.
    pub(crate) udp: crate::udp::Flows,
    /// Its certificate authority, for header injection (`tls.rs`): made
    /// when first needed ([`SandboxNet::ca`]), since most sandboxes never
    /// inject a header, and trusting it costs a sandbox a copy of the
    /// host's bundle (about 220 KB on Debian) in its memory.
    ca: Mutex<Option<Arc<crate::tls::SandboxCa>>>,
    /// Where the secrets its injections name come from.
    secrets: RwLock<Option<Arc<dyn crate::inject::SecretSource>>>,
}

impl std::fmt::Debug for SandboxNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxNet")
            .field("id", &self.id)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl SandboxNet {
    /// Its certificate authority, made now if it was not.
    pub fn ca(&self) -> Result<Arc<crate::tls::SandboxCa>, crate::tls::TlsError> {
        let mut ca = self.ca.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ca) = &*ca {
            return Ok(Arc::clone(ca));
        }
        let made = Arc::new(crate::tls::SandboxCa::new(&self.id)?);
        *ca = Some(Arc::clone(&made));
        Ok(made)
    }

    /// Whether its policy sets headers on some host (and so needs its CA
    /// trusted).
    pub fn injects(&self) -> bool {
        !self
            .policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .inject
            .is_empty()
    }

    /// Did `name` resolve to `addr` for this sandbox (or is it one of its
    /// `--add-host` entries)?
    pub fn resolved_to(&self, name: &str, addr: IpAddr) -> bool {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let hosts = self.policy.read().unwrap_or_else(|e| e.into_inner());
        if hosts
            .hosts
            .iter()
            .any(|(h, a)| h.eq_ignore_ascii_case(&name) && *a == addr)
        {
            return true;
        }
        drop(hosts);
        self.resolved
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&addr)
            .is_some_and(|names| names.contains(&name))
    }

    /// Names this sandbox resolved to `addr`.
    pub fn names_of(&self, addr: IpAddr) -> Vec<String> {
        self.resolved
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&addr)
            .cloned()
            .unwrap_or_default()
    }

    /// Remember that `name` resolved to `addrs` (bounded: a sandbox that
    /// resolves without end keeps its first 4096 addresses).
    pub fn record(&self, name: &str, addrs: &[IpAddr]) {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let mut map = self.resolved.write().unwrap_or_else(|e| e.into_inner());
        for a in addrs {
            if map.len() >= 4096 && !map.contains_key(a) {
                break;
            }
            let names = map.entry(*a).or_default();
            if !names.contains(&name) && names.len() < 16 {
                names.push(name.clone());
            }
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replace its policy: new connections, lookups and UDP flows follow it
    /// at once, and open UDP flows it refuses end (an open TCP connection
    /// goes on). Writing `policy` directly skips the UDP check.
    pub fn set_policy(&self, policy: Policy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = policy;
        crate::udp::recheck(self);
    }

    /// How many UDP flows it has open (at most [`crate::udp::MAX_FLOWS`]).
    pub fn udp_flows(&self) -> usize {
        self.udp.len()
    }

    /// The source of its secrets, if one was given.
    pub fn secrets(&self) -> Option<Arc<dyn crate::inject::SecretSource>> {
        self.secrets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Where the secrets its injections name come from from now on.
    pub fn set_secrets(&self, source: Arc<dyn crate::inject::SecretSource>) {
        *self.secrets.write().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// Let go of what holds sockets for it: the resolver's loopback
    /// stubs, its UDP flows.
    fn release(&self) {
        for stub in self
            .stubs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            stub.abort();
        }
        self.udp.end_all("the sandbox was detached");
    }
}

/// A sandbox's end of the network: the namespace to start it in.
#[derive(Debug)]
pub struct Attachment {
    /// The sandbox's network namespace (loopback and `eth0` up, routes
    /// set), owned by the host's user namespace.
    pub netns: OwnedFd,
    pub addr: Ipv4Addr,
    pub net: Arc<SandboxNet>,
}

/// How the gateway is set up.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Where the gateway namespace is pinned, so that it outlives a daemon
    /// restart; `None`: a private gateway that goes with this process
    /// (`brig run`).
    pub pin: Option<Pin>,
    /// Resolvers the gateway asks for names a policy allows.
    pub upstream_dns: Vec<SocketAddr>,
    /// Loopback addresses a sandbox's resolv.conf may name (systemd-
    /// resolved's 127.0.0.53): the resolver also answers on port 53 of
    /// these inside each sandbox, where a question to them would never
    /// leave ([`default_loopback_dns`]).
    pub loopback_dns: Vec<Ipv4Addr>,
}

/// 127.0.0.53 and the IPv4 loopback nameservers of the host's
/// /etc/resolv.conf (what the `host` template shows sandboxes).
pub fn default_loopback_dns() -> Vec<Ipv4Addr> {
    let mut addrs = vec![Ipv4Addr::new(127, 0, 0, 53)];
    for ns in crate::dns::upstream_from_resolv_conf() {
        if let IpAddr::V4(a) = ns.ip() {
            if a.is_loopback() && !addrs.contains(&a) {
                addrs.push(a);
            }
        }
    }
    addrs
}

/// A pinned gateway namespace.
#[derive(Debug, Clone)]
pub struct Pin {
    /// The file the namespace is bind-mounted on.
    pub path: PathBuf,
    /// What the gateway belongs to (the daemon's database): written next to
    /// the pin, so that a later daemon can remove the pin of a home that
    /// no longer exists ([`reap_orphan_pins`]).
    pub owner: PathBuf,
}

/// The gateway of one daemon.
#[derive(Debug)]
pub struct Gateway {
    netns: OwnedFd,
    /// An rtnetlink socket acting in the gateway namespace.
    rtnl: Mutex<Rtnl>,
    /// The runtime the proxy, the resolver and the relay run on.
    runtime: tokio::runtime::Handle,
    pub(crate) sandboxes: RwLock<HashMap<Ipv4Addr, Arc<SandboxNet>>>,
    next: Mutex<u32>,
    pub(crate) config: GatewayConfig,
    _steering: sys::Steering,
}

impl Gateway {
    /// Open the pinned gateway namespace, or make it; steer its traffic to
    /// the proxy, the resolver and the UDP relay, which start as tasks on
    /// the current tokio runtime.
    pub fn start(config: GatewayConfig) -> Result<Arc<Gateway>, NetError> {
        let netns = match &config.pin {
            Some(pin) => open_or_make(pin)?,
            None => make_namespace(None)?,
        };
        let rtnl = sys::in_netns(&netns, Rtnl::open)
            .map_err(io_err("open a netlink socket in the gateway"))?;
        let (tcp, dns, udp) = sys::in_netns(&netns, || {
            let tcp = std::net::TcpListener::bind((GATEWAY_ADDR, PROXY_PORT)).and_then(|l| {
                sys::set_transparent(l.as_raw_fd())?;
                l.set_nonblocking(true)?;
                Ok(l)
            })?;
            // Both datagram sockets answer from the addresses the sandboxes
            // sent to, and read where each datagram was going.
            let datagrams = |port| {
                std::net::UdpSocket::bind((GATEWAY_ADDR, port)).and_then(|u| {
                    sys::set_transparent(u.as_raw_fd())?;
                    sys::set_recv_orig_dst(u.as_raw_fd())?;
                    u.set_nonblocking(true)?;
                    Ok(u)
                })
            };
            Ok((tcp, datagrams(53)?, datagrams(RELAY_PORT)?))
        })
        .map_err(io_err("open the proxy's sockets in the gateway namespace"))?;
        let steering = sys::steer(&netns, tcp.as_raw_fd(), dns.as_raw_fd(), udp.as_raw_fd())
            .map_err(io_err("steer the sandboxes' traffic to the proxy"))?;
        let gateway = Arc::new(Gateway {
            netns,
            rtnl: Mutex::new(rtnl),
            runtime: tokio::runtime::Handle::current(),
            sandboxes: RwLock::default(),
            next: Mutex::new(2),
            config,
            _steering: steering,
        });
        crate::proxy::spawn(Arc::clone(&gateway), tcp).map_err(io_err("start the proxy"))?;
        crate::dns::spawn(Arc::clone(&gateway), dns).map_err(io_err("start the resolver"))?;
        crate::udp::spawn(Arc::clone(&gateway), udp, &gateway.netns)
            .map_err(io_err("start the UDP relay"))?;
        Ok(gateway)
    }

    /// A new network namespace for sandbox `id`, linked to the gateway,
    /// under `policy`.
    pub fn attach(&self, id: &str, policy: Policy) -> Result<Attachment, NetError> {
        // Known (and its address taken) from the start; forgotten again if
        // the link cannot be made. The namespace, and with it both ends of
        // a half-made link, goes with its last descriptor.
        let net = self.register(id, self.allocate()?, policy, None);
        let addr = net.addr;
        match self.link(id, addr) {
            Ok((netns, stubs)) => {
                self.serve_stubs(&net, stubs);
                Ok(Attachment { netns, addr, net })
            }
            Err(e) => {
                self.detach(addr);
                Err(e)
            }
        }
    }

    fn serve_stubs(&self, net: &Arc<SandboxNet>, sockets: Vec<crate::dns::Stub>) {
        let mut stubs = net.stubs.lock().unwrap_or_else(|e| e.into_inner());
        for socket in sockets {
            match crate::dns::serve_stub(
                &self.runtime,
                Arc::clone(net),
                socket,
                self.config.upstream_dns.clone(),
            ) {
                Ok(task) => stubs.push(task),
                Err(e) => tracing::warn!(sandbox = net.id, "cannot answer DNS on loopback: {e}"),
            }
        }
    }

    /// A new namespace with `eth0` at `addr`, linked to the gateway.
    fn link(&self, id: &str, addr: Ipv4Addr) -> Result<(OwnedFd, Vec<crate::dns::Stub>), NetError> {
        let link = link_name(id);
        let stub_addrs = self.config.loopback_dns.clone();
        let (netns, mut rtnl, stubs) = sys::in_netns(&self.netns, move || {
            // A fresh namespace for the sandbox, made from inside the
            // gateway's (any thread's namespace would do: it is left), a
            // netlink socket acting in it, its loopback up, and the
            // resolver's sockets on its loopback addresses.
            // SAFETY: unshare on this short-lived thread only.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut rtnl = Rtnl::open()?;
            rtnl.up(LOOPBACK)?;
            let stubs = crate::dns::bind_stubs(&stub_addrs);
            Ok((sys::current()?, rtnl, stubs))
        })
        .map_err(io_err("make the sandbox's network namespace"))?;
        let nl =
            |op: &'static str, veth: bool| move |source| NetError::Netlink { op, veth, source };
        // The sandbox's side: `eth0` at `addr`, everything via the gateway.
        rtnl.add_veth("eth0", &link, self.netns.as_raw_fd())
            .map_err(nl("link the sandbox to the gateway", true))?;
        let eth0 = rtnl
            .index("eth0")
            .map_err(nl("find the sandbox's eth0", false))?;
        rtnl.add_address(eth0, addr, 32)
            .map_err(nl("address the sandbox's eth0", false))?;
        rtnl.up(eth0)
            .map_err(nl("set the sandbox's eth0 up", false))?;
        let route = |dst, prefix, via| Route {
            dst,
            prefix,
            via,
            oif: eth0,
            table: MAIN_TABLE,
            local: false,
        };
        rtnl.add_route(route(GATEWAY_ADDR, 32, None))
            .and_then(|()| rtnl.add_route(route(Ipv4Addr::UNSPECIFIED, 0, Some(GATEWAY_ADDR))))
            .map_err(nl("route the sandbox's traffic to the gateway", false))?;
        // The gateway's side: its address, and the way back to `addr`,
        // replacing any route there is to it: `addr` is free here, but the
        // link of a sandbox an earlier daemon gave it may still linger in
        // the gateway (its namespace is freed lazily by the kernel).
        let mut gw = self.rtnl.lock().unwrap_or_else(|e| e.into_inner());
        let peer = gw
            .index(&link)
            .map_err(nl("find the gateway's end of the link", false))?;
        gw.add_address(peer, GATEWAY_ADDR, 32)
            .and_then(|()| gw.up(peer))
            .and_then(|()| {
                gw.replace_route(Route {
                    dst: addr,
                    prefix: 32,
                    via: None,
                    oif: peer,
                    table: MAIN_TABLE,
                    local: false,
                })
            })
            .map_err(nl("configure the gateway's side of the link", false))?;
        Ok((netns, stubs))
    }

    /// Take back a sandbox an earlier daemon attached (its link is still
    /// in the gateway namespace): known again by `addr`, under `policy`.
    /// What it resolved before is forgotten; it resolves again.
    /// `netns`: its namespace, where the resolver answers on loopback
    /// again (the earlier daemon's sockets went with it).
    /// `ca`: the certificate authority it trusts (kept by the runtime), if
    /// one was made.
    pub fn readopt(
        &self,
        id: &str,
        addr: Ipv4Addr,
        policy: Policy,
        netns: Option<&OwnedFd>,
        ca: Option<crate::tls::SandboxCa>,
    ) -> Arc<SandboxNet> {
        let net = self.register(id, addr, policy, ca);
        if let Some(ns) = netns {
            let addrs = self.config.loopback_dns.clone();
            match sys::in_netns(ns, move || Ok(crate::dns::bind_stubs(&addrs))) {
                Ok(stubs) => self.serve_stubs(&net, stubs),
                Err(e) => tracing::warn!(sandbox = id, "cannot answer DNS on loopback: {e}"),
            }
        }
        net
    }

    fn register(
        &self,
        id: &str,
        addr: Ipv4Addr,
        policy: Policy,
        ca: Option<crate::tls::SandboxCa>,
    ) -> Arc<SandboxNet> {
        let net = Arc::new(SandboxNet {
            id: id.to_string(),
            addr,
            policy: RwLock::new(policy),
            resolved: RwLock::default(),
            counters: Default::default(),
            log: Mutex::default(),
            stubs: Mutex::default(),
            udp: Default::default(),
            ca: Mutex::new(ca.map(Arc::new)),
            secrets: RwLock::default(),
        });
        self.sandboxes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(addr, Arc::clone(&net));
        net
    }

    /// Forget sandbox `addr` (its namespace, and with it the link, goes
    /// with the sandbox).
    pub fn detach(&self, addr: Ipv4Addr) {
        let gone = self
            .sandboxes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&addr);
        if let Some(net) = gone {
            net.release();
        }
    }

    /// Forget `net`, if it is still the sandbox known at its address (the
    /// address may have gone to another sandbox since).
    pub fn forget(&self, net: &Arc<SandboxNet>) {
        let mut map = self.sandboxes.write().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&net.addr)
            .is_some_and(|known| Arc::ptr_eq(known, net))
        {
            map.remove(&net.addr);
        }
        net.release();
    }

    /// The sandbox at `addr`, if attached.
    /// The next whole datagram a linked sandbox sent to `socket` (a
    /// steered socket of the gateway, read into `buf`), with the sandbox's
    /// network; a datagram from no linked address, or cut by `buf`, is
    /// dropped. A failed receive is logged as `what`'s and waited out.
    pub(crate) async fn next_datagram(
        &self,
        socket: &tokio::net::UdpSocket,
        buf: &mut [u8],
        what: &str,
    ) -> (sys::Datagram, Arc<SandboxNet>) {
        loop {
            let got = socket
                .async_io(tokio::io::Interest::READABLE, || {
                    sys::recv_with_dst(socket.as_raw_fd(), buf)
                })
                .await;
            let dg = match got {
                Ok(dg) => dg,
                Err(e) => {
                    tracing::warn!("{what}: receive failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            if dg.truncated {
                continue;
            }
            if let Some(net) = self.sandbox(*dg.from.ip()) {
                return (dg, net);
            }
        }
    }

    pub fn sandbox(&self, addr: Ipv4Addr) -> Option<Arc<SandboxNet>> {
        self.sandboxes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&addr)
            .cloned()
    }

    /// Replace sandbox `addr`'s policy ([`SandboxNet::set_policy`]).
    pub fn set_policy(&self, addr: Ipv4Addr, policy: Policy) -> bool {
        match self.sandbox(addr) {
            Some(net) => {
                net.set_policy(policy);
                true
            }
            None => false,
        }
    }

    fn allocate(&self) -> Result<Ipv4Addr, NetError> {
        const SIZE: u32 = 1 << 16;
        let taken = self.sandboxes.read().unwrap_or_else(|e| e.into_inner());
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..SIZE {
            let n = *next;
            *next = if n + 1 >= SIZE - 1 { 2 } else { n + 1 };
            let addr = Ipv4Addr::new(SANDBOX_NET[0], SANDBOX_NET[1], (n >> 8) as u8, n as u8);
            if !taken.contains_key(&addr) {
                return Ok(addr);
            }
        }
        Err(NetError::Exhausted(SIZE as usize - 3))
    }
}

/// The sandbox address of the network namespace process `pid` is in, read
/// from the kernel's routing trie of that namespace (`/proc/<pid>/net`
/// shows the process's namespace): the local /32 in the sandboxes' range.
pub fn address_of_pid(pid: u32) -> Option<Ipv4Addr> {
    address_in(&format!("/proc/{pid}/net/fib_trie"))
}

/// The sandbox address of the network namespace the calling thread is in
/// (see [`address_of_pid`]).
pub fn address_here() -> Option<Ipv4Addr> {
    address_in("/proc/thread-self/net/fib_trie")
}

fn address_in(fib_trie: &str) -> Option<Ipv4Addr> {
    let trie = std::fs::read_to_string(fib_trie).ok()?;
    let mut last: Option<Ipv4Addr> = None;
    for line in trie.lines() {
        let t = line.trim_start_matches([' ', '|', '+', '-']).trim();
        if let Ok(a) = t.parse::<Ipv4Addr>() {
            last = Some(a);
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(a) = last {
                if a.octets()[..2] == SANDBOX_NET {
                    return Some(a);
                }
            }
        }
    }
    None
}

/// The kernel names a link by at most 15 bytes: `b-` and the first 12 of
/// the id.
fn link_name(id: &str) -> String {
    let short: String = id
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    format!("b-{short}")
}

/// The gateway namespace pinned at `pin`, made and configured if it is
/// not there (or was left half-made).
fn open_or_make(pin: &Pin) -> Result<OwnedFd, NetError> {
    let ready = pin.path.with_extension("ready");
    if ready.exists() {
        if let Ok(f) = std::fs::File::open(&pin.path) {
            return Ok(OwnedFd::from(f));
        }
    }
    remove_pin(&pin.path);
    if let Some(dir) = pin.path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err("create the gateway's directory"))?;
    }
    std::fs::File::create(&pin.path).map_err(io_err("create the gateway's pin file"))?;
    let ns = make_namespace(Some(&pin.path))?;
    std::fs::write(&ready, pin.owner.as_os_str().as_encoded_bytes())
        .map_err(io_err("mark the gateway ready"))?;
    Ok(ns)
}

/// A new gateway namespace, configured, bind-mounted on `pin` if given.
fn make_namespace(pin: Option<&Path>) -> Result<OwnedFd, NetError> {
    let pin_owned = pin.map(Path::to_path_buf);
    let ns = std::thread::spawn(move || -> io::Result<OwnedFd> {
        // SAFETY: unshare on this short-lived thread only.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } < 0 {
            return Err(io::Error::last_os_error());
        }
        if let Some(pin) = pin_owned {
            let src = c"/proc/thread-self/ns/net";
            let dst = std::ffi::CString::new(pin.as_os_str().as_encoded_bytes())
                .map_err(io::Error::other)?;
            // SAFETY: bind-mount between two NUL-terminated paths.
            if unsafe {
                libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND,
                    std::ptr::null(),
                )
            } < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        // Forwarding is off in a new namespace; these make the rest true:
        // a sandbox's packets must come from its own address, and nothing
        // answers pings for addresses that are not really here.
        for (key, value) in [
            ("net/ipv4/conf/all/rp_filter", "1"),
            ("net/ipv4/conf/default/rp_filter", "1"),
            ("net/ipv4/icmp_echo_ignore_all", "1"),
            ("net/ipv4/ip_forward", "0"),
        ] {
            std::fs::write(Path::new("/proc/sys").join(key), value)?;
        }
        // Every address is local for packets from the sandboxes (the
        // BPF program then finds the proxy's socket for them), and the
        // gateway's own address is on loopback.
        let mut rtnl = Rtnl::open()?;
        rtnl.up(LOOPBACK)?;
        rtnl.add_route(Route {
            dst: Ipv4Addr::UNSPECIFIED,
            prefix: 0,
            via: None,
            oif: LOOPBACK,
            table: LOCAL_TABLE,
            local: true,
        })?;
        rtnl.add_rule(SANDBOX_PREFIX.0, SANDBOX_PREFIX.1, LOCAL_TABLE, 100)?;
        rtnl.add_address(LOOPBACK, GATEWAY_ADDR, 32)?;
        sys::current()
    })
    .join()
    .map_err(|_| NetError::Io {
        op: "make the gateway namespace",
        source: io::Error::other("the thread panicked"),
    })?
    .map_err(io_err("make the gateway namespace"))?;
    Ok(ns)
}

/// Remove the gateway pins in `dir` whose owner no longer exists: a daemon
/// that crashed and whose home was then removed (its sandboxes are
/// discarded by the tier's own reconcile for the same reason). A pin
/// without a recorded owner is an orphan too.
pub fn reap_orphan_pins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "ready") {
            let owner = std::fs::read_to_string(&path).unwrap_or_default();
            if owner.is_empty() || !Path::new(&owner).exists() {
                remove_pin(&path.with_extension(""));
            }
        }
    }
}

/// Remove a pinned gateway namespace (it lives on while a sandbox's link
/// or a descriptor holds it).
pub fn remove_pin(pin: &Path) {
    let _ = std::fs::remove_file(pin.with_extension("ready"));
    if let Ok(c) = std::ffi::CString::new(pin.as_os_str().as_encoded_bytes()) {
        // SAFETY: umount of a NUL-terminated path; failure is fine.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    let _ = std::fs::remove_file(pin);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_fit_the_kernels_limit() {
        assert_eq!(link_name("0123456789abcdef"), "b-0123456789ab");
        assert!(link_name("0123456789abcdef").len() <= 15);
    }
}
