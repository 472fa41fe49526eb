//! Vendor-compatible prefixes (DESIGN.md §11): code written against a hosted code tool
//! (Anthropic's `code_execution`, OpenAI's `code_interpreter`) switches to runcell by changing
//! its SDK's base URL and key. runcell answers those requests itself: the conversation goes to
//! the model the operator configured (`serve --agent-provider`), whose tool calls run in a
//! runcell session of the caller's tenant (one per vendor container, listed in `/v1/sessions`,
//! every cell in the audit log), and the reply comes back in the vendor's wire shapes and error
//! envelopes.

pub(crate) mod anthropic;
mod code_loop;
mod file_store;
pub(crate) mod gemini;
pub(crate) mod mistral;
pub(crate) mod openai;
mod sandbox;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use runcell_agent::ProviderConfig;
use runcell_engine::{CancelToken, Engine};

use crate::error::ApiError;
use crate::state::{AppState, Tenant};

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

/// A new session of `tenant` for one conversation of `vendor`'s API (its metadata's
/// `source`).
pub(crate) async fn start_session(
    state: &AppState,
    tenant: &Tenant,
    vendor: &str,
) -> Result<String, ApiError> {
    let engine = state.engine.clone();
    let owner = tenant.0.clone();
    let metadata = [("source".to_owned(), vendor.to_owned())].into();
    let info = crate::sessions::blocking(move || {
        engine.sessions().create(runcell_engine::CreateSession {
            owner,
            metadata,
            ..runcell_engine::CreateSession::default()
        })
    })
    .await?;
    Ok(info.id)
}

/// `id` if it is a live session of `tenant` (one that ended, or another tenant's, is not).
pub(crate) fn live_session(state: &AppState, tenant: &Tenant, id: &str) -> Option<String> {
    state
        .engine
        .sessions()
        .get(id)
        .ok()
        .filter(|i| i.owner == tenant.0 && i.status != runcell_engine::SessionStatus::Dead)
        .map(|i| i.id)
}

/// One server-sent event.
pub(crate) fn sse(event: &str, data: &serde_json::Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// A JSON record of `tenant` kept in `store` (a stored interaction, conversation, agent);
/// `None` when there is none (another tenant's is none either).
pub(crate) async fn load_record<T: serde::de::DeserializeOwned + Send + 'static>(
    store: &FileStore,
    tenant: &str,
    id: &str,
) -> std::io::Result<Option<T>> {
    let (store, tenant, id) = (store.clone(), tenant.to_owned(), id.to_owned());
    let found = tokio::task::spawn_blocking(move || store.read(&tenant, &id))
        .await
        .map_err(std::io::Error::other)??;
    match found {
        Some((_, data)) => serde_json::from_slice(&data)
            .map(Some)
            .map_err(std::io::Error::other),
        None => Ok(None),
    }
}

/// Keeps `record` as `tenant`'s `id` in `store` (blocking).
pub(crate) fn save_record<T: serde::Serialize>(
    store: &FileStore,
    tenant: &str,
    id: &str,
    record: &T,
    session: Option<&str>,
) -> std::io::Result<()> {
    let data = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    store
        .put_as(
            tenant,
            id,
            "record.json",
            "application/json",
            &data,
            session,
            None,
        )
        .map(|_| ())
}
