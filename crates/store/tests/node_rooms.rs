//! The room each node reports for placing new sessions (PostgreSQL only: a store of its own
//! places nothing): written at once on the first report, listed for live nodes that
//! reported, a node that never did left out, and a command's store (no node) writing none.

mod common;

use common::*;
use runcell_store::{NodePlace, NodeRoom};

fn room(mb: u64, sessions: Option<u64>) -> NodeRoom {
    NodeRoom {
        free_memory_mb: mb,
        free_sessions: sessions,
    }
}

#[test]
fn live_nodes_are_listed_with_the_room_they_reported() {
    let db = TestDb::new(Kind::Postgres);
    let a = db.open_node("http://node-a:8080");
    let b = db.open_node("http://node-b:8080");
    let silent = db.open_node("http://node-c:8080");
    assert_eq!(a.node_rooms().expect("rooms"), [], "nobody reported yet");

    // The first report is written before report_room returns.
    a.report_room(room(4096, Some(3)));
    b.report_room(room(8192, None));
    let listed = silent.node_rooms().expect("rooms");
    assert_eq!(
        listed,
        [
            NodePlace {
                node: "http://node-a:8080".into(),
                room: room(4096, Some(3)),
            },
            NodePlace {
                node: "http://node-b:8080".into(),
                room: room(8192, None),
            },
        ],
        "node-c never reported: not placeable"
    );
    assert_eq!(
        db.value("SELECT free_sessions IS NULL FROM nodes WHERE id = 'http://node-b:8080'"),
        "t",
        "no cap is NULL"
    );

    // A store that is no node (runcell keys, runcell audit) reports nothing.
    db.open().report_room(room(1, Some(1)));
    assert_eq!(b.node_rooms().expect("rooms").len(), 2);

    // A later report goes with the heartbeat, woken at once: read until it shows (the
    // heartbeat writes it asynchronously; no time is asserted).
    a.report_room(room(1024, Some(0)));
    // Bounded only so that a heartbeat that never writes fails rather than hangs (it beats
    // every 2 s anyway).
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let rooms = b.node_rooms().expect("rooms");
        if rooms[0].room == room(1024, Some(0)) {
            break;
        }
        assert_eq!(
            rooms[0].room,
            room(4096, Some(3)),
            "only the old or the new room"
        );
        assert!(
            std::time::Instant::now() < give_up,
            "the new room was never written"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
