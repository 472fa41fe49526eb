//! E2B's error envelope, and why a data-plane request is refused.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use runcell_engine::EngineError;

use crate::error::ApiError;

/// E2B's error envelope, `{"code": STATUS, "message"}`, for the control plane and envd's REST
/// endpoints alike (the SDK reads `message`).
#[derive(Debug)]
pub(crate) struct Error {
    pub status: StatusCode,
    pub message: String,
}

impl Error {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    pub fn not_found(id: &str) -> Error {
        Error::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        let (status, body) = e.parts();
        Error::new(status, body.error.message)
    }
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Error {
        ApiError::from(e).into()
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

/// Why a data-plane request is refused.
#[derive(Debug)]
pub(crate) enum Refused {
    /// No such sandbox, or no longer running: E2B's proxy answers 502 then.
    Gone(String),
    Unauthorized(&'static str),
}

impl Refused {
    pub fn status(&self) -> StatusCode {
        match self {
            Refused::Gone(_) => StatusCode::BAD_GATEWAY,
            Refused::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Refused::Gone(id) => format!("sandbox {id} is not running (killed or timed out)"),
            Refused::Unauthorized(m) => (*m).to_owned(),
        }
    }
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Error {
        Error::new(r.status(), r.message())
    }
}
