//! The registry of agent loops' cells waiting for a person (`approval: "always"`: the chat and
//! the vendor endpoints): the loop's thread registers its cell and waits for the answer, at
//! most [`WAIT`]; no answer by then, or a client gone, declines the cell (the model is told,
//! and the audit log says `runcell` decided). `approvals.rs` serves it over HTTP.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use runcell_agent::{Answer, Proposal, Verdict};
use serde::Serialize;
use utoipa::ToSchema;

/// How long a cell waits for its decision before it is declined.
pub const WAIT: Duration = Duration::from_secs(600);

/// A cell waiting for a decision.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PendingApproval {
    pub id: String,
    pub session_id: String,
    /// Where the loop runs: `chat`, `anthropic`, `openai`, `gemini` or `mistral`.
    pub source: String,
    /// The tool as the model called it: `python`, `bash` or `text_editor` (the chat);
    /// `code_execution`, `bash_code_execution` or `text_editor_code_execution` (`/anthropic`);
    /// `python` (`/openai`, `/gemini`, `/mistral`).
    pub tool: String,
    /// The code (the command, or the text editor's arguments as JSON) the model proposed.
    pub code: String,
    pub created_at: DateTime<Utc>,
}

struct Waiting {
    tenant: String,
    pending: PendingApproval,
    answer: mpsc::Sender<Answer>,
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
    /// answered, [`WAIT`] passes, or `stop` is set (both decline, decided by `runcell`).
    pub(crate) fn wait(
        &self,
        place: &Place,
        p: &Proposal<'_>,
        stop: &AtomicBool,
        announce: &mut dyn FnMut(&PendingApproval),
    ) -> Answer {
        let tenant = place.tenant.as_str();
        let pending = PendingApproval {
            id: runcell_engine::new_id("apv"),
            session_id: place.session.clone(),
            source: place.source.to_owned(),
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
        // Declined by no one who answered: the audit log names runcell itself.
        let by_runcell = |why: String| Answer {
            verdict: Verdict::Decline(Some(why)),
            by: Some(DECIDED_BY_RUNCELL.to_owned()),
        };
        let answer = loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break by_runcell(format!("no decision within {} s", WAIT.as_secs()));
            }
            match rx.recv_timeout(left.min(Duration::from_millis(500))) {
                Ok(a) => break a,
                Err(mpsc::RecvTimeoutError::Timeout) if stop.load(Ordering::SeqCst) => {
                    break by_runcell("the client went away".into())
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break by_runcell("the approval was withdrawn".into())
                }
            }
        };
        self.lock().remove(&pending.id);
        answer
    }

    pub(crate) fn of(&self, tenant: &str) -> Vec<PendingApproval> {
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
    pub(crate) fn waits(&self, tenant: &str, id: &str) -> bool {
        self.lock().get(id).is_some_and(|w| w.tenant == tenant)
    }

    /// Hands `verdict`, given `by` (the audit log's `decided_by`), to the waiting cell `id`
    /// of `tenant`; `false` if there is none.
    pub(crate) fn answer(&self, tenant: &str, id: &str, verdict: Verdict, by: String) -> bool {
        let mut waiting = self.lock();
        if waiting.get(id).is_none_or(|w| w.tenant != tenant) {
            // Another tenant's is left untouched, and nothing is said of it.
            return false;
        }
        waiting.remove(id).is_some_and(|w| {
            w.answer
                .send(Answer {
                    verdict,
                    by: Some(by),
                })
                .is_ok()
        })
    }
}

/// `decided_by` of a cell declined because nobody answered in time, or the client went away.
pub const DECIDED_BY_RUNCELL: &str = "runcell";

/// Where a waiting cell is: whose, which session, which endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub tenant: String,
    pub session: String,
    pub source: &'static str,
}

/// The gate an agent endpoint's loop asks when its request said `approval: "always"`.
pub(crate) fn gate_for(
    approvals: Arc<Approvals>,
    place: Place,
    stop: Arc<AtomicBool>,
    mut announce: impl FnMut(&PendingApproval),
) -> impl FnMut(&Proposal<'_>) -> Answer {
    move |p| approvals.wait(&place, p, &stop, &mut announce)
}
