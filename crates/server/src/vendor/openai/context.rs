//! What every `/openai` handler shares: who calls, which session a container is, where
//! files are kept.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;

use super::error::Error;
use crate::caller::KeyRef;
use crate::state::{AppState, Principal, Tenant};
use crate::vendor::FileStore;

/// Where OpenAI's files of every tenant are kept.
pub(super) fn file_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "openai", "file")
}

/// Where stored responses are kept, for `previous_response_id` (their ids are `resp_...`).
pub(super) fn response_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "openai-responses", "resp")
}

/// The container a session is: `ses_X` is `cntr_X`.
pub(super) fn container_id(session: &str) -> String {
    format!("cntr_{}", session.strip_prefix("ses_").unwrap_or(session))
}

/// The session a container id names, if it can name one.
pub(super) fn session_of(container: &str) -> Option<String> {
    let rest = container.strip_prefix("cntr_")?;
    let ok =
        !rest.is_empty() && rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_alphanumeric());
    ok.then(|| format!("ses_{rest}"))
}

/// The caller's tenant (and key: its approval default), from `Authorization: Bearer` (what the SDK sends).
#[derive(Debug)]
pub(crate) struct Caller(pub Tenant, pub Option<KeyRef>);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        match Principal::of_vendor_request(&parts.headers, None, state).await? {
            Ok(p) => Ok(Caller(p.tenant, p.key)),
            Err(why) => Err(Error {
                code: Some("invalid_api_key"),
                ..Error::new(StatusCode::UNAUTHORIZED, "invalid_request_error", why)
            }),
        }
    }
}

/// Seconds since the epoch, as OpenAI's objects give times.
pub(super) fn unix(t: chrono::DateTime<chrono::Utc>) -> i64 {
    t.timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_and_sessions_name_each_other() {
        assert_eq!(container_id("ses_ab12"), "cntr_ab12");
        assert_eq!(session_of("cntr_ab12").as_deref(), Some("ses_ab12"));
        for bad in ["cntr_", "ses_ab12", "cntr_a/b", "container_ab"] {
            assert_eq!(session_of(bad), None, "{bad}");
        }
    }
}
