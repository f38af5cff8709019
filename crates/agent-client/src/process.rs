//! [`Process`]: one `EXEC` or `ATTACH` stream.
//!
//! Output arrives in order as [`Output`] items (`started`/`attached`,
//! stdout and stderr chunks, `exited`); taking an item is what returns
//! credit to the agent, so an unread process is paused, not buffered.
//! [`Stdin`] sends within the stream's send credit and blocks while it is
//! exhausted. Dropping a `Process` whose stream the agent has not closed
//! cancels it: a foreground process is killed, a background one detached.
//!
//! Every blocking call has an async counterpart for a caller on an async
//! runtime ([`Process::next_output`], [`Stdin::write_all_async`], …): it
//! waits without a thread, woken by the reactor when the stream changes.

use std::future::poll_fn;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use brig_protocol::message::{Event, Input, CHANNEL_STDERR, CHANNEL_STDOUT};

use crate::connection::Shared;
use crate::stream::{Handle, Item, Stream};
use crate::ClientError;

/// One thing a process did, in the order the agent reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// The process started (first item of an exec).
    Started { pid: i32 },
    /// Re-attached to `pid`; `dropped` bytes of its output were lost from
    /// the agent's bounded buffer before this client attached.
    Attached { pid: i32, dropped: u64 },
    /// stdout, or everything a PTY printed.
    Stdout(Vec<u8>),
    /// stderr (never on a PTY).
    Stderr(Vec<u8>),
    /// The process ended; exactly one of `code` and `signal` is set.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

impl ExitStatus {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// A process in the sandbox. Iterate it for its [`Output`]; the iterator
/// ends when the agent closes the stream (after `exited`, or right after
/// `started` for a background process).
#[derive(Debug)]
pub struct Process {
    handle: Handle,
    pid: Option<i32>,
    /// Whether a [`Stdin`] was handed out: then its holder ends stdin, not
    /// [`Process::wait_with_output`].
    stdin_taken: AtomicBool,
    /// The stream ended (cleanly or with the error already returned):
    /// iteration is over.
    done: bool,
}

impl Process {
    /// Wait for the agent's first answer on a new stream.
    pub(crate) fn start(handle: Handle) -> Result<Process, ClientError> {
        let pid = handle.stream.first_event(handle.shared.answer_timeout())?;
        Ok(Process {
            handle,
            pid,
            stdin_taken: AtomicBool::new(false),
            done: false,
        })
    }

    /// [`Process::start`] without a thread: awaits the first answer.
    pub(crate) async fn start_async(handle: Handle) -> Result<Process, ClientError> {
        let pid = poll_fn(|cx| handle.stream.poll_first_event(cx)).await?;
        Ok(Process {
            handle,
            pid,
            stdin_taken: AtomicBool::new(false),
            done: false,
        })
    }

    /// The pid inside the sandbox, from `started` or `attached`.
    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// The stream id, for logs.
    pub fn stream_id(&self) -> u32 {
        self.handle.id().0
    }

    /// A writer for the process's stdin. It can be moved to another thread,
    /// which is how a caller feeds a lot of input to a process that also
    /// prints a lot: output is only credited back as it is read.
    pub fn stdin(&self) -> Stdin {
        self.stdin_taken.store(true, Ordering::Relaxed);
        Stdin {
            shared: Arc::clone(&self.handle.shared),
            stream: Arc::clone(&self.handle.stream),
        }
    }

    /// End of stdin (on a PTY: ^D). Idempotent.
    pub fn close_stdin(&self) -> Result<(), ClientError> {
        self.handle.stream.close(&self.handle.shared)
    }

    /// Deliver signal `sig` to the process (its group, as the agent does).
    pub fn signal(&self, sig: i32) -> Result<(), ClientError> {
        self.handle
            .stream
            .send_control(&self.handle.shared, &Input::Signal { sig })
    }

    /// Resize the process's PTY.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), ClientError> {
        self.handle
            .stream
            .send_control(&self.handle.shared, &Input::Resize { rows, cols })
    }

    /// Read everything and return stdout, stderr and how the process
    /// ended. Closes stdin first, unless [`Process::stdin`] was called:
    /// the holder of that writer may still be feeding it (from another
    /// thread) and closes it when done.
    pub fn wait_with_output(mut self) -> Result<(Vec<u8>, Vec<u8>, ExitStatus), ClientError> {
        if !self.stdin_taken.load(Ordering::Relaxed) {
            // Closing stdin can only fail if the stream or the connection
            // is already over, which reading reports more precisely.
            let _ = self.close_stdin();
        }
        let (mut stdout, mut stderr, mut status) = (Vec::new(), Vec::new(), None);
        for item in &mut self {
            match item? {
                Output::Stdout(b) => stdout.extend(b),
                Output::Stderr(b) => stderr.extend(b),
                Output::Exited { code, signal } => status = Some(ExitStatus { code, signal }),
                Output::Started { .. } | Output::Attached { .. } => {}
            }
        }
        let status = status.ok_or_else(|| {
            ClientError::protocol(format!(
                "stream {}: closed without an exit status",
                self.stream_id()
            ))
        })?;
        Ok((stdout, stderr, status))
    }
}

impl Process {
    /// The next output without blocking: `Pending` until there is one
    /// (the task is woken when it arrives), `Ready(None)` at the end of
    /// the stream. As [`Iterator::next`], for async callers.
    pub fn poll_output(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Output, ClientError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let item = ready!(self.handle.poll_next(cx));
        Poll::Ready(self.output(item))
    }

    /// The next output, awaited. As [`Iterator::next`], for async callers.
    pub async fn next_output(&mut self) -> Option<Result<Output, ClientError>> {
        poll_fn(|cx| self.poll_output(cx)).await
    }

    fn output(
        &mut self,
        item: Result<Option<Item>, ClientError>,
    ) -> Option<Result<Output, ClientError>> {
        let item = match item {
            Ok(Some(item)) => item,
            Ok(None) => {
                self.done = true;
                return None;
            }
            Err(e) => {
                self.done = true;
                return Some(Err(e));
            }
        };
        let output = match item {
            Item::Bytes {
                channel: CHANNEL_STDERR,
                bytes,
            } => Ok(Output::Stderr(bytes)),
            Item::Bytes { bytes, .. } => Ok(Output::Stdout(bytes)),
            Item::Event(Event::Started { pid }) => Ok(Output::Started { pid }),
            Item::Event(Event::Attached { pid, dropped }) => Ok(Output::Attached { pid, dropped }),
            Item::Event(Event::Exited { code, signal }) => Ok(Output::Exited { code, signal }),
            Item::Event(Event::Error { code, message }) => {
                Err(ClientError::Agent { code, message })
            }
            Item::Event(other) => Err(ClientError::protocol(format!(
                "stream {}: unexpected {other:?} on a process stream",
                self.stream_id()
            ))),
        };
        self.done |= output.is_err();
        Some(output)
    }
}

impl Iterator for Process {
    type Item = Result<Output, ClientError>;

    /// The next output, blocking until it arrives; `None` at the end of the
    /// stream. An `error` event from the agent, a reset or the loss of the
    /// connection is an `Err`, after which the iterator ends.
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.handle.next();
        self.output(item)
    }
}

/// A process's stdin. Writes block while the stream's send window is
/// exhausted; each `write` sends everything it is given (as one or more
/// Data frames). Dropping it does not close stdin: call
/// [`Stdin::close`] or [`Process::close_stdin`].
#[derive(Debug)]
pub struct Stdin {
    shared: Arc<Shared>,
    stream: Arc<Stream>,
}

impl Stdin {
    /// End of stdin.
    pub fn close(&self) -> Result<(), ClientError> {
        self.stream.close(&self.shared)
    }

    /// As [`Process::signal`], from the writer's side: a caller that reads
    /// output on one thread (iterating the `Process`) can still signal the
    /// process from another, as an interactive session does.
    pub fn signal(&self, sig: i32) -> Result<(), ClientError> {
        self.stream
            .send_control(&self.shared, &Input::Signal { sig })
    }

    /// As [`Process::resize`], from the writer's side.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), ClientError> {
        self.stream
            .send_control(&self.shared, &Input::Resize { rows, cols })
    }

    /// Send what the stream's credit allows of `buf` now (at least one
    /// byte), `Pending` while there is none. The async `write`.
    pub fn poll_write(&self, cx: &mut Context<'_>, buf: &[u8]) -> Poll<Result<usize, ClientError>> {
        self.stream
            .poll_send_bytes(cx, &self.shared, CHANNEL_STDOUT, buf)
    }

    /// Send all of `buf`, waiting for credit without a thread.
    pub async fn write_all_async(&self, mut buf: &[u8]) -> Result<(), ClientError> {
        while !buf.is_empty() {
            let n = poll_fn(|cx| self.poll_write(cx, buf)).await?;
            buf = &buf[n..];
        }
        Ok(())
    }

    /// [`Stdin::signal`], waiting for credit without a thread.
    pub async fn signal_async(&self, sig: i32) -> Result<(), ClientError> {
        self.control_async(&Input::Signal { sig }).await
    }

    /// [`Stdin::resize`], waiting for credit without a thread.
    pub async fn resize_async(&self, rows: u16, cols: u16) -> Result<(), ClientError> {
        self.control_async(&Input::Resize { rows, cols }).await
    }

    async fn control_async(&self, msg: &Input) -> Result<(), ClientError> {
        poll_fn(|cx| self.stream.poll_send_control(cx, &self.shared, msg)).await
    }
}

impl Write for Stdin {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.send_bytes(&self.shared, CHANNEL_STDOUT, buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Every write goes to the socket before it returns.
        Ok(())
    }
}
