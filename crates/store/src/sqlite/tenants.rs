//! Tenants' settings: session and memory quotas, and how their Python sessions start.

use chrono::Utc;
use rusqlite::{params, Row, TransactionBehavior};

use super::query::{collect, first};
use super::store::SqliteStore;
use crate::error::{Result, StoreError};
use crate::{time, validate, TenantChange, TenantSettings};

fn quota_from(r: &Row<'_>) -> Result<TenantSettings> {
    let n = |i: usize| -> Result<Option<u64>> {
        match r.get::<_, Option<i64>>(i)? {
            Some(v) => u64::try_from(v)
                .map(Some)
                .map_err(|_| StoreError::Corrupt(format!("negative quota {v}"))),
            None => Ok(None),
        }
    };
    Ok(TenantSettings {
        tenant: r.get(0)?,
        max_sessions: n(1)?,
        max_memory_mb: n(2)?,
        start: r.get(3)?,
    })
}

pub(super) fn tenant_settings(store: &SqliteStore, tenant: &str) -> Result<TenantSettings> {
    Ok(first(
        &store.read(),
        "SELECT tenant, max_sessions, max_memory_mb, start FROM tenants WHERE tenant = ?1",
        [tenant],
        quota_from,
    )?
    .unwrap_or_else(|| TenantSettings {
        tenant: tenant.to_owned(),
        ..TenantSettings::default()
    }))
}

pub(super) fn list_tenants(store: &SqliteStore) -> Result<Vec<TenantSettings>> {
    collect(
        &store.read(),
        "SELECT tenant, max_sessions, max_memory_mb, start FROM tenants ORDER BY tenant",
        [],
        quota_from,
    )
}

pub(super) fn update_tenant(
    store: &SqliteStore,
    tenant: &str,
    change: &TenantChange,
) -> Result<TenantSettings> {
    validate::name("tenant", tenant)?;
    if let Some(Some(start)) = &change.start {
        if !matches!(start.as_str(), "zygote" | "cold") {
            return Err(StoreError::Invalid(format!(
                "start must be zygote or cold (got {start:?})"
            )));
        }
    }
    let int = |v: u64| {
        i64::try_from(v).map_err(|_| StoreError::Invalid(format!("quota {v} is too large")))
    };
    let mut conn = store.write();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut q = first(
        &tx,
        "SELECT tenant, max_sessions, max_memory_mb, start FROM tenants WHERE tenant = ?1",
        [tenant],
        quota_from,
    )?
    .unwrap_or_else(|| TenantSettings {
        tenant: tenant.to_owned(),
        ..TenantSettings::default()
    });
    if let Some(v) = change.max_sessions {
        q.max_sessions = v;
    }
    if let Some(v) = change.max_memory_mb {
        q.max_memory_mb = v;
    }
    if let Some(v) = &change.start {
        q.start = v.clone();
    }
    tx.execute(
        "INSERT INTO tenants (tenant, max_sessions, max_memory_mb, start, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (tenant) DO UPDATE SET max_sessions = excluded.max_sessions,
             max_memory_mb = excluded.max_memory_mb, start = excluded.start,
             updated_at = excluded.updated_at",
        params![
            tenant,
            q.max_sessions.map(int).transpose()?,
            q.max_memory_mb.map(int).transpose()?,
            q.start,
            time::fmt(Utc::now())
        ],
    )?;
    tx.commit()?;
    Ok(q)
}
