//! Language-state snapshots (issue 17, durable sessions), host side: ask a live kernel to
//! write its state (variables, functions, classes, modules by name; bash's variables,
//! functions, aliases and cwd) to a file inside its sandbox, or to read one back.
//!
//! The host never reads the file: pickles are code, so it is written, checked and
//! unpickled by the kernel, inside the sandbox (`python/runcell_snapshot.py` holds the
//! format). The host only learns what the kernel reports, which the session's own code
//! could forge; a report is information for the user, never a decision for the host.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use runcell_protocol::{HostMessage, KernelMessage, SkippedName, SnapshotRefusal};
use runcell_sandbox::{ExitStatus, KillReason};

use crate::process::{CellOptions, CellStatus, Kernel, KernelError, ResultLimits};

/// Longest path a request takes (Linux's PATH_MAX).
const MAX_PATH: usize = 4096;

/// How long a snapshot or restore may take before the kernel is interrupted (pickling and
/// unpickling run the session's own code: `__reduce__`, `__setstate__`), and how long it
/// then has to give up before it is killed.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotOptions {
    pub timeout: Duration,
    pub grace: Duration,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(60),
            grace: Duration::from_secs(2),
        }
    }
}

/// A snapshot the kernel wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotReport {
    /// Size of the file.
    pub bytes: u64,
    /// The names saved.
    pub names: Vec<String>,
    /// The names that could not be saved, and why.
    pub skipped: Vec<SkippedName>,
    /// Names left out of both lists (over [`runcell_protocol::MAX_REPORT_NAMES`]).
    pub omitted: u64,
    /// The kernel's time for it.
    pub duration: Duration,
    /// The host's, from sending the request to its end.
    pub wall: Duration,
}

/// A snapshot the kernel read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    pub names: Vec<String>,
    /// In the snapshot but not restored (a module that cannot be imported, a library class
    /// that is gone, a name that refers to one of those), and why.
    pub skipped: Vec<SkippedName>,
    pub omitted: u64,
    pub duration: Duration,
    pub wall: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(
        "invalid snapshot path {0:?}: it must be absolute, without NUL, at most {MAX_PATH} bytes"
    )]
    InvalidPath(String),
    /// The file cannot be restored (missing, truncated, corrupt, incompatible); nothing in
    /// it was loaded and the session's state is as it was.
    #[error("snapshot refused")]
    Refused(#[source] SnapshotRefusal),
    /// The kernel could not do it (the directory is missing, the disk is full, ...).
    #[error("the kernel failed: {name}: {value}")]
    Failed { name: String, value: String },
    #[error("interrupted at the deadline of {0:?}")]
    TimedOut(Duration),
    #[error("interrupted")]
    Interrupted,
    /// The kernel is gone (killed at the end of the grace period, out of memory, crashed,
    /// or it broke the protocol): it must be replaced, as after a cell that killed it.
    #[error("the kernel died ({exit:?}, killed by {killed_by:?}){}", protocol_error.as_deref().map(|p| format!(": {p}")).unwrap_or_default())]
    KernelDied {
        killed_by: Option<KillReason>,
        exit: ExitStatus,
        protocol_error: Option<String>,
    },
    /// The kernel ended the request without its report (one that predates snapshots).
    #[error("the kernel ended the {0} without a report")]
    NoReport(&'static str),
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl Kernel {
    /// Asks the kernel to write its language state to `path`, a file inside its sandbox
    /// (written to a temporary file beside it, then renamed over it). Names that cannot be
    /// saved (open files, sockets, threads, generators, ...) are in the report's `skipped`.
    pub fn snapshot(
        &mut self,
        path: &str,
        opts: &SnapshotOptions,
    ) -> Result<SnapshotReport, SnapshotError> {
        let (reply, wall) = self.snapshot_request("snapshot", path, opts)?;
        match reply {
            Some(KernelMessage::Snapshotted {
                bytes,
                names,
                skipped,
                omitted,
                duration_us,
                ..
            }) => Ok(SnapshotReport {
                bytes,
                names,
                skipped,
                omitted,
                duration: Duration::from_micros(duration_us),
                wall,
            }),
            _ => Err(SnapshotError::NoReport("snapshot")),
        }
    }

    /// Asks the kernel to read the snapshot at `path` (inside its sandbox) into its session.
    /// A file that is missing, truncated, damaged or from an incompatible runtime is
    /// [`SnapshotError::Refused`] before anything in it is loaded.
    pub fn restore(
        &mut self,
        path: &str,
        opts: &SnapshotOptions,
    ) -> Result<RestoreReport, SnapshotError> {
        let (reply, wall) = self.snapshot_request("restore", path, opts)?;
        match reply {
            Some(KernelMessage::Restored {
                names,
                skipped,
                omitted,
                duration_us,
                ..
            }) => Ok(RestoreReport {
                names,
                skipped,
                omitted,
                duration: Duration::from_micros(duration_us),
                wall,
            }),
            _ => Err(SnapshotError::NoReport("restore")),
        }
    }

    /// Runs one snapshot or restore request; `Ok` with the report when the kernel says it
    /// succeeded.
    fn snapshot_request(
        &mut self,
        kind: &'static str,
        path: &str,
        opts: &SnapshotOptions,
    ) -> Result<(Option<KernelMessage>, Duration), SnapshotError> {
        if !path.starts_with('/') || path.contains('\0') || path.len() > MAX_PATH {
            return Err(SnapshotError::InvalidPath(path.to_owned()));
        }
        // Ids of their own, never one of the engine's execution ids, and never the last
        // request's (whose late frames must not pass for this one's).
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = format!("{kind}-{}", NEXT.fetch_add(1, Ordering::Relaxed));
        let msg = match kind {
            "snapshot" => HostMessage::Snapshot {
                id: id.clone(),
                path: path.to_owned(),
            },
            _ => HostMessage::Restore {
                id: id.clone(),
                path: path.to_owned(),
            },
        };
        let cell = CellOptions {
            timeout: opts.timeout,
            grace: opts.grace,
            // What the session's code prints while it is pickled is nobody's output; a
            // little is kept for the error, a flood kills the kernel as in a cell.
            output_cap: 16 << 10,
            output_kill_bytes: 64 << 20,
            results: ResultLimits::default(),
            ack: false,
        };
        let (out, reply) = self.request(&id, &msg, &cell)?;
        match out.status {
            CellStatus::Ok => Ok((reply, out.wall)),
            CellStatus::Error => match (reply, out.error) {
                (Some(KernelMessage::SnapshotRefused { refusal, .. }), _) => {
                    Err(SnapshotError::Refused(refusal))
                }
                (_, Some(e)) => Err(SnapshotError::Failed {
                    name: e.name,
                    value: e.value,
                }),
                (_, None) => Err(SnapshotError::NoReport(kind)),
            },
            CellStatus::TimedOut => Err(SnapshotError::TimedOut(opts.timeout)),
            CellStatus::Interrupted => Err(SnapshotError::Interrupted),
            CellStatus::KernelDied { killed_by, exit } => Err(SnapshotError::KernelDied {
                killed_by,
                exit,
                protocol_error: out.protocol_error,
            }),
        }
    }
}
