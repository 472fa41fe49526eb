//! `/v1/sessions`: create, list, get, delete, interrupt, restart, execute (JSON or NDJSON
//! stream), commands.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_engine::{
    CancelToken, CommandOutput, CreateSession, Engine, ExecEvent, Execution, Language,
    LimitsRequest, NetworkPolicy, SessionInfo, Start,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{ApiJson, Path};
use crate::state::{AppState, Principal, Tenant};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// `python` (default).
    pub language: Option<Language>,
    #[serde(default, deserialize_with = "crate::extract::object")]
    pub limits: Option<LimitsRequest>,
    /// Extra environment variables for the kernel: names without `=`, no NUL byte anywhere,
    /// at most 256 variables of 32 KiB each (`NAME=value`), 256 KiB in all.
    #[schema(value_type = Option<BTreeMap<EnvName, EnvValue>>, inline)]
    pub env: Option<BTreeMap<String, String>>,
    /// Free-form labels, filterable with `?metadata.k=v`.
    pub metadata: Option<BTreeMap<String, String>>,
    /// `zygote` (default for Python: forked from the preloaded zygote, fast) or `cold` (an
    /// interpreter of its own: its own address-space layout and hash secret).
    pub start: Option<Start>,
    /// `{"type":"disabled"}` (default: no network at all) or an allowlist within what the
    /// server allows (`serve --egress-allow`; beyond it: 400 `limit_exceeded`).
    #[serde(default, deserialize_with = "crate::extract::object")]
    pub network: Option<NetworkPolicy>,
}

/// An environment variable's name, for the document.
#[derive(ToSchema)]
#[schema(pattern = r"^[^=\x00]+$")]
#[allow(dead_code, reason = "the OpenAPI shape of env's names")]
pub struct EnvName(String);

/// An environment variable's value, for the document.
#[derive(ToSchema)]
#[schema(pattern = r"^[^\x00]*$")]
#[allow(dead_code, reason = "the OpenAPI shape of env's values")]
pub struct EnvValue(String);

#[derive(Debug, Serialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteRequest {
    pub code: String,
    /// Per-execution time limit (seconds); defaults to the session's `exec_timeout_s`. Time
    /// the code spends waiting for tool answers does not count (up to an hour in all).
    pub timeout_s: Option<f64>,
    /// Client tools the code may call (docs/tools.md): `from runcell_tools import NAME` in
    /// Python, `await tools.NAME({...})` in JavaScript. At most 128, names Python
    /// identifiers, each at most 64 KiB as JSON.
    pub tools: Option<Vec<runcell_engine::bridge::ToolSpec>>,
    /// How long each tool call waits for its answer (seconds, default 270, at most 3600);
    /// past it the call raises `runcell_tools.ToolTimeout` in the code.
    pub tool_timeout_s: Option<f64>,
}

/// The execute request's tools, checked, for the engine; None without any.
fn exec_tools(
    state: &AppState,
    req: &mut ExecuteRequest,
    owner: &str,
    session: &SessionInfo,
    events: Option<crate::tool_calls::EventTx>,
) -> ApiResult<
    Option<(
        runcell_engine::bridge::ExecTools,
        std::sync::Arc<crate::tool_calls::Run>,
    )>,
> {
    use runcell_engine::bridge::{
        ExecTools, ToolSpec, ToolSpecError, DEFAULT_CALL_TIMEOUT, MAX_CALL_TIMEOUT,
    };
    let call_timeout = match req.tool_timeout_s {
        None => DEFAULT_CALL_TIMEOUT,
        Some(s) if s > 0.0 && s <= MAX_CALL_TIMEOUT.as_secs_f64() => Duration::from_secs_f64(s),
        Some(s) => {
            return Err(ApiError::new(
                crate::error::ErrorCode::LimitExceeded,
                format!(
                    "tool_timeout_s must be over 0 and at most {} (got {s})",
                    MAX_CALL_TIMEOUT.as_secs()
                ),
            ))
        }
    };
    let Some(specs) = req.tools.take().filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    ToolSpec::check_all(&specs).map_err(|e| match e {
        ToolSpecError::Twice(_) => ApiError::new(crate::error::ErrorCode::Conflict, e.to_string()),
        ToolSpecError::Invalid(_) => ApiError::invalid(e.to_string()),
    })?;
    let run = crate::tool_calls::Run::new(
        state.tool_calls.clone(),
        owner.to_owned(),
        session.id.clone(),
        session.language,
        events,
    );
    let tools = ExecTools {
        specs,
        client: Some(run.dispatch()),
        mcp: None,
        mcp_specs: Vec::new(),
        call_timeout,
        runtime: tokio::runtime::Handle::current(),
    };
    Ok(Some((tools, run)))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommandRequest {
    /// Run as `bash -c COMMAND`: no program argument can hold a NUL byte.
    #[schema(pattern = r"^[^\x00]*$")]
    pub command: String,
    pub timeout_s: Option<f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Interrupted {
    /// Whether an execution was running and got the interrupt.
    pub interrupted: bool,
}

use crate::owned::lookup;
pub(crate) use crate::owned::owned;

/// A request's `timeout_s`, checked to be a duration at all; the engine holds it to the
/// server's maximum (`serve --max-exec-timeout-s`: 400 `limit_exceeded` past it).
pub(crate) fn timeout(t: Option<f64>) -> ApiResult<Option<Duration>> {
    match t {
        None => Ok(None),
        // Rounded up to the next nanosecond, never down: a time a hair over the maximum
        // (3600.0000000000005) is over it, and a positive time below a nanosecond is still a
        // positive (tiny) limit, not zero.
        Some(s) if s > 0.0 => Duration::try_from_secs_f64(s)
            .map(|d| {
                Some(if d.as_secs_f64() < s {
                    d + Duration::from_nanos(1)
                } else {
                    d
                })
            })
            .map_err(|_| {
                ApiError::invalid(format!(
                    "timeout_s {s} is not a number of seconds runcell can wait"
                ))
            }),
        Some(_) => Err(ApiError::invalid(
            "timeout_s must be a positive number of seconds",
        )),
    }
}

/// Runs engine work on the blocking pool and maps its error.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, runcell_engine::EngineError> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::from)
}

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions",
    request_body = CreateSessionRequest,
    params(("x-runcell-node" = Option<String>, Header, description = "several nodes on one database (docs/scale.md): create the session on this node (its `--node-url`) instead of the live node with the most room; ignored by a server of its own. The answer's `x-runcell-node` header names the node that made the session")),
    responses((status = 201, body = SessionInfo, description = "the session, ready to run code"),
        (status = 400, body = ErrorBody, description = "invalid, or `limit_exceeded`: a limit over the server's maximum or the tenant's quota"),
        (status = 409, body = ErrorBody, description = "`conflict`: `x-runcell-node` names no live node of this cluster"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed, or it runs as many sessions as its descriptors allow; see `Retry-After`")))]
pub async fn create_session(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(req): ApiJson<CreateSessionRequest>,
) -> ApiResult<(StatusCode, Json<SessionInfo>)> {
    let network = req.network.unwrap_or_default();
    crate::caller::within_key(principal.key.as_ref(), &network)?;
    let tenant = principal.tenant;
    let engine = state.engine.clone();
    let started = Instant::now();
    let info = blocking(move || {
        engine.sessions().create(CreateSession {
            owner: tenant.0,
            language: req.language,
            limits: req.limits.unwrap_or_default(),
            env: req.env.unwrap_or_default(),
            metadata: req.metadata.unwrap_or_default(),
            start: req.start,
            network,
        })
    })
    .await?;
    state
        .metrics
        .observe_session_start(started.elapsed().as_secs_f64());
    Ok((StatusCode::CREATED, Json(info)))
}

#[utoipa::path(get, path = "/v1/sessions", tag = "sessions",
    params(("metadata.KEY" = Option<String>, Query, description = "only sessions whose metadata KEY equals this value")),
    responses((status = 200, body = SessionList, description = "the tenant's sessions, live and dead"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: a query parameter other than `metadata.KEY`")))]
pub async fn list_sessions(
    State(state): State<AppState>,
    tenant: Tenant,
    RawQuery(query): RawQuery,
) -> ApiResult<Json<SessionList>> {
    let mut filters = Vec::new();
    for (k, v) in form_pairs(query.as_deref().unwrap_or("")) {
        match k.strip_prefix("metadata.") {
            Some(key) if !key.is_empty() => filters.push((key.to_owned(), v)),
            _ => return Err(ApiError::invalid(format!("unknown query parameter {k:?}"))),
        }
    }
    let engine = state.engine.clone();
    let store = state.store.clone();
    let owner = tenant.0.clone();
    let all = tokio::task::spawn_blocking(move || {
        let mut all = engine.sessions().list_owned(&owner);
        if store.node_id().is_some() {
            // Several nodes on one database: the other nodes' sessions are read from it, so
            // every node lists the same sessions.
            let here: std::collections::HashSet<String> =
                all.iter().map(|s| s.id.clone()).collect();
            let records = store
                .list_sessions(&owner)
                .map_err(crate::error::store_error)?;
            all.extend(
                records
                    .iter()
                    .filter(|r| !here.contains(&r.id))
                    .filter_map(elsewhere),
            );
            all.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        }
        Ok::<_, ApiError>(all)
    })
    .await
    .map_err(ApiError::internal)??;
    let sessions = all
        .into_iter()
        .filter(|s| filters.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
        .collect();
    Ok(Json(SessionList { sessions }))
}

/// What the shared store says of a session another node holds: its status there (`dead` once
/// that node stopped beating), its settings; its network policy is the owner's alone (a
/// session's own GET, forwarded to it, has it).
fn elsewhere(rec: &runcell_store::SessionRecord) -> Option<SessionInfo> {
    use runcell_engine::SessionStatus as S;
    let status = match rec.status.as_str() {
        "starting" => S::Starting,
        "ready" => S::Ready,
        "busy" => S::Busy,
        "paused" => S::Paused,
        "dead" => S::Dead,
        // Gone (expired, deleted): not listed, as on its own node.
        _ => return None,
    };
    runcell_engine::session_of_record(rec, status)
}

/// `a=1&b=x%20y` -> pairs, percent- and plus-decoded.
fn form_pairs(q: &str) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let bytes = s.replace('+', " ").into_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'%' && i + 2 < bytes.len() {
                if let Ok(b) =
                    u8::from_str_radix(&String::from_utf8_lossy(&bytes[i + 1..i + 3]), 16)
                {
                    out.push(b);
                    i += 3;
                    continue;
                }
            }
            out.push(bytes[i]);
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionInfo, description = "the session"), (status = 404, body = ErrorBody, description = "no such session of this tenant")))]
pub async fn get_session(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionInfo>> {
    Ok(Json(lookup(&state, &tenant, &id).await?))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 204, description = "ended: its kernel stopped, its workspace removed"), (status = 404, body = ErrorBody, description = "no such session of this tenant")))]
pub async fn delete_session(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    lookup(&state, &tenant, &id).await?;
    // Dead or not: one whose kernel could not be restarted (out of descriptors, say) is dead
    // yet still held and mounted, and the dead sessions of an earlier server are forgotten.
    // A delete the store cannot record (a full disk: 507) changes nothing.
    let engine = state.engine.clone();
    blocking(move || match engine.sessions().delete(&id) {
        // Ended meanwhile (idle expiry, another delete): what the client asked for.
        Err(runcell_engine::EngineError::NotFound(_)) => Ok(()),
        other => other,
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/interrupt", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = Interrupted, description = "whether an execution got the interrupt"), (status = 404, body = ErrorBody, description = "no such session of this tenant"), (status = 409, body = ErrorBody, description = "the session is dead (its kernel ended with a previous server process) or ended while the request waited")))]
pub async fn interrupt_session(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Interrupted>> {
    owned(&state, &tenant, &id).await?;
    let engine = state.engine.clone();
    let interrupted = blocking(move || engine.sessions().interrupt(&id)).await?;
    Ok(Json(Interrupted { interrupted }))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/restart", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionInfo, description = "the session with a fresh kernel (variables gone, files kept)"), (status = 404, body = ErrorBody, description = "no such session of this tenant"), (status = 409, body = ErrorBody, description = "the session is dead (its kernel ended with a previous server process) or ended while the request waited"),
        (status = 429, body = ErrorBody, description = "`session_busy`: the session is busy; see `Retry-After`"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed; see `Retry-After`")))]
pub async fn restart_session(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionInfo>> {
    owned(&state, &tenant, &id).await?;
    let engine = state.engine.clone();
    let info = blocking(move || engine.sessions().restart(&id)).await?;
    Ok(Json(info))
}

/// Calls off this request's execution if the request goes away before it finishes (the
/// client disconnected: axum drops the handler's future, or the stream's body): interrupted
/// if it runs, skipped if still queued; never another client's execution.
struct CancelOnDrop {
    engine: Engine,
    session: String,
    token: CancelToken,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if self.armed {
            tracing::info!(session = %self.session, "client went away; cancelling its execution");
            let engine = self.engine.clone();
            let session = std::mem::take(&mut self.session);
            let token = self.token.clone();
            std::thread::spawn(move || engine.sessions().cancel(&session, &token));
        }
    }
}

#[utoipa::path(post, path = "/v1/sessions/{id}/execute", tag = "sessions",
    params(("id" = String, Path)),
    request_body = ExecuteRequest,
    responses(
        (status = 200, body = Execution, description = "the finished execution; with `Accept: application/x-ndjson`, a stream of events ending with `{\"type\":\"end\",\"execution\":...}`"),
        (status = 400, body = ErrorBody, description = "`invalid_request`, or `limit_exceeded`: a `timeout_s` over the server's maximum"),
        (status = 404, body = ErrorBody, description = "no such session of this tenant"), (status = 409, body = ErrorBody, description = "the session is dead (its kernel ended with a previous server process) or ended while the request waited"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: code over 1 MiB"),
        (status = 429, body = ErrorBody, description = "`session_busy`: the session's queue is full; see `Retry-After`")))]
pub async fn execute(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
    ApiJson(mut req): ApiJson<ExecuteRequest>,
) -> ApiResult<Response> {
    let info = owned(&state, &tenant, &id).await?;
    let timeout = timeout(req.timeout_s)?;
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/x-ndjson"));
    if wants_stream {
        // Refused while a status can still say so: once the stream starts it is a 200.
        runcell_engine::check_code(&req.code)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<(bytes::Bytes, bool)>();
        let tools = exec_tools(&state, &mut req, &tenant.0, &info, Some(tx.clone()))?;
        return Ok(stream_execution(
            state,
            id,
            req.code,
            timeout,
            (tx, rx),
            tools.map(|(t, _)| t),
        ));
    }
    let tools = exec_tools(&state, &mut req, &tenant.0, &info, None)?;
    let token = CancelToken::new();
    let mut guard = CancelOnDrop {
        engine: state.engine.clone(),
        session: id.clone(),
        token: token.clone(),
        armed: true,
    };
    // This task speaks to the kernel itself (no thread in between), in a task of its own:
    // a client that goes away drops this handler, and the guard interrupts the cell, but the
    // cell must still be seen to its end before the session's next one.
    let (tools, run_state) = match tools {
        Some((t, r)) => (Some(t), Some(r)),
        None => (None, None),
    };
    let run = state
        .engine
        .sessions()
        .execute_async_with_tools(&id, req.code, timeout, token, tools)?;
    if let Some(calls) = run_state {
        // With client tools: the execution's task reports its end to the run, and this
        // request answers at the end or once calls wait (`waiting`; `continue` goes on).
        let attending = calls.first_request();
        let ended = calls.clone();
        tokio::spawn(async move { ended.finish(run.await) });
        let execution = calls.next().await;
        // Waiting: the execution goes on without this request (the client continues it).
        guard.armed = false;
        drop(attending);
        let execution = execution?;
        if execution.status != runcell_engine::ExecutionStatus::Waiting {
            state.metrics.observe_execution(&execution);
        }
        return Ok(Json(execution).into_response());
    }
    let result = tokio::spawn(run).await.map_err(ApiError::internal);
    guard.armed = false;
    let execution = result??;
    state.metrics.observe_execution(&execution);
    Ok(Json(execution).into_response())
}

/// NDJSON events as they happen, then `end` with the Execution.
fn stream_execution(
    state: AppState,
    id: String,
    code: String,
    timeout: Option<Duration>,
    (tx, rx): (
        crate::tool_calls::EventTx,
        tokio::sync::mpsc::UnboundedReceiver<(bytes::Bytes, bool)>,
    ),
    tools: Option<runcell_engine::bridge::ExecTools>,
) -> Response {
    // Unbounded, yet bounded in practice: only the head of each output stream (the capped
    // part) and the results kept within the execution's limits are streamed (the kernel's
    // host side drops the rest as it reads them), and a slow client must not stall the
    // kernel's deadline checks; tool calls are at most 64 pending and 100 a second. The flag
    // marks the last event.
    let line = |v: serde_json::Value| {
        let mut s = v.to_string();
        s.push('\n');
        bytes::Bytes::from(s)
    };
    let events_tx = tx.clone();
    let sink: runcell_engine::EventSink = Box::new(move |e: ExecEvent<'_>| {
        let v = match e {
            ExecEvent::Stdout(text) => serde_json::json!({"type": "stdout", "text": text}),
            ExecEvent::Stderr(text) => serde_json::json!({"type": "stderr", "text": text}),
            ExecEvent::Result(r) => {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                v["type"] = "result".into();
                v
            }
            ExecEvent::Error(err) => {
                let mut v = serde_json::to_value(err).unwrap_or_default();
                v["type"] = "error".into();
                v
            }
        };
        // A client that went away has its execution called off by the stream's guard.
        let _ = events_tx.send((line(v), false));
    });
    let engine = state.engine.clone();
    let metrics = state.metrics.clone();
    let session = id.clone();
    let token = CancelToken::new();
    let worker_token = token.clone();
    tokio::task::spawn_blocking(move || {
        let result = engine.sessions().execute_with_tools(
            &session,
            &code,
            timeout,
            Some(sink),
            worker_token,
            tools,
        );
        let end = match result {
            Ok(execution) => {
                metrics.observe_execution(&execution);
                serde_json::json!({"type": "end", "execution": execution})
            }
            // The stream has started (status 200): the error travels in the last event, with
            // the status it would have had.
            Err(e) => {
                let api: ApiError = e.into();
                let (status, body) = api.parts();
                serde_json::json!({"type": "end", "status": status.as_u16(), "error": body.error})
            }
        };
        let _ = tx.send((line(end), true));
    });
    let guard = CancelOnDrop {
        engine: state.engine.clone(),
        session: id,
        token,
        armed: true,
    };
    let stream = futures_util::stream::unfold((rx, guard), |(mut rx, mut guard)| async move {
        let (chunk, last) = rx.recv().await?;
        if last {
            guard.armed = false;
        }
        Some((Ok::<_, std::io::Error>(chunk), (rx, guard)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| ApiError::internal(e).into_response())
}

#[utoipa::path(post, path = "/v1/sessions/{id}/commands", tag = "sessions",
    params(("id" = String, Path)),
    request_body = CommandRequest,
    responses((status = 200, body = CommandOutput, description = "the command's output and exit status, whatever it was"),
        (status = 400, body = ErrorBody, description = "`invalid_request` (a NUL byte), or `limit_exceeded`: a `timeout_s` over the server's maximum"),
        (status = 404, body = ErrorBody, description = "no such session of this tenant"), (status = 409, body = ErrorBody, description = "the session is dead (its kernel ended with a previous server process) or ended while the request waited"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: a command over 128 KiB"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed; see `Retry-After`")))]
pub async fn run_command(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<CommandRequest>,
) -> ApiResult<Json<CommandOutput>> {
    owned(&state, &tenant, &id).await?;
    let timeout = timeout(req.timeout_s)?;
    let engine = state.engine.clone();
    let out = blocking(move || engine.run_command(&id, &req.command, timeout)).await?;
    Ok(Json(out))
}
