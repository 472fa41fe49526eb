//! Extractors whose rejections use the API's error envelope.

use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};

use crate::error::ApiError;

/// JSON bodies: malformed JSON, wrong types and unknown fields are a 400 `invalid_request`.
#[derive(Debug, FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::BytesRejection(b) => b.into(),
            other => ApiError::invalid(other.body_text()),
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(r: BytesRejection) -> Self {
        if let Some(slow) = crate::connections::body_too_slow(&r) {
            return ApiError::too_slow(slow.to_string());
        }
        if r.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::body_too_large()
        } else {
            ApiError::invalid(r.body_text())
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::invalid(r.body_text())
    }
}

impl From<axum::extract::rejection::PathRejection> for ApiError {
    fn from(r: axum::extract::rejection::PathRejection) -> Self {
        if r.status().is_server_error() {
            // A route declared without the parameter its handler reads: our bug.
            ApiError::internal(r.body_text())
        } else {
            ApiError::invalid(r.body_text())
        }
    }
}

/// Path parameters: one that is not valid UTF-8 once percent-decoded (`/files/%FF`), or not
/// of the handler's type, is a 400 `invalid_request` in the error envelope.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct Path<T>(pub T);

/// Query strings, with the error envelope.
#[derive(Debug, FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);
