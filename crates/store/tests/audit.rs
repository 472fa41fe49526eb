//! The tamper-evident audit chain: verification, tampering by a raw SQLite client,
//! durability across SIGKILL, and concurrent appends.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use common::*;
use runcell_store::{Store, VerifyReport};

/// Appends `ex_1..=ex_n` for tenant "t".
fn append_n(s: &Store, n: i64) {
    for i in 1..=n {
        let e = s
            .append_execution(&exec("t", &format!("ex_{i}"), Some("ses_1"), i))
            .expect("append");
        assert_eq!(e.seq, u64::try_from(i).expect("positive"));
        assert_eq!(e.hash.len(), 64);
    }
}

/// A raw connection, as an attacker with file access would have, with the append-only
/// triggers removed.
fn attacker(path: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).expect("raw open");
    c.execute_batch(
        "DROP TRIGGER IF EXISTS executions_no_update; DROP TRIGGER IF EXISTS executions_no_delete;",
    )
    .expect("drop triggers");
    c
}

fn broken(r: &VerifyReport) -> (&str, &str) {
    let b = r.first_broken.as_ref().expect("chain should be broken");
    assert!(!r.ok);
    (b.execution_id.as_str(), b.reason.as_str())
}

fn setup(n: i64) -> (TempDb, Store) {
    let db = temp_db();
    let s = open(&db.path);
    append_n(&s, n);
    let r = s.verify_chain(Some("t")).expect("verify");
    assert!(r.ok, "{r:?}");
    assert_eq!(r.checked, u64::try_from(n).expect("positive"));
    assert!(r.first_broken.is_none());
    (db, s)
}

#[test]
fn intact_chain_verifies() {
    let (_db, s) = setup(5);
    let rows = s.list_executions("t", None, 10, None).expect("list").0;
    // Each row links to the one before.
    for pair in rows.windows(2) {
        assert_eq!(pair[0].seq, pair[1].seq + 1);
    }
    let all = s.verify_chain(None).expect("all tenants");
    assert!(all.ok && all.checked == 5);
    let other = s.verify_chain(Some("nobody")).expect("empty tenant");
    assert!(other.ok && other.checked == 0);
}

#[test]
fn triggers_block_accidental_edits() {
    let (db, s) = setup(2);
    let c = rusqlite::Connection::open(&db.path).expect("raw");
    assert!(c.execute("UPDATE executions SET code = 'x'", []).is_err());
    assert!(c.execute("DELETE FROM executions", []).is_err());
    assert!(s.verify_chain(None).expect("verify").ok);
}

#[test]
fn edited_row_is_detected() {
    let (db, s) = setup(5);
    attacker(&db.path)
        .execute("UPDATE executions SET code = 'rm -rf /' WHERE seq = 3", [])
        .expect("edit");
    let r = s.verify_chain(Some("t")).expect("verify");
    assert_eq!(broken(&r), ("ex_3", "row edited: hash mismatch"));
    assert_eq!(r.checked, 2);
    // Same through the all-tenants walk.
    assert_eq!(broken(&s.verify_chain(None).expect("verify")).0, "ex_3");
}

#[test]
fn edited_json_or_timestamp_is_detected() {
    let (db, s) = setup(3);
    let c = attacker(&db.path);
    c.execute(
        "UPDATE executions SET created_at = '2001-01-01T00:00:00.000000000Z' WHERE seq = 2",
        [],
    )
    .expect("edit");
    assert_eq!(broken(&s.verify_chain(None).expect("v")).0, "ex_2");
}

#[test]
fn deleted_row_is_detected() {
    let (db, s) = setup(5);
    attacker(&db.path)
        .execute("DELETE FROM executions WHERE seq = 2", [])
        .expect("delete");
    let r = s.verify_chain(Some("t")).expect("verify");
    let (id, reason) = broken(&r);
    assert_eq!(id, "ex_3");
    assert!(reason.contains("missing"), "{reason}");
    assert!(reason.contains("seq 2 expected, found 3"), "{reason}");
    assert_eq!(r.checked, 1);
}

#[test]
fn deleted_last_row_is_detected_via_head() {
    let (db, s) = setup(5);
    attacker(&db.path)
        .execute("DELETE FROM executions WHERE seq = 5", [])
        .expect("delete");
    let r = s.verify_chain(Some("t")).expect("verify");
    let (id, reason) = broken(&r);
    assert_eq!(id, "ex_4");
    assert!(reason.contains("chain head"), "{reason}");
    assert!(reason.contains("deleted"), "{reason}");
    assert_eq!(r.checked, 4);

    // Everything deleted: the head still remembers.
    attacker(&db.path)
        .execute("DELETE FROM executions", [])
        .expect("delete all");
    let r = s.verify_chain(None).expect("verify");
    assert_eq!(broken(&r).0, "");
    assert_eq!(r.checked, 0);
}

#[test]
fn rehashed_row_breaks_the_next_link() {
    let (db, s) = setup(5);
    let c = attacker(&db.path);
    // Edit row 3 and recompute its hash properly (with the chain key), but leave row 4's
    // prev_hash alone.
    let row3 = s.get_execution("t", "ex_3").expect("get").expect("row 3");
    let prev: String = c
        .query_row("SELECT prev_hash FROM executions WHERE seq = 3", [], |r| {
            r.get(0)
        })
        .expect("prev");
    let created: String = c
        .query_row("SELECT created_at FROM executions WHERE seq = 3", [], |r| {
            r.get(0)
        })
        .expect("created");
    // With the chain key (stolen): a hash verification alone accepts for row 3.
    let key = stolen_chain_key(&db.path);
    let forged = runcell_store::audit::chain_mac(
        &key,
        &prev,
        &runcell_store::audit::ChainFields {
            seq: 3,
            tenant: "t",
            execution_id: "ex_3",
            session_id: row3.session_id.as_deref(),
            status: &row3.status,
            code: "evil()",
            execution_json: &row3.execution_json,
            created_at: &created,
        },
    );
    c.execute(
        "UPDATE executions SET code = 'evil()', hash = ?1 WHERE seq = 3",
        [&forged],
    )
    .expect("forge");
    let r = s.verify_chain(Some("t")).expect("verify");
    let (id, reason) = broken(&r);
    assert_eq!(id, "ex_4");
    assert!(reason.contains("previous row"), "{reason}");
    assert_eq!(r.checked, 3);
}

#[test]
fn out_of_band_rows_are_detected() {
    let (db, s) = setup(3);
    let c = attacker(&db.path);
    // A copy of row 3 re-numbered as 4 (so its own hash is wrong too).
    c.execute(
        "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                 execution_json, created_at, prev_hash, hash)
         SELECT tenant, 4, 'ex_fake', session_id, status, code, execution_json, created_at,
                hash, hash FROM executions WHERE seq = 3",
        [],
    )
    .expect("insert");
    let r = s.verify_chain(Some("t")).expect("verify");
    assert_eq!(broken(&r).0, "ex_fake");

    // A correctly hashed row appended without moving the head.
    c.execute("DELETE FROM executions WHERE seq = 4", [])
        .expect("cleanup");
    let last = s.get_execution("t", "ex_3").expect("get").expect("row 3");
    let created = "2030-01-01T00:00:00.000000000Z";
    let fields = runcell_store::audit::ChainFields {
        seq: 4,
        tenant: "t",
        execution_id: "ex_sneaky",
        session_id: None,
        status: "ok",
        code: "1",
        execution_json: "{}",
        created_at: created,
    };
    let hash = runcell_store::audit::chain_mac(&stolen_chain_key(&db.path), &last.hash, &fields);
    c.execute(
        "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                 execution_json, created_at, prev_hash, hash)
         VALUES ('t', 4, 'ex_sneaky', NULL, 'ok', '1', '{}', ?1, ?2, ?3)",
        [created, &last.hash, &hash],
    )
    .expect("insert");
    let r = s.verify_chain(Some("t")).expect("verify");
    let (id, reason) = broken(&r);
    assert_eq!(id, "ex_sneaky");
    assert!(reason.contains("out of band"), "{reason}");

    // A whole chain for a tenant that never had a head.
    c.execute("DELETE FROM executions WHERE seq = 4", [])
        .expect("cleanup");
    c.execute(
        "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                 execution_json, created_at, prev_hash, hash)
         SELECT 'ghost', seq, 'gh_' || seq, session_id, status, code, execution_json,
                created_at, prev_hash, hash FROM executions WHERE tenant = 't' AND seq = 1",
        [],
    )
    .expect("insert ghost");
    let r = s.verify_chain(None).expect("verify");
    assert_eq!(broken(&r).0, "gh_1");
    assert!(s.verify_chain(Some("t")).expect("t alone").ok);
}

#[test]
fn appends_continue_after_reopen() {
    let db = temp_db();
    {
        let s = open(&db.path);
        append_n(&s, 3);
    }
    let s = open(&db.path);
    let e = s
        .append_execution(&exec("t", "ex_4", None, 4))
        .expect("append");
    assert_eq!(e.seq, 4);
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 4);
}

const CHILD_DB_ENV: &str = "RUNCELL_STORE_TEST_CHILD_DB";

/// Runs only as the child of `append_survives_sigkill`: appends one row, says so, then waits
/// to be killed.
#[test]
fn durability_child() {
    let Ok(path) = std::env::var(CHILD_DB_ENV) else {
        return;
    };
    let s = open(Path::new(&path));
    let e = s
        .append_execution(&exec("t", "ex_acked", None, 99))
        .expect("append");
    println!("\nAPPENDED seq={}", e.seq);
    loop {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

#[test]
fn append_survives_sigkill() {
    let db = temp_db();
    {
        let s = open(&db.path);
        append_n(&s, 2);
    }
    let mut child = Command::new(std::env::current_exe().expect("current exe"))
        .args([
            "durability_child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB_ENV, &db.path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut acked = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("read");
        if line.contains("APPENDED seq=3") {
            acked = true;
            break;
        }
    }
    // Child::kill sends SIGKILL: no destructors, no checkpoint, no close.
    child.kill().expect("kill");
    let status = child.wait().expect("wait");
    assert!(acked, "child never acknowledged the append ({status})");

    let s = open(&db.path);
    let row = s
        .get_execution("t", "ex_acked")
        .expect("get")
        .expect("acknowledged row survived");
    assert_eq!(row.seq, 3);
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 3, "{r:?}");
}

#[test]
fn concurrent_appends_keep_one_chain() {
    let db = temp_db();
    let s = open(&db.path);
    // One thread through a shared handle, one through a second independent Store on the
    // same file (as a second process would be).
    let s2 = open(&db.path);
    let handles: Vec<_> = [("a", s.clone()), ("b", s2)]
        .into_iter()
        .map(|(who, store)| {
            std::thread::spawn(move || {
                for i in 0..100 {
                    store
                        .append_execution(&exec("t", &format!("ex_{who}{i}"), None, i))
                        .expect("append");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("thread");
    }
    let r = s.verify_chain(Some("t")).expect("verify");
    assert!(r.ok, "{r:?}");
    assert_eq!(r.checked, 200);
    let mut seqs = Vec::new();
    let mut cursor = None;
    loop {
        let (rows, next) = s
            .list_executions("t", None, 64, cursor.as_deref())
            .expect("list");
        seqs.extend(rows.iter().map(|r| r.seq));
        match next {
            Some(n) => cursor = Some(n),
            None => break,
        }
    }
    seqs.reverse();
    assert_eq!(seqs, (1..=200).collect::<Vec<u64>>());
}

#[test]
fn in_memory_store_works_too() {
    let s = Store::open_in_memory().expect("mem");
    append_n(&s, 4);
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 4);
}

/// Many threads on one store share group commits: every append that returns Ok is in its
/// tenant's chain at the seq it was given, a reused id fails alone (its batch-mates are still
/// recorded), and both chains verify.
#[test]
fn group_committed_appends_keep_every_chain_whole() {
    let db = temp_db();
    let s = open(&db.path);
    let threads: Vec<_> = (0..12)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let tenant = if t % 2 == 0 { "even" } else { "odd" };
                let mut got = Vec::new();
                for i in 0..40 {
                    // Every thread also tries the same id once: exactly one of them wins.
                    let id = if i == 20 {
                        "ex_shared".to_owned()
                    } else {
                        format!("ex_{t}_{i}")
                    };
                    match s.append_execution(&exec(tenant, &id, None, i)) {
                        Ok(e) => got.push((tenant, id, e.seq)),
                        Err(runcell_store::StoreError::Conflict(_)) => assert_eq!(id, "ex_shared"),
                        Err(e) => panic!("append {id}: {e:?}"),
                    }
                }
                got
            })
        })
        .collect();
    let got: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("thread"))
        .collect();
    assert_eq!(got.len(), 12 * 39 + 1, "exactly one ex_shared append wins");
    for (tenant, id, seq) in &got {
        let row = s.get_execution(tenant, id).expect("get").expect("recorded");
        assert_eq!(row.seq, *seq, "{id}");
    }
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok, "{r:?}");
    assert_eq!(r.checked, got.len() as u64);
}

/// A batch shares one commit, yet each record keeps its own outcome: a reused id and an
/// invalid record fail alone, the rest are chained in order after what was there.
#[test]
fn batch_append_fails_bad_records_alone() {
    let db = temp_db();
    let s = open(&db.path);
    append_n(&s, 2);
    let mut bad = exec("t", "ex_bad", None, 5);
    bad.status = "not a word".into();
    let results = s.append_executions(&[
        exec("t", "ex_3", Some("ses_1"), 3),
        exec("t", "ex_1", None, 9), // already recorded
        bad,
        exec("u", "ex_u1", None, 1),
        exec("t", "ex_4", Some("ses_1"), 4),
    ]);
    let seqs: Vec<Option<u64>> = results
        .iter()
        .map(|r| r.as_ref().ok().map(|e| e.seq))
        .collect();
    assert_eq!(seqs, [Some(3), None, None, Some(1), Some(4)]);
    assert!(
        matches!(results[1], Err(runcell_store::StoreError::Conflict(_))),
        "{:?}",
        results[1]
    );
    assert!(
        matches!(results[2], Err(runcell_store::StoreError::Invalid(_))),
        "{:?}",
        results[2]
    );
    let (rows, _) = s.list_executions("t", None, 10, None).expect("list");
    let ids: Vec<&str> = rows.iter().map(|r| r.execution_id.as_str()).collect();
    assert_eq!(ids, ["ex_4", "ex_3", "ex_2", "ex_1"]);
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 5, "{r:?}");
    // Nothing to commit is no error.
    assert!(s.append_executions(&[]).is_empty());
}
