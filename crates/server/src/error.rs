//! Every HTTP error status is decided here, and clients never see internals: an internal
//! failure is logged with its chain and answered with a generic message.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_engine::EngineError;
use serde::Serialize;

/// The error codes of DESIGN.md §6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidRequest,
    Unauthorized,
    /// The request's `Host` is not one of the server's names, or a state-changing request
    /// came from another origin (DNS rebinding, cross-site forms).
    Forbidden,
    NotFound,
    /// The workspace's state refuses a well-formed request (a file where a directory is
    /// needed, a directory that is not empty); it can work once that state changes.
    Conflict,
    SessionBusy,
    LimitExceeded,
    PayloadTooLarge,
    /// The server has no room now (admission control, connections, sessions); comes with
    /// `Retry-After`.
    Unavailable,
    /// The disk where the server keeps its data is full: nothing was recorded or written,
    /// and the same request works once space is freed (reads keep working meanwhile).
    InsufficientStorage,
    Internal,
}

impl ErrorCode {
    fn status(self) -> StatusCode {
        match self {
            ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::Conflict => StatusCode::CONFLICT,
            ErrorCode::SessionBusy => StatusCode::TOO_MANY_REQUESTS,
            // A request over a maximum or a quota: retrying it unchanged cannot help.
            ErrorCode::LimitExceeded => StatusCode::BAD_REQUEST,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::InsufficientStorage => StatusCode::INSUFFICIENT_STORAGE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// `{"error":{"code","message"}}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
}

#[derive(Debug)]
pub struct ApiError {
    code: ErrorCode,
    /// Overrides the code's usual status (409 for a session that has ended).
    status: Option<StatusCode>,
    message: String,
    /// `Retry-After` seconds, for a refusal that passes with time (503, some 429s).
    retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            status: None,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }

    pub fn not_found(what: impl std::fmt::Display) -> Self {
        Self::new(ErrorCode::NotFound, format!("{what} not found"))
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, message)
    }

    /// The server is at capacity (connections, sessions): 503. A place frees as soon as one
    /// client is done, so one second is a fair first wait.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message).retry_after(1)
    }

    /// The same refusal, its message prefixed (`runs[3]: ` for a run of a batch).
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        self.message.insert_str(0, prefix);
        self
    }

    /// Asks the client to wait `seconds` before trying again (`Retry-After`).
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// A request body that arrived too slowly (`serve --body-timeout`, `--body-min-rate`):
    /// 408, the connection closes.
    pub fn too_slow(message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::InvalidRequest,
            status: Some(StatusCode::REQUEST_TIMEOUT),
            message: message.into(),
            retry_after: None,
        }
    }

    /// A route that exists, asked with a method it does not serve: 405.
    pub fn method_not_allowed(method: &axum::http::Method) -> Self {
        Self {
            code: ErrorCode::InvalidRequest,
            status: Some(StatusCode::METHOD_NOT_ALLOWED),
            message: format!("this route does not serve {method}"),
            retry_after: None,
        }
    }

    /// A request body over [`runcell_engine::MAX_REQUEST_BYTES`], quoting it.
    pub fn body_too_large() -> Self {
        Self::too_large(format!(
            "the request body is over the limit of {} bytes ({} MiB)",
            runcell_engine::MAX_REQUEST_BYTES,
            runcell_engine::MAX_REQUEST_BYTES >> 20
        ))
    }

    /// A multipart body that could not be read: too large (413) or malformed (400).
    pub fn multipart(e: axum::extract::multipart::MultipartError) -> Self {
        if let Some(slow) = body_too_slow(&e) {
            return Self::too_slow(slow.to_string());
        }
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::body_too_large()
        } else {
            Self::invalid(e.body_text())
        }
    }

    /// A session that can no longer run anything: 409 Conflict.
    pub fn ended(message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::SessionBusy,
            status: Some(StatusCode::CONFLICT),
            message: message.into(),
            retry_after: None,
        }
    }

    /// The model provider behind the chat failed (refused the key, was down, replied
    /// nonsense): 502, with the provider's own explanation, which holds no server internals.
    pub fn upstream(message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::Internal,
            status: Some(StatusCode::BAD_GATEWAY),
            message: message.into(),
            retry_after: None,
        }
    }

    /// 507: the data dir or the database has no room; `message` holds no host path.
    pub fn no_space(message: impl Into<String>) -> Self {
        let message = message.into();
        tracing::warn!(%message, "refused a write: no space left");
        Self::new(ErrorCode::InsufficientStorage, message)
    }

    /// Logs the real cause; the client gets a generic message.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "internal error");
        Self::new(ErrorCode::Internal, "internal error; see the server log")
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest(m) => ApiError::invalid(m.to_string()),
            EngineError::SessionEnded(m) => ApiError::ended(m.to_string()),
            EngineError::NotFound(m) => ApiError::not_found(m),
            EngineError::Conflict(m) => ApiError::new(ErrorCode::Conflict, m.to_string()),
            // A pause or fork of a session running a cell: it is not queued, so 409, not 429.
            EngineError::SessionBusy(m @ runcell_engine::Busy::Running { .. }) => {
                ApiError::ended(m.to_string())
            }
            EngineError::SessionBusy(m) => ApiError::new(ErrorCode::SessionBusy, m.to_string()),
            EngineError::Unresumable(m) => ApiError::new(ErrorCode::Conflict, m.to_string()),
            EngineError::LimitExceeded(m) => ApiError::new(ErrorCode::LimitExceeded, m.to_string()),
            EngineError::QuotaExceeded(m) => ApiError::new(ErrorCode::LimitExceeded, m.to_string()),
            EngineError::PayloadTooLarge(m) => ApiError::too_large(m.to_string()),
            EngineError::AtCapacity(m) => ApiError::unavailable(m.to_string()),
            // Memory comes back when sessions end; nobody knows when: a few seconds.
            EngineError::OverCommitted(m) => ApiError::new(ErrorCode::Unavailable, m.to_string())
                .retry_after(runcell_engine::RETRY_AFTER.as_secs()),
            EngineError::InsufficientStorage(m) => ApiError::no_space(m.to_string()),
            EngineError::Cancelled => ApiError::ended("the execution was cancelled before it ran"),
            EngineError::Store(s) if s.is_unavailable() => ApiError::unavailable(DB_DOWN),
            // The node cannot prove it owns its sessions: another node, or this one once it
            // renews its lease, can serve.
            EngineError::Store(runcell_store::StoreError::Fenced(m)) => ApiError::unavailable(m),
            EngineError::NotRecorded(r) if r.store_unavailable() => ApiError::unavailable(
                "the execution ran but could not be recorded: the database is unavailable \
                 (restarting or unreachable), so it is not acknowledged; retry shortly",
            ),
            EngineError::NotRecorded(r) if r.fenced().is_some() => {
                ApiError::unavailable(r.fenced().unwrap_or_default())
            }
            EngineError::IsolationMissing { .. }
            | EngineError::Unavailable(_)
            | EngineError::NoThread { .. }
            | EngineError::Sandbox(_)
            | EngineError::NoKernel
            | EngineError::NotRecorded(_)
            | EngineError::Store(_)
            | EngineError::TenantPolicy { .. }
            | EngineError::Io { .. } => ApiError::internal(runcell_engine::error_chain(&e)),
        }
    }
}

impl ApiError {
    /// The status and the envelope, for replies that cannot carry a status of their own (the
    /// last event of a stream that already started).
    pub fn parts(self) -> (StatusCode, ErrorBody) {
        let status = self.status.unwrap_or_else(|| self.code.status());
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
        };
        (status, body)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = self.code;
        let retry_after_set = self.retry_after;
        let (status, body) = self.parts();
        let mut resp = (status, Json(body)).into_response();
        let retry_after = match code {
            // Executions on a session are short on average; one second is a fair first wait.
            ErrorCode::SessionBusy if status == StatusCode::TOO_MANY_REQUESTS => Some(1),
            _ => None,
        };
        if let Some(s) = retry_after_set.or(retry_after) {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(s),
            );
        }
        if status == StatusCode::UNAUTHORIZED {
            // RFC 9110 §11.6.1: a 401 names the scheme that would be accepted.
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer realm=\"runcell\""),
            );
        }
        if status == StatusCode::REQUEST_TIMEOUT {
            // The rest of a body that came too slowly is not worth waiting for.
            resp.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        resp
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// A request body that came slower than `serve --body-min-rate` allows (`connections.rs`
/// cuts it off): 408.
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived too slowly: after {grace_s} s, at least {rate} bytes per second")]
pub struct BodyTooSlow {
    pub(crate) grace_s: u64,
    pub(crate) rate: u64,
}

/// The [`BodyTooSlow`] behind a body-reading error, if that is what it was.
pub(crate) fn body_too_slow<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Option<&'a BodyTooSlow> {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(slow) = e.downcast_ref::<BodyTooSlow>() {
            return Some(slow);
        }
        cur = e.source();
    }
    None
}

/// A store error of what the HTTP layer reads itself (API keys, checkpoints' chain heads).
pub(crate) fn store_error(e: runcell_store::StoreError) -> ApiError {
    use runcell_store::StoreError;
    match e {
        StoreError::Invalid(m) => ApiError::invalid(m),
        StoreError::NotFound(m) => ApiError::not_found(m),
        e if e.is_storage_full() => ApiError::no_space(NO_SPACE),
        e if e.is_unavailable() => ApiError::unavailable(DB_DOWN),
        StoreError::Fenced(m) => ApiError::unavailable(m),
        other => ApiError::internal(runcell_engine::error_chain(&other)),
    }
}

/// What a client is told when the (PostgreSQL) database cannot be reached.
const DB_DOWN: &str = "the database is unavailable (restarting or unreachable); retry shortly";

/// What a client is told when the database cannot take a write.
const NO_SPACE: &str =
    "the server's disk is full: nothing was recorded; retry once the operator frees space";

/// A JSON-RPC error `/mcp` answers before (or instead of) its MCP service: the body is
/// JSON-RPC's error object, as MCP clients expect, not the API's envelope.
#[derive(Debug)]
pub struct JsonRpcRefusal {
    pub kind: JsonRpcKind,
    /// The request's id, or `null` when it could not be read.
    pub id: serde_json::Value,
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonRpcKind {
    /// The body is not JSON (`-32700`).
    Parse,
    /// JSON, but not a JSON-RPC 2.0 request (`-32600`).
    InvalidRequest,
    /// A known method with unusable params (`-32602`): an in-band error of a well-formed
    /// request, so HTTP 200 as for any other JSON-RPC error reply.
    InvalidParams,
    /// An `Mcp-Session-Id` the server does not know (MCP transport: 404, so that the client
    /// starts a new session).
    UnknownSession,
    /// A refusal of the MCP service itself (its status kept, its text body made JSON-RPC).
    Transport(StatusCode),
}

impl JsonRpcRefusal {
    fn status_and_code(&self) -> (StatusCode, i32) {
        match self.kind {
            JsonRpcKind::Parse => (StatusCode::BAD_REQUEST, -32700),
            JsonRpcKind::InvalidRequest => (StatusCode::BAD_REQUEST, -32600),
            JsonRpcKind::InvalidParams => (StatusCode::OK, -32602),
            JsonRpcKind::UnknownSession => (StatusCode::NOT_FOUND, -32600),
            JsonRpcKind::Transport(status) => (status, -32600),
        }
    }

    /// The JSON-RPC error response.
    pub fn body(&self) -> serde_json::Value {
        let (_, code) = self.status_and_code();
        serde_json::json!({"jsonrpc": "2.0", "id": self.id,
            "error": {"code": code, "message": self.message}})
    }
}

impl IntoResponse for JsonRpcRefusal {
    fn into_response(self) -> Response {
        let (status, _) = self.status_and_code();
        (status, Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_engine::{Busy, Ended, Limit, NoSpace, Resource};

    fn status_of(e: EngineError) -> (StatusCode, ErrorCode, String) {
        let (status, body) = ApiError::from(e).parts();
        (status, body.error.code, body.error.message)
    }

    /// The status follows the variant, whatever its text says.
    #[test]
    fn an_ended_session_is_409_by_kind_not_by_text() {
        for during_execution in [false, true] {
            let ended = EngineError::SessionEnded(Ended {
                id: "ses_1".into(),
                during_execution,
            });
            let (status, code, message) = status_of(ended);
            assert_eq!(
                (status, code),
                (StatusCode::CONFLICT, ErrorCode::SessionBusy)
            );
            assert!(message.starts_with("session ses_1 "), "{message}");
        }
        // A missing file whose name says "ended" is still a missing file (the message test
        // this replaces answered it 409).
        let (status, code, message) = status_of(EngineError::NotFound(Resource::File {
            path: "ended.txt".into(),
        }));
        assert_eq!((status, code), (StatusCode::NOT_FOUND, ErrorCode::NotFound));
        assert_eq!(message, "file ended.txt not found");
        let (status, _, message) = status_of(EngineError::NotFound(Resource::Session {
            id: "ses_2".into(),
        }));
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(message, "session ses_2 not found");
    }

    #[test]
    fn every_refusal_keeps_its_status_and_message() {
        let over = EngineError::LimitExceeded(Limit::OverMaximum {
            limit: "idle_timeout_s",
            value: 3601u64.into(),
            maximum: 3600u64.into(),
            option: Some("--max-idle-timeout-s".into()),
        });
        assert_eq!(
            status_of(over),
            (
                StatusCode::BAD_REQUEST,
                ErrorCode::LimitExceeded,
                "idle_timeout_s 3601 exceeds this server's maximum of 3600 (serve --max-idle-timeout-s)"
                    .into()
            )
        );
        let busy = EngineError::SessionBusy(Busy::Queue {
            id: "ses_1".into(),
            waiting: 8,
        });
        assert_eq!(
            status_of(busy),
            (
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::SessionBusy,
                "session ses_1 already has 8 executions waiting".into()
            )
        );
        let full = ApiError::from(EngineError::InsufficientStorage(NoSpace::Audit));
        assert_eq!(full.parts().0, StatusCode::INSUFFICIENT_STORAGE);
        let committed = ApiError::from(EngineError::OverCommitted(runcell_engine::Committed {
            asked_mb: 1024,
            committed_mb: 2048,
            budget_mb: 2048,
        }));
        assert_eq!(
            committed.retry_after,
            Some(runcell_engine::RETRY_AFTER.as_secs())
        );
        assert_eq!(committed.parts().0, StatusCode::SERVICE_UNAVAILABLE);
        let capacity = ApiError::from(EngineError::AtCapacity(runcell_engine::Capacity {
            max_sessions: 10,
        }));
        assert_eq!(capacity.retry_after, Some(1));
        assert_eq!(
            status_of(EngineError::Cancelled).0,
            StatusCode::CONFLICT,
            "a request called off before it ran"
        );
        // runcell's own failures say nothing of their cause to the client.
        let (status, code, message) = status_of(EngineError::NoKernel);
        assert_eq!(
            (status, code),
            (StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal)
        );
        assert_eq!(message, "internal error; see the server log");
    }
}
