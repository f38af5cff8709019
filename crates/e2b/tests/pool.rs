//! The pre-made sandbox pool for E2B's creates (`pool.rs`): a daemon with a
//! `base+setuid` pool serves `POST /v2/sandboxes {"templateID": "base"}`
//! from it (the `brig_pool_claims_total` metric rises), and the sandbox it
//! serves behaves exactly as one made for the request by a daemon without a
//! pool: user, HOME, the create's env vars, working `sudo`, no_new_privs
//! and capability bounds, mount flags, limits, metadata, timeout. Needs
//! root and the `base` template built in the test home (scripts/test
//! builds it); skips otherwise, fails under BRIG_TEST_STRICT=1.

mod support;

use std::time::Duration;

use brig_agent_client::ExecRequest;
use brig_runtime::PoolTarget;
use serde_json::{json, Value};
use support::root_or_skip;
use support::{planes_with, skip, template_home, Planes};

/// What a sandbox looks like from inside, as `user`.
const PROBE: &str = r#"
id
echo "HOME=$HOME GREETING=$GREETING"
sudo -n id -u
grep -E '^(NoNewPrivs|CapBnd|CapEff|Seccomp):' /proc/self/status
awk '$2 == "/" { print $4 }' /proc/self/mounts | tr , '\n' | grep -xE 'nosuid|nodev' || echo suid
ulimit -n
"#;

fn base_built() -> bool {
    let recipe = brig_template::recipe("base").unwrap();
    let paths = brig_template::Paths::new(&template_home(), "base");
    let ready = brig_template::state(&paths, recipe) == brig_template::State::Ready;
    if !ready {
        skip(&format!(
            "the base template is not built in {} (brig template build base with \
             BRIG_HOME there, or run scripts/test)",
            template_home().display()
        ));
    }
    ready
}

fn daemon(pool: &[&str]) -> Planes {
    let pool: Vec<PoolTarget> = pool.iter().map(|p| PoolTarget::parse(p).unwrap()).collect();
    planes_with(move |c| {
        c.home = Some(template_home());
        c.pool = pool;
    })
}

/// `POST /v2/sandboxes` as the Python client sends it; the sandbox's id.
fn e2b_create(p: &Planes) -> String {
    let body = json!({
        "templateID": "base",
        "timeout": 120,
        "envVars": {"GREETING": "hi there"},
        "metadata": {"who": "pool-test"},
    });
    let resp = ureq::post(&format!("http://{}/v2/sandboxes", p.api))
        .set("X-API-KEY", &p.f.key)
        .timeout(Duration::from_secs(60))
        .send_json(body)
        .unwrap_or_else(|e| panic!("create: {e}"));
    assert_eq!(resp.status(), 201);
    let v: Value = resp.into_json().unwrap();
    v["sandboxID"].as_str().unwrap().to_string()
}

/// The probe's output as `user`, and what the daemon records and enforces.
fn observe(p: &Planes, id: &str) -> (String, Value) {
    let tenant = p.f.manager.authenticate(&p.f.key).unwrap().tenant;
    let sb = p
        .state
        .sandboxes
        .get(id)
        .expect("registered with the E2B layer");
    assert_eq!(sb.default_user, "user");
    let req = ExecRequest {
        argv: vec!["bash".into(), "-c".into(), PROBE.into()],
        user: Some("user".into()),
        ..ExecRequest::default()
    };
    let (out, err, status) =
        p.f.manager
            .exec(&tenant, &sb.id, &req)
            .unwrap()
            .wait_with_output()
            .unwrap();
    assert!(status.success(), "{}", String::from_utf8_lossy(&err));
    let record = p.f.manager.get(&tenant, &sb.id).unwrap();
    let metrics = p.f.manager.metrics(&tenant, &sb.id).unwrap();
    let facts = json!({
        "labels": record.labels,
        "state": record.state.to_string(),
        // Rounded: the two sandboxes are created at different moments.
        "ttl_s": ((record.expires_at - record.created_at) as f64 / 1000.0).round(),
        "memory_limit": metrics.memory_limit_bytes,
        "disk_total": metrics.disk_total_bytes,
    });
    (String::from_utf8_lossy(&out).into_owned(), facts)
}

/// `brig_pool_claims_total` as the daemon's `/metrics` shows it.
fn pool_claims(p: &Planes) -> u64 {
    let text = brig_runtime::Metrics::new().encode(&p.f.manager);
    text.lines()
        .find_map(|l| l.strip_prefix("brig_pool_claims_total "))
        .map(|n| n.trim().parse::<f64>().unwrap() as u64)
        .unwrap_or_else(|| panic!("no brig_pool_claims_total in {text}"))
}

fn wait_for_idle(p: &Planes, name: &str, want: usize) {
    for _ in 0..400 {
        if p.f
            .manager
            .pool_sizes()
            .iter()
            .any(|(n, idle, _)| n == name && *idle == want)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!(
        "the {name} pool did not reach {want}: {:?}",
        p.f.manager.pool_sizes()
    );
}

#[test]
fn e2b_creates_are_served_from_a_setuid_pool_and_behave_as_fresh_ones() {
    if !root_or_skip() || !base_built() {
        return;
    }
    // The template is built: its pool fills at start, from its rootfs.
    let pooled = daemon(&["base+setuid=1"]);
    let sizes = pooled.f.manager.pool_sizes();
    assert_eq!(sizes.len(), 1, "{sizes:?}");
    assert_eq!(
        (sizes[0].0.as_str(), sizes[0].2),
        ("base+setuid", 1),
        "named as --pool spells it"
    );
    wait_for_idle(&pooled, "base+setuid", 1);
    let before = pool_claims(&pooled);
    let id = e2b_create(&pooled);
    assert_eq!(
        pool_claims(&pooled),
        before + 1,
        "the E2B create was served from the pool"
    );
    let (seen, facts) = observe(&pooled, &id);

    // The same request to a daemon that makes every sandbox on demand.
    let fresh = daemon(&[]);
    assert!(fresh.f.manager.pool_sizes().is_empty());
    let fresh_id = e2b_create(&fresh);
    assert_eq!(pool_claims(&fresh), 0);
    let (want, want_facts) = observe(&fresh, &fresh_id);

    assert_eq!(seen, want, "a pooled sandbox looks like a fresh one inside");
    assert_eq!(facts, want_facts, "and to the daemon");
    // And what they look like is right.
    assert!(seen.contains("uid=1000(user)"), "{seen}");
    assert!(seen.contains("HOME=/home/user GREETING=hi there"), "{seen}");
    assert!(seen.contains("\n0\n"), "passwordless sudo works: {seen}");
    assert!(seen.contains("NoNewPrivs:\t0"), "{seen}");
    assert_eq!(facts["labels"], json!({"who": "pool-test"}));
    assert_eq!(facts["ttl_s"], json!(120.0));
    assert_eq!(facts["state"], "running");

    // The pool refills; a create of the template without setuid (the
    // native API's) is not served from it.
    wait_for_idle(&pooled, "base+setuid", 1);
    let tenant = pooled.f.manager.authenticate(&pooled.f.key).unwrap().tenant;
    let plain = pooled
        .f
        .manager
        .create(
            &tenant,
            brig_runtime::CreateConfig {
                template: brig_core::TemplateRef::Named("base".into()),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(pool_claims(&pooled), before + 1, "no setuid, no claim");
    let req = ExecRequest {
        argv: vec!["sudo".into(), "-n".into(), "true".into()],
        user: Some("user".into()),
        ..ExecRequest::default()
    };
    let (_, _, status) = pooled
        .f
        .manager
        .exec(&tenant, &plain.id, &req)
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(!status.success(), "sudo must not work without setuid");
}

#[test]
fn a_pool_of_an_unbuilt_template_waits_for_its_first_create() {
    if !root_or_skip() || !base_built() {
        return;
    }
    // A home whose templates dir has no `base` yet.
    let home = tempfile::tempdir().unwrap();
    let p = planes_with(|c| {
        c.home = Some(home.path().to_path_buf());
        c.pool = vec![PoolTarget::parse("base+setuid=1").unwrap()];
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        p.f.manager.pool_sizes(),
        vec![("base+setuid".to_string(), 0, 1)],
        "nothing is made (or built) for an unbuilt template"
    );
    // Now "build" it: the test home's rootfs and stamp, linked in. The
    // pool notices on the first create that resolves it.
    let dir = brig_template::templates_dir(home.path());
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(
        brig_template::templates_dir(&template_home()).join("base"),
        dir.join("base"),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(p.f.manager.pool_sizes()[0].1, 0, "not before a create");
    let id = e2b_create(&p);
    assert_eq!(pool_claims(&p), 0, "the first create was made on demand");
    wait_for_idle(&p, "base+setuid", 1);
    let second = e2b_create(&p);
    assert_eq!(pool_claims(&p), 1, "the second came from the pool");
    assert_ne!(id, second);
}
