//! File operations against the real agent binary.

mod support;

use brig_protocol::message::{
    Call, ChangeKind, ErrorCode, Event, FileKind, ReadRequest, WatchRequest, WriteRequest,
};
use brig_protocol::StreamClass;
use support::Agent;

fn tempdir(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("brig-agent-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.to_string_lossy().into_owned()
}

fn write(agent: &mut Agent, path: &str, bytes: &[u8], append: bool) -> support::Outcome {
    let req = WriteRequest {
        path: path.into(),
        mode: Some(0o600),
        append,
        owner: None,
    };
    let id = agent.open(StreamClass::FILE_WRITE, &req);
    agent.send_bytes(id, bytes);
    agent.close(id);
    agent.collect(id)
}

fn read(agent: &mut Agent, path: &str) -> support::Outcome {
    let id = agent.open(StreamClass::FILE_READ, &ReadRequest { path: path.into() });
    agent.close(id);
    agent.collect(id)
}

#[test]
fn binary_file_round_trips() {
    let dir = tempdir("rw");
    let path = format!("{dir}/blob.bin");
    // 5 MiB that is not valid UTF-8.
    let data: Vec<u8> = (0..5u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 | 0x80)
        .collect();
    assert!(std::str::from_utf8(&data).is_err());
    let out = write(&mut agent_new(), &path, &data, false);
    assert_eq!(
        out.events,
        [Event::Written {
            bytes: data.len() as u64
        }]
    );

    let mut agent = Agent::start();
    let out = read(&mut agent, &path);
    assert_eq!(
        out.events,
        [Event::ReadStarted {
            size: data.len() as u64
        }]
    );
    assert!(out.stdout == data, "read back differs");

    let out = write(&mut agent, &path, b"tail", true);
    assert_eq!(out.events, [Event::Written { bytes: 4 }]);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        data.len() as u64 + 4
    );
    let out = agent.call(&Call::Stat {
        path: path.clone(),
        xattrs: None,
    });
    let Event::Stat { entry } = &out.events[0] else {
        panic!("{out:?}")
    };
    assert_eq!(
        (entry.kind, entry.mode, entry.name.as_str()),
        (FileKind::File, 0o600, "blob.bin")
    );
    std::fs::remove_dir_all(dir).unwrap();
}

fn agent_new() -> Agent {
    Agent::start()
}

#[test]
fn directories_list_mkdir_rename_remove() {
    let dir = tempdir("dirs");
    let mut agent = Agent::start();
    let out = agent.call(&Call::Mkdir {
        path: format!("{dir}/a/b/c"),
        parents: true,
    });
    assert_eq!(out.events, [Event::Done]);
    let out = agent.call(&Call::Mkdir {
        path: format!("{dir}/x/y"),
        parents: false,
    });
    assert_eq!(out.error().unwrap().0, ErrorCode::NotFound);
    write(&mut agent, &format!("{dir}/a/f.txt"), b"hello", false);

    let names = |agent: &mut Agent, depth| {
        let out = agent.call(&Call::List {
            path: dir.clone(),
            depth,
            xattrs: None,
        });
        assert_eq!(out.events.last(), Some(&Event::Done));
        out.events
            .iter()
            .flat_map(|e| match e {
                Event::Entries { entries } => entries.clone(),
                _ => vec![],
            })
            .map(|e| e.path.trim_start_matches(&dir).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&mut agent, 1), ["/a"]);
    assert_eq!(names(&mut agent, 2), ["/a", "/a/b", "/a/f.txt"]);
    assert_eq!(names(&mut agent, 9), ["/a", "/a/b", "/a/b/c", "/a/f.txt"]);

    let out = agent.call(&Call::Rename {
        from: format!("{dir}/a"),
        to: format!("{dir}/z"),
    });
    assert_eq!(out.events, [Event::Done]);
    assert_eq!(names(&mut agent, 1), ["/z"]);

    let out = agent.call(&Call::Remove {
        path: format!("{dir}/z"),
        recursive: false,
    });
    let (code, message) = out.error().unwrap();
    assert_eq!(code, ErrorCode::DirectoryNotEmpty);
    assert_eq!(message, format!("remove {dir}/z: directory not empty"));
    let out = agent.call(&Call::Remove {
        path: format!("{dir}/z"),
        recursive: true,
    });
    assert_eq!(out.events, [Event::Done]);
    assert!(names(&mut agent, 1).is_empty());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn missing_paths_give_clear_errors() {
    let mut agent = Agent::start();
    let out = read(&mut agent, "/no/such/file");
    assert_eq!(
        out.error().unwrap(),
        (
            ErrorCode::NotFound,
            "read /no/such/file: no such file or directory".into()
        )
    );
    let out = agent.call(&Call::Stat {
        path: "/no/such".into(),
        xattrs: None,
    });
    assert_eq!(
        out.error().unwrap(),
        (
            ErrorCode::NotFound,
            "stat /no/such: no such file or directory".into()
        )
    );
    let out = agent.call(&Call::List {
        path: "/no/such".into(),
        depth: 1,
        xattrs: None,
    });
    assert_eq!(
        out.error().unwrap().1,
        "list /no/such: no such file or directory"
    );
    let out = agent.call(&Call::Rename {
        from: "/no/a".into(),
        to: "/no/b".into(),
    });
    assert_eq!(
        out.error().unwrap().1,
        "rename /no/a to /no/b: no such file or directory"
    );
    let out = write(&mut agent, "/no/such/dir/f", b"x", false);
    assert_eq!(out.error().unwrap().0, ErrorCode::NotFound);
    let out = read(&mut agent, "/");
    assert_eq!(
        out.error().unwrap(),
        (ErrorCode::IsADirectory, "read /: is a directory".into())
    );
    let out = agent.call(&Call::Stat {
        path: String::new(),
        xattrs: None,
    });
    assert_eq!(
        out.error().unwrap(),
        (ErrorCode::InvalidRequest, "path is empty".into())
    );
    let out = agent.call(&Call::Stat {
        path: "a\0b".into(),
        xattrs: None,
    });
    assert_eq!(out.error().unwrap().0, ErrorCode::InvalidRequest);
}

#[test]
fn watch_on_the_wire_watching_changes_then_close_on_close() {
    let dir = tempdir("watch");
    let mut agent = Agent::start();
    let watch = |agent: &mut Agent, path: &str| {
        agent.open(
            StreamClass::WATCH,
            &WatchRequest {
                path: path.into(),
                recursive: false,
            },
        )
    };
    let id = watch(&mut agent, &dir);
    assert_eq!(agent.item(id), support::Item::Event(Event::Watching));
    std::fs::write(format!("{dir}/new"), b"").unwrap();
    assert_eq!(
        agent.item(id),
        support::Item::Event(Event::Change {
            kind: ChangeKind::Create,
            name: "new".into(),
            file_type: Some(FileKind::File),
        })
    );
    // The host's Close ends the watch: the agent closes its side too, with
    // nothing after it even when the directory changes again.
    agent.close(id);
    std::fs::remove_file(format!("{dir}/new")).unwrap();
    let out = agent.collect(id);
    assert!(out.events.is_empty() && out.reset.is_none(), "{out:?}");

    // A file is not a directory; the error comes instead of `watching`.
    std::fs::write(format!("{dir}/f"), b"").unwrap();
    let id = watch(&mut agent, &format!("{dir}/f"));
    let out = agent.collect(id);
    assert_eq!(
        out.error().unwrap(),
        (
            ErrorCode::NotADirectory,
            format!("watch {dir}/f: not a directory")
        )
    );
    // A malformed header is an invalid request.
    let id = agent.open_raw(StreamClass::WATCH, br#"{"path":"/tmp","deep":true}"#);
    assert_eq!(
        agent.collect(id).error().unwrap().0,
        ErrorCode::InvalidRequest
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The entry's owner and group by id and by name, and extended attributes:
/// set, reported under a prefix by `stat` and `list`, replaced as a set,
/// removed.
#[test]
fn owners_and_extended_attributes() {
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;

    let dir = tempdir("xattr");
    let path = format!("{dir}/f.txt");
    std::fs::write(&path, "x").unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    let mut agent = Agent::start();
    let stat = |agent: &mut Agent, prefix: Option<&str>| {
        let out = agent.call(&Call::Stat {
            path: path.clone(),
            xattrs: prefix.map(str::to_string),
        });
        match &out.events[0] {
            Event::Stat { entry } => entry.clone(),
            _ => panic!("{out:?}"),
        }
    };
    let e = stat(&mut agent, None);
    assert_eq!((e.uid, e.gid), (Some(meta.uid()), Some(meta.gid())));
    if meta.uid() == 0 {
        assert_eq!(e.owner.as_deref(), Some("root"));
        assert_eq!(e.group.as_deref(), Some("root"));
    }
    assert!(e.xattrs.is_empty(), "not asked for: {e:?}");

    let set = |agent: &mut Agent, pairs: &[(&str, &str)], replace: Option<&str>| {
        agent.call(&Call::SetXattrs {
            path: path.clone(),
            xattrs: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            replace_prefix: replace.map(str::to_string),
        })
    };
    let out = set(
        &mut agent,
        &[
            ("user.e2b.author", "mish"),
            ("user.e2b.tag", "a"),
            ("user.other", "keep"),
        ],
        None,
    );
    assert_eq!(out.events, [Event::Done], "{out:?}");
    let e = stat(&mut agent, Some("user.e2b."));
    let want: BTreeMap<String, String> = [("user.e2b.author", "mish"), ("user.e2b.tag", "a")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    assert_eq!(e.xattrs, want);
    let out = agent.call(&Call::List {
        path: dir.clone(),
        depth: 1,
        xattrs: Some("user.".into()),
    });
    let Event::Entries { entries } = &out.events[0] else {
        panic!("{out:?}")
    };
    assert_eq!(entries[0].xattrs.len(), 3, "{entries:?}");

    // Replacing the prefix's set drops what is not in the new one and
    // leaves other prefixes alone.
    let out = set(&mut agent, &[("user.e2b.tag", "b")], Some("user.e2b."));
    assert_eq!(out.events, [Event::Done], "{out:?}");
    let e = stat(&mut agent, Some("user."));
    assert_eq!(
        e.xattrs.into_iter().collect::<Vec<_>>(),
        [
            ("user.e2b.tag".to_string(), "b".to_string()),
            ("user.other".to_string(), "keep".to_string())
        ]
    );
    let out = set(&mut agent, &[], Some("user.e2b."));
    assert_eq!(out.events, [Event::Done]);
    assert_eq!(stat(&mut agent, Some("user.e2b.")).xattrs.len(), 0);

    let out = agent.call(&Call::RemoveXattr {
        path: path.clone(),
        name: "user.other".into(),
    });
    assert_eq!(out.events, [Event::Done]);
    let out = agent.call(&Call::RemoveXattr {
        path: path.clone(),
        name: "user.other".into(),
    });
    let (code, message) = out.error().unwrap();
    assert_eq!(code, ErrorCode::NotFound, "{message}");
    assert!(
        message.contains("user.other") && message.contains(&path),
        "{message}"
    );
    // A namespace the kernel does not know.
    let out = set(&mut agent, &[("bogus.x", "1")], None);
    let (code, message) = out.error().unwrap();
    assert_eq!(code, ErrorCode::Unsupported, "{message}");
    let out = agent.call(&Call::SetXattrs {
        path: format!("{dir}/none"),
        xattrs: BTreeMap::new(),
        replace_prefix: Some("user.".into()),
    });
    assert_eq!(out.error().unwrap().0, ErrorCode::NotFound);
    std::fs::remove_dir_all(&dir).unwrap();
}
