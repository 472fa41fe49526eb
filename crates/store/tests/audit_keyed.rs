//! The keyed chain and signed checkpoints against someone who can edit the database file:
//! every attack runs on a copy of a real database (appended through the store, then copied
//! with its key files), with a raw SQLite connection and the append-only triggers dropped.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use runcell_store::audit::signed::{AuditSigner, Checkpoint, Scope};
use runcell_store::audit::{chain_hash, chain_mac, ChainFields, ChainKey, GENESIS_HASH};
use runcell_store::{Expected, Store, StoreError, VerifyReport};

/// A database with tenants "t" (5 records) and "u" (2), closed, then copied with its keys.
fn real_db_copy() -> TempDb {
    let db = temp_db();
    {
        let s = open(&db.path);
        for i in 1..=5 {
            s.append_execution(&exec("t", &format!("ex_{i}"), Some("ses_1"), i))
                .expect("append");
        }
        for i in 1..=2 {
            s.append_execution(&exec("u", &format!("ux_{i}"), None, i))
                .expect("append");
        }
    }
    copy_db(&db.path)
}

/// Copies the database file (and any WAL) and its `keys/` directory into a new temp dir.
fn copy_db(src: &Path) -> TempDb {
    let copy = temp_db();
    let dir = copy.path.parent().expect("dir");
    std::fs::create_dir_all(dir.join("keys")).expect("mkdir");
    for suffix in ["", "-wal"] {
        let mut from = src.as_os_str().to_owned();
        from.push(suffix);
        let mut to = copy.path.as_os_str().to_owned();
        to.push(suffix);
        if Path::new(&from).exists() {
            std::fs::copy(&from, &to).expect("copy db");
        }
    }
    let keys = src.parent().expect("dir").join("keys");
    for e in std::fs::read_dir(keys).expect("keys") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), dir.join("keys").join(e.file_name())).expect("copy key");
    }
    copy
}

/// A raw connection with the append-only triggers dropped, as an editor of the file has.
fn attacker(path: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).expect("raw open");
    c.execute_batch(
        "DROP TRIGGER IF EXISTS executions_no_update; DROP TRIGGER IF EXISTS executions_no_delete;",
    )
    .expect("drop triggers");
    c
}

/// Recomputes every row of `tenant`'s chain from genesis with `hash` and moves its head to
/// the last row: the rewrite that passed `verify` when the chain was unkeyed.
fn recompute(
    c: &rusqlite::Connection,
    tenant: &str,
    hash: &dyn Fn(&str, &ChainFields<'_>) -> String,
) {
    type Row = (i64, String, Option<String>, String, String, String, String);
    let rows: Vec<Row> = c
        .prepare(
            "SELECT seq, execution_id, session_id, status, code, execution_json, created_at
             FROM executions WHERE tenant = ?1 ORDER BY seq",
        )
        .and_then(|mut s| {
            s.query_map([tenant], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                ))
            })?
            .collect()
        })
        .expect("rows");
    let mut prev = GENESIS_HASH.to_owned();
    let mut last = 0;
    for (seq, id, session, status, code, json, created) in &rows {
        let h = hash(
            &prev,
            &ChainFields {
                seq: *seq,
                tenant,
                execution_id: id,
                session_id: session.as_deref(),
                status,
                code,
                execution_json: json,
                created_at: created,
            },
        );
        c.execute(
            "UPDATE executions SET prev_hash = ?1, hash = ?2 WHERE tenant = ?3 AND seq = ?4",
            rusqlite::params![prev, h, tenant, seq],
        )
        .expect("rehash");
        prev = h;
        last = *seq;
    }
    c.execute(
        "UPDATE chain_heads SET seq = ?1, hash = ?2 WHERE tenant = ?3",
        rusqlite::params![last, prev, tenant],
    )
    .expect("move head");
}

fn edit_code(c: &rusqlite::Connection, id: &str) {
    let n = c
        .execute(
            "UPDATE executions SET code = 'print(\"innocent\")' WHERE execution_id = ?1",
            [id],
        )
        .expect("edit");
    assert_eq!(n, 1);
}

fn broken(r: &VerifyReport) -> (String, String, String) {
    assert!(!r.ok, "{r:?}");
    let b = r.first_broken.clone().expect("chain should be broken");
    (b.tenant, b.execution_id, b.reason)
}

fn checkpoint(s: &Store, signer: &AuditSigner) -> Checkpoint {
    let heads = s.chain_heads(None).expect("heads");
    signer.sign(Scope::All, "2026-01-01T00:00:00.000000000Z".into(), heads)
}

fn verify_with(s: &Store, cps: &[&Checkpoint]) -> VerifyReport {
    let expected: Vec<Expected> = cps.iter().flat_map(|c| c.expected()).collect();
    s.verify_extends(None, &expected).expect("verify")
}

#[test]
fn the_unkeyed_recompute_attack_no_longer_passes() {
    let copy = real_db_copy();
    let s = open(&copy.path);
    assert!(
        s.verify_chain(None).expect("verify").ok,
        "the copy verifies"
    );
    drop(s);
    let c = attacker(&copy.path);
    edit_code(&c, "ex_3");
    recompute(&c, "t", &chain_hash);
    drop(c);
    let s = open(&copy.path);
    let r = s.verify_chain(None).expect("verify");
    let (tenant, id, reason) = broken(&r);
    assert_eq!((tenant.as_str(), id.as_str()), ("t", "ex_1"));
    assert!(
        reason.contains("recomputed without the chain key"),
        "{reason}"
    );
    // The other tenant is untouched and alone still verifies.
    assert!(s.verify_chain(Some("u")).expect("u").ok);
}

#[test]
fn a_stolen_key_rewrite_passes_verify_but_not_a_checkpoint_taken_before() {
    let copy = real_db_copy();
    let signer = AuditSigner::ephemeral().expect("signer");
    let s = open(&copy.path);
    let before = checkpoint(&s, &signer);
    // The log goes on after the checkpoint.
    s.append_execution(&exec("t", "ex_6", None, 6))
        .expect("append");
    drop(s);
    let key = stolen_chain_key(&copy.path);
    let c = attacker(&copy.path);
    edit_code(&c, "ex_3");
    recompute(&c, "t", &|prev, f| chain_mac(&key, prev, f));
    drop(c);
    let s = open(&copy.path);
    // With the key the rewrite is consistent: the chain alone cannot tell.
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 8, "{r:?}");
    // The checkpoint fixed record 5's hash before the rewrite.
    let r = verify_with(&s, &[&before]);
    let (tenant, id, reason) = broken(&r);
    assert_eq!((tenant.as_str(), id.as_str()), ("t", "ex_5"));
    assert!(
        reason.contains("record 5 differs from the checkpoint of 2026-01-01"),
        "{reason}"
    );
}

#[test]
fn an_unmodified_log_extends_its_checkpoints() {
    let copy = real_db_copy();
    let signer = AuditSigner::ephemeral().expect("signer");
    let s = open(&copy.path);
    let first = checkpoint(&s, &signer);
    s.append_execution(&exec("t", "ex_6", None, 6))
        .expect("append");
    s.append_execution(&exec("new", "nx_1", None, 1))
        .expect("append");
    let second = checkpoint(&s, &signer);
    signer.public_key().verify(&first).expect("signed");
    let r = verify_with(&s, &[&first, &second]);
    assert!(r.ok && r.checked == 9, "{r:?}");
    // One tenant's statement, checked for that tenant.
    let mine = signer.sign(
        Scope::Tenant,
        "2026-01-02T00:00:00.000000000Z".into(),
        s.chain_heads(Some("u")).expect("heads"),
    );
    assert_eq!(mine.tenants.len(), 1);
    assert_eq!(mine.tenants[0].count, 2);
    let r = s
        .verify_extends(Some("u"), &mine.expected())
        .expect("verify");
    assert!(r.ok && r.checked == 2, "{r:?}");
}

#[test]
fn a_deleted_tenant_is_detected_with_a_checkpoint_only() {
    let copy = real_db_copy();
    let signer = AuditSigner::ephemeral().expect("signer");
    let s = open(&copy.path);
    let cp = checkpoint(&s, &signer);
    drop(s);
    let c = attacker(&copy.path);
    for table in ["executions", "chain_heads", "audit_legacy"] {
        c.execute(&format!("DELETE FROM {table} WHERE tenant = 'u'"), [])
            .expect("delete tenant");
    }
    drop(c);
    let s = open(&copy.path);
    // Without a checkpoint nothing says "u" ever existed.
    assert!(s.verify_chain(None).expect("verify").ok);
    let r = verify_with(&s, &[&cp]);
    let (tenant, _, reason) = broken(&r);
    assert_eq!(tenant, "u");
    assert!(reason.contains("the whole tenant was deleted"), "{reason}");
}

#[test]
fn a_truncated_chain_is_detected_with_a_checkpoint_only() {
    let copy = real_db_copy();
    let signer = AuditSigner::ephemeral().expect("signer");
    let s = open(&copy.path);
    let cp = checkpoint(&s, &signer);
    let row3 = s.get_execution("t", "ex_3").expect("get").expect("row");
    drop(s);
    let c = attacker(&copy.path);
    c.execute("DELETE FROM executions WHERE tenant = 't' AND seq > 3", [])
        .expect("delete");
    c.execute(
        "UPDATE chain_heads SET seq = 3, hash = ?1 WHERE tenant = 't'",
        [&row3.hash],
    )
    .expect("move head");
    drop(c);
    let s = open(&copy.path);
    assert!(
        s.verify_chain(None).expect("verify").ok,
        "every row left is genuine"
    );
    let r = verify_with(&s, &[&cp]);
    let (tenant, id, reason) = broken(&r);
    assert_eq!((tenant.as_str(), id.as_str()), ("t", "ex_3"));
    assert!(
        reason.contains("the chain has 3 records but the checkpoint"),
        "{reason}"
    );
}

#[test]
fn a_keyed_record_inserted_without_the_key_is_detected() {
    let copy = real_db_copy();
    let c = attacker(&copy.path);
    // Relabelling is impossible: nothing in a row says which hash it uses. A guessed key
    // gives a wrong HMAC.
    let wrong = ChainKey::from_bytes([7; 32]);
    recompute(&c, "u", &|prev, f| chain_mac(&wrong, prev, f));
    drop(c);
    let s = open(&copy.path);
    let (tenant, id, reason) = broken(&s.verify_chain(None).expect("verify"));
    assert_eq!(
        (tenant.as_str(), id.as_str(), reason.as_str()),
        ("u", "ux_1", "row edited: hash mismatch")
    );
}

/// A database as a runcell before keyed chains left it: schema version 1, SHA-256 rows.
fn legacy_db(n: i64) -> TempDb {
    let db = temp_db();
    std::fs::create_dir_all(db.path.parent().expect("dir")).expect("mkdir");
    let c = rusqlite::Connection::open(&db.path).expect("open");
    c.execute_batch(include_str!("../migrations/0001_init.sql"))
        .expect("schema 1");
    c.execute_batch(
        "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL) STRICT;
         INSERT INTO schema_migrations VALUES (1, '2025-01-01T00:00:00.000000000Z');",
    )
    .expect("version");
    let mut prev = GENESIS_HASH.to_owned();
    for i in 1..=n {
        let id = format!("old_{i}");
        let code = format!("print({i})");
        let created = format!("2025-01-01T00:00:0{i}.000000000Z");
        let h = chain_hash(
            &prev,
            &ChainFields {
                seq: i,
                tenant: "t",
                execution_id: &id,
                session_id: None,
                status: "ok",
                code: &code,
                execution_json: "{}",
                created_at: &created,
            },
        );
        c.execute(
            "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                     execution_json, created_at, prev_hash, hash)
             VALUES ('t', ?1, ?2, NULL, 'ok', ?3, '{}', ?4, ?5, ?6)",
            rusqlite::params![i, id, code, created, prev, h],
        )
        .expect("insert");
        prev = h;
    }
    c.execute(
        "INSERT INTO chain_heads (tenant, seq, hash) VALUES ('t', ?1, ?2)",
        rusqlite::params![n, prev],
    )
    .expect("head");
    db
}

fn key_file(db: &Path) -> PathBuf {
    db.parent()
        .expect("dir")
        .join("keys")
        .join("audit-chain.key")
}

#[test]
fn records_from_before_the_key_still_verify_and_are_protected_from_then_on() {
    let db = legacy_db(3);
    assert!(!key_file(&db.path).exists());
    {
        let s = open(&db.path);
        // The key was created (0600) and the three SHA-256 records anchored.
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(key_file(&db.path))
            .expect("key")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        s.append_execution(&exec("t", "ex_new", None, 9))
            .expect("append");
        let r = s.verify_chain(None).expect("verify");
        assert!(r.ok && r.checked == 4, "{r:?}");
    }
    // Reopening does not anchor again, and the mixed chain still verifies.
    let s = open(&db.path);
    assert!(s.verify_chain(None).expect("verify").ok);
    drop(s);

    // The old attack on the unkeyed prefix: edit record 2, recompute 1..=3 with SHA-256 (as
    // they are legacy) and keep record 4 linked. The anchor fixed record 3's hash.
    let copy = copy_db(&db.path);
    let c = attacker(&copy.path);
    edit_code(&c, "old_2");
    let rows: Vec<String> = c
        .prepare("SELECT execution_id FROM executions ORDER BY seq")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("ids");
    assert_eq!(rows.len(), 4);
    c.execute("DELETE FROM executions WHERE seq = 4", [])
        .expect("drop 4");
    recompute(&c, "t", &chain_hash);
    drop(c);
    let s = open(&copy.path);
    let (_, id, reason) = broken(&s.verify_chain(None).expect("verify"));
    assert_eq!(id, "old_3");
    assert!(
        reason.contains("before the chain key were rewritten"),
        "{reason}"
    );
    drop(s);

    // Removing the anchor makes every record count as keyed: the old ones fail.
    let copy = copy_db(&db.path);
    attacker(&copy.path)
        .execute("DELETE FROM audit_legacy", [])
        .expect("delete anchor");
    let s = open(&copy.path);
    let (_, id, reason) = broken(&s.verify_chain(None).expect("verify"));
    assert_eq!(id, "old_1");
    assert!(
        reason.contains("recomputed without the chain key"),
        "{reason}"
    );
    drop(s);

    // Moving the anchor (to bless a rewritten record 4 as legacy) breaks its MAC.
    let copy = copy_db(&db.path);
    attacker(&copy.path)
        .execute("UPDATE audit_legacy SET seq = 4", [])
        .expect("move anchor");
    let s = open(&copy.path);
    let (_, _, reason) = broken(&s.verify_chain(None).expect("verify"));
    assert!(reason.contains("anchor"), "{reason}");
}

#[test]
fn a_key_made_by_hand_for_an_old_database_blesses_nothing() {
    let db = legacy_db(2);
    let file = key_file(&db.path);
    std::fs::create_dir_all(file.parent().expect("dir")).expect("mkdir");
    std::fs::write(&file, format!("{}\n", "ab".repeat(32))).expect("key");
    let s = open(&db.path);
    let (_, id, reason) = broken(&s.verify_chain(None).expect("verify"));
    assert_eq!(id, "old_1");
    assert!(
        reason.contains("recomputed without the chain key"),
        "{reason}"
    );
}

#[test]
fn a_store_refuses_another_key_and_a_missing_one() {
    let copy = real_db_copy();
    let other = copy.path.parent().expect("dir").join("other.key");
    let err = Store::open_keyed(&copy.path, Default::default(), &other).expect_err("other key");
    assert!(matches!(err, StoreError::WrongChainKey { .. }), "{err:?}");
    assert!(
        err.to_string().ends_with("other.key does not exist"),
        "{err}"
    );
    assert!(!other.exists(), "no key file is left behind");
    std::fs::write(&other, format!("{}\n", "cd".repeat(32))).expect("key");
    let err = Store::open_keyed(&copy.path, Default::default(), &other).expect_err("other key");
    assert!(matches!(err, StoreError::WrongChainKey { .. }), "{err:?}");
    // The right one, given explicitly, works.
    let s = Store::open_keyed(&copy.path, Default::default(), &key_file(&copy.path)).expect("open");
    assert!(s.verify_chain(None).expect("verify").ok);
}
