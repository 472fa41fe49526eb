//! Opening SQLite the way the store needs it: file modes, pragmas (WAL, synchronous, foreign
//! keys, busy timeout) and the schema migrations.

use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use rusqlite::{params, Connection, OpenFlags, TransactionBehavior};

use crate::error::{Result, StoreError};
use crate::time;

/// Schema migrations, applied in order, each in its own transaction, recorded in
/// `schema_migrations`. Never edit a released migration: add a new file.
pub(super) const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/0001_init.sql")),
    (2, include_str!("../../migrations/0002_audit_keyed.sql")),
    (3, include_str!("../../migrations/0003_limits.sql")),
    (4, include_str!("../../migrations/0004_session_extras.sql")),
    (5, include_str!("../../migrations/0005_key_approval.sql")),
    (6, include_str!("../../migrations/0006_key_egress.sql")),
];

pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How hard a commit is pushed to disk before a write returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=NORMAL` (with WAL): survives the process being killed, not a power loss.
    #[default]
    Process,
    /// `synchronous=FULL`: every commit is fsynced; survives a power loss. Slower.
    PowerLoss,
}

pub(super) fn open_flags() -> OpenFlags {
    // No SQLITE_OPEN_URI: the path is always a plain file name.
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
}

/// Creates missing parent directories (0700) and the database file (0600) so the key hashes
/// and code are not world-readable. SQLite gives the -wal and -shm files the same mode.
pub(super) fn prepare_path(path: &Path) -> Result<()> {
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

pub(super) fn configure(conn: &Connection, durability: Durability, file: bool) -> Result<()> {
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
pub(super) fn known_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

pub(super) fn migrate(conn: &mut Connection) -> Result<()> {
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
