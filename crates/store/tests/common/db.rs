//! One database of either backend, for test bodies that run against both: `both!` makes a
//! `sqlite::` and a `postgres::` test of each body.

use std::path::PathBuf;

use runcell_store::audit::ChainKey;
use runcell_store::Store;

use super::pg::pg_server;

/// Which backend a [`TestDb`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
}

/// A database of its own (a file, or a database on the test server) and its chain key file.
#[derive(Debug)]
pub struct TestDb {
    pub kind: Kind,
    _dir: tempfile::TempDir,
    /// The SQLite file.
    pub path: PathBuf,
    /// PostgreSQL's connection string and database name.
    pub url: String,
    pub db_name: String,
    pub key_file: PathBuf,
}

impl TestDb {
    pub fn new(kind: Kind) -> TestDb {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("data").join("runcell.db");
        let key_file = runcell_store::audit::keys::default_dir(&path)
            .join(runcell_store::audit::keys::CHAIN_KEY_FILE);
        let (url, db_name) = match kind {
            Kind::Sqlite => (String::new(), String::new()),
            Kind::Postgres => {
                let url = pg_server().new_database();
                let name = url.rsplit("dbname=").next().unwrap_or_default().to_owned();
                (url, name)
            }
        };
        TestDb {
            kind,
            _dir: dir,
            path,
            url,
            db_name,
            key_file,
        }
    }

    /// A new handle on the database: for PostgreSQL, what another node opens.
    pub fn open(&self) -> Store {
        match self.kind {
            Kind::Sqlite => Store::open(&self.path).expect("open sqlite store"),
            Kind::Postgres => {
                Store::open_postgres(&self.url, &self.key_file).expect("open postgres store")
            }
        }
    }

    /// A PostgreSQL store as the server of node `node` (registered, beating).
    pub fn open_node(&self, node: &str) -> Store {
        assert_eq!(self.kind, Kind::Postgres, "nodes are PostgreSQL's");
        Store::open_postgres_node(&self.url, &self.key_file, node).expect("open a node's store")
    }

    /// The chain key, as a thief would read it.
    pub fn stolen_key(&self) -> ChainKey {
        ChainKey::read(&self.key_file).expect("chain key")
    }

    /// Runs `sql` as someone with raw access to the database who first gets the append-only
    /// triggers out of the way. The statements must mean the same in both dialects.
    pub fn tamper(&self, sql: &str) {
        match self.kind {
            Kind::Sqlite => {
                let c = rusqlite::Connection::open(&self.path).expect("raw open");
                c.execute_batch(&format!(
                    "DROP TRIGGER IF EXISTS executions_no_update;
                     DROP TRIGGER IF EXISTS executions_no_delete; {sql}"
                ))
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
            Kind::Postgres => {
                // A superuser's session skips ordinary triggers in replica mode.
                pg_server()
                    .psql(
                        &self.db_name,
                        &format!("SET session_replication_role = replica; {sql}"),
                    )
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
            }
        }
    }

    /// Runs `sql` with raw access but leaves the triggers alone.
    pub fn try_sql(&self, sql: &str) -> Result<(), String> {
        match self.kind {
            Kind::Sqlite => rusqlite::Connection::open(&self.path)
                .expect("raw open")
                .execute_batch(sql)
                .map_err(|e| e.to_string()),
            Kind::Postgres => pg_server().psql(&self.db_name, sql).map(drop),
        }
    }

    /// The one text value `sql` selects.
    pub fn value(&self, sql: &str) -> String {
        match self.kind {
            Kind::Sqlite => rusqlite::Connection::open(&self.path)
                .expect("raw open")
                .query_row(sql, [], |r| r.get(0))
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
            Kind::Postgres => pg_server()
                .psql(&self.db_name, sql)
                .unwrap_or_else(|e| panic!("{sql}: {e}")),
        }
    }

    /// Every byte the database holds: SQLite's files, or PostgreSQL's dump of it.
    pub fn bytes(&self) -> Vec<u8> {
        match self.kind {
            Kind::Sqlite => super::db_bytes(&self.path),
            Kind::Postgres => pg_server().dump(&self.db_name),
        }
    }
}

/// For each body `fn NAME(db: &TestDb)`, a test `sqlite::NAME` and a test `postgres::NAME`,
/// each on a fresh database.
#[macro_export]
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(&$crate::common::TestDb::new($crate::common::Kind::Sqlite));
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() {
                super::$name(&$crate::common::TestDb::new($crate::common::Kind::Postgres));
            })*
        }
    };
}
