//! Finding the session a request names, for the tenant that asks: every session-bound route
//! (sessions, files, tool results, pause) starts here, so it lives apart from any of them.

use runcell_engine::SessionInfo;

use crate::error::{ApiError, ApiResult};
use crate::state::{AppState, Tenant};

/// Looks up a session the tenant owns; another tenant's session does not exist (404).
pub(crate) async fn owned(state: &AppState, tenant: &Tenant, id: &str) -> ApiResult<SessionInfo> {
    let info = lookup(state, tenant, id).await?;
    if info.status == runcell_engine::SessionStatus::Dead {
        return Err(ApiError::ended(format!(
            "session {id} is dead: its kernel ended (with a previous server process, or it could not be restarted); delete it and create another"
        )));
    }
    Ok(info)
}

/// A live session of the tenant, or a dead one the store remembers.
pub(crate) async fn lookup(state: &AppState, tenant: &Tenant, id: &str) -> ApiResult<SessionInfo> {
    // Live sessions are in memory (a map lookup, no I/O): no trip to the blocking pool.
    let live = state.engine.sessions().get(id).ok();
    if let Some(i) = live.filter(|i| i.owner == tenant.0) {
        return Ok(i);
    }
    let engine = state.engine.clone();
    let (owner, id2) = (tenant.0.clone(), id.to_owned());
    tokio::task::spawn_blocking(move || engine.sessions().find(&owner, &id2))
        .await
        .map_err(ApiError::internal)?
        .ok_or_else(|| ApiError::not_found(format!("session {id}")))
}
