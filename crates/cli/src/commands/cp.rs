//! `brig cp SRC DST`: copy a file or a directory tree between this host
//! and a sandbox on the daemon, in either direction, as `docker cp` does.
//!
//! One side is `ID:/absolute/path` (in the sandbox), the other a local
//! path, or `-` for stdin (as SRC) or stdout (as DST). A local path with a
//! `:` before its first `/` reads as a sandbox; write it `./name:x`.
//!
//! **Files** are streamed both ways through the daemon's raw file
//! endpoints (`GET`/`PUT /v1/sandboxes/{id}/files?path=`), a buffer at a
//! time: no file is ever held whole in memory, here or in the daemon. Like
//! `cp`, a destination that is a directory (or ends in `/`) receives the
//! file under its source's name. A download is written to a temporary file
//! beside the destination and renamed into place once complete, so an
//! interrupted download never leaves a truncated file under the final name;
//! it keeps the permission bits the file had in the sandbox. An upload is
//! written in place (a temporary copy would double the space a replaced
//! file needs, and a sandbox's /tmp is often memory), so an interrupted one
//! leaves a partial file; it carries no mode (the API's raw upload takes
//! none).
//!
//! **Directories** go as one tar stream through the archive endpoints
//! (`GET`/`PUT /v1/sandboxes/{id}/archive?path=`), built and unpacked on
//! the fly on both sides. As with `cp -r`: a destination that is an
//! existing directory receives the tree under its source's name
//! (`brig cp ID:/srv/app ./out` makes `./out/app`), and one that does not
//! exist becomes the copy (its parent must exist). A source written as
//! `dir/.` copies what is in `dir`, not `dir` itself. A download keeps
//! modes (less setuid and setgid bits: the tree comes from an untrusted
//! sandbox), mtimes and symlinks, and is unpacked by the `tar` crate, which
//! never writes outside the destination (no `..`, nothing through a
//! symlink); a new destination is unpacked beside it and renamed into
//! place when whole. An upload keeps file modes, not directory modes or
//! mtimes, and cannot carry symlinks (the sandbox's agent cannot create
//! them): they, and devices, FIFOs and sockets, are refused with their
//! name before anything is sent.
//!
//! `-` moves a tar where it meets a directory, as `docker cp` does:
//! `brig cp ID:/dir -` writes the tree as a tar to stdout, and
//! `brig cp - ID:/dir` unpacks a tar from stdin into the existing
//! directory. With a file on the sandbox side, `-` moves the raw bytes.

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
                // An id, a unique start of one, or a name (resolved once
                // the daemon is reachable).
                if super::client::check_sandbox_ref(id).is_err() {
                    bail!(
                        "invalid sandbox {id:?} in {s:?}: name a sandbox by its id, its name or \
                         a unique start of its id, as `brig ls` shows (a local path with a `:` \
                         is written ./{s})"
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
    let mut config = args.into_config()?;
    let client = Client::from_env()?;
    match &mut config {
        CpConfig::Upload { id, .. } | CpConfig::Download { id, .. } => *id = client.resolve(id)?,
    }
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
                return upload_tree(client, p, id, path);
            }
            let file =
                File::open(p).with_context(|| format!("cannot open local file {}", p.display()))?;
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            (Box::new(file), name)
        }
        Operand::Sandbox { .. } => unreachable!("into_config pairs a sandbox with a local side"),
    };

    require_running(client, id)?;
    // `-` into a directory: a tar to unpack there, as docker cp takes it.
    if from == Operand::Std {
        let is_dir = |e: &Value| e["type"] == "dir";
        if path.ends_with('/') || stat(client, id, path)?.is_some_and(|e| is_dir(&e)) {
            drop(reader);
            let (tar, builder) = checked_stdin_tar();
            let sent = unpack_remote(client, id, path, tar, None);
            return finish_upload(sent, builder);
        }
    }
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
        return download_tree(client, id, path, to);
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

fn archive_url(id: &str) -> String {
    format!("/v1/sandboxes/{id}/archive")
}

/// `brig cp ./dir ID:/path`: into `/path` under the directory's name if
/// `/path` is a directory, else as `/path` itself (its parent must exist),
/// as `cp -r` does.
fn upload_tree(client: &Client, local: &Path, id: &str, path: &str) -> anyhow::Result<()> {
    // Before anything is sent: a refusal halfway would leave half a tree.
    check_tree(local)?;
    require_running(client, id)?;
    let (into, name) = match stat(client, id, path)? {
        Some(entry) if entry["type"] == "dir" => (path.to_string(), tree_name(local)),
        Some(entry) if entry["type"] == "symlink" => bail!(
            "{id}:{path} is a symlink (to {}): name the directory it points to",
            entry["symlink_target"].as_str().unwrap_or("?")
        ),
        Some(_) => bail!(
            "{id}:{path} exists and is not a directory: cannot copy the directory {} onto it",
            local.display()
        ),
        None => {
            let trimmed = path.trim_end_matches('/');
            let name = file_name(trimmed)
                .with_context(|| format!("{id}:{path} has no name to copy the directory to"))?;
            let parent = match trimmed.rsplit_once('/') {
                Some(("", _)) | None => "/".to_string(),
                Some((p, _)) => p.to_string(),
            };
            match stat(client, id, &parent)? {
                Some(entry) if entry["type"] == "dir" => {}
                Some(_) => bail!("{id}:{parent} is not a directory"),
                None => bail!(
                    "no directory {parent} in sandbox {id}: create it first (brig exec {id} -- \
                     mkdir -p {parent})"
                ),
            }
            (parent, name.to_string())
        }
    };
    let (reader, builder) = tar_of(local.to_path_buf(), name);
    let sent = unpack_remote(client, id, &into, reader, Some(local));
    finish_upload(sent, builder)
}

/// The upload's outcome, or, if the archive could not be made, why: the
/// builder's own error says best what went wrong on this side.
fn finish_upload(sent: anyhow::Result<()>, builder: Builder) -> anyhow::Result<()> {
    match builder.join() {
        Ok(Ok(())) => sent,
        Ok(Err(e)) => Err(e),
        Err(_) => bail!("building the archive to send failed"),
    }
}

/// `PUT /archive`: unpack the tar `body` into the directory `dir` in the
/// sandbox. `local` names the tree being sent, for messages.
fn unpack_remote(
    client: &Client,
    id: &str,
    dir: &str,
    body: impl Read,
    local: Option<&Path>,
) -> anyhow::Result<()> {
    let req = client
        .request("PUT", &archive_url(id))
        .query("path", dir)
        .set("Content-Type", "application/x-tar");
    let what = match local {
        Some(p) => format!("copy of {} to {id}:{dir}", p.display()),
        None => format!("unpacking stdin into {id}:{dir}"),
    };
    client.send_reader(req, body).map_err(|e| {
        // Not an answer from the daemon: the connection broke under the body.
        let e = if e.downcast_ref::<RemoteError>().is_none() {
            e.context(
                "the daemon closed the connection: the sandbox may be out of disk or memory, \
                 or the archive was refused after its start",
            )
        } else {
            e
        };
        e.context(format!("{what} failed"))
    })?;
    Ok(())
}

/// The name a local tree is archived under: its own, or `.` for `dir/.`
/// (its contents, as docker cp reads it) and for `/`.
fn tree_name(local: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let raw = local.as_os_str().as_bytes();
    if raw == b"." || raw.ends_with(b"/.") {
        return ".".to_string();
    }
    let name = match local.file_name() {
        Some(n) => Some(n.to_os_string()),
        // `..` and the like: the directory's real name.
        None => std::fs::canonicalize(local)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_os_string())),
    };
    name.map_or_else(|| ".".to_string(), |n| n.to_string_lossy().into_owned())
}

/// Refuse, by name, what the sandbox's agent cannot create: symlinks,
/// devices, FIFOs, sockets; and names it cannot take (not UTF-8).
fn check_tree(root: &Path) -> anyhow::Result<()> {
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries =
            std::fs::read_dir(&dir).with_context(|| format!("cannot read {}", dir.display()))?;
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot read {}", dir.display()))?;
            let path = entry.path();
            if entry.file_name().to_str().is_none() {
                bail!(
                    "{}: the name is not UTF-8, which the sandbox's file API cannot take",
                    path.display()
                );
            }
            let kind = entry
                .file_type()
                .with_context(|| format!("cannot read {}", path.display()))?;
            if kind.is_symlink() {
                bail!(
                    "{} is a symlink: the sandbox's agent cannot create symlinks, so brig cp \
                     cannot copy one into a sandbox; remove it or put what it points to in its \
                     place",
                    path.display()
                );
            } else if kind.is_dir() {
                dirs.push(path);
            } else if !kind.is_file() {
                bail!(
                    "{} is a device, FIFO or socket: brig cp copies files and directories",
                    path.display()
                );
            }
        }
    }
    Ok(())
}

/// A tar of `local`, its entries rooted at `name`, read as it is built on
/// a thread of its own; the thread's result says whether it was whole.
fn tar_of(local: PathBuf, name: String) -> (PipeReader, Builder) {
    piped_tar(move |tar| {
        // Symlinks were refused above; one made since goes as a link (and
        // is refused by the daemon), never as what it points to.
        tar.follow_symlinks(false);
        tar.append_dir_all(&name, &local)
            .with_context(|| format!("cannot archive {}", local.display()))
    })
}

/// The tar on stdin, entry by entry, each checked before it is passed on:
/// one the daemon would refuse stops the copy here, with its name, instead
/// of under a body the daemon has stopped reading.
fn checked_stdin_tar() -> (PipeReader, Builder) {
    piped_tar(|tar| {
        let mut input = tar::Archive::new(io::stdin().lock());
        let bad = |e: io::Error| anyhow::anyhow!("stdin is not a valid tar archive: {e}");
        for entry in input.entries().map_err(bad)? {
            let mut entry = entry.map_err(bad)?;
            let mut header = entry.header().clone();
            match header.entry_type() {
                // Metadata for what follows, which the reader has applied.
                tar::EntryType::XGlobalHeader => continue,
                tar::EntryType::Regular
                | tar::EntryType::Continuous
                | tar::EntryType::Directory => {}
                // Passed on expanded, as the reader reads it.
                tar::EntryType::GNUSparse => header.set_entry_type(tar::EntryType::Regular),
                other => bail!("{}", unsupported_entry(&entry, other)),
            }
            let path = entry.path().map_err(bad)?.into_owned();
            check_entry_name(&path)?;
            header.set_size(entry.size());
            tar.append_data(&mut header, &path, &mut entry)
                .context("cannot pass the archive on")?;
        }
        Ok(())
    })
}

/// Why an entry of this type cannot be unpacked in a sandbox.
fn unsupported_entry(entry: &tar::Entry<impl Read>, kind: tar::EntryType) -> String {
    let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
    let what = match kind {
        tar::EntryType::Symlink => "a symlink: the sandbox's agent cannot create symlinks",
        tar::EntryType::Link => "a hard link: the sandbox's agent cannot create links",
        _ => "not a file or directory: only files and directories can be unpacked",
    };
    format!("entry {name:?} is {what}")
}

/// An entry name must stay below the directory it is unpacked in.
fn check_entry_name(path: &Path) -> anyhow::Result<()> {
    use std::path::Component;
    for c in path.components() {
        match c {
            Component::ParentDir => bail!(
                "entry {:?} contains `..`: archive entries must stay inside the directory they \
                 are unpacked in",
                path.display().to_string()
            ),
            Component::RootDir | Component::Prefix(_) => bail!(
                "entry {:?} is an absolute path: archive entries must be relative to the \
                 directory they are unpacked in",
                path.display().to_string()
            ),
            Component::CurDir | Component::Normal(_) => {}
        }
    }
    Ok(())
}

/// The thread that writes an archive for an upload, and its outcome.
type Builder = std::thread::JoinHandle<anyhow::Result<()>>;

/// A tar that `fill` writes, on a thread of its own, read from the
/// returned reader as it is written; the thread's result says whether it
/// is whole.
fn piped_tar(
    fill: impl FnOnce(&mut tar::Builder<io::BufWriter<PipeWriter>>) -> anyhow::Result<()>
        + Send
        + 'static,
) -> (PipeReader, Builder) {
    let (tx, rx) = std::sync::mpsc::sync_channel(PIPE_CHUNKS);
    let builder = std::thread::spawn(move || {
        let writer = io::BufWriter::with_capacity(PIPE_CHUNK, PipeWriter(tx.clone()));
        let mut tar = tar::Builder::new(writer);
        let built = fill(&mut tar).and_then(|()| {
            let mut w = tar.into_inner()?;
            w.flush()?;
            Ok(())
        });
        let _ = tx.send(match &built {
            Ok(()) => Piped::End,
            Err(e) => Piped::Failed(format!("{e:#}")),
        });
        built
    });
    (
        PipeReader {
            rx,
            buf: Vec::new(),
            pos: 0,
            ended: false,
        },
        builder,
    )
}

/// Chunks of the archive in flight between its builder and the upload.
const PIPE_CHUNKS: usize = 4;
const PIPE_CHUNK: usize = 64 * 1024;

enum Piped {
    Data(Vec<u8>),
    /// The archive is whole.
    End,
    Failed(String),
}

struct PipeWriter(std::sync::mpsc::SyncSender<Piped>);

impl Write for PipeWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .send(Piped::Data(buf.to_vec()))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the upload stopped"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reading end: EOF only once the builder said the archive is whole,
/// so a builder that failed or died ends the upload with an error, not
/// with an archive cut short that looks complete.
struct PipeReader {
    rx: std::sync::mpsc::Receiver<Piped>,
    buf: Vec<u8>,
    pos: usize,
    ended: bool,
}

impl Read for PipeReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.buf.len() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Piped::Data(b)) => (self.buf, self.pos) = (b, 0),
                Ok(Piped::End) => self.ended = true,
                Ok(Piped::Failed(e)) => return Err(io::Error::other(e)),
                Err(_) => return Err(io::Error::other("the archive builder stopped")),
            }
        }
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// `brig cp ID:/dir DST`: the tree as a tar to stdout, or unpacked into
/// DST as `cp -r` would copy it.
fn download_tree(client: &Client, id: &str, path: &str, to: Operand) -> anyhow::Result<()> {
    let resp = client.send(
        client.request("GET", &archive_url(id)).query("path", path),
        None,
    )?;
    let mut body = resp.into_reader();
    match to {
        Operand::Std => {
            let mut out = io::stdout().lock();
            io::copy(&mut body, &mut out)
                .with_context(|| format!("copying {id}:{path} to stdout failed"))?;
            out.flush().context("cannot write to stdout")
        }
        Operand::Local(dst) => {
            // The archive's entries start with the directory's name (`.`
            // for `/`).
            let root = match path.trim_end_matches('/').rsplit('/').next() {
                None | Some("") => ".",
                Some(name) => name,
            };
            unpack_local(&mut body, root, &dst)
                .with_context(|| format!("copying {id}:{path} to {} failed", dst.display()))
        }
        Operand::Sandbox { .. } => unreachable!("into_config pairs a sandbox with a local side"),
    }
}

/// Unpack an archive rooted at `root` as `dst` (or into it, when it is a
/// directory already).
fn unpack_local(body: &mut dyn Read, root: &str, dst: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(dst) {
        // Into it, under the source's name; merged with what is there, as
        // cp -r does.
        Ok(meta) if meta.is_dir() => unpack_into(body, dst),
        Ok(_) => bail!("{} exists and is not a directory", dst.display()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = match dst.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !parent.is_dir() {
                bail!("no directory {}", parent.display());
            }
            if root == "." {
                std::fs::create_dir(dst)
                    .with_context(|| format!("cannot create {}", dst.display()))?;
                return unpack_into(body, dst);
            }
            // Unpacked beside it, then renamed into place: an interrupted
            // copy leaves nothing under the final name.
            let name = dst
                .file_name()
                .with_context(|| format!("{} names no directory", dst.display()))?;
            let tmp = parent.join(format!(
                ".{}.brig-cp-{}",
                name.to_string_lossy(),
                std::process::id()
            ));
            std::fs::create_dir(&tmp)
                .with_context(|| format!("cannot create {}", tmp.display()))?;
            let result = unpack_into(body, &tmp).and_then(|()| {
                std::fs::rename(tmp.join(root), dst).with_context(|| {
                    format!(
                        "cannot rename {} to {}",
                        tmp.join(root).display(),
                        dst.display()
                    )
                })
            });
            let _ = std::fs::remove_dir_all(&tmp);
            result
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", dst.display())),
    }
}

/// Unpack with the `tar` crate's guards: nothing lands outside `dir` (no
/// `..`, no absolute names, nothing written through a symlink), and
/// setuid and setgid bits are dropped.
fn unpack_into(body: &mut dyn Read, dir: &Path) -> anyhow::Result<()> {
    let mut archive = tar::Archive::new(&mut *body);
    archive.set_preserve_permissions(false);
    archive.set_preserve_mtime(true);
    archive.unpack(dir)?;
    // Read on past the archive's end: a transfer that broke off is an
    // error there, not an archive that merely looked short.
    io::copy(body, &mut io::sink())?;
    Ok(())
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
    fn a_sandbox_side_may_be_named_or_an_id_prefix() {
        for (src, id) in [("web-1:/a", "web-1"), ("01ab:/a", "01ab")] {
            match config(src, "b").unwrap() {
                CpConfig::Download { id: got, .. } => assert_eq!(got, id),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn bad_operands_say_what_to_write() {
        for (src, dst, says) in [
            ("a", "b", "neither side"),
            ("-", "-", "neither side"),
            ("0123456789ab:/a", "0123456789ab:/b", "both sides"),
            ("not a name:/a", "b", "./not a name:/a"),
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
