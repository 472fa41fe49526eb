//! The nodes sharing a database: each `runcell serve` registers under its id with an epoch
//! one more than that id's last, then beats every [`HEARTBEAT`]; one silent for
//! [`NODE_TIMEOUT`] is dead, and its sessions read as `dead` through every node (the
//! sessions' queries in `records.rs` compare against the database's clock).

use std::sync::Arc;
use std::time::Duration;

use super::pool::{PgConn, Pool};
use super::records::Owner;
use crate::error::Result;
use crate::{NodePlace, NodeRoom, SessionNode};

/// How often a node's heartbeat is written.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(2);
/// Silence after which a node is dead (the `interval '10 seconds'` of `records.rs`).
pub const NODE_TIMEOUT: Duration = Duration::from_secs(10);

/// Registers `node` and returns its new epoch.
pub(super) async fn register(pool: &Arc<Pool>, node: &str) -> Result<i64> {
    let c = pool.get().await?;
    let row = c
        .client
        .query_one(
            "INSERT INTO nodes (id, epoch, started_at, heartbeat_at) VALUES ($1, 1, now(), now())
             ON CONFLICT (id) DO UPDATE SET epoch = nodes.epoch + 1, started_at = now(),
                                            heartbeat_at = now()
             RETURNING epoch",
            &[&node],
        )
        .await?;
    Ok(row.try_get(0)?)
}

/// The room this node last reported, and a wake-up for the heartbeat when it changed.
#[derive(Debug, Default)]
pub(super) struct RoomCell {
    room: std::sync::Mutex<Option<NodeRoom>>,
    changed: tokio::sync::Notify,
}

impl RoomCell {
    /// Keeps `room`; wakes the heartbeat only when it differs from the last one. Whether it
    /// is the first.
    pub(super) fn set(&self, room: NodeRoom) -> bool {
        let mut cur = self.room.lock().unwrap_or_else(|p| p.into_inner());
        let first = cur.is_none();
        if *cur != Some(room) {
            *cur = Some(room);
            if !first {
                self.changed.notify_one();
            }
        }
        first
    }

    fn get(&self) -> Option<NodeRoom> {
        *self.room.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Beats for `owner` until the store's runtime stops (the store is dropped), writing the
/// room in `room` with each beat, and at once when it changes (so other nodes stop placing
/// sessions on a node that just filled up within one write, not a heartbeat later). A beat
/// that cannot be written (the database away) is retried at the next; a node whose epoch was
/// superseded (its id registered again, by a newer process) stops beating, so it goes dead
/// and the newer one's sessions are not kept alive by it.
pub(super) async fn heartbeat(pool: Arc<Pool>, owner: Owner, room: Arc<RoomCell>) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = room.changed.notified() => {}
        }
        let Ok(c) = pool.get().await else { continue };
        let beat = match room.get() {
            None => c
                .client
                .execute(
                    "UPDATE nodes SET heartbeat_at = now() WHERE id = $1 AND epoch = $2",
                    &[&owner.node, &owner.epoch],
                )
                .await
                .map_err(|_| ()),
            Some(r) => write_room(&c, &owner, r).await.map_err(|_| ()),
        };
        if matches!(beat, Ok(0)) {
            return;
        }
    }
}

/// Writes `room` as `owner`'s, with a beat: how many rows (0: the epoch was superseded).
pub(super) async fn write_room(c: &PgConn, owner: &Owner, room: NodeRoom) -> Result<u64> {
    let memory = i64::try_from(room.free_memory_mb).unwrap_or(i64::MAX);
    let sessions = room
        .free_sessions
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX));
    Ok(c.client
        .execute(
            "UPDATE nodes SET heartbeat_at = now(), free_memory_mb = $3, free_sessions = $4,
                              room_at = now()
             WHERE id = $1 AND epoch = $2",
            &[&owner.node, &owner.epoch, &memory, &sessions],
        )
        .await?)
}

/// The live nodes that reported their room, by id.
pub(super) async fn node_rooms(c: &mut PgConn) -> Result<Vec<NodePlace>> {
    let (client, mut st) = c.split();
    let q = st
        .get(
            client,
            "SELECT id, free_memory_mb, free_sessions FROM nodes
             WHERE heartbeat_at > now() - interval '10 seconds' AND room_at IS NOT NULL
             ORDER BY id",
        )
        .await?;
    let unsigned = |v: i64| u64::try_from(v).unwrap_or(0);
    client
        .query(&q, &[])
        .await?
        .iter()
        .map(|r| {
            Ok(NodePlace {
                node: r.try_get(0)?,
                room: NodeRoom {
                    free_memory_mb: unsigned(r.try_get(1)?),
                    free_sessions: r.try_get::<_, Option<i64>>(2)?.map(unsigned),
                },
            })
        })
        .collect()
}

/// The node owning session `id`, and whether it is alive.
pub(super) async fn session_node(c: &mut PgConn, id: &str) -> Result<Option<SessionNode>> {
    let (client, mut st) = c.split();
    let q = st
        .get(
            client,
            "SELECT s.owner_node,
                    COALESCE(n.heartbeat_at > now() - interval '10 seconds', false)
             FROM sessions s LEFT JOIN nodes n ON n.id = s.owner_node
             WHERE s.id = $1 AND s.owner_node IS NOT NULL",
        )
        .await?;
    match client.query_opt(&q, &[&id]).await? {
        Some(r) => Ok(Some(SessionNode {
            node: r.try_get(0)?,
            alive: r.try_get(1)?,
        })),
        None => Ok(None),
    }
}
