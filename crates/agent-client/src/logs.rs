//! [`LogReader`]: one `LOGS` stream, the sandbox's log (what its
//! background processes printed) as [`LogOutput`]s.
//!
//! [`Connection::logs`](crate::Connection::logs) returns once the agent
//! has answered; reading takes nothing from the agent's log, so another
//! reader sees the same output. Without `follow` the reader ends once it
//! has what the log held when it opened; with it, it goes on until it is
//! dropped (which ends the stream in the agent) or the connection ends.

use std::future::poll_fn;
use std::task::{ready, Context, Poll};

use brig_protocol::message::{Event, CHANNEL_STDERR};

use crate::stream::{Handle, Item};
use crate::ClientError;

/// One piece of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogOutput {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// `bytes` of output fell out of the agent's bounded log before this
    /// reader got to them (it read too slowly).
    Skipped(u64),
}

#[derive(Debug)]
pub struct LogReader {
    handle: Handle,
    dropped: u64,
    done: bool,
}

impl LogReader {
    /// Wait for `logging` (or the agent's error).
    pub(crate) fn start(handle: Handle) -> Result<LogReader, ClientError> {
        let first = handle.next()?;
        LogReader::first(handle, first)
    }

    /// [`LogReader::start`], awaited.
    pub(crate) async fn start_async(handle: Handle) -> Result<LogReader, ClientError> {
        let first = poll_fn(|cx| handle.poll_next(cx)).await?;
        LogReader::first(handle, first)
    }

    fn first(handle: Handle, first: Option<Item>) -> Result<LogReader, ClientError> {
        match first {
            Some(Item::Event(Event::Logging { dropped })) => Ok(LogReader {
                handle,
                dropped,
                done: false,
            }),
            Some(Item::Event(Event::Error { code, message })) => {
                Err(ClientError::Agent { code, message })
            }
            other => Err(ClientError::protocol(format!(
                "stream {}: expected logging, got {other:?}",
                handle.id()
            ))),
        }
    }

    /// Bytes that had already fallen out of the agent's log when this
    /// reader opened (the log keeps the last
    /// [`LOG_KEEP`](brig_protocol::message::LOG_KEEP) bytes).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The next piece, without blocking: `Ready(None)` at the end.
    pub fn poll_next_output(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<LogOutput, ClientError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let item = ready!(self.handle.poll_next(cx));
        Poll::Ready(self.output(item))
    }

    /// The next piece, awaited.
    pub async fn next_output(&mut self) -> Option<Result<LogOutput, ClientError>> {
        poll_fn(|cx| self.poll_next_output(cx)).await
    }

    fn output(
        &mut self,
        item: Result<Option<Item>, ClientError>,
    ) -> Option<Result<LogOutput, ClientError>> {
        let out = match item {
            Ok(Some(Item::Bytes {
                channel: CHANNEL_STDERR,
                bytes,
            })) => return Some(Ok(LogOutput::Stderr(bytes))),
            Ok(Some(Item::Bytes { bytes, .. })) => return Some(Ok(LogOutput::Stdout(bytes))),
            Ok(Some(Item::Event(Event::Skipped { bytes }))) => {
                return Some(Ok(LogOutput::Skipped(bytes)))
            }
            Ok(Some(Item::Event(Event::Error { code, message }))) => {
                Err(ClientError::Agent { code, message })
            }
            Ok(Some(other)) => Err(ClientError::protocol(format!(
                "stream {}: unexpected {other:?} on a log stream",
                self.handle.id()
            ))),
            Ok(None) => {
                self.done = true;
                return None;
            }
            Err(e) => Err(e),
        };
        self.done = true;
        Some(out)
    }
}

impl Iterator for LogReader {
    type Item = Result<LogOutput, ClientError>;

    /// The next piece, blocking until it arrives; `None` at the end.
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.handle.next();
        self.output(item)
    }
}
