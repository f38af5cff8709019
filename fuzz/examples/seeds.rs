//! Writes the seed corpus, `fuzz/corpus/<target>/<name>`, with brig's own
//! encoders, so the seeds stay what brig really sends as the formats
//! change. Run from the repository root:
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example seeds
//!
//! Each seed is laid out as its target reads it (a selector or chunk-size
//! byte first where the target has one); see each target's comment.

use std::collections::BTreeMap;
use std::path::Path;

use brig_protocol::message::{
    self, Call, ChangeKind, Entry, ErrorCode, Event, ExecRequest, FileKind, Input, PtySize,
    WriteRequest, CHANNEL_STDOUT,
};
use brig_protocol::{Frame, ResetCode, StreamClass, StreamId, SUPPORTED};
use serde_json::json;

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("fuzz/corpus").join(target);
    std::fs::create_dir_all(&dir).expect("create the corpus directory");
    std::fs::write(dir.join(name), bytes).expect("write a seed");
}

fn frames(frames: &[Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames {
        f.encode_into(&mut out).expect("a seed frame encodes");
    }
    out
}

fn with_prefix(prefix: &[u8], body: &[u8]) -> Vec<u8> {
    [prefix, body].concat()
}

fn envelope(flags: u8, v: &serde_json::Value) -> Vec<u8> {
    brig_e2b::envd::connect::envelope(flags, v).to_vec()
}

fn entry() -> Entry {
    Entry {
        path: "/home/user/a.txt".into(),
        name: "a.txt".into(),
        kind: FileKind::File,
        size: 3,
        mode: 0o644,
        mtime: 1_700_000_000,
        symlink_target: None,
        uid: Some(1000),
        gid: Some(1000),
        owner: Some("user".into()),
        group: None,
        xattrs: BTreeMap::from([("user.e2b.k".into(), "v".into())]),
    }
}

fn main() {
    // --- the agent protocol: a session as the host and the agent speak it.
    let exec = ExecRequest {
        argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
        env: BTreeMap::from([("A".into(), "b".into())]),
        cwd: Some("/tmp".into()),
        pty: Some(PtySize { rows: 24, cols: 80 }),
        ..ExecRequest::default()
    };
    let s1 = StreamId(1);
    let session = frames(&[
        Frame::hello(SUPPORTED.0, SUPPORTED.1),
        Frame::open(s1, StreamClass::EXEC, message::encode_header(&exec)),
        Frame::credit(s1, 65536),
        Frame::data(s1, message::control_payload(&Event::Started { pid: 7 })),
        Frame::data(s1, message::bytes_payload(CHANNEL_STDOUT, b"hi\n")),
        Frame::data(
            s1,
            message::control_payload(&Event::Exited {
                code: Some(0),
                signal: None,
            }),
        ),
        Frame::close(s1),
        Frame::ping(42),
        Frame::pong(42),
        Frame::reset(StreamId(3), ResetCode::CANCEL),
    ]);
    write("frame_decoder", "session", &with_prefix(&[0], &session));
    write(
        "frame_decoder",
        "session-chunked",
        &with_prefix(&[3, 1, 5, 13], &session),
    );
    write(
        "frame_decoder",
        "hello",
        &with_prefix(&[0], &frames(&[Frame::hello(1, 4)])),
    );
    let call = Call::List {
        path: "/".into(),
        depth: 2,
        xattrs: None,
    };
    write(
        "frame_decoder",
        "call",
        &with_prefix(
            &[1, 7],
            &frames(&[Frame::open(
                StreamId(5),
                StreamClass::CALL,
                message::encode_header(&call),
            )]),
        ),
    );
    // frame_roundtrip builds its frames from any bytes (Arbitrary).
    write(
        "frame_roundtrip",
        "a",
        b"\x01\x00\x02\x00\x00\x00\x04\x00hello",
    );
    write("frame_roundtrip", "b", &session[..64]);

    // --- messages: a selector byte (see message_codec.rs), then JSON.
    let events = [
        Event::Started { pid: 7 },
        Event::Exited {
            code: None,
            signal: Some(9),
        },
        Event::Entries {
            entries: vec![entry()],
        },
        Event::Stat {
            entry: Box::new(entry()),
        },
        Event::Change {
            kind: ChangeKind::Create,
            name: "x".into(),
            file_type: Some(FileKind::Dir),
        },
        Event::error(ErrorCode::NotFound, "stat /x: no such file or directory"),
    ];
    for (i, ev) in events.iter().enumerate() {
        write(
            "message_codec",
            &format!("event-{i}"),
            &with_prefix(&[0], &message::encode_header(ev)),
        );
    }
    write(
        "message_codec",
        "data-control",
        &with_prefix(&[0], &message::control_payload(&events[0])),
    );
    write(
        "message_codec",
        "data-bytes",
        &with_prefix(&[0], &message::bytes_payload(2, b"oops")),
    );
    write(
        "message_codec",
        "call",
        &with_prefix(&[2], &message::encode_header(&call)),
    );
    write(
        "message_codec",
        "exec",
        &with_prefix(&[3], &message::encode_header(&exec)),
    );
    write(
        "message_codec",
        "input",
        &with_prefix(
            &[4],
            &message::encode_header(&Input::Resize {
                rows: 50,
                cols: 132,
            }),
        ),
    );
    write(
        "message_codec",
        "write",
        &with_prefix(
            &[8],
            &message::encode_header(&WriteRequest {
                path: "/tmp/f".into(),
                mode: Some(0o600),
                append: true,
                owner: None,
            }),
        ),
    );

    // --- Connect envelopes: a chunk-size count, sizes, then the body.
    let stream_input = [
        envelope(0, &json!({"start": {"process": {"pid": 7}}})),
        envelope(0, &json!({"data": {"input": {"stdin": "aGkK"}}})),
        envelope(0, &json!({"keepalive": {}})),
        envelope(2, &json!({})),
    ]
    .concat();
    write(
        "connect_envelope",
        "stream-input",
        &with_prefix(&[0], &stream_input),
    );
    write(
        "connect_envelope",
        "stream-input-chunked",
        &with_prefix(&[2, 3, 11], &stream_input),
    );
    write(
        "connect_envelope",
        "empty-message",
        &with_prefix(&[0], &[0, 0, 0, 0, 0]),
    );
    write(
        "connect_envelope",
        "end-error",
        &with_prefix(
            &[0],
            &envelope(
                2,
                &json!({"error": {"code": "not_found", "message": "no process"}}),
            ),
        ),
    );

    // --- envd messages: (content type << 6) | method, then the body (see
    // envd_messages.rs for the tables).
    let (json_ct, connect_ct) = (0u8, 1u8 << 6);
    let start = json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "ls"], "envs": {"A": "b"}, "cwd": "~"},
                       "pty": {"size": {"cols": 80, "rows": 24}}, "tag": "t", "stdin": false});
    write(
        "envd_messages",
        "start",
        &with_prefix(&[connect_ct], &envelope(0, &start)),
    );
    write(
        "envd_messages",
        "stream-input",
        &with_prefix(&[connect_ct | 2], &stream_input),
    );
    write(
        "envd_messages",
        "send-input",
        &with_prefix(
            &[json_ct | 4],
            json!({"process": {"tag": "t"}, "input": {"pty": "AAEC"}})
                .to_string()
                .as_bytes(),
        ),
    );
    write(
        "envd_messages",
        "send-signal",
        &with_prefix(
            &[json_ct | 5],
            json!({"process": {"pid": 7}, "signal": "SIGNAL_SIGKILL"})
                .to_string()
                .as_bytes(),
        ),
    );
    write(
        "envd_messages",
        "update",
        &with_prefix(
            &[json_ct | 7],
            json!({"process": {"pid": 7}, "pty": {"size": {"cols": 0, "rows": 70000}}})
                .to_string()
                .as_bytes(),
        ),
    );
    write(
        "envd_messages",
        "stat",
        &with_prefix(&[json_ct | 9], br#"{"path":"~/a/../b"}"#),
    );
    write(
        "envd_messages",
        "move",
        &with_prefix(
            &[json_ct | 12],
            br#"{"source":"x/./y","destination":"/tmp//z"}"#,
        ),
    );
    write(
        "envd_messages",
        "list-dir",
        &with_prefix(&[json_ct | 13], br#"{"path":"","depth":3}"#),
    );
    write(
        "envd_messages",
        "watch-dir",
        &with_prefix(
            &[connect_ct | 15],
            &envelope(
                0,
                &json!({"path": "/tmp", "recursive": true, "includeEntry": true}),
            ),
        ),
    );

    // --- specs and limits: one string for every parser, or a create body.
    for (name, s) in [
        ("size", "512M"),
        ("size-frac", "1.5GiB"),
        ("size-bytes", "4096"),
        ("cpus", "0.5"),
        ("duration", "1h30m"),
        ("duration-ms", "250ms"),
        ("env", "PATH=/usr/bin:/bin"),
        ("user", "1000:1000"),
        ("user-name", "user"),
        ("template-image", "127.0.0.1:5000/team/tool:1"),
        ("template-dir", "dir:/srv/rootfs"),
        ("sandbox-id", "0123456789ab"),
        ("timestamp-offset", "2024-02-29T14:34:56.789123+02:00"),
    ] {
        write("spec_limits", name, s.as_bytes());
    }
    write(
        "spec_limits",
        "timestamp",
        brig_e2b::control::rfc3339(1_709_210_096_789).as_bytes(),
    );
    let create = json!({"template": "base", "memory": "512M", "disk": "1G", "cpus": 0.5, "pids": 128,
                        "timeout": "10m", "env": {"A": "b"}, "labels": {"team": "x"}, "name": "n-1",
                        "publish": ["8080", "18080:80"]});
    write("spec_limits", "create", create.to_string().as_bytes());

    // --- file-API paths.
    for (name, s) in [
        ("home", "~/a/b"),
        ("dots", "/tmp//x/../y/."),
        ("climb", "../../etc/passwd"),
        ("relative", "a/./b"),
        ("file-name", "report.txt"),
        ("trailing-slash", "/srv/data/"),
        ("cur-dir", "./"),
        ("escape", "dir/../../x"),
    ] {
        write("file_paths", name, s.as_bytes());
    }
}
