//! The loop behind the vendors whose code tool is one Python interpreter (Gemini's
//! `code_execution`, Mistral's `code_interpreter`): the operator's model is offered `python`;
//! each call runs in the conversation's session with a deadline; its output goes back to the
//! model; until the model answers without code, `max_steps` replies, or the failed runs allowed
//! are spent (the model is then asked to answer without code). What happened is reported as
//! [`Event`]s, which each vendor renders in its own shapes and keeps to continue the
//! conversation later. Blocking: call it from a blocking thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runcell_agent::{
    AgentError, Client, ModelReply, ProviderConfig, Ruling, ToolReply, ToolSpec, ToolUse, Turn,
};
use runcell_engine::tools::execution_output;
use runcell_engine::{CancelToken, Engine, EngineError, Execution, ExecutionStatus};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The tool's name, as the model is offered it.
pub(crate) const PYTHON: &str = "python";

/// How a code run ended, in Gemini's words (Mistral reports the output only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    Ok,
    Failed,
    DeadlineExceeded,
}

impl Outcome {
    pub(crate) fn gemini(self) -> &'static str {
        match self {
            Outcome::Ok => "OUTCOME_OK",
            Outcome::Failed => "OUTCOME_FAILED",
            Outcome::DeadlineExceeded => "OUTCOME_DEADLINE_EXCEEDED",
        }
    }
}

/// A PNG a run showed, base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Image {
    pub mime: String,
    pub data: String,
}

/// One thing that happened in a turn, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Event {
    /// The model's text.
    Text { text: String },
    /// Code the model ran.
    Code { id: String, code: String },
    /// What it gave: `output` for the client (stdout, the last value, stderr, the
    /// traceback), `model_text` as the model read it (kept, so that a continued conversation
    /// shows it the same), and the figures (not kept).
    Result {
        id: String,
        outcome: Outcome,
        output: String,
        model_text: String,
        #[serde(default, skip_serializing)]
        images: Vec<Image>,
    },
}

/// How a run ended.
#[derive(Debug, Default)]
pub(crate) struct End {
    /// The model answered (rather than running out of steps).
    pub complete: bool,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Why a run stopped before its end.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoopError {
    #[error("the model provider failed")]
    Upstream(#[source] AgentError),
    #[error("the session failed")]
    Engine(#[source] EngineError),
    #[error("the client went away")]
    Stopped,
}

/// One turn of a conversation.
pub(crate) struct CodeLoop {
    pub engine: Engine,
    /// The conversation's session; `None` when the request offers no code tool.
    pub session: Option<String>,
    pub provider: ProviderConfig,
    pub system: String,
    pub max_steps: usize,
    /// Each run's deadline (Gemini: 30 s).
    pub timeout: Duration,
    /// Failed runs the model may follow with another before it must answer (Gemini: 5).
    pub retries: usize,
    pub stop: Arc<AtomicBool>,
    pub cancel: CancelToken,
    /// With approval `always`: who decides on each cell.
    pub approver: Option<super::approval::Approver>,
}

pub(crate) fn python_tool() -> ToolSpec {
    ToolSpec {
        name: PYTHON.into(),
        description: "Run Python code in a stateful interpreter: variables persist between calls. Returns stdout, stderr, the last expression's value and any matplotlib figures.".into(),
        input_schema: json!({
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The Python code to run."}},
            "required": ["code"],
        }),
    }
}

/// What the model is told about the sandbox.
pub(crate) fn sandbox_prompt(timeout: Duration) -> String {
    format!(
        "You can run Python with the python tool: a stateful interpreter (variables persist \
between calls, within this conversation), {} s per run, numpy, pandas, matplotlib and the usual \
data-science packages installed, no network access. Compute rather than guess, show figures \
with matplotlib, and give the computed numbers in your answer.",
        timeout.as_secs()
    )
}

/// The client's view of a run: stdout, the last expression's value, stderr, the error.
pub(crate) fn output_of(e: &Execution) -> String {
    let mut out = e.stdout.clone();
    for r in e.results.iter().filter(|r| r.is_main_result) {
        if let Some(t) = r.data.get("text/plain") {
            out.push_str(t);
            out.push('\n');
        }
    }
    out.push_str(&e.stderr);
    if let Some(x) = &e.error {
        out.push_str(if x.traceback.trim().is_empty() {
            &x.value
        } else {
            &x.traceback
        });
    }
    out
}

/// The transcript the events of earlier turns are, after each turn's user text.
pub(crate) fn turns_of(events: &[Event]) -> Vec<Turn> {
    let mut turns = Vec::new();
    for e in events {
        match e {
            Event::Text { text } => turns.push(Turn::Assistant(ModelReply {
                text: text.clone(),
                calls: Vec::new(),
                raw: Value::Null,
            })),
            Event::Code { id, code } => turns.push(Turn::Assistant(ModelReply {
                text: String::new(),
                calls: vec![call(id, code)],
                raw: Value::Null,
            })),
            Event::Result {
                id,
                model_text,
                outcome,
                ..
            } => turns.push(Turn::Tools(vec![ToolReply {
                id: id.clone(),
                name: PYTHON.into(),
                text: model_text.clone(),
                images: Vec::new(),
                is_error: *outcome != Outcome::Ok,
            }])),
        }
    }
    merge(turns)
}

fn call(id: &str, code: &str) -> ToolUse {
    let input = json!({"code": code});
    ToolUse {
        id: id.to_owned(),
        name: PYTHON.into(),
        arguments: input.to_string(),
        input,
        bad_arguments: None,
    }
}

/// A reply's text and calls go together, and so do the calls' results.
pub(crate) fn merge(turns: Vec<Turn>) -> Vec<Turn> {
    let mut merged: Vec<Turn> = Vec::new();
    for t in turns {
        match (merged.last_mut(), t) {
            (Some(Turn::Tools(prev)), Turn::Tools(more)) => prev.extend(more),
            (Some(Turn::Assistant(prev)), Turn::Assistant(next))
                if prev.calls.is_empty() || next.text.is_empty() =>
            {
                if !next.text.is_empty() {
                    if !prev.text.is_empty() {
                        prev.text.push('\n');
                    }
                    prev.text.push_str(&next.text);
                }
                prev.calls.extend(next.calls)
            }
            (_, t) => merged.push(t),
        }
    }
    merged
}

impl CodeLoop {
    /// Runs the turn after `turns` (whose last is the user's).
    pub(crate) fn run(
        &self,
        mut turns: Vec<Turn>,
        sink: &mut dyn FnMut(Event),
    ) -> Result<End, LoopError> {
        let client = Client::new(self.provider.clone()).map_err(LoopError::Upstream)?;
        let tools = if self.session.is_some() {
            vec![python_tool()]
        } else {
            Vec::new()
        };
        let mut system = self.system.clone();
        if self.session.is_some() {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(&sandbox_prompt(self.timeout));
        }
        let mut end = End::default();
        let mut failures = 0;
        for step in 1..=self.max_steps.max(1) {
            if self.stop.load(Ordering::SeqCst) {
                return Err(LoopError::Stopped);
            }
            // The failed runs allowed are spent: the model answers with what it has.
            let offered: &[ToolSpec] = if failures > self.retries { &[] } else { &tools };
            let (reply, meta) = client
                .complete_with(&system, &turns, offered)
                .map_err(LoopError::Upstream)?;
            end.input_tokens += meta.input_tokens;
            end.output_tokens += meta.output_tokens;
            if !reply.text.is_empty() {
                sink(Event::Text {
                    text: reply.text.clone(),
                });
            }
            if reply.calls.is_empty() {
                end.complete = true;
                return Ok(end);
            }
            let mut replies = Vec::new();
            for c in &reply.calls {
                let (r, declined) = self.python(step, c, sink)?;
                // A declined cell is the person's choice, not the model's failure.
                if r.is_error && !declined {
                    failures += 1;
                } else {
                    failures = 0;
                }
                replies.push(r);
            }
            if failures > self.retries {
                if let Some(last) = replies.last_mut() {
                    last.text.push_str(&format!(
                        "\n\n{} runs in a row failed: no more code can run in this turn; answer with what you have.",
                        failures
                    ));
                }
            }
            turns.push(Turn::Assistant(reply));
            turns.push(Turn::Tools(replies));
        }
        Ok(end)
    }

    /// One call: run when it is a python call with code (and, with an approver, a person
    /// let it: the events then show the code that ran), else the model is told why not. The
    /// bool says the call was declined.
    fn python(
        &self,
        step: usize,
        c: &ToolUse,
        sink: &mut dyn FnMut(Event),
    ) -> Result<(ToolReply, bool), LoopError> {
        let mut reply = ToolReply {
            id: c.id.clone(),
            name: c.name.clone(),
            text: String::new(),
            images: Vec::new(),
            is_error: true,
        };
        let code = c.input.get("code").and_then(Value::as_str);
        let (Some(session), true, Some(code)) = (self.session.as_deref(), c.name == PYTHON, code)
        else {
            reply.text = match (&c.bad_arguments, c.name == PYTHON) {
                (Some(why), _) => format!("error: {why}"),
                (None, true) => "error: the python tool needs a `code` string".into(),
                (None, false) => format!("error: there is no tool named {:?}", c.name),
            };
            return Ok((reply, false));
        };
        let mut note = None;
        let edited;
        let code = match &self.approver {
            None => code,
            Some(a) => match a
                .rule(step, c, code.to_owned())
                .map_err(LoopError::Engine)?
            {
                Ruling::Run => code,
                Ruling::Edited(e) => {
                    note = Some(runcell_agent::approval::edited_note(&e));
                    edited = e;
                    edited.as_str()
                }
                Ruling::Declined(reason) => {
                    reply.text = runcell_agent::approval::declined_text(reason.as_deref());
                    sink(Event::Code {
                        id: c.id.clone(),
                        code: code.to_owned(),
                    });
                    sink(Event::Result {
                        id: c.id.clone(),
                        outcome: Outcome::Failed,
                        output: reply.text.clone(),
                        model_text: reply.text.clone(),
                        images: Vec::new(),
                    });
                    return Ok((reply, true));
                }
            },
        };
        sink(Event::Code {
            id: c.id.clone(),
            code: code.to_owned(),
        });
        let (outcome, output, images) = match self.engine.sessions().execute_cancellable(
            session,
            code,
            Some(self.timeout),
            None,
            self.cancel.clone(),
        ) {
            Ok(e) => {
                let out = execution_output(&e);
                reply.text = out.text.clone();
                reply.images = out.images.clone();
                reply.is_error = out.is_error;
                let outcome = match e.status {
                    ExecutionStatus::Ok => Outcome::Ok,
                    ExecutionStatus::Timeout => Outcome::DeadlineExceeded,
                    _ => Outcome::Failed,
                };
                let images = out
                    .images
                    .iter()
                    .map(|i| Image {
                        mime: i.mime.clone(),
                        data: i.data_base64.clone(),
                    })
                    .collect();
                (outcome, output_of(&e), images)
            }
            // The model's to fix: it is told.
            Err(
                e @ (EngineError::PayloadTooLarge(_)
                | EngineError::InvalidRequest(_)
                | EngineError::SessionBusy(_)),
            ) => {
                let why = runcell_engine::error_chain(&e);
                reply.text = format!("error: {why}");
                (Outcome::Failed, why, Vec::new())
            }
            Err(e) => return Err(LoopError::Engine(e)),
        };
        if reply.text.trim().is_empty() {
            reply.text = "(no output)".into();
        }
        if let Some(note) = note {
            reply.text = format!("{note}{}", reply.text);
        }
        sink(Event::Result {
            id: c.id.clone(),
            outcome,
            output,
            model_text: reply.text.clone(),
            images,
        });
        Ok((reply, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_events_become_the_transcript_with_calls_beside_their_text() {
        let events = vec![
            Event::Text {
                text: "Let me compute.".into(),
            },
            Event::Code {
                id: "c1".into(),
                code: "print(55)".into(),
            },
            Event::Result {
                id: "c1".into(),
                outcome: Outcome::Ok,
                output: "55\n".into(),
                model_text: "stdout:\n55".into(),
                images: Vec::new(),
            },
            Event::Text { text: "55".into() },
        ];
        let turns = turns_of(&events);
        assert_eq!(turns.len(), 3, "{turns:#?}");
        assert!(
            matches!(&turns[0], Turn::Assistant(r) if r.text == "Let me compute." && r.calls[0].input["code"] == "print(55)")
        );
        assert!(
            matches!(&turns[1], Turn::Tools(r) if r[0].text == "stdout:\n55" && !r[0].is_error)
        );
        assert!(matches!(&turns[2], Turn::Assistant(r) if r.text == "55" && r.calls.is_empty()));
    }
}
