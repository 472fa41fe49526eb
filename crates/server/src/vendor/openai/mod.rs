//! `/openai/v1`: OpenAI's Responses API with the `code_interpreter` tool, its Containers API
//! and the part of its Files API those take file ids from, for the official SDKs pointed at
//! `http://HOST/openai/v1` with a runcell API key as their key. A container is a runcell
//! session of the caller's tenant (`cntr_X` is session `ses_X`), and its files are the
//! session's /mnt/data.

mod containers;
mod context;
mod error;
mod files;
mod responses;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;

pub(crate) use self::error::Error;
use crate::state::AppState;

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
