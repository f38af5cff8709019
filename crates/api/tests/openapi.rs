//! api/openapi.yaml is the API's contract: it parses, and every route the
//! router serves is in it with the right methods.

use serde_yaml::Value;

/// Every route `brig_api::app` serves.
const ROUTES: &[(&str, &[&str])] = &[
    ("/healthz", &["get"]),
    ("/v1/info", &["get"]),
    ("/v1/keys", &["get", "post"]),
    ("/v1/keys/{id}", &["delete"]),
    ("/v1/tenants", &["get", "post"]),
    ("/v1/tenants/{name}", &["delete"]),
    ("/v1/secrets", &["get"]),
    ("/v1/secrets/{name}", &["delete", "get", "put"]),
    ("/v1/sandboxes", &["get", "post"]),
    ("/v1/sandboxes/{id}", &["get", "delete"]),
    ("/v1/sandboxes/{id}/timeout", &["post"]),
    ("/v1/sandboxes/{id}/pause", &["post"]),
    ("/v1/sandboxes/{id}/resume", &["post"]),
    ("/v1/sandboxes/{id}/snapshots", &["post"]),
    ("/v1/sandboxes/{id}/fork", &["post"]),
    ("/v1/snapshots", &["get"]),
    ("/v1/snapshots/{snapshot}", &["get", "delete"]),
    ("/v1/volumes", &["get", "post"]),
    ("/v1/volumes/{volume}", &["get", "delete"]),
    ("/v1/sandboxes/{id}/metrics", &["get"]),
    ("/v1/sandboxes/{id}/metrics/series", &["get"]),
    ("/metrics", &["get"]),
    ("/v1/sandboxes/{id}/exec", &["post"]),
    ("/v1/sandboxes/{id}/files", &["get", "put", "delete"]),
    ("/v1/sandboxes/{id}/files/list", &["get"]),
    ("/v1/sandboxes/{id}/files/stat", &["get"]),
    ("/v1/sandboxes/{id}/files/mkdir", &["post"]),
    ("/v1/sandboxes/{id}/files/rename", &["post"]),
    ("/v1/sandboxes/{id}/files/upload", &["post"]),
    ("/v1/sandboxes/{id}/files/watch", &["get"]),
    ("/v1/sandboxes/{id}/archive", &["get", "put"]),
    ("/v1/sandboxes/{id}/processes", &["get", "post"]),
    ("/v1/sandboxes/{id}/processes/{pid}/signal", &["post"]),
    ("/v1/sandboxes/{id}/processes/{pid}/output", &["get"]),
    ("/v1/sandboxes/{id}/processes/{pid}/stdin", &["post"]),
    ("/v1/sandboxes/{id}/pty", &["get"]),
    ("/v1/sandboxes/{id}/logs", &["get"]),
    ("/v1/sandboxes/{id}/network", &["get", "put"]),
    ("/v1/sandboxes/{id}/network/connections", &["get"]),
    ("/v1/sandboxes/{id}/tcp/{port}", &["get"]),
    ("/v1/templates", &["get"]),
    ("/v1/templates/pull", &["post"]),
    ("/v1/templates/import", &["post"]),
    ("/v1/templates/prune", &["post"]),
    ("/v1/templates/{name}", &["get", "delete"]),
    (
        "/v1/sandboxes/{id}/ports/{port}/{path}",
        &["get", "post", "put", "patch", "delete"],
    ),
];

#[test]
fn every_implemented_route_is_documented() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../api/openapi.yaml");
    let text = std::fs::read_to_string(path).expect("read api/openapi.yaml");
    let doc: Value = serde_yaml::from_str(&text).expect("api/openapi.yaml is valid YAML");
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    let paths = doc["paths"].as_mapping().expect("paths");
    for (route, methods) in ROUTES {
        let item = &doc["paths"][*route];
        assert!(
            item.is_mapping(),
            "{route} is missing from api/openapi.yaml"
        );
        for m in *methods {
            assert!(
                item[*m].is_mapping(),
                "{m} {route} is missing from api/openapi.yaml"
            );
        }
    }
    assert_eq!(
        paths.len(),
        ROUTES.len(),
        "api/openapi.yaml documents routes that do not exist"
    );
}
