//! Port forwarding (`CONNECT` streams): a TCP connection made inside the
//! sandbox's network namespace, relayed over the stream in both directions.
//!
//! The sandbox's network is loopback only, so the host cannot reach a
//! server listening there; the agent can, and the stream reuses the
//! protocol's framing and credit (no side channel, so the vm tier's
//! virtio-serial link carries it unchanged).
//!
//! Everything happens in the session's single poll loop, nothing blocks:
//!
//! - **Connect** is non-blocking: the socket is polled for `POLLOUT` until
//!   the kernel has an answer (`SO_ERROR`); then `connected`, or
//!   `error{connection_refused}` when nothing listens on the port, or an
//!   `io` error after [`CONNECT_TIMEOUT`] (a server whose accept queue is
//!   full: the kernel drops the SYN and would retry for minutes).
//! - **Socket → host** is pulled, like a file read: the socket is polled
//!   for `POLLIN` only while the stream has send credit, and the session's
//!   pump reads at most what the window allows. A host that stops reading
//!   stops the agent reading, and the sender inside the sandbox blocks on
//!   a full socket buffer. EOF is the agent's Close.
//! - **Host → socket**: Data is held until the socket takes it, and credit
//!   goes back only then, so at most one window (256 KiB) is held per
//!   stream. The host's Close is `shutdown(SHUT_WR)` once the held bytes
//!   are written; its Reset is an abort (RST, via `SO_LINGER` 0).
//! - A broken connection (`ECONNRESET`, `EPIPE`) resets the stream.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use brig_protocol::message::{self, ConnectRequest, ErrorCode, Event, CHANNEL_STDOUT, MAX_CHUNK};

use crate::files;
use crate::sys;

/// Bytes read from a socket per Data frame at most.
const READ_CHUNK: usize = 64 << 10;
/// How long a connect may take. On loopback an answer is immediate unless
/// the server's accept queue is full (the kernel then drops the SYN and
/// retries for minutes).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
struct Conn {
    sock: TcpStream,
    target: SocketAddr,
    /// The connect has not completed yet.
    connecting: bool,
    /// When a connect still in progress fails.
    deadline: Instant,
    /// Poll said the socket has something to read (bytes, EOF or an
    /// error); cleared when a read would block.
    readable: bool,
    /// The socket's EOF was read (and reported as the agent's Close).
    read_eof: bool,
    /// Host bytes the socket has not taken yet (≤ one receive window).
    to_sock: Vec<u8>,
    /// The host closed its side: shut the socket's write side once
    /// `to_sock` is empty.
    write_eof: bool,
    write_shut: bool,
}

/// What a socket event meant for its stream.
#[derive(Debug)]
pub enum Ready {
    /// Nothing the session must act on beyond releasing `n` bytes of
    /// credit (host bytes the socket took).
    Written(usize),
    /// The connection is established: send `connected`.
    Connected,
    /// The connect failed: reply with this error and close.
    Failed(Event),
    /// The connection broke: reset the stream.
    Broken,
}

/// What the pump can send for a stream.
#[derive(Debug)]
pub enum Pulled {
    /// A Data payload (channel 1), within the room given.
    Payload(Vec<u8>),
    /// The socket's EOF: close the agent's side of the stream.
    Eof,
    /// The connection broke: reset the stream.
    Broken,
    Nothing,
}

/// Every `CONNECT` stream of the session, by stream id.
#[derive(Debug, Default)]
pub struct Forwards {
    conns: BTreeMap<u32, Conn>,
}

impl Forwards {
    /// Start connecting for stream `id`. `Ok(true)`: already connected;
    /// `Ok(false)`: in progress (poll); `Err`: the reply to send.
    pub fn start(&mut self, id: u32, req: &ConnectRequest) -> Result<bool, Event> {
        let ip: IpAddr = match req.host.as_deref() {
            None | Some("127.0.0.1") => Ipv4Addr::LOCALHOST.into(),
            Some("::1") => Ipv6Addr::LOCALHOST.into(),
            Some(other) => {
                return Err(Event::error(
                    ErrorCode::InvalidRequest,
                    format!(
                        "connect {other}: only 127.0.0.1 and ::1 can be reached inside a sandbox"
                    ),
                ))
            }
        };
        if req.port == 0 {
            return Err(Event::error(
                ErrorCode::InvalidRequest,
                "connect: port 0 is not a port to connect to",
            ));
        }
        let target = SocketAddr::new(ip, req.port);
        let (sock, connected) = sys::tcp_connect(&target).map_err(|e| connect_error(target, &e))?;
        // Small writes (an HTTP request line, a WebSocket frame) go out at
        // once; the host already batches into frames.
        let _ = sock.set_nodelay(true);
        self.conns.insert(
            id,
            Conn {
                sock,
                target,
                connecting: !connected,
                deadline: Instant::now() + CONNECT_TIMEOUT,
                readable: false,
                read_eof: false,
                to_sock: Vec::new(),
                write_eof: false,
                write_shut: false,
            },
        );
        Ok(connected)
    }

    /// The descriptor and poll events stream `id` waits for, if any.
    /// `room`: the stream has send credit for at least one byte.
    pub fn interest(&self, id: u32, room: bool) -> Option<(RawFd, i16)> {
        let c = self.conns.get(&id)?;
        let mut events = 0;
        if c.connecting {
            events |= libc::POLLOUT;
        } else {
            if room && !c.readable && !c.read_eof {
                events |= libc::POLLIN;
            }
            if !c.to_sock.is_empty() || (c.write_eof && !c.write_shut) {
                events |= libc::POLLOUT;
            }
        }
        // An fd polled for nothing would still report POLLHUP and spin.
        (events != 0).then_some((c.sock.as_raw_fd(), events))
    }

    /// How long poll may sleep before a connect times out (-1: no
    /// connect in progress).
    pub fn poll_timeout(&self) -> i32 {
        let now = Instant::now();
        self.conns
            .values()
            .filter(|c| c.connecting)
            .map(|c| c.deadline.saturating_duration_since(now).as_millis() + 1)
            .min()
            .map_or(-1, |ms| ms.min(i32::MAX as u128) as i32)
    }

    /// Connects past their deadline, removed, with the reply for each.
    pub fn expired(&mut self) -> Vec<(u32, Event)> {
        let now = Instant::now();
        let ids: Vec<u32> = self
            .conns
            .iter()
            .filter(|(_, c)| c.connecting && c.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        ids.into_iter()
            .filter_map(|id| {
                let c = self.conns.remove(&id)?;
                let event = Event::error(
                    ErrorCode::Io,
                    format!(
                        "connect {}: no answer within {}s (is the server's accept queue full?)",
                        c.target,
                        CONNECT_TIMEOUT.as_secs()
                    ),
                );
                Some((id, event))
            })
            .collect()
    }

    /// Poll reported `revents` on stream `id`'s socket.
    pub fn ready(&mut self, id: u32, revents: i16) -> Ready {
        let Some(c) = self.conns.get_mut(&id) else {
            return Ready::Written(0);
        };
        if c.connecting {
            c.connecting = false;
            return match c.sock.take_error() {
                Ok(None) => Ready::Connected,
                Ok(Some(e)) | Err(e) => {
                    let event = connect_error(c.target, &e);
                    self.conns.remove(&id);
                    Ready::Failed(event)
                }
            };
        }
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            c.readable = true;
        }
        if revents & (libc::POLLOUT | libc::POLLERR) != 0 {
            return self.flush(id);
        }
        Ready::Written(0)
    }

    /// Host bytes for the socket; written as far as it takes them now.
    /// The caller releases credit for what [`Ready::Written`] says.
    pub fn push(&mut self, id: u32, bytes: &[u8]) -> Ready {
        match self.conns.get_mut(&id) {
            Some(c) => {
                c.to_sock.extend_from_slice(bytes);
                self.flush(id)
            }
            None => Ready::Written(0),
        }
    }

    /// The host closed its side: shut the socket's write side once the
    /// held bytes are out.
    pub fn shut_write(&mut self, id: u32) -> Ready {
        match self.conns.get_mut(&id) {
            Some(c) => {
                c.write_eof = true;
                self.flush(id)
            }
            None => Ready::Written(0),
        }
    }

    /// Write held bytes; shut the write side when they are all out and the
    /// host has closed.
    fn flush(&mut self, id: u32) -> Ready {
        let Some(c) = self.conns.get_mut(&id) else {
            return Ready::Written(0);
        };
        if c.connecting {
            return Ready::Written(0);
        }
        let mut written = 0;
        while written < c.to_sock.len() {
            match c.sock.write(&c.to_sock[written..]) {
                Ok(0) => return Ready::Broken,
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Ready::Broken,
            }
        }
        c.to_sock.drain(..written);
        if c.write_eof && c.to_sock.is_empty() && !c.write_shut {
            c.write_shut = true;
            // ENOTCONN (the peer already reset) shows up on the next read.
            let _ = c.sock.shutdown(Shutdown::Write);
        }
        Ready::Written(written)
    }

    /// Read what the socket has, at most `window` payload bytes (channel
    /// byte included).
    pub fn pull(&mut self, id: u32, window: usize) -> Pulled {
        let Some(c) = self.conns.get_mut(&id) else {
            return Pulled::Nothing;
        };
        let room = window.saturating_sub(1).min(MAX_CHUNK).min(READ_CHUNK);
        if c.connecting || c.read_eof || !c.readable || room == 0 {
            return Pulled::Nothing;
        }
        let mut buf = vec![0; room];
        loop {
            return match c.sock.read(&mut buf) {
                Ok(0) => {
                    c.read_eof = true;
                    Pulled::Eof
                }
                Ok(n) => Pulled::Payload(message::bytes_payload(CHANNEL_STDOUT, &buf[..n])),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    c.readable = false;
                    Pulled::Nothing
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => Pulled::Broken,
            };
        }
    }

    /// Whether every host byte reached the socket (the stream may be
    /// forgotten once both sides closed).
    pub fn drained(&self, id: u32) -> bool {
        self.conns.get(&id).is_none_or(|c| c.to_sock.is_empty())
    }

    /// Both sides closed: close the socket.
    pub fn finish(&mut self, id: u32) {
        self.conns.remove(&id);
    }

    /// Reset: abort the connection (the peer sees RST, not EOF).
    pub fn abort(&mut self, id: u32) {
        if let Some(c) = self.conns.remove(&id) {
            sys::set_linger_zero(&c.sock);
        }
    }
}

fn connect_error(target: SocketAddr, e: &io::Error) -> Event {
    let code = match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => ErrorCode::ConnectionRefused,
        _ => ErrorCode::Io,
    };
    Event::error(code, format!("connect {target}: {}", files::describe(e)))
}
