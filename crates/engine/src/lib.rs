//! runcell-engine: sessions, executions, files, limits and audit events — the domain, in
//! domain words. Knows nothing of HTTP; runs code only through `runcell-sandbox`.
#![forbid(unsafe_code)]

mod audit;
mod bounds;
mod commands;
mod core;
mod execution;
mod files;
mod launch;
mod limits;
mod model;
mod oneshot;
mod pool;
mod records;
mod session;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod tools;
mod zygote;

use std::path::PathBuf;

pub use crate::core::{workspaces_dir, Engine, EngineConfig};
pub use crate::launch::SANDBOX_PYTHON;
pub use crate::limits::{
    HostCapacity, LimitPolicy, LimitsRequest, Maxima, SessionLimits, TenantPolicy, MAX_IDLE_S,
    MAX_TIMEOUT, MAX_TIMEOUT_CEILING, ONE_SHOT_TIMEOUT, OUTPUT_CAP_BYTES, RETRY_AFTER,
};
pub use bounds::{
    check_code, check_env, check_metadata, Bound, BOUNDS, MAX_CODE_BYTES, MAX_COMMAND_BYTES,
    MAX_ENV_BYTES, MAX_ENV_VARS, MAX_ENV_VAR_BYTES, MAX_FILE_BYTES, MAX_FILE_CHANGES,
    MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS, MAX_REQUEST_BYTES,
    MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES,
};
pub use commands::CommandOutput;
pub use files::FileEntry;
pub use model::{
    new_id, new_ordered_id, ErrorInfo, Execution, ExecutionStatus, FileChange, FileChangeKind,
    KilledBy, Language, ResultItem, Truncated, UsageInfo,
};
pub use oneshot::{InputFile, OneShot, OneShotOutcome};
pub use records::ExecutionPage;
pub use runcell_sandbox::{Stream, MAX_PATH_CHARS};
pub use session::{
    CancelToken, CreateSession, EventSink, ExecEvent, SandboxSlot, SessionInfo, SessionManager,
    SessionStatus, Start, QUEUE_DEPTH,
};
pub use zygote::{ZygoteStatus, DEFAULT_PRELOAD};

/// The tenant of callers without one: a server without API keys (loopback only) serves
/// everyone as this tenant, and an engine's records of an empty owner are kept under it.
pub const OPEN_TENANT: &str = "default";

/// How many sandboxes can run at once on one host: each runs as a host uid of its own, from a
/// range of this many.
pub const MAX_SANDBOXES: u32 = runcell_sandbox::HOST_UID_COUNT;

/// Errors of the engine, in the words a caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request itself is wrong (bad path, limit out of range); retrying will not help.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// This host cannot run code safely right now (a mandatory isolation layer is missing).
    #[error("runcell cannot run code on this host: {0}")]
    Unavailable(String),
    /// The host has no room for another sandbox right now (the session cap its descriptors
    /// and uids allow); retrying later may succeed, as soon as any sandbox ends.
    #[error("at capacity: {0}")]
    AtCapacity(String),
    /// The server's committed-memory budget for sandboxes is used up (admission control);
    /// retrying later may succeed, once sessions holding memory end.
    #[error("{0}")]
    OverCommitted(String),
    /// The sandbox failed while running the code.
    #[error("sandbox failure: {0}")]
    Sandbox(String),
    #[error("not found: {0}")]
    NotFound(String),
    /// The request is well formed but the workspace's state refuses it: a file stands where
    /// a directory is needed (or the reverse), a directory is not empty, a path goes through a
    /// symbolic link the session made. The same request can work once the state changes.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A size or count limit (a full workspace, a file too large, a limit over the
    /// server's maximum).
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    /// The request carries more than runcell takes (code over [`MAX_CODE_BYTES`]).
    #[error("payload too large: {0}")]
    PayloadTooLarge(String),
    /// The tenant's quota (live sessions, their memory) is used up; ending one of its
    /// sessions frees it.
    #[error("{0}")]
    QuotaExceeded(String),
    /// Too many executions are already waiting on the session.
    #[error("session busy: {0}")]
    SessionBusy(String),
    /// The caller called the request off before it ran.
    #[error("the execution was cancelled before it started")]
    Cancelled,
    /// Where runcell keeps its data (the database, the data dir) has no room: nothing was
    /// recorded or written, and the same request works again once space is freed.
    #[error("insufficient storage: {0}")]
    InsufficientStorage(String),
    /// Something runcell itself failed at (the audit log, a thread).
    #[error("internal error: {0}")]
    Internal(String),
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The MIME type reported for a workspace file, from its extension.
pub fn mime_of(path: &str) -> String {
    mime_guess::from_path(path)
        .first_raw()
        .unwrap_or("application/octet-stream")
        .to_owned()
}

/// An error and its causes on one line (`a: b: c`), for messages and logs.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// The first 12 hex digits of the SHA-256 of `data`: names that change with content.
pub(crate) fn short_hash(data: &[u8]) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(data);
    d.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

pub(crate) use error_chain as chain;
