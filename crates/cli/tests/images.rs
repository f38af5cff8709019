//! Images, tried as a user does: Debian's `docker-registry` on loopback
//! (plain, and behind basic auth), images pushed into it with skopeo, then
//! `brig template pull|import|ls|inspect|rm|prune` and `brig run` /
//! `brig create` on them through the real binary.
//!
//! The test image is built here with brig-image's test helpers: a
//! busybox-static base layer (a shell and coreutils, from the host's
//! busybox-static package) and a second layer that deletes a file of the
//! first (whiteout), replaces a directory wholesale (opaque) and adds a
//! file; its config sets Env, WorkingDir and Cmd. Needs root, the
//! registry, skopeo and htpasswd (scripts/test installs them); skips with
//! a printed reason otherwise.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use brig_image::testing::{write_multi_platform_layout, write_oci_layout, Entry, PlatformImage};
use brig_image::ImageConfig;
use brig_test_support::registry::Registry;
use support::BRIG;

/// A daemon, stopped however the test ends (a failing test must not leave
/// it and its sandboxes running).
struct Daemon {
    child: Child,
    url: String,
    home: PathBuf,
}

impl Daemon {
    /// `brig serve` on `home` with `extra` flags, its log on the test's
    /// stderr.
    fn start(home: &Path, extra: &[&str]) -> Daemon {
        let mut cmd = Command::new(BRIG);
        cmd.args(["serve", "--listen", "127.0.0.1:0"]).args(extra);
        let (child, url, lines) = support::start_daemon_with(cmd, home);
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                eprintln!("daemon: {l}");
            }
        });
        Daemon {
            child,
            url,
            home: home.to_path_buf(),
        }
    }

    /// The CLI, pointed at this daemon.
    fn cli(&self, args: &[&str]) -> Output {
        Command::new(BRIG)
            .args(args)
            .env("BRIG_HOME", &self.home)
            .env("BRIG_URL", &self.url)
            .output()
            .unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        support::stop_daemon(&mut self.child);
    }
}

/// Why this test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if support::euid() != 0 {
        return Some("unpacking images and running sandboxes need root".into());
    }
    for tool in ["docker-registry", "skopeo", "htpasswd"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Some(format!(
                "{tool} is not installed (tests/support/install-deps.sh installs it)"
            ));
        }
    }
    if !Path::new("/bin/busybox").exists() {
        return Some("/bin/busybox (busybox-static) is missing".into());
    }
    None
}

macro_rules! require_tools {
    () => {
        if let Some(why) = missing() {
            support::skip(&why);
            return;
        }
    };
}

/// The base layer: busybox and the applets the tests use, /etc/passwd, and
/// what the second layer changes.
fn base_layer(marker: &str) -> Vec<Entry> {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let mut l = vec![
        Entry::dir("bin"),
        Entry::dir("etc"),
        Entry::dir("tmp").mode(0o1777),
        Entry::dir("data"),
        Entry::dir("data/dir"),
        Entry::file("bin/busybox", busybox).mode(0o755),
        Entry::file(
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n",
        ),
        Entry::file("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        Entry::file("data/old", "old\n"),
        Entry::file("data/dir/a", "a\n"),
        Entry::file("data/dir/b", "b\n"),
        Entry::file("etc/marker", marker),
    ];
    for applet in [
        "sh", "ls", "cat", "echo", "pwd", "test", "env", "id", "sleep", "wc",
    ] {
        l.push(Entry::symlink(&format!("bin/{applet}"), "busybox"));
    }
    l
}

fn top_layer() -> Vec<Entry> {
    vec![
        Entry::whiteout("data/old"),
        Entry::opaque("data/dir"),
        Entry::file("data/dir/c", "c\n"),
        Entry::file("data/file", "from the top layer\n"),
    ]
}

fn config() -> ImageConfig {
    ImageConfig {
        env: vec!["PATH=/bin".into(), "GREETING=hello from the image".into()],
        working_dir: Some("/data".into()),
        user: None,
        entrypoint: Vec::new(),
        cmd: vec![
            "sh".into(),
            "-c".into(),
            "echo $GREETING; pwd; ls /data/dir; test -e /data/old && echo OLD; cat /data/file"
                .into(),
        ],
    }
}

/// What the image's Cmd prints when its layers and config are honoured.
const EXPECTED: &str = "hello from the image\n/data\nc\nfrom the top layer\n";

fn brig(home: &Path, args: &[&str]) -> Output {
    Command::new(BRIG)
        .args(args)
        .env("BRIG_HOME", home)
        // ~/.docker/config.json of this test only.
        .env("DOCKER_CONFIG", home.join("docker"))
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

fn failed(out: Output, what: &str) -> String {
    assert!(!out.status.success(), "{what} succeeded: {out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn images_are_pulled_run_inspected_and_removed() {
    require_tools!();
    let registry = Registry::start(None);
    let layout = tempfile::tempdir().unwrap();
    let digest = write_oci_layout(layout.path(), &[base_layer("one"), top_layer()], config());
    registry.push(layout.path(), "test/busy:1", None);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let reference = format!("{}/test/busy:1", registry.addr);

    // First use pulls, with progress lines (stderr is not a terminal), and
    // runs the image's Cmd in its WorkingDir with its Env.
    let out = brig(h, &["run", "--template", &reference]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(ok(out, "run the image"), EXPECTED);
    assert!(
        said.contains(&format!("brig: pulling {reference}")),
        "{said}"
    );
    // A command replaces Cmd; -e beats the image's Env; -w its WorkingDir.
    let out = brig(
        h,
        &[
            "run",
            "--template",
            &reference,
            "-e",
            "GREETING=mine",
            "-w",
            "/tmp",
            "--",
            "sh",
            "-c",
            "echo $GREETING $PATH; pwd; id -u",
        ],
    );
    assert_eq!(ok(out, "run a command"), "mine /bin\n/tmp\n0\n");

    // Listed and inspected.
    let listed = ok(brig(h, &["template", "ls", "--json"]), "ls");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == reference.as_str())
        .unwrap_or_else(|| panic!("{reference} not listed: {listed}"));
    assert_eq!(entry["kind"], "image");
    assert_eq!(entry["layers"], 2);
    let shown = ok(
        brig(h, &["template", "inspect", &reference, "--json"]),
        "inspect",
    );
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["digest"], digest.as_str());
    assert_eq!(shown["config"]["working_dir"], "/data");
    assert_eq!(shown["lowers"].as_array().unwrap().len(), 2);

    // By digest, under another name.
    let by_digest = format!("{}/test/busy@{digest}", registry.addr);
    let name = ok(
        brig(
            h,
            &["template", "pull", &by_digest, "--name", "busy-pinned"],
        ),
        "pull by digest",
    );
    assert_eq!(name.trim(), "busy-pinned");
    assert_eq!(
        ok(
            brig(h, &["run", "--template", "busy-pinned"]),
            "run by name"
        ),
        EXPECTED
    );

    // Unknown image and tag: clear errors, nothing registered.
    let err = failed(
        brig(
            h,
            &[
                "template",
                "pull",
                &format!("{}/test/busy:nope", registry.addr),
            ],
        ),
        "unknown tag",
    );
    assert!(err.contains("no such image or tag"), "{err}");
    let err = failed(
        brig(
            h,
            &["run", "--template", "no-such-template-here", "--", "true"],
        ),
        "unknown name",
    );
    assert!(err.contains("no template or image named"), "{err}");

    // rm and prune: the layers go once nothing names them.
    ok(brig(h, &["template", "rm", &reference]), "rm");
    let err = failed(
        brig(h, &["template", "inspect", &reference]),
        "inspect removed",
    );
    assert!(err.contains("no image named"), "{err}");
    ok(brig(h, &["template", "rm", "busy-pinned"]), "rm pinned");
    let layers = || {
        std::fs::read_dir(h.join("images/layers")).map_or(0, |d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| !e.file_name().to_string_lossy().starts_with('.'))
            })
            .count()
        })
    };
    assert_eq!(layers(), 2);
    let pruned = brig(h, &["template", "prune"]);
    let said = String::from_utf8_lossy(&pruned.stderr).into_owned();
    ok(pruned, "prune");
    assert!(said.contains("removed 2 layers"), "{said}");
    assert_eq!(layers(), 0);
}

#[test]
fn a_multi_platform_image_gives_this_hosts_platform() {
    require_tools!();
    let registry = Registry::start(None);
    let layout = tempfile::tempdir().unwrap();
    let image = |arch: &str| PlatformImage {
        os: "linux".into(),
        architecture: arch.into(),
        layers: vec![base_layer(arch)],
        config: ImageConfig {
            env: vec!["PATH=/bin".into()],
            cmd: vec!["cat".into(), "/etc/marker".into()],
            ..ImageConfig::default()
        },
    };
    write_multi_platform_layout(
        layout.path(),
        &[image("arm64"), image("amd64"), image("s390x")],
    );
    registry.push(layout.path(), "test/multi:1", None);
    let home = tempfile::tempdir().unwrap();
    let reference = format!("{}/test/multi:1", registry.addr);
    assert_eq!(
        ok(
            brig(home.path(), &["run", "--template", &reference]),
            "run multi"
        ),
        "amd64"
    );
    // Another platform on request, and one the image lacks.
    ok(
        brig(
            home.path(),
            &[
                "template",
                "pull",
                &reference,
                "--platform",
                "linux/arm64",
                "--name",
                "m-arm",
            ],
        ),
        "pull arm64",
    );
    let shown = ok(
        brig(home.path(), &["template", "inspect", "m-arm", "--json"]),
        "inspect",
    );
    assert!(shown.contains("\"lowers\""), "{shown}");
    let err = failed(
        brig(
            home.path(),
            &[
                "template",
                "pull",
                &reference,
                "--platform",
                "linux/riscv64",
                "--name",
                "m-x",
            ],
        ),
        "missing platform",
    );
    assert!(err.contains("cannot pull"), "{err}");
}

#[test]
fn a_registry_with_basic_auth_takes_flags_and_docker_config() {
    require_tools!();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let htpasswd = h.join("htpasswd");
    let made = Command::new("htpasswd")
        .args(["-Bbc", htpasswd.to_str().unwrap(), "alice", "s3cret"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let registry = Registry::start(Some(&htpasswd));
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(layout.path(), &[base_layer("auth"), top_layer()], config());
    registry.push(layout.path(), "private/busy:1", Some("alice:s3cret"));
    let reference = format!("{}/private/busy:1", registry.addr);

    let err = failed(brig(h, &["template", "pull", &reference]), "anonymous pull");
    assert!(
        err.contains("refused the credentials")
            || err.contains("401")
            || err.to_lowercase().contains("unauthorized"),
        "{err}"
    );
    let mut pull = Command::new(BRIG)
        .args([
            "template",
            "pull",
            &reference,
            "--username",
            "alice",
            "--password-stdin",
            "--name",
            "with-flags",
        ])
        .env("BRIG_HOME", h)
        .env("DOCKER_CONFIG", h.join("docker"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut pull.stdin.take().unwrap(), b"s3cret\n").unwrap();
    ok(pull.wait_with_output().unwrap(), "pull with --username");
    // ~/.docker/config.json, as `docker login` writes it.
    std::fs::create_dir_all(h.join("docker")).unwrap();
    std::fs::write(
        h.join("docker/config.json"),
        format!(
            r#"{{"auths": {{"{}": {{"auth": "YWxpY2U6czNjcmV0"}}}}}}"#,
            registry.addr
        ),
    )
    .unwrap();
    assert_eq!(
        ok(
            brig(h, &["run", "--template", &reference]),
            "run with docker config"
        ),
        EXPECTED
    );
}

#[test]
fn a_corrupt_or_broken_off_pull_registers_nothing_and_a_retry_completes() {
    require_tools!();
    let registry = Registry::start(None);
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(
        layout.path(),
        &[base_layer("broken"), top_layer()],
        config(),
    );
    registry.push(layout.path(), "test/broken:1", None);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let reference = format!("{}/test/broken:1", registry.addr);
    // The manifest's layers, as the layout has them.
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layout.path().join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(
            layout
                .path()
                .join("blobs/sha256")
                .join(manifest_digest.trim_start_matches("sha256:")),
        )
        .unwrap(),
    )
    .unwrap();
    let base = manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let top = manifest["layers"][1]["digest"]
        .as_str()
        .unwrap()
        .to_string();

    // A corrupted blob: refused by its digest, nothing registered.
    let top_file = registry.blob_file(&top);
    let good = std::fs::read(&top_file).unwrap();
    let mut bad = good.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0xff;
    std::fs::write(&top_file, &bad).unwrap();
    let err = failed(brig(h, &["template", "pull", &reference]), "corrupt pull");
    assert!(err.contains("does not match its digest"), "{err}");
    let listed = ok(brig(h, &["template", "ls", "--json"]), "ls");
    assert!(!listed.contains(&reference), "{listed}");

    // A pull that breaks off (the blob gone from the registry): nothing
    // registered; the base layer that did arrive is kept.
    std::fs::remove_file(&top_file).unwrap();
    failed(
        brig(h, &["template", "pull", &reference]),
        "broken-off pull",
    );
    let base_blob = h
        .join("images/blobs/sha256")
        .join(base.trim_start_matches("sha256:"));
    let before = std::fs::metadata(&base_blob).expect("the base layer's blob is kept");
    // Back again: the retry fetches only what is missing, and completes.
    std::fs::write(&top_file, &good).unwrap();
    ok(brig(h, &["template", "pull", &reference]), "retry");
    let after = std::fs::metadata(&base_blob).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (before.ino(), before.mtime()),
        (after.ino(), after.mtime()),
        "the base layer was fetched again"
    );
    assert_eq!(
        ok(brig(h, &["run", "--template", &reference]), "run"),
        EXPECTED
    );
}

#[test]
fn archives_import_and_run() {
    require_tools!();
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(
        layout.path(),
        &[base_layer("import"), top_layer()],
        config(),
    );
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let work = tempfile::tempdir().unwrap();
    let docker_archive = work.path().join("busy-docker.tar");
    let oci_archive = work.path().join("busy-oci.tar");
    for (target, file) in [
        ("docker-archive", &docker_archive),
        ("oci-archive", &oci_archive),
    ] {
        let out = Command::new("skopeo")
            .args([
                "copy",
                &format!("oci:{}", layout.path().display()),
                &format!("{target}:{}", file.display()),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "skopeo {target}: {out:?}");
    }
    for (name, path) in [
        ("from-dir", layout.path()),
        ("from-docker", docker_archive.as_path()),
        ("from-oci", oci_archive.as_path()),
    ] {
        ok(
            brig(
                h,
                &["template", "import", path.to_str().unwrap(), "--name", name],
            ),
            name,
        );
        assert_eq!(
            ok(brig(h, &["run", "--template", name]), name),
            EXPECTED,
            "{name}"
        );
    }
    let err = failed(
        brig(h, &["template", "import", "/etc/hostname", "--name", "x"]),
        "not an image",
    );
    assert!(
        err.contains("/etc/hostname") && err.contains("not a tar archive"),
        "{err}"
    );
    let plain = tempfile::tempdir().unwrap();
    let err = failed(
        brig(
            h,
            &[
                "template",
                "import",
                plain.path().to_str().unwrap(),
                "--name",
                "x",
            ],
        ),
        "a plain directory",
    );
    assert!(err.contains("not an OCI layout"), "{err}");
}

#[test]
fn the_daemon_creates_from_an_image_and_keeps_it_while_used() {
    require_tools!();
    let registry = Registry::start(None);
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(
        layout.path(),
        &[base_layer("daemon"), top_layer()],
        config(),
    );
    registry.push(layout.path(), "test/daemon:1", None);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let daemon = Daemon::start(h, &[]);
    let url = daemon.url.clone();
    let cli = |args: &[&str]| daemon.cli(args);
    let reference = format!("{}/test/daemon:1", registry.addr);
    let id = ok(
        cli(&["create", "--template", &reference]),
        "create from an image",
    );
    let id = id.trim();
    let got = ok(
        cli(&[
            "exec",
            id,
            "--",
            "sh",
            "-c",
            "echo $GREETING; cat /data/file; ls /data/dir",
        ]),
        "exec",
    );
    assert_eq!(got, "hello from the image\nfrom the top layer\nc\n");
    let shown = ok(cli(&["inspect", "--json", id]), "inspect");
    assert!(
        shown.contains(&format!("\"template\":\"{reference}\"")),
        "{shown}"
    );
    // Not removed while a sandbox runs on it.
    let err = failed(cli(&["template", "rm", &reference]), "rm in use");
    assert!(
        err.contains("in use by running sandbox") && err.contains(id),
        "{err}"
    );
    ok(cli(&["kill", id]), "kill");
    ok(cli(&["template", "rm", &reference]), "rm after");

    // The same through the API.
    let key = std::fs::read_to_string(h.join("local.key")).unwrap();
    let key = key.trim();
    let call = |method: &str, path: &str| {
        ureq::request(method, &format!("{url}{path}"))
            .set("Authorization", &format!("Bearer {key}"))
    };
    let answer = |r: Result<ureq::Response, ureq::Error>| -> (u16, String) {
        match r {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => panic!("{e}"),
        }
    };
    let (status, lines) = answer(
        call("POST", "/v1/templates/pull").send_json(serde_json::json!({"reference": reference})),
    );
    assert_eq!(status, 200, "{lines}");
    let events: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["event"], "resolved", "{lines}");
    assert_eq!(
        events.iter().filter(|e| e["event"] == "layer").count(),
        2,
        "{lines}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["event"], "pulled", "{lines}");
    assert_eq!(last["image"]["name"], reference.as_str());
    let (status, listed) = answer(call("GET", "/v1/templates").call());
    assert_eq!(status, 200);
    assert!(
        listed.contains(&reference) && listed.contains("\"kind\":\"recipe\""),
        "{listed}"
    );
    let (status, one) = answer(call("GET", &format!("/v1/templates/{reference}")).call());
    assert_eq!(status, 200, "{one}");
    assert!(one.contains("\"working_dir\":\"/data\""), "{one}");
    // A bad reference streams an error line; an unknown image is 404.
    let (_, lines) = answer(
        call("POST", "/v1/templates/pull")
            .send_json(serde_json::json!({"reference": format!("{}/test/none:1", registry.addr)})),
    );
    assert!(
        lines.contains("\"event\":\"error\"") && lines.contains("no such image or tag"),
        "{lines}"
    );
    let (status, _) = answer(call("GET", "/v1/templates/no/such:image").call());
    assert_eq!(status, 404);
    // Import a docker-archive as the body.
    let archive = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("skopeo")
        .args([
            "copy",
            &format!("oci:{}", layout.path().display()),
            &format!("docker-archive:{}", archive.path().display()),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (status, body) = answer(
        call("POST", "/v1/templates/import?name=uploaded")
            .send_bytes(&std::fs::read(archive.path()).unwrap()),
    );
    assert_eq!(status, 201, "{body}");
    let id = ok(
        cli(&["create", "--template", "uploaded"]),
        "create from the upload",
    );
    let got = ok(cli(&["exec", id.trim(), "--", "cat", "/data/file"]), "exec");
    assert_eq!(got, "from the top layer\n");
    // In use: 409; a tenant key may look but not change.
    let (status, body) = answer(call("DELETE", "/v1/templates/uploaded").call());
    assert_eq!(status, 409, "{body}");
    let tenant = ok(cli(&["tenants", "create", "acme", "--json"]), "tenant");
    let tenant_key = serde_json::from_str::<serde_json::Value>(&tenant).unwrap()["key"]["key"]
        .as_str()
        .unwrap()
        .to_string();
    let as_tenant = |method: &str, path: &str| {
        ureq::request(method, &format!("{url}{path}"))
            .set("Authorization", &format!("Bearer {tenant_key}"))
    };
    assert_eq!(answer(as_tenant("GET", "/v1/templates").call()).0, 200);
    let (status, body) = answer(as_tenant("POST", "/v1/templates/prune").call());
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("admin key"), "{body}");
    ok(cli(&["kill", id.trim()]), "kill");
    let (status, _) = answer(call("DELETE", "/v1/templates/uploaded").call());
    assert_eq!(status, 200);
    let (status, body) = answer(call("POST", "/v1/templates/prune").call());
    assert_eq!(status, 200, "{body}");
    drop(daemon);
}

/// `brig serve --pool IMAGE=N`: an image in the store is pooled like a
/// built-in template, and a create naming it is served from the pool with
/// the image's environment.
#[test]
fn an_image_is_pooled_like_a_template() {
    require_tools!();
    let registry = Registry::start(None);
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(layout.path(), &[base_layer("pool"), top_layer()], config());
    registry.push(layout.path(), "test/pool:1", None);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let reference = format!("{}/test/pool:1", registry.addr);
    ok(brig(h, &["template", "pull", &reference]), "pull");
    let daemon = Daemon::start(
        h,
        &["--pool", "host=0", "--pool", &format!("{reference}=1")],
    );
    let url = daemon.url.clone();
    let key = std::fs::read_to_string(h.join("local.key")).unwrap();
    let metric = |name: &str| -> f64 {
        let text = ureq::get(&format!("{url}/metrics"))
            .set("Authorization", &format!("Bearer {}", key.trim()))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    assert!(
        support::eventually(Duration::from_secs(20), || metric("brig_pool_idle") >= 1.0),
        "the image's pool never filled"
    );
    let claims = metric("brig_pool_claims_total");
    let cli = |args: &[&str]| daemon.cli(args);
    let id = ok(cli(&["create", "--template", &reference]), "create");
    assert_eq!(
        metric("brig_pool_claims_total"),
        claims + 1.0,
        "not served from the pool"
    );
    let got = ok(
        cli(&[
            "exec",
            id.trim(),
            "--",
            "sh",
            "-c",
            "echo $GREETING; cat /etc/marker",
        ]),
        "exec",
    );
    assert_eq!(got, "hello from the image\npool");
    drop(daemon);
}

/// `brig template build NAME -f Dockerfile CONTEXT`: FROM an image of the
/// registry, ARG/ENV, a RUN that adds, deletes and makes (in a sandbox),
/// COPY from the context, WORKDIR and CMD; the result runs; an unchanged
/// rebuild is all cache hits, a changed file rebuilds from its COPY on, a
/// build arg that changes the environment reruns the RUN; a failing RUN
/// and a malformed Dockerfile name their line and register nothing.
#[test]
fn dockerfiles_build_with_a_cache() {
    require_tools!();
    let registry = Registry::start(None);
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(layout.path(), &[base_layer("build"), top_layer()], config());
    registry.push(layout.path(), "test/base:1", None);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("app.txt"), "app v1\n").unwrap();
    let dockerfile = format!(
        "# a comment\nFROM {}/test/base:1\nARG WHO=world\nENV GREETING=\"hello $WHO\"\n\
         RUN echo built > /data/built && rm /data/file && mkdir -p /srv/app\n\
         COPY app.txt /srv/app/\nWORKDIR /srv/app\n\
         CMD [\"sh\", \"-c\", \"echo $GREETING; cat /data/built; test -e /data/file || echo gone; cat app.txt; pwd\"]\n",
        registry.addr
    );
    std::fs::write(ctx.path().join("Dockerfile"), &dockerfile).unwrap();
    let build = |extra: &[&str]| {
        let mut args = vec!["template", "build", "built", ctx.path().to_str().unwrap()];
        args.extend_from_slice(extra);
        brig(h, &args)
    };
    let out = build(&[]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "build");
    assert!(!said.contains("(cached)"), "{said}");
    let want = "hello world\nbuilt\ngone\napp v1\n/srv/app\n";
    assert_eq!(
        ok(brig(h, &["run", "--template", "built"]), "run built"),
        want
    );

    // Unchanged: every step from the cache.
    let out = build(&[]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "rebuild");
    assert_eq!(said.matches("(cached)").count(), 2, "{said}");
    // A changed file: the RUN from the cache, the COPY again.
    std::fs::write(ctx.path().join("app.txt"), "app v2\n").unwrap();
    let out = build(&[]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "rebuild after a change");
    assert_eq!(said.matches("(cached)").count(), 1, "{said}");
    assert_eq!(
        ok(brig(h, &["run", "--template", "built"]), "run v2"),
        "hello world\nbuilt\ngone\napp v2\n/srv/app\n"
    );
    // A build arg changes ENV: the RUN runs again.
    let out = build(&["--build-arg", "WHO=you"]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out, "build with an arg");
    assert_eq!(said.matches("(cached)").count(), 0, "{said}");
    assert!(ok(brig(h, &["run", "--template", "built"]), "run").starts_with("hello you\n"));

    // A failing RUN and a malformed Dockerfile: the line, nothing registered.
    for (text, line, says) in [
        (
            format!("FROM {}/test/base:1\nRUN true\nRUN false\n", registry.addr),
            3,
            "RUN failed",
        ),
        (
            format!("FROM {}/test/base:1\nFROBNICATE\n", registry.addr),
            2,
            "unknown instruction",
        ),
        (
            "FROM scratch\nRUN true\n".to_string(),
            2,
            "RUN needs an image",
        ),
    ] {
        std::fs::write(ctx.path().join("Bad"), &text).unwrap();
        let err = failed(
            brig(
                h,
                &[
                    "template",
                    "build",
                    "bad",
                    "-f",
                    ctx.path().join("Bad").to_str().unwrap(),
                    ctx.path().to_str().unwrap(),
                ],
            ),
            "a bad build",
        );
        assert!(
            err.contains(&format!("Dockerfile line {line}")) && err.contains(says),
            "{err}"
        );
    }
    let listed = ok(brig(h, &["template", "ls", "--json"]), "ls");
    assert!(!listed.contains("\"bad\""), "{listed}");
}

/// An E2B create naming an image the store lacks pulls it in the
/// background and, when the pull is quick, answers 201 once it is in (the
/// E2B clients never see a pull longer than they wait); an image no
/// registry has is a 400 naming it, at once rather than after the
/// clients' retries, and the next create asks the registry again (here:
/// the image pushed meanwhile is found).
#[test]
fn e2b_creates_pull_images_in_the_background() {
    require_tools!();
    let registry = Registry::start(None);
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(layout.path(), &[base_layer("e2b"), top_layer()], config());
    let home = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BRIG);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--e2b",
        "--e2b-api",
        "127.0.0.1:0",
        "--e2b-sandbox",
        "127.0.0.1:0",
        "--prepare",
        "none",
    ]);
    let (child, url, mut lines) = support::start_daemon_with(cmd, home.path());
    let daemon = Daemon {
        child,
        url,
        home: home.path().to_path_buf(),
    };
    let api = loop {
        let line = lines.next().expect("brig serve exited").unwrap();
        if let Some(a) = line.strip_prefix("brig: e2b api on ") {
            break a.to_string();
        }
    };
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            eprintln!("daemon: {l}");
        }
    });
    let key = std::fs::read_to_string(home.path().join("local.key")).unwrap();
    let create = |template: &str| {
        ureq::post(&format!("{api}/v2/sandboxes"))
            .set("X-API-KEY", key.trim())
            .timeout(Duration::from_secs(60))
            .send_json(serde_json::json!({"templateID": template}))
            .map_err(Box::new)
    };
    let reference = format!("{}/test/e2b:1", registry.addr);

    // Not pushed yet: a 400 naming it, at once.
    let started = Instant::now();
    match create(&reference).map_err(|e| *e) {
        Err(ureq::Error::Status(400, r)) => {
            let body: serde_json::Value = r.into_json().unwrap();
            assert!(
                body["message"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("test/e2b"),
                "{body}"
            );
        }
        other => panic!("expected 400: {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );

    // Pushed: the next create pulls it and starts the sandbox.
    registry.push(layout.path(), "test/e2b:1", None);
    std::thread::sleep(Duration::from_secs(3));
    let created: serde_json::Value = create(&reference)
        .expect("an E2B create of an image being pulled")
        .into_json()
        .unwrap();
    let id = created["sandboxID"]
        .as_str()
        .expect("sandboxID")
        .to_string();
    let got = ok(
        daemon.cli(&["exec", &id, "--", "sh", "-c", "cat /data/file"]),
        "exec",
    );
    assert_eq!(got, "from the top layer\n");
    let listed = ok(daemon.cli(&["template", "ls"]), "template ls");
    assert!(listed.contains("test/e2b:1"), "{listed}");
}

/// A pull into a home whose disk fills up fails naming the cause, and
/// leaves nothing registered or half-written (no image, no temporary blob
/// or layer); on a disk with room the same pull then completes.
#[test]
fn a_pull_onto_a_full_disk_says_so_and_leaves_nothing() {
    require_tools!();
    let registry = Registry::start(None);
    let layout = tempfile::tempdir().unwrap();
    write_oci_layout(layout.path(), &[base_layer("full"), top_layer()], config());
    registry.push(layout.path(), "test/full:1", None);
    let reference = format!("{}/test/full:1", registry.addr);
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    // 1 MiB: room for the index, not for the image's layers.
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(h)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a small tmpfs");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _unmount = Unmount(h);

    let err = failed(
        brig(h, &["template", "pull", &reference]),
        "pull onto a full disk",
    );
    assert!(
        err.to_lowercase().contains("no space left"),
        "the cause is named: {err}"
    );
    let listed = ok(brig(h, &["template", "ls", "--json"]), "ls after");
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert!(
        !listed
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["name"].as_str() == Some(reference.as_str())),
        "{listed}"
    );
    let leftovers: Vec<String> = ["images/blobs/sha256", "images/layers"]
        .iter()
        .flat_map(|d| std::fs::read_dir(h.join(d)).into_iter().flatten())
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "half-written: {leftovers:?}");

    // With room, the same pull completes.
    let roomy = tempfile::tempdir().unwrap();
    ok(
        brig(roomy.path(), &["template", "pull", &reference]),
        "pull with room",
    );
}
