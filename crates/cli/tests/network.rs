//! `brig serve` gives sandboxes a network under their policy, tried the
//! way a user does — `brig create --network …`, `brig exec` running
//! Python's urllib, `brig net` — against a test world: the test moves into
//! a network namespace of its own ("the host", where the daemon runs),
//! linked to a second one holding the world's HTTP and DNS servers on
//! documentation addresses. No packet leaves these namespaces.

mod support;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::{RData, Record, RecordType};
use serde_json::Value;
use support::BRIG;

const ALLOWED: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
const OTHER: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 11);
const DNS: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 53);
const HOST: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);

fn ip(ns: &str, script: &str) {
    let mut child = Command::new("ip")
        .args(["-n", ns, "-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("run ip");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success(), "ip -n {ns}: {script}");
}

fn enter(ns: &str) {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
    // SAFETY: setns with a namespace descriptor we hold.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(r, 0);
}

/// The two namespaces, deleted on drop.
struct World {
    host: String,
    world: String,
}

impl Drop for World {
    fn drop(&mut self) {
        for ns in [&self.host, &self.world] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// Build the world and move the calling thread into its "host".
fn world() -> World {
    let world = World {
        host: format!("brig-nt-h-{}", std::process::id()),
        world: format!("brig-nt-w-{}", std::process::id()),
    };
    for ns in [&world.host, &world.world] {
        let _ = Command::new("ip").args(["netns", "del", ns]).status();
        assert!(Command::new("ip")
            .args(["netns", "add", ns])
            .status()
            .unwrap()
            .success());
    }
    ip(
        &world.host,
        &format!(
            "link set lo up\n\
             link add up0 type veth peer name down0 netns {w}\n\
             addr add {HOST}/24 dev up0\n\
             link set up0 up\n\
             route add 203.0.113.0/24 via 198.51.100.2\n",
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
             route add default via {HOST}\n"
        ),
    );
    let w = world.world.clone();
    std::thread::spawn(move || {
        enter(&w);
        for addr in [ALLOWED, OTHER] {
            serve_http(SocketAddr::new(addr.into(), 80));
        }
        serve_dns(SocketAddr::new(DNS.into(), 53));
    })
    .join()
    .unwrap();
    enter(&world.host);
    world
}

/// HTTP/1.0 answering every request with "hello from ADDR".
fn serve_http(addr: SocketAddr) {
    let l = std::net::TcpListener::bind(addr).unwrap();
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

fn serve_dns(addr: SocketAddr) {
    let u = UdpSocket::bind(addr).unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = u.recv_from(&mut buf) {
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::new();
            r.set_id(q.id()).set_message_type(MessageType::Response);
            r.add_queries(q.queries().to_vec());
            let name = q.queries()[0].name().clone();
            let a = match name.to_ascii().trim_end_matches('.') {
                "allowed.test" => Some(ALLOWED),
                "other.test" => Some(OTHER),
                _ => None,
            };
            match a {
                Some(a) if q.queries()[0].query_type() == RecordType::A => {
                    r.add_answer(Record::from_rdata(name, 30, RData::A(a.into())));
                }
                Some(_) => {}
                None => {
                    r.set_response_code(ResponseCode::NXDomain);
                }
            }
            let _ = u.send_to(&r.to_vec().unwrap(), from);
        }
    });
}

/// Python in the sandbox: fetch each URL, print "URL BODY" or "URL ERR
/// <exception>".
const FETCH: &str = "import sys, urllib.request
for u in sys.argv[1:]:
    try:
        print(u, urllib.request.urlopen(u, timeout=5).read().decode())
    except Exception as e:
        print(u, 'ERR', type(e).__name__, e)
";

fn brig(home: &Path, url: &str, args: &[&str]) -> Output {
    Command::new(BRIG)
        .args(args)
        .env("BRIG_URL", url)
        .env("BRIG_HOME", home)
        .env_remove("BRIG_API_KEY")
        .output()
        .unwrap()
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fetch(home: &Path, url: &str, id: &str, urls: &[&str]) -> String {
    let mut args = vec!["exec", id, "--", "python3", "-c", FETCH];
    args.extend_from_slice(urls);
    ok(brig(home, url, &args), "fetch")
}

fn line<'a>(out: &'a str, url: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(url))
        .unwrap_or_else(|| panic!("no line for {url} in {out}"))
}

#[test]
fn sandboxes_reach_what_their_policy_allows_and_nothing_else() {
    require_root!();
    let _world = world();
    let home = tempfile::tempdir().unwrap();
    let (mut child, url, lines) = support::start_daemon(
        home.path(),
        &["--dns-upstream", &DNS.to_string(), "--pool", "host=0"],
    );
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("daemon: {l}");
        }
    });
    let h = home.path();
    // The gateway's pin is named after the home's database (serve.rs).
    let owner = std::fs::canonicalize(home.path().join("brig.db"))
        .unwrap_or_else(|_| home.path().join("brig.db"));
    let hash = owner
        .display()
        .to_string()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let pin = Path::new("/run/brig/net").join(format!("gw-{hash:016x}"));
    assert!(pin.exists(), "no gateway pinned at {pin:?}");

    // allow: only allowed.test, by name.
    let id = ok(
        brig(
            h,
            &url,
            &["create", "--network", "allow", "--allow", "allowed.test"],
        ),
        "create --network allow",
    );
    let id = id.trim();
    let got = fetch(
        h,
        &url,
        id,
        &[
            "http://allowed.test/",
            "http://other.test/",
            "http://203.0.113.11/",
        ],
    );
    assert!(
        line(&got, "http://allowed.test/").ends_with("hello from 203.0.113.10:80"),
        "{got}"
    );
    assert!(line(&got, "http://other.test/").contains("ERR"), "{got}");
    assert!(line(&got, "http://203.0.113.11/").contains("ERR"), "{got}");

    // brig net shows it, and the connections it tried.
    let info: Value = serde_json::from_str(&ok(brig(h, &url, &["net", id]), "net")).unwrap();
    assert_eq!(info["mode"], "allow", "{info}");
    assert_eq!(info["allow"][0], "allowed.test", "{info}");
    assert!(
        info["address"]
            .as_str()
            .is_some_and(|a| a.starts_with("10.88.")),
        "{info}"
    );
    assert!(info["connections_allowed"].as_u64() >= Some(1), "{info}");
    assert!(info["connections_denied"].as_u64() >= Some(1), "{info}");
    let log = ok(
        brig(h, &url, &["net", id, "--connections"]),
        "net --connections",
    );
    assert!(
        log.contains("allowed 203.0.113.10:80 (allowed.test)"),
        "{log}"
    );
    assert!(log.contains("denied  203.0.113.11:80"), "{log}");

    // A live change applies to the next connection.
    ok(
        brig(h, &url, &["net", id, "--network", "none"]),
        "net --network none",
    );
    let got = fetch(h, &url, id, &["http://allowed.test/"]);
    assert!(line(&got, "http://allowed.test/").contains("ERR"), "{got}");
    ok(
        brig(h, &url, &["net", id, "--network", "public"]),
        "net --network public",
    );
    let got = fetch(
        h,
        &url,
        id,
        &["http://other.test/", "http://198.51.100.1:9/"],
    );
    assert!(
        line(&got, "http://other.test/").ends_with("hello from 203.0.113.11:80"),
        "{got}"
    );
    assert!(
        line(&got, "http://198.51.100.1:9/").contains("ERR"),
        "the host itself: {got}"
    );

    // Without --network a sandbox has loopback only.
    let plain = ok(brig(h, &url, &["create"]), "create");
    let got = fetch(h, &url, plain.trim(), &["http://203.0.113.10/"]);
    assert!(line(&got, "http://203.0.113.10/").contains("ERR"), "{got}");
    let refused = brig(h, &url, &["net", plain.trim(), "--network", "public"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("created without a network"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // Bad rules are a clear 400.
    let bad = brig(
        h,
        &url,
        &["create", "--network", "allow", "--allow", "a.*.com"],
    );
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("a.*.com"), "{err}");
    let bad = brig(h, &url, &["create", "--network", "sideways"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("sideways"));

    // Nothing is left once the sandboxes and the daemon are gone.
    ok(brig(h, &url, &["rm", "-f", id, plain.trim()]), "rm");
    support::stop_daemon(&mut child);
    assert!(!pin.exists(), "{pin:?} outlived the daemon");
    assert!(!pin.with_extension("ready").exists());
}
