//! The gateway against a test world of its own: every packet stays in
//! network namespaces this test makes.
//!
//! ```text
//!  sandbox netns ──veth── gateway netns        "daemon" netns D            world netns W
//!                          (brig-net)          198.51.100.1 (the host) ──veth── 198.51.100.2
//!                                              proxy, resolver, relay here     203.0.113.10 allowed.test  :80 :443, udp :9999
//!                                                                              203.0.113.11 other.test    :80
//!                                                                              203.0.113.53 DNS (UDP, TCP)
//!                                                                              192.168.1.10 (private)     :80, udp :9999
//!                                                                              169.254.169.254 (metadata) :80, udp :9999
//! ```
//!
//! Each test's thread moves into its own D (network namespaces are per
//! thread), builds its tokio runtime there (workers inherit it), and
//! starts a gateway pinned in a temporary directory. Needs root; skips
//! with the reason otherwise.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use brig_net::policy::{EgressProxy, Policy, Precedence};
use brig_net::{Gateway, GatewayConfig, Mode, GATEWAY_ADDR};
use brig_test_support::networld::{
    enter_fd, serve_http, serve_udp_echo, NetWorld, ALLOWED, BIG_RECORDS, DNS, HOST, METADATA,
    OTHER, PRIVATE, SOCKS, UDP_ECHO_PORT,
};
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};

/// The world, this test's gateway in its host namespace, and the
/// runtime the gateway's proxy and resolver run on.
struct World {
    pin: std::path::PathBuf,
    pin_dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
    gateway: Arc<Gateway>,
    // Last: the namespaces go after the gateway's pin.
    _net: NetWorld,
}

impl Drop for World {
    fn drop(&mut self) {
        brig_net::gateway::remove_pin(&self.pin);
    }
}

fn world(tag: &str) -> Option<World> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let why = "network namespaces and BPF need root";
        assert!(!brig_test_support::strict(), "{why}");
        eprintln!("skipped: {why}");
        return None;
    }
    let net = NetWorld::build(tag);
    // The host's own service.
    serve_http(SocketAddr::new(HOST.into(), 8080));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let pin_dir = tempfile::tempdir().unwrap();
    let pin = pin_dir.path().join("gw");
    let gateway = start_gateway(&rt, &pin, pin_dir.path());
    Some(World {
        pin,
        pin_dir,
        rt,
        gateway,
        _net: net,
    })
}

fn start_gateway(
    rt: &tokio::runtime::Runtime,
    pin: &std::path::Path,
    owner: &std::path::Path,
) -> Arc<Gateway> {
    let _guard = rt.enter();
    Gateway::start(GatewayConfig {
        pin: Some(brig_net::Pin {
            path: pin.to_path_buf(),
            owner: owner.to_path_buf(),
        }),
        upstream_dns: vec![SocketAddr::new(DNS.into(), 53)],
        loopback_dns: brig_net::gateway::default_loopback_dns(),
    })
    .expect("start the gateway")
}

/// Run `f` in the sandbox's namespace.
fn in_sandbox<T: Send + 'static>(ns: &OwnedFd, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.try_clone().unwrap();
    std::thread::spawn(move || {
        enter_fd(&ns);
        f()
    })
    .join()
    .unwrap()
}

/// What an HTTP request to `addr` with `host` got back: the body, or
/// None if the connection was refused or closed without an answer.
fn get(addr: SocketAddr, host: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .ok()?;
    body(&mut s)
}

/// The body of the HTTP response on `s`, or None if there was none.
fn body(s: &mut TcpStream) -> Option<String> {
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// A TLS ClientHello naming `sni` (enough for the proxy to read; the
/// world's server answers plain text).
fn client_hello(sni: &str) -> Vec<u8> {
    let name = sni.as_bytes();
    let mut sni_ext = Vec::new();
    sni_ext.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
    sni_ext.push(0);
    sni_ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
    sni_ext.extend_from_slice(name);
    let mut exts = Vec::new();
    exts.extend_from_slice(&0u16.to_be_bytes());
    exts.extend_from_slice(&(sni_ext.len() as u16).to_be_bytes());
    exts.extend_from_slice(&sni_ext);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01]);
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

fn tls(addr: SocketAddr, sni: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(&client_hello(sni)).ok()?;
    body(&mut s)
}

/// Resolve `name` (A) through whatever address the sandbox asks: the
/// response code and the addresses.
fn lookup(server: Ipv4Addr, name: &str) -> Option<(ResponseCode, Vec<Ipv4Addr>)> {
    let u = UdpSocket::bind("0.0.0.0:0").unwrap();
    u.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    u.send_to(&query(4242, name), (server, 53)).ok()?;
    let mut buf = [0u8; 1024];
    let (n, from) = u.recv_from(&mut buf).ok()?;
    assert_eq!(
        from.ip(),
        IpAddr::V4(server),
        "the answer comes from where it was asked"
    );
    let r = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(r.id(), 4242);
    Some(answer_of(&r))
}

/// A query for `name`'s A records.
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Message::new();
    q.set_id(id).set_recursion_desired(true);
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    q.to_vec().unwrap()
}

/// The response code and the A records of a response.
fn answer_of(r: &Message) -> (ResponseCode, Vec<Ipv4Addr>) {
    let addrs = r
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    (r.response_code(), addrs)
}

/// Resolve each of `names` over one TCP connection to `server`:53, every
/// query sent before any answer is read (RFC 1035 framing): the answers,
/// in order, or None if the connection gave fewer.
fn lookup_tcp(server: Ipv4Addr, names: &[&str]) -> Option<Vec<(ResponseCode, Vec<Ipv4Addr>)>> {
    let mut s = TcpStream::connect_timeout(&sa(server, 53), Duration::from_secs(3)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let q = query(100 + i as u16, name);
        out.extend_from_slice(&(q.len() as u16).to_be_bytes());
        out.extend_from_slice(&q);
    }
    s.write_all(&out).ok()?;
    let mut answers = Vec::new();
    for i in 0..names.len() {
        let mut len = [0u8; 2];
        s.read_exact(&mut len).ok()?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut buf).ok()?;
        let r = Message::from_vec(&buf).unwrap();
        assert_eq!(r.id(), 100 + i as u16, "answers come in order");
        answers.push(answer_of(&r));
    }
    Some(answers)
}

/// How long to wait for an echo that should come: long, as a loaded
/// machine may be slow.
const ANSWER: Duration = Duration::from_secs(3);
/// How long to wait for one that should not.
const SILENCE: Duration = Duration::from_millis(500);

/// The wait for an echo expected (`true`) or not.
fn wait(expected: bool) -> Duration {
    if expected {
        ANSWER
    } else {
        SILENCE
    }
}

/// Send `payload` over UDP to `dst` from a socket connected to it (which
/// takes only what comes from `dst`'s address and port): what came back
/// within `wait`.
fn udp_echo(dst: SocketAddr, payload: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let u = UdpSocket::bind("0.0.0.0:0").unwrap();
    u.connect(dst).unwrap();
    udp_again(&u, payload, wait)
}

/// Send `payload` on the connected `u`: what came back within `wait`.
fn udp_again(u: &UdpSocket, payload: &[u8], wait: Duration) -> Option<Vec<u8>> {
    u.set_read_timeout(Some(wait)).unwrap();
    u.send(payload).ok()?;
    let mut buf = [0u8; 1024];
    let n = u.recv(&mut buf).ok()?;
    Some(buf[..n].to_vec())
}

/// Wait up to 5 s for `f` to hold.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..250 {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

fn policy(mode: Mode, allow: &[&str], deny: &[&str]) -> Policy {
    Policy {
        mode,
        allow: allow.iter().map(|r| r.parse().unwrap()).collect(),
        deny: deny.iter().map(|r| r.parse().unwrap()).collect(),
        ..Policy::default()
    }
}

fn sa(a: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::new(a.into(), port)
}

#[test]
fn public_reaches_the_internet_but_not_the_host_private_ranges_or_metadata() {
    let Some(world) = world("pub") else { return };
    let sb = world
        .gateway
        .attach("pub0000000001", Policy::default())
        .unwrap();
    let got = in_sandbox(&sb.netns, || {
        (
            get(sa(ALLOWED, 80), "allowed.test"),
            get(sa(OTHER, 80), "whatever"),
            get(sa(PRIVATE, 80), "x"),
            get(sa(METADATA, 80), "x"),
            get(sa(HOST, 8080), "x"),
            lookup(Ipv4Addr::new(8, 8, 8, 8), "allowed.test"),
        )
    });
    assert_eq!(got.0.as_deref(), Some("hello from 203.0.113.10:80"));
    assert_eq!(got.1.as_deref(), Some("hello from 203.0.113.11:80"));
    assert_eq!(got.2, None, "a private address was reached");
    assert_eq!(got.3, None, "the metadata address was reached");
    assert_eq!(got.4, None, "the host itself was reached");
    assert_eq!(got.5, Some((ResponseCode::NoError, vec![ALLOWED])));
    let log = sb.net.log.lock().unwrap().entries();
    let refused: Vec<_> = log.iter().filter(|e| !e.allowed).collect();
    assert_eq!(refused.len(), 3, "{log:?}");
    assert!(
        refused
            .iter()
            .any(|e| e.reason.as_deref().is_some_and(|r| r.contains("metadata"))),
        "{log:?}"
    );
    drop(world);
}

#[test]
fn allow_mode_admits_only_allowed_names_at_the_addresses_they_resolved_to() {
    let Some(world) = world("allow") else { return };
    let sb = world
        .gateway
        .attach(
            "allow00000001",
            policy(Mode::Allow, &["allowed.test", "rebind.test"], &[]),
        )
        .unwrap();
    let got = in_sandbox(&sb.netns, || {
        (
            // Before any lookup, the name proves nothing.
            get(sa(ALLOWED, 80), "allowed.test"),
            lookup(GATEWAY_ADDR, "allowed.test"),
            lookup(GATEWAY_ADDR, "other.test"),
            get(sa(ALLOWED, 80), "allowed.test"),
            tls(sa(ALLOWED, 443), "allowed.test"),
            // A forged Host on another address, and an IP literal.
            get(sa(OTHER, 80), "allowed.test"),
            get(sa(OTHER, 80), "203.0.113.11"),
            tls(sa(ALLOWED, 443), "other.test"),
            // Rebinding: an allowed name that resolves to a private address.
            lookup(GATEWAY_ADDR, "rebind.test"),
            get(sa(PRIVATE, 80), "rebind.test"),
        )
    });
    assert_eq!(got.0, None, "allowed before its name was resolved");
    assert_eq!(got.1, Some((ResponseCode::NoError, vec![ALLOWED])));
    assert_eq!(
        got.2.map(|r| r.0),
        Some(ResponseCode::Refused),
        "a disallowed name was resolved"
    );
    assert_eq!(got.3.as_deref(), Some("hello from 203.0.113.10:80"));
    assert_eq!(got.4.as_deref(), Some("hello from 203.0.113.10:443"));
    assert_eq!(got.5, None, "a forged Host opened another address");
    assert_eq!(got.6, None, "an IP literal got through");
    assert_eq!(got.7, None, "a disallowed SNI got through");
    assert_eq!(got.8, Some((ResponseCode::NoError, vec![PRIVATE])));
    assert_eq!(
        got.9, None,
        "a name rebound to a private address was reached"
    );
}

#[test]
fn deny_rules_win_and_a_policy_change_applies_to_new_connections() {
    let Some(world) = world("deny") else { return };
    let sb = world
        .gateway
        .attach(
            "deny000000001",
            policy(Mode::Public, &[], &["203.0.113.11"]),
        )
        .unwrap();
    let ns = sb.netns.try_clone().unwrap();
    let first = in_sandbox(&ns, || (get(sa(ALLOWED, 80), "a"), get(sa(OTHER, 80), "b")));
    assert!(first.0.is_some());
    assert_eq!(first.1, None, "a denied address was reached");
    assert!(world
        .gateway
        .set_policy(sb.addr, policy(Mode::None, &[], &[])));
    let after = in_sandbox(&ns, || {
        (
            get(sa(ALLOWED, 80), "a"),
            lookup(GATEWAY_ADDR, "allowed.test"),
        )
    });
    assert_eq!(after.0, None, "--network none still reached out");
    assert_eq!(after.1.map(|r| r.0), Some(ResponseCode::Refused));
    assert!(world
        .gateway
        .set_policy(sb.addr, policy(Mode::Allow, &["203.0.113.0/24:80"], &[])));
    let cidr = in_sandbox(&ns, || {
        (
            get(sa(OTHER, 80), "x"),
            tls(sa(ALLOWED, 443), "allowed.test"),
        )
    });
    assert!(cidr.0.is_some(), "a CIDR rule did not admit");
    assert_eq!(cidr.1, None, "a port outside the rule got through");
}

/// Under brig's default (public, no rules) UDP other than DNS goes
/// nowhere: it needs an address allow rule.
#[test]
fn udp_without_an_address_rule_goes_nowhere_and_sandboxes_cannot_reach_each_other() {
    let Some(world) = world("iso") else { return };
    let a = world
        .gateway
        .attach("isoa000000001", Policy::default())
        .unwrap();
    let b = world
        .gateway
        .attach("isob000000001", Policy::default())
        .unwrap();
    let a_addr = a.addr;
    let listening = in_sandbox(&a.netns, || {
        std::net::TcpListener::bind("0.0.0.0:9000").unwrap()
    });
    listening.set_nonblocking(true).unwrap();
    let got = in_sandbox(&b.netns, move || {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        u.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        u.send_to(b"ping", (ALLOWED, 9999)).unwrap();
        let mut buf = [0u8; 16];
        let udp = u.recv_from(&mut buf).is_ok();
        let tcp = TcpStream::connect_timeout(&sa(a_addr, 9000), Duration::from_secs(2)).and_then(
            |mut s| {
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                let mut b = [0u8; 1];
                s.read(&mut b)
            },
        );
        (udp, tcp.ok())
    });
    assert!(!got.0, "a UDP datagram other than DNS was answered");
    assert!(listening.accept().is_err(), "sandbox b reached sandbox a");
    assert!(matches!(got.1, None | Some(0)), "{:?}", got.1);
}

/// A resolv.conf naming systemd-resolved's 127.0.0.53 (the host's, seen
/// through the `host` template) works: the resolver answers there too,
/// inside the sandbox, by the same policy; and stops when the sandbox is
/// detached.
#[test]
fn the_resolver_answers_on_loopback_inside_the_sandbox() {
    let Some(world) = world("stub") else { return };
    let stub = Ipv4Addr::new(127, 0, 0, 53);
    let sb = world
        .gateway
        .attach("stub00000001", policy(Mode::Allow, &["allowed.test"], &[]))
        .unwrap();
    let got = in_sandbox(&sb.netns, move || {
        (
            lookup(stub, "allowed.test"),
            lookup(stub, "other.test"),
            get(sa(ALLOWED, 80), "allowed.test"),
            lookup_tcp(stub, &["allowed.test", "other.test"]),
        )
    });
    assert_eq!(got.0, Some((ResponseCode::NoError, vec![ALLOWED])));
    assert_eq!(got.1.map(|r| r.0), Some(ResponseCode::Refused));
    assert_eq!(
        got.3,
        Some(vec![
            (ResponseCode::NoError, vec![ALLOWED]),
            (ResponseCode::Refused, vec![])
        ]),
        "DNS over TCP on loopback"
    );
    assert_eq!(
        got.2.as_deref(),
        Some("hello from 203.0.113.10:80"),
        "a name resolved on loopback counts for the proxy"
    );
    world.gateway.detach(sb.addr);
    let mut quiet = false;
    for _ in 0..50 {
        // Bindable again once the resolver has let go of it.
        let probe = in_sandbox(&sb.netns, move || UdpSocket::bind((stub, 53)).is_ok());
        if probe {
            quiet = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        quiet,
        "the resolver kept 127.0.0.53 after the sandbox was detached"
    );
    let tcp = in_sandbox(&sb.netns, move || {
        std::net::TcpListener::bind((stub, 53)).is_ok()
    });
    assert!(
        tcp,
        "the resolver kept 127.0.0.53 over TCP after the sandbox was detached"
    );
}

#[test]
fn a_sandboxs_link_is_gone_when_its_namespace_is() {
    let Some(world) = world("gone") else { return };
    let sb = world
        .gateway
        .attach("gone000000001", Policy::default())
        .unwrap();
    let links = |pin: &std::path::Path| {
        let f = OwnedFd::from(std::fs::File::open(pin).unwrap());
        std::thread::spawn(move || {
            enter_fd(&f);
            std::fs::read_to_string("/proc/thread-self/net/dev").unwrap()
        })
        .join()
        .unwrap()
    };
    assert!(
        links(&world.pin).contains("b-gone00000000"),
        "{}",
        links(&world.pin)
    );
    world.gateway.detach(sb.addr);
    drop(sb);
    let mut gone = false;
    for _ in 0..100 {
        if !links(&world.pin).contains("b-gone00000000") {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone, "the gateway's end of the link outlived the sandbox");
    let _ = &world.rt;
}

#[test]
fn a_pin_whose_owner_is_gone_is_reaped_and_a_live_ones_kept() {
    let Some(world) = world("reap") else { return };
    let owner = tempfile::NamedTempFile::new_in(world.pin_dir.path()).unwrap();
    let other_pin = world.pin_dir.path().join("gw-other");
    let _other = start_gateway(&world.rt, &other_pin, owner.path());
    assert!(other_pin.exists() && other_pin.with_extension("ready").exists());
    brig_net::gateway::reap_orphan_pins(world.pin_dir.path());
    assert!(other_pin.exists(), "a pin whose owner exists was reaped");
    drop(owner);
    brig_net::gateway::reap_orphan_pins(world.pin_dir.path());
    assert!(!other_pin.exists(), "an orphan pin was kept");
    assert!(!other_pin.with_extension("ready").exists());
    assert!(world.pin.exists(), "the live gateway's pin was reaped");
}

fn e2b(mode: Mode, allow: &[&str], deny: &[&str]) -> Policy {
    Policy {
        precedence: Precedence::Allow,
        ..policy(mode, allow, deny)
    }
}

/// brig's precedence: an IP or CIDR allow rule (within its ports) admits
/// UDP, the reply comes from where the datagram went; nothing else does.
#[test]
fn udp_goes_out_only_under_an_address_allow_rule() {
    let Some(world) = world("udp") else { return };
    let sb = world
        .gateway
        .attach("udp0000000001", Policy::none())
        .unwrap();
    let echo = sa(ALLOWED, UDP_ECHO_PORT);
    let cases: &[(Policy, bool, &str)] = &[
        (
            policy(Mode::Allow, &["203.0.113.10"], &[]),
            true,
            "an IP rule",
        ),
        (
            policy(Mode::Allow, &["203.0.113.0/24:9990-9999"], &[]),
            true,
            "a CIDR rule with its ports",
        ),
        (
            policy(Mode::Public, &["203.0.113.0/24"], &[]),
            true,
            "a CIDR rule in public mode",
        ),
        (
            policy(Mode::Allow, &["203.0.113.0/24:80"], &[]),
            false,
            "a rule for other ports",
        ),
        (
            policy(Mode::Public, &[], &[]),
            false,
            "public without a rule",
        ),
        (
            policy(Mode::Allow, &["allowed.test"], &[]),
            false,
            "a domain rule for a name that resolved to it",
        ),
        (
            policy(Mode::Allow, &["203.0.113.10"], &["203.0.113.10:9999"]),
            false,
            "a deny rule",
        ),
        (
            // (A deny rule with ports lets the name resolve.)
            policy(
                Mode::Allow,
                &["203.0.113.10", "allowed.test"],
                &["allowed.test:9999"],
            ),
            false,
            "a deny rule for a name that resolved to it",
        ),
        (Policy::none(), false, "none"),
    ];
    for (p, relayed, what) in cases {
        assert!(world.gateway.set_policy(sb.addr, p.clone()));
        let within = wait(*relayed);
        let got = in_sandbox(&sb.netns, move || {
            // Names that resolve, so that domain rules have their chance.
            let _ = lookup(GATEWAY_ADDR, "allowed.test");
            udp_echo(echo, b"ping", within)
        });
        if *relayed {
            assert_eq!(got.as_deref(), Some(&b"ping"[..]), "{what}: no echo");
        } else {
            assert_eq!(got, None, "{what}: relayed");
        }
    }
    // The reply comes from the destination's address and port, also to an
    // unconnected socket.
    assert!(world
        .gateway
        .set_policy(sb.addr, policy(Mode::Allow, &["203.0.113.10"], &[])));
    let from = in_sandbox(&sb.netns, move || {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        u.send_to(b"who", echo).unwrap();
        let mut buf = [0u8; 16];
        u.recv_from(&mut buf).map(|(_, from)| from).ok()
    });
    assert_eq!(from, Some(echo));
    // Counted and logged as the sandbox's traffic, refusals once a flow.
    // (Counted just after each send: the echo may come back first.)
    let counters = &sb.net.counters;
    let relayed = (3 * "ping".len() + "who".len()) as u64;
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let counted =
        eventually(|| load(&counters.bytes_out) == relayed && load(&counters.bytes_in) == relayed);
    assert!(
        counted,
        "{} out, {} in",
        load(&counters.bytes_out),
        load(&counters.bytes_in)
    );
    assert_eq!(load(&counters.allowed), 4, "one allowed connection a flow");
    let refused = sb
        .net
        .log
        .lock()
        .unwrap()
        .entries()
        .into_iter()
        .filter(|e| e.protocol == "udp" && !e.allowed)
        .count();
    assert_eq!(refused, 6, "one refused entry per refused flow");
}

/// Private, link-local, metadata ranges and the host itself are never
/// reached, whatever the rules and the precedence.
#[test]
fn udp_never_reaches_special_ranges_or_the_host() {
    let Some(world) = world("udpspecial") else {
        return;
    };
    serve_udp_echo(sa(HOST, UDP_ECHO_PORT));
    let sb = world
        .gateway
        .attach("udps00000001", Policy::none())
        .unwrap();
    let rules = [
        "192.168.1.0/24",
        "169.254.169.254",
        "198.51.100.1",
        "203.0.113.10",
    ];
    for p in [
        policy(Mode::Allow, &rules, &[]),
        e2b(Mode::Public, &rules, &[]),
    ] {
        assert!(world.gateway.set_policy(sb.addr, p));
        let got = in_sandbox(&sb.netns, || {
            (
                udp_echo(sa(PRIVATE, UDP_ECHO_PORT), b"a", SILENCE),
                udp_echo(sa(METADATA, UDP_ECHO_PORT), b"b", SILENCE),
                udp_echo(sa(HOST, UDP_ECHO_PORT), b"c", SILENCE),
                udp_echo(sa(ALLOWED, UDP_ECHO_PORT), b"d", ANSWER),
            )
        });
        assert_eq!(got.0, None, "a private address was reached");
        assert_eq!(got.1, None, "the metadata address was reached");
        assert_eq!(got.2, None, "the host itself was reached");
        assert_eq!(got.3.as_deref(), Some(&b"d"[..]), "the world was not");
    }
    assert_eq!(sb.net.udp_flows(), 2, "only the world's flows are open");
}

/// E2B's precedence: UDP is open by default in public; a deny CIDR closes
/// it, an allow CIDR reopens part of it; deny-all closes it.
#[test]
fn udp_under_e2b_precedence_is_open_unless_a_cidr_denies_it() {
    let Some(world) = world("udpe2b") else { return };
    let sb = world
        .gateway
        .attach("udpe00000001", Policy::none())
        .unwrap();
    let echo = sa(ALLOWED, UDP_ECHO_PORT);
    let cases = [
        (e2b(Mode::Public, &[], &[]), true, "public"),
        (
            e2b(Mode::Public, &[], &["203.0.113.0/24"]),
            false,
            "a deny CIDR",
        ),
        (
            e2b(Mode::Public, &["203.0.113.10"], &["203.0.113.0/24"]),
            true,
            "an allow CIDR inside the deny CIDR",
        ),
        (e2b(Mode::Allow, &[], &[]), false, "deny-all"),
        (
            e2b(Mode::Allow, &["203.0.113.10"], &[]),
            true,
            "deny-all and an allow IP",
        ),
    ];
    for (p, relayed, what) in cases {
        assert!(world.gateway.set_policy(sb.addr, p));
        let got = in_sandbox(&sb.netns, move || udp_echo(echo, b"e2b", wait(relayed)));
        assert_eq!(got.is_some(), relayed, "{what}: {got:?}");
    }
}

/// A policy change applies to new flows and ends the open ones it no
/// longer admits; each flow is logged when it ends, with its bytes.
#[test]
fn a_policy_change_stops_udp_flows() {
    let Some(world) = world("udpchange") else {
        return;
    };
    let sb = world
        .gateway
        .attach("udpc00000001", policy(Mode::Allow, &["203.0.113.10"], &[]))
        .unwrap();
    let echo = sa(ALLOWED, UDP_ECHO_PORT);
    let open = in_sandbox(&sb.netns, move || {
        let u = UdpSocket::bind("0.0.0.0:0").unwrap();
        u.connect(echo).unwrap();
        u
    });
    assert_eq!(
        udp_again(&open, b"one", ANSWER).as_deref(),
        Some(&b"one"[..])
    );
    assert_eq!(
        udp_again(&open, b"two", ANSWER).as_deref(),
        Some(&b"two"[..])
    );
    assert_eq!(sb.net.udp_flows(), 1);
    assert!(world
        .gateway
        .set_policy(sb.addr, policy(Mode::Allow, &["203.0.113.11"], &[])));
    assert_eq!(sb.net.udp_flows(), 0, "the flow outlived the rule");
    assert_eq!(
        udp_again(&open, b"three", SILENCE),
        None,
        "an open flow went on"
    );
    let fresh = in_sandbox(&sb.netns, move || udp_echo(echo, b"four", SILENCE));
    assert_eq!(fresh, None, "a new flow went out");
    let ended = eventually(|| {
        sb.net.log.lock().unwrap().entries().iter().any(|e| {
            e.protocol == "udp"
                && e.allowed
                && e.destination == echo
                && e.bytes_out == 6
                && e.bytes_in == 6
                && e.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("policy changed"))
        })
    });
    assert!(ended, "{:?}", sb.net.log.lock().unwrap().entries());
    // And back: the rule opens new flows again at once.
    assert!(world
        .gateway
        .set_policy(sb.addr, policy(Mode::Allow, &["203.0.113.10"], &[])));
    assert_eq!(
        udp_again(&open, b"five", ANSWER).as_deref(),
        Some(&b"five"[..])
    );
}

/// A sandbox has at most MAX_FLOWS flows open: past that, its least
/// recently active ones end to make room, and new flows still work.
#[test]
fn udp_flows_per_sandbox_are_bounded() {
    let Some(world) = world("udpbound") else {
        return;
    };
    let sb = world
        .gateway
        .attach("udpb00000001", policy(Mode::Allow, &["203.0.113.10"], &[]))
        .unwrap();
    let max = brig_net::udp::MAX_FLOWS;
    let extra = 20;
    let echo = sa(ALLOWED, UDP_ECHO_PORT);
    let answered = in_sandbox(&sb.netns, move || {
        // Every socket kept open, so that each has a port of its own (a
        // port used again would be the same flow).
        let mut sockets = Vec::new();
        for _ in 0..max + extra {
            let u = UdpSocket::bind("0.0.0.0:0").unwrap();
            u.connect(echo).unwrap();
            if udp_again(&u, b"n", ANSWER).is_some() {
                sockets.push(u);
            }
        }
        sockets.len()
    });
    assert_eq!(answered, max + extra, "some flows were not relayed");
    assert_eq!(sb.net.udp_flows(), max);
    let evicted = eventually(|| {
        sb.net
            .log
            .lock()
            .unwrap()
            .entries()
            .iter()
            .filter(|e| e.reason.as_deref().is_some_and(|r| r.contains("make room")))
            .count()
            == extra
    });
    assert!(evicted, "the oldest flows were not the ones ended");
}

/// A sandbox whose egress goes through a SOCKS5 proxy sends no UDP: the
/// proxy does not carry it, and around it is not allowed.
#[test]
fn udp_does_not_go_around_an_egress_proxy() {
    let Some(world) = world("udpsocks") else {
        return;
    };
    let mut p = policy(Mode::Allow, &["203.0.113.10"], &[]);
    p.egress_proxy = Some(EgressProxy {
        address: format!("{SOCKS}:1080"),
        username: None,
        password: None,
    });
    let sb = world.gateway.attach("udpx00000001", p).unwrap();
    let got = in_sandbox(&sb.netns, || {
        udp_echo(sa(ALLOWED, UDP_ECHO_PORT), b"x", SILENCE)
    });
    assert_eq!(got, None, "UDP went around the egress proxy");
    let logged = eventually(|| {
        sb.net.log.lock().unwrap().entries().iter().any(|e| {
            e.protocol == "udp"
                && !e.allowed
                && e.reason
                    .as_deref()
                    .is_some_and(|r| r.contains("egress proxy"))
        })
    });
    assert!(logged, "{:?}", sb.net.log.lock().unwrap().entries());
}

/// DNS over TCP, to any address, is answered by brig's resolver by the
/// same rules as over UDP: several queries to a connection, allowed names
/// recorded for the proxy, --add-host names answered, others refused, and
/// a truncated upstream answer asked again over TCP.
#[test]
fn dns_over_tcp_is_answered_by_the_same_rules() {
    let Some(world) = world("dnstcp") else { return };
    let mut p = policy(Mode::Allow, &["allowed.test", "big.test"], &[]);
    p.hosts = vec![("db.internal".into(), OTHER.into())];
    let sb = world.gateway.attach("dnst00000001", p).unwrap();
    let got = in_sandbox(&sb.netns, || {
        (
            // Any address, as over UDP; the name resolves over TCP only.
            lookup_tcp(
                Ipv4Addr::new(8, 8, 8, 8),
                &["allowed.test", "other.test", "db.internal"],
            ),
            get(sa(ALLOWED, 80), "allowed.test"),
            lookup_tcp(GATEWAY_ADDR, &["big.test"]),
            lookup(GATEWAY_ADDR, "big.test"),
        )
    });
    assert_eq!(
        got.0,
        Some(vec![
            (ResponseCode::NoError, vec![ALLOWED]),
            (ResponseCode::Refused, vec![]),
            (ResponseCode::NoError, vec![OTHER]),
        ])
    );
    assert_eq!(
        got.1.as_deref(),
        Some("hello from 203.0.113.10:80"),
        "a name resolved over TCP did not count for the proxy"
    );
    let big = got.2.expect("big.test over TCP");
    assert_eq!(big[0].0, ResponseCode::NoError);
    assert_eq!(
        big[0].1.len(),
        usize::from(BIG_RECORDS),
        "the whole answer over TCP"
    );
    assert_eq!(
        got.3,
        Some((ResponseCode::NoError, vec![])),
        "over UDP the answer stays truncated"
    );
    // Under none, refused over TCP too.
    assert!(world.gateway.set_policy(sb.addr, Policy::none()));
    let none = in_sandbox(&sb.netns, || lookup_tcp(GATEWAY_ADDR, &["allowed.test"]));
    assert_eq!(none, Some(vec![(ResponseCode::Refused, vec![])]));
}

/// A daemon that starts again on the gateway's pin may hand out the
/// address of a sandbox the last one attached whose link has not gone yet
/// (its namespace still dying): the new sandbox's link takes the address
/// over instead of failing with "File exists", and the route to the
/// address leads to the new link. The lingering link is made here by hand
/// in the gateway's namespace, for the first address a gateway gives.
#[test]
fn an_address_whose_old_link_lingers_is_taken_over() {
    let Some(world) = world("linger") else { return };
    let in_gateway = |args: &'static [&'static str]| {
        let f = OwnedFd::from(std::fs::File::open(&world.pin).unwrap());
        std::thread::spawn(move || {
            enter_fd(&f);
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .join()
        .unwrap()
    };
    in_gateway(&[
        "link",
        "add",
        "b-stale",
        "type",
        "veth",
        "peer",
        "name",
        "b-stalepeer",
    ]);
    in_gateway(&["link", "set", "b-stale", "up"]);
    in_gateway(&["route", "add", "10.88.0.2/32", "dev", "b-stale"]);
    let new = world
        .gateway
        .attach("lingerb00001", Policy::default())
        .expect("attach over a lingering link");
    assert_eq!(
        new.addr.to_string(),
        "10.88.0.2",
        "the test needs the first address"
    );
    let routes = in_gateway(&["-4", "route", "show"]);
    let to_new: Vec<&str> = routes
        .lines()
        .filter(|l| l.starts_with("10.88.0.2 "))
        .collect();
    assert!(
        to_new.len() == 1 && to_new[0].contains("b-lingerb00001"),
        "{routes}"
    );
    in_gateway(&["link", "del", "b-stale"]);
}
