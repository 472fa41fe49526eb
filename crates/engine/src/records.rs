//! What the engine keeps in its store ([`DomainStore`]): sessions (recorded when created,
//! forgotten when they end, recovered when a server starts again), the uploads into them,
//! every execution in its tenant's audit chain, and tenants' quotas, read at each start.
//!
//! The store speaks in records of words and JSON text, and does not know the engine; this is
//! where those records meet the domain's types, and the one place the engine reads or writes
//! them.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use runcell_store::{DomainStore, ExecutionRow, NewExecution, SessionRecord, StoreError};

use crate::audit::{AuditItem, AuditSink};
use crate::error::{Invalid, NoSpace, RecordError, Resource};
use crate::limits::TenantPolicy;
use crate::session::{SessionInfo, SessionStatus};
use crate::{chain, EngineError, Execution, OPEN_TENANT};

/// Every status the store may hold for a session, and those of a session that was live when
/// its server stopped.
const ALL_STATUSES: [&str; 6] = ["starting", "ready", "busy", "paused", "dead", "expired"];
/// Paused ones too: they come back paused (durable.rs).
const LIVE_STATUSES: [&str; 4] = ["starting", "ready", "busy", "paused"];

/// An engine's store, and how much of the domain it keeps there.
#[derive(Debug, Clone)]
pub(crate) struct Records {
    store: Arc<dyn DomainStore>,
    /// Sessions and their uploads too (a server's engine), or only executions (`runcell ask`,
    /// whose one session is the process's own and ends with it).
    sessions: bool,
}

impl Records {
    pub(crate) fn everything(store: Arc<dyn DomainStore>) -> Records {
        Records {
            store,
            sessions: true,
        }
    }

    pub(crate) fn executions_only(store: Arc<dyn DomainStore>) -> Records {
        Records {
            store,
            sessions: false,
        }
    }

    /// The store, when sessions are recorded in it.
    pub(crate) fn of_sessions(&self) -> Option<&dyn DomainStore> {
        self.sessions.then_some(&*self.store)
    }

    /// The audit writer's sink: this store's chains.
    pub(crate) fn audit_sink(&self) -> Arc<dyn AuditSink> {
        Arc::new(ChainSink(self.store.clone()))
    }

    pub(crate) fn store(&self) -> &dyn DomainStore {
        &*self.store
    }
}

/// The tenant an owner's records are kept under: the engine's callers without tenants (a
/// local engine's empty owner) share the server's open tenant.
pub(crate) fn tenant(owner: &str) -> &str {
    if owner.is_empty() {
        OPEN_TENANT
    } else {
        owner
    }
}

/// The engine's word for a store error: the request's own fault, a missing record, a full
/// disk (507 for a client: the same request works once space is freed), or runcell's failure.
pub(crate) fn store_error(e: StoreError) -> EngineError {
    match e {
        StoreError::Invalid(m) => EngineError::InvalidRequest(Invalid::Store(m)),
        StoreError::NotFound(m) => EngineError::NotFound(Resource::Record(m)),
        e if e.is_storage_full() => EngineError::InsufficientStorage(NoSpace::Database),
        other => EngineError::Store(other),
    }
}

/// The audit writer's word for a store error: a full disk is [`RecordError::NoSpace`],
/// anything else the store's error, kept whole.
fn record_error(e: StoreError) -> RecordError {
    if e.is_storage_full() {
        RecordError::NoSpace
    } else {
        RecordError::store(e)
    }
}

/// Records every execution in the store's per-tenant hash chain before its reply is sent.
#[derive(Debug)]
struct ChainSink(Arc<dyn DomainStore>);

impl AuditSink for ChainSink {
    fn record(&self, owner: &str, execution: &Execution, code: &str) -> Result<(), RecordError> {
        let rec = new_execution(owner, execution, code)?;
        self.0.append_execution(&rec).map_err(record_error)?;
        Ok(())
    }

    fn record_batch(&self, items: &[AuditItem<'_>]) -> Vec<Result<(), RecordError>> {
        let mut results: Vec<Option<Result<(), RecordError>>> = Vec::with_capacity(items.len());
        let mut recs = Vec::with_capacity(items.len());
        for i in items {
            match new_execution(i.owner, i.execution, i.code) {
                Ok(r) => {
                    recs.push(r);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e))),
            }
        }
        let mut appended = self.0.append_executions(&recs).into_iter();
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| match appended.next() {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(e)) => Err(record_error(e)),
                    None => Err(RecordError::NoAnswer),
                })
            })
            .collect()
    }
}

/// The store's record of an execution.
fn new_execution(
    owner: &str,
    execution: &Execution,
    code: &str,
) -> Result<NewExecution, RecordError> {
    let json = serde_json::to_string(execution).map_err(RecordError::store)?;
    let status = serde_json::to_value(execution.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    Ok(NewExecution {
        tenant: tenant(owner).to_owned(),
        execution_id: execution.id.clone(),
        session_id: execution.session_id.clone(),
        status,
        code: code.to_owned(),
        execution_json: json,
        created_at: execution.finished_at,
    })
}

/// Whether a chain row is a decision on a cell rather than an execution.
pub(crate) fn is_approval(row: &ExecutionRow) -> bool {
    row.execution_id.starts_with(APPROVAL_PREFIX)
}

/// The id prefix of a decision's chain row (`approval.rs`).
pub const APPROVAL_PREFIX: &str = "apr_";

/// A recorded execution as callers read it: the Execution as it was returned, plus the `code`
/// that ran.
pub(crate) fn with_code(row: ExecutionRow) -> serde_json::Value {
    let mut v: serde_json::Value =
        serde_json::from_str(&row.execution_json).unwrap_or_else(|_| serde_json::json!({}));
    if let Some(obj) = v.as_object_mut() {
        obj.insert("code".into(), row.code.into());
    }
    v
}

/// A tenant's quotas and default start, read at every session start (so `runcell keys
/// update`, another process, takes effect at once). The error is the store's, or what is
/// wrong with the start it holds.
pub(crate) fn tenant_policy(
    store: &dyn DomainStore,
    owner: &str,
) -> Result<TenantPolicy, Box<dyn std::error::Error + Send + Sync>> {
    let t = store.tenant_settings(tenant(owner))?;
    Ok(TenantPolicy {
        max_sessions: t.max_sessions,
        max_memory_mb: t.max_memory_mb,
        start: t.start.as_deref().map(str::parse).transpose()?,
    })
}

/// What the store keeps of a live session.
pub(crate) fn session_record(info: &SessionInfo, workspace: &Path) -> SessionRecord {
    SessionRecord {
        id: info.id.clone(),
        tenant: tenant(&info.owner).to_owned(),
        language: info.language.as_str().to_owned(),
        status: "ready".into(),
        created_at: info.created_at,
        last_active_at: info.last_active_at,
        expires_at: info.expires_at,
        // Both serialise plain maps and numbers: they cannot fail.
        limits_json: serde_json::to_string(&info.limits).unwrap_or_default(),
        metadata_json: serde_json::to_string(&info.metadata).unwrap_or_default(),
        workspace_path: workspace.to_string_lossy().into_owned(),
        start: info.start.as_str().to_owned(),
    }
}

/// What callers see of a session only the store remembers (its kernel is gone).
fn dead_session(rec: &SessionRecord) -> Option<SessionInfo> {
    session_of_record(rec, SessionStatus::Dead)
}

/// A session as the store records it, with `status`; none when the record cannot be read
/// (an unknown language, limits that do not parse). Its network policy is not in the store
/// (its secrets would be): the default, which a dead session has anyway and a session held by
/// another node reports only through its owner.
pub fn session_of_record(rec: &SessionRecord, status: SessionStatus) -> Option<SessionInfo> {
    Some(SessionInfo {
        id: rec.id.clone(),
        language: rec.language.parse().ok()?,
        status,
        created_at: rec.created_at,
        last_active_at: rec.last_active_at,
        expires_at: rec.expires_at,
        limits: serde_json::from_str(&rec.limits_json).ok()?,
        start: rec.start.parse().unwrap_or_default(),
        network: Default::default(),
        metadata: serde_json::from_str(&rec.metadata_json).unwrap_or_default(),
        owner: rec.tenant.clone(),
    })
}

/// Whether a session only the store remembers as dead is past its idle expiry; it is then
/// forgotten (its row and uploads deleted), as a live session expires after its idle timeout.
fn forget_if_expired(store: &dyn DomainStore, rec: &SessionRecord, now: DateTime<Utc>) -> bool {
    if rec.expires_at > now {
        return false;
    }
    if let Err(e) = store.delete_session(&rec.id) {
        tracing::warn!(session = %rec.id, error = %chain(&e), "cannot forget an expired dead session");
    } else {
        tracing::info!(session = %rec.id, "dead session expired");
    }
    true
}

/// The owner's session `id` if only the store remembers it, dead and not yet expired.
pub(crate) fn dead_one(store: &dyn DomainStore, owner: &str, id: &str) -> Option<SessionInfo> {
    store
        .get_session(tenant(owner), id)
        .ok()
        .flatten()
        .filter(|r| r.status == "dead" && !forget_if_expired(store, r, Utc::now()))
        .and_then(|r| dead_session(&r))
}

/// The owner's sessions only the store remembers as dead and not yet expired, oldest first.
pub(crate) fn dead_of(store: &dyn DomainStore, owner: &str) -> Vec<SessionInfo> {
    let now = Utc::now();
    store
        .list_sessions(tenant(owner))
        .unwrap_or_default()
        .iter()
        .filter(|r| r.status == "dead" && !forget_if_expired(store, r, now))
        .filter_map(dead_session)
        .collect()
}

/// Every tenant's sessions only the store remembers as dead and not yet expired (those past
/// their expiry are forgotten on the way).
pub(crate) fn all_dead(store: &dyn DomainStore) -> Vec<SessionRecord> {
    let now = Utc::now();
    store
        .sessions_with_status(&["dead"])
        .unwrap_or_default()
        .into_iter()
        .filter(|r| !forget_if_expired(store, r, now))
        .collect()
}

/// What the store remembers of a session that was live when its server stopped: enough to
/// start a fresh kernel on its workspace.
pub(crate) struct Stale {
    pub(crate) record: SessionRecord,
    /// Why it cannot be brought back, if a field does not parse.
    pub(crate) recover: Result<crate::session::RecoverSession, String>,
}

/// Sessions the store remembers as live (a previous server process died under them).
pub(crate) fn stale_sessions(store: &dyn DomainStore) -> Result<Vec<Stale>, EngineError> {
    let rows = store
        .sessions_with_status(&LIVE_STATUSES)
        .map_err(store_error)?;
    Ok(rows
        .into_iter()
        .map(|s| {
            let limits = serde_json::from_str(&s.limits_json);
            let metadata = serde_json::from_str(&s.metadata_json).unwrap_or_default();
            let language = s.language.parse::<crate::Language>();
            let recover = match (limits, language) {
                (Ok(limits), Ok(language)) => Ok(crate::session::RecoverSession {
                    id: s.id.clone(),
                    language,
                    owner: s.tenant.clone(),
                    created_at: s.created_at,
                    limits,
                    start: s.start.parse().unwrap_or_default(),
                    metadata,
                    last_active_at: s.last_active_at,
                    paused_until: (s.status == "paused").then_some(s.expires_at),
                }),
                (Err(e), _) => Err(e.to_string()),
                (_, Err(e)) => Err(e),
            };
            Stale { record: s, recover }
        })
        .collect())
}

/// Records a stale session's fate (`ready` with fresh times once recovered, `dead` with its
/// old ones otherwise).
pub(crate) fn settle(
    store: &dyn DomainStore,
    id: &str,
    status: &str,
    last_active_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) -> Result<(), EngineError> {
    match store.update_session_status(id, status, last_active_at, expires_at) {
        // A full disk must not keep the server from starting (the operator frees space
        // through it). The row keeps its old status, which the next start settles again.
        Err(e) if e.is_storage_full() => {
            tracing::warn!(
                session = %id,
                "the disk is full: the session's status is not updated in the store"
            );
            Ok(())
        }
        other => other.map(|_| ()).map_err(store_error),
    }
}

/// The ids of every session the store remembers, whatever its status.
pub(crate) fn known_sessions(store: &dyn DomainStore) -> Result<HashSet<String>, EngineError> {
    Ok(store
        .sessions_with_status(&ALL_STATUSES)
        .map_err(store_error)?
        .into_iter()
        .map(|s| s.id)
        .collect())
}

/// One page of a tenant's recorded executions, newest first.
#[derive(Debug, Clone)]
pub struct ExecutionPage {
    /// Each an Execution as it was returned, plus the `code` that ran.
    pub executions: Vec<serde_json::Value>,
    /// The cursor of the next (older) page; `None` on the last page.
    pub next: Option<String>,
}
