//! `/v1/keys` in process: create (the key works at once), list (never a
//! secret), revoke (the key is refused from then on, the last one cannot
//! go), and tenant isolation. The fixture starts a sandbox manager, so
//! these need root; they skip with a printed reason otherwise, and fail
//! under BRIG_TEST_STRICT=1.

mod support;

use axum::http::{Method, StatusCode};
use serde_json::Value;
use support::{assert_error, call, fixture, root_or_skip};

fn ids(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn create_list_revoke() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});

    let (status, created) = call(
        &f.app,
        Method::POST,
        "/v1/keys",
        Some(&f.key),
        Some(r#"{"name": "laptop"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let new_key = created["key"].as_str().unwrap().to_string();
    assert!(new_key.starts_with(&format!("brig_{id}_")), "{created}");
    assert_eq!(created["name"], "laptop");
    assert!(created["created_at"].as_i64().unwrap() > 0, "{created}");

    // The new key works at once, as the same tenant.
    let (status, list) = call(&f.app, Method::GET, "/v1/keys", Some(&new_key), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let listed = ids(&list);
    assert_eq!(listed.len(), 2, "the initial key and the new one: {list}");
    assert!(listed.contains(&id), "{list}");
    let entry = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["id"] == id.as_str())
        .unwrap();
    assert_eq!(entry["name"], "laptop");
    assert!(
        entry["last_used_at"].as_i64().is_some(),
        "it was just used: {entry}"
    );
    // No secret, no hash, no part of the key beyond its id.
    let text = list.to_string();
    assert!(!text.contains(&new_key[18..]), "{text}");
    assert!(!text.contains(&f.key[18..]), "{text}");
    for k in list["items"].as_array().unwrap() {
        let mut fields: Vec<_> = k.as_object().unwrap().keys().cloned().collect();
        fields.sort();
        fields.retain(|f| {
            ![
                "id",
                "name",
                "role",
                "tenant",
                "created_at",
                "expires_at",
                "last_used_at",
            ]
            .contains(&f.as_str())
        });
        assert!(fields.is_empty(), "unexpected fields {fields:?} in {k}");
    }

    // Revoking the key the request comes with is allowed; it is refused
    // from then on, and gone from the list.
    let (status, body) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/keys/{id}"),
        Some(&new_key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    let (status, body) = call(&f.app, Method::GET, "/v1/keys", Some(&new_key), None).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    let (status, list) = call(&f.app, Method::GET, "/v1/keys", Some(&f.key), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert!(!ids(&list).contains(&id), "{list}");
    // Revoked twice: nothing left to revoke.
    let (status, body) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/keys/{id}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    // The tenant's last key (here also the last admin key) stays, with a
    // message saying what to do.
    let only = ids(&list);
    assert_eq!(only.len(), 1, "{list}");
    let (status, body) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/keys/{}", only[0]),
        Some(&f.key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(
        body["message"].as_str().unwrap().contains("create another"),
        "{body}"
    );
    let (status, _) = call(&f.app, Method::GET, "/v1/keys", Some(&f.key), None).await;
    assert_eq!(status, StatusCode::OK, "the last key still works");
}

#[tokio::test(flavor = "multi_thread")]
async fn create_takes_no_body_and_refuses_bad_ones() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let (status, created) = call(&f.app, Method::POST, "/v1/keys", Some(&f.key), None).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["name"], Value::Null, "{created}");

    let long = format!(r#"{{"name": "{}"}}"#, "x".repeat(65));
    for (body, mentions) in [
        (r#"{"nme": "typo"}"#, "nme"),
        ("{not json", "JSON"),
        (long.as_str(), "key name"),
    ] {
        let (status, err) = call(&f.app, Method::POST, "/v1/keys", Some(&f.key), Some(body)).await;
        assert_error(status, &err, StatusCode::BAD_REQUEST, "bad_request");
        assert!(
            err["message"].as_str().unwrap().contains(mentions),
            "{body}: {err}"
        );
    }
    let (_, list) = call(&f.app, Method::GET, "/v1/keys", Some(&f.key), None).await;
    assert_eq!(ids(&list).len(), 2, "bad requests made no key: {list}");

    for uri in ["/v1/keys/nonsense", "/v1/keys/0123456789ab"] {
        let (status, err) = call(&f.app, Method::DELETE, uri, Some(&f.key), None).await;
        assert_error(status, &err, StatusCode::NOT_FOUND, "not_found");
    }
    for (method, uri) in [
        (Method::GET, "/v1/keys"),
        (Method::POST, "/v1/keys"),
        (Method::DELETE, "/v1/keys/0123456789ab"),
    ] {
        let (status, err) = call(&f.app, method, uri, Some("not-a-key"), None).await;
        assert_error(status, &err, StatusCode::UNAUTHORIZED, "unauthorized");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_see_and_revoke_only_their_own_keys() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let (_, mine) = call(&f.app, Method::GET, "/v1/keys", Some(&f.key), None).await;
    let (_, theirs) = call(&f.app, Method::GET, "/v1/keys", Some(&f.other_key), None).await;
    let (mine, theirs) = (ids(&mine), ids(&theirs));
    assert_eq!(mine.len(), 1);
    assert_eq!(theirs.len(), 1);
    assert_ne!(mine, theirs);

    // A second key for the first tenant, so "last key" is not why the
    // other tenant's attempt fails.
    let (status, created) = call(&f.app, Method::POST, "/v1/keys", Some(&f.key), None).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (_, theirs_now) = call(&f.app, Method::GET, "/v1/keys", Some(&f.other_key), None).await;
    assert_eq!(ids(&theirs_now), theirs, "the new key is not theirs to see");

    // Same answer as for a key that does not exist.
    let (status, err) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/keys/{}", mine[0]),
        Some(&f.other_key),
        None,
    )
    .await;
    assert_error(status, &err, StatusCode::NOT_FOUND, "not_found");
    let (status, _) = call(&f.app, Method::GET, "/v1/keys", Some(&f.key), None).await;
    assert_eq!(status, StatusCode::OK, "the first tenant's key still works");
}

/// Roles through the API: the admin key creates a tenant (with its first
/// key), lists and removes tenants, and makes keys for any tenant; a
/// tenant key gets 403 for all of that, cannot make an admin key, and
/// cannot touch another tenant's keys or sandboxes; an expiring key
/// reports when it expires.
#[tokio::test(flavor = "multi_thread")]
async fn admin_and_tenant_keys_through_the_api() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let admin = f.key.clone();
    let (status, created) = call(
        &f.app,
        Method::POST,
        "/v1/tenants",
        Some(&admin),
        Some(r#"{"name": "acme"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["name"], "acme");
    let acme = created["key"]["key"].as_str().unwrap().to_string();
    let (status, list) = call(&f.app, Method::GET, "/v1/tenants", Some(&admin), None).await;
    assert_eq!(status, StatusCode::OK);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        names.contains(&"acme") && names.contains(&"default"),
        "{list}"
    );

    // A tenant key: no tenants, no admin keys, nothing of another tenant.
    for (method, uri, body) in [
        (Method::GET, "/v1/tenants", None),
        (Method::POST, "/v1/tenants", Some(r#"{"name": "evil"}"#)),
        (Method::DELETE, "/v1/tenants/default", None),
        (Method::POST, "/v1/keys", Some(r#"{"role": "admin"}"#)),
        (Method::POST, "/v1/keys", Some(r#"{"tenant": "default"}"#)),
        (Method::GET, "/v1/keys?tenant=all", None),
    ] {
        let (status, body) = call(&f.app, method.clone(), uri, Some(&acme), body).await;
        assert_error(status, &body, StatusCode::FORBIDDEN, "forbidden");
        assert!(
            body["message"].as_str().unwrap().contains("admin key"),
            "{method} {uri}: {body}"
        );
    }
    // It lists only its own tenant's keys.
    let (_, own) = call(&f.app, Method::GET, "/v1/keys", Some(&acme), None).await;
    assert!(
        own["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|k| k["tenant"] == "acme"),
        "{own}"
    );
    // The admin makes an expiring key for acme; it says when it expires.
    let (status, made) = call(
        &f.app,
        Method::POST,
        "/v1/keys",
        Some(&admin),
        Some(r#"{"tenant": "acme", "name": "ci", "expires": "1h"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(
        (made["tenant"].as_str(), made["role"].as_str()),
        (Some("acme"), Some("tenant"))
    );
    let created_at = made["created_at"].as_i64().unwrap();
    let expires = made["expires_at"].as_i64().unwrap();
    assert!((expires - created_at - 3_600_000).abs() < 5_000, "{made}");
    let (status, body) = call(
        &f.app,
        Method::POST,
        "/v1/keys",
        Some(&admin),
        Some(r#"{"tenant": "nobody"}"#),
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    // Removing a tenant with a live sandbox is refused; then allowed, and
    // its keys stop working.
    let (status, sb) = call(
        &f.app,
        Method::POST,
        "/v1/sandboxes",
        Some(&acme),
        Some("{}"),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{sb}");
    let (status, body) = call(
        &f.app,
        Method::DELETE,
        "/v1/tenants/acme",
        Some(&admin),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
    assert!(
        body["message"].as_str().unwrap().contains("live sandboxes"),
        "{body}"
    );
    let id = sb["id"].as_str().unwrap();
    let (status, _) = call(
        &f.app,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        Some(&acme),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call(
        &f.app,
        Method::DELETE,
        "/v1/tenants/acme",
        Some(&admin),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = call(&f.app, Method::GET, "/v1/sandboxes", Some(&acme), None).await;
    assert_error(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
    let (status, body) = call(
        &f.app,
        Method::DELETE,
        "/v1/tenants/default",
        Some(&admin),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::CONFLICT, "conflict");
}
