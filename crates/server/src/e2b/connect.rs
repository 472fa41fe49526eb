//! The Connect protocol (connectrpc.com/docs/protocol) as envd's clients speak it: the JSON
//! codec; unary calls as a plain JSON body each way, errors as a non-200 status with
//! `{"code","message"}`; server streams as envelopes (a flags byte, a big-endian u32 length,
//! the message), the last one flagged end-of-stream and holding `{}` or `{"error"}`.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::Refused;

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    Unauthenticated,
    PermissionDenied,
    Unimplemented,
    Unavailable,
    ResourceExhausted,
    Internal,
}

impl Code {
    fn name(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unauthenticated => "unauthenticated",
            Code::PermissionDenied => "permission_denied",
            Code::Unimplemented => "unimplemented",
            Code::Unavailable => "unavailable",
            Code::ResourceExhausted => "resource_exhausted",
            Code::Internal => "internal",
        }
    }

    /// The HTTP status of a unary error with this code (the protocol's table).
    fn status(self) -> StatusCode {
        match self {
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// A failed call.
#[derive(Debug)]
pub(crate) struct RpcError {
    pub code: Code,
    pub message: String,
    /// Answer with this plain HTTP status instead (the SDK reads a 502 as "the sandbox is
    /// gone", as from E2B's proxy).
    pub plain: Option<StatusCode>,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            plain: None,
        }
    }

    pub fn json(&self) -> Value {
        json!({"code": self.code.name(), "message": self.message})
    }
}

impl From<Refused> for RpcError {
    fn from(r: Refused) -> RpcError {
        let plain = matches!(r, Refused::Gone(_)).then_some(StatusCode::BAD_GATEWAY);
        let code = match r {
            Refused::Gone(_) => Code::Unavailable,
            Refused::Unauthorized(_) => Code::Unauthenticated,
        };
        RpcError {
            code,
            message: r.message(),
            plain,
        }
    }
}

impl From<runcell_engine::EngineError> for RpcError {
    fn from(e: runcell_engine::EngineError) -> RpcError {
        let api: crate::error::ApiError = e.into();
        let (status, body) = api.parts();
        let code = match status.as_u16() {
            400 => Code::InvalidArgument,
            404 => Code::NotFound,
            409 => Code::FailedPrecondition,
            413 | 429 | 507 => Code::ResourceExhausted,
            503 => Code::Unavailable,
            _ => Code::Internal,
        };
        RpcError::new(code, body.error.message)
    }
}

impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        if let Some(status) = self.plain {
            return (status, self.message).into_response();
        }
        (
            self.code.status(),
            [(header::CONTENT_TYPE, "application/json")],
            self.json().to_string(),
        )
            .into_response()
    }
}

/// Whether the request is a streaming call (`application/connect+json`).
pub(crate) fn is_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/connect+"))
}

/// Refuses a codec other than JSON, or compression: envd's clients send neither.
pub(crate) fn check_codec(headers: &HeaderMap) -> Result<(), RpcError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ct = ct.split(';').next().unwrap_or("").trim();
    if ct != "application/json" && ct != "application/connect+json" {
        return Err(RpcError::new(
            Code::InvalidArgument,
            format!("runcell speaks the Connect protocol's JSON codec only, not {ct:?}"),
        ));
    }
    for h in ["content-encoding", "connect-content-encoding"] {
        if let Some(v) = headers.get(h).and_then(|v| v.to_str().ok()) {
            if v != "identity" {
                return Err(RpcError::new(
                    Code::Unimplemented,
                    format!("compressed requests ({v}) are not supported"),
                ));
            }
        }
    }
    Ok(())
}

/// The request message: the body itself (unary), or its one envelope (server streaming).
pub(crate) fn request_message(headers: &HeaderMap, body: &Bytes) -> Result<Value, RpcError> {
    let bytes: &[u8] = if is_stream(headers) {
        let bad = || RpcError::new(Code::InvalidArgument, "a malformed request envelope");
        if body.len() < 5 {
            return Err(bad());
        }
        if body[0] & 1 != 0 {
            return Err(RpcError::new(
                Code::Unimplemented,
                "compressed messages are not supported",
            ));
        }
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        body.get(5..5 + len).ok_or_else(bad)?
    } else {
        body
    };
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        RpcError::new(
            Code::InvalidArgument,
            format!("the request is not a JSON message: {e}"),
        )
    })
}

/// A unary call's reply.
pub(crate) fn unary(message: Value) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        message.to_string(),
    )
        .into_response()
}

/// One envelope of a server stream.
pub(crate) fn envelope(message: &Value) -> Bytes {
    frame(0, message.to_string().as_bytes())
}

/// The end of a server stream: `{}`, or the call's error.
pub(crate) fn end_of_stream(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        Some(e) => json!({"error": e.json()}),
        None => json!({}),
    };
    frame(2, body.to_string().as_bytes())
}

fn frame(flags: u8, data: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + data.len());
    out.push(flags);
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    Bytes::from(out)
}

/// A server stream's reply from its envelopes as they come.
pub(crate) fn stream(frames: impl futures_util::Stream<Item = Bytes> + Send + 'static) -> Response {
    use futures_util::StreamExt;
    Response::builder()
        .header(header::CONTENT_TYPE, "application/connect+json")
        .body(Body::from_stream(frames.map(Ok::<_, std::io::Error>)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A streaming call that failed before its first message: a 200 holding only the end.
pub(crate) fn stream_error(e: RpcError) -> Response {
    if e.plain.is_some() {
        return e.into_response();
    }
    let end = end_of_stream(Some(&e));
    stream(futures_util::stream::iter([end]))
}

/// The call's deadline (`Connect-Timeout-Ms`).
pub(crate) fn timeout(headers: &HeaderMap) -> Option<std::time::Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(std::time::Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_carry_their_length_and_flags() {
        let e = envelope(&json!({"a": 1}));
        assert_eq!(e[0], 0);
        assert_eq!(u32::from_be_bytes([e[1], e[2], e[3], e[4]]), 7);
        assert_eq!(&e[5..], br#"{"a":1}"#);
        let end = end_of_stream(Some(&RpcError::new(Code::NotFound, "gone")));
        assert_eq!(end[0], 2);
        let v: Value = serde_json::from_slice(&end[5..]).expect("ok");
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(&end_of_stream(None)[5..], b"{}");
    }

    #[test]
    fn requests_are_read_from_their_envelope_when_streaming() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            "application/connect+json".parse().expect("ok"),
        );
        let body = envelope(&json!({"x": "y"}));
        assert_eq!(request_message(&h, &body).expect("ok")["x"], "y");
        assert!(request_message(&h, &Bytes::from_static(b"\0\0\0\0\x09{}")).is_err());
        h.insert(
            header::CONTENT_TYPE,
            "application/json".parse().expect("ok"),
        );
        assert_eq!(
            request_message(&h, &Bytes::from_static(br#"{"x":1}"#)).expect("ok")["x"],
            1
        );
        assert!(check_codec(&h).is_ok());
        h.insert(
            header::CONTENT_TYPE,
            "application/proto".parse().expect("ok"),
        );
        assert!(check_codec(&h).is_err());
    }
}
