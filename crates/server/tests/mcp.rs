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
    // A paused session resumes on a tool call, and the model is told what came back.
    let paused: Value = reqwest::Client::new()
        .post(format!("{}/v1/sessions/{session}/pause", srv.base))
        .send()
        .await
        .expect("pause")
        .json()
        .await
        .expect("session");
    assert_eq!(paused["status"], "paused", "{paused}");
    let r = call(&client, "python", json!({"code": "x + 2"})).await;
    assert!(text(&r).contains("43"), "{}", text(&r));
    assert!(
        text(&r).contains("session resumed: ") && text(&r).contains("names restored"),
        "{}",
        text(&r)
    );

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
    assert_eq!(audited["executions"].as_array().map(Vec::len), Some(5));
    assert_eq!(audited["executions"][4]["code"], "x = 41");

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

/// A raw `POST /mcp` with `body` as is; the status and the body as JSON (or text).
async fn post_raw(
    srv: &Server,
    headers: &[(&str, &str)],
    body: &str,
) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/mcp", srv.base))
        .header("accept", "application/json, text/event-stream")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("send");
    let (status, h) = (resp.status(), resp.headers().clone());
    let text = resp.text().await.expect("body");
    // A streamed reply: its one `data:` line.
    let json = text
        .lines()
        .find_map(|l| l.strip_prefix("data: ").filter(|d| d.starts_with('{')))
        .unwrap_or(&text);
    let v = serde_json::from_str(json).unwrap_or(Value::String(text.clone()));
    (status, v, h)
}

const JSON: (&str, &str) = ("content-type", "application/json");

/// A session-less (2026-07-28) `tools/call` of `tool` from the client named `client`.
async fn sessionless_call(srv: &Server, client: &str, tool: &str, args: Value) -> Value {
    sessionless_call_as(srv, None, client, tool, args).await
}

/// [`sessionless_call`] with an API key.
async fn sessionless_call_as(
    srv: &Server,
    key: Option<&str>,
    client: &str,
    tool: &str,
    args: Value,
) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": tool, "arguments": args, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": client, "version": "1"}}}});
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![
        JSON,
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", tool),
    ];
    if let Some(a) = &auth {
        headers.push(("authorization", a));
    }
    let (status, v, _) = post_raw(srv, &headers, &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["result"].clone()
}

fn result_text(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What MCP clients that are not rmcp's send when something is off gets a JSON-RPC answer
/// with the code the spec names, not a plain-text status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_mcp_messages_get_json_rpc_errors() {
    let srv = start().await;
    let code = |v: &Value| v["error"]["code"].as_i64();

    let (s, v, _) = post_raw(&srv, &[JSON], "{not json").await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, Some(-32700)),
        "{v}"
    );
    assert_eq!(v["id"], Value::Null);
    assert_eq!(v["jsonrpc"], "2.0");

    let (s, v, _) = post_raw(&srv, &[JSON], r#"{"id": 1, "method": "ping"}"#).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, Some(-32600)),
        "{v}"
    );
    assert_eq!(v["id"], 1);
    // The same without a content type: still the JSON-RPC verdict, not 415 in plain text.
    let (s, v, _) = post_raw(&srv, &[], r#"{"id": 1, "method": "ping"}"#).await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, Some(-32600)),
        "{v}"
    );
    let (s, v, _) = post_raw(
        &srv,
        &[JSON],
        r#"[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]"#,
    )
    .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::BAD_REQUEST, Some(-32600)),
        "{v}"
    );
    // A JSON-RPC message without a content type: rmcp's 415, as JSON-RPC.
    let (s, v, _) = post_raw(
        &srv,
        &[],
        r#"{"jsonrpc": "2.0", "id": 2, "method": "ping"}"#,
    )
    .await;
    assert_eq!(
        (s, code(&v)),
        (StatusCode::UNSUPPORTED_MEDIA_TYPE, Some(-32600)),
        "{v}"
    );
    assert_eq!(v["id"], 2);

    // tools/call without a name: invalid params, in a session-less request and in a session.
    let no_name =
        r#"{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"arguments": {}}}"#;
    let (s, v, _) = post_raw(
        &srv,
        &[
            JSON,
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
        ],
        no_name,
    )
    .await;
    assert_eq!((s, code(&v)), (StatusCode::OK, Some(-32602)), "{v}");
    assert_eq!(v["id"], 3);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    let (s, _, h) = post_raw(&srv, &[JSON], &init.to_string()).await;
    assert_eq!(s, StatusCode::OK);
    let sid = h["mcp-session-id"].to_str().expect("session id").to_owned();
    let in_session = [
        JSON,
        ("mcp-session-id", sid.as_str()),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let (s, v, _) = post_raw(&srv, &in_session, no_name).await;
    assert_eq!((s, code(&v)), (StatusCode::OK, Some(-32602)), "{v}");

    // MCP requires the Origin checked on every request, the event stream's GET included.
    let get = |origin: &'static str| {
        reqwest::Client::new()
            .get(format!("{}/mcp", srv.base))
            .header("accept", "text/event-stream")
            .header("mcp-session-id", sid.clone())
            .header("mcp-protocol-version", "2025-11-25")
            .header("origin", origin)
            .send()
    };
    let resp = get("http://evil.example").await.expect("get");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let (s, _, _) = post_raw(
        &srv,
        &[JSON, ("origin", "http://evil.example")],
        &init.to_string(),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // DELETE ends the MCP session (204); then, and for any unknown id, 404.
    let delete = |id: String| {
        reqwest::Client::new()
            .delete(format!("{}/mcp", srv.base))
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", "2025-11-25")
            .send()
    };
    assert_eq!(
        delete(sid.clone()).await.expect("delete").status(),
        StatusCode::NO_CONTENT
    );
    let resp = delete(sid.clone()).await.expect("delete again");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(code(&v), Some(-32600), "{v}");
    let resp = delete("no-such-session".into())
        .await
        .expect("delete unknown");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let (s, v, _) = post_raw(
        &srv,
        &in_session,
        r#"{"jsonrpc": "2.0", "id": 9, "method": "ping"}"#,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["id"], 9);
}

/// Session-less clients (the Python SDK's default) keep their state: each client of a tenant
/// has one default session, reused by its calls, expiring soon when unused, and a tenant
/// keeps a bounded number of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessionless_clients_keep_one_default_session_each() {
    let srv = common::start_engine_with(None, |c| c.limits.defaults.memory_mb = 256).await;
    let r = sessionless_call(&srv, "agent-a", "python", json!({"code": "secret = 6*7"})).await;
    assert_eq!(r["isError"], false, "{r}");
    let session = r["structuredContent"]["session_id"]
        .as_str()
        .expect("session_id in the result")
        .to_owned();
    assert!(result_text(&r).contains(&session), "the model is told: {r}");
    let r = sessionless_call(&srv, "agent-a", "python", json!({"code": "secret + 1"})).await;
    assert!(result_text(&r).contains("43"), "{r}");
    assert_eq!(r["structuredContent"]["session_id"], session.as_str());
    let r = sessionless_call(
        &srv,
        "agent-a",
        "bash",
        json!({"command": "echo kept > f.txt"}),
    )
    .await;
    assert_eq!(
        r["structuredContent"]["session_id"],
        session.as_str(),
        "{r}"
    );
    let r = sessionless_call(
        &srv,
        "agent-a",
        "text_editor",
        json!({"command": "view", "path": "f.txt"}),
    )
    .await;
    assert!(result_text(&r).contains("kept"), "{r}");
    assert_eq!(
        r["structuredContent"]["session_id"],
        session.as_str(),
        "{r}"
    );

    // Another client of the tenant has its own.
    let r = sessionless_call(&srv, "agent-b", "python", json!({"code": "secret"})).await;
    assert!(result_text(&r).contains("NameError"), "{r}");
    assert_ne!(r["structuredContent"]["session_id"], session.as_str());

    // The default session expires after a short idle time, not the usual 20 minutes.
    let info = srv.get(&format!("/v1/sessions/{session}"), None).await;
    assert_eq!(info["limits"]["idle_timeout_s"], 600, "{info}");

    // Past the bound, the client unused the longest loses its session.
    for i in 0..7 {
        sessionless_call(
            &srv,
            &format!("agent-{i}"),
            "bash",
            json!({"command": "true"}),
        )
        .await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.session_ids(None).await.contains(&session) {
        assert!(
            Instant::now() < deadline,
            "agent-a's session outlived the bound"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ids = srv.session_ids(None).await;
    assert_eq!(ids.len(), 8, "{ids:?}");
}

/// Default sessions are per API key's tenant: the same client name under another key is
/// another session, and neither sees the other's variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_sessions_are_the_tenants() {
    let srv = start().await;
    let (_, key_a) = srv.store.create_key("a", "tenant-a").expect("key a");
    let (_, key_b) = srv.store.create_key("b", "tenant-b").expect("key b");
    let code = |c: &str| json!({ "code": c });
    let r = sessionless_call_as(&srv, Some(&key_a), "sdk", "python", code("v = 'a'")).await;
    let sa = r["structuredContent"]["session_id"].clone();
    let r = sessionless_call_as(&srv, Some(&key_b), "sdk", "python", code("v")).await;
    assert!(result_text(&r).contains("NameError"), "{r}");
    assert_ne!(r["structuredContent"]["session_id"], sa);
    let r = sessionless_call_as(&srv, Some(&key_a), "sdk", "python", code("v")).await;
    assert!(result_text(&r).contains("'a'"), "{r}");
    assert_eq!(r["structuredContent"]["session_id"], sa);
    assert_eq!(srv.session_ids(Some(&key_a)).await.len(), 1);
    assert_eq!(srv.session_ids(Some(&key_b)).await.len(), 1);
}
