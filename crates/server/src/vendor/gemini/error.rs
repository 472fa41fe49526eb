//! Errors in Gemini's envelope, for every `/gemini` route and for refusals in front of them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::{ApiError, ErrorCode};
use crate::vendor::code_loop::LoopError;

/// An error in Gemini's envelope: `{"error":{"code","message","status"}}`.
#[derive(Debug)]
pub(crate) struct Error {
    pub(super) status: StatusCode,
    pub(super) message: String,
}

/// Google's canonical status name for an HTTP status.
fn status_name(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 413 | 422 => "INVALID_ARGUMENT",
        401 => "UNAUTHENTICATED",
        403 => "PERMISSION_DENIED",
        404 => "NOT_FOUND",
        405 => "UNIMPLEMENTED",
        409 => "ABORTED",
        429 => "RESOURCE_EXHAUSTED",
        499 => "CANCELLED",
        501 => "UNIMPLEMENTED",
        502 | 503 => "UNAVAILABLE",
        504 => "DEADLINE_EXCEEDED",
        _ => "INTERNAL",
    }
}

impl Error {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Error {
        Error::new(StatusCode::NOT_FOUND, message)
    }

    /// Logs the cause; the client gets a generic message.
    pub(crate) fn internal(cause: impl std::fmt::Display) -> Error {
        tracing::error!(error = %cause, "internal error");
        Error::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error; see the server log",
        )
    }

    pub(super) fn object(&self) -> Value {
        json!({"code": self.status.as_u16(), "message": self.message, "status": status_name(self.status)})
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        let (status, body) = e.parts();
        if body.error.code == ErrorCode::Internal {
            return Error::internal(body.error.message);
        }
        Error::new(status, body.error.message)
    }
}

impl From<runcell_engine::EngineError> for Error {
    fn from(e: runcell_engine::EngineError) -> Error {
        ApiError::from(e).into()
    }
}

impl From<LoopError> for Error {
    fn from(e: LoopError) -> Error {
        match e {
            LoopError::Engine(e) => e.into(),
            LoopError::Stopped => Error::new(
                StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
                "the client went away",
            ),
            LoopError::Upstream(runcell_agent::AgentError::Api {
                status, message, ..
            }) if matches!(status, 400 | 404 | 413 | 422 | 429) => Error::new(
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
                format!("the model provider refused the request: {message}"),
            ),
            LoopError::Upstream(other) => Error::new(
                StatusCode::BAD_GATEWAY,
                format!(
                    "the model provider failed: {}",
                    runcell_engine::error_chain(&other)
                ),
            ),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.object()}))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carry_googles_status_names() {
        let e = Error::not_found("no such interaction").object();
        assert_eq!(
            e,
            json!({"code": 404, "message": "no such interaction", "status": "NOT_FOUND"})
        );
        assert_eq!(
            status_name(StatusCode::TOO_MANY_REQUESTS),
            "RESOURCE_EXHAUSTED"
        );
    }
}
