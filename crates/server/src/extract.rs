//! Extractors whose rejections use the API's error envelope.

use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};

use crate::error::ApiError;

/// JSON bodies: malformed JSON, wrong types and unknown fields are a 400 `invalid_request`,
/// and so is any body but a JSON object (serde would build a struct from an array of its
/// fields in order, which no schema of the API allows).
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let axum::Json(body) = axum::Json::<serde_json::Value>::from_request(req, state).await?;
        if !body.is_object() {
            return Err(ApiError::invalid("the body must be a JSON object"));
        }
        serde_path_to_error::deserialize(body)
            .map(ApiJson)
            .map_err(|e| {
                ApiError::invalid(format!(
                    "Failed to deserialize the JSON body into the target type: {e}"
                ))
            })
    }
}

/// A field that holds an object: `Some(T)` from a JSON object only, `None` from null or
/// nothing (for `#[serde(default, deserialize_with = "…")]`).
pub(crate) fn object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error;
    use serde::Deserialize;
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v @ serde_json::Value::Object(_)) => {
            T::deserialize(v).map(Some).map_err(D::Error::custom)
        }
        Some(_) => Err(D::Error::custom("expected an object")),
    }
}

/// A field that holds a list of objects, each a JSON object (see [`object`]).
pub(crate) fn objects<'de, D, T>(d: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::Error;
    use serde::Deserialize;
    let Some(items) = Option::<Vec<serde_json::Value>>::deserialize(d)? else {
        return Ok(None);
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| match v {
            serde_json::Value::Object(_) => {
                T::deserialize(v).map_err(|e| D::Error::custom(format!("[{i}]: {e}")))
            }
            _ => Err(D::Error::custom(format!("[{i}]: expected an object"))),
        })
        .collect::<Result<Vec<T>, D::Error>>()
        .map(Some)
}

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
        if let Some(slow) = crate::error::body_too_slow(&r) {
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
