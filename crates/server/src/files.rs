//! `/v1/sessions/{id}/files`: list, upload (raw PUT and multipart POST), download, delete.
//! Paths are relative to /workspace; the engine refuses absolute paths, `..`, NUL, over-long
//! names and planted symlinks.

use axum::body::Bytes;
use axum::extract::{Multipart, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_engine::FileEntry;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::{ApiQuery, Path};
use crate::sessions::{blocking, owned};
use crate::state::{AppState, Tenant};

#[derive(Debug, Serialize, ToSchema)]
pub struct FileList {
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// A directory relative to /workspace (default: all files).
    pub path: Option<String>,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", tag = "files",
    params(("id" = String, Path), ListQuery),
    responses((status = 200, body = FileList, description = "the files below the directory"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: a path that is absolute, has `..`, a NUL byte or an over-long name, or goes through a symbolic link"), (status = 404, body = ErrorBody, description = "no such session of this tenant, or no such file"), (status = 409, body = ErrorBody, description = "the session is dead: its kernel ended with a previous server process")))]
pub async fn list_files(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<FileList>> {
    owned(&state, &tenant, &id).await?;
    let engine = state.engine.clone();
    let dir = q.path.unwrap_or_default();
    let files = blocking(move || engine.list_files(&id, &dir)).await?;
    Ok(Json(FileList { files }))
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", tag = "files",
    params(("id" = String, Path), ("path" = String, Path, description = "relative to /workspace")),
    request_body(content = Option<Vec<u8>>, content_type = "application/octet-stream", description = "the file's bytes; none: an empty file"),
    responses((status = 201, body = FileEntry, description = "stored"), (status = 400, body = ErrorBody, description = "`invalid_request`: a path that is absolute, has `..`, a NUL byte or an over-long name, or goes through a symbolic link"), (status = 404, body = ErrorBody, description = "no such session of this tenant, or no such file"), (status = 409, body = ErrorBody, description = "the session is dead: its kernel ended with a previous server process"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: over the file size limit")))]
pub async fn put_file(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, path)): Path<(String, String)>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> ApiResult<(StatusCode, Json<FileEntry>)> {
    owned(&state, &tenant, &id).await?;
    let body = body?;
    let entry = store_file(&state, &id, path, body).await?;
    sync_files(&state, &id).await?;
    Ok((StatusCode::CREATED, Json(entry)))
}

/// What the request wrote, on disk before its reply (once for all of a multipart's parts).
async fn sync_files(state: &AppState, id: &str) -> ApiResult<()> {
    let engine = state.engine.clone();
    let id = id.to_owned();
    blocking(move || engine.sync_files(&id)).await
}

/// Writes one upload, records it, and returns its listing entry; [`sync_files`] makes it
/// durable.
async fn store_file(state: &AppState, id: &str, path: String, data: Bytes) -> ApiResult<FileEntry> {
    let engine = state.engine.clone();
    let id = id.to_owned();
    // The entry comes from the file written, never from a listing: a listing of the
    // directory per part made an upload of N parts O(N²), and wrong past the listing's bound.
    blocking(move || engine.upload_file_unsynced(&id, &path, &data)).await
}

#[utoipa::path(post, path = "/v1/sessions/{id}/files", tag = "files",
    params(("id" = String, Path), ListQuery),
    request_body(content_type = "multipart/form-data", description = "one or more file parts; each is stored under its file name, or its part name (below `?path=dir` if given)"),
    responses((status = 201, body = FileList, description = "the files stored"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: not a multipart body, a part without a file name, no part at all, or a bad path"), (status = 404, body = ErrorBody, description = "no such session of this tenant, or no such file"), (status = 409, body = ErrorBody, description = "the session is dead: its kernel ended with a previous server process"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: a file over the size limit")))]
pub async fn upload_multipart(
    State(state): State<AppState>,
    tenant: Tenant,
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
    multipart: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> ApiResult<(StatusCode, Json<FileList>)> {
    owned(&state, &tenant, &id).await?;
    let mut multipart = multipart.map_err(|e| ApiError::invalid(e.body_text()))?;
    let mut files = Vec::new();
    loop {
        let Some(field) = multipart.next_field().await.map_err(ApiError::multipart)? else {
            break;
        };
        let name = field
            .file_name()
            .or(field.name())
            .map(str::to_owned)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| ApiError::invalid("every part needs a file name"))?;
        let path = match &q.path {
            Some(dir) if !dir.is_empty() => format!("{}/{name}", dir.trim_end_matches('/')),
            _ => name,
        };
        let data = field.bytes().await.map_err(ApiError::multipart)?;
        files.push(store_file(&state, &id, path, data).await?);
    }
    if files.is_empty() {
        return Err(ApiError::invalid("no file parts in the upload"));
    }
    sync_files(&state, &id).await?;
    Ok((StatusCode::CREATED, Json(FileList { files })))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct GetFileQuery {
    /// Present (with any value, usually none: `?provenance`): instead of the bytes, a signed
    /// statement of the execution that left the file as it is now.
    pub provenance: Option<String>,
    /// Present (`?c2pa`): a PNG or JPEG with a signed C2PA manifest embedded that names the
    /// execution which left the file as it is now (the workspace file is not changed; the
    /// copy's bytes differ from `files[].sha256`, which the manifest records).
    pub c2pa: Option<String>,
}

/// A signed provenance statement (the shape of runcell_store's `Provenance`, which is what
/// is served; docs/api.md gives the signed encoding).
#[derive(Debug, Serialize, ToSchema)]
#[allow(
    dead_code,
    reason = "the OpenAPI shape of runcell_store's Provenance, which is what is served"
)]
pub struct ProvenanceDoc {
    /// `runcell.provenance`.
    #[serde(rename = "type")]
    pub kind: String,
    pub version: u32,
    pub path: String,
    pub size: u64,
    /// SHA-256 of the file's content, hex.
    pub sha256: String,
    pub mime: String,
    pub execution_id: String,
    /// SHA-256 of the code that ran, hex.
    pub code_sha256: String,
    pub session_id: Option<String>,
    pub tenant: String,
    /// When the execution finished (RFC 3339).
    pub time: String,
    /// The signing key's id (`GET /v1/audit/public-key`).
    pub key_id: String,
    /// Ed25519 signature, hex.
    pub signature: String,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", tag = "files",
    params(("id" = String, Path), ("path" = String, Path), GetFileQuery),
    responses((status = 200, content((Vec<u8> = "*/*"), (ProvenanceDoc = "application/json")), description = "the file's bytes, typed by its name's extension (`application/octet-stream` when unknown); with `?provenance`, the signed statement of its origin; with `?c2pa`, a copy of the PNG or JPEG with a signed C2PA manifest embedded"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: a path that is absolute, has `..`, a NUL byte or an over-long name, or goes through a symbolic link; with `?c2pa`, a file that is not a PNG or JPEG (by its name), or one the C2PA SDK cannot parse"), (status = 404, body = ErrorBody, description = "no such session of this tenant, or no such file; with `?provenance` or `?c2pa`, also: no recorded execution left the file as it is now, or this server has no signing key"), (status = 413, body = ErrorBody, description = "with `?c2pa`: a file over 100 MiB"), (status = 409, body = ErrorBody, description = "the session is dead: its kernel ended with a previous server process")))]
pub async fn get_file(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, path)): Path<(String, String)>,
    ApiQuery(q): ApiQuery<GetFileQuery>,
) -> ApiResult<Response> {
    owned(&state, &tenant, &id).await?;
    if q.provenance.is_some() {
        return provenance(&state, tenant, id, path).await;
    }
    if q.c2pa.is_some() {
        return c2pa_copy(&state, tenant, id, path).await;
    }
    let engine = state.engine.clone();
    let p = path.clone();
    let data = blocking(move || engine.read_file(&id, &p)).await?;
    let mime = runcell_engine::mime_of(&path);
    let name = path.rsplit('/').next().unwrap_or("file");
    Ok((
        [
            (header::CONTENT_TYPE, mime),
            (header::CONTENT_DISPOSITION, content_disposition(name)),
            // The bytes are the session's, written by whatever code ran there: a browser
            // must neither guess a more active type for them nor run them as a page of this
            // origin (an HTML file opened from a link would otherwise script the API).
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            (header::CONTENT_SECURITY_POLICY, "sandbox".to_owned()),
        ],
        data,
    )
        .into_response())
}

/// `?provenance`: the origin of the file's current content, signed with the audit key.
async fn provenance(
    state: &AppState,
    tenant: Tenant,
    id: String,
    path: String,
) -> ApiResult<Response> {
    let signer = state.audit_signer.clone().ok_or_else(|| {
        ApiError::not_found("provenance statements (this server has no signing key)")
    })?;
    let engine = state.engine.clone();
    let origin =
        blocking(move || engine.file_origin(&tenant.0, &id, &path).map(|(o, _)| o)).await?;
    Ok(Json(signer.sign_provenance(origin)).into_response())
}

/// `?c2pa`: a signed copy of a PNG or JPEG the session's executions produced. The bytes
/// are read like a download; the host parses them only to embed the manifest (in the C2PA
/// SDK, Rust, bounded by the file size cap below), and the workspace file is never written.
async fn c2pa_copy(
    state: &AppState,
    tenant: Tenant,
    id: String,
    path: String,
) -> ApiResult<Response> {
    let signer = state
        .engine
        .config()
        .image_signer
        .clone()
        .ok_or_else(|| ApiError::not_found("C2PA copies (this server signs no images)"))?;
    let mime = runcell_engine::mime_of(&path);
    if !runcell_engine::SIGNED_IMAGE_TYPES.contains(&mime.as_str()) {
        return Err(ApiError::invalid(format!(
            "?c2pa signs PNG and JPEG files (image/png, image/jpeg); {path} is {mime}"
        )));
    }
    let engine = state.engine.clone();
    let name = path.rsplit('/').next().unwrap_or("file").to_owned();
    let format = mime.clone();
    let signed = blocking(move || {
        let (o, data) = engine.file_origin(&tenant.0, &id, &path)?;
        if data.len() > runcell_engine::MAX_FILE_BYTES as usize {
            return Ok(Err(ApiError::too_large(format!(
                "?c2pa signs files up to {} bytes; {path} has {}",
                runcell_engine::MAX_FILE_BYTES,
                data.len()
            ))));
        }
        let origin = runcell_engine::ImageOrigin {
            execution_id: o.execution_id,
            session_id: o.session_id,
            tenant: o.tenant,
            code_sha256: o.code_sha256,
            time: o.time,
            file: Some((o.path, o.sha256)),
        };
        Ok(signer.sign(&format, &data, &origin).map_err(|why| {
            ApiError::invalid(format!("{path} cannot be signed as {format}: {why}"))
        }))
    })
    .await??;
    Ok((
        [
            (header::CONTENT_TYPE, mime),
            (header::CONTENT_DISPOSITION, content_disposition(&name)),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            (header::CONTENT_SECURITY_POLICY, "sandbox".to_owned()),
        ],
        signed,
    )
        .into_response())
}

/// `attachment` with the file's name for any name code can create (RFC 6266): a quoted ASCII
/// fallback for old clients, with every character that is not printable ASCII, and the quote
/// and backslash the quoting would need escaped, replaced by `_`; and the exact name as
/// UTF-8 in `filename*` (RFC 8187), percent-encoded outside `attr-char`. The result is
/// always a valid header value (a newline in a name made the header, and the reply, fail).
fn content_disposition(name: &str) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    // RFC 8187 attr-char: ALPHA / DIGIT / "!" / "#" / "$" / "&" / "+" / "-" / "." / "^" /
    // "_" / "`" / "|" / "~"; everything else is percent-encoded.
    const NOT_ATTR_CHAR: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'!')
        .remove(b'#')
        .remove(b'$')
        .remove(b'&')
        .remove(b'+')
        .remove(b'-')
        .remove(b'.')
        .remove(b'^')
        .remove(b'_')
        .remove(b'`')
        .remove(b'|')
        .remove(b'~');
    let fallback: String = name
        .chars()
        .map(|c| match c {
            // `%` too: some clients percent-decode the plain parameter.
            '"' | '\\' | '%' => '_',
            c if c.is_ascii_graphic() || c == ' ' => c,
            _ => '_',
        })
        .collect();
    let encoded = utf8_percent_encode(name, NOT_ATTR_CHAR);
    format!("attachment; filename=\"{fallback}\"; filename*=UTF-8''{encoded}")
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/files/{path}", tag = "files",
    params(("id" = String, Path), ("path" = String, Path)),
    responses((status = 204, description = "deleted"), (status = 400, body = ErrorBody, description = "`invalid_request`: a path that is absolute, has `..`, a NUL byte or an over-long name, or goes through a symbolic link"), (status = 404, body = ErrorBody, description = "no such session of this tenant, or no such file"), (status = 409, body = ErrorBody, description = "the session is dead: its kernel ended with a previous server process")))]
pub async fn delete_file(
    State(state): State<AppState>,
    tenant: Tenant,
    Path((id, path)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    owned(&state, &tenant, &id).await?;
    let engine = state.engine.clone();
    blocking(move || engine.delete_file(&id, &path)).await?;
    Ok(StatusCode::NO_CONTENT)
}
