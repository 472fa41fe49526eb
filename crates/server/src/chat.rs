//! `/v1/chat`: the agent loop (DESIGN.md §8) run server-side for the web page's chat. The
//! question and its files arrive as multipart; the loop runs in a new session of the caller's
//! tenant (so every cell is in its audit log, and the files it wrote stay downloadable through
//! `/v1/sessions/{id}/files` until the session expires); each step streams out as NDJSON.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Multipart, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_agent::{Agent, AgentError, AgentOptions, Gate, StepEvent, StopReason};
use runcell_engine::tools::ToolCall;
use runcell_engine::{CreateSession, InputFile};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::sessions::blocking;
use crate::state::{AppState, ChatConfig, Principal, Tenant};

/// What the page needs to know before offering the chat.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChatInfo {
    /// Whether a model provider is configured.
    pub enabled: bool,
    /// `openai` or `anthropic`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<usize>,
    /// Why the chat is off, and how an operator turns it on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'static str>,
}

const NOT_CONFIGURED: &str = "chat is not configured on this server: start it with \
`runcell serve --agent-provider openai|anthropic|gemini` (and the provider's key in OPENAI_API_KEY, \
ANTHROPIC_API_KEY or GEMINI_API_KEY)";

#[utoipa::path(get, path = "/v1/chat", tag = "chat",
    responses((status = 200, body = ChatInfo, description = "whether the chat is on, and with which model")))]
pub async fn chat_info(State(state): State<AppState>, _tenant: Tenant) -> Json<ChatInfo> {
    Json(match &state.chat {
        Some(c) => ChatInfo {
            enabled: true,
            provider: Some(c.provider.kind.name()),
            model: Some(c.provider.model.clone()),
            max_steps: Some(c.max_steps),
            message: None,
        },
        None => ChatInfo {
            enabled: false,
            provider: None,
            model: None,
            max_steps: None,
            message: Some(NOT_CONFIGURED),
        },
    })
}

/// The question, the files and the `approval` part (`never` or `always`, checked later with
/// the key's default), from the multipart body.
async fn read_form(mut form: Multipart) -> ApiResult<(String, Vec<InputFile>, Option<String>)> {
    let mut question = None;
    let mut approve = None;
    let mut files = Vec::new();
    loop {
        let Some(field) = form.next_field().await.map_err(ApiError::multipart)? else {
            break;
        };
        let file_name = field.file_name().map(str::to_owned);
        let name = field.name().map(str::to_owned);
        let data = field.bytes().await.map_err(ApiError::multipart)?;
        match (file_name, name.as_deref()) {
            (Some(path), _) if !path.is_empty() => files.push(InputFile {
                path,
                content: data.to_vec(),
            }),
            (_, Some("question")) => {
                question = Some(
                    String::from_utf8(data.to_vec())
                        .map_err(|_| ApiError::invalid("the question is not UTF-8 text"))?,
                )
            }
            (_, Some("approval")) => {
                approve = Some(String::from_utf8_lossy(&data).into_owned());
            }
            (_, other) => {
                return Err(ApiError::invalid(format!(
                    "unexpected part {:?}: send `question`, `approval` and file parts",
                    other.unwrap_or("")
                )))
            }
        }
    }
    let question = question
        .filter(|q| !q.trim().is_empty())
        .ok_or_else(|| ApiError::invalid("the question is empty"))?;
    Ok((question, files, approve))
}

fn agent_error(e: AgentError) -> ApiError {
    match e {
        AgentError::Engine(e) => e.into(),
        other => ApiError::upstream(runcell_engine::error_chain(&other)),
    }
}

/// One NDJSON line.
fn line(v: serde_json::Value) -> bytes::Bytes {
    let mut s = v.to_string();
    s.push('\n');
    bytes::Bytes::from(s)
}

/// What a tool call runs, as a person reads it: the code, the command, or the edit.
fn call_source(name: &str, input: &serde_json::Value, raw: &str) -> String {
    match ToolCall::parse(name, input.clone()) {
        Ok(ToolCall::Python(i)) => i.code,
        Ok(ToolCall::Bash(i)) => i.command,
        Ok(ToolCall::TextEditor(i)) => format!("{} {}", i.command, i.path),
        Err(_) => raw.to_owned(),
    }
}

#[utoipa::path(post, path = "/v1/chat", tag = "chat",
    request_body(content_type = "multipart/form-data", description = "a `question` text part, an optional `approval` part (`never` or `always`: each cell waits for `POST /v1/approvals/{id}`; also accepted as the `runcell-approval` header; when neither says, the key's default, else `never`) and any number of file parts, uploaded into /workspace under their file names"),
    responses(
        (status = 200, content_type = "application/x-ndjson", description = "events as the loop runs: `session`, then per step `model`, `tool_call`, (with an `approval` part `always`) `approval` with the pending cell to answer at `POST /v1/approvals/{id}`, `tool_result`; last `end` with the answer and the files produced, or with `status` and `error`"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: not a multipart body, an empty question, an unexpected part, or an `approval` other than `never` / `always`"),
        (status = 403, body = ErrorBody, description = "`forbidden`: `approval: never` with a key whose default is `always` (a floor a request cannot lower)"),
        (status = 404, body = ErrorBody, description = "no model provider is configured"),
        (status = 409, body = ErrorBody, description = "the session the loop ran in ended under it"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: a file over the size limit"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed; see `Retry-After`")))]
pub async fn chat(
    State(state): State<AppState>,
    who: Principal,
    headers: axum::http::HeaderMap,
    form: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<Response> {
    let tenant = who.tenant;
    let Some(config) = state.chat.clone() else {
        return Err(ApiError::new(
            crate::error::ErrorCode::NotFound,
            NOT_CONFIGURED,
        ));
    };
    let form = form.map_err(|e| ApiError::invalid(e.body_text()))?;
    let (question, files, approve) = read_form(form).await?;
    // The part, or the runcell-approval header, or the key's default (a floor), as on the
    // vendor endpoints.
    let mode = crate::vendor::approval::mode(approve.as_deref(), &headers, who.key.as_ref())?;
    let approvals = (mode == runcell_store::ApprovalMode::Always).then(|| state.approvals.clone());

    // The session is the caller's, like any other: listed, audited, openable as a notebook.
    let engine = state.engine.clone();
    let owner = tenant.0.clone();
    let info = blocking(move || {
        engine.sessions().create(CreateSession {
            owner,
            metadata: [("source".to_owned(), "chat".to_owned())].into(),
            ..CreateSession::default()
        })
    })
    .await?;

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<bytes::Bytes>();
    let _ = tx.send(line(json!({"type": "session", "session": info})));
    let engine = state.engine.clone();
    let session = info.id.clone();
    let job = Job {
        engine,
        config,
        tenant,
        session,
        question,
        files,
        approvals,
    };
    tokio::task::spawn_blocking(move || run(job, tx));

    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok::<_, std::io::Error>(chunk), rx))
    });
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| ApiError::internal(e).into_response()))
}

/// One chat run.
struct Job {
    engine: runcell_engine::Engine,
    config: Arc<ChatConfig>,
    tenant: Tenant,
    session: String,
    question: String,
    files: Vec<InputFile>,
    /// Each cell waits for a person's decision (`approval: always`).
    approvals: Option<Arc<crate::pending::Approvals>>,
}

/// The loop itself, on a blocking thread: every step becomes an event, the outcome the last.
fn run(job: Job, tx: tokio::sync::mpsc::UnboundedSender<bytes::Bytes>) {
    let Job {
        engine,
        config,
        tenant,
        session,
        question,
        files,
        approvals,
    } = job;
    // A client that went away stops the loop before its next model call (the cell running
    // now finishes; no more of the provider's tokens are spent).
    let stop = Arc::new(AtomicBool::new(false));
    let send = |v: serde_json::Value| {
        if tx.send(line(v)).is_err() {
            stop.store(true, Ordering::SeqCst);
        }
    };
    let by = format!("api:{}", tenant.0);
    let mut decide = approvals.map(|a| {
        let tx = tx.clone();
        crate::pending::gate_for(
            a,
            crate::pending::Place {
                tenant: tenant.0.clone(),
                session: session.clone(),
                source: "chat",
            },
            stop.clone(),
            move |p| {
                let _ = tx.send(line(json!({"type": "approval", "approval": p})));
            },
        )
    });
    let gate = decide.as_mut().map(|d| Gate { by, decide: d });
    let opts = AgentOptions {
        max_steps: config.max_steps,
        owner: tenant.0,
        session: Some(session.clone()),
        stop: Some(stop.clone()),
        ..AgentOptions::default()
    };
    let mut on_step = |event: StepEvent<'_>| match event {
        // The page shows the model's steps; what it was told of the MCP tools is the prompt's.
        StepEvent::ToolsListed { .. } => {}
        StepEvent::Model { step, reply } => {
            if !reply.calls.is_empty() && !reply.text.trim().is_empty() {
                send(json!({"type": "model", "step": step, "text": reply.text}));
            }
        }
        StepEvent::ToolCall { step, call } => send(json!({
            "type": "tool_call", "step": step, "id": call.id, "tool": call.name,
            "code": call_source(&call.name, &call.input, &call.arguments),
        })),
        StepEvent::ToolResult { step, call, output } => send(json!({
            "type": "tool_result", "step": step, "id": call.id, "tool": call.name,
            "is_error": output.is_error, "text": output.text, "execution": output.execution,
        })),
    };
    let outcome = Agent::new(engine.clone(), config.provider.clone())
        .and_then(|agent| agent.run_gated(&question, &files, &opts, &mut on_step, gate));
    let end = match outcome {
        Ok(outcome) => {
            let listing = engine.list_files(&session, "").unwrap_or_default();
            let produced: Vec<_> = outcome
                .files_produced
                .iter()
                .filter_map(|f| listing.iter().find(|e| e.path == f.path))
                .collect();
            json!({
                "type": "end",
                "answer": outcome.answer,
                "stop": match outcome.stop {
                    StopReason::Answer => "answer",
                    StopReason::MaxSteps => "max_steps",
                    StopReason::TooManyFailures => "too_many_failures",
                },
                "steps": outcome.steps,
                "session_id": session,
                "files": produced,
            })
        }
        Err(AgentError::Stopped) => {
            tracing::info!(%session, "chat client went away; the loop stopped");
            return;
        }
        Err(e) => {
            let (status, body) = agent_error(e).parts();
            json!({"type": "end", "status": status.as_u16(), "error": body.error})
        }
    };
    send(end);
}
