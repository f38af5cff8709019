//! A fake agent that breaks the rules: the client must refuse, report and
//! stay bounded, never trust it.

mod support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use brig_agent_client::{ClientError, Connection, Output};
use brig_protocol::message::{self, ErrorBody, ErrorCode, Event, CHANNEL_STDOUT};
use brig_protocol::{
    Body, Decoder, Frame, ResetCode, StreamClass, StreamId, INITIAL_WINDOW, SUPPORTED,
};
use support::{exec, within};

/// The agent's end of a socketpair, speaking raw frames.
struct Fake {
    sock: UnixStream,
    decoder: Decoder,
}

impl Fake {
    fn send(&mut self, frame: Frame) {
        let mut buf = Vec::new();
        frame.encode_into(&mut buf).unwrap();
        // The client may already have hung up on this fake (that is what
        // some tests provoke); what it saw is asserted on its side.
        let _ = self.sock.write_all(&buf);
    }

    fn frame(&mut self) -> Frame {
        loop {
            if let Some(f) = self.decoder.next_frame().unwrap() {
                return f;
            }
            let mut buf = [0u8; 65536];
            let n = self.sock.read(&mut buf).unwrap();
            assert!(n > 0, "client hung up");
            self.decoder.push(&buf[..n]);
        }
    }
}

/// A connected client and the fake agent on the other end.
fn pair() -> (std::thread::JoinHandle<Connection>, Fake) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let client = std::thread::spawn(move || Connection::new(ours).unwrap());
    let mut fake = Fake {
        sock: theirs,
        decoder: Decoder::new(),
    };
    assert!(matches!(fake.frame().body, Body::Hello { .. }));
    fake.send(Frame::hello(SUPPORTED.0, SUPPORTED.1));
    (client, fake)
}

#[test]
fn data_past_the_granted_window_resets_the_stream() {
    within(30, || {
        let (client, mut fake) = pair();
        let conn = client.join().unwrap();
        let agent = std::thread::spawn(move || {
            let open = fake.frame();
            assert!(matches!(open.body, Body::Open { class, .. } if class == StreamClass::EXEC));
            let id = open.stream;
            fake.send(Frame::data(
                id,
                message::control_payload(&Event::Started { pid: 9 }),
            ));
            // The started event used part of the window; this overruns it.
            let flood = vec![b'x'; INITIAL_WINDOW as usize];
            fake.send(Frame::data(
                id,
                message::bytes_payload(CHANNEL_STDOUT, &flood),
            ));
            loop {
                if let Frame {
                    stream,
                    body: Body::Reset(code),
                } = fake.frame()
                {
                    assert_eq!(stream, id);
                    return (code, fake);
                }
            }
        });
        let mut proc = conn.exec(&exec(&["x"])).unwrap();
        assert_eq!(proc.pid(), Some(9));
        assert!(matches!(proc.next(), Some(Ok(Output::Started { pid: 9 }))));
        let err = proc.next().unwrap().unwrap_err();
        assert!(
            matches!(&err, ClientError::Protocol { reason } if reason.contains("credit")),
            "{err:?}"
        );
        let (code, _fake) = agent.join().unwrap();
        assert_eq!(code, ResetCode::FLOW_CONTROL);
    });
}

#[test]
fn a_notice_ends_the_connection_with_the_agents_reason() {
    within(30, || {
        let (client, mut fake) = pair();
        let conn = client.join().unwrap();
        fake.send(Frame::open(
            StreamId(2),
            StreamClass::NOTICE,
            message::encode_header(&ErrorBody {
                code: ErrorCode::Protocol,
                message: "data on stream 7 before open".into(),
            }),
        ));
        fake.send(Frame::close(StreamId(2)));
        // The fake never answers the ping: it returns because the notice
        // ends the connection.
        let err = conn.ping().unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent broke the protocol: agent reported: data on stream 7 before open"
        );
        drop(fake);
    });
}
