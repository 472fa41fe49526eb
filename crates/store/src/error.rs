//! The store's error type.

use std::path::PathBuf;

/// Everything that can go wrong in the store. Messages are lowercase and never contain the
/// underlying cause's text: walk [`std::error::Error::source`] for it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller passed something the store refuses (bad name, bad limit, bad JSON, ...).
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A record the operation needs does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The record already exists (e.g. an execution id appended twice).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The database was migrated by a newer runcell than this one.
    #[error("database schema version {found} is newer than this binary knows ({known}); upgrade runcell")]
    SchemaTooNew {
        /// Highest migration recorded in the database.
        found: i64,
        /// Highest migration this binary carries.
        known: i64,
    },
    /// A migration failed; nothing of it was applied.
    #[error("applying schema migration {version} failed")]
    Migration {
        /// The migration's version.
        version: i64,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The database file's directory could not be created or the file could not be prepared.
    #[error("cannot prepare database path {path}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// SQLite could not be configured as required (e.g. WAL unavailable on this filesystem).
    #[error("unsupported database setup: {0}")]
    Unsupported(String),
    /// A stored value could not be read back (unparseable timestamp, negative size, ...).
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// An audit key file is missing, unreadable or malformed.
    #[error("audit key file {path}: {problem}")]
    AuditKey {
        /// The key file.
        path: PathBuf,
        /// What is wrong, e.g. `cannot read`.
        problem: String,
        /// The I/O error, if there was one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The database's chain is keyed with another key than the one given.
    #[error("the audit chain of this database is keyed with key {expected}, but {path} {found}")]
    WrongChainKey {
        /// The key file given.
        path: PathBuf,
        /// The key id the database records.
        expected: String,
        /// What the file holds instead: `holds key ID` or `does not exist`.
        found: String,
    },
    /// The operating system's random number generator failed.
    #[error("random number generator failed")]
    Random(#[source] getrandom::Error),
    /// The filesystem holding the database is full (SQLITE_FULL): nothing was written, and
    /// writes work again once space is freed. Reads are unaffected.
    #[error("the database's filesystem is full")]
    Full(#[source] rusqlite::Error),
    /// Any other SQLite error.
    #[error("sqlite error")]
    Sqlite(#[source] rusqlite::Error),
    /// The PostgreSQL server could not be reached, or the connection broke mid-call: nothing
    /// of the call was committed unless it says so, and the next call connects again.
    #[error("the database is unavailable: {reason}")]
    Unavailable {
        /// What failed, e.g. `cannot connect` or `no connection free within 10 s`.
        reason: String,
        /// What the driver said, if it said anything.
        #[source]
        source: Option<tokio_postgres::Error>,
    },
    /// This node cannot prove it still owns the sessions it holds (it could not renew its
    /// lease with the database in time, or the cluster declared its epoch dead, or another
    /// node or a later epoch of this one holds the session now): nothing was written. The
    /// text says which, for the client (HTTP 503).
    #[error("{0}")]
    Fenced(String),
    /// Any other PostgreSQL error.
    #[error("postgresql error")]
    Postgres(#[source] tokio_postgres::Error),
    /// A PostgreSQL migration failed; nothing of it was applied.
    #[error("applying postgresql schema migration {version} failed")]
    PgMigration {
        /// The migration's version.
        version: i64,
        /// What PostgreSQL said.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // Unavailable: a connection refused, broken or closed (an I/O error or none left),
        // or the server saying it cannot serve now: connection exceptions (class 08),
        // operator intervention such as a shutdown or a start-up in progress (57), resources
        // such as connection slots exhausted (53). Anything else is an answer about the call.
        let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        let class = e.code().map(|c| &c.code()[..2]);
        if e.is_closed() || io || matches!(class, Some("08" | "57" | "53")) {
            let reason = if e.is_closed() {
                "the connection closed"
            } else {
                "the server cannot serve now"
            };
            StoreError::Unavailable {
                reason: reason.into(),
                source: Some(e),
            }
        } else {
            StoreError::Postgres(e)
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        if is_full(&e) {
            StoreError::Full(e)
        } else {
            StoreError::Sqlite(e)
        }
    }
}

/// SQLite's own word for a full disk (it reports ENOSPC on a write as SQLITE_FULL), or a
/// shared-memory index it could not grow for want of space (SQLITE_IOERR_SHMSIZE).
fn is_full(e: &rusqlite::Error) -> bool {
    use rusqlite::ffi;
    match e {
        rusqlite::Error::SqliteFailure(f, _) => {
            f.code == rusqlite::ErrorCode::DiskFull || f.extended_code == ffi::SQLITE_IOERR_SHMSIZE
        }
        _ => false,
    }
}

impl StoreError {
    /// Whether the database could not be reached (PostgreSQL down, restarting or cut off):
    /// the caller can say so (HTTP 503) and retry.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    /// Whether the operation failed for want of space where the store writes (the database,
    /// its journal, a key file): the caller can say so (HTTP 507) rather than fail blindly,
    /// and retry once space is freed.
    pub fn is_storage_full(&self) -> bool {
        let enospc = |e: &std::io::Error| e.kind() == std::io::ErrorKind::StorageFull;
        match self {
            StoreError::Full(_) => true,
            StoreError::Migration { source, .. } => is_full(source),
            StoreError::Io { source, .. } => enospc(source),
            StoreError::AuditKey {
                source: Some(source),
                ..
            } => enospc(source),
            _ => false,
        }
    }
}

/// Shorthand used throughout the crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
