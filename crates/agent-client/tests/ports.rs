//! `CONNECT` streams: TCP connections the agent makes to a port and relays.
//!
//! Most tests run the agent on the host (over a socketpair) against
//! servers in this test process on 127.0.0.1, so each side can be driven
//! and observed exactly. The last one runs the agent inside a real sandbox
//! with a python3 echo server there, and checks that the sandbox's own
//! loopback is what it reaches.

mod support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_agent_client::{ClientError, Connection, ErrorCode};
use brig_test_support::root_or_skip;
use support::{agent_bin, exec, pattern, within, Agent};

/// A listener on a free port and a thread echoing every connection
/// until its EOF, then closing.
fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut back = conn.try_clone().unwrap();
                let _ = std::io::copy(&mut conn, &mut back);
                let _ = back.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    port
}

fn agent_rss_kib(agent: &Agent) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.child.id())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn bytes_go_both_ways_and_half_close_ends_the_echo() {
    within(30, || {
        let agent = Agent::start();
        let port = echo_server();
        let mut s = agent.conn.connect_port(port).unwrap();
        assert_eq!(s.port(), port);
        s.write_all(b"hello, port").unwrap();
        let mut buf = [0u8; 11];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello, port");
        // Half-close: the server reads EOF, echoes nothing more and closes;
        // this side reads the rest and then EOF.
        s.write_all(b" bye").unwrap();
        s.shutdown_write().unwrap();
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b" bye");
        assert!(s.write_all(b"x").is_err(), "writing after shutdown fails");
    });
}

/// The server closes its side first; this side goes on writing, and the
/// server still gets those bytes (each direction closes on its own).
#[test]
fn the_server_closing_first_leaves_the_other_direction_open() {
    within(30, || {
        let agent = Agent::start();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(b"greeting").unwrap();
            conn.shutdown(std::net::Shutdown::Write).unwrap();
            let mut got = Vec::new();
            conn.read_to_end(&mut got).unwrap();
            got
        });
        let mut s = agent.conn.connect_port(port).unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"greeting");
        s.write_all(b"still talking").unwrap();
        s.shutdown_write().unwrap();
        assert_eq!(server.join().unwrap(), b"still talking");
    });
}

#[test]
fn nothing_listening_is_connection_refused() {
    within(30, || {
        let agent = Agent::start();
        // A port that was free a moment ago.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = agent.conn.connect_port(port).unwrap_err();
        assert_eq!(
            err.agent_code(),
            Some(ErrorCode::ConnectionRefused),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("connect 127.0.0.1:{port}: connection refused")
        );
        let err = agent.conn.connect_port(0).unwrap_err();
        assert_eq!(err.agent_code(), Some(ErrorCode::InvalidRequest), "{err}");
        // The connection is fine afterwards.
        agent.conn.ping().unwrap();
    });
}

/// A server whose accept queue is full never answers the SYN: the agent
/// gives up after its connect timeout (10 s) with an `io` error, and the
/// rest of the connection keeps working meanwhile.
#[test]
fn a_connect_nobody_answers_times_out() {
    within(60, || {
        use std::os::fd::AsRawFd;
        let agent = Agent::start();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // SAFETY: listen on a socket this test owns; no pointers.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
        // Fill the accept queue (nobody accepts).
        let _fillers: Vec<_> = (0..4)
            .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok())
            .collect();
        let start = Instant::now();
        let conn = Arc::new(agent);
        let c = Arc::clone(&conn);
        let waiting = std::thread::spawn(move || c.conn.connect_port(addr.port()));
        // Meanwhile the agent serves other requests.
        std::thread::sleep(Duration::from_millis(200));
        let p = conn.conn.exec(&exec(&["echo", "alive"])).unwrap();
        let (out, _, _) = p.wait_with_output().unwrap();
        assert_eq!(out, b"alive\n");
        let err = waiting.join().unwrap().unwrap_err();
        let took = start.elapsed();
        assert_eq!(err.agent_code(), Some(ErrorCode::Io), "{err}");
        assert!(err.to_string().contains("no answer within 10s"), "{err}");
        assert!(
            took >= Duration::from_secs(9) && took < Duration::from_secs(20),
            "{took:?}"
        );
    });
}

/// 50 MB from a server that writes as fast as it can to a client that
/// reads slowly: the agent holds at most a window, and the bytes arrive
/// intact. The other direction meanwhile carries 8 MiB the other way.
#[test]
fn fifty_megabytes_to_a_slow_reader_stay_bounded() {
    within(180, || {
        let agent = Agent::start();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        const BIG: usize = 50_000_000;
        let big = Arc::new(pattern(BIG));
        let served = Arc::clone(&big);
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut reader = conn.try_clone().unwrap();
            let sink = std::thread::spawn(move || {
                let mut got = Vec::new();
                reader.read_to_end(&mut got).unwrap();
                got
            });
            conn.write_all(&served).unwrap();
            conn.shutdown(std::net::Shutdown::Write).unwrap();
            sink.join().unwrap()
        });
        let s = agent.conn.connect_port(port).unwrap();
        let mut writer = s.try_clone().unwrap();
        let upload = pattern(8 << 20);
        let sent = upload.clone();
        let up = std::thread::spawn(move || {
            writer.write_all(&sent).unwrap();
            writer.shutdown_write().unwrap();
        });
        // Slow at first: the server fills every buffer on the way and
        // waits; the agent must not take more than the window meanwhile.
        let mut s = s;
        let mut got = Vec::with_capacity(BIG);
        let mut buf = vec![0u8; 64 << 10];
        let mut max_rss = 0;
        let start = Instant::now();
        while got.len() < 4 << 20 {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "early EOF at {}", got.len());
            got.extend_from_slice(&buf[..n]);
            std::thread::sleep(Duration::from_millis(2));
            max_rss = max_rss.max(agent_rss_kib(&agent));
        }
        s.read_to_end(&mut got).unwrap();
        assert!(got == *big, "50 MB arrive intact ({} bytes)", got.len());
        max_rss = max_rss.max(agent_rss_kib(&agent));
        assert!(max_rss < 32 << 10, "agent VmRSS {max_rss} KiB");
        up.join().unwrap();
        assert!(server.join().unwrap() == upload, "8 MiB upload intact");
        eprintln!(
            "50 MB slow read in {:?}, agent VmRSS peak {max_rss} KiB",
            start.elapsed()
        );
    });
}

/// 64 connections at once from 8 threads, each echoing its own data.
#[test]
fn many_concurrent_connections_keep_their_bytes_apart() {
    within(60, || {
        let agent = Arc::new(Agent::start());
        let port = echo_server();
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let agent = Arc::clone(&agent);
                std::thread::spawn(move || {
                    let streams: Vec<_> = (0..8)
                        .map(|_| agent.conn.connect_port(port).unwrap())
                        .collect();
                    for (i, s) in streams.into_iter().enumerate() {
                        let data: Vec<u8> =
                            format!("thread {t} stream {i};").repeat(5000).into_bytes();
                        let mut w = s.try_clone().unwrap();
                        let sent = data.clone();
                        let writer = std::thread::spawn(move || {
                            w.write_all(&sent).unwrap();
                            w.shutdown_write().unwrap();
                        });
                        let mut s = s;
                        let mut back = Vec::new();
                        s.read_to_end(&mut back).unwrap();
                        writer.join().unwrap();
                        assert!(back == data, "thread {t} stream {i}");
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        agent.conn.ping().unwrap();
    });
}

/// Abort resets the connection (the server reads ECONNRESET, not EOF) and
/// wakes a reader blocked on it; dropping an open stream does the same.
#[test]
fn abort_and_drop_reset_the_connection() {
    within(30, || {
        let agent = Agent::start();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let s = agent.conn.connect_port(port).unwrap();
        let (mut server_side, _) = listener.accept().unwrap();
        let mut reader = s.try_clone().unwrap();
        let blocked = std::thread::spawn(move || reader.read(&mut [0u8; 16]));
        std::thread::sleep(Duration::from_millis(100));
        s.abort();
        let err = blocked.join().unwrap().unwrap_err();
        let inner = err.get_ref().and_then(|e| e.downcast_ref::<ClientError>());
        assert!(
            matches!(inner, Some(ClientError::StreamClosed { .. })),
            "{err:?}"
        );
        let err = server_side.read(&mut [0u8; 16]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);

        let s = agent.conn.connect_port(port).unwrap();
        let (mut server_side, _) = listener.accept().unwrap();
        drop(s);
        let err = server_side.read(&mut [0u8; 16]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);

        // A server that resets: the client's read fails with a reset.
        let mut s = agent.conn.connect_port(port).unwrap();
        let (server_side, _) = listener.accept().unwrap();
        let sock = socket2_free_linger_zero(server_side);
        drop(sock);
        let err = s.read(&mut [0u8; 16]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err:?}");
        agent.conn.ping().unwrap();
    });
}

/// Set SO_LINGER 0 so closing `s` sends RST.
fn socket2_free_linger_zero(s: TcpStream) -> TcpStream {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid linger struct of the size passed, read during the
    // call only.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::addr_of!(linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    s
}

/// The agent as a sandbox's pid 1: a python3 echo server started there is
/// reached on the sandbox's loopback, and a server on the host's loopback
/// is not (the sandbox has its own network namespace).
#[test]
fn a_port_inside_a_sandbox_is_reached_through_the_agent() {
    if !root_or_skip() {
        return;
    }
    within(60, || {
        let (sandbox, ours) =
            brig_test_support::agent_in_sandbox(agent_bin(), brig_core::TemplateRef::Host, true);
        let conn = Connection::new(ours).expect("handshake");

        let host_port = echo_server();
        let err = conn.connect_port(host_port).unwrap_err();
        assert_eq!(
            err.agent_code(),
            Some(ErrorCode::ConnectionRefused),
            "{err}"
        );

        let script = "import socket\n\
             s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
             s.bind(('127.0.0.1', 7777)); s.listen(8); print('ready', flush=True)\n\
             while True:\n\
             \x20   c, _ = s.accept()\n\
             \x20   while True:\n\
             \x20       b = c.recv(65536)\n\
             \x20       if not b: break\n\
             \x20       c.sendall(b)\n\
             \x20   c.shutdown(socket.SHUT_WR); c.close()\n";
        let mut req = exec(&["python3", "-c", script]);
        req.background = true;
        let server = conn.exec(&req).expect("start python3");
        let mut attached = conn.attach(server.pid().expect("a pid")).unwrap();
        match attached.next() {
            Some(Ok(brig_agent_client::Output::Attached { .. })) => {}
            other => panic!("attach: {other:?}"),
        }
        match attached.next() {
            Some(Ok(brig_agent_client::Output::Stdout(b))) => assert_eq!(b, b"ready\n"),
            other => panic!("server did not start: {other:?}"),
        }
        let s = conn
            .connect_port(7777)
            .expect("connect to the sandbox's server");
        let data = pattern(3 << 20);
        let mut w = s.try_clone().unwrap();
        let sent = data.clone();
        let writer = std::thread::spawn(move || {
            w.write_all(&sent).unwrap();
            w.shutdown_write().unwrap();
        });
        let mut s = s;
        let mut back = Vec::new();
        s.read_to_end(&mut back).unwrap();
        writer.join().unwrap();
        assert!(back == data, "3 MiB echoed from inside the sandbox");
        drop(attached);
        drop(conn);
        sandbox.wait().expect("sandbox ends when the agent does");
    });
}
