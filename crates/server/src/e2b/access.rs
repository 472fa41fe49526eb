//! The check every data-plane request passes: the sandbox it names, and its token.

use std::sync::Arc;

use axum::http::HeaderMap;

use super::error::Refused;
use super::sandboxes::{end_extras, same_secret, Sandbox, CONTEXT_OF};
use crate::state::AppState;

/// The sandbox a data-plane request is for (`E2b-Sandbox-Id`), once its token checks out.
pub(crate) fn sandbox_of(state: &AppState, headers: &HeaderMap) -> Result<Arc<Sandbox>, Refused> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let id = header("e2b-sandbox-id")
        .ok_or(Refused::Unauthorized(
            "the E2b-Sandbox-Id header is required (the SDK sends it when E2B_SANDBOX_URL is set)",
        ))?
        .to_owned();
    let sandbox = match state.e2b.get(&id) {
        Some(s) => s,
        // Unknown to this process: a sandbox of the server before a restart is in the store
        // (read once, on this thread: a primary-key look-up).
        None => state
            .engine
            .sessions()
            .get(&id)
            .ok()
            .filter(|s| !s.metadata.contains_key(CONTEXT_OF))
            .and_then(|s| {
                state
                    .e2b
                    .get_or_load(&state.engine, &state.store, &id, &s.owner)
            })
            .ok_or_else(|| Refused::Gone(id.clone()))?,
    };
    let token = header("x-access-token").or_else(|| header("e2b-traffic-access-token"));
    match token {
        Some(t) if same_secret(t, &sandbox.token) => {}
        Some(_) => {
            return Err(Refused::Unauthorized(
                "invalid access token for this sandbox",
            ))
        }
        None => {
            return Err(Refused::Unauthorized(
                "the sandbox's access token is required (X-Access-Token)",
            ))
        }
    }
    let live = state.engine.sessions().get(&id);
    if live.is_err() || live.is_ok_and(|s| s.owner != sandbox.owner) {
        // Expired or deleted behind the registry's back: forget it, end what it left.
        if let Some(gone) = state.e2b.remove(&id) {
            let engine = state.engine.clone();
            tokio::task::spawn_blocking(move || end_extras(&engine, &gone));
        }
        return Err(Refused::Gone(id));
    }
    Ok(sandbox)
}
