//! `POST /gemini/{v1,v1beta}/interactions` (and `GET`/`DELETE .../interactions/{id}`): the
//! Interactions API with `tools: [{"type": "code_execution"}]`. An interaction's `steps` are
//! its `user_input`, then `code_execution_call` / `code_execution_result` for each run and
//! `model_output` for the model's text. Interactions are kept (unless `store: false`), so
//! `previous_interaction_id` continues the chain: the same session, and the model sees the
//! earlier turns.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_agent::Turn;
use runcell_engine::CancelToken;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::context::{check_version, interaction_store, Caller};
use super::error::Error;
use super::generate::{RETRIES, RUN_TIMEOUT};
use crate::state::AppState;
use crate::vendor::code_loop::{merge, turns_of, CodeLoop, End, Event};
use crate::vendor::session::{live_session, load_record, save_record, start_session};
use crate::vendor::{sse, Abort};

/// One interaction of a chain: what the user said and what happened.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Exchange {
    /// The input as the model read it.
    turns: Vec<StoredTurn>,
    events: Vec<Event>,
}

/// A turn of a client-given input, kept with the chain.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum StoredTurn {
    User { text: String },
    Model { event: Event },
}

/// What a kept interaction holds.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    /// The chain up to and including this interaction.
    chain: Vec<Exchange>,
    session: Option<String>,
    interaction: Value,
}

/// The text of an input's content list (images and documents are noted, not passed).
fn content_text(content: &[Value]) -> String {
    content
        .iter()
        .map(|c| match c.get("type").and_then(Value::as_str) {
            Some("text") => c
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            Some(other) => format!(
                "[An input of type {other} was here; this server does not pass it to the model]"
            ),
            None => String::new(),
        })
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The request's `input`: a string, a list of contents, or a list of steps (a history the
/// client keeps itself).
fn read_input(input: Option<&Value>) -> Result<Vec<StoredTurn>, Error> {
    let bad = || Error::invalid("input must be a string, a list of contents or a list of steps");
    match input {
        Some(Value::String(s)) => Ok(vec![StoredTurn::User { text: s.clone() }]),
        Some(Value::Array(items)) if items.is_empty() => Err(bad()),
        Some(Value::Array(items)) => {
            let is_content = |v: &Value| {
                matches!(
                    v.get("type").and_then(Value::as_str),
                    Some("text" | "image" | "audio" | "document" | "video")
                )
            };
            if items.iter().all(is_content) {
                return Ok(vec![StoredTurn::User {
                    text: content_text(items),
                }]);
            }
            let mut turns = Vec::new();
            for (i, s) in items.iter().enumerate() {
                let str_at = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
                let content = || {
                    content_text(
                        s.get("content")
                            .and_then(Value::as_array)
                            .map(Vec::as_slice)
                            .unwrap_or(&[]),
                    )
                };
                let event = match s.get("type").and_then(Value::as_str) {
                    Some("user_input") => {
                        turns.push(StoredTurn::User { text: content() });
                        continue;
                    }
                    Some("model_output") => Event::Text { text: content() },
                    Some("code_execution_call") => Event::Code {
                        id: str_at("id"),
                        code: s
                            .pointer("/arguments/code")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                    },
                    Some("code_execution_result") => {
                        let output = match s.get("result") {
                            Some(Value::String(r)) => r.clone(),
                            Some(Value::Array(c)) => content_text(c),
                            _ => String::new(),
                        };
                        let failed = s.get("is_error").and_then(Value::as_bool) == Some(true);
                        Event::Result {
                            id: str_at("call_id"),
                            outcome: if failed {
                                crate::vendor::code_loop::Outcome::Failed
                            } else {
                                crate::vendor::code_loop::Outcome::Ok
                            },
                            model_text: output.clone(),
                            output,
                            images: Vec::new(),
                        }
                    }
                    // Thoughts and the like carry nothing another model can use.
                    Some("thought") => continue,
                    Some(other) => {
                        return Err(Error::invalid(format!(
                            "input[{i}]: steps of type {other} are not supported here"
                        )))
                    }
                    None => return Err(bad()),
                };
                turns.push(StoredTurn::Model { event });
            }
            Ok(turns)
        }
        _ => Err(bad()),
    }
}

/// The transcript of stored turns.
fn transcript(turns: &[StoredTurn]) -> Vec<Turn> {
    let mut out = Vec::new();
    let mut events = Vec::new();
    for t in turns {
        match t {
            StoredTurn::User { text } => {
                out.extend(turns_of(&std::mem::take(&mut events)));
                out.push(Turn::User(text.clone()));
            }
            StoredTurn::Model { event } => events.push(event.clone()),
        }
    }
    out.extend(turns_of(&events));
    merge(out)
}

/// The request's tools: whether code execution is among them (others are refused).
fn wants_code(tools: Option<&Value>) -> Result<bool, Error> {
    let Some(tools) = tools else {
        return Ok(false);
    };
    let list = tools
        .as_array()
        .ok_or_else(|| Error::invalid("tools must be a list"))?;
    let mut code = false;
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            Some("code_execution") => code = true,
            other => {
                return Err(Error::invalid(format!(
                "tools[{i}]: tool type {:?} is not supported here: this server runs code_execution",
                other.unwrap_or("")
            )))
            }
        }
    }
    Ok(code)
}

/// The steps an event is.
fn step_of(e: &Event) -> Value {
    match e {
        Event::Text { text } => {
            json!({"type": "model_output", "content": [{"type": "text", "text": text}]})
        }
        Event::Code { id, code } => json!({
            "type": "code_execution_call", "id": id,
            "arguments": {"code": code, "language": "python"},
        }),
        Event::Result {
            id,
            outcome,
            output,
            images,
            ..
        } => {
            let result = if images.is_empty() {
                json!(output)
            } else {
                let mut content = vec![json!({"type": "text", "text": output})];
                for img in images {
                    content.push(json!({"type": "image", "data": img.data, "mime_type": img.mime}));
                }
                Value::Array(content)
            };
            json!({
                "type": "code_execution_result", "call_id": id, "result": result,
                "is_error": *outcome != crate::vendor::code_loop::Outcome::Ok,
            })
        }
    }
}

fn user_step(t: &StoredTurn) -> Value {
    match t {
        StoredTurn::User { text } => {
            json!({"type": "user_input", "content": [{"type": "text", "text": text}]})
        }
        StoredTurn::Model { event } => step_of(event),
    }
}

pub(super) async fn create(
    State(state): State<AppState>,
    Caller(tenant, key): Caller,
    Path(version): Path<String>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Error> {
    check_version(&version)?;
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is too large",
            )
        } else {
            Error::invalid(e.body_text())
        }
    })?;
    let req: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid(format!("Invalid JSON payload received: {e}")))?;
    let approval = crate::vendor::approval::mode_of_json(&req, &headers, key.as_ref())?;
    if req.get("agent").is_some() {
        return Err(Error::invalid(
            "agents are not served here: name a model, which runs on this server's configured provider",
        ));
    }
    let stream = req.get("stream").and_then(Value::as_bool) == Some(true);
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| Error::invalid("model is required"))?
        .to_owned();
    let input = read_input(req.get("input"))?;
    let code = wants_code(req.get("tools"))?;
    let Some(config) = state.vendor.clone() else {
        return Err(Error::not_found(
            "this server has no model configured: its operator starts it with `runcell serve --agent-provider`",
        ));
    };
    let store = interaction_store(&state);
    let previous_id = req
        .get("previous_interaction_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let previous: Option<Record> = match &previous_id {
        Some(id) => Some(
            load_record(&store, &tenant.0, id)
                .await
                .map_err(Error::internal)?
                .ok_or_else(|| Error::not_found(format!("Interaction {id} was not found")))?,
        ),
        None => None,
    };
    let mut chain = previous
        .as_ref()
        .map(|p| p.chain.clone())
        .unwrap_or_default();
    let mut all: Vec<StoredTurn> = Vec::new();
    for ex in &chain {
        all.extend(ex.turns.iter().cloned());
        all.extend(
            ex.events
                .iter()
                .cloned()
                .map(|event| StoredTurn::Model { event }),
        );
    }
    all.extend(input.iter().cloned());
    let turns = transcript(&all);
    if !matches!(turns.last(), Some(Turn::User(_))) {
        return Err(Error::invalid(
            "the input must end with the user's turn: it is what the model answers",
        ));
    }
    let session = if code {
        let kept = previous
            .as_ref()
            .and_then(|p| p.session.as_deref())
            .and_then(|s| live_session(&state, &tenant, s));
        match kept {
            Some(s) => Some(s),
            None => Some(start_session(&state, &tenant, "gemini").await?),
        }
    } else {
        None
    };
    let max_tokens = req
        .pointer("/generation_config/max_output_tokens")
        .and_then(Value::as_u64);
    let stop = Arc::new(AtomicBool::new(false));
    let cancel = CancelToken::new();
    let mut abort = Abort {
        stop: stop.clone(),
        cancel: cancel.clone(),
        engine: state.engine.clone(),
        session: session.clone(),
        armed: true,
    };
    let job = CodeLoop {
        engine: state.engine.clone(),
        session: session.clone(),
        provider: config.provider_for(&model, max_tokens),
        system: req
            .get("system_instruction")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        max_steps: config.max_steps,
        timeout: RUN_TIMEOUT,
        retries: RETRIES,
        approver: crate::vendor::approval::approver_for(
            (&state.approvals, &state.engine),
            approval,
            &tenant.0,
            session.as_ref(),
            "gemini",
            &stop,
        ),
        stop,
        cancel,
    };
    let created = chrono::Utc::now();
    let id = store.new_id();
    let keep = req.get("store").and_then(Value::as_bool) != Some(false);
    let echo: Vec<(String, Value)> = [
        "tools",
        "system_instruction",
        "previous_interaction_id",
        "generation_config",
    ]
    .iter()
    .filter_map(|k| req.get(*k).map(|v| ((*k).to_owned(), v.clone())))
    .collect();
    let time =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let head = {
        let mut v =
            json!({"id": id, "status": "in_progress", "model": model, "created": time(created)});
        for (k, e) in &echo {
            v[k] = e.clone();
        }
        v
    };
    // The interaction once the run ended, kept for `previous_interaction_id` (blocking).
    let finish = {
        let (tenant, id, head) = (tenant.0.clone(), id.clone(), head.clone());
        let input = input.clone();
        move |events: Vec<Event>, end: &End| -> Result<Value, Error> {
            let mut steps: Vec<Value> = input.iter().map(user_step).collect();
            steps.extend(events.iter().map(step_of));
            let mut interaction = head;
            interaction["status"] = json!(if end.complete {
                "completed"
            } else {
                "incomplete"
            });
            interaction["updated"] = json!(time(chrono::Utc::now()));
            interaction["steps"] = json!(steps);
            interaction["usage"] = json!({"total_input_tokens": end.input_tokens,
                "total_output_tokens": end.output_tokens,
                "total_tokens": end.input_tokens + end.output_tokens});
            if keep {
                chain.push(Exchange {
                    turns: input,
                    events,
                });
                let record = Record {
                    chain,
                    session,
                    interaction: interaction.clone(),
                };
                save_record(&store, &tenant, &id, &record, record.session.as_deref())
                    .map_err(Error::internal)?;
            }
            Ok(interaction)
        }
    };

    if !stream {
        let out = tokio::task::spawn_blocking(move || {
            let mut events = Vec::new();
            let end = job.run(turns, &mut |e| events.push(e))?;
            finish(events, &end)
        })
        .await
        .map_err(Error::internal)?;
        abort.armed = false;
        return Ok(Json(out?).into_response());
    }

    // Streamed: the interaction's lifecycle events and each step's start, content and stop,
    // as the run goes; the model's text is one delta per reply.
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let first: Vec<Value> = input.iter().map(user_step).collect();
    tokio::task::spawn_blocking(move || {
        let send = |kind: &str, mut data: Value| {
            data["event_type"] = json!(kind);
            let _ = tx.send(sse(kind, &data));
        };
        send("interaction.created", json!({"interaction": head}));
        let mut index = 0;
        let mut step = |s: &Value| {
            match s["type"].as_str() {
                Some("model_output") => {
                    send(
                        "step.start",
                        json!({"index": index, "step": {"type": "model_output", "content": []}}),
                    );
                    for c in s["content"].as_array().into_iter().flatten() {
                        send("step.delta", json!({"index": index, "delta": c}));
                    }
                }
                _ => send("step.start", json!({"index": index, "step": s})),
            }
            send("step.stop", json!({"index": index}));
            index += 1;
        };
        for s in &first {
            step(s);
        }
        let mut events = Vec::new();
        let end = job.run(turns, &mut |e| {
            step(&step_of(&e));
            events.push(e);
        });
        match end
            .map_err(Error::from)
            .and_then(|end| finish(events, &end))
        {
            Ok(interaction) => send("interaction.completed", json!({"interaction": interaction})),
            Err(e) => send("error", json!({"error": e.object()})),
        }
        let _ = tx.send("data: [DONE]\n\n".to_owned());
    });
    struct Stream {
        rx: tokio::sync::mpsc::UnboundedReceiver<String>,
        abort: Abort,
    }
    let body = futures_util::stream::unfold(Stream { rx, abort }, |mut s| async move {
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
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .map_err(Error::internal)
}

pub(super) async fn retrieve(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path((version, id)): Path<(String, String)>,
) -> Result<Json<Value>, Error> {
    check_version(&version)?;
    let record: Option<Record> = load_record(&interaction_store(&state), &tenant.0, &id)
        .await
        .map_err(Error::internal)?;
    match record {
        Some(r) => Ok(Json(r.interaction)),
        None => Err(Error::not_found(format!("Interaction {id} was not found"))),
    }
}

pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path((version, id)): Path<(String, String)>,
) -> Result<Json<Value>, Error> {
    check_version(&version)?;
    let store = interaction_store(&state);
    let t = tenant.0.clone();
    let i = id.clone();
    let gone = tokio::task::spawn_blocking(move || store.delete(&t, &i))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    if !gone {
        return Err(Error::not_found(format!("Interaction {id} was not found")));
    }
    Ok(Json(json!({})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_of_steps_becomes_the_transcript() {
        let input = json!([
            {"type": "user_input", "content": [{"type": "text", "text": "fib?"}]},
            {"type": "code_execution_call", "id": "c1", "arguments": {"code": "print(55)", "language": "python"}},
            {"type": "code_execution_result", "call_id": "c1", "result": "55\n"},
            {"type": "model_output", "content": [{"type": "text", "text": "55"}]},
            {"type": "user_input", "content": [{"type": "text", "text": "doubled?"}]},
        ]);
        let turns = transcript(&read_input(Some(&input)).expect("input"));
        assert_eq!(turns.len(), 5, "{turns:#?}");
        assert!(matches!(&turns[1], Turn::Assistant(r) if r.calls[0].id == "c1"));
        assert!(matches!(&turns[2], Turn::Tools(r) if r[0].text == "55\n"));
        assert!(matches!(&turns[4], Turn::User(t) if t == "doubled?"));
        let text = read_input(Some(&json!([{"type": "text", "text": "hi"}]))).expect("input");
        assert!(matches!(&text[..], [StoredTurn::User { text }] if text == "hi"));
        assert!(read_input(Some(&json!(42))).is_err());
        assert!(wants_code(Some(&json!([{"type": "google_search"}]))).is_err());
    }
}
