//! `/mistral/v1/conversations`: start (from an `agent_id`, or a `model` with its tools and
//! instructions), append, retrieve, history, list, delete; `stream: true` as Mistral's SSE
//! events. A conversation with the `code_interpreter` tool has one runcell session for its
//! whole life; its `outputs` are `tool.execution` entries (`info`: `code`, `code_output`)
//! and `message.output` entries, a figure being a `tool_file` chunk of the message after it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use runcell_agent::Turn;
use runcell_engine::CancelToken;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::agents::{check_tools, find, parse_body, required};
use super::context::{conversation_store, file_store, time, Caller};
use super::error::Error;
use crate::state::{AppState, Tenant};
use crate::vendor::code_loop::{merge, turns_of, CodeLoop, End, Event, Image};
use crate::vendor::session::{live_session, load_record, save_record, start_session};
use crate::vendor::{sse, Abort, FileStore};

/// Mistral's code interpreter runs for up to this long per call.
const RUN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Failed runs the model may follow with another before it must answer.
const RETRIES: usize = 5;
const TOOL: &str = "code_interpreter";

/// A piece of a conversation, as the model reads it again.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Piece {
    User { text: String },
    Model { event: Event },
}

/// A kept conversation.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    /// The AgentConversation or ModelConversation object.
    conversation: Value,
    session: Option<String>,
    model: String,
    agent_id: Option<String>,
    instructions: String,
    max_tokens: Option<u64>,
    pieces: Vec<Piece>,
    /// Every entry so far, for `/history`.
    entries: Vec<Value>,
}

/// The text of a message's content: a string, or its text chunks.
fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(chunks)) => chunks
            .iter()
            .filter_map(|c| c.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The request's `inputs` as pieces and as the entries the history keeps.
fn read_inputs(inputs: Option<&Value>) -> Result<(Vec<Piece>, Vec<Value>), Error> {
    let now = time(chrono::Utc::now());
    let entry = |role: &str, content: Value| {
        json!({"object": "entry", "type": "message.input", "id": runcell_engine::new_id("msg"),
               "role": role, "content": content, "created_at": now, "completed_at": now, "prefix": false})
    };
    match inputs {
        Some(Value::String(s)) if !s.is_empty() => Ok((
            vec![Piece::User { text: s.clone() }],
            vec![entry("user", json!(s))],
        )),
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut pieces = Vec::new();
            let mut entries = Vec::new();
            for (i, it) in items.iter().enumerate() {
                let kind = it
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message.input");
                if kind != "message.input" {
                    return Err(Error::invalid(
                        &[json!("inputs"), json!(i), json!("type")],
                        format!("entries of type {kind} are not supported here"),
                    ));
                }
                let text = content_text(it.get("content"));
                let content = it.get("content").cloned().unwrap_or_else(|| json!(""));
                match it.get("role").and_then(Value::as_str) {
                    Some("user") | None => {
                        pieces.push(Piece::User { text });
                        entries.push(entry("user", content));
                    }
                    Some("assistant") => {
                        pieces.push(Piece::Model {
                            event: Event::Text { text },
                        });
                        entries.push(entry("assistant", content));
                    }
                    Some(other) => {
                        return Err(Error::invalid(
                            &[json!("inputs"), json!(i), json!("role")],
                            format!("role must be user or assistant, not {other:?}"),
                        ))
                    }
                }
            }
            Ok((pieces, entries))
        }
        _ => Err(Error::invalid(&[json!("inputs")], "Field required")),
    }
}

fn transcript(pieces: &[Piece]) -> Vec<Turn> {
    let mut out = Vec::new();
    let mut events = Vec::new();
    for p in pieces {
        match p {
            Piece::User { text } => {
                out.extend(turns_of(&std::mem::take(&mut events)));
                out.push(Turn::User(text.clone()));
            }
            Piece::Model { event } => events.push(event.clone()),
        }
    }
    out.extend(turns_of(&events));
    merge(out)
}

/// Turns the run's events into entries and stream events.
struct Render {
    model: String,
    agent_id: Option<String>,
    tenant: String,
    session: Option<String>,
    files: FileStore,
    outputs: Vec<Value>,
    /// Figures waiting for the next message.
    pending: Vec<Value>,
    /// The open tool execution: its entry's index in `outputs`.
    open: Option<usize>,
}

impl Render {
    fn stamp(&self, mut v: Value) -> Value {
        v["model"] = json!(self.model);
        v["agent_id"] = json!(self.agent_id);
        v
    }

    fn figure(&self, img: &Image, n: usize) -> Option<Value> {
        let data = base64::engine::general_purpose::STANDARD
            .decode(&img.data)
            .ok()?;
        let name = format!("plot_{n}.png");
        match self.files.put(
            &self.tenant,
            &name,
            &img.mime,
            &data,
            self.session.as_deref(),
        ) {
            Ok(f) => Some(json!({"type": "tool_file", "tool": TOOL, "file_id": f.id,
                                 "file_name": name, "file_type": "png"})),
            Err(e) => {
                tracing::warn!(error = %e, "cannot store a figure");
                None
            }
        }
    }

    /// The stream events of `e`, its entries kept.
    fn on(&mut self, e: &Event) -> Vec<(&'static str, Value)> {
        let now = time(chrono::Utc::now());
        let index = self.outputs.len();
        match e {
            Event::Code { code, .. } => {
                let id = runcell_engine::new_id("tool_exec");
                let arguments = json!({"code": code}).to_string();
                self.outputs.push(self.stamp(json!({
                    "object": "entry", "type": "tool.execution", "id": id, "name": TOOL,
                    "arguments": arguments, "created_at": now, "completed_at": null,
                    "info": {"code": code},
                })));
                self.open = Some(index);
                vec![(
                    "tool.execution.started",
                    self.stamp(json!({"type": "tool.execution.started", "id": id, "name": TOOL,
                                      "arguments": arguments, "output_index": index, "created_at": now})),
                )]
            }
            Event::Result { output, images, .. } => {
                let Some(at) = self.open.take() else {
                    return Vec::new();
                };
                let entry = &mut self.outputs[at];
                entry["info"]["code_output"] = json!(output);
                entry["completed_at"] = json!(now);
                let (id, info) = (entry["id"].clone(), entry["info"].clone());
                for img in images {
                    let n = self.pending.len() + 1;
                    if let Some(chunk) = self.figure(img, n) {
                        self.pending.push(chunk);
                    }
                }
                vec![(
                    "tool.execution.done",
                    json!({"type": "tool.execution.done", "id": id, "name": TOOL, "info": info,
                           "output_index": at, "created_at": now}),
                )]
            }
            Event::Text { text } => self.message(text),
        }
    }

    /// A message.output entry with `text` and the figures waiting.
    fn message(&mut self, text: &str) -> Vec<(&'static str, Value)> {
        let now = time(chrono::Utc::now());
        let index = self.outputs.len();
        let id = runcell_engine::new_id("msg");
        let files = std::mem::take(&mut self.pending);
        let content = if files.is_empty() {
            json!(text)
        } else {
            let mut chunks = Vec::new();
            if !text.is_empty() {
                chunks.push(json!({"type": "text", "text": text}));
            }
            chunks.extend(files.iter().cloned());
            Value::Array(chunks)
        };
        self.outputs.push(self.stamp(json!({
            "object": "entry", "type": "message.output", "id": id, "role": "assistant",
            "content": content, "created_at": now, "completed_at": now,
        })));
        let mut events = Vec::new();
        let delta = |content: Value, n: usize| {
            self.stamp(
                json!({"type": "message.output.delta", "id": id, "content": content,
                              "output_index": index, "content_index": n, "role": "assistant",
                              "created_at": now}),
            )
        };
        let mut n = 0;
        if !text.is_empty() {
            events.push(("message.output.delta", delta(json!(text), n)));
            n += 1;
        }
        for f in files {
            events.push(("message.output.delta", delta(f, n)));
            n += 1;
        }
        events
    }

    /// Figures no message followed.
    fn finish(&mut self) -> Vec<(&'static str, Value)> {
        if self.pending.is_empty() {
            Vec::new()
        } else {
            self.message("")
        }
    }
}

fn usage(end: &End) -> Value {
    json!({"prompt_tokens": end.input_tokens, "completion_tokens": end.output_tokens,
           "total_tokens": end.input_tokens + end.output_tokens})
}

pub(super) async fn start(
    State(state): State<AppState>,
    Caller(tenant, key): Caller,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Error> {
    let req = parse_body(body)?;
    let approval = crate::vendor::approval::mode_of_json(&req, &headers, key.as_ref())?;
    let (pieces, entries) = read_inputs(req.get("inputs"))?;
    let now = time(chrono::Utc::now());
    let store = conversation_store(&state);
    let id = store.new_id();
    let get = |k: &str| req.get(k).cloned().unwrap_or(Value::Null);
    let (record, code) = match req.get("agent_id").and_then(Value::as_str) {
        Some(agent_id) => {
            if req.get("model").is_some_and(|m| !m.is_null()) {
                return Err(Error::invalid(
                    &[json!("model")],
                    "give agent_id or model, not both",
                ));
            }
            let agent = find(&state, &tenant.0, agent_id).await?;
            let code = check_tools(agent.get("tools"))?;
            let record = Record {
                conversation: json!({"object": "conversation", "id": id, "agent_id": agent_id,
                    "created_at": now, "updated_at": now, "name": get("name"),
                    "description": get("description"), "metadata": get("metadata"),
                    "agent_version": agent.get("version")}),
                session: None,
                model: agent["model"].as_str().unwrap_or("").to_owned(),
                agent_id: Some(agent_id.to_owned()),
                instructions: agent["instructions"].as_str().unwrap_or("").to_owned(),
                max_tokens: agent
                    .pointer("/completion_args/max_tokens")
                    .and_then(Value::as_u64),
                pieces: Vec::new(),
                entries: Vec::new(),
            };
            (record, code)
        }
        None => {
            let model = required(&req, "model").map_err(|_| {
                Error::invalid(
                    &[json!("agent_id")],
                    "give agent_id, or model with its tools",
                )
            })?;
            let code = check_tools(req.get("tools"))?;
            let record = Record {
                conversation: json!({"object": "conversation", "id": id, "model": model,
                    "created_at": now, "updated_at": now,
                    "instructions": get("instructions"),
                    "tools": req.get("tools").cloned().unwrap_or_else(|| json!([])),
                    "completion_args": req.get("completion_args").cloned().unwrap_or_else(|| json!({})),
                    "name": get("name"), "description": get("description"), "metadata": get("metadata")}),
                session: None,
                model: model.to_owned(),
                agent_id: None,
                instructions: req["instructions"].as_str().unwrap_or("").to_owned(),
                max_tokens: req
                    .pointer("/completion_args/max_tokens")
                    .and_then(Value::as_u64),
                pieces: Vec::new(),
                entries: Vec::new(),
            };
            (record, code)
        }
    };
    let mut record = record;
    if code {
        record.session = Some(start_session(&state, &tenant, "mistral").await?);
    }
    let keep = req.get("store").and_then(Value::as_bool) != Some(false);
    let stream = req.get("stream").and_then(Value::as_bool) == Some(true);
    let how = How {
        keep,
        stream,
        approval,
    };
    turn(state, tenant, id, record, pieces, entries, how).await
}

pub(super) async fn append(
    State(state): State<AppState>,
    Caller(tenant, key): Caller,
    Path(id): Path<String>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Error> {
    let req = parse_body(body)?;
    let approval = crate::vendor::approval::mode_of_json(&req, &headers, key.as_ref())?;
    let mut record = load(&state, &tenant, &id).await?;
    let (pieces, entries) = read_inputs(req.get("inputs"))?;
    // A session that ended (idle, deleted) is replaced: the model still has the history.
    if let Some(s) = &record.session {
        if live_session(&state, &tenant, s).is_none() {
            record.session = Some(start_session(&state, &tenant, "mistral").await?);
        }
    }
    let keep = req.get("store").and_then(Value::as_bool) != Some(false);
    let stream = req.get("stream").and_then(Value::as_bool) == Some(true);
    let how = How {
        keep,
        stream,
        approval,
    };
    turn(state, tenant, id, record, pieces, entries, how).await
}

async fn load(state: &AppState, tenant: &Tenant, id: &str) -> Result<Record, Error> {
    load_record(&conversation_store(state), &tenant.0, id)
        .await
        .map_err(Error::internal)?
        .ok_or_else(|| Error::not_found(format!("Conversation {id} not found")))
}

/// How a turn is asked for: kept or not, streamed or not, each cell approved or not.
struct How {
    keep: bool,
    stream: bool,
    approval: runcell_store::ApprovalMode,
}

/// Runs the model's turn after `pieces`, keeps the conversation, and answers.
async fn turn(
    state: AppState,
    tenant: Tenant,
    id: String,
    mut record: Record,
    pieces: Vec<Piece>,
    entries: Vec<Value>,
    how: How,
) -> Result<Response, Error> {
    let How {
        keep,
        stream,
        approval,
    } = how;
    let Some(config) = state.vendor.clone() else {
        return Err(Error::not_found(
            "this server has no model configured: its operator starts it with `runcell serve --agent-provider`",
        ));
    };
    record.pieces.extend(pieces);
    record.entries.extend(entries);
    let turns = transcript(&record.pieces);
    if !matches!(turns.last(), Some(Turn::User(_))) {
        return Err(Error::invalid(
            &[json!("inputs")],
            "the inputs must end with the user's message",
        ));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let cancel = CancelToken::new();
    let abort = Abort {
        stop: stop.clone(),
        cancel: cancel.clone(),
        engine: state.engine.clone(),
        session: record.session.clone(),
        armed: true,
    };
    let job = CodeLoop {
        engine: state.engine.clone(),
        session: record.session.clone(),
        provider: config.provider_for(&record.model, record.max_tokens),
        system: record.instructions.clone(),
        max_steps: config.max_steps,
        timeout: RUN_TIMEOUT,
        retries: RETRIES,
        approver: crate::vendor::approval::approver_for(
            (&state.approvals, &state.engine),
            approval,
            &tenant.0,
            record.session.as_ref(),
            "mistral",
            &stop,
        ),
        stop,
        cancel,
    };
    let mut render = Render {
        model: record.model.clone(),
        agent_id: record.agent_id.clone(),
        tenant: tenant.0.clone(),
        session: record.session.clone(),
        files: file_store(&state),
        outputs: Vec::new(),
        pending: Vec::new(),
        open: None,
    };
    let store = conversation_store(&state);
    let conversation_id = id.clone();
    // Runs the turn (blocking), sending each stream event to `emit`; the response.
    let work = move |emit: &mut dyn FnMut(&'static str, Value)| -> Result<Value, Error> {
        let mut events = Vec::new();
        let end = job.run(turns, &mut |e| {
            for (kind, data) in render.on(&e) {
                emit(kind, data);
            }
            events.push(e);
        });
        let end = end.map_err(Error::from)?;
        for (kind, data) in render.finish() {
            emit(kind, data);
        }
        record
            .pieces
            .extend(events.into_iter().map(|event| Piece::Model { event }));
        record.entries.extend(render.outputs.iter().cloned());
        record.conversation["updated_at"] = json!(time(chrono::Utc::now()));
        if keep {
            save_record(&store, &tenant.0, &id, &record, record.session.as_deref())
                .map_err(Error::internal)?;
        }
        Ok(
            json!({"object": "conversation.response", "conversation_id": id,
                  "outputs": render.outputs, "usage": usage(&end)}),
        )
    };

    if !stream {
        let mut abort = abort;
        let out = tokio::task::spawn_blocking(move || work(&mut |_, _| {}))
            .await
            .map_err(Error::internal)?;
        abort.armed = false;
        return Ok(Json(out?).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::task::spawn_blocking(move || {
        let send = |kind: &str, data: Value| {
            let _ = tx.send(sse(kind, &data));
        };
        let out = work(&mut |kind, data| send(kind, data));
        match out {
            Ok(resp) => send(
                "conversation.response.done",
                json!({"type": "conversation.response.done", "usage": resp["usage"],
                       "created_at": time(chrono::Utc::now())}),
            ),
            Err(e) => send(
                "conversation.response.error",
                json!({"type": "conversation.response.error", "message": e.message,
                       "code": e.status.as_u16(), "created_at": time(chrono::Utc::now())}),
            ),
        }
    });
    struct Stream {
        rx: tokio::sync::mpsc::UnboundedReceiver<String>,
        abort: Abort,
    }
    let started = sse(
        "conversation.response.started",
        &json!({"type": "conversation.response.started", "conversation_id": conversation_id,
                "created_at": time(chrono::Utc::now())}),
    );
    let init = Stream { rx, abort };
    let rest = futures_util::stream::unfold(init, |mut s| async move {
        match s.rx.recv().await {
            Some(text) => Some((Ok::<_, std::io::Error>(Bytes::from(text)), s)),
            None => {
                // The run is over: nothing to call off.
                s.abort.armed = false;
                drop(s);
                None
            }
        }
    });
    let body = futures_util::StreamExt::chain(
        futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(started)) }),
        rest,
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .map_err(Error::internal)
}

pub(super) async fn retrieve(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    Ok(Json(load(&state, &tenant, &id).await?.conversation))
}

pub(super) async fn history(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    let r = load(&state, &tenant, &id).await?;
    Ok(Json(
        json!({"object": "conversation.history", "conversation_id": id, "entries": r.entries}),
    ))
}

pub(super) async fn list(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
) -> Result<Json<Value>, Error> {
    let store = conversation_store(&state);
    let t = tenant.0.clone();
    let files = tokio::task::spawn_blocking(move || store.list(&t))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    let mut out = Vec::new();
    for f in files {
        if let Ok(r) = load(&state, &tenant, &f.id).await {
            out.push(r.conversation);
        }
    }
    Ok(Json(Value::Array(out)))
}

pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, Error> {
    let record = load(&state, &tenant, &id).await?;
    let store = conversation_store(&state);
    let (t, i) = (tenant.0.clone(), id.clone());
    tokio::task::spawn_blocking(move || store.delete(&t, &i))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    // The conversation's sandbox goes with it.
    if let Some(s) = record
        .session
        .filter(|s| live_session(&state, &tenant, s).is_some())
    {
        let engine = state.engine.clone();
        crate::sessions::blocking(move || engine.sessions().delete(&s)).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}
