//! envd's REST endpoints: `/health`, and `/files` (download with `GET ?path=`, upload with
//! `POST ?path=` as `application/octet-stream` or as multipart parts named `file` whose
//! filename is the path), with the sandbox in the headers or a signed URL's `signature`. Files
//! live in the workspace: `/home/user/...` (docs/e2b.md).

use axum::body::Bytes;
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use std::sync::Arc;

use super::access::sandbox_of;
use super::error::{Error, Refused};
use super::names::{shown, workspace_rel};
use super::sandboxes::{same_secret, Sandbox};
use crate::state::AppState;

#[derive(Debug, serde::Deserialize)]
pub(crate) struct FileQuery {
    path: Option<String>,
    username: Option<String>,
    /// A signed URL's (`download_url()`, `upload_url()`): `v1_` and the base64 SHA-256 of
    /// `path:operation:username:token[:expiration]`.
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

/// The sandbox whose token signed this URL for `operation` (`read`, `write`), if any did and
/// the signature has not expired. Such URLs name no sandbox (the SDK builds them from
/// `E2B_SANDBOX_URL` for a browser or `curl`), so every sandbox's token is tried.
fn signed_for(state: &AppState, q: &FileQuery, operation: &str) -> Result<Arc<Sandbox>, Refused> {
    use base64::Engine as _;
    use sha2::Digest;
    let sig = q.signature.as_deref().unwrap_or("");
    if let Some(exp) = q.signature_expiration {
        if exp < chrono::Utc::now().timestamp() {
            return Err(Refused::Unauthorized("the signed URL has expired"));
        }
    }
    let path = q.path.as_deref().unwrap_or("");
    let user = q.username.as_deref().unwrap_or("");
    let found = state.e2b.all().into_iter().find(|s| {
        let raw = match q.signature_expiration {
            Some(exp) => format!("{path}:{operation}:{user}:{}:{exp}", s.token),
            None => format!("{path}:{operation}:{user}:{}", s.token),
        };
        let digest = sha2::Sha256::digest(raw.as_bytes());
        let expected = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
        );
        same_secret(&expected, sig)
    });
    let sandbox = found.ok_or(Refused::Unauthorized("invalid signature"))?;
    match state.engine.sessions().get(&sandbox.id) {
        Ok(_) => Ok(sandbox),
        Err(_) => Err(Refused::Gone(sandbox.id.clone())),
    }
}

/// The sandbox of a file request: by its signature when it has one, else by its headers.
fn sandbox_for(
    state: &AppState,
    headers: &HeaderMap,
    q: &FileQuery,
    operation: &str,
) -> Result<Arc<Sandbox>, Refused> {
    match q.signature {
        Some(_) => signed_for(state, q, operation),
        None => sandbox_of(state, headers),
    }
}

/// `GET /health`: 204 while the sandbox runs, 502 once it is gone or while it is paused (as
/// E2B's proxy answers: the SDK's `is_running()` is then `False`). It never resumes a paused
/// sandbox, as every other data-plane request does.
pub(crate) async fn health(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match sandbox_of(&state, &headers) {
        Ok(s)
            if state
                .engine
                .sessions()
                .get(&s.id)
                .is_ok_and(|i| i.status == runcell_engine::SessionStatus::Paused) =>
        {
            Error::new(
                StatusCode::BAD_GATEWAY,
                format!("sandbox {} is paused (connect to resume it)", s.id),
            )
            .into_response()
        }
        Ok(_) => StatusCode::NO_CONTENT.into_response(),
        Err(r) => Error::from(r).into_response(),
    }
}

/// `GET /files?path=P`: the file's bytes.
pub(crate) async fn download(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
) -> Result<Response, Error> {
    let sandbox = sandbox_for(&state, &headers, &q, "read")?;
    let path = q.path.unwrap_or_default();
    let rel = workspace_rel(&path).map_err(Error::invalid)?;
    if rel.is_empty() {
        return Err(Error::invalid(format!("{} is a directory", shown(&rel))));
    }
    let engine = state.engine.clone();
    let data = tokio::task::spawn_blocking(move || engine.read_file(&sandbox.id, &rel))
        .await
        .map_err(crate::error::ApiError::internal)?
        .map_err(|e| match e {
            runcell_engine::EngineError::NotFound(_) => Error::new(
                StatusCode::NOT_FOUND,
                format!("path '{path}' does not exist"),
            ),
            other => other.into(),
        })?;
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Bytes::from(data),
    )
        .into_response())
}

/// `POST /files?path=P`: writes each file (parents created); replies with what was written.
pub(crate) async fn upload(
    State(state): State<AppState>,
    Query(q): Query<FileQuery>,
    req: Request,
) -> Result<Response, Error> {
    let headers = req.headers().clone();
    let sandbox = sandbox_for(&state, &headers, &q, "write")?;
    if headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v != "identity")
    {
        return Err(Error::invalid(
            "compressed uploads are not supported: send the file without gzip",
        ));
    }
    let multipart = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let mut files: Vec<(String, Bytes)> = Vec::new();
    if multipart {
        let mut form = Multipart::from_request(req, &state)
            .await
            .map_err(|e| Error::invalid(e.body_text()))?;
        let mut parts = Vec::new();
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| Error::invalid(e.body_text()))?
        {
            let name = field.file_name().map(str::to_owned);
            let data = field
                .bytes()
                .await
                .map_err(|e| Error::invalid(e.body_text()))?;
            parts.push((name, data));
        }
        let single = parts.len() == 1;
        for (name, data) in parts {
            let path = match (&q.path, name) {
                (Some(p), _) if single => p.clone(),
                (_, Some(n)) => n,
                (Some(p), None) => p.clone(),
                (None, None) => return Err(Error::invalid("a file part without a path")),
            };
            files.push((path, data));
        }
    } else {
        let path = q
            .path
            .clone()
            .ok_or_else(|| Error::invalid("the path query parameter is required"))?;
        let data = Bytes::from_request(req, &state)
            .await
            .map_err(|e| Error::invalid(e.body_text()))?;
        files.push((path, data));
    }
    let mut targets = Vec::new();
    for (path, data) in files {
        let rel = workspace_rel(&path).map_err(Error::invalid)?;
        if rel.is_empty() {
            return Err(Error::invalid(format!(
                "{HOME} is a directory",
                HOME = shown("")
            )));
        }
        targets.push((rel, data));
    }
    let engine = state.engine.clone();
    let written = tokio::task::spawn_blocking(move || {
        targets
            .into_iter()
            .map(|(rel, data)| {
                engine.write_file(&sandbox.id, &rel, &data)?;
                let name = rel.rsplit('/').next().unwrap_or(&rel).to_owned();
                Ok(json!({"name": name, "type": "file", "path": shown(&rel)}))
            })
            .collect::<Result<Vec<_>, runcell_engine::EngineError>>()
    })
    .await
    .map_err(crate::error::ApiError::internal)??;
    Ok(Json(written).into_response())
}
