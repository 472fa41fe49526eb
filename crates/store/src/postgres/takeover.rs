//! A dead node's session taken over by a live one (the engine's takeover.rs decides when; a
//! snapshot store the nodes share holds what the session needs).

use super::pool::PgConn;
use super::records::Owner;
use crate::error::Result;

/// Moves session `id` from `dead_node` to `to` if `dead_node` still owns it and is dead (no
/// heartbeat for 10 s, the `interval` of `records.rs`, or never registered); whether it moved.
///
/// One statement, so the row lock decides between nodes taking it at once: the second one's
/// update waits for the first's commit, then finds the owner changed (`owner_node =
/// dead_node` no longer holds) and updates nothing. Afterwards the dead node's epoch is no
/// longer the owner's, so its writes (`put_session`, `update_session_status`) change nothing.
pub(super) async fn take_over(
    c: &mut PgConn,
    id: &str,
    dead_node: &str,
    to: &Owner,
) -> Result<bool> {
    let n = c
        .client
        .execute(
            "UPDATE sessions SET owner_node = $3, owner_epoch = $4, status = 'paused'
             WHERE id = $1 AND owner_node = $2 AND owner_node <> $3
               AND status IN ('starting', 'ready', 'busy', 'paused')
               AND NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = $2
                               AND n.heartbeat_at > now() - interval '10 seconds')",
            &[&id, &dead_node, &to.node, &to.epoch],
        )
        .await?;
    Ok(n == 1)
}
