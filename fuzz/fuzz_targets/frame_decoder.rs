//! The agent frame decoder (brig-protocol `Decoder`) on bytes from a
//! hostile agent, pushed in chunks of fuzzer-chosen sizes.
//!
//! Properties, beyond not panicking:
//! - chunking does not matter: the frames and the error are the same as
//!   when the whole input is pushed at once;
//! - every decoded frame is one the encoder accepts, and encodes back to
//!   the very bytes it was decoded from (Hello excepted: bytes after its
//!   version range are a newer peer's extension, skipped);
//! - a drained decoder holds less than one maximal frame;
//! - the first error is final: later pushes are ignored and every later
//!   `next_frame` returns the same error;
//! - a Hello's version range negotiates, with this build's, to the highest
//!   version in both ranges, or to an error when there is none.
#![no_main]

use brig_protocol::{Body, Decoder, Frame, FrameError, HEADER_LEN, MAX_PAYLOAD, SUPPORTED};
use libfuzzer_sys::fuzz_target;

/// Decode `wire` pushed in chunks of the sizes `sizes` cycles through
/// (whole when empty): the frames, each with its bytes, and the error.
fn decode(wire: &[u8], sizes: &[u8]) -> (Vec<(Frame, usize)>, Option<FrameError>) {
    let mut d = Decoder::new();
    let mut frames = Vec::new();
    let mut rest = wire;
    let mut i = 0;
    let mut consumed = 0;
    loop {
        let n = match sizes.get(i % sizes.len().max(1)) {
            Some(&s) => usize::from(s).max(1).min(rest.len()),
            None => rest.len(),
        };
        i += 1;
        let (chunk, tail) = rest.split_at(n);
        d.push(chunk);
        rest = tail;
        loop {
            let before = d.buffered();
            match d.next_frame() {
                Ok(Some(f)) => {
                    let used = before - d.buffered();
                    frames.push((f, used));
                    consumed += used;
                }
                Ok(None) => break,
                Err(e) => {
                    assert!(d.is_failed());
                    d.push(b"\xb1\x05\0\0\x01\0\0\0\0\0\0\0");
                    assert_eq!(d.next_frame(), Err(e.clone()), "an error is final");
                    assert_eq!(d.buffered(), 0, "a failed decoder keeps nothing");
                    return (frames, Some(e));
                }
            }
        }
        assert!(
            d.buffered() < HEADER_LEN + MAX_PAYLOAD,
            "a drained decoder holds {} bytes",
            d.buffered()
        );
        assert_eq!(consumed + d.buffered(), wire.len() - rest.len());
        if rest.is_empty() {
            return (frames, None);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // The first byte says how many of the next bytes are chunk sizes.
    let Some((&n, data)) = data.split_first() else {
        return;
    };
    let (sizes, wire) = data.split_at(usize::from(n % 8).min(data.len()));

    let (frames, err) = decode(wire, sizes);
    let (whole, whole_err) = decode(wire, &[]);
    assert_eq!(frames, whole, "chunking changed the frames");
    assert_eq!(err, whole_err, "chunking changed the error");

    let mut at = 0;
    for (frame, used) in &frames {
        let mut out = Vec::new();
        frame
            .encode_into(&mut out)
            .expect("a decoded frame encodes");
        assert_eq!(out.len(), frame.encoded_len());
        let original = &wire[at..at + used];
        if let Body::Hello { min, max } = frame.body {
            let theirs = (min, max);
            match brig_protocol::negotiate(SUPPORTED, theirs) {
                Ok(v) => {
                    assert!(v >= min && v <= max && v >= SUPPORTED.0 && v <= SUPPORTED.1);
                    assert!(
                        v == max || v == SUPPORTED.1,
                        "{v} is not the highest common"
                    );
                }
                Err(_) => assert!(
                    min == 0 || min > max || max < SUPPORTED.0 || min > SUPPORTED.1,
                    "{theirs:?} has a version in common with {SUPPORTED:?}"
                ),
            }
        }
        if matches!(frame.body, Body::Hello { .. }) {
            // The same but for the length, and the extension after it.
            assert_eq!(out[..8], original[..8], "hello re-encodes");
            assert_eq!(out[12..], original[12..16], "hello re-encodes");
        } else {
            assert_eq!(out, original, "{frame:?} re-encodes to other bytes");
        }
        at += used;
    }
});
