//! The gateway against a test world of its own: every packet stays in
//! network namespaces this test makes.
//!
//! ```text
//!  sandbox netns ──veth── gateway netns        "daemon" netns D            world netns W
//!                          (brig-net)          198.51.100.1 (the host) ──veth── 198.51.100.2
//!                                              proxy + resolver run here       203.0.113.10 allowed.test  :80 :443
//!                                                                              203.0.113.11 other.test    :80
//!                                                                              203.0.113.53 DNS
//!                                                                              192.168.1.10 (private)     :80
//!                                                                              169.254.169.254 (metadata) :80
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

use brig_net::policy::Policy;
use brig_net::{Gateway, GatewayConfig, Mode, GATEWAY_ADDR};
use brig_test_support::networld::{
    enter_fd, serve_http, NetWorld, ALLOWED, DNS, HOST, METADATA, OTHER, PRIVATE,
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
    let mut q = Message::new();
    q.set_id(4242).set_recursion_desired(true);
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    u.send_to(&q.to_vec().unwrap(), (server, 53)).ok()?;
    let mut buf = [0u8; 1024];
    let (n, from) = u.recv_from(&mut buf).ok()?;
    assert_eq!(
        from.ip(),
        IpAddr::V4(server),
        "the answer comes from where it was asked"
    );
    let r = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(r.id(), 4242);
    let addrs = r
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect();
    Some((r.response_code(), addrs))
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

#[test]
fn udp_other_than_dns_goes_nowhere_and_sandboxes_cannot_reach_each_other() {
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
        )
    });
    assert_eq!(got.0, Some((ResponseCode::NoError, vec![ALLOWED])));
    assert_eq!(got.1.map(|r| r.0), Some(ResponseCode::Refused));
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
