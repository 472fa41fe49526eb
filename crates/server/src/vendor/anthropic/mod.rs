//! `/anthropic`: Anthropic's Messages API with the code execution tool (`code_execution_20250825`,
//! `code_execution_20260120`, `code_execution_20260521`) and its Files API, for the official
//! SDKs pointed at `http://HOST/anthropic` with a runcell API key as their key. A container is
//! a runcell session of the caller's tenant: `container_X` is session `ses_X`.

mod context;
mod error;
mod files;
mod messages;
mod programmatic;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;

pub(crate) use self::error::Error;
use crate::state::AppState;

/// The routes, to be nested at `/anthropic`; whatever else is asked there is answered in
/// Anthropic's envelope too.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/messages", post(messages::create))
        .route("/v1/files", get(files::list).post(files::upload))
        .route("/v1/files/{id}", get(files::metadata).delete(files::delete))
        .route("/v1/files/{id}/content", get(files::download))
        .fallback(|uri: axum::http::Uri| async move {
            Error::not_found(format!("{}: no such endpoint here", uri.path()))
        })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("this endpoint does not serve {method}"),
            )
        })
}
