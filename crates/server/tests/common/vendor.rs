//! The vendor SDKs (tests/vendor-clients/requirements.txt, in a venv under target/ made on
//! first use) and a scripted model behind the vendor prefixes: the stand-in reads the task
//! (the user's last text) and the tool outputs since, and answers with the next call or an
//! answer built from those outputs, so every number a test checks was computed by real code.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};
use std::process::Command;

use runcell_agent::testing::StandIn;
use runcell_agent::ProviderKind;
use serde_json::{json, Value};

#[path = "clients.rs"]
mod clients;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vendor-clients")
}

/// The Python of a venv with the pinned SDKs.
pub fn sdk_python() -> PathBuf {
    // The tests of one binary run at once, and would install into the same directory.
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    clients::requirements_venv("vendor-sdks", &dir().join("requirements.txt"))
}

/// Runs `script` (in tests/vendor-clients) with `args`; its JSON report.
pub fn run_sdk(script: &str, args: &[&str]) -> Value {
    let out = Command::new(sdk_python())
        .arg(dir().join(script))
        .args(args)
        .output()
        .expect("run the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} {args:?} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

/// The model's next move.
#[derive(Debug, Clone)]
pub enum Step {
    Call(&'static str, Value),
    Say(String),
}

/// The section `label:` of a runcell tool result (up to the next blank line), trimmed.
pub fn section(text: &str, label: &str) -> String {
    let Some(at) = text.find(&format!("{label}:\n")) else {
        return String::new();
    };
    let rest = &text[at + label.len() + 2..];
    rest.split("\n\n").next().unwrap_or("").trim().to_owned()
}

/// The task and the tool outputs since, from a Chat Completions request.
fn openai_view(body: &Value) -> (String, Vec<String>) {
    let msgs = body["messages"].as_array().cloned().unwrap_or_default();
    let at = msgs
        .iter()
        .rposition(|m| m["role"] == "user" && m["content"].is_string())
        .unwrap_or(0);
    let task = msgs[at]["content"].as_str().unwrap_or("").to_owned();
    let outputs = msgs[at + 1..]
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect();
    (task, outputs)
}

/// The same from a Messages request.
fn anthropic_view(body: &Value) -> (String, Vec<String>) {
    let msgs = body["messages"].as_array().cloned().unwrap_or_default();
    let at = msgs
        .iter()
        .rposition(|m| m["role"] == "user" && m["content"].is_string())
        .unwrap_or(0);
    let task = msgs[at]["content"].as_str().unwrap_or("").to_owned();
    let mut outputs = Vec::new();
    for m in &msgs[at + 1..] {
        for b in m["content"].as_array().into_iter().flatten() {
            if b["type"] == "tool_result" {
                let text: Vec<&str> = b["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["text"].as_str())
                    .collect();
                outputs.push(text.join("\n"));
            }
        }
    }
    (task, outputs)
}

/// The same from a generateContent request.
fn gemini_view(body: &Value) -> (String, Vec<String>) {
    let contents = body["contents"].as_array().cloned().unwrap_or_default();
    let at = contents
        .iter()
        .rposition(|c| c["role"] == "user" && c["parts"][0]["text"].is_string())
        .unwrap_or(0);
    let task = contents[at]["parts"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let mut outputs = Vec::new();
    for c in &contents[at + 1..] {
        for p in c["parts"].as_array().into_iter().flatten() {
            let r = &p["functionResponse"]["response"];
            if let Some(t) = r["output"].as_str().or_else(|| r["error"].as_str()) {
                outputs.push(t.to_owned());
            }
        }
    }
    (task, outputs)
}

fn gemini_reply(n: usize, step: Step) -> String {
    let part = match step {
        Step::Call(name, args) => {
            json!({"functionCall": {"id": format!("fc_{n}"), "name": name, "args": args}})
        }
        Step::Say(text) => json!({"text": text}),
    };
    json!({"candidates": [{"index": 0, "finishReason": "STOP",
        "content": {"role": "model", "parts": [part]}}],
        "usageMetadata": {"promptTokenCount": 100 + n, "candidatesTokenCount": 10}})
    .to_string()
}

fn openai_reply(n: usize, step: Step) -> String {
    let (message, finish) = match step {
        Step::Call(name, args) => (
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call_{n}"), "type": "function",
                "function": {"name": name, "arguments": args.to_string()}}]}),
            "tool_calls",
        ),
        Step::Say(text) => (json!({"role": "assistant", "content": text}), "stop"),
    };
    json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion", "choices": [
        {"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 100 + n, "completion_tokens": 10}})
    .to_string()
}

fn anthropic_reply(n: usize, step: Step) -> String {
    let (content, stop) = match step {
        Step::Call(name, args) => (
            json!([{"type": "tool_use", "id": format!("toolu_{n}"), "name": name, "input": args}]),
            "tool_use",
        ),
        Step::Say(text) => (json!([{"type": "text", "text": text}]), "end_turn"),
    };
    json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": "m",
        "content": content, "stop_reason": stop,
        "usage": {"input_tokens": 100 + n, "output_tokens": 10}})
    .to_string()
}

/// A stand-in for `kind`'s API that follows `script(task, outputs)`.
pub fn scripted(
    kind: ProviderKind,
    script: impl Fn(&str, &[String]) -> Step + Send + 'static,
) -> StandIn {
    StandIn::start(move |n, req| {
        let (task, outputs) = match kind {
            ProviderKind::OpenAi => openai_view(&req.body),
            ProviderKind::Anthropic => anthropic_view(&req.body),
            ProviderKind::Gemini => gemini_view(&req.body),
        };
        let step = script(&task, &outputs);
        let body = match kind {
            ProviderKind::OpenAi => openai_reply(n, step),
            ProviderKind::Anthropic => anthropic_reply(n, step),
            ProviderKind::Gemini => gemini_reply(n, step),
        };
        (200, vec![], body)
    })
}

/// What a run printed, or else the value of its last expression.
pub fn shown(out: &str) -> String {
    let s = section(out, "stdout");
    if s.is_empty() {
        section(out, "result")
    } else {
        s
    }
}
