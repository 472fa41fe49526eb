//! Vendor-compatible prefixes (DESIGN.md §11): code written against a hosted code tool
//! (Anthropic's `code_execution`, OpenAI's `code_interpreter`, Gemini's `code_execution`,
//! Mistral's `code_interpreter`) switches to runcell by changing its SDK's base URL and key.
//! runcell answers those requests itself: the conversation goes to the model the operator
//! configured (`serve --agent-provider`), whose tool calls run in a runcell session of the
//! caller's tenant (one per vendor container, interaction chain or conversation, listed in
//! `/v1/sessions`, every cell in the audit log), and the reply comes back in the vendor's wire
//! shapes and error envelopes.

pub(crate) mod anthropic;
pub(crate) mod approval;
mod code_loop;
mod file_store;
pub(crate) mod gemini;
pub(crate) mod mistral;
pub(crate) mod openai;
mod sandbox;
mod session;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use runcell_agent::ProviderConfig;
use runcell_engine::{CancelToken, Engine};

use crate::error::ApiError;

pub(crate) use file_store::{FileStore, StoredFile};

/// The model behind the vendor prefixes, set when the server starts.
#[derive(Debug, Clone)]
pub struct VendorConfig {
    pub provider: ProviderConfig,
    /// Whether `provider.model` answers whatever model a request names (the operator chose
    /// it: `serve --agent-model`); otherwise a request's model goes to the provider as is.
    pub pin_model: bool,
    /// Model replies at most per request; past it the reply stops with the vendor's "paused"
    /// reason, and sending it back continues the turn.
    pub max_steps: usize,
}

impl VendorConfig {
    /// The provider to ask for one request that names `model` and allows `max_tokens`.
    pub(crate) fn provider_for(&self, model: &str, max_tokens: Option<u64>) -> ProviderConfig {
        let mut p = self.provider.clone();
        if !self.pin_model && !model.trim().is_empty() {
            p.model = model.to_owned();
        }
        if let Some(t) = max_tokens {
            p.max_tokens = u32::try_from(t).unwrap_or(u32::MAX);
        }
        p
    }
}

/// A refusal decided in front of every route (the `Host` check, the connection cap), in the
/// envelope of the API `path` belongs to: a vendor's SDK reads only its vendor's.
pub(crate) fn refusal(path: &str, e: ApiError) -> Response {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|r| r.is_empty() || r.starts_with('/'))
    };
    if under("/anthropic") {
        anthropic::Error::from(e).into_response()
    } else if under("/openai") {
        openai::Error::from(e).into_response()
    } else if under("/e2b") {
        crate::e2b::Error::from(e).into_response()
    } else if under("/gemini") {
        gemini::Error::from(e).into_response()
    } else if under("/mistral") {
        mistral::Error::from(e).into_response()
    } else {
        e.into_response()
    }
}

/// Stops a run whose client went away: no further model call, and the running cell is
/// interrupted. Disarmed once the reply is complete.
pub(crate) struct Abort {
    pub stop: Arc<AtomicBool>,
    pub cancel: CancelToken,
    pub engine: Engine,
    pub session: Option<String>,
    pub armed: bool,
}

impl Drop for Abort {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(s) = &self.session {
            self.engine.sessions().cancel(s, &self.cancel);
        }
    }
}

/// One server-sent event.
pub(crate) fn sse(event: &str, data: &serde_json::Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}
