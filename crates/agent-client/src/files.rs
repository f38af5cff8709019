//! Streaming file contents: [`FileReader`] (a `FILE_READ` stream) and the
//! body of [`Connection::write_file`](crate::Connection::write_file) (a
//! `FILE_WRITE` stream). Neither holds more than one chunk plus the
//! stream's window in memory, whatever the file's size.

use std::io::Read;
use std::task::{Context, Poll};

use brig_protocol::message::{Event, CHANNEL_STDOUT};

use crate::inbound::Inbound;
use crate::stream::{Handle, Item};
use crate::ClientError;

/// How much of the source [`Connection::write_file`](crate::Connection::write_file)
/// reads at once.
const WRITE_CHUNK: usize = 256 << 10;

/// A file being read from the sandbox. Implements [`Read`]; errors are
/// `std::io::Error`s wrapping a [`ClientError`].
#[derive(Debug)]
pub struct FileReader {
    handle: Handle,
    size: u64,
    inbound: Inbound,
}

impl FileReader {
    /// Wait for `read_started` (or the agent's error).
    pub(crate) fn start(handle: Handle) -> Result<FileReader, ClientError> {
        let size = match handle.next()? {
            Some(Item::Event(Event::ReadStarted { size })) => size,
            Some(Item::Event(Event::Error { code, message })) => {
                return Err(ClientError::Agent { code, message })
            }
            other => {
                return Err(ClientError::protocol(format!(
                    "stream {}: expected read_started, got {other:?}",
                    handle.id()
                )))
            }
        };
        Ok(FileReader {
            handle,
            size,
            inbound: Inbound::default(),
        })
    }

    /// The file's size when the agent opened it.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// `read` without blocking, for async callers: `Pending` until the
    /// next chunk arrives (the task is woken then).
    pub fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<std::io::Result<usize>> {
        self.inbound.poll_read(cx, &self.handle, "a file read", buf)
    }
}

impl Read for FileReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inbound.read(&self.handle, "a file read", buf)
    }
}

/// Send `contents` on a `FILE_WRITE` stream, close it and wait for
/// `written`. A failure reading `contents` cancels the stream (the agent
/// leaves what it already wrote on disk).
pub(crate) fn write(
    handle: &Handle,
    path: &str,
    mut contents: impl Read,
) -> Result<u64, ClientError> {
    let mut buf = vec![0u8; WRITE_CHUNK];
    loop {
        let n = match contents.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Err(ClientError::Io {
                    op: format!("read the contents to write to {path}"),
                    source: e,
                })
            }
        };
        handle
            .stream
            .send_bytes(&handle.shared, CHANNEL_STDOUT, &buf[..n])?;
    }
    handle.stream.close(&handle.shared)?;
    let mut written = None;
    while let Some(item) = handle.next()? {
        match item {
            Item::Event(Event::Written { bytes }) => written = Some(bytes),
            Item::Event(Event::Error { code, message }) => {
                return Err(ClientError::Agent { code, message })
            }
            other => {
                return Err(ClientError::protocol(format!(
                    "stream {}: unexpected {other:?} in reply to a file write",
                    handle.id()
                )))
            }
        }
    }
    written.ok_or_else(|| {
        ClientError::protocol(format!(
            "stream {}: closed without reporting the bytes written",
            handle.id()
        ))
    })
}
