//! `/anthropic/v1/files`: upload, list, metadata, download, delete, in the Files API's shapes.
//! The GA (`client.files`) and beta (`client.beta.files`) SDK resources call the same paths;
//! a listing answers both pagination styles (`next_page` cursors, and `has_more` with
//! `first_id`/`last_id` for `before_id`/`after_id`).

use axum::body::Body;
use axum::extract::{Multipart, Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::SecondsFormat;
use runcell_engine::MAX_FILE_BYTES;
use serde_json::{json, Value};

use super::context::{file_store, Caller};
use super::error::Error;
use crate::state::AppState;
use crate::vendor::StoredFile;

/// A file as the Files API shows it. Every file here can be downloaded, uploads included.
pub(super) fn metadata_json(f: &StoredFile) -> Value {
    json!({
        "type": "file",
        "id": f.id,
        "filename": f.filename,
        "mime_type": f.mime_type,
        "size_bytes": f.size_bytes,
        "created_at": f.created_at.to_rfc3339_opts(SecondsFormat::Millis, true),
        "downloadable": true,
    })
}

fn no_such_file(id: &str) -> Error {
    Error::not_found(format!("file_id: no file {id}"))
}

/// Runs file-store work on the blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)
}

pub(super) async fn upload(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    form: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Json<Value>, Error> {
    let too_large = || {
        Error::too_large(format!(
            "file: files are limited to {} MiB on this server",
            MAX_FILE_BYTES >> 20
        ))
    };
    let mut form = form.map_err(|e| Error::invalid(e.body_text()))?;
    let mut file = None;
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large()),
            Err(e) => return Err(Error::invalid(e.body_text())),
        };
        let name = field.name().unwrap_or("").to_owned();
        let filename = field.file_name().map(str::to_owned);
        let mime = field.content_type().map(str::to_owned);
        let data = match field.bytes().await {
            Ok(d) => d,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large()),
            Err(e) => return Err(Error::invalid(e.body_text())),
        };
        match name.as_str() {
            "file" => file = Some((filename, mime, data)),
            // Accepted for the SDK's sake; files here last until deleted.
            "expires_in_seconds" => {}
            other => {
                return Err(Error::invalid(format!(
                    "{other}: unexpected part (send the file as `file`)"
                )))
            }
        }
    }
    let (filename, mime, data) = file.ok_or_else(|| Error::invalid("file: Field required"))?;
    if data.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let filename = crate::vendor::sandbox::safe_name(filename.as_deref().unwrap_or(""));
    let mime = mime
        .filter(|m| !m.is_empty() && m != "application/octet-stream")
        .unwrap_or_else(|| runcell_engine::mime_of(&filename));
    let store = file_store(&state);
    let stored = blocking(move || store.put(&tenant.0, &filename, &mime, &data, None)).await?;
    Ok(Json(metadata_json(&stored)))
}

/// The query's values by name (`ids[]` counts as `ids`; comma-separated lists are split).
fn query_values(raw: Option<&str>) -> Vec<(String, String)> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned()
    };
    raw.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let k = decode(k);
            (k.strip_suffix("[]").unwrap_or(&k).to_owned(), decode(v))
        })
        .collect()
}

pub(super) async fn list(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, Error> {
    let mut limit = 20usize;
    let (mut after, mut before, mut ids) = (None, None, Vec::new());
    for (k, v) in query_values(query.as_deref()) {
        match k.as_str() {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        Error::invalid(format!("limit: must be between 1 and 1000, not {v:?}"))
                    })?
            }
            // A `page` cursor is the id of the last file of the page before.
            "page" => after = Some(v.strip_prefix("page_").unwrap_or(&v).to_owned()),
            "after_id" => after = Some(v),
            "before_id" => before = Some(v),
            "ids" => ids.extend(v.split(',').filter(|s| !s.is_empty()).map(str::to_owned)),
            // The SDK's workspace header's query twin and the like: nothing to select here.
            _ => {}
        }
    }
    let store = file_store(&state);
    let all = blocking(move || store.list(&tenant.0)).await?;
    let page: Vec<&StoredFile> = if !ids.is_empty() {
        all.iter().filter(|f| ids.contains(&f.id)).collect()
    } else if let Some(b) = &before {
        let end = all.iter().position(|f| &f.id == b).unwrap_or(0);
        all[end.saturating_sub(limit)..end].iter().collect()
    } else {
        let start = match &after {
            Some(a) => all
                .iter()
                .position(|f| &f.id == a)
                .map_or(all.len(), |i| i + 1),
            None => 0,
        };
        all[start..].iter().take(limit).collect()
    };
    let has_more = ids.is_empty()
        && match (&before, page.first(), page.last()) {
            (Some(_), Some(first), _) => all.first().is_some_and(|f| f.id != first.id),
            (None, _, Some(last)) => all.last().is_some_and(|f| f.id != last.id),
            _ => false,
        };
    let first_id = page.first().map(|f| f.id.clone());
    let last_id = page.last().map(|f| f.id.clone());
    let next_page = (has_more && before.is_none())
        .then(|| last_id.as_ref().map(|id| format!("page_{id}")))
        .flatten();
    Ok(Json(json!({
        "data": page.iter().map(|f| metadata_json(f)).collect::<Vec<_>>(),
        "has_more": has_more,
        "first_id": first_id,
        "last_id": last_id,
        "next_page": next_page,
    })))
}

pub(super) async fn metadata(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    let store = file_store(&state);
    let i = id.clone();
    match blocking(move || store.get(&tenant.0, &i)).await? {
        Some(f) => Ok(Json(metadata_json(&f))),
        None => Err(no_such_file(&id)),
    }
}

pub(super) async fn download(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let store = file_store(&state);
    let i = id.clone();
    let Some((meta, data)) = blocking(move || store.read(&tenant.0, &i)).await? else {
        return Err(no_such_file(&id));
    };
    let disposition = format!(
        "attachment; filename*=UTF-8''{}",
        percent_encoding::utf8_percent_encode(&meta.filename, percent_encoding::NON_ALPHANUMERIC)
    );
    Response::builder()
        .header(header::CONTENT_TYPE, meta.mime_type)
        .header(header::CONTENT_DISPOSITION, disposition)
        .body(Body::from(data))
        .map_err(Error::internal)
}

pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let store = file_store(&state);
    let i = id.clone();
    if !blocking(move || store.delete(&tenant.0, &i)).await? {
        return Err(no_such_file(&id));
    }
    Ok(Json(json!({"id": id, "type": "file_deleted"})).into_response())
}
