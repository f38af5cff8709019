//! `/v1/secrets` in process: set (201, then 200 with the next version),
//! list and show (never a value, `Cache-Control: no-store`), remove, the
//! limits at and past their edge, and tenant isolation. The fixture starts
//! a sandbox manager, so these need root; they skip with a printed reason
//! otherwise, and fail under BRIG_TEST_STRICT=1.

mod support;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::{json, Value};
use support::{assert_error, call, fixture, root_or_skip};
use tower::ServiceExt;

const VALUE: &str = "sk-live-0123456789-do-not-show";

#[tokio::test(flavor = "multi_thread")]
async fn secrets_are_write_only_and_per_tenant() {
    if !root_or_skip() {
        return;
    }
    let f = fixture(|_| {});
    let put = |name: &str, body: Value| {
        let app = f.app.clone();
        let key = f.key.clone();
        let uri = format!("/v1/secrets/{name}");
        async move { call(&app, Method::PUT, &uri, Some(&key), Some(&body.to_string())).await }
    };

    let (status, made) = put(
        "OpenAI",
        json!({"value": VALUE, "metadata": {"team": "ml"}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["name"], "openai", "{made}");
    assert_eq!(made["version"], 1, "{made}");
    assert_eq!(made["metadata"]["team"], "ml", "{made}");
    let (status, again) = put("openai", json!({"value": "sk-2"})).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["version"], 2, "{again}");
    assert_eq!(again["metadata"]["team"], "ml", "metadata kept: {again}");

    // Every read surface: no value, and not to be cached.
    for uri in [
        "/v1/secrets",
        "/v1/secrets/openai",
        &format!("/v1/secrets/{}", made["id"].as_str().unwrap()),
    ] {
        let req = Request::builder()
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {}", f.key))
            .body(Body::empty())
            .unwrap();
        let resp = f.app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{uri}");
        assert_eq!(resp.headers()[header::CACHE_CONTROL], "no-store", "{uri}");
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("sk-"), "{uri} shows a value: {text}");
        assert!(text.contains("openai"), "{uri}: {text}");
    }

    // Paging.
    for n in 0..3 {
        let (status, _) = put(&format!("p{n}"), json!({"value": "v"})).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (_, page) = call(
        &f.app,
        Method::GET,
        "/v1/secrets?limit=2",
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(page["items"].as_array().unwrap().len(), 2, "{page}");
    let next = page["next"].as_str().expect("a next page").to_string();
    let (_, rest) = call(
        &f.app,
        Method::GET,
        &format!("/v1/secrets?limit=2&after={next}"),
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 2, "{rest}");
    assert!(rest["next"].is_null(), "{rest}");
    let (status, body) = call(
        &f.app,
        Method::GET,
        "/v1/secrets?limit=0",
        Some(&f.key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::BAD_REQUEST, "bad_request");

    // Limits, at and past the edge, and bad input: a clear 400, nothing kept.
    let (status, _) = put(&"n".repeat(128), json!({"value": "x".repeat(64 * 1024)})).await;
    assert_eq!(status, StatusCode::CREATED);
    for (name, body, says) in [
        (
            "n".repeat(129),
            json!({"value": "v"}),
            "invalid secret name",
        ),
        (
            "big".into(),
            json!({"value": "x".repeat(64 * 1024 + 1)}),
            "too large",
        ),
        ("empty".into(), json!({"value": ""}), "empty"),
        ("sec_x".into(), json!({"value": "v"}), "invalid secret name"),
        ("a.b".into(), json!({"value": "v"}), "invalid secret name"),
        ("nov".into(), json!({"metadata": {}}), "value"),
        (
            "meta".into(),
            json!({"value": "v", "metadata": {"k": "v".repeat(1025)}}),
            "metadata",
        ),
    ] {
        let (status, got) = put(&name, body).await;
        assert_error(status, &got, StatusCode::BAD_REQUEST, "bad_request");
        assert!(
            got["message"].as_str().unwrap().contains(says),
            "{name}: {got}"
        );
        let (status, _) = call(
            &f.app,
            Method::GET,
            &format!("/v1/secrets/{name}"),
            Some(&f.key),
            None,
        )
        .await;
        assert_ne!(status, StatusCode::OK, "{name} was kept");
    }

    // Another tenant sees none of them and cannot remove them.
    let (status, other) = call(
        &f.app,
        Method::POST,
        "/v1/tenants",
        Some(&f.key),
        Some(r#"{"name": "vault-b"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{other}");
    let other_key = other["key"]["key"].as_str().unwrap().to_string();
    let (_, list) = call(&f.app, Method::GET, "/v1/secrets", Some(&other_key), None).await;
    assert_eq!(list["items"], json!([]), "{list}");
    let (status, body) = call(
        &f.app,
        Method::DELETE,
        "/v1/secrets/openai",
        Some(&other_key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");

    let (status, _) = call(
        &f.app,
        Method::DELETE,
        "/v1/secrets/openai",
        Some(&f.key),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = call(
        &f.app,
        Method::GET,
        "/v1/secrets/openai",
        Some(&f.key),
        None,
    )
    .await;
    assert_error(status, &body, StatusCode::NOT_FOUND, "not_found");
}
