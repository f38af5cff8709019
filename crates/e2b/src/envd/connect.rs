//! The Connect protocol, JSON codec, as envd speaks it (reference §3.1).
//!
//! - **Unary**: `application/json` request, `200` + JSON message, or an
//!   error status from [`Code::status`] with `{"code","message"}`.
//! - **Server-streaming** (`Start`, `Connect`, `WatchDir`): one request
//!   envelope; the response is `200 application/connect+json`, message
//!   envelopes, then exactly one end-stream envelope (flag `0x02`): `{}` or
//!   `{"error":{...}}`. Errors found before the first message are sent the
//!   same way (HTTP 200 + end-stream error), as connect-go does.
//! - **Client-streaming** (`StreamInput`): envelopes read incrementally
//!   from the request body ([`EnvelopeReader`]).
//!
//! An envelope is 1 flag byte + a 4-byte big-endian length + the JSON.
//! Compression is never used by the clients; a compressed envelope is
//! refused.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use brig_agent_client::{ClientError, ErrorCode};

use brig_runtime::{ErrorKind, ManagerError};

/// Envelope flag: the payload is compressed (refused).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Envelope flag: the end-of-stream message.
pub const FLAG_END_STREAM: u8 = 0x02;
/// The largest request envelope accepted (stdin chunks, watch requests).
pub const MAX_ENVELOPE: usize = 16 << 20;
/// Keepalive interval when the client sends no usable
/// `Keepalive-Ping-Interval` (envd's default).
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

/// Connect error codes (the ones envd answers with).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (Connect's table).
    pub fn status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A Connect error: a code for the client library, a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> ConnectError {
        ConnectError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::NotFound, message)
    }

    pub fn internal(message: impl Into<String>) -> ConnectError {
        ConnectError::new(Code::Internal, message)
    }

    fn json(&self) -> Value {
        json!({ "code": self.code.as_str(), "message": self.message })
    }
}

/// A failed manager call. A failure inside the sandbox keeps the agent's
/// own code and message (`stat /x: no such file or directory`): Connect's
/// codes are finer than the runtime's kinds. Anything else is picked by
/// its [`ErrorKind`]: a sandbox that is paused, has ended or cannot be
/// reached now is `unavailable`, a bad request `invalid_argument`, the rest
/// `internal`.
impl From<ManagerError> for ConnectError {
    fn from(err: ManagerError) -> ConnectError {
        let code = match &err {
            ManagerError::Agent { source, .. } => match source {
                ClientError::Agent { code, message } => {
                    return ConnectError::new(agent_code(*code), message.clone());
                }
                ClientError::Closed => Code::Unavailable,
                _ => Code::Internal,
            },
            _ => match err.kind() {
                ErrorKind::Paused | ErrorKind::NotRunning | ErrorKind::Unavailable => {
                    Code::Unavailable
                }
                ErrorKind::BadRequest => Code::InvalidArgument,
                _ => Code::Internal,
            },
        };
        ConnectError::new(code, err.to_string())
    }
}

impl From<tokio::task::JoinError> for ConnectError {
    fn from(err: tokio::task::JoinError) -> ConnectError {
        ConnectError::internal(format!("a worker task failed: {err}"))
    }
}

/// The Connect code of an agent error.
pub fn agent_code(code: ErrorCode) -> Code {
    match code {
        ErrorCode::NotFound | ErrorCode::NoSuchProcess => Code::NotFound,
        ErrorCode::PermissionDenied => Code::PermissionDenied,
        ErrorCode::AlreadyExists => Code::AlreadyExists,
        ErrorCode::InvalidRequest
        | ErrorCode::NotADirectory
        | ErrorCode::IsADirectory
        | ErrorCode::DirectoryNotEmpty => Code::InvalidArgument,
        ErrorCode::Busy => Code::FailedPrecondition,
        ErrorCode::Unsupported => Code::Unimplemented,
        ErrorCode::ConnectionRefused => Code::Unavailable,
        ErrorCode::Protocol | ErrorCode::Io => Code::Internal,
    }
}

/// A unary error response.
impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        (
            self.code.status(),
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.json().to_string(),
        )
            .into_response()
    }
}

/// A unary answer: `200` + the message, or the error.
pub fn unary(result: Result<Value, ConnectError>) -> Response {
    match result {
        Ok(v) => (
            StatusCode::OK,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            v.to_string(),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// A unary request's message. An empty body is the empty message.
pub fn unary_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ConnectError> {
    let ct = content_type(headers);
    if !ct.is_empty() && !ct.starts_with("application/json") {
        return Err(ConnectError::invalid(format!(
            "content type {ct:?} is not supported: envd speaks Connect with the JSON codec \
             (application/json)"
        )));
    }
    decode(if body.is_empty() { b"{}" } else { body })
}

/// A server-streaming request's one message (one envelope).
pub fn stream_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ConnectError> {
    let ct = content_type(headers);
    if !ct.starts_with("application/connect+json") {
        return Err(ConnectError::invalid(format!(
            "content type {ct:?} is not supported for a streaming call: use \
             application/connect+json"
        )));
    }
    let mut rest = body;
    match split_envelope(&mut rest)? {
        Some((flags, payload)) if flags & FLAG_END_STREAM == 0 => {
            decode(if payload.is_empty() { b"{}" } else { payload })
        }
        _ => Err(ConnectError::invalid("the request has no message envelope")),
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// One message's JSON, as every handler decodes it: a bad one is
/// `invalid_argument` naming serde's reason.
pub fn decode_message<T: DeserializeOwned>(json: &[u8]) -> Result<T, ConnectError> {
    decode(json)
}

fn decode<T: DeserializeOwned>(json: &[u8]) -> Result<T, ConnectError> {
    serde_json::from_slice(json)
        .map_err(|e| ConnectError::invalid(format!("invalid request message: {e}")))
}

/// Take one envelope off the front of `buf`: `None` if it holds less than
/// a whole one (and `buf` is left as it was). A compressed envelope, or
/// one longer than the limit, is refused as soon as its 5-byte prefix is
/// there, so a client never makes the reader buffer more than the limit.
/// Public for the `connect_envelope` fuzz target.
pub fn split_envelope<'a>(buf: &mut &'a [u8]) -> Result<Option<(u8, &'a [u8])>, ConnectError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let flags = buf[0];
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if flags & FLAG_COMPRESSED != 0 {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "compressed envelopes are not supported: send identity-encoded messages",
        ));
    }
    if len > MAX_ENVELOPE {
        return Err(ConnectError::new(
            Code::ResourceExhausted,
            format!("message of {len} bytes is larger than the {MAX_ENVELOPE}-byte limit"),
        ));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let payload = &buf[5..5 + len];
    *buf = &buf[5 + len..];
    Ok(Some((flags, payload)))
}

/// Envelopes read incrementally from a client-streaming request body.
#[derive(Debug)]
pub struct EnvelopeReader {
    body: axum::body::BodyDataStream,
    buf: Vec<u8>,
    /// Offset of the first envelope not yet returned. Taken envelopes are
    /// shifted out only before the next chunk is appended, once per chunk:
    /// shifting after each one took time quadratic in a chunk's envelopes
    /// (a 4.2 MB chunk of 21-byte keepalives kept a worker busy for 16 s;
    /// crates/e2b/tests/e2b_hostile.rs found it, a flood taking seconds).
    start: usize,
    done: bool,
}

impl EnvelopeReader {
    pub fn new(body: Body) -> EnvelopeReader {
        EnvelopeReader {
            body: body.into_data_stream(),
            buf: Vec::new(),
            start: 0,
            done: false,
        }
    }

    /// The next message, `None` at the end of the stream (an end-stream
    /// envelope or the end of the body).
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, ConnectError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let mut rest = &self.buf[self.start..];
            let before = rest.len();
            if let Some((flags, payload)) = split_envelope(&mut rest)? {
                let used = before - rest.len();
                let msg = if flags & FLAG_END_STREAM != 0 {
                    self.done = true;
                    None
                } else {
                    Some(decode(if payload.is_empty() { b"{}" } else { payload })?)
                };
                self.start += used;
                if msg.is_some() {
                    return Ok(msg);
                }
                continue;
            }
            self.buf.drain(..self.start);
            self.start = 0;
            match self.body.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(ConnectError::new(
                        Code::Canceled,
                        format!("reading the request body: {e}"),
                    ));
                }
                None if self.buf.is_empty() => {
                    self.done = true;
                    return Ok(None);
                }
                None => {
                    return Err(ConnectError::invalid(
                        "the request body ends inside an envelope",
                    ));
                }
            }
        }
    }
}

/// One envelope.
pub fn envelope(flags: u8, json: &Value) -> Bytes {
    let payload = json.to_string();
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload.as_bytes());
    Bytes::from(out)
}

/// What a streaming handler sends into its response.
#[derive(Debug)]
pub enum StreamItem {
    /// One message.
    Msg(Value),
    /// The end of the stream: success, or an error.
    End(Option<ConnectError>),
}

/// A server-streaming response fed by `rx`. When nothing was sent for a
/// whole `keepalive`, `keepalive_msg` is sent (reference §3.4). The stream
/// ends after [`StreamItem::End`]; if every sender is gone without one,
/// it ends with `{}` too (the handler had nothing more to say).
pub fn stream_response(
    mut rx: mpsc::Receiver<StreamItem>,
    keepalive: Duration,
    keepalive_msg: Value,
) -> Response {
    let (tx, body_rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(8);
    let task = tokio::spawn(async move {
        loop {
            let item = match tokio::time::timeout(keepalive, rx.recv()).await {
                Err(_) => StreamItem::Msg(keepalive_msg.clone()),
                Ok(Some(item)) => item,
                Ok(None) => StreamItem::End(None),
            };
            let (bytes, end) = match item {
                StreamItem::Msg(v) => (envelope(0, &v), false),
                StreamItem::End(err) => (end_stream(err.as_ref()), true),
            };
            if tx.send(Ok(bytes)).await.is_err() || end {
                return;
            }
        }
    });
    // Abort the producer once the body is dropped: a departed client must
    // not leave a task waiting on a keepalive timer forever, and dropping
    // `rx` is how the producers learn the client is gone.
    let guard = AbortOnDrop(task);
    let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx).map(move |item| {
        let _ = &guard;
        item
    });
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/connect+json"),
    );
    resp
}

/// A streaming response that is only an end-stream envelope (an error
/// before the first message).
pub fn stream_error(err: ConnectError) -> Response {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(StreamItem::End(Some(err)));
    stream_response(rx, DEFAULT_KEEPALIVE, json!({}))
}

/// A client-streaming call's answer: one message, then end-stream `{}`.
pub fn client_stream_response(result: Result<Value, ConnectError>) -> Response {
    let (tx, rx) = mpsc::channel(2);
    match result {
        Ok(v) => {
            let _ = tx.try_send(StreamItem::Msg(v));
            let _ = tx.try_send(StreamItem::End(None));
        }
        Err(e) => {
            let _ = tx.try_send(StreamItem::End(Some(e)));
        }
    }
    stream_response(rx, DEFAULT_KEEPALIVE, json!({}))
}

fn end_stream(err: Option<&ConnectError>) -> Bytes {
    match err {
        None => envelope(FLAG_END_STREAM, &json!({})),
        Some(e) => envelope(FLAG_END_STREAM, &json!({ "error": e.json() })),
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `Connect-Timeout-Ms`: `None` when absent, zero or unparsable.
pub fn timeout(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// `Keepalive-Ping-Interval` (seconds), else envd's default of 90 s.
pub fn keepalive(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_KEEPALIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200,000 keepalives in one chunk (4.2 MB) are read in linear time:
    /// well under a second. Shifting the buffer after each envelope, as
    /// this reader once did, took 16 s for them on a debug build.
    #[tokio::test]
    async fn a_chunk_of_many_envelopes_reads_in_linear_time() {
        let one = envelope(0, &json!({"keepalive": {}}));
        let mut body = one.repeat(200_000);
        body.extend_from_slice(&envelope(FLAG_END_STREAM, &json!({})));
        let mut reader = EnvelopeReader::new(Body::from(body));
        let started = std::time::Instant::now();
        let mut n = 0;
        while let Some(v) = reader.next::<Value>().await.unwrap() {
            assert_eq!(v, json!({"keepalive": {}}));
            n += 1;
        }
        assert_eq!(n, 200_000);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "took {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn envelopes_round_trip() {
        let e = envelope(0, &json!({"a":1}));
        assert_eq!(&e[..5], &[0, 0, 0, 0, 7]);
        let mut buf = &e[..];
        let (flags, payload) = split_envelope(&mut buf).unwrap().unwrap();
        assert_eq!((flags, payload), (0, &br#"{"a":1}"#[..]));
        assert!(buf.is_empty());
        let mut short = &e[..6];
        assert!(split_envelope(&mut short).unwrap().is_none());
        let mut compressed: &[u8] = &[1, 0, 0, 0, 0];
        assert_eq!(
            split_envelope(&mut compressed).unwrap_err().code,
            Code::Unimplemented
        );
        assert_eq!(end_stream(None)[0], FLAG_END_STREAM);
    }

    #[test]
    fn codes_map_to_connect_statuses() {
        assert_eq!(Code::NotFound.status(), 404);
        assert_eq!(Code::AlreadyExists.status(), 409);
        assert_eq!(Code::Canceled.status(), 499);
        assert_eq!(Code::Unauthenticated.status(), 401);
        assert_eq!(agent_code(ErrorCode::NoSuchProcess), Code::NotFound);
    }

    #[test]
    fn runtime_errors_map_to_connect_codes_without_native_hints() {
        let id = brig_core::SandboxId::from_random(7);
        let agent = |code| ManagerError::Agent {
            id: id.clone(),
            source: ClientError::Agent {
                code,
                message: "stat /x: no such file or directory".into(),
            },
        };
        let e = ConnectError::from(agent(ErrorCode::NotFound));
        assert_eq!(
            (e.code, e.message.as_str()),
            (Code::NotFound, "stat /x: no such file or directory")
        );
        let e = ConnectError::from(ManagerError::Paused { id: id.clone() });
        assert_eq!(e.code, Code::Unavailable);
        assert!(!e.message.contains("/v1/"), "{}", e.message);
        let ended = ManagerError::NotRunning {
            id: id.clone(),
            state: brig_runtime::SandboxState::Dead,
        };
        assert_eq!(ConnectError::from(ended).code, Code::Unavailable);
        let bad = ManagerError::BadRequest {
            reason: "no".into(),
        };
        assert_eq!(ConnectError::from(bad).code, Code::InvalidArgument);
        let closed = ManagerError::Agent {
            id: id.clone(),
            source: ClientError::Closed,
        };
        assert_eq!(ConnectError::from(closed).code, Code::Unavailable);
    }

    #[test]
    fn headers_parse_with_defaults() {
        let mut h = HeaderMap::new();
        assert_eq!(timeout(&h), None);
        assert_eq!(keepalive(&h), DEFAULT_KEEPALIVE);
        h.insert("connect-timeout-ms", HeaderValue::from_static("0"));
        h.insert("keepalive-ping-interval", HeaderValue::from_static("50"));
        assert_eq!(timeout(&h), None);
        assert_eq!(keepalive(&h), Duration::from_secs(50));
        h.insert("connect-timeout-ms", HeaderValue::from_static("1500"));
        assert_eq!(timeout(&h), Some(Duration::from_millis(1500)));
    }
}
