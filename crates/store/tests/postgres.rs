//! What only the PostgreSQL backend has: several nodes on one database (their appends to one
//! tenant's chain, their chain key), its migrations, and the server going away and coming
//! back. (The store's contract on both backends is in both.rs.)

mod common;

use std::time::{Duration, Instant};

use common::*;
use runcell_store::{Lease, Store, StoreError};

/// Two nodes, four threads each, appending to the same two tenants at once, one at a time
/// and in batches naming both tenants in either order (so a batch's head locks, taken in
/// name order, cannot deadlock with another's): every chain is one line 1..=N without a
/// gap, and verifies from either node.
#[test]
fn two_nodes_appending_to_one_tenant_keep_one_chain() {
    let db = TestDb::new(Kind::Postgres);
    let nodes = [db.open(), db.open()];
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let node = nodes[t % 2].clone();
            std::thread::spawn(move || {
                let mut appended = 0;
                for i in 0..30 {
                    let id = |tenant: &str| format!("ex_{tenant}_{t}_{i}");
                    if i % 5 == 0 {
                        let (a, b) = if t % 4 < 2 { ("t", "u") } else { ("u", "t") };
                        let recs = [exec(a, &id(a), None, i), exec(b, &id(b), None, i)];
                        for r in node.append_executions(&recs) {
                            r.expect("batch append");
                            appended += 1;
                        }
                    } else {
                        node.append_execution(&exec("t", &id("t"), Some("ses_x"), i))
                            .expect("append");
                        appended += 1;
                    }
                }
                appended
            })
        })
        .collect();
    let total: u64 = threads.into_iter().map(|t| t.join().expect("thread")).sum();
    let (mut t_rows, mut u_rows) = (0, 0);
    for (tenant, count) in [("t", &mut t_rows), ("u", &mut u_rows)] {
        let mut seqs = Vec::new();
        let mut cursor = None;
        loop {
            let (rows, next) = nodes[1]
                .list_executions(tenant, None, 100, cursor.as_deref())
                .expect("list");
            seqs.extend(rows.iter().map(|r| r.seq));
            match next {
                Some(n) => cursor = Some(n),
                None => break,
            }
        }
        seqs.reverse();
        *count = seqs.len() as u64;
        assert_eq!(seqs, (1..=*count).collect::<Vec<u64>>(), "{tenant}");
    }
    assert_eq!(t_rows + u_rows, total);
    assert_eq!(u_rows, 8 * 6, "one u record per batch");
    for node in &nodes {
        let r = node.verify_chain(None).expect("verify");
        assert!(r.ok, "{r:?}");
        assert_eq!(r.checked, total);
    }
    // What a checkpoint signs is the same from both nodes.
    assert_eq!(
        nodes[0].chain_heads(None).expect("heads"),
        nodes[1].chain_heads(None).expect("heads")
    );
}

/// Every node must hold the chain key the database was keyed with: a node given another
/// key, or none, is refused before it can append anything.
#[test]
fn a_node_with_another_chain_key_or_none_is_refused() {
    let db = TestDb::new(Kind::Postgres);
    let first = db.open();
    first
        .append_execution(&exec("t", "ex_1", None, 1))
        .expect("append");
    let other = tempfile::tempdir().expect("tempdir");
    let missing = other.path().join("audit-chain.key");
    match Store::open_postgres(&db.url, &missing) {
        Err(StoreError::WrongChainKey { found, .. }) => assert_eq!(found, "does not exist"),
        other => panic!("a node without the key opened: {other:?}"),
    }
    assert!(!missing.exists(), "no key is left behind for it");
    std::fs::write(&missing, format!("{}\n", "ab".repeat(32))).expect("write another key");
    match Store::open_postgres(&db.url, &missing) {
        Err(StoreError::WrongChainKey { found, .. }) => assert!(found.starts_with("holds key")),
        other => panic!("a node with another key opened: {other:?}"),
    }
    // A copy of the right key works, and sees what the first node wrote.
    std::fs::copy(&db.key_file, &missing).expect("copy the key");
    let second = Store::open_postgres(&db.url, &missing).expect("second node");
    assert!(second.verify_chain(None).expect("verify").ok);
    assert_eq!(
        second
            .get_execution("t", "ex_1")
            .expect("get")
            .map(|r| r.seq),
        Some(1)
    );
}

#[test]
fn migrations_run_once_and_a_newer_schema_is_refused() {
    let db = TestDb::new(Kind::Postgres);
    // Several nodes starting together migrate once (the advisory lock).
    let opens: Vec<_> = (0..4)
        .map(|_| {
            let (url, key) = (db.url.clone(), db.key_file.clone());
            std::thread::spawn(move || Store::open_postgres(&url, &key).map(drop))
        })
        .collect();
    for o in opens {
        o.join().expect("thread").expect("open");
    }
    assert_eq!(
        db.value("SELECT count(*) FROM schema_migrations"),
        runcell_store::PgStore::schema_version().to_string()
    );
    db.tamper("INSERT INTO schema_migrations (version, applied_at) VALUES (999, 'later')");
    assert!(matches!(
        Store::open_postgres(&db.url, &db.key_file),
        Err(StoreError::SchemaTooNew { found: 999, .. })
    ));
}

/// The server stops under a node: calls fail at once, as unavailable (not as bad input or
/// a conflict), nothing acknowledged is lost, and once the server is back the same store
/// carries on by itself (its pool connects again).
#[test]
fn a_restarting_server_fails_calls_clearly_and_the_store_recovers() {
    let server = PgServer::start();
    let url = server.new_database();
    let keys = tempfile::tempdir().expect("tempdir");
    let key_file = keys.path().join("audit-chain.key");
    let s = Store::open_postgres(&url, &key_file).expect("open");
    for i in 1..=3 {
        s.append_execution(&exec("t", &format!("ex_{i}"), None, i))
            .expect("append");
    }
    server.pg_stop();
    let started = Instant::now();
    let err = s
        .append_execution(&exec("t", "ex_lost", None, 4))
        .expect_err("no server");
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "failed in {:?}",
        started.elapsed()
    );
    assert!(s
        .get_session("t", "ses_1")
        .expect_err("no server")
        .is_unavailable());
    server.pg_start();
    let e = s
        .append_execution(&exec("t", "ex_4", None, 4))
        .expect("append after the restart");
    assert_eq!(e.seq, 4, "the failed append took no place in the chain");
    let r = s.verify_chain(None).expect("verify");
    assert!(r.ok && r.checked == 4, "{r:?}");
}

#[test]
fn an_unreachable_database_is_unavailable() {
    let nowhere = tempfile::tempdir().expect("tempdir");
    let url = format!("host={} user=runcell dbname=none", nowhere.path().display());
    let err = Store::open_postgres(&url, &nowhere.path().join("key")).expect_err("nothing there");
    assert!(err.is_unavailable(), "{err:?}");
    assert!(matches!(
        Store::open_postgres("mysql://nope", &nowhere.path().join("key")),
        Err(StoreError::Invalid(_))
    ));
}

const LIVE: [&str; 3] = ["starting", "ready", "busy"];

fn ids(sessions: Vec<runcell_store::SessionRecord>) -> Vec<String> {
    sessions.into_iter().map(|s| s.id).collect()
}

/// Each session is its node's: another node neither recovers, changes nor takes it, and
/// reads it as the owner wrote it while the owner beats; once the owner falls silent, every
/// node reads it `dead` within NODE_TIMEOUT (plus a heartbeat). A later epoch of the same
/// node takes its sessions back, and the earlier epoch can no longer change them.
#[test]
fn sessions_are_their_nodes_and_read_dead_once_the_node_stops_beating() {
    let db = TestDb::new(Kind::Postgres);
    let a = db.open_node("http://node-a:8080");
    let b = db.open_node("http://node-b:8080");
    a.put_session(&session("t", "ses_a", 1)).expect("put on a");
    b.put_session(&session("t", "ses_b", 2)).expect("put on b");
    let seen = b
        .get_session("t", "ses_a")
        .expect("get")
        .expect("a's session");
    assert_eq!(seen.status, "ready");
    assert_eq!(ids(b.list_sessions("t").expect("list")), ["ses_a", "ses_b"]);
    // What a node recovers at start and sweeps: its own.
    assert_eq!(ids(a.sessions_with_status(&LIVE).expect("a's")), ["ses_a"]);
    assert_eq!(ids(b.sessions_with_status(&LIVE).expect("b's")), ["ses_b"]);
    assert!(!b
        .update_session_status("ses_a", "dead", at(3), at(900))
        .expect("update"));
    assert!(matches!(
        b.put_session(&session("t", "ses_a", 1)),
        Err(StoreError::Conflict(_))
    ));

    // Node a stops (its heartbeat with it).
    drop(a);
    let stopped = Instant::now();
    loop {
        let s = b
            .get_session("t", "ses_a")
            .expect("get")
            .expect("still recorded");
        if s.status == "dead" {
            break;
        }
        assert!(
            stopped.elapsed() < runcell_store::NODE_TIMEOUT + Duration::from_secs(4),
            "still {} after {:?}",
            s.status,
            stopped.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        stopped.elapsed() >= runcell_store::NODE_TIMEOUT - Duration::from_secs(3),
        "dead too soon: {:?}",
        stopped.elapsed()
    );
    assert_eq!(
        ids(b.sessions_with_status(&["dead"]).expect("dead")),
        ["ses_a"]
    );
    assert_eq!(
        b.get_session("t", "ses_b").expect("get").map(|s| s.status),
        Some("ready".into()),
        "b's own sessions are untouched"
    );

    // Node a comes back (epoch 2): its session is its own again, live for everyone.
    let a2 = db.open_node("http://node-a:8080");
    assert_eq!(
        ids(a2.sessions_with_status(&LIVE).expect("a's again")),
        ["ses_a"]
    );
    assert_eq!(
        b.get_session("t", "ses_a").expect("get").map(|s| s.status),
        Some("ready".into())
    );
    // A third process under the same id (epoch 3) takes the session over; epoch 2 can no
    // longer change it, nor make sessions: its epoch is no longer the node's.
    let a3 = db.open_node("http://node-a:8080");
    a3.put_session(&session("t", "ses_a", 1))
        .expect("taken over");
    assert!(matches!(
        a2.update_session_status("ses_a", "busy", at(4), at(900)),
        Err(StoreError::Fenced(_))
    ));
    assert!(matches!(
        a2.put_session(&session("t", "ses_a", 1)),
        Err(StoreError::Fenced(_))
    ));
    assert!(a3
        .update_session_status("ses_a", "busy", at(4), at(900))
        .expect("update"));
}

/// The server drops its store on one of its async threads at shutdown: the store's own
/// runtime must go without waiting there (tokio refuses to block in an async context).
#[test]
fn a_store_can_be_dropped_inside_an_async_runtime() {
    let db = TestDb::new(Kind::Postgres);
    let s = db.open_node("http://node-drop");
    s.append_execution(&exec("t", "ex_1", None, 1))
        .expect("append");
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    rt.block_on(async move { drop(s) });
}

/// What a node forwards by: which node owns a session, and whether it is alive.
#[test]
fn a_session_names_its_node() {
    let db = TestDb::new(Kind::Postgres);
    let a = db.open_node("http://node-a:8080");
    let b = db.open_node("http://node-b:8080");
    assert_eq!(a.node_id(), Some("http://node-a:8080"));
    a.put_session(&session("t", "ses_a", 1)).expect("put");
    let found = b.session_node("ses_a").expect("look up");
    assert_eq!(
        found,
        Some(runcell_store::SessionNode {
            node: "http://node-a:8080".into(),
            alive: true
        })
    );
    assert_eq!(b.session_node("ses_nope").expect("look up"), None);
    // A command's store is no node and owns nothing.
    let cli = db.open();
    assert_eq!(cli.node_id(), None);
    cli.put_session(&session("t", "ses_cli", 2)).expect("put");
    assert_eq!(b.session_node("ses_cli").expect("look up"), None);
    assert_eq!(
        db.open()
            .session_node("ses_a")
            .expect("look up")
            .map(|n| n.alive),
        Some(true)
    );
}

/// Where a node writes for its sessions, the database itself checks the node's epoch: once
/// the cluster has called a node dead (its heartbeat over 10 s old, as after a partition),
/// none of its writes goes in, whatever the node believes, and its heartbeat cannot bring
/// it back; a session another node holds now takes no execution from the old one. Positive
/// controls: the same writes while alive, and the other node's own.
#[test]
fn the_database_refuses_a_node_it_called_dead_and_sessions_held_elsewhere() {
    let db = TestDb::new(Kind::Postgres);
    let a = db.open_node("http://node-a:8080");
    let b = db.open_node("http://node-b:8080");
    a.put_session(&session("t", "ses_a", 1)).expect("put on a");
    assert!(a
        .update_session_status("ses_a", "busy", at(2), at(900))
        .expect("update while alive"));
    a.append_execution(&exec("t", "ex_a1", Some("ses_a"), 1))
        .expect("append while alive");
    assert_eq!(a.lease(), Lease::Held);

    // Silent for 20 s, as far as the database knows: dead for every node. Right after one
    // of its beats, so that the node itself still believes it holds its lease while it
    // writes below (checked after): what refuses those writes is the database.
    let beat = || db.value("SELECT heartbeat_at FROM nodes WHERE id = 'http://node-a:8080'");
    let last = beat();
    let waiting = Instant::now();
    while beat() == last {
        assert!(waiting.elapsed() < Duration::from_secs(30), "no heartbeat");
        std::thread::sleep(Duration::from_millis(20));
    }
    db.try_sql(
        "UPDATE nodes SET heartbeat_at = now() - interval '20 seconds' \
         WHERE id = 'http://node-a:8080'",
    )
    .expect("age a's heartbeat");
    assert_eq!(
        b.get_session("t", "ses_a").expect("get").map(|s| s.status),
        Some("dead".into())
    );
    let fenced = |r: Result<(), StoreError>, what: &str| match r {
        Err(StoreError::Fenced(m)) => {
            assert!(m.contains("declared its epoch 1 dead"), "{what}: {m}")
        }
        other => panic!("{what}: {other:?}"),
    };
    fenced(
        a.update_session_status("ses_a", "ready", at(3), at(900))
            .map(drop),
        "status update",
    );
    fenced(a.put_session(&session("t", "ses_a2", 3)), "new session");
    fenced(
        a.append_execution(&exec("t", "ex_a2", Some("ses_a"), 2))
            .map(drop),
        "execution in its session",
    );
    fenced(
        a.append_execution(&exec("t", "ex_a3", None, 3)).map(drop),
        "one-shot execution",
    );
    let batch = a.append_executions(&[
        exec("t", "ex_a4", Some("ses_a"), 4),
        exec("t", "ex_a5", None, 5),
    ]);
    for r in batch {
        fenced(r.map(drop), "batch");
    }
    assert_eq!(
        a.lease(),
        Lease::Held,
        "the node found out first: the refusals were its own, not the database's"
    );
    // Nothing of it was written.
    assert_eq!(db.value("SELECT count(*) FROM executions"), "1");
    assert_eq!(
        db.value("SELECT status FROM sessions WHERE id = 'ses_a'"),
        "busy"
    );
    assert_eq!(
        db.value("SELECT count(*) FROM sessions WHERE id = 'ses_a2'"),
        "0"
    );
    // Its heartbeat finds its epoch dead and stops: the node knows it lost it, and stays
    // dead for the others.
    let aged = Instant::now();
    while a.lease() != (Lease::Lost { epoch: 1 }) {
        assert!(
            aged.elapsed() < Duration::from_secs(30),
            "the lease still reads {:?}",
            a.lease()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(a.lease().check().is_err());
    assert_eq!(
        b.get_session("t", "ses_a").expect("get").map(|s| s.status),
        Some("dead".into())
    );

    // A session of b's that another node holds now (moved there): b records no execution
    // of it any more, its own others still.
    b.put_session(&session("t", "ses_b", 4)).expect("put on b");
    b.append_execution(&exec("t", "ex_b1", Some("ses_b"), 6))
        .expect("append while b holds it");
    db.try_sql("UPDATE sessions SET owner_node = 'http://node-c:8080' WHERE id = 'ses_b'")
        .expect("move ses_b");
    match b.append_execution(&exec("t", "ex_b2", Some("ses_b"), 7)) {
        Err(StoreError::Fenced(m)) => {
            assert!(m.contains("session ses_b is held by another node"), "{m}")
        }
        other => panic!("an execution of a session held elsewhere: {other:?}"),
    }
    b.append_execution(&exec("t", "ex_b3", None, 8))
        .expect("b's own one-shot");
    assert_eq!(b.lease(), Lease::Held);
    let report = b.verify_chain(Some("t")).expect("verify");
    assert!(report.ok, "{report:?}");
    assert_eq!(report.checked, 3);
}
