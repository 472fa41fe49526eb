//! runcell-engine: sessions, executions, files, limits and audit events — the domain, in
//! domain words. Knows nothing of HTTP; runs code only through `runcell-sandbox`.
#![forbid(unsafe_code)]

mod approval;
mod audit;
mod batch;
mod bounds;
pub mod bridge;
mod commands;
mod core;
mod durable;
mod engine;
mod error;
mod execution;
mod files;
mod hashing;
mod kept_files;
mod launch;
mod limits;
mod mcp_tools;
mod model;
mod network;
mod oneshot;
mod oneshot_pool;
mod paused;
mod pool;
mod provenance;
mod records;
mod replay;
mod restored;
mod rich;
mod session;
pub mod snapshots;
mod spares;
mod stamp;
mod takeover;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod tools;
mod verdict;
mod zygote;

pub use crate::approval::{ApprovalRecord, Decision};
pub use crate::core::{workspaces_dir, EngineConfig};
pub use crate::engine::Engine;
pub use crate::error::{
    Amount, Busy, Capacity, Cause, Committed, Ended, EngineError, Invalid, Limit, NoSpace,
    Oversize, Quota, RecordError, Resource, Unresumable, WorkspaceConflict,
};
pub use crate::launch::SANDBOX_PYTHON;
pub use crate::limits::{
    whole_number, HostCapacity, LimitPolicy, LimitsRequest, Maxima, SessionLimits, TenantPolicy,
    MAX_IDLE_S, MAX_TIMEOUT, MAX_TIMEOUT_CEILING, ONE_SHOT_TIMEOUT, OUTPUT_CAP_BYTES, RETRY_AFTER,
};
pub use crate::records::APPROVAL_PREFIX;
pub use batch::{BatchRun, Gate, MAX_BATCH_CONCURRENCY, MAX_BATCH_RUNS};
pub use bounds::{
    check_code, check_env, check_metadata, Bound, BOUNDS, MAX_CODE_BYTES, MAX_COMMAND_BYTES,
    MAX_ENV_BYTES, MAX_ENV_VARS, MAX_ENV_VAR_BYTES, MAX_FILE_BYTES, MAX_FILE_CHANGES,
    MAX_METADATA_KEYS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS, MAX_REQUEST_BYTES,
    MAX_RESULTS, MAX_RESULTS_BYTES, MAX_RESULT_BYTES,
};
pub use commands::{CommandOutput, WatchedCommand};
pub use files::FileEntry;
pub use hashing::{sha256_hex, sha256_of, MAX_HASHED_BYTES};
pub use model::{
    new_id, new_ordered_id, ErrorInfo, Execution, ExecutionStatus, FileChange, FileChangeKind,
    KilledBy, Language, ResultItem, Start, Truncated, UsageInfo,
};
pub use network::{
    DomainSecretSpec, KeyEgressBound, NetworkConfig, NetworkConnection, NetworkPolicy, BUNDLE_FILE,
    CA_FILE, EGRESS_PORT, PACKAGES_DIR, TRUST_DIR,
};
pub use oneshot::{InputFile, OneShot, OneShotOutcome, MAX_ARGS, MAX_ARG_CHARS};
pub use provenance::producer;
pub use records::{session_of_record, ExecutionPage};
pub use replay::{sources_of_difference, CellReplay, ReplayCheck, ReplayReport, UploadRestore};
pub use restored::{Restored, Skipped};
pub use rich::chart_summary;
pub use runcell_sandbox::{Stream, MAX_PATH_CHARS};
pub use session::{
    CancelToken, CreateSession, EventSink, ExecEvent, SandboxSlot, SessionInfo, SessionManager,
    SessionStatus, QUEUE_DEPTH,
};
pub use stamp::{ImageOrigin, ImageSigner, SIGNED_IMAGE_TYPES};
pub use verdict::{
    Check, Comparison, Judged, TestCase, TestResult, TestSummary, Verdict, DEFAULT_TOLERANCE,
    MAX_TESTS_PER_RUN,
};
pub use zygote::{ZygoteStatus, DEFAULT_PRELOAD};

/// The tenant of callers without one: a server without API keys (loopback only) serves
/// everyone as this tenant, and an engine's records of an empty owner are kept under it.
pub const OPEN_TENANT: &str = "default";

/// How many sandboxes can run at once on one host: each runs as a host uid of its own, from a
/// range of this many.
pub const MAX_SANDBOXES: u32 = runcell_sandbox::HOST_UID_COUNT;

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
