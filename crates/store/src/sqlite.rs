//! The SQLite backend.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rusqlite::types::ValueRef;
use rusqlite::{
    params, params_from_iter, Connection, OpenFlags, OptionalExtension, Params, Row,
    TransactionBehavior,
};

use crate::audit::keys::{self, Found};
use crate::audit::{
    chain_mac, legacy_mac, ChainFields, ChainKey, Expect, Legacy, StoredRow, TenantWalk,
    GENESIS_HASH,
};
use crate::checkpoint::{Checkpointer, WalLimits};
use crate::error::{Result, StoreError};
use crate::group::GroupCommit;
use crate::validate::{self, KEY_PREFIX_LEN};
use crate::{
    time, AuditEntry, Backend, ChainHead, DomainStore, ExecutionRow, Expected, KeyInfo,
    NewExecution, SessionRecord, TenantChange, TenantSettings, UploadRecord, VerifyReport,
};

/// Schema migrations, applied in order, each in its own transaction, recorded in
/// `schema_migrations`. Never edit a released migration: add a new file.
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../migrations/0001_init.sql")),
    (2, include_str!("../migrations/0002_audit_keyed.sql")),
    (3, include_str!("../migrations/0003_limits.sql")),
];

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How hard a commit is pushed to disk before a write returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=NORMAL` (with WAL): survives the process being killed, not a power loss.
    #[default]
    Process,
    /// `synchronous=FULL`: every commit is fsynced; survives a power loss. Slower.
    PowerLoss,
}

/// SQLite storage: one writer connection (writes are serialised, which SQLite requires
/// anyway) and one reader connection so reads are not stuck behind writes. Chain
/// verification uses a connection of its own so it never blocks appends, and so do WAL
/// checkpoints (see `checkpoint`).
pub struct SqliteStore {
    /// Stopped first on drop (fields drop in order), before the connections close.
    _checkpointer: Option<Checkpointer>,
    path: Option<PathBuf>,
    writer: Mutex<Connection>,
    reader: Option<Mutex<Connection>>,
    /// Bumped by every key change made through this store (see `Backend::keys_generation`).
    keys_generation: std::sync::atomic::AtomicU64,
    /// Concurrent execution appends, committed together.
    appends: GroupCommit<PendingAppend<'static>, AuditEntry>,
    /// What the chain's HMACs are keyed with.
    key: ChainKey,
    /// Executions appended through this store (see `Backend::appended_count`).
    appended: std::sync::atomic::AtomicU64,
    /// Opened on a full disk, in exclusive locking mode (see `open_exclusive`).
    exclusive: bool,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Increments a generation when the key change it guards is over (committed or not).
struct BumpOnDrop<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for BumpOnDrop<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic while holding the lock cannot leave a transaction open (rusqlite rolls back on
    // drop), so a poisoned connection is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn open_flags() -> OpenFlags {
    // No SQLITE_OPEN_URI: the path is always a plain file name.
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
}

/// Creates missing parent directories (0700) and the database file (0600) so the key hashes
/// and code are not world-readable. SQLite gives the -wal and -shm files the same mode.
fn prepare_path(path: &Path) -> Result<()> {
    let io = |source| StoreError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
        b.create(dir).map_err(io)?;
    }
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path).map(drop).map_err(io)
}

fn configure(conn: &Connection, durability: Durability, file: bool) -> Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    if file {
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Unsupported(format!(
                "sqlite refused WAL journal mode (got {mode:?}); is the data dir on a network \
                 filesystem?"
            )));
        }
    }
    let sync = match durability {
        Durability::Process => "NORMAL",
        Durability::PowerLoss => "FULL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(())
}

/// The highest schema version this binary knows.
fn known_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

fn migrate(conn: &mut Connection) -> Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    INTEGER PRIMARY KEY,
             applied_at TEXT NOT NULL
         ) STRICT;",
    )?;
    let known = known_version();
    for &(version, sql) in MIGRATIONS {
        // IMMEDIATE: two processes opening a fresh database at once apply each migration once.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let found: i64 = tx.query_row(
            "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
            [],
            |r| r.get(0),
        )?;
        if found > known {
            return Err(StoreError::SchemaTooNew { found, known });
        }
        if found < version {
            tx.execute_batch(sql)
                .map_err(|source| StoreError::Migration { version, source })?;
            tx.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, ?2)",
                params![version, time::fmt(Utc::now())],
            )?;
        }
        tx.commit()?;
    }
    // Also covers a binary with no migrations newer than what is recorded.
    let found: i64 = conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |r| r.get(0),
    )?;
    if found > known {
        return Err(StoreError::SchemaTooNew { found, known });
    }
    Ok(())
}

/// Runs `sql` and maps every row with `f`.
fn collect<T>(
    conn: &Connection,
    sql: &str,
    p: impl Params,
    f: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(p)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(f(r)?);
    }
    Ok(out)
}

/// Runs `sql` and maps the first row, if any, with `f`.
fn first<T>(
    conn: &Connection,
    sql: &str,
    p: impl Params,
    f: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Option<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(p)?;
    match rows.next()? {
        Some(r) => Ok(Some(f(r)?)),
        None => Ok(None),
    }
}

/// An execution waiting in the group commit, with its timestamp already formatted.
#[derive(Debug)]
struct PendingAppend<'a> {
    rec: Cow<'a, NewExecution>,
    created_at: String,
}

/// Checks one record and formats its timestamp for the chain.
fn pending_append(rec: &NewExecution) -> Result<PendingAppend<'_>> {
    validate::name("tenant", &rec.tenant)?;
    validate::id("execution id", &rec.execution_id)?;
    if let Some(s) = &rec.session_id {
        validate::id("session id", s)?;
    }
    validate::word("status", &rec.status)?;
    validate::json("execution_json", &rec.execution_json)?;
    Ok(PendingAppend {
        created_at: time::fmt(rec.created_at),
        rec: Cow::Borrowed(rec),
    })
}

/// Appends `batch` (in order) to the tenants' chains in one IMMEDIATE transaction and
/// commits; all or nothing. `Conflict` if an execution id is already recorded.
fn append_batch(
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
fn commit_appends(
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

fn ts(r: &Row<'_>, i: usize) -> Result<DateTime<Utc>> {
    time::parse(&r.get::<_, String>(i)?)
}

fn seq_of(r: &Row<'_>, i: usize) -> Result<u64> {
    let v: i64 = r.get(i)?;
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative seq {v}")))
}

const KEY_COLS: &str = "id, name, tenant, created_at, revoked_at, prefix";

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
    })
}

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

fn verify_on(
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

fn chain_heads_on(conn: &Connection, tenant: Option<&str>) -> Result<Vec<ChainHead>> {
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
fn settle_chain_key(conn: &mut Connection, key_file: &Path) -> Result<ChainKey> {
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

fn record_keying(tx: &Connection, key: &ChainKey) -> Result<()> {
    tx.execute(
        "INSERT INTO audit_keying (id, key_id, keyed_at) VALUES (1, ?1, ?2)",
        params![key.id(), time::fmt(Utc::now())],
    )?;
    Ok(())
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` with [`Durability::Process`]:
    /// creates parent directories, enables WAL, `synchronous=NORMAL`, foreign keys and a 5 s
    /// busy timeout, and applies pending migrations. Refuses a database migrated by a newer
    /// runcell ([`StoreError::SchemaTooNew`]).
    pub fn open(path: &Path) -> Result<SqliteStore> {
        Self::open_with(path, Durability::Process)
    }

    /// Like [`SqliteStore::open`] with an explicit durability level. The chain key is
    /// `keys/audit-chain.key` beside the database (see [`crate::audit::keys`]).
    pub fn open_with(path: &Path, durability: Durability) -> Result<SqliteStore> {
        let key_file = keys::default_dir(path).join(keys::CHAIN_KEY_FILE);
        Self::open_keyed(path, durability, &key_file)
    }

    /// Like [`SqliteStore::open_with`] with the chain key in `chain_key_file`, created if
    /// missing. Refuses ([`StoreError::WrongChainKey`]) a key other than the one the
    /// database's chains are keyed with. On a filesystem too full to open it as usual, opens
    /// it for this process alone ([`Backend::is_exclusive`]), so a full disk never keeps a
    /// server from starting and serving reads.
    pub fn open_keyed(
        path: &Path,
        durability: Durability,
        chain_key_file: &Path,
    ) -> Result<SqliteStore> {
        Self::open_inner(path, durability, WalLimits::default(), chain_key_file)
    }

    #[cfg(test)]
    pub(crate) fn open_tuned(
        path: &Path,
        durability: Durability,
        limits: WalLimits,
    ) -> Result<SqliteStore> {
        let key_file = keys::default_dir(path).join(keys::CHAIN_KEY_FILE);
        Self::open_inner(path, durability, limits, &key_file)
    }

    fn open_inner(
        path: &Path,
        durability: Durability,
        limits: WalLimits,
        chain_key_file: &Path,
    ) -> Result<SqliteStore> {
        prepare_path(path)?;
        match Self::open_shared(path, durability, limits, chain_key_file) {
            Err(e) if e.is_storage_full() => Self::open_exclusive(path, durability, chain_key_file),
            r => r,
        }
    }

    /// The usual open: a writer, a reader and a checkpointer, each its own connection, which
    /// share the WAL index through the `-shm` file (so other processes, `runcell keys` say,
    /// can use the database meanwhile).
    fn open_shared(
        path: &Path,
        durability: Durability,
        limits: WalLimits,
        chain_key_file: &Path,
    ) -> Result<SqliteStore> {
        let mut writer = Connection::open_with_flags(path, open_flags())?;
        configure(&writer, durability, true)?;
        migrate(&mut writer)?;
        let key = settle_chain_key(&mut writer, chain_key_file)?;
        let reader = Connection::open_with_flags(path, open_flags())?;
        configure(&reader, durability, true)?;
        reader.pragma_update(None, "query_only", true)?;
        // Its `synchronous` decides how a checkpoint syncs, so it is configured like the rest.
        let checkpoints = Connection::open_with_flags(path, open_flags())?;
        configure(&checkpoints, durability, true)?;
        let checkpointer = Checkpointer::start(path, &mut writer, checkpoints, limits)?;
        Ok(SqliteStore {
            _checkpointer: Some(checkpointer),
            path: Some(path.to_owned()),
            writer: Mutex::new(writer),
            reader: Some(Mutex::new(reader)),
            keys_generation: Default::default(),
            appends: GroupCommit::new(),
            key,
            appended: Default::default(),
            exclusive: false,
        })
    }

    /// The open of last resort, on a filesystem too full for the `-shm` file the WAL index
    /// lives in (it is created, and grown to 32 KiB, by the first connection of a database
    /// closed cleanly): one connection in exclusive locking mode keeps the index in its own
    /// memory and needs no `-shm` at all. Reads work at once and writes as soon as there is
    /// room again, so a server started on a full disk can serve, and recover by itself; but
    /// no other process can open the database until this one closes it (`runcell keys` and
    /// `runcell audit` wait for the server to stop). Migrations that are already applied and
    /// an existing chain key write nothing; anything else that must write fails as `Full`.
    fn open_exclusive(
        path: &Path,
        durability: Durability,
        chain_key_file: &Path,
    ) -> Result<SqliteStore> {
        let mut conn = Connection::open_with_flags(path, open_flags())?;
        // Before the first access: only then does SQLite never touch the shared memory.
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
        configure(&conn, durability, true)?;
        migrate(&mut conn)?;
        let key = settle_chain_key(&mut conn, chain_key_file)?;
        Ok(SqliteStore {
            // SQLite's own checkpoints, in the commits: there is no second connection.
            _checkpointer: None,
            path: Some(path.to_owned()),
            writer: Mutex::new(conn),
            reader: None,
            keys_generation: Default::default(),
            appends: GroupCommit::new(),
            key,
            appended: Default::default(),
            exclusive: true,
        })
    }

    /// A private in-memory database (one connection; for tests), keyed with a random key
    /// kept nowhere.
    pub fn open_in_memory() -> Result<SqliteStore> {
        let mut conn = Connection::open_in_memory()?;
        configure(&conn, Durability::Process, false)?;
        migrate(&mut conn)?;
        let key = ChainKey::generate()?;
        record_keying(&conn, &key)?;
        Ok(SqliteStore {
            _checkpointer: None,
            path: None,
            writer: Mutex::new(conn),
            reader: None,
            keys_generation: Default::default(),
            appends: GroupCommit::new(),
            key,
            appended: Default::default(),
            exclusive: false,
        })
    }

    /// The database file, if not in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The schema version this binary migrates to.
    pub fn schema_version() -> i64 {
        known_version()
    }

    fn write(&self) -> MutexGuard<'_, Connection> {
        lock(&self.writer)
    }

    fn read(&self) -> MutexGuard<'_, Connection> {
        match &self.reader {
            Some(r) => lock(r),
            None => self.write(),
        }
    }
}

impl DomainStore for SqliteStore {
    fn tenant_settings(&self, tenant: &str) -> Result<TenantSettings> {
        Ok(first(
            &self.read(),
            "SELECT tenant, max_sessions, max_memory_mb, start FROM tenants WHERE tenant = ?1",
            [tenant],
            quota_from,
        )?
        .unwrap_or_else(|| TenantSettings {
            tenant: tenant.to_owned(),
            ..TenantSettings::default()
        }))
    }

    fn put_session(&self, s: &SessionRecord) -> Result<()> {
        validate::id("session id", &s.id)?;
        validate::name("tenant", &s.tenant)?;
        validate::word("language", &s.language)?;
        validate::word("status", &s.status)?;
        validate::json("limits_json", &s.limits_json)?;
        validate::json("metadata_json", &s.metadata_json)?;
        validate::word("start", &s.start)?;
        // An upsert, not INSERT OR REPLACE: REPLACE deletes the old row first, which would
        // cascade to the session's uploads.
        let changed = self.write().execute(
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

    fn update_session_status(
        &self,
        id: &str,
        status: &str,
        last_active_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<bool> {
        validate::word("status", status)?;
        let n = self.write().execute(
            "UPDATE sessions SET status = ?2, last_active_at = ?3, expires_at = ?4 WHERE id = ?1",
            params![id, status, time::fmt(last_active_at), time::fmt(expires_at)],
        )?;
        Ok(n > 0)
    }

    fn get_session(&self, tenant: &str, id: &str) -> Result<Option<SessionRecord>> {
        first(
            &self.read(),
            &format!("SELECT {SESSION_COLS} FROM sessions WHERE tenant = ?1 AND id = ?2"),
            [tenant, id],
            session_from,
        )
    }

    fn list_sessions(&self, tenant: &str) -> Result<Vec<SessionRecord>> {
        collect(
            &self.read(),
            &format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE tenant = ?1 ORDER BY created_at, id"
            ),
            [tenant],
            session_from,
        )
    }

    fn delete_session(&self, id: &str) -> Result<bool> {
        // Uploads go with it (ON DELETE CASCADE), in the same statement.
        let n = self
            .write()
            .execute("DELETE FROM sessions WHERE id = ?1", [id])?;
        Ok(n > 0)
    }

    fn sessions_with_status(&self, statuses: &[&str]) -> Result<Vec<SessionRecord>> {
        if statuses.is_empty() {
            return Ok(Vec::new());
        }
        let marks = vec!["?"; statuses.len()].join(", ");
        collect(
            &self.read(),
            &format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE status IN ({marks})
                 ORDER BY created_at, id"
            ),
            params_from_iter(statuses),
            session_from,
        )
    }

    fn record_upload(
        &self,
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
        let mut conn = self.write();
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

    fn uploads(&self, session_id: &str) -> Result<Vec<UploadRecord>> {
        collect(
            &self.read(),
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

    fn append_execution(&self, rec: &NewExecution) -> Result<AuditEntry> {
        // Owned: the group commit's leader may be another thread.
        let pending = PendingAppend {
            rec: Cow::Owned(rec.clone()),
            ..pending_append(rec)?
        };
        // Concurrent appends share one transaction (see `group`): each returns once the
        // commit holding its row is done, so the contract above holds as with one commit each.
        let entry = self.appends.submit(pending, |batch| {
            commit_appends(&mut self.write(), &self.key, &batch)
        })?;
        self.appended
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(entry)
    }

    fn append_executions(&self, recs: &[NewExecution]) -> Vec<Result<AuditEntry>> {
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
            commit_appends(&mut self.write(), &self.key, &batch)
        }
        .into_iter();
        let ok = committed.as_slice().iter().filter(|r| r.is_ok()).count();
        self.appended
            .fetch_add(ok as u64, std::sync::atomic::Ordering::Relaxed);
        results
            .into_iter()
            .map(|r| {
                r.or_else(|| committed.next()).unwrap_or_else(|| {
                    Err(StoreError::Corrupt("a batch append lost a result".into()))
                })
            })
            .collect()
    }

    fn list_executions(
        &self,
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
        let mut conn = self.read();
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

    fn get_execution(&self, tenant: &str, id: &str) -> Result<Option<ExecutionRow>> {
        first(
            &self.read(),
            &format!("SELECT {EXEC_COLS} FROM executions WHERE tenant = ?1 AND execution_id = ?2"),
            [tenant, id],
            execution_from,
        )
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
        // Before the change, so a cached "no key needed" cannot outlive it (and after: below).
        self.keys_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let _bump = BumpOnDrop(&self.keys_generation);
        validate::name("key name", name)?;
        validate::name("tenant", tenant)?;
        let key = validate::new_key()?;
        let info = KeyInfo {
            id: validate::new_key_id()?,
            name: name.to_owned(),
            tenant: tenant.to_owned(),
            created_at: Utc::now(),
            revoked_at: None,
            prefix: key.chars().take(KEY_PREFIX_LEN).collect(),
        };
        self.write().execute(
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

    fn list_keys(&self) -> Result<Vec<KeyInfo>> {
        collect(
            &self.read(),
            &format!("SELECT {KEY_COLS} FROM api_keys ORDER BY created_at, id"),
            [],
            key_from,
        )
    }

    fn revoke_key(&self, id_or_name: &str) -> Result<bool> {
        let _bump = BumpOnDrop(&self.keys_generation);
        let mut conn = self.write();
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

    fn authenticate(&self, key: &str) -> Result<Option<KeyInfo>> {
        first(
            &self.read(),
            &format!("SELECT {KEY_COLS} FROM api_keys WHERE key_hash = ?1 AND revoked_at IS NULL"),
            [validate::sha256(key.as_bytes())],
            key_from,
        )
    }

    fn has_active_keys(&self) -> Result<bool> {
        Ok(self.read().query_row(
            "SELECT EXISTS (SELECT 1 FROM api_keys WHERE revoked_at IS NULL)",
            [],
            |r| r.get(0),
        )?)
    }

    fn find_key(&self, id_or_name: &str) -> Result<Option<KeyInfo>> {
        let conn = self.read();
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

    fn list_tenants(&self) -> Result<Vec<TenantSettings>> {
        collect(
            &self.read(),
            "SELECT tenant, max_sessions, max_memory_mb, start FROM tenants ORDER BY tenant",
            [],
            quota_from,
        )
    }

    fn update_tenant(&self, tenant: &str, change: &TenantChange) -> Result<TenantSettings> {
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
        let mut conn = self.write();
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

#[cfg(test)]
mod tests {
    use super::*;

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
