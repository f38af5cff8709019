//! What frame payloads mean: the typed messages between brig and the agent.
//!
//! Two encodings, chosen per kind of content:
//!
//! - **Control messages are JSON** (serde_json): Open headers
//!   ([`ExecRequest`], [`AttachRequest`], [`ReadRequest`], [`WriteRequest`],
//!   [`WatchRequest`], [`Call`]), host-to-agent inputs ([`Input`]) and
//!   agent-to-host events ([`Event`]). They are small, rare and worth being
//!   readable in a hex dump.
//! - **Bulk bytes are raw**: stdin, stdout, stderr and file contents travel
//!   as Data payloads, never JSON-encoded.
//!
//! ## One stream per operation, a channel byte per Data frame
//!
//! Every operation is one stream, opened by the host with an odd id and a
//! [`StreamClass`] naming the operation; the Open header is the request as
//! JSON. Every Data payload on every stream, in both directions, starts with
//! one channel byte ([`DataMsg`]):
//!
//! | channel | meaning |
//! |--------:|---------|
//! | [`CHANNEL_CONTROL`] `0` | one JSON message ([`Event`] from the agent, [`Input`] from the host) |
//! | [`CHANNEL_STDOUT`] `1` | bytes: stdout (or PTY output), file contents, stdin |
//! | [`CHANNEL_STDERR`] `2` | bytes: stderr of a process without a PTY |
//!
//! Why multiplex stdout, stderr and events on one stream instead of opening
//! a stream per channel: the agent's events are then ordered with the
//! output for free (`exited` always arrives after the process's last byte of
//! output, with no cross-stream sequencing); one Open, one Close and one
//! Reset cover the whole operation, so cancelling or losing a client cleans
//! up one stream-table entry; and the agent never has to allocate even
//! stream ids for replies. The cost is one byte per Data frame and a shared
//! credit window for stdout and stderr: a host that stops reading stderr
//! also stops stdout. The host drains both into the same place anyway, so
//! that head-of-line coupling buys nothing to avoid.
//!
//! ## Streams per operation
//!
//! | class | header | host → agent | agent → host |
//! |-------|--------|--------------|--------------|
//! | `EXEC` 1 | [`ExecRequest`] | channel 1: stdin; Close: end of stdin; control: [`Input::Signal`], [`Input::Resize`] | `started`, then channel 1/2 output, then `exited`, Close. Background: `started`, Close (with `attached`: as foreground, but a Reset detaches) |
//! | `ATTACH` 6 | [`AttachRequest`] | as `EXEC` | `attached` (with bytes dropped from the buffer), buffered then live output, `exited`, Close |
//! | `FILE_READ` 2 | [`ReadRequest`] | Close | `read_started{size}`, channel 1: contents, Close |
//! | `FILE_WRITE` 3 | [`WriteRequest`] | channel 1: contents; Close: end of file | `written{bytes}` after the host's Close, Close |
//! | `WATCH` 4 | [`WatchRequest`] | Close: stop watching | `watching`, then one [`Event::Change`] or [`Event::Overflow`] per Data frame (control channel) until the host's Close or Reset, then Close |
//! | `CALL` 5 | [`Call`] | Close | one typed reply (`entries`… `done`, `stat`, `processes`, `done`), Close. `stat`/`list` with `xattrs: PREFIX` also report extended attributes; `set_xattrs`, `remove_xattr` change them |
//! | `LOGS` 8 | [`LogsRequest`] | Close: stop following | `logging{dropped}`, then channel 1/2: the sandbox's background output from the agent's log (skipped spans reported as `skipped{bytes}`); Close once caught up, or with `follow` live output until the host's Close (version 4) |
//! | `CONNECT` 7 | [`ConnectRequest`] | channel 1: bytes to the socket; Close: half-close (`shutdown(SHUT_WR)` once the bytes are written); Reset: abort (RST) | `connected`, then channel 1: bytes from the socket; Close at its EOF; Reset if the connection breaks. Refused: `error{connection_refused}`, Close |
//!
//! ## Port forwarding
//!
//! A `CONNECT` stream is a TCP connection the agent makes inside the
//! sandbox's network namespace (loopback only), so the host can reach a
//! server listening there without a side channel: the same stream serves
//! the vm tier over virtio-serial. After [`Event::Connected`] the stream is
//! a byte pipe in both directions, each direction closed on its own: the
//! agent's Close is the socket's EOF, the host may go on writing after it
//! (and the agent reading after the host's Close), until both sides closed.
//! Flow control is the stream's credit: the agent reads from the socket
//! only what the host's window allows, and returns credit for host bytes
//! only once the socket took them. Nothing listening on the port is
//! [`ErrorCode::ConnectionRefused`].
//!
//! ## Watch events
//!
//! A `WATCH` stream reports changes in one directory (with `recursive`, in
//! its whole subtree, including directories created later). The first
//! message, [`Event::Watching`], says the kernel watches are in place:
//! every change after it is reported (or covered by an `overflow`). Then
//! each change is one control message:
//!
//! ```text
//! {"type":"change","kind":"create","name":"sub/a.txt","file_type":"file"}
//! {"type":"overflow"}
//! ```
//!
//! `kind` ([`ChangeKind`]) is one of `create`, `write`, `remove`, `rename`,
//! `chmod`: E2B's filesystem `EventType` one for one. As there (fsnotify),
//! a rename is two events: `rename` for the old name, `create` for the new.
//! `name` is relative to the watched directory. `file_type` (`file`, `dir`,
//! `symlink`, `other`) is the entry's type when the agent knew it (absent,
//! e.g., for a removed file); it is not called `type` because `type` tags
//! the message. Identical consecutive changes are coalesced (a big write is
//! one `write`). `overflow` means changes were lost: the kernel's queue
//! overflowed, or the host read too slowly and the agent's bounded queue
//! for the stream filled. The watch then goes on. If the watched directory
//! itself is removed or moved away the agent sends `error{not_found}` and
//! closes.
//!
//! Any request can be answered by [`Event::Error`] (followed by Close)
//! instead of its typed reply. A reset from the host cancels: it kills a
//! foreground process, detaches from a background one, and abandons a read
//! or write. An unknown class is refused with `Reset(REFUSED)`.
//!
//! A connection-level error (bad framing, no Hello first) cannot be
//! answered on a host stream, so the agent opens its own stream (even id)
//! of class [`StreamClass::NOTICE`] whose header is an [`ErrorBody`], then
//! ends the connection.

use std::collections::BTreeMap;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::frame::{StreamClass, MAX_PAYLOAD};

/// Stream classes beyond the four the framing layer names.
impl StreamClass {
    /// One-shot requests with a single typed reply: [`Call`].
    pub const CALL: StreamClass = StreamClass(5);
    /// Re-attach to a running or finished process by pid: [`AttachRequest`].
    pub const ATTACH: StreamClass = StreamClass(6);
    /// A TCP connection to a port inside the sandbox: [`ConnectRequest`].
    pub const CONNECT: StreamClass = StreamClass(7);
    /// The sandbox's log: output of its background processes
    /// ([`LogsRequest`], version 4).
    pub const LOGS: StreamClass = StreamClass(8);
    /// Opened by the agent to report a connection-level error
    /// ([`ErrorBody`]) just before it ends the connection.
    pub const NOTICE: StreamClass = StreamClass(0x100);
}

/// Channel byte of a JSON control message.
pub const CHANNEL_CONTROL: u8 = 0;
/// Channel byte of stdout, PTY output, stdin and file contents.
pub const CHANNEL_STDOUT: u8 = 1;
/// Channel byte of stderr.
pub const CHANNEL_STDERR: u8 = 2;

/// The most bulk bytes one Data frame can carry (one byte goes to the
/// channel tag).
pub const MAX_CHUNK: usize = MAX_PAYLOAD - 1;

/// A payload that does not decode as a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("data frame has no channel byte")]
    NoChannel,
    #[error("unknown data channel {0}")]
    UnknownChannel(u8),
    #[error("invalid {what}: {reason}")]
    Json { what: &'static str, reason: String },
}

/// A decoded Data payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataMsg<'a> {
    /// A JSON control message, not yet parsed.
    Control(&'a [u8]),
    /// Bulk bytes on [`CHANNEL_STDOUT`] or [`CHANNEL_STDERR`].
    Bytes { channel: u8, bytes: &'a [u8] },
}

impl<'a> DataMsg<'a> {
    /// Split a Data payload into its channel and content.
    pub fn parse(payload: &'a [u8]) -> Result<Self, MessageError> {
        let (&channel, rest) = payload.split_first().ok_or(MessageError::NoChannel)?;
        match channel {
            CHANNEL_CONTROL => Ok(DataMsg::Control(rest)),
            CHANNEL_STDOUT | CHANNEL_STDERR => Ok(DataMsg::Bytes {
                channel,
                bytes: rest,
            }),
            other => Err(MessageError::UnknownChannel(other)),
        }
    }
}

/// A Data payload carrying one control message.
pub fn control_payload<T: Serialize>(msg: &T) -> Vec<u8> {
    let mut out = vec![CHANNEL_CONTROL];
    // Serializing these plain structs to a Vec cannot fail: no maps with
    // non-string keys, no I/O.
    serde_json::to_writer(&mut out, msg).expect("message serializes");
    out
}

/// A Data payload carrying bulk bytes (at most [`MAX_CHUNK`] of them).
pub fn bytes_payload(channel: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 1);
    out.push(channel);
    out.extend_from_slice(bytes);
    out
}

/// An Open header: the request as JSON.
pub fn encode_header<T: Serialize>(request: &T) -> Vec<u8> {
    serde_json::to_vec(request).expect("request serializes")
}

/// Parse JSON (an Open header or a control message), naming `what` in the
/// error.
pub fn decode<T: DeserializeOwned>(what: &'static str, json: &[u8]) -> Result<T, MessageError> {
    serde_json::from_slice(json).map_err(|e| MessageError::Json {
        what,
        reason: e.to_string(),
    })
}

/// Terminal size of a PTY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    pub rows: u16,
    pub cols: u16,
}

/// Start a process. Header of an `EXEC` stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// Program and arguments; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// Added to (and overriding) the agent's own environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// A user name from the sandbox's /etc/passwd; sets uid, gid and HOME.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// Run on a new PTY of this size instead of pipes. stdout and stderr
    /// then both arrive on channel 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Keep running with no client attached; output goes to a bounded
    /// buffer that `ATTACH` replays.
    #[serde(default)]
    pub background: bool,
    /// With `background`: this stream stays attached from the start, as if
    /// an `ATTACH` came at once (output, `exited`, Close), so nothing is
    /// written only to the buffer before a client attaches. Closing or
    /// resetting the stream detaches; the process goes on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub attached: bool,
    /// Since version 2: the host's own note about the process (at most
    /// [`MAX_META`] bytes), kept by the agent for as long as it keeps the
    /// process and reported in [`ProcessInfo::meta`], so that a host that
    /// reconnects (a restarted daemon) knows again what it started. Sent
    /// only when the negotiated version is at least 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<String>,
    /// Since version 3: the request is too large for an Open header
    /// ([`MAX_OPEN_HEADER`](crate::MAX_OPEN_HEADER)): this header carries
    /// only this field, and the whole request follows as the first
    /// `continued` bytes of the stream's Data (channel 1, counted against
    /// credit as any Data), before anything else is sent on the stream. At
    /// most [`MAX_EXEC_REQUEST`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continued: Option<u32>,
}

/// The longest [`ExecRequest::meta`] an agent keeps.
pub const MAX_META: usize = 4096;

/// The largest exec request an agent takes (as JSON, through
/// [`ExecRequest::continued`]): room for what execve itself accepts (a
/// quarter of the stack limit, 2 MiB by default, for argv and environment
/// together) even with JSON's escaping.
pub const MAX_EXEC_REQUEST: usize = 16 << 20;

/// Re-attach to a process by pid. Header of an `ATTACH` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    pub pid: i32,
}

/// Read the sandbox's log: what its background processes (not PTYs)
/// printed, interleaved as it arrived, from a bounded buffer of the last
/// [`LOG_KEEP`] bytes that the agent keeps (reading it takes nothing
/// away, unlike `ATTACH`). Header of a `LOGS` stream.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogsRequest {
    /// Only this process's output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    /// Keep the stream open and send output as it comes.
    #[serde(default)]
    pub follow: bool,
    /// Start this many lines before the end instead of at the oldest
    /// byte kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<u32>,
}

/// Bytes of background output the agent keeps for `LOGS`, for the whole
/// sandbox.
pub const LOG_KEEP: usize = 1 << 20;

/// Read a file. Header of a `FILE_READ` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRequest {
    pub path: String,
}

/// Write a file from the stream's channel-1 bytes. Header of a `FILE_WRITE`
/// stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteRequest {
    pub path: String,
    /// Permission bits; a new file otherwise gets 0o644 (less the umask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Append instead of truncating.
    #[serde(default)]
    pub append: bool,
    /// Open (and create) the file as this user rather than as the agent:
    /// the kernel's permission checks for that uid and gid apply (a file
    /// the user may not write is refused, a symlink or hard link to one
    /// does not help), and a new file is theirs from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<FileOwner>,
}

/// A user of the sandbox, by ids, for [`WriteRequest::owner`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileOwner {
    pub uid: u32,
    pub gid: u32,
}

/// Watch a directory for changes. Header of a `WATCH` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchRequest {
    /// A directory; anything else is refused (`not_a_directory`).
    pub path: String,
    /// Also watch every directory below it, present and future.
    #[serde(default)]
    pub recursive: bool,
}

/// What happened to an entry in a watched directory. One for one with
/// E2B's filesystem `EventType` (`CREATE`, `WRITE`, `REMOVE`, `RENAME`,
/// `CHMOD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// Created, or moved in (the new name of a rename).
    Create,
    /// Contents modified.
    Write,
    Remove,
    /// Moved away (the old name of a rename).
    Rename,
    /// Metadata changed: mode, owner, timestamps, links.
    Chmod,
}

fn one() -> u32 {
    1
}

/// A one-shot request. Header of a `CALL` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Call {
    /// Directory entries, `depth` levels down (1: direct children).
    /// Replied with one or more `entries` and then `done`.
    List {
        path: String,
        #[serde(default = "one")]
        depth: u32,
        /// As for `stat`: report each entry's extended attributes under
        /// this prefix.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        xattrs: Option<String>,
    },
    /// Replied with `stat`. Symlinks are not followed.
    Stat {
        path: String,
        /// Also report the entry's extended attributes whose names start
        /// with this prefix (e.g. `user.e2b.`), in [`Entry::xattrs`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        xattrs: Option<String>,
    },
    Mkdir {
        path: String,
        #[serde(default)]
        parents: bool,
    },
    Rename {
        from: String,
        to: String,
    },
    Remove {
        path: String,
        #[serde(default)]
        recursive: bool,
    },
    /// Replied with `processes`.
    ListProcesses,
    /// Signal any process in the sandbox, attached or not; a negative
    /// `pid` (below -1) signals that process group (agents of this build
    /// on; older ones answer `invalid_request`).
    Signal {
        pid: i32,
        sig: i32,
    },
    /// Set extended attributes on `path` (not following a symlink), each
    /// name a full attribute name such as `user.e2b.author`. With
    /// `replace_prefix`, every attribute under that prefix that is not in
    /// `xattrs` is removed first, so the result is exactly `xattrs` (an
    /// empty map clears them; on a filesystem without extended attributes
    /// that is not an error). Replied with `done`.
    SetXattrs {
        path: String,
        #[serde(default)]
        xattrs: BTreeMap<String, String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replace_prefix: Option<String>,
    },
    /// Remove one extended attribute; `not_found` if it is not set.
    /// Replied with `done`.
    RemoveXattr {
        path: String,
        name: String,
    },
}

/// Host-to-agent control message on an `EXEC` or `ATTACH` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Input {
    Signal { sig: i32 },
    Resize { rows: u16, cols: u16 },
}

/// Connect to a TCP port inside the sandbox. Header of a `CONNECT` stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectRequest {
    pub port: u16,
    /// `127.0.0.1` (the default) or `::1`; nothing else is reachable from
    /// a sandbox's loopback-only network, so nothing else is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// One file, as `list` and `stat` describe it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub path: String,
    pub name: String,
    pub kind: FileKind,
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    /// Owner and group ids (`st_uid`, `st_gid`). Absent from an older
    /// agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// The owner's and group's names in the sandbox's /etc/passwd and
    /// /etc/group; absent when the id has no name there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Extended attributes under the prefix the request asked for (full
    /// names; values as UTF-8, lossily). Empty unless asked for.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// One process the agent manages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: i32,
    pub argv: Vec<String>,
    pub pty: bool,
    pub background: bool,
    pub running: bool,
    pub attached: bool,
    /// Its [`ExecRequest::meta`], if it was started with one (version 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<String>,
}

/// Machine-readable error class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    NotFound,
    PermissionDenied,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    NoSuchProcess,
    Busy,
    Unsupported,
    Protocol,
    Io,
    /// `CONNECT`: nothing listens on the port (`ECONNREFUSED`).
    ConnectionRefused,
}

/// An error: a code for programs and a lowercase message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// Agent-to-host control message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Started {
        pid: i32,
    },
    /// Reply to `ATTACH`; `dropped` bytes of output fell out of the
    /// bounded buffer before this client attached.
    Attached {
        pid: i32,
        dropped: u64,
    },
    /// Reply to `LOGS`; `dropped` bytes of output had already fallen out
    /// of the agent's log (for the whole sandbox: with a `pid`, at most
    /// that many were this process's).
    Logging {
        dropped: u64,
    },
    /// On a `LOGS` stream: `bytes` of output fell out of the log before
    /// this reader got to them (it read too slowly); the stream goes on
    /// after the gap.
    Skipped {
        bytes: u64,
    },
    /// Exactly one of `code` and `signal` is set.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
    ReadStarted {
        size: u64,
    },
    Written {
        bytes: u64,
    },
    Entries {
        entries: Vec<Entry>,
    },
    Stat {
        /// Boxed: an entry is several times the size of every other event.
        entry: Box<Entry>,
    },
    Processes {
        processes: Vec<ProcessInfo>,
    },
    /// The request succeeded (or a multi-part reply ended).
    Done,
    /// Reply to `WATCH`: the watches are in place; changes from here on are
    /// reported.
    Watching,
    /// A change in a watched directory; `name` is relative to it.
    Change {
        kind: ChangeKind,
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file_type: Option<FileKind>,
    },
    /// Reply to `CONNECT`: the TCP connection is established.
    Connected,
    /// Changes on a `WATCH` stream were lost (kernel queue overflow, or the
    /// host reading too slowly); the watch goes on.
    Overflow,
    Error {
        code: ErrorCode,
        message: String,
    },
}

impl Event {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> Event {
        Event::Error {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_payloads_split_by_channel() {
        let p = bytes_payload(CHANNEL_STDERR, b"oops");
        assert_eq!(
            DataMsg::parse(&p),
            Ok(DataMsg::Bytes {
                channel: CHANNEL_STDERR,
                bytes: b"oops"
            })
        );
        assert_eq!(DataMsg::parse(&[]), Err(MessageError::NoChannel));
        assert_eq!(
            DataMsg::parse(&[9, 1]).unwrap_err().to_string(),
            "unknown data channel 9"
        );
        let c = control_payload(&Event::Started { pid: 7 });
        assert_eq!(c[0], CHANNEL_CONTROL);
        assert_eq!(&c[1..], br#"{"type":"started","pid":7}"#);
    }

    #[test]
    fn requests_round_trip_and_use_defaults() {
        let exec: ExecRequest = decode("exec request", br#"{"argv":["ls"]}"#).unwrap();
        assert_eq!(exec.argv, ["ls"]);
        assert!(!exec.background && exec.pty.is_none());
        let full = ExecRequest {
            argv: vec!["sh".into()],
            env: [("A".to_string(), "b".to_string())].into(),
            cwd: Some("/tmp".into()),
            user: None,
            uid: Some(1),
            gid: Some(2),
            pty: Some(PtySize { rows: 3, cols: 4 }),
            background: true,
            attached: true,
            meta: Some("{\"tag\":\"t\"}".into()),
            continued: None,
        };
        assert_eq!(
            decode::<ExecRequest>("exec request", &encode_header(&full)).unwrap(),
            full
        );
        // Without meta, a version 2 request reads the same to an agent of
        // version 1 (which refuses unknown fields).
        let plain = ExecRequest {
            meta: None,
            ..full.clone()
        };
        assert!(!String::from_utf8(encode_header(&plain))
            .unwrap()
            .contains("meta"));
        // Nor does `continued` appear unless a request continues.
        assert!(!String::from_utf8(encode_header(&plain))
            .unwrap()
            .contains("continued"));
        let head = ExecRequest {
            continued: Some(70_000),
            ..ExecRequest::default()
        };
        assert_eq!(
            decode::<ExecRequest>("exec request", &encode_header(&head)).unwrap(),
            head
        );
        let call: Call = decode("call", br#"{"op":"list","path":"/"}"#).unwrap();
        assert_eq!(
            call,
            Call::List {
                path: "/".into(),
                depth: 1,
                xattrs: None,
            }
        );
        // The optional fields stay off the wire when unset, so a request
        // reads the same to an agent that predates them.
        assert_eq!(
            String::from_utf8(encode_header(&Call::Stat {
                path: "/a".into(),
                xattrs: None
            }))
            .unwrap(),
            r#"{"op":"stat","path":"/a"}"#
        );
        let call: Call = decode(
            "call",
            br#"{"op":"set_xattrs","path":"/a","xattrs":{"user.k":"v"},"replace_prefix":"user."}"#,
        )
        .unwrap();
        assert!(matches!(call, Call::SetXattrs { replace_prefix: Some(p), .. } if p == "user."));
        let entry: Entry = decode(
            "entry",
            br#"{"path":"/a","name":"a","kind":"file","size":1,"mode":420,"mtime":0}"#,
        )
        .unwrap();
        assert_eq!(
            (entry.uid, entry.owner, entry.xattrs.len()),
            (None, None, 0)
        );
        let watch: WatchRequest = decode("watch request", br#"{"path":"/tmp"}"#).unwrap();
        assert!(!watch.recursive);
        let call: Call = decode("call", br#"{"op":"list_processes"}"#).unwrap();
        assert_eq!(call, Call::ListProcesses);
        let c: ConnectRequest = decode("connect request", br#"{"port":8000}"#).unwrap();
        assert_eq!((c.port, c.host), (8000, None));
        assert!(decode::<ConnectRequest>("connect request", br#"{"port":70000}"#).is_err());
        assert_eq!(
            serde_json::to_string(&Event::error(ErrorCode::ConnectionRefused, "x")).unwrap(),
            r#"{"type":"error","code":"connection_refused","message":"x"}"#
        );
    }

    #[test]
    fn bad_json_names_what_was_wrong() {
        let err = decode::<ExecRequest>("exec request", b"{}").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid exec request: missing field `argv` at line 1 column 2"
        );
        let err = decode::<ExecRequest>("exec request", br#"{"argv":[],"x":1}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `x`"), "{err}");
        assert!(decode::<Call>("call", br#"{"op":"format_disk"}"#).is_err());
    }

    #[test]
    fn events_are_tagged_snake_case() {
        let e = Event::error(ErrorCode::NotFound, "stat /x: no such file or directory");
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(
            json,
            r#"{"type":"error","code":"not_found","message":"stat /x: no such file or directory"}"#
        );
        let e = Event::Exited {
            code: None,
            signal: Some(15),
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"exited","code":null,"signal":15}"#
        );
    }

    #[test]
    fn watch_events_have_a_flat_shape() {
        let e = Event::Change {
            kind: ChangeKind::Create,
            name: "sub/a.txt".into(),
            file_type: Some(FileKind::File),
        };
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(
            json,
            r#"{"type":"change","kind":"create","name":"sub/a.txt","file_type":"file"}"#
        );
        assert_eq!(decode::<Event>("event", json.as_bytes()).unwrap(), e);
        let e = Event::Change {
            kind: ChangeKind::Remove,
            name: "a".into(),
            file_type: None,
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"change","kind":"remove","name":"a"}"#
        );
        assert_eq!(
            serde_json::to_string(&Event::Watching).unwrap(),
            r#"{"type":"watching"}"#
        );
        assert_eq!(
            serde_json::to_string(&Event::Overflow).unwrap(),
            r#"{"type":"overflow"}"#
        );
    }
}
