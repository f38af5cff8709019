//! Frames built from fuzzer input, encoded and decoded again, in chunks.
//!
//! Properties: whatever `Frame::encode_into` accepts, a `Decoder` returns
//! unchanged (the same frames, in order, however the bytes are split);
//! whatever it refuses writes nothing.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use brig_protocol::{Body, Decoder, Frame, ResetCode, StreamClass, StreamId};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, Arbitrary)]
enum AnyBody {
    Hello(u16, u16),
    Open(u16, Vec<u8>),
    Data(Vec<u8>),
    /// A payload over the kind's limit, which the encoder must refuse.
    BigData(u16),
    Credit(u32),
    Close,
    Reset(u32),
    Ping(u64),
    Pong(u64),
}

#[derive(Debug, Arbitrary)]
struct AnyFrame {
    /// Connection-level frames belong on stream 0 and the others must not
    /// be there; the fuzzer tries both.
    stream: u32,
    body: AnyBody,
}

fn frame(f: AnyFrame) -> Frame {
    let body = match f.body {
        AnyBody::Hello(min, max) => Body::Hello { min, max },
        AnyBody::Open(class, header) => Body::Open {
            class: StreamClass(class),
            header,
        },
        AnyBody::Data(bytes) => Body::Data(bytes),
        AnyBody::BigData(extra) => {
            Body::Data(vec![0; brig_protocol::MAX_PAYLOAD + 1 + usize::from(extra)])
        }
        AnyBody::Credit(n) => Body::Credit(n),
        AnyBody::Close => Body::Close,
        AnyBody::Reset(code) => Body::Reset(ResetCode(code)),
        AnyBody::Ping(n) => Body::Ping(n),
        AnyBody::Pong(n) => Body::Pong(n),
    };
    Frame {
        stream: StreamId(f.stream % 4),
        body,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(frames) = Vec::<AnyFrame>::arbitrary(&mut u) else {
        return;
    };
    let chunk = u.int_in_range(1..=64usize).unwrap_or(7);
    let mut wire = Vec::new();
    let mut sent = Vec::new();
    for f in frames.into_iter().map(frame) {
        let before = wire.len();
        match f.encode_into(&mut wire) {
            Ok(()) => {
                assert_eq!(wire.len() - before, f.encoded_len());
                sent.push(f);
            }
            Err(_) => assert_eq!(wire.len(), before, "a refused frame wrote bytes"),
        }
    }
    let mut d = Decoder::new();
    let mut got = Vec::new();
    for piece in wire.chunks(chunk) {
        d.push(piece);
        while let Some(f) = d.next_frame().expect("an encoded frame decodes") {
            got.push(f);
        }
    }
    assert_eq!(d.buffered(), 0);
    assert_eq!(got, sent);
});
