//! The lifecycle events (`events.rs`): what happens to a sandbox is told
//! to a subscriber in order, and by the time its end is told, the manager
//! no longer runs it. Needs root; skips with a printed reason otherwise,
//! and fails instead under BRIG_TEST_STRICT=1.

use std::time::{Duration, Instant};

use brig_runtime::{CreateConfig, Event, EventKind, SandboxState};
use brig_test_support::{manager_fixture, root_or_skip};
use tokio::sync::broadcast::error::TryRecvError;
use tokio::sync::broadcast::Receiver;

/// The next event, within `limit`.
fn next(events: &mut Receiver<Event>, limit: Duration) -> Event {
    let deadline = Instant::now() + limit;
    loop {
        match events.try_recv() {
            Ok(e) => return e,
            Err(TryRecvError::Empty) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("no event within {limit:?}: {e:?}"),
        }
    }
}

#[test]
fn create_pause_resume_and_delete_are_told_in_order() {
    if !root_or_skip() {
        return;
    }
    let f = manager_fixture(|_| {});
    let m = &f.manager;
    let tenant = m.authenticate(&f.key).unwrap().tenant;
    let mut events = m.subscribe();
    let id = m.create(&tenant, CreateConfig::default()).unwrap().id;
    m.pause(&tenant, &id).unwrap();
    m.resume(&tenant, &id, None).unwrap();
    m.delete(&tenant, &id).unwrap();
    let mut kinds = Vec::new();
    for _ in 0..4 {
        let e = next(&mut events, Duration::from_secs(10));
        assert_eq!((&e.id, &e.tenant), (&id, &tenant), "{e:?}");
        kinds.push(e.kind);
    }
    assert_eq!(
        kinds[..3],
        [EventKind::Created, EventKind::Paused, EventKind::Resumed]
    );
    assert!(
        matches!(
            kinds[3],
            EventKind::Ended {
                state: SandboxState::Stopped,
                ..
            }
        ),
        "{kinds:?}"
    );
    assert!(!m.is_live(&id));
}

/// A sandbox that dies by itself (its agent killed from the host) is told
/// as `dead`, once the sweeper noticed, and is no longer live by then.
#[test]
fn a_sandbox_that_dies_is_told_as_dead() {
    if !root_or_skip() {
        return;
    }
    let f = manager_fixture(|_| {});
    let m = &f.manager;
    let tenant = m.authenticate(&f.key).unwrap().tenant;
    let record = m.create(&tenant, CreateConfig::default()).unwrap();
    let mut events = m.subscribe();
    let pid = record.init_pid.expect("a running sandbox has an init");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let e = next(&mut events, Duration::from_secs(20));
    assert_eq!(e.id, record.id);
    assert!(
        matches!(
            e.kind,
            EventKind::Ended {
                state: SandboxState::Dead,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!m.is_live(&record.id));
}
