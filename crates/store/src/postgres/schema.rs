//! PostgreSQL's schema migrations, and settling which chain key the database is keyed with:
//! each in one transaction under an advisory lock, so nodes starting together decide once.

use std::path::Path;

use chrono::Utc;
use tokio_postgres::Client;

use crate::audit::keys::{self, Found};
use crate::audit::ChainKey;
use crate::error::{Result, StoreError};
use crate::time;

/// PostgreSQL's migrations, in order, recorded in `schema_migrations`. Never edit a released
/// migration: add a new file. (Numbered apart from SQLite's: the backends' schemas are the
/// same records, made by different statements.)
const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/postgres/0001_init.sql")),
    (2, include_str!("../../migrations/postgres/0002_nodes.sql")),
    (
        3,
        include_str!("../../migrations/postgres/0003_session_extras.sql"),
    ),
    (
        4,
        include_str!("../../migrations/postgres/0004_key_approval.sql"),
    ),
    (
        5,
        include_str!("../../migrations/postgres/0005_key_egress.sql"),
    ),
    (
        6,
        include_str!("../../migrations/postgres/0006_node_room.sql"),
    ),
];

/// `pg_advisory_xact_lock` keys: "runcell" in ASCII, then 1 for migrating, 2 for keying.
const MIGRATE_LOCK: i64 = 0x7275_6e63_656c_6c01;
const KEYING_LOCK: i64 = 0x7275_6e63_656c_6c02;

/// The highest schema version this binary knows.
pub(super) fn known_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// Applies the pending migrations, all in one transaction (PostgreSQL's DDL is
/// transactional: a failed migration leaves nothing behind). Refuses a database migrated by
/// a newer runcell.
pub(super) async fn migrate(client: &mut Client) -> Result<()> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    BIGINT PRIMARY KEY,
             applied_at TEXT NOT NULL
         )",
    )
    .await?;
    let found: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0)::BIGINT FROM schema_migrations",
            &[],
        )
        .await?
        .try_get(0)?;
    let known = known_version();
    if found > known {
        return Err(StoreError::SchemaTooNew { found, known });
    }
    for &(version, sql) in MIGRATIONS.iter().filter(|m| m.0 > found) {
        tx.batch_execute(sql)
            .await
            .map_err(|source| StoreError::PgMigration { version, source })?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
            &[&version, &time::fmt(Utc::now())],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Settles the chain key (see the SQLite backend's `settle_chain_key`): the first store to
/// open the database records the id of its key, created if the file is missing; every later
/// one, on any node, must hold the same key. A PostgreSQL database never held unkeyed rows,
/// so there is no legacy prefix to anchor.
pub(super) async fn settle_chain_key(client: &mut Client, key_file: &Path) -> Result<ChainKey> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&KEYING_LOCK])
        .await?;
    let recorded: Option<String> = tx
        .query_opt("SELECT key_id FROM audit_keying WHERE id = 1", &[])
        .await?
        .map(|r| r.try_get(0))
        .transpose()?;
    let record = |key: &ChainKey| (key.id(), time::fmt(Utc::now()));
    match (recorded, keys::find_chain_key(key_file)?) {
        (Some(id), Found::Existing(key)) if key.id() == id => Ok(key),
        (Some(id), Found::Existing(key)) => Err(StoreError::WrongChainKey {
            path: key_file.to_owned(),
            expected: id,
            found: format!("holds key {}", key.id()),
        }),
        // A key made by an open that crashed after committing, before putting it in place.
        (Some(id), Found::New { key, tmp }) if key.id() == id => {
            keys::publish(&tmp, key_file, &key)?;
            Ok(key)
        }
        (Some(id), Found::New { tmp, .. }) => {
            keys::discard(&tmp);
            Err(StoreError::WrongChainKey {
                path: key_file.to_owned(),
                expected: id,
                found: "does not exist".into(),
            })
        }
        (None, found) => {
            let (key, tmp) = match found {
                Found::Existing(key) => (key, None),
                Found::New { key, tmp } => (key, Some(tmp)),
            };
            let (id, at) = record(&key);
            tx.execute(
                "INSERT INTO audit_keying (id, key_id, keyed_at) VALUES (1, $1, $2)",
                &[&id, &at],
            )
            .await?;
            // Committed before the key is in place: a crash in between leaves the key in its
            // temporary file, which the next open finds and puts in place (above).
            tx.commit().await?;
            if let Some(tmp) = tmp {
                keys::publish(&tmp, key_file, &key)?;
            }
            Ok(key)
        }
    }
}
