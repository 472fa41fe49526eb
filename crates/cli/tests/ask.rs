//! `runcell ask` end to end: the real binary, the real sandbox and Python runtime, and a
//! scripted local stand-in for the provider's HTTP API (127.0.0.1:0, HTTP/1.1 parsed by hand).
//! The stand-in only learns the number it answers with from the tool results it is sent, so
//! the answer proves the code really ran.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use runcell_agent::testing::{Request, StandIn};
use serde_json::{json, Value};

/// A data dir whose runtime is the shared, already-installed test runtime.
fn data_dir() -> PathBuf {
    runcell_engine::testing::data_dir_with_runtime(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "runcell-ask-test-",
    )
}

fn runcell(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runcell"));
    c.env("RUNCELL_DATA_DIR", data)
        .env("NO_COLOR", "1")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("RUNCELL_PROVIDER")
        .env_remove("RUNCELL_MODEL");
    c
}

/// The agent crate's provider stand-in, with JSON bodies.
fn stand_in(
    script: impl Fn(usize, &Request) -> (u16, Vec<(&'static str, String)>, Value) + Send + 'static,
) -> StandIn {
    StandIn::start(move |n, r| {
        let (status, headers, body) = script(n, r);
        (status, headers, body.to_string())
    })
}

/// A CSV whose answer only running code gives: the sum of price * qty.
fn write_data(dir: &Path) -> (PathBuf, i64) {
    let mut csv = String::from("item,price,qty\n");
    let mut total = 0i64;
    for i in 1..=40i64 {
        let (price, qty) = (i * 37 % 101 + 3, i * 13 % 17 + 1);
        total += price * qty;
        csv.push_str(&format!("item{i},{price},{qty}\n"));
    }
    let path = dir.join("data.csv");
    std::fs::write(&path, csv).expect("write csv");
    (path, total)
}

const BUGGY: &str = "import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(df['revenue'].sum())";
const FIXED: &str = "import pandas as pd\nimport matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\ndf = pd.read_csv('data.csv')\ntotal = int((df['price'] * df['qty']).sum())\nprint(f'TOTAL={total}')\nfig, ax = plt.subplots()\nax.bar(df['item'], df['price'] * df['qty'])\nfig.savefig('chart.png')\nplt.show()";

/// The number after TOTAL= in `text`.
fn total_in(text: &str) -> Option<String> {
    let at = text.find("TOTAL=")? + "TOTAL=".len();
    Some(
        text[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect(),
    )
}

fn tool_names(tools: &Value, key: &str) -> Vec<String> {
    tools
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            t.pointer(key)
                .and_then(Value::as_str)
                .expect("name")
                .to_owned()
        })
        .collect()
}

fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn check_png(path: &Path) {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(data.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
}

fn audit_list(data: &Path) -> String {
    let out = runcell(data)
        .args(["audit", "list"])
        .output()
        .expect("audit");
    assert!(out.status.success(), "{out:?}");
    stdout_of(&out)
}

#[test]
fn openai_flow_fixes_a_bug_charts_and_answers_with_the_real_number() {
    let data = data_dir();
    let work = tempfile::tempdir().expect("tempdir");
    let (csv, total) = write_data(work.path());
    let stand_in = stand_in(|n, req| {
        let call = |id: &str, code: &str| {
            json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": [{
                    "id": id, "type": "function",
                    "function": {"name": "python", "arguments": json!({"code": code}).to_string()}}]}}]})
        };
        let body = match n {
            0 => call("call_bug", BUGGY),
            1 => call("call_fix", FIXED),
            _ => {
                let messages = req.body["messages"].as_array().expect("messages");
                let last_tool = messages
                    .iter()
                    .rev()
                    .find(|m| m["role"] == "tool")
                    .and_then(|m| m["content"].as_str())
                    .unwrap_or("");
                let number = total_in(last_tool).unwrap_or_else(|| "unknown".into());
                json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                    "content": format!("The total revenue is {number}. The chart is in chart.png.")}}]})
            }
        };
        (200, vec![], body)
    });
    let out_dir = work.path().join("out");
    let out = runcell(&data)
        .env("OPENAI_API_KEY", "sk-test-123")
        .arg("ask")
        .arg("What is the total revenue? Chart it.")
        .arg("--file")
        .arg(&csv)
        .args([
            "--provider",
            "openai",
            "--model",
            "test-model",
            "--base-url",
        ])
        .arg(format!("{}/v1", stand_in.base))
        .arg("--out")
        .arg(&out_dir)
        .arg("--show-code")
        .output()
        .expect("runcell ask");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        stdout_of(&out).trim(),
        format!("The total revenue is {total}. The chart is in chart.png.")
    );
    // --show-code showed both cells and the error.
    assert!(
        stderr.contains("df['revenue']") && stderr.contains("KeyError"),
        "{stderr}"
    );
    check_png(&out_dir.join("chart.png"));
    assert!(
        !out_dir.join("data.csv").exists(),
        "the upload is not an output"
    );

    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.headers["authorization"], "Bearer sk-test-123");
        assert_eq!(r.body["model"], "test-model");
        assert_eq!(
            tool_names(&r.body["tools"], "/function/name"),
            ["python", "bash", "text_editor"]
        );
        assert_eq!(r.body["tools"][0]["type"], "function");
    }
    let first = &reqs[0].body["messages"];
    assert_eq!(first[0]["role"], "system");
    assert!(first[0]["content"]
        .as_str()
        .expect("system")
        .contains("/workspace"));
    // No MCP server: no code-mode listing (ask_code_mode.rs has one).
    assert!(!first[0]["content"]
        .as_str()
        .expect("system")
        .contains("Code mode:"));
    let question = first[1]["content"].as_str().expect("question");
    assert!(
        question.contains("total revenue") && question.contains("data.csv"),
        "{question}"
    );

    // The failing call's result: the KeyError, as a tool message answering that call.
    let second = reqs[1].body["messages"].as_array().expect("messages");
    assert_eq!(second[2]["role"], "assistant");
    assert_eq!(second[2]["tool_calls"][0]["id"], "call_bug");
    assert_eq!(second[3]["role"], "tool");
    assert_eq!(second[3]["tool_call_id"], "call_bug");
    let err_text = second[3]["content"].as_str().expect("tool text");
    assert!(
        err_text.contains("KeyError") && err_text.contains("revenue"),
        "{err_text}"
    );
    assert_eq!(second.len(), 4, "no image message after a failure");

    // The fixed call's result: the number in the tool message, the chart in a user message.
    let third = reqs[2].body["messages"].as_array().expect("messages");
    assert_eq!(third.len(), 7);
    assert_eq!(third[5]["role"], "tool");
    assert_eq!(third[5]["tool_call_id"], "call_fix");
    let text = third[5]["content"].as_str().expect("tool text");
    assert!(text.contains(&format!("TOTAL={total}")), "{text}");
    assert!(text.contains("chart.png"), "{text}");
    assert_eq!(third[6]["role"], "user");
    let parts = third[6]["content"].as_array().expect("parts");
    let image = parts
        .iter()
        .find(|p| p["type"] == "image_url")
        .expect("an image part");
    assert!(image["image_url"]["url"]
        .as_str()
        .expect("url")
        .starts_with("data:image/png;base64,iVBOR"));

    // Both cells are in the audit log, under the default tenant.
    let audit = audit_list(&data);
    assert!(audit.contains("import pandas as pd"), "{audit}");
    assert_eq!(audit.lines().count(), 2, "{audit}");
}

#[test]
fn anthropic_flow_uses_tool_use_blocks_and_images_in_tool_results() {
    let data = data_dir();
    let work = tempfile::tempdir().expect("tempdir");
    let (csv, total) = write_data(work.path());
    let stand_in = stand_in(|n, req| {
        let call = |id: &str, code: &str| {
            json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
                "stop_reason": "tool_use", "content": [
                    {"type": "text", "text": "Let me look at the data."},
                    {"type": "tool_use", "id": id, "name": "python", "input": {"code": code}}]})
        };
        let body = match n {
            0 => call("toolu_bug", BUGGY),
            1 => call("toolu_fix", FIXED),
            _ => {
                let last = req.body["messages"]
                    .as_array()
                    .and_then(|m| m.last())
                    .cloned()
                    .unwrap_or_default();
                let text = last
                    .pointer("/content/0/content/0/text")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let number = total_in(text).unwrap_or_else(|| "unknown".into());
                json!({"id": "msg_3", "type": "message", "role": "assistant", "stop_reason": "end_turn",
                    "content": [{"type": "text", "text": format!("Total: {number}.")}]})
            }
        };
        (200, vec![], body)
    });
    let out_dir = work.path().join("out");
    let out = runcell(&data)
        .env("ANTHROPIC_API_KEY", "ant-test-key")
        .arg("ask")
        .arg("Total revenue?")
        .arg("--file")
        .arg(&csv)
        .args([
            "--provider",
            "anthropic",
            "--model",
            "claude-test",
            "--base-url",
        ])
        .arg(&stand_in.base)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .expect("runcell ask");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout_of(&out).trim(), format!("Total: {total}."));
    check_png(&out_dir.join("chart.png"));

    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.headers["x-api-key"], "ant-test-key");
        assert_eq!(r.headers["anthropic-version"], "2023-06-01");
        assert!(!r.headers.contains_key("authorization"));
        assert_eq!(r.body["model"], "claude-test");
        assert!(r.body["max_tokens"].as_u64().is_some());
        assert!(r.body["system"]
            .as_str()
            .expect("system")
            .contains("/workspace"));
        assert_eq!(
            tool_names(&r.body["tools"], "/name"),
            ["python", "bash", "text_editor"]
        );
        assert!(r.body["tools"][0]["input_schema"].is_object());
    }
    let second = reqs[1].body["messages"].as_array().expect("messages");
    assert_eq!(second.len(), 3);
    // The assistant turn goes back as it came.
    assert_eq!(second[1]["role"], "assistant");
    assert_eq!(second[1]["content"][0]["text"], "Let me look at the data.");
    assert_eq!(second[1]["content"][1]["id"], "toolu_bug");
    let result = &second[2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "toolu_bug");
    assert_eq!(result["is_error"], true);
    let err_text = result["content"][0]["text"].as_str().expect("text");
    assert!(err_text.contains("KeyError"), "{err_text}");

    let third = reqs[2].body["messages"].as_array().expect("messages");
    let result = &third[4]["content"][0];
    assert_eq!(result["tool_use_id"], "toolu_fix");
    assert_eq!(result["is_error"], false);
    let content = result["content"].as_array().expect("content");
    assert!(content[0]["text"]
        .as_str()
        .expect("text")
        .contains(&format!("TOTAL={total}")));
    let image = content
        .iter()
        .find(|b| b["type"] == "image")
        .expect("an image block in the tool result");
    assert_eq!(image["source"]["type"], "base64");
    assert_eq!(image["source"]["media_type"], "image/png");
    assert!(image["source"]["data"]
        .as_str()
        .expect("data")
        .starts_with("iVBOR"));
    assert_eq!(audit_list(&data).lines().count(), 2);
}

#[test]
fn gemini_flow_uses_function_calls_and_sends_the_parts_back_as_they_came() {
    let data = data_dir();
    let work = tempfile::tempdir().expect("tempdir");
    let (csv, total) = write_data(work.path());
    let stand_in = stand_in(|n, req| {
        let call = |id: Option<&str>, code: &str| {
            let mut call = json!({"name": "python", "args": {"code": code}});
            if let Some(id) = id {
                call["id"] = json!(id);
            }
            json!({"candidates": [{"index": 0, "finishReason": "STOP", "content": {"role": "model", "parts": [
                    {"text": "Let me look at the data."},
                    {"functionCall": call, "thoughtSignature": "c2lnLTE="}]}}],
                "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 5}})
        };
        let body = match n {
            0 => call(None, BUGGY),
            1 => call(Some("fc_fix"), FIXED),
            _ => {
                let last = req.body["contents"]
                    .as_array()
                    .and_then(|m| m.last())
                    .cloned()
                    .unwrap_or_default();
                let text = last
                    .pointer("/parts/0/functionResponse/response/output")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let number = total_in(text).unwrap_or_else(|| "unknown".into());
                json!({"candidates": [{"index": 0, "finishReason": "STOP", "content": {"role": "model",
                    "parts": [{"text": format!("Total: {number}.")}]}}]})
            }
        };
        (200, vec![], body)
    });
    let out_dir = work.path().join("out");
    let out = runcell(&data)
        .env("GEMINI_API_KEY", "gem-test-key")
        .arg("ask")
        .arg("Total revenue?")
        .arg("--file")
        .arg(&csv)
        .args([
            "--provider",
            "gemini",
            "--model",
            "gemini-test",
            "--base-url",
        ])
        .arg(format!("{}/v1beta", stand_in.base))
        .arg("--out")
        .arg(&out_dir)
        .output()
        .expect("runcell ask");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout_of(&out).trim(), format!("Total: {total}."));
    check_png(&out_dir.join("chart.png"));

    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.path, "/v1beta/models/gemini-test:generateContent");
        assert_eq!(r.headers["x-goog-api-key"], "gem-test-key");
        assert!(!r.headers.contains_key("authorization"));
        assert!(r.body["systemInstruction"]["parts"][0]["text"]
            .as_str()
            .expect("system")
            .contains("/workspace"));
        assert_eq!(
            tool_names(&r.body["tools"][0]["functionDeclarations"], "/name"),
            ["python", "bash", "text_editor"]
        );
        assert!(r.body["generationConfig"]["maxOutputTokens"]
            .as_u64()
            .is_some());
    }
    let second = reqs[1].body["contents"].as_array().expect("contents");
    assert_eq!(second.len(), 3);
    // The model's turn goes back as it came, with its thought signature.
    assert_eq!(second[1]["role"], "model");
    assert_eq!(second[1]["parts"][1]["thoughtSignature"], "c2lnLTE=");
    let response = &second[2]["parts"][0]["functionResponse"];
    assert_eq!(response["name"], "python");
    assert!(
        response.get("id").is_none(),
        "the call came without an id: {response}"
    );
    let err_text = response["response"]["error"].as_str().expect("error");
    assert!(err_text.contains("KeyError"), "{err_text}");

    let third = reqs[2].body["contents"].as_array().expect("contents");
    let parts = third[4]["parts"].as_array().expect("parts");
    assert_eq!(parts[0]["functionResponse"]["id"], "fc_fix");
    assert!(parts[0]["functionResponse"]["response"]["output"]
        .as_str()
        .expect("output")
        .contains(&format!("TOTAL={total}")));
    let image = parts
        .iter()
        .find(|p| p.get("inlineData").is_some())
        .expect("the figure after the function response");
    assert_eq!(image["inlineData"]["mimeType"], "image/png");
    assert!(image["inlineData"]["data"]
        .as_str()
        .expect("data")
        .starts_with("iVBOR"));
    assert_eq!(audit_list(&data).lines().count(), 2);
}

#[test]
fn a_429_is_retried_after_retry_after() {
    let data = data_dir();
    let stand_in = stand_in(|n, _| match n {
        0 => (
            429,
            vec![("retry-after", "1".to_owned())],
            json!({"error": {"message": "Rate limit reached", "type": "rate_limit"}}),
        ),
        _ => (
            200,
            vec![],
            json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Forty-two."}}]}),
        ),
    });
    let out = runcell(&data)
        .env("OPENAI_API_KEY", "sk-test")
        .args(["ask", "What is six times seven?", "--base-url"])
        .arg(&stand_in.base)
        .output()
        .expect("runcell ask");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout_of(&out).trim(), "Forty-two.");
    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].body, reqs[1].body, "the same request again");
    assert!(
        reqs[1].at.duration_since(reqs[0].at) >= Duration::from_millis(900),
        "retry-after was not honoured"
    );
    assert_eq!(reqs[0].body["model"], "gpt-4.1", "the default model");
}

#[test]
fn a_401_names_the_key_variable() {
    let data = data_dir();
    let stand_in = stand_in(|_, _| {
        (
            401,
            vec![],
            json!({"error": {"message": "Incorrect API key provided: sk-wrong", "type": "invalid_request_error"}}),
        )
    });
    let out = runcell(&data)
        .env("OPENAI_API_KEY", "sk-wrong")
        .args(["ask", "Hello?", "--base-url"])
        .arg(&stand_in.base)
        .output()
        .expect("runcell ask");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr.contains("OPENAI_API_KEY"), "{stderr}");
    assert!(stderr.contains("Incorrect API key"), "{stderr}");
    assert_eq!(stand_in.requests().len(), 1, "a 401 is not retried");
    assert!(stdout_of(&out).is_empty());
}

#[test]
fn without_a_key_the_default_endpoint_is_not_called() {
    let data = data_dir();
    let out = runcell(&data)
        .args(["ask", "Hello?", "--provider", "anthropic"])
        .output()
        .expect("runcell ask");
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("ANTHROPIC_API_KEY"), "{stderr}");
}

/// A model that runs `code` once, then answers "Done.".
fn one_cell(code: &'static str) -> StandIn {
    stand_in(move |n, _| {
        let body = if n == 0 {
            json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": null, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "python", "arguments": json!({"code": code}).to_string()}}]}}]})
        } else {
            json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Done."}}]})
        };
        (200, vec![], body)
    })
}

fn ask_into(data: &Path, stand_in: &StandIn, out_dir: &Path, extra: &[&str]) -> Output {
    runcell(data)
        .env("OPENAI_API_KEY", "sk-test")
        .args(["ask", "Write the report.", "--base-url"])
        .arg(&stand_in.base)
        .arg("--out")
        .arg(out_dir)
        .args(extra)
        .output()
        .expect("runcell ask")
}

/// The code writes a file over a link planted in --out, one over an existing file, one whose
/// name holds a terminal escape sequence, a dotfile and a plain one.
const WRITES: &str = "files = {'report.txt': 'pwned', 'existing.txt': 'new', \
                      '\\x1b[31mred.txt': 'r', '.bashrc': 'echo hi', 'normal.txt': 'ok'}\n\
                      for name, text in files.items():\n    open(name, 'w').write(text)\n";

#[test]
fn out_never_follows_a_planted_link_nor_overwrites_and_prints_names_escaped() {
    let data = data_dir();
    let work = tempfile::tempdir().expect("tempdir");
    let outside = work.path().join("outside");
    std::fs::write(&outside, "the user's own file").expect("write");
    let out_dir = work.path().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    std::os::unix::fs::symlink(&outside, out_dir.join("report.txt")).expect("plant the link");
    std::fs::write(out_dir.join("existing.txt"), "mine").expect("write");

    let model = one_cell(WRITES);
    let out = ask_into(&data, &model, &out_dir, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The answer is printed; the refusals make the exit code 1.
    assert_eq!(stdout_of(&out).trim(), "Done.", "{out:?}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&outside).expect("read"),
        "the user's own file",
        "the link was followed"
    );
    assert!(std::fs::symlink_metadata(out_dir.join("report.txt"))
        .expect("link")
        .file_type()
        .is_symlink());
    assert!(
        stderr.contains("not saved: ") && stderr.contains("report.txt: a symbolic link is there"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("existing.txt")).expect("read"),
        "mine"
    );
    assert!(
        stderr.contains("existing.txt: a file of that name exists (--force replaces it)"),
        "{stderr}"
    );
    // The escape sequence is shown escaped, never sent raw to the terminal.
    assert!(!stderr.contains('\u{1b}'), "{stderr:?}");
    assert!(stderr.contains("\\u{1b}[31mred.txt (1 bytes)"), "{stderr}");
    assert_eq!(
        std::fs::read(out_dir.join("\u{1b}[31mred.txt")).expect("read"),
        b"r"
    );
    // The dotfile is saved, and listed like every other file; the positive control is saved.
    assert!(stderr.contains("/.bashrc (7 bytes)"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out_dir.join("normal.txt")).expect("read"),
        "ok"
    );
    assert!(stderr.contains("/normal.txt (2 bytes)"), "{stderr}");
    assert!(stderr.contains("2 of 5 files not saved"), "{stderr}");

    // --force replaces the existing file, and still never writes through the link.
    let model = one_cell(WRITES);
    let out = ask_into(&data, &model, &out_dir, &["--force"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(out_dir.join("existing.txt")).expect("read"),
        "new"
    );
    assert!(
        stderr.contains("existing.txt (3 bytes, replaced)"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&outside).expect("read"),
        "the user's own file"
    );
    assert!(stderr.contains("1 of 5 files not saved"), "{stderr}");
}

/// The model defaults `--help` states are the agent's own (one place), for `ask` and for the
/// chat of `serve`.
#[test]
fn help_states_the_default_models() {
    let data = tempfile::tempdir().expect("tempdir");
    for (cmd, flag) in [("ask", "--model"), ("serve", "--agent-model")] {
        let out = runcell(data.path())
            .args([cmd, "--help"])
            .output()
            .expect("help");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{cmd} --help: {out:?}");
        let line = help
            .lines()
            .skip_while(|l| !l.contains(flag))
            .take(2)
            .collect::<String>();
        for model in [
            runcell_agent::DEFAULT_OPENAI_MODEL,
            runcell_agent::DEFAULT_ANTHROPIC_MODEL,
            runcell_agent::DEFAULT_GEMINI_MODEL,
        ] {
            assert!(
                line.contains(model),
                "{cmd} --help {flag} names {model}: {line}"
            );
        }
    }
}
