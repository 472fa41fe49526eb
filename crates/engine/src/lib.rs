//! runcell-engine: sessions, executions, files, limits and audit events — the domain, in
//! domain words. Knows nothing of HTTP; runs code only through `runcell-sandbox`.
#![forbid(unsafe_code)]

mod model;
mod oneshot;

use std::path::PathBuf;

pub use model::{
    new_id, ErrorInfo, Execution, ExecutionStatus, FileChange, FileChangeKind, KilledBy, Language,
    ResultItem, Truncated, UsageInfo,
};
pub use oneshot::{
    Engine, EngineConfig, InputFile, LimitsRequest, OneShot, OneShotOutcome, MAX_TIMEOUT,
};
pub use runcell_sandbox::Stream;

/// Errors of the engine, in the words a caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request itself is wrong (bad path, limit out of range); retrying will not help.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// This host cannot run code safely right now (a mandatory isolation layer is missing).
    #[error("runcell cannot run code on this host: {0}")]
    Unavailable(String),
    /// The sandbox failed while running the code.
    #[error("sandbox failure: {0}")]
    Sandbox(String),
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
