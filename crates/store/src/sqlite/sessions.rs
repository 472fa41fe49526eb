//! Session records: an upsert that never moves a session to another tenant, status updates,
//! look-ups by tenant and by status.

use chrono::{DateTime, Utc};
use rusqlite::{params, params_from_iter, Row};

use super::query::{collect, first, ts};
use super::store::SqliteStore;
use crate::error::{Result, StoreError};
use crate::{time, validate, SessionRecord};

const SESSION_COLS: &str = "id, tenant, language, status, created_at, last_active_at, \
                            expires_at, limits_json, metadata_json, workspace_path, start";

fn session_from(r: &Row<'_>) -> Result<SessionRecord> {
    Ok(SessionRecord {
        id: r.get(0)?,
        tenant: r.get(1)?,
        language: r.get(2)?,
        status: r.get(3)?,
        created_at: ts(r, 4)?,
        last_active_at: ts(r, 5)?,
        expires_at: ts(r, 6)?,
        limits_json: r.get(7)?,
        metadata_json: r.get(8)?,
        workspace_path: r.get(9)?,
        start: r.get(10)?,
    })
}

pub(super) fn put_session(store: &SqliteStore, s: &SessionRecord) -> Result<()> {
    validate::id("session id", &s.id)?;
    validate::name("tenant", &s.tenant)?;
    validate::word("language", &s.language)?;
    validate::word("status", &s.status)?;
    validate::json("limits_json", &s.limits_json)?;
    validate::json("metadata_json", &s.metadata_json)?;
    validate::word("start", &s.start)?;
    // An upsert, not INSERT OR REPLACE: REPLACE deletes the old row first, which would
    // cascade to the session's uploads.
    let changed = store.write().execute(
        &format!(
            "INSERT INTO sessions ({SESSION_COLS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
             ON CONFLICT (id) DO UPDATE SET
                 language = excluded.language, status = excluded.status,
                 created_at = excluded.created_at, last_active_at = excluded.last_active_at,
                 expires_at = excluded.expires_at, limits_json = excluded.limits_json,
                 metadata_json = excluded.metadata_json,
                 workspace_path = excluded.workspace_path, start = excluded.start
             WHERE sessions.tenant = excluded.tenant"
        ),
        params![
            s.id,
            s.tenant,
            s.language,
            s.status,
            time::fmt(s.created_at),
            time::fmt(s.last_active_at),
            time::fmt(s.expires_at),
            s.limits_json,
            s.metadata_json,
            s.workspace_path,
            s.start
        ],
    )?;
    if changed == 0 {
        return Err(StoreError::Conflict(format!(
            "session {} belongs to another tenant",
            s.id
        )));
    }
    Ok(())
}

pub(super) fn update_session_status(
    store: &SqliteStore,
    id: &str,
    status: &str,
    last_active_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) -> Result<bool> {
    validate::word("status", status)?;
    let n = store.write().execute(
        "UPDATE sessions SET status = ?2, last_active_at = ?3, expires_at = ?4 WHERE id = ?1",
        params![id, status, time::fmt(last_active_at), time::fmt(expires_at)],
    )?;
    Ok(n > 0)
}

pub(super) fn get_session(
    store: &SqliteStore,
    tenant: &str,
    id: &str,
) -> Result<Option<SessionRecord>> {
    first(
        &store.read(),
        &format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant = ?1 AND id = ?2"),
        [tenant, id],
        session_from,
    )
}

pub(super) fn list_sessions(store: &SqliteStore, tenant: &str) -> Result<Vec<SessionRecord>> {
    collect(
        &store.read(),
        &format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant = ?1 ORDER BY created_at, id"),
        [tenant],
        session_from,
    )
}

pub(super) fn delete_session(store: &SqliteStore, id: &str) -> Result<bool> {
    // Uploads go with it (ON DELETE CASCADE), in the same statement.
    let n = store
        .write()
        .execute("DELETE FROM sessions WHERE id = ?1", [id])?;
    Ok(n > 0)
}

pub(super) fn sessions_with_status(
    store: &SqliteStore,
    statuses: &[&str],
) -> Result<Vec<SessionRecord>> {
    if statuses.is_empty() {
        return Ok(Vec::new());
    }
    let marks = vec!["?"; statuses.len()].join(", ");
    collect(
        &store.read(),
        &format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE status IN ({marks})
             ORDER BY created_at, id"
        ),
        params_from_iter(statuses),
        session_from,
    )
}

pub(super) fn put_session_extra(
    store: &SqliteStore,
    session_id: &str,
    kind: &str,
    data: &str,
) -> Result<()> {
    validate::session_extra(session_id, kind, data)?;
    let r = store.write().execute(
        "INSERT INTO session_extras (session_id, kind, data_json, updated_at)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (session_id, kind) DO UPDATE SET
             data_json = excluded.data_json, updated_at = excluded.updated_at",
        params![session_id, kind, data, time::fmt(Utc::now())],
    );
    match r {
        Ok(_) => Ok(()),
        // The session's foreign key: there is no such session (or it was just deleted).
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY =>
        {
            Err(StoreError::NotFound(format!("session {session_id}")))
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) fn session_extra(
    store: &SqliteStore,
    session_id: &str,
    kind: &str,
) -> Result<Option<String>> {
    first(
        &store.read(),
        "SELECT data_json FROM session_extras WHERE session_id = ?1 AND kind = ?2",
        [session_id, kind],
        |r| Ok(r.get(0)?),
    )
}
