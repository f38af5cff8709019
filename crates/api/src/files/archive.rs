//! `/v1/sandboxes/{id}/archive?path=`: a file or a whole tree as one tar
//! stream, in both directions, as `docker cp` moves them.
//!
//! **GET** builds the tar here, from the agent's ordinary file calls: a
//! `stat` of `path`, a `list` of one directory at a time, and a
//! `FILE_READ` stream per file, copied into the archive a chunk at a time.
//! One directory at a time, not one deep `list`: a deep one is capped at
//! 20,000 entries and would be held whole, while this holds only the
//! directories still to visit. Entry names are rooted at the base name of
//! `path` (`/srv/app` gives `app`, `app/main.py`, …; `/` gives `.`,
//! `./etc`, …). An entry keeps its type, permission bits, mtime, owner and
//! group (ids, and names where the sandbox has them) and a symlink's
//! target; symlinks are archived, never followed. Devices, FIFOs and
//! sockets are left out: the agent reports no device numbers, and reading
//! a FIFO would wait forever. What fails before the first byte (no such
//! path: 404) is an ordinary API error; what fails later (a file the agent
//! cannot read) ends the body abnormally, so the client sees a broken
//! transfer, never a short archive that looks whole.
//!
//! **PUT** unpacks a tar body under `path`, an existing directory, entry
//! by entry as the body arrives: a directory is a `mkdir -p`, a file a
//! `FILE_WRITE` stream carrying its permission bits. The agent has no call
//! to create a symlink or a device, or to set a directory's mode or an
//! mtime, so such entries (and hard links) are refused with 400 naming
//! them, and directories get the agent's default mode. Every name is
//! checked before anything is done with it: an absolute one, or one with a
//! `..` component, is refused (400 naming it), so an archive cannot steer
//! the unpack out of `path`. (The agent would keep it inside the sandbox
//! anyway; this keeps it inside the directory the client named. A tar
//! cannot plant a symlink to lead later entries elsewhere, as it cannot
//! create symlinks at all; one the sandbox itself made below `path` is
//! followed, as by any file write, and leads only elsewhere in the
//! sandbox.) Entries are unpacked in order; an error stops the unpack
//! there, and what came before it stays written.

use std::collections::{HashSet, VecDeque};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Component, Path as FsPath};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::Response;
use axum::Json;
use brig_agent_client::{Call, ClientError, Connection, Entry, ErrorCode, FileKind, Reply};
use brig_core::SandboxId;
use brig_runtime::ManagerError;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::{FileQuery, CHUNK, CHUNKS_IN_FLIGHT};
use crate::{blocking, sandbox_id, ApiError, AppState, Auth};

/// What a refused upload still reads of its body before answering. A
/// client blocked writing a large body would not read the answer, and a
/// server that stops reading and closes makes it see a reset instead of
/// the reason; past this much, it does.
const DRAIN_LIMIT: u64 = 256 << 20;

/// `GET /archive?path=`: `path` and everything below it as a tar stream.
pub async fn download(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let path = query?.0.checked()?;
    let root = root_name(&path)?;
    let manager = state.manager.clone();
    let (path_shown, id_shown) = (path.clone(), id.clone());
    let (conn, top) = blocking(move || {
        let conn = manager.connection(&tenant, &id)?;
        let top = stat(&conn, &id, &path)?;
        if top.kind == FileKind::Other {
            return Err(ApiError::bad_request(format!(
                "{path} is a device, FIFO or socket: only files, directories and symlinks \
                 can be archived"
            )));
        }
        Ok::<_, ApiError>((conn, top))
    })
    .await?;

    let (tx, rx) = mpsc::channel::<Result<Bytes, io::Error>>(CHUNKS_IN_FLIGHT);
    // The agent client and the tar builder are blocking; the channel paces
    // them to the HTTP client.
    tokio::task::spawn_blocking(move || {
        let sink = BufWriter::with_capacity(CHUNK, ChannelWriter(tx.clone()));
        if let Err(e) = write_tree(&conn, top, &root, sink) {
            if e.kind() != io::ErrorKind::BrokenPipe {
                tracing::warn!("archive of {path_shown} in sandbox {id_shown}: {e}");
            }
            // Ends the response abnormally (if the client is still there).
            let _ = tx.blocking_send(Err(e));
        }
    });
    Response::builder()
        .header(CONTENT_TYPE, "application/x-tar")
        .body(Body::from_stream(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        ))
        .map_err(|e| ApiError::internal(&e))
}

/// The name the archive's entries are rooted at: the last component of
/// `path`, or `.` for `/`. Public for the `file_paths` fuzz target, like
/// [`relative`].
pub fn root_name(path: &str) -> Result<String, ApiError> {
    match path.trim_end_matches('/').rsplit('/').next() {
        None | Some("") => Ok(".".to_string()),
        Some("." | "..") => Err(ApiError::bad_request(format!(
            "invalid path {path:?}: name the file or directory itself, without a trailing `.` \
             or `..`"
        ))),
        Some(name) => Ok(name.to_string()),
    }
}

/// `stat` of `path`; not there is 404 with a message that says so.
fn stat(conn: &Connection, id: &SandboxId, path: &str) -> Result<Entry, ApiError> {
    let call = Call::Stat {
        path: path.to_string(),
        xattrs: None,
    };
    match conn.call(&call) {
        Ok(Reply::Stat(entry)) => Ok(entry),
        Ok(other) => Err(super::unexpected(other)),
        Err(ClientError::Agent {
            code: ErrorCode::NotFound,
            ..
        }) => Err(ApiError::not_found(format!(
            "no file or directory {path} in sandbox {id}"
        ))),
        Err(source) => Err(agent(id, source)),
    }
}

fn agent(id: &SandboxId, source: ClientError) -> ApiError {
    ManagerError::Agent {
        id: id.clone(),
        source,
    }
    .into()
}

/// Write `top` (and, for a directory, everything below it) as a tar
/// archive whose names start with `root`, then the archive's end.
fn write_tree(conn: &Connection, top: Entry, root: &str, out: impl Write) -> io::Result<()> {
    let mut tar = tar::Builder::new(out);
    let is_dir = top.kind == FileKind::Dir;
    let top_path = top.path.clone();
    append(conn, &mut tar, top, root)?;
    // (sandbox path, archive name) of each directory still to list.
    let mut dirs = VecDeque::new();
    if is_dir {
        dirs.push_back((top_path, root.to_string()));
    }
    while let Some((dir, name)) = dirs.pop_front() {
        for entry in list(conn, &dir)? {
            // The listing comes from inside the sandbox: a name that is not
            // one plain component would put the entry elsewhere in the
            // archive (and, unpacked, elsewhere on the client's disk).
            if entry.name.is_empty()
                || entry.name == "."
                || entry.name == ".."
                || entry.name.contains(['/', '\0'])
            {
                return Err(io::Error::other(format!(
                    "the agent listed an invalid name {:?} in {dir}",
                    entry.name
                )));
            }
            let child = format!("{}/{}", dir.trim_end_matches('/'), entry.name);
            let child_name = format!("{name}/{}", entry.name);
            let kind = entry.kind;
            // The path the agent reported is not trusted either.
            let entry = Entry {
                path: child.clone(),
                ..entry
            };
            append(conn, &mut tar, entry, &child_name)?;
            if kind == FileKind::Dir {
                dirs.push_back((child, child_name));
            }
        }
    }
    tar.into_inner()?.flush()
}

/// One directory's entries. A directory that went away since it was
/// listed is empty.
fn list(conn: &Connection, dir: &str) -> io::Result<Vec<Entry>> {
    let call = Call::List {
        path: dir.to_string(),
        depth: 1,
        xattrs: None,
    };
    match conn.call(&call) {
        Ok(Reply::Entries(entries)) => Ok(entries),
        Ok(Reply::Done) => Ok(Vec::new()),
        Ok(other) => Err(io::Error::other(format!(
            "the agent answered a list with {other:?}"
        ))),
        Err(ClientError::Agent {
            code: ErrorCode::NotFound,
            ..
        }) => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Append one entry; a file's contents are streamed from the agent.
fn append(
    conn: &Connection,
    tar: &mut tar::Builder<impl Write>,
    entry: Entry,
    name: &str,
) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_mode(entry.mode & 0o7777);
    header.set_mtime(entry.mtime.max(0) as u64);
    if let Some(uid) = entry.uid {
        header.set_uid(uid.into());
    }
    if let Some(gid) = entry.gid {
        header.set_gid(gid.into());
    }
    // A name too long for the header's field is left out; the id stays.
    if let Some(owner) = &entry.owner {
        let _ = header.set_username(owner);
    }
    if let Some(group) = &entry.group {
        let _ = header.set_groupname(group);
    }
    match entry.kind {
        FileKind::Dir => {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            tar.append_data(&mut header, name, io::empty())
        }
        FileKind::Symlink => {
            let target = entry.symlink_target.unwrap_or_default();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            tar.append_link(&mut header, name, target)
        }
        FileKind::File => {
            let reader = match conn.read_file(&entry.path) {
                Ok(r) => r,
                // Gone since it was listed (a temporary file): as if it had
                // never been there, as tar does.
                Err(ClientError::Agent {
                    code: ErrorCode::NotFound,
                    ..
                }) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            let size = reader.size();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(size);
            let body = Exactly {
                inner: reader,
                left: size,
                path: &entry.path,
            };
            tar.append_data(&mut header, name, body)
        }
        FileKind::Other => Ok(()),
    }
}

/// The first `left` bytes of a file, which must have them: one that shrank
/// while it was read would leave its header's size unmet and every later
/// entry misread.
struct Exactly<'a, R> {
    inner: R,
    left: u64,
    path: &'a str,
}

impl<R: Read> Read for Exactly<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let max = buf.len().min(self.left.try_into().unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::Error::other(format!(
                "{} shrank while it was archived ({} bytes short)",
                self.path, self.left
            )));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The archive's bytes, to the HTTP body: blocks while the client is
/// behind; fails once it is gone.
struct ChannelWriter(mpsc::Sender<Result<Bytes, io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `PUT /archive?path=`: unpack the tar body under `path`, an existing
/// directory.
pub async fn upload(
    State(state): State<AppState>,
    Auth(tenant): Auth,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
    body: Body,
) -> Result<Json<Value>, ApiError> {
    let id = sandbox_id(&id?.0)?;
    let dir = query?.0.checked()?;
    let stream = body.into_data_stream().map(|r| r.map_err(io::Error::other));
    // The tar reader and the agent client are blocking; the bridge blocks
    // this (blocking-pool) thread on the async body.
    let mut reader = SyncIoBridge::new(StreamReader::new(stream));
    let manager = state.manager.clone();
    let unpacked = blocking(move || {
        let result = manager
            .connection(&tenant, &id)
            .map_err(ApiError::from)
            .and_then(|conn| unpack(&conn, &id, &dir, &mut reader));
        // Read what is left (a tar's padding; the rest of a refused one),
        // so the client, still sending, gets to read the answer.
        let _ = io::copy(&mut (&mut reader).take(DRAIN_LIMIT), &mut io::sink());
        result
    })
    .await?;
    Ok(Json(unpacked))
}

/// Unpack `body` under `dir` in the sandbox; what was made, as JSON.
fn unpack(
    conn: &Arc<Connection>,
    id: &SandboxId,
    dir: &str,
    body: impl Read,
) -> Result<Value, ApiError> {
    let top = stat(conn, id, dir).map_err(|e| match e.code {
        "not_found" => ApiError::not_found(format!(
            "no directory {dir} in sandbox {id}: create it first (POST \
             /v1/sandboxes/{id}/files/mkdir)"
        )),
        _ => e,
    })?;
    match (top.kind, top.symlink_target) {
        (FileKind::Dir, _) => {}
        (FileKind::Symlink, Some(target)) => {
            return Err(ApiError::bad_request(format!(
                "{dir} is a symlink to {target}: name the directory itself"
            )))
        }
        _ => {
            return Err(ApiError::bad_request(format!(
                "{dir} is not a directory: an archive is unpacked into a directory"
            )))
        }
    }
    let base = dir.trim_end_matches('/');
    let mut body = Counted { inner: body, n: 0 };
    let mut archive = tar::Archive::new(&mut body);
    let malformed =
        |e: io::Error| ApiError::bad_request(format!("the body is not a valid tar archive: {e}"));
    let (mut files, mut dirs, mut bytes) = (0u64, 0u64, 0u64);
    // Directories known to exist (made, or a file's parent made), so each
    // is made once.
    let mut made: HashSet<String> = HashSet::new();
    for entry in archive.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let shown = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let Some(rel) = relative(&shown, &entry.path().map_err(malformed)?)? else {
            // `.` or `./`: the target directory itself, which exists.
            continue;
        };
        let target = format!("{base}/{rel}");
        match kind {
            tar::EntryType::Directory => {
                mkdir(conn, id, &target)?;
                made.insert(rel);
                dirs += 1;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                if let Some((parent, _)) = rel.rsplit_once('/') {
                    if !made.contains(parent) {
                        mkdir(conn, id, &format!("{base}/{parent}"))?;
                        made.insert(parent.to_string());
                    }
                }
                let mode = entry.header().mode().map_err(malformed)? & 0o7777;
                let size = entry.size();
                let mut counted = Counted {
                    inner: &mut entry,
                    n: 0,
                };
                let written = conn
                    .write_file(&target, &mut counted, Some(mode), false)
                    .map_err(|e| match e {
                        // The body, not the sandbox: it broke off or is
                        // not a tar past this point.
                        ClientError::Io { source, .. } => ApiError::bad_request(format!(
                            "entry {shown:?}: the archive broke off inside it: {source}"
                        )),
                        e => agent(id, e),
                    })?;
                // The tar reader ends an entry early, without an error,
                // where the body ends.
                if counted.n != size {
                    return Err(ApiError::bad_request(format!(
                        "entry {shown:?}: the archive broke off inside it ({} of {size} bytes)",
                        counted.n
                    )));
                }
                if written != counted.n {
                    return Err(ApiError::internal(&io::Error::other(format!(
                        "{target}: sent {} bytes, the agent wrote {written}",
                        counted.n
                    ))));
                }
                files += 1;
                bytes += written;
            }
            other => return Err(refused(&shown, other, &entry)),
        }
    }
    // Even an empty tar has its end (two zero blocks); no body at all is a
    // request that forgot it.
    if body.n == 0 {
        return Err(ApiError::bad_request(
            "the body is empty: send a tar archive (Content-Type: application/x-tar)",
        ));
    }
    Ok(json!({ "path": dir, "files": files, "dirs": dirs, "bytes": bytes }))
}

/// An entry's name as a path below the target directory: plain components
/// only (`.` ones dropped); `None` for the directory itself. Absolute names
/// and `..` are refused, whatever they would resolve to.
pub fn relative(shown: &str, name: &FsPath) -> Result<Option<String>, ApiError> {
    let mut parts = Vec::new();
    for c in name.components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str().ok_or_else(|| {
                ApiError::bad_request(format!("entry {shown:?}: the name is not UTF-8"))
            })?),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(ApiError::bad_request(format!(
                    "entry {shown:?} is an absolute path: archive entries must be relative to \
                     the directory they are unpacked in"
                )))
            }
            Component::ParentDir => {
                return Err(ApiError::bad_request(format!(
                    "entry {shown:?} contains `..`: archive entries must stay inside the \
                     directory they are unpacked in"
                )))
            }
        }
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

/// An entry of a type the agent cannot create.
fn refused(shown: &str, kind: tar::EntryType, entry: &tar::Entry<impl Read>) -> ApiError {
    let what = match kind {
        tar::EntryType::Symlink => {
            let target = entry
                .link_name()
                .ok()
                .flatten()
                .map(|t| format!(" to {}", t.display()))
                .unwrap_or_default();
            format!(
                "a symlink{target}: the sandbox's agent cannot create symlinks; leave it out, or \
                 put the file it points to in its place"
            )
        }
        tar::EntryType::Link => "a hard link: the sandbox's agent cannot create links; \
                                 archive the file itself (e.g. tar --hard-dereference)"
            .to_string(),
        tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
            "a device or FIFO: only files and directories can be unpacked".to_string()
        }
        other => format!(
            "of tar type {:?}: only files and directories can be unpacked",
            other.as_byte() as char
        ),
    };
    ApiError::bad_request(format!("entry {shown:?} is {what}"))
}

fn mkdir(conn: &Connection, id: &SandboxId, path: &str) -> Result<(), ApiError> {
    let call = Call::Mkdir {
        path: path.to_string(),
        parents: true,
    };
    match conn.call(&call) {
        Ok(_) => Ok(()),
        Err(e) => Err(agent(id, e)),
    }
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

    fn rel(name: &str) -> Result<Option<String>, String> {
        relative(name, FsPath::new(name)).map_err(|e| e.message)
    }

    #[test]
    fn entry_names_stay_below_the_target() {
        assert_eq!(rel("a/b.txt").unwrap().as_deref(), Some("a/b.txt"));
        assert_eq!(rel("./a/./b/").unwrap().as_deref(), Some("a/b"));
        assert_eq!(rel("./").unwrap(), None);
        assert_eq!(rel(".").unwrap(), None);
        let err = rel("../evil").unwrap_err();
        assert!(err.contains("\"../evil\"") && err.contains("`..`"), "{err}");
        let err = rel("a/../../evil").unwrap_err();
        assert!(err.contains("`..`"), "{err}");
        let err = rel("/etc/passwd").unwrap_err();
        assert!(
            err.contains("\"/etc/passwd\"") && err.contains("absolute"),
            "{err}"
        );
    }

    #[test]
    fn archives_are_rooted_at_the_base_name() {
        assert_eq!(root_name("/srv/app").unwrap(), "app");
        assert_eq!(root_name("/srv/app/").unwrap(), "app");
        assert_eq!(root_name("/").unwrap(), ".");
        assert!(root_name("/srv/..").is_err());
        assert!(root_name("/srv/.").is_err());
    }

    #[test]
    fn a_file_that_shrank_is_an_error_not_a_short_entry() {
        let mut r = Exactly {
            inner: &b"abc"[..],
            left: 5,
            path: "/f",
        };
        let mut out = Vec::new();
        let err = io::copy(&mut r, &mut out).unwrap_err();
        assert!(err.to_string().contains("/f shrank"), "{err}");
        let mut r = Exactly {
            inner: &b"abcdef"[..],
            left: 4,
            path: "/f",
        };
        let mut out = Vec::new();
        io::copy(&mut r, &mut out).unwrap();
        assert_eq!(out, b"abcd");
    }
}
