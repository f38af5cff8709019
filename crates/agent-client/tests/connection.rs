//! The connection itself: handshake, ping, and the agent going away.

mod support;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use brig_agent_client::{ClientError, Connection, Output};
use support::{exec, within, Agent};

#[test]
fn ping_round_trips() {
    within(30, || {
        let agent = Agent::start();
        assert_eq!(agent.conn.version(), brig_protocol::PROTOCOL_VERSION);
        for _ in 0..10 {
            let rtt = agent.conn.ping().unwrap();
            assert!(rtt < Duration::from_secs(5));
        }
    });
}

/// The agent dies mid-exec: the waiting reader gets `Closed` (no hang),
/// and so does everything after.
#[test]
fn agent_dying_mid_exec_is_closed_for_everyone() {
    within(30, || {
        let mut agent = Agent::start();
        let mut proc = agent.conn.exec(&exec(&["sleep", "100"])).unwrap();
        assert!(matches!(proc.next(), Some(Ok(Output::Started { .. }))));
        let stdin = proc.stdin();
        let waiter = std::thread::spawn(move || proc.next());
        std::thread::sleep(Duration::from_millis(100));
        agent.child.kill().unwrap();
        let got = waiter.join().unwrap();
        assert!(matches!(got, Some(Err(ClientError::Closed))), "{got:?}");

        assert!(matches!(
            agent.conn.exec(&exec(&["true"])),
            Err(ClientError::Closed)
        ));
        assert!(matches!(agent.conn.ping(), Err(ClientError::Closed)));
        let mut stdin = stdin;
        let err = stdin.write_all(b"x").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe, "{err}");
        assert!(agent.conn.is_closed());
    });
}

#[test]
fn a_peer_that_is_not_an_agent_fails_the_handshake() {
    within(30, || {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        theirs.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        let err = Connection::new(ours).unwrap_err();
        assert!(
            matches!(&err, ClientError::Protocol { reason } if reason.contains("bad frame magic")),
            "{err:?}"
        );

        let (ours, theirs) = UnixStream::pair().unwrap();
        drop(theirs);
        assert!(matches!(Connection::new(ours), Err(ClientError::Closed)));
    });
}
