//! Many streams on one connection: they run at once, their outputs stay
//! apart, and one that nobody reads does not hold up the others.

mod support;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_agent_client::Output;
use support::{exec, pattern, within, Agent};

/// 20 execs from 8 threads on one connection, each printing a few hundred
/// lines that name it, to stdout and stderr: every process gets exactly
/// its own output.
#[test]
fn twenty_execs_from_eight_threads_keep_their_outputs_apart() {
    within(60, || {
        let agent = Arc::new(Agent::start());
        let next = Arc::new(AtomicUsize::new(0));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (agent, next) = (Arc::clone(&agent), Arc::clone(&next));
                std::thread::spawn(move || {
                    let mut done = 0;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= 20 {
                            return done;
                        }
                        let script = format!(
                            "i=0; while [ $i -lt 300 ]; do echo out-{i}-$i; echo err-{i}-$i >&2; i=$((i+1)); done"
                        );
                        let proc = agent.conn.exec(&exec(&["sh", "-c", &script])).unwrap();
                        let (out, err, status) = proc.wait_with_output().unwrap();
                        assert!(status.success(), "job {i}: {status:?}");
                        let want = |tag: &str| -> String {
                            (0..300).map(|j| format!("{tag}-{i}-{j}\n")).collect()
                        };
                        assert_eq!(String::from_utf8(out).unwrap(), want("out"), "job {i}");
                        assert_eq!(String::from_utf8(err).unwrap(), want("err"), "job {i}");
                        done += 1;
                    }
                })
            })
            .collect();
        let total: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(total, 20);
    });
}

/// A process pours output that nobody reads. Its stream fills its window
/// and stops; meanwhile a 2 MiB stdin round trip and a 3 MiB file write
/// and read on the same connection complete. Afterwards the stalled
/// stream still delivers, in order.
#[test]
fn a_stalled_consumer_does_not_stall_other_streams() {
    within(90, || {
        let agent = Agent::start();
        let conn = &agent.conn;
        let mut stalled = conn
            .exec(&exec(&[
                "sh",
                "-c",
                "head -c 50000000 /dev/zero; echo done",
            ]))
            .unwrap();
        // Let it fill its window and the agent's queue.
        std::thread::sleep(Duration::from_millis(300));

        let start = Instant::now();
        let proc = conn.exec(&exec(&["cat"])).unwrap();
        let input = pattern(2 << 20);
        std::thread::scope(|s| {
            let mut stdin = proc.stdin();
            let input = &input;
            s.spawn(move || {
                stdin.write_all(input).unwrap();
                stdin.close().unwrap();
            });
            let (out, _, status) = proc.wait_with_output().unwrap();
            assert!(status.success());
            assert!(out == *input, "cat echoed something else");
        });

        let path =
            std::env::temp_dir().join(format!("brig-agent-client-stall-{}", std::process::id()));
        let path = path.to_str().unwrap();
        let data = pattern(3 << 20);
        conn.write_file(path, &data[..], None, false).unwrap();
        let mut back = Vec::new();
        conn.read_file(path)
            .unwrap()
            .read_to_end(&mut back)
            .unwrap();
        assert!(back == data);
        std::fs::remove_file(path).unwrap();
        eprintln!(
            "other streams done in {:?} while one stalled",
            start.elapsed()
        );

        // The stalled stream resumes where it was: zeros, then "done".
        let mut total = 0usize;
        let mut tail = Vec::new();
        for item in &mut stalled {
            match item.unwrap() {
                Output::Stdout(b) => {
                    total += b.len();
                    tail.extend_from_slice(&b);
                    let keep = tail.len().saturating_sub(16);
                    tail.drain(..keep);
                }
                Output::Exited { code, .. } => assert_eq!(code, Some(0)),
                _ => {}
            }
        }
        assert_eq!(total, 50_000_000 + 5);
        assert!(tail.ends_with(b"\0done\n"));
    });
}
