//! Cells waiting for a person (`approval: "always"` on an agent endpoint, `pending.rs`):
//! listed by `GET /v1/approvals`, answered by `POST /v1/approvals/{id}` by a key of the same
//! tenant (another tenant's id is 404, whatever it is). Each decision is recorded in the audit
//! log by the agent loop, before the cell runs, with `decided_by` naming the key that answered.

use axum::extract::{Path, State};
use axum::Json;
use runcell_agent::Verdict;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::ApiJson;
use crate::pending::PendingApproval;
use crate::state::{AppState, Principal, Tenant};

#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalList {
    pub object: &'static str,
    pub data: Vec<PendingApproval>,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DecisionWord {
    Approve,
    Decline,
    Edit,
}

/// A decision on a pending cell.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalDecision {
    pub decision: DecisionWord,
    /// The code to run instead (`edit` only, and required there).
    #[serde(default)]
    pub code: Option<String>,
    /// Why it was declined, told to the model (`decline` only).
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApprovalAnswered {
    pub id: String,
    /// `approve`, `decline` or `edit`, as given.
    pub decision: &'static str,
}

#[utoipa::path(get, path = "/v1/approvals", tag = "approvals",
    responses((status = 200, body = ApprovalList, description = "the tenant's cells waiting for a decision, oldest first")))]
pub async fn list_approvals(State(state): State<AppState>, tenant: Tenant) -> Json<ApprovalList> {
    Json(ApprovalList {
        object: "list",
        data: state.approvals.of(&tenant.0),
    })
}

#[utoipa::path(post, path = "/v1/approvals/{id}", tag = "approvals",
    params(("id" = String, Path)),
    request_body = ApprovalDecision,
    responses(
        (status = 200, body = ApprovalAnswered, description = "the waiting cell got the decision"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: an unknown decision, `edit` without `code`"),
        (status = 404, body = ErrorBody, description = "no cell of this tenant waits under this id (answered, timed out, or never)")))]
pub async fn answer_approval(
    State(state): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ApprovalDecision>,
) -> ApiResult<Json<ApprovalAnswered>> {
    // Unknown first: a well-formed decision on no waiting cell is a 404 whatever it says.
    let missing = || ApiError::not_found(format!("approval {id}"));
    let tenant = &who.tenant;
    if !state.approvals.waits(&tenant.0, &id) {
        return Err(missing());
    }
    let (verdict, word) = match body.decision {
        DecisionWord::Approve => (Verdict::Run, "approve"),
        DecisionWord::Decline => (Verdict::Decline(body.reason), "decline"),
        DecisionWord::Edit => match body.code {
            Some(code) => (Verdict::Edit(code), "edit"),
            None => return Err(ApiError::invalid("`edit` needs the `code` to run")),
        },
    };
    if !state
        .approvals
        .answer(&tenant.0, &id, verdict, who.decided_by())
    {
        return Err(missing());
    }
    Ok(Json(ApprovalAnswered { id, decision: word }))
}
