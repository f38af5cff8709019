//! A network world for tests, in namespaces of its own: no packet leaves
//! them.
//!
//! ```text
//!  "host" netns (the caller's thread moves here)      "world" netns
//!  198.51.100.1 (HOST) ──────────── veth ──────────── 198.51.100.2
//!  routes to the world's addresses                    ALLOWED 203.0.113.10  http :80 :443, udp echo :9999
//!                                                     OTHER   203.0.113.11  http :80
//!                                                     DNS     203.0.113.53  allowed.test, www.allowed.test,
//!                                                                           other.test, rebind.test, meta.test
//!                                                     PRIVATE 192.168.1.10  http :80
//!                                                     METADATA 169.254.169.254 http :80
//! ```
//!
//! Every TCP server answers whatever it reads first (an HTTP head, a TLS
//! hello) with an HTTP/1.0 response whose body is `hello from ADDR:PORT`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};

pub const ALLOWED: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
pub const OTHER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 11);
pub const DNS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 53);
pub const PRIVATE: Ipv4Addr = Ipv4Addr::new(192, 168, 1, 10);
pub const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
pub const HOST: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

/// The world's two named namespaces, deleted on drop.
#[derive(Debug)]
pub struct NetWorld {
    pub host: String,
    pub world: String,
}

impl Drop for NetWorld {
    fn drop(&mut self) {
        for ns in [&self.host, &self.world] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

impl NetWorld {
    /// Build the world (names made unique with `tag` and the pid), start
    /// its servers, and move the calling thread into its host namespace.
    /// Needs root and iproute2.
    pub fn build(tag: &str) -> NetWorld {
        let world = NetWorld {
            host: format!("brigt-h-{}-{tag}", std::process::id()),
            world: format!("brigt-w-{}-{tag}", std::process::id()),
        };
        for ns in [&world.host, &world.world] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
            let made = Command::new("ip").args(["netns", "add", ns]).status();
            assert!(made.is_ok_and(|s| s.success()), "ip netns add {ns}");
        }
        ip(
            &world.host,
            &format!(
                "link set lo up\n\
                 link add up0 type veth peer name down0 netns {w}\n\
                 addr add {HOST}/24 dev up0\n\
                 link set up0 up\n\
                 route add 203.0.113.0/24 via 198.51.100.2\n\
                 route add 192.168.1.0/24 via 198.51.100.2\n\
                 route add {METADATA}/32 via 198.51.100.2\n",
                w = world.world
            ),
        );
        ip(
            &world.world,
            &format!(
                "link set lo up\n\
                 addr add 198.51.100.2/24 dev down0\n\
                 link set down0 up\n\
                 addr add {ALLOWED}/32 dev lo\n\
                 addr add {OTHER}/32 dev lo\n\
                 addr add {DNS}/32 dev lo\n\
                 addr add {PRIVATE}/32 dev lo\n\
                 addr add {METADATA}/32 dev lo\n\
                 route add default via {HOST}\n"
            ),
        );
        let inside = world.world.clone();
        std::thread::spawn(move || {
            enter(&inside);
            for addr in [ALLOWED, OTHER, PRIVATE, METADATA] {
                serve_http(SocketAddr::new(addr.into(), 80));
            }
            serve_http(SocketAddr::new(ALLOWED.into(), 443));
            serve_udp_echo(SocketAddr::new(ALLOWED.into(), 9999));
            serve_dns(SocketAddr::new(DNS.into(), 53));
        })
        .join()
        .expect("start the world's servers");
        enter(&world.host);
        world
    }
}

/// `ip -n NS -batch -` with `script`; panics with its stderr on failure.
pub fn ip(ns: &str, script: &str) {
    let out = Command::new("ip")
        .args(["-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            if let Some(mut stdin) = c.stdin.take() {
                stdin.write_all(script.as_bytes())?;
            }
            c.wait_with_output()
        })
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip -n {ns}: {script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Move the calling thread into the named namespace `ns`.
pub fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).expect("open a named netns");
    enter_fd(&OwnedFd::from(f));
}

/// Move the calling thread into the namespace `fd`.
pub fn enter_fd(fd: &OwnedFd) {
    // SAFETY: setns with a namespace descriptor the caller holds.
    let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
}

/// An HTTP/1.0 server answering anything with `hello from ADDR`.
pub fn serve_http(addr: SocketAddr) {
    let l = std::net::TcpListener::bind(addr).expect("bind a world server");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let mut buf = [0u8; 4096];
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.read(&mut buf);
                let body = format!("hello from {addr}");
                let _ = s.write_all(
                    format!(
                        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            });
        }
    });
}

fn serve_udp_echo(addr: SocketAddr) {
    let u = UdpSocket::bind(addr).expect("bind the world's echo");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = u.recv_from(&mut buf) {
            let _ = u.send_to(&buf[..n], from);
        }
    });
}

/// The world's DNS: A records for a few names, NXDOMAIN for the rest.
fn serve_dns(addr: SocketAddr) {
    let u = UdpSocket::bind(addr).expect("bind the world's DNS");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = u.recv_from(&mut buf) {
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let Some(question) = q.queries().first() else {
                continue;
            };
            let mut r = Message::new();
            r.set_id(q.id()).set_message_type(MessageType::Response);
            r.add_queries(q.queries().to_vec());
            let name = question.name().clone();
            let a = match name.to_ascii().trim_end_matches('.') {
                "allowed.test" | "www.allowed.test" => Some(ALLOWED),
                "other.test" => Some(OTHER),
                "rebind.test" => Some(PRIVATE),
                "meta.test" => Some(METADATA),
                _ => None,
            };
            match a {
                Some(a) if question.query_type() == RecordType::A => {
                    r.add_answer(Record::from_rdata(name, 30, RData::A(a.into())));
                }
                Some(_) => {}
                None => {
                    r.set_response_code(ResponseCode::NXDomain);
                }
            }
            if let Ok(bytes) = r.to_vec() {
                let _ = u.send_to(&bytes, from);
            }
        }
    });
}
