//! A scripted stand-in for a provider's HTTP API: 127.0.0.1:0, HTTP/1.1 parsed by hand, one
//! request per connection.
#![allow(dead_code, reason = "each test binary uses a different subset")]

pub use runcell_agent::testing::*;

/// A Chat Completions reply calling `name` with `arguments` (a JSON string as the API sends).
pub fn openai_call(id: &str, name: &str, arguments: &str) -> String {
    serde_json::json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": null, "tool_calls": [{
            "id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]}}]})
    .to_string()
}

/// A Chat Completions reply with only text.
pub fn openai_text(text: &str) -> String {
    serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": text}}]})
    .to_string()
}
