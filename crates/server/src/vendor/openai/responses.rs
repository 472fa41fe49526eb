//! `POST /openai/v1/responses` with the `code_interpreter` tool: the operator's model is
//! offered `python` (a stateful Jupyter-like session in the container, files in /mnt/data)
//! beside the request's function tools; each call is reported as a `code_interpreter_call`
//! item with its logs and images, and the answer as a `message` whose text cites every file
//! the code wrote with a `container_file_citation`. Responses are kept (unless `store:
//! false`) so that `previous_response_id` continues a conversation, in the same container.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_agent::{AgentError, Client, ModelReply, Ruling, ToolReply, ToolSpec, ToolUse, Turn};
use runcell_engine::tools::execution_output;
use runcell_engine::{CancelToken, Engine, EngineError, ExecutionStatus, FileChangeKind};
use serde::Deserialize;
use serde_json::{json, Value};

use super::containers::{self, ContainerSpec};
use super::context::{container_id, response_store, Caller};
use super::error::Error;
use crate::state::AppState;
use crate::vendor::approval::{self, Approver};
use crate::vendor::{sse, Abort, FileStore};

/// The tool the model runs code with, as ChatGPT's models know it.
const PYTHON: &str = "python";

#[derive(Debug, Deserialize)]
struct CreateResponse {
    model: String,
    #[serde(default)]
    input: Option<Input>,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    store: Option<bool>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    metadata: Option<Value>,
    /// runcell's own: `never` or `always` (each cell waits for `POST /v1/approvals/{id}`);
    /// the SDK sends it with `extra_body`.
    #[serde(default)]
    approval: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<Value>),
}

/// What a stored response keeps: the conversation before it, the response, its container.
#[derive(Debug, serde::Serialize, Deserialize)]
struct Record {
    history: Vec<Value>,
    response: Value,
    #[serde(default)]
    session: Option<String>,
    /// What the model read of each code interpreter call of the conversation, by item id,
    /// so a continued conversation shows it the same results (an item's logs are less).
    #[serde(default)]
    tool_texts: BTreeMap<String, String>,
}

fn item_type(v: &Value) -> &str {
    match v.get("type").and_then(Value::as_str) {
        Some(t) => t,
        // `{"role": ..., "content": ...}` is an input message.
        None if v.get("role").is_some() => "message",
        None => "",
    }
}

/// A message's text: a string, or its text parts (notes for the parts the model cannot see).
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match item_type(p) {
                "input_text" | "output_text" | "text" => {
                    p.get("text").and_then(Value::as_str).unwrap_or("").to_owned()
                }
                "input_file" => format!(
                    "[A file was attached here ({}); to work on it with code, give it to the container: tools[].container.file_ids]",
                    p.get("file_id").and_then(Value::as_str).unwrap_or("inline")
                ),
                "input_image" => "[An image was attached here; this server does not pass images to the model]".to_owned(),
                _ => String::new(),
            })
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n\n"),
        _ => String::new(),
    }
}

/// The conversation's items as the agent's transcript, and the system and developer
/// messages' text (which joins the instructions).
fn transcript(items: &[Value], tool_texts: &BTreeMap<String, String>) -> (Vec<Turn>, String) {
    let mut turns = Vec::new();
    let mut system = Vec::new();
    let call = |id: &str, name: &str, input: Value, arguments: String| ToolUse {
        id: id.to_owned(),
        name: name.to_owned(),
        input,
        arguments,
        bad_arguments: None,
    };
    let reply = |text: String, calls: Vec<ToolUse>| {
        Turn::Assistant(ModelReply {
            text,
            calls,
            raw: Value::Null,
        })
    };
    for item in items {
        let s = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        match item_type(item) {
            "message" => {
                let text = content_text(item.get("content"));
                match item.get("role").and_then(Value::as_str) {
                    Some("assistant") => turns.push(reply(text, Vec::new())),
                    Some("system" | "developer") => system.push(text),
                    _ => turns.push(Turn::User(text)),
                }
            }
            "code_interpreter_call" => {
                let code = s("code");
                let id = s("id");
                turns.push(reply(
                    String::new(),
                    vec![call(
                        &id,
                        PYTHON,
                        json!({"code": code}),
                        json!({"code": code}).to_string(),
                    )],
                ));
                let logs: Vec<&str> = item
                    .get("outputs")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|o| o.get("logs").and_then(Value::as_str))
                    .collect();
                let text = match tool_texts.get(&id) {
                    Some(t) => t.clone(),
                    None if logs.is_empty() => "(no output)".into(),
                    None => logs.join("\n"),
                };
                turns.push(Turn::Tools(vec![ToolReply {
                    id,
                    name: PYTHON.into(),
                    text,
                    images: Vec::new(),
                    is_error: false,
                }]));
            }
            "function_call" => {
                let arguments = s("arguments");
                let input = serde_json::from_str(&arguments).unwrap_or_else(|_| json!({}));
                turns.push(reply(
                    String::new(),
                    vec![call(&s("call_id"), &s("name"), input, arguments)],
                ));
            }
            "function_call_output" => turns.push(Turn::Tools(vec![ToolReply {
                id: s("call_id"),
                name: String::new(),
                text: match item.get("output") {
                    Some(Value::String(o)) => o.clone(),
                    other => content_text(other),
                },
                images: Vec::new(),
                is_error: false,
            }])),
            // Reasoning and the like carry nothing another model can use.
            _ => {}
        }
    }
    // A reply's calls and their results go back together.
    let mut merged: Vec<Turn> = Vec::new();
    for t in turns {
        match (merged.last_mut(), t) {
            (Some(Turn::Tools(prev)), Turn::Tools(more)) => prev.extend(more),
            (Some(Turn::Assistant(prev)), Turn::Assistant(next))
                if next.text.is_empty() && !prev.calls.is_empty() =>
            {
                prev.calls.extend(next.calls)
            }
            (_, t) => merged.push(t),
        }
    }
    (merged, system.join("\n\n"))
}

fn sandbox_prompt() -> &'static str {
    "You can run Python with the python tool: a stateful Jupyter-like session (variables \
persist between calls) whose working directory is /mnt/data, where the user's files are. \
Save every output file (charts as PNG, tables as CSV, ...) to /mnt/data and mention it by \
its path (sandbox:/mnt/data/NAME): those files are handed to the user. numpy, pandas, \
matplotlib and the usual data-science packages are installed; there is no network access. \
Check results by running code rather than guessing, and give the key numbers in your answer."
}

fn python_tool() -> ToolSpec {
    ToolSpec {
        name: PYTHON.into(),
        description: "Run Python in a stateful Jupyter-like session in /mnt/data: variables persist between calls. Returns stdout, stderr, the last expression's value and any figures.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        }),
    }
}

/// What the request's tools ask for.
#[derive(Debug, Default)]
struct Offer {
    /// The code interpreter's container, as given (an id, or an `auto` spec), and its index.
    container: Option<(usize, Value)>,
    functions: Vec<ToolSpec>,
}

fn parse_tools(tools: &[Value]) -> Result<Offer, Error> {
    let mut offer = Offer::default();
    for (i, t) in tools.iter().enumerate() {
        let param = |f: &str| format!("tools[{i}].{f}");
        match t.get("type").and_then(Value::as_str) {
            Some("code_interpreter") => {
                if offer.container.is_some() {
                    return Err(Error::invalid(Some(&param("type")), "code_interpreter is given twice"));
                }
                let c = t.get("container").cloned().unwrap_or(Value::Null);
                let ok = c.is_string() || c.get("type").and_then(Value::as_str) == Some("auto");
                if !ok {
                    return Err(Error::invalid(
                        Some(&param("container")),
                        "container must be a container id (cntr_...) or {\"type\": \"auto\"}",
                    ));
                }
                offer.container = Some((i, c));
            }
            Some("function") => {
                let name = t.get("name").and_then(Value::as_str).unwrap_or("");
                if name.is_empty() {
                    return Err(Error::invalid(Some(&param("name")), "Missing required parameter: 'name'."));
                }
                if name == PYTHON {
                    return Err(Error::invalid(
                        Some(&param("name")),
                        "`python` is the code interpreter's own name here",
                    ));
                }
                offer.functions.push(ToolSpec {
                    name: name.to_owned(),
                    description: t.get("description").and_then(Value::as_str).unwrap_or("").to_owned(),
                    input_schema: t
                        .get("parameters")
                        .cloned()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                });
            }
            other => {
                return Err(Error::invalid(
                    Some(&param("type")),
                    format!(
                        "Unsupported tool type {:?}: this server runs code_interpreter and function tools",
                        other.unwrap_or("")
                    ),
                ))
            }
        }
    }
    Ok(offer)
}

/// What the run tells its client, as it happens.
#[derive(Debug)]
enum Emit {
    /// A code interpreter call about to run (status `in_progress`).
    Started(Value),
    /// An item in its final form.
    Done(Value),
}

struct Job {
    engine: Engine,
    session: Option<String>,
    provider: runcell_agent::ProviderConfig,
    system: String,
    tools: Vec<ToolSpec>,
    functions: HashSet<String>,
    max_steps: usize,
    turns: Vec<Turn>,
    stop: Arc<AtomicBool>,
    cancel: CancelToken,
    /// With approval `always`: who decides on each cell.
    approver: Option<Approver>,
}

#[derive(Debug, Default)]
struct End {
    complete: bool,
    input_tokens: u64,
    output_tokens: u64,
    /// What the model read of each call, by item id.
    tool_texts: BTreeMap<String, String>,
}

fn upstream_error(e: AgentError) -> Error {
    match e {
        AgentError::Engine(e) => e.into(),
        AgentError::Api {
            status, message, ..
        } if matches!(status, 400 | 404 | 413 | 422 | 429) => Error {
            code: if status == 429 {
                Some("rate_limit_exceeded")
            } else {
                None
            },
            ..Error::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                if status == 429 {
                    "rate_limit_exceeded"
                } else {
                    "invalid_request_error"
                },
                format!("the model provider refused the request: {message}"),
            )
        },
        other => Error::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            format!(
                "the model provider failed: {}",
                runcell_engine::error_chain(&other)
            ),
        ),
    }
}

/// `text` with a `container_file_citation` for each file: where the text names the file
/// (`sandbox:/mnt/data/NAME`, `/mnt/data/NAME` or `NAME`), or in a link added at its end.
fn cite(text: &str, container: &str, files: &[(String, String)]) -> (String, Vec<Value>) {
    let mut text = text.to_owned();
    let mut annotations = Vec::new();
    for (path, id) in files {
        let forms = [
            format!("sandbox:/mnt/data/{path}"),
            format!("/mnt/data/{path}"),
            path.clone(),
        ];
        let found = forms
            .iter()
            .find_map(|f| text.find(f.as_str()).map(|at| (at, f.len())));
        let (at, len) = match found {
            Some(hit) => hit,
            None => {
                let link = format!("sandbox:/mnt/data/{path}");
                text.push_str(&format!("\n\n[{path}]({link})"));
                (text.len() - link.len() - 1, link.len())
            }
        };
        // Offsets in characters, as OpenAI counts them.
        let start = text[..at].chars().count();
        let end = start + text[at..at + len].chars().count();
        annotations.push(json!({
            "type": "container_file_citation", "container_id": container, "file_id": id,
            "filename": path.rsplit('/').next().unwrap_or(path), "start_index": start, "end_index": end,
        }));
    }
    (text, annotations)
}

impl Job {
    fn run(mut self, sink: &mut dyn FnMut(Emit)) -> Result<End, Error> {
        let mut turns = std::mem::take(&mut self.turns);
        let client = Client::new(self.provider.clone()).map_err(upstream_error)?;
        let mut end = End::default();
        // Files the code wrote in this response: (path in /mnt/data, container file id).
        let mut produced: Vec<(String, String)> = Vec::new();
        for step in 1..=self.max_steps.max(1) {
            if self.stop.load(Ordering::SeqCst) {
                return Err(Error::invalid(None, "the client went away"));
            }
            let (reply, meta) = client
                .complete_with(&self.system, &turns, &self.tools)
                .map_err(upstream_error)?;
            end.input_tokens += meta.input_tokens;
            end.output_tokens += meta.output_tokens;
            if !reply.text.is_empty() {
                let container = self
                    .session
                    .as_deref()
                    .map(container_id)
                    .unwrap_or_default();
                let (text, annotations) = cite(&reply.text, &container, &produced);
                sink(Emit::Done(json!({
                    "type": "message", "id": runcell_engine::new_id("msg"), "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": annotations, "logprobs": []}],
                })));
            }
            if reply.calls.is_empty() {
                end.complete = true;
                return Ok(end);
            }
            let mut replies = Vec::new();
            let mut client_calls = false;
            for call in &reply.calls {
                if self.functions.contains(&call.name) {
                    sink(Emit::Done(json!({
                        "type": "function_call", "id": runcell_engine::new_id("fc"), "call_id": call.id,
                        "name": call.name, "arguments": call.arguments, "status": "completed",
                    })));
                    client_calls = true;
                    continue;
                }
                let (item, reply) = self.python(step, call, &mut produced, sink)?;
                if let Some(item) = item {
                    end.tool_texts.insert(item, reply.text.clone());
                }
                replies.push(reply);
            }
            turns.push(Turn::Assistant(reply));
            if !replies.is_empty() {
                turns.push(Turn::Tools(replies));
            }
            if client_calls {
                end.complete = true;
                return Ok(end);
            }
        }
        Ok(end)
    }

    /// Runs one code interpreter call; with an approver, a person decides first (the item
    /// then shows the code that ran, and a declined call fails with the reason in its logs).
    fn python(
        &self,
        step: usize,
        call: &ToolUse,
        produced: &mut Vec<(String, String)>,
        sink: &mut dyn FnMut(Emit),
    ) -> Result<(Option<String>, ToolReply), Error> {
        let mut tool = ToolReply {
            id: call.id.clone(),
            name: call.name.clone(),
            text: String::new(),
            images: Vec::new(),
            is_error: true,
        };
        let code = call.input.get("code").and_then(Value::as_str);
        let (Some(session), true, Some(code)) =
            (self.session.as_deref(), call.name == PYTHON, code)
        else {
            tool.text = match (&call.bad_arguments, call.name == PYTHON) {
                (Some(why), _) => format!("error: {why}"),
                (None, true) => "error: the python tool needs a `code` string".into(),
                (None, false) => format!("error: there is no tool named {:?}", call.name),
            };
            return Ok((None, tool));
        };
        let id = runcell_engine::new_id("ci");
        let container = container_id(session);
        let mut note = None;
        let edited;
        let code = match &self.approver {
            None => code,
            Some(a) => match a.rule(step, call, code.to_owned())? {
                Ruling::Run => code,
                Ruling::Edited(c) => {
                    note = Some(runcell_agent::approval::edited_note(&c));
                    edited = c;
                    edited.as_str()
                }
                Ruling::Declined(reason) => {
                    tool.text = runcell_agent::approval::declined_text(reason.as_deref());
                    let item = json!({"type": "code_interpreter_call", "id": id, "code": code,
                        "container_id": container, "outputs": null, "status": "in_progress"});
                    sink(Emit::Started(item.clone()));
                    let mut done = item;
                    done["outputs"] = json!([{"type": "logs", "logs": tool.text}]);
                    done["status"] = json!("failed");
                    sink(Emit::Done(done));
                    return Ok((Some(id), tool));
                }
            },
        };
        sink(Emit::Started(json!({
            "type": "code_interpreter_call", "id": id, "code": code, "container_id": container,
            "outputs": null, "status": "in_progress",
        })));
        let (outputs, status) = match self.engine.sessions().execute_cancellable(
            session,
            code,
            None,
            None,
            self.cancel.clone(),
        ) {
            Ok(e) => {
                let out = execution_output(&e);
                tool.text = out.text.clone();
                tool.images = out.images.clone();
                tool.is_error = out.is_error;
                let mut logs = e.stdout.clone();
                for r in e.results.iter().filter(|r| r.is_main_result) {
                    if let Some(t) = r.data.get("text/plain") {
                        logs.push_str(t);
                        logs.push('\n');
                    }
                }
                logs.push_str(&e.stderr);
                if let Some(x) = &e.error {
                    logs.push_str(if x.traceback.trim().is_empty() {
                        &x.value
                    } else {
                        &x.traceback
                    });
                }
                let mut outputs = vec![json!({"type": "logs", "logs": logs})];
                for img in &out.images {
                    outputs.push(json!({"type": "image", "url": format!("data:{};base64,{}", img.mime, img.data_base64)}));
                }
                for f in e
                    .files
                    .iter()
                    .filter(|f| f.change != FileChangeKind::Deleted)
                {
                    let fid = containers::file_id(session, &f.path);
                    if !produced.iter().any(|(p, _)| p == &f.path) {
                        produced.push((f.path.clone(), fid));
                    }
                }
                let status = match e.status {
                    ExecutionStatus::Timeout | ExecutionStatus::Killed => "failed",
                    _ => "completed",
                };
                (outputs, status)
            }
            // The model's to fix: it is told.
            Err(
                e @ (EngineError::PayloadTooLarge(_)
                | EngineError::InvalidRequest(_)
                | EngineError::SessionBusy(_)),
            ) => {
                let why = runcell_engine::error_chain(&e);
                tool.text = format!("error: {why}");
                (vec![json!({"type": "logs", "logs": why})], "failed")
            }
            Err(e) => return Err(e.into()),
        };
        sink(Emit::Done(json!({
            "type": "code_interpreter_call", "id": id, "code": code, "container_id": container,
            "outputs": outputs, "status": status,
        })));
        if let Some(note) = note {
            tool.text = format!("{note}{}", tool.text);
        }
        Ok((Some(id), tool))
    }
}

/// The Response object.
fn response_json(id: &str, req: &ResponseEcho, output: Vec<Value>, end: Option<&End>) -> Value {
    let status = match end {
        None => "in_progress",
        Some(e) if e.complete => "completed",
        Some(_) => "incomplete",
    };
    let usage = end.map(|e| {
        json!({"input_tokens": e.input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
               "output_tokens": e.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": e.input_tokens + e.output_tokens})
    });
    json!({
        "id": id,
        "object": "response",
        "created_at": req.created_at,
        "status": status,
        "error": null,
        "incomplete_details": if status == "incomplete" { json!({"reason": "max_messages"}) } else { Value::Null },
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": req.previous_response_id,
        "store": req.store,
        "temperature": null,
        "tool_choice": "auto",
        "tools": req.tools,
        "top_p": null,
        "usage": usage,
        "metadata": req.metadata,
    })
}

/// The request's fields a Response repeats.
#[derive(Debug, Clone)]
struct ResponseEcho {
    created_at: i64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<u64>,
    previous_response_id: Option<String>,
    store: bool,
    tools: Value,
    metadata: Value,
}

fn parse_request(body: &[u8]) -> Result<CreateResponse, Error> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let inner = inner
            .rfind(" at line ")
            .map_or(inner.as_str(), |at| &inner[..at])
            .to_owned();
        Error::invalid((path != ".").then_some(path.as_str()), inner)
    })
}

async fn load(store: &FileStore, tenant: &str, id: &str) -> Result<Option<Record>, Error> {
    let (store, tenant, id) = (store.clone(), tenant.to_owned(), id.to_owned());
    let found = super::files::blocking(move || store.read(&tenant, &id)).await?;
    match found {
        Some((_, data)) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(Error::internal),
        None => Ok(None),
    }
}

pub(super) async fn retrieve(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    match load(&response_store(&state), &tenant.0, &id).await? {
        Some(r) => Ok(Json(r.response)),
        None => Err(Error::not_found(format!(
            "Response with id '{id}' not found."
        ))),
    }
}

pub(super) async fn create(
    State(state): State<AppState>,
    Caller(tenant, key): Caller,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Error> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::too_large("the request body is too large")
        } else {
            Error::invalid(None, e.body_text())
        }
    })?;
    let req = parse_request(&body)?;
    let offer = parse_tools(req.tools.as_deref().unwrap_or(&[]))?;
    let approval =
        approval::mode(req.approval.as_deref(), &headers, key.as_ref()).map_err(|e| Error {
            param: Some("approval".into()),
            ..Error::from(e)
        })?;
    let Some(config) = state.vendor.clone() else {
        return Err(Error::not_found(
            "this server has no model configured: its operator starts it with `runcell serve --agent-provider openai|anthropic|gemini`",
        ));
    };
    let store = response_store(&state);
    let previous = match &req.previous_response_id {
        Some(id) => Some(load(&store, &tenant.0, id).await?.ok_or_else(|| Error {
            param: Some("previous_response_id".into()),
            ..Error::not_found(format!("Previous response with id '{id}' not found."))
        })?),
        None => None,
    };
    let mut items: Vec<Value> = match &previous {
        Some(p) => {
            let mut h = p.history.clone();
            h.extend(p.response["output"].as_array().cloned().unwrap_or_default());
            h
        }
        None => Vec::new(),
    };
    match req.input {
        Some(Input::Text(t)) => items.push(json!({"role": "user", "content": t})),
        Some(Input::Items(i)) => items.extend(i),
        None if previous.is_none() => {
            return Err(Error::invalid(
                Some("input"),
                "Missing required parameter: 'input'.",
            ))
        }
        None => {}
    }

    // The container: the one named, the previous response's (auto), or a new one.
    let session = match &offer.container {
        None => None,
        Some((_, Value::String(id))) => Some(containers::owned(&state, &tenant, id).await?.id),
        Some((i, spec)) => {
            let reuse = match previous.as_ref().and_then(|p| p.session.clone()) {
                Some(s) => state
                    .engine
                    .sessions()
                    .get(&s)
                    .ok()
                    .filter(|info| info.owner == tenant.0)
                    .map(|info| info.id),
                None => None,
            };
            match reuse {
                Some(s) => Some(s),
                None => {
                    let spec: ContainerSpec =
                        serde_json::from_value(spec.clone()).map_err(|e| {
                            Error::invalid(Some(&format!("tools[{i}].container")), e.to_string())
                        })?;
                    let param = format!("tools[{i}].container.");
                    Some(containers::start(&state, &tenant, spec, &param).await?.id)
                }
            }
        }
    };

    let mut tool_texts = previous
        .as_ref()
        .map(|p| p.tool_texts.clone())
        .unwrap_or_default();
    let (turns, extra_system) = transcript(&items, &tool_texts);
    let mut system: Vec<String> = req.instructions.iter().cloned().collect();
    if !extra_system.is_empty() {
        system.push(extra_system);
    }
    let mut tools = Vec::new();
    if session.is_some() {
        system.push(sandbox_prompt().to_owned());
        tools.push(python_tool());
    }
    let functions: HashSet<String> = offer.functions.iter().map(|f| f.name.clone()).collect();
    tools.extend(offer.functions);

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
        "openai",
        &stop,
    );
    let job = Job {
        engine: state.engine.clone(),
        session: session.clone(),
        provider: config.provider_for(&req.model, req.max_output_tokens),
        system: system.join("\n\n"),
        tools,
        functions,
        max_steps: config.max_steps,
        turns,
        stop,
        cancel,
        approver,
    };
    let echo = ResponseEcho {
        created_at: chrono::Utc::now().timestamp(),
        model: req.model.clone(),
        instructions: req.instructions.clone(),
        max_output_tokens: req.max_output_tokens,
        previous_response_id: req.previous_response_id.clone(),
        store: req.store != Some(false),
        tools: Value::Array(req.tools.clone().unwrap_or_default()),
        metadata: req.metadata.clone().unwrap_or_else(|| json!({})),
    };
    let id = store.new_id();
    // Kept for `previous_response_id` and `GET /responses/{id}`.
    let keep = {
        let (store, tenant, id, session, echo) = (
            store.clone(),
            tenant.0.clone(),
            id.clone(),
            session.clone(),
            echo.clone(),
        );
        move |response: Value, texts: &BTreeMap<String, String>| -> Result<(), Error> {
            if !echo.store {
                return Ok(());
            }
            tool_texts.extend(texts.clone());
            let record = Record {
                history: items,
                response,
                session,
                tool_texts,
            };
            let data = serde_json::to_vec(&record).map_err(Error::internal)?;
            store
                .put_as(
                    &tenant,
                    &id,
                    "response.json",
                    "application/json",
                    &data,
                    None,
                    None,
                )
                .map(|_| ())
                .map_err(Error::internal)
        }
    };

    if req.stream != Some(true) {
        let (output, end, kept) = tokio::task::spawn_blocking({
            let (id, echo) = (id.clone(), echo.clone());
            move || {
                let mut output = Vec::new();
                let end = job.run(&mut |e| {
                    if let Emit::Done(item) = e {
                        output.push(item);
                    }
                });
                let kept = match &end {
                    Ok(end) => keep(
                        response_json(&id, &echo, output.clone(), Some(end)),
                        &end.tool_texts,
                    ),
                    Err(_) => Ok(()),
                };
                (output, end, kept)
            }
        })
        .await
        .map_err(Error::internal)?;
        abort.armed = false;
        let end = end?;
        kept?;
        return Ok(Json(response_json(&id, &echo, output, Some(&end))).into_response());
    }

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Frame>();
    tokio::task::spawn_blocking({
        let (id, echo) = (id.clone(), echo.clone());
        move || {
            let mut output = Vec::new();
            let end = job.run(&mut |e| {
                if let Emit::Done(item) = &e {
                    output.push(item.clone());
                }
                let _ = tx.send(Frame::Emit(e));
            });
            let frame = match end {
                Ok(end) => {
                    let response = response_json(&id, &echo, output, Some(&end));
                    match keep(response.clone(), &end.tool_texts) {
                        Ok(()) => Frame::End(response),
                        Err(e) => Frame::Failed(e),
                    }
                }
                Err(e) => Frame::Failed(e),
            };
            let _ = tx.send(frame);
        }
    });
    let start = response_json(&id, &echo, Vec::new(), None);
    let mut events = Events::default();
    let first = events.event("response.created", json!({"response": start.clone()}))
        + &events.event("response.in_progress", json!({"response": start}));
    struct Stream {
        rx: tokio::sync::mpsc::UnboundedReceiver<Frame>,
        events: Events,
        done: bool,
        abort: Abort,
    }
    let init = Stream {
        rx,
        events,
        done: false,
        abort,
    };
    let rest = futures_util::stream::unfold(init, |mut s| async move {
        if s.done {
            return None;
        }
        let text = match s.rx.recv().await {
            Some(Frame::Emit(e)) => s.events.emit(e),
            Some(Frame::End(response)) => {
                s.done = true;
                s.abort.armed = false;
                let kind = if response["status"] == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                s.events.event(kind, json!({"response": response}))
            }
            Some(Frame::Failed(e)) => {
                s.done = true;
                s.abort.armed = false;
                s.events.error(&e)
            }
            None => {
                s.done = true;
                s.events
                    .error(&Error::internal("the run ended without an outcome"))
            }
        };
        Some((Ok::<_, std::io::Error>(Bytes::from(text)), s))
    });
    let body = futures_util::StreamExt::chain(
        futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(first)) }),
        rest,
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .map_err(Error::internal)
}

enum Frame {
    Emit(Emit),
    End(Value),
    Failed(Error),
}

/// The stream's events, numbered, and the output index each item got.
#[derive(Default)]
struct Events {
    sequence: u64,
    next_index: usize,
    /// Indexes of code interpreter calls started and not yet done, by item id.
    started: Vec<(String, usize)>,
}

impl Events {
    fn event(&mut self, kind: &str, mut data: Value) -> String {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        sse(kind, &data)
    }

    fn error(&mut self, e: &Error) -> String {
        // The SDK raises on a stream event that carries `error`.
        let data =
            json!({"code": e.code, "message": e.message, "param": e.param, "error": e.object()});
        self.event("error", data)
    }

    fn emit(&mut self, e: Emit) -> String {
        match e {
            Emit::Started(item) => {
                let id = item["id"].as_str().unwrap_or("").to_owned();
                let index = self.next_index;
                self.next_index += 1;
                self.started.push((id.clone(), index));
                let code = item["code"].as_str().unwrap_or("").to_owned();
                let mut added = item.clone();
                added["code"] = json!("");
                let at = |extra: Value| {
                    let mut v = json!({"item_id": id, "output_index": index});
                    if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
                        v.extend(extra.clone());
                    }
                    v
                };
                self.event(
                    "response.output_item.added",
                    json!({"item": added, "output_index": index}),
                ) + &self.event("response.code_interpreter_call.in_progress", at(json!({})))
                    + &self.event(
                        "response.code_interpreter_call_code.delta",
                        at(json!({"delta": code})),
                    )
                    + &self.event(
                        "response.code_interpreter_call_code.done",
                        at(json!({"code": code})),
                    )
                    + &self.event("response.code_interpreter_call.interpreting", at(json!({})))
            }
            Emit::Done(item) => {
                let id = item["id"].as_str().unwrap_or("").to_owned();
                if let Some(pos) = self.started.iter().position(|(i, _)| *i == id) {
                    let (_, index) = self.started.remove(pos);
                    return self.event(
                        "response.code_interpreter_call.completed",
                        json!({"item_id": id, "output_index": index}),
                    ) + &self.event(
                        "response.output_item.done",
                        json!({"item": item, "output_index": index}),
                    );
                }
                let index = self.next_index;
                self.next_index += 1;
                let mut out = String::new();
                match item["type"].as_str() {
                    Some("message") => {
                        let part = item["content"][0].clone();
                        let text = part["text"].as_str().unwrap_or("").to_owned();
                        let mut added = item.clone();
                        added["status"] = json!("in_progress");
                        added["content"] = json!([]);
                        out += &self.event(
                            "response.output_item.added",
                            json!({"item": added, "output_index": index}),
                        );
                        let at = json!({"item_id": id, "output_index": index, "content_index": 0});
                        let with = |extra: Value| {
                            let mut v = at.clone();
                            if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
                                v.extend(extra.clone());
                            }
                            v
                        };
                        out += &self.event(
                            "response.content_part.added",
                            with(json!({"part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})),
                        );
                        out += &self.event(
                            "response.output_text.delta",
                            with(json!({"delta": text, "logprobs": []})),
                        );
                        for (n, a) in part["annotations"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .into_iter()
                            .enumerate()
                        {
                            out += &self.event(
                                "response.output_text.annotation.added",
                                with(json!({"annotation_index": n, "annotation": a})),
                            );
                        }
                        out += &self.event(
                            "response.output_text.done",
                            with(json!({"text": text, "logprobs": []})),
                        );
                        out +=
                            &self.event("response.content_part.done", with(json!({"part": part})));
                    }
                    Some("function_call") => {
                        let mut added = item.clone();
                        added["arguments"] = json!("");
                        added["status"] = json!("in_progress");
                        out += &self.event(
                            "response.output_item.added",
                            json!({"item": added, "output_index": index}),
                        );
                        let args = item["arguments"].clone();
                        out += &self.event(
                            "response.function_call_arguments.delta",
                            json!({"item_id": id, "output_index": index, "delta": args}),
                        );
                        out += &self.event(
                            "response.function_call_arguments.done",
                            json!({"item_id": id, "output_index": index, "arguments": args}),
                        );
                    }
                    _ => {}
                }
                out + &self.event(
                    "response.output_item.done",
                    json!({"item": item, "output_index": index}),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_cited_where_the_text_names_them_or_in_a_link() {
        let files = vec![
            ("chart.png".to_owned(), "cfile_1".to_owned()),
            ("out/t.csv".to_owned(), "cfile_2".to_owned()),
        ];
        let (text, a) = cite("Voilà: sandbox:/mnt/data/chart.png", "cntr_x", &files);
        assert_eq!(a.len(), 2);
        let chars: Vec<char> = text.chars().collect();
        let span = |v: &Value| {
            let (s, e) = (
                v["start_index"].as_u64().unwrap_or(0) as usize,
                v["end_index"].as_u64().unwrap_or(0) as usize,
            );
            chars[s..e].iter().collect::<String>()
        };
        assert_eq!(span(&a[0]), "sandbox:/mnt/data/chart.png");
        assert_eq!(span(&a[1]), "sandbox:/mnt/data/out/t.csv");
        assert!(
            text.ends_with("[out/t.csv](sandbox:/mnt/data/out/t.csv)"),
            "{text}"
        );
        assert_eq!(a[1]["filename"], "t.csv");
    }

    #[test]
    fn items_become_the_transcript() {
        let items = vec![
            json!({"role": "developer", "content": "be brief"}),
            json!({"role": "user", "content": [{"type": "input_text", "text": "fib?"}]}),
            json!({"type": "code_interpreter_call", "id": "ci_1", "code": "print(55)", "container_id": "cntr_x",
                   "outputs": [{"type": "logs", "logs": "55\n"}], "status": "completed"}),
            json!({"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                   "content": [{"type": "output_text", "text": "55", "annotations": []}]}),
            json!({"type": "function_call", "call_id": "c2", "name": "save", "arguments": "{\"n\":55}"}),
            json!({"type": "function_call_output", "call_id": "c2", "output": "ok"}),
        ];
        let (turns, system) = transcript(&items, &BTreeMap::new());
        assert_eq!(system, "be brief");
        assert_eq!(turns.len(), 6, "{turns:#?}");
        assert!(matches!(&turns[0], Turn::User(t) if t == "fib?"));
        assert!(matches!(&turns[2], Turn::Tools(r) if r[0].text == "55\n" && r[0].id == "ci_1"));
        assert!(matches!(&turns[4], Turn::Assistant(r) if r.calls[0].input["n"] == 55));
        assert!(matches!(&turns[5], Turn::Tools(r) if r[0].text == "ok"));
    }
}
