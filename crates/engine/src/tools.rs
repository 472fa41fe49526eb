//! The tools a model gets (DESIGN.md §8): `python`, `bash` and `text_editor`, as data (names,
//! descriptions and JSON Schemas, in each provider's function-calling format) and as execution
//! on a session, with results written for a model to read. MCP, `runcell tools` and the agent
//! loop all use this module, so the tools are the same everywhere.

use std::fmt::Write as _;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::Engine;
use crate::model::{Execution, ExecutionStatus, FileChangeKind};
use crate::{CancelToken, CommandOutput, EngineError};

/// Tool names.
pub const PYTHON: &str = "python";
pub const BASH: &str = "bash";
pub const TEXT_EDITOR: &str = "text_editor";

/// The most characters one labelled section of a tool result keeps; beyond it the head and
/// tail are kept around a `[… N bytes truncated …]` line.
pub const SECTION_CAP: usize = 20_000;

/// One tool, as a model is told about it.
#[derive(Debug, Clone)]
pub struct ToolDefinition {
    pub name: &'static str,
    pub description: &'static str,
    /// JSON Schema of the tool's input (an object).
    pub input_schema: Value,
}

const PYTHON_DESCRIPTION: &str = "Run Python code in a stateful Jupyter-like session (variables, \
imports and files persist between calls). The working directory is /workspace (also \
/mnt/data); files written there are reported back. The value of the last expression is \
returned as the result; print() output, errors with tracebacks and matplotlib figures \
(plt.show() or a figure left open, returned as PNG images) come back too. numpy, pandas, \
matplotlib, scipy and the usual data-science packages are installed. There is no network \
access. Each call has a time limit (30 s by default).";

const BASH_DESCRIPTION: &str = "Run a shell command with bash in the same sandbox and \
/workspace as the python tool (for example ls, cat, grep, head, wc, unzip, or python3 \
script.py). Each call starts a fresh shell in /workspace: cd and variables do not persist \
between calls. Returns stdout, stderr and the exit code. There is no network access.";

const TEXT_EDITOR_DESCRIPTION: &str = "View, create and edit text files in /workspace (the \
python and bash tools see the same files). Paths are relative to /workspace (absolute \
/workspace/... and /mnt/data/... paths are accepted too). Commands: `view` shows a file with \
line numbers (optionally only `view_range` [start, end], 1-based, end -1 for the last line) or \
lists a directory; `create` writes `file_text` to `path` (replacing the file if it exists); \
`str_replace` replaces `old_str`, which must occur exactly once in the file, with `new_str`; \
`insert` inserts `new_str` after line `insert_line` (0 inserts at the top).";

fn session_id_schema() -> Value {
    json!({
        "type": "string",
        "description": "Run in this session (ses_...) instead of the default one. Omit it to use the default session, which keeps state between calls."
    })
}

/// The three tools.
pub fn definitions() -> Vec<ToolDefinition> {
    vec![
        ToolDefinition {
            name: PYTHON,
            description: PYTHON_DESCRIPTION,
            input_schema: json!({
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The Python code to run."},
                    "session_id": session_id_schema(),
                },
                "required": ["code"],
                "additionalProperties": false,
            }),
        },
        ToolDefinition {
            name: BASH,
            description: BASH_DESCRIPTION,
            input_schema: json!({
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The shell command to run (bash -c)."},
                    "session_id": session_id_schema(),
                },
                "required": ["command"],
                "additionalProperties": false,
            }),
        },
        ToolDefinition {
            name: TEXT_EDITOR,
            description: TEXT_EDITOR_DESCRIPTION,
            input_schema: json!({
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "enum": ["view", "create", "str_replace", "insert"],
                        "description": "What to do."
                    },
                    "path": {"type": "string", "description": "The file or directory, relative to /workspace (e.g. data.csv or src/app.py)."},
                    "file_text": {"type": "string", "description": "create: the whole content of the new file."},
                    "old_str": {"type": "string", "description": "str_replace: the exact text to replace; it must occur exactly once."},
                    "new_str": {"type": "string", "description": "str_replace: the replacement (empty to delete); insert: the text to insert."},
                    "insert_line": {"type": "integer", "minimum": 0, "description": "insert: the line after which new_str goes (0 for the top of the file)."},
                    "view_range": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "minItems": 2,
                        "maxItems": 2,
                        "description": "view: [start, end] lines to show, 1-based and inclusive; end -1 means the last line."
                    },
                    "session_id": session_id_schema(),
                },
                "required": ["command", "path"],
                "additionalProperties": false,
            }),
        },
    ]
}

/// The function-calling formats `runcell tools --format` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Chat Completions / Responses: `[{"type":"function","function":{name,description,parameters}}]`.
    OpenAi,
    /// Messages API: `[{name, description, input_schema}]`.
    Anthropic,
    /// Gemini: `{"functionDeclarations": [{name, description, parameters}]}`.
    Gemini,
    /// MCP `tools/list`: `[{name, description, inputSchema}]`.
    Mcp,
}

impl std::str::FromStr for ToolFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "openai" => Ok(ToolFormat::OpenAi),
            "anthropic" => Ok(ToolFormat::Anthropic),
            "gemini" => Ok(ToolFormat::Gemini),
            "mcp" => Ok(ToolFormat::Mcp),
            other => Err(format!(
                "unknown format {other:?} (expected openai, anthropic, gemini or mcp)"
            )),
        }
    }
}

/// Gemini takes an OpenAPI subset: no `additionalProperties`, no `minItems`/`maxItems` bounds
/// on every version; keep the rest.
pub fn gemini_schema(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !matches!(k.as_str(), "additionalProperties"))
                .map(|(k, v)| (k.clone(), gemini_schema(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(gemini_schema).collect()),
        other => other.clone(),
    }
}

/// The tool definitions in `format`, ready to paste into a request.
pub fn definitions_json(format: ToolFormat) -> Value {
    let defs = definitions();
    match format {
        ToolFormat::OpenAi => Value::Array(
            defs.iter()
                .map(|d| {
                    json!({"type": "function", "function": {
                        "name": d.name, "description": d.description, "parameters": d.input_schema}})
                })
                .collect(),
        ),
        ToolFormat::Anthropic => Value::Array(
            defs.iter()
                .map(|d| json!({"name": d.name, "description": d.description, "input_schema": d.input_schema}))
                .collect(),
        ),
        ToolFormat::Gemini => json!({"functionDeclarations": defs
            .iter()
            .map(|d| json!({"name": d.name, "description": d.description, "parameters": gemini_schema(&d.input_schema)}))
            .collect::<Vec<_>>()}),
        // The result of `tools/list`, as an MCP server answers it.
        ToolFormat::Mcp => json!({"tools": defs
            .iter()
            .map(|d| json!({"name": d.name, "description": d.description, "inputSchema": d.input_schema}))
            .collect::<Vec<_>>()}),
    }
}

/// `python` input.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PythonInput {
    pub code: String,
    #[serde(default)]
    pub session_id: Option<String>,
}

/// `bash` input.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BashInput {
    pub command: String,
    #[serde(default)]
    pub session_id: Option<String>,
}

/// `text_editor` input (the shape of Anthropic's file editor tool).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditorInput {
    pub command: String,
    pub path: String,
    #[serde(default)]
    pub file_text: Option<String>,
    #[serde(default)]
    pub old_str: Option<String>,
    #[serde(default)]
    pub new_str: Option<String>,
    #[serde(default)]
    pub insert_line: Option<i64>,
    #[serde(default)]
    pub view_range: Option<Vec<i64>>,
    #[serde(default)]
    pub session_id: Option<String>,
}

/// A call of one of the tools, with its arguments checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCall {
    Python(PythonInput),
    Bash(BashInput),
    TextEditor(EditorInput),
}

impl ToolCall {
    /// Parses a call as a model made it; the error says what is wrong, for the model.
    pub fn parse(name: &str, arguments: Value) -> Result<ToolCall, String> {
        let arguments = if arguments.is_null() {
            json!({})
        } else {
            arguments
        };
        let bad = |e: serde_json::Error| format!("invalid arguments for the {name} tool: {e}");
        match name {
            PYTHON => serde_json::from_value(arguments)
                .map(ToolCall::Python)
                .map_err(bad),
            BASH => serde_json::from_value(arguments)
                .map(ToolCall::Bash)
                .map_err(bad),
            TEXT_EDITOR => serde_json::from_value(arguments)
                .map(ToolCall::TextEditor)
                .map_err(bad),
            other => Err(format!(
                "unknown tool {other:?}: the tools are python, bash and text_editor"
            )),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            ToolCall::Python(_) => PYTHON,
            ToolCall::Bash(_) => BASH,
            ToolCall::TextEditor(_) => TEXT_EDITOR,
        }
    }

    /// The session the caller asked for, if any (otherwise the default one).
    pub fn session_id(&self) -> Option<&str> {
        match self {
            ToolCall::Python(i) => i.session_id.as_deref(),
            ToolCall::Bash(i) => i.session_id.as_deref(),
            ToolCall::TextEditor(i) => i.session_id.as_deref(),
        }
    }
}

/// An image a tool produced (a matplotlib figure, a displayed PNG).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolImage {
    pub mime: String,
    /// Base64, as the Execution carries it.
    pub data_base64: String,
}

/// What a tool call gives back to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// Labelled sections (`stdout:`, `stderr:`, `result:`, `error:`, `files:`), each capped.
    pub text: String,
    /// Every PNG the code produced, in order.
    pub images: Vec<ToolImage>,
    /// The execution did not end `ok`, the command exited non-zero, or the edit failed.
    pub is_error: bool,
    /// The whole Execution (python) or command output (bash), for structured consumers.
    pub structured: Option<Value>,
    /// The Execution itself (python).
    pub execution: Option<Execution>,
}

impl ToolOutput {
    /// A failed call, explained.
    pub fn error(message: impl Into<String>) -> ToolOutput {
        ToolOutput {
            text: format!("error: {}", message.into()),
            images: Vec::new(),
            is_error: true,
            structured: None,
            execution: None,
        }
    }

    fn text(text: impl Into<String>) -> ToolOutput {
        ToolOutput {
            text: text.into(),
            images: Vec::new(),
            is_error: false,
            structured: None,
            execution: None,
        }
    }
}

pub use crate::rich::truncate_section;

/// `label:` then the body on the lines below (capped); a one-line body stays on the label's
/// line when it is short.
fn section(out: &mut String, label: &str, body: &str) {
    if !out.is_empty() {
        out.push('\n');
    }
    let body = truncate_section(body, SECTION_CAP);
    let _ = write!(out, "{label}:\n{}", body.trim_end_matches('\n'));
    out.push('\n');
}

fn line(out: &mut String, label: &str, value: &str) {
    if !out.is_empty() {
        out.push('\n');
    }
    let _ = writeln!(out, "{label}: {value}");
}

/// What a resume brought back, for a model to read: it must know which variables are gone.
fn restored_text(r: &crate::Restored) -> String {
    let mut t = match &r.files_only {
        Some(why) => format!("files only, no variables ({why})"),
        None => format!("{} names restored", r.names.len()),
    };
    if !r.skipped.is_empty() {
        let names: Vec<String> = r
            .skipped
            .iter()
            .map(|s| format!("{} ({})", s.name, s.reason))
            .collect();
        t.push_str(&format!("; not restored: {}", names.join(", ")));
    }
    if !r.lost_executions.is_empty() {
        t.push_str(&format!(
            "; the effects on variables of {} earlier execution(s) were lost in a server restart",
            r.lost_executions.len()
        ));
    }
    t
}

/// An Execution as a model should read it.
pub fn execution_output(e: &Execution) -> ToolOutput {
    let mut text = String::new();
    let mut images = Vec::new();
    if let Some(r) = &e.restored {
        line(&mut text, "session resumed", &restored_text(r));
    }
    if !e.stdout.is_empty() {
        section(&mut text, "stdout", &e.stdout);
    }
    if !e.stderr.is_empty() {
        section(&mut text, "stderr", &e.stderr);
    }
    for r in &e.results {
        let label = if r.is_main_result {
            "result"
        } else {
            "display"
        };
        let view = crate::rich::model_view(r, label);
        if let Some((mime, data_base64)) = view.image {
            images.push(ToolImage {
                mime: mime.into(),
                data_base64,
            });
        }
        for (label, body) in &view.sections {
            section(&mut text, label, body);
        }
    }
    if !images.is_empty() {
        let kinds: std::collections::BTreeSet<&str> = images
            .iter()
            .map(|i| i.mime.trim_start_matches("image/"))
            .collect();
        let kinds = kinds
            .into_iter()
            .collect::<Vec<_>>()
            .join("/")
            .to_uppercase();
        line(
            &mut text,
            "images",
            &format!(
                "{} {kinds} image{} attached",
                images.len(),
                if images.len() == 1 { "" } else { "s" }
            ),
        );
    }
    if let Some(err) = &e.error {
        let mut body = format!("{}: {}", err.name, err.value);
        if !err.traceback.trim().is_empty() {
            body.push('\n');
            body.push_str(&err.traceback);
        }
        section(&mut text, "error", &body);
    }
    if !e.files.is_empty() {
        let list = e
            .files
            .iter()
            .map(|f| match f.change {
                FileChangeKind::Deleted => format!("- {} (deleted)", f.path),
                kind => format!(
                    "- {} ({} bytes, {}, {})",
                    f.path,
                    f.size,
                    f.mime,
                    match kind {
                        FileChangeKind::Created => "created",
                        _ => "modified",
                    }
                ),
            })
            .collect::<Vec<_>>()
            .join("\n");
        section(&mut text, "files", &list);
    }
    if !e.network.is_empty() {
        // What went out through the egress proxy: the model sees what it reached and what
        // the session's allowlist refused.
        let list = e
            .network
            .iter()
            .map(|c| {
                if c.allowed {
                    format!(
                        "- {}:{} allowed ({} bytes out, {} bytes in)",
                        c.domain, c.port, c.bytes_out, c.bytes_in
                    )
                } else {
                    format!(
                        "- {}:{} refused by the session's network policy",
                        c.domain, c.port
                    )
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        section(&mut text, "network", &list);
    }
    if e.status != ExecutionStatus::Ok {
        let status = serde_json::to_value(e.status)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let mut status_line = status;
        if let Some(k) = e.usage.killed_by {
            let k = serde_json::to_value(k)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = write!(
                status_line,
                " (killed by {k}; the session restarted: variables are lost, files are kept)"
            );
        }
        line(&mut text, "status", &status_line);
    }
    if text.is_empty() {
        text.push_str("(no output)\n");
    }
    ToolOutput {
        text,
        images,
        is_error: e.status != ExecutionStatus::Ok,
        structured: serde_json::to_value(e).ok(),
        execution: Some(e.clone()),
    }
}

/// A shell command's output as a model should read it.
pub fn command_output(c: &CommandOutput) -> ToolOutput {
    let mut text = String::new();
    if !c.stdout.is_empty() {
        section(&mut text, "stdout", &c.stdout);
    }
    if !c.stderr.is_empty() {
        section(&mut text, "stderr", &c.stderr);
    }
    let mut exit = c.exit_code.to_string();
    if let Some(k) = c.usage.killed_by {
        let k = serde_json::to_value(k)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let _ = write!(exit, " (killed by {k})");
    }
    line(&mut text, "exit_code", &exit);
    ToolOutput {
        text,
        images: Vec::new(),
        is_error: c.exit_code != 0 || c.usage.killed_by.is_some(),
        structured: serde_json::to_value(c).ok(),
        execution: None,
    }
}

/// A path as the model wrote it -> a path relative to /workspace ("" for /workspace itself).
pub fn workspace_path(path: &str) -> Result<String, String> {
    let p = path.trim();
    let rel = if let Some(abs) = p.strip_prefix('/') {
        let abs = abs.trim_end_matches('/');
        let mut found = None;
        for root in ["workspace", "mnt/data"] {
            if abs == root {
                found = Some("");
            } else if let Some(rest) = abs.strip_prefix(root).and_then(|r| r.strip_prefix('/')) {
                found = Some(rest);
            }
            if found.is_some() {
                break;
            }
        }
        found.ok_or_else(|| {
            format!(
                "{path} is outside /workspace: the editor only works on files in /workspace (give a path relative to it, e.g. data.csv)"
            )
        })?
    } else {
        p.trim_end_matches('/')
    };
    let mut rel = rel;
    while let Some(r) = rel.strip_prefix("./") {
        rel = r;
    }
    Ok(if rel == "." { "" } else { rel }.to_owned())
}

fn numbered(lines: &[&str], first: usize) -> String {
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        let _ = writeln!(out, "{:6}\t{l}", first + i);
    }
    out
}

/// The lines of a text (a final newline does not start another line).
fn lines_of(text: &str) -> Vec<&str> {
    let t = text.strip_suffix('\n').unwrap_or(text);
    if t.is_empty() && text.is_empty() {
        Vec::new()
    } else {
        t.split('\n').collect()
    }
}

/// A few numbered lines around `line` (1-based), after an edit.
fn snippet(text: &str, line: usize, count: usize) -> String {
    let lines = lines_of(text);
    let start = line.saturating_sub(4).max(1);
    let end = (line + count + 3).min(lines.len());
    if lines.is_empty() || start > end {
        return String::new();
    }
    numbered(&lines[start - 1..end], start)
}

impl Engine {
    /// Runs one tool call on `session` (the caller resolves which session that is). An `Err`
    /// is about the session itself (gone, busy, the host unable to run code); everything the
    /// model did wrong comes back as an output with `is_error`. `cancel` calls a python
    /// execution off (interrupted if running, skipped if queued).
    pub fn run_tool(
        &self,
        session: &str,
        call: &ToolCall,
        cancel: CancelToken,
    ) -> Result<ToolOutput, EngineError> {
        match call {
            ToolCall::Python(i) => {
                match self
                    .sessions()
                    .execute_cancellable(session, &i.code, None, None, cancel)
                {
                    Ok(e) => Ok(execution_output(&e)),
                    // The model's to fix: it is told, and can try smaller code.
                    Err(EngineError::PayloadTooLarge(m)) => Ok(ToolOutput::error(m.to_string())),
                    Err(e) => Err(e),
                }
            }
            ToolCall::Bash(i) => match self.run_command(session, &i.command, None) {
                Ok(c) => Ok(command_output(&c)),
                Err(EngineError::InvalidRequest(m)) => Ok(ToolOutput::error(m.to_string())),
                Err(EngineError::PayloadTooLarge(m)) => Ok(ToolOutput::error(m.to_string())),
                Err(e) => Err(e),
            },
            ToolCall::TextEditor(i) => {
                // The session must exist: a missing one is the caller's to handle.
                self.sessions().get(session)?;
                Ok(self
                    .text_editor(session, i)
                    .unwrap_or_else(ToolOutput::error))
            }
        }
    }

    fn text_editor(&self, session: &str, i: &EditorInput) -> Result<ToolOutput, String> {
        let path = workspace_path(&i.path)?;
        let shown = if path.is_empty() {
            "/workspace".to_owned()
        } else {
            path.clone()
        };
        let file_err = |e: EngineError| match e {
            EngineError::NotFound(_) => format!("{shown} does not exist"),
            EngineError::InvalidRequest(m) => m.to_string(),
            EngineError::LimitExceeded(m) => m.to_string(),
            other => crate::chain(&other),
        };
        let read_text = |what: &str| -> Result<String, String> {
            let data = self.read_file(session, &path).map_err(file_err)?;
            String::from_utf8(data).map_err(|e| {
                format!(
                    "{shown} is not a text file ({} bytes); {what} it with the python or bash tool",
                    e.as_bytes().len()
                )
            })
        };
        match i.command.as_str() {
            "view" => {
                if path.is_empty() {
                    return self.view_dir(session, "", &shown);
                }
                // Not a directory: a file, or nothing (a listing cannot tell them apart since
                // one below a file is "not found"; the read says which).
                if self.list_files(session, &path).is_ok() {
                    return self.view_dir(session, &path, &shown);
                }
                let text = read_text("inspect")?;
                let lines = lines_of(&text);
                let (start, end) = match i.view_range.as_deref() {
                    None => (1, lines.len()),
                    Some(&[start, end]) => {
                        let n = lines.len() as i64;
                        if start < 1 || start > n.max(1) {
                            return Err(format!(
                                "invalid view_range [{start}, {end}]: start must be between 1 and {} (the file has {n} lines)",
                                n.max(1)
                            ));
                        }
                        let end = if end == -1 { n } else { end };
                        if end < start {
                            return Err(format!(
                                "invalid view_range [{start}, {end}]: end must be -1 or at least start"
                            ));
                        }
                        (start as usize, end.min(n) as usize)
                    }
                    Some(_) => return Err(
                        "view_range must be two integers [start, end] (end -1 for the last line)"
                            .into(),
                    ),
                };
                let body = if lines.is_empty() {
                    "(empty file)\n".to_owned()
                } else {
                    numbered(&lines[start - 1..end], start)
                };
                Ok(ToolOutput::text(truncate_section(
                    &format!("{shown} (lines {start}-{end} of {}):\n{body}", lines.len()),
                    SECTION_CAP,
                )))
            }
            "create" => {
                let Some(text) = &i.file_text else {
                    return Err("create needs file_text: the content of the file".into());
                };
                if path.is_empty() {
                    return Err("create needs a file path, not /workspace itself".into());
                }
                let existed = self.read_file(session, &path).is_ok();
                self.write_file(session, &path, text.as_bytes())
                    .map_err(file_err)?;
                Ok(ToolOutput::text(format!(
                    "{} {shown} ({} bytes, {} lines)\n",
                    if existed { "overwrote" } else { "created" },
                    text.len(),
                    lines_of(text).len()
                )))
            }
            "str_replace" => {
                let Some(old) = i.old_str.as_deref() else {
                    return Err("str_replace needs old_str: the exact text to replace".into());
                };
                if old.is_empty() {
                    return Err("old_str must not be empty".into());
                }
                let new = i.new_str.as_deref().unwrap_or("");
                let text = read_text("edit")?;
                let starts: Vec<usize> = text.match_indices(old).map(|(at, _)| at).collect();
                match starts.len() {
                    0 => Err(format!(
                        "no replacement was made: old_str did not appear verbatim in {shown}. Check whitespace and indentation (view the file first)."
                    )),
                    1 => {
                        let at = starts[0];
                        let edited = format!("{}{new}{}", &text[..at], &text[at + old.len()..]);
                        self.write_file(session, &path, edited.as_bytes())
                            .map_err(file_err)?;
                        let line = text[..at].matches('\n').count() + 1;
                        Ok(ToolOutput::text(format!(
                            "edited {shown}; the changed part now reads:\n{}",
                            snippet(&edited, line, new.matches('\n').count())
                        )))
                    }
                    _ => {
                        let lines: Vec<String> = starts
                            .iter()
                            .map(|&at| (text[..at].matches('\n').count() + 1).to_string())
                            .collect();
                        Err(format!(
                            "no replacement was made: old_str occurs {} times in {shown} (lines {}). Include more surrounding text so that it is unique.",
                            starts.len(),
                            lines.join(", ")
                        ))
                    }
                }
            }
            "insert" => {
                let Some(new) = i.new_str.as_deref() else {
                    return Err("insert needs new_str: the text to insert".into());
                };
                let Some(after) = i.insert_line else {
                    return Err(
                        "insert needs insert_line: the line after which to insert (0 for the top)"
                            .into(),
                    );
                };
                let text = read_text("edit")?;
                let lines = lines_of(&text);
                if after < 0 || after as usize > lines.len() {
                    return Err(format!(
                        "invalid insert_line {after}: it must be between 0 and {} (the number of lines in {shown})",
                        lines.len()
                    ));
                }
                let after = after as usize;
                let mut inserted: Vec<&str> = lines_of(new);
                if inserted.is_empty() {
                    inserted.push("");
                }
                let mut all: Vec<&str> = Vec::with_capacity(lines.len() + inserted.len());
                all.extend_from_slice(&lines[..after]);
                all.extend_from_slice(&inserted);
                all.extend_from_slice(&lines[after..]);
                let mut edited = all.join("\n");
                if text.ends_with('\n') || text.is_empty() {
                    edited.push('\n');
                }
                self.write_file(session, &path, edited.as_bytes())
                    .map_err(file_err)?;
                Ok(ToolOutput::text(format!(
                    "inserted {} line{} after line {after} of {shown}; that part now reads:\n{}",
                    inserted.len(),
                    if inserted.len() == 1 { "" } else { "s" },
                    snippet(&edited, after + 1, inserted.len().saturating_sub(1))
                )))
            }
            other => Err(format!(
                "unknown command {other:?}: use view, create, str_replace or insert"
            )),
        }
    }

    fn view_dir(&self, session: &str, dir: &str, shown: &str) -> Result<ToolOutput, String> {
        let files = self
            .list_files(session, dir)
            .map_err(|e| crate::chain(&e))?;
        if files.is_empty() {
            return Ok(ToolOutput::text(format!("{shown} is an empty directory\n")));
        }
        let mut out = format!("files in {shown}:\n");
        for f in &files {
            let _ = writeln!(out, "- {} ({} bytes, {})", f.path, f.size, f.mime);
        }
        Ok(ToolOutput::text(truncate_section(&out, SECTION_CAP)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_network_section_says_what_was_reached_and_what_was_refused() {
        let e: Execution = serde_json::from_value(serde_json::json!({
            "id": "ex_1", "session_id": null, "language": "python", "execution_count": 1,
            "status": "ok", "stdout": "", "stderr": "",
            "truncated": {"stdout": false, "stderr": false}, "results": [], "error": null,
            "files": [], "usage": {"wall_ms": 1, "cpu_ms": 1, "peak_memory_bytes": 1, "killed_by": null},
            "network": [
                {"domain": "pypi.org", "port": 443, "allowed": true, "bytes_out": 10, "bytes_in": 20},
                {"domain": "github.com", "port": 443, "allowed": false, "bytes_out": 0, "bytes_in": 0}
            ],
            "started_at": "2026-01-01T00:00:00Z", "finished_at": "2026-01-01T00:00:00Z"
        }))
        .expect("execution");
        let text = execution_output(&e).text;
        assert!(
            text.contains("network:\n- pypi.org:443 allowed (10 bytes out, 20 bytes in)\n- github.com:443 refused by the session's network policy"),
            "{text}"
        );
    }

    #[test]
    fn paths_are_confined_to_the_workspace() {
        assert_eq!(workspace_path("a/b.txt").as_deref(), Ok("a/b.txt"));
        assert_eq!(workspace_path("./a.txt").as_deref(), Ok("a.txt"));
        assert_eq!(workspace_path("/workspace/a.txt").as_deref(), Ok("a.txt"));
        assert_eq!(
            workspace_path("/mnt/data/x/y.csv").as_deref(),
            Ok("x/y.csv")
        );
        assert_eq!(workspace_path("/workspace").as_deref(), Ok(""));
        assert_eq!(workspace_path("/workspace/").as_deref(), Ok(""));
        assert_eq!(workspace_path(".").as_deref(), Ok(""));
        let e = workspace_path("/etc/passwd").expect_err("outside");
        assert!(e.contains("outside /workspace"), "{e}");
        assert!(workspace_path("/workspacex/a").is_err());
    }

    #[test]
    fn long_sections_keep_head_and_tail_with_a_marker() {
        let text = format!("{}{}", "a".repeat(30_000), "b".repeat(30_000));
        let t = truncate_section(&text, SECTION_CAP);
        assert!(t.starts_with("aaaa") && t.ends_with("bbbb"));
        assert!(
            t.contains("\n[… 40000 bytes truncated …]\n"),
            "{}",
            &t[9990..10050]
        );
        assert_eq!(truncate_section("short", SECTION_CAP), "short");
        // Multi-byte characters are never cut.
        let t = truncate_section(&"é".repeat(100), 10);
        assert!(t.contains("[… 180 bytes truncated …]"), "{t}");
    }

    #[test]
    fn calls_are_parsed_and_checked() {
        let c = ToolCall::parse("python", json!({"code": "1+1"})).expect("python");
        assert_eq!(c.session_id(), None);
        let c =
            ToolCall::parse("bash", json!({"command": "ls", "session_id": "ses_x"})).expect("bash");
        assert_eq!(c.session_id(), Some("ses_x"));
        let e = ToolCall::parse("python", json!({"cod": "1"})).expect_err("typo");
        assert!(e.contains("unknown field"), "{e}");
        assert!(ToolCall::parse("rm", json!({})).is_err());
    }

    #[test]
    fn formats_have_the_shapes_providers_take() {
        let o = definitions_json(ToolFormat::OpenAi);
        assert_eq!(o.as_array().map(Vec::len), Some(3));
        assert_eq!(o[0]["type"], "function");
        assert_eq!(o[0]["function"]["name"], "python");
        assert_eq!(o[0]["function"]["parameters"]["required"], json!(["code"]));
        let a = definitions_json(ToolFormat::Anthropic);
        assert_eq!(a[2]["name"], "text_editor");
        assert!(a[2]["input_schema"]["properties"]["old_str"].is_object());
        let g = definitions_json(ToolFormat::Gemini);
        assert_eq!(g["functionDeclarations"][1]["name"], "bash");
        assert!(g["functionDeclarations"][1]["parameters"]
            .get("additionalProperties")
            .is_none());
        let m = definitions_json(ToolFormat::Mcp);
        assert_eq!(m["tools"][0]["inputSchema"]["type"], "object");
        assert_eq!(m["tools"].as_array().map(Vec::len), Some(3));
        assert!("xml".parse::<ToolFormat>().is_err());
    }

    #[test]
    fn line_helpers() {
        assert_eq!(lines_of(""), Vec::<&str>::new());
        assert_eq!(lines_of("a\nb\n"), vec!["a", "b"]);
        assert_eq!(lines_of("a\nb"), vec!["a", "b"]);
        assert_eq!(numbered(&["x", "y"], 3), "     3\tx\n     4\ty\n");
    }
}
