//! [`Store`], the handle callers hold: some backend behind an `Arc`, opened as SQLite by
//! default, or as PostgreSQL for several nodes.

use std::fmt;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use crate::error::Result;
use crate::postgres::PgStore;
use crate::sqlite::{Durability, SqliteStore};
use crate::{Backend, DomainStore};

/// A shared handle to a storage backend: `Clone + Send + Sync`, and derefs to
/// [`Backend`], so `store.get_session(..)` just works.
#[derive(Clone)]
pub struct Store(Arc<dyn Backend>);

impl Store {
    /// Opens (creating if needed) the SQLite database at `path` with [`Durability::Process`],
    /// its chain keyed with the key in `keys/audit-chain.key` beside it (created if missing;
    /// see [`audit::keys`]).
    pub fn open(path: &Path) -> Result<Store> {
        Ok(Store(Arc::new(SqliteStore::open(path)?)))
    }

    /// Like [`Store::open`] with an explicit durability level.
    pub fn open_with(path: &Path, durability: Durability) -> Result<Store> {
        Ok(Store(Arc::new(SqliteStore::open_with(path, durability)?)))
    }

    /// Like [`Store::open_with`] with the chain key in `chain_key_file` (created if missing).
    pub fn open_keyed(path: &Path, durability: Durability, chain_key_file: &Path) -> Result<Store> {
        Ok(Store(Arc::new(SqliteStore::open_keyed(
            path,
            durability,
            chain_key_file,
        )?)))
    }

    /// Connects to the PostgreSQL database at `url`, its chain keyed with the key in
    /// `chain_key_file` (see [`PgStore::open`]).
    pub fn open_postgres(url: &str, chain_key_file: &Path) -> Result<Store> {
        Ok(Store(Arc::new(PgStore::open(url, chain_key_file)?)))
    }

    /// Like [`Store::open_postgres`], as the server of node `node` (see [`PgStore::open_node`]).
    pub fn open_postgres_node(url: &str, chain_key_file: &Path, node: &str) -> Result<Store> {
        Ok(Store(Arc::new(PgStore::open_node(
            url,
            chain_key_file,
            node,
        )?)))
    }

    /// A private in-memory SQLite database (for tests).
    pub fn open_in_memory() -> Result<Store> {
        Ok(Store(Arc::new(SqliteStore::open_in_memory()?)))
    }

    /// Wraps any backend.
    pub fn from_backend(backend: Arc<dyn Backend>) -> Store {
        Store(backend)
    }

    /// The same backend as the engine holds it: its [`DomainStore`] records only.
    pub fn domain(&self) -> Arc<dyn DomainStore> {
        self.0.clone()
    }
}

impl Deref for Store {
    type Target = dyn Backend;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Store").field(&self.0).finish()
    }
}
