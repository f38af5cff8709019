//! brig-runtime's store through its public API, against real database files.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use brig_core::SandboxId;
use brig_runtime::{
    Cursor, ErrorKind, ListFilter, NewSandbox, SandboxError, SandboxState, Scope, Store, TenantId,
    DB_FILE, SCHEMA_VERSION,
};

fn new_sandbox(tenant: &TenantId, labels: &[(&str, &str)]) -> NewSandbox {
    NewSandbox {
        id: SandboxId::from_random(rand::random()),
        tenant: tenant.clone(),
        template: "host".into(),
        isolation: "process".into(),
        spec: serde_json::json!({"memory": "512M"}),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        name: None,
        timeout: Duration::from_secs(300),
        attrs: Default::default(),
    }
}

/// Every byte SQLite may have written: the main file, the WAL, the shm.
fn all_db_bytes(home: &Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for suffix in ["", "-wal", "-shm", "-journal"] {
        if let Ok(b) = std::fs::read(home.join(format!("{DB_FILE}{suffix}"))) {
            bytes.extend(b);
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn migrates_an_empty_home_and_reopens() {
    let home = tempfile::tempdir().unwrap();
    {
        let store = Store::open_in(home.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let t = store.create_tenant("acme").unwrap();
        store.insert_sandbox(&new_sandbox(&t, &[])).unwrap();
    }
    let store = Store::open_in(home.path()).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let t = store.tenant_by_name("acme").unwrap().unwrap().id;
    let page = store
        .list_sandboxes(&t, &ListFilter::default(), None, 10)
        .unwrap();
    assert_eq!(page.items.len(), 1, "data survives a reopen");
}

#[test]
fn wal_mode_is_on() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_in(home.path()).unwrap();
    assert_eq!(store.journal_mode().unwrap(), "wal");
    store.create_tenant("acme").unwrap();
    // In WAL mode a commit lands in brig.db-wal while a connection is open.
    assert!(home.path().join(format!("{DB_FILE}-wal")).exists());
    // And the mode is persistent: a second connection sees it too.
    let other = Store::open_in(home.path()).unwrap();
    assert_eq!(other.journal_mode().unwrap(), "wal");
}

#[test]
fn key_secrets_never_reach_the_disk() {
    let home = tempfile::tempdir().unwrap();
    let key = {
        let store = Store::open_in(home.path()).unwrap();
        let key = store.ensure_initial_key().unwrap().unwrap();
        // Look while the data may still sit only in the WAL...
        let secret = key.rsplit('_').next().unwrap();
        assert!(!contains(&all_db_bytes(home.path()), secret.as_bytes()));
        key
    };
    // ...and after close, when it has been checkpointed into brig.db.
    let secret = key.rsplit('_').next().unwrap();
    let bytes = all_db_bytes(home.path());
    assert!(!bytes.is_empty());
    assert!(!contains(&bytes, secret.as_bytes()));
    assert!(!contains(&bytes, key.as_bytes()));
    // A long-enough piece of the secret is not there either (only the 4
    // characters of the display prefix are).
    assert!(!contains(&bytes, &secret.as_bytes()[..12]));

    let store = Store::open_in(home.path()).unwrap();
    assert!(store.authenticate(&key).is_ok());
    assert_eq!(store.ensure_initial_key().unwrap(), None);
}

#[test]
fn every_refused_key_gets_one_public_message() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_in(home.path()).unwrap();
    let t = store.create_tenant("acme").unwrap();
    let (id, key) = store.create_key(&t).unwrap();
    store.revoke_key(&t, &id).unwrap();
    let unknown = format!("brig_ffffffffffff_{}", key.rsplit('_').next().unwrap());
    for bad in ["nonsense", unknown.as_str(), key.as_str()] {
        let err = store.authenticate(bad).unwrap_err();
        assert!(err.is_rejection(), "{err:?}");
        // What clients see does not depend on why: one kind, which each
        // front-end answers with one message (brig-api's
        // `UNAUTHORIZED_MESSAGE`).
        assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err:?}");
    }
}

#[test]
fn tenants_cannot_see_each_other() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_in(home.path()).unwrap();
    let a = store.create_tenant("a").unwrap();
    let b = store.create_tenant("b").unwrap();
    let sa = store.insert_sandbox(&new_sandbox(&a, &[])).unwrap().id;
    let sb = store.insert_sandbox(&new_sandbox(&b, &[])).unwrap().id;

    // Another tenant's id reads as missing, word for word.
    let foreign = store.get_sandbox(Scope::Tenant(&a), &sb).unwrap_err();
    let missing = SandboxId::parse("000000000000").unwrap();
    let absent = store.get_sandbox(Scope::Tenant(&a), &missing).unwrap_err();
    assert!(
        matches!(foreign, SandboxError::NotFound { .. }),
        "{foreign:?}"
    );
    assert!(
        matches!(absent, SandboxError::NotFound { .. }),
        "{absent:?}"
    );
    assert_eq!(
        foreign.to_string().replace(sb.as_str(), "ID"),
        absent.to_string().replace(missing.as_str(), "ID")
    );

    // Nor can it change, extend or list it.
    for to in [SandboxState::Stopped, SandboxState::Dead] {
        assert!(matches!(
            store.transition(Scope::Tenant(&a), &sb, to, None),
            Err(SandboxError::NotFound { .. })
        ));
    }
    assert!(matches!(
        store.extend_timeout(Scope::Tenant(&a), &sb, Duration::from_secs(1)),
        Err(SandboxError::NotFound { .. })
    ));
    let listed: Vec<_> = store
        .list_sandboxes(&a, &ListFilter::default(), None, 100)
        .unwrap()
        .items
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(listed, vec![sa.clone()]);
    assert_eq!(
        store.get_sandbox(Scope::Tenant(&b), &sb).unwrap().state,
        SandboxState::Creating,
        "b's sandbox untouched"
    );
    // The daemon sees both.
    assert!(store.get_sandbox(Scope::Daemon, &sb).is_ok());
}

#[test]
fn pagination_serves_every_row_once_despite_concurrent_inserts() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_in(home.path()).unwrap();
    // A second connection inserts between pages, as another request would.
    let writer = Store::open_in(home.path()).unwrap();
    let t = store.create_tenant("acme").unwrap();
    let other = store.create_tenant("other").unwrap();

    let mut original = HashSet::new();
    for i in 0..47 {
        let labels: &[(&str, &str)] = if i % 2 == 0 { &[("k", "v")] } else { &[] };
        original.insert(store.insert_sandbox(&new_sandbox(&t, labels)).unwrap().id);
    }

    let mut seen = Vec::new();
    let mut cursor: Option<Cursor> = None;
    let mut pages = 0;
    loop {
        // The cursor goes through its text form, as it would over HTTP.
        let after = cursor.as_ref().map(|c| Cursor::parse(c.as_str()).unwrap());
        let page = store
            .list_sandboxes(&t, &ListFilter::default(), after.as_ref(), 5)
            .unwrap();
        assert!(page.items.len() <= 5);
        seen.extend(page.items.iter().map(|r| r.id.clone()));
        pages += 1;
        // Between pages: new rows for this tenant and another, and a row
        // already served is ended (must not reappear or shift anything).
        writer.insert_sandbox(&new_sandbox(&t, &[])).unwrap();
        writer.insert_sandbox(&new_sandbox(&other, &[])).unwrap();
        if let Some(first) = page.items.first() {
            let _ = writer.transition(Scope::Daemon, &first.id, SandboxState::Stopped, None);
        }
        match page.next {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages < 100, "pagination does not terminate");
    }

    let unique: HashSet<_> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "a row was served twice");
    assert!(original.is_subset(&unique), "a row was skipped");
    // Every row served is this tenant's.
    for id in &unique {
        assert_eq!(store.get_sandbox(Scope::Daemon, id).unwrap().tenant, t);
    }
}

#[test]
fn concurrent_writers_do_not_fail_with_busy() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 50;
    let home = tempfile::tempdir().unwrap();
    let tenant = Store::open_in(home.path())
        .unwrap()
        .create_tenant("acme")
        .unwrap();

    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let home = home.path().to_path_buf();
            let tenant = tenant.clone();
            std::thread::spawn(move || {
                // Each thread opens its own connection (and races the others
                // through open and migration check).
                let store = Store::open_in(&home).unwrap();
                for i in 0..PER_THREAD {
                    let rec = store.insert_sandbox(&new_sandbox(&tenant, &[])).unwrap();
                    store.set_running(&rec.id, 1000 + i as u32).unwrap();
                    store.create_key(&tenant).unwrap();
                    store
                        .transition(Scope::Daemon, &rec.id, SandboxState::Paused, None)
                        .unwrap();
                    store
                        .transition(Scope::Daemon, &rec.id, SandboxState::Running, None)
                        .unwrap();
                    // Read-then-write inside an IMMEDIATE transaction (a key
                    // exists, so it writes nothing, but it takes the lock).
                    assert_eq!(store.ensure_initial_key().unwrap(), None);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a writer failed");
    }

    let store = Store::open_in(home.path()).unwrap();
    let filter = ListFilter {
        labels: BTreeMap::new(),
        state: Some(SandboxState::Running),
    };
    let page = store
        .list_sandboxes(&tenant, &filter, None, 10_000)
        .unwrap();
    assert_eq!(page.items.len(), THREADS * PER_THREAD);
    assert_eq!(
        store.list_keys(&tenant).unwrap().len(),
        THREADS * PER_THREAD
    );
}
