//! The store's contract, run against both backends: every body below is a test on SQLite
//! (`sqlite::NAME`) and on a real PostgreSQL (`postgres::NAME`, on a server the tests start
//! themselves; see common/pg.rs).

mod common;

use common::*;
use runcell_store::{Store, StoreError, VerifyReport};

both!(
    keys_lifecycle,
    key_names_are_validated,
    keys_carry_an_approval_default,
    keys_carry_an_egress_bound,
    sessions_crud,
    uploads_metadata,
    session_extras_live_and_die_with_their_session,
    executions_pagination_and_isolation,
    tenants_are_set_changed_and_cleared,
    intact_chain_verifies,
    triggers_block_accidental_edits,
    edited_row_is_detected,
    edited_json_or_timestamp_is_detected,
    deleted_row_is_detected,
    deleted_last_row_is_detected_via_head,
    rehashed_row_breaks_the_next_link,
    out_of_band_rows_are_detected,
    appends_continue_after_reopen,
    concurrent_appends_keep_one_chain,
    group_committed_appends_keep_every_chain_whole,
    batch_append_fails_bad_records_alone,
);

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

fn broken(r: &VerifyReport) -> (&str, &str) {
    let b = r.first_broken.as_ref().expect("chain should be broken");
    assert!(!r.ok);
    (b.execution_id.as_str(), b.reason.as_str())
}

/// A store holding `ex_1..=ex_n` of tenant "t", verified.
fn setup(db: &TestDb, n: i64) -> Store {
    let s = db.open();
    append_n(&s, n);
    let r = s.verify_chain(Some("t")).expect("verify");
    assert!(r.ok, "{r:?}");
    assert_eq!(r.checked, u64::try_from(n).expect("positive"));
    assert!(r.first_broken.is_none());
    s
}

fn keys_lifecycle(db: &TestDb) {
    let s = db.open();
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
    let bytes = db.bytes();
    assert!(!bytes.is_empty());
    for k in [&key, &key2] {
        assert!(!contains(&bytes, k.as_bytes()));
        assert!(!contains(&bytes, &k.as_bytes()[7..]));
    }
}

fn key_names_are_validated(db: &TestDb) {
    let s = db.open();
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

fn keys_carry_an_approval_default(db: &TestDb) {
    use runcell_store::ApprovalMode;
    let s = db.open();
    let (info, key) = s.create_key("agent", "acme").expect("create");
    assert_eq!(info.approval, None, "no default unless set");
    let set = s
        .set_key_approval(&info.id, Some(ApprovalMode::Always))
        .expect("set")
        .expect("the key exists");
    assert_eq!(set.approval, Some(ApprovalMode::Always));
    assert_eq!(
        (set.id.as_str(), set.name.as_str()),
        (info.id.as_str(), "agent")
    );
    // What authentication hands the server, and what survives a reopen.
    drop(s);
    let s = db.open();
    let got = s.authenticate(&key).expect("auth").expect("known key");
    assert_eq!(got.approval, Some(ApprovalMode::Always));
    assert_eq!(s.find_key("agent").expect("find"), Some(got));
    // Lowered, then cleared.
    let lowered = s
        .set_key_approval(&info.id, Some(ApprovalMode::Never))
        .expect("set")
        .expect("the key exists");
    assert_eq!(lowered.approval, Some(ApprovalMode::Never));
    let cleared = s
        .set_key_approval(&info.id, None)
        .expect("clear")
        .expect("exists");
    assert_eq!(cleared.approval, None);
    // No such key: nothing set, and said so.
    assert_eq!(
        s.set_key_approval("key_nope", Some(ApprovalMode::Always))
            .expect("no error"),
        None
    );
    // The column takes only the two words (a control first: a valid word is accepted).
    db.try_sql("UPDATE api_keys SET approval = 'always'")
        .expect("a valid word is accepted");
    let e = db
        .try_sql("UPDATE api_keys SET approval = 'sometimes'")
        .expect_err("refused by the column's CHECK");
    assert!(e.to_lowercase().contains("check"), "{e}");
}

fn keys_carry_an_egress_bound(db: &TestDb) {
    let s = db.open();
    let (info, key) = s.create_key("agent", "acme").expect("create");
    let (other, _) = s.create_key("other", "acme").expect("create");
    assert_eq!(info.egress_allow, None, "the server's bound unless set");
    let bound = vec!["pypi.org".to_owned(), "*.example.com".to_owned()];
    let set = s
        .set_key_egress(&info.id, Some(&bound))
        .expect("set")
        .expect("the key exists");
    assert_eq!(set.egress_allow.as_deref(), Some(bound.as_slice()));
    assert_eq!(set.approval, None, "the approval default untouched");
    // What authentication hands the server, in the order given, and what survives a reopen;
    // the other key is untouched.
    drop(s);
    let s = db.open();
    let got = s.authenticate(&key).expect("auth").expect("known key");
    assert_eq!(got.egress_allow, Some(bound.clone()));
    assert_eq!(s.find_key("agent").expect("find"), Some(got));
    let listed = s.list_keys().expect("list");
    let other_now = listed.iter().find(|k| k.id == other.id).expect("listed");
    assert_eq!(other_now.egress_allow, None);
    // An empty bound (no network at all) is not the same as none (the server's).
    let nothing = s
        .set_key_egress(&info.id, Some(&[]))
        .expect("set")
        .expect("exists");
    assert_eq!(nothing.egress_allow, Some(Vec::new()));
    let cleared = s
        .set_key_egress(&info.id, None)
        .expect("clear")
        .expect("exists");
    assert_eq!(cleared.egress_allow, None);
    assert_eq!(
        s.find_key(&info.id)
            .expect("find")
            .expect("exists")
            .egress_allow,
        None
    );
    // No such key: nothing set, and said so.
    assert_eq!(
        s.set_key_egress("key_nope", Some(&bound))
            .expect("no error"),
        None
    );
    // Over the store's bounds: refused, nothing changed (a control first: 256 patterns pass).
    let many: Vec<String> = (0..256).map(|i| format!("h{i}.example.com")).collect();
    assert_eq!(
        s.set_key_egress(&info.id, Some(&many))
            .expect("256 patterns")
            .expect("exists")
            .egress_allow
            .map(|b| b.len()),
        Some(256)
    );
    let too_many: Vec<String> = (0..257).map(|i| format!("h{i}.example.com")).collect();
    for bad in [too_many, vec![String::new()], vec!["a b.com".to_owned()]] {
        let e = s.set_key_egress(&info.id, Some(&bad)).expect_err("refused");
        assert!(matches!(e, StoreError::Invalid(_)), "{e}");
    }
    assert_eq!(
        s.find_key(&info.id)
            .expect("find")
            .expect("exists")
            .egress_allow,
        Some(many)
    );
}

fn sessions_crud(db: &TestDb) {
    let s = db.open();
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

fn uploads_metadata(db: &TestDb) {
    let s = db.open();
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

fn session_extras_live_and_die_with_their_session(db: &TestDb) {
    let s = db.open();
    s.put_session(&session("a", "ses_1", 0)).expect("put");
    assert_eq!(s.session_extra("ses_1", "e2b").expect("read"), None);
    s.put_session_extra("ses_1", "e2b", r#"{"token":"t1"}"#)
        .expect("extra");
    s.put_session_extra("ses_1", "e2b", r#"{"token":"t2"}"#)
        .expect("replaced");
    s.put_session_extra("ses_1", "other", "[]")
        .expect("a second kind");
    assert_eq!(
        s.session_extra("ses_1", "e2b").expect("read").as_deref(),
        Some(r#"{"token":"t2"}"#)
    );
    assert!(matches!(
        s.put_session_extra("ses_nope", "e2b", "{}"),
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.put_session_extra("ses_1", "e2b", "{not json"),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        s.put_session_extra("ses_1", "", "{}"),
        Err(StoreError::Invalid(_))
    ));
    let big = format!("\"{}\"", "x".repeat(runcell_store::MAX_SESSION_EXTRA_BYTES));
    assert!(matches!(
        s.put_session_extra("ses_1", "e2b", &big),
        Err(StoreError::Invalid(_))
    ));
    // Replacing the session (a status change, a restart's re-record) keeps them; deleting it
    // drops them.
    s.put_session(&session("a", "ses_1", 0)).expect("replace");
    assert!(s.session_extra("ses_1", "e2b").expect("read").is_some());
    assert!(s.delete_session("ses_1").expect("delete"));
    assert_eq!(s.session_extra("ses_1", "e2b").expect("read"), None);
    assert_eq!(s.session_extra("ses_1", "other").expect("read"), None);
}

fn executions_pagination_and_isolation(db: &TestDb) {
    let s = db.open();
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

fn tenants_are_set_changed_and_cleared(db: &TestDb) {
    let s = db.open();
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
    let s = db.open();
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

fn intact_chain_verifies(db: &TestDb) {
    let s = setup(db, 5);
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

fn triggers_block_accidental_edits(db: &TestDb) {
    let s = setup(db, 2);
    assert!(db.try_sql("UPDATE executions SET code = 'x'").is_err());
    assert!(db.try_sql("DELETE FROM executions").is_err());
    assert!(s.verify_chain(None).expect("verify").ok);
}

fn edited_row_is_detected(db: &TestDb) {
    let s = setup(db, 5);
    db.tamper("UPDATE executions SET code = 'rm -rf /' WHERE seq = 3");
    let r = s.verify_chain(Some("t")).expect("verify");
    assert_eq!(broken(&r), ("ex_3", "row edited: hash mismatch"));
    assert_eq!(r.checked, 2);
    // Same through the all-tenants walk.
    assert_eq!(broken(&s.verify_chain(None).expect("verify")).0, "ex_3");
}

fn edited_json_or_timestamp_is_detected(db: &TestDb) {
    let s = setup(db, 3);
    db.tamper("UPDATE executions SET created_at = '2001-01-01T00:00:00.000000000Z' WHERE seq = 2");
    assert_eq!(broken(&s.verify_chain(None).expect("v")).0, "ex_2");
}

fn deleted_row_is_detected(db: &TestDb) {
    let s = setup(db, 5);
    db.tamper("DELETE FROM executions WHERE seq = 2");
    let r = s.verify_chain(Some("t")).expect("verify");
    let (id, reason) = broken(&r);
    assert_eq!(id, "ex_3");
    assert!(reason.contains("missing"), "{reason}");
    assert!(reason.contains("seq 2 expected, found 3"), "{reason}");
    assert_eq!(r.checked, 1);
}

fn deleted_last_row_is_detected_via_head(db: &TestDb) {
    let s = setup(db, 5);
    db.tamper("DELETE FROM executions WHERE seq = 5");
    let r = s.verify_chain(Some("t")).expect("verify");
    let (id, reason) = broken(&r);
    assert_eq!(id, "ex_4");
    assert!(reason.contains("chain head"), "{reason}");
    assert!(reason.contains("deleted"), "{reason}");
    assert_eq!(r.checked, 4);

    // Everything deleted: the head still remembers.
    db.tamper("DELETE FROM executions");
    let r = s.verify_chain(None).expect("verify");
    assert_eq!(broken(&r).0, "");
    assert_eq!(r.checked, 0);
}

fn rehashed_row_breaks_the_next_link(db: &TestDb) {
    let s = setup(db, 5);
    // Edit row 3 and recompute its hash properly (with the chain key), but leave row 4's
    // prev_hash alone.
    let row3 = s.get_execution("t", "ex_3").expect("get").expect("row 3");
    let prev = db.value("SELECT prev_hash FROM executions WHERE seq = 3");
    let created = db.value("SELECT created_at FROM executions WHERE seq = 3");
    // With the chain key (stolen): a hash verification alone accepts for row 3.
    let key = db.stolen_key();
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
    db.tamper(&format!(
        "UPDATE executions SET code = 'evil()', hash = '{forged}' WHERE seq = 3"
    ));
    let r = s.verify_chain(Some("t")).expect("verify");
    let (id, reason) = broken(&r);
    assert_eq!(id, "ex_4");
    assert!(reason.contains("previous row"), "{reason}");
    assert_eq!(r.checked, 3);
}

fn out_of_band_rows_are_detected(db: &TestDb) {
    let s = setup(db, 3);
    // A copy of row 3 re-numbered as 4 (so its own hash is wrong too).
    db.tamper(
        "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                 execution_json, created_at, prev_hash, hash)
         SELECT tenant, 4, 'ex_fake', session_id, status, code, execution_json, created_at,
                hash, hash FROM executions WHERE seq = 3",
    );
    let r = s.verify_chain(Some("t")).expect("verify");
    assert_eq!(broken(&r).0, "ex_fake");

    // A correctly hashed row appended without moving the head.
    db.tamper("DELETE FROM executions WHERE seq = 4");
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
    let hash = runcell_store::audit::chain_mac(&db.stolen_key(), &last.hash, &fields);
    db.tamper(&format!(
        "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                 execution_json, created_at, prev_hash, hash)
         VALUES ('t', 4, 'ex_sneaky', NULL, 'ok', '1', '{{}}', '{created}', '{}', '{hash}')",
        last.hash
    ));
    let r = s.verify_chain(Some("t")).expect("verify");
    let (id, reason) = broken(&r);
    assert_eq!(id, "ex_sneaky");
    assert!(reason.contains("out of band"), "{reason}");

    // A whole chain for a tenant that never had a head.
    db.tamper("DELETE FROM executions WHERE seq = 4");
    db.tamper(
        "INSERT INTO executions (tenant, seq, execution_id, session_id, status, code,
                                 execution_json, created_at, prev_hash, hash)
         SELECT 'ghost', seq, 'gh_' || seq, session_id, status, code, execution_json,
                created_at, prev_hash, hash FROM executions WHERE tenant = 't' AND seq = 1",
    );
    let r = s.verify_chain(None).expect("verify");
    assert_eq!(broken(&r).0, "gh_1");
    assert!(s.verify_chain(Some("t")).expect("t alone").ok);
}

fn appends_continue_after_reopen(db: &TestDb) {
    {
        let s = db.open();
        append_n(&s, 3);
    }
    let s = db.open();
    let e = s
        .append_execution(&exec("t", "ex_4", None, 4))
        .expect("append");
    assert_eq!(e.seq, 4);
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 4);
}

fn concurrent_appends_keep_one_chain(db: &TestDb) {
    let s = db.open();
    // One thread through a shared handle, one through a second independent Store on the
    // same database (as a second process, or for PostgreSQL a second node, would be).
    let s2 = db.open();
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

/// Many threads on one store share group commits: every append that returns Ok is in its
/// tenant's chain at the seq it was given, a reused id fails alone (its batch-mates are still
/// recorded), and both chains verify.
fn group_committed_appends_keep_every_chain_whole(db: &TestDb) {
    let s = db.open();
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
fn batch_append_fails_bad_records_alone(db: &TestDb) {
    let s = db.open();
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
