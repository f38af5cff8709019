//! Files and calls through the client against the real agent on the host.

mod support;

use std::io::Read;

use brig_agent_client::{Call, ClientError, ErrorCode, FileKind, Reply};
use support::{pattern, within, Agent};

#[test]
fn three_mib_of_binary_round_trips() {
    within(60, || {
        let agent = Agent::start();
        let dir = tempdir();
        let path = format!("{dir}/blob");
        let data = pattern(3 << 20);
        let n = agent
            .conn
            .write_file(&path, &data[..], Some(0o600), false)
            .unwrap();
        assert_eq!(n, data.len() as u64);

        let mut reader = agent.conn.read_file(&path).unwrap();
        assert_eq!(reader.size(), data.len() as u64);
        let mut back = Vec::new();
        reader.read_to_end(&mut back).unwrap();
        assert!(back == data, "read back differs ({} bytes)", back.len());

        // Appending, then stat sees the new size and the mode.
        agent
            .conn
            .write_file(&path, &b"tail"[..], None, true)
            .unwrap();
        match agent
            .conn
            .call(&Call::Stat {
                path: path.clone(),
                xattrs: None,
            })
            .unwrap()
        {
            Reply::Stat(e) => {
                assert_eq!(e.size, data.len() as u64 + 4);
                assert_eq!(e.mode, 0o600);
                assert_eq!(e.kind, FileKind::File);
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn calls_manage_files() {
    within(30, || {
        let agent = Agent::start();
        let dir = tempdir();
        let call = |c: Call| agent.conn.call(&c).unwrap();
        assert_eq!(
            call(Call::Mkdir {
                path: format!("{dir}/a/b"),
                parents: true
            }),
            Reply::Done
        );
        agent
            .conn
            .write_file(&format!("{dir}/a/b/f"), &b"x"[..], None, false)
            .unwrap();
        assert_eq!(
            call(Call::Rename {
                from: format!("{dir}/a/b/f"),
                to: format!("{dir}/a/g"),
            }),
            Reply::Done
        );
        let Reply::Entries(entries) = call(Call::List {
            path: format!("{dir}/a"),
            depth: 2,
            xattrs: None,
        }) else {
            panic!("list answers with entries")
        };
        let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["b", "g"]);
        assert_eq!(
            call(Call::Remove {
                path: format!("{dir}/a"),
                recursive: true
            }),
            Reply::Done
        );
        let Reply::Processes(_) = call(Call::ListProcesses) else {
            panic!("list_processes answers with processes")
        };
        std::fs::remove_dir_all(&dir).unwrap();
    });
}

#[test]
fn agent_errors_keep_their_code_and_message() {
    within(30, || {
        let agent = Agent::start();
        let err = agent
            .conn
            .call(&Call::Stat {
                path: "/no/such".into(),
                xattrs: None,
            })
            .unwrap_err();
        assert!(
            matches!(&err, ClientError::Agent { code: ErrorCode::NotFound, message }
                if message == "stat /no/such: no such file or directory"),
            "{err:?}"
        );

        let err = agent.conn.read_file("/no/such").unwrap_err();
        assert_eq!(err.agent_code(), Some(ErrorCode::NotFound), "{err}");

        let err = agent
            .conn
            .write_file("/no/such/dir/f", &pattern(1 << 20)[..], None, false)
            .unwrap_err();
        assert_eq!(err.agent_code(), Some(ErrorCode::NotFound), "{err}");

        // As an io::Error (the Read side of FileReader), the kind follows.
        let io: std::io::Error = err.into();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);

        agent.conn.ping().unwrap();
    });
}

/// A fresh directory on the host (the agent runs on the host here).
fn tempdir() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "brig-agent-client-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir.to_str().unwrap().to_string()
}
