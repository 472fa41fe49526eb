//! E2B drop-in (docs/e2b.md): the unmodified E2B SDK (`e2b`, `e2b-code-interpreter`) works
//! against runcell with `E2B_API_URL=http://HOST/e2b`, `E2B_SANDBOX_URL=http://HOST/e2b/sandbox`
//! and `E2B_API_KEY` set to a runcell key.
//!
//! A sandbox is a runcell session of the key's tenant (its id is the sandbox id; it is listed
//! in `/v1/sessions`, every cell and command is in the audit log) whose workspace is the
//! sandbox's `/home/user`. The control plane (`/e2b/...`) speaks E2B's REST API; the data
//! plane (`/e2b/sandbox/...`) is envd's (the file REST endpoint, the `process.Process` and
//! `filesystem.Filesystem` Connect-RPC services) and the code interpreter's (`/execute`,
//! `/contexts`) on one URL: with `E2B_SANDBOX_URL` set the SDK sends every sandbox's requests
//! there, naming the sandbox in `E2b-Sandbox-Id` and proving access with the token it was given
//! at create (`X-Access-Token`, or `E2B-Traffic-Access-Token` where the SDK sends only that).

mod access;
mod connect;
mod control;
mod envd;
mod error;
mod filesystem;
mod interpreter;
mod names;
mod process;
mod sandboxes;

use axum::http::StatusCode;
use axum::routing::{delete, get, post};
use axum::Router;

use crate::state::AppState;

pub(crate) use error::Error;
pub(crate) use sandboxes::Sandboxes;

/// Every route under `/e2b`: the control plane at the root, the data plane under `/sandbox`.
pub(crate) fn router() -> Router<AppState> {
    let data = Router::new()
        .route("/health", get(envd::health))
        .route("/files", get(envd::download).post(envd::upload))
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .route("/execute", post(interpreter::execute))
        .route(
            "/contexts",
            get(interpreter::list_contexts).post(interpreter::create_context),
        )
        .route("/contexts/{id}", delete(interpreter::remove_context))
        .route("/contexts/{id}/restart", post(interpreter::restart_context));
    Router::new()
        .route("/sandboxes", get(control::list_v1).post(control::create))
        .route("/v2/sandboxes", get(control::list_v2).post(control::create))
        .route("/sandboxes/{id}", get(control::info).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/metrics", get(control::metrics))
        .nest("/sandbox", data)
        .fallback(|uri: axum::http::Uri| async move {
            Error::new(
                StatusCode::NOT_FOUND,
                format!("runcell's E2B API does not serve {}", uri.path()),
            )
        })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("this endpoint does not serve {method}"),
            )
        })
}

/// `/files` at the listener's root: the SDK's signed `download_url()` and `upload_url()` join
/// `/files` onto `E2B_SANDBOX_URL` as an absolute path, dropping its `/e2b/sandbox`.
pub(crate) fn signed_urls() -> Router<AppState> {
    Router::new().route("/files", get(envd::download).post(envd::upload))
}
