//! Cells waiting for a person (`approval: "always"` on an agent endpoint): listed by
//! `GET /v1/approvals`, answered by `POST /v1/approvals/{id}`. The agent loop's thread waits
//! for the answer, at most [`WAIT`]; no answer by then declines the cell (the model is told).
//! Each decision is recorded in the audit log by the agent loop, before the cell runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::Json;
use chrono::{DateTime, Utc};
use runcell_agent::{Proposal, Verdict};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::ApiJson;
use crate::state::{AppState, Tenant};

/// How long a cell waits for its decision before it is declined.
pub const WAIT: Duration = Duration::from_secs(600);

/// A cell waiting for a decision.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PendingApproval {
    pub id: String,
    pub session_id: String,
    /// `python`, `bash` or `text_editor`.
    pub tool: String,
    /// The code (the command, or the text editor's arguments as JSON) the model proposed.
    pub code: String,
    pub created_at: DateTime<Utc>,
}

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

struct Waiting {
    tenant: String,
    pending: PendingApproval,
    answer: mpsc::Sender<Verdict>,
}

/// Every tenant's waiting cells.
#[derive(Default)]
pub struct Approvals {
    waiting: Mutex<HashMap<String, Waiting>>,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals").finish_non_exhaustive()
    }
}

impl Approvals {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Waiting>> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shows `p` as pending for `tenant`, calls `announce` with it, and blocks until it is
    /// answered, [`WAIT`] passes, or `stop` is set (both decline).
    pub fn wait(
        &self,
        tenant: &str,
        session: &str,
        p: &Proposal<'_>,
        stop: &AtomicBool,
        announce: &mut dyn FnMut(&PendingApproval),
    ) -> Verdict {
        let pending = PendingApproval {
            id: runcell_engine::new_id("apv"),
            session_id: session.to_owned(),
            tool: p.call.name.clone(),
            code: p.code.clone(),
            created_at: Utc::now(),
        };
        let (tx, rx) = mpsc::channel();
        self.lock().insert(
            pending.id.clone(),
            Waiting {
                tenant: tenant.to_owned(),
                pending: pending.clone(),
                answer: tx,
            },
        );
        announce(&pending);
        let until = Instant::now() + WAIT;
        let verdict = loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Verdict::Decline(Some(format!("no decision within {} s", WAIT.as_secs())));
            }
            match rx.recv_timeout(left.min(Duration::from_millis(500))) {
                Ok(v) => break v,
                Err(mpsc::RecvTimeoutError::Timeout) if stop.load(Ordering::SeqCst) => {
                    break Verdict::Decline(Some("the client went away".into()))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break Verdict::Decline(Some("the approval was withdrawn".into()))
                }
            }
        };
        self.lock().remove(&pending.id);
        verdict
    }

    fn of(&self, tenant: &str) -> Vec<PendingApproval> {
        let mut out: Vec<PendingApproval> = self
            .lock()
            .values()
            .filter(|w| w.tenant == tenant)
            .map(|w| w.pending.clone())
            .collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        out
    }

    /// Whether the cell `id` of `tenant` waits.
    fn waits(&self, tenant: &str, id: &str) -> bool {
        self.lock().get(id).is_some_and(|w| w.tenant == tenant)
    }

    /// Hands `verdict` to the waiting cell `id` of `tenant`; `false` if there is none.
    fn answer(&self, tenant: &str, id: &str, verdict: Verdict) -> bool {
        let mut waiting = self.lock();
        if waiting.get(id).is_none_or(|w| w.tenant != tenant) {
            // Another tenant's is left untouched, and nothing is said of it.
            return false;
        }
        waiting
            .remove(id)
            .is_some_and(|w| w.answer.send(verdict).is_ok())
    }
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
    tenant: Tenant,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ApprovalDecision>,
) -> ApiResult<Json<ApprovalAnswered>> {
    // Unknown first: a well-formed decision on no waiting cell is a 404 whatever it says.
    let missing = || ApiError::not_found(format!("approval {id}"));
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
    if !state.approvals.answer(&tenant.0, &id, verdict) {
        return Err(missing());
    }
    Ok(Json(ApprovalAnswered { id, decision: word }))
}

/// The gate an agent endpoint's loop asks when its request said `approval: "always"`.
pub(crate) fn gate_for(
    approvals: Arc<Approvals>,
    tenant: String,
    session: String,
    stop: Arc<AtomicBool>,
    mut announce: impl FnMut(&PendingApproval),
) -> impl FnMut(&Proposal<'_>) -> Verdict {
    move |p| approvals.wait(&tenant, &session, p, &stop, &mut announce)
}
