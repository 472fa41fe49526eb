//! What every `/anthropic` handler shares: who calls, which session a container is, where
//! files are kept.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;

use super::error::Error;
use crate::caller::KeyRef;
use crate::state::{AppState, Principal, Tenant};
use crate::vendor::FileStore;
use runcell_engine::tools::ToolImage;
use serde_json::Value;

/// Where Anthropic's files of every tenant are kept.
pub(super) fn file_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "anthropic", "file")
}

/// The container a session is: `ses_X` is `container_X`.
pub(super) fn container_id(session: &str) -> String {
    format!(
        "container_{}",
        session.strip_prefix("ses_").unwrap_or(session)
    )
}

/// The session a container id names, if it can name one.
pub(super) fn session_of(container: &str) -> Option<String> {
    let rest = container.strip_prefix("container_")?;
    let ok =
        !rest.is_empty() && rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_alphanumeric());
    ok.then(|| format!("ses_{rest}"))
}

/// The caller's tenant (and key: its approval default), from `x-api-key` (what the SDK sends) or `Authorization: Bearer`.
#[derive(Debug)]
pub(crate) struct Caller(pub Tenant, pub Option<KeyRef>);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        match Principal::of_vendor_request(&parts.headers, Some("x-api-key"), state).await? {
            Ok(p) => Ok(Caller(p.tenant, p.key)),
            Err(why) => {
                let no_key = !parts.headers.contains_key("x-api-key")
                    && !parts
                        .headers
                        .contains_key(axum::http::header::AUTHORIZATION);
                let message = if no_key {
                    "an API key is required: send a runcell API key as x-api-key (the SDK's api_key)"
                } else {
                    why
                };
                Err(Error::new(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    message,
                ))
            }
        }
    }
}

/// A client's `tool_result` content: its text, and its images.
pub(super) fn tool_result_content(content: Option<&Value>) -> (String, Vec<ToolImage>) {
    match content {
        Some(Value::String(s)) => (s.clone(), Vec::new()),
        Some(Value::Array(parts)) => {
            let mut text = Vec::new();
            let mut images = Vec::new();
            for p in parts {
                match p
                    .get("type")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("")
                {
                    "text" => text.push(p.get("text").and_then(Value::as_str).unwrap_or("")),
                    "image"
                        if p.pointer("/source/type").and_then(Value::as_str) == Some("base64") =>
                    {
                        images.push(ToolImage {
                            mime: p
                                .pointer("/source/media_type")
                                .and_then(Value::as_str)
                                .unwrap_or("image/png")
                                .to_owned(),
                            data_base64: p
                                .pointer("/source/data")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_owned(),
                        })
                    }
                    _ => {}
                }
            }
            (text.join("\n"), images)
        }
        _ => (String::new(), Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_and_sessions_name_each_other() {
        let c = container_id("ses_0abc9");
        assert_eq!(c, "container_0abc9");
        assert_eq!(session_of(&c).as_deref(), Some("ses_0abc9"));
        for bad in ["ses_0abc9", "container_", "container_../x", "cntr_abc"] {
            assert_eq!(session_of(bad), None, "{bad}");
        }
    }
}
