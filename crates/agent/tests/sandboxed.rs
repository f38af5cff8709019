//! The agent where it belongs: as the command of a real brig sandbox,
//! started from a descriptor (it is not in the template) and speaking the
//! protocol over a socket the host holds. The first end-to-end piece of
//! the daemon's path: host → socket → agent in sandbox → processes.
//! Needs root; skips with a printed reason otherwise.

mod support;

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use brig_core::{SandboxSpec, TemplateRef};
use brig_jail::{Extras, Sandbox, SpawnOptions};
use brig_protocol::message::Call;
use brig_protocol::StreamClass;
use support::{exec, Agent};

fn root_or_skip() -> bool {
    // SAFETY: geteuid cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        if std::env::var("BRIG_TEST_STRICT").is_ok_and(|v| v == "1") {
            panic!("BRIG_TEST_STRICT=1 and this test needs root");
        }
        eprintln!("skipping: sandboxes need root");
    }
    root
}

/// Start brig-agent as the command of a sandbox on `template` and connect;
/// `as_init`: as the sandbox's pid 1, as `brig serve` runs it.
fn agent_in_sandbox(template: TemplateRef, as_init: bool) -> (Sandbox, Agent) {
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    let program =
        std::fs::File::open(env!("CARGO_BIN_EXE_brig-agent")).expect("open the agent binary");
    let mut spec = SandboxSpec::new(vec!["brig-agent".into(), "--stdio".into()]);
    spec.template = template;
    let extras = Extras {
        program: Some(OwnedFd::from(program)),
        stdio: Some(OwnedFd::from(theirs)),
        as_init,
    };
    let opts = SpawnOptions::prepare().expect("prepare");
    let sandbox = Sandbox::spawn_with(&spec, &opts, extras).expect("spawn the agent in a sandbox");
    (sandbox, Agent::connect(ours))
}

fn templates() -> Vec<TemplateRef> {
    let mut t = vec![TemplateRef::Host];
    match std::env::var_os("BRIG_TEST_ROOTFS") {
        Some(r) => t.push(TemplateRef::Dir(r.into())),
        None if std::env::var("BRIG_TEST_STRICT").is_ok_and(|v| v == "1") => {
            panic!("BRIG_TEST_STRICT=1 and BRIG_TEST_ROOTFS is not set")
        }
        None => eprintln!("note: BRIG_TEST_ROOTFS not set; host template only"),
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
