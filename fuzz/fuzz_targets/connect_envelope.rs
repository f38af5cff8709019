//! E2B Connect envelopes (1 flag byte, a 4-byte big-endian length, the
//! message) as a client sends them to envd, through the splitter every
//! streaming handler uses and through `EnvelopeReader`, which reads a
//! client-streaming body (`StreamInput`) chunk by chunk.
//!
//! Properties: the splitter takes exactly one whole envelope (prefix plus
//! the length it declares) or nothing, refuses compressed and oversized
//! ones from their prefix alone, and reads back what `envelope` wrote;
//! `EnvelopeReader` yields the same messages and the same error as the
//! splitter over the whole body, however the body is chunked.
#![no_main]

use std::convert::Infallible;
use std::sync::OnceLock;

use axum::body::{Body, Bytes};
use brig_e2b::envd::connect::{
    self, split_envelope, Code, ConnectError, EnvelopeReader, FLAG_COMPRESSED, FLAG_END_STREAM,
    MAX_ENVELOPE,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a tokio runtime")
    })
}

/// What reading `body` as a client stream should give: each message as
/// JSON text (so that float formatting is compared as sent), then the end
/// or the error's code.
fn model(body: &[u8]) -> (Vec<String>, Option<Code>) {
    let mut rest = body;
    let mut msgs = Vec::new();
    loop {
        let before = rest.len();
        match split_envelope(&mut rest) {
            Ok(Some((flags, payload))) => {
                assert_eq!(before - rest.len(), 5 + payload.len(), "took one envelope");
                let declared = u32::from_be_bytes([
                    body[body.len() - before + 1],
                    body[body.len() - before + 2],
                    body[body.len() - before + 3],
                    body[body.len() - before + 4],
                ]);
                assert_eq!(declared as usize, payload.len());
                assert_eq!(
                    flags & FLAG_COMPRESSED,
                    0,
                    "a compressed envelope got through"
                );
                assert!(payload.len() <= MAX_ENVELOPE);
                if flags & FLAG_END_STREAM != 0 {
                    return (msgs, None);
                }
                let json = if payload.is_empty() {
                    &b"{}"[..]
                } else {
                    payload
                };
                match connect::decode_message::<Value>(json) {
                    Ok(v) => msgs.push(v.to_string()),
                    Err(e) => return (msgs, Some(e.code)),
                }
            }
            Ok(None) => {
                assert_eq!(
                    rest.len(),
                    before,
                    "nothing is taken from a partial envelope"
                );
                if rest.len() >= 5 {
                    let declared = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
                    assert!(rest.len() < 5 + declared as usize);
                }
                let end = if rest.is_empty() {
                    None
                } else {
                    Some(Code::InvalidArgument)
                };
                return (msgs, end);
            }
            Err(ConnectError { code, .. }) => {
                let declared = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
                assert!(
                    rest[0] & FLAG_COMPRESSED != 0 || declared as usize > MAX_ENVELOPE,
                    "refused a good prefix"
                );
                return (msgs, Some(code));
            }
        }
    }
}

/// What `EnvelopeReader` gives for `body` sent in chunks of `sizes`.
fn read(body: &[u8], sizes: &[u8]) -> (Vec<String>, Option<Code>) {
    let mut chunks = Vec::new();
    let mut rest = body;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes
            .get(i % sizes.len().max(1))
            .map_or(rest.len(), |&s| usize::from(s).max(1).min(rest.len()));
        chunks.push(Ok::<_, Infallible>(Bytes::copy_from_slice(&rest[..n])));
        rest = &rest[n..];
        i += 1;
    }
    let body = Body::from_stream(futures_util::stream::iter(chunks));
    runtime().block_on(async move {
        let mut reader = EnvelopeReader::new(body);
        let mut msgs = Vec::new();
        loop {
            match reader.next::<Value>().await {
                Ok(Some(v)) => msgs.push(v.to_string()),
                Ok(None) => return (msgs, None),
                Err(e) => return (msgs, Some(e.code)),
            }
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, data)) = data.split_first() else {
        return;
    };
    let (sizes, body) = data.split_at(usize::from(n % 8).min(data.len()));

    assert_eq!(
        read(body, sizes),
        model(body),
        "reader and splitter disagree"
    );

    // Whatever JSON the body holds, `envelope` frames it so that the
    // splitter gives back its flags and text.
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let flags = n & FLAG_END_STREAM;
        let wire = connect::envelope(flags, &v);
        let mut rest = &wire[..];
        let (f, payload) = split_envelope(&mut rest)
            .expect("an envelope we wrote is accepted")
            .expect("and whole");
        assert!(rest.is_empty());
        assert_eq!(f, flags);
        assert_eq!(payload, v.to_string().as_bytes());
    }
});
