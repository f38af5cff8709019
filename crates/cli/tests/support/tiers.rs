//! Daemon scenarios every isolation tier beyond the process tier must
//! pass, written once and run by each tier's suite (gvisor.rs, vm.rs) with
//! that tier's way of making a sandbox and of proving that nothing of one
//! is left on the host.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{ok, skip, text, TestDaemon};

/// A tier as its suite drives it.
pub struct TierUnderTest {
    /// The `--isolation` value and the name of its directory under
    /// `/run/brig`.
    pub isolation: &'static str,
    /// `dir:` of the test rootfs.
    pub template: String,
    /// What each `brig create` of the tier adds (its memory, its network).
    pub create_args: &'static [&'static str],
    /// The native API's create body for it.
    pub create_body: Value,
    /// Fails the test if anything of sandbox `id` is left on the host.
    pub assert_nothing_left: fn(&str),
}

impl TierUnderTest {
    /// `brig create` of a sandbox of this tier; its id.
    pub fn create(&self, daemon: &TestDaemon) -> String {
        let mut args = vec![
            "create",
            "--isolation",
            self.isolation,
            "--template",
            &self.template,
        ];
        args.extend_from_slice(self.create_args);
        ok(daemon.brig(&args), "create").trim().to_string()
    }

    /// The official E2B Python SDK picks the tier with the metadata key
    /// `brig.isolation` (tests/e2b/tier_sdk.py, `checks` of them: commands,
    /// files, snapshots, volumes); nothing of its sandbox is left after its
    /// kill.
    pub fn e2b_clients_pick_it_with_a_metadata_key(&self, checks: usize) {
        let home = tempfile::tempdir().unwrap();
        let daemon = TestDaemon::start_e2b(home.path(), &["--prepare", "none"]);
        let Some(stdout) = daemon.run_tier_sdk(&self.template, self.isolation, checks) else {
            return;
        };
        let id = stdout
            .lines()
            .find_map(|l| l.strip_prefix("sandbox "))
            .expect("the script names its sandbox");
        (self.assert_nothing_left)(id);
    }

    /// A daemon killed with -9, then a new one that ends everything
    /// (SIGTERM): the sandboxes the first left are adopted (one answers an
    /// exec) and then torn down without a trace; one no record names (the
    /// daemon died between the launch and the record) is discarded at the
    /// start.
    pub fn nothing_is_left_after_a_daemon_crash(&self) {
        let home = tempfile::tempdir().unwrap();
        let daemon = TestDaemon::start(home.path());
        let ids = [self.create(&daemon), self.create(&daemon)];
        daemon.kill9();
        // Forget one record, as if the daemon had died before writing it.
        let out = Command::new("sqlite3")
            .arg(home.path().join("brig.db"))
            .arg(format!("DELETE FROM sandboxes WHERE id = '{}'", ids[1]))
            .output();
        let forgot = out.is_ok_and(|o| o.status.success());
        if !forgot {
            skip("sqlite3 is not installed (apt-get install sqlite3): no stray to discard");
        }
        let daemon = TestDaemon::start(home.path());
        if forgot {
            (self.assert_nothing_left)(&ids[1]);
        }
        let out = ok(
            daemon.brig(&["exec", &ids[0], "--", "echo", "adopted"]),
            "exec",
        );
        assert_eq!(out, "adopted\n");
        drop(daemon);
        for id in &ids {
            (self.assert_nothing_left)(id);
        }
    }

    /// A daemon killed with -9 in the middle of two creates, after each of
    /// `delays_ms` in turn: the next daemon leaves none of them `creating`
    /// (adopted if answered before the kill, dead if cut short), and once
    /// it ends (SIGTERM) nothing of them is left. `left` sees, for each
    /// delay, the ids of the sandboxes the killed daemon had begun (by
    /// their directories), for what the tier can say of that moment.
    pub fn a_daemon_killed_mid_create_leaves_nothing_half_made(
        &self,
        delays_ms: &[u64],
        left: impl Fn(u64, &[String]),
    ) {
        for &delay_ms in delays_ms {
            let home = tempfile::tempdir().unwrap();
            let daemon = TestDaemon::start(home.path());
            let creates: Vec<_> = (0..2)
                .map(|_| {
                    let url = format!("{}/v1/sandboxes", daemon.url);
                    let auth = format!("Bearer {}", daemon.key);
                    let body = self.create_body.clone();
                    std::thread::spawn(move || {
                        let _ = ureq::post(&url).set("Authorization", &auth).send_json(body);
                    })
                })
                .collect();
            std::thread::sleep(Duration::from_millis(delay_ms));
            daemon.kill9();
            for c in creates {
                let _ = c.join();
            }
            // What the killed daemon began, by its sandboxes' directories
            // (a half-made one's name starts with a dot).
            let owner = format!("{}\n", home.path().join("brig.db").display());
            let ids: Vec<String> = std::fs::read_dir(format!("/run/brig/{}", self.isolation))
                .map(|d| {
                    d.flatten()
                        .filter(|e| {
                            std::fs::read_to_string(e.path().join("state"))
                                .is_ok_and(|s| s.starts_with(&owner))
                        })
                        .map(|e| {
                            e.file_name()
                                .to_string_lossy()
                                .trim_start_matches('.')
                                .to_owned()
                        })
                        .collect()
                })
                .unwrap_or_default();
            left(delay_ms, &ids);
            let daemon = TestDaemon::start(home.path());
            let (_, list) = daemon.call("GET", "/v1/sandboxes", None);
            for sb in list["items"].as_array().unwrap() {
                assert!(
                    sb["state"] == "running" || sb["state"] == "dead",
                    "after {delay_ms} ms: {sb}"
                );
            }
            drop(daemon);
            for id in &ids {
                (self.assert_nothing_left)(id);
            }
        }
    }
}

/// In sandbox `id` of `daemon`: an exec's exit code, both streams and its
/// stdin; a file of 300 kB (every byte value, the ones a vm's line must
/// escape among them) copied in and out through the CLI and listed
/// through the API. `scratch`: a host directory for the copies.
pub fn execs_and_files_work(daemon: &TestDaemon, id: &str, scratch: &std::path::Path) {
    let out = daemon.brig_with_input(
        &[
            "exec",
            "-i",
            id,
            "--",
            "sh",
            "-c",
            "read x; echo out:$x; echo err >&2; exit 7",
        ],
        b"in\n",
    );
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out:in\n");
    assert_eq!(text(&out.stderr), "err\n");

    let local = scratch.join("blob");
    let blob: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    std::fs::write(&local, &blob).unwrap();
    ok(
        daemon.brig(&["cp", local.to_str().unwrap(), &format!("{id}:/root/blob")]),
        "cp in",
    );
    let out = ok(
        daemon.brig(&["exec", id, "--", "sh", "-c", "wc -c < /root/blob"]),
        "size",
    );
    assert_eq!(out.trim(), "300000");
    let back = scratch.join("back");
    ok(
        daemon.brig(&["cp", &format!("{id}:/root/blob"), back.to_str().unwrap()]),
        "cp out",
    );
    assert!(
        std::fs::read(&back).unwrap() == blob,
        "the file came back changed"
    );
    let (status, list) = daemon.call(
        "GET",
        &format!("/v1/sandboxes/{id}/files/list?path=/root"),
        None,
    );
    assert_eq!(status, 200, "{list}");
    assert!(list.to_string().contains("blob"), "{list}");
}
