//! brig-agent-client: the host side of the brig agent protocol.
//!
//! The daemon talks to one `brig-agent` per sandbox over one byte stream
//! (a unix socket) and serves many concurrent requests against it. This
//! crate is that client: thread-safe, std only (no async runtime). Every
//! call blocks; what streams (a process's output and stdin, a file read, a
//! port connection, a watch) also has a `poll_*`/`*_async` form that waits
//! without a thread: the reactor wakes the task (a [`std::task::Waker`]
//! kept beside the stream's condvar). The daemon uses those, so an open
//! stream costs it no thread; one-shot calls go through `spawn_blocking`.
//!
//! - [`Connection`] (`connection.rs`): the handshake, the mutex-guarded
//!   writer, stream ids, and the routing of frames to streams. Start here.
//! - `reactor.rs`: one thread that reads every connection of the process
//!   (epoll), so a daemon's thread count does not grow with its sandboxes.
//! - [`Process`] (`process.rs`): one `EXEC` or `ATTACH` stream: [`Stdin`],
//!   [`Output`] items, signals, PTY resize, [`ExitStatus`].
//! - [`FileReader`] and [`Connection::write_file`] (`files.rs`): streaming
//!   file contents in either direction.
//! - [`Reply`] (`call.rs`): the typed answer to a one-shot [`Call`].
//! - [`Watcher`] (`watch.rs`): a watched directory's [`WatchEvent`]s.
//! - [`LogReader`] (`logs.rs`): the sandbox's log, [`LogOutput`]s.
//! - [`PortStream`] (`port.rs`): a TCP connection to a port inside the
//!   sandbox, as blocking `Read + Write` with half-close and abort.
//! - `stream.rs`: one stream's receive buffer and send credit, shared
//!   between the reactor and the handle that consumes it.
//! - [`ClientError`]: everything that can go wrong, below.
//!
//! ## Flow control: credit as the consumer takes data
//!
//! The reactor never blocks on a consumer. Data it receives goes into
//! the stream's buffer, which cannot exceed the stream's receive window
//! (256 KiB) because the agent may only send what it has credit for. Credit
//! goes back to the agent only when the consumer takes bytes out of the
//! buffer, so a consumer that stops reading one process's output throttles
//! that stream alone (its process then blocks in write(2) inside the
//! sandbox) while every other stream keeps moving. Memory per connection is
//! bounded by open streams × 256 KiB plus one frame in the decoder.
//!
//! The cost of this choice is the shell-pipeline rule: a thread that writes
//! a lot of stdin to a process which echoes it must read the output from
//! another thread (or interleave), exactly as with `std::process`. The
//! alternative, crediting on arrival into an unbounded queue, would move
//! the agent's back-pressure into host memory.

pub mod call;
pub mod connection;
pub mod files;
mod inbound;
pub mod logs;
pub mod port;
pub mod process;
mod reactor;
mod stream;
pub mod watch;

use brig_protocol::ResetCode;

pub use brig_protocol::message::{
    Call, ChangeKind, Entry, ErrorCode, ExecRequest, FileKind, FileOwner, LogsRequest, ProcessInfo,
    PtySize, LOG_KEEP, MAX_EXEC_REQUEST, MAX_META,
};
pub use call::Reply;
pub use connection::Connection;
pub use files::FileReader;
pub use logs::{LogOutput, LogReader};
pub use port::PortStream;
pub use process::{ExitStatus, Output, Process, Stdin};
pub use watch::{WatchEvent, WatchStopper, Watcher};

/// Why an operation on the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The agent refused or failed the request. The message names the
    /// operation and path, e.g. `stat /no/such: no such file or directory`.
    #[error("{message}")]
    Agent { code: ErrorCode, message: String },
    /// The agent broke the protocol. On a stream this resets the stream; in
    /// the framing or the handshake it ends the connection.
    #[error("agent broke the protocol: {reason}")]
    Protocol { reason: String },
    /// The agent reset the stream (it refused it, or the client broke a
    /// stream rule).
    #[error("agent reset stream {stream} ({code})")]
    Reset { stream: u32, code: ResetCode },
    /// The agent closed its side of the stream before the operation was
    /// done, e.g. writing stdin to a process that has exited.
    #[error("agent closed stream {stream}")]
    StreamClosed { stream: u32 },
    /// The connection to the agent is gone (the agent exited, the sandbox
    /// died, or the [`Connection`] was dropped).
    #[error("connection to the agent closed")]
    Closed,
    /// The agent did not answer a request within the connection's answer
    /// timeout ([`Connection::set_answer_timeout`]): an agent that is
    /// stuck, or taken over by code in its sandbox.
    #[error(
        "the sandbox's agent did not answer within {} s: something in the sandbox may have \
         stopped or replaced it; end the sandbox and start a new one",
        .waited.as_secs_f64()
    )]
    NoAnswer {
        stream: u32,
        waited: std::time::Duration,
    },
    /// A local I/O operation failed: `op` says which.
    #[error("{op}")]
    Io {
        op: String,
        #[source]
        source: std::io::Error,
    },
}

impl ClientError {
    fn io(op: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClientError {
        let op = op.into();
        move |source| ClientError::Io { op, source }
    }

    fn protocol(reason: impl Into<String>) -> ClientError {
        ClientError::Protocol {
            reason: reason.into(),
        }
    }

    /// The agent's error code, if the agent reported the error.
    pub fn agent_code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Agent { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// For [`std::io::Read`] and [`std::io::Write`] implementations: keeps the
/// `ClientError` as the source and picks the closest `ErrorKind`.
impl From<ClientError> for std::io::Error {
    fn from(e: ClientError) -> Self {
        use std::io::ErrorKind;
        let kind = match &e {
            ClientError::Io { source, .. } => source.kind(),
            ClientError::Agent { code, .. } => match code {
                ErrorCode::NotFound | ErrorCode::NoSuchProcess => ErrorKind::NotFound,
                ErrorCode::PermissionDenied => ErrorKind::PermissionDenied,
                ErrorCode::AlreadyExists => ErrorKind::AlreadyExists,
                ErrorCode::InvalidRequest => ErrorKind::InvalidInput,
                ErrorCode::Unsupported => ErrorKind::Unsupported,
                _ => ErrorKind::Other,
            },
            ClientError::Closed | ClientError::StreamClosed { .. } => ErrorKind::BrokenPipe,
            ClientError::Reset { .. } => ErrorKind::ConnectionReset,
            ClientError::Protocol { .. } => ErrorKind::InvalidData,
            ClientError::NoAnswer { .. } => ErrorKind::TimedOut,
        };
        std::io::Error::new(kind, e)
    }
}
