//! `GET /mistral/v1/files/{id}/content`: the figures runs showed, as `tool_file` chunks name
//! them.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::context::{file_store, Caller};
use super::error::Error;
use crate::state::AppState;

/// `GET /v1/files/{id}/content`: a figure a run showed.
pub(super) async fn content(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let store = file_store(&state);
    let (t, i) = (tenant.0.clone(), id.clone());
    let found = tokio::task::spawn_blocking(move || store.read(&t, &i))
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)?;
    let Some((meta, data)) = found else {
        return Err(Error::not_found(format!("File {id} not found")));
    };
    // Octet-stream whatever the file is: the SDK reads no other type as a download.
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}\"", meta.filename),
            ),
        ],
        data,
    )
        .into_response())
}
