//! The agent where it belongs: as the command of a real brig sandbox,
//! started from a descriptor (it is not in the template) and speaking the
//! protocol over a socket the host holds. The first end-to-end piece of
//! the daemon's path: host → socket → agent in sandbox → processes.
//! Needs root; skips with a printed reason otherwise.

mod support;

use brig_core::TemplateRef;
use brig_jail::Sandbox;
use brig_protocol::message::Call;
use brig_protocol::StreamClass;
use brig_test_support::root_or_skip;
use support::{exec, Agent};

/// Start brig-agent as the command of a sandbox on `template` and connect;
/// `as_init`: as the sandbox's pid 1, as `brig serve` runs it.
fn agent_in_sandbox(template: TemplateRef, as_init: bool) -> (Sandbox, Agent) {
    let agent = std::path::Path::new(env!("CARGO_BIN_EXE_brig-agent"));
    let (sandbox, sock) = brig_test_support::agent_in_sandbox(agent, template, as_init);
    (sandbox, Agent::connect(sock))
}

fn templates() -> Vec<TemplateRef> {
    let mut t = vec![TemplateRef::Host];
    match brig_test_support::rootfs() {
        Some(r) => t.push(TemplateRef::Dir(r)),
        None => brig_test_support::skip("BRIG_TEST_ROOTFS not set; host template only"),
    }
    t
}

#[test]
fn the_agent_runs_commands_inside_the_sandbox() {
    if !root_or_skip() {
        return;
    }
    for (template, as_init) in templates()
        .into_iter()
        .flat_map(|t| [(t.clone(), false), (t, true)])
    {
        let (sandbox, mut agent) = agent_in_sandbox(template.clone(), as_init);
        let id = sandbox.id().to_string();
        let run = |agent: &mut Agent, argv: &[&str]| {
            let s = agent.open(StreamClass::EXEC, &exec(argv));
            agent.close(s);
            agent.collect(s)
        };
        // The commands run in the sandbox: its hostname, its pid namespace
        // (the agent is pid 2 under brig's init), its user namespace.
        let out = run(
            &mut agent,
            &[
                "sh",
                "-c",
                "hostname; cat /proc/self/uid_map; echo $$ > /tmp/x; cat /tmp/x",
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], id, "{template}: {text}");
        let map: Vec<u64> = lines[1]
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert!(map[0] == 0 && map[1] >= 0x1000_0000, "{template}: {text}");
        assert!(
            lines[2].parse::<u32>().unwrap() < 100,
            "{template}: small pid in its own namespace: {text}"
        );
        assert_eq!(out.exited(), Some((Some(0), None)), "{template}");

        // As pid 1 the agent is the sandbox's init: it reaps what is
        // orphaned to it (a zombie would otherwise hold a pid forever).
        if as_init {
            let out = run(
                &mut agent,
                &["sh", "-c", "cat /proc/1/comm; sleep 0.05 & exit 0"],
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "brig-agent\n",
                "{template}"
            );
            std::thread::sleep(std::time::Duration::from_millis(300));
            let out = run(
                &mut agent,
                &[
                    "sh",
                    "-c",
                    "grep -l '^State:.*Z' /proc/[0-9]*/status || true",
                ],
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "",
                "{template}: no zombie under the agent as init"
            );
        }

        // Files the agent writes live in the sandbox's writable layer.
        let listing = agent.call(&Call::Stat {
            path: "/tmp/x".into(),
            xattrs: None,
        });
        assert!(listing.error().is_none(), "{template}: {listing:?}");

        // Hanging up ends the agent, and with it the sandbox.
        agent.hang_up();
        let exit = sandbox.wait().expect("sandbox ends when the agent does");
        assert_eq!(
            exit.code, 0,
            "{template}: the agent exits cleanly on hang-up"
        );
        eprintln!(
            "{template}: agent in sandbox {id} ran `sh` as pid {} and exited cleanly",
            lines[2]
        );
    }
}

/// A process started as a user gets that user's uid, gid and supplementary
/// groups from the sandbox's own /etc/passwd and /etc/group, and HOME,
/// USER, LOGNAME and PATH, under the request's variables. File entries
/// name owners from the same files.
#[test]
fn processes_run_as_the_sandbox_s_users() {
    if !root_or_skip() {
        return;
    }
    let Some(rootfs) = brig_test_support::rootfs_or_skip() else {
        return;
    };
    let (sandbox, mut agent) = agent_in_sandbox(TemplateRef::Dir(rootfs), true);
    let run = |agent: &mut Agent, req: &brig_protocol::message::ExecRequest| {
        let s = agent.open(StreamClass::EXEC, req);
        agent.close(s);
        let out = agent.collect(s);
        assert_eq!(out.exited(), Some((Some(0), None)), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Two groups that list `nobody`, written into this sandbox's
    // /etc/group (its writable layer; the template is untouched).
    run(
        &mut agent,
        &exec(&[
            "sh",
            "-c",
            "echo 'brigtest:x:4242:root,nobody' >> /etc/group; \
             echo 'brigother:x:4343:x,nobody' >> /etc/group; \
             echo 'brigstaff:x:4444:' >> /etc/group; touch /tmp/mine; \
             chown 65534:4444 /tmp/mine",
        ]),
    );
    let mut req = exec(&[
        "sh",
        "-c",
        "id -u; id -g; id -G; echo \"$HOME|$USER|$LOGNAME|$PATH|$EXTRA\"",
    ]);
    req.user = Some("nobody".into());
    req.env.insert("EXTRA".into(), "x".into());
    let out = run(&mut agent, &req);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "65534", "{out}");
    assert_eq!(lines[1], "65534", "{out}");
    let mut groups: Vec<&str> = lines[2].split_whitespace().collect();
    groups.sort();
    assert_eq!(groups, ["4242", "4343", "65534"], "{out}");
    let env: Vec<&str> = lines[3].split('|').collect();
    assert_eq!(&env[..3], ["/nonexistent", "nobody", "nobody"], "{out}");
    assert!(env[3].contains("/usr/bin"), "PATH: {out}");
    assert_eq!(env[4], "x", "{out}");

    // The request's variables win over the user's.
    req.env.insert("HOME".into(), "/tmp".into());
    req.argv = vec!["sh".into(), "-c".into(), "echo $HOME".into()];
    assert_eq!(run(&mut agent, &req), "/tmp\n");

    // A bare uid with no user name: that uid, its account's environment,
    // but only its own gid as group (no name to look groups up by is
    // given, but the account is found by uid).
    let mut req = exec(&["sh", "-c", "id -u; id -G; echo $USER"]);
    req.uid = Some(65534);
    req.gid = Some(65534);
    let out = run(&mut agent, &req);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "65534", "{out}");
    assert_eq!(lines[2], "nobody", "{out}");

    // Root keeps root's groups only: no leftover from the agent.
    let out = run(&mut agent, &exec(&["sh", "-c", "id -G"]));
    assert!(!out.contains("4343"), "{out}");

    // Owners by name from the sandbox's files, the id where none.
    let out = agent.call(&Call::Stat {
        path: "/tmp/mine".into(),
        xattrs: None,
    });
    let brig_protocol::message::Event::Stat { entry } = &out.events[0] else {
        panic!("{out:?}")
    };
    assert_eq!((entry.uid, entry.gid), (Some(65534), Some(4444)));
    assert_eq!(entry.owner.as_deref(), Some("nobody"));
    assert_eq!(entry.group.as_deref(), Some("brigstaff"));

    // User extended attributes (envd's file metadata) on both writable
    // places of a template sandbox: the root's layer and /tmp.
    run(&mut agent, &exec(&["touch", "/root/attr"]));
    for path in ["/root/attr", "/tmp/mine"] {
        let out = agent.call(&Call::SetXattrs {
            path: path.into(),
            xattrs: [("user.e2b.k".to_string(), "v".to_string())].into(),
            replace_prefix: Some("user.e2b.".into()),
        });
        assert_eq!(
            out.events,
            [brig_protocol::message::Event::Done],
            "{path}: {out:?}"
        );
        let out = agent.call(&Call::Stat {
            path: path.into(),
            xattrs: Some("user.".into()),
        });
        let brig_protocol::message::Event::Stat { entry } = &out.events[0] else {
            panic!("{out:?}")
        };
        assert_eq!(
            entry.xattrs.get("user.e2b.k").map(String::as_str),
            Some("v"),
            "{path}"
        );
    }
    agent.hang_up();
    sandbox.wait().expect("sandbox ends");
}
