//! A person's decision on a cell before it ran (approved, edited, declined), recorded in the
//! owner's audit chain next to the executions, so the log says who let what run.
//!
//! A decision is one chain row of its own (id `apr_…`, status the decision word, `code` the
//! code that was proposed); its JSON says who decided, the code that ran instead when it was
//! edited, and the reason given when declined. Listing executions skips these rows; the chain
//! covers them like any other, so `runcell audit verify` checks them too.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use runcell_store::NewExecution;

use crate::error::RecordError;
use crate::records::{self, store_error};
use crate::{new_ordered_id, Engine, EngineError};

/// What a person decided about a proposed cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Approved,
    Edited,
    Declined,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approved => "approved",
            Decision::Edited => "edited",
            Decision::Declined => "declined",
        }
    }
}

/// One decision, as the audit log keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub id: String,
    pub object: String,
    pub session_id: Option<String>,
    pub decision: Decision,
    /// Who decided: `cli:<user>`, `api:<tenant>`, ...
    pub decided_by: String,
    /// The tool the model called (`python`, `bash`, `text_editor`).
    pub tool: String,
    /// The code the model proposed.
    pub proposed_code: String,
    /// The code that ran instead (edited only).
    pub edited_code: Option<String>,
    /// Why it was declined, if a reason was given.
    pub reason: Option<String>,
    #[serde(serialize_with = "crate::model::rfc3339")]
    pub decided_at: DateTime<Utc>,
}

impl ApprovalRecord {
    pub fn new(
        session_id: Option<String>,
        decision: Decision,
        decided_by: impl Into<String>,
        tool: impl Into<String>,
        proposed_code: impl Into<String>,
    ) -> ApprovalRecord {
        ApprovalRecord {
            id: new_ordered_id("apr"),
            object: "approval".into(),
            session_id,
            decision,
            decided_by: decided_by.into(),
            tool: tool.into(),
            proposed_code: proposed_code.into(),
            edited_code: None,
            reason: None,
            decided_at: Utc::now(),
        }
    }
}

impl Engine {
    /// Records `decision` in `owner`'s audit chain before the cell runs (or instead of it). An
    /// engine without a store records nothing.
    pub fn record_approval(
        &self,
        owner: &str,
        decision: &ApprovalRecord,
    ) -> Result<(), EngineError> {
        let Some(records) = &self.core.records else {
            return Ok(());
        };
        let rec = new_approval(owner, decision)?;
        records
            .store()
            .append_execution(&rec)
            .map_err(store_error)?;
        Ok(())
    }
}

/// The store's record of a decision on a cell (`approval.rs`).
fn new_approval(owner: &str, decision: &ApprovalRecord) -> Result<NewExecution, EngineError> {
    let json = serde_json::to_string(decision).map_err(RecordError::store)?;
    Ok(NewExecution {
        tenant: records::tenant(owner).to_owned(),
        execution_id: decision.id.clone(),
        session_id: decision.session_id.clone(),
        status: decision.decision.as_str().to_owned(),
        code: decision.proposed_code.clone(),
        execution_json: json,
        created_at: decision.decided_at,
    })
}
