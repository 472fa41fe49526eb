//! What every `/mistral` handler shares: who calls, where agents, conversations and figures
//! are kept, how times are written.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;

use super::error::Error;
use crate::caller::KeyRef;
use crate::state::{AppState, Principal, Tenant};
use crate::vendor::FileStore;

pub(super) fn agent_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "mistral-agents", "ag")
}

pub(super) fn conversation_store(state: &AppState) -> FileStore {
    FileStore::new(
        &state.engine.config().data_dir,
        "mistral-conversations",
        "conv",
    )
}

/// The figures the code showed, for `tool_file` chunks.
pub(super) fn file_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "mistral", "file")
}

/// The caller's tenant (and key: its approval default), from `Authorization: Bearer` (what the SDK sends).
#[derive(Debug)]
pub(crate) struct Caller(pub Tenant, pub Option<KeyRef>);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        match Principal::of_vendor_request(&parts.headers, None, state).await? {
            Ok(p) => Ok(Caller(p.tenant, p.key)),
            Err(why) => Err(Error::new(
                StatusCode::UNAUTHORIZED,
                format!("Unauthorized: {why}"),
            )),
        }
    }
}

/// A time as Mistral's objects give it.
pub(super) fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}
