//! A session's kernel and how one cell runs on it, from the busy mark to its Execution.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use runcell_kernel::{CellEvent, CellOptions, CellStatus, CellTools, Kernel};
use runcell_sandbox::Workspace;

use super::cell::{
    channel_failed, died_error, protocol_error, restart_notice, EventSink, ExecEvent,
};
use super::info::SessionStatus;
use super::shared::SharedState;
use crate::bridge::{Broker, ExecTools, ToolCallRecord};
use crate::core::Core;
use crate::execution::{Began, Produced};
use crate::limits::SessionLimits;
use crate::model::{
    new_ordered_id, ErrorInfo, Execution, ExecutionStatus, Language, ResultItem, Start,
};
use crate::stamp::Stamper;
use crate::EngineError;

/// A session's kernel and what running cells on it needs. Whoever runs a cell holds it (see
/// `Entry::runner`).
pub(super) struct Runner {
    pub(super) core: Arc<Core>,
    pub(super) workspace: Arc<Workspace>,
    pub(super) kernel: Option<Kernel>,
    pub(super) env: Vec<(String, String)>,
    /// How the session asked its kernels to start.
    pub(super) start: Start,
    /// The session's proxy state, with a network policy: each kernel's sandbox is served by it.
    pub(super) egress: Option<runcell_egress::SessionEgress>,
}

/// The signer of a cell's image results, when the server has one (`crate::stamp`).
fn stamper<'a>(core: &'a Core, start: &CellStart, code: &str) -> Option<Stamper<'a>> {
    let signer = core.config.image_signer.as_deref()?;
    Some(Stamper::new(
        signer,
        &start.began.id,
        start.began.session_id(),
        &start.owner,
        code,
    ))
}

/// Signs the image results of a finished cell (those streamed already get the same bytes).
fn stamp_results(
    stamper: Option<&mut Stamper<'_>>,
    done: Result<(Execution, String), EngineError>,
) -> Result<(Execution, String), EngineError> {
    let Some(stamper) = stamper else {
        return done;
    };
    done.map(|(mut execution, owner)| {
        for item in &mut execution.results {
            stamper.stamp(item);
        }
        (execution, owner)
    })
}

/// What a cell's start noted, for its Execution.
struct CellStart {
    began: Began,
    owner: String,
    limits: SessionLimits,
    language: Language,
}

impl Runner {
    pub(super) fn ensure_kernel(
        &mut self,
        shared: &SharedState,
    ) -> Result<&mut Kernel, EngineError> {
        if self.kernel.as_ref().is_none_or(|k| !k.is_alive()) {
            let (limits, language) = {
                let s = shared.lock();
                (s.info.limits, s.info.language)
            };
            let kernel = self.core.start_kernel(
                &self.workspace,
                language,
                &limits,
                &self.env,
                self.start,
                self.egress.as_ref(),
            );
            let mut s = shared.lock();
            match kernel {
                Ok((k, how)) => {
                    s.handle = Some(k.handle());
                    s.info.status = SessionStatus::Ready;
                    s.info.start = how;
                    self.kernel = Some(k);
                }
                Err(e) => {
                    s.handle = None;
                    s.info.status = SessionStatus::Dead;
                    return Err(e);
                }
            }
        }
        self.kernel.as_mut().ok_or(EngineError::NoKernel)
    }

    /// Marks the session busy and notes what the Execution needs from before the cell.
    fn start_cell(&self, shared: &SharedState) -> CellStart {
        let id = new_ordered_id("ex");
        let (session_id, owner, limits, language) = {
            let mut s = shared.lock();
            s.info.status = SessionStatus::Busy;
            s.info.last_active_at = Utc::now();
            (
                s.info.id.clone(),
                s.info.owner.clone(),
                s.info.limits,
                s.info.language,
            )
        };
        CellStart {
            began: Began::now(id, Some(session_id), &self.workspace),
            owner,
            limits,
            language,
        }
    }

    fn cell_options(&self, timeout: Duration) -> CellOptions {
        CellOptions {
            timeout,
            ..self.core.cell_options()
        }
    }

    /// The broker of the cell's tool calls, given to its kernel (bridge.rs).
    fn tool_broker(start: &CellStart, tools: Option<ExecTools>) -> Option<Arc<Broker>> {
        tools.map(|t| {
            Broker::new(
                t,
                start.began.session_id.clone(),
                start.began.id.clone(),
                start.owner.clone(),
            )
        })
    }

    fn arm_tools(kernel: &mut Kernel, broker: &Option<Arc<Broker>>) {
        kernel.set_tools(broker.as_ref().map(|b| CellTools {
            specs: b.kernel_specs(),
            sink: b.clone(),
        }));
    }

    /// Runs one cell on this thread; returns its execution, not yet recorded, and the
    /// session's owner.
    pub(super) fn execute(
        &mut self,
        shared: &SharedState,
        code: &str,
        timeout: Duration,
        mut events: Option<EventSink>,
        tools: Option<ExecTools>,
    ) -> Result<(Execution, String), EngineError> {
        let start = self.start_cell(shared);
        let broker = Self::tool_broker(&start, self.core.mcp_tools.complete(tools));
        let opts = CellOptions {
            ack: events.is_some(),
            ..self.cell_options(timeout)
        };
        let core = self.core.clone();
        let mut stamper = stamper(&core, &start, code);
        let kernel = self.ensure_kernel(shared)?;
        Self::arm_tools(kernel, &broker);
        let mut on_event = |e: CellEvent<'_>| {
            let Some(sink) = events.as_mut() else { return };
            match e {
                CellEvent::Stdout(d) => sink(ExecEvent::Stdout(&String::from_utf8_lossy(d))),
                CellEvent::Stderr(d) => sink(ExecEvent::Stderr(&String::from_utf8_lossy(d))),
                CellEvent::Result {
                    is_main_result,
                    data,
                } => {
                    let mut item = ResultItem::new(is_main_result, data.clone());
                    if let Some(s) = stamper.as_mut() {
                        s.stamp(&mut item);
                    }
                    sink(ExecEvent::Result(&item))
                }
                CellEvent::Error(err) => sink(ExecEvent::Error(&ErrorInfo {
                    name: err.name.clone(),
                    value: err.value.clone(),
                    traceback: err.traceback.clone(),
                })),
            }
        };
        let outcome = kernel.execute(&start.began.id, code, &opts, &mut on_event);
        let calls = broker.map(|b| b.finish()).unwrap_or_default();
        let done = self.finish_cell(shared, start, outcome, timeout, calls);
        stamp_results(stamper.as_mut(), done)
    }

    /// [`Runner::execute`] on the calling task, waiting for the kernel on the tokio reactor
    /// (no events). Starting a kernel (after a death) blocks, in `block_in_place`.
    pub(super) async fn execute_async(
        &mut self,
        shared: &SharedState,
        code: &str,
        timeout: Duration,
        tools: Option<ExecTools>,
    ) -> Result<(Execution, String), EngineError> {
        let start = self.start_cell(shared);
        let broker = Self::tool_broker(&start, self.core.mcp_tools.complete(tools));
        let core = self.core.clone();
        let mut stamper = stamper(&core, &start, code);
        let opts = self.cell_options(timeout);
        if !self.kernel.as_ref().is_some_and(Kernel::is_alive) {
            runcell_kernel::blocking(|| self.ensure_kernel(shared).map(|_| ()))?;
        }
        let kernel = self.kernel.as_mut().ok_or(EngineError::NoKernel)?;
        Self::arm_tools(kernel, &broker);
        let outcome = kernel.execute_async(&start.began.id, code, &opts).await;
        let calls = broker.map(|b| b.finish()).unwrap_or_default();
        let restarts = !matches!(
            &outcome,
            Ok(o) if !matches!(o.status, CellStatus::KernelDied { .. })
        );
        let done = if restarts {
            runcell_kernel::blocking(|| self.finish_cell(shared, start, outcome, timeout, calls))
        } else {
            self.finish_cell(shared, start, outcome, timeout, calls)
        };
        // Signing takes milliseconds of CPU per image: off the reactor, when there is any.
        let images = matches!(&done, Ok((e, _)) if e.results.iter().any(Stamper::wants));
        if images && stamper.is_some() {
            runcell_kernel::blocking(|| stamp_results(stamper.as_mut(), done))
        } else {
            done
        }
    }

    /// Builds the Execution of a finished cell; a kernel that died is restarted first (unless
    /// the session is being deleted), so the next cell finds it ready.
    fn finish_cell(
        &mut self,
        shared: &SharedState,
        start: CellStart,
        outcome: Result<runcell_kernel::CellOutcome, runcell_kernel::KernelError>,
        timeout: Duration,
        tool_calls: Vec<ToolCallRecord>,
    ) -> Result<(Execution, String), EngineError> {
        let limits = start.limits;
        // The connections since the last cell's end: this cell's (before any restart below).
        let network = self
            .egress
            .as_ref()
            .map(|e| crate::network::connections(e.take_records()))
            .unwrap_or_default();
        // A cell that was sent is recorded whatever became of its kernel: one whose channel
        // failed is ended like one that died.
        let (outcome, failure) = match outcome {
            Ok(o) => (o, None),
            Err(e) => {
                let opts = self.cell_options(timeout);
                let count = self.kernel.as_ref().map_or(1, Kernel::execution_count);
                let failed = channel_failed(count, opts.output_cap, start.began.started_at);
                (failed, Some(crate::chain(&e)))
            }
        };
        let ended = start.began.end(&self.workspace);

        let mut error = outcome.error.map(|e| ErrorInfo {
            name: e.name,
            value: e.value,
            traceback: e.traceback,
        });
        let mut killed_by = None;
        let status = match outcome.status {
            CellStatus::Ok => ExecutionStatus::Ok,
            CellStatus::Error => ExecutionStatus::Error,
            CellStatus::Interrupted => ExecutionStatus::Interrupted,
            CellStatus::TimedOut => {
                let tb = error.map(|e| e.traceback).unwrap_or_default();
                error = Some(ErrorInfo {
                    name: "TimeoutError".into(),
                    value: format!(
                        "the cell exceeded its {} s time limit and was interrupted; the session keeps its state",
                        timeout.as_secs_f64()
                    ),
                    traceback: tb,
                });
                ExecutionStatus::Timeout
            }
            CellStatus::KernelDied { killed_by: k, exit } => {
                killed_by = k;
                // The session restarts at once, so the next cell finds it ready.
                self.kernel = None;
                let restarted = !shared.lock().deleted && self.ensure_kernel(shared).is_ok();
                error = Some(match (&outcome.protocol_error, &failure) {
                    (Some(what), _) => protocol_error(what, restarted),
                    (None, Some(why)) => ErrorInfo {
                        name: "KernelDied".into(),
                        value: format!(
                            "the kernel was killed: its channel failed ({why}). {}",
                            restart_notice(restarted)
                        ),
                        traceback: String::new(),
                    },
                    (None, None) => died_error(k, exit, &limits, timeout, restarted),
                });
                ExecutionStatus::Killed
            }
        };
        {
            let mut s = shared.lock();
            if s.info.status == SessionStatus::Busy {
                s.info.status = SessionStatus::Ready;
            }
            let now = Utc::now();
            s.info.last_active_at = now;
            s.info.expires_at = now + chrono::Duration::seconds(limits.idle_timeout_s as i64);
        }
        let restored = shared.lock().restored.take();
        let mut execution = ended.execution(Produced {
            language: start.language,
            execution_count: outcome.execution_count,
            status,
            error,
            stdout: &outcome.stdout,
            stderr: &outcome.stderr,
            results: outcome
                .results
                .into_iter()
                .map(|(is_main_result, data)| ResultItem::new(is_main_result, data))
                .collect(),
            results_dropped: outcome.dropped.count > 0,
            usage: runcell_sandbox::Usage {
                wall: outcome.wall,
                cpu: outcome.cpu,
                peak_memory_bytes: outcome.peak_memory_bytes,
            },
            killed_by,
        });
        execution.restored = restored;
        execution.network = network;
        execution.tool_calls = tool_calls;
        Ok((execution, start.owner))
    }
}
