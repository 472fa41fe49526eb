//! Keys, sessions, uploads, migrations and execution listing.

mod common;

use common::*;
use runcell_store::{SqliteStore, Store, StoreError};

#[test]
fn migrations_are_idempotent_on_reopen() {
    let db = temp_db();
    {
        let s = open(&db.path);
        s.put_session(&session("t", "ses_1", 0)).expect("put");
    }
    for _ in 0..3 {
        let s = open(&db.path);
        assert!(s.get_session("t", "ses_1").expect("get").is_some());
    }
    let raw = rusqlite::Connection::open(&db.path).expect("raw");
    let versions: Vec<i64> = raw
        .prepare("SELECT version FROM schema_migrations ORDER BY version")
        .expect("prepare")
        .query_map([], |r| r.get(0))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    // Every migration once, in order.
    assert_eq!(
        versions,
        (1..=SqliteStore::schema_version()).collect::<Vec<_>>()
    );
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .expect("pragma");
    assert_eq!(mode, "wal");
}

#[test]
fn refuses_newer_schema() {
    let db = temp_db();
    drop(open(&db.path));
    let raw = rusqlite::Connection::open(&db.path).expect("raw");
    raw.execute(
        "INSERT INTO schema_migrations (version, applied_at) VALUES (99, 'x')",
        [],
    )
    .expect("insert");
    drop(raw);
    match Store::open(&db.path) {
        Err(StoreError::SchemaTooNew { found: 99, known }) => {
            assert_eq!(known, SqliteStore::schema_version());
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[cfg(unix)]
#[test]
fn database_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let db = temp_db();
    drop(open(&db.path));
    let mode = std::fs::metadata(&db.path)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn store_is_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<Store>();
}

#[test]
fn a_version_1_database_gains_quotas_and_its_sessions_start_from_the_zygote() {
    let db = temp_db();
    std::fs::create_dir_all(db.path.parent().expect("dir")).expect("mkdir");
    {
        let raw = rusqlite::Connection::open(&db.path).expect("raw");
        raw.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL) STRICT;",
        )
        .expect("table");
        raw.execute_batch(include_str!("../migrations/0001_init.sql"))
            .expect("v1");
        raw.execute(
            "INSERT INTO schema_migrations VALUES (1, '2024-01-01T00:00:00.000000000Z')",
            [],
        )
        .expect("v1 recorded");
        raw.execute(
            "INSERT INTO sessions VALUES ('ses_old', 't', 'python', 'ready', \
             '2024-01-01T00:00:00.000000000Z', '2024-01-01T00:00:00.000000000Z', \
             '2024-01-01T00:20:00.000000000Z', '{}', '{}', '/w')",
            [],
        )
        .expect("an old session");
    }
    let s = open(&db.path);
    let old = s.get_session("t", "ses_old").expect("get").expect("kept");
    assert_eq!(old.start, "zygote");
    assert!(s
        .tenant_settings("t")
        .expect("quota table")
        .max_sessions
        .is_none());
}
