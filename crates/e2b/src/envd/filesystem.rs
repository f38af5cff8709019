//! envd's `filesystem.Filesystem` service (reference §3.3) on the agent's
//! list/stat/mkdir/rename/remove calls and its inotify watches.
//!
//! `EntryInfo` is built from the agent's [`Entry`]: type, size, mode,
//! permissions (`-rw-r--r--`, computed from the mode), owner and group (the
//! names in the sandbox's /etc/passwd and /etc/group, which the agent looks
//! up; the numeric id when there is none, as envd does), modification time
//! (RFC 3339), symlink target, and `metadata`: the file's `user.e2b.*`
//! extended attributes with the prefix stripped (envd 0.6.2).
//!
//! A symlink is `FILE_TYPE_SYMLINK` with `isSymlink: true`: newer envd
//! reports the target's type in `type` and marks the link with
//! `isSymlink`, but JS clients up to 2.51 know only `FILE_TYPE_SYMLINK`,
//! and Python 2.63 reads either. `symlinkTarget` is the target as an
//! absolute path (envd resolves it; brig joins a relative one to the
//! link's directory).
//!
//! Watches come in two forms: `WatchDir`, a stream (Python async and JS
//! SDKs), and `CreateWatcher`/`GetWatcherEvents`/`RemoveWatcher`, polling
//! (the Python sync SDK), whose events wait in a bounded queue per watcher
//! ([`Watchers`]; at most [`MAX_WATCHERS`] per sandbox).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Request};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use brig_agent_client::{Call, ChangeKind, Entry, FileKind, Reply, WatchEvent, WatchStopper};
use brig_runtime::ManagerError;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::connect::{self, Code, ConnectError, StreamItem};
use super::process::read_body;
use super::{lock, Ctx, User};

/// Polling watchers one sandbox may have at once.
pub const MAX_WATCHERS: usize = 64;
/// Events a polling watcher keeps between polls; older ones are dropped.
const MAX_QUEUED_EVENTS: usize = 4096;

/// `POST /filesystem.Filesystem/{method}`.
pub async fn rpc(
    Extension(ctx): Extension<Ctx>,
    Path(method): Path<String>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let body = match read_body(body).await {
        Ok(b) => b,
        Err(e) if method == "WatchDir" => return connect::stream_error(e),
        Err(e) => return e.into_response(),
    };
    if method == "WatchDir" {
        return watch_dir(&ctx, &headers, &body).await;
    }
    let user = super::basic_user(&headers);
    let result = match method.as_str() {
        "Stat" | "MakeDir" | "Move" | "ListDir" | "Remove" | "CreateWatcher" => {
            let (method, headers) = (method.clone(), headers.clone());
            ctx.blocking(move |ctx| {
                let user = ctx.user(user.as_deref())?;
                match method.as_str() {
                    "Stat" => stat(ctx, &user, &headers, &body),
                    "MakeDir" => make_dir(ctx, &user, &headers, &body),
                    "Move" => rename(ctx, &user, &headers, &body),
                    "ListDir" => list_dir(ctx, &user, &headers, &body),
                    "Remove" => remove(ctx, &user, &headers, &body),
                    _ => create_watcher(ctx, &user, &headers, &body),
                }
            })
            .await
        }
        "GetWatcherEvents" => get_watcher_events(&ctx, &headers, &body),
        "RemoveWatcher" => remove_watcher(&ctx, &headers, &body),
        other => Err(ConnectError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem has no method {other}"),
        )),
    };
    connect::unary(result)
}

/// Decode `body` as `method`'s request and resolve its paths for `user`
/// as the handler does before it asks the sandbox anything: the part of
/// [`rpc`] a client's bytes reach first, runnable without a sandbox, for
/// the `envd_messages` fuzz target. The resolved paths are returned. A
/// method added to [`rpc`] belongs here too.
pub fn check_request(
    method: &str,
    user: &User,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Vec<String>, ConnectError> {
    Ok(match method {
        "Stat" | "MakeDir" | "Remove" => {
            let req: PathRequest = connect::unary_request(headers, body)?;
            vec![user.resolve(&req.path)]
        }
        "Move" => {
            let req: MoveRequest = connect::unary_request(headers, body)?;
            vec![user.resolve(&req.source), user.resolve(&req.destination)]
        }
        "ListDir" => {
            let req: ListDirRequest = connect::unary_request(headers, body)?;
            vec![user.resolve(&req.path)]
        }
        "CreateWatcher" => {
            let req: WatchRequest = connect::unary_request(headers, body)?;
            vec![user.resolve(&req.path)]
        }
        "WatchDir" => {
            let req: WatchRequest = connect::stream_request(headers, body)?;
            vec![user.resolve(&req.path)]
        }
        "GetWatcherEvents" | "RemoveWatcher" => {
            let _: WatcherIdRequest = connect::unary_request(headers, body)?;
            Vec::new()
        }
        other => {
            return Err(ConnectError::new(
                Code::Unimplemented,
                format!("filesystem.Filesystem has no method {other}"),
            ))
        }
    })
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    /// envd 0.6.3: each event carries the entry's `EntryInfo` when it
    /// still exists.
    #[serde(default)]
    include_entry: bool,
    /// envd 0.6.4: envd refuses to watch NFS/CIFS/SMB/FUSE mounts unless
    /// this is set. A brig sandbox has no network mounts, so there is
    /// nothing to refuse: accepted and ignored.
    #[serde(default)]
    #[allow(dead_code)]
    allow_network_mounts: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherIdRequest {
    #[serde(default)]
    watcher_id: String,
}

/// The prefix of the extended attributes envd keeps file metadata in.
pub const METADATA_XATTR_PREFIX: &str = "user.e2b.";

/// `EntryInfo` in proto3 JSON.
pub fn entry_info(e: &Entry) -> Value {
    let (ty, letter) = match e.kind {
        FileKind::File => ("FILE_TYPE_FILE", '-'),
        FileKind::Dir => ("FILE_TYPE_DIRECTORY", 'd'),
        // Go's FileMode.String() marks a symlink with 'L'.
        FileKind::Symlink => ("FILE_TYPE_SYMLINK", 'L'),
        FileKind::Other => ("FILE_TYPE_UNSPECIFIED", '?'),
    };
    // envd names an id it cannot find by its number; an agent too old to
    // report ids leaves both empty.
    let name = |name: &Option<String>, id: Option<u32>| {
        name.clone()
            .or_else(|| id.map(|i| i.to_string()))
            .unwrap_or_default()
    };
    let mut v = json!({
        "name": e.name,
        "type": ty,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode & 0o777,
        "permissions": permissions(letter, e.mode),
        "owner": name(&e.owner, e.uid),
        "group": name(&e.group, e.gid),
        "modifiedTime": rfc3339(e.mtime),
    });
    if let Some(t) = &e.symlink_target {
        v["symlinkTarget"] = json!(absolute_target(&e.path, t));
        v["isSymlink"] = json!(true);
    }
    let metadata = metadata(e);
    if !metadata.is_empty() {
        v["metadata"] = json!(metadata);
    }
    v
}

/// The `user.e2b.*` attributes of an entry, prefix stripped.
pub fn metadata(e: &Entry) -> std::collections::BTreeMap<String, String> {
    e.xattrs
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.strip_prefix(METADATA_XATTR_PREFIX)?.to_string(),
                v.clone(),
            ))
        })
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// A symlink's target as an absolute path: relative targets are relative
/// to the link's directory.
fn absolute_target(link: &str, target: &str) -> String {
    if target.starts_with('/') {
        return super::normalize(target);
    }
    let dir = std::path::Path::new(link)
        .parent()
        .map_or_else(|| "/".to_string(), |p| p.to_string_lossy().into_owned());
    super::normalize(&format!("{dir}/{target}"))
}

/// `ls -l` style permissions, as Go's `FileMode.String()` prints them.
fn permissions(kind: char, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(kind);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

/// Seconds since the epoch as an RFC 3339 UTC timestamp.
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn stat_entry(ctx: &Ctx, path: &str) -> Result<Entry, ConnectError> {
    match ctx.manager().call(
        &ctx.sandbox.tenant,
        ctx.id(),
        &Call::Stat {
            path: path.into(),
            xattrs: Some(METADATA_XATTR_PREFIX.into()),
        },
    )? {
        Reply::Stat(e) => Ok(e),
        other => Err(unexpected("stat", &other)),
    }
}

fn unexpected(op: &str, reply: &Reply) -> ConnectError {
    ConnectError::internal(format!("the agent answered {op} with {reply:?}"))
}

fn stat(ctx: &Ctx, user: &User, h: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: PathRequest = connect::unary_request(h, body)?;
    let path = user.resolve(&req.path);
    Ok(json!({ "entry": entry_info(&stat_entry(ctx, &path)?) }))
}

fn make_dir(ctx: &Ctx, user: &User, h: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: PathRequest = connect::unary_request(h, body)?;
    let path = user.resolve(&req.path);
    match stat_entry(ctx, &path) {
        Ok(e) if e.kind == FileKind::Dir => {
            return Err(ConnectError::new(
                Code::AlreadyExists,
                format!("directory '{path}' already exists"),
            ));
        }
        Ok(_) => {
            return Err(ConnectError::invalid(format!(
                "path '{path}' already exists and is not a directory"
            )));
        }
        Err(e) if e.code == Code::NotFound => {}
        Err(e) => return Err(e),
    }
    ctx.ensure_dirs(user, &path)?;
    Ok(json!({ "entry": entry_info(&stat_entry(ctx, &path)?) }))
}

fn rename(ctx: &Ctx, user: &User, h: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: MoveRequest = connect::unary_request(h, body)?;
    let (from, to) = (user.resolve(&req.source), user.resolve(&req.destination));
    if let Some(parent) = std::path::Path::new(&to).parent() {
        ctx.ensure_dirs(user, &parent.to_string_lossy())?;
    }
    ctx.manager().call(
        &ctx.sandbox.tenant,
        ctx.id(),
        &Call::Rename {
            from,
            to: to.clone(),
        },
    )?;
    Ok(json!({ "entry": entry_info(&stat_entry(ctx, &to)?) }))
}

fn list_dir(ctx: &Ctx, user: &User, h: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: ListDirRequest = connect::unary_request(h, body)?;
    let path = user.resolve(&req.path);
    let depth = req.depth.max(1);
    let dir = stat_entry(ctx, &path)?;
    if dir.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!(
            "path '{path}' is not a directory"
        )));
    }
    match ctx.manager().call(
        &ctx.sandbox.tenant,
        ctx.id(),
        &Call::List {
            path,
            depth,
            xattrs: Some(METADATA_XATTR_PREFIX.into()),
        },
    )? {
        Reply::Entries(entries) => Ok(json!({
            "entries": entries.iter().map(entry_info).collect::<Vec<_>>()
        })),
        Reply::Done => Ok(json!({ "entries": [] })),
        other => Err(unexpected("list", &other)),
    }
}

/// `Remove`: the path and everything under it. Like envd's
/// `os.RemoveAll`, a path that is not there is no error.
fn remove(ctx: &Ctx, user: &User, h: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: PathRequest = connect::unary_request(h, body)?;
    let path = user.resolve(&req.path);
    let removed = ctx.manager().call(
        &ctx.sandbox.tenant,
        ctx.id(),
        &Call::Remove {
            path,
            recursive: true,
        },
    );
    match removed.map_err(ConnectError::from) {
        Ok(_) => Ok(json!({})),
        Err(e) if e.code == Code::NotFound => Ok(json!({})),
        Err(e) => Err(e),
    }
}

/// A change as a `FilesystemEvent`.
fn fs_event(ctx: &Ctx, dir: &str, include_entry: bool, ev: &WatchEvent) -> Option<Value> {
    let WatchEvent::Change { kind, name, .. } = ev else {
        // Lost changes have no E2B event; the client re-lists if it cares.
        return None;
    };
    let ty = match kind {
        ChangeKind::Create => "EVENT_TYPE_CREATE",
        ChangeKind::Write => "EVENT_TYPE_WRITE",
        ChangeKind::Remove => "EVENT_TYPE_REMOVE",
        ChangeKind::Rename => "EVENT_TYPE_RENAME",
        ChangeKind::Chmod => "EVENT_TYPE_CHMOD",
    };
    let mut v = json!({ "name": name, "type": ty });
    if include_entry {
        let path = format!("{}/{name}", dir.trim_end_matches('/'));
        if let Ok(e) = stat_entry(ctx, &path) {
            v["entry"] = entry_info(&e);
        }
    }
    Some(v)
}

/// [`fs_event`] for an async pump: the entry's stat (a call to the agent)
/// runs off the async threads.
async fn event_of(ctx: &Ctx, dir: &str, include_entry: bool, ev: WatchEvent) -> Option<Value> {
    if !include_entry {
        return fs_event(ctx, dir, false, &ev);
    }
    let (ctx, dir) = (ctx.clone(), dir.to_string());
    tokio::task::spawn_blocking(move || fs_event(&ctx, &dir, true, &ev))
        .await
        .ok()
        .flatten()
}

/// Start a watch: the resolved directory, its watcher.
fn open_watch(
    ctx: &Ctx,
    user: &User,
    req: &WatchRequest,
) -> Result<(String, brig_agent_client::Watcher), ConnectError> {
    let path = user.resolve(&req.path);
    let dir = stat_entry(ctx, &path)?;
    if dir.kind != FileKind::Dir {
        return Err(ConnectError::invalid(format!(
            "path '{path}' is not a directory"
        )));
    }
    let conn = ctx.connection()?;
    let watcher = conn.watch(&path, req.recursive).map_err(|source| {
        ConnectError::from(ManagerError::Agent {
            id: ctx.id().clone(),
            source,
        })
    })?;
    Ok((path, watcher))
}

async fn watch_dir(ctx: &Ctx, headers: &HeaderMap, body: &[u8]) -> Response {
    let req: WatchRequest = match connect::stream_request(headers, body) {
        Ok(r) => r,
        Err(e) => return connect::stream_error(e),
    };
    let user = super::basic_user(headers);
    let (tx, rx) = mpsc::channel::<StreamItem>(64);
    let opened = ctx
        .blocking(move |ctx| {
            let user = ctx.user(user.as_deref())?;
            open_watch(ctx, &user, &req).map(|(p, w)| (p, w, req.include_entry))
        })
        .await;
    let (dir, mut watcher, include_entry) = match opened {
        Ok(w) => w,
        Err(e) => return connect::stream_error(e),
    };
    let _ = tx.try_send(StreamItem::Msg(json!({ "start": {} })));
    // Waits on the agent without a thread, possibly for hours; the client
    // leaving drops the watcher, which ends the watch in the agent.
    let pump_ctx = ctx.clone();
    tokio::spawn(async move {
        loop {
            let got = tokio::select! {
                got = watcher.recv_async() => got,
                () = tx.closed() => return,
            };
            match got {
                Ok(Some(ev)) => {
                    let Some(v) = event_of(&pump_ctx, &dir, include_entry, ev).await else {
                        continue;
                    };
                    let msg = StreamItem::Msg(json!({ "filesystem": v }));
                    if tx.send(msg).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                // As envd's fsnotify: a `REMOVE` of "." and then silence
                // (keepalives) until the client leaves.
                Err(e) if watched_dir_gone(&e) => {
                    let msg = StreamItem::Msg(json!({ "filesystem": removed_itself() }));
                    if tx.send(msg).await.is_ok() {
                        tx.closed().await;
                    }
                    return;
                }
                Err(e) => {
                    let source = ManagerError::Agent {
                        id: pump_ctx.id().clone(),
                        source: e,
                    };
                    let _ = tx.send(StreamItem::End(Some(source.into()))).await;
                    return;
                }
            }
        }
    });
    connect::stream_response(rx, connect::keepalive(headers), json!({ "keepalive": {} }))
}

/// The agent ended a watch because its directory was removed or moved
/// away (the only `not_found` once a watch has started).
fn watched_dir_gone(e: &brig_agent_client::ClientError) -> bool {
    e.agent_code() == Some(brig_agent_client::ErrorCode::NotFound)
}

/// The event envd (fsnotify) reports when the watched directory itself is
/// removed: `REMOVE` named "." (its path relative to itself). Its watch
/// is gone with it: a directory re-created there is not watched, and no
/// error follows, as with envd.
fn removed_itself() -> Value {
    json!({ "name": ".", "type": "EVENT_TYPE_REMOVE" })
}

/// The polling watchers of one sandbox.
#[derive(Debug, Default)]
pub struct Watchers {
    map: Mutex<HashMap<String, Arc<Polled>>>,
}

#[derive(Debug)]
struct Polled {
    stopper: WatchStopper,
    queue: Mutex<PolledQueue>,
}

#[derive(Debug, Default)]
struct PolledQueue {
    events: VecDeque<Value>,
    /// Why the watch ended (the directory went away), reported once the
    /// queue is drained.
    error: Option<ConnectError>,
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for w in lock(&self.map).values() {
            let _ = w.stopper.stop();
        }
    }
}

fn create_watcher(
    ctx: &Ctx,
    user: &User,
    h: &HeaderMap,
    body: &[u8],
) -> Result<Value, ConnectError> {
    let req: WatchRequest = connect::unary_request(h, body)?;
    if lock(&ctx.envd.watchers.map).len() >= MAX_WATCHERS {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!(
                "this sandbox already has {MAX_WATCHERS} watchers: remove one (RemoveWatcher) \
                 before creating another"
            ),
        ));
    }
    let (dir, mut watcher) = open_watch(ctx, user, &req)?;
    let id = format!("w{:016x}", rand::random::<u64>());
    let polled = Arc::new(Polled {
        stopper: watcher.stopper(),
        queue: Mutex::new(PolledQueue::default()),
    });
    lock(&ctx.envd.watchers.map).insert(id.clone(), Arc::clone(&polled));
    let (pump_ctx, include_entry) = (ctx.clone(), req.include_entry);
    let rt = tokio::runtime::Handle::try_current()
        .map_err(|e| ConnectError::internal(format!("no async runtime to watch on: {e}")))?;
    // Waits on the agent without a thread until the watcher is removed.
    rt.spawn(async move {
        loop {
            match watcher.recv_async().await {
                Ok(Some(ev)) => {
                    if let Some(v) = event_of(&pump_ctx, &dir, include_entry, ev).await {
                        let mut q = lock(&polled.queue);
                        if q.events.len() >= MAX_QUEUED_EVENTS {
                            q.events.pop_front();
                        }
                        q.events.push_back(v);
                    }
                }
                Ok(None) => return,
                // As envd's: the event, then empty polls (no error).
                Err(e) if watched_dir_gone(&e) => {
                    lock(&polled.queue).events.push_back(removed_itself());
                    return;
                }
                Err(e) => {
                    let source = ManagerError::Agent {
                        id: pump_ctx.id().clone(),
                        source: e,
                    };
                    lock(&polled.queue).error = Some(source.into());
                    return;
                }
            }
        }
    });
    Ok(json!({ "watcherId": id }))
}

fn get_watcher_events(ctx: &Ctx, h: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: WatcherIdRequest = connect::unary_request(h, body)?;
    let w = lock(&ctx.envd.watchers.map)
        .get(&req.watcher_id)
        .cloned()
        .ok_or_else(|| {
            ConnectError::not_found(format!("watcher '{}' not found", req.watcher_id))
        })?;
    let mut q = lock(&w.queue);
    let events: Vec<Value> = q.events.drain(..).collect();
    if events.is_empty() {
        if let Some(e) = q.error.take() {
            drop(q);
            lock(&ctx.envd.watchers.map).remove(&req.watcher_id);
            return Err(e);
        }
    }
    Ok(json!({ "events": events }))
}

fn remove_watcher(ctx: &Ctx, h: &HeaderMap, body: &[u8]) -> Result<Value, ConnectError> {
    let req: WatcherIdRequest = connect::unary_request(h, body)?;
    let w = lock(&ctx.envd.watchers.map)
        .remove(&req.watcher_id)
        .ok_or_else(|| {
            ConnectError::not_found(format!("watcher '{}' not found", req.watcher_id))
        })?;
    let _ = w.stopper.stop();
    Ok(json!({}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn entries_look_like_envd_s() {
        let e = Entry {
            path: "/home/user/a.txt".into(),
            name: "a.txt".into(),
            kind: FileKind::File,
            size: 12,
            mode: 0o644,
            mtime: 0,
            symlink_target: None,
            uid: Some(1000),
            gid: Some(4242),
            owner: Some("user".into()),
            group: None,
            xattrs: [
                ("user.e2b.author".to_string(), "mish".to_string()),
                ("user.other".to_string(), "x".to_string()),
            ]
            .into(),
        };
        let v = entry_info(&e);
        assert_eq!(v["type"], "FILE_TYPE_FILE");
        assert_eq!(v["size"], "12");
        assert_eq!(v["permissions"], "-rw-r--r--");
        assert_eq!(v["modifiedTime"], "1970-01-01T00:00:00Z");
        assert_eq!((&v["owner"], &v["group"]), (&json!("user"), &json!("4242")));
        assert_eq!(v["metadata"], json!({"author": "mish"}));
        assert!(v.get("isSymlink").is_none());
        assert_eq!(permissions('d', 0o755), "drwxr-xr-x");
        let link = Entry {
            kind: FileKind::Symlink,
            symlink_target: Some("../f.txt".into()),
            xattrs: Default::default(),
            path: "/home/user/d/link".into(),
            mode: 0o777,
            ..e
        };
        let v = entry_info(&link);
        assert_eq!(v["type"], "FILE_TYPE_SYMLINK");
        assert_eq!(v["isSymlink"], true);
        assert_eq!(v["symlinkTarget"], "/home/user/f.txt");
        assert_eq!(v["permissions"], "Lrwxrwxrwx");
        assert!(v.get("metadata").is_none());
    }
}
