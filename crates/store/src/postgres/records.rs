//! API keys, tenants' settings, sessions and uploads on PostgreSQL: the same records and
//! rules as the SQLite backend's files of the same names, one statement each where SQLite
//! needed a transaction (PostgreSQL's constraints and row locks say what SQLite's write lock
//! did).

use chrono::{DateTime, Utc};
use tokio_postgres::error::SqlState;
use tokio_postgres::Row;

use super::pool::PgConn;
use crate::error::{Result, StoreError};
use crate::validate::{self, KEY_PREFIX_LEN};
use crate::{time, KeyInfo, SessionRecord, TenantChange, TenantSettings, UploadRecord};

fn ts(r: &Row, i: usize) -> Result<DateTime<Utc>> {
    time::parse(&r.try_get::<_, String>(i)?)
}

fn unsigned(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative {what} {v}")))
}

// ---- API keys ----

/// Also spelled out in `authenticate`'s prepared statement.
const KEY_COLS: &str = "id, name, tenant, created_at, revoked_at, prefix, approval, egress_allow";

fn key_from(r: &Row) -> Result<KeyInfo> {
    Ok(KeyInfo {
        id: r.try_get(0)?,
        name: r.try_get(1)?,
        tenant: r.try_get(2)?,
        created_at: ts(r, 3)?,
        revoked_at: match r.try_get::<_, Option<String>>(4)? {
            Some(s) => Some(time::parse(&s)?),
            None => None,
        },
        prefix: r.try_get(5)?,
        approval: crate::ApprovalMode::from_column(r.try_get(6)?)?,
        egress_allow: r.try_get(7)?,
    })
}

pub(super) async fn create_key(
    c: &mut PgConn,
    name: &str,
    tenant: &str,
    format: crate::KeyFormat,
) -> Result<(KeyInfo, String)> {
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
    let (client, mut st) = c.split();
    let insert = st
        .get(
            client,
            "INSERT INTO api_keys (id, name, tenant, key_hash, prefix, created_at)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .await?;
    client
        .execute(
            &insert,
            &[
                &info.id,
                &info.name,
                &info.tenant,
                &validate::sha256(key.as_bytes()),
                &info.prefix,
                &time::fmt(info.created_at),
            ],
        )
        .await?;
    Ok((info, key))
}

pub(super) async fn list_keys(c: &mut PgConn) -> Result<Vec<KeyInfo>> {
    let sql = format!("SELECT {KEY_COLS} FROM api_keys ORDER BY created_at, id");
    c.client
        .query(&sql, &[])
        .await?
        .iter()
        .map(key_from)
        .collect()
}

pub(super) async fn revoke_key(c: &mut PgConn, id_or_name: &str) -> Result<bool> {
    let tx = c.client.transaction().await?;
    // FOR UPDATE: a concurrent revoke of the same key (on another node) waits for this one.
    let by_id = tx
        .query_opt(
            "SELECT revoked_at FROM api_keys WHERE id = $1 FOR UPDATE",
            &[&id_or_name],
        )
        .await?;
    let id = match by_id {
        Some(r) if r.try_get::<_, Option<String>>(0)?.is_some() => return Ok(false),
        Some(_) => id_or_name.to_owned(),
        None => {
            let ids = tx
                .query(
                    "SELECT id FROM api_keys WHERE name = $1 AND revoked_at IS NULL FOR UPDATE",
                    &[&id_or_name],
                )
                .await?;
            match ids.as_slice() {
                [] => return Ok(false),
                [one] => one.try_get(0)?,
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
        "UPDATE api_keys SET revoked_at = $2 WHERE id = $1",
        &[&id, &time::fmt(Utc::now())],
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

pub(super) async fn authenticate(c: &mut PgConn, key: &str) -> Result<Option<KeyInfo>> {
    let (client, mut st) = c.split();
    let q = st
        .get(
            client,
            "SELECT id, name, tenant, created_at, revoked_at, prefix, approval, egress_allow FROM api_keys
             WHERE key_hash = $1 AND revoked_at IS NULL",
        )
        .await?;
    client
        .query_opt(&q, &[&validate::sha256(key.as_bytes())])
        .await?
        .as_ref()
        .map(key_from)
        .transpose()
}

pub(super) async fn has_active_keys(c: &mut PgConn) -> Result<bool> {
    Ok(c.client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL)",
            &[],
        )
        .await?
        .try_get(0)?)
}

pub(super) async fn find_key(c: &mut PgConn, id_or_name: &str) -> Result<Option<KeyInfo>> {
    let by_id = format!("SELECT {KEY_COLS} FROM api_keys WHERE id = $1");
    if let Some(r) = c.client.query_opt(&by_id, &[&id_or_name]).await? {
        return key_from(&r).map(Some);
    }
    let by_name = format!("SELECT {KEY_COLS} FROM api_keys WHERE name = $1 AND revoked_at IS NULL");
    let mut found = c
        .client
        .query(&by_name, &[&id_or_name])
        .await?
        .iter()
        .map(key_from)
        .collect::<Result<Vec<_>>>()?;
    match found.len() {
        0 | 1 => Ok(found.pop()),
        n => Err(StoreError::Invalid(format!(
            "{n} active keys are named {id_or_name:?}; name one by id"
        ))),
    }
}

pub(super) async fn set_key_approval(
    c: &mut PgConn,
    id: &str,
    mode: Option<crate::ApprovalMode>,
) -> Result<Option<KeyInfo>> {
    let sql = format!("UPDATE api_keys SET approval = $2 WHERE id = $1 RETURNING {KEY_COLS}");
    let word = mode.map(crate::ApprovalMode::as_str);
    match c.client.query_opt(&sql, &[&id, &word]).await? {
        Some(r) => key_from(&r).map(Some),
        None => Ok(None),
    }
}

pub(super) async fn set_key_egress(
    c: &mut PgConn,
    id: &str,
    bound: Option<Vec<String>>,
) -> Result<Option<KeyInfo>> {
    let sql = format!("UPDATE api_keys SET egress_allow = $2 WHERE id = $1 RETURNING {KEY_COLS}");
    match c.client.query_opt(&sql, &[&id, &bound]).await? {
        Some(r) => key_from(&r).map(Some),
        None => Ok(None),
    }
}

// ---- tenants ----

const TENANT_COLS: &str = "tenant, max_sessions, max_memory_mb, start";

fn tenant_from(r: &Row) -> Result<TenantSettings> {
    let n = |i: usize| -> Result<Option<u64>> {
        r.try_get::<_, Option<i64>>(i)?
            .map(|v| unsigned(v, "quota"))
            .transpose()
    };
    Ok(TenantSettings {
        tenant: r.try_get(0)?,
        max_sessions: n(1)?,
        max_memory_mb: n(2)?,
        start: r.try_get(3)?,
    })
}

pub(super) async fn tenant_settings(c: &mut PgConn, tenant: &str) -> Result<TenantSettings> {
    let (client, mut st) = c.split();
    let q = st
        .get(
            client,
            "SELECT tenant, max_sessions, max_memory_mb, start FROM tenants WHERE tenant = $1",
        )
        .await?;
    Ok(match client.query_opt(&q, &[&tenant]).await? {
        Some(r) => tenant_from(&r)?,
        None => TenantSettings {
            tenant: tenant.to_owned(),
            ..TenantSettings::default()
        },
    })
}

pub(super) async fn list_tenants(c: &mut PgConn) -> Result<Vec<TenantSettings>> {
    let sql = format!("SELECT {TENANT_COLS} FROM tenants ORDER BY tenant");
    c.client
        .query(&sql, &[])
        .await?
        .iter()
        .map(tenant_from)
        .collect()
}

pub(super) async fn update_tenant(
    c: &mut PgConn,
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
    let now = time::fmt(Utc::now());
    let tx = c.client.transaction().await?;
    // The row first, so the read below can lock it: two nodes changing one tenant at once
    // apply their changes one after the other, neither lost.
    tx.execute(
        "INSERT INTO tenants (tenant, updated_at) VALUES ($1, $2) ON CONFLICT (tenant) DO NOTHING",
        &[&tenant, &now],
    )
    .await?;
    let sql = format!("SELECT {TENANT_COLS} FROM tenants WHERE tenant = $1 FOR UPDATE");
    let mut q = tenant_from(&tx.query_one(&sql, &[&tenant]).await?)?;
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
        "UPDATE tenants SET max_sessions = $2, max_memory_mb = $3, start = $4, updated_at = $5
         WHERE tenant = $1",
        &[
            &tenant,
            &q.max_sessions.map(int).transpose()?,
            &q.max_memory_mb.map(int).transpose()?,
            &q.start,
            &now,
        ],
    )
    .await?;
    tx.commit().await?;
    Ok(q)
}

// ---- sessions ----

/// The node a store writes sessions as (see `nodes.rs`), if it is one: a command that is no
/// node (`runcell keys`, `runcell audit`) owns nothing.
#[derive(Debug, Clone)]
pub(super) struct Owner {
    pub(super) node: String,
    pub(super) epoch: i64,
}

/// Whether `owner`'s epoch is alive in the database's eyes: its node row has that epoch and
/// beat within [`crate::NODE_TIMEOUT`]. Asked where an owner writes, in the write's transaction.
pub(super) async fn epoch_alive(
    client: &impl tokio_postgres::GenericClient,
    owner: &Owner,
) -> Result<bool> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM nodes WHERE id = $1 AND epoch = $2
                                 AND heartbeat_at > now() - interval '10 seconds')",
            &[&owner.node, &owner.epoch],
        )
        .await?
        .try_get(0)?)
}

fn owner_parts(owner: Option<&Owner>) -> (Option<&str>, Option<i64>) {
    (owner.map(|o| o.node.as_str()), owner.map(|o| o.epoch))
}

/// A session's status as every node reads it: `dead` when another node owns it and that
/// node's heartbeat is over 10 s old (or it never registered), else what its owner wrote.
/// `$1` is the reading node's id (NULL for none).
const SESSION_COLS: &str = "id, tenant, language, \
     CASE WHEN owner_node IS NOT NULL AND owner_node IS DISTINCT FROM $1 AND NOT EXISTS ( \
              SELECT 1 FROM nodes n WHERE n.id = sessions.owner_node \
                                      AND n.heartbeat_at > now() - interval '10 seconds') \
          THEN 'dead' ELSE status END AS status, \
     created_at, last_active_at, expires_at, limits_json, metadata_json, workspace_path, start";

fn session_from(r: &Row) -> Result<SessionRecord> {
    Ok(SessionRecord {
        id: r.try_get(0)?,
        tenant: r.try_get(1)?,
        language: r.try_get(2)?,
        status: r.try_get(3)?,
        created_at: ts(r, 4)?,
        last_active_at: ts(r, 5)?,
        expires_at: ts(r, 6)?,
        limits_json: r.try_get(7)?,
        metadata_json: r.try_get(8)?,
        workspace_path: r.try_get(9)?,
        start: r.try_get(10)?,
    })
}

pub(super) async fn put_session(
    c: &mut PgConn,
    s: &SessionRecord,
    owner: Option<&Owner>,
) -> Result<()> {
    validate::id("session id", &s.id)?;
    validate::name("tenant", &s.tenant)?;
    validate::word("language", &s.language)?;
    validate::word("status", &s.status)?;
    validate::json("limits_json", &s.limits_json)?;
    validate::json("metadata_json", &s.metadata_json)?;
    validate::word("start", &s.start)?;
    let (client, mut st) = c.split();
    // An upsert that keeps the row (and so its uploads), never moves it to another tenant,
    // and never takes it from another node (or from a later epoch of this one).
    let upsert = st
        .get(
            client,
            "INSERT INTO sessions (id, tenant, language, status, created_at, last_active_at,
                                   expires_at, limits_json, metadata_json, workspace_path, start,
                                   owner_node, owner_epoch)
             SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::text, $7::text,
                    $8::text, $9::text, $10::text, $11::text, $12::text, $13::bigint
             WHERE $12::text IS NULL
                OR EXISTS (SELECT 1 FROM nodes n WHERE n.id = $12 AND n.epoch = $13
                              AND n.heartbeat_at > now() - interval '10 seconds')
             ON CONFLICT (id) DO UPDATE SET
                 language = excluded.language, status = excluded.status,
                 created_at = excluded.created_at, last_active_at = excluded.last_active_at,
                 expires_at = excluded.expires_at, limits_json = excluded.limits_json,
                 metadata_json = excluded.metadata_json,
                 workspace_path = excluded.workspace_path, start = excluded.start,
                 owner_node = excluded.owner_node, owner_epoch = excluded.owner_epoch
             WHERE sessions.tenant = excluded.tenant
               AND (sessions.owner_node IS NULL
                    OR (sessions.owner_node = excluded.owner_node
                        AND sessions.owner_epoch <= excluded.owner_epoch))",
        )
        .await?;
    let (node, epoch) = owner_parts(owner);
    let changed = client
        .execute(
            &upsert,
            &[
                &s.id,
                &s.tenant,
                &s.language,
                &s.status,
                &time::fmt(s.created_at),
                &time::fmt(s.last_active_at),
                &time::fmt(s.expires_at),
                &s.limits_json,
                &s.metadata_json,
                &s.workspace_path,
                &s.start,
                &node,
                &epoch,
            ],
        )
        .await?;
    if changed == 0 {
        if let Some(owner) = owner {
            if !epoch_alive(client, owner).await? {
                return Err(StoreError::Fenced(crate::lease::lost(owner.epoch)));
            }
        }
        return Err(StoreError::Conflict(format!(
            "session {} belongs to another tenant, or to another node",
            s.id
        )));
    }
    Ok(())
}

pub(super) async fn update_session_status(
    c: &mut PgConn,
    id: &str,
    status: &str,
    last_active_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    owner: Option<&Owner>,
) -> Result<bool> {
    validate::word("status", status)?;
    let (client, mut st) = c.split();
    // Only the owner changes a session (an earlier epoch of it no longer can), and only
    // while the database counts its epoch alive (not once the others called it dead).
    let update = st
        .get(
            client,
            "UPDATE sessions SET status = $2, last_active_at = $3, expires_at = $4
             WHERE id = $1
               AND (owner_node IS NULL OR (owner_node = $5 AND owner_epoch <= $6))
               AND ($5::text IS NULL
                    OR EXISTS (SELECT 1 FROM nodes n WHERE n.id = $5 AND n.epoch = $6
                                  AND n.heartbeat_at > now() - interval '10 seconds'))",
        )
        .await?;
    let (node, epoch) = owner_parts(owner);
    let n = client
        .execute(
            &update,
            &[
                &id,
                &status,
                &time::fmt(last_active_at),
                &time::fmt(expires_at),
                &node,
                &epoch,
            ],
        )
        .await?;
    if n == 0 {
        if let Some(owner) = owner {
            if !epoch_alive(client, owner).await? {
                return Err(StoreError::Fenced(crate::lease::lost(owner.epoch)));
            }
        }
    }
    Ok(n > 0)
}

pub(super) async fn get_session(
    c: &mut PgConn,
    tenant: &str,
    id: &str,
    owner: Option<&Owner>,
) -> Result<Option<SessionRecord>> {
    let sql = format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant = $2 AND id = $3");
    let (node, _) = owner_parts(owner);
    c.client
        .query_opt(&sql, &[&node, &tenant, &id])
        .await?
        .as_ref()
        .map(session_from)
        .transpose()
}

pub(super) async fn list_sessions(
    c: &mut PgConn,
    tenant: &str,
    owner: Option<&Owner>,
) -> Result<Vec<SessionRecord>> {
    let sql =
        format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant = $2 ORDER BY created_at, id");
    let (node, _) = owner_parts(owner);
    c.client
        .query(&sql, &[&node, &tenant])
        .await?
        .iter()
        .map(session_from)
        .collect()
}

pub(super) async fn delete_session(c: &mut PgConn, id: &str) -> Result<bool> {
    // Uploads go with it (ON DELETE CASCADE), in the same statement.
    Ok(c.client
        .execute("DELETE FROM sessions WHERE id = $1", &[&id])
        .await?
        > 0)
}

/// The sessions a node answers for whose status (as it reads it) is one of `statuses`: its
/// own, those no node owns, and those of dead nodes (which read as `dead`). Another live
/// node's sessions are that node's to recover, sweep and expire.
pub(super) async fn sessions_with_status(
    c: &mut PgConn,
    statuses: &[String],
    owner: Option<&Owner>,
) -> Result<Vec<SessionRecord>> {
    if statuses.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "SELECT * FROM (SELECT {SESSION_COLS}, owner_node FROM sessions) s
         WHERE s.status = ANY($2)
           AND (s.owner_node IS NULL OR s.owner_node = $1 OR s.status = 'dead')
         ORDER BY created_at, id"
    );
    let (node, _) = owner_parts(owner);
    c.client
        .query(&sql, &[&node, &statuses])
        .await?
        .iter()
        .map(session_from)
        .collect()
}

// ---- uploads ----

pub(super) async fn record_upload(
    c: &mut PgConn,
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
    let (client, mut st) = c.split();
    let upsert = st
        .get(
            client,
            "INSERT INTO uploads (session_id, path, size, sha256, uploaded_at)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session_id, path) DO UPDATE SET
                 size = excluded.size, sha256 = excluded.sha256,
                 uploaded_at = excluded.uploaded_at",
        )
        .await?;
    let r = client
        .execute(
            &upsert,
            &[&session_id, &path, &size, &sha256_hex, &time::fmt(at)],
        )
        .await;
    match r {
        Ok(_) => Ok(()),
        // The session's foreign key: there is no such session (or it was just deleted).
        Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
            Err(StoreError::NotFound(format!("session {session_id}")))
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn uploads(c: &mut PgConn, session_id: &str) -> Result<Vec<UploadRecord>> {
    c.client
        .query(
            "SELECT session_id, path, size, sha256, uploaded_at FROM uploads
             WHERE session_id = $1 ORDER BY path",
            &[&session_id],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(UploadRecord {
                session_id: r.try_get(0)?,
                path: r.try_get(1)?,
                size: unsigned(r.try_get(2)?, "size")?,
                sha256: r.try_get(3)?,
                uploaded_at: ts(r, 4)?,
            })
        })
        .collect()
}

pub(super) async fn put_session_extra(
    c: &mut PgConn,
    session_id: &str,
    kind: &str,
    data: &str,
) -> Result<()> {
    let r = c
        .client
        .execute(
            "INSERT INTO session_extras (session_id, kind, data_json, updated_at)
             VALUES ($1, $2, $3, $4)
             ON CONFLICT (session_id, kind) DO UPDATE SET
                 data_json = excluded.data_json, updated_at = excluded.updated_at",
            &[&session_id, &kind, &data, &time::fmt(Utc::now())],
        )
        .await;
    match r {
        Ok(_) => Ok(()),
        // The session's foreign key: there is no such session (or it was just deleted).
        Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
            Err(StoreError::NotFound(format!("session {session_id}")))
        }
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn session_extra(
    c: &mut PgConn,
    session_id: &str,
    kind: &str,
) -> Result<Option<String>> {
    Ok(c.client
        .query_opt(
            "SELECT data_json FROM session_extras WHERE session_id = $1 AND kind = $2",
            &[&session_id, &kind],
        )
        .await?
        .map(|r| r.try_get(0))
        .transpose()?)
}
