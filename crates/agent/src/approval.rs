//! Control points: a person sees each tool call before it runs and runs it, edits it or
//! declines it (`runcell ask --approve`, the chat page, `POST /v1/approvals/{id}`). Every
//! decision goes to the audit log before the cell runs; a declined cell tells the model why,
//! in words it can act on.

use runcell_engine::tools::ToolCall;
use runcell_engine::{ApprovalRecord, Decision, Engine, EngineError};
use serde_json::Value;

use crate::ToolUse;

/// A tool call waiting for a decision.
#[derive(Debug, Clone)]
pub struct Proposal<'a> {
    pub step: usize,
    pub call: &'a ToolUse,
    /// What is shown and edited: the python code, the bash command, or the text editor's
    /// arguments as pretty JSON.
    pub code: String,
}

/// A person's answer to a [`Proposal`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Run,
    /// Run this instead (same form as [`Proposal::code`]).
    Edit(String),
    /// Do not run it; the reason, if one was given, goes to the model.
    Decline(Option<String>),
}

/// A [`Verdict`] and who gave it, when that is not the gate's own `by` (over HTTP, the key
/// that answered; `runcell` itself for a timeout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub verdict: Verdict,
    pub by: Option<String>,
}

impl From<Verdict> for Answer {
    fn from(verdict: Verdict) -> Answer {
        Answer { verdict, by: None }
    }
}

/// Who decides, and how.
pub struct Gate<'a> {
    /// Recorded as `decided_by` in the audit log (e.g. `cli:alice`, `api:tenant`) unless the
    /// answer names someone else.
    pub by: String,
    pub decide: &'a mut dyn FnMut(&Proposal<'_>) -> Answer,
}

/// What a recorded decision lets happen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ruling {
    /// Run the call as proposed (also an "edit" that changed nothing).
    Run,
    /// Run this instead (same form as [`Proposal::code`]).
    Edited(String),
    /// Do not run it; the model is told [`declined_text`] of the reason.
    Declined(Option<String>),
}

/// Asks `gate` about `call` (whose reviewable form is `code`), and records the decision in
/// `owner`'s audit log, before anything runs, as a decision on `session`'s tool `tool` (the
/// name the model called it by). Shared by the agent loop and the vendor endpoints' loops.
pub fn rule(
    engine: &Engine,
    owner: &str,
    session: &str,
    p: &Proposal<'_>,
    gate: &mut Gate<'_>,
) -> Result<Ruling, EngineError> {
    let answer = (gate.decide)(p);
    let decision = match &answer.verdict {
        Verdict::Run => Decision::Approved,
        Verdict::Edit(c) if *c == p.code => Decision::Approved,
        Verdict::Edit(_) => Decision::Edited,
        Verdict::Decline(_) => Decision::Declined,
    };
    let mut rec = ApprovalRecord::new(
        Some(session.to_owned()),
        decision,
        answer.by.unwrap_or_else(|| gate.by.clone()),
        p.call.name.clone(),
        p.code.clone(),
    );
    let ruling = match answer.verdict {
        Verdict::Edit(c) if decision == Decision::Edited => {
            rec.edited_code = Some(c.clone());
            Ruling::Edited(c)
        }
        Verdict::Decline(r) => {
            rec.reason = r.clone();
            Ruling::Declined(r)
        }
        _ => Ruling::Run,
    };
    engine.record_approval(owner, &rec)?;
    Ok(ruling)
}

impl std::fmt::Debug for Gate<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("by", &self.by).finish()
    }
}

/// The text a person reviews for `call`.
pub fn proposal_text(call: &ToolUse) -> String {
    match ToolCall::parse(&call.name, call.input.clone()) {
        Ok(ToolCall::Python(i)) => i.code,
        Ok(ToolCall::Bash(i)) => i.command,
        _ => serde_json::to_string_pretty(&call.input).unwrap_or_else(|_| call.arguments.clone()),
    }
}

/// `call` with its code replaced by `code` (the form of [`proposal_text`]); `Err` when edited
/// text editor arguments are not a JSON object.
pub fn edited_call(call: &ToolUse, code: &str) -> Result<ToolUse, String> {
    let mut out = call.clone();
    match call.name.as_str() {
        "python" | "bash" => {
            let key = if call.name == "python" {
                "code"
            } else {
                "command"
            };
            let mut input = match &call.input {
                Value::Object(m) => m.clone(),
                _ => serde_json::Map::new(),
            };
            input.insert(key.into(), Value::String(code.to_owned()));
            out.input = Value::Object(input);
        }
        _ => {
            let v: Value = serde_json::from_str(code)
                .map_err(|e| format!("the edited arguments are not JSON: {e}"))?;
            if !v.is_object() {
                return Err("the edited arguments are not a JSON object".into());
            }
            out.input = v;
        }
    }
    out.arguments = out.input.to_string();
    Ok(out)
}

/// What the model is told of a declined call.
pub fn declined_text(reason: Option<&str>) -> String {
    match reason.map(str::trim).filter(|r| !r.is_empty()) {
        Some(r) => format!("the user declined to run this code: {r}"),
        None => "the user declined to run this code: no reason given".into(),
    }
}

/// What the model is told before the output of a call the user edited.
pub fn edited_note(code: &str) -> String {
    format!("the user edited the code before it ran; this is what ran:\n{code}\n--- output ---\n")
}
