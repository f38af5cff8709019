//! `brig cp SRC DST`: copy one file between this host and a sandbox on the
//! daemon, in either direction.
//!
//! One side is `ID:/absolute/path` (in the sandbox), the other a local
//! path, or `-` for stdin (as SRC) or stdout (as DST). A local path with a
//! `:` before its first `/` reads as a sandbox; write it `./name:x`.
//!
//! Bytes are streamed both ways through the daemon's raw file endpoints
//! (`GET`/`PUT /v1/sandboxes/{id}/files?path=`), a buffer at a time: no file
//! is ever held whole in memory, here or in the daemon.
//!
//! Like `cp`, a destination that is a directory (or ends in `/`) receives
//! the file under its source's name. A download is written to a temporary
//! file beside the destination and renamed into place once complete, so an
//! interrupted download never leaves a truncated file under the final name;
//! it keeps the permission bits the file had in the sandbox. An upload is
//! written in place (a temporary copy would double the space a replaced file
//! needs, and a sandbox's /tmp is often memory), so an interrupted one
//! leaves a partial file; it carries no mode (the API's raw upload takes
//! none).
//!
//! Directories are refused with a message: copying a tree is not supported
//! yet (a tar stream through `brig exec -i` would do it once `exec` takes
//! stdin).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::Value;

use super::client::{Client, RemoteError};

#[derive(Debug, clap::Args)]
pub struct CpArgs {
    /// What to copy: `ID:/path`, a local file, or `-` for stdin.
    #[arg(value_name = "SRC")]
    src: String,
    /// Where to: `ID:/path`, a local path, or `-` for stdout.
    #[arg(value_name = "DST")]
    dst: String,
}

/// One side of a copy, as typed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Operand {
    Sandbox {
        id: String,
        path: String,
    },
    Local(PathBuf),
    /// `-`: stdin as the source, stdout as the destination.
    Std,
}

/// Stage two: which way the bytes go.
#[derive(Debug, PartialEq, Eq)]
enum CpConfig {
    Upload {
        from: Operand,
        id: String,
        path: String,
    },
    Download {
        id: String,
        path: String,
        to: Operand,
    },
}

impl Operand {
    fn parse(s: &str) -> anyhow::Result<Operand> {
        if s == "-" {
            return Ok(Operand::Std);
        }
        if s.is_empty() {
            bail!("empty path: name a local file, `-`, or ID:/path in a sandbox");
        }
        match s.split_once(':') {
            Some((id, path)) if !id.is_empty() && !id.contains('/') => {
                if brig_core::SandboxId::parse(id).is_none() {
                    bail!(
                        "invalid sandbox id {id:?} in {s:?}: ids are 12 hex digits, as `brig ls` \
                         shows (a local path with a `:` is written ./{s})"
                    );
                }
                if !path.starts_with('/') {
                    bail!("invalid path {path:?} in {s:?}: use an absolute path inside the sandbox, as ID:/path");
                }
                Ok(Operand::Sandbox {
                    id: id.to_string(),
                    path: path.to_string(),
                })
            }
            _ => Ok(Operand::Local(PathBuf::from(s))),
        }
    }
}

impl CpArgs {
    fn into_config(self) -> anyhow::Result<CpConfig> {
        let src = Operand::parse(&self.src)?;
        let dst = Operand::parse(&self.dst)?;
        match (src, dst) {
            (Operand::Sandbox { .. }, Operand::Sandbox { .. }) => {
                bail!(
                    "both sides are in a sandbox: brig cp copies between this host and one sandbox"
                )
            }
            (Operand::Sandbox { id, path }, to) => Ok(CpConfig::Download { id, path, to }),
            (from, Operand::Sandbox { id, path }) => Ok(CpConfig::Upload { from, id, path }),
            _ => bail!("neither side is in a sandbox: write one of them as ID:/path"),
        }
    }
}

pub fn run(args: CpArgs) -> anyhow::Result<i32> {
    let config = args.into_config()?;
    let client = Client::from_env()?;
    match config {
        CpConfig::Upload { from, id, path } => upload(&client, from, &id, &path),
        CpConfig::Download { id, path, to } => download(&client, &id, &path, to),
    }?;
    Ok(0)
}

fn files_url(id: &str, what: &str) -> String {
    format!("/v1/sandboxes/{id}/files{what}")
}

/// `stat` of a path in the sandbox; `None` when it does not exist.
fn stat(client: &Client, id: &str, path: &str) -> anyhow::Result<Option<Value>> {
    let req = client
        .request("GET", &files_url(id, "/stat"))
        .query("path", path);
    match client.send(req, None) {
        Ok(resp) => Ok(Some(
            resp.into_json()
                .context("the daemon's answer is not the JSON expected")?,
        )),
        Err(e) if is_missing_file(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A 404 about the file, not about the sandbox (both are `not_found`; the
/// caller has already made sure the sandbox exists).
fn is_missing_file(err: &anyhow::Error) -> bool {
    err.downcast_ref::<RemoteError>()
        .is_some_and(|r| r.status == 404)
}

/// The sandbox must exist and be running: checked first so its absence is
/// reported as such, not as a missing file or a cut-off upload.
fn require_running(client: &Client, id: &str) -> anyhow::Result<()> {
    let sandbox = client.json("GET", &format!("/v1/sandboxes/{id}"), None)?;
    match sandbox["state"].as_str() {
        Some("running") => Ok(()),
        Some(state) => bail!("sandbox {id} is {state}: files can be copied only while it runs"),
        None => bail!("the daemon's answer about sandbox {id} has no state"),
    }
}

fn file_name(path: &str) -> Option<&str> {
    path.rsplit('/')
        .next()
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
}

fn upload(client: &Client, from: Operand, id: &str, path: &str) -> anyhow::Result<()> {
    let (reader, name): (Box<dyn Read>, Option<String>) = match &from {
        Operand::Std => (Box::new(io::stdin().lock()), None),
        Operand::Local(p) => {
            let meta = std::fs::metadata(p)
                .with_context(|| format!("cannot read local file {}", p.display()))?;
            if meta.is_dir() {
                bail!(
                    "{} is a directory: brig cp copies one file at a time (directories are not \
                     supported yet)",
                    p.display()
                );
            }
            let file =
                File::open(p).with_context(|| format!("cannot open local file {}", p.display()))?;
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            (Box::new(file), name)
        }
        Operand::Sandbox { .. } => unreachable!("into_config pairs a sandbox with a local side"),
    };

    require_running(client, id)?;
    // Where exactly: into a directory under the source's name, as cp does.
    let into_dir = |dir: &str| -> anyhow::Result<String> {
        let name = name.as_deref().with_context(|| {
            format!("{id}:{dir} is a directory: with `-` as the source, name the file to write, as ID:{}/NAME", dir.trim_end_matches('/'))
        })?;
        Ok(format!("{}/{name}", dir.trim_end_matches('/')))
    };
    let target = if path.ends_with('/') {
        into_dir(path)?
    } else {
        match stat(client, id, path)? {
            Some(entry) if entry["type"] == "dir" => into_dir(path)?,
            _ => path.to_string(),
        }
    };
    let exists = match stat(client, id, &target)? {
        Some(entry) if entry["type"] == "dir" => bail!("{id}:{target} is a directory"),
        found => found.is_some(),
    };
    // The parent must exist. Checked before sending: a daemon that refuses
    // an upload early closes the connection under a large body, and the
    // client would see a reset instead of the reason.
    let parent = match target.rsplit_once('/') {
        Some(("", _)) | None => "/".to_string(),
        Some((p, _)) => p.to_string(),
    };
    match stat(client, id, &parent)? {
        Some(entry) if entry["type"] == "dir" => {}
        Some(_) => bail!("{id}:{parent} is not a directory"),
        None => bail!("no directory {parent} in sandbox {id}: create it first (brig exec {id} -- mkdir -p {parent})"),
    }

    let put = || {
        client
            .request("PUT", &files_url(id, ""))
            .query("path", &target)
            .set("Content-Type", "application/octet-stream")
    };
    // A daemon that refuses an upload once the body is flowing (the agent
    // could not open the file) closes the connection under a large body,
    // and the client sees a broken pipe instead of the reason. A new file
    // is therefore created empty first: a refusal then comes as an answer.
    // The bytes go straight to the target, not to a temporary file renamed
    // over it: in a sandbox whose /tmp is memory, replacing a big file would
    // need twice its size.
    if !exists {
        client
            .send_reader(put(), io::empty())
            .with_context(|| format!("cannot write {id}:{target}"))?;
    }
    let mut counted = Counted {
        inner: reader,
        n: 0,
    };
    let resp = client.send_reader(put(), &mut counted).map_err(|e| {
        // Not an answer from the daemon: the connection broke under the body.
        let e = if e.downcast_ref::<RemoteError>().is_none() {
            e.context(
                "the daemon closed the connection: the sandbox may be out of disk or memory, \
                 or the file is not writable",
            )
        } else {
            e
        };
        e.context(format!(
            "upload to {id}:{target} failed after {} bytes",
            counted.n
        ))
    })?;
    let answer: Value = resp
        .into_json()
        .context("the daemon's answer is not the JSON expected")?;
    if answer["size"].as_u64() != Some(counted.n) {
        bail!(
            "upload to {id}:{target} is incomplete: sent {} bytes, the sandbox has {}",
            counted.n,
            answer["size"]
        );
    }
    Ok(())
}

fn download(client: &Client, id: &str, path: &str, to: Operand) -> anyhow::Result<()> {
    // `stat` first: a directory gets a clear refusal, and the mode is kept.
    let entry = stat(client, id, path)?;
    let Some(entry) = entry else {
        // Missing sandbox and missing file are both 404; ask which.
        require_running(client, id)?;
        bail!("no file {path} in sandbox {id}");
    };
    if entry["type"] == "dir" {
        bail!(
            "{id}:{path} is a directory: brig cp copies one file at a time (directories are not \
             supported yet)"
        );
    }
    let mode = entry["mode"].as_u64().map(|m| m as u32 & 0o7777);

    let resp = client.send(
        client
            .request("GET", &files_url(id, ""))
            .query("path", path),
        None,
    )?;
    let expected: Option<u64> = resp.header("Content-Length").and_then(|v| v.parse().ok());
    let mut body = resp.into_reader();

    match to {
        Operand::Std => {
            let mut out = io::stdout().lock();
            let n = io::copy(&mut body, &mut out)
                .with_context(|| format!("copying {id}:{path} to stdout failed"))?;
            out.flush().context("cannot write to stdout")?;
            check_complete(id, path, n, expected)
        }
        Operand::Local(dst) => {
            let dst = if dst.is_dir() || dst.as_os_str().to_string_lossy().ends_with('/') {
                let name = file_name(path)
                    .with_context(|| format!("{id}:{path} has no file name to copy it under"))?;
                dst.join(name)
            } else {
                dst
            };
            write_atomically(&dst, mode, |file| {
                let n = io::copy(&mut body, file)
                    .with_context(|| format!("copying {id}:{path} to {} failed", dst.display()))?;
                check_complete(id, path, n, expected)
            })
        }
        Operand::Sandbox { .. } => unreachable!("into_config pairs a sandbox with a local side"),
    }
}

fn check_complete(id: &str, path: &str, got: u64, expected: Option<u64>) -> anyhow::Result<()> {
    match expected {
        Some(want) if want != got => {
            bail!("download of {id}:{path} was cut off after {got} of {want} bytes")
        }
        _ => Ok(()),
    }
}

/// Fill a temporary file beside `dst`, then rename it over `dst`; remove it
/// if anything fails.
fn write_atomically(
    dst: &Path,
    mode: Option<u32>,
    fill: impl FnOnce(&mut File) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let dir = match dst.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = dst
        .file_name()
        .with_context(|| format!("{} names no file", dst.display()))?;
    let tmp = dir.join(format!(
        ".{}.brig-cp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut file =
            File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        fill(&mut file)?;
        if let Some(mode) = mode {
            file.set_permissions(std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("cannot set the mode of {}", tmp.display()))?;
        }
        std::fs::rename(&tmp, dst)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), dst.display()))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// A reader that counts what went through it.
struct Counted<R> {
    inner: R,
    n: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(src: &str, dst: &str) -> anyhow::Result<CpConfig> {
        CpArgs {
            src: src.into(),
            dst: dst.into(),
        }
        .into_config()
    }

    #[test]
    fn operands_pick_the_direction() {
        assert_eq!(
            config("0123456789ab:/etc/hostname", "out").unwrap(),
            CpConfig::Download {
                id: "0123456789ab".into(),
                path: "/etc/hostname".into(),
                to: Operand::Local("out".into()),
            }
        );
        assert_eq!(
            config("-", "0123456789ab:/tmp/x").unwrap(),
            CpConfig::Upload {
                from: Operand::Std,
                id: "0123456789ab".into(),
                path: "/tmp/x".into(),
            }
        );
        // A `/` before the `:` makes it a local path.
        assert_eq!(
            config("./a:b", "0123456789ab:/tmp/").unwrap(),
            CpConfig::Upload {
                from: Operand::Local("./a:b".into()),
                id: "0123456789ab".into(),
                path: "/tmp/".into(),
            }
        );
    }

    #[test]
    fn bad_operands_say_what_to_write() {
        for (src, dst, says) in [
            ("a", "b", "neither side"),
            ("-", "-", "neither side"),
            ("0123456789ab:/a", "0123456789ab:/b", "both sides"),
            ("nothex:/a", "b", "./nothex:/a"),
            ("0123456789ab:rel", "b", "absolute"),
            ("", "0123456789ab:/b", "empty path"),
        ] {
            let err = config(src, dst).unwrap_err().to_string();
            assert!(err.contains(says), "{src} {dst}: {err}");
        }
    }

    #[test]
    fn a_failed_download_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let dst = dir.path().join("out");
        let err = write_atomically(&dst, Some(0o600), |f| {
            f.write_all(b"partial")?;
            bail!("cut off")
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "cut off");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        write_atomically(&dst, Some(0o640), |f| Ok(f.write_all(b"whole")?)).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"whole");
        let mode = std::fs::metadata(&dst).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn file_names_of_sandbox_paths() {
        assert_eq!(file_name("/etc/hostname"), Some("hostname"));
        assert_eq!(file_name("/tmp/"), None);
        assert_eq!(file_name("/"), None);
        assert_eq!(file_name("/a/.."), None);
    }
}
