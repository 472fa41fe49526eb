//! `/openai/v1/files`: the part of OpenAI's Files API that containers and `code_interpreter`
//! take file ids from: upload, list, retrieve, content, delete.

use axum::body::Body;
use axum::extract::{Multipart, Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::Json;
use runcell_engine::MAX_FILE_BYTES;
use serde_json::{json, Value};

use super::context::{file_store, unix, Caller};
use super::error::Error;
use crate::state::AppState;
use crate::vendor::StoredFile;

/// The purposes OpenAI's SDK knows; anything else is refused as OpenAI would.
const PURPOSES: [&str; 8] = [
    "assistants",
    "assistants_output",
    "batch",
    "batch_output",
    "fine-tune",
    "fine-tune-results",
    "vision",
    "user_data",
];

pub(super) fn file_json(f: &StoredFile) -> Value {
    json!({
        "id": f.id,
        "object": "file",
        "bytes": f.size_bytes,
        "created_at": unix(f.created_at),
        "filename": f.filename,
        "purpose": f.purpose.as_deref().unwrap_or("user_data"),
        "status": "processed",
        "expires_at": null,
    })
}

fn no_such_file(id: &str) -> Error {
    Error::not_found(format!("No such File object: {id}"))
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(Error::internal)?
        .map_err(Error::internal)
}

/// A multipart `file` part (name, bytes) and the other text parts, within the size limit.
pub(super) async fn read_upload(
    form: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<(Option<(String, bytes::Bytes)>, Vec<(String, String)>), Error> {
    let too_large = || {
        Error::too_large(format!(
            "files are limited to {} MiB on this server",
            MAX_FILE_BYTES >> 20
        ))
    };
    let mut form = form.map_err(|e| Error::invalid(None, e.body_text()))?;
    let (mut file, mut fields) = (None, Vec::new());
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large()),
            Err(e) => return Err(Error::invalid(None, e.body_text())),
        };
        let name = field.name().unwrap_or("").to_owned();
        let filename = field.file_name().map(str::to_owned);
        let data = match field.bytes().await {
            Ok(d) => d,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large()),
            Err(e) => return Err(Error::invalid(None, e.body_text())),
        };
        if name == "file" {
            if data.len() as u64 > MAX_FILE_BYTES {
                return Err(too_large());
            }
            file = Some((filename.unwrap_or_default(), data));
        } else {
            fields.push((name, String::from_utf8_lossy(&data).into_owned()));
        }
    }
    Ok((file, fields))
}

pub(super) async fn upload(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    form: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Json<Value>, Error> {
    let (file, fields) = read_upload(form).await?;
    let (filename, data) =
        file.ok_or_else(|| Error::invalid(Some("file"), "Missing required parameter: 'file'."))?;
    let purpose = fields
        .iter()
        .find(|(k, _)| k == "purpose")
        .map(|(_, v)| v.clone())
        .ok_or_else(|| Error::invalid(Some("purpose"), "Missing required parameter: 'purpose'."))?;
    if !PURPOSES.contains(&purpose.as_str()) {
        return Err(Error::invalid(
            Some("purpose"),
            format!("'{purpose}' is not one of {PURPOSES:?} - 'purpose'"),
        ));
    }
    let filename = crate::vendor::sandbox::safe_name(&filename);
    let mime = runcell_engine::mime_of(&filename);
    let store = file_store(&state);
    let stored =
        blocking(move || store.put_for(&tenant.0, &filename, &mime, &data, None, Some(&purpose)))
            .await?;
    Ok(Json(file_json(&stored)))
}

pub(super) async fn list(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    RawQuery(_query): RawQuery,
) -> Result<Json<Value>, Error> {
    let store = file_store(&state);
    let all = blocking(move || store.list(&tenant.0)).await?;
    Ok(Json(json!({
        "object": "list",
        "data": all.iter().map(file_json).collect::<Vec<_>>(),
        "first_id": all.first().map(|f| f.id.clone()),
        "last_id": all.last().map(|f| f.id.clone()),
        "has_more": false,
    })))
}

pub(super) async fn retrieve(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    let store = file_store(&state);
    let i = id.clone();
    match blocking(move || store.get(&tenant.0, &i)).await? {
        Some(f) => Ok(Json(file_json(&f))),
        None => Err(no_such_file(&id)),
    }
}

pub(super) async fn content(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let store = file_store(&state);
    let i = id.clone();
    let Some((meta, data)) = blocking(move || store.read(&tenant.0, &i)).await? else {
        return Err(no_such_file(&id));
    };
    Response::builder()
        .header(header::CONTENT_TYPE, meta.mime_type)
        .body(Body::from(data))
        .map_err(Error::internal)
}

pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    let store = file_store(&state);
    let i = id.clone();
    if !blocking(move || store.delete(&tenant.0, &i)).await? {
        return Err(no_such_file(&id));
    }
    Ok(Json(json!({"id": id, "object": "file", "deleted": true})))
}
