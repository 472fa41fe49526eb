//! Programmatic tool calling (issue 22; docs/vendor-apis.md, docs/tools.md): the request's
//! custom tools marked `allowed_callers: ["code_execution_20260120"]` are functions of the
//! Python the model runs in the container (`from runcell_tools import NAME`), answered by the
//! client, through the tool bridge (engine `bridge.rs`, server `tool_calls.rs`).
//!
//! A call from the code suspends the cell (the bridge's waiting state): the reply ends with
//! `stop_reason: "tool_use"` and one `tool_use` block per waiting call, each with
//! `caller: {type, tool_id}` naming the code's `server_tool_use`. The client sends the
//! conversation back with `tool_result` blocks and the same `container`; the answers go to the
//! suspended code, which goes on, and the model sees only what the cell printed, never the
//! tools' results (those blocks are left out of the model's transcript).
//!
//! A `tool_use` id is the bridge's call id under Anthropic's prefix (`toolu_` + 128 random
//! bits); an answer counts only for a call waiting in that container of that tenant.

use std::collections::HashSet;
use std::sync::Arc;

use runcell_engine::bridge::{ExecTools, PendingToolCall, ToolSpec};
use runcell_engine::{EngineError, Execution, ExecutionStatus, Language};
use serde_json::{json, Value};

use super::error::Error;
use crate::tool_calls::{Attending, Run, ToolCalls, ToolResult};
use crate::vendor::sandbox::Sandbox;

/// The code execution versions a tool's `allowed_callers` may name, beside `direct`.
pub(super) const CODE_CALLERS: [&str; 3] = [
    "code_execution_20250825",
    "code_execution_20260120",
    "code_execution_20260521",
];

/// The `caller.type` of a `tool_use` the code made under code tool `version`. The SDK knows
/// the 2025-08-25 and 2026-01-20 caller types only (anthropic 2.10.0 has no 2026-05-21 one,
/// and validates strictly), so the 2026-05-21 tool reports the 2026-01-20 caller it extends.
pub(super) fn caller_type(version: &str) -> &'static str {
    match version {
        "code_execution_20250825" => "code_execution_20250825",
        _ => "code_execution_20260120",
    }
}

/// A bridge call id as Anthropic's `tool_use` id.
pub(super) fn tool_use_id(call_id: &str) -> String {
    format!("toolu_{}", call_id.strip_prefix("call_").unwrap_or(call_id))
}

/// The bridge call id a `tool_use` id names, if it can name one.
fn call_id(tool_use_id: &str) -> Option<String> {
    let hex = tool_use_id.strip_prefix("toolu_")?;
    let ok = hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| format!("call_{hex}"))
}

/// The block a waiting call is reported as.
pub(super) fn tool_use_block(call: &PendingToolCall, caller: &str, server_id: &str) -> Value {
    json!({"type": "tool_use", "id": tool_use_id(&call.id), "name": call.name, "input": call.input,
        "caller": {"type": caller, "tool_id": server_id}})
}

/// What the model is told of the functions its code may call (after `code_execution`'s
/// description).
pub(super) fn describe(specs: &[ToolSpec]) -> String {
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    let mut out = format!(
        "\n\nFunctions this code can call (the user's tools, run on the user's side): \
`from runcell_tools import {}`. Call them with keyword arguments, as plain functions \
(`r = {}(...)`) or, in async code or with top-level `await`, awaited, and many at once with \
`asyncio.gather`. A call returns the tool's result as a string (json.loads it when it is \
JSON) and raises runcell_tools.ToolError when the tool fails. Their results reach only your \
code, not you: print what you need from them (a summary, not every record).",
        names.join(", "),
        names.first().copied().unwrap_or("tool"),
    );
    for s in specs {
        let params = s
            .input_schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| {
                p.iter()
                    .map(|(k, v)| match v.get("type").and_then(Value::as_str) {
                        Some(t) => format!("{k}: {t}"),
                        None => k.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        out.push_str(&format!("\n- {}({params}): {}", s.name, s.description));
    }
    out
}

/// How a cell with client tools stands.
pub(super) enum Cell {
    Done(Box<Execution>),
    /// Suspended in these calls, which wait for the client.
    Waiting(Vec<PendingToolCall>),
}

/// What a cell calling the client's tools needs from the request.
pub(super) struct CodeTools {
    pub specs: Vec<ToolSpec>,
    pub calls: Arc<ToolCalls>,
    pub runtime: tokio::runtime::Handle,
    /// `caller.type` of the reported calls.
    pub caller: &'static str,
    /// How long each call waits for its answer.
    pub call_timeout: std::time::Duration,
}

impl CodeTools {
    /// Runs `code` in the container with the tools callable, until it ends or calls wait.
    /// Blocking. The outer Err is about the request; the inner one is the engine refusing the
    /// cell (the model's to hear).
    pub(super) fn start(
        &self,
        sb: &Sandbox<'_>,
        code: &str,
    ) -> Result<Result<Cell, EngineError>, Error> {
        let run = Run::new(
            self.calls.clone(),
            sb.tenant.to_owned(),
            sb.session.to_owned(),
            Language::Python,
            None,
        );
        let tools = ExecTools {
            specs: self.specs.clone(),
            client: Some(run.dispatch()),
            mcp: None,
            mcp_specs: Vec::new(),
            call_timeout: self.call_timeout,
            runtime: self.runtime.clone(),
        };
        let started = sb.engine.sessions().execute_async_with_tools(
            sb.session,
            code.to_owned(),
            None,
            sb.cancel.clone(),
            Some(tools),
        );
        let cell = match started {
            Ok(cell) => cell,
            Err(e) => return Ok(Err(e)),
        };
        let attending = run.first_request();
        let ended = run.clone();
        // The cell's end reaches the run whoever waits for it then (this request, or the one
        // that brings the answers).
        self.runtime.spawn(async move { ended.finish(cell.await) });
        let next = wait(&self.runtime, &run);
        drop(attending);
        next.map(Ok)
    }
}

/// What comes next of a suspended cell: its end, or calls made since. Blocking.
pub(super) fn wait(runtime: &tokio::runtime::Handle, run: &Arc<Run>) -> Result<Cell, Error> {
    let e = runtime.block_on(run.next()).map_err(Error::from)?;
    Ok(if e.status == ExecutionStatus::Waiting {
        Cell::Waiting(e.pending_tool_calls)
    } else {
        Cell::Done(Box::new(e))
    })
}

/// A client's `tool_result` for a call of the code, from the conversation's last message.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Answer {
    /// Where it is in the request (`messages.3.content.0`).
    pub at: String,
    pub tool_use_id: String,
    /// The code's `server_tool_use` id (the call's `caller.tool_id`).
    pub caller: String,
    pub text: String,
    pub is_error: bool,
}

fn block_type(b: &Value) -> &str {
    b.get("type").and_then(Value::as_str).unwrap_or("")
}

/// Whether an assistant block is a call the code made (a `tool_use` with a code caller).
fn code_caller(b: &Value) -> Option<&str> {
    if block_type(b) != "tool_use" {
        return None;
    }
    let caller = b.get("caller")?;
    let kind = caller.get("type").and_then(Value::as_str)?;
    if !kind.starts_with("code_execution_") {
        return None;
    }
    Some(
        caller
            .get("tool_id")
            .and_then(Value::as_str)
            .unwrap_or_default(),
    )
}

/// The ids of every `tool_use` the code made, anywhere in the conversation: the model never
/// sees those calls nor their results.
pub(super) fn code_call_ids(messages: &[(bool, &[Value])]) -> HashSet<String> {
    messages
        .iter()
        .filter(|(assistant, _)| *assistant)
        .flat_map(|(_, blocks)| blocks.iter())
        .filter(|b| code_caller(b).is_some())
        .filter_map(|b| b.get("id").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

/// The answers the conversation's last message gives to the code's calls in the message
/// before, checked as Anthropic checks a reply to tool calls: every call of the previous
/// message answered, no result for a call it did not make, and a reply to the code's calls
/// holds only `tool_result` blocks. `messages`: (is the assistant's, blocks) per message; a
/// message given as a plain string has no blocks.
pub(super) fn answers(messages: &[(bool, &[Value])]) -> Result<Vec<Answer>, Error> {
    let n = messages.len();
    let Some((false, last)) = messages.last() else {
        return Ok(Vec::new());
    };
    let results: Vec<(usize, &Value)> = last
        .iter()
        .enumerate()
        .filter(|(_, b)| block_type(b) == "tool_result")
        .collect();
    let previous: &[Value] = match n.checked_sub(2).map(|i| messages[i]) {
        Some((true, blocks)) => blocks,
        _ => &[],
    };
    let code_calls: Vec<(&str, &str)> = previous
        .iter()
        .filter_map(|b| Some((b.get("id")?.as_str()?, code_caller(b)?)))
        .collect();
    let made: HashSet<&str> = previous
        .iter()
        .filter(|b| matches!(block_type(b), "tool_use" | "server_tool_use"))
        .filter_map(|b| b.get("id").and_then(Value::as_str))
        .collect();
    let m = n - 1;
    let mut out = Vec::new();
    for (i, b) in &results {
        let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
        if !made.contains(id) {
            return Err(Error::invalid(format!(
                "messages.{m}.content.{i}: unexpected tool_use_id found in tool_result blocks: {id}. Each tool_result block must have a corresponding tool_use block in the previous message."
            )));
        }
        let Some((_, caller)) = code_calls.iter().find(|(c, _)| *c == id) else {
            continue;
        };
        let (text, _) = super::context::tool_result_content(b.get("content"));
        out.push(Answer {
            at: format!("messages.{m}.content.{i}"),
            tool_use_id: id.to_owned(),
            caller: (*caller).to_owned(),
            text,
            is_error: b.get("is_error").and_then(Value::as_bool) == Some(true),
        });
    }
    if code_calls.is_empty() {
        return Ok(out);
    }
    for (id, _) in &code_calls {
        if !out.iter().any(|a| a.tool_use_id == *id) {
            return Err(Error::invalid(format!(
                "messages.{m}: tool_use ids were found without tool_result blocks immediately after: {id}. Each tool_use block must have a corresponding tool_result block in the next message."
            )));
        }
    }
    if let Some((i, _)) = last
        .iter()
        .enumerate()
        .find(|(_, b)| block_type(b) != "tool_result")
    {
        return Err(Error::invalid(format!(
            "messages.{m}.content.{i}: a reply to tool calls made by code holds only tool_result blocks"
        )));
    }
    Ok(out)
}

/// A suspended cell the answers were given to: the request now waits on it.
pub(super) struct Resumed {
    pub run: Arc<Run>,
    pub attending: Attending,
}

/// Gives `answers` to the cell of `tenant`'s `session` that waits for them. They must all be
/// calls of one suspended cell of that container, waiting now; otherwise nothing is answered
/// and the request is refused (400, as Anthropic refuses an unknown `tool_use_id`).
pub(super) fn deliver(
    calls: &ToolCalls,
    tenant: &str,
    session: &str,
    container: &str,
    answers: &[Answer],
) -> Result<Option<Resumed>, Error> {
    let mut run: Option<Arc<Run>> = None;
    let mut given = Vec::with_capacity(answers.len());
    for a in answers {
        let found = call_id(&a.tool_use_id)
            .and_then(|id| calls.run_of(tenant, session, &id).map(|r| (id, r)));
        let Some((id, r)) = found else {
            return Err(Error::invalid(format!(
                "{}.tool_use_id: {} is not a tool call of code in container {container} that waits for a result (answered already, timed out, of another container, or never made)",
                a.at, a.tool_use_id
            )));
        };
        if run.as_ref().is_some_and(|prev| !Arc::ptr_eq(prev, &r)) {
            return Err(Error::invalid(format!(
                "{}.tool_use_id: {} belongs to another run of code than the other results",
                a.at, a.tool_use_id
            )));
        }
        run = Some(r);
        let output = Value::String(a.text.clone());
        given.push(ToolResult {
            id,
            output: (!a.is_error).then(|| output.clone()),
            error: a.is_error.then(|| {
                if a.text.is_empty() {
                    Value::String("the tool failed".into())
                } else {
                    output
                }
            }),
        });
    }
    let Some(run) = run else {
        return Ok(None);
    };
    let Some(attending) = run.attend() else {
        return Err(Error::new(
            axum::http::StatusCode::CONFLICT,
            "invalid_request_error",
            format!("another request is already continuing the code in container {container}"),
        ));
    };
    // Checked before any is given: a bad one changes nothing.
    for r in &given {
        let _answer = crate::tool_calls::check_answer(r).map_err(Error::from)?;
    }
    for r in &given {
        // One that timed out since it was looked up is moot: its code has its exception.
        let _ = calls.answer(tenant, session, None, r);
    }
    Ok(Some(Resumed { run, attending }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_use_ids_are_call_ids_under_anthropics_prefix() {
        let call = "call_0123456789abcdef0123456789abcdef";
        let t = tool_use_id(call);
        assert_eq!(t, "toolu_0123456789abcdef0123456789abcdef");
        assert_eq!(call_id(&t).as_deref(), Some(call));
        for bad in [
            "toolu_1",
            "call_0123456789abcdef0123456789abcdef",
            "toolu_../x",
        ] {
            assert_eq!(call_id(bad), None, "{bad}");
        }
    }

    fn conv(v: &[(bool, Value)]) -> Vec<(bool, Vec<Value>)> {
        v.iter()
            .map(|(a, b)| (*a, b.as_array().cloned().unwrap_or_default()))
            .collect()
    }

    fn view(c: &[(bool, Vec<Value>)]) -> Vec<(bool, &[Value])> {
        c.iter().map(|(a, b)| (*a, b.as_slice())).collect()
    }

    #[test]
    fn answers_to_the_codes_calls_are_checked() {
        let assistant = json!([
            {"type": "server_tool_use", "id": "srvtoolu_a", "name": "code_execution", "input": {"code": "..."}},
            {"type": "tool_use", "id": "toolu_x", "name": "lookup", "input": {"id": 1},
             "caller": {"type": "code_execution_20260120", "tool_id": "srvtoolu_a"}},
        ]);
        let ok = conv(&[
            (false, json!([{"type": "text", "text": "go"}])),
            (true, assistant.clone()),
            (
                false,
                json!([{"type": "tool_result", "tool_use_id": "toolu_x", "content": "42", "is_error": true}]),
            ),
        ]);
        let a = answers(&view(&ok)).expect("answers");
        assert_eq!(a.len(), 1);
        assert_eq!(
            (a[0].caller.as_str(), a[0].text.as_str(), a[0].is_error),
            ("srvtoolu_a", "42", true)
        );
        assert_eq!(
            code_call_ids(&view(&ok)),
            HashSet::from(["toolu_x".to_owned()])
        );
        for (last, says) in [
            (
                json!([{"type": "tool_result", "tool_use_id": "toolu_forged", "content": "1"}]),
                "unexpected tool_use_id",
            ),
            (
                json!([{"type": "text", "text": "hi"}]),
                "without tool_result",
            ),
            (
                json!([{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}, {"type": "text", "text": "hi"}]),
                "only tool_result",
            ),
        ] {
            let c = conv(&[(true, assistant.clone()), (false, last)]);
            let e = answers(&view(&c)).expect_err("refused");
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
            assert!(e.message.contains(says), "{}", e.message);
        }
    }
}
