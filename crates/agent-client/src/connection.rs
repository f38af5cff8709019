//! [`Connection`]: one agent, one socket, many concurrent streams.
//!
//! - **Handshake** in [`Connection::new`]: send Hello, read the agent's,
//!   negotiate. Nothing else is sent before the agent's Hello arrives.
//! - **The reactor** (`reactor.rs`, one thread for every connection of the
//!   process) reads the read half. It decodes frames and routes them:
//!   Credit to the stream's send window, Data/Close/Reset into the
//!   stream's buffer (`stream.rs`), Pong to [`Connection::ping`]. It never
//!   waits for a consumer, so one stalled stream cannot stop the others.
//!   When the socket ends or the agent breaks the framing, every stream is
//!   woken with the reason.
//! - **Writes** from any thread go through one mutex around the write half;
//!   a frame is written whole under the lock.
//! - **Stream ids** are odd and increasing, as the agent requires: an id is
//!   allocated and its Open written under the same writer lock, so Opens
//!   reach the wire in id order whichever thread opens them.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use brig_protocol::message::{
    self, Call, ErrorBody, ErrorCode, ExecRequest, LogsRequest, CHANNEL_STDOUT, MAX_EXEC_REQUEST,
};
use brig_protocol::{
    negotiate, Body, Decoder, Frame, ResetCode, StreamClass, StreamId, MAX_OPEN_HEADER, SUPPORTED,
};

use crate::files::FileReader;
use crate::logs::LogReader;
use crate::port::PortStream;
use crate::process::Process;
use crate::reactor::Reactor;
use crate::stream::{Dead, Handle, Stream};
use crate::watch::Watcher;
use crate::{call, ClientError, Reply};

/// How long [`Connection::new`] waits for the agent's Hello.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to one `brig-agent`. `Sync`: share it (e.g. in an `Arc`)
/// between threads; every method takes `&self`. Dropping it hangs up,
/// which makes the agent kill its foreground processes and exit; handles
/// still open then report [`ClientError::Closed`].
#[derive(Debug)]
pub struct Connection {
    shared: Arc<Shared>,
    version: u16,
}

/// What the reactor and every handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    writer: Mutex<Writer>,
    /// Another handle on the socket, to shut it down without the writer's
    /// lock.
    /// The socket again (the same descriptor), to shut it down without the
    /// writer's lock. One descriptor per connection, shared by the writer,
    /// this and the reactor: a daemon holds one per sandbox.
    hangup: Arc<UnixStream>,
    table: Mutex<Table>,
    /// Signalled when a Pong arrives or the connection dies.
    pongs_changed: Condvar,
    next_nonce: AtomicU64,
    /// How long a request waits for the agent's first answer, in ms.
    answer_ms: AtomicU64,
}

/// How long a request waits for the agent's first answer by default. A
/// working agent answers in milliseconds even on a loaded host; one that
/// does not is stuck or hostile, and a request must not wait on it forever.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

impl Shared {
    pub(crate) fn answer_timeout(&self) -> Duration {
        Duration::from_millis(self.answer_ms.load(Ordering::Relaxed))
    }
}

#[derive(Debug)]
struct Writer {
    sock: Arc<UnixStream>,
    next_id: u32,
    buf: Vec<u8>,
}

#[derive(Debug, Default)]
struct Table {
    streams: HashMap<u32, Arc<Stream>>,
    pongs: HashSet<u64>,
    dead: Option<Dead>,
}

impl Shared {
    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write one frame, whole, from any thread.
    pub(crate) fn send(&self, frame: &Frame) -> Result<(), ClientError> {
        let mut w = self.writer();
        w.write(frame).map_err(|e| self.why_failed(e))
    }

    /// A write's error, or the connection's own end if it has one: a
    /// connection the agent ended (a notice, a protocol error) shuts the
    /// socket down, and the reason is what the caller needs, not the
    /// broken pipe that followed.
    fn why_failed(&self, e: ClientError) -> ClientError {
        match (&e, &self.table().dead) {
            (ClientError::Closed | ClientError::Io { .. }, Some(dead)) => dead.error(),
            _ => e,
        }
    }

    /// Register a stream and send its Open.
    fn open(self: &Arc<Self>, class: StreamClass, header: Vec<u8>) -> Result<Handle, ClientError> {
        let mut w = self.writer();
        let stream = {
            let mut table = self.table();
            if let Some(dead) = &table.dead {
                return Err(dead.error());
            }
            let stream = Arc::new(Stream::new(StreamId(w.next_id)));
            table.streams.insert(w.next_id, Arc::clone(&stream));
            stream
        };
        let sent = match w.next_id.checked_add(2) {
            Some(next) => {
                w.next_id = next;
                w.write(&Frame::open(stream.id, class, header))
                    .map_err(|e| self.why_failed(e))
            }
            None => Err(ClientError::protocol("stream ids exhausted")),
        };
        // The handle owns the table entry (dropping it on error removes it
        // again), and its Drop writes: release the writer first.
        drop(w);
        let handle = Handle {
            shared: Arc::clone(self),
            stream,
        };
        sent.map(|()| handle)
    }

    /// Drop a stream from the table; later frames for it are ignored.
    pub(crate) fn forget(&self, id: StreamId) {
        self.table().streams.remove(&id.0);
    }

    fn stream(&self, id: u32) -> Option<Arc<Stream>> {
        self.table().streams.get(&id).cloned()
    }

    /// The connection is over: wake everyone with the reason.
    pub(crate) fn die(&self, dead: Dead) {
        let streams: Vec<Arc<Stream>> = {
            let mut table = self.table();
            table.dead.get_or_insert(dead.clone());
            table.streams.values().cloned().collect()
        };
        for s in streams {
            s.on_dead(&dead);
        }
        self.pongs_changed.notify_all();
        // Unblock writers stuck on a full socket, and tell the agent. Not
        // through the writer's lock: a writer may be blocked holding it.
        let _ = self.hangup.shutdown(Shutdown::Both);
    }

    /// Route one frame from the agent. An error ends the connection.
    /// Never blocks: it runs on the reactor, which serves every connection.
    pub(crate) fn dispatch(self: &Arc<Self>, frame: Frame) -> Result<(), Dead> {
        let id = frame.stream.0;
        let reset = match frame.body {
            Body::Ping(nonce) => {
                self.send_aside(Frame::pong(nonce));
                None
            }
            Body::Pong(nonce) => {
                self.table().pongs.insert(nonce);
                self.pongs_changed.notify_all();
                None
            }
            Body::Hello { .. } => return Err(Dead::Protocol("a second hello".into())),
            Body::Open { class, header } => {
                if class == StreamClass::NOTICE {
                    return Err(Dead::Protocol(notice(&header)));
                }
                // The host expects no other stream from the agent.
                Some(ResetCode::REFUSED)
            }
            // Frames for streams no longer in the table are late frames of
            // a stream this side already dropped.
            Body::Data(payload) => self.stream(id).and_then(|s| s.on_data(payload)),
            Body::Credit(increment) => self.stream(id).and_then(|s| s.on_credit(increment)),
            Body::Close => {
                if let Some(s) = self.stream(id) {
                    s.on_close();
                }
                None
            }
            Body::Reset(code) => {
                if let Some(s) = self.stream(id) {
                    s.on_reset(code);
                }
                None
            }
        };
        if let Some(code) = reset {
            self.send_aside(Frame::reset(frame.stream, code));
        }
        Ok(())
    }

    /// Write a frame the reactor owes the agent from a thread of its own:
    /// the write may block on a full socket, the reactor must not. Rare
    /// (the agent does not ping; it opens no streams). Best effort: if the
    /// write fails, the reactor sees the end of the connection too.
    fn send_aside(self: &Arc<Self>, frame: Frame) {
        let shared = Arc::clone(self);
        let _ = std::thread::Builder::new()
            .name("brig-agent-reply".into())
            .spawn(move || {
                let _ = shared.send(&frame);
            });
    }
}

impl Writer {
    fn write(&mut self, frame: &Frame) -> Result<(), ClientError> {
        self.buf.clear();
        frame
            .encode_into(&mut self.buf)
            .map_err(|e| ClientError::protocol(format!("cannot encode a frame: {e}")))?;
        (&*self.sock)
            .write_all(&self.buf)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::NotConnected => ClientError::Closed,
                _ => ClientError::Io {
                    op: "write to the agent".into(),
                    source: e,
                },
            })
    }
}

/// The reason in a NOTICE stream's header.
fn notice(header: &[u8]) -> String {
    match message::decode::<ErrorBody>("notice", header) {
        Ok(body) => format!("agent reported: {}", body.message),
        Err(e) => format!("agent sent a notice that does not decode: {e}"),
    }
}

impl Connection {
    /// Exchange Hellos with the agent on `sock` and hand its read half to
    /// the reactor. Fails if the agent does not answer within
    /// [`HANDSHAKE_TIMEOUT`], speaks no common version, or sends anything
    /// but a Hello first.
    pub fn new(sock: UnixStream) -> Result<Connection, ClientError> {
        let sock = Arc::new(sock);
        let mut read_half: &UnixStream = &sock;
        let mut writer = Writer {
            sock: Arc::clone(&sock),
            next_id: 1,
            buf: Vec::new(),
        };
        writer.write(&Frame::hello(SUPPORTED.0, SUPPORTED.1))?;

        let mut decoder = Decoder::new();
        let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let version = loop {
            let frame = decoder
                .next_frame()
                .map_err(|e| ClientError::protocol(format!("bad frame in the handshake: {e}")))?;
            match frame {
                Some(Frame {
                    body: Body::Hello { min, max },
                    ..
                }) => {
                    break negotiate(SUPPORTED, (min, max))
                        .map_err(|e| ClientError::protocol(e.to_string()))?;
                }
                Some(Frame {
                    body: Body::Open { class, header },
                    ..
                }) if class == StreamClass::NOTICE => {
                    return Err(ClientError::protocol(notice(&header)));
                }
                Some(other) => {
                    return Err(ClientError::protocol(format!(
                        "expected hello as the first frame, got {}",
                        other.kind()
                    )))
                }
                None => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::protocol("no hello from the agent within 10s"));
            }
            read_half
                .set_read_timeout(Some(left))
                .map_err(ClientError::io("set a read timeout on the agent socket"))?;
            let mut buf = [0u8; 4096];
            match read_half.read(&mut buf) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(n) => decoder.push(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ClientError::protocol("no hello from the agent within 10s"))
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return Err(ClientError::Closed)
                }
                Err(e) => return Err(ClientError::io("read the agent's hello")(e)),
            }
        };
        read_half.set_read_timeout(None).map_err(ClientError::io(
            "clear the read timeout on the agent socket",
        ))?;

        let shared = Arc::new(Shared {
            writer: Mutex::new(writer),
            hangup: Arc::clone(&sock),
            table: Mutex::new(Table::default()),
            pongs_changed: Condvar::new(),
            next_nonce: AtomicU64::new(1),
            answer_ms: AtomicU64::new(ANSWER_TIMEOUT.as_millis() as u64),
        });
        Reactor::get()
            .and_then(|r| r.register(sock, decoder, Arc::clone(&shared)))
            .map_err(ClientError::io(
                "register the agent socket with the reactor",
            ))?;
        Ok(Connection { shared, version })
    }

    /// How long a request waits for the agent's first answer (`started`,
    /// `attached`) before it fails with [`ClientError::NoAnswer`]
    /// ([`ANSWER_TIMEOUT`] unless set).
    pub fn set_answer_timeout(&self, within: Duration) {
        self.shared
            .answer_ms
            .store(within.as_millis() as u64, Ordering::Relaxed);
    }

    pub fn answer_timeout(&self) -> Duration {
        self.shared.answer_timeout()
    }

    /// The protocol version both sides agreed on.
    pub fn version(&self) -> u16 {
        self.version
    }

    /// Whether the connection has ended (the agent went away or broke the
    /// protocol).
    pub fn is_closed(&self) -> bool {
        self.shared.table().dead.is_some()
    }

    /// Start a process. Returns once the agent has answered: `started`
    /// (the pid is then [`Process::pid`]) or an error such as
    /// `cannot start /no/such: no such file or directory`.
    pub fn exec(&self, req: &ExecRequest) -> Result<Process, ClientError> {
        let (header, continued) = self.exec_header(req)?;
        let handle = self.shared.open(StreamClass::EXEC, header)?;
        if let Some(body) = continued {
            handle
                .stream
                .send_bytes(&handle.shared, CHANNEL_STDOUT, &body)?;
        }
        Process::start(handle)
    }

    /// [`Connection::exec`] for an async caller: waits for credit and for
    /// the agent's answer without a thread.
    pub async fn exec_async(&self, req: &ExecRequest) -> Result<Process, ClientError> {
        let (header, continued) = self.exec_header(req)?;
        let handle = self.shared.open(StreamClass::EXEC, header)?;
        if let Some(body) = continued {
            let mut rest = &body[..];
            while !rest.is_empty() {
                let sent = std::future::poll_fn(|cx| {
                    handle
                        .stream
                        .poll_send_bytes(cx, &handle.shared, CHANNEL_STDOUT, rest)
                })
                .await?;
                rest = &rest[sent..];
            }
        }
        Process::start_async(handle).await
    }

    /// The Open header of an exec, and the request to send as the stream's
    /// first Data when it is too large for a header (version 3:
    /// `ExecRequest::continued`), so that a command line or environment of
    /// megabytes reaches execve, which has its own limits.
    #[allow(clippy::type_complexity)]
    fn exec_header(&self, req: &ExecRequest) -> Result<(Vec<u8>, Option<Vec<u8>>), ClientError> {
        // `meta` is version 2: an older agent would refuse the field.
        let whole = if req.meta.is_some() && self.version < 2 {
            message::encode_header(&ExecRequest {
                meta: None,
                ..req.clone()
            })
        } else {
            message::encode_header(req)
        };
        if whole.len() <= MAX_OPEN_HEADER {
            return Ok((whole, None));
        }
        let refuse = |message: String| ClientError::Agent {
            code: ErrorCode::InvalidRequest,
            message,
        };
        if whole.len() > MAX_EXEC_REQUEST {
            return Err(refuse(format!(
                "the command line and environment are too large: {} bytes as a request, \
                 brig takes at most {} MiB (and execve itself about 2 MiB); pass large input \
                 through stdin or a file",
                whole.len(),
                MAX_EXEC_REQUEST >> 20
            )));
        }
        if self.version < 3 {
            return Err(refuse(format!(
                "the command line and environment take {} bytes; this sandbox's agent \
                 (protocol version {}) takes at most {} KiB: a sandbox created by this brig \
                 takes up to the kernel's own limit",
                whole.len(),
                self.version,
                MAX_OPEN_HEADER >> 10
            )));
        }
        let header = message::encode_header(&ExecRequest {
            continued: Some(whole.len() as u32),
            ..ExecRequest::default()
        });
        Ok((header, Some(whole)))
    }

    /// Re-attach to a process by pid (a background one, typically): its
    /// buffered output, then live output and its exit.
    pub fn attach(&self, pid: i32) -> Result<Process, ClientError> {
        let handle = self.shared.open(
            StreamClass::ATTACH,
            message::encode_header(&message::AttachRequest { pid }),
        )?;
        Process::start(handle)
    }

    /// Run a one-shot request (list, stat, mkdir, rename, remove, list
    /// processes, signal) and return its typed reply.
    pub fn call(&self, req: &Call) -> Result<Reply, ClientError> {
        let handle = self
            .shared
            .open(StreamClass::CALL, message::encode_header(req))?;
        handle.stream.close(&handle.shared)?;
        call::collect(&handle)
    }

    /// Open a file for streaming reads. Returns once the agent has opened
    /// it ([`FileReader::size`]) or failed to.
    pub fn read_file(&self, path: &str) -> Result<FileReader, ClientError> {
        let handle = self.shared.open(
            StreamClass::FILE_READ,
            message::encode_header(&message::ReadRequest { path: path.into() }),
        )?;
        handle.stream.close(&handle.shared)?;
        FileReader::start(handle)
    }

    /// Stream `contents` into a file in the sandbox, blocking while the
    /// agent's window is full. `mode` applies to a new file (default 0o644
    /// less the umask); `append` appends instead of truncating. Returns the
    /// bytes written, as the agent counted them after syncing the file.
    pub fn write_file(
        &self,
        path: &str,
        contents: impl Read,
        mode: Option<u32>,
        append: bool,
    ) -> Result<u64, ClientError> {
        self.write_file_as(path, contents, mode, append, None)
    }

    /// [`Connection::write_file`], opening the file as `owner` (see
    /// [`message::WriteRequest::owner`]) when given.
    pub fn write_file_as(
        &self,
        path: &str,
        contents: impl Read,
        mode: Option<u32>,
        append: bool,
        owner: Option<message::FileOwner>,
    ) -> Result<u64, ClientError> {
        let handle = self.shared.open(
            StreamClass::FILE_WRITE,
            message::encode_header(&message::WriteRequest {
                path: path.into(),
                mode,
                append,
                owner,
            }),
        )?;
        crate::files::write(&handle, path, contents)
    }

    /// Watch a directory in the sandbox (with `recursive`, its whole
    /// subtree). Returns once the agent's watches are in place, so every
    /// change after this returns is reported; or the agent's error (e.g.
    /// `watch /x: not a directory`). Dropping the [`Watcher`] ends it.
    pub fn watch(&self, path: &str, recursive: bool) -> Result<Watcher, ClientError> {
        let handle = self.shared.open(
            StreamClass::WATCH,
            message::encode_header(&message::WatchRequest {
                path: path.into(),
                recursive,
            }),
        )?;
        Watcher::start(handle)
    }

    /// Read the sandbox's log (its background processes' output). Needs an
    /// agent of protocol version 4; an older one is a clear error.
    pub fn logs(&self, req: &LogsRequest) -> Result<LogReader, ClientError> {
        LogReader::start(self.open_logs(req)?)
    }

    /// [`Connection::logs`], awaited.
    pub async fn logs_async(&self, req: &LogsRequest) -> Result<LogReader, ClientError> {
        LogReader::start_async(self.open_logs(req)?).await
    }

    fn open_logs(&self, req: &LogsRequest) -> Result<Handle, ClientError> {
        if self.version() < 4 {
            return Err(ClientError::Agent {
                code: ErrorCode::Unsupported,
                message: format!(
                    "this sandbox's agent speaks protocol version {}, which keeps no log \
                     (version 4 does): a sandbox created by this brig has one",
                    self.version()
                ),
            });
        }
        self.shared
            .open(StreamClass::LOGS, message::encode_header(req))
    }

    /// Connect to TCP port `port` on the sandbox's loopback (127.0.0.1),
    /// from inside its network namespace. Returns once the connection is
    /// made, or the agent's error: code
    /// [`ConnectionRefused`](crate::ErrorCode::ConnectionRefused) when
    /// nothing listens there.
    pub fn connect_port(&self, port: u16) -> Result<PortStream, ClientError> {
        let handle = self.shared.open(
            StreamClass::CONNECT,
            message::encode_header(&message::ConnectRequest { port, host: None }),
        )?;
        PortStream::start(handle, port)
    }

    /// Round trip to the agent and back; returns how long it took.
    pub fn ping(&self) -> Result<Duration, ClientError> {
        let nonce = self.shared.next_nonce.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        self.shared.send(&Frame::ping(nonce))?;
        let mut table = self.shared.table();
        loop {
            if table.pongs.remove(&nonce) {
                return Ok(start.elapsed());
            }
            if let Some(dead) = &table.dead {
                return Err(dead.error());
            }
            table = self
                .shared
                .pongs_changed
                .wait(table)
                .unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Hang up: the agent sees EOF and cleans up; the reactor sees it
        // too and forgets the socket. Every open handle learns now.
        self.shared.die(Dead::Closed);
    }
}
