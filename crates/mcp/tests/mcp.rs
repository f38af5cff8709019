//! brig-mcp in process: the handler served over an in-memory pipe to
//! rmcp's own client (stdio's framing, no process), and `/mcp` on a
//! loopback socket. Tests that start sandboxes need root (they skip
//! otherwise, and fail under `BRIG_TEST_STRICT=1`); the end-to-end suite
//! with the official Python SDK is crates/cli/tests/mcp.rs.

use std::sync::Arc;
use std::time::Duration;

use brig_mcp::{BrigMcp, Shared};
use brig_test_support::root_or_skip;
use brig_test_support::{manager_fixture, ManagerFixture};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;

type Client = RunningService<RoleClient, ()>;

/// A client connected to a fresh session of the fixture's first tenant.
async fn connect(f: &ManagerFixture, template: &str) -> Client {
    let shared = Shared::new(Arc::clone(&f.manager), template);
    let tenant = f.manager.authenticate(&f.key).unwrap().tenant;
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    tokio::spawn(async move {
        let server = BrigMcp::for_tenant(shared, tenant)
            .serve(server_io)
            .await
            .expect("serve");
        let _ = server.waiting().await;
    });
    ().serve(client_io).await.expect("connect")
}

async fn call(c: &Client, tool: &str, args: serde_json::Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    c.peer().call_tool(params).await.expect("a tool result")
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn fixture() -> Option<ManagerFixture> {
    root_or_skip().then(|| manager_fixture(|_| {}))
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_are_listed_and_bad_arguments_are_tool_errors_naming_the_field() {
    let Some(f) = fixture() else { return };
    let c = connect(&f, "host").await;
    let tools = c.peer().list_all_tools().await.unwrap();
    assert!(tools.len() >= 13, "{tools:?}");
    let run = tools.iter().find(|t| t.name == "run_command").unwrap();
    assert_eq!(run.input_schema["required"], json!(["command"]));

    for (args, field) in [
        (json!({}), "command"),
        (
            json!({"command": "true", "timeout_seconds": -1}),
            "timeout_seconds",
        ),
        (json!({"command": "true", "colour": "red"}), "colour"),
    ] {
        let r = call(&c, "run_command", args.clone()).await;
        assert_eq!(r.is_error, Some(true), "{args}");
        assert!(text(&r).contains(field), "{args}: {}", text(&r));
    }
    let r = call(&c, "no_such_tool", json!({})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("tools/list"), "{}", text(&r));
    // Nothing was created by refused calls.
    let r = call(&c, "list_sandboxes", json!({"include_ended": true})).await;
    assert_eq!(r.structured_content.unwrap()["sandboxes"], json!([]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_gets_a_default_sandbox_and_its_sandboxes_end_with_it() {
    let Some(f) = fixture() else { return };
    let c = connect(&f, "host").await;
    let r = call(&c, "run_command", json!({"command": "echo $((6 * 7))"})).await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    let s = r.structured_content.clone().unwrap();
    assert_eq!(s["stdout"], "42\n");
    assert_eq!(s["exit_code"], 0);
    let default = s["sandbox_id"].as_str().unwrap().to_string();
    // The same sandbox next time.
    let r = call(&c, "run_command", json!({"command": "true"})).await;
    assert_eq!(r.structured_content.unwrap()["sandbox_id"], default);
    // Made without a timeout, it lives an hour past its last use.
    let tenant = f.manager.authenticate(&f.key).unwrap().tenant;
    let record = f
        .manager
        .get(&tenant, &brig_core::SandboxId::parse(&default).unwrap())
        .unwrap();
    let left = record.expires_at - record.created_at;
    assert!(left > 59 * 60 * 1000, "{left} ms");

    let r = call(
        &c,
        "create_sandbox",
        json!({"template": "host", "persist": true}),
    )
    .await;
    let kept = r.structured_content.unwrap()["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = call(&c, "create_sandbox", json!({"template": "host"})).await;
    let made = r.structured_content.unwrap()["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();

    c.cancel().await.unwrap();
    let ended = |id: &str| {
        let id = brig_core::SandboxId::parse(id).unwrap();
        !f.manager.is_running(&tenant, &id)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !(ended(&default) && ended(&made)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended(&default), "the default sandbox outlived its session");
    assert!(ended(&made), "a session's sandbox outlived it");
    assert!(!ended(&kept), "a persisted sandbox ended with the session");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_command_is_killed() {
    let Some(f) = fixture() else { return };
    let c = connect(&f, "host").await;
    let r = call(&c, "run_command", json!({"command": "true"})).await;
    let id = r.structured_content.unwrap()["sandbox_id"]
        .as_str()
        .unwrap()
        .to_string();
    let params = CallToolRequestParams::new("run_command").with_arguments(
        json!({"command": "sleep 617"})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let handle = c
        .peer()
        .send_cancellable_request(
            rmcp::model::ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params)),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    async fn running(c: &Client, id: &str) -> String {
        let r = call(
            c,
            "run_command",
            json!({"command": "pgrep -f 'slee[p] 617' || true", "sandbox_id": id}),
        )
        .await;
        r.structured_content.unwrap()["stdout"]
            .as_str()
            .unwrap()
            .trim()
            .to_string()
    }
    assert!(!running(&c, &id).await.is_empty(), "the sleep should run");
    handle.cancel(Some("test".into())).await.unwrap();
    let mut gone = false;
    for _ in 0..50 {
        if running(&c, &id).await.is_empty() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the cancelled command is still running");
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_over_http_needs_a_key_and_keeps_tenants_apart() {
    let Some(f) = fixture() else { return };
    let shared = Shared::new(Arc::clone(&f.manager), "host");
    let addr = brig_test_support::serve(brig_mcp::http::router(shared)).await;
    let url = format!("http://{addr}/mcp");
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "test", "version": "1"}}});
    let post = |key: Option<String>, body: serde_json::Value, session: Option<String>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let mut req = ureq::post(&url)
                .set("Accept", "application/json, text/event-stream")
                .set("Content-Type", "application/json");
            if let Some(k) = key {
                req = req.set("Authorization", &format!("Bearer {k}"));
            }
            if let Some(s) = session {
                req = req
                    .set("Mcp-Session-Id", &s)
                    .set("MCP-Protocol-Version", "2025-11-25");
            }
            match req.send_string(&body.to_string()) {
                Ok(r) => {
                    let session = r.header("mcp-session-id").map(str::to_string);
                    let text = r.into_string().unwrap();
                    // The last `data:` event is the answer.
                    let data = text
                        .lines()
                        .filter_map(|l| l.strip_prefix("data:"))
                        .map(str::trim)
                        .rfind(|d| !d.is_empty())
                        .unwrap_or(text.trim())
                        .to_string();
                    (
                        200,
                        serde_json::from_str(&data).unwrap_or(json!(null)),
                        session,
                    )
                }
                Err(ureq::Error::Status(s, r)) => (s, r.into_json().unwrap_or(json!(null)), None),
                Err(e) => panic!("{e}"),
            }
        })
    };
    let (status, body, _) = post(None, initialize.clone(), None).await.unwrap();
    assert_eq!(status, 401);
    assert!(
        body["message"].as_str().unwrap().contains("Bearer"),
        "{body}"
    );
    let (status, _, _) = post(Some("brig_nope".into()), initialize.clone(), None)
        .await
        .unwrap();
    assert_eq!(status, 401);

    // Two sessions, two tenants.
    let mut sessions = Vec::new();
    for key in [&f.key, &f.other_key] {
        let (status, body, session) = post(Some(key.clone()), initialize.clone(), None)
            .await
            .unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["serverInfo"]["name"], "brig");
        let session = session.expect("a session id");
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        post(Some(key.clone()), note, Some(session.clone()))
            .await
            .unwrap();
        sessions.push((key.clone(), session));
    }
    let tool = |id: u32, name: &str, args: serde_json::Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": args}})
    };
    let (k1, s1) = sessions[0].clone();
    let (k2, s2) = sessions[1].clone();
    let (_, body, _) = post(
        Some(k1.clone()),
        tool(2, "create_sandbox", json!({"template": "host"})),
        Some(s1.clone()),
    )
    .await
    .unwrap();
    let id = body["result"]["structuredContent"]["sandbox_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{body}"))
        .to_string();
    let (_, body, _) = post(
        Some(k2.clone()),
        tool(3, "list_sandboxes", json!({"include_ended": true})),
        Some(s2.clone()),
    )
    .await
    .unwrap();
    assert_eq!(
        body["result"]["structuredContent"]["sandboxes"],
        json!([]),
        "{body}"
    );
    let (_, body, _) = post(
        Some(k2.clone()),
        tool(
            4,
            "run_command",
            json!({"command": "true", "sandbox_id": id}),
        ),
        Some(s2.clone()),
    )
    .await
    .unwrap();
    assert_eq!(body["result"]["isError"], true, "{body}");
    // Nor may the other key use the first's session.
    let (_, body, _) = post(
        Some(k2),
        tool(5, "list_sandboxes", json!({})),
        Some(s1.clone()),
    )
    .await
    .unwrap();
    assert_eq!(body["result"]["isError"], true, "{body}");
    let (_, body, _) = post(Some(k1), tool(6, "list_sandboxes", json!({})), Some(s1))
        .await
        .unwrap();
    let listed = body["result"]["structuredContent"]["sandboxes"].to_string();
    assert!(listed.contains(&id), "{body}");
}

/// A client of the stateless revision (2026-07-28) that names a session
/// (`brig-mcp-session`, as `brig mcp`'s relay does) gets a default sandbox
/// of that session, ended by its `DELETE /mcp`; one that names none keeps
/// the key's default sandbox until its timeout.
#[tokio::test(flavor = "multi_thread")]
async fn a_stateless_client_s_named_session_ends_its_sandboxes() {
    let Some(f) = fixture() else { return };
    let shared = Shared::new(Arc::clone(&f.manager), "host");
    let addr = brig_test_support::serve(brig_mcp::http::router(shared)).await;
    let url = format!("http://{addr}/mcp");
    let key = f.key.clone();
    let request = move |method: &'static str, session: Option<&'static str>| {
        let (url, key) = (url.clone(), key.clone());
        tokio::task::spawn_blocking(move || {
            let mut req = ureq::request(method, &url)
                .set("Authorization", &format!("Bearer {key}"))
                .set("Accept", "application/json, text/event-stream")
                .set("Content-Type", "application/json")
                .set("MCP-Protocol-Version", "2026-07-28");
            if let Some(s) = session {
                req = req.set(brig_mcp::CLIENT_SESSION, s);
            }
            if method == "DELETE" {
                return (req.call().unwrap().status(), json!(null));
            }
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "run_command", "arguments": {"command": "echo stateless"},
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                          "io.modelcontextprotocol/clientCapabilities": {}}}});
            let resp = req
                .set("Mcp-Method", "tools/call")
                .set("Mcp-Name", "run_command")
                .send_string(&body.to_string())
                .unwrap_or_else(|e| {
                    let what = e.to_string();
                    panic!("{what}: {:?}", e.into_response().map(|r| r.into_string()))
                });
            let text = resp.into_string().unwrap();
            let data = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim)
                .rfind(|d| !d.is_empty())
                .unwrap_or(text.trim())
                .to_string();
            (200, serde_json::from_str(&data).unwrap())
        })
    };
    let tenant = f.manager.authenticate(&f.key).unwrap().tenant;
    let id_of = |v: &serde_json::Value| {
        let id = v["result"]["structuredContent"]["sandbox_id"]
            .as_str()
            .unwrap_or_else(|| panic!("{v}"));
        brig_core::SandboxId::parse(id).unwrap()
    };
    let (_, a) = request("POST", Some("one")).await.unwrap();
    assert_eq!(
        a["result"]["structuredContent"]["stdout"], "stateless\n",
        "{a}"
    );
    let (_, again) = request("POST", Some("one")).await.unwrap();
    assert_eq!(
        id_of(&a),
        id_of(&again),
        "one default sandbox per named session"
    );
    let (_, keyed) = request("POST", None).await.unwrap();
    assert_ne!(id_of(&keyed), id_of(&a));

    let (status, _) = request("DELETE", Some("one")).await.unwrap();
    assert_eq!(status, 204);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while f.manager.is_running(&tenant, &id_of(&a)) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!f.manager.is_running(&tenant, &id_of(&a)));
    assert!(f.manager.is_running(&tenant, &id_of(&keyed)));
}
