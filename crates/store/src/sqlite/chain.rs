//! Reading the audit chains back: verification walks (one read snapshot per call), the heads,
//! and settling which key a database's chains are keyed with when it opens.

use std::path::Path;

use chrono::Utc;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};

use super::query::{collect, first, seq_of};
use crate::audit::keys::{self, Found};
use crate::audit::{
    legacy_mac, ChainFields, ChainKey, Expect, Legacy, StoredRow, TenantWalk, GENESIS_HASH,
};
use crate::error::{Result, StoreError};
use crate::{time, ChainHead, Expected, VerifyReport};

/// Text column as `&str`, or the column's name if it holds anything else.
fn text<'a>(r: &'a Row<'_>, i: usize, name: &'static str) -> Result<&'a str, &'static str> {
    match r.get_ref(i) {
        Ok(ValueRef::Text(b)) => std::str::from_utf8(b).map_err(|_| name),
        _ => Err(name),
    }
}

fn stored_row<'a>(r: &'a Row<'_>, tenant: &'a str) -> Result<StoredRow<'a>, &'static str> {
    let seq = match r.get_ref(0) {
        Ok(ValueRef::Integer(i)) => i,
        _ => return Err("seq"),
    };
    let session_id = match r.get_ref(2) {
        Ok(ValueRef::Null) => None,
        _ => Some(text(r, 2, "session_id")?),
    };
    Ok(StoredRow {
        fields: ChainFields {
            seq,
            tenant,
            execution_id: text(r, 1, "execution_id")?,
            session_id,
            status: text(r, 3, "status")?,
            code: text(r, 4, "code")?,
            execution_json: text(r, 5, "execution_json")?,
            created_at: text(r, 6, "created_at")?,
        },
        prev_hash: text(r, 7, "prev_hash")?,
        hash: text(r, 8, "hash")?,
    })
}

pub(super) fn verify_on(
    conn: &mut Connection,
    key: &ChainKey,
    tenant: Option<&str>,
    expected: &[Expected],
) -> Result<VerifyReport> {
    // One read transaction = one snapshot of rows and heads, even while appends go on.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Deferred)?;
    let mut tenants: Vec<String> = match tenant {
        Some(t) => vec![t.to_owned()],
        None => collect(
            &tx,
            "SELECT tenant FROM chain_heads UNION SELECT tenant FROM executions
             UNION SELECT tenant FROM audit_legacy ORDER BY 1",
            [],
            |r| Ok(r.get(0)?),
        )?,
    };
    if tenant.is_none() && !expected.is_empty() {
        // A tenant a checkpoint names but the database has forgotten entirely is walked too.
        let all: std::collections::BTreeSet<String> = tenants
            .drain(..)
            .chain(expected.iter().map(|e| e.head.tenant.clone()))
            .collect();
        tenants = all.into_iter().collect();
    }
    let mut checked = 0u64;
    for t in &tenants {
        let head = first(
            &tx,
            "SELECT seq, hash FROM chain_heads WHERE tenant = ?1",
            [t],
            |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?)),
        )?;
        let legacy = first(
            &tx,
            "SELECT seq, hash, mac FROM audit_legacy WHERE tenant = ?1",
            [t],
            |r| {
                Ok(Legacy {
                    seq: r.get(0)?,
                    hash: r.get(1)?,
                    mac: r.get(2)?,
                })
            },
        )?;
        let expect = expected
            .iter()
            .filter(|e| e.head.tenant == *t)
            .map(|e| Expect {
                count: i64::try_from(e.head.count).unwrap_or(i64::MAX),
                head: e.head.head.clone(),
                source: e.source.clone(),
            })
            .collect();
        let mut walk = TenantWalk::new(t, key, head, legacy, expect);
        let mut result = walk.start();
        if result.is_ok() {
            let mut stmt = tx.prepare_cached(
                "SELECT seq, execution_id, session_id, status, code, execution_json, created_at, \
                        prev_hash, hash
                 FROM executions WHERE tenant = ?1 ORDER BY seq",
            )?;
            let mut rows = stmt.query([t])?;
            while let Some(r) = rows.next()? {
                result = match stored_row(r, t) {
                    Ok(row) => walk.row(&row),
                    Err(column) => {
                        let id = match r.get_ref(1) {
                            Ok(ValueRef::Text(b)) => String::from_utf8_lossy(b).into_owned(),
                            _ => String::new(),
                        };
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

pub(super) fn chain_heads_on(conn: &Connection, tenant: Option<&str>) -> Result<Vec<ChainHead>> {
    let head = |r: &Row<'_>| {
        Ok(ChainHead {
            tenant: r.get(0)?,
            count: seq_of(r, 1)?,
            head: r.get(2)?,
        })
    };
    match tenant {
        None => collect(
            conn,
            "SELECT tenant, seq, hash FROM chain_heads ORDER BY tenant",
            [],
            head,
        ),
        Some(t) => Ok(vec![first(
            conn,
            "SELECT tenant, seq, hash FROM chain_heads WHERE tenant = ?1",
            [t],
            head,
        )?
        .unwrap_or_else(|| ChainHead {
            tenant: t.to_owned(),
            count: 0,
            head: GENESIS_HASH.to_owned(),
        })]),
    }
}

/// Settles which chain key the database is keyed with, on the writer connection right after
/// the migrations, and returns the key.
///
/// One IMMEDIATE transaction, so two processes opening the same database at once decide
/// together. The first time (no `audit_keying` row): if the key file did not exist either,
/// runcell creates the key and anchors every tenant's existing records as the legacy
/// (unkeyed) prefix; if the key file did exist (made by hand, say), nothing is anchored and any
/// unkeyed record fails verification, since nothing outside the database can say it is old.
/// Later: the key must be the recorded one.
pub(super) fn settle_chain_key(conn: &mut Connection, key_file: &Path) -> Result<ChainKey> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let recorded: Option<String> = tx
        .query_row("SELECT key_id FROM audit_keying WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()?;
    let found = keys::find_chain_key(key_file)?;
    let key = match (recorded, found) {
        (Some(id), Found::Existing(key)) => {
            if key.id() != id {
                return Err(StoreError::WrongChainKey {
                    path: key_file.to_owned(),
                    expected: id,
                    found: format!("holds key {}", key.id()),
                });
            }
            key
        }
        (Some(id), Found::New { key, tmp }) => {
            if key.id() != id {
                keys::discard(&tmp);
                return Err(StoreError::WrongChainKey {
                    path: key_file.to_owned(),
                    expected: id,
                    found: "does not exist".into(),
                });
            }
            // A key made by an open that crashed after committing, before putting it in place.
            keys::publish(&tmp, key_file, &key)?;
            key
        }
        (None, Found::Existing(key)) => {
            record_keying(&tx, &key)?;
            tx.commit()?;
            return Ok(key);
        }
        (None, Found::New { key, tmp }) => {
            let heads = chain_heads_on(&tx, None)?;
            for h in &heads {
                let seq = i64::try_from(h.count)
                    .map_err(|_| StoreError::Corrupt("chain head seq overflow".into()))?;
                tx.execute(
                    "INSERT OR REPLACE INTO audit_legacy (tenant, seq, hash, mac)
                     VALUES (?1, ?2, ?3, ?4)",
                    params![
                        h.tenant,
                        seq,
                        h.head,
                        legacy_mac(&key, &h.tenant, seq, &h.head)
                    ],
                )?;
            }
            record_keying(&tx, &key)?;
            // Committed before the key is in place: a crash in between leaves the key in its
            // temporary file, which the next open finds and puts in place (above).
            tx.commit()?;
            keys::publish(&tmp, key_file, &key)?;
            return Ok(key);
        }
    };
    tx.commit()?;
    Ok(key)
}

pub(super) fn record_keying(tx: &Connection, key: &ChainKey) -> Result<()> {
    tx.execute(
        "INSERT INTO audit_keying (id, key_id, keyed_at) VALUES (1, ?1, ?2)",
        params![key.id(), time::fmt(Utc::now())],
    )?;
    Ok(())
}
