//! `POST /anthropic/v1/messages`: a Messages request with the code execution tool, answered by
//! the operator's model with the code run in a runcell session.
//!
//! The request's conversation is rebuilt as the agent's provider-neutral transcript (earlier
//! `server_tool_use` blocks and their results become tool calls and tool results, so a
//! conversation sent back continues), the model is offered the code tool's sub-tools
//! (`bash_code_execution`, `text_editor_code_execution`, and for the 2026 versions
//! `code_execution`: Python whose state persists in the container) beside the request's own
//! tools, and each reply's calls run until the model answers. Every block is reported as it
//! happens: collected into one Message, or streamed as Anthropic's server-sent events.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::SecondsFormat;
use runcell_agent::{AgentError, Client, ModelReply, Ruling, ToolReply, ToolSpec, ToolUse, Turn};
use runcell_engine::tools::{command_output, execution_output};
use runcell_engine::{CancelToken, CreateSession, Engine, EngineError, ExecutionStatus, KilledBy};
use serde::Deserialize;
use serde_json::{json, Value};

use super::context::{container_id, file_store, session_of, tool_result_content, Caller};
use super::error::{request_id, Error};
use super::programmatic::{self, Cell, CodeTools, Resumed};
use crate::state::AppState;
use crate::vendor::approval::{self, Approver};
use crate::vendor::sandbox::{Edit, EditRequest, PythonRun, Sandbox, Saved};
use crate::vendor::{sse, Abort, FileStore};

/// The code tool's sub-tools, as the model calls them and the reply names them.
const BASH: &str = "bash_code_execution";
const EDITOR: &str = "text_editor_code_execution";
const PYTHON: &str = "code_execution";

/// The code execution tool versions served, and whether each keeps Python state.
const VERSIONS: [(&str, bool); 3] = [
    ("code_execution_20250825", false),
    ("code_execution_20260120", true),
    ("code_execution_20260521", true),
];

#[derive(Debug, Deserialize)]
struct CreateMessage {
    model: String,
    max_tokens: u64,
    messages: Vec<InMessage>,
    #[serde(default)]
    system: Option<System>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    container: Option<ContainerParam>,
    #[serde(default)]
    stream: Option<bool>,
    /// runcell's own: `never` or `always` (each cell waits for `POST /v1/approvals/{id}`);
    /// the SDK sends it with `extra_body`.
    #[serde(default)]
    approval: Option<String>,
    /// runcell's own: how long each call the model's code makes of the client's tools waits
    /// for its `tool_result` (seconds, over 0, at most 3600; default 270), sent with
    /// `extra_body`. Past it the call raises `runcell_tools.ToolTimeout` in the code.
    #[serde(default)]
    tool_timeout_s: Option<f64>,
    // temperature, tool_choice, metadata, thinking, stop_sequences...: accepted, and left to
    // the model's defaults.
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum System {
    Text(String),
    Blocks(Vec<TextParam>),
}

#[derive(Debug, Deserialize)]
struct TextParam {
    text: String,
}

#[derive(Debug, Deserialize)]
struct InMessage {
    role: Role,
    content: Content,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    User,
    Assistant,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Blocks(Vec<Value>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContainerParam {
    Id(String),
    Params {
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        skills: Option<Vec<Value>>,
    },
}

/// What the request offers the model.
#[derive(Debug, Default)]
struct Offer {
    /// The code execution tool, if offered: whether Python (with state) comes with it.
    code: Option<bool>,
    /// Its version.
    version: Option<&'static str>,
    /// The request's own tools the model calls (`allowed_callers` with `direct`, the
    /// default), which the client runs.
    custom: Vec<ToolSpec>,
    /// The request's own tools the model's code calls (`allowed_callers` with the code
    /// tool's version), which the client runs too.
    callable: Vec<runcell_engine::bridge::ToolSpec>,
}

/// A custom tool's `allowed_callers`: (the model calls it, the code execution versions whose
/// code calls it).
fn allowed_callers(t: &Value, i: usize) -> Result<(bool, Vec<&str>), Error> {
    let Some(list) = t.get("allowed_callers") else {
        return Ok((true, Vec::new()));
    };
    let bad = || {
        Error::invalid(format!(
            "tools.{i}.allowed_callers: a non-empty list of \"direct\" and code execution versions ({})",
            programmatic::CODE_CALLERS.join(", ")
        ))
    };
    let list = list.as_array().filter(|l| !l.is_empty()).ok_or_else(bad)?;
    let mut direct = false;
    let mut code = Vec::new();
    for c in list {
        match c.as_str() {
            Some("direct") => direct = true,
            Some(v) if programmatic::CODE_CALLERS.contains(&v) => code.push(v),
            _ => return Err(bad()),
        }
    }
    Ok((direct, code))
}

fn parse_tools(tools: &[Value]) -> Result<Offer, Error> {
    let mut offer = Offer::default();
    // Tools the code calls, with the versions they name, checked once the code tool is known.
    let mut callable: Vec<(usize, Vec<&str>, ToolSpec)> = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str);
        let name = t.get("name").and_then(Value::as_str).unwrap_or("");
        match kind {
            Some(k) if k.starts_with("code_execution_") => {
                let Some((version, python)) = VERSIONS.iter().find(|(v, _)| *v == k) else {
                    return Err(Error::invalid(format!(
                        "tools.{i}.type: {k:?} is not a code execution version this server runs ({})",
                        VERSIONS.map(|(v, _)| v).join(", ")
                    )));
                };
                if name != "code_execution" {
                    return Err(Error::invalid(format!(
                        "tools.{i}.name: the code execution tool is named \"code_execution\", not {name:?}"
                    )));
                }
                if offer.code.is_some() {
                    return Err(Error::invalid(format!(
                        "tools.{i}: the code execution tool is offered twice"
                    )));
                }
                offer.code = Some(*python);
                offer.version = Some(version);
            }
            None | Some("custom") => {
                if name.is_empty() {
                    return Err(Error::invalid(format!("tools.{i}.name: Field required")));
                }
                if [BASH, EDITOR, PYTHON].contains(&name) {
                    return Err(Error::invalid(format!(
                        "tools.{i}.name: {name:?} is the code execution tool's own name"
                    )));
                }
                let Some(schema) = t.get("input_schema").filter(|s| s.is_object()) else {
                    return Err(Error::invalid(format!(
                        "tools.{i}.input_schema: Field required"
                    )));
                };
                let spec = ToolSpec {
                    name: name.to_owned(),
                    description: t
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                    input_schema: schema.clone(),
                };
                let (direct, code) = allowed_callers(t, i)?;
                if !code.is_empty() {
                    callable.push((i, code, spec.clone()));
                }
                if direct {
                    offer.custom.push(spec);
                }
            }
            Some(other) => {
                return Err(Error::invalid(format!(
                    "tools.{i}.type: unknown tool type {other:?}: this server runs the code execution tool ({}) and custom tools",
                    VERSIONS.map(|(v, _)| v).join(", ")
                )))
            }
        }
    }
    for (i, versions, spec) in callable {
        match (offer.version, offer.code) {
            (None, _) => {
                return Err(Error::invalid(format!(
                    "tools.{i}.allowed_callers: {} is called from code, so `tools` needs the code execution tool",
                    spec.name
                )))
            }
            (Some(v), _) if !versions.contains(&v) => {
                return Err(Error::invalid(format!(
                    "tools.{i}.allowed_callers: names {}, but this request's code execution tool is {v}",
                    versions.join(", ")
                )))
            }
            (Some(v), Some(false)) => {
                return Err(Error::invalid(format!(
                    "tools.{i}.allowed_callers: on this server code calls tools from Python, which {v} does not run: use code_execution_20260120 or code_execution_20260521"
                )))
            }
            _ => {}
        }
        offer.callable.push(runcell_engine::bridge::ToolSpec {
            name: spec.name,
            description: spec.description,
            input_schema: spec.input_schema,
        });
    }
    runcell_engine::bridge::ToolSpec::check_all(&offer.callable).map_err(|why| {
        Error::invalid(format!(
            "tools: {why} (a tool called from code is a Python function of that name)"
        ))
    })?;
    Ok(offer)
}

/// The sub-tools, as the model is told about them.
fn code_tools(python: bool) -> Vec<ToolSpec> {
    let mut tools = vec![
        ToolSpec {
            name: BASH.into(),
            description: "Run a shell command (bash -c) in the sandbox, in /workspace. Returns stdout, stderr and the exit code. Each call is a fresh shell. No network access.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command to run."}},
                "required": ["command"],
            }),
        },
        ToolSpec {
            name: EDITOR.into(),
            description: "View, create and edit files in /workspace. `view` shows a file (or lists a directory), optionally only `view_range` [start, end] (end -1 for the last line); `create` writes `file_text` to `path`; `str_replace` replaces `old_str`, which must occur exactly once, with `new_str`.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["view", "create", "str_replace"]},
                    "path": {"type": "string", "description": "The file, e.g. /workspace/data.csv"},
                    "file_text": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                    "view_range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                },
                "required": ["command", "path"],
            }),
        },
    ];
    if python {
        tools.push(ToolSpec {
            name: PYTHON.into(),
            description: "Run Python in a stateful session: variables, imports and functions persist between calls, and across requests that reuse the container. Returns stdout, stderr (with any traceback) and the value of the last expression. numpy, pandas and matplotlib are installed.".into(),
            input_schema: json!({
                "type": "object",
                "properties": {"code": {"type": "string", "description": "The Python code to run."}},
                "required": ["code"],
            }),
        });
    }
    tools
}

/// What the model is told about the sandbox, after the request's own system prompt.
fn sandbox_prompt(python: bool) -> String {
    format!(
        "You can run code in a sandboxed Linux container with the tools {BASH} (shell commands) \
and {EDITOR} (view, create and edit files){}. The working directory is /workspace; files the \
user uploaded are there. Save every output file (charts as PNG, tables as CSV, ...) to \
$OUTPUT_DIR, which is /workspace: each file created or changed there is handed to the user. \
numpy, pandas, matplotlib and the usual data-science packages are installed; there is no \
network access. Check results by running code rather than guessing, and give the key numbers \
in your answer.",
        if python {
            format!(", and {PYTHON} (Python whose variables persist between calls)")
        } else {
            String::new()
        }
    )
}

/// A file a `container_upload` block names, and where it was placed.
#[derive(Debug)]
struct Upload {
    file: crate::vendor::StoredFile,
    data: Vec<u8>,
}

/// Each message: whether it is the assistant's, and its blocks (none for plain text).
fn block_view(messages: &[InMessage]) -> Vec<(bool, &[Value])> {
    messages
        .iter()
        .map(|m| {
            let blocks: &[Value] = match &m.content {
                Content::Blocks(b) => b,
                Content::Text(_) => &[],
            };
            (m.role == Role::Assistant, blocks)
        })
        .collect()
}

/// The conversation as the agent's transcript. `placed` gives each uploaded file's path in
/// /workspace. The calls the model's code made (and their results) are left out: the model
/// sees only what the code printed.
fn transcript(
    messages: &[InMessage],
    placed: &HashMap<String, String>,
) -> Result<Vec<Turn>, Error> {
    let code_calls = programmatic::code_call_ids(&block_view(messages));
    let mut turns: Vec<Turn> = Vec::new();
    // Tool names by call id, for the results that name only the id.
    let mut names: HashMap<String, String> = HashMap::new();
    for (m, msg) in messages.iter().enumerate() {
        let blocks = match &msg.content {
            Content::Text(t) => {
                turns.push(match msg.role {
                    Role::User => Turn::User(t.clone()),
                    Role::Assistant => Turn::Assistant(reply(t.clone(), Vec::new())),
                });
                continue;
            }
            Content::Blocks(b) => b,
        };
        match msg.role {
            Role::User => user_turns(m, blocks, placed, &names, &code_calls, &mut turns)?,
            Role::Assistant => assistant_turns(m, blocks, &mut names, &code_calls, &mut turns)?,
        }
    }
    // Results of one reply's calls go back together: the client's results after the ones
    // runcell ran, and as one user message.
    let mut merged: Vec<Turn> = Vec::with_capacity(turns.len());
    for t in turns {
        match (merged.last_mut(), t) {
            (Some(Turn::Tools(prev)), Turn::Tools(more)) => prev.extend(more),
            (_, t) => merged.push(t),
        }
    }
    Ok(merged)
}

fn reply(text: String, calls: Vec<ToolUse>) -> ModelReply {
    ModelReply {
        text,
        calls,
        raw: Value::Null,
    }
}

fn block_type(b: &Value) -> &str {
    b.get("type").and_then(Value::as_str).unwrap_or("")
}

fn str_field<'a>(b: &'a Value, field: &str, at: &str) -> Result<&'a str, Error> {
    b.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid(format!("{at}.{field}: Field required")))
}

fn user_turns(
    m: usize,
    blocks: &[Value],
    placed: &HashMap<String, String>,
    names: &HashMap<String, String>,
    code_calls: &HashSet<String>,
    turns: &mut Vec<Turn>,
) -> Result<(), Error> {
    let mut text = String::new();
    let mut results = Vec::new();
    let push_text = |text: &mut String, s: &str| {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(s);
    };
    for (i, b) in blocks.iter().enumerate() {
        let at = format!("messages.{m}.content.{i}");
        match block_type(b) {
            "text" => push_text(&mut text, str_field(b, "text", &at)?),
            "tool_result" => {
                let id = str_field(b, "tool_use_id", &at)?;
                if code_calls.contains(id) {
                    continue;
                }
                let (body, images) = tool_result_content(b.get("content"));
                results.push(ToolReply {
                    id: id.to_owned(),
                    name: names.get(id).cloned().unwrap_or_default(),
                    text: body,
                    images,
                    is_error: b.get("is_error").and_then(Value::as_bool) == Some(true),
                });
            }
            "container_upload" => {
                let id = str_field(b, "file_id", &at)?;
                if let Some(path) = placed.get(id) {
                    push_text(
                        &mut text,
                        &format!("[The file {id} is in the container at /workspace/{path}]"),
                    );
                }
            }
            "document" => match b.pointer("/source/type").and_then(Value::as_str) {
                Some("text") => push_text(
                    &mut text,
                    b.pointer("/source/data").and_then(Value::as_str).unwrap_or(""),
                ),
                _ => push_text(
                    &mut text,
                    "[A document was attached here; this server passes only text documents: upload it with the Files API and a container_upload block to work on it with code]",
                ),
            },
            "image" => push_text(
                &mut text,
                "[An image was attached here; this server does not pass images to the model: upload it with the Files API and a container_upload block to work on it with code]",
            ),
            // Thinking and cache markers carry nothing the model needs again.
            _ => {}
        }
    }
    if !results.is_empty() {
        turns.push(Turn::Tools(results));
    }
    if !text.is_empty() {
        turns.push(Turn::User(text));
    }
    Ok(())
}

fn assistant_turns(
    m: usize,
    blocks: &[Value],
    names: &mut HashMap<String, String>,
    code_calls: &HashSet<String>,
    turns: &mut Vec<Turn>,
) -> Result<(), Error> {
    let mut text = String::new();
    let mut calls: Vec<ToolUse> = Vec::new();
    let mut results: Vec<ToolReply> = Vec::new();
    let flush = |turns: &mut Vec<Turn>,
                 text: &mut String,
                 calls: &mut Vec<ToolUse>,
                 results: &mut Vec<ToolReply>| {
        if !text.is_empty() || !calls.is_empty() {
            turns.push(Turn::Assistant(reply(
                std::mem::take(text),
                std::mem::take(calls),
            )));
        }
        if !results.is_empty() {
            turns.push(Turn::Tools(std::mem::take(results)));
        }
    };
    for (i, b) in blocks.iter().enumerate() {
        let at = format!("messages.{m}.content.{i}");
        let kind = block_type(b);
        match kind {
            "text" => {
                if !results.is_empty() {
                    flush(turns, &mut text, &mut calls, &mut results);
                }
                text.push_str(str_field(b, "text", &at)?);
            }
            "tool_use"
                if b.get("id")
                    .and_then(Value::as_str)
                    .is_some_and(|id| code_calls.contains(id)) => {}
            "server_tool_use" | "tool_use" => {
                if !results.is_empty() {
                    flush(turns, &mut text, &mut calls, &mut results);
                }
                let id = str_field(b, "id", &at)?;
                let name = str_field(b, "name", &at)?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                names.insert(id.to_owned(), name.to_owned());
                calls.push(ToolUse {
                    id: id.to_owned(),
                    name: name.to_owned(),
                    arguments: input.to_string(),
                    input,
                    bad_arguments: None,
                });
            }
            k if k.ends_with("_tool_result") => {
                let id = str_field(b, "tool_use_id", &at)?;
                let (body, is_error) = result_text(b.get("content").unwrap_or(&Value::Null));
                results.push(ToolReply {
                    id: id.to_owned(),
                    name: names.get(id).cloned().unwrap_or_default(),
                    text: body,
                    images: Vec::new(),
                    is_error,
                });
            }
            _ => {}
        }
    }
    flush(turns, &mut text, &mut calls, &mut results);
    Ok(())
}

/// A result block's content, as the model read it when it was new.
fn result_text(c: &Value) -> (String, bool) {
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or("");
    match block_type(c) {
        "bash_code_execution_result" | "code_execution_result" => {
            let code = c.get("return_code").and_then(Value::as_i64).unwrap_or(0);
            let mut out = String::new();
            if !s("stdout").is_empty() {
                out.push_str(&format!("stdout:\n{}\n", s("stdout")));
            }
            if !s("stderr").is_empty() {
                out.push_str(&format!("stderr:\n{}\n", s("stderr")));
            }
            out.push_str(&format!("return_code: {code}"));
            (out, code != 0)
        }
        "text_editor_code_execution_view_result" => (s("content").to_owned(), false),
        "text_editor_code_execution_create_result" => {
            let update = c.get("is_file_update").and_then(Value::as_bool) == Some(true);
            (
                if update {
                    "file overwritten"
                } else {
                    "file created"
                }
                .into(),
                false,
            )
        }
        "text_editor_code_execution_str_replace_result" => {
            let lines: Vec<&str> = c
                .get("lines")
                .and_then(Value::as_array)
                .map(|l| l.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            (format!("edited:\n{}", lines.join("\n")), false)
        }
        _ => {
            let code = s("error_code");
            let msg = s("error_message");
            (format!("error ({code}) {msg}").trim().to_owned(), true)
        }
    }
}

/// The files the request's `container_upload` blocks name, checked before anything starts.
fn uploads(messages: &[InMessage], store: &FileStore, tenant: &str) -> Result<Vec<Upload>, Error> {
    let mut out: Vec<Upload> = Vec::new();
    for (m, msg) in messages.iter().enumerate() {
        let Content::Blocks(blocks) = &msg.content else {
            continue;
        };
        for (i, b) in blocks.iter().enumerate() {
            if block_type(b) != "container_upload" {
                continue;
            }
            let at = format!("messages.{m}.content.{i}");
            let id = str_field(b, "file_id", &at)?;
            if out.iter().any(|u| u.file.id == id) {
                continue;
            }
            match store.read(tenant, id).map_err(Error::internal)? {
                Some((file, data)) => out.push(Upload { file, data }),
                None => {
                    return Err(Error::not_found(format!(
                        "{at}.file_id: no file {id} (upload it with the Files API first)"
                    )))
                }
            }
        }
    }
    Ok(out)
}

/// Everything one run needs, moved onto a blocking thread.
struct Job {
    engine: Engine,
    files: FileStore,
    tenant: String,
    /// The container's session, when the code tool is offered.
    session: Option<String>,
    provider: runcell_agent::ProviderConfig,
    system: String,
    tools: Vec<ToolSpec>,
    custom: HashSet<String>,
    python: bool,
    max_steps: usize,
    turns: Vec<Turn>,
    stop: Arc<AtomicBool>,
    cancel: CancelToken,
    /// With approval `always`: who decides on each cell.
    approver: Option<Approver>,
    /// The client's tools the model's Python may call (none: cells run without).
    code: CodeTools,
    /// The suspended cell this request brought answers for, if it did.
    resume: Option<Resumed>,
}

/// The sub-tool calls of the conversation's last model reply that have no result yet: the
/// suspended cell first (a reply's calls run in order, and stop at a cell that waits), then
/// those after it.
fn unresolved(turns: &[Turn], custom: &HashSet<String>) -> Vec<ToolUse> {
    let Some(at) = turns.iter().rposition(|t| matches!(t, Turn::Assistant(_))) else {
        return Vec::new();
    };
    let Turn::Assistant(reply) = &turns[at] else {
        return Vec::new();
    };
    let done: HashSet<&str> = turns[at + 1..]
        .iter()
        .filter_map(|t| match t {
            Turn::Tools(r) => Some(r.iter().map(|x| x.id.as_str())),
            _ => None,
        })
        .flatten()
        .collect();
    reply
        .calls
        .iter()
        .filter(|c| !custom.contains(&c.name) && !done.contains(c.id.as_str()))
        .cloned()
        .collect()
}

/// A finished cell's result block, and what the model reads of it.
fn python_block(run: &PythonRun, tool: &mut ToolReply, id: &str) -> Value {
    let e = &run.execution;
    let out = execution_output(e);
    tool.text = format!("{}{}", out.text, saved_text(&run.saved));
    tool.images = out.images;
    tool.is_error = out.is_error;
    if e.status == ExecutionStatus::Timeout {
        error_block("code_execution", id, "execution_time_exceeded", None)
    } else {
        json!({"type": "code_execution_tool_result", "tool_use_id": id, "content": {
            "type": "code_execution_result",
            "stdout": python_stdout(e),
            "stderr": python_stderr(e),
            "return_code": i32::from(e.status != ExecutionStatus::Ok),
            "content": run.saved.iter().map(|s| json!({"type": "code_execution_output", "file_id": s.file.id})).collect::<Vec<_>>(),
        }})
    }
}

/// How a run ended.
#[derive(Debug)]
struct End {
    stop_reason: String,
    input_tokens: u64,
    output_tokens: u64,
}

/// The model provider's failure, for the client: what it said of the request is passed on
/// with its status; its own troubles (a refused key, an outage) are a 502.
fn upstream_error(e: AgentError) -> Error {
    match e {
        AgentError::Engine(e) => e.into(),
        AgentError::Api {
            status, message, ..
        } if matches!(status, 400 | 404 | 413 | 422 | 429) => {
            let kind = match status {
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                _ => "invalid_request_error",
            };
            Error::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                kind,
                format!("the model provider refused the request: {message}"),
            )
        }
        other => Error::new(
            StatusCode::BAD_GATEWAY,
            "api_error",
            format!(
                "the model provider failed: {}",
                runcell_engine::error_chain(&other)
            ),
        ),
    }
}

/// The id a server tool call is reported under: Anthropic's `srvtoolu_` prefix on the
/// model's own id, which keeps a conversation sent back consistent.
fn server_id(id: &str) -> String {
    if id.starts_with("srvtoolu_") {
        return id.to_owned();
    }
    let clean: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("srvtoolu_{clean}")
}

/// The list of saved files, for the model.
fn saved_text(saved: &[Saved]) -> String {
    if saved.is_empty() {
        return String::new();
    }
    let list: Vec<String> = saved
        .iter()
        .map(|s| {
            format!(
                "- {} ({} bytes, returned to the user as {})",
                s.path, s.file.size_bytes, s.file.id
            )
        })
        .collect();
    format!("\n\nfiles saved:\n{}", list.join("\n"))
}

fn error_block(kind: &str, tool_use_id: &str, code: &str, message: Option<&str>) -> Value {
    let mut err = json!({"type": format!("{kind}_tool_result_error"), "error_code": code});
    if let Some(m) = message {
        // Only the editor's error carries a message in Anthropic's shapes.
        if kind == "text_editor_code_execution" {
            err["error_message"] = json!(m);
        }
    }
    json!({"type": format!("{kind}_tool_result"), "tool_use_id": tool_use_id, "content": err})
}

impl Job {
    /// The loop: model, calls, results, until an answer. `sink` gets every block as it is
    /// decided (a call's block before it runs).
    fn run(mut self, sink: &mut dyn FnMut(Value)) -> Result<End, Error> {
        let mut turns = std::mem::take(&mut self.turns);
        let resume = self.resume.take();
        let client = Client::new(self.provider.clone()).map_err(upstream_error)?;
        let sandbox = self.session.as_deref().map(|s| Sandbox {
            engine: &self.engine,
            files: &self.files,
            tenant: &self.tenant,
            session: s,
            cancel: self.cancel.clone(),
        });
        let mut end = End {
            stop_reason: "pause_turn".into(),
            input_tokens: 0,
            output_tokens: 0,
        };
        if let Some(resumed) = resume {
            if self.resume_code(resumed, sandbox.as_ref(), &mut turns, sink)? {
                end.stop_reason = "tool_use".into();
                return Ok(end);
            }
        }
        for step in 1..=self.max_steps.max(1) {
            if self.stop.load(Ordering::SeqCst) {
                return Err(Error::invalid("the client went away"));
            }
            let (reply, meta) = client
                .complete_with(&self.system, &turns, &self.tools)
                .map_err(upstream_error)?;
            end.input_tokens += meta.input_tokens;
            end.output_tokens += meta.output_tokens;
            if !reply.text.is_empty() {
                sink(json!({"type": "text", "text": reply.text, "citations": null}));
            }
            if reply.calls.is_empty() {
                end.stop_reason = match meta.stop_reason.as_deref() {
                    Some(r @ ("max_tokens" | "stop_sequence" | "refusal")) => r.to_owned(),
                    _ => "end_turn".to_owned(),
                };
                return Ok(end);
            }
            let mut replies = Vec::new();
            let mut client_calls = false;
            let mut suspended = false;
            for call in &reply.calls {
                if self.custom.contains(&call.name) {
                    sink(
                        json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}),
                    );
                    client_calls = true;
                    continue;
                }
                if suspended {
                    // Runs once the waiting cell ends, in the request that brings its answers.
                    continue;
                }
                match self.server_call(sandbox.as_ref(), step, call, sink)? {
                    Some(reply) => replies.push(reply),
                    None => suspended = true,
                }
            }
            turns.push(Turn::Assistant(reply));
            if !replies.is_empty() {
                turns.push(Turn::Tools(replies));
            }
            if client_calls || suspended {
                end.stop_reason = "tool_use".into();
                return Ok(end);
            }
        }
        Ok(end)
    }

    /// Continues the suspended cell with the answers given, then runs the calls of the same
    /// model reply after it. Whether a cell waits for the client again.
    fn resume_code(
        &self,
        resumed: Resumed,
        sandbox: Option<&Sandbox<'_>>,
        turns: &mut Vec<Turn>,
        sink: &mut dyn FnMut(Value),
    ) -> Result<bool, Error> {
        let pending = unresolved(turns, &self.custom);
        let (Some(sb), Some(first)) = (sandbox, pending.first()) else {
            return Err(Error::internal(
                "a resumed cell without its container or call",
            ));
        };
        let cell = programmatic::wait(&self.code.runtime, &resumed.run)?;
        drop(resumed.attending);
        let mut replies = Vec::new();
        let mut suspended = false;
        match self.code_result(sb, first, cell, sink) {
            Some(r) => replies.push(r),
            None => suspended = true,
        }
        for call in &pending[1..] {
            if suspended {
                break;
            }
            match self.server_call(sandbox, 1, call, sink)? {
                Some(r) => replies.push(r),
                None => suspended = true,
            }
        }
        if !replies.is_empty() {
            match turns.last_mut() {
                Some(Turn::Tools(last)) => last.extend(replies),
                _ => turns.push(Turn::Tools(replies)),
            }
        }
        Ok(suspended)
    }

    /// A cell with client tools as it stands: its result (None while calls wait, which are
    /// reported as `tool_use` blocks the code made).
    fn code_result(
        &self,
        sb: &Sandbox<'_>,
        call: &ToolUse,
        cell: Cell,
        sink: &mut dyn FnMut(Value),
    ) -> Option<ToolReply> {
        let id = server_id(&call.id);
        match cell {
            Cell::Waiting(calls) => {
                for c in &calls {
                    sink(programmatic::tool_use_block(c, self.code.caller, &id));
                }
                None
            }
            Cell::Done(execution) => {
                let run = PythonRun {
                    saved: sb.saved_by(&execution),
                    execution: *execution,
                };
                let mut tool = ToolReply {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    text: String::new(),
                    images: Vec::new(),
                    is_error: false,
                };
                sink(python_block(&run, &mut tool, &id));
                Some(tool)
            }
        }
    }

    /// Runs one call of a sub-tool, reporting its `server_tool_use` block and its result.
    /// With an approver, a person decides first: the block then names what runs (the edited
    /// input, if edited), and a declined call's result says so. None: a cell waits for the
    /// client's tools (its calls are reported).
    fn server_call(
        &self,
        sandbox: Option<&Sandbox<'_>>,
        step: usize,
        call: &ToolUse,
        sink: &mut dyn FnMut(Value),
    ) -> Result<Option<ToolReply>, Error> {
        let known =
            matches!(call.name.as_str(), BASH | EDITOR) || (call.name == PYTHON && self.python);
        let (Some(sb), true) = (sandbox, known) else {
            return Ok(Some(ToolReply {
                id: call.id.clone(),
                name: call.name.clone(),
                text: format!("error: there is no tool named {:?}", call.name),
                images: Vec::new(),
                is_error: true,
            }));
        };
        let id = server_id(&call.id);
        let kind = match call.name.as_str() {
            BASH => "bash_code_execution",
            EDITOR => "text_editor_code_execution",
            _ => "code_execution",
        };
        let mut note = None;
        let ruled;
        let call = match (&self.approver, review_form(call)) {
            (Some(a), Some((field, code))) if call.bad_arguments.is_none() => {
                match a.rule(step, call, code)? {
                    Ruling::Run => call,
                    Ruling::Edited(c) => {
                        ruled = match approval::edited(call, field, &c) {
                            Ok(e) => {
                                note = Some(runcell_agent::approval::edited_note(&c));
                                e
                            }
                            // Nothing runs; the model is told why, as for its own bad input.
                            Err(why) => ToolUse {
                                bad_arguments: Some(why),
                                ..call.clone()
                            },
                        };
                        &ruled
                    }
                    Ruling::Declined(reason) => {
                        sink(
                            json!({"type": "server_tool_use", "id": id, "name": call.name, "input": call.input}),
                        );
                        let text = runcell_agent::approval::declined_text(reason.as_deref());
                        sink(declined_block(kind, &id, &text));
                        return Ok(Some(ToolReply {
                            id: call.id.clone(),
                            name: call.name.clone(),
                            text,
                            images: Vec::new(),
                            is_error: true,
                        }));
                    }
                }
            }
            _ => call,
        };
        sink(json!({"type": "server_tool_use", "id": id, "name": call.name, "input": call.input}));
        let mut tool = ToolReply {
            id: call.id.clone(),
            name: call.name.clone(),
            text: String::new(),
            images: Vec::new(),
            is_error: false,
        };
        let invalid = |tool: &mut ToolReply, why: String| {
            tool.text = format!("error: {why}");
            tool.is_error = true;
            error_block(kind, &id, "invalid_tool_input", Some(&why))
        };
        let arg = |name: &str| call.input.get(name).and_then(Value::as_str);
        let block = if let Some(why) = &call.bad_arguments {
            invalid(&mut tool, why.clone())
        } else {
            match call.name.as_str() {
                BASH => match arg("command") {
                    None => invalid(&mut tool, "the input needs a `command` string".into()),
                    Some(command) => match sb.bash(command) {
                        Ok(run) => {
                            let out = command_output(&run.output);
                            tool.text = format!("{}{}", out.text, saved_text(&run.saved));
                            tool.is_error = out.is_error;
                            if run.output.usage.killed_by == Some(KilledBy::Timeout) {
                                error_block(kind, &id, "execution_time_exceeded", None)
                            } else {
                                json!({"type": "bash_code_execution_tool_result", "tool_use_id": id, "content": {
                                    "type": "bash_code_execution_result",
                                    "stdout": run.output.stdout,
                                    "stderr": run.output.stderr,
                                    "return_code": run.output.exit_code,
                                    "content": run.saved.iter().map(|s| json!({"type": "bash_code_execution_output", "file_id": s.file.id})).collect::<Vec<_>>(),
                                }})
                            }
                        }
                        Err(e) => self.tool_failure(e, &mut tool, kind, &id)?,
                    },
                },
                EDITOR => match serde_json::from_value::<EditRequest>(call.input.clone()) {
                    Err(e) => invalid(&mut tool, format!("invalid input: {e}")),
                    Ok(req) => {
                        let edit = sb.edit(&req)?;
                        tool.text = edit.text();
                        tool.is_error = matches!(edit, Edit::Failed { .. });
                        let content = match edit {
                            Edit::View {
                                content,
                                file_type,
                                start_line,
                                num_lines,
                                total_lines,
                                image,
                            } => {
                                tool.images.extend(image);
                                json!({"type": "text_editor_code_execution_view_result", "content": content,
                                       "file_type": file_type, "start_line": start_line,
                                       "num_lines": num_lines, "total_lines": total_lines})
                            }
                            Edit::Create { is_file_update, .. } => json!({
                                "type": "text_editor_code_execution_create_result",
                                "is_file_update": is_file_update}),
                            Edit::StrReplace {
                                old_start,
                                old_lines,
                                new_start,
                                new_lines,
                                lines,
                                ..
                            } => json!({
                                "type": "text_editor_code_execution_str_replace_result",
                                "old_start": old_start, "old_lines": old_lines,
                                "new_start": new_start, "new_lines": new_lines, "lines": lines}),
                            Edit::Failed { code, message } => json!({
                                "type": "text_editor_code_execution_tool_result_error",
                                "error_code": code, "error_message": message}),
                        };
                        json!({"type": "text_editor_code_execution_tool_result", "tool_use_id": id, "content": content})
                    }
                },
                _ => match arg("code") {
                    None => invalid(&mut tool, "the input needs a `code` string".into()),
                    // The client's tools callable: the cell may wait for them.
                    Some(code) if !self.code.specs.is_empty() => match self.code.start(sb, code)? {
                        Ok(cell) => match self.code_result(sb, call, cell, sink) {
                            Some(mut done) => {
                                if let Some(note) = note {
                                    done.text = format!("{note}{}", done.text);
                                }
                                return Ok(Some(done));
                            }
                            None => return Ok(None),
                        },
                        Err(e) => self.tool_failure(e, &mut tool, kind, &id)?,
                    },
                    Some(code) => match sb.python(code) {
                        Ok(run) => python_block(&run, &mut tool, &id),
                        Err(e) => self.tool_failure(e, &mut tool, kind, &id)?,
                    },
                },
            }
        };
        sink(block);
        if let Some(note) = note {
            tool.text = format!("{note}{}", tool.text);
        }
        Ok(Some(tool))
    }

    /// A call the engine refused: the model's to fix (code too large, a full queue) as an
    /// error result; anything about the session itself ends the request.
    fn tool_failure(
        &self,
        e: EngineError,
        tool: &mut ToolReply,
        kind: &str,
        id: &str,
    ) -> Result<Value, Error> {
        let code = match &e {
            EngineError::InvalidRequest(_) | EngineError::PayloadTooLarge(_) => {
                "invalid_tool_input"
            }
            EngineError::SessionBusy(_) => "too_many_requests",
            _ => return Err(e.into()),
        };
        let why = runcell_engine::error_chain(&e);
        tool.text = format!("error: {why}");
        tool.is_error = true;
        Ok(error_block(kind, id, code, Some(&why)))
    }
}

/// What a person reviews of a sub-tool call, and the input field an edit replaces (none: the
/// whole input, as JSON). `None`: nothing would run (no command or code to run).
fn review_form(call: &ToolUse) -> Option<(Option<&'static str>, String)> {
    let field = |f: &'static str| {
        call.input
            .get(f)
            .and_then(Value::as_str)
            .map(|c| (Some(f), c.to_owned()))
    };
    match call.name.as_str() {
        BASH => field("command"),
        PYTHON => field("code"),
        EDITOR => Some((
            None,
            serde_json::to_string_pretty(&call.input).unwrap_or_else(|_| call.arguments.clone()),
        )),
        _ => None,
    }
}

/// The result block of a call the user declined, in the shapes the SDK knows: a failed run
/// whose stderr says why (bash, Python), or the editor's error with the reason as its message.
fn declined_block(kind: &str, tool_use_id: &str, text: &str) -> Value {
    if kind == "text_editor_code_execution" {
        return json!({"type": "text_editor_code_execution_tool_result", "tool_use_id": tool_use_id,
            "content": {"type": "text_editor_code_execution_tool_result_error",
                "error_code": "unavailable", "error_message": text}});
    }
    json!({"type": format!("{kind}_tool_result"), "tool_use_id": tool_use_id, "content": {
        "type": format!("{kind}_result"), "stdout": "", "stderr": text, "return_code": 1,
        "content": [],
    }})
}

/// A cell's stdout as a REPL shows it: the printed output, then the last expression's value.
fn python_stdout(e: &runcell_engine::Execution) -> String {
    let mut out = e.stdout.clone();
    for r in e.results.iter().filter(|r| r.is_main_result) {
        if let Some(t) = r.data.get("text/plain") {
            if !out.is_empty() && !out.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(t);
            out.push('\n');
        }
    }
    out
}

/// A cell's stderr, with the error's traceback as Python prints it.
fn python_stderr(e: &runcell_engine::Execution) -> String {
    let mut err = e.stderr.clone();
    if let Some(x) = &e.error {
        if !err.is_empty() && !err.ends_with('\n') {
            err.push('\n');
        }
        if x.traceback.trim().is_empty() {
            err.push_str(&format!("{}: {}\n", x.name, x.value));
        } else {
            err.push_str(&x.traceback);
            if !err.ends_with('\n') {
                err.push('\n');
            }
        }
    }
    err
}

/// `{id, expires_at}` of the container, after the run.
fn container_json(engine: &Engine, session: Option<&str>) -> Value {
    match session.and_then(|s| engine.sessions().get(s).ok()) {
        Some(info) => json!({
            "id": container_id(&info.id),
            "expires_at": info.expires_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }),
        None => Value::Null,
    }
}

fn message_json(
    id: &str,
    model: &str,
    content: Vec<Value>,
    end: Option<&End>,
    container: Value,
) -> Value {
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": end.map(|e| e.stop_reason.clone()),
        "stop_sequence": null,
        "usage": {
            "input_tokens": end.map_or(0, |e| e.input_tokens),
            "output_tokens": end.map_or(0, |e| e.output_tokens),
        },
        "container": container,
    })
}

/// The container the request names (the caller's, and alive), or a new one.
async fn container_session(
    state: &AppState,
    tenant: &crate::state::Tenant,
    param: Option<&ContainerParam>,
) -> Result<String, Error> {
    let id = match param {
        Some(ContainerParam::Id(id)) => Some(id.clone()),
        Some(ContainerParam::Params { id, skills }) => {
            if skills.as_ref().is_some_and(|s| !s.is_empty()) {
                return Err(Error::invalid(
                    "container.skills: this server loads no skills into containers",
                ));
            }
            id.clone()
        }
        None => None,
    };
    if let Some(id) = id {
        let missing = || {
            Error::not_found(format!(
                "container: no container {id} (it may have expired)"
            ))
        };
        let session = session_of(&id).ok_or_else(missing)?;
        return match crate::sessions::owned(state, tenant, &session).await {
            Ok(info) => Ok(info.id),
            Err(e) => {
                let e = Error::from(e);
                Err(if e.status == StatusCode::NOT_FOUND {
                    missing()
                } else {
                    e
                })
            }
        };
    }
    let engine = state.engine.clone();
    let owner = tenant.0.clone();
    let info = crate::sessions::blocking(move || {
        engine.sessions().create(CreateSession {
            owner,
            metadata: [("source".to_owned(), "anthropic".to_owned())].into(),
            ..CreateSession::default()
        })
    })
    .await?;
    Ok(info.id)
}

/// A finished block as the stream's events: start, the deltas a client accumulates (text,
/// a call's input as JSON), stop.
fn block_events(index: usize, block: &Value) -> String {
    let start = |b: Value| {
        sse(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": b}),
        )
    };
    let delta = |d: Value| {
        sse(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": d}),
        )
    };
    let mut out = match block_type(block) {
        "text" => {
            let text = block.get("text").and_then(Value::as_str).unwrap_or("");
            start(json!({"type": "text", "text": "", "citations": null}))
                + &delta(json!({"type": "text_delta", "text": text}))
        }
        "server_tool_use" | "tool_use" => {
            let mut empty = block.clone();
            empty["input"] = json!({});
            let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
            start(empty)
                + &delta(json!({"type": "input_json_delta", "partial_json": input.to_string()}))
        }
        _ => start(block.clone()),
    };
    out.push_str(&sse(
        "content_block_stop",
        &json!({"type": "content_block_stop", "index": index}),
    ));
    out
}

/// What the run's thread tells the stream.
enum Frame {
    Block(Value),
    End(End, Value),
    Failed(Error),
}

/// How often a stream says it is alive while code runs or the model thinks.
const PING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

pub(super) async fn create(
    State(state): State<AppState>,
    Caller(tenant, key): Caller,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Error> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::too_large(format!(
                "the request body is over the limit of {} MiB",
                runcell_engine::MAX_REQUEST_BYTES >> 20
            ))
        } else {
            Error::invalid(e.body_text())
        }
    })?;
    let de = &mut serde_json::Deserializer::from_slice(&body);
    let req: CreateMessage = serde_path_to_error::deserialize(de).map_err(|e| {
        // Anthropic's way of naming a field (`messages.0.role`), and no parser positions.
        let path = e.path().to_string().replace('[', ".").replace(']', "");
        let inner = e.into_inner().to_string();
        let inner = match inner.rfind(" at line ") {
            Some(at) => &inner[..at],
            None => &inner,
        };
        if path == "." {
            Error::invalid(format!("the body is not a Messages request: {inner}"))
        } else {
            Error::invalid(format!("{path}: {inner}"))
        }
    })?;
    if req.messages.is_empty() {
        return Err(Error::invalid("messages: at least one message is required"));
    }
    if req.max_tokens == 0 {
        return Err(Error::invalid("max_tokens: must be at least 1"));
    }
    let offer = parse_tools(req.tools.as_deref().unwrap_or(&[]))?;
    let max = runcell_engine::bridge::MAX_CALL_TIMEOUT;
    let call_timeout = match req.tool_timeout_s {
        None => runcell_engine::bridge::DEFAULT_CALL_TIMEOUT,
        Some(s) if s > 0.0 && s <= max.as_secs_f64() => std::time::Duration::from_secs_f64(s),
        Some(s) => {
            return Err(Error::invalid(format!(
                "tool_timeout_s: must be over 0 and at most {} seconds (got {s})",
                max.as_secs()
            )))
        }
    };
    // Results for calls the model's code made: they go to that code, in its container.
    let answers = programmatic::answers(&block_view(&req.messages))?;
    if !answers.is_empty() && req.container.is_none() {
        return Err(Error::invalid(format!(
            "container: {} answers a tool call made by code: send the `container` of the reply that made it",
            answers[0].at
        )));
    }
    let approval = approval::mode(req.approval.as_deref(), &headers, key.as_ref())?;
    let Some(config) = state.vendor.clone() else {
        return Err(Error::not_found(
            "this server has no model configured: its operator starts it with `runcell serve --agent-provider openai|anthropic|gemini`",
        ));
    };
    let store = file_store(&state);
    // The bytes of the files named, read before anything starts.
    let (messages, uploads) = {
        let (store, tenant, messages) = (store.clone(), tenant.0.clone(), req.messages);
        tokio::task::spawn_blocking(move || {
            let u = uploads(&messages, &store, &tenant);
            (messages, u)
        })
        .await
        .map_err(Error::internal)?
    };
    let uploads = uploads?;
    if !uploads.is_empty() && offer.code.is_none() {
        return Err(Error::invalid(
            "container_upload blocks need the code execution tool in `tools`",
        ));
    }
    let session = match (offer.code, &req.container) {
        (Some(_), c) => Some(container_session(&state, &tenant, c.as_ref()).await?),
        (None, Some(c)) => Some(container_session(&state, &tenant, Some(c)).await?),
        (None, None) => None,
    };
    let python = offer.code == Some(true);
    let mut tools = offer.code.map(code_tools).unwrap_or_default();
    if !offer.callable.is_empty() {
        if let Some(py) = tools.iter_mut().find(|t| t.name == PYTHON) {
            py.description
                .push_str(&programmatic::describe(&offer.callable));
        }
    }
    let custom: HashSet<String> = offer.custom.iter().map(|t| t.name.clone()).collect();
    tools.extend(offer.custom);
    let mut system = match req.system {
        Some(System::Text(t)) => t,
        Some(System::Blocks(b)) => b
            .into_iter()
            .map(|b| b.text)
            .collect::<Vec<_>>()
            .join("\n\n"),
        None => String::new(),
    };
    if offer.code.is_some() {
        if !system.is_empty() {
            system.push_str("\n\n");
        }
        system.push_str(&sandbox_prompt(python));
        if !offer.callable.is_empty() {
            system.push_str(
                " Some of the user's tools are functions of the code_execution tool's Python (its description lists them): to use them on many items, write one program that calls them in a loop and prints a short summary.",
            );
        }
    }

    // The uploads go into the container, then the conversation is read with their paths.
    let turns = {
        let engine = state.engine.clone();
        let (files, tenant_name, session) = (store.clone(), tenant.0.clone(), session.clone());
        tokio::task::spawn_blocking(move || -> Result<Vec<Turn>, Error> {
            let mut placed = HashMap::new();
            if let Some(s) = &session {
                let sb = Sandbox {
                    engine: &engine,
                    files: &files,
                    tenant: &tenant_name,
                    session: s,
                    cancel: CancelToken::new(),
                };
                for u in &uploads {
                    placed.insert(u.file.id.clone(), sb.place(&u.file, &u.data)?);
                }
            }
            transcript(&messages, &placed)
        })
        .await
        .map_err(Error::internal)??
    };
    // Answers go to the cell that waits for them, which must be the last reply's first call
    // without a result: checked before any answer is given.
    let resume = match (answers.first(), session.as_deref()) {
        (Some(first), Some(s)) => {
            let waiting = unresolved(&turns, &custom)
                .first()
                .map(|c| server_id(&c.id));
            if waiting.as_deref() != Some(first.caller.as_str())
                || answers.iter().any(|a| a.caller != first.caller)
            {
                return Err(Error::invalid(format!(
                    "{}: the tool_use it answers names caller {}, which is not the code execution call of the previous message that waits for results",
                    first.at, first.caller
                )));
            }
            programmatic::deliver(&state.tool_calls, &tenant.0, s, &container_id(s), &answers)?
        }
        _ => None,
    };

    let stop = Arc::new(AtomicBool::new(false));
    let cancel = CancelToken::new();
    let mut abort = Abort {
        stop: stop.clone(),
        cancel: cancel.clone(),
        engine: state.engine.clone(),
        session: session.clone(),
        armed: true,
    };
    let approver = approval::approver_for(
        (&state.approvals, &state.engine),
        approval,
        &tenant.0,
        session.as_ref(),
        "anthropic",
        &stop,
    );
    let job = Job {
        engine: state.engine.clone(),
        files: store,
        tenant: tenant.0.clone(),
        session: session.clone(),
        provider: config.provider_for(&req.model, Some(req.max_tokens)),
        system,
        tools,
        custom,
        python,
        max_steps: config.max_steps,
        turns,
        stop,
        cancel,
        approver,
        code: CodeTools {
            specs: offer.callable,
            calls: state.tool_calls.clone(),
            runtime: tokio::runtime::Handle::current(),
            caller: programmatic::caller_type(offer.version.unwrap_or_default()),
            call_timeout,
        },
        resume,
    };
    let message_id = runcell_engine::new_id("msg");
    let model = req.model.clone();

    if req.stream != Some(true) {
        let engine = state.engine.clone();
        let (content, end) = tokio::task::spawn_blocking(move || {
            let mut content = Vec::new();
            let end = job.run(&mut |b| content.push(b));
            (content, end)
        })
        .await
        .map_err(Error::internal)?;
        abort.armed = false;
        let end = end?;
        let container = container_json(&engine, session.as_deref());
        let mut resp = Json(message_json(
            &message_id,
            &model,
            content,
            Some(&end),
            container,
        ))
        .into_response();
        if let Ok(v) = request_id().parse() {
            resp.headers_mut().insert("request-id", v);
        }
        return Ok(resp);
    }

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Frame>();
    let engine = state.engine.clone();
    let run_session = session.clone();
    tokio::task::spawn_blocking(move || {
        let end = job.run(&mut |b| {
            let _ = tx.send(Frame::Block(b));
        });
        let _ = tx.send(match end {
            Ok(end) => Frame::End(end, container_json(&engine, run_session.as_deref())),
            Err(e) => Frame::Failed(e),
        });
    });
    let start = container_json(&state.engine, session.as_deref());
    let first = sse(
        "message_start",
        &json!({"type": "message_start", "message": message_json(&message_id, &model, Vec::new(), None, start)}),
    );
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.reset();
    struct Stream {
        rx: tokio::sync::mpsc::UnboundedReceiver<Frame>,
        ping: tokio::time::Interval,
        index: usize,
        done: bool,
        abort: Abort,
    }
    let state0 = Stream {
        rx,
        ping,
        index: 0,
        done: false,
        abort,
    };
    let events = futures_util::stream::unfold(state0, |mut s| async move {
        if s.done {
            return None;
        }
        let frame = tokio::select! {
            f = s.rx.recv() => f,
            _ = s.ping.tick() => {
                return Some((Ok::<_, std::io::Error>(Bytes::from(sse("ping", &json!({"type": "ping"})))), s));
            }
        };
        let text = match frame {
            Some(Frame::Block(b)) => {
                let t = block_events(s.index, &b);
                s.index += 1;
                t
            }
            Some(Frame::End(end, container)) => {
                s.done = true;
                s.abort.armed = false;
                sse(
                    "message_delta",
                    &json!({"type": "message_delta",
                        "delta": {"stop_reason": end.stop_reason, "stop_sequence": null, "container": container},
                        "usage": {"input_tokens": end.input_tokens, "output_tokens": end.output_tokens}}),
                ) + &sse("message_stop", &json!({"type": "message_stop"}))
            }
            Some(Frame::Failed(e)) => {
                s.done = true;
                s.abort.armed = false;
                sse("error", &json!({"type": "error", "error": e.object()}))
            }
            // The run's thread ended without a word: it panicked.
            None => {
                s.done = true;
                sse(
                    "error",
                    &json!({"type": "error", "error": Error::internal("the run ended without an outcome").object()}),
                )
            }
        };
        Some((Ok(Bytes::from(text)), s))
    });
    let body = futures_util::StreamExt::chain(
        futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(first)) }),
        events,
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("request-id", request_id())
        .body(Body::from_stream(body))
        .map_err(Error::internal)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(v: Value) -> Vec<InMessage> {
        serde_json::from_value(v).expect("messages")
    }

    #[test]
    fn a_conversation_sent_back_becomes_calls_and_results() {
        let m = msgs(json!([
            {"role": "user", "content": "Compute fib(10)"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me run it.", "citations": null},
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "bash_code_execution", "input": {"command": "python3 fib.py"}, "caller": null},
                {"type": "bash_code_execution_tool_result", "tool_use_id": "srvtoolu_1", "content": {
                    "type": "bash_code_execution_result", "stdout": "55\n", "stderr": "", "return_code": 0, "content": []}},
                {"type": "text", "text": "It is 55."},
                {"type": "tool_use", "id": "toolu_2", "name": "notify", "input": {"n": 55}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "sent"}]},
                {"type": "text", "text": "thanks"}
            ]}
        ]));
        let turns = transcript(&m, &HashMap::new()).expect("transcript");
        assert_eq!(turns.len(), 6, "{turns:#?}");
        let Turn::Assistant(first) = &turns[1] else {
            panic!("{turns:#?}")
        };
        assert_eq!(first.text, "Let me run it.");
        assert_eq!(first.calls[0].name, "bash_code_execution");
        let Turn::Tools(r) = &turns[2] else {
            panic!("{turns:#?}")
        };
        assert!(r[0].text.contains("55"), "{r:?}");
        let Turn::Assistant(second) = &turns[3] else {
            panic!("{turns:#?}")
        };
        assert_eq!(second.calls[0].id, "toolu_2");
        let Turn::Tools(r) = &turns[4] else {
            panic!("{turns:#?}")
        };
        assert_eq!((r[0].name.as_str(), r[0].text.as_str()), ("notify", "sent"));
        assert!(matches!(&turns[5], Turn::User(t) if t == "thanks"));
    }

    #[test]
    fn tools_are_checked() {
        let ok = parse_tools(&[
            json!({"type": "code_execution_20260120", "name": "code_execution"}),
            json!({"name": "notify", "input_schema": {"type": "object"}}),
        ])
        .expect("tools");
        assert_eq!(ok.code, Some(true));
        assert_eq!(ok.custom.len(), 1);
        assert_eq!(
            parse_tools(&[json!({"type": "code_execution_20250825", "name": "code_execution"})])
                .expect("tools")
                .code,
            Some(false)
        );
        for bad in [
            json!({"type": "web_search_20250305", "name": "web_search"}),
            json!({"type": "code_execution_20990101", "name": "code_execution"}),
            json!({"type": "code_execution_20250825", "name": "python"}),
            json!({"name": "bash_code_execution", "input_schema": {"type": "object"}}),
            json!({"name": "x"}),
        ] {
            let e = parse_tools(std::slice::from_ref(&bad)).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn allowed_callers_split_the_models_tools_from_the_codes() {
        let code = json!({"type": "code_execution_20260120", "name": "code_execution"});
        let tool = |name: &str, callers: Value| json!({"name": name, "input_schema": {"type": "object"}, "allowed_callers": callers});
        let ok = parse_tools(&[
            tool("lookup", json!(["code_execution_20260120"])),
            tool("both", json!(["direct", "code_execution_20260120"])),
            tool("notify", json!(["direct"])),
            code.clone(),
        ])
        .expect("tools");
        let names = |t: &[ToolSpec]| t.iter().map(|s| s.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&ok.custom), ["both", "notify"]);
        let callable: Vec<&str> = ok.callable.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(callable, ["lookup", "both"]);
        assert_eq!(ok.version, Some("code_execution_20260120"));
        let v2605 = json!({"type": "code_execution_20260521", "name": "code_execution"});
        let v2508 = json!({"type": "code_execution_20250825", "name": "code_execution"});
        for (tools, says) in [
            (vec![tool("x", json!([]))], "non-empty list"),
            (
                vec![tool("x", json!(["model"])), code.clone()],
                "non-empty list",
            ),
            (vec![tool("x", json!("direct"))], "non-empty list"),
            (
                vec![tool("x", json!(["code_execution_20260120"]))],
                "needs the code execution tool",
            ),
            (
                vec![tool("x", json!(["code_execution_20260120"])), v2605],
                "this request's code execution tool is code_execution_20260521",
            ),
            (
                vec![tool("x", json!(["code_execution_20250825"])), v2508],
                "does not run",
            ),
            (
                vec![
                    tool("get-row", json!(["code_execution_20260120"])),
                    code.clone(),
                ],
                "not a Python identifier",
            ),
        ] {
            let e = parse_tools(&tools).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{tools:?}");
            assert!(e.message.contains(says), "{}", e.message);
        }
    }

    #[test]
    fn server_ids_are_prefixed_once() {
        assert_eq!(server_id("call_abc"), "srvtoolu_call_abc");
        assert_eq!(server_id("srvtoolu_x"), "srvtoolu_x");
        assert_eq!(server_id("a:b"), "srvtoolu_a_b");
    }
}
