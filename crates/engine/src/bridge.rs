//! The tool bridge (issue 22, docs/tools.md): tools that code in the sandbox calls, answered
//! outside it. The sandbox has no network; every call comes over the kernel's channel
//! (runcell-kernel's `tools.rs`), and here runcell decides, brokers and records it.
//!
//! **The dispatch point.** Whoever runs an execution with tools gives it an [`ExecTools`]:
//! the declared client tools' specs, a [`ToolDispatch`] for them and, optionally, one for
//! MCP tools. Each call the code makes arrives as a [`ToolCall`] at one of them, routed by
//! name:
//! - a name under [`MCP_PREFIX`] (`mcp.<server>.<tool>`, e.g. `mcp.github.search_issues`) goes
//!   to [`ExecTools::mcp`]; which servers and tools a tenant may use is that dispatcher's
//!   to decide (it refuses with [`ToolErrorKind::Refused`]); without one such a call is
//!   refused here;
//! - any other name must be one of [`ExecTools::specs`] (the execute request's `tools`) and
//!   goes to [`ExecTools::client`]; an undeclared one is refused here and reaches no client.
//!
//! `ToolDispatch::call` returns the tool's output (any JSON value) or a [`ToolError`]; it runs
//! on [`ExecTools::runtime`] and is dropped (cancelled) if the execution ends before it does,
//! or at the call's time limit ([`ExecTools::call_timeout`]).
//!
//! **What every call passes first**, whatever its route (the bounds are per execution):
//! at most [`MAX_PENDING`] calls waiting at once, [`CALLS_PER_SECOND`] on average (bursts of
//! [`CALL_BURST`]), [`MAX_CALLS`] in all; arguments and outputs at most [`MAX_INPUT_BYTES`] and
//! [`MAX_OUTPUT_BYTES`] as JSON. Each call gets an id of 128 random bits (`call_<32 hex>`),
//! known only to the dispatcher and whoever it tells (the client the call belongs to): the
//! dispatcher binds it to the session, execution and tenant of the [`ToolCall`].
//!
//! **Records.** Every call the kernel made, refused ones included (up to [`MAX_CALLS`]), is an
//! entry of the Execution's `tool_calls` ({id, name, input, output_bytes, duration_ms,
//! error}), and so in the audit log with it.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runcell_kernel::{KernelToolCall, ToolAnswer, ToolFailure, ToolFailureKind, ToolSink};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Names of MCP tools start with this: `mcp.<server>.<tool>`.
pub const MCP_PREFIX: &str = "mcp.";
/// Calls of one execution waiting for answers at once, at most.
pub const MAX_PENDING: usize = 64;
/// Calls one execution makes at most.
pub const MAX_CALLS: usize = 2_000;
/// Calls per second one execution makes on average, at most ...
pub const CALLS_PER_SECOND: f64 = 100.0;
/// ... in bursts of up to this many.
pub const CALL_BURST: f64 = 100.0;
/// Bytes of a call's arguments, as JSON, at most.
pub const MAX_INPUT_BYTES: usize = 1 << 20;
/// Bytes of a tool's output, as JSON, at most.
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;
/// How long a call waits for its answer by default (Anthropic's 270 s).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(270);
/// The longest a caller may let a call wait.
pub const MAX_CALL_TIMEOUT: Duration = Duration::from_secs(3600);
/// Declared tools per execution, at most, and the bounds on each.
pub const MAX_TOOLS: usize = 128;
pub const MAX_TOOL_NAME: usize = 128;
pub const MAX_TOOL_SPEC_BYTES: usize = 64 << 10;
/// Bytes of a call's arguments kept in its record (the audit log); larger ones are noted.
const RECORDED_INPUT_BYTES: usize = 8 << 10;

/// A client tool as the execute request declares it (Anthropic's and MCP's shape).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// A Python identifier (the function's name in `runcell_tools`), at most 128 characters,
    /// not starting with `__`.
    #[cfg_attr(
        feature = "openapi",
        schema(pattern = r"^(?!__)[A-Za-z_][A-Za-z0-9_]{0,127}$")
    )]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// A JSON Schema of the arguments object; the sandbox checks arguments against it (type,
    /// properties, required, enum, items, additionalProperties, minimum/maximum, min/max
    /// length and items; other keywords are ignored).
    #[serde(default = "empty_object_schema")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input_schema: Value,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object"})
}

/// Why a set of tool declarations is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolSpecError {
    /// Two declarations of one name: they conflict with each other, the request's form is fine
    /// (the API answers 409, as a schema cannot say "no two names alike").
    #[error("tool {0:?} is declared twice (tool names must differ)")]
    Twice(String),
    /// A declaration that is malformed or too large on its own (400).
    #[error("{0}")]
    Invalid(String),
}

impl ToolSpec {
    /// Why these specs cannot be declared, if they cannot (names, sizes, duplicates).
    pub fn check_all(specs: &[ToolSpec]) -> Result<(), ToolSpecError> {
        use ToolSpecError::Invalid;
        if specs.len() > MAX_TOOLS {
            return Err(Invalid(format!(
                "{} tools declared; at most {MAX_TOOLS}",
                specs.len()
            )));
        }
        let mut seen = HashSet::new();
        for s in specs {
            let n = &s.name;
            let ident = n
                .chars()
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && n.chars().all(|c| c == '_' || c.is_ascii_alphanumeric());
            if !ident || n.len() > MAX_TOOL_NAME || n.starts_with("__") {
                return Err(Invalid(format!(
                    "tool name {n:?} is not a Python identifier of at most {MAX_TOOL_NAME} characters (nor may it start with '__')"
                )));
            }
            if !seen.insert(n.as_str()) {
                return Err(ToolSpecError::Twice(n.clone()));
            }
            if !s.input_schema.is_object() {
                return Err(Invalid(format!(
                    "tool {n:?}: input_schema must be a JSON object"
                )));
            }
            let size = serde_json::to_vec(s).map_or(usize::MAX, |v| v.len());
            if size > MAX_TOOL_SPEC_BYTES {
                return Err(Invalid(format!(
                    "tool {n:?} is {size} bytes as JSON; at most {MAX_TOOL_SPEC_BYTES}"
                )));
            }
        }
        Ok(())
    }
}

/// One call, as a [`ToolDispatch`] gets it.
#[derive(Debug, Clone)]
pub struct ToolCall {
    /// `call_` and 128 random bits in hex: the id a client answers.
    pub id: String,
    pub session_id: Option<String>,
    pub execution_id: String,
    /// The tenant (the session's owner).
    pub owner: String,
    pub name: String,
    /// The arguments object, at most [`MAX_INPUT_BYTES`] as JSON.
    pub input: Value,
}

/// How a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolErrorKind {
    /// The tool ran and failed (the client's `error`, the MCP server's).
    Error,
    Timeout,
    Refused,
    TooLarge,
    Cancelled,
}

/// A failed call: the code in the sandbox raises it (`runcell_tools.ToolError`, or the
/// subclass of its kind) with `message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub kind: ToolErrorKind,
    pub message: String,
}

impl ToolError {
    pub fn new(kind: ToolErrorKind, message: impl Into<String>) -> Self {
        ToolError {
            kind,
            message: message.into(),
        }
    }
}

/// What [`ToolDispatch::call`] returns.
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<Value, ToolError>> + Send + 'static>>;

/// Where calls go: the server's client tools, the MCP helper's servers.
pub trait ToolDispatch: Send + Sync + 'static {
    /// Runs one call. Dropped unfinished when the execution ends or the call times out.
    fn call(&self, call: ToolCall) -> ToolFuture;
}

/// The tools of one execution (see the module's doc).
#[derive(Clone)]
pub struct ExecTools {
    /// The declared client tools (checked with [`ToolSpec::check_all`]).
    pub specs: Vec<ToolSpec>,
    /// Client tools' calls.
    pub client: Option<Arc<dyn ToolDispatch>>,
    /// MCP tools' calls (names under [`MCP_PREFIX`]).
    pub mcp: Option<Arc<dyn ToolDispatch>>,
    /// What the kernel is told of MCP tools, `{name: "mcp.<server>.<tool>", description,
    /// input_schema}` (the MCP layer's module in the sandbox reads them: `runcell_tools._tools()`).
    pub mcp_specs: Vec<Value>,
    /// How long each call waits for its answer (at most [`MAX_CALL_TIMEOUT`]).
    pub call_timeout: Duration,
    /// Where the calls run.
    pub runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for ExecTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecTools")
            .field("specs", &self.specs)
            .field("client", &self.client.is_some())
            .field("mcp", &self.mcp.is_some())
            .field("call_timeout", &self.call_timeout)
            .finish_non_exhaustive()
    }
}

/// One call as the Execution records it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub id: String,
    pub name: String,
    /// The arguments (over 8 KiB as JSON: `{"truncated": true, "bytes": N}`).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Value,
    /// Size of the output as JSON (0 for a failed call).
    pub output_bytes: u64,
    pub duration_ms: u64,
    /// Why it failed (`kind: message`), or null.
    pub error: Option<String>,
}

/// A client tool call waiting for its answer, as a `waiting` Execution lists it (and as the
/// NDJSON stream's `tool_call` event carries it, with `"type": "tool_call"`).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingToolCall {
    pub id: String,
    pub name: String,
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Value,
}

/// New call id: 128 random bits.
fn new_call_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the kernel's random source is unavailable");
    let mut id = String::with_capacity(37);
    id.push_str("call_");
    for b in bytes {
        id.push_str(&format!("{b:02x}"));
    }
    id
}

/// The broker of one execution's calls: the kernel's [`ToolSink`] for its cell.
pub(crate) struct Broker {
    tools: ExecTools,
    session_id: Option<String>,
    execution_id: String,
    owner: String,
    /// Shared with the calls' tasks, which fill in their records.
    state: Arc<Mutex<BrokerState>>,
}

struct BrokerState {
    records: Vec<ToolCallRecord>,
    /// Index in `records` and abort handle of each call still running.
    running: Vec<(usize, tokio::task::AbortHandle)>,
    calls: usize,
    tokens: f64,
    refilled: Instant,
    finished: bool,
}

impl Broker {
    pub(crate) fn new(
        tools: ExecTools,
        session_id: Option<String>,
        execution_id: String,
        owner: String,
    ) -> Arc<Broker> {
        Arc::new(Broker {
            tools,
            session_id,
            execution_id,
            owner,
            state: Arc::new(Mutex::new(BrokerState {
                records: Vec::new(),
                running: Vec::new(),
                calls: 0,
                tokens: CALL_BURST,
                refilled: Instant::now(),
                finished: false,
            })),
        })
    }

    /// What the kernel is told it may call.
    pub(crate) fn kernel_specs(&self) -> Vec<Value> {
        let mut v: Vec<Value> = self
            .tools
            .specs
            .iter()
            .filter_map(|s| serde_json::to_value(s).ok())
            .collect();
        v.extend(self.tools.mcp_specs.iter().cloned());
        v
    }

    fn lock(&self) -> MutexGuard<'_, BrokerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the execution's calls: those still running are cancelled (their dispatch futures
    /// dropped) and recorded so; returns the records.
    pub(crate) fn finish(&self) -> Vec<ToolCallRecord> {
        let mut s = self.lock();
        s.finished = true;
        for (i, handle) in std::mem::take(&mut s.running) {
            handle.abort();
            if let Some(r) = s.records.get_mut(i) {
                if r.error.is_none() {
                    r.error = Some("cancelled: the execution ended before the answer came".into());
                }
            }
        }
        std::mem::take(&mut s.records)
    }

    /// The checks every call passes before it is dispatched, at `now`.
    fn admit(
        s: &mut BrokerState,
        name: &str,
        input_bytes: usize,
        now: Instant,
    ) -> Result<(), ToolError> {
        let refused = |m: String| Err(ToolError::new(ToolErrorKind::Refused, m));
        if s.calls >= MAX_CALLS {
            return refused(format!(
                "this execution has made {MAX_CALLS} tool calls, the most one may make"
            ));
        }
        let elapsed = now.duration_since(s.refilled).as_secs_f64();
        s.tokens = (s.tokens + elapsed * CALLS_PER_SECOND).min(CALL_BURST);
        s.refilled = now;
        if s.tokens < 1.0 {
            return refused(format!(
                "too many tool calls: at most {CALLS_PER_SECOND} per second (bursts of {CALL_BURST})"
            ));
        }
        if s.running.len() >= MAX_PENDING {
            return refused(format!(
                "too many tool calls waiting: at most {MAX_PENDING} at once"
            ));
        }
        if input_bytes > MAX_INPUT_BYTES {
            return Err(ToolError::new(
                ToolErrorKind::TooLarge,
                format!(
                    "the arguments of {name} are {input_bytes} bytes as JSON, over the {MAX_INPUT_BYTES}-byte limit"
                ),
            ));
        }
        s.tokens -= 1.0;
        Ok(())
    }

    /// Which dispatcher a name goes to, or why none.
    fn route(&self, name: &str) -> Result<Arc<dyn ToolDispatch>, ToolError> {
        if name.starts_with(MCP_PREFIX) {
            return self.tools.mcp.clone().ok_or_else(|| {
                ToolError::new(
                    ToolErrorKind::Refused,
                    format!("{name}: no MCP servers are configured for this session"),
                )
            });
        }
        if !self.tools.specs.iter().any(|s| s.name == name) {
            return Err(ToolError::new(
                ToolErrorKind::Refused,
                format!("{name:?} is not a tool declared for this execution"),
            ));
        }
        self.tools.client.clone().ok_or_else(|| {
            ToolError::new(
                ToolErrorKind::Refused,
                format!("{name}: client tools cannot be answered here"),
            )
        })
    }
}

fn failure(e: &ToolError) -> ToolFailure {
    ToolFailure {
        kind: match e.kind {
            ToolErrorKind::Error => ToolFailureKind::Error,
            ToolErrorKind::Timeout => ToolFailureKind::Timeout,
            ToolErrorKind::Refused => ToolFailureKind::Refused,
            ToolErrorKind::TooLarge => ToolFailureKind::TooLarge,
            ToolErrorKind::Cancelled => ToolFailureKind::Cancelled,
        },
        message: e.message.clone(),
    }
}

fn describe(e: &ToolError) -> String {
    let kind = serde_json::to_value(e.kind)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    format!("{kind}: {}", e.message)
}

fn recorded_input(input: &Value, bytes: usize) -> Value {
    if bytes <= RECORDED_INPUT_BYTES {
        input.clone()
    } else {
        serde_json::json!({"truncated": true, "bytes": bytes})
    }
}

impl ToolSink for Broker {
    fn call(&self, call: KernelToolCall, answer: ToolAnswer) {
        let started = Instant::now();
        let id = new_call_id();
        let input_bytes = serde_json::to_vec(&call.input).map_or(usize::MAX, |v| v.len());
        let name: String = call.name.chars().take(MAX_TOOL_NAME + 1).collect();
        let mut s = self.lock();
        if s.finished {
            drop(s);
            answer.send(Err(failure(&ToolError::new(
                ToolErrorKind::Cancelled,
                "the execution has ended",
            ))));
            return;
        }
        let over_cap = s.calls >= MAX_CALLS;
        let checked =
            Self::admit(&mut s, &name, input_bytes, started).and_then(|()| self.route(&name));
        s.calls = s.calls.saturating_add(1);
        let index = s.records.len();
        if !over_cap {
            s.records.push(ToolCallRecord {
                id: id.clone(),
                name: name.clone(),
                input: recorded_input(&call.input, input_bytes),
                output_bytes: 0,
                duration_ms: 0,
                error: None,
            });
        }
        let dispatch = match checked {
            Ok(d) => d,
            Err(e) => {
                if let Some(r) = s.records.get_mut(index).filter(|_| !over_cap) {
                    r.error = Some(describe(&e));
                }
                drop(s);
                answer.send(Err(failure(&e)));
                return;
            }
        };
        let future = dispatch.call(ToolCall {
            id,
            session_id: self.session_id.clone(),
            execution_id: self.execution_id.clone(),
            owner: self.owner.clone(),
            name: name.clone(),
            input: call.input,
        });
        let timeout = self.tools.call_timeout.min(MAX_CALL_TIMEOUT);
        let state = self.state.clone();
        let task = self.tools.runtime.spawn(async move {
            let result = match tokio::time::timeout(timeout, future).await {
                Ok(r) => r,
                Err(_) => Err(ToolError::new(
                    ToolErrorKind::Timeout,
                    format!("no answer to {name} within {} s", timeout.as_secs_f64()),
                )),
            };
            let result = result.and_then(|v| {
                let bytes = serde_json::to_vec(&v).map_or(usize::MAX, |b| b.len());
                if bytes > MAX_OUTPUT_BYTES {
                    Err(ToolError::new(
                        ToolErrorKind::TooLarge,
                        format!(
                            "the answer of {name} is {bytes} bytes as JSON, over the {MAX_OUTPUT_BYTES}-byte limit"
                        ),
                    ))
                } else {
                    Ok((v, bytes))
                }
            });
            {
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                if !s.finished {
                    s.running.retain(|(i, _)| *i != index);
                    if let Some(r) = s.records.get_mut(index).filter(|_| !over_cap) {
                        r.duration_ms = started.elapsed().as_millis() as u64;
                        match &result {
                            Ok((_, bytes)) => r.output_bytes = *bytes as u64,
                            Err(e) => r.error = Some(describe(e)),
                        }
                    }
                }
            }
            answer.send(result.map(|(v, _)| v).map_err(|e| failure(&e)));
        });
        s.running.push((index, task.abort_handle()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(at: Instant) -> BrokerState {
        BrokerState {
            records: Vec::new(),
            running: Vec::new(),
            calls: 0,
            tokens: CALL_BURST,
            refilled: at,
            finished: false,
        }
    }

    #[test]
    fn calls_are_bounded_by_rate_total_and_size() {
        let t0 = Instant::now();
        let mut s = state(t0);
        // A burst of CALL_BURST passes at once; the next is refused until time refills it.
        for _ in 0..CALL_BURST as usize {
            Broker::admit(&mut s, "f", 10, t0).expect("within the burst");
            s.calls += 1;
        }
        let e = Broker::admit(&mut s, "f", 10, t0).expect_err("over the rate");
        assert_eq!(e.kind, ToolErrorKind::Refused);
        assert_eq!(
            e.message,
            "too many tool calls: at most 100 per second (bursts of 100)"
        );
        let later = t0 + Duration::from_millis(20); // two calls' worth at 100/s
        Broker::admit(&mut s, "f", 10, later).expect("refilled");
        Broker::admit(&mut s, "f", 10, later).expect("refilled");
        assert!(Broker::admit(&mut s, "f", 10, later).is_err());
        // Oversized arguments are their own refusal (and take no token).
        let mut s = state(t0);
        let e = Broker::admit(&mut s, "f", MAX_INPUT_BYTES + 1, t0).expect_err("too large");
        assert_eq!(e.kind, ToolErrorKind::TooLarge);
        assert_eq!(s.tokens, CALL_BURST);
        Broker::admit(&mut s, "f", MAX_INPUT_BYTES, t0).expect("at the bound");
        // The total, whatever the time.
        let mut s = state(t0);
        s.calls = MAX_CALLS;
        let e = Broker::admit(&mut s, "f", 1, t0 + Duration::from_secs(60)).expect_err("total");
        assert_eq!(
            e.message,
            "this execution has made 2000 tool calls, the most one may make"
        );
    }

    #[test]
    fn specs_are_checked() {
        let spec = |name: &str| ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
        };
        assert!(ToolSpec::check_all(&[spec("lookup"), spec("_x2")]).is_ok());
        for (bad, why) in [
            ("mcp.github", "is not a Python identifier"),
            ("2x", "is not a Python identifier"),
            ("__class__", "nor may it start with '__'"),
            ("", "is not a Python identifier"),
        ] {
            let e = ToolSpec::check_all(&[spec(bad)]).expect_err(bad);
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
        let e = ToolSpec::check_all(&[spec("a"), spec("a")]).expect_err("twice");
        assert_eq!(e, ToolSpecError::Twice("a".into()));
        let mut s = spec("a");
        s.input_schema = serde_json::json!([1]);
        assert!(ToolSpec::check_all(&[s]).is_err());
    }

    #[test]
    fn call_ids_carry_128_random_bits() {
        let a = new_call_id();
        let b = new_call_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), "call_".len() + 32);
        assert!(a[5..].chars().all(|c| c.is_ascii_hexdigit()));
    }
}
