//! The bytes a stream brings in, as `Read`: what a file read and a port
//! connection share. One chunk (one `Data` frame) is held at a time; the
//! next is taken, and its credit returned, only when the reader asks.

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

    /// Refill the chunk; false at the end of the stream.
    fn fill(&mut self, handle: &Handle, what: &str) -> Result<bool, ClientError> {
        while !self.done {
            match handle.next()? {
                None => self.done = true,
                Some(Item::Bytes { bytes, .. }) if !bytes.is_empty() => {
                    self.chunk = bytes;
                    self.pos = 0;
                    return Ok(true);
                }
                Some(Item::Bytes { .. }) => {}
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
        }
        Ok(false)
    }
}
