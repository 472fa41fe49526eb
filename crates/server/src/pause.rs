//! `/v1/sessions/{id}/pause`, `/resume` and `/fork` (durable sessions, docs/api.md "Pause,
//! resume and fork").

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use runcell_engine::{Restored, SessionInfo};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiResult, ErrorBody};
use crate::extract::Path;
use crate::sessions::{blocking, owned};
use crate::state::{AppState, Principal, Tenant};

/// A Session, and what came back of its variables.
#[derive(Debug, Serialize, ToSchema)]
pub struct RestoredSession {
    #[serde(flatten)]
    pub session: SessionInfo,
    /// What the resume (or fork) restored; `null` when nothing was paused (a resume of a
    /// live session).
    pub restored: Option<Restored>,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/pause", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionInfo, description = "the session, `paused`: its variables in a snapshot on disk, its sandbox and memory freed (pausing a paused session changes nothing)"),
        (status = 404, body = ErrorBody, description = "no such session of this tenant"),
        (status = 409, body = ErrorBody, description = "`session_busy`: an execution runs or waits (a pause never waits for it; retry when idle), or the session is dead; `conflict`: the kernel could not write its snapshot (the session keeps running)"),
        (status = 507, body = ErrorBody, description = "`insufficient_storage`: the snapshot found no room in the workspace or the data dir; the session keeps running")))]
pub async fn pause_session(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<SessionInfo>> {
    owned(&state, &tenant, &id).await?;
    let engine = state.engine.clone();
    Ok(Json(blocking(move || engine.sessions().pause(&id)).await?))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/resume", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 200, body = RestoredSession, description = "the session, ready, with `restored`: the names brought back, those skipped and why, or `files_only` saying why only the files came back"),
        (status = 404, body = ErrorBody, description = "no such session of this tenant"),
        (status = 409, body = ErrorBody, description = "the session is dead, or `conflict`: its runtime was removed from this server"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed; see `Retry-After`")))]
pub async fn resume_session(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<RestoredSession>> {
    owned(&state, &tenant, &id).await?;
    let engine = state.engine.clone();
    let (session, restored) = blocking(move || engine.sessions().resume(&id)).await?;
    Ok(Json(RestoredSession { session, restored }))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/fork", tag = "sessions",
    params(("id" = String, Path)),
    responses((status = 201, body = RestoredSession, description = "a new session with a copy of the workspace's files and of the variables (`restored` says which); independent of the source afterwards"),
        (status = 404, body = ErrorBody, description = "no such session of this tenant"),
        (status = 409, body = ErrorBody, description = "`session_busy`: an execution runs or waits in the source; retry when idle"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed; see `Retry-After`"),
        (status = 507, body = ErrorBody, description = "`insufficient_storage`: no room for the snapshot")))]
pub async fn fork_session(
    State(state): State<AppState>,
    principal: Principal,
    Path(id): Path<String>,
) -> ApiResult<(StatusCode, Json<RestoredSession>)> {
    let source = owned(&state, &principal.tenant, &id).await?;
    // The fork gets the source's network: a new session asking for that policy, with this key.
    crate::caller::within_key(principal.key.as_ref(), &source.network)?;
    let engine = state.engine.clone();
    let (session, restored) = blocking(move || engine.sessions().fork(&id)).await?;
    Ok((
        StatusCode::CREATED,
        Json(RestoredSession {
            session,
            restored: Some(restored),
        }),
    ))
}
