//! Where a new session goes, with several nodes on one database (docs/scale.md,
//! "Placement"). Every node reports the room it has left (memory it can still commit, and
//! sessions under its `--max-sessions`) with its heartbeat, and at once when it changes; a
//! `POST /v1/sessions` reaching any node is created on the live node with the most room,
//! forwarded there signed like any forwarded request, unless the client pins it to a node
//! (`x-runcell-node: NODE_URL`). A node without room for the session is never chosen; a
//! chosen node that cannot be reached, or that has filled up meanwhile (503), is passed
//! over for the next; with none left the create is tried here, which gives the usual
//! refusal when this node is full too.

use std::cmp::Reverse;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderName, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use runcell_store::{NodePlace, NodeRoom};

use crate::error::{ApiError, ErrorCode};
use crate::relay::{served_here, to_node};
use crate::state::{AppState, Principal};

/// Pins a new session to a node: `x-runcell-node: NODE_URL` (the node's `--node-url`).
pub const PIN: HeaderName = HeaderName::from_static("x-runcell-node");

/// How often a node's room is taken to the store (which writes it only when it changed).
const ROOM_EVERY: Duration = Duration::from_millis(250);

/// Keeps this node's room in the store while the server runs (nothing on a server of its
/// own). Call on the server's runtime.
pub fn spawn_room_reports(state: &AppState) {
    if state.store.node_id().is_none() {
        return;
    }
    let (engine, store) = (state.engine.clone(), state.store.clone());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(ROOM_EVERY);
        loop {
            tick.tick().await;
            store.report_room(engine.sessions().room());
        }
    });
}

/// `POST /v1/sessions` on node `me` of a cluster: created where it is pinned, or on the node
/// with the most room.
pub(crate) async fn create(state: &AppState, me: &str, req: Request, next: Next) -> Response {
    // The client is authenticated before anything is looked up for it.
    if let Err(e) = Principal::of_headers(req.headers(), state).await {
        return e.into_response();
    }
    let pin = match req.headers().get(&PIN).map(|v| v.to_str()) {
        None => None,
        Some(Ok(p)) => Some(p.trim().to_owned()),
        Some(Err(_)) => return not_a_node("(not text)").into_response(),
    };
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, runcell_engine::MAX_REQUEST_BYTES).await {
        Ok(b) => b,
        Err(_) => return ApiError::body_too_large().into_response(),
    };
    let again = || Request::from_parts(parts.clone(), Body::from(body.clone()));
    let mut rooms = match rooms(state).await {
        Some(rooms) => rooms,
        // The store is away: this node's create meets the same store and says so.
        None => return served_here(state, next.run(again()).await),
    };
    // This node's own room is known now, not as of its last report.
    rooms.retain(|r| r.node != me);
    rooms.push(NodePlace {
        node: me.to_owned(),
        room: state.engine.sessions().room(),
    });
    if let Some(pin) = pin {
        if pin == me {
            return served_here(state, next.run(again()).await);
        }
        if !rooms.iter().any(|r| r.node == pin) {
            return not_a_node(&pin).into_response();
        }
        return to_node(state, &pin, me, again())
            .await
            .unwrap_or_else(|why| {
                ApiError::unavailable(format!(
                    "the node this session is pinned to ({pin}) cannot be reached: {why}"
                ))
                .into_response()
            });
    }
    let need = memory_asked(&body).unwrap_or(state.engine.config().limits.defaults.memory_mb);
    for node in ranked(rooms, need) {
        if node == me {
            return served_here(state, next.run(again()).await);
        }
        match to_node(state, &node, me, again()).await {
            // Filled up since it last said: nothing was made there, the next may have room.
            Ok(answer) if answer.status() == StatusCode::SERVICE_UNAVAILABLE => {
                tracing::info!(%node, "placement: the chosen node has no room now, trying the next");
            }
            Ok(answer) => return answer,
            Err(why) => {
                tracing::warn!(%node, %why, "placement: the chosen node cannot be reached, trying the next");
            }
        }
    }
    // No node has room: this one's refusal says why.
    served_here(state, next.run(again()).await)
}

/// How long the other nodes' rooms, once read, are used for placing creates: the rooms are
/// as fresh as each node's last write anyway (a node that filled up meanwhile answers 503 and
/// is passed over), and a burst of creates then costs one read of the store, not one each.
const ROOMS_FOR: Duration = Duration::from_millis(250);

/// The live nodes' rooms, read from the store at most every [`ROOMS_FOR`]; `None` when the
/// store cannot be read.
async fn rooms(state: &AppState) -> Option<Vec<NodePlace>> {
    // One node per process; keyed by the node all the same (tests may run several).
    type Cached = Option<(String, std::time::Instant, Vec<NodePlace>)>;
    static CACHE: std::sync::Mutex<Cached> = std::sync::Mutex::new(None);
    let me = state.store.node_id().unwrap_or_default().to_owned();
    let fresh = |c: &Cached| {
        c.as_ref()
            .filter(|(node, at, _)| *node == me && at.elapsed() < ROOMS_FOR)
            .map(|(_, _, r)| r.clone())
    };
    if let Some(r) = fresh(&CACHE.lock().unwrap_or_else(|p| p.into_inner())) {
        return Some(r);
    }
    let store = state.store.clone();
    let read = tokio::task::spawn_blocking(move || store.node_rooms())
        .await
        .ok()?
        .ok()?;
    *CACHE.lock().unwrap_or_else(|p| p.into_inner()) =
        Some((me, std::time::Instant::now(), read.clone()));
    Some(read)
}

fn not_a_node(pin: &str) -> ApiError {
    ApiError::new(
        ErrorCode::Conflict,
        format!(
            "x-runcell-node: {pin} is not a live node of this cluster (name a node by its \
             --node-url)"
        ),
    )
}

/// The memory a create body asks for (`limits.memory_mb`), if it names it; the handler
/// checks the body itself.
fn memory_asked(body: &[u8]) -> Option<u64> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("limits")?.get("memory_mb")?.as_u64()
}

/// The nodes with room for a session of `need_mb`, the most room first: free memory, then
/// free sessions (no cap first), then by id, so that equal nodes are chosen alike
/// everywhere.
fn ranked(mut rooms: Vec<NodePlace>, need_mb: u64) -> Vec<String> {
    rooms.retain(|r| has_room(r.room, need_mb));
    rooms.sort_by_key(|r| {
        (
            Reverse(r.room.free_memory_mb),
            Reverse(r.room.free_sessions.unwrap_or(u64::MAX)),
            r.node.clone(),
        )
    });
    rooms.into_iter().map(|r| r.node).collect()
}

fn has_room(room: NodeRoom, need_mb: u64) -> bool {
    room.free_sessions != Some(0) && room.free_memory_mb >= need_mb
}

#[cfg(test)]
mod tests {
    use super::{memory_asked, ranked};
    use runcell_store::{NodePlace, NodeRoom};

    fn node(id: &str, mb: u64, sessions: Option<u64>) -> NodePlace {
        NodePlace {
            node: id.into(),
            room: NodeRoom {
                free_memory_mb: mb,
                free_sessions: sessions,
            },
        }
    }

    #[test]
    fn the_most_room_first_and_full_nodes_never() {
        let rooms = vec![
            node("a", 8000, Some(0)),
            node("b", 2000, None),
            node("c", 6000, Some(3)),
            node("d", 6000, None),
            node("e", 500, None),
        ];
        // a has no session left, e too little memory for 1024 MiB.
        assert_eq!(ranked(rooms.clone(), 1024), ["d", "c", "b"]);
        assert_eq!(ranked(rooms.clone(), 400), ["d", "c", "b", "e"]);
        assert_eq!(ranked(rooms, 9000), Vec::<String>::new());
        // Ties go by id.
        assert_eq!(
            ranked(vec![node("y", 10, None), node("x", 10, None)], 1),
            ["x", "y"]
        );
    }

    #[test]
    fn the_memory_a_body_asks_for() {
        assert_eq!(memory_asked(br#"{"limits":{"memory_mb":256}}"#), Some(256));
        assert_eq!(memory_asked(br#"{"limits":{}}"#), None);
        assert_eq!(memory_asked(b"{}"), None);
        assert_eq!(memory_asked(b"not json"), None);
    }
}
