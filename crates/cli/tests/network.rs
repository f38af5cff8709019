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
    let _world = NetWorld::build("cli");
    let home = tempfile::tempdir().unwrap();
    let (child, url, lines) = support::start_daemon(
        home.path(),
        &["--dns-upstream", &DNS.to_string(), "--pool", "host=0"],
    );
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("daemon: {l}");
        }
    });
    let mut daemon = Daemon(child);
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
    support::stop_daemon(&mut daemon.0);
    assert!(!pin.exists(), "{pin:?} outlived the daemon");
    assert!(!pin.with_extension("ready").exists());
}
