//! The agent loop (DESIGN.md §8): a system prompt and the runcell tools (python, bash,
//! text_editor) go to a model; the calls it makes run in one session the agent creates (and
//! deletes at the end); their results go back (images as image content); until the model
//! answers without calling a tool, `max_steps` model replies, or too many failed executions in
//! a row. Synchronous: the HTTP client blocks, the engine blocks.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use runcell_engine::tools::{ToolCall, ToolOutput};
use runcell_engine::{CancelToken, CreateSession, Engine, FileChangeKind, InputFile};

pub mod approval;
pub mod code_mode;
mod error;
pub mod provider;
#[cfg(feature = "test-support")]
pub mod testing;

pub use approval::{Answer, Gate, Proposal, Ruling, Verdict};
pub use error::AgentError;
pub use provider::{
    default_models, Client, ModelReply, ProviderConfig, ProviderKind, ReplyMeta, ToolReply,
    ToolSpec, ToolUse, Turn, DEFAULT_ANTHROPIC_MODEL, DEFAULT_GEMINI_MODEL, DEFAULT_OPENAI_MODEL,
};

/// How a run goes.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// Model replies at most (each may call several tools).
    pub max_steps: usize,
    /// Stop after this many failed tool calls in a row.
    pub max_consecutive_failures: usize,
    /// The session's owner (the audit log's tenant).
    pub owner: String,
    /// Replaces [`SYSTEM_PROMPT`].
    pub system_prompt: Option<String>,
    /// Runs in this existing session, which the caller created and ends (the web page's chat
    /// keeps it so its files stay downloadable); by default the agent creates a fresh session
    /// and deletes it when the run ends.
    pub session: Option<String>,
    /// Set (by another thread, or the step callback) to end the run before its next model
    /// call: the web page's chat sets it when its client went away.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Default for AgentOptions {
    fn default() -> Self {
        AgentOptions {
            max_steps: 12,
            max_consecutive_failures: 5,
            owner: "default".into(),
            system_prompt: None,
            session: None,
            stop: None,
        }
    }
}

/// The system prompt.
pub const SYSTEM_PROMPT: &str = "You are a careful data analyst with a sandboxed Python and \
bash environment. Use the tools to answer: `python` runs code in a stateful Jupyter-like \
session (variables persist between calls), `bash` runs shell commands, `text_editor` views \
and edits text files. The working directory is /workspace; files the user uploaded are \
there. numpy, pandas, matplotlib and the usual data-science packages are installed; there is \
no network access. Save every output file (charts as PNG, tables as CSV, ...) to /workspace: \
those files are handed to the user. Look at the data before relying on it, check your \
results, and fix errors you hit. When you are done, reply without calling a tool: a concise \
answer with the key numbers, and the names of the files you saved.";

/// Why the loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The model replied without calling a tool.
    Answer,
    /// `max_steps` model replies, all with tool calls.
    MaxSteps,
    /// `max_consecutive_failures` failed tool calls in a row.
    TooManyFailures,
}

/// A file the code created or modified in /workspace during the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducedFile {
    /// Relative to /workspace.
    pub path: String,
    pub content: Vec<u8>,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct AgentOutcome {
    /// The final answer (with another stop reason: the model's last text, maybe empty).
    pub answer: String,
    pub stop: StopReason,
    /// Model replies.
    pub steps: usize,
    pub files_produced: Vec<ProducedFile>,
    /// The whole conversation after the system prompt.
    pub transcript: Vec<Turn>,
}

/// What happens, as it happens (for `--show-code` and logs).
#[derive(Debug)]
pub enum StepEvent<'a> {
    /// Code mode: the section about the session's MCP functions was added to the system
    /// prompt (before the first model call; only when there is one).
    ToolsListed { section: &'a str },
    /// The model replied (text may be empty when it only calls tools).
    Model { step: usize, reply: &'a ModelReply },
    /// A tool call is about to run.
    ToolCall { step: usize, call: &'a ToolUse },
    /// It ran.
    ToolResult {
        step: usize,
        call: &'a ToolUse,
        output: &'a ToolOutput,
    },
}

/// A model, the tools and the engine that runs them.
#[derive(Debug)]
pub struct Agent {
    engine: Engine,
    client: Client,
}

/// Deletes the session when the run ends, however it ends, if the agent created it.
struct SessionGuard<'a> {
    engine: &'a Engine,
    id: String,
    owned: bool,
}

impl Drop for SessionGuard<'_> {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        if let Err(e) = self.engine.sessions().delete(&self.id) {
            tracing::warn!(session = %self.id, error = %runcell_engine::error_chain(&e), "cannot delete the agent's session");
        }
    }
}

/// Each file's size and modification time (compared, never shown).
type Snapshot = BTreeMap<String, (u64, String)>;

impl Agent {
    pub fn new(engine: Engine, provider: ProviderConfig) -> Result<Agent, AgentError> {
        Ok(Agent {
            engine,
            client: Client::new(provider)?,
        })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Runs the loop on `question`, with `files` uploaded into /workspace first.
    pub fn run(
        &self,
        question: &str,
        files: &[InputFile],
        opts: &AgentOptions,
        on_step: &mut dyn FnMut(StepEvent<'_>),
    ) -> Result<AgentOutcome, AgentError> {
        self.run_gated(question, files, opts, on_step, None)
    }

    /// [`Agent::run`] where, with a `gate`, every tool call waits for a person's decision,
    /// which is recorded in the audit log before anything runs.
    pub fn run_gated(
        &self,
        question: &str,
        files: &[InputFile],
        opts: &AgentOptions,
        on_step: &mut dyn FnMut(StepEvent<'_>),
        mut gate: Option<Gate<'_>>,
    ) -> Result<AgentOutcome, AgentError> {
        let guard = match &opts.session {
            Some(id) => SessionGuard {
                engine: &self.engine,
                id: id.clone(),
                owned: false,
            },
            None => {
                let info = self.engine.sessions().create(CreateSession {
                    owner: opts.owner.clone(),
                    ..CreateSession::default()
                })?;
                SessionGuard {
                    engine: &self.engine,
                    id: info.id,
                    owned: true,
                }
            }
        };
        let session = guard.id.as_str();
        for f in files {
            self.engine.write_file(session, &f.path, &f.content)?;
        }
        let before = self.snapshot(session)?;

        let mut prompt = question.trim().to_owned();
        if !files.is_empty() {
            prompt.push_str("\n\nFiles uploaded to /workspace:");
            for f in files {
                prompt.push_str(&format!("\n- {} ({} bytes)", f.path, f.content.len()));
            }
        }
        let mut system = opts
            .system_prompt
            .as_deref()
            .unwrap_or(SYSTEM_PROMPT)
            .to_owned();
        // Code mode: the MCP tools this session's code can call, listed for the model.
        if let Some(section) = self.code_mode_section(session) {
            on_step(StepEvent::ToolsListed { section: &section });
            system.push_str("\n\n");
            system.push_str(&section);
        }
        let system = system.as_str();
        let mut turns = vec![Turn::User(prompt)];
        let mut changed: BTreeSet<String> = BTreeSet::new();
        let mut failures = 0;
        let mut steps = 0;
        let mut answer = String::new();
        let mut stop = StopReason::MaxSteps;

        while steps < opts.max_steps.max(1) {
            if opts.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Err(AgentError::Stopped);
            }
            steps += 1;
            let reply = self.client.complete(system, &turns)?;
            on_step(StepEvent::Model {
                step: steps,
                reply: &reply,
            });
            answer = reply.text.clone();
            if reply.calls.is_empty() {
                turns.push(Turn::Assistant(reply));
                stop = StopReason::Answer;
                break;
            }
            let mut replies = Vec::with_capacity(reply.calls.len());
            for call in &reply.calls {
                on_step(StepEvent::ToolCall { step: steps, call });
                let (output, declined) = match gate.as_mut() {
                    None => (self.run_call(session, call)?, false),
                    Some(g) => self.run_approved(session, steps, call, &opts.owner, g)?,
                };
                on_step(StepEvent::ToolResult {
                    step: steps,
                    call,
                    output: &output,
                });
                if let Some(e) = &output.execution {
                    for f in &e.files {
                        if f.change == FileChangeKind::Deleted {
                            changed.remove(&f.path);
                        } else {
                            changed.insert(f.path.clone());
                        }
                    }
                }
                // A declined call is the person's choice, not the model's failure.
                failures = if output.is_error && !declined {
                    failures + 1
                } else {
                    0
                };
                replies.push(ToolReply {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    text: output.text,
                    images: output.images,
                    is_error: output.is_error,
                });
            }
            turns.push(Turn::Assistant(reply));
            turns.push(Turn::Tools(replies));
            if failures >= opts.max_consecutive_failures.max(1) {
                stop = StopReason::TooManyFailures;
                break;
            }
        }

        let files_produced = self.produced(session, &before, changed)?;
        drop(guard);
        Ok(AgentOutcome {
            answer,
            stop,
            steps,
            files_produced,
            transcript: turns,
        })
    }

    /// Asks the gate about `call`, records the decision, and runs what was approved. The bool
    /// says the call was declined.
    fn run_approved(
        &self,
        session: &str,
        step: usize,
        call: &ToolUse,
        owner: &str,
        gate: &mut Gate<'_>,
    ) -> Result<(ToolOutput, bool), AgentError> {
        if call.bad_arguments.is_some() {
            return Ok((self.run_call(session, call)?, false));
        }
        let p = Proposal {
            step,
            call,
            code: approval::proposal_text(call),
        };
        match approval::rule(&self.engine, owner, session, &p, gate)? {
            Ruling::Declined(reason) => Ok((
                ToolOutput {
                    text: approval::declined_text(reason.as_deref()),
                    ..ToolOutput::error("")
                },
                true,
            )),
            Ruling::Edited(c) => {
                let edited = match approval::edited_call(call, &c) {
                    Ok(e) => e,
                    Err(m) => return Ok((ToolOutput::error(m), false)),
                };
                let mut out = self.run_call(session, &edited)?;
                out.text = format!("{}{}", approval::edited_note(&c), out.text);
                Ok((out, false))
            }
            Ruling::Run => Ok((self.run_call(session, call)?, false)),
        }
    }

    fn run_call(&self, session: &str, call: &ToolUse) -> Result<ToolOutput, AgentError> {
        if let Some(why) = &call.bad_arguments {
            return Ok(ToolOutput::error(format!(
                "invalid arguments for the {} tool: {why}",
                call.name
            )));
        }
        let parsed = ToolCall::parse(&call.name, call.input.clone());
        let tool = match parsed {
            Ok(t) => t,
            Err(m) => return Ok(ToolOutput::error(m)),
        };
        // Every call runs in the agent's session, whatever session_id the model named.
        Ok(self.engine.run_tool(session, &tool, CancelToken::new())?)
    }

    /// The system prompt's code-mode section ([`code_mode`]) for `session`, when its code can
    /// call MCP tools. A listing that fails leaves the prompt without one (logged): the run
    /// goes on with the model's own tools.
    fn code_mode_section(&self, session: &str) -> Option<String> {
        if !self.engine.has_mcp_dispatch() {
            return None;
        }
        let listed = self.engine.sessions().execute_cancellable(
            session,
            code_mode::LISTING_CODE,
            None,
            None,
            CancelToken::new(),
        );
        let e = match listed {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(session, error = %runcell_engine::error_chain(&e), "code mode: cannot list the session's MCP tools");
                return None;
            }
        };
        let parsed: Result<serde_json::Value, _> = serde_json::from_str(e.stdout.trim());
        match parsed {
            Ok(listing) => {
                let section = code_mode::prompt_section(&listing);
                tracing::info!(
                    session,
                    bytes = section.as_ref().map_or(0, String::len),
                    "code mode: MCP tools listed for the model"
                );
                section
            }
            Err(_) => {
                tracing::warn!(session, stdout = %e.stdout, stderr = %e.stderr, "code mode: the listing cell printed no listing");
                None
            }
        }
    }

    fn snapshot(&self, session: &str) -> Result<Snapshot, AgentError> {
        Ok(self
            .engine
            .list_files(session, "")?
            .into_iter()
            .map(|f| (f.path, (f.size, f.modified_at.to_rfc3339())))
            .collect())
    }

    /// Files created or modified since `before`: what the executions reported, and what the
    /// workspace shows changed (bash and the editor report nothing).
    fn produced(
        &self,
        session: &str,
        before: &Snapshot,
        mut changed: BTreeSet<String>,
    ) -> Result<Vec<ProducedFile>, AgentError> {
        let after = self.snapshot(session)?;
        for (path, stat) in &after {
            if before.get(path) != Some(stat) {
                changed.insert(path.clone());
            }
        }
        let mut out = Vec::new();
        for path in changed {
            if !after.contains_key(&path) {
                continue;
            }
            match self.engine.read_file(session, &path) {
                Ok(content) => out.push(ProducedFile { path, content }),
                Err(e) => {
                    tracing::warn!(%path, error = %runcell_engine::error_chain(&e), "cannot read a produced file")
                }
            }
        }
        Ok(out)
    }
}
