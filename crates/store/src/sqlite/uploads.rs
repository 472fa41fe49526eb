//! The latest upload of each path into a session's workspace (deleted with the session).

use chrono::{DateTime, Utc};
use rusqlite::{params, TransactionBehavior};

use super::query::{collect, ts};
use super::store::SqliteStore;
use crate::error::{Result, StoreError};
use crate::{time, validate, UploadRecord};

pub(super) fn record_upload(
    store: &SqliteStore,
    session_id: &str,
    path: &str,
    size: u64,
    sha256_hex: &str,
    at: DateTime<Utc>,
) -> Result<()> {
    if path.is_empty() || path.len() > 4096 || path.contains('\0') {
        return Err(StoreError::Invalid(
            "upload path must be 1 to 4096 bytes without NUL".into(),
        ));
    }
    validate::sha256_hex("sha256", sha256_hex)?;
    let size = i64::try_from(size)
        .map_err(|_| StoreError::Invalid(format!("upload size {size} is too large")))?;
    let mut conn = store.write();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let exists: bool = tx.query_row(
        "SELECT EXISTS (SELECT 1 FROM sessions WHERE id = ?1)",
        [session_id],
        |r| r.get(0),
    )?;
    if !exists {
        return Err(StoreError::NotFound(format!("session {session_id}")));
    }
    tx.execute(
        "INSERT INTO uploads (session_id, path, size, sha256, uploaded_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (session_id, path) DO UPDATE SET
             size = excluded.size, sha256 = excluded.sha256,
             uploaded_at = excluded.uploaded_at",
        params![session_id, path, size, sha256_hex, time::fmt(at)],
    )?;
    tx.commit()?;
    Ok(())
}

pub(super) fn uploads(store: &SqliteStore, session_id: &str) -> Result<Vec<UploadRecord>> {
    collect(
        &store.read(),
        "SELECT session_id, path, size, sha256, uploaded_at FROM uploads
         WHERE session_id = ?1 ORDER BY path",
        [session_id],
        |r| {
            let size: i64 = r.get(2)?;
            Ok(UploadRecord {
                session_id: r.get(0)?,
                path: r.get(1)?,
                size: u64::try_from(size)
                    .map_err(|_| StoreError::Corrupt(format!("negative size {size}")))?,
                sha256: r.get(3)?,
                uploaded_at: ts(r, 4)?,
            })
        },
    )
}
