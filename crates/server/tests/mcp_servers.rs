//! The operator's MCP servers used from a session's Python (issue 22: `from runcell_tools.mcp
//! import NAME`): a real server written with the official MCP Python SDK
//! (tests/mcp-servers/test_server.py, in the SDK venv tests/common/clients.rs makes), over
//! stdio and over streamable HTTP, configured on the server as `serve --mcp-server` does and
//! called from cells through the tool bridge.

mod common;

#[path = "common/clients.rs"]
mod clients;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use runcell_server::mcp_servers::{McpServerConfig, McpServers, TenantAccess};
use serde_json::{json, Value};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-servers/test_server.py")
}

/// `NAME=PYTHON test_server.py` (stdio) for `tenants`.
fn stdio_server(name: &str, python: &Path, tenants: &[&str]) -> McpServerConfig {
    let mut c = McpServerConfig::parse_flag(&format!(
        "{name}={} {}",
        python.display(),
        script().display()
    ))
    .expect("flag");
    c.tenants = TenantAccess::from_names(tenants.iter().map(|t| t.to_string())).expect("tenants");
    c
}

/// The test server over streamable HTTP, killed when dropped.
struct HttpServer {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_server(python: &Path) -> HttpServer {
    let dir = tempfile::tempdir().expect("tempdir");
    let port_file = dir.path().join("port");
    let mut child = std::process::Command::new(python)
        .arg(script())
        .arg("--http")
        .arg(&port_file)
        .spawn()
        .expect("start the HTTP MCP server");
    // It writes the file once it listens (renamed into place: never half-written).
    let mut waited = 0;
    let port = loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            break p;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the HTTP MCP server exited: {status}");
        }
        waited += 1;
        assert!(waited < 1200, "the HTTP MCP server never listened");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    HttpServer {
        child,
        url: format!("http://127.0.0.1:{}/mcp", port.trim()),
        _dir: dir,
    }
}

async fn session(srv: &common::Server) -> String {
    let s: Value = srv
        .http
        .post(format!("{}/v1/sessions", srv.base))
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("session");
    s["id"].as_str().expect("id").to_owned()
}

async fn exec(srv: &common::Server, id: &str, code: &str) -> Value {
    let r = srv
        .http
        .post(format!("{}/v1/sessions/{id}/execute", srv.base))
        .json(&json!({ "code": code, "timeout_s": 120 }))
        .send()
        .await
        .expect("execute");
    assert_eq!(r.status(), 200);
    r.json().await.expect("execution")
}

fn stdout(e: &Value) -> &str {
    e["stdout"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_servers_are_python_modules_in_a_session() {
    let python = tokio::task::spawn_blocking(clients::sdk_python)
        .await
        .expect("install the SDK");
    let web = http_server(&python);
    let mut http = McpServerConfig::parse_flag(&format!("web={}", web.url)).expect("url");
    http.tenants = TenantAccess::All;
    let servers = Arc::new(
        McpServers::new(vec![
            // The open tenant (no keys) is `default`.
            stdio_server("tests", &python, &["default"]),
            // Configured, but for another tenant only.
            stdio_server("secret", &python, &["acme"]),
            http,
        ])
        .expect("servers"),
    );
    let srv = common::start_with(move |state| state.with_mcp_servers(servers)).await;
    let id = session(&srv).await;

    // The listing, a module with typed, documented functions, and their results.
    let e = exec(
        &srv,
        &id,
        r#"
import inspect, pydoc
import runcell_tools.mcp as mcp
from runcell_tools.mcp import tests
print("servers", mcp.servers())
print("functions", tests.__all__)
print("signature", inspect.signature(tests.search_issues))
r = tests.search_issues(query="is:open", per_page=2)
print("structured", type(r).__name__, r)
img = tests.make_chart()
print("image", type(img).__name__, img)
print("text", repr(tests.echo(text="héllo")))
try:
    tests.fail(reason="on purpose")
except Exception as e:
    print("error", type(e).__name__, e)
print(pydoc.render_doc(tests.search_issues, renderer=pydoc.plaintext))
"#,
    )
    .await;
    assert_eq!(e["status"], "ok", "{e}");
    let out = stdout(&e);
    assert!(out.contains("servers ['tests', 'web']"), "{out}");
    assert!(
        out.contains(
            "functions ['big', 'die', 'echo', 'fail', 'make_chart', 'pid', 'search_issues']"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "signature (*, query: str, per_page: int = 30, state: Literal['open', 'closed'] = 'open') -> dict"
        ),
        "{out}"
    );
    assert!(
        // The object's keys arrive in the MCP server's order (serde_json keeps it).
        out.contains("structured dict {'total': 2, 'titles': ['open issue 0 for is:open', 'open issue 1 for is:open'], 'query': 'is:open'}"),
        "{out}"
    );
    assert!(
        out.contains(r"image bytes b'\x89PNG\r\n\x1a\nrunc\x00\xffell'"),
        "{out}"
    );
    assert!(out.contains("text 'héllo'"), "{out}");
    assert!(
        // The SDK's text for a tool's ToolError.
        out.contains("error ToolError Error executing tool fail: failed on purpose: on purpose"),
        "{out}"
    );
    assert!(out.contains("Search the issues of a repository."), "{out}");
    assert!(
        out.contains("query (str, required): GitHub search syntax"),
        "{out}"
    );
    assert!(
        out.contains("MCP tool 'search_issues' of the server 'tests'"),
        "{out}"
    );
    // Each call (and the listings) recorded in the Execution.
    let names: Vec<&str> = e["tool_calls"]
        .as_array()
        .expect("tool_calls")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        names,
        [
            "mcp.tests",
            "mcp.*",
            "mcp.tests.search_issues",
            "mcp.tests.make-chart",
            "mcp.tests.echo",
            "mcp.tests.fail"
        ],
        "{e}"
    );
    let calls = e["tool_calls"].as_array().expect("calls");
    assert_eq!(
        calls[2]["input"],
        json!({"query": "is:open", "per_page": 2})
    );
    assert!(calls[2]["output_bytes"].as_u64().unwrap_or(0) > 0, "{e}");
    assert!(calls[2]["error"].is_null(), "{e}");
    assert!(
        calls[5]["error"]
            .as_str()
            .is_some_and(|m| m.contains("failed on purpose")),
        "{e}"
    );
    // ... and in the audit log, as recorded.
    let recorded: Value = srv
        .http
        .get(format!(
            "{}/v1/executions/{}",
            srv.base,
            e["id"].as_str().expect("id")
        ))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(recorded["tool_calls"], e["tool_calls"], "{recorded}");

    // Arguments are checked in the sandbox: a bad one never leaves (no call recorded).
    let e = exec(
        &srv,
        &id,
        r#"
for bad in ({"query": 3}, {"query": "a", "per_page": 0}, {"query": "a", "state": "merged"}, {}, {"query": "a", "nope": 1}):
    try:
        tests.search_issues(**bad)
    except (TypeError, ValueError) as e:
        print(type(e).__name__, e)
"#,
    )
    .await;
    let out = stdout(&e);
    assert!(
        out.contains("TypeError tests.search_issues() argument 'query' must be string, not int"),
        "{out}"
    );
    assert!(
        out.contains(
            "ValueError tests.search_issues() argument 'per_page' must be at least 1, not 0"
        ),
        "{out}"
    );
    assert!(out.contains("ValueError tests.search_issues() argument 'state' must be one of ['open', 'closed'], not 'merged'"), "{out}");
    assert!(
        out.contains("TypeError tests.search_issues(): missing a required argument: 'query'"),
        "{out}"
    );
    assert!(
        out.contains("TypeError tests.search_issues(): got an unexpected keyword argument 'nope'"),
        "{out}"
    );
    assert_eq!(e["tool_calls"], json!([]), "{e}");

    // A server the tenant may not use, and one nobody configured: the same refusal, naming
    // why; the positive control is `tests` above, imported the same way.
    let e = exec(
        &srv,
        &id,
        r#"
for name in ("secret", "nope"):
    try:
        exec(f"from runcell_tools.mcp import {name}")
    except ModuleNotFoundError as e:
        print(type(e).__name__, e)
try:
    import runcell_tools.mcp.secret
except ImportError as e:
    print("import", type(e).__name__)
"#,
    )
    .await;
    let out = stdout(&e);
    assert!(out.contains("ModuleNotFoundError runcell_tools.mcp.secret: no MCP server \"secret\" for this session: the operator has not configured one by that name for this tenant"), "{out}");
    assert!(
        out.contains(
            "ModuleNotFoundError runcell_tools.mcp.nope: no MCP server \"nope\" for this session"
        ),
        "{out}"
    );
    assert!(out.contains("import ModuleNotFoundError"), "{out}");
    // Calling the tool by its bridge name does not get around it either.
    let e = exec(
        &srv,
        &id,
        r#"
import runcell_tools
try:
    runcell_tools._call("mcp.secret.pid", {})
except runcell_tools.ToolRefused as e:
    print("refused", e)
"#,
    )
    .await;
    assert!(
        stdout(&e).contains("refused no MCP server \"secret\" for this session"),
        "{e}"
    );

    // A result over the bridge's bound is refused naming its size; one under it passes.
    let e = exec(
        &srv,
        &id,
        r#"
import runcell_tools
print("small", len(tests.big(size=1000)))
try:
    tests.big(size=2 * 1024 * 1024)
except runcell_tools.ToolTooLarge as e:
    print("large", e)
"#,
    )
    .await;
    let out = stdout(&e);
    assert!(out.contains("small 1000"), "{out}");
    assert!(
        out.contains("large MCP tests.big: the result's contents are 2097177 bytes as JSON, over the limit of 1048576 bytes"),
        "{out}"
    );

    // Over streamable HTTP.
    let e = exec(
        &srv,
        &id,
        r#"
from runcell_tools.mcp import web
print(web.echo(text="over http"), web.search_issues(query="q", per_page=1)["total"])
"#,
    )
    .await;
    assert_eq!(stdout(&e), "over http 1\n", "{e}");

    // A server that dies mid-call: that call fails, saying so (never repeated); the next
    // call starts it again (a new process).
    let e = exec(
        &srv,
        &id,
        r#"
import runcell_tools
before = tests.pid()["result"]
try:
    tests.die()
except runcell_tools.ToolError as e:
    print("died", e)
after = tests.pid()["result"]
print("restarted", before != after)
"#,
    )
    .await;
    let out = stdout(&e);
    assert!(
        out.contains("died the MCP server \"tests\" stopped during the call"),
        "{out}"
    );
    assert!(out.contains("restarted True"), "{out}");
}

/// Code mode in the web page's chat: the chat's model is told the MCP functions its tenant's
/// sessions may call (and none of another tenant's), writes one cell that loops over a tool,
/// and gets back only what the cell printed. The model is the agent crate's scripted stand-in,
/// which records every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_model_is_told_the_mcp_functions_and_sees_only_what_its_code_prints() {
    use runcell_agent::testing::StandIn;
    let python = tokio::task::spawn_blocking(clients::sdk_python)
        .await
        .expect("install the SDK");
    let servers = Arc::new(
        McpServers::new(vec![
            stdio_server("tests", &python, &["default"]),
            stdio_server("secret", &python, &["acme"]),
        ])
        .expect("servers"),
    );
    const LOOP: &str = "from runcell_tools.mcp import tests\n\
        found = [tests.search_issues(query=f'q{i}', per_page=i + 1) for i in range(10)]\n\
        print('TOTAL', sum(r['total'] for r in found))";
    let stand_in = StandIn::start(|n, req| {
        let system = req.body["messages"][0]["content"].as_str().unwrap_or("");
        let message = if n == 0 && system.contains("- tests.search_issues(*, query: str") {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "python",
                "arguments": json!({"code": LOOP}).to_string()}}]})
        } else {
            let printed = req.body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|m| m["role"] == "tool"))
                .and_then(|m| m["content"].as_str())
                .unwrap_or("no listing, no cell");
            json!({"role": "assistant", "content": format!("Printed: {}", printed.trim())})
        };
        let body = json!({"choices": [{"index": 0, "message": message,
            "finish_reason": if n == 0 { "tool_calls" } else { "stop" }}]});
        (200, vec![], body.to_string())
    });
    let chat = runcell_server::ChatConfig {
        provider: stand_in.config(runcell_agent::ProviderKind::OpenAi),
        max_steps: 4,
    };
    let srv =
        common::start_with(move |state| state.with_mcp_servers(servers).with_chat(chat)).await;
    let form = reqwest::multipart::Form::new().text("question", "How many issues in all?");
    let body = srv
        .http
        .post(format!("{}/v1/chat", srv.base))
        .multipart(form)
        .send()
        .await
        .expect("chat")
        .text()
        .await
        .expect("body");
    let events: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).expect("an NDJSON line"))
        .collect();
    let end = events.last().expect("end");
    // 1 + 2 + ... + 10 issues: the sum the cell computed from ten real calls.
    assert_eq!(end["answer"], "Printed: stdout:\nTOTAL 55", "{body}");
    let cell = events
        .iter()
        .find(|e| e["type"] == "tool_result")
        .expect("the cell's result");
    let calls = cell["execution"]["tool_calls"].as_array().expect("calls");
    let searches = calls
        .iter()
        .filter(|c| c["name"] == "mcp.tests.search_issues" && c["error"].is_null())
        .count();
    assert_eq!(searches, 10, "{cell}");

    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    let system = reqs[0].body["messages"][0]["content"]
        .as_str()
        .expect("system");
    assert!(
        system.contains("from runcell_tools.mcp import tests\n")
            && system.contains("- tests.echo(*, text: str)"),
        "{system}"
    );
    // Another tenant's server is not named to this tenant's model.
    assert!(!system.contains("secret"), "{system}");
    // The search results (their titles) never reached the model.
    for r in &reqs {
        let sent = r.body.to_string();
        assert!(!sent.contains("open issue 0 for q"), "{sent}");
    }
}
