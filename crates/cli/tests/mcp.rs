//! `runcell mcp` spoken to by a real MCP client (rmcp's), and `runcell tools`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

#[path = "../../server/tests/common/clients.rs"]
mod clients;

/// A data dir whose runtime is the shared, already-installed test runtime.
fn data_dir() -> PathBuf {
    runcell_engine::testing::data_dir_with_runtime(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "runcell-mcp-test-",
    )
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

fn workspaces(data: &Path) -> Vec<String> {
    std::fs::read_dir(runcell_engine::workspaces_dir(data))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_over_stdio_runs_the_tools_in_one_session() {
    let data = data_dir();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_runcell"));
    cmd.arg("--data-dir")
        .arg(&data)
        .arg("mcp")
        .env("NO_COLOR", "1");
    let transport = TokioChildProcess::new(cmd).expect("spawn runcell mcp");
    let client = ().serve(transport).await.expect("initialize");
    let info = client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("runcell")
    );

    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["python", "bash", "text_editor"]);
    assert!(tools[0].input_schema.contains_key("properties"));

    // State persists between calls.
    let r = call(&client, "python", json!({"code": "x = 41"})).await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let r = call(&client, "python", json!({"code": "x + 1"})).await;
    assert!(text(&r).contains("42"), "{}", text(&r));
    let execution = r.structured_content.clone().expect("structuredContent");
    assert_eq!(execution["status"], "ok");
    assert_eq!(execution["execution_count"], 2);
    let session = execution["session_id"]
        .as_str()
        .expect("session")
        .to_owned();
    assert_eq!(workspaces(&data), [session]);

    // Images come back as image content.
    let r = call(
        &client,
        "python",
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"}),
    )
    .await;
    let image = r
        .content
        .iter()
        .find_map(|c| c.as_image())
        .unwrap_or_else(|| panic!("no image in {:?}", r.content));
    assert_eq!(image.mime_type, "image/png");
    let png = base64::engine::general_purpose::STANDARD
        .decode(&image.data)
        .expect("base64");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));

    // Files the code writes are linked, and the links can be read.
    let r = call(
        &client,
        "python",
        json!({"code": "open('report.csv', 'w').write('a,b\\n1,2\\n')"}),
    )
    .await;
    let link = r
        .content
        .iter()
        .find_map(|c| c.as_resource_link())
        .unwrap_or_else(|| panic!("no resource link in {:?}", r.content));
    assert_eq!(link.name, "report.csv");
    assert_eq!(link.mime_type.as_deref(), Some("text/csv"));
    let read = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            link.uri.clone(),
        ))
        .await
        .expect("read the linked file");
    let body = serde_json::to_value(&read.contents[0]).expect("json");
    assert_eq!(body["text"], "a,b\n1,2\n", "{body}");
    let outside = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            link.uri.replace("report.csv", "../../etc/passwd"),
        ))
        .await;
    assert!(outside.is_err(), "paths outside the workspace are refused");

    // Errors are tool errors the model reads.
    let r = call(&client, "python", json!({"code": "1/0"})).await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("ZeroDivisionError"), "{}", text(&r));

    // The editor and bash share the session's workspace.
    let r = call(
        &client,
        "text_editor",
        json!({"command": "create", "path": "notes.txt", "file_text": "hello world\n"}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let r = call(
        &client,
        "text_editor",
        json!({"command": "str_replace", "path": "/workspace/notes.txt", "old_str": "world", "new_str": "runcell"}),
    )
    .await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let r = call(&client, "bash", json!({"command": "cat notes.txt"})).await;
    assert!(text(&r).contains("hello runcell"), "{}", text(&r));
    let r = call(
        &client,
        "python",
        json!({"code": "open('notes.txt').read()"}),
    )
    .await;
    assert!(text(&r).contains("hello runcell"), "{}", text(&r));

    // Another session id is refused; a bad argument is a tool error.
    let r = call(
        &client,
        "python",
        json!({"code": "1", "session_id": "ses_nope"}),
    )
    .await;
    assert_eq!(r.is_error, Some(true));
    assert!(text(&r).contains("not found"), "{}", text(&r));
    let r = call(&client, "python", json!({"source": "1"})).await;
    assert_eq!(r.is_error, Some(true));

    // EOF ends the connection, and its session with it.
    client.cancel().await.expect("close");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !workspaces(&data).is_empty() {
        assert!(
            Instant::now() < deadline,
            "session left: {:?}",
            workspaces(&data)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn tools_prints_function_definitions() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runcell"))
        .args(["tools", "--format", "openai"])
        .output()
        .expect("runcell tools");
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let tools = v.as_array().expect("array");
    assert_eq!(tools.len(), 3);
    for t in tools {
        assert_eq!(t["type"], "function");
        assert!(t["function"]["description"]
            .as_str()
            .is_some_and(|d| d.len() > 20));
        assert_eq!(t["function"]["parameters"]["type"], "object");
    }
    assert_eq!(tools[0]["function"]["name"], "python");
    assert_eq!(tools[2]["function"]["name"], "text_editor");

    for (format, check) in [
        ("anthropic", "/0/input_schema/type"),
        ("gemini", "/functionDeclarations/0/parameters/type"),
        ("mcp", "/tools/0/inputSchema/type"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_runcell"))
            .args(["tools", "--format", format])
            .output()
            .expect("runcell tools");
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v.pointer(check), Some(&json!("object")), "{format}: {v}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runcell"))
        .args(["tools", "--format", "xml"])
        .output()
        .expect("runcell tools");
    assert!(!out.status.success());
}

/// The MCP Python SDK's default client over stdio: state and files persist between calls.
#[test]
fn the_python_sdks_default_client_keeps_its_state_over_stdio() {
    let data = data_dir();
    let exe = Path::new(env!("CARGO_BIN_EXE_runcell"));
    let report = clients::run_sdk_client(&[
        "--".as_ref(),
        exe.as_os_str(),
        "--data-dir".as_ref(),
        data.as_os_str(),
        "mcp".as_ref(),
    ]);
    clients::assert_state_kept(&report);
}

/// A line that is not a JSON-RPC message gets an error reply (`"id": null` when it has no
/// id), not silence; the server goes on answering.
#[test]
fn unreadable_stdin_lines_get_json_rpc_errors() {
    use std::io::{BufRead, BufReader, Write};
    let data = data_dir();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_runcell"))
        .arg("--data-dir")
        .arg(&data)
        .arg("mcp")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn runcell mcp");
    // A reply that never comes must fail the test, not hang it: the server is killed, its
    // stdout ends and the read below fails.
    let pid = child.id().to_string();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if finished.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status();
        }
    });
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut reply = || {
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read a reply");
        serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    writeln!(stdin, "{init}").expect("write");
    assert_eq!(reply()["id"], 1);
    writeln!(
        stdin,
        r#"{{"jsonrpc": "2.0", "method": "notifications/initialized"}}"#
    )
    .expect("write");
    for (line, code, id) in [
        ("{not json".to_owned(), -32700, Value::Null),
        (
            r#"{"id": 5, "method": "ping"}"#.to_owned(),
            -32600,
            json!(5),
        ),
        (
            r#"{"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"arguments": {}}}"#
                .to_owned(),
            -32602,
            json!(6),
        ),
    ] {
        writeln!(stdin, "{line}").expect("write");
        let r = reply();
        assert_eq!(r["error"]["code"], code, "{line}: {r}");
        assert_eq!(r["id"], id, "{line}: {r}");
        assert_eq!(r["jsonrpc"], "2.0");
    }
    writeln!(stdin, r#"{{"jsonrpc": "2.0", "id": 7, "method": "ping"}}"#).expect("write");
    let r = reply();
    assert_eq!(r["id"], 7, "{r}");
    assert!(r["result"].is_object(), "{r}");
    drop(stdin);
    let status = child.wait().expect("wait");
    let _ = done.send(());
    assert!(status.success(), "{status}");
}
