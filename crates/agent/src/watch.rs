//! Directory watches (`WATCH` streams) on one inotify instance.
//!
//! One instance serves every stream of the session: inotify instances are
//! a scarce per-user resource (`fs.inotify.max_user_instances`, 128 by
//! default) while watches are plentiful (`max_user_watches`), and one
//! descriptor is one more entry in the session's poll set, however many
//! streams watch. The kernel gives an inode already watched on the
//! instance the same watch descriptor (wd) again, so a wd can serve several
//! streams (say `/w` recursively and `/w/sub` alone), each with its own
//! prefix for names: [`Watches`] counts the streams per wd and removes a
//! kernel watch only when its last stream lets go.
//!
//! Recursive watches add a watch for each directory below the root, and
//! for each directory created or moved in later. A directory can fill
//! before its watch is in place, so the agent lists it right after adding
//! the watch and reports what it finds as `create` (an entry created in
//! that instant may be reported twice, never missed). A directory moved
//! away or removed takes its watches with it. Setting up a recursive watch
//! walks the tree inside the session's loop, one kernel watch per
//! directory: watching a huge tree (say `/`) is slow and may exhaust
//! `max_user_watches`, which fails the request with a message saying so.
//!
//! Memory is bounded per stream: changes wait in a queue of at most
//! [`MAX_PENDING`] bytes for send credit. When the host reads too slowly to
//! keep it below that, further changes are dropped and one `overflow` is
//! queued in their place; changes are taken again once the queue has
//! drained to half. A kernel queue overflow (`IN_Q_OVERFLOW`) becomes an
//! `overflow` on every stream.

use std::collections::{HashMap, VecDeque};
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use brig_protocol::message::{self, ChangeKind, ErrorCode, Event, FileKind, WatchRequest};

use crate::files;
use crate::sys;

/// Queued change bytes per stream before changes are dropped for an
/// `overflow` (a few hundred changes; the stream's send window holds more).
pub const MAX_PENDING: usize = 64 << 10;
/// Bytes of kernel events read per turn; room for at least one event with
/// the longest name (16 + NAME_MAX + 1).
const READ_BUF: usize = 4096;
/// Deepest directory a recursive watch follows, as `list`.
const MAX_DEPTH: usize = 64;

/// What every watch asks the kernel for. `IN_ONLYDIR`: a watch is on a
/// directory, so a file path fails with ENOTDIR instead of watching the
/// file.
const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_ATTRIB
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

/// What the session's pump gets from [`Watches::pop`].
#[derive(Debug)]
pub enum Popped {
    /// One control payload to send.
    Payload(Vec<u8>),
    /// The watch is over (the watched directory went away, or a new
    /// subdirectory could not be watched): reply with this and close.
    Ended(Event),
    /// Nothing to send now (nothing queued, or not enough credit).
    Nothing,
}

/// One stream's watch.
#[derive(Debug)]
struct Watch {
    root: PathBuf,
    recursive: bool,
    /// This stream's kernel watches: wd → the directory's path relative to
    /// `root` ("" for the root).
    wds: HashMap<i32, String>,
    /// Encoded control payloads waiting for send credit.
    pending: VecDeque<Vec<u8>>,
    pending_bytes: usize,
    /// The change at the back of `pending`, to coalesce repeats.
    last: Option<(ChangeKind, String)>,
    /// Changes are being dropped (an `overflow` is queued).
    dropping: bool,
    /// Sent once `pending` is empty; then the stream closes.
    end: Option<Event>,
}

impl Watch {
    fn new(root: PathBuf, recursive: bool) -> Watch {
        Watch {
            root,
            recursive,
            wds: HashMap::new(),
            pending: VecDeque::new(),
            pending_bytes: 0,
            last: None,
            dropping: false,
            end: None,
        }
    }

    fn push_change(&mut self, kind: ChangeKind, name: String, file_type: Option<FileKind>) {
        if self.end.is_some() {
            return;
        }
        if self.dropping {
            if self.pending_bytes > MAX_PENDING / 2 {
                return;
            }
            self.dropping = false;
        }
        if !self.pending.is_empty()
            && matches!(&self.last, Some((k, n)) if *k == kind && *n == name)
        {
            return;
        }
        let payload = message::control_payload(&Event::Change {
            kind,
            name: name.clone(),
            file_type,
        });
        if self.pending_bytes + payload.len() > MAX_PENDING {
            return self.overflow();
        }
        self.pending_bytes += payload.len();
        self.pending.push_back(payload);
        self.last = Some((kind, name));
    }

    /// Queue one `overflow` (unless one is already the latest news) and
    /// drop changes until the queue drains.
    fn overflow(&mut self) {
        if self.end.is_some() || self.dropping {
            return;
        }
        let payload = message::control_payload(&Event::Overflow);
        self.pending_bytes += payload.len();
        self.pending.push_back(payload);
        self.last = None;
        self.dropping = true;
    }

    fn finish(&mut self, event: Event) {
        self.end.get_or_insert(event);
    }
}

/// Every watch of the session.
#[derive(Debug, Default)]
pub struct Watches {
    /// Created with the first watch, kept for the session.
    inotify: Option<File>,
    /// Kernel watch → the streams using it and the directory's path
    /// relative to each one's root.
    by_wd: HashMap<i32, Vec<(u32, String)>>,
    streams: HashMap<u32, Watch>,
}

impl Watches {
    /// The inotify descriptor to poll, once there is one.
    pub fn fd(&self) -> Option<RawFd> {
        self.inotify.as_ref().map(|f| f.as_raw_fd())
    }

    /// Start watching for stream `id`. On success the caller sends
    /// `watching`; on failure, the returned `error` event.
    pub fn start(&mut self, id: u32, req: &WatchRequest) -> Result<(), Event> {
        files::check_path(&req.path)?;
        if self.inotify.is_none() {
            let fd = sys::inotify_init().map_err(|e| files::io_error("watch", &req.path, &e))?;
            self.inotify = Some(File::from(fd));
        }
        let root = PathBuf::from(&req.path);
        self.streams
            .insert(id, Watch::new(root.clone(), req.recursive));
        // The root may be a symlink to a directory, as for `list`; below
        // it, links are never followed.
        let result = match self.add(id, &root, String::new(), true) {
            Ok(()) if req.recursive => self.add_tree(id, &root, "", false),
            other => other,
        };
        result.map_err(|e| {
            self.stop(id);
            watch_error(&req.path, &e)
        })
    }

    /// Stop stream `id`'s watch: its kernel watches go unless another
    /// stream uses them.
    pub fn stop(&mut self, id: u32) {
        let Some(w) = self.streams.remove(&id) else {
            return;
        };
        for wd in w.wds.into_keys() {
            self.release(id, wd);
        }
    }

    /// The next payload for stream `id` if it fits in `credit` bytes.
    pub fn pop(&mut self, id: u32, credit: usize) -> Popped {
        let Some(w) = self.streams.get_mut(&id) else {
            return Popped::Nothing;
        };
        match w.pending.front() {
            Some(p) if p.len() <= credit => {
                let p = w.pending.pop_front().unwrap_or_default();
                w.pending_bytes -= p.len();
                if w.pending.is_empty() {
                    w.last = None;
                }
                Popped::Payload(p)
            }
            Some(_) => Popped::Nothing,
            None => match w.end.take() {
                Some(event) => Popped::Ended(event),
                None => Popped::Nothing,
            },
        }
    }

    /// Read and dispatch one buffer of what the kernel has queued. One
    /// small read per turn of the session's loop: the pump runs between
    /// reads, so a burst fills a stream's queue only when its send window
    /// is really full (one read is at most [`READ_BUF`] / 32 changes, far
    /// below [`MAX_PENDING`] / 2), and the rest waits in the kernel's
    /// queue, which has its own bound and overflow event.
    pub fn read(&mut self) {
        let mut buf = [0u8; READ_BUF];
        let Some(inotify) = self.inotify.as_mut() else {
            return;
        };
        let n = match inotify.read(&mut buf) {
            Ok(n) => n,
            // WouldBlock or EINTR: poll again. Anything else cannot be
            // fixed here; the streams keep what they have.
            Err(_) => return,
        };
        let mut at = 0;
        while let Some((raw, len)) = RawEvent::parse(&buf[at..n]) {
            at += len;
            self.dispatch(raw);
        }
    }

    /// Add (or share) a kernel watch on `dir` for stream `id`.
    fn add(&mut self, id: u32, dir: &Path, rel: String, follow: bool) -> io::Result<()> {
        let Some(inotify) = &self.inotify else {
            return Ok(());
        };
        let mask = if follow {
            MASK
        } else {
            MASK | libc::IN_DONT_FOLLOW
        };
        let wd = sys::inotify_add_watch(inotify, dir, mask)?;
        let Some(w) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        // The same directory twice in one stream (a bind mount): keep the
        // first name.
        if w.wds.contains_key(&wd) {
            return Ok(());
        }
        w.wds.insert(wd, rel.clone());
        self.by_wd.entry(wd).or_default().push((id, rel));
        Ok(())
    }

    /// Watch every directory below `dir` (whose path relative to the root
    /// is `rel`). With `announce`, report each entry found as `create`: it
    /// appeared after the parent's watch saw `dir` arrive.
    ///
    /// Entries that vanish or cannot be read are skipped; only running out
    /// of kernel watches is an error.
    fn add_tree(&mut self, id: u32, dir: &Path, rel: &str, announce: bool) -> io::Result<()> {
        let mut todo = vec![(dir.to_path_buf(), rel.to_string(), 0)];
        while let Some((dir, rel, depth)) = todo.pop() {
            let Ok(children) = fs::read_dir(&dir) else {
                continue;
            };
            let mut children: Vec<_> = children.filter_map(Result::ok).collect();
            children.sort_by_key(|c| c.file_name());
            for child in children {
                let path = child.path();
                let name = join(&rel, &child.file_name().to_string_lossy());
                let Ok(meta) = fs::symlink_metadata(&path) else {
                    continue;
                };
                let kind = files::kind(&meta);
                if announce {
                    if let Some(w) = self.streams.get_mut(&id) {
                        w.push_change(ChangeKind::Create, name.clone(), Some(kind));
                    }
                }
                if kind == FileKind::Dir && depth + 1 < MAX_DEPTH {
                    match self.add(id, &path, name.clone(), false) {
                        Ok(()) => todo.push((path, name, depth + 1)),
                        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return Err(e),
                        // Gone already, replaced by a file, or unreadable.
                        Err(_) => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// Stream `id` no longer uses `wd`; drop the kernel watch if nobody
    /// does.
    fn release(&mut self, id: u32, wd: i32) {
        let Some(users) = self.by_wd.get_mut(&wd) else {
            return;
        };
        users.retain(|(s, _)| *s != id);
        if users.is_empty() {
            self.by_wd.remove(&wd);
            if let Some(inotify) = &self.inotify {
                sys::inotify_rm_watch(inotify, wd);
            }
        }
    }

    /// Stop watching `rel` and everything below it for stream `id` (it was
    /// moved away or removed).
    fn forget_tree(&mut self, id: u32, rel: &str) {
        let Some(w) = self.streams.get_mut(&id) else {
            return;
        };
        let below = format!("{rel}/");
        let gone: Vec<i32> = w
            .wds
            .iter()
            .filter(|(_, r)| *r == rel || r.starts_with(&below))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in &gone {
            w.wds.remove(wd);
        }
        for wd in gone {
            self.release(id, wd);
        }
    }

    fn dispatch(&mut self, ev: RawEvent) {
        if ev.mask & libc::IN_Q_OVERFLOW != 0 {
            for w in self.streams.values_mut() {
                w.overflow();
            }
            return;
        }
        if ev.mask & libc::IN_IGNORED != 0 {
            // The kernel dropped the watch (its directory is gone, or we
            // removed it): wds are reused, so forget it everywhere.
            for (id, rel) in self.by_wd.remove(&ev.wd).unwrap_or_default() {
                if let Some(w) = self.streams.get_mut(&id) {
                    w.wds.remove(&ev.wd);
                    if rel.is_empty() {
                        w.finish(root_gone(&w.root));
                    }
                }
            }
            return;
        }
        let Some(users) = self.by_wd.get(&ev.wd).cloned() else {
            return;
        };
        let is_dir = ev.mask & libc::IN_ISDIR != 0;
        for (id, dir_rel) in users {
            let Some(w) = self.streams.get_mut(&id) else {
                continue;
            };
            if ev.name.is_empty() {
                // About the directory itself: its parent's watch reports
                // it, except for the root, whose going ends the watch.
                if dir_rel.is_empty() && ev.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0
                {
                    w.finish(root_gone(&w.root));
                }
                continue;
            }
            let name = join(&dir_rel, &ev.name);
            let Some(kind) = change_kind(ev.mask) else {
                continue;
            };
            let file_type = match kind {
                _ if is_dir => Some(FileKind::Dir),
                ChangeKind::Write => Some(FileKind::File),
                ChangeKind::Remove | ChangeKind::Rename => None,
                ChangeKind::Create | ChangeKind::Chmod => {
                    let path = w.root.join(&name);
                    fs::symlink_metadata(&path).ok().map(|m| files::kind(&m))
                }
            };
            w.push_change(kind, name.clone(), file_type);
            if !(w.recursive && is_dir) {
                continue;
            }
            match kind {
                ChangeKind::Create => {
                    let path = w.root.join(&name);
                    let depth = name.matches('/').count() + 1;
                    if depth >= MAX_DEPTH {
                        continue;
                    }
                    let added = match self.add(id, &path, name.clone(), false) {
                        Ok(()) => self.add_tree(id, &path, &name, true),
                        Err(e) => Err(e),
                    };
                    if let Err(e) = added {
                        if e.raw_os_error() == Some(libc::ENOSPC) {
                            if let Some(w) = self.streams.get_mut(&id) {
                                let path = w.root.join(&name);
                                w.finish(watch_error(&path.to_string_lossy(), &e));
                            }
                        }
                    }
                }
                ChangeKind::Remove | ChangeKind::Rename => self.forget_tree(id, &name),
                _ => {}
            }
        }
    }
}

/// One `struct inotify_event` from a read buffer.
#[derive(Debug)]
struct RawEvent {
    wd: i32,
    mask: u32,
    name: String,
}

impl RawEvent {
    /// The event at the start of `buf` and its length in bytes. The kernel
    /// only returns whole events, so a short buffer is the end.
    fn parse(buf: &[u8]) -> Option<(RawEvent, usize)> {
        let word = |i: usize| -> Option<[u8; 4]> { buf.get(i..i + 4)?.try_into().ok() };
        let wd = i32::from_ne_bytes(word(0)?);
        let mask = u32::from_ne_bytes(word(4)?);
        // word(8) is the rename cookie, which fsnotify-style events ignore.
        let len = u32::from_ne_bytes(word(12)?) as usize;
        let name = buf.get(16..16 + len)?;
        let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
        // Non-UTF-8 names cannot be told exactly in JSON (see docs/agent.md).
        let name = String::from_utf8_lossy(name).into_owned();
        Some((RawEvent { wd, mask, name }, 16 + len))
    }
}

/// The E2B-style kind of an inotify event: a rename is `rename` for the
/// old name and `create` for the new one.
fn change_kind(mask: u32) -> Option<ChangeKind> {
    if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
        Some(ChangeKind::Create)
    } else if mask & libc::IN_MODIFY != 0 {
        Some(ChangeKind::Write)
    } else if mask & libc::IN_DELETE != 0 {
        Some(ChangeKind::Remove)
    } else if mask & libc::IN_MOVED_FROM != 0 {
        Some(ChangeKind::Rename)
    } else if mask & libc::IN_ATTRIB != 0 {
        Some(ChangeKind::Chmod)
    } else {
        None
    }
}

fn join(dir_rel: &str, name: &str) -> String {
    if dir_rel.is_empty() {
        name.to_string()
    } else {
        format!("{dir_rel}/{name}")
    }
}

fn root_gone(root: &Path) -> Event {
    Event::error(
        ErrorCode::NotFound,
        format!(
            "watch {}: the watched directory was removed or moved",
            root.display()
        ),
    )
}

fn watch_error(path: &str, err: &io::Error) -> Event {
    if err.raw_os_error() == Some(libc::ENOSPC) {
        return Event::error(
            ErrorCode::Io,
            format!(
                "watch {path}: out of inotify watches; raise fs.inotify.max_user_watches or \
                 watch a smaller tree"
            ),
        );
    }
    files::io_error("watch", path, err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(w: &mut Watch, n: usize) {
        w.push_change(ChangeKind::Write, format!("file-{n}"), None);
    }

    fn watch() -> Watch {
        Watch::new(PathBuf::from("/w"), false)
    }

    fn decoded(w: &mut Watch) -> Vec<Event> {
        w.pending
            .drain(..)
            .map(|p| message::decode("event", &p[1..]).unwrap())
            .collect()
    }

    #[test]
    fn repeats_coalesce_while_queued() {
        let mut w = watch();
        change(&mut w, 1);
        change(&mut w, 1);
        change(&mut w, 2);
        change(&mut w, 1);
        assert_eq!(w.pending.len(), 3);
    }

    #[test]
    fn a_full_queue_drops_for_one_overflow_then_resumes() {
        let mut w = watch();
        for n in 0..100_000 {
            change(&mut w, n);
        }
        assert!(w.pending_bytes <= MAX_PENDING + 32, "{}", w.pending_bytes);
        let queued = w.pending.len();
        let events = decoded(&mut w);
        assert_eq!(events.last(), Some(&Event::Overflow));
        assert_eq!(events.iter().filter(|e| **e == Event::Overflow).count(), 1);
        // Still over half full (as far as the watch knows): dropped.
        change(&mut w, 7);
        assert!(w.pending.is_empty());
        w.pending_bytes = 0;
        change(&mut w, 8);
        assert_eq!(
            w.pending.len(),
            1,
            "resumes once drained ({queued} were queued)"
        );
    }

    #[test]
    fn raw_events_parse_with_padded_names() {
        let mut buf = Vec::new();
        for (wd, mask, name) in [
            (1i32, libc::IN_CREATE, &b"a.txt"[..]),
            (2, libc::IN_IGNORED, b""),
        ] {
            buf.extend_from_slice(&wd.to_ne_bytes());
            buf.extend_from_slice(&mask.to_ne_bytes());
            buf.extend_from_slice(&0u32.to_ne_bytes());
            let padded = if name.is_empty() { 0 } else { 16 };
            buf.extend_from_slice(&(padded as u32).to_ne_bytes());
            let mut n = name.to_vec();
            n.resize(padded, 0);
            buf.extend_from_slice(&n);
        }
        let (first, len) = RawEvent::parse(&buf).unwrap();
        assert_eq!(
            (first.wd, first.mask, first.name.as_str()),
            (1, libc::IN_CREATE, "a.txt")
        );
        assert_eq!(len, 32);
        let (second, len2) = RawEvent::parse(&buf[len..]).unwrap();
        assert_eq!((second.wd, second.name.as_str()), (2, ""));
        assert!(RawEvent::parse(&buf[len + len2..]).is_none());
        assert!(RawEvent::parse(&buf[..10]).is_none());
    }

    #[test]
    fn kinds_follow_fsnotify() {
        assert_eq!(change_kind(libc::IN_MOVED_TO), Some(ChangeKind::Create));
        assert_eq!(change_kind(libc::IN_MOVED_FROM), Some(ChangeKind::Rename));
        assert_eq!(change_kind(libc::IN_ATTRIB), Some(ChangeKind::Chmod));
        assert_eq!(
            change_kind(libc::IN_DELETE | libc::IN_ISDIR),
            Some(ChangeKind::Remove)
        );
        assert_eq!(change_kind(libc::IN_OPEN), None);
    }
}
