//! API keys in the store, beyond `src/keys.rs`'s unit tests: names, when a
//! key was last used, revoking without locking a tenant out, and a database
//! of schema version 1 (keys without those columns) upgraded in place.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use brig_runtime::{KeyError, Store, UnixMillis};

fn store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open_in(dir.path()).unwrap();
    (dir, store)
}

#[test]
fn a_named_key_lists_with_its_name_and_no_secret() {
    let (_d, s) = store();
    let t = s.create_tenant("acme").unwrap();
    let (info, key) = s.create_named_key(&t, Some("ci runner")).unwrap();
    assert_eq!(info.name.as_deref(), Some("ci runner"));
    assert_eq!(s.authenticate(&key).unwrap().tenant, t);
    let listed = s.list_keys(&t).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, info.id);
    assert_eq!(listed[0].name.as_deref(), Some("ci runner"));
    assert_eq!(listed[0].created_at, info.created_at);
    // What listing carries cannot rebuild the key.
    let shown = format!("{:?}", listed[0]);
    assert!(!shown.contains(&key[18..30]), "{shown}");

    // An empty name is no name.
    let (unnamed, _) = s.create_named_key(&t, Some("")).unwrap();
    assert_eq!(unnamed.name, None);
}

#[test]
fn bad_names_are_refused() {
    let (_d, s) = store();
    let t = s.create_tenant("acme").unwrap();
    for bad in [
        "x".repeat(65),
        "line\nbreak".to_string(),
        "nul\0".to_string(),
    ] {
        let err = s.create_named_key(&t, Some(&bad)).unwrap_err();
        assert!(matches!(err, KeyError::BadName { .. }), "{bad:?}: {err:?}");
    }
    assert!(s.list_keys(&t).unwrap().is_empty(), "nothing was created");
    // 64 characters, not bytes.
    assert!(s.create_named_key(&t, Some(&"é".repeat(64))).is_ok());
}

#[test]
fn last_used_is_recorded_at_most_once_a_minute() {
    let (_d, mut s) = store();
    let now = Arc::new(AtomicI64::new(1_000_000));
    let clock = Arc::clone(&now);
    s.set_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
    let t = s.create_tenant("acme").unwrap();
    let (_, key) = s.create_key(&t).unwrap();
    let last_used = |s: &Store| -> Option<UnixMillis> { s.list_keys(&t).unwrap()[0].last_used_at };
    assert_eq!(last_used(&s), None, "never used yet");

    s.authenticate(&key).unwrap();
    assert_eq!(last_used(&s), Some(1_000_000));
    now.fetch_add(59_000, Ordering::SeqCst);
    s.authenticate(&key).unwrap();
    assert_eq!(
        last_used(&s),
        Some(1_000_000),
        "within the minute: no write"
    );
    now.fetch_add(1_000, Ordering::SeqCst);
    s.authenticate(&key).unwrap();
    assert_eq!(last_used(&s), Some(1_060_000));

    // A refused key is not "used".
    let (id2, key2) = s.create_key(&t).unwrap();
    s.revoke_key(&t, &id2).unwrap();
    assert!(s.authenticate(&key2).is_err());
    let k2 = s
        .list_keys(&t)
        .unwrap()
        .into_iter()
        .find(|k| k.id == id2)
        .unwrap();
    assert_eq!(k2.last_used_at, None);
}

#[test]
fn the_last_active_key_cannot_be_revoked() {
    let (_d, s) = store();
    let t = s.create_tenant("acme").unwrap();
    let (first, first_key) = s.create_key(&t).unwrap();
    let err = s.revoke_key_unless_last(&t, &first).unwrap_err();
    assert!(matches!(err, KeyError::LastKey { .. }), "{err:?}");
    assert!(
        err.to_string().contains("brig keys create"),
        "says how to go on: {err}"
    );
    assert!(s.authenticate(&first_key).is_ok(), "still usable");

    let (second, second_key) = s.create_key(&t).unwrap();
    s.revoke_key_unless_last(&t, &first).unwrap();
    assert!(s.authenticate(&first_key).is_err());
    // Revoking it again: it is no longer there to revoke.
    assert!(matches!(
        s.revoke_key_unless_last(&t, &first),
        Err(KeyError::NotFound { .. })
    ));
    // Now `second` is the last one.
    assert!(matches!(
        s.revoke_key_unless_last(&t, &second),
        Err(KeyError::LastKey { .. })
    ));
    assert!(s.authenticate(&second_key).is_ok());
}

#[test]
fn another_tenants_key_is_not_found_and_not_counted() {
    let (_d, s) = store();
    let a = s.create_tenant("a").unwrap();
    let b = s.create_tenant("b").unwrap();
    let (a1, a1_key) = s.create_key(&a).unwrap();
    let (_a2, _) = s.create_key(&a).unwrap();
    let (b1, _) = s.create_key(&b).unwrap();
    assert!(matches!(
        s.revoke_key_unless_last(&b, &a1),
        Err(KeyError::NotFound { .. })
    ));
    assert!(s.authenticate(&a1_key).is_ok());
    // `a` having two keys does not make `b`'s only key revocable.
    assert!(matches!(
        s.revoke_key_unless_last(&b, &b1),
        Err(KeyError::LastKey { .. })
    ));
}

/// A home written by the first schema (keys without `name` and
/// `last_used_at`) opens, is upgraded, and its keys keep working.
#[test]
fn a_version_1_database_is_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(brig_runtime::DB_FILE);
    {
        // The tables of migration 1 that migrations 2 and 3 touch, as
        // committed.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "
            CREATE TABLE tenants (
                id          TEXT PRIMARY KEY,
                name        TEXT NOT NULL UNIQUE,
                created_at  INTEGER NOT NULL
            ) STRICT;
            CREATE TABLE api_keys (
                id          TEXT PRIMARY KEY,
                tenant_id   TEXT NOT NULL REFERENCES tenants(id),
                key_hash    BLOB NOT NULL,
                prefix      TEXT NOT NULL,
                created_at  INTEGER NOT NULL,
                revoked_at  INTEGER
            ) STRICT;
            CREATE TABLE sandboxes (
                id          TEXT PRIMARY KEY CHECK (length(id) = 12),
                tenant_id   TEXT NOT NULL REFERENCES tenants(id),
                template    TEXT NOT NULL,
                isolation   TEXT NOT NULL,
                spec_json   TEXT NOT NULL,
                labels_json TEXT NOT NULL DEFAULT '{}',
                state       TEXT NOT NULL
                            CHECK (state IN ('creating', 'running', 'paused', 'stopped', 'dead')),
                init_pid    INTEGER,
                created_at  INTEGER NOT NULL,
                expires_at  INTEGER NOT NULL,
                ended_at    INTEGER,
                exit_code   INTEGER
            ) STRICT;
            INSERT INTO tenants VALUES ('00000000000a', 'old', 5);
            INSERT INTO api_keys VALUES ('00000000000b', '00000000000a', x'00', 'brig_00000000000b_abcd', 7, NULL);
            PRAGMA user_version = 1;
            ",
        )
        .unwrap();
    }
    let s = Store::open(&path).unwrap();
    assert_eq!(s.schema_version().unwrap(), brig_runtime::SCHEMA_VERSION);
    let t = s.tenant_by_name("old").unwrap().unwrap().id;
    let keys = s.list_keys(&t).unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0].created_at, 7);
    assert_eq!(keys[0].name, None);
    assert_eq!(keys[0].last_used_at, None);
    let (_, key) = s.create_named_key(&t, Some("new")).unwrap();
    assert_eq!(s.authenticate(&key).unwrap().tenant, t);
}

/// Who may do what with keys and tenants: the first key is the admin key;
/// a tenant key manages its own tenant's tenant keys and nothing else; the
/// last admin key and a tenant's last key cannot be revoked; an expired
/// key authenticates nothing; a removed tenant's keys stop working and its
/// name is free again; the default tenant and a tenant with live sandboxes
/// cannot be removed.
#[test]
fn roles_decide_who_manages_keys_and_tenants() {
    use brig_runtime::{NewKey, Role, TenantError};
    let (_d, s) = store();
    let admin_key = s.ensure_initial_key().unwrap().unwrap();
    let admin = s.authenticate(&admin_key).unwrap();
    assert_eq!(admin.role, Role::Admin);

    let acme = s.add_tenant("acme").unwrap();
    assert!(matches!(
        s.add_tenant("acme"),
        Err(TenantError::Exists { .. })
    ));
    assert!(matches!(
        s.add_tenant("Bad Name"),
        Err(TenantError::BadName { .. })
    ));
    let names: Vec<String> = s
        .list_tenants()
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["default", "acme"]);

    // The admin makes acme's first key; acme's key makes another of its own.
    let (_, acme_key) = s
        .create_key_as(&admin, &acme.id, &NewKey::default())
        .unwrap();
    let acme_p = s.authenticate(&acme_key).unwrap();
    assert_eq!((acme_p.role, &acme_p.tenant), (Role::Tenant, &acme.id));
    let (acme2, _) = s
        .create_key_as(&acme_p, &acme.id, &NewKey::default())
        .unwrap();
    // ... but no admin key, and nothing for another tenant.
    let admin_role = NewKey {
        role: Some(Role::Admin),
        ..NewKey::default()
    };
    assert!(matches!(
        s.create_key_as(&acme_p, &acme.id, &admin_role),
        Err(KeyError::Forbidden { .. })
    ));
    assert!(matches!(
        s.create_key_as(&acme_p, &admin.tenant, &NewKey::default()),
        Err(KeyError::Forbidden { .. })
    ));
    // A tenant key cannot revoke the admin key (another tenant's: not
    // found), nor an admin key in its own tenant.
    assert!(matches!(
        s.revoke_key_as(&acme_p, &admin.key),
        Err(KeyError::NotFound { .. })
    ));
    let (default_tenant_key, _) = s
        .create_key_as(&admin, &admin.tenant, &NewKey::default())
        .unwrap();
    let default_p = brig_runtime::Principal {
        tenant: admin.tenant.clone(),
        key: default_tenant_key.id.clone(),
        role: Role::Tenant,
    };
    assert!(matches!(
        s.revoke_key_as(&default_p, &admin.key),
        Err(KeyError::Forbidden { .. })
    ));
    // The last admin key stays, even for the admin.
    assert!(matches!(
        s.revoke_key_as(&admin, &admin.key),
        Err(KeyError::LastAdmin { .. })
    ));
    // acme revokes its own second key; its last one stays.
    s.revoke_key_as(&acme_p, &acme2.id).unwrap();
    assert!(matches!(
        s.revoke_key_as(&acme_p, &acme_p.key),
        Err(KeyError::LastKey { .. })
    ));
    // A second admin key lets the first go.
    let (_, admin2_key) = s.create_key_as(&admin, &admin.tenant, &admin_role).unwrap();
    let admin2 = s.authenticate(&admin2_key).unwrap();
    s.revoke_key_as(&admin2, &admin.key).unwrap();
    assert!(s.authenticate(&admin_key).is_err());

    // Expiry: a zero lifetime is refused.
    let past = NewKey {
        expires_in: Some(std::time::Duration::ZERO),
        ..NewKey::default()
    };
    assert!(matches!(
        s.create_key_as(&admin2, &acme.id, &past),
        Err(KeyError::BadExpiry)
    ));

    // Removal: not the default tenant; acme's keys stop working; the
    // name is free again.
    assert!(matches!(
        s.remove_tenant("default"),
        Err(TenantError::Default)
    ));
    s.remove_tenant("acme").unwrap();
    assert!(s.authenticate(&acme_key).is_err());
    let names: Vec<String> = s
        .list_tenants()
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["default"]);
    let again = s.add_tenant("acme").unwrap();
    assert_ne!(again.id, acme.id);
    // The admin sees every key, revoked ones included.
    assert_eq!(s.list_all_keys().unwrap().len(), 5);
}

/// A key with an expiry works until then and is refused after (the store's
/// clock is moved forward).
#[test]
fn an_expired_key_authenticates_nothing() {
    use brig_runtime::NewKey;
    let dir = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicI64::new(1_000_000));
    let clock = Arc::clone(&now);
    let mut s = Store::open_in(dir.path()).unwrap();
    s.set_clock(Arc::new(move || clock.load(Ordering::SeqCst)));
    let t = s.create_tenant("acme").unwrap();
    let (_, key) = s
        .create_key_with(
            &t,
            &NewKey {
                expires_in: Some(std::time::Duration::from_secs(60)),
                ..NewKey::default()
            },
        )
        .unwrap();
    assert_eq!(s.authenticate(&key).unwrap().tenant, t);
    now.store(1_060_000, Ordering::SeqCst);
    let err = s.authenticate(&key).unwrap_err();
    assert!(err.to_string().contains("expired"), "{err}");
    assert!(err.is_rejection());
}
