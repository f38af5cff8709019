//! A network world for tests, in namespaces of its own: no packet leaves
//! them.
//!
//! ```text
//!  "host" netns (the caller's thread moves here)      "world" netns
//!  198.51.100.1 (HOST) ──────────── veth ──────────── 198.51.100.2
//!  routes to the world's addresses                    ALLOWED 203.0.113.10  http :80 :443, udp echo :9999
//!                                                     OTHER   203.0.113.11  http :80
//!                                                     DNS     203.0.113.53  allowed.test, www.allowed.test,
//!                                                                           other.test, rebind.test, meta.test,
//!                                                                           big.test (UDP and TCP)
//!                                                     PRIVATE 192.168.1.10  http :80, udp echo :9999
//!                                                     METADATA 169.254.169.254 http :80, udp echo :9999
//! ```
//!
//! Every TCP server answers whatever it reads first (an HTTP head, a TLS
//! hello) with an HTTP/1.0 response whose body is `hello from ADDR:PORT`;
//! but on ALLOWED and OTHER port [`ECHO_PORT`] is an echo server (the
//! request's head back as the body, plus the SHA-256 of its
//! `Authorization` header), and on ALLOWED port [`TLS_ECHO_PORT`] the same
//! over TLS, with a certificate for `allowed.test` and `www.allowed.test`
//! signed by the world's own CA ([`NetWorld::ca_file`]).

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
/// The UDP echo servers' port (ALLOWED, PRIVATE, METADATA).
pub const UDP_ECHO_PORT: u16 = 9999;
/// How many A records `big.test` has: too many for a UDP answer, which
/// the world's DNS sends truncated (TC, no records); over TCP, all of
/// them, 203.0.113.100 and on.
pub const BIG_RECORDS: u8 = 40;
/// A SOCKS5 proxy (port 1080; user `u`, password `p` when a client
/// offers to authenticate), which records where it was asked to connect
/// ([`socks_log`]).
pub const SOCKS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 20);
/// `pypi.test`: where a test serves a package index ([`serve_dir`]).
pub const PYPI: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 30);
/// The echo servers' port, plain HTTP.
pub const ECHO_PORT: u16 = 8080;
/// The echo server's port over TLS (ALLOWED only).
pub const TLS_ECHO_PORT: u16 = 8443;

/// The world's two named namespaces, deleted on drop.
#[derive(Debug)]
pub struct NetWorld {
    pub host: String,
    pub world: String,
    /// The world's CA (PEM), which signed its TLS server's certificate.
    ca: tempfile_path::TempPem,
}

mod tempfile_path {
    /// A PEM file removed on drop.
    #[derive(Debug)]
    pub struct TempPem(pub std::path::PathBuf);
    impl Drop for TempPem {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
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
        let (ca_pem, tls) = world_tls();
        let ca = std::env::temp_dir().join(format!("brigt-ca-{}-{tag}.pem", std::process::id()));
        std::fs::write(&ca, ca_pem).expect("write the world's CA");
        let world = NetWorld {
            host: format!("brigt-h-{}-{tag}", std::process::id()),
            world: format!("brigt-w-{}-{tag}", std::process::id()),
            ca: tempfile_path::TempPem(ca),
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
                 addr add {SOCKS}/32 dev lo\n\
                 addr add {PYPI}/32 dev lo\n\
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
            for addr in [ALLOWED, OTHER] {
                serve_echo(SocketAddr::new(addr.into(), ECHO_PORT), None);
            }
            serve_echo(SocketAddr::new(ALLOWED.into(), TLS_ECHO_PORT), Some(tls));
            for addr in [ALLOWED, PRIVATE, METADATA] {
                serve_udp_echo(SocketAddr::new(addr.into(), UDP_ECHO_PORT));
            }
            serve_dns(SocketAddr::new(DNS.into(), 53));
            serve_socks(SocketAddr::new(SOCKS.into(), 1080));
        })
        .join()
        .expect("start the world's servers");
        enter(&world.host);
        world
    }

    /// Serve the files under `dir` over HTTP/1.0 on `pypi.test` (PYPI:80)
    /// (a directory is its `index.html`), for as long as the test runs.
    pub fn serve_dir(&self, dir: &std::path::Path) {
        let dir = dir.to_path_buf();
        let world = self.world.clone();
        let listener = std::thread::spawn(move || {
            enter(&world);
            std::net::TcpListener::bind((PYPI, 80)).expect("bind the world's file server")
        })
        .join()
        .expect("start the world's file server");
        std::thread::spawn(move || {
            for s in listener.incoming().flatten() {
                let dir = dir.clone();
                std::thread::spawn(move || {
                    let mut s = s;
                    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                        match s.read(&mut byte) {
                            Ok(1) => head.push(byte[0]),
                            _ => return,
                        }
                    }
                    let text = String::from_utf8_lossy(&head);
                    let path = text.split_whitespace().nth(1).unwrap_or("/");
                    let path = path.split(['?', '#']).next().unwrap_or("/");
                    let mut file = dir.join(path.trim_start_matches('/'));
                    if file.is_dir() {
                        file = file.join("index.html");
                    }
                    let kind = if file.extension().is_some_and(|e| e == "html") {
                        "text/html"
                    } else {
                        "application/octet-stream"
                    };
                    let reply = match (path.contains(".."), std::fs::read(&file)) {
                        (false, Ok(body)) => {
                            let mut r = format!(
                                "HTTP/1.0 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n",
                                body.len()
                            )
                            .into_bytes();
                            r.extend(body);
                            r
                        }
                        _ => b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec(),
                    };
                    let _ = s.write_all(&reply);
                });
            }
        });
    }

    /// The world's CA certificate (PEM file): what a client of its TLS
    /// server must trust (`SSL_CERT_FILE`).
    pub fn ca_file(&self) -> &std::path::Path {
        &self.ca.0
    }
}

/// The world's CA (PEM) and its TLS server's configuration.
fn world_tls() -> (String, std::sync::Arc<rustls::ServerConfig>) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().expect("a key");
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "brig test world CA");
    let ca_cert = ca.self_signed(&ca_key).expect("the world's CA");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("a key");
    let leaf = CertificateParams::new(vec!["allowed.test".into(), "www.allowed.test".into()])
        .expect("names")
        .signed_by(&key, &issuer)
        .expect("the server's certificate");
    let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], der)
    .expect("a server configuration");
    (ca_cert.pem(), std::sync::Arc::new(config))
}

/// An HTTP/1.1 echo server (over TLS with `tls`): each request's head comes
/// back as the body, with `auth-sha256: HEX` of its Authorization header
/// (`none` without one), so a test can check a header it must not see.
fn serve_echo(addr: SocketAddr, tls: Option<std::sync::Arc<rustls::ServerConfig>>) {
    use sha2::Digest;
    let l = std::net::TcpListener::bind(addr).expect("bind a world echo server");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let tls = tls.clone();
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let mut stream: Box<dyn ReadWrite> = match tls {
                    Some(config) => match rustls::ServerConnection::new(config) {
                        Ok(conn) => Box::new(rustls::StreamOwned::new(conn, s)),
                        Err(_) => return,
                    },
                    None => Box::new(s),
                };
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
                    match stream.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let text = String::from_utf8_lossy(&head).into_owned();
                let auth = text
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("authorization")
                            .then(|| v.trim().to_string())
                    })
                    .map_or("none".to_string(), |v| {
                        sha2::Sha256::digest(v.as_bytes())
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect()
                    });
                let body = format!("{text}auth-sha256: {auth}\n");
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
                let _ = stream.flush();
            });
        }
    });
}

/// Where the world's SOCKS5 proxy was asked to connect (`HOST:PORT`, as
/// asked: a name or an address), oldest first.
pub fn socks_log() -> Vec<String> {
    SOCKS_LOG.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

static SOCKS_LOG: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// A SOCKS5 server (RFC 1928 CONNECT; RFC 1929 user `u` password `p`).
fn serve_socks(addr: SocketAddr) {
    let l = std::net::TcpListener::bind(addr).expect("bind the world's SOCKS5 proxy");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = socks_session(s);
            });
        }
    });
}

fn socks_session(mut s: std::net::TcpStream) -> std::io::Result<()> {
    let mut b = [0u8; 2];
    s.read_exact(&mut b)?;
    let mut methods = vec![0u8; usize::from(b[1])];
    s.read_exact(&mut methods)?;
    if methods.contains(&2) {
        s.write_all(&[5, 2])?;
        let mut v = [0u8; 2];
        s.read_exact(&mut v)?;
        let mut user = vec![0u8; usize::from(v[1])];
        s.read_exact(&mut user)?;
        let mut n = [0u8; 1];
        s.read_exact(&mut n)?;
        let mut pass = vec![0u8; usize::from(n[0])];
        s.read_exact(&mut pass)?;
        let ok = user == b"u" && pass == b"p";
        s.write_all(&[1, if ok { 0 } else { 1 }])?;
        if !ok {
            return Ok(());
        }
    } else {
        s.write_all(&[5, 0])?;
    }
    let mut req = [0u8; 4];
    s.read_exact(&mut req)?;
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            s.read_exact(&mut a)?;
            Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut n = [0u8; 1];
            s.read_exact(&mut n)?;
            let mut name = vec![0u8; usize::from(n[0])];
            s.read_exact(&mut name)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        _ => return Ok(()),
    };
    let mut port = [0u8; 2];
    s.read_exact(&mut port)?;
    let port = u16::from_be_bytes(port);
    SOCKS_LOG
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(format!("{host}:{port}"));
    let ip = match host.as_str() {
        "allowed.test" | "www.allowed.test" => ALLOWED,
        "other.test" => OTHER,
        h => match h.parse() {
            Ok(ip) => ip,
            Err(_) => {
                s.write_all(&[5, 4, 0, 1, 0, 0, 0, 0, 0, 0])?;
                return Ok(());
            }
        },
    };
    let Ok(up) = std::net::TcpStream::connect((ip, port)) else {
        s.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0])?;
        return Ok(());
    };
    s.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0])?;
    let (mut a, mut b) = (s.try_clone()?, up.try_clone()?);
    let (mut c, mut d) = (s, up);
    let t = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a, &mut b);
        let _ = b.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut d, &mut c);
    let _ = c.shutdown(std::net::Shutdown::Write);
    let _ = t.join();
    Ok(())
}

trait ReadWrite: Read + Write + Send {}
impl<T: Read + Write + Send> ReadWrite for T {}

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

/// A UDP echo server: each datagram back to where it came from.
pub fn serve_udp_echo(addr: SocketAddr) {
    let u = UdpSocket::bind(addr).expect("bind the world's echo");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = u.recv_from(&mut buf) {
            let _ = u.send_to(&buf[..n], from);
        }
    });
}

/// The world's DNS, over UDP and TCP: A records for a few names, NXDOMAIN
/// for the rest.
fn serve_dns(addr: SocketAddr) {
    let u = UdpSocket::bind(addr).expect("bind the world's DNS");
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = u.recv_from(&mut buf) {
            if let Some(bytes) = dns_answer(&buf[..n], false) {
                let _ = u.send_to(&bytes, from);
            }
        }
    });
    let l = std::net::TcpListener::bind(addr).expect("bind the world's DNS over TCP");
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut s = s;
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut len = [0u8; 2];
                while s.read_exact(&mut len).is_ok() {
                    let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
                    if s.read_exact(&mut q).is_err() {
                        return;
                    }
                    let Some(a) = dns_answer(&q, true) else {
                        return;
                    };
                    let mut framed = (a.len() as u16).to_be_bytes().to_vec();
                    framed.extend(a);
                    if s.write_all(&framed).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

fn dns_answer(query: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let q = Message::from_vec(query).ok()?;
    let question = q.queries().first()?;
    let mut r = Message::new();
    r.set_id(q.id()).set_message_type(MessageType::Response);
    r.add_queries(q.queries().to_vec());
    let name = question.name().clone();
    let a = match name.to_ascii().trim_end_matches('.') {
        "allowed.test" | "www.allowed.test" => vec![ALLOWED],
        "other.test" => vec![OTHER],
        "pypi.test" => vec![PYPI],
        "rebind.test" => vec![PRIVATE],
        "meta.test" => vec![METADATA],
        "big.test" => (0..BIG_RECORDS)
            .map(|i| Ipv4Addr::new(203, 0, 113, 100 + i))
            .collect(),
        _ => Vec::new(),
    };
    if a.is_empty() {
        r.set_response_code(ResponseCode::NXDomain);
    } else if question.query_type() == RecordType::A {
        if a.len() > 1 && !tcp {
            r.set_truncated(true);
        } else {
            for a in a {
                r.add_answer(Record::from_rdata(name.clone(), 30, RData::A(a.into())));
            }
        }
    }
    r.to_vec().ok()
}
