//! Code mode in `runcell ask` (issue 22): `--mcp-server` gives the session's code an MCP
//! server's tools, the model is told their names and parameters in its system prompt, writes
//! one cell that loops over the tool, and sees only what that cell prints. The real binary,
//! sandbox and Python runtime; a real MCP server (tests/fixtures/records_mcp_server.py, the
//! official MCP Python SDK in the venv clients.rs makes); a scripted stand-in for the model
//! that records everything runcell sends it.

#[path = "../../server/tests/common/clients.rs"]
mod clients;

use std::path::{Path, PathBuf};
use std::process::Command;

use runcell_agent::testing::StandIn;
use serde_json::{json, Value};

fn data_dir() -> PathBuf {
    runcell_engine::testing::data_dir_with_runtime(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "runcell-ask-code-mode-",
    )
}

fn runcell(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runcell"));
    c.env("RUNCELL_DATA_DIR", data)
        .env("NO_COLOR", "1")
        .env("OPENAI_API_KEY", "sk-test")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("RUNCELL_PROVIDER")
        .env_remove("RUNCELL_MODEL");
    c
}

/// The fixture server's `amount_cents` of record `id` (records_mcp_server.py's `record`).
fn amount_cents(id: i64) -> i64 {
    (id * 7919) % 10_000 + 100
}

const LOOP: &str = "from runcell_tools.mcp import records\n\
total = 0\n\
for i in range(1, 21):\n    total += records.get_record(id=i)['amount_cents']\n\
print(f'TOTAL={total}')\n\
print('LEFT', '_runcell_code_mode_listing' in globals())";

fn tool_call(code: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": null, "tool_calls": [{
            "id": "call_loop", "type": "function",
            "function": {"name": "python", "arguments": json!({"code": code}).to_string()}}]}}]})
}

fn answer(text: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": text}}]})
}

#[test]
fn the_model_loops_over_an_mcp_tool_in_one_cell_and_sees_only_what_it_prints() {
    let python = clients::sdk_python();
    let server = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/records_mcp_server.py")
        .canonicalize()
        .expect("fixture server");
    let data = data_dir();
    let work = tempfile::tempdir().expect("tempdir");
    let calls_log = work.path().join("calls.log");

    let stand_in = StandIn::start(|n, req| {
        let body = match n {
            // The model writes the loop only if it was told the function exists.
            0 => {
                let system = req.body["messages"][0]["content"].as_str().unwrap_or("");
                if system.contains("records.get_record(*, id: int)") {
                    tool_call(LOOP)
                } else {
                    answer("NO TOOL LISTING")
                }
            }
            _ => {
                let messages = req.body["messages"].as_array().expect("messages");
                let printed = messages
                    .iter()
                    .rev()
                    .find(|m| m["role"] == "tool")
                    .and_then(|m| m["content"].as_str())
                    .unwrap_or("");
                let total: String = printed
                    .split("TOTAL=")
                    .nth(1)
                    .unwrap_or("")
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                answer(&format!("The 20 records add up to {total} cents."))
            }
        };
        (200, vec![], body.to_string())
    });

    let out = runcell(&data)
        .env("RECORDS_LOG", &calls_log)
        .arg("ask")
        .arg("Look up records 1 to 20 and report the total amount.")
        .args([
            "--provider",
            "openai",
            "--model",
            "test-model",
            "--base-url",
        ])
        .arg(format!("{}/v1", stand_in.base))
        .arg("--mcp-server")
        .arg(format!(
            "records='{}' '{}'",
            python.display(),
            server.display()
        ))
        .arg("--out")
        .arg(work.path().join("out"))
        .arg("--show-code")
        .output()
        .expect("runcell ask");
    assert!(out.status.success(), "{out:?}");
    // --show-code shows what the model was told, then the cell.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let told = stderr
        .find("── code mode ──\nCode mode:")
        .expect("the listing shown");
    let cell = stderr
        .find("── python (step 1) ──")
        .expect("the cell shown");
    assert!(told < cell, "{stderr}");

    // The answer comes from what the cell printed: the real sum of the server's records.
    let expected: i64 = (1..=20).map(amount_cents).sum();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("The 20 records add up to {expected} cents.")
    );
    // Positive control: the 20 calls really reached the MCP server.
    let served = std::fs::read_to_string(&calls_log).expect("the server's call log");
    let ids: Vec<&str> = served.lines().collect();
    let want: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
    assert_eq!(ids, want, "{served}");

    // Two model calls: the loop, then the answer — not one per record.
    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    let system = reqs[0].body["messages"][0]["content"]
        .as_str()
        .expect("system prompt");
    // The listing: the module, the function with its parameter and description, bounded.
    assert!(
        system.contains("from runcell_tools.mcp import records\n"),
        "{system}"
    );
    assert!(
        system.contains(
            "- records.get_record(*, id: int) -> dict: Look up one customer record by its id (1 to 10000)."
        ),
        "{system}"
    );
    assert!(
        system.contains("- records.fail(*, reason: str)"),
        "{system}"
    );
    let section = &system[system.find("Code mode:").expect("the code mode section")..];
    assert!(
        section.len() <= runcell_agent::code_mode::MAX_SECTION_BYTES + 1024,
        "{}",
        section.len()
    );
    // What the model was told (shown with --nocapture; docs/tools.md quotes it).
    eprintln!("{section}");
    // The model never received an intermediate result: no record's contents in anything sent.
    for r in &reqs {
        let sent = r.body.to_string();
        assert!(
            !sent.contains("cust-00") && !sent.contains("billing+"),
            "a record reached the model: {sent}"
        );
    }
    let tool_text = reqs[1].body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .expect("the cell's output");
    // ... and the listing cell left no name of its own in the session.
    assert_eq!(
        tool_text.trim(),
        format!("stdout:\nTOTAL={expected}\nLEFT False")
    );
    // ask ended its session; its data dir (store, audit log) goes (the runtime is a link).
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn a_bad_mcp_server_flag_is_a_usage_error_before_anything_runs() {
    let data = data_dir();
    let out = runcell(&data)
        .args(["ask", "hi", "--base-url", "http://127.0.0.1:9/v1"])
        .args(["--mcp-server", "not a name=/bin/true"])
        .output()
        .expect("runcell ask");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--mcp-server not a name=/bin/true"),
        "{stderr}"
    );
}
