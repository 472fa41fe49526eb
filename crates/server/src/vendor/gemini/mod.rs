//! `/gemini`: the Gemini API's `generateContent` / `streamGenerateContent` with the
//! `code_execution` tool, and its Interactions API, under both `/v1` and `/v1beta`, for the
//! official SDKs pointed at `http://HOST/gemini` with a runcell API key as their key
//! (`x-goog-api-key`, or `?key=`). The code runs in a runcell session of the caller's
//! tenant: one per interaction chain (`previous_interaction_id`), and for the stateless
//! `generateContent` one per conversation, found again from the history the client sends
//! back (see [`history_key`]).

mod context;
mod error;
mod generate;
mod interactions;

use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;

pub(crate) use self::error::Error;
use crate::state::AppState;

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
