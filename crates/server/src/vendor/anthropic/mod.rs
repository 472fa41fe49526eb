//! `/anthropic`: Anthropic's Messages API with the code execution tool (`code_execution_20250825`,
//! `code_execution_20260120`, `code_execution_20260521`) and its Files API, for the official
//! SDKs pointed at `http://HOST/anthropic` with a runcell API key as their key. A container is
//! a runcell session of the caller's tenant: `container_X` is session `ses_X`.

mod files;
mod messages;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::FileStore;
use crate::error::{ApiError, ErrorCode};
use crate::state::{AppState, Tenant};

/// The routes, to be nested at `/anthropic`; whatever else is asked there is answered in
/// Anthropic's envelope too.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/messages", post(messages::create))
        .route("/v1/files", get(files::list).post(files::upload))
        .route("/v1/files/{id}", get(files::metadata).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::download))
        .fallback(|uri: axum::http::Uri| async move {
            Error::not_found(format!("{}: no such endpoint here", uri.path()))
        })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("this endpoint does not serve {method}"),
            )
        })
}

/// Where Anthropic's files of every tenant are kept.
fn file_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "anthropic", "file")
}

/// The container a session is: `ses_X` is `container_X`.
pub(crate) fn container_id(session: &str) -> String {
    format!(
        "container_{}",
        session.strip_prefix("ses_").unwrap_or(session)
    )
}

/// The session a container id names, if it can name one.
fn session_of(container: &str) -> Option<String> {
    let rest = container.strip_prefix("container_")?;
    let ok =
        !rest.is_empty() && rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_alphanumeric());
    ok.then(|| format!("ses_{rest}"))
}

/// An error in Anthropic's envelope: `{"type":"error","error":{"type","message"},"request_id"}`.
#[derive(Debug)]
pub(crate) struct Error {
    status: StatusCode,
    /// Anthropic's `error.type`: `invalid_request_error`, `authentication_error`, ...
    kind: &'static str,
    message: String,
}

impl Error {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Error {
        Error {
            status,
            kind,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Error {
        Error::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    pub(crate) fn too_large(message: impl Into<String>) -> Error {
        Error::new(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", message)
    }

    /// Logs the cause; the client gets a generic message.
    pub(crate) fn internal(cause: impl std::fmt::Display) -> Error {
        tracing::error!(error = %cause, "internal error");
        Error::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            "internal error; see the server log",
        )
    }

    /// The `error` object (a stream's last event carries it too).
    fn object(&self) -> Value {
        json!({"type": self.kind, "message": self.message})
    }

    fn body(&self, request_id: &str) -> Value {
        json!({"type": "error", "error": self.object(), "request_id": request_id})
    }
}

/// runcell's error, in Anthropic's words; the status is kept.
impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        let (status, body) = e.parts();
        let kind = match body.error.code {
            ErrorCode::Unauthorized => "authentication_error",
            ErrorCode::Forbidden => "permission_error",
            ErrorCode::NotFound => "not_found_error",
            ErrorCode::PayloadTooLarge => "request_too_large",
            ErrorCode::SessionBusy if status == StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            ErrorCode::Unavailable => "overloaded_error",
            ErrorCode::Internal | ErrorCode::InsufficientStorage => "api_error",
            _ => "invalid_request_error",
        };
        Error::new(status, kind, body.error.message)
    }
}

impl From<runcell_engine::EngineError> for Error {
    fn from(e: runcell_engine::EngineError) -> Error {
        ApiError::from(e).into()
    }
}

/// A fresh `req_...` id: Anthropic's replies carry one in the body and the `request-id` header.
fn request_id() -> String {
    runcell_engine::new_id("req")
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let id = request_id();
        let mut resp = (self.status, Json(self.body(&id))).into_response();
        if let Ok(v) = HeaderValue::from_str(&id) {
            resp.headers_mut().insert("request-id", v);
        }
        resp
    }
}

/// The caller's tenant, from `x-api-key` (what the SDK sends) or `Authorization: Bearer`.
#[derive(Debug)]
pub(crate) struct Caller(pub Tenant);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        match Tenant::of_vendor_request(&parts.headers, Some("x-api-key"), state).await? {
            Ok(t) => Ok(Caller(t)),
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
