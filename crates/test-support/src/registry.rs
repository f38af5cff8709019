//! Debian's `docker-registry` on a free loopback port (plain, or behind
//! basic auth), removed (process and storage) on drop; images are pushed
//! into it with skopeo. For the tests of image pulls and of E2B template
//! builds from a registry.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    storage: tempfile::TempDir,
}

impl Registry {
    /// `htpasswd`: a file of users (basic auth) or none.
    pub fn start(htpasswd: Option<&Path>) -> Registry {
        // A port may still be taken between the check and the registry's
        // bind (by another fixture's child): then it exits, and another
        // port is tried.
        for _ in 0..5 {
            if let Some(registry) = Self::start_on(crate::child_port(), htpasswd) {
                return registry;
            }
        }
        panic!("docker-registry could not listen on any of 5 free ports");
    }

    fn start_on(port: u16, htpasswd: Option<&Path>) -> Option<Registry> {
        let storage = tempfile::tempdir().unwrap();
        let addr = format!("127.0.0.1:{port}");
        let auth = htpasswd
            .map(|p| {
                format!(
                    "auth:\n  htpasswd:\n    realm: brig-test\n    path: {}\n",
                    p.display()
                )
            })
            .unwrap_or_default();
        let config = storage.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n{auth}",
                storage.path().join("data").display()
            ),
        )
        .unwrap();
        let mut child = Command::new("docker-registry")
            .args(["serve", config.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start docker-registry");
        let deadline = Instant::now() + Duration::from_secs(20);
        // Listening, and it is the registry that listens: it is still
        // running (it exits when the port is taken).
        loop {
            if child.try_wait().unwrap().is_some() {
                return None;
            }
            if std::net::TcpStream::connect(&addr).is_ok() {
                std::thread::sleep(Duration::from_millis(100));
                if child.try_wait().unwrap().is_some() {
                    return None;
                }
                break;
            }
            assert!(
                Instant::now() < deadline,
                "docker-registry never listened on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(Registry {
            child,
            addr,
            storage,
        })
    }

    /// Push the OCI layout `dir` as `repo:tag` (every platform of it), with
    /// `creds` (`USER:PASS`) if given.
    pub fn push(&self, dir: &Path, repo: &str, creds: Option<&str>) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--all", "--dest-tls-verify=false"]);
        if let Some(c) = creds {
            cmd.args(["--dest-creds", c]);
        }
        let out = cmd
            .arg(format!("oci:{}", dir.display()))
            .arg(format!("docker://{}/{repo}", self.addr))
            .output()
            .unwrap();
        assert!(out.status.success(), "skopeo push: {out:?}");
    }

    /// The registry's stored copy of blob `digest`.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
