//! The agent protocol's messages: a Data payload split by its channel
//! byte, then the JSON in it decoded as the type each side expects, the
//! host's (`Event`, the `ErrorBody` of a notice, from a hostile agent) and
//! the agent's (`Call`, `ExecRequest`, `Input`, … from the host).
//!
//! The first input byte picks the type, the rest is the payload.
//! Properties: a payload splits into its channel and the bytes after it;
//! a message that decodes encodes (as an Open header and as a control
//! payload) to JSON that decodes to the same value.
#![no_main]

use std::fmt::Debug;

use brig_protocol::message::{
    self, AttachRequest, Call, ConnectRequest, DataMsg, ErrorBody, Event, ExecRequest, Input,
    LogsRequest, PtySize, ReadRequest, WatchRequest, WriteRequest, CHANNEL_CONTROL,
};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Decode `json` as a `T`; if it decodes, check both encodings of it
/// decode back to it.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(json: &[u8]) {
    let Ok(value) = message::decode::<T>("fuzz", json) else {
        return;
    };
    let header = message::encode_header(&value);
    let again: T = message::decode("fuzz", &header).expect("an encoded header decodes");
    assert_eq!(again, value, "header round trip");

    let payload = message::control_payload(&value);
    match DataMsg::parse(&payload) {
        Ok(DataMsg::Control(json)) => {
            let again: T = message::decode("fuzz", json).expect("a control payload decodes");
            assert_eq!(again, value, "control payload round trip");
        }
        other => panic!("a control payload parsed as {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, payload)) = data.split_first() else {
        return;
    };
    // Every input is also a Data payload as the host's reader gets it.
    match DataMsg::parse(payload) {
        Ok(DataMsg::Control(json)) => {
            assert_eq!(payload[0], CHANNEL_CONTROL);
            assert_eq!(json, &payload[1..]);
            round_trip::<Event>(json);
        }
        Ok(DataMsg::Bytes { channel, bytes }) => {
            assert_eq!(channel, payload[0]);
            assert_eq!(bytes, &payload[1..]);
            assert_eq!(message::bytes_payload(channel, bytes), payload);
        }
        Err(_) => assert!(payload.first().is_none_or(|&c| c > 2)),
    }
    match which % 12 {
        0 => round_trip::<Event>(payload),
        1 => round_trip::<ErrorBody>(payload),
        2 => round_trip::<Call>(payload),
        3 => round_trip::<ExecRequest>(payload),
        4 => round_trip::<Input>(payload),
        5 => round_trip::<AttachRequest>(payload),
        6 => round_trip::<LogsRequest>(payload),
        7 => round_trip::<ReadRequest>(payload),
        8 => round_trip::<WriteRequest>(payload),
        9 => round_trip::<WatchRequest>(payload),
        10 => round_trip::<ConnectRequest>(payload),
        _ => round_trip::<PtySize>(payload),
    }
});
