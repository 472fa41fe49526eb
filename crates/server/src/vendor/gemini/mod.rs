//! `/gemini`: the Gemini API's `generateContent` / `streamGenerateContent` with the
//! `code_execution` tool, and its Interactions API, under both `/v1` and `/v1beta`, for the
//! official SDKs pointed at `http://HOST/gemini` with a runcell API key as their key
//! (`x-goog-api-key`, or `?key=`). The code runs in a runcell session of the caller's
//! tenant: one per interaction chain (`previous_interaction_id`), and for the stateless
//! `generateContent` one per conversation, found again from the history the client sends
//! back (see [`history_key`]).

mod generate;
mod interactions;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use sha2::Digest;

use super::code_loop::LoopError;
use super::FileStore;
use crate::error::{ApiError, ErrorCode};
use crate::state::{AppState, Tenant};

/// The routes, to be nested at `/gemini`; whatever else is asked there is answered in
/// Gemini's envelope too.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/{version}/models/{call}", post(generate::call))
        .route("/{version}/interactions", post(interactions::create))
        .route(
            "/{version}/interactions/{id}",
            get(interactions::retrieve).delete(interactions::delete),
        )
        .fallback(|uri: axum::http::Uri| async move {
            Error::new(
                StatusCode::NOT_FOUND,
                format!("{}: no such method here", uri.path()),
            )
        })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("this method does not serve {method}"),
            )
        })
}

/// The API versions the SDKs use.
fn check_version(version: &str) -> Result<(), Error> {
    match version {
        "v1" | "v1beta" | "v1alpha" => Ok(()),
        other => Err(Error::new(
            StatusCode::NOT_FOUND,
            format!("API version {other:?} is not served here: use v1 or v1beta"),
        )),
    }
}

/// Stored interactions, for `previous_interaction_id` (ids `int_...`).
fn interaction_store(state: &AppState) -> FileStore {
    FileStore::new(
        &state.engine.config().data_dir,
        "gemini-interactions",
        "int",
    )
}

/// The session each `generateContent` conversation runs in, by [`history_key`].
fn chat_store(state: &AppState) -> FileStore {
    FileStore::new(&state.engine.config().data_dir, "gemini-chats", "chat")
}

/// A `generateContent` conversation's key: a hash of what its turns say (each turn's role,
/// its text, its code and the code's output; not inline data or signatures, which an SDK
/// may re-encode). The server keeps the session of the conversation a reply ends under the
/// key of the contents up to and including that reply; the next request sends those
/// contents back before its new user turn, so the same key finds the session. A client that
/// edits earlier turns, or starts over, gets a fresh session.
pub(crate) fn history_key(contents: &[Value]) -> String {
    let mut h = sha2::Sha256::new();
    for c in contents {
        let role = c.get("role").and_then(Value::as_str).unwrap_or("user");
        h.update(format!("role:{role}\n").as_bytes());
        for p in c
            .get("parts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let field = |camel: &str, snake: &str| p.get(camel).or_else(|| p.get(snake)).cloned();
            if let Some(Value::String(t)) = p.get("text") {
                h.update(format!("text:{}:{t}\n", t.len()).as_bytes());
            }
            if let Some(code) = field("executableCode", "executable_code") {
                let c = code.get("code").and_then(Value::as_str).unwrap_or("");
                h.update(format!("code:{}:{c}\n", c.len()).as_bytes());
            }
            if let Some(r) = field("codeExecutionResult", "code_execution_result") {
                let o = r.get("output").and_then(Value::as_str).unwrap_or("");
                h.update(format!("output:{}:{o}\n", o.len()).as_bytes());
            }
        }
    }
    let digest = h.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("chat_{hex}")
}

/// An error in Gemini's envelope: `{"error":{"code","message","status"}}`.
#[derive(Debug)]
pub(crate) struct Error {
    status: StatusCode,
    message: String,
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
    fn new(status: StatusCode, message: impl Into<String>) -> Error {
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

    fn object(&self) -> Value {
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

/// The caller's tenant, from `x-goog-api-key` (what the SDKs send), `?key=`, or
/// `Authorization: Bearer`.
#[derive(Debug)]
pub(crate) struct Caller(pub Tenant);

/// `key=` of a query string.
fn query_key(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "key").then(|| {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Error> {
        let mut headers: HeaderMap = parts.headers.clone();
        if !headers.contains_key("x-goog-api-key") {
            if let Some(k) = query_key(parts.uri.query()) {
                if let Ok(v) = HeaderValue::from_str(&k) {
                    headers.insert("x-goog-api-key", v);
                }
            }
        }
        let header = headers
            .contains_key("x-goog-api-key")
            .then_some("x-goog-api-key");
        match Tenant::of_vendor_request(&headers, header, state).await? {
            Ok(t) => Ok(Caller(t)),
            Err(why) => Err(Error::new(
                StatusCode::UNAUTHORIZED,
                format!("API key not valid: {why}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_is_keyed_on_what_it_says_in_either_spelling() {
        let camel = vec![
            json!({"role": "user", "parts": [{"text": "fib?"}]}),
            json!({"role": "model", "parts": [
                {"executableCode": {"language": "PYTHON", "code": "print(55)"}},
                {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "55\n"}},
                {"inlineData": {"mimeType": "image/png", "data": "AAAA"}},
                {"text": "55", "thoughtSignature": "xyz"}]}),
        ];
        let snake = vec![
            json!({"parts": [{"text": "fib?"}]}),
            json!({"role": "model", "parts": [
                {"executable_code": {"code": "print(55)", "language": "PYTHON"}},
                {"code_execution_result": {"output": "55\n", "outcome": "OUTCOME_OK"}},
                {"text": "55"}]}),
        ];
        assert_eq!(history_key(&camel), history_key(&snake));
        assert_ne!(history_key(&camel), history_key(&camel[..1]));
        let edited = vec![
            camel[0].clone(),
            json!({"role": "model", "parts": [{"text": "56"}]}),
        ];
        assert_ne!(history_key(&camel), history_key(&edited));
        let key = history_key(&camel);
        let store = FileStore::new(std::path::Path::new("/tmp"), "x", "chat");
        assert!(store.is_id(&key), "{key}");
    }

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
        assert_eq!(query_key(Some("alt=sse&key=a%2Bb")).as_deref(), Some("a+b"));
        assert_eq!(query_key(Some("alt=sse")), None);
    }
}
