//! Deterministic pseudo-random abuse of the decoder: 10,000 inputs that are
//! random bytes, near-valid headers, or valid frame sequences with a few
//! bytes mutated, each pushed in random-sized chunks. The decoder must never
//! panic, must hold less than one maximal frame once drained, must stay
//! failed after an error, and everything it accepts must round-trip through
//! the encoder. Valid sequences left unmutated must decode exactly.
//!
//! No fuzzing crate: a fixed-seed xorshift keeps it dependency-free and
//! makes any failure reproducible from the printed case number.

use brig_protocol::{
    Decoder, Frame, FrameError, FrameKind, ResetCode, StreamClass, StreamId, HEADER_LEN, MAGIC,
    MAX_PAYLOAD,
};

const CASES: usize = 10_000;

/// xorshift64 (Marsaglia): tiny, fast, and good enough to vary inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

fn random_frame(rng: &mut Rng) -> Frame {
    let stream = StreamId(1 + rng.below(5) as u32);
    let small = rng.below(40);
    match rng.below(8) {
        0 => Frame::hello(rng.next() as u16, rng.next() as u16),
        1 => Frame::open(stream, StreamClass(rng.next() as u16), rng.bytes(small)),
        2 => Frame::data(stream, rng.bytes(small)),
        3 => Frame::credit(stream, rng.next() as u32),
        4 => Frame::close(stream),
        5 => Frame::reset(stream, ResetCode(rng.next() as u32)),
        6 => Frame::ping(rng.next()),
        _ => Frame::pong(rng.next()),
    }
}

fn mutate(rng: &mut Rng, wire: &mut Vec<u8>) {
    if wire.is_empty() {
        wire.push(rng.next() as u8);
        return;
    }
    let at = rng.below(wire.len());
    match rng.below(5) {
        0 => wire[at] = rng.next() as u8,
        1 => wire[at] ^= 1 << rng.below(8),
        2 => wire.truncate(at),
        3 => wire.insert(at, rng.next() as u8),
        _ => {
            let end = (at + 1 + rng.below(16)).min(wire.len());
            let copy = wire[at..end].to_vec();
            wire.splice(at..at, copy);
        }
    }
}

/// Push `wire` in random chunks, draining after each, checking the
/// decoder's invariants throughout. Returns what decoded and the error that
/// ended decoding, if any.
fn feed(rng: &mut Rng, case: usize, wire: &[u8]) -> (Vec<Frame>, Option<FrameError>) {
    let mut decoder = Decoder::new();
    let mut frames = Vec::new();
    let mut error: Option<FrameError> = None;
    let mut rest = wire;
    while !rest.is_empty() {
        let n = if rng.below(8) == 0 {
            rest.len()
        } else {
            (1 + rng.below(32)).min(rest.len())
        };
        decoder.push(&rest[..n]);
        rest = &rest[n..];
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    assert!(error.is_none(), "case {case}: frame after error");
                    frames.push(frame);
                }
                Ok(None) => {
                    assert!(
                        error.is_none(),
                        "case {case}: decoder recovered from an error"
                    );
                    break;
                }
                Err(err) => {
                    if let Some(first) = &error {
                        assert_eq!(&err, first, "case {case}: error changed");
                    }
                    assert!(decoder.is_failed());
                    assert_eq!(
                        decoder.buffered(),
                        0,
                        "case {case}: failed decoder still buffers"
                    );
                    error = Some(err);
                    break;
                }
            }
        }
        assert!(
            decoder.buffered() < HEADER_LEN + MAX_PAYLOAD,
            "case {case}: {} bytes buffered after draining",
            decoder.buffered()
        );
    }
    (frames, error)
}

/// Whatever the decoder accepts, the encoder must accept too, and the
/// result must decode to the same frame.
fn assert_reencodes(case: usize, frame: &Frame) {
    let mut wire = Vec::new();
    frame
        .encode_into(&mut wire)
        .unwrap_or_else(|e| panic!("case {case}: decoded {frame:?} but cannot encode it: {e}"));
    let mut decoder = Decoder::new();
    decoder.push(&wire);
    assert_eq!(
        decoder.next_frame().unwrap().as_ref(),
        Some(frame),
        "case {case}"
    );
}

#[test]
fn decoder_survives_random_and_mutated_input() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut stats = [0usize; 3]; // [frames decoded, inputs rejected, exact round trips]

    for case in 0..CASES {
        let frames: Vec<Frame> = (0..1 + rng.below(8))
            .map(|_| random_frame(&mut rng))
            .collect();
        let mut wire = Vec::new();
        for frame in &frames {
            frame.encode_into(&mut wire).unwrap();
        }

        let exact = case % 4 == 3;
        let input = match case % 4 {
            0 => {
                let len = rng.below(256);
                rng.bytes(len)
            }
            1 => {
                // Past the magic and kind checks, so flags, stream and
                // length rules get exercised with random values.
                let kind = FrameKind::ALL[rng.below(FrameKind::ALL.len())] as u8;
                let mut bytes = vec![MAGIC, kind];
                let len = 2 + rng.below(64);
                bytes.extend(rng.bytes(len));
                if rng.below(2) == 0 {
                    bytes[2] = 0;
                    bytes[3] = 0;
                }
                bytes
            }
            2 => {
                let mut wire = wire.clone();
                for _ in 0..1 + rng.below(4) {
                    mutate(&mut rng, &mut wire);
                }
                wire
            }
            _ => wire,
        };

        let (decoded, error) = feed(&mut rng, case, &input);
        for frame in &decoded {
            assert_reencodes(case, frame);
        }
        if exact {
            assert_eq!(error, None, "case {case}: valid input rejected");
            assert_eq!(decoded, frames, "case {case}");
            stats[2] += 1;
        }
        stats[0] += decoded.len();
        stats[1] += usize::from(error.is_some());
    }

    // Guard against a generator that only ever exercises one path.
    let [decoded, rejected, exact] = stats;
    assert!(decoded > CASES, "only {decoded} frames decoded");
    assert!(rejected > CASES / 3, "only {rejected} inputs rejected");
    assert_eq!(exact, CASES / 4);
}
