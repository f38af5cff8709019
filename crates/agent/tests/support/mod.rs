//! A small protocol client that drives the real `brig-agent` binary over a
//! socketpair, the way the host will.
#![allow(dead_code)] // each test file uses a different part

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use brig_protocol::message::{
    self, DataMsg, Event, CHANNEL_CONTROL, CHANNEL_STDERR, CHANNEL_STDOUT,
};
use brig_protocol::{
    Body, Decoder, Frame, RecvWindow, ResetCode, SendWindow, StreamClass, StreamId, SUPPORTED,
};

/// What arrived on a stream, with Data already split by channel.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Event(Event),
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Close,
    Reset(ResetCode),
}

/// Everything a stream delivered until the agent closed or reset it.
#[derive(Debug, Default)]
pub struct Outcome {
    pub events: Vec<Event>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub reset: Option<ResetCode>,
}

impl Outcome {
    pub fn exited(&self) -> Option<(Option<i32>, Option<i32>)> {
        self.events.iter().find_map(|e| match e {
            Event::Exited { code, signal } => Some((*code, *signal)),
            _ => None,
        })
    }

    pub fn error(&self) -> Option<(message::ErrorCode, String)> {
        self.events.iter().find_map(|e| match e {
            Event::Error { code, message } => Some((*code, message.clone())),
            _ => None,
        })
    }
}

#[derive(Debug)]
pub struct Agent {
    /// The agent process when the test started it on the host; `None`
    /// when it runs in a sandbox the test holds.
    pub child: Option<Child>,
    sock: UnixStream,
    decoder: Decoder,
    frames: HashMap<u32, VecDeque<Frame>>,
    conn: VecDeque<Frame>,
    recv: HashMap<u32, RecvWindow>,
    send: HashMap<u32, SendWindow>,
    next_id: u32,
    pub eof: bool,
}

impl Agent {
    /// Start the agent with `--stdio` and exchange Hellos.
    pub fn start() -> Agent {
        let mut agent = Agent::spawn_raw();
        agent.send(Frame::hello(SUPPORTED.0, SUPPORTED.1));
        agent.expect_hello();
        agent
    }

    /// Start the agent without any handshake.
    pub fn spawn_raw() -> Agent {
        let (ours, theirs) = UnixStream::pair().expect("socketpair");
        let theirs = OwnedFd::from(theirs);
        let child = Command::new(env!("CARGO_BIN_EXE_brig-agent"))
            .arg("--stdio")
            .stdin(Stdio::from(theirs.try_clone().unwrap()))
            .stdout(Stdio::from(theirs))
            .spawn()
            .expect("start brig-agent");
        Agent::over(ours, Some(child))
    }

    /// A client on `sock`, whose other end an agent speaks on (started by
    /// the caller, e.g. in a sandbox). Exchanges Hellos.
    pub fn connect(sock: UnixStream) -> Agent {
        let mut agent = Agent::over(sock, None);
        agent.send(Frame::hello(SUPPORTED.0, SUPPORTED.1));
        agent.expect_hello();
        agent
    }

    fn over(ours: UnixStream, child: Option<Child>) -> Agent {
        ours.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Agent {
            child,
            sock: ours,
            decoder: Decoder::new(),
            frames: HashMap::new(),
            conn: VecDeque::new(),
            recv: HashMap::new(),
            send: HashMap::new(),
            next_id: 1,
            eof: false,
        }
    }

    pub fn expect_hello(&mut self) {
        let f = self.conn_frame().expect("agent sent nothing");
        assert_eq!(
            f.body,
            Body::Hello {
                min: SUPPORTED.0,
                max: SUPPORTED.1
            }
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("agent started on the host").id()
    }

    pub fn send(&mut self, frame: Frame) {
        let mut buf = Vec::new();
        frame.encode_into(&mut buf).unwrap();
        self.send_raw(&buf);
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("write to agent");
    }

    /// Read one frame from the socket into the per-stream queues. Credit is
    /// applied at once, both ways: credit the agent grants us is added to
    /// our send windows, and Data the agent sends is credited back as soon
    /// as it is in our queue (the queue is the application's buffer). The
    /// latter matters: a test that writes a lot of stdin before reading
    /// stdout would otherwise deadlock exactly as a shell pipeline does.
    /// Reading slowly still throttles the agent, through the socket.
    /// Returns false at EOF.
    fn pull(&mut self) -> bool {
        loop {
            match self.decoder.next_frame().expect("agent sent a bad frame") {
                Some(f) => {
                    match (&f.body, f.stream.0) {
                        (Body::Credit(n), id) => {
                            self.send.entry(id).or_default().replenish(*n).unwrap();
                        }
                        (_, 0) => self.conn.push_back(f),
                        (Body::Data(bytes), id) => {
                            let len = bytes.len();
                            let w = self.recv.entry(id).or_default();
                            w.receive(len).expect("agent exceeded our window");
                            w.release(len).unwrap();
                            if let Some(inc) = w.take_credit() {
                                self.send(Frame::credit(StreamId(id), inc));
                            }
                            self.frames.entry(id).or_default().push_back(f);
                        }
                        (_, id) => self.frames.entry(id).or_default().push_back(f),
                    }
                    return true;
                }
                None => {
                    let mut buf = [0u8; 65536];
                    let n = match self.sock.read(&mut buf) {
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => 0,
                        Err(e) => panic!("timed out or failed reading from the agent: {e}"),
                    };
                    if n == 0 {
                        self.eof = true;
                        return false;
                    }
                    self.decoder.push(&buf[..n]);
                }
            }
        }
    }

    pub fn conn_frame(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.conn.pop_front() {
                return Some(f);
            }
            if !self.pull() {
                return None;
            }
        }
    }

    /// The next raw frame on a stream (Credit excluded), or None at EOF.
    pub fn frame_on(&mut self, id: StreamId) -> Option<Frame> {
        loop {
            if let Some(f) = self.frames.get_mut(&id.0).and_then(|q| q.pop_front()) {
                return Some(f);
            }
            if !self.pull() {
                return None;
            }
        }
    }

    pub fn open<T: serde::Serialize>(&mut self, class: StreamClass, header: &T) -> StreamId {
        let id = StreamId(self.next_id);
        self.next_id += 2;
        self.send(Frame::open(id, class, message::encode_header(header)));
        id
    }

    /// A raw Open with any header bytes.
    pub fn open_raw(&mut self, class: StreamClass, header: &[u8]) -> StreamId {
        let id = StreamId(self.next_id);
        self.next_id += 2;
        self.send(Frame::open(id, class, header.to_vec()));
        id
    }

    /// The next item on a stream (its Data was credited when it arrived).
    pub fn item(&mut self, id: StreamId) -> Item {
        let f = self
            .frame_on(id)
            .expect("connection closed before the stream ended");
        match f.body {
            Body::Data(bytes) => {
                match DataMsg::parse(&bytes).expect("agent sent an untagged payload") {
                    DataMsg::Control(json) => Item::Event(message::decode("event", json).unwrap()),
                    DataMsg::Bytes {
                        channel: CHANNEL_STDERR,
                        bytes,
                    } => Item::Stderr(bytes.to_vec()),
                    DataMsg::Bytes { bytes, .. } => Item::Stdout(bytes.to_vec()),
                }
            }
            Body::Close => Item::Close,
            Body::Reset(code) => Item::Reset(code),
            other => panic!("unexpected frame on stream {id}: {other:?}"),
        }
    }

    /// Read a stream until the agent closes or resets it.
    pub fn collect(&mut self, id: StreamId) -> Outcome {
        let mut out = Outcome::default();
        loop {
            match self.item(id) {
                Item::Event(e) => out.events.push(e),
                Item::Stdout(b) => out.stdout.extend(b),
                Item::Stderr(b) => out.stderr.extend(b),
                Item::Close => return out,
                Item::Reset(code) => {
                    out.reset = Some(code);
                    return out;
                }
            }
        }
    }

    /// Send bulk bytes on channel 1, respecting the stream's send window.
    pub fn send_bytes(&mut self, id: StreamId, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let avail = self.send.entry(id.0).or_default().available() as usize;
            if avail < 2 {
                assert!(self.pull(), "connection closed while waiting for credit");
                continue;
            }
            let n = (avail - 1).min(bytes.len()).min(message::MAX_CHUNK);
            let payload = message::bytes_payload(CHANNEL_STDOUT, &bytes[..n]);
            self.send
                .get_mut(&id.0)
                .unwrap()
                .consume(payload.len())
                .unwrap();
            self.send(Frame::data(id, payload));
            bytes = &bytes[n..];
        }
    }

    pub fn send_control<T: serde::Serialize>(&mut self, id: StreamId, msg: &T) {
        let payload = message::control_payload(msg);
        assert_eq!(payload[0], CHANNEL_CONTROL);
        self.send
            .entry(id.0)
            .or_default()
            .consume(payload.len())
            .unwrap();
        self.send(Frame::data(id, payload));
    }

    pub fn close(&mut self, id: StreamId) {
        self.send(Frame::close(id));
    }

    /// Run a call and return its events.
    pub fn call(&mut self, call: &message::Call) -> Outcome {
        let id = self.open(StreamClass::CALL, call);
        self.close(id);
        self.collect(id)
    }

    /// Close the connection in both directions, as a dying host would.
    pub fn hang_up(&mut self) {
        self.sock.shutdown(std::net::Shutdown::Both).unwrap();
    }

    /// Wait for the agent to exit, at most `secs` seconds.
    pub fn wait_exit(&mut self, secs: u64) -> std::process::ExitStatus {
        for _ in 0..secs * 20 {
            let child = self.child.as_mut().expect("agent started on the host");
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("agent did not exit within {secs}s");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// VmRSS of a process in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

pub fn exec(argv: &[&str]) -> message::ExecRequest {
    message::ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}
