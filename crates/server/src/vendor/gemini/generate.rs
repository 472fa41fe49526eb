//! `POST /gemini/{v1,v1beta}/models/{model}:generateContent` and `:streamGenerateContent`
//! (`?alt=sse` as the SDKs ask: one `data:` event per part; without it, one JSON array): the
//! request's `contents` are the conversation, `tools: [{"codeExecution": {}}]` offers the
//! model Python, and each run comes back as an `executableCode` part, a
//! `codeExecutionResult` part and one `inlineData` PNG part per figure.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use runcell_agent::{ModelReply, ToolReply, ToolUse, Turn};
use runcell_engine::CancelToken;
use serde_json::{json, Value};

use super::context::{chat_store, check_version, history_key, Caller};
use super::error::Error;
use crate::state::{AppState, Tenant};
use crate::vendor::code_loop::{merge, CodeLoop, End, Event, PYTHON};
use crate::vendor::session::{live_session, start_session};
use crate::vendor::Abort;

/// Each run's deadline, as Gemini's code execution has it.
pub(super) const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// Failed runs the model may retry after, as Gemini's code execution has it.
pub(super) const RETRIES: usize = 5;

/// `field` of `v` in the API's camelCase or the SDK dicts' snake_case.
pub(super) fn field<'a>(v: &'a Value, camel: &str, snake: &str) -> Option<&'a Value> {
    v.get(camel).or_else(|| v.get(snake))
}

/// Whether the request's tools ask for code execution; other tools are refused.
pub(super) fn wants_code(tools: Option<&Value>) -> Result<bool, Error> {
    let mut code = false;
    let Some(tools) = tools else {
        return Ok(false);
    };
    let list = tools
        .as_array()
        .ok_or_else(|| Error::invalid("tools must be a list"))?;
    for (i, t) in list.iter().enumerate() {
        let obj = t
            .as_object()
            .ok_or_else(|| Error::invalid(format!("tools[{i}] must be an object")))?;
        for (k, v) in obj {
            match k.as_str() {
                "codeExecution" | "code_execution" if v.is_object() || v.is_null() => code = true,
                other => {
                    return Err(Error::invalid(format!(
                        "tools[{i}].{other} is not supported here: this server runs the code_execution tool"
                    )))
                }
            }
        }
    }
    Ok(code)
}

/// The text of a `systemInstruction` (a Content, or a plain string).
pub(super) fn system_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(c) => c
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        None => String::new(),
    }
}

/// The contents as the model's transcript: the user's text, the model's text, and each
/// `executableCode` with the `codeExecutionResult` after it as a python call and its result.
/// A file the user sent inline, as the code finds it in its working directory.
#[derive(Debug, Clone, PartialEq)]
struct Attachment {
    /// `input_file_N.EXT`, N counting the conversation's inline files from 0.
    name: String,
    mime: String,
    data: Vec<u8>,
}

/// The extension a file of `mime` gets.
fn extension(mime: &str) -> &'static str {
    match mime {
        "text/csv" => "csv",
        "text/plain" => "txt",
        "text/html" => "html",
        "text/markdown" => "md",
        "application/json" => "json",
        "application/pdf" => "pdf",
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet" => "xlsx",
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => "bin",
    }
}

/// Every inline file of the users' turns, in order (a history sent again names the same
/// files the same way).
fn attachments(contents: &[Value]) -> Result<Vec<Attachment>, Error> {
    let mut out = Vec::new();
    for c in contents
        .iter()
        .filter(|c| c.get("role").and_then(Value::as_str).unwrap_or("user") == "user")
    {
        for p in c
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(d) = field(p, "inlineData", "inline_data") else {
                continue;
            };
            let mime = field(d, "mimeType", "mime_type")
                .and_then(Value::as_str)
                .unwrap_or("application/octet-stream")
                .to_owned();
            let b64 = d.get("data").and_then(Value::as_str).unwrap_or("");
            let data = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| Error::invalid(format!("inlineData.data is not base64: {e}")))?;
            let name = format!("input_file_{}.{}", out.len(), extension(&mime));
            out.push(Attachment { name, mime, data });
        }
    }
    Ok(out)
}

/// Writes each attachment into the session's working directory unless a file of its name
/// is there (the code may have changed it since).
fn place(
    engine: &runcell_engine::Engine,
    session: &str,
    files: &[Attachment],
) -> Result<(), runcell_engine::EngineError> {
    for f in files {
        match engine.read_file(session, &f.name) {
            Ok(_) => {}
            Err(runcell_engine::EngineError::NotFound(_)) => {
                engine.upload_file(session, &f.name, &f.data)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The contents as the model's transcript (see the module's doc); an inline file is named
/// where it was sent, as a file of the code's working directory when there is code to read
/// it.
fn transcript(contents: &[Value], code: bool) -> Result<Vec<Turn>, Error> {
    let mut turns = Vec::new();
    let mut n = 0;
    let mut files = 0;
    for (i, c) in contents.iter().enumerate() {
        let parts = c
            .get("parts")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::invalid(format!("contents[{i}].parts must be a list")))?;
        let role = c.get("role").and_then(Value::as_str).unwrap_or("user");
        match role {
            "user" => {
                let mut text = Vec::new();
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        text.push(t.to_owned());
                    } else if let Some(d) = field(p, "inlineData", "inline_data") {
                        let mime = field(d, "mimeType", "mime_type")
                            .and_then(Value::as_str)
                            .unwrap_or("application/octet-stream");
                        let name = format!("input_file_{files}.{}", extension(mime));
                        files += 1;
                        text.push(if code {
                            format!("[The user attached the file {name} ({mime}): it is in the working directory of the python tool]")
                        } else {
                            format!("[An attachment ({mime}) was here; without the code execution tool this server does not pass it to the model]")
                        });
                    } else if field(p, "functionResponse", "function_response").is_some() {
                        return Err(Error::invalid(format!(
                            "contents[{i}]: function responses are not supported here"
                        )));
                    }
                }
                turns.push(Turn::User(text.join("\n")));
            }
            "model" => {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        if p.get("thought").and_then(Value::as_bool) != Some(true) {
                            turns.push(Turn::Assistant(ModelReply {
                                text: t.to_owned(),
                                calls: Vec::new(),
                                raw: Value::Null,
                            }));
                        }
                    } else if let Some(e) = field(p, "executableCode", "executable_code") {
                        n += 1;
                        let code = e.get("code").and_then(Value::as_str).unwrap_or("");
                        let input = json!({"code": code});
                        turns.push(Turn::Assistant(ModelReply {
                            text: String::new(),
                            calls: vec![ToolUse {
                                id: format!("code_{n}"),
                                name: PYTHON.into(),
                                arguments: input.to_string(),
                                input,
                                bad_arguments: None,
                            }],
                            raw: Value::Null,
                        }));
                    } else if let Some(r) = field(p, "codeExecutionResult", "code_execution_result")
                    {
                        let output = r.get("output").and_then(Value::as_str).unwrap_or("");
                        let outcome = r.get("outcome").and_then(Value::as_str).unwrap_or("");
                        turns.push(Turn::Tools(vec![ToolReply {
                            id: format!("code_{n}"),
                            name: PYTHON.into(),
                            text: if output.is_empty() {
                                "(no output)".into()
                            } else {
                                output.to_owned()
                            },
                            images: Vec::new(),
                            is_error: outcome != "OUTCOME_OK",
                        }]));
                    }
                }
            }
            other => {
                return Err(Error::invalid(format!(
                    "contents[{i}].role must be user or model, not {other:?}"
                )))
            }
        }
    }
    Ok(merge(turns))
}

/// The parts an event is.
pub(super) fn parts_of(e: &Event) -> Vec<Value> {
    match e {
        Event::Text { text } => vec![json!({"text": text})],
        Event::Code { code, .. } => {
            vec![json!({"executableCode": {"language": "PYTHON", "code": code}})]
        }
        Event::Result {
            outcome,
            output,
            images,
            ..
        } => {
            let mut parts = vec![
                json!({"codeExecutionResult": {"outcome": outcome.gemini(), "output": output}}),
            ];
            for img in images {
                parts.push(json!({"inlineData": {"mimeType": img.mime, "data": img.data}}));
            }
            parts
        }
    }
}

fn finish_reason(end: &End) -> &'static str {
    if end.complete {
        "STOP"
    } else {
        "OTHER"
    }
}

fn usage(end: &End) -> Value {
    json!({"promptTokenCount": end.input_tokens, "candidatesTokenCount": end.output_tokens,
           "totalTokenCount": end.input_tokens + end.output_tokens})
}

/// A GenerateContentResponse of `parts`, with the end when there is one.
fn response(parts: Vec<Value>, end: Option<&End>, model: &str, id: &str) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    let mut v = json!({"candidates": [], "modelVersion": model, "responseId": id});
    if let Some(end) = end {
        candidate["finishReason"] = json!(finish_reason(end));
        v["usageMetadata"] = usage(end);
    }
    v["candidates"] = json!([candidate]);
    v
}

/// Where a `generateContent` conversation runs: the session its history was left in, or a
/// new one.
async fn session_for(state: &AppState, tenant: &Tenant, before: &[Value]) -> Result<String, Error> {
    let store = chat_store(state);
    let key = history_key(before);
    let (s, t) = (store.clone(), tenant.0.clone());
    let found = tokio::task::spawn_blocking(move || s.read(&t, &key))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    let known = found
        .and_then(|(_, data)| serde_json::from_slice::<Value>(&data).ok())
        .and_then(|v| v["session"].as_str().map(str::to_owned))
        .and_then(|s| live_session(state, tenant, &s));
    match known {
        Some(s) => Ok(s),
        None => Ok(start_session(state, tenant, "gemini").await?),
    }
}

/// Keeps `session` under the key of `contents` followed by the reply `parts`.
fn remember(
    state: &AppState,
    tenant: &Tenant,
    contents: &[Value],
    parts: &[Value],
    session: &str,
) -> Result<(), Error> {
    let mut all = contents.to_vec();
    all.push(json!({"role": "model", "parts": parts}));
    let key = history_key(&all);
    let data = json!({"session": session}).to_string();
    chat_store(state)
        .put_as(
            &tenant.0,
            &key,
            "chat.json",
            "application/json",
            data.as_bytes(),
            Some(session),
            None,
        )
        .map(|_| ())
        .map_err(Error::internal)
}

pub(super) async fn call(
    State(state): State<AppState>,
    Caller(tenant, key): Caller,
    Path((version, call)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, Error> {
    check_version(&version)?;
    let (model, method) = call
        .rsplit_once(':')
        .ok_or_else(|| Error::not_found(format!("models/{call}: no such method")))?;
    let stream = match method {
        "generateContent" => false,
        "streamGenerateContent" => true,
        other => {
            return Err(Error::not_found(format!(
            "models/{model}:{other}: this server serves generateContent and streamGenerateContent"
        )))
        }
    };
    let sse = query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
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
    let contents = req
        .get("contents")
        .and_then(Value::as_array)
        .cloned()
        .filter(|c| !c.is_empty())
        .ok_or_else(|| Error::invalid("contents is not specified"))?;
    let code = wants_code(req.get("tools"))?;
    let approval = crate::vendor::approval::mode_of_json(&req, &headers, key.as_ref())?;
    let turns = transcript(&contents, code)?;
    let files = if code {
        attachments(&contents)?
    } else {
        Vec::new()
    };
    if !matches!(turns.last(), Some(Turn::User(_))) {
        return Err(Error::invalid(
            "the last content must be the user's: it is what the model answers",
        ));
    }
    let Some(config) = state.vendor.clone() else {
        return Err(Error::not_found(
            "this server has no model configured: its operator starts it with `runcell serve --agent-provider`",
        ));
    };
    let max_tokens = req
        .get("generationConfig")
        .or_else(|| req.get("generation_config"))
        .and_then(|g| field(g, "maxOutputTokens", "max_output_tokens"))
        .and_then(Value::as_u64);
    let model = model.strip_prefix("models/").unwrap_or(model).to_owned();

    // The session the history before the new user turn was left in.
    let session = if code {
        let before = contents
            .iter()
            .rposition(|c| c.get("role").and_then(Value::as_str) == Some("model"))
            .map_or(&contents[..0], |at| &contents[..=at]);
        let session = session_for(&state, &tenant, before).await?;
        let (engine, s) = (state.engine.clone(), session.clone());
        crate::sessions::blocking(move || place(&engine, &s, &files)).await?;
        Some(session)
    } else {
        None
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
    let job = CodeLoop {
        engine: state.engine.clone(),
        session: session.clone(),
        provider: config.provider_for(&model, max_tokens),
        system: system_text(
            req.get("systemInstruction")
                .or_else(|| req.get("system_instruction")),
        ),
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
    let id = runcell_engine::new_id("resp");
    let finish = {
        let (state, tenant, session) = (state.clone(), tenant.clone(), session.clone());
        move |parts: &[Value]| -> Result<(), Error> {
            match &session {
                Some(s) => remember(&state, &tenant, &contents, parts, s),
                None => Ok(()),
            }
        }
    };

    if !stream || !sse {
        let (parts, end) = tokio::task::spawn_blocking(move || {
            let mut parts = Vec::new();
            let end = job.run(turns, &mut |e| parts.extend(parts_of(&e)));
            let end = end.map_err(Error::from).and_then(|end| {
                finish(&parts)?;
                Ok(end)
            });
            (parts, end)
        })
        .await
        .map_err(Error::internal)?;
        abort.armed = false;
        let end = end?;
        if stream {
            // Without `alt=sse` the stream is one JSON array of chunks.
            let mut chunks: Vec<Value> = parts
                .into_iter()
                .map(|p| response(vec![p], None, &model, &id))
                .collect();
            chunks.push(response(Vec::new(), Some(&end), &model, &id));
            return Ok(Json(Value::Array(chunks)).into_response());
        }
        return Ok(Json(response(parts, Some(&end), &model, &id)).into_response());
    }

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::task::spawn_blocking({
        let (model, id) = (model.clone(), id.clone());
        move || {
            let mut all = Vec::new();
            let end = job.run(turns, &mut |e| {
                for p in parts_of(&e) {
                    all.push(p.clone());
                    let chunk = response(vec![p], None, &model, &id);
                    let _ = tx.send(format!("data: {chunk}\r\n\r\n"));
                }
            });
            let last = end.map_err(Error::from).and_then(|end| {
                finish(&all)?;
                Ok(response(Vec::new(), Some(&end), &model, &id))
            });
            let last = match last {
                Ok(v) => v,
                Err(e) => json!({"error": e.object()}),
            };
            let _ = tx.send(format!("data: {last}\r\n\r\n"));
        }
    });
    struct Stream {
        rx: tokio::sync::mpsc::UnboundedReceiver<String>,
        abort: Abort,
    }
    let init = Stream { rx, abort };
    let body = futures_util::stream::unfold(init, |mut s| async move {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vendor::code_loop::Outcome;

    #[test]
    fn code_and_its_result_become_a_call_and_its_reply() {
        let contents = vec![
            json!({"role": "user", "parts": [{"text": "fib?"}]}),
            json!({"role": "model", "parts": [
                {"executableCode": {"language": "PYTHON", "code": "print(55)"}},
                {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "55\n"}},
                {"text": "It is 55."}]}),
            json!({"role": "user", "parts": [{"text": "and doubled?"}]}),
        ];
        let turns = transcript(&contents, true).expect("turns");
        assert_eq!(turns.len(), 5, "{turns:#?}");
        assert!(matches!(&turns[1], Turn::Assistant(r) if r.calls[0].input["code"] == "print(55)"));
        assert!(matches!(&turns[2], Turn::Tools(r) if r[0].text == "55\n" && r[0].id == "code_1"));
        assert!(matches!(&turns[3], Turn::Assistant(r) if r.text == "It is 55."));
        assert!(matches!(&turns[4], Turn::User(t) if t == "and doubled?"));
    }

    #[test]
    fn only_code_execution_is_served() {
        assert!(wants_code(Some(&json!([{"codeExecution": {}}]))).expect("ok"));
        assert!(wants_code(Some(&json!([{"code_execution": {}}]))).expect("ok"));
        assert!(!wants_code(None).expect("ok"));
        let e = wants_code(Some(&json!([{"googleSearch": {}}]))).expect_err("refused");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("googleSearch"), "{}", e.message);
    }

    #[test]
    fn a_failed_run_with_a_figure_is_two_parts_and_the_png() {
        let parts = parts_of(&Event::Result {
            id: "c".into(),
            outcome: Outcome::DeadlineExceeded,
            output: "".into(),
            model_text: "".into(),
            images: vec![crate::vendor::code_loop::Image {
                mime: "image/png".into(),
                data: "iVBO".into(),
            }],
        });
        assert_eq!(
            parts[0]["codeExecutionResult"]["outcome"],
            "OUTCOME_DEADLINE_EXCEEDED"
        );
        assert_eq!(parts[1]["inlineData"]["mimeType"], "image/png");
    }
}
