//! `/mistral`: Mistral's Agents and Conversations APIs with the `code_interpreter` tool, for
//! the official SDK pointed at `http://HOST/mistral` (`server_url`) with a runcell API key as
//! its key. One runcell session of the caller's tenant per conversation; each run is a
//! `tool.execution` entry whose `info` carries the code and its output, and each figure a
//! `tool_file` chunk of the message after it, downloadable from `/v1/files/{id}/content`.

mod agents;
mod context;
mod conversations;
mod error;
mod files;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;

pub(crate) use self::error::Error;
use crate::state::AppState;

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
        .route("/v1/files/{id}/content", get(files::content))
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
