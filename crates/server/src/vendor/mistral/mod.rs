//! `/mistral`: Mistral's Agents and Conversations APIs with the `code_interpreter` tool, for
//! the official SDK pointed at `http://HOST/mistral` (`server_url`) with a runcell API key as
//! its key. One runcell session of the caller's tenant per conversation; each run is a
//! `tool.execution` entry whose `info` carries the code and its output, and each figure a
//! `tool_file` chunk of the message after it, downloadable from `/v1/files/{id}/content`.

mod agents;
mod conversations;

use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::code_loop::LoopError;
use super::FileStore;
use crate::error::{ApiError, ErrorCode};
use crate::state::{AppState, Tenant};

/// The routes, to be nested at `/mistral`; whatever else is asked there is answered in
/// Mistral's envelope too.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/agents", post(agents::create).get(agents::list))
        .route(
            "/v1/agents/{id}",
            get(agents::retrieve).delete(agents::delete),
        )
        .route(
            "/v1/conversations",
            post(conversations::start).get(conversations::list),
        )
        .route(
            "/v1/conversations/{id}",
            post(conversations::append)
                .get(conversations::retrieve)
                .delete(conversations::delete),
        )
        .route(
            "/v1/conversations/{id}/history",
            get(conversations::history),
        )
        .route("/v1/files/{id}/content", get(file_content))
        .fallback(|uri: axum::http::Uri| async move {
            Error::not_found(format!("{}: no such endpoint here", uri.path()))
        })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("this endpoint does not serve {method}"),
            )
        })
}

fn agent_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "mistral-agents", "ag")
}

fn conversation_store(state: &AppState) -> FileStore {
    FileStore::new(
        &state.engine.config().data_dir,
        "mistral-conversations",
        "conv",
    )
}

/// The figures the code showed, for `tool_file` chunks.
fn file_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "mistral", "file")
}

/// An error in Mistral's envelope: `{"object":"error","message","type","param","code"}`;
/// a request that does not validate is a 422 that also carries FastAPI's `detail` list,
/// which the SDK reads.
#[derive(Debug)]
pub(crate) struct Error {
    status: StatusCode,
    message: String,
    /// Where in the body the fault is (`["body", "tools", 0, "type"]`), for a 422.
    loc: Option<Vec<Value>>,
}

impl Error {
    fn new(status: StatusCode, message: impl Into<String>) -> Error {
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

/// The caller's tenant, from `Authorization: Bearer` (what the SDK sends).
#[derive(Debug)]
pub(crate) struct Caller(pub Tenant);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        match Tenant::of_vendor_request(&parts.headers, None, state).await? {
            Ok(t) => Ok(Caller(t)),
            Err(why) => Err(Error::new(
                StatusCode::UNAUTHORIZED,
                format!("Unauthorized: {why}"),
            )),
        }
    }
}

/// A time as Mistral's objects give it.
fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// `GET /v1/files/{id}/content`: a figure a run showed.
async fn file_content(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let store = file_store(&state);
    let (t, i) = (tenant.0.clone(), id.clone());
    let found = tokio::task::spawn_blocking(move || store.read(&t, &i))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    let Some((meta, data)) = found else {
        return Err(Error::not_found(format!("File {id} not found")));
    };
    // Octet-stream whatever the file is: the SDK reads no other type as a download.
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}\"", meta.filename),
            ),
        ],
        data,
    )
        .into_response())
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
