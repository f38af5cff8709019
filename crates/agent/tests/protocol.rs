//! Handshake and hostile input against the real agent binary.

mod support;

use brig_protocol::message::{self, ErrorBody, ErrorCode, Event};
use brig_protocol::{Body, Frame, ResetCode, StreamClass, StreamId};
use support::Agent;

fn ping(agent: &mut Agent, nonce: u64) {
    agent.send(Frame::ping(nonce));
    assert_eq!(agent.conn_frame().map(|f| f.body), Some(Body::Pong(nonce)));
}

#[test]
fn handshake_and_ping() {
    let mut agent = Agent::start();
    ping(&mut agent, 42);
}

#[test]
fn hanging_up_ends_the_agent_cleanly() {
    let mut agent = Agent::start();
    ping(&mut agent, 1);
    agent.hang_up();
    assert!(agent.wait_exit(5).success());
}

/// What a protocol-error notice looks like: a NOTICE stream from the agent,
/// then the connection ends and the agent exits with status 2.
fn expect_notice(agent: &mut Agent) -> String {
    loop {
        let Some(f) = agent.frame_on(StreamId(2)) else {
            panic!("connection ended without a notice")
        };
        if let Body::Open { class, header } = f.body {
            assert_eq!(class, StreamClass::NOTICE);
            let body: ErrorBody = message::decode("notice", &header).unwrap();
            assert_eq!(body.code, ErrorCode::Protocol);
            let status = agent.wait_exit(5);
            assert_eq!(status.code(), Some(2));
            return body.message;
        }
    }
}

#[test]
fn garbage_bytes_get_a_protocol_error_not_a_hang() {
    let mut agent = Agent::start();
    agent.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(
        expect_notice(&mut agent),
        "bad frame magic 0x47, expected 0xb1"
    );
}

#[test]
fn oversize_length_is_refused_from_the_header() {
    let mut agent = Agent::start();
    let mut header = vec![0xB1, 0x03, 0, 0];
    header.extend_from_slice(&1u32.to_le_bytes());
    header.extend_from_slice(&u32::MAX.to_le_bytes());
    agent.send_raw(&header);
    let message = expect_notice(&mut agent);
    assert!(
        message.starts_with("data frame has a 4294967295-byte payload"),
        "{message}"
    );
}

#[test]
fn frames_before_hello_are_refused() {
    let mut agent = Agent::spawn_raw();
    agent.expect_hello();
    agent.send(Frame::ping(1));
    assert_eq!(
        expect_notice(&mut agent),
        "expected hello as the first frame, got ping"
    );
}

#[test]
fn incompatible_version_is_refused() {
    let mut agent = Agent::spawn_raw();
    agent.expect_hello();
    agent.send(Frame::hello(90, 99));
    let message = expect_notice(&mut agent);
    assert!(
        message.starts_with("no common protocol version"),
        "{message}"
    );
}

#[test]
fn stream_level_mistakes_keep_the_connection_up() {
    let mut agent = Agent::start();
    // Malformed JSON header: a typed error on that stream.
    let id = agent.open_raw(StreamClass::EXEC, b"{not json");
    let out = agent.collect(id);
    let (code, message) = out.error().unwrap();
    assert_eq!(code, ErrorCode::InvalidRequest);
    assert!(message.starts_with("invalid exec request: "), "{message}");
    // Unknown field.
    let id = agent.open_raw(StreamClass::CALL, br#"{"op":"stat","path":"/","evil":1}"#);
    assert!(agent
        .collect(id)
        .error()
        .unwrap()
        .1
        .contains("unknown field `evil`"));
    // Unknown stream class: refused.
    let id = agent.open_raw(StreamClass(999), b"{}");
    assert_eq!(agent.collect(id).reset, Some(ResetCode::REFUSED));
    // Data on a stream that was never opened.
    agent.send(Frame::data(StreamId(1001), vec![1, 2, 3]));
    assert_eq!(
        agent.frame_on(StreamId(1001)).unwrap().body,
        Body::Reset(ResetCode::PROTOCOL)
    );
    // An untagged (empty) Data payload on an open stream.
    let id = agent.open(StreamClass::EXEC, &support::exec(&["sleep", "5"]));
    assert!(matches!(
        agent.item(id),
        support::Item::Event(Event::Started { .. })
    ));
    agent.send(Frame::data(id, vec![]));
    assert_eq!(
        agent.frame_on(id).unwrap().body,
        Body::Reset(ResetCode::PROTOCOL)
    );
    // A reused stream id.
    agent.send(Frame::open(StreamId(1), StreamClass::CALL, b"{}".to_vec()));
    assert_eq!(
        agent.frame_on(StreamId(1)).unwrap().body,
        Body::Reset(ResetCode::PROTOCOL)
    );
    ping(&mut agent, 7);
}
