//! [`PortStream`]: one `CONNECT` stream, a TCP connection to a port inside
//! the sandbox (made by the agent there), as a blocking [`Read`] +
//! [`Write`] byte stream.
//!
//! Each direction closes on its own, as on a socket:
//! [`PortStream::shutdown_write`] sends the stream's Close (the agent then
//! shuts the socket's write side once everything sent reached it) and
//! reading goes on until the server closes its side (`read` returns 0).
//! [`PortStream::abort`] resets the connection (the server sees RST) and
//! wakes every thread blocked on it. Dropping the last handle of a stream
//! that is still open aborts it too; once the server has closed its side
//! it is a plain close.
//!
//! An async caller uses [`PortStream::poll_read`] and
//! [`PortStream::poll_write`] instead: no thread waits, the reactor wakes
//! the task when bytes or credit arrive.
//!
//! To pump both directions at once, give each thread its own handle
//! ([`PortStream::try_clone`]): reading blocks only on bytes from the
//! sandbox, writing only on the agent's send credit. Reading is what
//! returns credit to the agent, so a reader that stops makes the agent
//! stop reading the socket, and the server inside the sandbox blocks in
//! write(2): nothing is buffered without bound on either side.

use std::io::{Read, Write};
use std::sync::Arc;
use std::task::{Context, Poll};

use brig_protocol::message::{Event, CHANNEL_STDOUT};

use crate::inbound::Inbound;
use crate::stream::{Handle, Item};
use crate::ClientError;

/// A TCP connection to a port inside the sandbox. See the module docs.
#[derive(Debug)]
pub struct PortStream {
    handle: Arc<Handle>,
    port: u16,
    inbound: Inbound,
}

impl PortStream {
    /// Wait for `connected` (or the agent's error:
    /// [`ErrorCode::ConnectionRefused`](crate::ErrorCode::ConnectionRefused)
    /// when nothing listens on the port).
    pub(crate) fn start(handle: Handle, port: u16) -> Result<PortStream, ClientError> {
        handle.stream.set_half_close();
        match handle.next()? {
            Some(Item::Event(Event::Connected)) => Ok(PortStream {
                handle: Arc::new(handle),
                port,
                inbound: Inbound::default(),
            }),
            Some(Item::Event(Event::Error { code, message })) => {
                Err(ClientError::Agent { code, message })
            }
            other => Err(ClientError::protocol(format!(
                "stream {}: expected connected, got {other:?}",
                handle.id()
            ))),
        }
    }

    /// The port inside the sandbox.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Another handle on the same connection, for a second thread: bytes
    /// read by one handle are not seen by the other, so let one thread
    /// read and the other write. Never fails; the `Result` mirrors
    /// `TcpStream::try_clone`.
    pub fn try_clone(&self) -> std::io::Result<PortStream> {
        Ok(PortStream {
            handle: Arc::clone(&self.handle),
            port: self.port,
            inbound: Inbound::default(),
        })
    }

    /// Nothing more will be written: the server reads EOF once everything
    /// written before reached it. Reading goes on.
    pub fn shutdown_write(&self) -> Result<(), ClientError> {
        self.handle.stream.close(&self.handle.shared)
    }

    /// Reset the connection (the server sees RST). Every handle's blocked
    /// `read` or `write` returns an error.
    pub fn abort(&self) {
        self.handle.stream.cancel(&self.handle.shared);
    }

    /// `read` without blocking: `Pending` until the server sends bytes or
    /// closes (`Ready(Ok(0))`); the task is woken then.
    pub fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        self.inbound
            .poll_read(cx, &self.handle, "a port connection", buf)
    }

    /// `write` without blocking: sends what the agent's window allows now
    /// (at least one byte), `Pending` while it is full.
    pub fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.handle
            .stream
            .poll_send_bytes(cx, &self.handle.shared, CHANNEL_STDOUT, buf)
            .map_err(std::io::Error::from)
    }
}

impl Read for PortStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inbound.read(&self.handle, "a port connection", buf)
    }
}

impl Write for PortStream {
    /// Blocks while the agent's window is full (the server is not reading).
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.handle
            .stream
            .send_bytes(&self.handle.shared, CHANNEL_STDOUT, buf)?;
        Ok(buf.len())
    }

    /// Every `write` hands its bytes to the connection's socket at once.
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
