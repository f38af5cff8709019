//! The client against the agent where it belongs: the command of a real
//! brig sandbox, started from a descriptor and speaking over a socket the
//! host holds (as crates/agent/tests/sandboxed.rs sets it up). Needs root;
//! skips with a printed reason otherwise, and fails instead under
//! BRIG_TEST_STRICT=1.

mod support;

use std::io::Read;

use brig_agent_client::{Call, Connection, Reply};
use brig_core::TemplateRef;
use brig_test_support::{agent_in_sandbox, root_or_skip};
use support::{agent_bin, exec, pattern, within};

#[test]
fn the_client_drives_an_agent_inside_a_sandbox() {
    if !root_or_skip() {
        return;
    }
    within(60, || {
        // As the daemon runs it: the agent is the sandbox's pid 1.
        let (sandbox, ours) = agent_in_sandbox(agent_bin(), TemplateRef::Host, true);
        let id = sandbox.id().to_string();
        let conn = Connection::new(ours).expect("handshake with the agent in the sandbox");

        // Concurrent work on one connection, inside the sandbox.
        let data = pattern(1 << 20);
        std::thread::scope(|s| {
            let conn = &conn;
            let data = &data;
            let hostname = s.spawn(move || {
                let p = conn.exec(&exec(&["hostname"])).unwrap();
                p.wait_with_output().unwrap()
            });
            let file = s.spawn(move || {
                conn.write_file("/tmp/blob", &data[..], None, false)
                    .unwrap();
                let mut back = Vec::new();
                conn.read_file("/tmp/blob")
                    .unwrap()
                    .read_to_end(&mut back)
                    .unwrap();
                back
            });
            let (out, _, status) = hostname.join().unwrap();
            assert!(status.success());
            assert_eq!(
                String::from_utf8_lossy(&out).trim(),
                id,
                "runs in the sandbox"
            );
            assert!(file.join().unwrap() == *data);
        });
        let Reply::Stat(entry) = conn
            .call(&Call::Stat {
                path: "/tmp/blob".into(),
                xattrs: None,
            })
            .unwrap()
        else {
            panic!("stat answers with an entry")
        };
        assert_eq!(entry.size, data.len() as u64);

        // Hanging up ends the agent, and with it the sandbox.
        drop(conn);
        let exit = sandbox.wait().expect("sandbox ends when the agent does");
        assert_eq!(exit.code, 0, "the agent exits cleanly on hang-up");
    });
}
