//! Executions: appended to the audit chain through the group commit (or as one batch), listed
//! newest first with a cursor, read back by id.

use std::borrow::Cow;

use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};

use super::append::{commit_appends, pending_append, PendingAppend};
use super::query::{collect, first, seq_of, ts};
use super::store::SqliteStore;
use crate::error::{Result, StoreError};
use crate::{AuditEntry, ExecutionRow, NewExecution};

const EXEC_COLS: &str =
    "execution_id, session_id, status, code, execution_json, created_at, seq, hash";

fn execution_from(r: &Row<'_>) -> Result<ExecutionRow> {
    Ok(ExecutionRow {
        execution_id: r.get(0)?,
        session_id: r.get(1)?,
        status: r.get(2)?,
        code: r.get(3)?,
        execution_json: r.get(4)?,
        created_at: ts(r, 5)?,
        seq: seq_of(r, 6)?,
        hash: r.get(7)?,
    })
}

pub(super) fn append_execution(store: &SqliteStore, rec: &NewExecution) -> Result<AuditEntry> {
    // Owned: the group commit's leader may be another thread.
    let pending = PendingAppend {
        rec: Cow::Owned(rec.clone()),
        ..pending_append(rec)?
    };
    // Concurrent appends share one transaction (see `group`): each returns once the
    // commit holding its row is done, so the contract above holds as with one commit each.
    let entry = store.appends.submit(pending, |batch| {
        commit_appends(&mut store.write(), &store.key, &batch)
    })?;
    store
        .appended
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(entry)
}

pub(super) fn append_executions(
    store: &SqliteStore,
    recs: &[NewExecution],
) -> Vec<Result<AuditEntry>> {
    // The valid records share one transaction (on the writer connection, which the group
    // commit's leaders take too); the invalid ones get their error without touching it.
    let mut results: Vec<Option<Result<AuditEntry>>> = Vec::with_capacity(recs.len());
    let mut batch = Vec::with_capacity(recs.len());
    for rec in recs {
        match pending_append(rec) {
            Ok(p) => {
                batch.push(p);
                results.push(None);
            }
            Err(e) => results.push(Some(Err(e))),
        }
    }
    let mut committed = if batch.is_empty() {
        Vec::new()
    } else {
        commit_appends(&mut store.write(), &store.key, &batch)
    }
    .into_iter();
    let ok = committed.as_slice().iter().filter(|r| r.is_ok()).count();
    store
        .appended
        .fetch_add(ok as u64, std::sync::atomic::Ordering::Relaxed);
    results
        .into_iter()
        .map(|r| {
            r.or_else(|| committed.next())
                .unwrap_or_else(|| Err(StoreError::Corrupt("a batch append lost a result".into())))
        })
        .collect()
}

pub(super) fn list_executions(
    store: &SqliteStore,
    tenant: &str,
    session_id: Option<&str>,
    limit: usize,
    before: Option<&str>,
) -> Result<(Vec<ExecutionRow>, Option<String>)> {
    if !(1..=1000).contains(&limit) {
        return Err(StoreError::Invalid(format!(
            "limit must be 1 to 1000 (got {limit})"
        )));
    }
    let mut conn = store.read();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
    let below = match before {
        None => i64::MAX,
        Some(cursor) => tx
            .query_row(
                "SELECT seq FROM executions WHERE tenant = ?1 AND execution_id = ?2",
                [tenant, cursor],
                |r| r.get(0),
            )
            .optional()?
            // A cursor names an execution: one that does not exist is not found, like its id.
            .ok_or_else(|| {
                StoreError::NotFound(format!("execution {cursor:?} (the `before` cursor)"))
            })?,
    };
    // Fetch one extra row to know whether there is a next page.
    let fetch = i64::try_from(limit).unwrap_or(1000) + 1;
    let mut rows = match session_id {
        // Two statements so each can walk its own index backwards.
        None => collect(
            &tx,
            &format!(
                "SELECT {EXEC_COLS} FROM executions
                 WHERE tenant = ?1 AND seq < ?2 ORDER BY seq DESC LIMIT ?3"
            ),
            params![tenant, below, fetch],
            execution_from,
        )?,
        Some(session) => collect(
            &tx,
            &format!(
                "SELECT {EXEC_COLS} FROM executions
                 WHERE tenant = ?1 AND session_id = ?2 AND seq < ?3
                 ORDER BY seq DESC LIMIT ?4"
            ),
            params![tenant, session, below, fetch],
            execution_from,
        )?,
    };
    drop(tx);
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| r.execution_id.clone())
    } else {
        None
    };
    Ok((rows, next))
}

pub(super) fn get_execution(
    store: &SqliteStore,
    tenant: &str,
    id: &str,
) -> Result<Option<ExecutionRow>> {
    first(
        &store.read(),
        &format!("SELECT {EXEC_COLS} FROM executions WHERE tenant = ?1 AND execution_id = ?2"),
        [tenant, id],
        execution_from,
    )
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::super::append::append_batch;
    use super::*;
    use crate::{time, DomainStore};

    fn pending(tenant: &str, id: &str) -> PendingAppend<'static> {
        let created_at = Utc::now();
        PendingAppend {
            rec: Cow::Owned(NewExecution {
                tenant: tenant.into(),
                execution_id: id.into(),
                session_id: None,
                status: "ok".into(),
                code: "1+1".into(),
                execution_json: "{}".into(),
                created_at,
            }),
            created_at: time::fmt(created_at),
        }
    }

    fn store() -> SqliteStore {
        SqliteStore::open_in_memory().expect("open")
    }

    fn ids(s: &SqliteStore, tenant: &str) -> Vec<String> {
        let (rows, _) = s.list_executions(tenant, None, 100, None).expect("list");
        rows.into_iter().rev().map(|r| r.execution_id).collect()
    }

    #[test]
    fn a_reused_id_in_a_batch_fails_alone() {
        let s = store();
        let first = commit_appends(&mut s.write(), &s.key, &[pending("a", "ex_1")]);
        assert!(first[0].is_ok(), "{first:?}");
        let batch = [
            pending("a", "ex_2"),
            pending("b", "ex_1"),
            pending("a", "ex_3"),
        ];
        // All or nothing as one transaction...
        assert!(matches!(
            append_batch(&mut s.write(), &s.key, &batch),
            Err(StoreError::Conflict(_))
        ));
        assert_eq!(ids(&s, "a"), ["ex_1"]);
        // ...and as a group-commit batch each row gets its own result.
        let results = commit_appends(&mut s.write(), &s.key, &batch);
        assert_eq!(results[0].as_ref().expect("ex_2").seq, 2);
        assert!(
            matches!(results[1], Err(StoreError::Conflict(_))),
            "{results:?}"
        );
        assert_eq!(results[2].as_ref().expect("ex_3").seq, 3);
        assert_eq!(ids(&s, "a"), ["ex_1", "ex_2", "ex_3"]);
        assert!(ids(&s, "b").is_empty());
    }

    #[test]
    fn the_same_id_twice_in_one_batch_is_kept_once() {
        let s = store();
        let results = commit_appends(
            &mut s.write(),
            &s.key,
            &[pending("a", "ex_1"), pending("a", "ex_1")],
        );
        assert!(results[0].is_ok(), "{results:?}");
        assert!(
            matches!(results[1], Err(StoreError::Conflict(_))),
            "{results:?}"
        );
        assert_eq!(ids(&s, "a"), ["ex_1"]);
    }

    /// Guards the look-up's replacement by the UNIQUE index's error (tried, not measurably
    /// cheaper): only a reused execution id is a conflict.
    #[test]
    fn another_constraint_is_not_a_conflict() {
        let s = store();
        commit_appends(&mut s.write(), &s.key, &[pending("a", "ex_1")])
            .remove(0)
            .expect("append");
        // A lost chain head makes the next append reuse seq 1: the (tenant, seq) key refuses
        // it, which is damage, not a reused execution id.
        s.write()
            .execute("DELETE FROM chain_heads", [])
            .expect("delete head");
        let r = commit_appends(&mut s.write(), &s.key, &[pending("a", "ex_2")]).remove(0);
        assert!(matches!(r, Err(StoreError::Sqlite(_))), "{r:?}");
    }
}
