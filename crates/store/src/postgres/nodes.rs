//! The nodes sharing a database: each `runcell serve` registers under its id with an epoch
//! one more than that id's last, then beats every [`HEARTBEAT`]; one silent for
//! [`NODE_TIMEOUT`] is dead, and its sessions read as `dead` through every node (the
//! sessions' queries in `records.rs` compare against the database's clock).

use std::sync::Arc;
use std::time::Duration;

use super::pool::{PgConn, Pool};
use super::records::Owner;
use crate::error::Result;
use crate::SessionNode;

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

/// Beats for `owner` until the store's runtime stops (the store is dropped). A beat that
/// cannot be written (the database away) is retried at the next; a node whose epoch was
/// superseded (its id registered again, by a newer process) stops beating, so it goes dead
/// and the newer one's sessions are not kept alive by it.
pub(super) async fn heartbeat(pool: Arc<Pool>, owner: Owner) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Ok(c) = pool.get().await else { continue };
        let beat = c
            .client
            .execute(
                "UPDATE nodes SET heartbeat_at = now() WHERE id = $1 AND epoch = $2",
                &[&owner.node, &owner.epoch],
            )
            .await;
        if matches!(beat, Ok(0)) {
            return;
        }
    }
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
