//! The model APIs the loop talks to: any OpenAI-compatible Chat Completions endpoint,
//! Anthropic Messages and Gemini's generateContent (function calling). One provider-neutral
//! transcript ([`Turn`]s) is rendered into each API's request shape, and each reply is read
//! back into a [`ModelReply`].

use std::time::Duration;

use runcell_engine::tools::{definitions_json, gemini_schema, ToolFormat, ToolImage};
use serde_json::{json, Map, Value};

use crate::error::AgentError;

/// Which API the model is behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// Chat Completions (OpenAI, Mistral, vLLM, llama.cpp, Ollama, ...).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// Gemini's generateContent with function declarations.
    Gemini,
}

impl std::str::FromStr for ProviderKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "openai" => Ok(ProviderKind::OpenAi),
            "anthropic" => Ok(ProviderKind::Anthropic),
            "gemini" => Ok(ProviderKind::Gemini),
            other => Err(format!(
                "unknown provider {other:?} (expected openai, anthropic or gemini)"
            )),
        }
    }
}

impl ProviderKind {
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
        }
    }

    /// The environment variable the API key is read from.
    pub fn key_env(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "OPENAI_API_KEY",
            ProviderKind::Anthropic => "ANTHROPIC_API_KEY",
            ProviderKind::Gemini => "GEMINI_API_KEY",
        }
    }

    pub fn default_base_url(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "https://api.openai.com/v1",
            ProviderKind::Anthropic => "https://api.anthropic.com",
            ProviderKind::Gemini => "https://generativelanguage.googleapis.com/v1beta",
        }
    }

    /// The model used when none is named.
    pub fn default_model(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => DEFAULT_OPENAI_MODEL,
            ProviderKind::Anthropic => DEFAULT_ANTHROPIC_MODEL,
            ProviderKind::Gemini => DEFAULT_GEMINI_MODEL,
        }
    }
}

/// The default OpenAI model: not on OpenAI's deprecation list, and a Chat Completions model
/// that takes the request the agent sends (`max_tokens`, tools).
pub const DEFAULT_OPENAI_MODEL: &str = "gpt-4.1";
/// The default Anthropic model: the newest Sonnet the SDK names, on no deprecation list
/// (claude-sonnet-4-5, the previous default, reached its end of life on 2026-11-30). Check
/// the providers' deprecation pages when bumping the agent's dependencies.
pub const DEFAULT_ANTHROPIC_MODEL: &str = "claude-sonnet-5-5";
/// The default Gemini model: the one google-genai 3.6.1's own examples name.
pub const DEFAULT_GEMINI_MODEL: &str = "gemini-3.8-flash";

/// `gpt-4.1 for openai, ... for anthropic`: the defaults as `--help` states them.
pub fn default_models() -> String {
    [
        ProviderKind::OpenAi,
        ProviderKind::Anthropic,
        ProviderKind::Gemini,
    ]
    .map(|k| format!("{} for {}", k.default_model(), k.name()))
    .join(", ")
}

/// Where the model is and how to talk to it.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    /// Without a trailing slash: `https://api.openai.com/v1`, `https://api.anthropic.com`,
    /// `https://generativelanguage.googleapis.com/v1beta`.
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
    /// Retries after a 429 or a 5xx (the first attempt not counted).
    pub max_retries: u32,
    /// The first backoff after a 5xx (doubled each time), and after a 429 without retry-after.
    pub retry_base: Duration,
    /// The longest wait a retry-after header gets.
    pub max_retry_after: Duration,
    /// One request, from connecting to the whole reply.
    pub timeout: Duration,
    /// Anthropic's required `max_tokens`.
    pub max_tokens: u32,
}

impl ProviderConfig {
    /// Defaults for `kind`, the key from its environment variable (a missing key is an error
    /// only against the provider's own endpoint: local OpenAI-compatible servers take none).
    pub fn from_env(
        kind: ProviderKind,
        model: Option<String>,
        base_url: Option<String>,
    ) -> Result<ProviderConfig, AgentError> {
        let api_key = std::env::var(kind.key_env())
            .ok()
            .filter(|k| !k.trim().is_empty());
        let custom_url = base_url.is_some();
        if api_key.is_none() && !custom_url {
            return Err(AgentError::MissingKey {
                env: kind.key_env(),
            });
        }
        Ok(ProviderConfig {
            kind,
            base_url: base_url
                .unwrap_or_else(|| kind.default_base_url().to_owned())
                .trim_end_matches('/')
                .to_owned(),
            api_key,
            model: model.unwrap_or_else(|| kind.default_model().to_owned()),
            max_retries: 3,
            retry_base: Duration::from_secs(1),
            max_retry_after: Duration::from_secs(120),
            timeout: Duration::from_secs(300),
            max_tokens: 8192,
        })
    }
}

/// A tool call as the model made it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolUse {
    pub id: String,
    pub name: String,
    /// The arguments (an object; `{}` when they did not parse).
    pub input: Value,
    /// The arguments as the model wrote them (Chat Completions sends a JSON string back).
    pub arguments: String,
    /// Why the arguments are unusable, told to the model instead of running anything.
    pub bad_arguments: Option<String>,
}

/// What a tool call gave back, for the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolReply {
    pub id: String,
    pub name: String,
    pub text: String,
    pub images: Vec<ToolImage>,
    pub is_error: bool,
}

/// One entry of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    User(String),
    Assistant(ModelReply),
    Tools(Vec<ToolReply>),
}

/// One reply of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelReply {
    /// Its text (the final answer when there are no calls).
    pub text: String,
    pub calls: Vec<ToolUse>,
    /// Anthropic: the content blocks as received, sent back verbatim; Gemini:
    /// `{"parts": [...]}` as received (with their thought signatures), sent back verbatim.
    pub raw: Value,
}

/// A tool the model is offered, for a caller that brings its own set instead of runcell's
/// three (the vendor-compatible APIs name theirs as the vendor does).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the input (an object).
    pub input_schema: Value,
}

/// What a reply says beside its content: the provider's token counts and why it stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplyMeta {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// In Anthropic's words (`end_turn`, `max_tokens`, `stop_sequence`, `tool_use`), Chat
    /// Completions' `finish_reason` translated; `None` when the provider gave none.
    pub stop_reason: Option<String>,
}

/// Talks to one model.
#[derive(Debug)]
pub struct Client {
    cfg: ProviderConfig,
    http: reqwest::blocking::Client,
}

impl Client {
    pub fn new(cfg: ProviderConfig) -> Result<Client, AgentError> {
        let http = reqwest::blocking::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("runcell/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| AgentError::Http(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Client { cfg, http })
    }

    pub fn config(&self) -> &ProviderConfig {
        &self.cfg
    }

    /// The model's next reply to `turns`, with runcell's tools.
    pub fn complete(&self, system: &str, turns: &[Turn]) -> Result<ModelReply, AgentError> {
        let tools = match self.cfg.kind {
            ProviderKind::OpenAi => definitions_json(ToolFormat::OpenAi),
            ProviderKind::Anthropic => definitions_json(ToolFormat::Anthropic),
            ProviderKind::Gemini => json!([definitions_json(ToolFormat::Gemini)]),
        };
        self.send(system, turns, tools).map(|(reply, _)| reply)
    }

    /// The model's next reply to `turns`, offered `tools` (none: a plain conversation), with
    /// the reply's token counts and stop reason.
    pub fn complete_with(
        &self,
        system: &str,
        turns: &[Turn],
        tools: &[ToolSpec],
    ) -> Result<(ModelReply, ReplyMeta), AgentError> {
        let tools = Value::Array(match self.cfg.kind {
            ProviderKind::OpenAi => tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.input_schema}})
                })
                .collect(),
            ProviderKind::Anthropic => tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
                .collect(),
            ProviderKind::Gemini if tools.is_empty() => Vec::new(),
            ProviderKind::Gemini => vec![json!({"functionDeclarations": tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description,
                                "parameters": gemini_schema(&t.input_schema)}))
                .collect::<Vec<_>>()})],
        });
        self.send(system, turns, tools)
    }

    fn send(
        &self,
        system: &str,
        turns: &[Turn],
        tools: Value,
    ) -> Result<(ModelReply, ReplyMeta), AgentError> {
        match self.cfg.kind {
            ProviderKind::OpenAi => {
                let body = openai_body(&self.cfg.model, system, turns, tools);
                let url = format!("{}/chat/completions", self.cfg.base_url);
                let reply = self.post(&url, &body)?;
                Ok((parse_openai(&reply)?, openai_meta(&reply)))
            }
            ProviderKind::Anthropic => {
                let body =
                    anthropic_body(&self.cfg.model, self.cfg.max_tokens, system, turns, tools);
                let url = format!("{}/v1/messages", self.cfg.base_url);
                let reply = self.post(&url, &body)?;
                Ok((parse_anthropic(&reply)?, anthropic_meta(&reply)))
            }
            ProviderKind::Gemini => {
                let body = gemini_body(self.cfg.max_tokens, system, turns, tools);
                let model = self.cfg.model.trim_start_matches("models/");
                let url = format!("{}/models/{model}:generateContent", self.cfg.base_url);
                let reply = self.post(&url, &body)?;
                let parsed = parse_gemini(&reply)?;
                let meta = gemini_meta(&reply, !parsed.calls.is_empty());
                Ok((parsed, meta))
            }
        }
    }

    /// POSTs `body`, retrying 429s (after retry-after) and 5xx (with backoff).
    fn post(&self, url: &str, body: &Value) -> Result<Value, AgentError> {
        let mut attempt = 0;
        loop {
            let mut req = self.http.post(url).json(body);
            req = match (self.cfg.kind, &self.cfg.api_key) {
                (ProviderKind::OpenAi, Some(k)) => req.bearer_auth(k),
                (ProviderKind::OpenAi, None) => req,
                (ProviderKind::Gemini, Some(k)) => req.header("x-goog-api-key", k),
                (ProviderKind::Gemini, None) => req,
                (ProviderKind::Anthropic, key) => {
                    let req = req.header("anthropic-version", "2023-06-01");
                    match key {
                        Some(k) => req.header("x-api-key", k),
                        None => req,
                    }
                }
            };
            let resp = req.send().map_err(|e| {
                AgentError::Http(format!(
                    "cannot reach the {} API at {url}: {}",
                    self.cfg.kind.name(),
                    error_chain(&e)
                ))
            })?;
            let status = resp.status();
            let retry_after = resp
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64);
            let text = resp.text().map_err(|e| {
                AgentError::Http(format!(
                    "the {} API's reply could not be read: {}",
                    self.cfg.kind.name(),
                    error_chain(&e)
                ))
            })?;
            if status.is_success() {
                return serde_json::from_str(&text).map_err(|e| {
                    AgentError::Malformed(format!(
                        "the {} API's reply is not JSON ({e}): {}",
                        self.cfg.kind.name(),
                        excerpt(&text)
                    ))
                });
            }
            let message = api_message(&text);
            let code = status.as_u16();
            if code == 401 || code == 403 {
                return Err(AgentError::Unauthorized {
                    status: code,
                    env: self.cfg.kind.key_env(),
                    message,
                });
            }
            let retryable = code == 429 || status.is_server_error();
            if !retryable || attempt >= self.cfg.max_retries {
                return Err(AgentError::Api {
                    status: code,
                    message,
                    attempts: attempt + 1,
                });
            }
            let wait = if code == 429 {
                retry_after
                    .unwrap_or(self.cfg.retry_base * 2u32.pow(attempt))
                    .min(self.cfg.max_retry_after)
            } else {
                self.cfg.retry_base * 2u32.pow(attempt)
            };
            tracing::warn!(
                status = code,
                wait_ms = wait.as_millis() as u64,
                attempt = attempt + 1,
                "the {} API did not answer; retrying: {message}",
                self.cfg.kind.name()
            );
            std::thread::sleep(wait);
            attempt += 1;
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The start of a body, for an error message.
fn excerpt(text: &str) -> String {
    let t = text.trim();
    if t.is_empty() {
        return "(empty body)".into();
    }
    match t.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_owned(),
    }
}

/// `error.message` of an error body (all three APIs use it), or the body's start.
fn api_message(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("message"))
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .unwrap_or_else(|| excerpt(text))
}

fn data_url(img: &ToolImage) -> String {
    format!("data:{};base64,{}", img.mime, img.data_base64)
}

/// A Chat Completions request.
pub fn openai_request(model: &str, system: &str, turns: &[Turn]) -> Value {
    openai_body(model, system, turns, definitions_json(ToolFormat::OpenAi))
}

fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

fn openai_meta(v: &Value) -> ReplyMeta {
    ReplyMeta {
        input_tokens: u64_at(v, "/usage/prompt_tokens"),
        output_tokens: u64_at(v, "/usage/completion_tokens"),
        stop_reason: v
            .pointer("/choices/0/finish_reason")
            .and_then(Value::as_str)
            .map(|r| {
                match r {
                    "stop" => "end_turn",
                    "length" => "max_tokens",
                    "tool_calls" | "function_call" => "tool_use",
                    other => other,
                }
                .to_owned()
            }),
    }
}

fn anthropic_meta(v: &Value) -> ReplyMeta {
    ReplyMeta {
        input_tokens: u64_at(v, "/usage/input_tokens"),
        output_tokens: u64_at(v, "/usage/output_tokens"),
        stop_reason: v
            .get("stop_reason")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

/// A Chat Completions request offering `tools` (an empty list is left out: some servers
/// refuse `"tools": []`), with no system message when `system` is empty.
fn openai_body(model: &str, system: &str, turns: &[Turn], tools: Value) -> Value {
    let mut messages = Vec::new();
    if !system.is_empty() {
        messages.push(json!({"role": "system", "content": system}));
    }
    for t in turns {
        match t {
            Turn::User(text) => messages.push(json!({"role": "user", "content": text})),
            Turn::Assistant(r) => {
                let mut m = Map::new();
                m.insert("role".into(), json!("assistant"));
                m.insert(
                    "content".into(),
                    if r.text.is_empty() {
                        Value::Null
                    } else {
                        json!(r.text)
                    },
                );
                if !r.calls.is_empty() {
                    let calls: Vec<Value> = r
                        .calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments}})
                        })
                        .collect();
                    m.insert("tool_calls".into(), Value::Array(calls));
                }
                messages.push(Value::Object(m));
            }
            Turn::Tools(replies) => {
                // Tool messages carry text only, and must follow the assistant message
                // directly: the images go in one user message after them.
                for r in replies {
                    messages.push(json!({"role": "tool", "tool_call_id": r.id, "content": r.text}));
                }
                let mut parts = Vec::new();
                for r in replies.iter().filter(|r| !r.images.is_empty()) {
                    parts.push(json!({"type": "text", "text": format!(
                        "The image{} produced by the {} call {}:",
                        if r.images.len() == 1 { "" } else { "s" }, r.name, r.id)}));
                    for img in &r.images {
                        parts.push(
                            json!({"type": "image_url", "image_url": {"url": data_url(img)}}),
                        );
                    }
                }
                if !parts.is_empty() {
                    messages.push(json!({"role": "user", "content": parts}));
                }
            }
        }
    }
    let mut body = json!({"model": model, "messages": messages});
    if tools.as_array().is_some_and(|t| !t.is_empty()) {
        body["tools"] = tools;
    }
    body
}

/// Reads a Chat Completions reply.
pub fn parse_openai(v: &Value) -> Result<ModelReply, AgentError> {
    let malformed = |what: &str| {
        AgentError::Malformed(format!(
            "the openai API's reply has {what}: {}",
            excerpt(&v.to_string())
        ))
    };
    if let Some(msg) = v.pointer("/error/message").and_then(Value::as_str) {
        return Err(AgentError::Malformed(format!(
            "the openai API answered with an error: {msg}"
        )));
    }
    let message = v
        .pointer("/choices/0/message")
        .and_then(Value::as_object)
        .ok_or_else(|| malformed("no choices[0].message"))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        // Some servers send content parts.
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        Some(_) => return Err(malformed("a content that is neither text nor parts")),
    };
    let mut calls = Vec::new();
    match message.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (n, c) in list.iter().enumerate() {
                let name = c
                    .pointer("/function/name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed("a tool call without function.name"))?;
                let id = c
                    .get("id")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map_or_else(|| format!("call_{n}"), str::to_owned);
                let (input, arguments, bad_arguments) = match c.pointer("/function/arguments") {
                    Some(Value::String(s)) => read_arguments(s),
                    // Some servers send the object itself.
                    Some(o @ Value::Object(_)) => (o.clone(), o.to_string(), None),
                    None | Some(Value::Null) => (json!({}), "{}".to_owned(), None),
                    Some(other) => (
                        json!({}),
                        other.to_string(),
                        Some("the arguments must be a JSON object".to_owned()),
                    ),
                };
                calls.push(ToolUse {
                    id,
                    name: name.to_owned(),
                    input,
                    arguments,
                    bad_arguments,
                });
            }
        }
        Some(_) => return Err(malformed("a tool_calls that is not a list")),
    }
    Ok(ModelReply {
        text,
        calls,
        raw: Value::Object(message.clone()),
    })
}

fn read_arguments(s: &str) -> (Value, String, Option<String>) {
    if s.trim().is_empty() {
        return (json!({}), "{}".to_owned(), None);
    }
    match serde_json::from_str::<Value>(s) {
        Ok(v @ Value::Object(_)) => (v, s.to_owned(), None),
        Ok(_) => (
            json!({}),
            s.to_owned(),
            Some("the arguments must be a JSON object".to_owned()),
        ),
        Err(e) => (
            json!({}),
            s.to_owned(),
            Some(format!("the arguments are not valid JSON ({e})")),
        ),
    }
}

/// A Messages request.
pub fn anthropic_request(model: &str, max_tokens: u32, system: &str, turns: &[Turn]) -> Value {
    anthropic_body(
        model,
        max_tokens,
        system,
        turns,
        definitions_json(ToolFormat::Anthropic),
    )
}

/// A Messages request offering `tools` (left out when empty), with no system prompt when
/// `system` is empty.
fn anthropic_body(
    model: &str,
    max_tokens: u32,
    system: &str,
    turns: &[Turn],
    tools: Value,
) -> Value {
    let mut messages = Vec::new();
    for t in turns {
        match t {
            Turn::User(text) => messages.push(json!({"role": "user", "content": text})),
            Turn::Assistant(r) => {
                let content = if r.raw.is_array() {
                    r.raw.clone()
                } else {
                    let mut blocks = Vec::new();
                    if !r.text.is_empty() {
                        blocks.push(json!({"type": "text", "text": r.text}));
                    }
                    for c in &r.calls {
                        blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.input}));
                    }
                    Value::Array(blocks)
                };
                messages.push(json!({"role": "assistant", "content": content}));
            }
            Turn::Tools(replies) => {
                let blocks: Vec<Value> = replies
                    .iter()
                    .map(|r| {
                        let mut content = vec![json!({"type": "text", "text": r.text})];
                        for img in &r.images {
                            content.push(json!({"type": "image", "source": {
                                "type": "base64", "media_type": img.mime, "data": img.data_base64}}));
                        }
                        json!({"type": "tool_result", "tool_use_id": r.id,
                               "content": content, "is_error": r.is_error})
                    })
                    .collect();
                messages.push(json!({"role": "user", "content": blocks}));
            }
        }
    }
    let mut body = json!({"model": model, "max_tokens": max_tokens, "messages": messages});
    if !system.is_empty() {
        body["system"] = json!(system);
    }
    if tools.as_array().is_some_and(|t| !t.is_empty()) {
        body["tools"] = tools;
    }
    body
}

/// Reads a Messages reply.
pub fn parse_anthropic(v: &Value) -> Result<ModelReply, AgentError> {
    let malformed = |what: &str| {
        AgentError::Malformed(format!(
            "the anthropic API's reply has {what}: {}",
            excerpt(&v.to_string())
        ))
    };
    if v.get("type").and_then(Value::as_str) == Some("error") {
        return Err(AgentError::Malformed(format!(
            "the anthropic API answered with an error: {}",
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("(no message)")
        )));
    }
    let content = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no content list"))?;
    let mut text = String::new();
    let mut calls = Vec::new();
    for b in content {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => {
                if let Some(t) = b.get("text").and_then(Value::as_str) {
                    text.push_str(t);
                }
            }
            Some("tool_use") => {
                let id = b
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed("a tool_use block without an id"))?;
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| malformed("a tool_use block without a name"))?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                let bad_arguments =
                    (!input.is_object()).then(|| "the input must be a JSON object".to_owned());
                calls.push(ToolUse {
                    id: id.to_owned(),
                    name: name.to_owned(),
                    arguments: input.to_string(),
                    input,
                    bad_arguments,
                });
            }
            // Thinking and other blocks go back verbatim with `raw`.
            _ => {}
        }
    }
    Ok(ModelReply {
        text,
        calls,
        raw: Value::Array(content.clone()),
    })
}

/// The prefix of the ids given to Gemini calls that came without one (Gemini's own ids are
/// sent back; these are not).
const GEMINI_NO_ID: &str = "gemini_call_";

fn gemini_meta(v: &Value, calls: bool) -> ReplyMeta {
    ReplyMeta {
        input_tokens: u64_at(v, "/usageMetadata/promptTokenCount"),
        output_tokens: u64_at(v, "/usageMetadata/candidatesTokenCount"),
        stop_reason: v
            .pointer("/candidates/0/finishReason")
            .and_then(Value::as_str)
            .map(|r| {
                match r {
                    "STOP" if calls => "tool_use",
                    "STOP" => "end_turn",
                    "MAX_TOKENS" => "max_tokens",
                    other => other,
                }
                .to_owned()
            }),
    }
}

/// A generateContent request offering `tools` (a list of Tool objects, left out when
/// empty), with no system instruction when `system` is empty.
fn gemini_body(max_tokens: u32, system: &str, turns: &[Turn], tools: Value) -> Value {
    let mut contents = Vec::new();
    for t in turns {
        match t {
            Turn::User(text) => contents.push(json!({"role": "user", "parts": [{"text": text}]})),
            Turn::Assistant(r) => {
                let parts = match r.raw.get("parts") {
                    Some(p @ Value::Array(_)) => p.clone(),
                    _ => {
                        let mut parts = Vec::new();
                        if !r.text.is_empty() {
                            parts.push(json!({"text": r.text}));
                        }
                        for c in &r.calls {
                            let mut call = json!({"name": c.name, "args": c.input});
                            if !c.id.starts_with(GEMINI_NO_ID) {
                                call["id"] = json!(c.id);
                            }
                            parts.push(json!({"functionCall": call}));
                        }
                        Value::Array(parts)
                    }
                };
                contents.push(json!({"role": "model", "parts": parts}));
            }
            Turn::Tools(replies) => {
                let mut parts: Vec<Value> = replies
                    .iter()
                    .map(|r| {
                        let key = if r.is_error { "error" } else { "output" };
                        let mut response = json!({"name": r.name, "response": {key: r.text}});
                        if !r.id.starts_with(GEMINI_NO_ID) {
                            response["id"] = json!(r.id);
                        }
                        json!({"functionResponse": response})
                    })
                    .collect();
                // The figures follow the responses, in the same turn.
                for r in replies {
                    for img in &r.images {
                        parts.push(
                            json!({"inlineData": {"mimeType": img.mime, "data": img.data_base64}}),
                        );
                    }
                }
                contents.push(json!({"role": "user", "parts": parts}));
            }
        }
    }
    let mut body =
        json!({"contents": contents, "generationConfig": {"maxOutputTokens": max_tokens}});
    if !system.is_empty() {
        body["systemInstruction"] = json!({"parts": [{"text": system}]});
    }
    if tools.as_array().is_some_and(|t| !t.is_empty()) {
        body["tools"] = tools;
    }
    body
}

/// Reads a generateContent reply.
pub fn parse_gemini(v: &Value) -> Result<ModelReply, AgentError> {
    let malformed = |what: &str| {
        AgentError::Malformed(format!(
            "the gemini API's reply has {what}: {}",
            excerpt(&v.to_string())
        ))
    };
    if let Some(msg) = v.pointer("/error/message").and_then(Value::as_str) {
        return Err(AgentError::Malformed(format!(
            "the gemini API answered with an error: {msg}"
        )));
    }
    let candidate = v.pointer("/candidates/0").ok_or_else(|| {
        match v.pointer("/promptFeedback/blockReason") {
            Some(r) => AgentError::Malformed(format!("the gemini API blocked the prompt ({r})")),
            None => malformed("no candidates"),
        }
    })?;
    // A candidate without content (stopped for safety, say) is an empty answer.
    let parts = match candidate.pointer("/content/parts") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(p)) => p.clone(),
        Some(_) => return Err(malformed("a content whose parts are not a list")),
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    for p in &parts {
        if let Some(call) = p.get("functionCall") {
            let name = call
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| malformed("a functionCall without a name"))?;
            let input = call.get("args").cloned().unwrap_or_else(|| json!({}));
            let input = if input.is_null() { json!({}) } else { input };
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map_or_else(|| format!("{GEMINI_NO_ID}{}", calls.len()), str::to_owned);
            let bad_arguments =
                (!input.is_object()).then(|| "the args must be a JSON object".to_owned());
            calls.push(ToolUse {
                id,
                name: name.to_owned(),
                arguments: input.to_string(),
                input,
                bad_arguments,
            });
        } else if let Some(t) = p.get("text").and_then(Value::as_str) {
            // Thought summaries are not the answer.
            if p.get("thought").and_then(Value::as_bool) != Some(true) {
                text.push_str(t);
            }
        }
    }
    Ok(ModelReply {
        text,
        calls,
        raw: json!({"parts": parts}),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_provider_without_a_model_gets_the_one_default_constant() {
        for (kind, constant) in [
            (ProviderKind::OpenAi, DEFAULT_OPENAI_MODEL),
            (ProviderKind::Anthropic, DEFAULT_ANTHROPIC_MODEL),
            (ProviderKind::Gemini, DEFAULT_GEMINI_MODEL),
        ] {
            let cfg = ProviderConfig::from_env(kind, None, Some("http://127.0.0.1:9".into()));
            let cfg = cfg.expect("a config");
            assert_eq!(cfg.model, constant);
            assert_eq!(kind.default_model(), constant);
            assert!(default_models().contains(&format!("{constant} for {}", kind.name())));
        }
        // Retired 2026-11-30 (the Anthropic SDK warns on every request naming it).
        assert_ne!(DEFAULT_ANTHROPIC_MODEL, "claude-sonnet-4-5");
    }
}
