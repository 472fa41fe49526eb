//! The SQLite store itself: its connections (one writer, one reader, and a checkpointer of
//! its own) and the ways to open it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rusqlite::Connection;

use super::append::PendingAppend;
use super::chain::{record_keying, settle_chain_key};
use super::schema::{configure, known_version, migrate, open_flags, prepare_path, Durability};
use crate::audit::keys;
use crate::audit::ChainKey;
use crate::checkpoint::{Checkpointer, WalLimits};
use crate::error::Result;
use crate::group::GroupCommit;
use crate::AuditEntry;

/// SQLite storage: one writer connection (writes are serialised, which SQLite requires
/// anyway) and one reader connection so reads are not stuck behind writes. Chain
/// verification uses a connection of its own so it never blocks appends, and so do WAL
/// checkpoints (see `checkpoint`).
pub struct SqliteStore {
    /// Stopped first on drop (fields drop in order), before the connections close.
    pub(super) _checkpointer: Option<Checkpointer>,
    pub(super) path: Option<PathBuf>,
    pub(super) writer: Mutex<Connection>,
    pub(super) reader: Option<Mutex<Connection>>,
    /// Bumped by every key change made through this store (see `Backend::keys_generation`).
    pub(super) keys_generation: std::sync::atomic::AtomicU64,
    /// Concurrent execution appends, committed together.
    pub(super) appends: GroupCommit<PendingAppend<'static>, AuditEntry>,
    /// What the chain's HMACs are keyed with.
    pub(super) key: ChainKey,
    /// Executions appended through this store (see `Backend::appended_count`).
    pub(super) appended: std::sync::atomic::AtomicU64,
    /// Opened on a full disk, in exclusive locking mode (see `open_exclusive`).
    pub(super) exclusive: bool,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Connection>) -> MutexGuard<'_, Connection> {
    // A panic while holding the lock cannot leave a transaction open (rusqlite rolls back on
    // drop), so a poisoned connection is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` with [`Durability::Process`]:
    /// creates parent directories, enables WAL, `synchronous=NORMAL`, foreign keys and a 5 s
    /// busy timeout, and applies pending migrations. Refuses a database migrated by a newer
    /// runcell ([`crate::StoreError::SchemaTooNew`]).
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
    /// missing. Refuses ([`crate::StoreError::WrongChainKey`]) a key other than the one the
    /// database's chains are keyed with. On a filesystem too full to open it as usual, opens
    /// it for this process alone ([`crate::Backend::is_exclusive`]), so a full disk never keeps a
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

    pub(super) fn write(&self) -> MutexGuard<'_, Connection> {
        lock(&self.writer)
    }

    pub(super) fn read(&self) -> MutexGuard<'_, Connection> {
        match &self.reader {
            Some(r) => lock(r),
            None => self.write(),
        }
    }
}
