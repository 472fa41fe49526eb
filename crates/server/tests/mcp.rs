//! `POST /mcp` for real: the app bound to port 0, spoken to by rmcp's streamable HTTP client.

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{start, Server};
use reqwest::StatusCode;
use rmcp::model::{CallToolRequestParams, CallToolResult, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

impl Server {
    fn transport(&self, key: Option<&str>) -> StreamableHttpClientTransport<reqwest::Client> {
        let mut config =
            StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", self.base));
        if let Some(k) = key {
            config = config.auth_header(k);
        }
        StreamableHttpClientTransport::from_config(config)
    }

    async fn connect(&self, key: Option<&str>) -> RunningService<RoleClient, ()> {
        ().serve(self.transport(key)).await.expect("initialize")
    }

    async fn get(&self, path: &str, key: Option<&str>) -> Value {
        let mut req = reqwest::Client::new().get(format!("{}{path}", self.base));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.expect("send");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json().await.expect("json")
    }

    async fn session_ids(&self, key: Option<&str>) -> Vec<String> {
        self.get("/v1/sessions", key).await["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .filter_map(|s| s["id"].as_str().map(str::to_owned))
            .collect()
    }
}

async fn call(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> CallToolResult {
    let Value::Object(args) = args else {
        panic!("arguments must be an object")
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .expect("tools/call")
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_http_is_a_session_of_the_tenant() {
    let srv = start().await;
    let client = srv.connect(None).await;
    let tools = client.list_all_tools().await.expect("tools/list");
    assert_eq!(tools.len(), 3);

    let r = call(&client, "python", json!({"code": "x = 41"})).await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let r = call(&client, "python", json!({"code": "x + 1"})).await;
    assert!(text(&r).contains("42"), "{}", text(&r));
    let session = r.structured_content.as_ref().expect("execution")["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();

    let r = call(
        &client,
        "python",
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([3, 1, 2])\nplt.show()"}),
    )
    .await;
    let image = r.content.iter().find_map(|c| c.as_image()).expect("image");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&image.data)
        .expect("base64");
    assert!(png.starts_with(b"\x89PNG"));
    let r = call(&client, "python", json!({"code": "1/0"})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("ZeroDivisionError"), "{}", text(&r));

    // The session is the open tenant's: listed and audited like any other.
    assert_eq!(srv.session_ids(None).await, std::slice::from_ref(&session));
    let audited = srv
        .get(&format!("/v1/executions?session_id={session}"), None)
        .await;
    assert_eq!(audited["executions"].as_array().map(Vec::len), Some(4));
    assert_eq!(audited["executions"][3]["code"], "x = 41");

    // Closing the connection (DELETE of the MCP session) ends the session.
    client.cancel().await.expect("close");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !srv.session_ids(None).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the MCP session's session is still there"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_needs_a_key_once_keys_exist() {
    let srv = start().await;
    let (_, key_a) = srv.store.create_key("a", "tenant-a").expect("key a");
    let (_, key_b) = srv.store.create_key("b", "tenant-b").expect("key b");

    let resp = reqwest::Client::new()
        .post(format!("{}/mcp", srv.base))
        .header("accept", "application/json, text/event-stream")
        .json(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "curl", "version": "1"}}}),
        )
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["code"], "unauthorized");
    assert!(().serve(srv.transport(Some("rc_wrong"))).await.is_err());

    let a = srv.connect(Some(&key_a)).await;
    let r = call(
        &a,
        "bash",
        json!({"command": "echo hi > f.txt && cat f.txt"}),
    )
    .await;
    assert!(text(&r).contains("hi"), "{}", text(&r));
    let sessions = srv.session_ids(Some(&key_a)).await;
    assert_eq!(sessions.len(), 1);
    assert!(srv.session_ids(Some(&key_b)).await.is_empty());

    // Tenant b cannot reach a's session by id.
    let b = srv.connect(Some(&key_b)).await;
    let r = call(
        &b,
        "text_editor",
        json!({"command": "view", "path": "f.txt", "session_id": sessions[0]}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("not found"), "{}", text(&r));
    // a can, by id too.
    let r = call(
        &a,
        "text_editor",
        json!({"command": "view", "path": "f.txt", "session_id": sessions[0]}),
    )
    .await;
    assert!(text(&r).contains("     1\thi"), "{}", text(&r));
    a.cancel().await.expect("close a");
    b.cancel().await.expect("close b");
}

/// The session-less protocol (2026-07-28): no connection to hang a session on, so the result
/// names the session and the model passes it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_without_sessions_names_the_session_to_reuse() {
    let srv = start().await;
    let client = ()
        .serve_with_lifecycle(
            srv.transport(None),
            ClientLifecycleMode::Discover {
                preferred_versions: vec![ProtocolVersion::V_2026_07_28],
            },
        )
        .await
        .expect("discover");
    let r = call(&client, "python", json!({"code": "y = 6 * 7"})).await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let t = text(&r);
    let session = t
        .split_whitespace()
        .find(|w| w.starts_with("ses_"))
        .unwrap_or_else(|| panic!("no session id in {t}"))
        .to_owned();
    let r = call(
        &client,
        "python",
        json!({"code": "y", "session_id": session}),
    )
    .await;
    assert!(text(&r).contains("42"), "{}", text(&r));
    client.cancel().await.expect("close");
}
