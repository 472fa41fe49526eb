//! The engine's errors, in the words a caller can act on.
//!
//! A refusal a client is told about is a variant holding its detail (which session, which
//! path, which limit and its values): the variant decides what kind of refusal it is (the
//! server's status), the detail's `Display` is what the client is told, and the variant's
//! `Display` puts the two together. A failure of runcell itself keeps its cause as
//! [`std::error::Error::source`], and its message never repeats the cause: print the chain
//! ([`crate::error_chain`], `{:#}`) to see it.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use runcell_sandbox::doctor::Layer;

use crate::model::Language;

/// Errors of the engine, in the words a caller can act on.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request itself is wrong (bad path, limit out of range); retrying will not help.
    #[error("invalid request: {0}")]
    InvalidRequest(Invalid),
    /// A mandatory isolation layer is missing on this host: runcell refuses to run code.
    #[error("runcell cannot run code on this host: {}", layer_list(.layers))]
    IsolationMissing { layers: Vec<Layer> },
    /// This host cannot run code right now: it gives no uid, no workspace, no cgroup.
    #[error("runcell cannot run code on this host")]
    Unavailable(#[source] Cause),
    /// A thread the engine needs could not be started (the host is out of threads).
    #[error("runcell cannot run code on this host: cannot start {thread}")]
    NoThread {
        thread: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The host has no room for another sandbox right now (the session cap its descriptors
    /// and uids allow); retrying later may succeed, as soon as any sandbox ends.
    #[error("at capacity: {0}")]
    AtCapacity(Capacity),
    /// The server's committed-memory budget for sandboxes is used up (admission control);
    /// retrying later may succeed, once sessions holding memory end.
    #[error("{0}")]
    OverCommitted(Committed),
    /// The sandbox failed while running the code.
    #[error("sandbox failure")]
    Sandbox(#[source] Cause),
    /// A session's kernel was gone when a cell was to run in it.
    #[error("sandbox failure: no kernel")]
    NoKernel,
    #[error("not found: {0}")]
    NotFound(Resource),
    /// The session is gone (deleted, expired, dead): nothing more runs in it. Not the same as
    /// a session that never existed: a client that had one learns that it ended.
    #[error("not found: {0}")]
    SessionEnded(Ended),
    /// The request is well formed but the workspace's state refuses it: a file stands where
    /// a directory is needed (or the reverse), a directory is not empty, a path goes through a
    /// symbolic link the session made. The same request can work once the state changes.
    #[error("conflict: {0}")]
    Conflict(WorkspaceConflict),
    /// A size or count limit (a full workspace, a file too large, a limit over the
    /// server's maximum).
    #[error("limit exceeded: {0}")]
    LimitExceeded(Limit),
    /// The request carries more than runcell takes (code over [`crate::MAX_CODE_BYTES`]).
    #[error("payload too large: {0}")]
    PayloadTooLarge(Oversize),
    /// The tenant's quota (live sessions, their memory) is used up; ending one of its
    /// sessions frees it.
    #[error("{0}")]
    QuotaExceeded(Quota),
    /// The session cannot take the request now (its queue is full).
    #[error("session busy: {0}")]
    SessionBusy(Busy),
    /// The caller called the request off before it ran.
    #[error("the execution was cancelled before it started")]
    Cancelled,
    /// A pause or resume that cannot be done (durable.rs).
    #[error("{0}")]
    Unresumable(Unresumable),
    /// Where runcell keeps its data (the database, the data dir) has no room: nothing was
    /// recorded or written, and the same request works again once space is freed.
    #[error("insufficient storage: {0}")]
    InsufficientStorage(NoSpace),
    /// The audit log did not take a finished execution (for a reason other than a full
    /// store, which is [`EngineError::InsufficientStorage`]): its reply is this error, since
    /// nothing is acknowledged that was not recorded.
    #[error("internal error: cannot record the execution")]
    NotRecorded(#[source] RecordError),
    /// The store failed at what it keeps for the engine (sessions, uploads, the audit log)
    /// otherwise than for a full disk ([`EngineError::InsufficientStorage`]); its error is
    /// the source.
    #[error("internal error: the store failed")]
    Store(#[source] runcell_store::StoreError),
    /// The tenants' policies (quotas, default start) could not be read.
    #[error("internal error: cannot read the tenant's quota")]
    TenantPolicy {
        owner: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What is wrong with a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Invalid {
    /// A workspace path that is absolute, climbs out, holds a NUL or is too long.
    #[error("invalid path {path:?}: {reason}")]
    Path { path: String, reason: &'static str },
    /// A limit below the least runcell takes. A fractional minimum (CPUs) is also what a
    /// value that is not a number at all is told.
    #[error("{limit} must be {}at least {minimum}", a_number(.minimum))]
    BelowMinimum {
        limit: &'static str,
        minimum: Amount,
    },
    /// A time limit of zero.
    #[error("{limit} must be positive")]
    NotPositive { limit: &'static str },
    /// The server's own limit settings contradict each other (a default over its maximum).
    #[error("{0}")]
    Policy(String),
    /// A zygote start asked for a language the zygote does not serve.
    #[error("start \"zygote\" is for python sessions; {} sessions start cold", .language.as_str())]
    ZygoteStart { language: Language },
    /// Session metadata over one of its bounds (what is over is the text).
    #[error("metadata: {0}")]
    Metadata(String),
    /// A session environment over one of its bounds, or a variable no `execve` can pass.
    #[error("env: {0}")]
    Env(String),
    /// Input the store refuses (a value over its bounds), in the store's words.
    #[error("{0}")]
    Store(String),
    /// A one-shot run (or a batch of them) the engine cannot run as asked; the text says why.
    #[error("{0}")]
    Run(String),
    /// A shell command with a NUL byte.
    #[error("the command contains a NUL byte, which no program argument can hold")]
    NulInCommand,
    /// A malformed network policy (a domain pattern, a secret's header).
    #[error("network: {0}")]
    Network(String),
}

/// What was not found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Resource {
    #[error("session {id}")]
    Session { id: String },
    /// The workspace of a session a previous server left behind (recovery).
    #[error("workspace of session {session}")]
    Workspace { session: String },
    /// A path in a session's workspace.
    #[error("file {path}")]
    File { path: String },
    /// A record the store does not hold (a recorded execution, a `before` cursor), in the
    /// store's words.
    #[error("{0}")]
    Record(String),
}

/// A session that has ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("session {id} {}", ended_how(.during_execution))]
pub struct Ended {
    pub id: String,
    /// It ended while the request waited for it (a queued cell of a deleted session).
    pub during_execution: bool,
}

/// How a workspace's state refuses a request. `path` is relative to /workspace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceConflict {
    /// A component of the path is a file, or a symbolic link (never followed).
    #[error("{path}: a component of the path is a file or a symbolic link")]
    NotADirectory { path: String },
    #[error("{path} is a directory")]
    IsADirectory { path: String },
    #[error("directory {path} is not empty")]
    NotEmpty { path: String },
    /// A device, a socket, a pipe: nothing a file operation takes.
    #[error("{path} is not a regular file")]
    NotARegularFile { path: String },
    /// A name within the API's 255 characters that is over the filesystem's 255 bytes.
    #[error("{path}: a name in it is longer than the workspace filesystem's 255 bytes")]
    NameTooLong { path: String },
}

/// Which limit a request went past, with its values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Limit {
    /// A limit asked over its maximum. `option` is the `serve` flag that sets the maximum;
    /// `None` when the maximum is the host's (what it can give), which no flag raises.
    #[error("{limit} {value} exceeds {} maximum of {maximum}{}", whose(.option), flag(.option))]
    OverMaximum {
        limit: &'static str,
        value: Amount,
        maximum: Amount,
        option: Option<String>,
    },
    /// The workspace's size limit is reached (writing `path`).
    #[error("the workspace is full ({path})")]
    WorkspaceFull { path: String },
    /// A workspace file over the size one download or upload moves.
    #[error("{path} is larger than {} MiB", .maximum_bytes >> 20)]
    FileTooLarge { path: String, maximum_bytes: u64 },
    /// An upload over that size, refused before anything is written.
    #[error("files are limited to {} MiB", .maximum_bytes >> 20)]
    UploadTooLarge { size: u64, maximum_bytes: u64 },
    /// A network allowlist beyond what the server allows (`serve --egress-allow`).
    #[error("network: {0}")]
    Network(String),
}

/// A limit's value: whole (MiB, pids, seconds) or not (CPUs, a timeout's seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    Whole(u64),
    Real(f64),
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Whole(n) => n.fmt(f),
            Amount::Real(x) => x.fmt(f),
        }
    }
}

impl From<u64> for Amount {
    fn from(n: u64) -> Self {
        Amount::Whole(n)
    }
}

impl From<f64> for Amount {
    fn from(x: f64) -> Self {
        Amount::Real(x)
    }
}

/// A request part over its size bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} is {size} bytes, over the limit of {limit} bytes; put data and long scripts in files instead")]
pub struct Oversize {
    /// "the code", "the command".
    pub what: &'static str,
    pub size: usize,
    pub limit: usize,
}

/// Which of a tenant's quotas a new session would go past. `owner` is the tenant (empty for
/// the open tenant of a server without keys).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Quota {
    #[error("tenant quota: {} already has {live} live session{} of its max_sessions {maximum}; delete one, or raise the quota (runcell keys update KEY --max-sessions N)", tenant_name(.owner), plural(.live))]
    Sessions {
        owner: String,
        live: u64,
        maximum: u64,
    },
    #[error("tenant quota: {} has {live_mb} MiB in live sessions and {asked_mb} MiB more exceeds its max_memory_mb {maximum_mb}; delete a session, or raise the quota (runcell keys update KEY --max-memory-mb M)", tenant_name(.owner))]
    MemoryMb {
        owner: String,
        live_mb: u64,
        asked_mb: u64,
        maximum_mb: u64,
    },
}

/// Why a session cannot take a request now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Busy {
    /// Its queue holds as many executions as it takes.
    #[error("session {id} already has {waiting} executions waiting")]
    Queue { id: String, waiting: usize },
    /// Its worker cannot take another job (a restart).
    #[error("session {id} is busy")]
    Worker { id: String },
    /// A cell runs or waits, and a pause or a fork needs the session idle (409): it never
    /// waits behind a cell that may run for an hour.
    #[error("session {id} is running an execution; pause or fork it once it is idle")]
    Running { id: String },
}

/// The session cap of this server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this server runs at most {max_sessions} sessions at once (serve --max-sessions, or what its open-files limit and uid range allow); delete one or retry later")]
pub struct Capacity {
    pub max_sessions: usize,
}

/// A sandbox's memory past the server's committed-memory budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the server is at capacity: {committed_mb} of its {budget_mb} MiB for sandboxes are committed and this needs {asked_mb} MiB more (serve --max-committed-memory-mb); retry later or ask for less memory")]
pub struct Committed {
    pub asked_mb: u64,
    pub committed_mb: u64,
    pub budget_mb: u64,
}

/// Where runcell found no room. The host path stays in the server's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoSpace {
    /// The data directory (workspaces' mount points, kernel files).
    #[error("the server's data directory is full (cannot {action} a file there); retry once space is freed")]
    DataDir { action: &'static str },
    /// The database, for a write other than an execution's record (a session's, an
    /// upload's).
    #[error("{}", RecordError::NoSpace)]
    Database,
    /// The store the audit log is in ([`RecordError::NoSpace`]).
    #[error("cannot record the execution: {}", RecordError::NoSpace)]
    Audit,
    /// A pause's (or fork's) snapshot found no room in the session's workspace or the data
    /// dir: the session keeps running, as it was.
    #[error("cannot pause session {id}: its snapshot found no room in the {place}; the session keeps running")]
    Snapshot { id: String, place: &'static str },
}

/// Why a session cannot be paused or resumed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unresumable {
    /// Its runtime was removed from this server since it paused.
    #[error("session {id} cannot resume: its runtime ({runtime}) is not installed on this server any more; install it again (runcell runtime install) or delete the session")]
    RuntimeMissing { id: String, runtime: String },
    /// The kernel could not write its snapshot (the session keeps running).
    #[error("cannot snapshot session {id}: {reason}; the session keeps running")]
    SnapshotFailed { id: String, reason: String },
}

/// Why the audit log could not record an execution.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RecordError {
    /// The store has no room (its disk is full): nothing was recorded, and recording works
    /// again once space is freed.
    #[error(
        "the server's disk is full: nothing was recorded; retry once the operator frees space"
    )]
    NoSpace,
    /// The store failed otherwise; its error is the source. (`Arc`: one failed commit fails
    /// every execution of its batch.)
    #[error(transparent)]
    Store(Arc<dyn std::error::Error + Send + Sync>),
    /// The store answered a batch with fewer results than it was given.
    #[error("the audit store gave no answer for it")]
    NoAnswer,
    /// The store panicked while recording the batch.
    #[error("the audit store panicked")]
    Panicked,
    /// The audit writer is gone (the engine is shutting down).
    #[error("the audit writer has stopped")]
    WriterStopped,
}

impl RecordError {
    /// A store's failure, kept whole as the source.
    pub fn store(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        RecordError::Store(Arc::new(e))
    }

    fn store_error(&self) -> Option<&runcell_store::StoreError> {
        match self {
            RecordError::Store(e) => e.downcast_ref::<runcell_store::StoreError>(),
            _ => None,
        }
    }

    /// Whether the store could not be reached (a database restarting or cut off): nothing
    /// was recorded, and the same request may work in a moment.
    pub fn store_unavailable(&self) -> bool {
        self.store_error()
            .is_some_and(runcell_store::StoreError::is_unavailable)
    }

    /// Why the store refused to record for this node, if it did because the node can no
    /// longer prove it owns the session ([`runcell_store::StoreError::Fenced`]).
    pub fn fenced(&self) -> Option<String> {
        match self.store_error() {
            Some(runcell_store::StoreError::Fenced(m)) => Some(m.clone()),
            _ => None,
        }
    }
}

impl From<RecordError> for EngineError {
    /// The engine's error for an execution that was not recorded.
    fn from(e: RecordError) -> Self {
        match e {
            RecordError::NoSpace => EngineError::InsufficientStorage(NoSpace::Audit),
            other => EngineError::NotRecorded(other),
        }
    }
}

/// The error of a crate below the engine that a sandbox failed with, kept whole.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    #[error(transparent)]
    Sandbox(#[from] runcell_sandbox::SandboxError),
    #[error(transparent)]
    Workspace(#[from] runcell_sandbox::WorkspaceError),
    #[error(transparent)]
    Uid(#[from] runcell_sandbox::UserNsError),
    #[error(transparent)]
    Kernel(#[from] runcell_kernel::KernelError),
}

impl EngineError {
    /// `map_err(EngineError::sandbox)`: the sandbox failed with `e`.
    pub(crate) fn sandbox(e: impl Into<Cause>) -> Self {
        EngineError::Sandbox(e.into())
    }

    /// `map_err(EngineError::unavailable)`: the host cannot give what a sandbox needs.
    pub(crate) fn unavailable(e: impl Into<Cause>) -> Self {
        EngineError::Unavailable(e.into())
    }

    /// The session `id` does not exist.
    pub(crate) fn no_session(id: &str) -> Self {
        EngineError::NotFound(Resource::Session { id: id.to_owned() })
    }

    /// The session `id` has ended; `during_execution`: while the request waited for it.
    pub(crate) fn ended(id: &str, during_execution: bool) -> Self {
        EngineError::SessionEnded(Ended {
            id: id.to_owned(),
            during_execution,
        })
    }
}

fn layer_list(layers: &[Layer]) -> String {
    layers
        .iter()
        .map(|l| format!("{}: {}", l.name, l.detail))
        .collect::<Vec<_>>()
        .join("; ")
}

fn ended_how(during_execution: &bool) -> &'static str {
    if *during_execution {
        "ended during the execution"
    } else {
        "has ended"
    }
}

fn a_number(minimum: &Amount) -> &'static str {
    match minimum {
        Amount::Real(_) => "a number of ",
        Amount::Whole(_) => "",
    }
}

fn whose(option: &Option<String>) -> &'static str {
    match option {
        Some(_) => "this server's",
        None => "this host's",
    }
}

fn flag(option: &Option<String>) -> String {
    match option {
        Some(o) => format!(" (serve {o})"),
        None => String::new(),
    }
}

fn tenant_name(owner: &str) -> String {
    if owner.is_empty() {
        "this tenant".into()
    } else {
        format!("tenant {owner}")
    }
}

fn plural(n: &u64) -> &'static str {
    if *n == 1 {
        ""
    } else {
        "s"
    }
}

/// `map_err(io_error("write", path))`: an I/O failure with what was being done and where.
pub(crate) fn io_error(
    action: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> EngineError {
    let path = path.to_owned();
    move |source| {
        if source.kind() == std::io::ErrorKind::StorageFull {
            tracing::warn!(action, path = %path.display(), "the data dir is full");
            return no_space(action);
        }
        EngineError::Io {
            action,
            path,
            source,
        }
    }
}

/// A write to the data dir that found no room (the path stays in the server's log).
pub(crate) fn no_space(action: &'static str) -> EngineError {
    EngineError::InsufficientStorage(NoSpace::DataDir { action })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages of today's callers, derived from the fields.
    #[test]
    fn messages_are_derived_from_the_fields() {
        let over = EngineError::LimitExceeded(Limit::OverMaximum {
            limit: "cpu",
            value: 2.5.into(),
            maximum: 2.0.into(),
            option: None,
        });
        assert_eq!(
            over.to_string(),
            "limit exceeded: cpu 2.5 exceeds this host's maximum of 2"
        );
        let over = Limit::OverMaximum {
            limit: "memory_mb",
            value: u64::MAX.into(),
            maximum: 512u64.into(),
            option: Some("--max-memory-mb".into()),
        };
        assert_eq!(
            over.to_string(),
            "memory_mb 18446744073709551615 exceeds this server's maximum of 512 (serve --max-memory-mb)"
        );
        assert_eq!(
            Invalid::BelowMinimum {
                limit: "cpu",
                minimum: 0.01.into()
            }
            .to_string(),
            "cpu must be a number of at least 0.01"
        );
        assert_eq!(
            Invalid::BelowMinimum {
                limit: "pids",
                minimum: 8u64.into()
            }
            .to_string(),
            "pids must be at least 8"
        );
        assert_eq!(
            EngineError::ended("ses_1", false).to_string(),
            "not found: session ses_1 has ended"
        );
        assert_eq!(
            EngineError::ended("ses_1", true).to_string(),
            "not found: session ses_1 ended during the execution"
        );
        let quota = |live| Quota::Sessions {
            owner: String::new(),
            live,
            maximum: 2,
        };
        assert_eq!(
            quota(1).to_string(),
            "tenant quota: this tenant already has 1 live session of its max_sessions 2; delete one, or raise the quota (runcell keys update KEY --max-sessions N)"
        );
        assert_eq!(
            quota(2).to_string(),
            "tenant quota: this tenant already has 2 live sessions of its max_sessions 2; delete one, or raise the quota (runcell keys update KEY --max-sessions N)"
        );
        assert_eq!(
            EngineError::from(RecordError::NoSpace).to_string(),
            "insufficient storage: cannot record the execution: the server's disk is full: nothing was recorded; retry once the operator frees space"
        );
    }

    /// A cause is the source, never repeated in the message: the chain reads as one line.
    #[test]
    fn causes_are_sources() {
        let io = std::io::Error::from_raw_os_error(11);
        let e = EngineError::NoThread {
            thread: "the audit writer",
            source: io,
        };
        let chain = crate::error_chain(&e);
        assert!(
            chain.starts_with(
                "runcell cannot run code on this host: cannot start the audit writer: "
            ),
            "{chain}"
        );
        assert_eq!(chain.matches("audit writer").count(), 1, "{chain}");
        let store = std::io::Error::other("disk I/O error");
        let e = EngineError::from(RecordError::store(store));
        assert_eq!(
            crate::error_chain(&e),
            "internal error: cannot record the execution: disk I/O error"
        );
    }
}
