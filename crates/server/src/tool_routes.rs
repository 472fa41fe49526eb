//! The HTTP routes by which a client answers its tools' calls (`tool_results`, `continue`);
//! what they answer, the calls waiting per session and execution, is in `tool_calls.rs`,
//! which the application state holds — so these handlers live apart from it.

use std::collections::HashSet;

use axum::extract::State;
use axum::Json;
use runcell_engine::{Execution, ExecutionStatus};

use crate::error::{ApiError, ApiResult, ErrorBody, ErrorCode};
use crate::extract::{ApiJson, Path};
use crate::state::{AppState, Tenant};
use crate::tool_calls::{
    check_answer, not_pending, ContinueRequest, ToolResult, ToolResultAccepted,
};

#[utoipa::path(post, path = "/v1/sessions/{id}/tool_results", tag = "sessions",
    params(("id" = String, Path)),
    request_body = ToolResult,
    responses(
        (status = 200, body = ToolResultAccepted, description = "the call is answered: its code goes on with the output, or raises the error"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: not exactly one of `output` and `error`"),
        (status = 404, body = ErrorBody, description = "no such session of this tenant, or no such call of this session waiting for an answer (answered, timed out, ended, another session's, or never made)"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: an output or error over 1 MiB as JSON")))]
pub async fn tool_results(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ToolResult>,
) -> ApiResult<Json<ToolResultAccepted>> {
    crate::owned::owned(&state, &tenant, &id).await?;
    state.tool_calls.answer(&tenant.0, &id, None, &req)?;
    Ok(Json(ToolResultAccepted {
        id: req.id,
        status: "answered",
    }))
}

#[utoipa::path(post, path = "/v1/executions/{id}/continue", tag = "executions",
    params(("id" = String, Path)),
    request_body = ContinueRequest,
    responses(
        (status = 200, body = Execution, description = "the execution once the answers are in: finished, or `waiting` again with the calls it made since"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: a result without exactly one of `output` and `error`, or an id given twice"),
        (status = 404, body = ErrorBody, description = "no execution of this tenant waits for tool results under that id, or a result's id is not a pending call of it (nothing is answered then)"),
        (status = 409, body = ErrorBody, description = "`conflict`: another `continue` is waiting on this execution"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: an output or error over 1 MiB as JSON")))]
pub async fn continue_execution(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ContinueRequest>,
) -> ApiResult<Json<Execution>> {
    let run = state
        .tool_calls
        .runs()
        .get(&id)
        .filter(|r| r.owner == tenant.0)
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "execution {id} (no execution of this tenant is waiting for tool results under that id)"
            ))
        })?;
    // Every answer is checked before any is given: a bad one changes nothing.
    let mut seen = HashSet::new();
    for r in &req.results {
        let _answer = check_answer(r)?;
        if !seen.insert(r.id.as_str()) {
            return Err(ApiError::invalid(format!(
                "tool call {} is answered twice",
                r.id
            )));
        }
        if !state
            .tool_calls
            .is_pending(&tenant.0, &run.session_id, Some(&id), &r.id)
        {
            return Err(not_pending(&r.id));
        }
    }
    let Some(_attending) = run.attend() else {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("another continue is waiting on execution {id}"),
        ));
    };
    for r in &req.results {
        // One that timed out since it was checked is moot: its code has its exception.
        let _ = state
            .tool_calls
            .answer(&tenant.0, &run.session_id, Some(&id), r);
    }
    let execution = run.next().await?;
    if execution.status != ExecutionStatus::Waiting {
        state.metrics.observe_execution(&execution);
    }
    Ok(Json(execution))
}
