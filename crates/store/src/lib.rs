//! Persistence for runcell: API keys, sessions, upload metadata and the executions audit log.
//!
//! SQLite is the default backend ([`SqliteStore`]), PostgreSQL the one for several nodes
//! sharing a database ([`PgStore`]); this is the only crate that speaks SQL. The interface is
//! two traits that both implement: [`DomainStore`],
//! the records the engine keeps (sessions, uploads, executions, tenants' settings), and
//! [`Backend`], everything else (API keys, tenants' changes, checkpoints' chain heads) on top
//! of it. Callers hold a [`Store`], a cheap-to-clone handle to some backend; the engine holds
//! its [`DomainStore`] side ([`Store::domain`]).
//!
//! The API is synchronous. Async callers should wrap calls in `tokio::task::spawn_blocking`.
//! (The PostgreSQL backend runs its async driver on a runtime of its own, so it needs none
//! from its callers.)
//!
//! # Durability
//! The SQLite database runs in WAL mode with `synchronous=NORMAL`: once a write method returns,
//! the change survives the process being killed (even `kill -9`), because the committed WAL
//! frames are already in the operating system. Surviving a power loss or kernel crash as well
//! needs `synchronous=FULL` (an fsync per commit): open with [`Durability::PowerLoss`].
//!
//! # The audit chain
//! [`DomainStore::append_execution`] adds each execution to a per-tenant chain of HMACs keyed with
//! a secret kept outside the database; see [`audit`] for the exact encoding, the key files and
//! signed checkpoints, and [`DomainStore::verify_chain`] for what verification detects.
//!
//! # Records
//! The store does not depend on the engine: executions are stored as JSON text
//! (`execution_json`), session limits and metadata likewise.

#![forbid(unsafe_code)]

pub mod audit;
mod checkpoint;
mod error;
mod group;
mod handle;
mod lease;
mod pending;
mod postgres;
mod sqlite;
mod time;
mod validate;

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use error::{Result, StoreError};
pub use handle::Store;
pub use lease::{Lease, LEASE};
pub use postgres::{PgStore, NODE_TIMEOUT};
pub use sqlite::{Durability, SqliteStore};

/// An API key as the store knows it (never the plaintext).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    /// `key_` + 16 base62 characters.
    pub id: String,
    /// Human name given at creation (not necessarily unique).
    pub name: String,
    /// The tenant the key acts as.
    pub tenant: String,
    /// When the key was created.
    pub created_at: DateTime<Utc>,
    /// When it was revoked, if it was.
    pub revoked_at: Option<DateTime<Utc>>,
    /// The first 7 characters of the key (e.g. `rc_AbCd`), for display.
    pub prefix: String,
    /// Whether the agent endpoints' cells wait for a person when a request made with this key
    /// does not say (`None`: they do not). `Always` is a floor: a request cannot lower it.
    #[serde(default)]
    pub approval: Option<ApprovalMode>,
    /// The key's own egress bound: the domain patterns any network a request made with this
    /// key asks for must stay within, on top of the server's `--egress-allow` (a key only
    /// narrows it). `None`: the server's bound alone; empty: no network at all.
    #[serde(default)]
    pub egress_allow: Option<Vec<String>>,
}

/// Whether an agent endpoint's cells wait for a person's decision before they run
/// (`approval: "never" | "always"` on a request, or a key's default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalMode {
    /// Cells run as the model proposes them.
    Never,
    /// Each cell waits for `POST /v1/approvals/{id}` (or the page's Run / Edit / Decline).
    Always,
}

impl ApprovalMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalMode::Never => "never",
            ApprovalMode::Always => "always",
        }
    }

    /// `never` or `always`; anything else is `None`.
    pub fn parse(s: &str) -> Option<ApprovalMode> {
        match s {
            "never" => Some(ApprovalMode::Never),
            "always" => Some(ApprovalMode::Always),
            _ => None,
        }
    }

    /// A key's `approval` column (whose CHECK allows only the two words, or NULL).
    pub(crate) fn from_column(word: Option<String>) -> Result<Option<ApprovalMode>> {
        word.map(|w| {
            ApprovalMode::parse(&w)
                .ok_or_else(|| StoreError::Corrupt(format!("key approval {w:?}")))
        })
        .transpose()
    }
}

impl fmt::Display for ApprovalMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a new API key's plaintext looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeyFormat {
    /// `rc_` + 40 base62 characters.
    #[default]
    Runcell,
    /// `e2b_` + 64 lowercase hex digits: what E2B's SDKs check a key against (`e2b_[0-9a-f]+`).
    E2b,
}

/// A session as persisted. Status and language are free-form words owned by the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// Session id (`[A-Za-z0-9_.-]`, 1..=128 chars).
    pub id: String,
    /// Owning tenant.
    pub tenant: String,
    /// Kernel language, e.g. `python`.
    pub language: String,
    /// `starting|ready|busy|dead|expired` (not checked by the store).
    pub status: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Last activity.
    pub last_active_at: DateTime<Utc>,
    /// When the session expires if idle.
    pub expires_at: DateTime<Utc>,
    /// Effective limits as JSON (must parse).
    pub limits_json: String,
    /// User metadata as JSON (must parse).
    pub metadata_json: String,
    /// Host path of the session's workspace.
    pub workspace_path: String,
    /// How its kernel asked to start: `zygote` or `cold` (not checked by the store).
    pub start: String,
}

/// A tenant's settings: at most `max_sessions` live sessions and `max_memory_mb` in the sum
/// of their memory limits (`None`: no quota), and how its Python sessions start when they do
/// not say (`zygote` or `cold`; `None`: the server's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantSettings {
    pub tenant: String,
    pub max_sessions: Option<u64>,
    pub max_memory_mb: Option<u64>,
    pub start: Option<String>,
}

/// A change to a tenant's settings: `None` keeps a value, `Some(None)` clears it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantChange {
    pub max_sessions: Option<Option<u64>>,
    pub max_memory_mb: Option<Option<u64>>,
    pub start: Option<Option<String>>,
}

/// The latest upload of one path into a session's workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadRecord {
    /// Session the file belongs to.
    pub session_id: String,
    /// Path relative to the workspace.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the content.
    pub sha256: String,
    /// When it was stored.
    pub uploaded_at: DateTime<Utc>,
}

/// An execution to append to the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewExecution {
    /// Owning tenant.
    pub tenant: String,
    /// Globally unique execution id (`[A-Za-z0-9_.-]`, 1..=128 chars).
    pub execution_id: String,
    /// The session it ran in; `None` for one-shot executions.
    pub session_id: Option<String>,
    /// Final status word (`ok|error|timeout|interrupted|killed`, not checked).
    pub status: String,
    /// The code that ran.
    pub code: String,
    /// The whole execution record as JSON (must parse).
    pub execution_json: String,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
}

/// Where an appended execution landed in its tenant's chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Position in the tenant's chain, from 1.
    pub seq: u64,
    /// The row's hash (lowercase hex SHA-256).
    pub hash: String,
}

/// A stored execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionRow {
    /// Execution id.
    pub execution_id: String,
    /// Session, if any.
    pub session_id: Option<String>,
    /// Final status word.
    pub status: String,
    /// The code that ran.
    pub code: String,
    /// The execution record as JSON.
    pub execution_json: String,
    /// When it was recorded.
    pub created_at: DateTime<Utc>,
    /// Position in the tenant's chain.
    pub seq: u64,
    /// The row's chain hash.
    pub hash: String,
}

/// Result of [`DomainStore::verify_chain`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// True when every checked chain is intact.
    pub ok: bool,
    /// Rows found intact before the first problem (all rows when `ok`).
    pub checked: u64,
    /// The first problem found, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_broken: Option<Broken>,
}

/// Where a chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Broken {
    /// The tenant whose chain is broken.
    pub tenant: String,
    /// The first row found wrong; for a deleted last row, the last remaining row ("" if none).
    pub execution_id: String,
    /// Human-readable reason, e.g. `row edited: hash mismatch`.
    pub reason: String,
}

/// Where a tenant's chain stands: record `count` (its seq) has hash `head`. What a checkpoint
/// states per tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainHead {
    /// The tenant.
    pub tenant: String,
    /// Records in its chain (the last one's seq); 0 for none.
    pub count: u64,
    /// The last record's hash ([`audit::GENESIS_HASH`] for none).
    pub head: String,
}

/// A chain position a verification must find, with a name for reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The position.
    pub head: ChainHead,
    /// Where it comes from, e.g. `checkpoint of 2026-01-01T00:00:00Z`.
    pub source: String,
}

/// What the engine keeps of its domain: sessions, the uploads into them, executions in their
/// tenants' audit chains, and tenants' settings as a session start reads them. The engine holds
/// any backend this way (`Arc<dyn DomainStore>`, see [`Store::domain`]), so it speaks to the
/// store in records, never in SQL. Implemented by [`SqliteStore`] and [`PgStore`]. All methods validate their input and return [`StoreError::Invalid`]
/// rather than panic.
pub trait DomainStore: Send + Sync + fmt::Debug {
    // ---- tenants' quotas and default start ----

    /// The tenant's settings (none set: no quota, the server's default start).
    fn tenant_settings(&self, tenant: &str) -> Result<TenantSettings>;

    // ---- the node's lease on its sessions (nodes sharing a database) ----

    /// Whether this node may act on the sessions it holds, and make new ones, now (see
    /// [`Lease`]); always [`Lease::Held`] for a store of its own. Answered from memory.
    fn lease(&self) -> Lease {
        Lease::Held
    }

    // ---- sessions ----

    /// Inserts the session or replaces the stored one with the same id. A session cannot move
    /// to another tenant (`Conflict`). Replacing keeps the session's uploads.
    fn put_session(&self, session: &SessionRecord) -> Result<()>;
    /// Updates a session's status and times; `false` if there is no such session.
    fn update_session_status(
        &self,
        id: &str,
        status: &str,
        last_active_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<bool>;
    /// The tenant's session with this id (another tenant's session is `None`).
    fn get_session(&self, tenant: &str, id: &str) -> Result<Option<SessionRecord>>;
    /// The tenant's sessions, oldest first.
    fn list_sessions(&self, tenant: &str) -> Result<Vec<SessionRecord>>;
    /// Deletes a session and its upload records (not its executions); `false` if absent.
    fn delete_session(&self, id: &str) -> Result<bool>;
    /// Sessions of every tenant whose status is one of `statuses`, oldest first.
    fn sessions_with_status(&self, statuses: &[&str]) -> Result<Vec<SessionRecord>>;
    /// Makes session `id`, owned by `dead_node`, this node's (with this node's epoch, status
    /// `paused`), if `dead_node` still owns it and has not beaten within [`NODE_TIMEOUT`]:
    /// one conditional update, so of several nodes taking it at once one wins (`true`) and the
    /// others see `false`; the dead node, should it come back, can no longer change it. A
    /// store of one node (SQLite) has nothing to take: `false`.
    fn take_over_session(&self, _id: &str, _dead_node: &str) -> Result<bool> {
        Ok(false)
    }

    // ---- uploads ----

    /// Records (or re-records) an upload into a session's workspace. `NotFound` if the session
    /// does not exist.
    fn record_upload(
        &self,
        session_id: &str,
        path: &str,
        size: u64,
        sha256_hex: &str,
        at: DateTime<Utc>,
    ) -> Result<()>;
    /// A session's uploads, by path.
    fn uploads(&self, session_id: &str) -> Result<Vec<UploadRecord>>;

    // ---- executions and the audit chain ----

    /// Appends an execution to its tenant's hash chain, atomically, and returns its place.
    /// The commit is durable (see the crate docs) when this returns. `Conflict` if the
    /// execution id was already used (by any tenant).
    fn append_execution(&self, rec: &NewExecution) -> Result<AuditEntry>;
    /// Appends several executions, in order, sharing one commit where the backend can: one
    /// result per record, in order, each as [`DomainStore::append_execution`] would give it (a
    /// bad record fails alone; the others are still appended). Every `Ok` is durable when this
    /// returns.
    fn append_executions(&self, recs: &[NewExecution]) -> Vec<Result<AuditEntry>> {
        recs.iter().map(|r| self.append_execution(r)).collect()
    }
    /// The tenant's executions newest first, optionally of one session, at most `limit`
    /// (1..=1000), strictly older than the execution `before` if given. The second value is
    /// the cursor for the next page (`None` on the last page). An unknown cursor is `Invalid`.
    fn list_executions(
        &self,
        tenant: &str,
        session_id: Option<&str>,
        limit: usize,
        before: Option<&str>,
    ) -> Result<(Vec<ExecutionRow>, Option<String>)>;
    /// The tenant's execution with this id (another tenant's is `None`).
    fn get_execution(&self, tenant: &str, id: &str) -> Result<Option<ExecutionRow>>;
    /// Re-walks one tenant's chain (or every tenant's, in name order) and reports the first
    /// edited, deleted or out-of-band row, from one consistent snapshot.
    fn verify_chain(&self, tenant: Option<&str>) -> Result<VerifyReport> {
        self.verify_extends(tenant, &[])
    }
    /// Like [`DomainStore::verify_chain`], and also checks that each position in `expected`
    /// (of the tenant walked, or of any tenant) is still in its chain: record `count` exists and
    /// has hash `head`. A tenant expected but gone entirely is reported too.
    fn verify_extends(&self, tenant: Option<&str>, expected: &[Expected]) -> Result<VerifyReport>;
}

/// Everything the store does: the [`DomainStore`] records, and what only the operator and the
/// HTTP layer need (API keys, changing tenants' settings, signed checkpoints' chain heads).
/// Implemented by [`SqliteStore`] and [`PgStore`]. All methods
/// validate their input and return [`StoreError::Invalid`] rather than panic.
pub trait Backend: DomainStore {
    // ---- API keys ----

    /// Creates an API key for `tenant` and returns it with its plaintext, which is not stored
    /// (only its SHA-256) and cannot be recovered later. Key and tenant names must be 1..=64
    /// characters of `[A-Za-z0-9_.-]`. Names need not be unique.
    fn create_key(&self, name: &str, tenant: &str) -> Result<(KeyInfo, String)>;
    /// [`Backend::create_key`] with the plaintext in `format` (E2B's SDKs accept only keys
    /// that look like theirs). A backend that cannot issue a format refuses it.
    fn create_key_in_format(
        &self,
        name: &str,
        tenant: &str,
        format: KeyFormat,
    ) -> Result<(KeyInfo, String)> {
        match format {
            KeyFormat::Runcell => self.create_key(name, tenant),
            KeyFormat::E2b => Err(StoreError::Invalid(
                "this store cannot issue keys in E2B's format".into(),
            )),
        }
    }
    /// Changes whenever a key is created or revoked through this store, so callers caching
    /// authentication outcomes can tell theirs is stale. (Changes made by other processes are
    /// not seen: such caches also expire.)
    fn keys_generation(&self) -> u64 {
        0
    }
    /// Whether the database is open for this process alone: SQLite opened on a disk too full
    /// for its shared WAL index ([`SqliteStore::open_keyed`]).
    fn is_exclusive(&self) -> bool {
        false
    }
    /// All keys, revoked ones included, oldest first.
    fn list_keys(&self) -> Result<Vec<KeyInfo>>;
    /// Revokes the key with this id, or else the only active key with this name. Returns
    /// `false` if nothing was revoked (no match, or already revoked); `Invalid` when the name
    /// matches several active keys.
    fn revoke_key(&self, id_or_name: &str) -> Result<bool>;
    /// The active key whose plaintext is `key`; `None` if unknown or revoked.
    fn authenticate(&self, key: &str) -> Result<Option<KeyInfo>>;
    /// Whether any unrevoked key exists.
    fn has_active_keys(&self) -> Result<bool>;
    /// The key with this id (revoked or not), or else the only active key with this name;
    /// `Invalid` when the name matches several active keys.
    fn find_key(&self, id_or_name: &str) -> Result<Option<KeyInfo>>;
    /// Sets the approval default of the key with id `id` (`None`: cells do not wait unless a
    /// request asks); the key as it now is, or `None` when there is no such key.
    fn set_key_approval(&self, id: &str, mode: Option<ApprovalMode>) -> Result<Option<KeyInfo>>;
    /// Sets the egress bound of the key with id `id` (`None`: the server's bound alone; an
    /// empty list: no network). The patterns are stored as given (the caller checks their
    /// form; the store only bounds their number and size); the key as it now is, or `None`
    /// when there is no such key.
    fn set_key_egress(&self, id: &str, bound: Option<&[String]>) -> Result<Option<KeyInfo>>;

    // ---- tenants' quotas and default start ----

    /// Every tenant with settings, by name.
    fn list_tenants(&self) -> Result<Vec<TenantSettings>>;
    /// Applies `change` to the tenant's settings and returns the result. `start` must be
    /// `zygote` or `cold` (`Invalid` otherwise).
    fn update_tenant(&self, tenant: &str, change: &TenantChange) -> Result<TenantSettings>;

    // ---- what the HTTP layer keeps with a session ----

    /// Stores (or replaces) the JSON document `kind` of session `session_id` (E2B's sandbox
    /// record: `kind` `e2b`), removed with the session. `NotFound` if there is no such
    /// session. `kind` is a word (1..=64 printable ASCII characters), `json` must parse and
    /// be at most [`MAX_SESSION_EXTRA_BYTES`].
    fn put_session_extra(&self, session_id: &str, kind: &str, json: &str) -> Result<()>;
    /// The JSON document `kind` of session `session_id`, if one was stored.
    fn session_extra(&self, session_id: &str, kind: &str) -> Result<Option<String>>;

    // ---- the audit chain's heads ----

    /// Every tenant's chain head (or one tenant's: count 0 if it has none), by tenant name,
    /// from one snapshot: what a checkpoint signs.
    fn chain_heads(&self, tenant: Option<&str>) -> Result<Vec<ChainHead>>;
    /// Executions appended through this handle since it was opened (a cheap counter for
    /// deciding when to take a checkpoint).
    fn appended_count(&self) -> u64 {
        0
    }

    // ---- nodes sharing the database ----

    /// The node this store is the server of (its `--node-url`), when nodes share the
    /// database; `None` for a store of its own (SQLite) or a command that is no node.
    fn node_id(&self) -> Option<&str> {
        None
    }
    /// Which node owns session `id` (of any tenant), and whether that node is alive (it beat
    /// within [`NODE_TIMEOUT`]); `None` for an unknown session or one no node owns.
    fn session_node(&self, _id: &str) -> Result<Option<SessionNode>> {
        Ok(None)
    }
}

/// The largest document [`Backend::put_session_extra`] takes: 1 MiB (E2B's sandbox
/// variables are bounded by the engine's environment bounds, 256 KiB).
pub const MAX_SESSION_EXTRA_BYTES: usize = 1 << 20;

/// Where a session lives: see [`Backend::session_node`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionNode {
    /// The owner's node id (its URL).
    pub node: String,
    /// Whether it beat within [`NODE_TIMEOUT`].
    pub alive: bool,
}
