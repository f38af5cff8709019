//! Processes through the client against the real agent on the host.

mod support;

use std::io::Write;

use brig_agent_client::{ClientError, ErrorCode, ExitStatus, Output, PtySize};

use support::{exec, pattern, within, Agent};

#[test]
fn echo_reports_started_output_and_exit_in_order() {
    within(30, || {
        let agent = Agent::start();
        let proc = agent.conn.exec(&exec(&["echo", "hello"])).unwrap();
        let pid = proc.pid().expect("exec returns after started");
        let items: Vec<Output> = proc.map(Result::unwrap).collect();
        assert_eq!(
            items,
            [
                Output::Started { pid },
                Output::Stdout(b"hello\n".to_vec()),
                Output::Exited {
                    code: Some(0),
                    signal: None
                },
            ]
        );
    });
}

#[test]
fn wait_with_output_separates_stdout_stderr_and_the_exit_code() {
    within(30, || {
        let agent = Agent::start();
        let proc = agent
            .conn
            .exec(&exec(&["sh", "-c", "echo out; echo err >&2; exit 3"]))
            .unwrap();
        let (out, err, status) = proc.wait_with_output().unwrap();
        assert_eq!(out, b"out\n");
        assert_eq!(err, b"err\n");
        assert_eq!(
            status,
            ExitStatus {
                code: Some(3),
                signal: None
            }
        );
        assert!(!status.success());
    });
}

#[test]
fn a_program_that_cannot_start_is_the_agents_error() {
    within(30, || {
        let agent = Agent::start();
        let err = agent.conn.exec(&exec(&["/no/such/program"])).unwrap_err();
        match &err {
            ClientError::Agent { code, message } => {
                assert_eq!(*code, ErrorCode::NotFound);
                assert_eq!(
                    message,
                    "cannot start /no/such/program: no such file or directory"
                );
            }
            other => panic!("expected the agent's error, got {other:?}"),
        }
        assert_eq!(
            err.to_string(),
            "cannot start /no/such/program: no such file or directory"
        );
        // The connection is fine afterwards.
        agent.conn.ping().unwrap();
    });
}

/// 2 MiB through `cat`: eight windows each way, with the writer on its own
/// thread (output is credited only as it is read, so one thread doing both
/// in sequence would deadlock like a shell pipeline).
#[test]
fn stdin_round_trips_two_mib() {
    within(60, || {
        let agent = Agent::start();
        let proc = agent.conn.exec(&exec(&["cat"])).unwrap();
        let input = pattern(2 << 20);
        let mut stdin = proc.stdin();
        let expected = input.clone();
        let writer = std::thread::spawn(move || {
            for chunk in input.chunks(100_000) {
                stdin.write_all(chunk).unwrap();
            }
            stdin.close().unwrap();
        });
        let (out, err, status) = proc.wait_with_output().unwrap();
        writer.join().unwrap();
        assert!(status.success(), "{status:?}");
        assert!(err.is_empty());
        assert_eq!(out.len(), expected.len());
        assert!(out == expected, "stdout differs from stdin");
    });
}

#[test]
fn signal_ends_a_process() {
    within(30, || {
        let agent = Agent::start();
        let proc = agent.conn.exec(&exec(&["sleep", "100"])).unwrap();
        proc.signal(libc::SIGTERM).unwrap();
        let (_, _, status) = proc.wait_with_output().unwrap();
        assert_eq!(
            status,
            ExitStatus {
                code: None,
                signal: Some(libc::SIGTERM)
            }
        );
    });
}

#[test]
fn resize_reaches_the_pty() {
    within(30, || {
        let agent = Agent::start();
        let mut req = exec(&["sh", "-c", "stty size; read x; stty size"]);
        req.pty = Some(PtySize { rows: 24, cols: 80 });
        let mut proc = agent.conn.exec(&req).unwrap();
        let mut seen = Vec::new();
        let mut read_until = |proc: &mut brig_agent_client::Process, want: &str| loop {
            if String::from_utf8_lossy(&seen).contains(want) {
                return;
            }
            match proc.next().expect("output before exit").unwrap() {
                Output::Stdout(b) => seen.extend(b),
                Output::Stderr(_) => panic!("a PTY has no separate stderr"),
                _ => {}
            }
        };
        read_until(&mut proc, "24 80");
        proc.resize(40, 100).unwrap();
        proc.stdin().write_all(b"\n").unwrap();
        read_until(&mut proc, "40 100");
        let (_, _, status) = proc.wait_with_output().unwrap();
        assert!(status.success());
    });
}

#[test]
fn background_process_can_be_reattached() {
    within(30, || {
        let agent = Agent::start();
        let mut req = exec(&["sh", "-c", "echo early; sleep 0.3; echo late"]);
        req.background = true;
        let proc = agent.conn.exec(&req).unwrap();
        let pid = proc.pid().unwrap();
        let items: Vec<Output> = proc.map(Result::unwrap).collect();
        assert_eq!(
            items,
            [Output::Started { pid }],
            "background: started, close"
        );

        let attached = agent.conn.attach(pid).unwrap();
        assert_eq!(attached.pid(), Some(pid));
        let (out, _, status) = attached.wait_with_output().unwrap();
        assert_eq!(out, b"early\nlate\n");
        assert!(status.success());

        let err = agent.conn.attach(999_999).unwrap_err();
        assert_eq!(err.agent_code(), Some(ErrorCode::NoSuchProcess), "{err}");
    });
}

#[test]
fn dropping_a_process_cancels_it_and_the_connection_goes_on() {
    within(30, || {
        let agent = Agent::start();
        let proc = agent.conn.exec(&exec(&["sleep", "100"])).unwrap();
        let pid = proc.pid().unwrap();
        drop(proc);
        // The agent killed it: signalling it by pid now fails.
        let mut gone = false;
        for _ in 0..100 {
            let r = agent
                .conn
                .call(&brig_agent_client::Call::Signal { pid, sig: 0 });
            if r.is_err() {
                gone = true;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(gone, "pid {pid} still running after its stream was dropped");
        assert!(agent.conn.ping().is_ok());
    });
}

/// `background` + `attached`: the exec stream itself carries the output
/// from the first byte, paced by this client (nothing dropped however
/// slowly it reads, unlike an unattended background process), and leaving
/// detaches without killing.
#[test]
fn an_attached_background_exec_is_paced_by_its_client_and_outlives_it() {
    use brig_agent_client::{Call, Reply};
    within(60, || {
        let agent = Agent::start();
        // 4 MiB, four times the ring an unattended process keeps.
        let mut req = exec(&["sh", "-c", "head -c 4194304 /dev/zero | tr '\\0' a"]);
        req.background = true;
        req.attached = true;
        let proc = agent.conn.exec(&req).unwrap();
        let mut got = 0usize;
        let mut exited = None;
        for (i, item) in proc.enumerate() {
            // A slow reader at first: the process waits for it.
            if i < 20 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            match item.unwrap() {
                Output::Stdout(b) => {
                    assert!(b.iter().all(|c| *c == b'a'));
                    got += b.len();
                }
                Output::Exited { code, signal } => exited = Some((code, signal)),
                _ => {}
            }
        }
        assert_eq!(got, 4 << 20, "every byte, in spite of the slow start");
        assert_eq!(exited, Some((Some(0), None)));

        let mut req = exec(&["sleep", "30"]);
        req.background = true;
        req.attached = true;
        let proc = agent.conn.exec(&req).unwrap();
        let pid = proc.pid().unwrap();
        drop(proc);
        let Reply::Processes(ps) = agent.conn.call(&Call::ListProcesses).unwrap() else {
            panic!("processes")
        };
        let p = ps.iter().find(|p| p.pid == pid).expect("still managed");
        assert!(p.running && p.background, "{p:?}");
        agent.conn.call(&Call::Signal { pid, sig: 9 }).unwrap();
    });
}
