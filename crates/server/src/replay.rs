//! `POST /v1/sessions/{id}/replay`: the engine's replay (a recorded session's cells re-run in a
//! fresh sandbox and compared with the audit log), for the caller's tenant.

use axum::extract::{Path, State};
use axum::Json;
use runcell_engine::ReplayReport;

use crate::error::{ApiResult, ErrorBody};
use crate::sessions::blocking;
use crate::state::{AppState, Tenant};

#[utoipa::path(post, path = "/v1/sessions/{id}/replay", tag = "sessions",
    params(("id" = String, Path)),
    responses(
        (status = 200, body = ReplayReport, description = "each recorded cell re-run in order in a fresh session, with the session's uploads restored from its live workspace where their content still has the recorded SHA-256; per cell whether stdout, the main result, the error and the files match, diffs where they do not, and the known sources of difference found in the code"),
        (status = 404, body = ErrorBody, description = "this tenant has no such session (one that ran nothing replays as an empty report)"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed; see `Retry-After`")))]
pub async fn replay_session(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<ReplayReport>> {
    let engine = state.engine.clone();
    let report = blocking(move || engine.replay(&tenant.0, &id, &[])).await?;
    Ok(Json(report))
}
