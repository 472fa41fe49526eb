//! Appending executions to the tenants' audit chains: each row's HMAC over the previous one,
//! the chain heads moved in the same IMMEDIATE transaction, and a failed group-commit batch
//! retried row by row so one bad row fails alone.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use crate::audit::{chain_mac, ChainFields, ChainKey, GENESIS_HASH};
use crate::error::{Result, StoreError};
pub(super) use crate::pending::{pending_append, PendingAppend};
use crate::AuditEntry;

/// Appends `batch` (in order) to the tenants' chains in one IMMEDIATE transaction and
/// commits; all or nothing. `Conflict` if an execution id is already recorded.
pub(super) fn append_batch(
    conn: &mut Connection,
    key: &ChainKey,
    batch: &[PendingAppend<'_>],
) -> Result<Vec<AuditEntry>> {
    // IMMEDIATE takes the write lock up front, so no other writer (another process on the
    // same file included) can read the same head and fork the chain.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    // Each tenant's head as this batch moves it: read once, written once at the end.
    let mut heads: Vec<(&str, i64, String)> = Vec::new();
    let mut entries = Vec::with_capacity(batch.len());
    for PendingAppend { rec, created_at } in batch {
        let taken: bool = tx
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM executions WHERE execution_id = ?1)")?
            .query_row([&rec.execution_id], |r| r.get(0))?;
        if taken {
            return Err(StoreError::Conflict(format!(
                "execution {} is already recorded",
                rec.execution_id
            )));
        }
        let head = match heads.iter().position(|h| h.0 == rec.tenant) {
            Some(i) => i,
            None => {
                let (seq, hash) = tx
                    .prepare_cached("SELECT seq, hash FROM chain_heads WHERE tenant = ?1")?
                    .query_row([&rec.tenant], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                    })
                    .optional()?
                    .unwrap_or_else(|| (0, GENESIS_HASH.to_owned()));
                heads.push((&rec.tenant, seq, hash));
                heads.len() - 1
            }
        };
        let (_, last, prev_hash) = &heads[head];
        let seq = last
            .checked_add(1)
            .ok_or_else(|| StoreError::Corrupt("chain head seq overflow".into()))?;
        let hash = chain_mac(
            key,
            prev_hash,
            &ChainFields {
                seq,
                tenant: &rec.tenant,
                execution_id: &rec.execution_id,
                session_id: rec.session_id.as_deref(),
                status: &rec.status,
                code: &rec.code,
                execution_json: &rec.execution_json,
                created_at,
            },
        );
        tx.prepare_cached(
            "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                     execution_json, created_at, prev_hash, hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?
        .execute(params![
            rec.tenant,
            seq,
            rec.execution_id,
            rec.session_id,
            rec.status,
            rec.code,
            rec.execution_json,
            created_at,
            prev_hash,
            hash
        ])?;
        let seq_u = u64::try_from(seq).map_err(|_| StoreError::Corrupt("negative seq".into()))?;
        entries.push(AuditEntry {
            seq: seq_u,
            hash: hash.clone(),
        });
        heads[head].1 = seq;
        heads[head].2 = hash;
    }
    for (tenant, seq, hash) in &heads {
        tx.prepare_cached(
            "INSERT INTO chain_heads (tenant, seq, hash) VALUES (?1, ?2, ?3)
             ON CONFLICT (tenant) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
        )?
        .execute(params![tenant, seq, hash])?;
    }
    // With WAL the commit has reached the OS when this returns (and the disk too with
    // Durability::PowerLoss).
    tx.commit()?;
    Ok(entries)
}

/// Commits a group-commit batch: one result per item, in order.
pub(super) fn commit_appends(
    conn: &mut Connection,
    key: &ChainKey,
    batch: &[PendingAppend<'_>],
) -> Vec<Result<AuditEntry>> {
    match append_batch(conn, key, batch) {
        Ok(entries) => entries.into_iter().map(Ok).collect(),
        // Nothing of the batch was kept: each row on its own, so one bad row (a reused id)
        // fails alone and gets its own error.
        Err(e) if batch.len() == 1 => vec![Err(e)],
        Err(_) => batch
            .iter()
            .map(|p| append_batch(conn, key, std::slice::from_ref(p)).map(|mut v| v.remove(0)))
            .collect(),
    }
}
