//! The bytes a stream brings in, as `Read`: what a file read and a port
//! connection share. One chunk (one `Data` frame) is held at a time; the
//! next is taken, and its credit returned, only when the reader asks.

use std::task::{Context, Poll};

use brig_protocol::message::Event;

use crate::stream::{Handle, Item};
use crate::ClientError;

/// A stream's incoming bytes, read chunk by chunk.
#[derive(Debug, Default)]
pub(crate) struct Inbound {
    chunk: Vec<u8>,
    pos: usize,
    done: bool,
}

impl Inbound {
    /// `Read::read` on `handle`'s bytes; `what` names the stream in a
    /// protocol error ("a file read", "a port connection").
    pub fn read(&mut self, handle: &Handle, what: &str, buf: &mut [u8]) -> std::io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if self.pos == self.chunk.len() && !self.fill(handle, what)? {
            return Ok(0);
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }

    /// [`Inbound::read`] without blocking: `Pending` (the task woken when
    /// bytes arrive) where `read` would block.
    pub fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        handle: &Handle,
        what: &str,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        while self.pos == self.chunk.len() && !self.done {
            let item = match handle.poll_next(cx) {
                Poll::Ready(item) => item,
                Poll::Pending => return Poll::Pending,
            };
            if let Err(e) = self.accept(item, handle, what) {
                return Poll::Ready(Err(e.into()));
            }
        }
        if self.pos == self.chunk.len() {
            return Poll::Ready(Ok(0));
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Poll::Ready(Ok(n))
    }

    /// Refill the chunk; false at the end of the stream.
    fn fill(&mut self, handle: &Handle, what: &str) -> Result<bool, ClientError> {
        while !self.done && self.pos == self.chunk.len() {
            let item = handle.next();
            self.accept(item, handle, what)?;
        }
        Ok(self.pos < self.chunk.len())
    }

    /// Take one item of the stream: bytes become the chunk, its end or an
    /// error ends the reading.
    fn accept(
        &mut self,
        item: Result<Option<Item>, ClientError>,
        handle: &Handle,
        what: &str,
    ) -> Result<(), ClientError> {
        match item? {
            None => self.done = true,
            Some(Item::Bytes { bytes, .. }) => {
                self.chunk = bytes;
                self.pos = 0;
            }
            Some(Item::Event(Event::Error { code, message })) => {
                self.done = true;
                return Err(ClientError::Agent { code, message });
            }
            Some(Item::Event(other)) => {
                self.done = true;
                return Err(ClientError::protocol(format!(
                    "stream {}: unexpected {other:?} in {what}",
                    handle.id()
                )));
            }
        }
        Ok(())
    }
}
