//! The SQLite backend. [`SqliteStore`] (`store.rs`) holds the connections and opens the
//! database (`schema.rs`); each kind of record has a file of its own (`api_keys.rs`,
//! `tenants.rs`, `sessions.rs`, `uploads.rs`, `executions.rs`), the audit chain two (`append.rs`
//! writes it, `chain.rs` reads and verifies it); this file maps [`DomainStore`] and [`Backend`] onto them.

mod api_keys;
mod append;
mod chain;
mod executions;
mod query;
mod schema;
mod sessions;
mod store;
mod tenants;
mod uploads;

pub use schema::Durability;
pub use store::SqliteStore;

use chrono::{DateTime, Utc};
use rusqlite::Connection;

use crate::error::Result;
use crate::{
    validate, AuditEntry, Backend, ChainHead, DomainStore, ExecutionRow, Expected, KeyInfo,
    NewExecution, SessionRecord, TenantChange, TenantSettings, UploadRecord, VerifyReport,
};
use chain::{chain_heads_on, verify_on};
use schema::{open_flags, BUSY_TIMEOUT};

impl DomainStore for SqliteStore {
    fn tenant_settings(&self, tenant: &str) -> Result<TenantSettings> {
        tenants::tenant_settings(self, tenant)
    }

    fn put_session(&self, s: &SessionRecord) -> Result<()> {
        sessions::put_session(self, s)
    }

    fn update_session_status(
        &self,
        id: &str,
        status: &str,
        last_active_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<bool> {
        sessions::update_session_status(self, id, status, last_active_at, expires_at)
    }

    fn get_session(&self, tenant: &str, id: &str) -> Result<Option<SessionRecord>> {
        sessions::get_session(self, tenant, id)
    }

    fn list_sessions(&self, tenant: &str) -> Result<Vec<SessionRecord>> {
        sessions::list_sessions(self, tenant)
    }

    fn delete_session(&self, id: &str) -> Result<bool> {
        sessions::delete_session(self, id)
    }

    fn sessions_with_status(&self, statuses: &[&str]) -> Result<Vec<SessionRecord>> {
        sessions::sessions_with_status(self, statuses)
    }

    fn record_upload(
        &self,
        session_id: &str,
        path: &str,
        size: u64,
        sha256_hex: &str,
        at: DateTime<Utc>,
    ) -> Result<()> {
        uploads::record_upload(self, session_id, path, size, sha256_hex, at)
    }

    fn uploads(&self, session_id: &str) -> Result<Vec<UploadRecord>> {
        uploads::uploads(self, session_id)
    }

    fn append_execution(&self, rec: &NewExecution) -> Result<AuditEntry> {
        executions::append_execution(self, rec)
    }

    fn append_executions(&self, recs: &[NewExecution]) -> Vec<Result<AuditEntry>> {
        executions::append_executions(self, recs)
    }

    fn list_executions(
        &self,
        tenant: &str,
        session_id: Option<&str>,
        limit: usize,
        before: Option<&str>,
    ) -> Result<(Vec<ExecutionRow>, Option<String>)> {
        executions::list_executions(self, tenant, session_id, limit, before)
    }

    fn get_execution(&self, tenant: &str, id: &str) -> Result<Option<ExecutionRow>> {
        executions::get_execution(self, tenant, id)
    }

    fn verify_extends(&self, tenant: Option<&str>, expected: &[Expected]) -> Result<VerifyReport> {
        match self.path.as_ref().filter(|_| !self.exclusive) {
            Some(path) => {
                // A connection of its own: a long walk must not hold up appends or reads.
                let mut conn = Connection::open_with_flags(path, open_flags())?;
                conn.busy_timeout(BUSY_TIMEOUT)?;
                conn.pragma_update(None, "query_only", true)?;
                verify_on(&mut conn, &self.key, tenant, expected)
            }
            None => verify_on(&mut self.write(), &self.key, tenant, expected),
        }
    }
}

impl Backend for SqliteStore {
    fn is_exclusive(&self) -> bool {
        self.exclusive
    }

    fn keys_generation(&self) -> u64 {
        self.keys_generation
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn create_key(&self, name: &str, tenant: &str) -> Result<(KeyInfo, String)> {
        api_keys::create_key(self, name, tenant, crate::KeyFormat::Runcell)
    }

    fn create_key_in_format(
        &self,
        name: &str,
        tenant: &str,
        format: crate::KeyFormat,
    ) -> Result<(KeyInfo, String)> {
        api_keys::create_key(self, name, tenant, format)
    }

    fn list_keys(&self) -> Result<Vec<KeyInfo>> {
        api_keys::list_keys(self)
    }

    fn revoke_key(&self, id_or_name: &str) -> Result<bool> {
        api_keys::revoke_key(self, id_or_name)
    }

    fn authenticate(&self, key: &str) -> Result<Option<KeyInfo>> {
        api_keys::authenticate(self, key)
    }

    fn has_active_keys(&self) -> Result<bool> {
        api_keys::has_active_keys(self)
    }

    fn find_key(&self, id_or_name: &str) -> Result<Option<KeyInfo>> {
        api_keys::find_key(self, id_or_name)
    }

    fn set_key_approval(
        &self,
        id: &str,
        mode: Option<crate::ApprovalMode>,
    ) -> Result<Option<KeyInfo>> {
        api_keys::set_key_approval(self, id, mode)
    }

    fn set_key_egress(&self, id: &str, bound: Option<&[String]>) -> Result<Option<KeyInfo>> {
        api_keys::set_key_egress(self, id, bound)
    }

    fn list_tenants(&self) -> Result<Vec<TenantSettings>> {
        tenants::list_tenants(self)
    }

    fn update_tenant(&self, tenant: &str, change: &TenantChange) -> Result<TenantSettings> {
        tenants::update_tenant(self, tenant, change)
    }

    fn put_session_extra(&self, session_id: &str, kind: &str, json: &str) -> Result<()> {
        sessions::put_session_extra(self, session_id, kind, json)
    }

    fn session_extra(&self, session_id: &str, kind: &str) -> Result<Option<String>> {
        sessions::session_extra(self, session_id, kind)
    }

    fn chain_heads(&self, tenant: Option<&str>) -> Result<Vec<ChainHead>> {
        if let Some(t) = tenant {
            validate::name("tenant", t)?;
        }
        chain_heads_on(&self.read(), tenant)
    }

    fn appended_count(&self) -> u64 {
        self.appended.load(std::sync::atomic::Ordering::Relaxed)
    }
}
