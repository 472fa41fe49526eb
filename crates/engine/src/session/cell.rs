//! One cell as its caller sees it (events as they happen, a token to call it off) and how a
//! cell that ended badly is told: the errors of a timeout, a killed kernel, a broken channel.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use runcell_sandbox::KillReason;

use crate::limits::SessionLimits;
use crate::model::{ErrorInfo, ResultItem};

/// Output of a running execution, as it happens.
#[derive(Debug)]
pub enum ExecEvent<'a> {
    Stdout(&'a str),
    Stderr(&'a str),
    Result(&'a ResultItem),
    Error(&'a ErrorInfo),
}

/// Receives [`ExecEvent`]s on the session's worker thread.
pub type EventSink = Box<dyn FnMut(ExecEvent<'_>) + Send>;

/// Cancels one execution request: skipped if still queued, interrupted if running, and never
/// anyone else's (a client that gives up while queued must not interrupt the one running).
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<std::sync::atomic::AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    /// Calls the request off (see `SessionManager::cancel`).
    pub(super) fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    pub(super) fn is_cancelled(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(super) fn same(&self, other: &CancelToken) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The outcome of a cell whose kernel's channel failed (sent, never answered): ended like a
/// kernel killed by a signal, with nothing it printed.
pub(super) fn channel_failed(
    execution_count: u64,
    output_cap: usize,
    started_at: DateTime<Utc>,
) -> runcell_kernel::CellOutcome {
    runcell_kernel::CellOutcome {
        status: runcell_kernel::CellStatus::KernelDied {
            killed_by: Some(KillReason::Signal),
            exit: runcell_sandbox::ExitStatus::Signal(9),
        },
        execution_count,
        stdout: runcell_sandbox::CappedOutput::new(output_cap),
        stderr: runcell_sandbox::CappedOutput::new(output_cap),
        results: Vec::new(),
        results_bytes: 0,
        dropped: Default::default(),
        protocol_error: None,
        error: None,
        wall: Utc::now()
            .signed_duration_since(started_at)
            .to_std()
            .unwrap_or_default(),
        cpu: Duration::ZERO,
        peak_memory_bytes: 0,
    }
}

/// The error of a cell whose kernel was killed for breaking the channel protocol (code that
/// wrote to the kernel's channel itself, say).
pub(super) fn protocol_error(what: &str, restarted: bool) -> ErrorInfo {
    ErrorInfo {
        name: "ProtocolError".into(),
        value: format!(
            "the kernel was killed: it broke the channel protocol ({what}). {}",
            restart_notice(restarted)
        ),
        traceback: String::new(),
    }
}

pub(super) fn restart_notice(restarted: bool) -> &'static str {
    if restarted {
        "The session was restarted: variables and imports are lost; files in /workspace are kept."
    } else {
        "The session could not be restarted."
    }
}

pub(super) fn died_error(
    killed_by: Option<KillReason>,
    exit: runcell_sandbox::ExitStatus,
    limits: &SessionLimits,
    timeout: Duration,
    restarted: bool,
) -> ErrorInfo {
    let (name, what) = match killed_by {
        Some(KillReason::Timeout) => (
            "TimeoutError",
            format!(
                "the cell exceeded its {} s time limit and did not stop when interrupted, so the kernel was killed",
                timeout.as_secs_f64()
            ),
        ),
        Some(KillReason::Oom) => (
            "MemoryError",
            format!(
                "the kernel was killed: the memory limit of {} MiB was exceeded",
                limits.memory_mb
            ),
        ),
        Some(KillReason::Pids) => (
            "ProcessLimitError",
            format!("the kernel was killed: the limit of {} processes was reached", limits.pids),
        ),
        Some(KillReason::Output) => (
            "OutputLimitError",
            "the kernel was killed: the cell printed too much output".to_owned(),
        ),
        Some(KillReason::Signal) | None => (
            "KernelDied",
            match exit {
                runcell_sandbox::ExitStatus::Signal(s) => {
                    format!("the kernel died of signal {s} (a crash in native code?)")
                }
                runcell_sandbox::ExitStatus::Code(c) => format!("the kernel exited with code {c}"),
            },
        ),
    };
    ErrorInfo {
        name: name.into(),
        value: format!("{what}. {}", restart_notice(restarted)),
        traceback: String::new(),
    }
}
