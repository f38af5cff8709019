//! [`Watcher`]: one `WATCH` stream, the changes in a directory of the
//! sandbox as [`WatchEvent`]s.
//!
//! [`Connection::watch`](crate::Connection::watch) returns once the agent
//! says its watches are in place, so every change after that returns is
//! reported (or covered by an [`WatchEvent::Overflow`]). Taking events is
//! what returns credit to the agent; a watcher that is not read makes the
//! agent drop changes for one `overflow`, never buffer them without bound.
//! Dropping the watcher (or [`WatchStopper::stop`] from another thread)
//! ends the watch in the agent.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use brig_protocol::message::{ChangeKind, Event, FileKind};

use crate::connection::Shared;
use crate::stream::{Handle, Item, Stream};
use crate::ClientError;

/// One thing that happened in a watched directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// `name` (relative to the watched directory) was created, written,
    /// removed, renamed away (`Rename`; the new name comes as `Create`) or
    /// had its metadata changed. `file_type` when the agent knew it.
    Change {
        kind: ChangeKind,
        name: String,
        file_type: Option<FileKind>,
    },
    /// Changes were lost here: the kernel's queue overflowed or this side
    /// read too slowly. The watch goes on; re-list the directory to resync.
    Overflow,
}

/// A directory being watched. Iterate it (blocking) for [`WatchEvent`]s;
/// the iterator ends when the watch is stopped, and yields the agent's
/// error (`not_found`) if the watched directory itself goes away.
#[derive(Debug)]
pub struct Watcher {
    handle: Handle,
    done: bool,
}

impl Watcher {
    /// Wait for `watching` (or the agent's error).
    pub(crate) fn start(handle: Handle) -> Result<Watcher, ClientError> {
        match handle.next()? {
            Some(Item::Event(Event::Watching)) => Ok(Watcher {
                handle,
                done: false,
            }),
            Some(Item::Event(Event::Error { code, message })) => {
                Err(ClientError::Agent { code, message })
            }
            other => Err(ClientError::protocol(format!(
                "stream {}: expected watching, got {other:?}",
                handle.id()
            ))),
        }
    }

    /// The next event, blocking until there is one. `Ok(None)` once the
    /// watch has ended.
    pub fn recv(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        if self.done {
            return Ok(None);
        }
        let item = self.handle.next();
        self.event(item)
    }

    /// [`Watcher::recv`] without blocking: `Pending` until an event comes
    /// (the task is woken then).
    pub fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<WatchEvent>, ClientError>> {
        if self.done {
            return Poll::Ready(Ok(None));
        }
        let item = ready!(self.handle.poll_next(cx));
        Poll::Ready(self.event(item))
    }

    /// [`Watcher::recv`], awaited.
    pub async fn recv_async(&mut self) -> Result<Option<WatchEvent>, ClientError> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    fn event(
        &mut self,
        item: Result<Option<Item>, ClientError>,
    ) -> Result<Option<WatchEvent>, ClientError> {
        let event = match item {
            Ok(Some(Item::Event(Event::Change {
                kind,
                name,
                file_type,
            }))) => {
                return Ok(Some(WatchEvent::Change {
                    kind,
                    name,
                    file_type,
                }))
            }
            Ok(Some(Item::Event(Event::Overflow))) => return Ok(Some(WatchEvent::Overflow)),
            Ok(Some(Item::Event(Event::Error { code, message }))) => {
                Err(ClientError::Agent { code, message })
            }
            Ok(Some(other)) => Err(ClientError::protocol(format!(
                "stream {}: unexpected {other:?} on a watch",
                self.handle.id()
            ))),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        };
        self.done = true;
        event
    }

    /// A handle that ends this watch from another thread (a `recv` blocked
    /// there then returns `Ok(None)`).
    pub fn stopper(&self) -> WatchStopper {
        WatchStopper {
            shared: Arc::clone(&self.handle.shared),
            stream: Arc::clone(&self.handle.stream),
        }
    }
}

impl Iterator for Watcher {
    type Item = Result<WatchEvent, ClientError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.recv().transpose()
    }
}

/// Ends a [`Watcher`]'s watch; `Send + Sync + Clone`.
#[derive(Debug, Clone)]
pub struct WatchStopper {
    shared: Arc<Shared>,
    stream: Arc<Stream>,
}

impl WatchStopper {
    /// Ask the agent to stop watching (Close on the stream): it removes the
    /// watches and closes its side, which ends the watcher's iteration.
    /// Stopping twice, or a watch already over, is fine.
    pub fn stop(&self) -> Result<(), ClientError> {
        self.stream.close(&self.shared)
    }
}
