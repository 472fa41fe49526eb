//! The nodes sharing a database: each `runcell serve` registers under its id with an epoch
//! one more than that id's last, then beats every [`HEARTBEAT`]; one silent for
//! [`NODE_TIMEOUT`] is dead, and its sessions read as `dead` through every node (the
//! sessions' queries in `records.rs` compare against the database's clock).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::pool::{PgConn, Pool};
use super::records::Owner;
use crate::error::{Result, StoreError};
use crate::lease::LeaseClock;
use crate::SessionNode;

/// How often a node's heartbeat is written.
pub(super) const HEARTBEAT: Duration = Duration::from_secs(2);
pub use crate::lease::NODE_TIMEOUT;

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

/// How long one beat may take before it counts as failed (and its connection is dropped).
const BEAT_WAIT: Duration = Duration::from_secs(2);
/// How soon a failed beat is tried again.
const RETRY: Duration = Duration::from_millis(250);

/// Beats for `owner` until the store's runtime stops (the store is dropped), on a
/// connection of its own (a pool busy with slow calls does not delay it). Each beat the
/// database confirms renews `lease`; a beat that fails or takes over [`BEAT_WAIT`] renews
/// nothing and is tried again at the next tick, on a new connection.
///
/// A beat only counts while this epoch is still alive in the database's eyes (the same
/// node id and epoch, heard from within [`NODE_TIMEOUT`]): a node the others already called
/// dead, or whose id a newer process registered again, has lost its epoch; it stops
/// beating, so it stays dead and its sessions are not kept alive by it.
pub(super) async fn heartbeat(pool: Arc<Pool>, owner: Owner, lease: Arc<LeaseClock>) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut conn: Option<PgConn> = None;
    loop {
        tick.tick().await;
        let sent = Instant::now();
        let beat = tokio::time::timeout(BEAT_WAIT, async {
            let c = match conn.take().filter(|c| !c.client.is_closed()) {
                Some(c) => c,
                None => pool.connect().await?,
            };
            let n = c
                .client
                .execute(
                    "UPDATE nodes SET heartbeat_at = now()
                     WHERE id = $1 AND epoch = $2
                       AND heartbeat_at > now() - interval '10 seconds'",
                    &[&owner.node, &owner.epoch],
                )
                .await?;
            Ok::<_, StoreError>((c, n))
        })
        .await;
        match beat {
            Ok(Ok((c, 1))) => {
                lease.renewed_at(sent);
                conn = Some(c);
            }
            Ok(Ok((_, _))) => {
                say_lost(&owner);
                lease.lose();
                return;
            }
            // Unreachable or too slow: no renewal. Tried again soon, on a new connection,
            // rather than a whole beat later: once the database answers again, the lease
            // is renewed before the others' 10 s are up, if it still can be.
            Ok(Err(_)) | Err(_) => {
                tokio::time::sleep(RETRY).await;
                tick.reset_immediately();
            }
        }
    }
}

/// Said once, for the node's operator: it must be restarted.
fn say_lost(owner: &Owner) {
    tracing::error!(
        node = %owner.node,
        epoch = owner.epoch,
        "{}",
        crate::lease::lost(owner.epoch)
    );
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
