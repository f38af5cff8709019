//! The manager's own logic — the record before the launch, the pool,
//! expiry, pause and resume, stopping with or without its sandboxes, and
//! re-adoption by a new manager — on the fake tier of brig-test-support:
//! the real agent as a plain host process, no isolation, no root needed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use brig_agent_client::ExecRequest;
use brig_core::{Limits, SandboxId, TemplateRef, Tier};
use brig_runtime::manager::OnStop;
use brig_runtime::{
    CreateConfig, EndCause, ManagerConfig, NewSandbox, PoolTarget, SandboxManager, SandboxState,
    Scope, Store, TenantId,
};
use brig_test_support::agent_bin;
use brig_test_support::fake_tier::{Call, FakeTier};

struct Setup {
    home: tempfile::TempDir,
    tier: FakeTier,
    tenant: TenantId,
}

impl Setup {
    fn new() -> Setup {
        let home = tempfile::tempdir().unwrap();
        let store = Store::open_in(home.path()).unwrap();
        let key = store.ensure_initial_key().unwrap().unwrap();
        let tenant = store.authenticate(&key).unwrap().tenant;
        Setup {
            home,
            tier: FakeTier::new(agent_bin()),
            tenant,
        }
    }

    /// A manager over this setup's store and fake tier, with `pool`
    /// pre-made sandboxes of `host`.
    fn manager(&self, pool: usize) -> Arc<SandboxManager> {
        let mut config = ManagerConfig::new();
        config.sweep_interval = Duration::from_millis(50);
        config.pool = vec![PoolTarget {
            template: TemplateRef::Host,
            setuid: false,
            size: pool,
        }];
        let store = Store::open_in(self.home.path()).unwrap();
        let tier: Arc<dyn Tier> = Arc::new(self.tier.clone());
        SandboxManager::start(store, config, vec![tier]).unwrap()
    }
}

fn echo(m: &SandboxManager, tenant: &TenantId, id: &SandboxId, text: &str) -> String {
    let req = ExecRequest {
        argv: vec!["echo".into(), text.into()],
        ..ExecRequest::default()
    };
    let (out, _, status) = m
        .exec(tenant, id, &req)
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(status.success());
    String::from_utf8(out).unwrap()
}

fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

#[test]
fn the_record_is_written_before_the_launch_and_a_failed_launch_leaves_it_dead() {
    let s = Setup::new();
    let m = s.manager(0);
    s.tier.fail_launches(1);
    let err = m.create(&s.tenant, CreateConfig::default()).unwrap_err();
    assert!(err.to_string().contains("cannot start a sandbox"), "{err}");
    let Some(Call::Launch(id)) = s.tier.calls().into_iter().next() else {
        panic!("no launch: {:?}", s.tier.calls());
    };
    // The launch was for an id that has a record: written first.
    let record = m.store().get_sandbox(Scope::Daemon, &id).unwrap();
    assert_eq!(record.state, SandboxState::Dead);
    assert_eq!(record.end, Some(EndCause::CreateFailed));
    // The next create works, on a new id.
    let ok = m.create(&s.tenant, CreateConfig::default()).unwrap();
    assert_ne!(ok.id, id);
    assert_eq!(ok.state, SandboxState::Running);
    assert_eq!(echo(&m, &s.tenant, &ok.id, "hi"), "hi\n");
    // Deleted: by whom is recorded.
    let gone = m.create(&s.tenant, CreateConfig::default()).unwrap();
    let deleted = m.delete(&s.tenant, &gone.id).unwrap();
    assert_eq!(
        deleted.end,
        Some(EndCause::Deleted {
            by: s.tenant.as_str().to_string()
        })
    );
    m.shutdown();
    assert_eq!(s.tier.live(), 0, "shutdown ends every sandbox");
    let ended = m.store().get_sandbox(Scope::Daemon, &ok.id).unwrap();
    assert_eq!(ended.end, Some(EndCause::Shutdown), "{ended:?}");
}

#[test]
fn creates_are_served_from_the_pool_with_their_limits_applied() {
    let s = Setup::new();
    let m = s.manager(2);
    assert!(eventually(Duration::from_secs(10), || s.tier.live() == 2));
    let launches_before = s
        .tier
        .calls()
        .iter()
        .filter(|c| matches!(c, Call::Launch(_)))
        .count();
    let config = CreateConfig {
        limits: Limits {
            memory: brig_core::parse_size("300M").unwrap(),
            ..Limits::default()
        },
        ..CreateConfig::default()
    };
    let record = m.create(&s.tenant, config).unwrap();
    let calls = s.tier.calls();
    // The sandbox served was made before the create (its launch is among
    // the pool's), and got the create's limits.
    assert!(
        calls[..launches_before + 1]
            .iter()
            .any(|c| *c == Call::Launch(record.id.clone())),
        "{calls:?}"
    );
    assert!(
        calls.contains(&Call::SetLimits(record.id.clone())),
        "{calls:?}"
    );
    assert_eq!(m.pool_claims(), 1);
    assert_eq!(echo(&m, &s.tenant, &record.id, "pooled"), "pooled\n");
    // The pool refills.
    assert!(eventually(Duration::from_secs(10), || s.tier.live() == 3));
    m.shutdown();
    assert_eq!(s.tier.live(), 0);
}

#[test]
fn an_expired_sandbox_is_ended_by_the_sweeper() {
    let s = Setup::new();
    let m = s.manager(0);
    let config = CreateConfig {
        timeout: Some(Duration::from_millis(300)),
        ..CreateConfig::default()
    };
    let record = m.create(&s.tenant, config).unwrap();
    assert!(eventually(Duration::from_secs(5), || {
        m.get(&s.tenant, &record.id).unwrap().state == SandboxState::Stopped
    }));
    assert_eq!(
        m.get(&s.tenant, &record.id).unwrap().end,
        Some(EndCause::Timeout)
    );
    assert!(s.tier.calls().contains(&Call::Kill(record.id.clone())));
    assert!(!m.is_live(&record.id));
    m.shutdown();
}

#[test]
fn pause_and_resume_go_through_the_tier_and_a_paused_sandbox_refuses_work() {
    let s = Setup::new();
    let m = s.manager(0);
    let id = m.create(&s.tenant, CreateConfig::default()).unwrap().id;
    let paused = m.pause(&s.tenant, &id).unwrap();
    assert_eq!(paused.state, SandboxState::Paused);
    assert!(s.tier.calls().contains(&Call::Pause(id.clone())));
    let err = m
        .exec(
            &s.tenant,
            &id,
            &ExecRequest {
                argv: vec!["true".into()],
                ..ExecRequest::default()
            },
        )
        .unwrap_err();
    assert_eq!(err.kind(), brig_runtime::ErrorKind::Paused, "{err}");
    let resumed = m.resume(&s.tenant, &id, None).unwrap();
    assert_eq!(resumed.state, SandboxState::Running);
    assert!(s.tier.calls().contains(&Call::Resume(id.clone())));
    assert_eq!(echo(&m, &s.tenant, &id, "back"), "back\n");
    m.shutdown();
}

/// A pause the host did not get done in time (a v1 freezer that did not
/// settle) is "try again", not a failure: the sandbox runs on, unharmed,
/// and the next pause works.
#[test]
fn a_pause_the_tier_could_not_finish_says_try_again_and_leaves_the_sandbox_running() {
    let s = Setup::new();
    let m = s.manager(0);
    let id = m.create(&s.tenant, CreateConfig::default()).unwrap().id;
    s.tier.fail_pauses(1);
    let err = m.pause(&s.tenant, &id).unwrap_err();
    assert_eq!(err.kind(), brig_runtime::ErrorKind::Unavailable, "{err}");
    let said = brig_runtime::chain(&err);
    assert!(said.contains("try again"), "{said}");
    assert_eq!(m.get(&s.tenant, &id).unwrap().state, SandboxState::Running);
    assert_eq!(echo(&m, &s.tenant, &id, "still"), "still\n");
    assert_eq!(m.pause(&s.tenant, &id).unwrap().state, SandboxState::Paused);
    m.shutdown();
}

#[test]
fn a_new_manager_adopts_what_the_last_one_kept_and_settles_the_rest() {
    let s = Setup::new();
    let m = s.manager(1);
    assert!(eventually(Duration::from_secs(10), || s.tier.live() == 1));
    let mut labels = BTreeMap::new();
    labels.insert("keep".to_string(), "yes".to_string());
    let kept = m
        .create(
            &s.tenant,
            CreateConfig {
                labels,
                timeout: Some(Duration::from_secs(600)),
                env: vec![brig_core::EnvVar::parse("FROM_CREATE=1").unwrap()],
                ..CreateConfig::default()
            },
        )
        .unwrap();
    let paused = m.create(&s.tenant, CreateConfig::default()).unwrap();
    m.pause(&s.tenant, &paused.id).unwrap();
    // A create cut short by a crash: its record says `creating`.
    let cut_short = SandboxId::from_random(0x00c0_ffee);
    m.store()
        .insert_sandbox(&NewSandbox {
            id: cut_short.clone(),
            tenant: s.tenant.clone(),
            template: "host".into(),
            isolation: "process".into(),
            spec: serde_json::Value::Null,
            labels: BTreeMap::new(),
            name: None,
            timeout: Duration::from_secs(60),
            attrs: Default::default(),
        })
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || s.tier.live() == 3));
    m.stop(OnStop::Keep);
    drop(m);
    // Kept: the two sandboxes (released, not killed); the pool's one ended.
    assert!(s.tier.calls().contains(&Call::Release(kept.id.clone())));
    assert!(!s.tier.calls().contains(&Call::Kill(kept.id.clone())));
    assert_eq!(s.tier.live(), 2, "{:?}", s.tier.calls());
    // A stray this daemon's tier runs that no record names.
    let stray = SandboxId::from_random(0x5_7a41);
    s.tier
        .launch(&brig_core::Launch {
            id: stray.clone(),
            template: TemplateRef::Host,
            limits: Limits::default(),
            allow_setuid: false,
            network: brig_core::NetworkAttachment::Loopback,
            volumes: Vec::new(),
        })
        .unwrap()
        .release();

    // The kept one left stopped in a way its tier does not report as
    // paused (a v1 freezer reading FREEZING): it must still be adopted, not
    // lost to a handshake that never comes.
    s.tier.stop_unreported(&kept.id);

    let m = s.manager(0);
    let calls = s.tier.calls();
    assert!(calls.contains(&Call::Adopt(kept.id.clone())), "{calls:?}");
    assert!(
        calls.contains(&Call::Discard(cut_short.clone())),
        "{calls:?}"
    );
    assert!(calls.contains(&Call::Discard(stray.clone())), "{calls:?}");
    let again = m.get(&s.tenant, &kept.id).unwrap();
    assert_eq!(again.state, SandboxState::Running);
    assert_eq!(again.expires_at, kept.expires_at, "the deadline is kept");
    assert_eq!(again.labels, kept.labels);
    assert!(m.was_adopted(&kept.id));
    // Its agent answers, with the create-time environment.
    let req = ExecRequest {
        argv: vec!["sh".into(), "-c".into(), "echo $FROM_CREATE".into()],
        ..ExecRequest::default()
    };
    let (out, _, _) = m
        .exec(&s.tenant, &kept.id, &req)
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert_eq!(out, b"1\n");
    assert_eq!(
        m.get(&s.tenant, &cut_short).unwrap().state,
        SandboxState::Dead
    );
    assert_eq!(
        m.get(&s.tenant, &cut_short).unwrap().end,
        Some(EndCause::CreateFailed)
    );
    // The paused one is still paused, and resumes.
    assert_eq!(
        m.pause_mode(&paused.id),
        Some(brig_runtime::PauseMode::Full)
    );
    m.resume(&s.tenant, &paused.id, None).unwrap();
    assert_eq!(echo(&m, &s.tenant, &paused.id, "resumed"), "resumed\n");
    m.shutdown();
    assert_eq!(s.tier.live(), 0);
}

#[test]
fn a_sandbox_that_ended_while_no_daemon_ran_is_marked_dead() {
    let s = Setup::new();
    let m = s.manager(0);
    let id = m.create(&s.tenant, CreateConfig::default()).unwrap().id;
    m.stop(OnStop::Keep);
    drop(m);
    // It dies while nobody watches.
    s.tier.discard(&id).unwrap();
    let m = s.manager(0);
    assert_eq!(m.get(&s.tenant, &id).unwrap().state, SandboxState::Dead);
    assert_eq!(
        m.get(&s.tenant, &id).unwrap().end,
        Some(EndCause::EndedUnwatched)
    );
    assert!(!m.is_live(&id));
    m.shutdown();
}
