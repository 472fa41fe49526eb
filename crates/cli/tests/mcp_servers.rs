//! `runcell serve`'s MCP server settings (issue 22): a server configured in the config file,
//! its tenants by flag, used from a session's Python; and the start-up errors for a bad name
//! and for tenants of a server nobody configured. The server is the MCP Python SDK's
//! (crates/server/tests/mcp-servers/test_server.py, in the SDK venv clients.rs makes).

mod common;

#[path = "../../server/tests/common/clients.rs"]
mod clients;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

#[test]
fn a_configured_mcp_server_is_a_module_in_sessions_of_its_tenants() {
    let python = clients::sdk_python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../server/tests/mcp-servers/test_server.py")
        .canonicalize()
        .expect("test server");
    let data = common::serve::data_dir("runcell-mcp-servers-");
    let config = data.join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[mcp_servers.tests]\ncommand = \"'{}' '{}'\"\ntimeout_s = 30\n",
            python.display(),
            script.display()
        ),
    )
    .expect("config");
    let log = Arc::new(Mutex::new(Vec::new()));
    let lines = log.clone();
    let srv = common::serve::serve_logging(
        &data,
        &[
            "--warm-sessions",
            "0",
            "--config",
            config.to_str().expect("utf-8 path"),
            "--mcp-server-tenants",
            "tests=default",
        ],
        move |line| lines.lock().expect("log").push(line),
    );
    let c = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let s: Value = c
        .post(format!("{}/v1/sessions", srv.base))
        .json(&json!({}))
        .send()
        .and_then(|r| r.json())
        .expect("create");
    let id = s["id"].as_str().expect("id");
    let e: Value = c
        .post(format!("{}/v1/sessions/{id}/execute", srv.base))
        .json(&json!({"code": "from runcell_tools.mcp import tests\nprint(tests.echo(text='via serve'), tests.search_issues(query='x', per_page=3)['total'])"}))
        .send()
        .and_then(|r| r.json())
        .expect("execute");
    assert_eq!(e["stdout"], "via serve 3\n", "{e}");
    assert_eq!(e["tool_calls"][1]["name"], "mcp.tests.echo", "{e}");
    drop(srv);
    let log = log.lock().expect("log").join("\n");
    assert!(!log.contains("no tenant may use it"), "{log}");
}

#[test]
fn mcp_server_mistakes_stop_the_server_at_start_up() {
    let data = common::serve::data_dir("runcell-mcp-servers-bad-");
    for (flags, says) in [
        (
            vec!["--mcp-server", "class=some-server"],
            "MCP server name \"class\": it must be a Python identifier",
        ),
        (
            vec![
                "--mcp-server",
                "gh=x",
                "--mcp-server-tenants",
                "github=acme",
            ],
            "--mcp-server-tenants names \"github\", which is not a configured MCP server",
        ),
        (
            vec!["--mcp-server", "gh=x", "--mcp-server", "gh=y"],
            "MCP server \"gh\" is configured twice",
        ),
        (
            vec!["--mcp-server", "docs=http://"],
            "MCP server \"docs\": \"http://\" is not an http:// or https:// URL with a host",
        ),
    ] {
        let out = common::serve::runcell(&data)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&flags)
            .output()
            .expect("serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}
