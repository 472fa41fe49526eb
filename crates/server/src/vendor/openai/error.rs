//! Errors in OpenAI's envelope, for every `/openai` route and for refusals in front of them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::{ApiError, ErrorCode};

/// An error in OpenAI's envelope: `{"error":{"message","type","param","code"}}`.
#[derive(Debug)]
pub(crate) struct Error {
    pub(super) status: StatusCode,
    pub(super) kind: &'static str,
    pub(super) message: String,
    pub(super) param: Option<String>,
    pub(super) code: Option<&'static str>,
}

impl Error {
    pub(super) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Error {
        Error {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A bad request naming the parameter at fault.
    pub(crate) fn invalid(param: Option<&str>, message: impl Into<String>) -> Error {
        Error {
            param: param.map(str::to_owned),
            code: Some("invalid_value"),
            ..Error::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Error {
        Error {
            code: Some("not_found"),
            ..Error::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
        }
    }

    pub(crate) fn too_large(message: impl Into<String>) -> Error {
        Error {
            code: Some("file_too_large"),
            ..Error::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                message,
            )
        }
    }

    /// Logs the cause; the client gets a generic message.
    pub(crate) fn internal(cause: impl std::fmt::Display) -> Error {
        tracing::error!(error = %cause, "internal error");
        Error::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "internal error; see the server log",
        )
    }

    /// The `error` object.
    pub(super) fn object(&self) -> Value {
        json!({"message": self.message, "type": self.kind, "param": self.param, "code": self.code})
    }
}

/// runcell's error, in OpenAI's words; the status is kept.
impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        let (status, body) = e.parts();
        let (kind, code) = match body.error.code {
            ErrorCode::Unauthorized => ("invalid_request_error", Some("invalid_api_key")),
            ErrorCode::NotFound => ("invalid_request_error", Some("not_found")),
            ErrorCode::PayloadTooLarge => ("invalid_request_error", Some("file_too_large")),
            ErrorCode::SessionBusy if status == StatusCode::TOO_MANY_REQUESTS => {
                ("rate_limit_exceeded", Some("rate_limit_exceeded"))
            }
            ErrorCode::Unavailable => ("server_error", Some("server_busy")),
            ErrorCode::Internal | ErrorCode::InsufficientStorage => ("server_error", None),
            _ => ("invalid_request_error", None),
        };
        Error {
            code,
            ..Error::new(status, kind, body.error.message)
        }
    }
}

impl From<runcell_engine::EngineError> for Error {
    fn from(e: runcell_engine::EngineError) -> Error {
        ApiError::from(e).into()
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": self.object()}))).into_response()
    }
}
