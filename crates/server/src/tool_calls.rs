//! Client tools over the HTTP API (issue 22, docs/tools.md): the server's [`ToolDispatch`] for
//! the tools an execute request declares, and the routes that answer their calls.
//!
//! A call from the code becomes a pending call here, known by its id (128 random bits, from
//! the engine's broker) and bound to the tenant, session and execution it came from:
//! - a streamed execute (NDJSON) sends it as `{"type":"tool_call","id","name","input"}` and
//!   the client answers with `POST /v1/sessions/{id}/tool_results {id, output|error}`;
//! - a plain execute returns `status: "waiting"` with `pending_tool_calls` once calls wait
//!   (the execution keeps running, suspended in those calls), and
//!   `POST /v1/executions/{id}/continue {results:[{id, output|error}]}` answers them and
//!   returns what comes next: the finished Execution, or `waiting` again. `tool_results`
//!   answers a plain execute's calls too (and `continue` a streamed one's: no).
//!
//! An id that is not a pending call of that session (of that tenant) is 404 and changes
//! nothing, whatever else is pending. A call stops being pending when it is answered, times
//! out (the engine's per-call limit) or its execution ends.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use runcell_engine::bridge::{
    PendingToolCall, ToolCall, ToolDispatch, ToolError, ToolErrorKind, ToolFuture, MAX_OUTPUT_BYTES,
};
use runcell_engine::{EngineError, Execution, ExecutionStatus, Language, Truncated, UsageInfo};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{oneshot, watch};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult};

/// How long a plain execute waits, after a call arrives, for more calls made with it (an
/// `asyncio.gather`) before it answers `waiting`: one round trip for them all, not one each.
const GATHER: Duration = Duration::from_millis(50);
/// ... and at most this many such waits.
const GATHER_ROUNDS: usize = 10;
/// A finished execution nobody came back for with `continue` is forgotten after this.
const KEEP_FINISHED: Duration = Duration::from_secs(600);

/// The events of a streamed execute: (NDJSON line, whether it is the last).
pub(crate) type EventTx = tokio::sync::mpsc::UnboundedSender<(bytes::Bytes, bool)>;

/// The answer to one call.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolResult {
    /// The call's id, from its `tool_call` event or `pending_tool_calls`.
    pub id: String,
    /// The tool's output (any JSON value, at most 1 MiB as JSON): what the call returns in
    /// the code.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// The tool's failure (a message, or any JSON value, passed on as JSON text, at most
    /// 1 MiB): the call raises `runcell_tools.ToolError` with it. Exactly one of `output` and
    /// `error`.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
}

/// A field that is there, whatever its value: `"output": null` is a tool that returned null
/// (Python's None), not a missing output.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

/// `POST /v1/executions/{id}/continue`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ContinueRequest {
    /// Answers to pending calls of this execution (any number of them, each once; none just
    /// waits for what comes next).
    pub results: Vec<ToolResult>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ToolResultAccepted {
    pub id: String,
    /// `answered`: the code goes on with the answer.
    pub status: &'static str,
}

/// A call waiting for its client.
struct Pending {
    owner: String,
    session_id: String,
    execution_id: String,
    /// Its place among its execution's calls.
    seq: u64,
    call: PendingToolCall,
    answer: oneshot::Sender<Result<Value, ToolError>>,
}

/// The pending calls and suspended executions of the whole server.
#[derive(Default)]
pub struct ToolCalls {
    calls: Mutex<HashMap<String, Pending>>,
    /// Plain executes with calls, by execution id, until their end is taken.
    runs: Mutex<HashMap<String, Arc<Run>>>,
}

impl ToolCalls {
    fn calls(&self) -> MutexGuard<'_, HashMap<String, Pending>> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn runs(&self) -> MutexGuard<'_, HashMap<String, Arc<Run>>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `id` is a pending call of `owner`'s `session` (and `execution`, if given).
    pub(crate) fn is_pending(
        &self,
        owner: &str,
        session: &str,
        execution: Option<&str>,
        id: &str,
    ) -> bool {
        self.calls().get(id).is_some_and(|p| {
            p.owner == owner
                && p.session_id == session
                && execution.is_none_or(|e| p.execution_id == e)
        })
    }

    /// Answers pending call `r.id` if it is `owner`'s, of `session` (and of `execution`, if
    /// given); Err (404) otherwise, and nothing changes.
    pub(crate) fn answer(
        &self,
        owner: &str,
        session: &str,
        execution: Option<&str>,
        r: &ToolResult,
    ) -> ApiResult<()> {
        let answer = check_answer(r)?;
        let mut calls = self.calls();
        let ours = calls.get(&r.id).is_some_and(|p| {
            p.owner == owner
                && p.session_id == session
                && execution.is_none_or(|e| p.execution_id == e)
        });
        if !ours {
            return Err(not_pending(&r.id));
        }
        if let Some(p) = calls.remove(&r.id) {
            let _ = p.answer.send(answer);
        }
        Ok(())
    }

    /// The suspended plain execution (its [`Run`]) that pending call `id` of `owner`'s
    /// `session` belongs to; None for any other id. The Anthropic-compatible endpoint finds
    /// the code to continue by the calls a client answers.
    pub(crate) fn run_of(&self, owner: &str, session: &str, id: &str) -> Option<Arc<Run>> {
        let execution = self
            .calls()
            .get(id)
            .filter(|p| p.owner == owner && p.session_id == session)
            .map(|p| p.execution_id.clone())?;
        self.runs().get(&execution).cloned()
    }

    /// Forgets finished runs nobody came back for.
    fn sweep(&self) {
        self.runs().retain(|_, run| {
            run.finished_at()
                .is_none_or(|t| t.elapsed() < KEEP_FINISHED)
        });
    }
}

pub(crate) fn not_pending(id: &str) -> ApiError {
    ApiError::not_found(format!(
        "tool call {id:?} (no such call of this session is waiting for an answer)"
    ))
}

/// What a [`ToolResult`] tells the code, or why it is not an answer.
pub(crate) fn check_answer(r: &ToolResult) -> ApiResult<Result<Value, ToolError>> {
    match (&r.output, &r.error) {
        (Some(output), None) => {
            let bytes = serde_json::to_vec(output).map_or(usize::MAX, |v| v.len());
            if bytes > MAX_OUTPUT_BYTES {
                return Err(ApiError::too_large(format!(
                    "the output of tool call {} is {bytes} bytes as JSON, over the {MAX_OUTPUT_BYTES}-byte limit",
                    r.id
                )));
            }
            Ok(Ok(output.clone()))
        }
        (None, Some(error)) => {
            let text = match error {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if text.len() > MAX_OUTPUT_BYTES {
                return Err(ApiError::too_large(format!(
                    "the error of tool call {} is {} bytes, over the {MAX_OUTPUT_BYTES}-byte limit",
                    r.id,
                    text.len()
                )));
            }
            Ok(Err(ToolError::new(ToolErrorKind::Error, text)))
        }
        _ => Err(ApiError::invalid(format!(
            "tool call {}: give exactly one of `output` and `error`",
            r.id
        ))),
    }
}

/// When an execution ended, and its result until a request takes it.
type Ended = (Instant, Option<Result<Execution, EngineError>>);

/// One execute request's execution with client tools: its calls as they come, and its end.
pub(crate) struct Run {
    calls: Arc<ToolCalls>,
    pub(crate) owner: String,
    pub(crate) session_id: String,
    language: Language,
    execution_id: OnceLock<String>,
    seq: AtomicU64,
    /// Bumped at every new call and at the end.
    changed: watch::Sender<u64>,
    /// A streamed execute's events; None for a plain one (which may be continued).
    events: Option<EventTx>,
    finished: Mutex<Option<Ended>>,
    /// A request is waiting on this run (the execute, or one `continue`).
    attended: AtomicBool,
    /// Calls a `waiting` reply has listed: a request answers `waiting` again only for new ones.
    announced: Mutex<HashSet<String>>,
}

impl Run {
    pub(crate) fn new(
        calls: Arc<ToolCalls>,
        owner: String,
        session_id: String,
        language: Language,
        events: Option<EventTx>,
    ) -> Arc<Run> {
        Arc::new(Run {
            calls,
            owner,
            session_id,
            language,
            execution_id: OnceLock::new(),
            seq: AtomicU64::new(0),
            changed: watch::channel(0).0,
            events,
            finished: Mutex::new(None),
            attended: AtomicBool::new(true),
            announced: Mutex::new(HashSet::new()),
        })
    }

    /// The dispatch point the engine's broker calls.
    pub(crate) fn dispatch(self: &Arc<Self>) -> Arc<dyn ToolDispatch> {
        Arc::new(RunDispatch(self.clone()))
    }

    fn finished(&self) -> MutexGuard<'_, Option<Ended>> {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finished_at(&self) -> Option<Instant> {
        self.finished().as_ref().map(|(t, _)| *t)
    }

    /// The execution's end (its task's result).
    pub(crate) fn finish(&self, result: Result<Execution, EngineError>) {
        *self.finished() = Some((Instant::now(), Some(result)));
        self.changed.send_modify(|n| *n += 1);
    }

    /// Its calls waiting for the client, in the order they came.
    fn pending(&self) -> Vec<PendingToolCall> {
        let Some(ex) = self.execution_id.get() else {
            return Vec::new();
        };
        let calls = self.calls.calls();
        let mut v: Vec<_> = calls
            .values()
            .filter(|p| &p.execution_id == ex)
            .map(|p| (p.seq, p.call.clone()))
            .collect();
        v.sort_by_key(|(seq, _)| *seq);
        v.into_iter().map(|(_, c)| c).collect()
    }

    /// Whether calls wait that no `waiting` reply has listed yet.
    fn news(&self) -> bool {
        let announced = self.announced.lock().unwrap_or_else(|e| e.into_inner());
        self.pending().iter().any(|c| !announced.contains(&c.id))
    }

    /// Waits until the execution ends (its Execution, and it is forgotten) or calls wait for
    /// the client that it has not been told of (a `waiting` Execution listing every call that
    /// waits): a `continue` that leaves calls unanswered waits for new ones or the end.
    pub(crate) async fn next(self: &Arc<Self>) -> Result<Execution, ApiError> {
        let mut changes = self.changed.subscribe();
        loop {
            if let Some(end) = self.take_end() {
                return end;
            }
            if self.news() {
                // Calls made together arrive a moment apart: wait for the lot.
                for _ in 0..GATHER_ROUNDS {
                    if tokio::time::timeout(GATHER, changes.changed())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                if let Some(end) = self.take_end() {
                    return end;
                }
                if self.news() {
                    let pending = self.pending();
                    self.announced
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .extend(pending.iter().map(|c| c.id.clone()));
                    return Ok(self.waiting(pending));
                }
                continue;
            }
            if changes.changed().await.is_err() {
                return Err(ApiError::internal("the execution's state went away"));
            }
        }
    }

    fn take_end(&self) -> Option<Result<Execution, ApiError>> {
        let end = self.finished().as_mut().and_then(|(_, r)| r.take())?;
        if let Some(ex) = self.execution_id.get() {
            self.calls.runs().remove(ex);
        }
        Some(end.map_err(ApiError::from))
    }

    fn waiting(&self, pending: Vec<PendingToolCall>) -> Execution {
        let now = chrono::Utc::now();
        Execution {
            id: self.execution_id.get().cloned().unwrap_or_default(),
            session_id: Some(self.session_id.clone()),
            language: self.language,
            execution_count: 0,
            status: ExecutionStatus::Waiting,
            stdout: String::new(),
            stderr: String::new(),
            truncated: Truncated::default(),
            results: Vec::new(),
            error: None,
            files: Vec::new(),
            usage: UsageInfo::default(),
            network: Vec::new(),
            tool_calls: Vec::new(),
            pending_tool_calls: pending,
            started_at: now,
            finished_at: now,
            restored: None,
        }
    }

    /// Marks a request as waiting on this run until the guard goes (answered, or the client
    /// went away); None if one already is.
    pub(crate) fn attend(self: &Arc<Self>) -> Option<Attending> {
        self.attended
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| Attending(self.clone()))
    }

    /// The guard of the request that started the run (attended from the start).
    pub(crate) fn first_request(self: &Arc<Self>) -> Attending {
        Attending(self.clone())
    }
}

/// A request waiting on a [`Run`] (see [`Run::attend`]).
pub(crate) struct Attending(Arc<Run>);

impl Drop for Attending {
    fn drop(&mut self) {
        self.0.attended.store(false, Ordering::Release);
    }
}

/// [`Run`]'s side of the engine's dispatch point.
struct RunDispatch(Arc<Run>);

/// Takes a call off the pending list when its future ends (answered, timed out, cancelled).
struct Withdraw {
    calls: Arc<ToolCalls>,
    id: String,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        self.calls.calls().remove(&self.id);
    }
}

impl ToolDispatch for RunDispatch {
    fn call(&self, call: ToolCall) -> ToolFuture {
        let run = &self.0;
        let execution_id = run
            .execution_id
            .get_or_init(|| call.execution_id.clone())
            .clone();
        if execution_id != call.execution_id {
            // One Run serves one execution; the broker never mixes them.
            return Box::pin(async {
                Err(ToolError::new(
                    ToolErrorKind::Refused,
                    "not this execution's call",
                ))
            });
        }
        if run.events.is_none() {
            run.calls.sweep();
            run.calls
                .runs()
                .entry(execution_id.clone())
                .or_insert_with(|| run.clone());
        }
        let (tx, rx) = oneshot::channel();
        let pending = PendingToolCall {
            id: call.id.clone(),
            name: call.name.clone(),
            input: call.input.clone(),
        };
        run.calls.calls().insert(
            call.id.clone(),
            Pending {
                owner: call.owner.clone(),
                session_id: call.session_id.clone().unwrap_or_default(),
                execution_id,
                seq: run.seq.fetch_add(1, Ordering::Relaxed),
                call: pending,
                answer: tx,
            },
        );
        if let Some(events) = &run.events {
            let mut line = serde_json::json!({
                "type": "tool_call",
                "id": call.id,
                "name": call.name,
                "input": call.input,
            })
            .to_string();
            line.push('\n');
            let _ = events.send((bytes::Bytes::from(line), false));
        }
        run.changed.send_modify(|n| *n += 1);
        let withdraw = Withdraw {
            calls: run.calls.clone(),
            id: call.id,
        };
        Box::pin(async move {
            let _withdraw = withdraw;
            match rx.await {
                Ok(answer) => answer,
                Err(_) => Err(ToolError::new(
                    ToolErrorKind::Cancelled,
                    "the call was withdrawn before an answer came",
                )),
            }
        })
    }
}
