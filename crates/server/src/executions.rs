//! `/v1/executions` and `/v1/audit/verify`: the tenant's recorded executions and the state of
//! its hash chain.

use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{ApiQuery, Path};
use crate::sessions::blocking;
use crate::state::{AppState, Tenant};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only this session's executions.
    pub session_id: Option<String>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
    /// The `next` cursor of the previous page.
    pub before: Option<String>,
}

/// An Execution (as returned by execute) plus the `code` that ran.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecutionList {
    #[schema(value_type = Vec<Object>)]
    pub executions: Vec<serde_json::Value>,
    /// Pass as `before` for the next (older) page; null on the last page.
    pub next: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct VerifyResult {
    pub ok: bool,
    pub checked: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_broken: Option<FirstBroken>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FirstBroken {
    pub execution_id: String,
    pub reason: String,
}

#[utoipa::path(get, path = "/v1/executions", tag = "executions",
    params(ListQuery),
    responses((status = 200, body = ExecutionList, description = "the tenant's executions, newest first"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: a `limit` out of range or an unknown parameter"),
        (status = 404, body = ErrorBody, description = "the `before` cursor names no execution of this tenant")))]
pub async fn list_executions(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<ExecutionList>> {
    let limit = q.limit.unwrap_or(50);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::invalid("limit must be between 1 and 1000"));
    }
    let engine = state.engine.clone();
    let page = blocking(move || {
        engine.executions(
            &tenant.0,
            q.session_id.as_deref(),
            limit,
            q.before.as_deref(),
        )
    })
    .await?;
    Ok(Json(ExecutionList {
        executions: page.executions,
        next: page.next,
    }))
}

#[utoipa::path(get, path = "/v1/executions/{id}", tag = "executions",
    params(("id" = String, Path)),
    responses((status = 200, body = Object, description = "an Execution plus its code"),
        (status = 404, body = ErrorBody, description = "no execution of this tenant has this id")))]
pub async fn get_execution(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let engine = state.engine.clone();
    let id2 = id.clone();
    let execution = blocking(move || engine.execution(&tenant.0, &id2)).await?;
    execution
        .map(Json)
        .ok_or_else(|| ApiError::not_found(format!("execution {id}")))
}

#[utoipa::path(get, path = "/v1/audit/verify", tag = "executions",
    responses((status = 200, body = VerifyResult, description = "whether the tenant's hash chain is intact, and where it breaks")))]
pub async fn verify(
    State(state): State<AppState>,
    tenant: Tenant,
) -> ApiResult<Json<VerifyResult>> {
    let engine = state.engine.clone();
    let report = blocking(move || engine.verify_audit(&tenant.0)).await?;
    Ok(Json(VerifyResult {
        ok: report.ok,
        checked: report.checked,
        first_broken: report.first_broken.map(|b| FirstBroken {
            execution_id: b.execution_id,
            reason: b.reason,
        }),
    }))
}
