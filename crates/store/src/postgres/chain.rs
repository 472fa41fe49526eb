//! The audit chains on PostgreSQL: appends from several nodes at once, serialised per tenant
//! by a row lock on the tenant's chain head; listing; verification from one snapshot.

use std::collections::BTreeSet;
use std::pin::pin;

use futures_util::StreamExt;
use tokio_postgres::error::SqlState;
use tokio_postgres::{IsolationLevel, Row};

use super::pool::PgConn;
use super::records::{self, Owner};
use crate::audit::{chain_mac, ChainFields, ChainKey, Expect, StoredRow, TenantWalk, GENESIS_HASH};
use crate::error::{Result, StoreError};
use crate::pending::PendingAppend;
use crate::{time, AuditEntry, ChainHead, ExecutionRow, Expected, VerifyReport};

/// Appends `batch` (in order) to the tenants' chains in one transaction; all or nothing.
/// `Conflict` if an execution id is already recorded.
///
/// Every tenant the batch touches has its chain head locked first (`FOR UPDATE`), in name
/// order: an append on another node to the same tenant waits until this one commits and then
/// reads the head this one wrote, so the chain never forks; batches that share tenants lock
/// them in the same order, so they cannot deadlock.
///
/// A node (`owner`) records only while its epoch is alive in the database and only for
/// sessions it still holds: checked in the same transaction, so a node that comes back
/// after the others called it dead, or after its session moved to another node, cannot add
/// to the chain what it ran meanwhile ([`StoreError::Fenced`]).
pub(super) async fn append_batch(
    c: &mut PgConn,
    key: &ChainKey,
    batch: &[PendingAppend<'_>],
    owner: Option<&Owner>,
) -> Result<Vec<AuditEntry>> {
    let (client, mut st) = c.split();
    let tx = client.transaction().await?;
    if let Some(owner) = owner {
        if !records::epoch_alive(&tx, owner).await? {
            return Err(StoreError::Fenced(crate::lease::lost(owner.epoch)));
        }
        let sessions: Vec<&str> = batch
            .iter()
            .filter_map(|p| p.rec.session_id.as_deref())
            .collect();
        if !sessions.is_empty() {
            let held_elsewhere = st
                .get(
                    &tx,
                    "SELECT id FROM sessions WHERE id = ANY($1) AND owner_node IS NOT NULL
                       AND (owner_node <> $2 OR owner_epoch > $3) LIMIT 1",
                )
                .await?;
            if let Some(r) = tx
                .query_opt(&held_elsewhere, &[&sessions, &owner.node, &owner.epoch])
                .await?
            {
                let id: String = r.try_get(0)?;
                return Err(StoreError::Fenced(format!(
                    "session {id} is held by another node now (or by a later start of this \
                     one): this node can no longer act on it"
                )));
            }
        }
    }
    let lock_head = st
        .get(
            &tx,
            "SELECT seq, hash FROM chain_heads WHERE tenant = $1 FOR UPDATE",
        )
        .await?;
    let tenants: BTreeSet<&str> = batch.iter().map(|p| p.rec.tenant.as_str()).collect();
    let mut heads: Vec<(&str, i64, String)> = Vec::with_capacity(tenants.len());
    for tenant in tenants {
        let mut head = tx.query_opt(&lock_head, &[&tenant]).await?;
        if head.is_none() {
            // A tenant's first append makes its head row, to lock it. If another node made
            // it meanwhile, this waits for that one to commit and then locks the row it made.
            let create = st
                .get(
                    &tx,
                    "INSERT INTO chain_heads (tenant, seq, hash) VALUES ($1, 0, $2)
                     ON CONFLICT (tenant) DO NOTHING",
                )
                .await?;
            tx.execute(&create, &[&tenant, &GENESIS_HASH]).await?;
            head = tx.query_opt(&lock_head, &[&tenant]).await?;
        }
        let head = head.ok_or_else(|| StoreError::Corrupt("a chain head vanished".into()))?;
        heads.push((tenant, head.try_get(0)?, head.try_get(1)?));
    }
    let insert = st
        .get(
            &tx,
            "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                     execution_json, created_at, prev_hash, hash)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .await?;
    let mut entries = Vec::with_capacity(batch.len());
    for PendingAppend { rec, created_at } in batch {
        let head = heads
            .iter_mut()
            .find(|h| h.0 == rec.tenant)
            .ok_or_else(|| StoreError::Corrupt("a batch lost its tenant's head".into()))?;
        let seq = head
            .1
            .checked_add(1)
            .ok_or_else(|| StoreError::Corrupt("chain head seq overflow".into()))?;
        let hash = chain_mac(
            key,
            &head.2,
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
        let inserted = tx
            .execute(
                &insert,
                &[
                    &rec.tenant,
                    &seq,
                    &rec.execution_id,
                    &rec.session_id,
                    &rec.status,
                    &rec.code,
                    &rec.execution_json,
                    created_at,
                    &head.2,
                    &hash,
                ],
            )
            .await;
        match inserted {
            Ok(_) => {}
            // Only the execution id's own constraint is a reused id: any other (a lost chain
            // head reusing a seq, say) is damage, reported as such.
            Err(e)
                if e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                    && e.as_db_error().and_then(|d| d.constraint())
                        == Some("executions_execution_id_key") =>
            {
                return Err(StoreError::Conflict(format!(
                    "execution {} is already recorded",
                    rec.execution_id
                )))
            }
            Err(e) => return Err(e.into()),
        }
        entries.push(AuditEntry {
            seq: u64::try_from(seq).map_err(|_| StoreError::Corrupt("negative seq".into()))?,
            hash: hash.clone(),
        });
        head.1 = seq;
        head.2 = hash;
    }
    let move_head = st
        .get(
            &tx,
            "UPDATE chain_heads SET seq = $2, hash = $3 WHERE tenant = $1",
        )
        .await?;
    for (tenant, seq, hash) in &heads {
        tx.execute(&move_head, &[tenant, seq, hash]).await?;
    }
    // Durable when this returns, as far as the server's `synchronous_commit` says (on by
    // default: the commit's WAL is flushed first).
    tx.commit().await?;
    Ok(entries)
}

/// Commits a group-commit batch: one result per item, in order; a failed batch is retried
/// row by row so one bad row (a reused id) fails alone.
pub(super) async fn commit_appends(
    c: &mut PgConn,
    key: &ChainKey,
    batch: &[PendingAppend<'_>],
    owner: Option<&Owner>,
) -> Vec<Result<AuditEntry>> {
    match append_batch(c, key, batch, owner).await {
        Ok(entries) => entries.into_iter().map(Ok).collect(),
        Err(e) if batch.len() == 1 => vec![Err(e)],
        Err(_) => {
            let mut out = Vec::with_capacity(batch.len());
            for p in batch {
                out.push(
                    append_batch(c, key, std::slice::from_ref(p), owner)
                        .await
                        .map(|mut v| v.remove(0)),
                );
            }
            out
        }
    }
}

const EXEC_COLS: &str =
    "execution_id, session_id, status, code, execution_json, created_at, seq, hash";

fn execution_from(r: &Row) -> Result<ExecutionRow> {
    let seq: i64 = r.try_get(6)?;
    Ok(ExecutionRow {
        execution_id: r.try_get(0)?,
        session_id: r.try_get(1)?,
        status: r.try_get(2)?,
        code: r.try_get(3)?,
        execution_json: r.try_get(4)?,
        created_at: time::parse(&r.try_get::<_, String>(5)?)?,
        seq: u64::try_from(seq).map_err(|_| StoreError::Corrupt(format!("negative seq {seq}")))?,
        hash: r.try_get(7)?,
    })
}

pub(super) async fn list_executions(
    c: &mut PgConn,
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
    let (client, mut st) = c.split();
    // Rows are never changed once appended, so the cursor's seq and the page need no shared
    // snapshot.
    let below: i64 = match before {
        None => i64::MAX,
        Some(cursor) => {
            let q = st
                .get(
                    client,
                    "SELECT seq FROM executions WHERE tenant = $1 AND execution_id = $2",
                )
                .await?;
            client
                .query_opt(&q, &[&tenant, &cursor])
                .await?
                .ok_or_else(|| {
                    StoreError::NotFound(format!("execution {cursor:?} (the `before` cursor)"))
                })?
                .try_get(0)?
        }
    };
    // One extra row says whether there is a next page.
    let fetch = i64::try_from(limit).unwrap_or(1000) + 1;
    let mut rows = match session_id {
        None => {
            let q = st
                .get(
                    client,
                    "SELECT execution_id, session_id, status, code, execution_json, created_at,
                            seq, hash
                     FROM executions WHERE tenant = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3",
                )
                .await?;
            client.query(&q, &[&tenant, &below, &fetch]).await?
        }
        Some(session) => {
            let q = st
                .get(
                    client,
                    "SELECT execution_id, session_id, status, code, execution_json, created_at,
                            seq, hash
                     FROM executions WHERE tenant = $1 AND session_id = $2 AND seq < $3
                     ORDER BY seq DESC LIMIT $4",
                )
                .await?;
            client
                .query(&q, &[&tenant, &session, &below, &fetch])
                .await?
        }
    }
    .iter()
    .map(execution_from)
    .collect::<Result<Vec<_>>>()?;
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| r.execution_id.clone())
    } else {
        None
    };
    Ok((rows, next))
}

pub(super) async fn get_execution(
    c: &mut PgConn,
    tenant: &str,
    id: &str,
) -> Result<Option<ExecutionRow>> {
    let sql = format!("SELECT {EXEC_COLS} FROM executions WHERE tenant = $1 AND execution_id = $2");
    c.client
        .query_opt(&sql, &[&tenant, &id])
        .await?
        .as_ref()
        .map(execution_from)
        .transpose()
}

/// One stored row for the walk; `Err` names the column that does not hold what it should.
fn stored_row<'a>(r: &'a Row, tenant: &'a str) -> Result<StoredRow<'a>, &'static str> {
    fn text<'a>(r: &'a Row, i: usize, name: &'static str) -> Result<&'a str, &'static str> {
        r.try_get(i).map_err(|_| name)
    }
    Ok(StoredRow {
        fields: ChainFields {
            seq: r.try_get(0).map_err(|_| "seq")?,
            tenant,
            execution_id: text(r, 1, "execution_id")?,
            session_id: r.try_get(2).map_err(|_| "session_id")?,
            status: text(r, 3, "status")?,
            code: text(r, 4, "code")?,
            execution_json: text(r, 5, "execution_json")?,
            created_at: text(r, 6, "created_at")?,
        },
        prev_hash: text(r, 7, "prev_hash")?,
        hash: text(r, 8, "hash")?,
    })
}

/// Walks the chains (see [`crate::DomainStore::verify_extends`]) from one snapshot: a
/// read-only REPEATABLE READ transaction, so appends by any node go on meanwhile and none of
/// them is half seen. Rows stream in; a long chain is never held in memory.
pub(super) async fn verify(
    c: &mut PgConn,
    key: &ChainKey,
    tenant: Option<&str>,
    expected: &[Expected],
) -> Result<VerifyReport> {
    let tx = c
        .client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let mut tenants: BTreeSet<String> = match tenant {
        Some(t) => [t.to_owned()].into(),
        None => tx
            .query(
                "SELECT tenant FROM chain_heads UNION SELECT tenant FROM executions",
                &[],
            )
            .await?
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?,
    };
    if tenant.is_none() {
        // A tenant a checkpoint names but the database has forgotten entirely is walked too.
        tenants.extend(expected.iter().map(|e| e.head.tenant.clone()));
    }
    let rows_of = tx
        .prepare(
            "SELECT seq, execution_id, session_id, status, code, execution_json, created_at,
                    prev_hash, hash
             FROM executions WHERE tenant = $1 ORDER BY seq",
        )
        .await?;
    let mut checked = 0u64;
    for t in &tenants {
        let head = match tx
            .query_opt("SELECT seq, hash FROM chain_heads WHERE tenant = $1", &[t])
            .await?
        {
            Some(r) => Some((r.try_get::<_, i64>(0)?, r.try_get::<_, String>(1)?)),
            None => None,
        };
        let expect = expected
            .iter()
            .filter(|e| e.head.tenant == *t)
            .map(|e| Expect {
                count: i64::try_from(e.head.count).unwrap_or(i64::MAX),
                head: e.head.head.clone(),
                source: e.source.clone(),
            })
            .collect();
        let mut walk = TenantWalk::new(t, key, head, None, expect);
        let mut result = walk.start();
        if result.is_ok() {
            let mut rows = pin!(tx.query_raw(&rows_of, [t]).await?);
            while let Some(r) = rows.next().await {
                let r = r?;
                result = match stored_row(&r, t) {
                    Ok(row) => walk.row(&row),
                    Err(column) => {
                        let id = r.try_get::<_, String>(1).unwrap_or_default();
                        Err(walk.broken(&id, format!("row edited: malformed {column}")))
                    }
                };
                if result.is_err() {
                    break;
                }
            }
        }
        let result = result.and_then(|()| walk.finish());
        checked += walk.checked;
        if let Err(b) = result {
            return Ok(VerifyReport {
                ok: false,
                checked,
                first_broken: Some(b),
            });
        }
    }
    Ok(VerifyReport {
        ok: true,
        checked,
        first_broken: None,
    })
}

pub(super) async fn chain_heads(c: &mut PgConn, tenant: Option<&str>) -> Result<Vec<ChainHead>> {
    let head = |r: &Row| -> Result<ChainHead> {
        let seq: i64 = r.try_get(1)?;
        Ok(ChainHead {
            tenant: r.try_get(0)?,
            count: u64::try_from(seq)
                .map_err(|_| StoreError::Corrupt(format!("negative seq {seq}")))?,
            head: r.try_get(2)?,
        })
    };
    match tenant {
        None => c
            .client
            .query(
                "SELECT tenant, seq, hash FROM chain_heads ORDER BY tenant",
                &[],
            )
            .await?
            .iter()
            .map(head)
            .collect(),
        Some(t) => Ok(vec![match c
            .client
            .query_opt(
                "SELECT tenant, seq, hash FROM chain_heads WHERE tenant = $1",
                &[&t],
            )
            .await?
        {
            Some(r) => head(&r)?,
            None => ChainHead {
                tenant: t.to_owned(),
                count: 0,
                head: GENESIS_HASH.to_owned(),
            },
        }]),
    }
}
