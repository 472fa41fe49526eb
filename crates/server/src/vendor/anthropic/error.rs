//! Errors in Anthropic's envelope, for every `/anthropic` route and for refusals in front of them.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::{ApiError, ErrorCode};

/// An error in Anthropic's envelope: `{"type":"error","error":{"type","message"},"request_id"}`.
#[derive(Debug)]
pub(crate) struct Error {
    pub(super) status: StatusCode,
    /// Anthropic's `error.type`: `invalid_request_error`, `authentication_error`, ...
    pub(super) kind: &'static str,
    pub(super) message: String,
}

impl Error {
    pub(super) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Error {
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
    pub(super) fn object(&self) -> Value {
        json!({"type": self.kind, "message": self.message})
    }

    pub(super) fn body(&self, request_id: &str) -> Value {
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
pub(super) fn request_id() -> String {
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
