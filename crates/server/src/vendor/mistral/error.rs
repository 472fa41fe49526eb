//! Errors in Mistral's envelope, for every `/mistral` route and for refusals in front of them.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::{ApiError, ErrorCode};
use crate::vendor::code_loop::LoopError;

/// An error in Mistral's envelope: `{"object":"error","message","type","param","code"}`;
/// a request that does not validate is a 422 that also carries FastAPI's `detail` list,
/// which the SDK reads.
#[derive(Debug)]
pub(crate) struct Error {
    pub(super) status: StatusCode,
    pub(super) message: String,
    /// Where in the body the fault is (`["body", "tools", 0, "type"]`), for a 422.
    loc: Option<Vec<Value>>,
}

impl Error {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
            loc: None,
        }
    }

    /// A request that does not validate, at `loc` in the body.
    pub(crate) fn invalid(loc: &[Value], message: impl Into<String>) -> Error {
        let mut full = vec![json!("body")];
        full.extend(loc.iter().cloned());
        Error {
            loc: Some(full),
            ..Error::new(StatusCode::UNPROCESSABLE_ENTITY, message)
        }
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

    fn body(&self) -> Value {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        };
        let mut v = json!({"object": "error", "message": self.message, "type": kind,
                           "param": null, "code": self.status.as_u16().to_string()});
        if let Some(loc) = &self.loc {
            v["param"] = json!(loc.last().and_then(Value::as_str));
            v["detail"] = json!([{"type": "value_error", "loc": loc, "msg": self.message}]);
        }
        v
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
            LoopError::Stopped => Error::new(StatusCode::BAD_REQUEST, "the client went away"),
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
        (self.status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_does_not_validate_is_a_422_with_its_detail() {
        let e = Error::invalid(&[json!("tools"), json!(0), json!("type")], "bad tool");
        assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY);
        let b = e.body();
        assert_eq!(b["object"], "error");
        assert_eq!(b["detail"][0]["loc"], json!(["body", "tools", 0, "type"]));
        assert_eq!(b["detail"][0]["msg"], "bad tool");
        assert_eq!(Error::not_found("x").body()["type"], "not_found_error");
    }
}
