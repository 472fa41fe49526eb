//! A dead node's session taken over by a live node (`take_over_session`), on a real
//! PostgreSQL: refused while the owner beats and for a node that is not the owner; once the
//! owner is dead, two nodes trying at once make one owner; the dead node, started again,
//! neither recovers nor changes it. SQLite (one node) has nothing to take.

mod common;

use std::time::{Duration, Instant};

use common::*;
use runcell_store::StoreError;

const A: &str = "http://node-a:8080";
/// What a node recovers at its start: its sessions in these states.
const LIVE: [&str; 4] = ["starting", "ready", "busy", "paused"];

#[test]
fn a_dead_nodes_session_is_taken_over_by_one_live_node() {
    let db = TestDb::new(Kind::Postgres);
    let a = db.open_node(A);
    let b = db.open_node("http://node-b:8080");
    let c = db.open_node("http://node-c:8080");
    a.put_session(&session("t", "ses_a", 1)).expect("put on a");
    // The owner beats: nobody takes it. Nor is a session taken from a node that is not its.
    assert!(!b.take_over_session("ses_a", A).expect("take"));
    assert!(!b
        .take_over_session("ses_a", "http://node-c:8080")
        .expect("take"));
    assert!(!b.take_over_session("ses_none", A).expect("take"));

    drop(a);
    let stopped = Instant::now();
    while b
        .get_session("t", "ses_a")
        .expect("get")
        .is_some_and(|s| s.status != "dead")
    {
        assert!(
            stopped.elapsed() < runcell_store::NODE_TIMEOUT + Duration::from_secs(4),
            "a's session not dead after {:?}",
            stopped.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Still not taken from the wrong node.
    assert!(!c
        .take_over_session("ses_a", "http://node-b:8080")
        .expect("take"));
    // b and c at once: one wins.
    let (won_b, won_c) = std::thread::scope(|s| {
        let tb = s.spawn(|| b.take_over_session("ses_a", A).expect("take on b"));
        let tc = s.spawn(|| c.take_over_session("ses_a", A).expect("take on c"));
        (tb.join().expect("b"), tc.join().expect("c"))
    });
    assert!(won_b ^ won_c, "exactly one owner: b {won_b}, c {won_c}");
    let (winner, loser) = if won_b { (&b, &c) } else { (&c, &b) };
    // Paused for everyone, the winner's to change, not the loser's.
    for n in [&b, &c] {
        assert_eq!(
            n.get_session("t", "ses_a").expect("get").map(|s| s.status),
            Some("paused".into())
        );
    }
    assert!(winner
        .update_session_status("ses_a", "ready", at(5), at(900))
        .expect("update"));
    assert!(!loser
        .update_session_status("ses_a", "busy", at(6), at(900))
        .expect("update"));
    // Taken once: neither takes it again from A.
    assert!(!loser.take_over_session("ses_a", A).expect("take"));
    assert_eq!(
        ids(winner.sessions_with_status(&LIVE).expect("winner's")),
        ["ses_a"]
    );

    // A starts again (epoch 2): the session is not its to recover or change.
    let a2 = db.open_node(A);
    assert!(a2.sessions_with_status(&LIVE).expect("a's").is_empty());
    assert!(!a2
        .update_session_status("ses_a", "dead", at(7), at(900))
        .expect("update"));
    assert!(matches!(
        a2.put_session(&session("t", "ses_a", 1)),
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(
        a2.get_session("t", "ses_a").expect("get").map(|s| s.status),
        Some("ready".into())
    );
}

#[test]
fn one_node_has_nothing_to_take() {
    let db = TestDb::new(Kind::Sqlite);
    let s = db.open();
    s.put_session(&session("t", "ses_1", 1)).expect("put");
    assert!(!s.take_over_session("ses_1", A).expect("take"));
}

fn ids(sessions: Vec<runcell_store::SessionRecord>) -> Vec<String> {
    sessions.into_iter().map(|s| s.id).collect()
}
