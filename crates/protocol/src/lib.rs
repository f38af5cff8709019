//! brig-protocol: the framed, versioned byte protocol between brig on the
//! host and `brig-agent` inside every sandbox.
//!
//! One byte stream (a unix socketpair in the process tier, virtio-serial in
//! the vm tier) carries many concurrent streams: a process's stdin and
//! output, a file being read or written, a directory watch. This crate is
//! the layer that makes that safe:
//!
//! - [`frame`]: the wire format. A [`Frame`] is a 12-byte header plus a
//!   bounded payload whose meaning is given by its [`Body`].
//!   [`Frame::encode_into`] writes one; a [`Decoder`] reads them back from
//!   chunks of any size, rejecting bad input with a [`FrameError`] before
//!   buffering it.
//! - [`flow`]: per-stream credit windows. [`SendWindow`] says how much may
//!   be sent; [`RecvWindow`] refuses a peer that sends more than it was
//!   granted ([`FlowError`]) and decides when to grant more.
//! - [`message`]: what the payloads mean. Open headers and control
//!   messages are JSON ([`ExecRequest`](message::ExecRequest),
//!   [`Call`](message::Call), [`Event`](message::Event), …); bulk bytes are
//!   raw Data behind a one-byte channel tag ([`message::DataMsg`]).
//! - [`serial`]: the vm tier's packets on its virtio-serial line, which
//!   let a new host connection start clean after a dead one.
//! - [`negotiate`]: both peers send a Hello with the version range they
//!   speak and use the highest version both support.
//!
//! The agent is untrusted from the host's side, so decoding never panics,
//! never trusts a length beyond the per-kind limits, and never allocates
//! for bytes that have not arrived. The crate's README has the wire table
//! and the rules a session built on it must follow.
#![forbid(unsafe_code)]

pub mod flow;
pub mod frame;
pub mod message;
pub mod serial;

pub use flow::{FlowError, RecvWindow, SendWindow, INITIAL_WINDOW, MAX_WINDOW};
pub use frame::{
    Body, Decoder, Frame, FrameError, FrameKind, ResetCode, StreamClass, StreamId, HEADER_LEN,
    MAGIC, MAX_HELLO, MAX_OPEN_HEADER, MAX_PAYLOAD,
};

/// The newest protocol version this build speaks.
///
/// 2: `ExecRequest::meta` and `ProcessInfo::meta` (a host's note about a
/// process, kept by the agent across reconnections).
/// 3: `ExecRequest::continued` (an exec request larger than an Open
/// header: a command line or environment of megabytes).
/// 4: `LOGS` streams (the sandbox's background output, read without
/// taking it).
pub const PROTOCOL_VERSION: u16 = 4;

/// The oldest protocol version this build still speaks.
pub const MIN_SUPPORTED: u16 = 1;

/// The version range to put in this side's Hello: `(min, max)`.
pub const SUPPORTED: (u16, u16) = (MIN_SUPPORTED, PROTOCOL_VERSION);

// Checked at compile time so that a bad bump cannot ship.
const _: () = assert!(MIN_SUPPORTED >= 1 && MIN_SUPPORTED <= PROTOCOL_VERSION);

/// The version both peers will speak: the highest one in both inclusive
/// `(min, max)` ranges. The result is the same whichever side computes it,
/// so no reply to the Hello is needed. Version 0 is never valid, so a
/// zeroed or garbage Hello cannot agree on anything.
pub fn negotiate(ours: (u16, u16), theirs: (u16, u16)) -> Result<u16, FrameError> {
    for (min, max) in [ours, theirs] {
        if min == 0 || min > max {
            return Err(FrameError::InvalidVersionRange { min, max });
        }
    }
    let agreed = ours.1.min(theirs.1);
    if agreed < ours.0.max(theirs.0) {
        return Err(FrameError::NoCommonVersion { ours, theirs });
    }
    Ok(agreed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_picks_the_highest_common_version() {
        assert_eq!(negotiate(SUPPORTED, SUPPORTED), Ok(PROTOCOL_VERSION));
        assert_eq!(negotiate((1, 3), (2, 5)), Ok(3));
        assert_eq!(negotiate((2, 5), (1, 3)), Ok(3), "symmetric");
        assert_eq!(negotiate((1, 1), (1, 9)), Ok(1));
        assert_eq!(negotiate((4, 4), (1, 4)), Ok(4));
    }

    #[test]
    fn disjoint_ranges_fail_naming_both() {
        let err = negotiate((1, 2), (3, 4)).unwrap_err();
        assert_eq!(
            err,
            FrameError::NoCommonVersion {
                ours: (1, 2),
                theirs: (3, 4)
            }
        );
        assert_eq!(
            err.to_string(),
            "no common protocol version: this side speaks 1..=2, the peer speaks 3..=4"
        );
        assert!(negotiate((3, 4), (1, 2)).is_err());
    }

    #[test]
    fn malformed_ranges_are_rejected() {
        assert_eq!(
            negotiate(SUPPORTED, (0, 0)),
            Err(FrameError::InvalidVersionRange { min: 0, max: 0 })
        );
        assert_eq!(
            negotiate(SUPPORTED, (0, 5)),
            Err(FrameError::InvalidVersionRange { min: 0, max: 5 })
        );
        assert_eq!(
            negotiate(SUPPORTED, (5, 1)),
            Err(FrameError::InvalidVersionRange { min: 5, max: 1 })
        );
        assert!(negotiate((2, 1), SUPPORTED).is_err());
    }
}
