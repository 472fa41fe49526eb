//! `/openai/v1`: OpenAI's Responses API with the `code_interpreter` tool, its Containers API
//! and the part of its Files API those take file ids from, for the official SDKs pointed at
//! `http://HOST/openai/v1` with a runcell API key as their key. A container is a runcell
//! session of the caller's tenant (`cntr_X` is session `ses_X`), and its files are the
//! session's /mnt/data.

mod containers;
mod files;
mod responses;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::FileStore;
use crate::error::{ApiError, ErrorCode};
use crate::state::{AppState, Tenant};

/// The routes, to be nested at `/openai/v1`; whatever else is asked there is answered in
/// OpenAI's envelope too.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/responses", post(responses::create))
        .route("/responses/{id}", get(responses::retrieve))
        .route(
            "/containers",
            get(containers::list).post(containers::create),
        )
        .route(
            "/containers/{id}",
            get(containers::retrieve).delete(containers::delete),
        )
        .route(
            "/containers/{id}/files",
            get(containers::list_files).post(containers::create_file),
        )
        .route(
            "/containers/{id}/files/{file}",
            get(containers::retrieve_file).delete(containers::delete_file),
        )
        .route(
            "/containers/{id}/files/{file}/content",
            get(containers::file_content),
        )
        .route("/files", get(files::list).post(files::upload))
        .route("/files/{id}", get(files::retrieve).delete(files::delete))
        .route("/files/{id}/content", get(files::content))
        .fallback(|uri: axum::http::Uri| async move {
            Error::not_found(format!("Invalid URL (/openai/v1{})", uri.path()))
        })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("this endpoint does not serve {method}"),
            )
        })
}

/// Where OpenAI's files of every tenant are kept.
fn file_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "openai", "file")
}

/// Where stored responses are kept, for `previous_response_id` (their ids are `resp_...`).
fn response_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "openai-responses", "resp")
}

/// The container a session is: `ses_X` is `cntr_X`.
pub(crate) fn container_id(session: &str) -> String {
    format!("cntr_{}", session.strip_prefix("ses_").unwrap_or(session))
}

/// The session a container id names, if it can name one.
fn session_of(container: &str) -> Option<String> {
    let rest = container.strip_prefix("cntr_")?;
    let ok =
        !rest.is_empty() && rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_alphanumeric());
    ok.then(|| format!("ses_{rest}"))
}

/// An error in OpenAI's envelope: `{"error":{"message","type","param","code"}}`.
#[derive(Debug)]
pub(crate) struct Error {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
    code: Option<&'static str>,
}

impl Error {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Error {
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
    fn object(&self) -> Value {
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

/// The caller's tenant, from `Authorization: Bearer` (what the SDK sends).
#[derive(Debug)]
pub(crate) struct Caller(pub Tenant);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        match Tenant::of_vendor_request(&parts.headers, None, state).await? {
            Ok(t) => Ok(Caller(t)),
            Err(why) => Err(Error {
                code: Some("invalid_api_key"),
                ..Error::new(StatusCode::UNAUTHORIZED, "invalid_request_error", why)
            }),
        }
    }
}

/// Seconds since the epoch, as OpenAI's objects give times.
fn unix(t: chrono::DateTime<chrono::Utc>) -> i64 {
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
