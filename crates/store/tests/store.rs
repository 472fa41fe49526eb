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
fn keys_lifecycle() {
    let db = temp_db();
    let s = open(&db.path);
    assert!(!s.has_active_keys().expect("has"));

    let (info, key) = s.create_key("ci-bot", "acme").expect("create");
    assert!(key.starts_with("rc_") && key.len() == 43);
    assert!(info.id.starts_with("key_"));
    assert_eq!(info.prefix, &key[..7]);
    assert_eq!(info.tenant, "acme");
    assert!(s.has_active_keys().expect("has"));

    let got = s.authenticate(&key).expect("auth").expect("known key");
    assert_eq!(got, info);
    assert!(s.authenticate("rc_nope").expect("auth").is_none());
    assert!(s.authenticate("").expect("auth").is_none());

    let (info2, key2) = s.create_key("laptop", "default").expect("create");
    let listed = s.list_keys().expect("list");
    assert_eq!(listed.len(), 2);

    // Revoke by name.
    assert!(s.revoke_key("ci-bot").expect("revoke"));
    assert!(s.authenticate(&key).expect("auth").is_none());
    assert!(
        !s.revoke_key("ci-bot").expect("again"),
        "nothing left to revoke"
    );
    assert!(!s.revoke_key(&info.id).expect("again by id"));
    assert!(!s.revoke_key("nobody").expect("unknown"));
    let revoked = s
        .list_keys()
        .expect("list")
        .into_iter()
        .find(|k| k.id == info.id)
        .expect("still listed");
    assert!(revoked.revoked_at.is_some());
    assert!(s.has_active_keys().expect("has"));

    // Ambiguous names are refused; ids always work.
    let (info3, _) = s.create_key("laptop", "default").expect("create");
    assert!(matches!(
        s.revoke_key("laptop"),
        Err(StoreError::Invalid(_))
    ));
    assert!(s.revoke_key(&info3.id).expect("by id"));
    assert!(s.revoke_key("laptop").expect("now unambiguous"));
    assert!(s.authenticate(&key2).expect("auth").is_none());
    assert!(!s.has_active_keys().expect("has"));
    let _ = info2;

    // The plaintext key is nowhere in the files.
    drop(s);
    let bytes = db_bytes(&db.path);
    assert!(!bytes.is_empty());
    for k in [&key, &key2] {
        assert!(!contains(&bytes, k.as_bytes()));
        assert!(!contains(&bytes, &k.as_bytes()[7..]));
    }
}

#[test]
fn key_names_are_validated() {
    let s = Store::open_in_memory().expect("mem");
    for bad in ["", "with space", "slash/y", "ümlaut", &"x".repeat(65)] {
        assert!(
            matches!(s.create_key(bad, "t"), Err(StoreError::Invalid(_))),
            "{bad:?}"
        );
        assert!(
            matches!(s.create_key("ok", bad), Err(StoreError::Invalid(_))),
            "{bad:?}"
        );
    }
    assert!(s.create_key(&"x".repeat(64), "a.b-c_D9").is_ok());
    assert_eq!(s.list_keys().expect("list").len(), 1);
}

#[test]
fn sessions_crud() {
    let s = Store::open_in_memory().expect("mem");
    let a2 = session("a", "ses_a2", 20);
    let a1 = session("a", "ses_a1", 10);
    let b1 = session("b", "ses_b1", 5);
    for x in [&a2, &a1, &b1] {
        s.put_session(x).expect("put");
    }
    assert_eq!(s.get_session("a", "ses_a1").expect("get"), Some(a1.clone()));
    assert_eq!(s.get_session("b", "ses_a1").expect("get"), None, "isolated");
    let ids: Vec<_> = s
        .list_sessions("a")
        .expect("list")
        .into_iter()
        .map(|x| x.id)
        .collect();
    assert_eq!(ids, ["ses_a1", "ses_a2"], "oldest first");

    // Replace.
    let mut a1b = a1.clone();
    a1b.metadata_json = r#"{"owner":"you"}"#.into();
    s.put_session(&a1b).expect("replace");
    assert_eq!(s.get_session("a", "ses_a1").expect("get"), Some(a1b));

    // Another tenant cannot take it over.
    let mut stolen = a1.clone();
    stolen.tenant = "b".into();
    assert!(matches!(
        s.put_session(&stolen),
        Err(StoreError::Conflict(_))
    ));

    // Status updates and the start-up sweep.
    assert!(s
        .update_session_status("ses_a2", "busy", at(30), at(930))
        .expect("update"));
    assert!(!s
        .update_session_status("nope", "busy", at(30), at(930))
        .expect("update"));
    let got = s.get_session("a", "ses_a2").expect("get").expect("some");
    assert_eq!(
        (got.status.as_str(), got.last_active_at, got.expires_at),
        ("busy", at(30), at(930))
    );
    let live: Vec<_> = s
        .sessions_with_status(&["ready", "busy", "starting"])
        .expect("sweep")
        .into_iter()
        .map(|x| x.id)
        .collect();
    assert_eq!(live, ["ses_b1", "ses_a1", "ses_a2"]);
    assert!(s.sessions_with_status(&[]).expect("empty").is_empty());
    assert!(s.sessions_with_status(&["dead"]).expect("none").is_empty());

    assert!(s.delete_session("ses_a1").expect("delete"));
    assert!(!s.delete_session("ses_a1").expect("delete again"));
    assert_eq!(s.list_sessions("a").expect("list").len(), 1);

    // Validation.
    let mut bad = session("a", "ses x", 0);
    assert!(matches!(s.put_session(&bad), Err(StoreError::Invalid(_))));
    bad = session("a", "ses_x", 0);
    bad.limits_json = "{nope".into();
    assert!(matches!(s.put_session(&bad), Err(StoreError::Invalid(_))));
}

#[test]
fn uploads_metadata() {
    let s = Store::open_in_memory().expect("mem");
    s.put_session(&session("a", "ses_1", 0)).expect("put");
    let h1 = "a".repeat(64);
    let h2 = "b".repeat(64);
    s.record_upload("ses_1", "data/x.csv", 10, &h1, at(1))
        .expect("up");
    s.record_upload("ses_1", "a.txt", 3, &h1, at(2))
        .expect("up");
    s.record_upload("ses_1", "data/x.csv", 20, &h2, at(3))
        .expect("re-upload");
    let ups = s.uploads("ses_1").expect("list");
    assert_eq!(ups.len(), 2);
    assert_eq!(ups[0].path, "a.txt");
    assert_eq!(
        (ups[1].size, ups[1].sha256.as_str(), ups[1].uploaded_at),
        (20, h2.as_str(), at(3))
    );
    assert!(matches!(
        s.record_upload("ses_nope", "a", 1, &h1, at(0)),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.record_upload("ses_1", "a", 1, "XYZ", at(0)),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        s.record_upload("ses_1", "a", u64::MAX, &h1, at(0)),
        Err(StoreError::Invalid(_))
    ));
    // Replacing the session keeps its uploads; deleting it drops them.
    s.put_session(&session("a", "ses_1", 0)).expect("replace");
    assert_eq!(s.uploads("ses_1").expect("list").len(), 2);
    assert!(s.delete_session("ses_1").expect("delete"));
    assert!(s.uploads("ses_1").expect("list").is_empty());
}

#[test]
fn executions_pagination_and_isolation() {
    let db = temp_db();
    let s = open(&db.path);
    for i in 1..=7 {
        let sess = if i % 2 == 0 { Some("ses_even") } else { None };
        s.append_execution(&exec("a", &format!("ex_a{i}"), sess, i))
            .expect("append");
    }
    s.append_execution(&exec("b", "ex_b1", None, 1))
        .expect("append b");

    let (page1, next) = s.list_executions("a", None, 3, None).expect("page1");
    let ids: Vec<_> = page1.iter().map(|r| r.execution_id.as_str()).collect();
    assert_eq!(ids, ["ex_a7", "ex_a6", "ex_a5"]);
    assert_eq!(next.as_deref(), Some("ex_a5"));
    assert_eq!(page1[0].seq, 7);
    assert_eq!(page1[0].created_at, at(7));
    assert_eq!(page1[0].code, "print(7)");

    let (page2, next) = s
        .list_executions("a", None, 3, next.as_deref())
        .expect("page2");
    let ids: Vec<_> = page2.iter().map(|r| r.execution_id.as_str()).collect();
    assert_eq!(ids, ["ex_a4", "ex_a3", "ex_a2"]);
    let (page3, next) = s
        .list_executions("a", None, 3, next.as_deref())
        .expect("page3");
    assert_eq!(page3.len(), 1);
    assert_eq!(page3[0].execution_id, "ex_a1");
    assert_eq!(next, None);

    // Exactly `limit` rows left: no next cursor.
    let (all, next) = s.list_executions("a", None, 7, None).expect("all");
    assert_eq!((all.len(), next), (7, None));

    // By session.
    let (even, next) = s
        .list_executions("a", Some("ses_even"), 2, None)
        .expect("session");
    let ids: Vec<_> = even.iter().map(|r| r.execution_id.as_str()).collect();
    assert_eq!(ids, ["ex_a6", "ex_a4"]);
    let (rest, next) = s
        .list_executions("a", Some("ses_even"), 2, next.as_deref())
        .expect("session page 2");
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].session_id.as_deref(), Some("ses_even"));
    assert_eq!(next, None);

    // Limits and cursors.
    for bad in [0, 1001] {
        assert!(matches!(
            s.list_executions("a", None, bad, None),
            Err(StoreError::Invalid(_))
        ));
    }
    // An unknown cursor names nothing to page from (the API answers 404).
    assert!(matches!(
        s.list_executions("a", None, 5, Some("ex_b1")),
        Err(StoreError::NotFound(_))
    ));

    // Tenant isolation.
    assert!(s.get_execution("a", "ex_b1").expect("get").is_none());
    assert!(s.get_execution("b", "ex_a1").expect("get").is_none());
    let b1 = s.get_execution("b", "ex_b1").expect("get").expect("own");
    assert_eq!(b1.seq, 1, "each tenant has its own chain");
    let (bs, _) = s.list_executions("b", None, 100, None).expect("b list");
    assert_eq!(bs.len(), 1);
    assert!(s
        .list_executions("c", None, 10, None)
        .expect("empty")
        .0
        .is_empty());

    // Ids are unique across tenants.
    assert!(matches!(
        s.append_execution(&exec("b", "ex_a1", None, 9)),
        Err(StoreError::Conflict(_))
    ));
    // Bad input.
    let mut bad = exec("a", "ex_bad", None, 1);
    bad.execution_json = "not json".into();
    assert!(matches!(
        s.append_execution(&bad),
        Err(StoreError::Invalid(_))
    ));
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok);
    assert_eq!(r.checked, 8);
}

#[test]
fn store_is_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<Store>();
}

#[test]
fn tenants_are_set_changed_and_cleared() {
    let db = temp_db();
    let s = open(&db.path);
    // No row: no quota.
    let none = s.tenant_settings("acme").expect("quota");
    assert_eq!((none.max_sessions, none.max_memory_mb), (None, None));
    let set = runcell_store::TenantChange {
        max_sessions: Some(Some(2)),
        max_memory_mb: Some(Some(4096)),
        start: Some(Some("cold".into())),
    };
    s.update_tenant("acme", &set).expect("set");
    // Changing one keeps the other; `Some(None)` clears.
    let q = s
        .update_tenant(
            "acme",
            &runcell_store::TenantChange {
                max_sessions: Some(None),
                ..Default::default()
            },
        )
        .expect("clear one");
    assert_eq!((q.max_sessions, q.max_memory_mb), (None, Some(4096)));
    assert_eq!(q.start.as_deref(), Some("cold"));
    assert!(matches!(
        s.update_tenant(
            "acme",
            &runcell_store::TenantChange {
                start: Some(Some("lukewarm".into())),
                ..Default::default()
            }
        ),
        Err(StoreError::Invalid(_))
    ));
    drop(s);
    let s = open(&db.path);
    let q = s.tenant_settings("acme").expect("reopened");
    assert_eq!((q.max_sessions, q.max_memory_mb), (None, Some(4096)));
    assert_eq!(s.list_tenants().expect("list").len(), 1);
    assert!(matches!(
        s.update_tenant("bad tenant", &set),
        Err(StoreError::Invalid(_))
    ));
    // Keys are found by id or by their one active name.
    let (k, _) = s.create_key("ci", "acme").expect("key");
    assert_eq!(
        s.find_key(&k.id).expect("by id").expect("found").tenant,
        "acme"
    );
    assert_eq!(s.find_key("ci").expect("by name").expect("found").id, k.id);
    assert!(s.find_key("nobody").expect("lookup").is_none());
    s.create_key("ci", "other")
        .expect("second key of that name");
    assert!(matches!(s.find_key("ci"), Err(StoreError::Invalid(_))));
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
