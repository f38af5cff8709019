//! `brig serve` gives sandboxes a network under their policy, tried the
//! way a user does — `brig create --network …`, `brig exec` running
//! Python's urllib, `brig net` — against a test world: the test moves into
//! a network namespace of its own ("the host", where the daemon runs),
//! linked to a second one holding the world's HTTP and DNS servers on
//! documentation addresses. No packet leaves these namespaces.

mod support;

use std::path::Path;
use std::process::{Child, Command, Output};

use brig_test_support::networld::{NetWorld, DNS};
use serde_json::Value;
use support::BRIG;

/// The daemon, stopped however the test ends (a panicking test must not
/// leave it running).
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        support::stop_daemon(&mut self.0);
    }
}

/// `brig serve` with `home`, asking the world's DNS, with `args`; trusting
/// `world_ca` (`SSL_CERT_FILE`) when given. Its URL, and the rest of its
/// log (for [`drain`], once the caller has read what it needs).
fn serve(
    home: &Path,
    args: &[&str],
    world_ca: Option<&Path>,
) -> (Daemon, String, support::DaemonLog) {
    let mut cmd = Command::new(BRIG);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--dns-upstream",
        &DNS.to_string(),
    ])
    .args(args);
    if let Some(ca) = world_ca {
        cmd.env("SSL_CERT_FILE", ca);
    }
    let (child, url, lines) = support::start_daemon_with(cmd, home);
    (Daemon(child), url, lines)
}

/// The daemon's log on the test's stderr, so it never blocks on a full pipe.
fn drain(lines: support::DaemonLog) {
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("daemon: {l}");
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

/// `brig secrets set NAME` with `value` on stdin, as a user types it.
fn set_secret(home: &Path, url: &str, name: &str, value: &str) {
    let mut set = Command::new(BRIG)
        .args(["secrets", "set", name])
        .env("BRIG_URL", url)
        .env("BRIG_HOME", home)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut set.stdin.take().unwrap(), value.as_bytes()).unwrap();
    assert!(set.wait().unwrap().success(), "brig secrets set {name}");
}

/// What the world's echo servers report for `Authorization: Bearer
/// SECRET` (`auth-sha256: HEX`), computed here by sha256sum.
fn bearer_sha256(secret: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("printf %s 'Bearer {secret}' | sha256sum")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
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
    let _world = NetWorld::build("cli");
    let home = tempfile::tempdir().unwrap();
    let (mut daemon, url, lines) = serve(home.path(), &["--pool", "host=0"], None);
    drain(lines);
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

    // The same counters in the daemon's metrics.
    let key = std::fs::read_to_string(h.join("local.key")).unwrap();
    let metrics = ureq::get(&format!("{url}/metrics"))
        .set("Authorization", &format!("Bearer {}", key.trim()))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let series = |name: &str| -> u64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("id=\"{id}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} for {id} in:\n{metrics}"))
    };
    assert!(series("brig_sandbox_network_received_bytes_total") > 0);
    assert!(series("brig_sandbox_network_sent_bytes_total") > 0);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("brig_sandbox_connections_total")
                && l.contains(&format!("id=\"{id}\""))
                && l.contains("verdict=\"denied\"")
                && !l.ends_with(" 0")),
        "{metrics}"
    );

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
    ok(brig(h, &url, &["rm", "-f", id]), "rm");
    support::stop_daemon(&mut daemon.0);
    assert!(!pin.exists(), "{pin:?} outlived the daemon");
    assert!(!pin.with_extension("ready").exists());
}

/// E2B's network options through the official Python client
/// (tests/e2b/network_sdk.py), against `brig serve --e2b` in the test
/// world; and the daemon's default network for native creates.
#[test]
fn e2b_network_options_work_through_the_official_client() {
    use brig_test_support::networld::{ALLOWED, METADATA, OTHER, PRIVATE, SOCKS};
    require_root!();
    let python = brig_test_support::test_cache().join("e2b-venv/bin/python");
    if !python.exists() {
        let why = format!(
            "{} is missing: tests/support/install-python-deps.sh makes it",
            python.display()
        );
        brig_test_support::skip(&why);
        return;
    }
    let world = NetWorld::build("e2b");
    let home = tempfile::tempdir().unwrap();
    // The daemon checks the world's TLS server against the world's CA.
    let (mut daemon, url, mut lines) = serve(
        home.path(),
        &[
            "--e2b",
            "--e2b-api",
            "127.0.0.1:0",
            "--e2b-sandbox",
            "127.0.0.1:0",
            "--prepare",
            "none",
        ],
        Some(world.ca_file()),
    );
    let mut addr = |prefix: &str| loop {
        let line = lines.next().expect("brig serve exited").unwrap();
        if let Some(a) = line.strip_prefix(prefix) {
            break a.to_string();
        }
    };
    let api = addr("brig: e2b api on ");
    let data = addr("brig: e2b sandboxes on ");
    drain(lines);
    let key = std::fs::read_to_string(home.path().join("local.key")).unwrap();

    // Native: a create that names no network gets the default, public.
    let h = home.path();
    let id = ok(brig(h, &url, &["create"]), "create");
    let got = fetch(
        h,
        &url,
        id.trim(),
        &["http://other.test/", &format!("http://{PRIVATE}/")],
    );
    assert!(
        line(&got, "http://other.test/").ends_with("hello from 203.0.113.11:80"),
        "{got}"
    );
    assert!(
        line(&got, &format!("http://{PRIVATE}/")).contains("ERR"),
        "{got}"
    );
    let info: Value = serde_json::from_str(&ok(brig(h, &url, &["net", id.trim()]), "net")).unwrap();
    assert_eq!(info["mode"], "public", "{info}");
    // `none` is a policy like any other: it can be opened later.
    let closed = ok(
        brig(h, &url, &["create", "--network", "none"]),
        "create none",
    );
    let got = fetch(h, &url, closed.trim(), &["http://other.test/"]);
    assert!(line(&got, "http://other.test/").contains("ERR"), "{got}");
    ok(
        brig(h, &url, &["net", closed.trim(), "--network", "public"]),
        "net --network public",
    );
    let got = fetch(h, &url, closed.trim(), &["http://other.test/"]);
    assert!(
        line(&got, "http://other.test/").ends_with("hello from 203.0.113.11:80"),
        "{got}"
    );
    ok(brig(h, &url, &["rm", "-f", id.trim(), closed.trim()]), "rm");

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/e2b/network_sdk.py");
    let out = Command::new(&python)
        .arg(&script)
        .args([ALLOWED, OTHER, PRIVATE, METADATA, SOCKS].map(|a| a.to_string()))
        .env("E2B_API_KEY", key.trim())
        .env("E2B_API_URL", &api)
        .env("E2B_SANDBOX_URL", &data)
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("{NETWORK_SDK_CHECKS} passed, 0 failed")),
        "network_sdk.py:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The same through the official JS client.
    let node_dir = brig_test_support::test_cache().join("e2b-node");
    if !node_dir.join("node_modules/e2b/package.json").exists() {
        let why = format!(
            "{} has no e2b: tests/support/install-node-deps.sh installs it",
            node_dir.display()
        );
        brig_test_support::skip(&why);
    } else {
        // Copies next to node_modules (where node resolves `e2b`), named
        // by pid: tests may run side by side.
        let src = script.with_file_name("js_network.mjs");
        let pid = std::process::id();
        let checks = format!("sdk_checks-net-{pid}.mjs");
        let copy = node_dir.join(format!("{pid}-js_network.mjs"));
        let text = std::fs::read_to_string(&src)
            .unwrap()
            .replace("'./sdk_checks.mjs'", &format!("'./{checks}'"));
        std::fs::write(&copy, text).unwrap();
        std::fs::copy(src.with_file_name("sdk_checks.mjs"), node_dir.join(&checks)).unwrap();
        let out = Command::new("node")
            .arg(&copy)
            .args([ALLOWED, OTHER].map(|a| a.to_string()))
            .current_dir(&node_dir)
            .env("E2B_API_KEY", key.trim())
            .env("E2B_API_URL", &api)
            .env("E2B_SANDBOX_URL", &data)
            .env("E2B_USER_AGENT_SOURCE", "ci")
            .env_remove("E2B_DEBUG")
            .env_remove("E2B_DOMAIN")
            .output()
            .unwrap();
        let _ = std::fs::remove_file(&copy);
        let _ = std::fs::remove_file(node_dir.join(&checks));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success()
                && stdout.contains(&format!("{JS_NETWORK_CHECKS} passed, 0 failed")),
            "js_network.mjs:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    support::stop_daemon(&mut daemon.0);
}

/// The checks of tests/e2b/network_sdk.py.
const NETWORK_SDK_CHECKS: usize = 39;
/// The checks of tests/e2b/js_network.mjs.
const JS_NETWORK_CHECKS: usize = 20;

/// `brig run` gives its sandbox a network of its own (no daemon): public
/// by default, narrowed by the same flags as `brig create`, none with
/// `--network none`; nothing of it is left once it exits.
#[test]
fn brig_run_has_a_network_of_its_own() {
    require_root!();
    let world = NetWorld::build("run");
    let links = || {
        Command::new("ip")
            .args(["-n", &world.host, "-o", "link"])
            .output()
            .unwrap()
            .stdout
            .len()
    };
    let before = links();
    let run = |flags: &[&str], urls: &[&str]| -> String {
        let mut args = vec!["run", "--dns-upstream", "203.0.113.53"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "python3", "-c", FETCH]);
        args.extend_from_slice(urls);
        let out = Command::new(BRIG).args(&args).output().unwrap();
        ok(out, &format!("brig run {flags:?}"))
    };
    let got = run(
        &[],
        &[
            "http://allowed.test/",
            "http://203.0.113.11/",
            "http://192.168.1.10/",
            "http://169.254.169.254/",
            "http://198.51.100.1:9/",
        ],
    );
    assert!(
        line(&got, "http://allowed.test/").ends_with("hello from 203.0.113.10:80"),
        "{got}"
    );
    assert!(
        line(&got, "http://203.0.113.11/").ends_with("hello from 203.0.113.11:80"),
        "{got}"
    );
    for refused in [
        "http://192.168.1.10/",
        "http://169.254.169.254/",
        "http://198.51.100.1:9/",
    ] {
        assert!(line(&got, refused).contains("ERR"), "{refused}: {got}");
    }
    let got = run(
        &["--network", "allow", "--allow", "allowed.test"],
        &[
            "http://allowed.test/",
            "http://other.test/",
            "http://203.0.113.10/",
        ],
    );
    assert!(
        line(&got, "http://allowed.test/").ends_with("hello from 203.0.113.10:80"),
        "{got}"
    );
    assert!(line(&got, "http://other.test/").contains("ERR"), "{got}");
    assert!(line(&got, "http://203.0.113.10/").contains("ERR"), "{got}");
    let got = run(&["--network", "none"], &["http://203.0.113.10/"]);
    assert!(line(&got, "http://203.0.113.10/").contains("ERR"), "{got}");
    // A bad rule is refused before anything runs.
    let out = Command::new(BRIG)
        .args(["run", "--allow", "a.*.com", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a.*.com"),
        "{out:?}"
    );
    assert_eq!(
        links(),
        before,
        "brig run left a link in the host namespace"
    );
}

/// `brig run -p PORT`: a server listening on the sandbox's loopback is
/// reached from this host's loopback while the sandbox runs (with
/// `--network none` too), on a port brig chose and printed; the port is
/// closed once it has ended.
#[test]
fn brig_run_publishes_a_port() {
    use std::io::{BufRead, BufReader, Read, Write};
    require_root!();
    const SERVER: &str = "import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        b = b'from inside'
        self.send_response(200)
        self.send_header('Content-Length', str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.HTTPServer(('127.0.0.1', 8000), H).handle_request()
";
    let mut child = Command::new(BRIG)
        .args([
            "run",
            "--network",
            "none",
            "-p",
            "8000",
            "--",
            "python3",
            "-c",
            SERVER,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr: std::net::SocketAddr = line
        .strip_prefix("brig: ")
        .and_then(|l| l.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no published address in {line:?}"));
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{line}");
    assert!(line.contains("-> port 8000"), "{line}");
    // Until the server listens, a connection is closed at once. The
    // server answers one request and exits, so an answer is waited for
    // long enough that a loaded machine never loses it to a timeout.
    let mut body = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let Ok(mut s) = std::net::TcpStream::connect(addr) else {
            break;
        };
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let _ = s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n");
        let mut got = String::new();
        let _ = s.read_to_string(&mut got);
        if got.starts_with("HTTP/1.0 200") {
            body = got;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(body.ends_with("from inside"), "{body:?}");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "{addr} is still open after the sandbox ended"
    );
    // A taken host port is a clear error before anything runs.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let out = Command::new(BRIG)
        .args(["run", "-p", &format!("{port}:80"), "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains(&format!("cannot publish port 80 on 127.0.0.1:{port}")),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Python in the sandbox: GET each URL, print "URL STATUS BODY" (the body
/// on one line), or "URL ERR <exception>".
const FETCH_ANY: &str = "import sys, urllib.request, urllib.error
for u in sys.argv[1:]:
    try:
        r = urllib.request.urlopen(u, timeout=10)
        print(u, r.status, r.read().decode().replace('\\r\\n', '|').replace('\\n', '|'))
    except urllib.error.HTTPError as e:
        print(u, e.code, e.read().decode().replace('\\n', '|'))
    except Exception as e:
        print(u, 'ERR', type(e).__name__, e)
";

/// `brig create --inject`: requests to the host get the header with the
/// tenant's secret, over TLS (the sandbox trusts its own CA, which brig put
/// in it) and plain HTTP; other hosts do not; the secret is nowhere the
/// sandbox can read, not even in a response that echoes it; a secret that
/// is not set fails the request saying which; a policy change takes the
/// header away.
#[test]
fn secrets_are_injected_and_never_reach_the_sandbox() {
    require_root!();
    let world = NetWorld::build("inject");
    let home = tempfile::tempdir().unwrap();
    // The daemon checks the world's server against the world's CA.
    let (mut daemon, url, lines) = serve(home.path(), &[], Some(world.ca_file()));
    drain(lines);
    let h = home.path();
    const SECRET: &str = "s3cret-token-0123456789";
    set_secret(h, &url, "tok", SECRET);

    let id = ok(
        brig(
            h,
            &url,
            &[
                "create",
                "--inject",
                "allowed.test:Authorization=Bearer ${secrets.tok}",
            ],
        ),
        "create --inject",
    );
    let id = id.trim();
    let fetch_any = |urls: &[&str]| fetch_flat(h, &url, id, urls);
    let want = bearer_sha256(SECRET);
    let tls = "https://allowed.test:8443/";
    let plain = "http://allowed.test:8080/";
    let other = "http://other.test:8080/";
    let got = fetch_any(&[tls, plain, other]);
    assert!(!got.contains(SECRET), "the sandbox saw the secret: {got}");
    for u in [tls, plain] {
        let l = line(&got, u);
        assert!(l.contains(" 200 "), "{l}");
        assert!(
            l.contains(&format!("auth-sha256: {want}")),
            "{u} got no secret: {l}"
        );
        assert!(l.contains("Bearer ****"), "the echo was not masked: {l}");
    }
    assert!(line(&got, other).contains("auth-sha256: none"), "{got}");

    // A forged Host towards another address gets no secret: the connection
    // is refused (plain HTTP has no certificate that would give it away).
    let forged = ok(
        brig(
            h,
            &url,
            &["exec", id, "--", "python3", "-c",
              "import urllib.request as u\n\
               try:\n\
               \x20   r = u.urlopen(u.Request('http://203.0.113.11:8080/', headers={'Host': 'allowed.test'}), timeout=5)\n\
               \x20   print(r.read().decode())\n\
               except Exception as e:\n\
               \x20   print('ERR', e)"],
        ),
        "forged Host",
    );
    assert!(forged.starts_with("ERR"), "{forged}");
    assert!(!forged.contains(&want), "{forged}");

    // Nowhere in the sandbox: its environment, its processes', its files.
    let looked = ok(
        brig(
            h,
            &url,
            &["exec", id, "--", "sh", "-c",
              "env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null; grep -rs . /run /tmp /root /etc/ssl 2>/dev/null | head -c 10000000"],
        ),
        "look for the secret",
    );
    assert!(!looked.contains(SECRET), "the secret is in the sandbox");
    assert!(
        looked.contains("SSL_CERT_FILE=/run/brig-ca-bundle.crt"),
        "{looked}"
    );

    // A secret that is not set: the request fails, saying which.
    ok(
        brig(
            h,
            &url,
            &["net", id, "--inject", "allowed.test:X-Key=${secrets.nope}"],
        ),
        "net --inject",
    );
    let got = fetch_any(&[plain]);
    assert!(line(&got, plain).contains(" 502 "), "{got}");
    assert!(line(&got, plain).contains("\"nope\" is not set"), "{got}");
    // No injection any more: no header.
    ok(
        brig(h, &url, &["net", id, "--network", "public"]),
        "net --network public",
    );
    let got = fetch_any(&[plain]);
    assert!(line(&got, plain).contains("auth-sha256: none"), "{got}");
    // A bad injection is refused, naming it.
    let bad = brig(h, &url, &["net", id, "--inject", "allowed.test:Host=x"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("frames the request"));
    ok(brig(h, &url, &["rm", "-f", id]), "rm");

    // A sandbox made without an injection holds no CA (trusting one costs
    // it a copy of the host's bundle, ~220 KB of its memory) and points
    // nothing at one. The first injection, set live, makes it trust its
    // CA: what it runs next reaches the host over TLS with the header.
    let later = ok(brig(h, &url, &["create"]), "create");
    let later = later.trim();
    let look = "test -e /run/brig-ca-bundle.crt && echo bundle; \
                env | grep -E '^(SSL_CERT_FILE|NODE_EXTRA_CA_CERTS)=' | sort; echo end";
    let before = ok(
        brig(h, &url, &["exec", later, "--", "sh", "-c", look]),
        "look",
    );
    assert_eq!(before, "end\n", "a CA before any injection");
    ok(
        brig(
            h,
            &url,
            &[
                "net",
                later,
                "--inject",
                "allowed.test:Authorization=Bearer ${secrets.tok}",
            ],
        ),
        "net --inject",
    );
    let after = ok(
        brig(h, &url, &["exec", later, "--", "sh", "-c", look]),
        "look",
    );
    assert_eq!(
        after,
        "bundle\nNODE_EXTRA_CA_CERTS=/run/brig-ca.crt\nSSL_CERT_FILE=/run/brig-ca-bundle.crt\nend\n"
    );
    let got = fetch_flat(h, &url, later, &[tls]);
    let l = line(&got, tls);
    assert!(l.contains(" 200 "), "{l}");
    assert!(l.contains(&format!("auth-sha256: {want}")), "{l}");
    ok(brig(h, &url, &["rm", "-f", later]), "rm");
    support::stop_daemon(&mut daemon.0);
}

/// `brig create --secret NAME`: a secret of that sandbox alone, taken from
/// the CLI's environment, used by its injections before the tenant's
/// secret of the same name, and shown by no answer; another sandbox
/// without it gets the tenant's.
#[test]
fn a_sandbox_can_be_given_its_own_secret() {
    require_root!();
    let world = NetWorld::build("ownsecret");
    let home = tempfile::tempdir().unwrap();
    let (mut daemon, url, lines) = serve(home.path(), &[], Some(world.ca_file()));
    drain(lines);
    let h = home.path();
    const OWN: &str = "own-0123456789abcdef";
    const TENANTS: &str = "tenant-fedcba9876543210";
    set_secret(h, &url, "tok", TENANTS);
    let inject = "allowed.test:Authorization=Bearer ${secrets.tok}";
    let created = Command::new(BRIG)
        .args(["create", "--inject", inject, "--secret", "TOK"])
        .env("BRIG_URL", &url)
        .env("BRIG_HOME", h)
        .env("TOK", OWN)
        .output()
        .unwrap();
    let own_id = ok(created, "create --secret").trim().to_string();
    let other_id = ok(brig(h, &url, &["create", "--inject", inject]), "create")
        .trim()
        .to_string();
    let plain = "http://allowed.test:8080/";
    let got = fetch_flat(h, &url, &own_id, &[plain]);
    assert!(
        line(&got, plain).contains(&format!("auth-sha256: {}", bearer_sha256(OWN))),
        "{got}"
    );
    let got = fetch_flat(h, &url, &other_id, &[plain]);
    assert!(
        line(&got, plain).contains(&format!("auth-sha256: {}", bearer_sha256(TENANTS))),
        "{got}"
    );
    // No answer shows it.
    for args in [
        vec!["inspect", "--json", own_id.as_str()],
        vec!["net", own_id.as_str()],
        vec!["ls", "--format", "json"],
    ] {
        let shown = ok(brig(h, &url, &args), "show");
        assert!(!shown.contains(OWN), "{args:?} shows the secret: {shown}");
    }
    // Bad ones are refused before anything is made.
    let bad = brig(h, &url, &["create", "--secret", "sec_x=1"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("invalid secret name"),
        "{bad:?}"
    );
    support::stop_daemon(&mut daemon.0);
}

/// `brig run --inject … --secret NAME`: no daemon, the same guarantees:
/// the host gets the header, the sandbox (its environment, processes,
/// files) never sees the value, which came from brig's environment and
/// never from its command line; a named secret that is not given, or one
/// given that no injection names, is refused before anything runs.
#[test]
fn brig_run_injects_secrets_it_is_given() {
    require_root!();
    let world = NetWorld::build("runinject");
    const SECRET: &str = "run-s3cret-9876543210";
    let want = bearer_sha256(SECRET);
    let run = |extra: &[&str], script: &str| -> Output {
        let mut args = vec![
            "run",
            "--dns-upstream",
            "203.0.113.53",
            "--inject",
            "allowed.test:Authorization=Bearer ${secrets.tok}",
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        Command::new(BRIG)
            .args(&args)
            .env("TOK", SECRET)
            // brig checks the world's server against the world's CA.
            .env("SSL_CERT_FILE", world.ca_file())
            .output()
            .unwrap()
    };
    let fetch = format!(
        "python3 -c \"{}\" https://allowed.test:8443/ http://allowed.test:8080/ http://other.test:8080/; \
         env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null; \
         grep -rs . /run /tmp /root 2>/dev/null | head -c 10000000",
        FETCH_ANY.replace('"', "\\\"")
    );
    let got = ok(run(&["--secret", "TOK"], &fetch), "brig run --inject");
    assert!(!got.contains(SECRET), "the sandbox saw the secret: {got}");
    for u in ["https://allowed.test:8443/", "http://allowed.test:8080/"] {
        let l = line(&got, u);
        assert!(l.contains(" 200 "), "{l}");
        assert!(
            l.contains(&format!("auth-sha256: {want}")),
            "{u} got no secret: {l}"
        );
        assert!(l.contains("Bearer ****"), "the echo was not masked: {l}");
    }
    assert!(
        line(&got, "http://other.test:8080/").contains("auth-sha256: none"),
        "{got}"
    );
    assert!(
        got.contains("SSL_CERT_FILE=/run/brig-ca-bundle.crt"),
        "{got}"
    );

    // Refused before anything runs, saying why.
    for (extra, says) in [
        (&[][..], "give it with --secret tok=VALUE"),
        (
            &["--secret", "TOK", "--secret", "other=x"][..],
            "--secret other is not named",
        ),
        (&["--secret", "NOT_SET_ANYWHERE"][..], "is not set here"),
    ] {
        let out = run(extra, "echo ran");
        assert_eq!(out.status.code(), Some(125), "{extra:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{extra:?}: {err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("ran"));
    }
}

/// `--egress-proxy`: allowed connections go through the SOCKS5 proxy (by
/// name when the policy decided by name), never around it: a proxy that
/// is down or refuses the credentials fails the connection.
#[test]
fn egress_goes_through_the_socks5_proxy_and_never_around_it() {
    use brig_test_support::networld::socks_log;
    require_root!();
    let _world = NetWorld::build("socks");
    let home = tempfile::tempdir().unwrap();
    let (mut daemon, url, lines) = serve(home.path(), &[], None);
    drain(lines);
    let h = home.path();
    let target = "http://other.test:8080/";
    let id = ok(
        brig(
            h,
            &url,
            &["create", "--egress-proxy", "socks5://u:p@203.0.113.20:1080"],
        ),
        "create --egress-proxy",
    );
    let id = id.trim();
    let got = fetch_flat(h, &url, id, &[target]);
    assert!(line(&got, target).contains("auth-sha256: none"), "{got}");
    assert!(
        socks_log().iter().any(|t| t == "203.0.113.11:8080"),
        "not through the proxy: {:?}",
        socks_log()
    );
    // The proxy is shown without its password.
    let info: Value = serde_json::from_str(&ok(brig(h, &url, &["net", id]), "net")).unwrap();
    assert_eq!(
        info["egress_proxy"]["address"], "203.0.113.20:1080",
        "{info}"
    );
    assert!(!info.to_string().contains("\"p\""), "{info}");
    // Decided by name: the proxy is asked for the name.
    ok(
        brig(
            h,
            &url,
            &[
                "net",
                id,
                "--network",
                "allow",
                "--allow",
                "other.test",
                "--egress-proxy",
                "socks5://u:p@203.0.113.20:1080",
            ],
        ),
        "net --allow",
    );
    let got = fetch_flat(h, &url, id, &[target]);
    assert!(line(&got, target).contains("auth-sha256: none"), "{got}");
    assert!(
        socks_log().iter().any(|t| t == "other.test:8080"),
        "{:?}",
        socks_log()
    );
    // Down, or refusing the credentials: nothing gets out.
    for proxy in [
        "socks5://203.0.113.21:1080",
        "socks5://u:wrong@203.0.113.20:1080",
    ] {
        ok(
            brig(h, &url, &["net", id, "--egress-proxy", proxy]),
            "net --egress-proxy",
        );
        let before = socks_log().len();
        let got = fetch_flat(h, &url, id, &[target]);
        assert!(line(&got, target).contains("ERR"), "{proxy}: {got}");
        // Down, or refused before the request: the proxy connected nowhere.
        assert_eq!(socks_log().len(), before, "{proxy}: {:?}", socks_log());
    }
    let log = ok(
        brig(h, &url, &["net", id, "--connections"]),
        "net --connections",
    );
    assert!(log.contains("egress proxy"), "{log}");
    let bad = brig(
        h,
        &url,
        &["net", id, "--egress-proxy", "http://203.0.113.20:1080"],
    );
    assert!(String::from_utf8_lossy(&bad.stderr).contains("only SOCKS5"));
    ok(brig(h, &url, &["rm", "-f", id]), "rm");
    support::stop_daemon(&mut daemon.0);
}

/// `FETCH_ANY` in sandbox `id`: one line per URL, bodies flattened.
fn fetch_flat(home: &Path, url: &str, id: &str, urls: &[&str]) -> String {
    let mut args = vec!["exec", id, "--", "python3", "-c", FETCH_ANY];
    args.extend_from_slice(urls);
    ok(brig(home, url, &args), "fetch")
}

/// A package index for `pip`: `brigdemo` 0.1, one pure-Python wheel.
const MAKE_INDEX: &str = r#"import base64, hashlib, os, sys, zipfile
d = sys.argv[1]
os.makedirs(f"{d}/files"); os.makedirs(f"{d}/simple/brigdemo")
whl = f"{d}/files/brigdemo-0.1-py3-none-any.whl"
files = {
    "brigdemo/__init__.py": "VALUE = 42\n",
    "brigdemo-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: brigdemo\nVersion: 0.1\n",
    "brigdemo-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: brig-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
with zipfile.ZipFile(whl, "w") as z:
    for n, c in files.items():
        z.writestr(n, c)
        h = base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={h},{len(c)}")
    record.append("brigdemo-0.1.dist-info/RECORD,,")
    z.writestr("brigdemo-0.1.dist-info/RECORD", "\n".join(record) + "\n")
sha = hashlib.sha256(open(whl, "rb").read()).hexdigest()
with open(f"{d}/simple/brigdemo/index.html", "w") as f:
    f.write(f'<a href="/files/brigdemo-0.1-py3-none-any.whl#sha256={sha}">brigdemo-0.1-py3-none-any.whl</a>\n')
"#;

/// `pip install` of a package from the test world's index works under
/// `--network allow --allow pypi.test`, and not when the index is not
/// allowed.
#[test]
fn pip_installs_from_an_allowed_index_and_from_nothing_else() {
    require_root!();
    let world = NetWorld::build("pip");
    let index = tempfile::tempdir().unwrap();
    let made = Command::new("python3")
        .args(["-c", MAKE_INDEX])
        .arg(index.path().join("i"))
        .status()
        .unwrap();
    assert!(made.success());
    world.serve_dir(&index.path().join("i"));
    let install = "python3 -m venv /tmp/v && /tmp/v/bin/pip install -q --no-cache-dir \
                   --disable-pip-version-check --trusted-host pypi.test \
                   --index-url http://pypi.test/simple/ brigdemo \
                   && /tmp/v/bin/python -c 'import brigdemo; print(brigdemo.VALUE)'";
    let run = |allow: &str| {
        Command::new(BRIG)
            .args(["run", "--network", "allow", "--allow", allow])
            .args(["--dns-upstream", &DNS.to_string(), "--memory", "1G", "--"])
            .args(["sh", "-c", install])
            .output()
            .unwrap()
    };
    let got = run("pypi.test");
    assert!(
        got.status.success() && String::from_utf8_lossy(&got.stdout).trim() == "42",
        "{}{}",
        String::from_utf8_lossy(&got.stdout),
        String::from_utf8_lossy(&got.stderr)
    );
    let refused = run("other.test");
    assert!(
        !refused.status.success(),
        "installed from an index not allowed"
    );
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("42"));
}

/// The same policy on the gvisor tier: a `--network allow` gvisor sandbox
/// (its netns is the one the gateway polices, gVisor's netstack on the
/// inside) reaches the allowed name and nothing else, gets the tenant's
/// secret injected over TLS and plain HTTP without seeing it, its refused
/// connections are logged at the gateway, and a live change to `none`
/// applies to the next connection.
#[test]
fn a_gvisor_sandbox_is_held_to_its_policy_too() {
    held_to_its_policy("gvisor", &[], "dmesg", "gVisor");
}

/// The same on the vm tier: the guest's own kernel and network stack,
/// its virtio NIC bridged to the sandbox's namespace (crates/vm/src/net.rs),
/// the same gateway, the same checks; and its kernel is the guest's.
#[test]
fn a_vm_sandbox_is_held_to_its_policy_too() {
    held_to_its_policy(
        "vm",
        &["--template", "base", "--memory", "512M"],
        "uname -r; ls /sys/class/net",
        "cloud-amd64",
    );
}

/// A sandbox of `isolation` (created with `extra`), held to an allow list
/// with injection; `kernel` run in it says `says` (whose kernel it is).
fn held_to_its_policy(isolation: &str, extra: &[&str], kernel: &str, says: &str) {
    require_root!();
    if !support::tier_or_skip(isolation) {
        return;
    }
    let world = NetWorld::build(isolation);
    let home = tempfile::tempdir().unwrap();
    if extra.contains(&"--template") {
        // The named templates scripts/test built.
        std::os::unix::fs::symlink(
            support::template_home().join("templates"),
            home.path().join("templates"),
        )
        .unwrap();
    }
    let (mut daemon, url, lines) = serve(home.path(), &[], Some(world.ca_file()));
    drain(lines);
    let h = home.path();
    const SECRET: &str = "tier-s3cret-0123456789";
    set_secret(h, &url, "tok", SECRET);
    let mut args = vec![
        "create",
        "--isolation",
        isolation,
        "--network",
        "allow",
        "--allow",
        "allowed.test",
        "--inject",
        "allowed.test:Authorization=Bearer ${secrets.tok}",
    ];
    args.extend_from_slice(extra);
    let id = ok(brig(h, &url, &args), "create --network allow");
    let id = id.trim();
    let tls = "https://allowed.test:8443/";
    let plain = "http://allowed.test:8080/";
    let other = "http://other.test:8080/";
    let by_address = "http://203.0.113.11:8080/";
    let got = fetch_flat(h, &url, id, &[tls, plain, other, by_address]);
    assert!(!got.contains(SECRET), "the sandbox saw the secret: {got}");
    let want = bearer_sha256(SECRET);
    for u in [tls, plain] {
        let l = line(&got, u);
        assert!(l.contains(" 200 "), "{l}");
        assert!(
            l.contains(&format!("auth-sha256: {want}")),
            "{u} got no secret: {l}"
        );
    }
    assert!(line(&got, other).contains("ERR"), "{got}");
    assert!(line(&got, by_address).contains("ERR"), "{got}");

    let log = ok(
        brig(h, &url, &["net", id, "--connections"]),
        "net --connections",
    );
    assert!(log.contains("allowed 203.0.113.10"), "{log}");
    assert!(log.contains("denied  203.0.113.11:8080"), "{log}");
    let said = ok(
        brig(h, &url, &["exec", id, "--", "sh", "-c", kernel]),
        kernel,
    );
    assert!(said.contains(says), "not the tier's kernel: {said}");

    ok(
        brig(h, &url, &["net", id, "--network", "none"]),
        "net --network none",
    );
    let got = fetch_flat(h, &url, id, &[plain]);
    assert!(line(&got, plain).contains("ERR"), "{got}");
    ok(brig(h, &url, &["rm", "-f", id]), "rm");
    support::stop_daemon(&mut daemon.0);
}
