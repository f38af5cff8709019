//! The wire format: a fixed 12-byte header followed by a bounded payload.
//!
//! ```text
//!  0        1        2        4                8                12
//! +--------+--------+--------+----------------+----------------+-----------
//! | magic  |  kind  | flags  |   stream id    |  payload len   | payload…
//! |  u8    |   u8   | u16 LE |     u32 LE     |     u32 LE     | len bytes
//! +--------+--------+--------+----------------+----------------+-----------
//! ```
//!
//! [`Frame::encode_into`] writes one frame; [`Decoder`] turns a byte stream
//! cut into arbitrary chunks back into frames. Everything the decoder returns
//! has been checked against the per-kind rules below, so code above this
//! layer never sees a malformed frame: a header that breaks a rule is
//! rejected the moment its 12 bytes arrive, before any of its payload is
//! waited for or buffered.
//!
//! Per-kind rules (stream 0 is the connection itself):
//!
//! | kind   | byte | stream  | payload                                        |
//! |--------|------|---------|------------------------------------------------|
//! | Hello  | 0x01 | 0       | `min u16, max u16`, then ignored extension bytes (≤ [`MAX_HELLO`] in all) |
//! | Open   | 0x02 | nonzero | `class u16`, then a class-specific header (≤ [`MAX_OPEN_HEADER`]) |
//! | Data   | 0x03 | nonzero | 0..=[`MAX_PAYLOAD`] bytes, counted against the stream's credit |
//! | Credit | 0x04 | nonzero | `increment u32`                                |
//! | Close  | 0x05 | nonzero | empty                                          |
//! | Reset  | 0x06 | nonzero | `code u32`                                     |
//! | Ping   | 0x07 | 0       | `nonce u64`                                    |
//! | Pong   | 0x08 | 0       | `nonce u64` (echoed from the Ping)             |
//!
//! No flag bits are defined in version 1; all are reserved and must be zero.

use std::fmt;

/// First byte of every frame. It identifies the header layout itself, which
/// cannot be negotiated because it is needed to read the Hello frame; it
/// changes only if the header layout does. Anything else in that position
/// means the peer is not speaking this protocol or the stream lost sync.
pub const MAGIC: u8 = 0xB1;

/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 12;

/// Largest payload any frame may carry (1 MiB). A decoder holds at most one
/// incomplete frame, so this also bounds what a peer can make it buffer
/// without sending a complete frame.
pub const MAX_PAYLOAD: usize = 1 << 20;

/// Largest class-specific header an Open frame may carry (64 KiB). Open is
/// not flow-controlled, so the receiver holds this outside any credit
/// window; it is kept well below [`MAX_PAYLOAD`] for that reason. Bulk
/// input belongs in Data frames on the opened stream.
pub const MAX_OPEN_HEADER: usize = 64 << 10;

/// Largest Hello payload. Hello is read before the peers agree on a version,
/// so its trailing bytes are the one place where a newer peer can add fields
/// that an older one skips; they are bounded so that nothing read before
/// negotiation is large.
pub const MAX_HELLO: usize = 1024;

/// Why bytes could not be decoded into a frame, or a frame could not be
/// encoded. Every variant is a connection-level protocol error: after it the
/// byte stream cannot be trusted to be in sync, so the connection must end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad frame magic 0x{found:02x}, expected 0x{MAGIC:02x}")]
    BadMagic { found: u8 },
    #[error("unknown frame kind 0x{kind:02x}")]
    UnknownKind { kind: u8 },
    #[error("{kind} frame sets reserved flags 0x{flags:04x}")]
    ReservedFlags { kind: FrameKind, flags: u16 },
    #[error("{kind} frame must be sent on stream 0, not stream {stream}")]
    ConnectionFrameOnStream { kind: FrameKind, stream: StreamId },
    #[error("{kind} frame needs a stream id, got stream 0")]
    StreamFrameOnConnection { kind: FrameKind },
    #[error("{kind} frame has a {len}-byte payload, expected {}", describe_len(*.min, *.max))]
    PayloadLength {
        kind: FrameKind,
        len: usize,
        min: usize,
        max: usize,
    },
    #[error("invalid protocol version range {min}..={max}")]
    InvalidVersionRange { min: u16, max: u16 },
    #[error(
        "no common protocol version: this side speaks {}..={}, the peer speaks {}..={}",
        .ours.0, .ours.1, .theirs.0, .theirs.1
    )]
    NoCommonVersion {
        ours: (u16, u16),
        theirs: (u16, u16),
    },
}

fn describe_len(min: usize, max: usize) -> String {
    if min == max {
        format!("exactly {min}")
    } else {
        format!("{min} to {max}")
    }
}

/// What a frame is. The discriminant is the kind byte on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    Hello = 0x01,
    Open = 0x02,
    Data = 0x03,
    Credit = 0x04,
    Close = 0x05,
    Reset = 0x06,
    Ping = 0x07,
    Pong = 0x08,
}

impl FrameKind {
    /// Every kind of version 1, in wire order.
    pub const ALL: [FrameKind; 8] = [
        FrameKind::Hello,
        FrameKind::Open,
        FrameKind::Data,
        FrameKind::Credit,
        FrameKind::Close,
        FrameKind::Reset,
        FrameKind::Ping,
        FrameKind::Pong,
    ];

    /// The kind for a wire byte, or `None` if version 1 defines no such kind.
    pub fn from_byte(byte: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == byte)
    }

    /// Whether frames of this kind concern the whole connection (stream 0)
    /// rather than one stream.
    pub fn is_connection_level(self) -> bool {
        matches!(self, FrameKind::Hello | FrameKind::Ping | FrameKind::Pong)
    }

    /// Smallest and largest payload length a frame of this kind may have.
    /// Checked against the header before the payload is read.
    pub fn payload_bounds(self) -> (usize, usize) {
        match self {
            FrameKind::Hello => (4, MAX_HELLO),
            FrameKind::Open => (2, 2 + MAX_OPEN_HEADER),
            FrameKind::Data => (0, MAX_PAYLOAD),
            FrameKind::Credit | FrameKind::Reset => (4, 4),
            FrameKind::Close => (0, 0),
            FrameKind::Ping | FrameKind::Pong => (8, 8),
        }
    }
}

impl fmt::Display for FrameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FrameKind::Hello => "hello",
            FrameKind::Open => "open",
            FrameKind::Data => "data",
            FrameKind::Credit => "credit",
            FrameKind::Close => "close",
            FrameKind::Reset => "reset",
            FrameKind::Ping => "ping",
            FrameKind::Pong => "pong",
        })
    }
}

/// Names one multiplexed stream. Stream 0 is the connection itself and
/// carries only Hello, Ping and Pong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u32);

impl StreamId {
    /// The connection-level pseudo-stream.
    pub const CONNECTION: StreamId = StreamId(0);
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// What an Open frame asks the peer to start; it decides how the Open
/// header and the stream's Data are interpreted. The message layer defines
/// each class's header. An unknown class is refused per stream (Reset with
/// [`ResetCode::REFUSED`]), not by ending the connection: the framing is
/// still intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamClass(pub u16);

impl StreamClass {
    /// Start a process; the stream carries its stdin, output and exit.
    pub const EXEC: StreamClass = StreamClass(1);
    /// Read a file; the stream carries its contents back.
    pub const FILE_READ: StreamClass = StreamClass(2);
    /// Write a file; the stream carries its contents in.
    pub const FILE_WRITE: StreamClass = StreamClass(3);
    /// Watch a directory; the stream carries change events back.
    pub const WATCH: StreamClass = StreamClass(4);
}

/// Why a stream was aborted. Codes are informational: an unknown code is
/// still a valid Reset, so the set can grow without a version bump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResetCode(pub u32);

impl ResetCode {
    /// The sender no longer wants the stream (a caller went away).
    pub const CANCEL: ResetCode = ResetCode(1);
    /// The stream was not opened: unknown class, bad header, or too many
    /// open streams.
    pub const REFUSED: ResetCode = ResetCode(2);
    /// The peer sent more Data than its credit allowed.
    pub const FLOW_CONTROL: ResetCode = ResetCode(3);
    /// The peer broke a stream rule, such as Data after Close.
    pub const PROTOCOL: ResetCode = ResetCode(4);
    /// The sender failed for its own reasons.
    pub const INTERNAL: ResetCode = ResetCode(5);
}

impl fmt::Display for ResetCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            ResetCode::CANCEL => "cancel",
            ResetCode::REFUSED => "refused",
            ResetCode::FLOW_CONTROL => "flow control",
            ResetCode::PROTOCOL => "protocol",
            ResetCode::INTERNAL => "internal",
            ResetCode(other) => return write!(f, "code {other}"),
        };
        f.write_str(name)
    }
}

/// What a frame carries, by kind. See the module docs for the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// The protocol versions the sender speaks, inclusive.
    Hello { min: u16, max: u16 },
    /// Open a stream of a class with its class-specific header.
    Open { class: StreamClass, header: Vec<u8> },
    /// Stream bytes; their length counts against the sender's credit.
    Data(Vec<u8>),
    /// The receiver may take this many more Data bytes on the stream.
    Credit(u32),
    /// The sender will send no more Data on the stream (half-close).
    Close,
    /// Abort the stream in both directions.
    Reset(ResetCode),
    /// Liveness probe; the peer answers with a Pong carrying the same nonce.
    Ping(u64),
    /// Answer to a Ping.
    Pong(u64),
}

/// One frame: the stream it belongs to and what it carries. Flags are not
/// represented because version 1 defines none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub stream: StreamId,
    pub body: Body,
}

impl Frame {
    pub fn hello(min: u16, max: u16) -> Self {
        Self::connection(Body::Hello { min, max })
    }

    pub fn open(stream: StreamId, class: StreamClass, header: Vec<u8>) -> Self {
        Frame {
            stream,
            body: Body::Open { class, header },
        }
    }

    pub fn data(stream: StreamId, bytes: Vec<u8>) -> Self {
        Frame {
            stream,
            body: Body::Data(bytes),
        }
    }

    pub fn credit(stream: StreamId, increment: u32) -> Self {
        Frame {
            stream,
            body: Body::Credit(increment),
        }
    }

    pub fn close(stream: StreamId) -> Self {
        Frame {
            stream,
            body: Body::Close,
        }
    }

    pub fn reset(stream: StreamId, code: ResetCode) -> Self {
        Frame {
            stream,
            body: Body::Reset(code),
        }
    }

    pub fn ping(nonce: u64) -> Self {
        Self::connection(Body::Ping(nonce))
    }

    pub fn pong(nonce: u64) -> Self {
        Self::connection(Body::Pong(nonce))
    }

    fn connection(body: Body) -> Self {
        Frame {
            stream: StreamId::CONNECTION,
            body,
        }
    }

    pub fn kind(&self) -> FrameKind {
        match self.body {
            Body::Hello { .. } => FrameKind::Hello,
            Body::Open { .. } => FrameKind::Open,
            Body::Data(_) => FrameKind::Data,
            Body::Credit(_) => FrameKind::Credit,
            Body::Close => FrameKind::Close,
            Body::Reset(_) => FrameKind::Reset,
            Body::Ping(_) => FrameKind::Ping,
            Body::Pong(_) => FrameKind::Pong,
        }
    }

    fn payload_len(&self) -> usize {
        match &self.body {
            Body::Hello { .. } | Body::Credit(_) | Body::Reset(_) => 4,
            Body::Open { header, .. } => 2 + header.len(),
            Body::Data(bytes) => bytes.len(),
            Body::Close => 0,
            Body::Ping(_) | Body::Pong(_) => 8,
        }
    }

    /// Bytes this frame takes on the wire.
    pub fn encoded_len(&self) -> usize {
        HEADER_LEN + self.payload_len()
    }

    /// Append the frame's wire form to `out`. A frame the peer's decoder
    /// would reject (a payload over its kind's limit, a stream id that
    /// breaks the kind's rule) is refused here instead, and nothing is
    /// written.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), FrameError> {
        let kind = self.kind();
        let len = self.payload_len();
        check_stream(kind, self.stream)?;
        check_len(kind, len)?;

        out.reserve(HEADER_LEN + len);
        out.push(MAGIC);
        out.push(kind as u8);
        out.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&self.stream.0.to_le_bytes());
        // check_len bounded len by MAX_PAYLOAD, so it fits in a u32.
        out.extend_from_slice(&(len as u32).to_le_bytes());
        match &self.body {
            Body::Hello { min, max } => {
                out.extend_from_slice(&min.to_le_bytes());
                out.extend_from_slice(&max.to_le_bytes());
            }
            Body::Open { class, header } => {
                out.extend_from_slice(&class.0.to_le_bytes());
                out.extend_from_slice(header);
            }
            Body::Data(bytes) => out.extend_from_slice(bytes),
            Body::Credit(n) => out.extend_from_slice(&n.to_le_bytes()),
            Body::Close => {}
            Body::Reset(code) => out.extend_from_slice(&code.0.to_le_bytes()),
            Body::Ping(nonce) | Body::Pong(nonce) => out.extend_from_slice(&nonce.to_le_bytes()),
        }
        Ok(())
    }
}

fn check_stream(kind: FrameKind, stream: StreamId) -> Result<(), FrameError> {
    match (kind.is_connection_level(), stream == StreamId::CONNECTION) {
        (true, false) => Err(FrameError::ConnectionFrameOnStream { kind, stream }),
        (false, true) => Err(FrameError::StreamFrameOnConnection { kind }),
        _ => Ok(()),
    }
}

fn check_len(kind: FrameKind, len: usize) -> Result<(), FrameError> {
    let (min, max) = kind.payload_bounds();
    if len < min || len > max {
        return Err(FrameError::PayloadLength {
            kind,
            len,
            min,
            max,
        });
    }
    Ok(())
}

/// A header that has passed every check that does not need the payload.
#[derive(Debug, Clone, Copy)]
struct Header {
    kind: FrameKind,
    stream: StreamId,
    len: usize,
}

impl Header {
    fn parse(bytes: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        if bytes[0] != MAGIC {
            return Err(FrameError::BadMagic { found: bytes[0] });
        }
        let kind =
            FrameKind::from_byte(bytes[1]).ok_or(FrameError::UnknownKind { kind: bytes[1] })?;
        let flags = u16::from_le_bytes([bytes[2], bytes[3]]);
        if flags != 0 {
            return Err(FrameError::ReservedFlags { kind, flags });
        }
        let stream = StreamId(u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]));
        check_stream(kind, stream)?;
        // A u32 always fits in usize on the 32- and 64-bit targets brig runs on;
        // saturating keeps an exotic 16-bit target on the rejecting side.
        let len = usize::try_from(u32::from_le_bytes([
            bytes[8], bytes[9], bytes[10], bytes[11],
        ]))
        .unwrap_or(usize::MAX);
        check_len(kind, len)?;
        Ok(Header { kind, stream, len })
    }
}

/// Decode a payload whose length already passed `check_len` for its kind,
/// which is what makes the fixed-width reads below infallible.
fn decode_body(kind: FrameKind, payload: &[u8]) -> Body {
    let u16_at = |i: usize| u16::from_le_bytes([payload[i], payload[i + 1]]);
    let u32_at =
        |i: usize| u32::from_le_bytes([payload[i], payload[i + 1], payload[i + 2], payload[i + 3]]);
    match kind {
        // Bytes after `max` are extensions from a newer peer; skip them.
        FrameKind::Hello => Body::Hello {
            min: u16_at(0),
            max: u16_at(2),
        },
        FrameKind::Open => Body::Open {
            class: StreamClass(u16_at(0)),
            header: payload[2..].to_vec(),
        },
        FrameKind::Data => Body::Data(payload.to_vec()),
        FrameKind::Credit => Body::Credit(u32_at(0)),
        FrameKind::Close => Body::Close,
        FrameKind::Reset => Body::Reset(ResetCode(u32_at(0))),
        FrameKind::Ping | FrameKind::Pong => {
            let mut nonce = [0u8; 8];
            nonce.copy_from_slice(&payload[..8]);
            let nonce = u64::from_le_bytes(nonce);
            if kind == FrameKind::Ping {
                Body::Ping(nonce)
            } else {
                Body::Pong(nonce)
            }
        }
    }
}

/// Turns a byte stream, pushed in chunks of any size, into frames.
///
/// Feed it whatever a read returned with [`push`](Decoder::push), then call
/// [`next_frame`](Decoder::next_frame) until it returns `Ok(None)`:
///
/// ```
/// use brig_protocol::{Decoder, Frame, StreamId};
///
/// let mut wire = Vec::new();
/// Frame::data(StreamId(1), b"hi".to_vec()).encode_into(&mut wire).unwrap();
///
/// let mut decoder = Decoder::new();
/// decoder.push(&wire[..5]);
/// assert_eq!(decoder.next_frame().unwrap(), None);
/// decoder.push(&wire[5..]);
/// assert_eq!(decoder.next_frame().unwrap(), Some(Frame::data(StreamId(1), b"hi".to_vec())));
/// ```
///
/// Memory is driven by bytes actually received, never by a declared
/// length: a header is validated as soon as its 12 bytes are present, and
/// nothing is reserved for a payload that has not arrived. Once drained
/// (`next_frame` returned `Ok(None)`) the decoder holds less than one
/// maximal frame, `HEADER_LEN + MAX_PAYLOAD` bytes. The caller bounds the
/// rest by the size of the chunks it pushes.
///
/// The first error is final: the stream is out of sync, so the buffer is
/// dropped, later pushes are ignored, and every later `next_frame` returns
/// the same error.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Offset of the first unconsumed byte in `buf`. Consumed frames are
    /// only shifted out on the next push, so a chunk holding many frames
    /// costs one move rather than one per frame.
    start: usize,
    failed: Option<FrameError>,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Append bytes read from the peer.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_some() || bytes.is_empty() {
            return;
        }
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let needed = self.buf.len() + bytes.len();
        if needed > self.buf.capacity() {
            // Grow geometrically for cheap trickled input, but not past one
            // maximal frame unless this very chunk needs it: plain Vec
            // doubling would turn a 1 MiB frame into a 2 MiB allocation.
            let target = (self.buf.capacity() * 2)
                .min(HEADER_LEN + MAX_PAYLOAD)
                .max(needed);
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the
    /// error that ended the stream.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        let pending = &self.buf[self.start..];
        let Some(header_bytes) = pending.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = match Header::parse(header_bytes) {
            Ok(header) => header,
            Err(err) => return Err(self.fail(err)),
        };
        let Some(payload) = pending.get(HEADER_LEN..HEADER_LEN + header.len) else {
            return Ok(None);
        };
        let body = decode_body(header.kind, payload);
        self.start += HEADER_LEN + header.len;
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
            // A caller that pushed one huge chunk should not pin that much
            // memory for the life of the connection.
            self.buf.shrink_to(HEADER_LEN + MAX_PAYLOAD);
        }
        Ok(Some(Frame {
            stream: header.stream,
            body,
        }))
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The memory the decoder holds now: up to one maximal frame once a
    /// large frame went through, kept while frames keep coming.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Give the buffer's memory back if nothing is buffered (a quiet
    /// connection): the next push starts small again.
    pub fn release(&mut self) {
        if self.buffered() == 0 {
            self.buf = Vec::new();
            self.start = 0;
        }
    }

    /// Whether an error has ended this stream.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    fn fail(&mut self, err: FrameError) -> FrameError {
        self.buf = Vec::new();
        self.start = 0;
        self.failed = Some(err.clone());
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(frames: &[Frame]) -> Vec<u8> {
        let mut out = Vec::new();
        for frame in frames {
            frame.encode_into(&mut out).unwrap();
        }
        out
    }

    #[test]
    fn a_quiet_decoder_gives_its_buffer_back_but_keeps_a_partial_frame() {
        let mut decoder = Decoder::new();
        let big = encode(&[Frame {
            stream: StreamId(3),
            body: Body::Data(vec![7; 600 << 10]),
        }]);
        decoder.push(&big);
        assert!(decoder.next_frame().unwrap().is_some());
        assert!(decoder.capacity() >= 600 << 10, "kept after the frame");
        decoder.release();
        assert_eq!(decoder.capacity(), 0);
        // Half a frame is kept, and completes.
        let small = encode(&[Frame {
            stream: StreamId(3),
            body: Body::Data(b"later".to_vec()),
        }]);
        decoder.push(&small[..5]);
        decoder.release();
        assert_eq!(decoder.buffered(), 5);
        decoder.push(&small[5..]);
        let frame = decoder.next_frame().unwrap().unwrap();
        assert_eq!(frame.body, Body::Data(b"later".to_vec()));
    }

    fn drain(decoder: &mut Decoder, into: &mut Vec<Frame>) {
        while let Some(frame) = decoder.next_frame().unwrap() {
            into.push(frame);
        }
    }

    fn header(kind: u8, flags: u16, stream: u32, len: u32) -> Vec<u8> {
        let mut h = vec![MAGIC, kind];
        h.extend_from_slice(&flags.to_le_bytes());
        h.extend_from_slice(&stream.to_le_bytes());
        h.extend_from_slice(&len.to_le_bytes());
        h
    }

    /// One frame of every kind, including the payload-size extremes.
    fn samples() -> Vec<Frame> {
        vec![
            Frame::hello(1, 3),
            Frame::open(StreamId(1), StreamClass::EXEC, b"argv".to_vec()),
            Frame::open(StreamId(2), StreamClass(0xffff), Vec::new()),
            Frame::open(
                StreamId(3),
                StreamClass::FILE_WRITE,
                vec![7; MAX_OPEN_HEADER],
            ),
            Frame::data(StreamId(1), b"hello, sandbox".to_vec()),
            Frame::data(StreamId(u32::MAX), Vec::new()),
            Frame::data(StreamId(5), (0..MAX_PAYLOAD).map(|i| i as u8).collect()),
            Frame::credit(StreamId(1), u32::MAX),
            Frame::close(StreamId(1)),
            Frame::reset(StreamId(9), ResetCode::FLOW_CONTROL),
            Frame::reset(StreamId(9), ResetCode(0xdead_beef)),
            Frame::ping(0x0102_0304_0506_0708),
            Frame::pong(u64::MAX),
        ]
    }

    #[test]
    fn every_kind_round_trips() {
        let frames = samples();
        let covered: Vec<FrameKind> = frames.iter().map(Frame::kind).collect();
        assert!(FrameKind::ALL.iter().all(|k| covered.contains(k)));

        for frame in frames {
            let wire = encode(std::slice::from_ref(&frame));
            assert_eq!(wire.len(), frame.encoded_len());
            let mut decoder = Decoder::new();
            decoder.push(&wire);
            assert_eq!(decoder.next_frame().unwrap(), Some(frame));
            assert_eq!(decoder.next_frame().unwrap(), None);
            assert_eq!(decoder.buffered(), 0);
        }
    }

    #[test]
    fn header_layout_is_fixed() {
        // Pinned bytes: changing the layout breaks every deployed agent.
        let wire = encode(&[Frame::credit(StreamId(0x0403_0201), 0x0807_0605)]);
        assert_eq!(wire, [0xB1, 0x04, 0, 0, 1, 2, 3, 4, 4, 0, 0, 0, 5, 6, 7, 8]);
        let wire = encode(&[Frame::hello(1, 2)]);
        assert_eq!(wire, [0xB1, 0x01, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 1, 0, 2, 0]);
    }

    #[test]
    fn frames_split_at_every_byte_boundary_decode() {
        let frames = vec![
            Frame::hello(1, 1),
            Frame::open(
                StreamId(1),
                StreamClass::FILE_READ,
                b"/etc/hostname".to_vec(),
            ),
            Frame::data(StreamId(1), b"abc".to_vec()),
            Frame::data(StreamId(1), Vec::new()),
            Frame::credit(StreamId(1), 3),
            Frame::ping(42),
            Frame::close(StreamId(1)),
            Frame::reset(StreamId(3), ResetCode::CANCEL),
        ];
        let wire = encode(&frames);

        for split in 0..=wire.len() {
            let mut decoder = Decoder::new();
            let mut got = Vec::new();
            decoder.push(&wire[..split]);
            drain(&mut decoder, &mut got);
            decoder.push(&wire[split..]);
            drain(&mut decoder, &mut got);
            assert_eq!(got, frames, "split at byte {split}");
            assert_eq!(decoder.buffered(), 0);
        }

        let mut decoder = Decoder::new();
        let mut got = Vec::new();
        for byte in &wire {
            decoder.push(std::slice::from_ref(byte));
            drain(&mut decoder, &mut got);
        }
        assert_eq!(got, frames, "one byte at a time");
    }

    #[test]
    fn hello_skips_extension_bytes_from_newer_peers() {
        let mut wire = header(0x01, 0, 0, 10);
        wire.extend_from_slice(&[1, 0, 7, 0, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]);
        wire.extend_from_slice(&encode(&[Frame::ping(1)]));
        let mut decoder = Decoder::new();
        decoder.push(&wire);
        assert_eq!(decoder.next_frame().unwrap(), Some(Frame::hello(1, 7)));
        assert_eq!(decoder.next_frame().unwrap(), Some(Frame::ping(1)));
    }

    #[test]
    fn oversize_length_is_rejected_from_the_header_alone() {
        for (kind, len) in [
            (0x03, MAX_PAYLOAD as u32 + 1),
            (0x03, u32::MAX),
            (0x02, 3 + MAX_OPEN_HEADER as u32),
        ] {
            let stream = 1;
            let mut decoder = Decoder::new();
            decoder.push(&header(kind, 0, stream, len));
            let err = decoder.next_frame().unwrap_err();
            assert!(
                matches!(err, FrameError::PayloadLength { len: l, .. } if l == len as usize),
                "{err}"
            );
            assert_eq!(decoder.buffered(), 0);
            assert_eq!(decoder.buf.capacity(), 0, "failed decoder keeps no buffer");
        }
    }

    #[test]
    fn maximal_frame_is_buffered_in_one_frame_of_memory() {
        let wire = encode(&[Frame::data(StreamId(1), vec![1; MAX_PAYLOAD])]);
        let mut decoder = Decoder::new();
        for chunk in wire.chunks(4096) {
            decoder.push(chunk);
            assert!(decoder.buf.capacity() <= HEADER_LEN + MAX_PAYLOAD);
            if decoder.buffered() < wire.len() {
                assert_eq!(decoder.next_frame().unwrap(), None);
            }
        }
        assert_eq!(
            decoder.next_frame().unwrap().unwrap().kind(),
            FrameKind::Data
        );
    }

    #[test]
    fn fixed_size_payloads_must_have_their_size() {
        for (kind, len) in [
            (0x04, 3),
            (0x04, 5),
            (0x05, 1),
            (0x06, 0),
            (0x07, 9),
            (0x08, 7),
            (0x01, 3),
            (0x02, 1),
        ] {
            let stream = if matches!(kind, 0x01 | 0x07 | 0x08) {
                0
            } else {
                1
            };
            let mut decoder = Decoder::new();
            decoder.push(&header(kind, 0, stream, len));
            let err = decoder.next_frame().unwrap_err();
            assert!(
                matches!(err, FrameError::PayloadLength { .. }),
                "kind {kind:#x} len {len}: {err}"
            );
        }
        let err = {
            let mut decoder = Decoder::new();
            decoder.push(&header(0x01, 0, 0, MAX_HELLO as u32 + 1));
            decoder.next_frame().unwrap_err()
        };
        assert_eq!(
            err.to_string(),
            "hello frame has a 1025-byte payload, expected 4 to 1024"
        );
    }

    #[test]
    fn garbage_headers_are_rejected_with_the_offending_value() {
        let cases: [(Vec<u8>, &str); 5] = [
            (
                vec![0x47, 0x45, 0x54, 0x20, 0, 0, 0, 0, 0, 0, 0, 0],
                "bad frame magic 0x47, expected 0xb1",
            ),
            (header(0x00, 0, 1, 0), "unknown frame kind 0x00"),
            (header(0x09, 0, 1, 0), "unknown frame kind 0x09"),
            (
                header(0x05, 0x8000, 1, 0),
                "close frame sets reserved flags 0x8000",
            ),
            (
                header(0x07, 0, 3, 8),
                "ping frame must be sent on stream 0, not stream 3",
            ),
        ];
        for (bytes, message) in cases {
            let mut decoder = Decoder::new();
            decoder.push(&bytes);
            assert_eq!(decoder.next_frame().unwrap_err().to_string(), message);
        }
        let mut decoder = Decoder::new();
        decoder.push(&header(0x03, 0, 0, 0));
        assert_eq!(
            decoder.next_frame().unwrap_err(),
            FrameError::StreamFrameOnConnection {
                kind: FrameKind::Data
            }
        );
    }

    #[test]
    fn first_error_is_final() {
        let mut decoder = Decoder::new();
        decoder.push(&[0u8; HEADER_LEN]);
        let err = decoder.next_frame().unwrap_err();
        assert!(decoder.is_failed());
        decoder.push(&encode(&[Frame::ping(1)]));
        assert_eq!(decoder.buffered(), 0, "bytes after an error are dropped");
        assert_eq!(decoder.next_frame().unwrap_err(), err);
    }

    #[test]
    fn encoder_refuses_what_a_decoder_would_reject() {
        let mut out = vec![0xee];
        let too_big = Frame::data(StreamId(1), vec![0; MAX_PAYLOAD + 1]);
        assert!(matches!(
            too_big.encode_into(&mut out),
            Err(FrameError::PayloadLength { .. })
        ));
        let big_open = Frame::open(StreamId(1), StreamClass::EXEC, vec![0; MAX_OPEN_HEADER + 1]);
        assert!(big_open.encode_into(&mut out).is_err());
        let on_zero = Frame::close(StreamId::CONNECTION);
        assert_eq!(
            on_zero.encode_into(&mut out),
            Err(FrameError::StreamFrameOnConnection {
                kind: FrameKind::Close
            })
        );
        let ping_on_stream = Frame {
            stream: StreamId(4),
            body: Body::Ping(0),
        };
        assert!(ping_on_stream.encode_into(&mut out).is_err());
        assert_eq!(out, [0xee], "nothing is written on error");
    }

    #[test]
    fn reset_codes_display_by_name() {
        assert_eq!(ResetCode::REFUSED.to_string(), "refused");
        assert_eq!(ResetCode(77).to_string(), "code 77");
    }
}
