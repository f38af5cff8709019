//! The agent's event loop: one thread, one poll(2) over the connection, the
//! SIGCHLD signalfd and every child pipe.
//!
//! Each turn: `pump` moves queued output onto streams as far as their send
//! windows allow, `poll` waits for something to change, and the handlers
//! read frames, child output and exit statuses. Nothing in the loop blocks
//! except poll itself. Memory is bounded everywhere: the connection's
//! outgoing buffer stops growing at [`OUT_HIGH`] (pumps pause, and the
//! connection is not read while it is over [`OUT_MAX`]); process output
//! queues are bounded (see `process.rs`); incoming Data is bounded by each
//! stream's receive window.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use brig_protocol::message::{
    self, AttachRequest, Call, ConnectRequest, DataMsg, ErrorBody, ErrorCode, Event, ExecRequest,
    Input, LogsRequest, ProcessInfo, ReadRequest, WatchRequest, WriteRequest, CHANNEL_STDOUT,
    MAX_CHUNK, MAX_EXEC_REQUEST,
};
use brig_protocol::{
    negotiate, Body, Decoder, Frame, RecvWindow, ResetCode, SendWindow, StreamClass, StreamId,
    SUPPORTED,
};

use crate::files;
use crate::forward::{self, Forwards, Pulled};
use crate::logs::{self, Logs};
use crate::process::{Pipe, Proc, SpawnError};
use crate::sys::{self, WaitStatus};
use crate::watch::{Popped, Watches};

/// Stop producing output once this much is waiting to be written.
const OUT_HIGH: usize = 1 << 20;
/// Stop reading the connection once this much is waiting to be written
/// (a peer that pings without reading).
const OUT_MAX: usize = 4 << 20;
/// Streams open at once; more Opens are refused.
const MAX_STREAMS: usize = 1024;
/// Finished background processes kept for a late `ATTACH`.
const MAX_EXITED: usize = 64;
/// File bytes per Data frame when reading.
const FILE_CHUNK: usize = 256 << 10;
/// Buffers up to this size are kept across a quiet spell; larger ones are
/// freed once the connection has been quiet for [`QUIET_MS`].
const KEEP_WHEN_QUIET: usize = 64 << 10;
const QUIET_MS: libc::c_int = 2000;

/// Why the connection ended.
#[derive(Debug)]
pub enum End {
    /// The host closed the connection.
    Eof,
    /// The host broke the protocol; reported to it with a NOTICE stream.
    Protocol(String),
    Io(io::Error),
}

#[derive(Debug)]
enum Role {
    /// Output of a process goes here; inputs go to it.
    Process {
        pid: i32,
    },
    Read {
        file: File,
    },
    Write {
        file: File,
        written: u64,
    },
    /// Changes in a watched directory go here (`watch.rs`).
    Watch,
    /// A TCP connection inside the sandbox (`forward.rs`).
    Forward,
    /// An exec request too large for its Open header, arriving as the
    /// stream's first `need` bytes of Data (`ExecRequest::continued`).
    Request {
        need: usize,
        buf: Vec<u8>,
    },
    /// A reader of the sandbox's log (`logs.rs`).
    Logs,
    /// Nothing more to do but drain control messages and close.
    Idle,
}

#[derive(Debug)]
struct Stream {
    send: SendWindow,
    recv: RecvWindow,
    /// Control payloads (already tagged) waiting for send credit.
    ctl: VecDeque<Vec<u8>>,
    role: Role,
    /// Close this side once `ctl` is empty.
    finish: bool,
    local_closed: bool,
    remote_closed: bool,
}

impl Stream {
    fn new(role: Role) -> Stream {
        Stream {
            send: SendWindow::new(),
            recv: RecvWindow::default(),
            ctl: VecDeque::new(),
            role,
            finish: false,
            local_closed: false,
            remote_closed: false,
        }
    }

    fn event(&mut self, event: &Event) {
        self.ctl.push_back(message::control_payload(event));
    }

    /// Reply with one event and close.
    fn reply(&mut self, event: &Event) {
        self.event(event);
        self.role = Role::Idle;
        self.finish = true;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    ConnIn,
    ConnOut,
    Listen,
    Sigchld,
    Out(i32, Pipe),
    Stdin(i32),
    Inotify,
    Forward(u32),
}

/// The file a `--listen-at` agent writes beside its socket once it has let
/// go of it for a checkpoint.
pub const RELEASED: &str = "released";

/// Bind a unix socket at `path` (a stale one is replaced) that only the
/// sandbox's root may connect to: made 0600 by the umask at its creation
/// (gVisor refuses a chmod of a socket it bound on the host), the umask
/// restored for what the agent starts.
pub fn bind_private(path: &std::path::Path) -> io::Result<UnixListener> {
    let _ = std::fs::remove_file(path);
    // SAFETY: umask takes an integer and cannot fail.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    bound
}

#[derive(Debug)]
pub struct Session {
    /// The host's connection (read half, write half); `None` while no host
    /// is connected (listening, between daemons).
    conn: Option<(File, File)>,
    /// With `--listen`: where the next host connects. A new connection
    /// replaces the current one; the host going away ends nothing.
    listener: Option<UnixListener>,
    /// With `--listen-at`: the socket's path, which the agent lets go of
    /// (SIGUSR2) for a checkpoint and binds again (SIGUSR1) after it.
    listen_path: Option<PathBuf>,
    decoder: Decoder,
    out: Vec<u8>,
    peer_hello: bool,
    /// The version negotiated with the current host.
    version: u16,
    streams: BTreeMap<u32, Stream>,
    highest_host_stream: u32,
    next_agent_stream: u32,
    procs: BTreeMap<i32, Proc>,
    exited_unattached: VecDeque<i32>,
    sigchld: File,
    watches: Watches,
    forwards: Forwards,
    logs: Logs,
}

fn push_frame(out: &mut Vec<u8>, frame: Frame) {
    // Every frame the agent builds is within the kind's bounds (Data ≤
    // MAX_CHUNK + 1, headers ≤ a few hundred bytes), so encoding cannot fail.
    frame
        .encode_into(out)
        .expect("agent frames are well-formed");
}

impl Session {
    /// A session on one connection: it ends when the host hangs up.
    pub fn new(input: File, output: File) -> io::Result<Session> {
        sys::set_nonblocking(&input)?;
        sys::set_nonblocking(&output)?;
        Self::build(Some((input, output)), None, None)
    }

    /// A session that outlives its connections: hosts connect to
    /// `listener`, one at a time, and a host that goes away (a daemon
    /// restarting) leaves every background process running, its output
    /// kept in its ring for the next host to re-attach to.
    pub fn listen(listener: UnixListener) -> io::Result<Session> {
        listener.set_nonblocking(true)?;
        Self::build(None, Some(listener), None)
    }

    /// As [`Session::listen`], on the socket the agent bound at `path`
    /// (the gvisor tier). gVisor cannot checkpoint a sandbox holding a
    /// host socket, so on SIGUSR2 the agent lets go of it — it drops the
    /// host's connection (as when a host goes away: background processes
    /// run on) and closes and removes its socket — and on SIGUSR1 binds
    /// it again (the host sends it after the checkpoint, to the sandbox
    /// and to each one restored from it).
    pub fn listen_at(listener: UnixListener, path: PathBuf) -> io::Result<Session> {
        listener.set_nonblocking(true)?;
        Self::build(None, Some(listener), Some(path))
    }

    fn build(
        conn: Option<(File, File)>,
        listener: Option<UnixListener>,
        listen_path: Option<PathBuf>,
    ) -> io::Result<Session> {
        let also: &[libc::c_int] = if listen_path.is_some() {
            &[libc::SIGUSR1, libc::SIGUSR2]
        } else {
            &[]
        };
        Ok(Session {
            conn,
            listener,
            listen_path,
            decoder: Decoder::new(),
            out: Vec::new(),
            peer_hello: false,
            version: 0,
            streams: BTreeMap::new(),
            highest_host_stream: 0,
            next_agent_stream: 2,
            procs: BTreeMap::new(),
            exited_unattached: VecDeque::new(),
            sigchld: File::from(sys::sigchld_fd(also)?),
            watches: Watches::default(),
            forwards: Forwards::default(),
            logs: Logs::default(),
        })
    }

    /// Serve until the host hangs up or breaks the protocol; a listening
    /// session serves the next host instead, for as long as it runs.
    pub fn run(&mut self) -> End {
        if self.conn.is_some() {
            push_frame(&mut self.out, Frame::hello(SUPPORTED.0, SUPPORTED.1));
        }
        loop {
            let Err(end) = self.turn() else {
                continue;
            };
            if let End::Protocol(message) = &end {
                self.notice(message);
            }
            if self.listener.is_none() {
                return end;
            }
            self.detach();
        }
    }

    /// The host is gone: end its streams as if it had reset each one
    /// (foreground processes die with their client; background ones keep
    /// running, their output going to their rings) and forget the
    /// connection's state, ready for the next host's hello.
    fn detach(&mut self) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.drop_stream(id);
        }
        self.conn = None;
        self.out.clear();
        self.decoder = Decoder::new();
        self.peer_hello = false;
        self.highest_host_stream = 0;
        self.next_agent_stream = 2;
    }

    /// Before a checkpoint: no host socket may be open in the sandbox.
    /// Once closed, the agent says so with a file beside the socket
    /// ([`RELEASED`]); the host removes both (gVisor lets the sandbox bind
    /// a host socket, not remove it).
    fn let_go(&mut self) {
        let Some(path) = self.listen_path.clone() else {
            return;
        };
        if self.conn.is_some() {
            let _ = self.flush();
            self.detach();
        }
        self.listener = None;
        let released = path.with_file_name(RELEASED);
        if let Err(e) = std::fs::write(&released, b"") {
            eprintln!("brig-agent: cannot write {}: {e}", released.display());
        }
    }

    /// After a checkpoint (in the sandbox checkpointed and in each one
    /// restored from it): listen again.
    fn bind_again(&mut self) {
        let Some(path) = self.listen_path.clone() else {
            return;
        };
        if self.listener.is_some() {
            return;
        }
        match bind_private(&path).and_then(|l| l.set_nonblocking(true).map(|()| l)) {
            Ok(listener) => self.listener = Some(listener),
            Err(e) => eprintln!("brig-agent: cannot bind {} again: {e}", path.display()),
        }
    }

    /// A host connects: it replaces the current one, if any.
    fn accept(&mut self) {
        let Some(listener) = &self.listener else {
            return;
        };
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(_) => return,
        };
        // Non-blocking is a property of the open file, shared by both halves.
        let halves = stream.set_nonblocking(true).and_then(|()| {
            let write = stream.try_clone()?;
            Ok((
                File::from(OwnedFd::from(stream)),
                File::from(OwnedFd::from(write)),
            ))
        });
        let Ok(halves) = halves else {
            return;
        };
        if self.conn.is_some() {
            self.detach();
        }
        self.conn = Some(halves);
        push_frame(&mut self.out, Frame::hello(SUPPORTED.0, SUPPORTED.1));
    }

    /// Kill every process this agent started (the connection is gone, and
    /// with it any way to manage them).
    pub fn kill_all(&mut self) {
        for pid in self.procs.keys() {
            sys::kill_group(*pid, libc::SIGKILL);
        }
    }

    fn turn(&mut self) -> Result<(), End> {
        self.pump();
        let mut fds = Vec::new();
        let mut tokens = Vec::new();
        let mut add = |fd: i32, events: i16, token: Token| {
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
            tokens.push(token);
        };
        if let Some((input, output)) = &self.conn {
            if self.out.len() < OUT_MAX {
                add(input.as_raw_fd(), libc::POLLIN, Token::ConnIn);
            }
            if !self.out.is_empty() {
                add(output.as_raw_fd(), libc::POLLOUT, Token::ConnOut);
            }
        }
        if let Some(listener) = &self.listener {
            add(listener.as_raw_fd(), libc::POLLIN, Token::Listen);
        }
        add(self.sigchld.as_raw_fd(), libc::POLLIN, Token::Sigchld);
        if let Some(fd) = self.watches.fd() {
            add(fd, libc::POLLIN, Token::Inotify);
        }
        for (id, st) in &self.streams {
            if let Role::Forward = st.role {
                if let Some((fd, events)) = self.forwards.interest(*id, st.send.available() > 1) {
                    add(fd, events, Token::Forward(*id));
                }
            }
        }
        for (pid, p) in &self.procs {
            if p.wants_output() {
                if let Some(f) = &p.stdout {
                    add(f.as_raw_fd(), libc::POLLIN, Token::Out(*pid, Pipe::Stdout));
                }
                if let Some(f) = &p.stderr {
                    add(f.as_raw_fd(), libc::POLLIN, Token::Out(*pid, Pipe::Stderr));
                }
            }
            if !p.stdin_buf.is_empty() {
                if let Some(fd) = p.stdin_fd() {
                    add(fd, libc::POLLOUT, Token::Stdin(*pid));
                }
            }
        }
        // Wake for the first exited process whose output grace ends, or
        // for a resize to check.
        let now = std::time::Instant::now();
        let grace = self
            .procs
            .values()
            .filter_map(|p| p.next_deadline())
            .min()
            .map(|d| {
                (d.saturating_duration_since(now).as_millis() + 1).min(i32::MAX as u128) as i32
            });
        let timeout = match (self.forwards.poll_timeout(), grace) {
            (-1, g) => g.unwrap_or(-1),
            (f, g) => g.map_or(f, |g| g.min(f)),
        };
        // A large frame in or out left buffers (and the allocator's heap)
        // that large: given back once the connection is quiet, not kept
        // for the sandbox's life.
        let holding = self.decoder.capacity().max(self.out.capacity()) > KEEP_WHEN_QUIET;
        let timeout = match timeout {
            _ if !holding => timeout,
            -1 => QUIET_MS,
            t => t.min(QUIET_MS),
        };
        if sys::poll(&mut fds, timeout).map_err(End::Io)? == 0 && holding {
            self.give_back();
        }
        for (pfd, token) in fds.iter().zip(tokens) {
            if pfd.revents == 0 {
                continue;
            }
            match token {
                Token::ConnIn => self.read_conn()?,
                Token::ConnOut => self.flush()?,
                Token::Listen => self.accept(),
                Token::Sigchld => self.reap(),
                Token::Out(pid, which) => {
                    if let Some(p) = self.procs.get_mut(&pid) {
                        p.read_pipe(which, &mut self.logs);
                    }
                }
                Token::Stdin(pid) => self.write_stdin(pid),
                Token::Inotify => self.watches.read(),
                Token::Forward(id) => {
                    let ready = self.forwards.ready(id, pfd.revents);
                    self.forward_ready(id, ready);
                }
            }
        }
        let now = std::time::Instant::now();
        for p in self.procs.values_mut() {
            p.end_orphaned_output(now, &mut self.logs);
            p.recheck_size(now);
        }
        for (id, event) in self.forwards.expired() {
            self.forward_ready(id, forward::Ready::Failed(event));
        }
        Ok(())
    }

    /// Free the connection's buffers where they hold nothing, and return
    /// the allocator's free memory to the kernel.
    fn give_back(&mut self) {
        self.decoder.release();
        if self.out.is_empty() {
            self.out = Vec::new();
        }
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free memory of glibc's heap.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    fn read_conn(&mut self) -> Result<(), End> {
        let mut buf = vec![0; 64 << 10];
        let Some((input, _)) = &mut self.conn else {
            return Ok(());
        };
        let n = match input.read(&mut buf) {
            Ok(0) => return Err(End::Eof),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(())
            }
            Err(e) => return Err(End::Io(e)),
        };
        self.decoder.push(&buf[..n]);
        loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => self.handle(frame)?,
                Ok(None) => return Ok(()),
                Err(e) => return Err(End::Protocol(e.to_string())),
            }
        }
    }

    fn flush(&mut self) -> Result<(), End> {
        let Some((_, output)) = &mut self.conn else {
            return Ok(());
        };
        while !self.out.is_empty() {
            match output.write(&self.out) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(End::Io(e)),
            }
        }
        Ok(())
    }

    /// Report a connection-level error on an agent-opened NOTICE stream and
    /// give the host up to a second to read it.
    fn notice(&mut self, message: &str) {
        let Some(fd) = self.conn.as_ref().map(|(_, o)| o.as_raw_fd()) else {
            return;
        };
        let id = StreamId(self.next_agent_stream);
        self.next_agent_stream += 2;
        let body = ErrorBody {
            code: ErrorCode::Protocol,
            message: message.to_string(),
        };
        push_frame(
            &mut self.out,
            Frame::open(id, StreamClass::NOTICE, message::encode_header(&body)),
        );
        push_frame(&mut self.out, Frame::close(id));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while !self.out.is_empty() && std::time::Instant::now() < deadline {
            let mut fds = [libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            }];
            if sys::poll(&mut fds, 100).is_err() || self.flush().is_err() {
                return;
            }
        }
    }

    fn reap(&mut self) {
        // Drain the signalfd; the statuses come from waitpid.
        for signal in sys::read_signals(&mut self.sigchld) {
            match signal as libc::c_int {
                libc::SIGUSR2 => self.let_go(),
                libc::SIGUSR1 => self.bind_again(),
                _ => {}
            }
        }
        for (pid, status) in sys::reap_children() {
            if let Some(p) = self.procs.get_mut(&pid) {
                p.status = Some(status);
                p.exited_at = Some(std::time::Instant::now());
                p.end_pty_without_hangup(&mut self.logs);
                if p.attached.is_none() {
                    if p.background {
                        self.exited_unattached.push_back(pid);
                        while self.exited_unattached.len() > MAX_EXITED {
                            if let Some(old) = self.exited_unattached.pop_front() {
                                self.procs.remove(&old);
                            }
                        }
                    } else {
                        self.procs.remove(&pid);
                    }
                }
            }
        }
    }

    fn write_stdin(&mut self, pid: i32) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        let done = p.write_stdin();
        if let Some(id) = p.attached {
            self.release(id, done);
        }
    }

    /// Give `len` received bytes back to the peer as credit when due.
    fn release(&mut self, id: u32, len: usize) {
        if let Some(st) = self.streams.get_mut(&id) {
            if st.recv.release(len).is_ok() {
                if let Some(inc) = st.recv.take_credit() {
                    push_frame(&mut self.out, Frame::credit(StreamId(id), inc));
                }
            }
        }
    }

    fn handle(&mut self, frame: Frame) -> Result<(), End> {
        let id = frame.stream.0;
        match frame.body {
            Body::Hello { min, max } => {
                if self.peer_hello {
                    return Err(End::Protocol("second hello on the connection".into()));
                }
                self.version =
                    negotiate(SUPPORTED, (min, max)).map_err(|e| End::Protocol(e.to_string()))?;
                self.peer_hello = true;
                return Ok(());
            }
            _ if !self.peer_hello => {
                return Err(End::Protocol(format!(
                    "expected hello as the first frame, got {}",
                    frame.kind()
                )))
            }
            Body::Ping(nonce) => push_frame(&mut self.out, Frame::pong(nonce)),
            Body::Pong(_) => {}
            Body::Open { class, header } => self.open(id, class, &header),
            Body::Data(bytes) => self.data(id, &bytes),
            Body::Credit(inc) => {
                if let Some(st) = self.streams.get_mut(&id) {
                    if let Err(e) = st.send.replenish(inc) {
                        self.reset(id, e.reset_code());
                    }
                } else {
                    self.unknown_stream(id);
                }
            }
            Body::Close => self.remote_close(id),
            Body::Reset(_) => {
                if self.streams.contains_key(&id) {
                    self.drop_stream(id);
                }
            }
        }
        Ok(())
    }

    /// A frame for a stream not in the table: late frames for a stream that
    /// already ended are dropped; anything else is a stream-level error.
    fn unknown_stream(&mut self, id: u32) {
        let ended = if id & 1 == 1 {
            id <= self.highest_host_stream
        } else {
            id < self.next_agent_stream
        };
        if !ended {
            push_frame(
                &mut self.out,
                Frame::reset(StreamId(id), ResetCode::PROTOCOL),
            );
        }
    }

    fn reset(&mut self, id: u32, code: ResetCode) {
        push_frame(&mut self.out, Frame::reset(StreamId(id), code));
        self.drop_stream(id);
    }

    /// Forget a stream, cancelling what it was doing.
    fn drop_stream(&mut self, id: u32) {
        let Some(st) = self.streams.remove(&id) else {
            return;
        };
        if let Role::Watch = st.role {
            self.watches.stop(id);
        }
        if let Role::Forward = st.role {
            self.forwards.abort(id);
        }
        if let Role::Logs = st.role {
            self.logs.close(id);
        }
        if let Role::Process { pid } = st.role {
            if let Some(p) = self.procs.get_mut(&pid) {
                p.attached = None;
                p.stdin_buf.clear();
                if !p.background {
                    // A foreground process lives only as long as its client.
                    sys::kill_group(pid, libc::SIGKILL);
                    self.procs.remove(&pid);
                } else if p.status.is_some() {
                    self.exited_unattached.push_back(pid);
                }
            }
        }
    }

    fn open(&mut self, id: u32, class: StreamClass, header: &[u8]) {
        // The host opens odd ids, each higher than the last, so a single
        // number tells a reused id from a new one.
        if id & 1 == 0 || id <= self.highest_host_stream {
            push_frame(
                &mut self.out,
                Frame::reset(StreamId(id), ResetCode::PROTOCOL),
            );
            return;
        }
        self.highest_host_stream = id;
        if self.streams.len() >= MAX_STREAMS {
            push_frame(
                &mut self.out,
                Frame::reset(StreamId(id), ResetCode::REFUSED),
            );
            return;
        }
        let mut st = Stream::new(Role::Idle);
        match class {
            StreamClass::EXEC => match message::decode::<ExecRequest>("exec request", header) {
                Ok(ExecRequest {
                    continued: Some(need),
                    ref argv,
                    ..
                }) => {
                    let need = need as usize;
                    if !argv.is_empty() || need == 0 || need > MAX_EXEC_REQUEST {
                        st.reply(&Event::error(
                            ErrorCode::InvalidRequest,
                            format!(
                                "a continued exec request carries nothing else in its header \
                                 and is 1 to {MAX_EXEC_REQUEST} bytes long (this one: {need})"
                            ),
                        ));
                    } else {
                        st.role = Role::Request {
                            need,
                            buf: Vec::with_capacity(
                                need.min(brig_protocol::INITIAL_WINDOW as usize),
                            ),
                        };
                    }
                }
                Ok(req) => self.exec(id, &mut st, &req),
                Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
            },
            StreamClass::ATTACH => match message::decode::<AttachRequest>("attach request", header)
            {
                Ok(req) => self.attach(id, &mut st, req.pid),
                Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
            },
            StreamClass::FILE_READ => {
                match message::decode::<ReadRequest>("read request", header) {
                    Ok(req) => open_read(&mut st, &req.path),
                    Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
                }
            }
            StreamClass::FILE_WRITE => {
                match message::decode::<WriteRequest>("write request", header) {
                    Ok(req) => open_write(&mut st, &req),
                    Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
                }
            }
            StreamClass::WATCH => match message::decode::<WatchRequest>("watch request", header) {
                Ok(req) => match self.watches.start(id, &req) {
                    Ok(()) => {
                        st.event(&Event::Watching);
                        st.role = Role::Watch;
                    }
                    Err(e) => st.reply(&e),
                },
                Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
            },
            StreamClass::CONNECT => {
                match message::decode::<ConnectRequest>("connect request", header) {
                    Ok(req) => match self.forwards.start(id, &req) {
                        Ok(connected) => {
                            if connected {
                                st.event(&Event::Connected);
                            }
                            st.role = Role::Forward;
                        }
                        Err(e) => st.reply(&e),
                    },
                    Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
                }
            }
            StreamClass::LOGS if self.version >= 4 => {
                match message::decode::<LogsRequest>("logs request", header) {
                    Ok(req) => {
                        let dropped = self.logs.open(id, &req);
                        st.event(&Event::Logging { dropped });
                        st.role = Role::Logs;
                    }
                    Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
                }
            }
            StreamClass::CALL => match message::decode::<Call>("call", header) {
                Ok(call) => {
                    for event in self.call(call) {
                        st.event(&event);
                    }
                    st.finish = true;
                }
                Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
            },
            _ => {
                push_frame(
                    &mut self.out,
                    Frame::reset(StreamId(id), ResetCode::REFUSED),
                );
                return;
            }
        }
        self.streams.insert(id, st);
    }

    /// Start the process of a continued exec request, now whole.
    fn exec_continued(&mut self, id: u32) {
        let Some(mut st) = self.streams.remove(&id) else {
            return;
        };
        let Role::Request { buf, .. } = std::mem::replace(&mut st.role, Role::Idle) else {
            self.streams.insert(id, st);
            return;
        };
        match message::decode::<ExecRequest>("exec request", &buf) {
            Ok(req) if req.continued.is_some() => st.reply(&Event::error(
                ErrorCode::InvalidRequest,
                "a continued exec request cannot continue again",
            )),
            Ok(req) => self.exec(id, &mut st, &req),
            Err(e) => st.reply(&Event::error(ErrorCode::InvalidRequest, e.to_string())),
        }
        self.streams.insert(id, st);
    }

    fn exec(&mut self, id: u32, st: &mut Stream, req: &ExecRequest) {
        let mut proc = match Proc::spawn(req) {
            Ok(p) => p,
            Err(SpawnError::Invalid(m)) => {
                return st.reply(&Event::error(ErrorCode::InvalidRequest, m));
            }
            Err(SpawnError::Io(what, e)) => {
                let mut event = files::io_error("", "", &e);
                if let Event::Error { message, .. } = &mut event {
                    *message = if e.raw_os_error() == Some(libc::E2BIG) {
                        format!(
                            "{what}: its command line and environment are too large for the \
                             kernel (E2BIG): execve takes at most 128 KiB per argument or \
                             variable and about a quarter of the stack limit (2 MiB by \
                             default) for all of them; pass large input through stdin or a file"
                        )
                    } else {
                        format!("{what}: {}", files::describe(&e))
                    };
                }
                return st.reply(&event);
            }
        };
        let pid = proc.pid;
        st.event(&Event::Started { pid });
        if req.background && !req.attached {
            st.finish = true;
        } else {
            proc.attached = Some(id);
            st.role = Role::Process { pid };
        }
        self.procs.insert(pid, proc);
    }

    fn attach(&mut self, id: u32, st: &mut Stream, pid: i32) {
        let Some(p) = self.procs.get_mut(&pid) else {
            return st.reply(&Event::error(
                ErrorCode::NoSuchProcess,
                format!("no process with pid {pid} is managed by this agent"),
            ));
        };
        if p.attached.is_some() {
            return st.reply(&Event::error(
                ErrorCode::Busy,
                format!("process {pid} already has a client attached"),
            ));
        }
        p.attached = Some(id);
        st.event(&Event::Attached {
            pid,
            dropped: p.dropped,
        });
        st.role = Role::Process { pid };
        self.exited_unattached.retain(|x| *x != pid);
    }

    fn call(&mut self, call: Call) -> Vec<Event> {
        let checked = |paths: &[&str]| paths.iter().try_for_each(|p| files::check_path(p));
        match call {
            Call::List {
                path,
                depth,
                xattrs,
            } => match checked(&[&path]) {
                Ok(()) => files::list(&path, depth, xattrs.as_deref()),
                Err(e) => vec![e],
            },
            Call::Stat { path, xattrs } => {
                vec![checked(&[&path])
                    .map_or_else(|e| e, |()| files::stat(&path, xattrs.as_deref()))]
            }
            Call::SetXattrs {
                path,
                xattrs,
                replace_prefix,
            } => vec![checked(&[&path]).map_or_else(
                |e| e,
                |()| files::set_xattrs(&path, &xattrs, replace_prefix.as_deref()),
            )],
            Call::RemoveXattr { path, name } => {
                vec![checked(&[&path]).map_or_else(|e| e, |()| files::remove_xattr(&path, &name))]
            }
            Call::Mkdir { path, parents } => {
                vec![checked(&[&path]).map_or_else(|e| e, |()| files::mkdir(&path, parents))]
            }
            Call::Rename { from, to } => {
                vec![checked(&[&from, &to]).map_or_else(|e| e, |()| files::rename(&from, &to))]
            }
            Call::Remove { path, recursive } => {
                vec![checked(&[&path]).map_or_else(|e| e, |()| files::remove(&path, recursive))]
            }
            Call::ListProcesses => vec![Event::Processes {
                processes: self
                    .procs
                    .values()
                    .map(|p| ProcessInfo {
                        pid: p.pid,
                        argv: p.argv.clone(),
                        pty: p.pty,
                        background: p.background,
                        running: p.status.is_none(),
                        attached: p.attached.is_some(),
                        // A host that speaks version 1 knows no such field.
                        meta: p.meta.clone().filter(|_| self.version >= 2),
                    })
                    .collect(),
            }],
            Call::Signal { pid, sig } => vec![signal(pid, sig)],
        }
    }

    fn data(&mut self, id: u32, bytes: &[u8]) {
        let Some(st) = self.streams.get_mut(&id) else {
            return self.unknown_stream(id);
        };
        if st.remote_closed {
            return self.reset(id, ResetCode::PROTOCOL);
        }
        if let Err(e) = st.recv.receive(bytes.len()) {
            return self.reset(id, e.reset_code());
        }
        let msg = match DataMsg::parse(bytes) {
            Ok(m) => m,
            Err(_) => return self.reset(id, ResetCode::PROTOCOL),
        };
        // Bytes held for later (stdin) are released when written; all else now.
        let mut held = 0;
        // A continued exec request arrived whole.
        let mut complete = false;
        match (msg, &mut st.role) {
            (DataMsg::Control(json), role) => {
                let reply = match message::decode::<Input>("input", json) {
                    Err(e) => Some(Event::error(ErrorCode::InvalidRequest, e.to_string())),
                    Ok(input) => match role {
                        Role::Process { pid } => match self.procs.get_mut(pid) {
                            Some(p) => input_to_process(p, input),
                            None => None,
                        },
                        _ => Some(Event::error(
                            ErrorCode::InvalidRequest,
                            "this stream takes no control messages",
                        )),
                    },
                };
                if let Some(event) = reply {
                    st.event(&event);
                }
            }
            (DataMsg::Bytes { channel, bytes }, Role::Process { pid })
                if channel == CHANNEL_STDOUT =>
            {
                if let Some(p) = self.procs.get_mut(pid) {
                    if p.stdin.is_some() {
                        p.stdin_buf.extend(bytes);
                        held = bytes.len();
                    }
                }
            }
            (DataMsg::Bytes { channel, bytes }, Role::Write { file, written })
                if channel == CHANNEL_STDOUT =>
            {
                // Local files accept writes at disk speed; writing inline
                // keeps nothing buffered.
                match file.write_all(bytes) {
                    Ok(()) => *written += bytes.len() as u64,
                    Err(e) => st.reply(&files::io_error("write", "file", &e)),
                }
            }
            (DataMsg::Bytes { channel, .. }, Role::Forward) if channel == CHANNEL_STDOUT => {
                // Credit comes back as the socket takes them.
                held = bytes.len() - 1;
            }
            (DataMsg::Bytes { channel, bytes }, Role::Request { need, buf })
                if channel == CHANNEL_STDOUT =>
            {
                buf.extend_from_slice(bytes);
                if buf.len() > *need {
                    let over =
                        format!("the exec request was announced as {need} bytes but more arrived");
                    st.role = Role::Idle;
                    st.reply(&Event::error(ErrorCode::InvalidRequest, over));
                } else if buf.len() == *need {
                    complete = true;
                }
            }
            // Bytes for a finished operation, or stderr-channel bytes from
            // the host, are dropped (but still credited).
            (DataMsg::Bytes { .. }, _) => {}
        }
        let len = bytes.len() - held;
        self.release(id, len);
        if complete {
            return self.exec_continued(id);
        }
        if held > 0 && matches!(self.streams.get(&id), Some(s) if matches!(s.role, Role::Forward)) {
            let ready = self.forwards.push(id, &bytes[1..]);
            return self.forward_ready(id, ready);
        }
        if held > 0 {
            if let Some(pid) = self.streams.get(&id).and_then(|s| match s.role {
                Role::Process { pid } => Some(pid),
                _ => None,
            }) {
                self.write_stdin(pid);
            }
        }
    }

    fn remote_close(&mut self, id: u32) {
        let Some(st) = self.streams.get_mut(&id) else {
            return self.unknown_stream(id);
        };
        if st.remote_closed {
            return self.reset(id, ResetCode::PROTOCOL);
        }
        st.remote_closed = true;
        match &mut st.role {
            Role::Process { pid } => {
                let pid = *pid;
                if let Some(p) = self.procs.get_mut(&pid) {
                    p.stdin_eof = true;
                }
                self.write_stdin(pid);
            }
            Role::Write { file, written } => {
                let event = match file.sync_data() {
                    Ok(()) => Event::Written { bytes: *written },
                    Err(e) => files::io_error("write", "file", &e),
                };
                st.reply(&event);
            }
            Role::Watch => {
                // The host's Close ends the watch.
                self.watches.stop(id);
                st.role = Role::Idle;
                st.finish = true;
            }
            Role::Logs => {
                // The host's Close stops following.
                self.logs.close(id);
                st.role = Role::Idle;
                st.finish = true;
            }
            Role::Forward => {
                let ready = self.forwards.shut_write(id);
                return self.forward_ready(id, ready);
            }
            Role::Request { need, buf } => {
                let cut = format!(
                    "the exec request ended after {} of its {need} bytes",
                    buf.len()
                );
                st.role = Role::Idle;
                st.reply(&Event::error(ErrorCode::InvalidRequest, cut));
            }
            Role::Read { .. } | Role::Idle => {}
        }
        self.maybe_forget(id);
    }

    fn maybe_forget(&mut self, id: u32) {
        if matches!(self.streams.get(&id), Some(s) if s.local_closed && s.remote_closed) {
            // A connection is done once the host's last bytes reached it.
            if !self.forwards.drained(id) {
                return;
            }
            self.streams.remove(&id);
            self.forwards.finish(id);
        }
    }

    /// Act on what a `CONNECT` stream's socket did (`forward.rs`).
    fn forward_ready(&mut self, id: u32, ready: forward::Ready) {
        match ready {
            forward::Ready::Written(n) => {
                self.release(id, n);
                self.maybe_forget(id);
            }
            forward::Ready::Connected => {
                if let Some(st) = self.streams.get_mut(&id) {
                    st.event(&Event::Connected);
                }
            }
            forward::Ready::Failed(event) => {
                if let Some(st) = self.streams.get_mut(&id) {
                    st.reply(&event);
                }
            }
            forward::Ready::Broken => self.reset(id, ResetCode::CANCEL),
        }
    }

    /// Move queued control messages, process output and file contents onto
    /// their streams, as far as send windows and the outgoing buffer allow.
    fn pump(&mut self) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if self.out.len() >= OUT_HIGH {
                return;
            }
            let Some(st) = self.streams.get_mut(&id) else {
                continue;
            };
            let sid = StreamId(id);
            let mut broken = false;
            loop {
                // Control messages first: they were queued before anything
                // the role produces below.
                while let Some(msg) = st.ctl.front() {
                    if st.send.consume(msg.len()).is_err() {
                        break;
                    }
                    let msg = st.ctl.pop_front().unwrap_or_default();
                    push_frame(&mut self.out, Frame::data(sid, msg));
                }
                if !st.ctl.is_empty() || self.out.len() >= OUT_HIGH {
                    break;
                }
                let room = (st.send.available() as usize)
                    .saturating_sub(1)
                    .min(MAX_CHUNK);
                match &mut st.role {
                    Role::Process { pid } => {
                        let pid = *pid;
                        let Some(p) = self.procs.get_mut(&pid) else {
                            st.role = Role::Idle;
                            st.finish = true;
                            continue;
                        };
                        if room > 0 {
                            if let Some((channel, chunk)) = p.take_output(room) {
                                let payload = message::bytes_payload(channel, &chunk);
                                // `room` left a byte for the channel tag.
                                let _ = st.send.consume(payload.len());
                                push_frame(&mut self.out, Frame::data(sid, payload));
                                continue;
                            }
                        }
                        if p.is_finished() {
                            let (code, signal) = match p.status {
                                Some(WaitStatus::Exited(c)) => (Some(c), None),
                                Some(WaitStatus::Signaled(s)) => (None, Some(s)),
                                None => (None, None),
                            };
                            self.procs.remove(&pid);
                            st.reply(&Event::Exited { code, signal });
                            continue;
                        }
                        break;
                    }
                    Role::Read { file } => {
                        if room == 0 {
                            break;
                        }
                        let mut buf = vec![0; room.min(FILE_CHUNK)];
                        match file.read(&mut buf) {
                            Ok(0) => {
                                st.role = Role::Idle;
                                st.finish = true;
                            }
                            Ok(n) => {
                                let payload = message::bytes_payload(CHANNEL_STDOUT, &buf[..n]);
                                let _ = st.send.consume(payload.len());
                                push_frame(&mut self.out, Frame::data(sid, payload));
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => st.reply(&files::io_error("read", "file", &e)),
                        }
                    }
                    Role::Watch => match self.watches.pop(id, st.send.available() as usize) {
                        Popped::Payload(payload) => {
                            // `pop` checked that it fits the window.
                            let _ = st.send.consume(payload.len());
                            push_frame(&mut self.out, Frame::data(sid, payload));
                        }
                        Popped::Ended(event) => {
                            self.watches.stop(id);
                            st.reply(&event);
                        }
                        Popped::Nothing => break,
                    },
                    Role::Logs => match self.logs.pull(id, room) {
                        logs::Pulled::Bytes(channel, chunk) => {
                            let payload = message::bytes_payload(channel, &chunk);
                            // `room` left a byte for the channel tag.
                            let _ = st.send.consume(payload.len());
                            push_frame(&mut self.out, Frame::data(sid, payload));
                        }
                        logs::Pulled::Skipped(bytes) => st.event(&Event::Skipped { bytes }),
                        logs::Pulled::Done => {
                            self.logs.close(id);
                            st.role = Role::Idle;
                            st.finish = true;
                        }
                        logs::Pulled::Nothing => break,
                    },
                    Role::Forward => {
                        if st.finish {
                            // The socket's EOF is already on its way.
                            break;
                        }
                        match self.forwards.pull(id, st.send.available() as usize) {
                            Pulled::Payload(payload) => {
                                // `pull` kept within the window.
                                let _ = st.send.consume(payload.len());
                                push_frame(&mut self.out, Frame::data(sid, payload));
                            }
                            // Close this side; the host may still write.
                            Pulled::Eof => st.finish = true,
                            Pulled::Broken => {
                                broken = true;
                                break;
                            }
                            Pulled::Nothing => break,
                        }
                    }
                    Role::Write { .. } | Role::Request { .. } | Role::Idle => break,
                }
            }
            if broken {
                self.reset(id, ResetCode::CANCEL);
                continue;
            }
            if st.finish && st.ctl.is_empty() && !st.local_closed {
                st.local_closed = true;
                push_frame(&mut self.out, Frame::close(sid));
            }
            self.maybe_forget(id);
        }
    }
}

fn input_to_process(p: &mut Proc, input: Input) -> Option<Event> {
    match input {
        Input::Signal { sig } => match signal(p.pid, sig) {
            Event::Done => None,
            err => Some(err),
        },
        Input::Resize { .. } if !p.pty || p.stdout.is_none() => Some(Event::error(
            ErrorCode::InvalidRequest,
            format!("process {} has no pty to resize", p.pid),
        )),
        Input::Resize { rows, cols } => p.resize(rows, cols).err().map(|e| {
            Event::error(
                ErrorCode::Io,
                format!("resize pty: {}", files::describe(&e)),
            )
        }),
    }
}

/// `pid` > 0: that process; `pid` < -1: the process group -`pid` (every
/// process the agent starts leads its own group, so this reaches what it
/// started too); 0 and -1 (the agent's own group, every process) are
/// refused.
fn signal(pid: i32, sig: i32) -> Event {
    if pid == 0 || pid == -1 || pid == i32::MIN {
        return Event::error(ErrorCode::InvalidRequest, format!("invalid pid {pid}"));
    }
    match sys::kill(pid, sig) {
        Ok(()) => Event::Done,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Event::error(
            ErrorCode::NoSuchProcess,
            format!("no process with pid {pid}"),
        ),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Event::error(ErrorCode::InvalidRequest, format!("invalid signal {sig}"))
        }
        Err(e) => Event::error(
            ErrorCode::PermissionDenied,
            format!("signal {sig} to pid {pid}: {}", files::describe(&e)),
        ),
    }
}

/// The file API moves bytes of regular files; a device, FIFO or socket can
/// block or never end, and belongs to a command.
fn not_a_regular_file(op: &str, path: &str) -> Event {
    Event::error(
        ErrorCode::InvalidRequest,
        format!(
            "{op} {path}: not a regular file (a device, FIFO or socket); use a command for it, \
             for example `cat {path}` through exec"
        ),
    )
}

fn open_read(st: &mut Stream, path: &str) {
    if let Err(e) = files::check_path(path) {
        return st.reply(&e);
    }
    // Non-blocking and no controlling terminal: opening a FIFO with no
    // writer, or a terminal, must not stall the agent's single loop (and
    // every other request of the sandbox with it).
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => return st.reply(&files::io_error("read", path, &e)),
    };
    match file.metadata() {
        Ok(m) if m.is_dir() => st.reply(&Event::error(
            ErrorCode::IsADirectory,
            format!("read {path}: is a directory"),
        )),
        Ok(m) if !m.is_file() => st.reply(&not_a_regular_file("read", path)),
        Ok(m) => {
            st.event(&Event::ReadStarted { size: m.len() });
            st.role = Role::Read { file };
        }
        Err(e) => st.reply(&files::io_error("read", path, &e)),
    }
}

fn open_write(st: &mut Stream, req: &WriteRequest) {
    if let Err(e) = files::check_path(&req.path) {
        return st.reply(&e);
    }
    let mut opts = OpenOptions::new();
    opts.write(true)
        .create(true)
        // As in open_read: a FIFO or terminal must not block the loop.
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .mode(req.mode.unwrap_or(0o644))
        .append(req.append)
        // O_TRUNC is ignored for a FIFO or a terminal (POSIX), so a
        // truncating open harms only a regular file, the one meant.
        .truncate(!req.append);
    // Look first, so that a device or FIFO is not even opened...
    if let Ok(m) = std::fs::metadata(&req.path) {
        if !m.is_file() && !m.is_dir() {
            return st.reply(&not_a_regular_file("write", &req.path));
        }
    }
    // ...as the requesting user, if one is named: the kernel decides what
    // that user may open, through whatever links the path holds.
    let opened = match req.owner {
        Some(o) => match sys::FsIdentity::assume(o.uid, o.gid) {
            Ok(_identity) => opts.open(&req.path),
            // No setfsuid here (gVisor): a thread that becomes the user.
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                sys::open_as(o.uid, o.gid, &opts, &req.path)
            }
            Err(e) => {
                return st.reply(&files::io_error(
                    &format!("write as uid {} to", o.uid),
                    &req.path,
                    &e,
                ))
            }
        },
        None => opts.open(&req.path),
    };
    let file = match opened {
        Ok(f) => f,
        Err(e) => return st.reply(&files::io_error("write", &req.path, &e)),
    };
    // ...and judge what was opened, not the name: the sandbox may have
    // swapped the path for a FIFO (held open for reading) or a symlink to
    // a device since the look above.
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(_) => return st.reply(&not_a_regular_file("write", &req.path)),
        Err(e) => return st.reply(&files::io_error("write", &req.path, &e)),
    }
    if let Some(mode) = req.mode {
        // An existing file keeps its mode on open; apply the requested one.
        if let Err(e) = file.set_permissions(std::fs::Permissions::from_mode(mode)) {
            return st.reply(&files::io_error("chmod", &req.path, &e));
        }
    }
    st.role = Role::Write { file, written: 0 };
}
