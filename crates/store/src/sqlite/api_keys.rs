//! API keys: created with a random secret of which only the hash is kept, looked up by the
//! hash, revoked by id or by (unambiguous) name.

use chrono::Utc;
use rusqlite::{params, OptionalExtension, Row, TransactionBehavior};

use super::query::{collect, first, ts};
use super::store::SqliteStore;
use crate::error::{Result, StoreError};
use crate::validate::{self, KEY_PREFIX_LEN};
use crate::{time, KeyInfo};

/// Increments a generation when the key change it guards is over (committed or not).
struct BumpOnDrop<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for BumpOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

const KEY_COLS: &str = "id, name, tenant, created_at, revoked_at, prefix, approval, egress_allow";

fn key_from(r: &Row<'_>) -> Result<KeyInfo> {
    Ok(KeyInfo {
        id: r.get(0)?,
        name: r.get(1)?,
        tenant: r.get(2)?,
        created_at: ts(r, 3)?,
        revoked_at: match r.get::<_, Option<String>>(4)? {
            Some(s) => Some(time::parse(&s)?),
            None => None,
        },
        prefix: r.get(5)?,
        approval: crate::ApprovalMode::from_column(r.get(6)?)?,
        egress_allow: match r.get::<_, Option<String>>(7)? {
            Some(json) => Some(
                serde_json::from_str(&json)
                    .map_err(|e| StoreError::Corrupt(format!("key egress_allow {json:?}: {e}")))?,
            ),
            None => None,
        },
    })
}

pub(super) fn create_key(
    store: &SqliteStore,
    name: &str,
    tenant: &str,
    format: crate::KeyFormat,
) -> Result<(KeyInfo, String)> {
    // Before the change, so a cached "no key needed" cannot outlive it (and after: below).
    store
        .keys_generation
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let _bump = BumpOnDrop(&store.keys_generation);
    validate::name("key name", name)?;
    validate::name("tenant", tenant)?;
    let key = validate::new_key_in(format)?;
    let info = KeyInfo {
        id: validate::new_key_id()?,
        name: name.to_owned(),
        tenant: tenant.to_owned(),
        created_at: Utc::now(),
        revoked_at: None,
        prefix: key.chars().take(KEY_PREFIX_LEN).collect(),
        approval: None,
        egress_allow: None,
    };
    store.write().execute(
        "INSERT INTO api_keys (id, name, tenant, key_hash, prefix, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            info.id,
            info.name,
            info.tenant,
            validate::sha256(key.as_bytes()),
            info.prefix,
            time::fmt(info.created_at)
        ],
    )?;
    Ok((info, key))
}

pub(super) fn list_keys(store: &SqliteStore) -> Result<Vec<KeyInfo>> {
    collect(
        &store.read(),
        &format!("SELECT {KEY_COLS} FROM api_keys ORDER BY created_at, id"),
        [],
        key_from,
    )
}

pub(super) fn revoke_key(store: &SqliteStore, id_or_name: &str) -> Result<bool> {
    let _bump = BumpOnDrop(&store.keys_generation);
    let mut conn = store.write();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let by_id: Option<Option<String>> = tx
        .query_row(
            "SELECT revoked_at FROM api_keys WHERE id = ?1",
            [id_or_name],
            |r| r.get(0),
        )
        .optional()?;
    let id = match by_id {
        Some(Some(_)) => return Ok(false), // already revoked
        Some(None) => id_or_name.to_owned(),
        None => {
            let ids = collect(
                &tx,
                "SELECT id FROM api_keys WHERE name = ?1 AND revoked_at IS NULL",
                [id_or_name],
                |r| Ok(r.get::<_, String>(0)?),
            )?;
            match ids.as_slice() {
                [] => return Ok(false),
                [one] => one.clone(),
                many => {
                    return Err(StoreError::Invalid(format!(
                        "{} active keys are named {id_or_name:?}; revoke one by id",
                        many.len()
                    )))
                }
            }
        }
    };
    tx.execute(
        "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1",
        params![id, time::fmt(Utc::now())],
    )?;
    tx.commit()?;
    Ok(true)
}

pub(super) fn authenticate(store: &SqliteStore, key: &str) -> Result<Option<KeyInfo>> {
    first(
        &store.read(),
        &format!("SELECT {KEY_COLS} FROM api_keys WHERE key_hash = ?1 AND revoked_at IS NULL"),
        [validate::sha256(key.as_bytes())],
        key_from,
    )
}

pub(super) fn set_key_approval(
    store: &SqliteStore,
    id: &str,
    mode: Option<crate::ApprovalMode>,
) -> Result<Option<KeyInfo>> {
    let _bump = BumpOnDrop(&store.keys_generation);
    let changed = store.write().execute(
        "UPDATE api_keys SET approval = ?2 WHERE id = ?1",
        params![id, mode.map(crate::ApprovalMode::as_str)],
    )?;
    updated_key(store, id, changed)
}

pub(super) fn set_key_egress(
    store: &SqliteStore,
    id: &str,
    bound: Option<&[String]>,
) -> Result<Option<KeyInfo>> {
    if let Some(b) = bound {
        validate::egress_bound(b)?;
    }
    let _bump = BumpOnDrop(&store.keys_generation);
    let json = bound
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Invalid(e.to_string()))?;
    let changed = store.write().execute(
        "UPDATE api_keys SET egress_allow = ?2 WHERE id = ?1",
        params![id, json],
    )?;
    updated_key(store, id, changed)
}

/// The key `id` as an UPDATE of `changed` rows left it; none when there was no such key.
fn updated_key(store: &SqliteStore, id: &str, changed: usize) -> Result<Option<KeyInfo>> {
    if changed == 0 {
        return Ok(None);
    }
    first(
        &store.read(),
        &format!("SELECT {KEY_COLS} FROM api_keys WHERE id = ?1"),
        [id],
        key_from,
    )
}

pub(super) fn has_active_keys(store: &SqliteStore) -> Result<bool> {
    Ok(store.read().query_row(
        "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL)",
        [],
        |r| r.get(0),
    )?)
}

pub(super) fn find_key(store: &SqliteStore, id_or_name: &str) -> Result<Option<KeyInfo>> {
    let conn = store.read();
    if let Some(k) = first(
        &conn,
        &format!("SELECT {KEY_COLS} FROM api_keys WHERE id = ?1"),
        [id_or_name],
        key_from,
    )? {
        return Ok(Some(k));
    }
    let mut by_name = collect(
        &conn,
        &format!("SELECT {KEY_COLS} FROM api_keys WHERE name = ?1 AND revoked_at IS NULL"),
        [id_or_name],
        key_from,
    )?;
    match by_name.len() {
        0 | 1 => Ok(by_name.pop()),
        n => Err(StoreError::Invalid(format!(
            "{n} active keys are named {id_or_name:?}; name one by id"
        ))),
    }
}
