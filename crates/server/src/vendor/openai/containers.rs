//! `/openai/v1/containers`: create, list, retrieve and delete containers, and their files
//! (upload as multipart or by a Files API id, list, retrieve, content, delete). A container is
//! a runcell session; its files are the session's /mnt/data (`/workspace`), each named by an
//! id derived from the session and the path, so a file the code wrote is a container file
//! with no copy made.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Path, RawQuery, Request, State};
use axum::http::{header, StatusCode};
use axum::response::Response;
use axum::Json;
use runcell_engine::{CreateSession, FileEntry, LimitsRequest, SessionInfo};
use serde::Deserialize;
use serde_json::{json, Value};

use super::context::{container_id, file_store, session_of, unix, Caller};
use super::error::Error;
use super::files::{blocking, read_upload};
use crate::state::{AppState, Tenant};

/// Container files uploaded by the client (OpenAI's `source: user`); the others the code
/// wrote. Kept in memory: after a restart every file reads as the code's.
fn uploaded() -> &'static Mutex<HashSet<String>> {
    static SET: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    SET.get_or_init(Mutex::default)
}

/// The id of the container file at `path` (relative to /mnt/data) of `session`.
pub(super) fn file_id(session: &str, path: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("{session}\0{path}").as_bytes());
    let hex: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("cfile_{hex}")
}

pub(super) fn file_json(session: &str, f: &FileEntry) -> Value {
    let id = file_id(session, &f.path);
    let user = uploaded()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&id);
    json!({
        "id": id,
        "object": "container.file",
        "bytes": f.size,
        "container_id": container_id(session),
        "created_at": unix(f.modified_at),
        "path": format!("/mnt/data/{}", f.path),
        "source": if user { "user" } else { "assistant" },
    })
}

/// OpenAI's memory sizes, in MiB.
fn memory_mb(limit: &str) -> Option<u64> {
    match limit {
        "1g" => Some(1024),
        "4g" => Some(4096),
        "16g" => Some(16384),
        "64g" => Some(65536),
        _ => None,
    }
}

pub(super) fn container_json(info: &SessionInfo) -> Value {
    let memory = match info.limits.memory_mb {
        m if m <= 1024 => "1g",
        m if m <= 4096 => "4g",
        m if m <= 16384 => "16g",
        _ => "64g",
    };
    json!({
        "id": container_id(&info.id),
        "object": "container",
        "created_at": unix(info.created_at),
        "last_active_at": unix(info.last_active_at),
        "status": match info.status {
            runcell_engine::SessionStatus::Expired | runcell_engine::SessionStatus::Dead => "expired",
            _ => "running",
        },
        "name": info.metadata.get("name").cloned().unwrap_or_default(),
        "expires_after": {"anchor": "last_active_at", "minutes": info.limits.idle_timeout_s / 60},
        "memory_limit": memory,
        "network_policy": {"type": "disabled"},
    })
}

/// What a container is made of, from `POST /containers` or a `code_interpreter` tool's
/// `{"type": "auto", ...}`.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ContainerSpec {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub expires_after: Option<ExpiresAfter>,
    #[serde(default)]
    pub file_ids: Option<Vec<String>>,
    #[serde(default)]
    pub memory_limit: Option<String>,
    #[serde(default)]
    pub network_policy: Option<Value>,
    #[serde(default)]
    pub skills: Option<Vec<Value>>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ExpiresAfter {
    pub anchor: String,
    pub minutes: u64,
}

/// Starts a container of `tenant` as `spec` says, with the Files API's `file_ids` in
/// /mnt/data. `param` prefixes the names of bad fields (`tools[0].container`).
pub(super) async fn start(
    state: &AppState,
    tenant: &Tenant,
    spec: ContainerSpec,
    param: &str,
) -> Result<SessionInfo, Error> {
    let mut limits = LimitsRequest::default();
    if let Some(e) = &spec.expires_after {
        if e.anchor != "last_active_at" {
            return Err(Error::invalid(
                Some(&format!("{param}expires_after.anchor")),
                "expires_after.anchor must be 'last_active_at'",
            ));
        }
        limits.idle_timeout_s = Some(e.minutes.saturating_mul(60));
    }
    if let Some(m) = &spec.memory_limit {
        limits.memory_mb = Some(memory_mb(m).ok_or_else(|| {
            Error::invalid(
                Some(&format!("{param}memory_limit")),
                format!("memory_limit must be one of 1g, 4g, 16g, 64g, not {m:?}"),
            )
        })?);
    }
    match spec.network_policy.as_ref().and_then(|p| p.get("type")).and_then(Value::as_str) {
        None | Some("disabled") => {}
        Some(other) => {
            return Err(Error::invalid(
                Some(&format!("{param}network_policy.type")),
                format!("network_policy {other:?} is not available on this server: its containers have no network"),
            ))
        }
    }
    if spec.skills.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(Error::invalid(
            Some(&format!("{param}skills")),
            "this server loads no skills into containers",
        ));
    }
    // The files first: a bad id must not leave a container behind.
    let mut files = Vec::new();
    if let Some(ids) = &spec.file_ids {
        for (i, id) in ids.iter().enumerate() {
            let store = file_store(state);
            let (t, fid) = (tenant.0.clone(), id.clone());
            match blocking(move || store.read(&t, &fid)).await? {
                Some(f) => files.push(f),
                None => {
                    return Err(Error::not_found(format!(
                        "No such File object: {id} ({param}file_ids[{i}])"
                    )))
                }
            }
        }
    }
    let mut metadata =
        std::collections::BTreeMap::from([("source".to_owned(), "openai".to_owned())]);
    if let Some(n) = spec.name.filter(|n| !n.is_empty()) {
        metadata.insert("name".to_owned(), n);
    }
    let engine = state.engine.clone();
    let owner = tenant.0.clone();
    let info = crate::sessions::blocking(move || {
        engine.sessions().create(CreateSession {
            owner,
            limits,
            metadata,
            ..CreateSession::default()
        })
    })
    .await?;
    for (meta, data) in files {
        let path = crate::vendor::sandbox::safe_name(&meta.filename);
        put_file(state, &info.id, &path, data.into()).await?;
    }
    Ok(info)
}

/// The tenant's container `id` (404 for any other).
pub(super) async fn owned(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
) -> Result<SessionInfo, Error> {
    let missing = || Error::not_found(format!("No container found with id '{id}'."));
    let session = session_of(id).ok_or_else(missing)?;
    match crate::sessions::owned(state, tenant, &session).await {
        Ok(info) => Ok(info),
        Err(e) => {
            let e = Error::from(e);
            Err(if e.status == StatusCode::NOT_FOUND {
                missing()
            } else {
                e
            })
        }
    }
}

/// Writes a client's file into the container, recorded like any upload.
async fn put_file(
    state: &AppState,
    session: &str,
    path: &str,
    data: Bytes,
) -> Result<FileEntry, Error> {
    let engine = state.engine.clone();
    let (s, p) = (session.to_owned(), path.to_owned());
    let entry = crate::sessions::blocking(move || engine.upload_file(&s, &p, &data)).await?;
    uploaded()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(file_id(session, &entry.path));
    Ok(entry)
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Error> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let inner = inner
            .rfind(" at line ")
            .map_or(inner.as_str(), |at| &inner[..at])
            .to_owned();
        Error::invalid((path != ".").then_some(path.as_str()), inner)
    })
}

pub(super) async fn create(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<Value>, Error> {
    let body = body.map_err(|e| Error::invalid(None, e.body_text()))?;
    let spec: ContainerSpec = parse_json(&body)?;
    if spec.name.as_deref().is_none_or(str::is_empty) {
        return Err(Error::invalid(
            Some("name"),
            "Missing required parameter: 'name'.",
        ));
    }
    let info = start(&state, &tenant, spec, "").await?;
    Ok(Json(container_json(&info)))
}

/// `limit`, `after` and `order` of a list query (and `name`, for containers).
struct Page {
    limit: usize,
    after: Option<String>,
    ascending: bool,
    name: Option<String>,
}

fn page(raw: Option<&str>) -> Result<Page, Error> {
    let mut p = Page {
        limit: 20,
        after: None,
        ascending: false,
        name: None,
    };
    for pair in raw.unwrap_or("").split('&').filter(|s| !s.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_encoding::percent_decode_str(&v.replace('+', " "))
            .decode_utf8_lossy()
            .into_owned();
        match k {
            "limit" => {
                p.limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| {
                        Error::invalid(
                            Some("limit"),
                            format!("limit must be between 1 and 100, not {v:?}"),
                        )
                    })?
            }
            "after" => p.after = Some(v),
            "order" => match v.as_str() {
                "asc" => p.ascending = true,
                "desc" => p.ascending = false,
                _ => {
                    return Err(Error::invalid(
                        Some("order"),
                        "order must be 'asc' or 'desc'",
                    ))
                }
            },
            "name" => p.name = Some(v),
            _ => {}
        }
    }
    Ok(p)
}

/// One page of `items` (already in creation order, oldest first) as OpenAI lists them.
fn list_page(mut items: Vec<(String, Value)>, p: &Page) -> Value {
    if !p.ascending {
        items.reverse();
    }
    let start = match &p.after {
        Some(a) => items
            .iter()
            .position(|(id, _)| id == a)
            .map_or(items.len(), |i| i + 1),
        None => 0,
    };
    let rest = &items[start..];
    let page: Vec<&(String, Value)> = rest.iter().take(p.limit).collect();
    json!({
        "object": "list",
        "data": page.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
        "first_id": page.first().map(|(id, _)| id.clone()),
        "last_id": page.last().map(|(id, _)| id.clone()),
        "has_more": rest.len() > page.len(),
    })
}

pub(super) async fn list(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, Error> {
    let p = page(query.as_deref())?;
    let items = state
        .engine
        .sessions()
        .list()
        .into_iter()
        .filter(|s| {
            s.owner == tenant.0 && s.metadata.get("source").map(String::as_str) == Some("openai")
        })
        .filter(|s| {
            p.name
                .as_ref()
                .is_none_or(|n| s.metadata.get("name") == Some(n))
        })
        .map(|s| (container_id(&s.id), container_json(&s)))
        .collect();
    Ok(Json(list_page(items, &p)))
}

pub(super) async fn retrieve(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    Ok(Json(container_json(&owned(&state, &tenant, &id).await?)))
}

pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
) -> Result<Json<Value>, Error> {
    let info = owned(&state, &tenant, &id).await?;
    let engine = state.engine.clone();
    crate::sessions::blocking(move || match engine.sessions().delete(&info.id) {
        Err(runcell_engine::EngineError::NotFound(_)) => Ok(()),
        other => other,
    })
    .await?;
    Ok(Json(
        json!({"id": id, "object": "container.deleted", "deleted": true}),
    ))
}

async fn listing(state: &AppState, session: &str) -> Result<Vec<FileEntry>, Error> {
    let engine = state.engine.clone();
    let s = session.to_owned();
    Ok(crate::sessions::blocking(move || engine.list_files(&s, "")).await?)
}

async fn find_file(state: &AppState, session: &str, file: &str) -> Result<FileEntry, Error> {
    listing(state, session)
        .await?
        .into_iter()
        .find(|f| file_id(session, &f.path) == file)
        .ok_or_else(|| Error::not_found(format!("No such container file: {file}")))
}

pub(super) async fn create_file(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
    req: Request,
) -> Result<Json<Value>, Error> {
    let info = owned(&state, &tenant, &id).await?;
    let multipart = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("multipart/form-data"));
    let (path, data) = if multipart {
        let form = Multipart::from_request(req, &state).await;
        let (file, _) = read_upload(form).await?;
        let (name, data) = file
            .ok_or_else(|| Error::invalid(Some("file"), "Missing required parameter: 'file'."))?;
        (crate::vendor::sandbox::safe_name(&name), data)
    } else {
        #[derive(Deserialize)]
        struct ById {
            file_id: String,
        }
        let body = Bytes::from_request(req, &state)
            .await
            .map_err(|e| Error::invalid(None, e.body_text()))?;
        let by: ById = parse_json(&body)?;
        let store = file_store(&state);
        let (t, fid) = (tenant.0.clone(), by.file_id.clone());
        let Some((meta, data)) = blocking(move || store.read(&t, &fid)).await? else {
            return Err(Error::not_found(format!(
                "No such File object: {}",
                by.file_id
            )));
        };
        (
            crate::vendor::sandbox::safe_name(&meta.filename),
            Bytes::from(data),
        )
    };
    let entry = put_file(&state, &info.id, &path, data).await?;
    Ok(Json(file_json(&info.id, &entry)))
}

pub(super) async fn list_files(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, Error> {
    let p = page(query.as_deref())?;
    let info = owned(&state, &tenant, &id).await?;
    let mut files = listing(&state, &info.id).await?;
    files.sort_by(|a, b| a.modified_at.cmp(&b.modified_at).then(a.path.cmp(&b.path)));
    let items = files
        .iter()
        .map(|f| (file_id(&info.id, &f.path), file_json(&info.id, f)))
        .collect();
    Ok(Json(list_page(items, &p)))
}

pub(super) async fn retrieve_file(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path((id, file)): Path<(String, String)>,
) -> Result<Json<Value>, Error> {
    let info = owned(&state, &tenant, &id).await?;
    let f = find_file(&state, &info.id, &file).await?;
    Ok(Json(file_json(&info.id, &f)))
}

pub(super) async fn file_content(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path((id, file)): Path<(String, String)>,
) -> Result<Response, Error> {
    let info = owned(&state, &tenant, &id).await?;
    let f = find_file(&state, &info.id, &file).await?;
    let engine = state.engine.clone();
    let (s, p) = (info.id.clone(), f.path.clone());
    let data = crate::sessions::blocking(move || engine.read_file(&s, &p)).await?;
    Response::builder()
        .header(header::CONTENT_TYPE, f.mime)
        .body(Body::from(data))
        .map_err(Error::internal)
}

pub(super) async fn delete_file(
    State(state): State<AppState>,
    Caller(tenant, ..): Caller,
    Path((id, file)): Path<(String, String)>,
) -> Result<Json<Value>, Error> {
    let info = owned(&state, &tenant, &id).await?;
    let f = find_file(&state, &info.id, &file).await?;
    let engine = state.engine.clone();
    let (s, p) = (info.id.clone(), f.path.clone());
    crate::sessions::blocking(move || engine.delete_file(&s, &p)).await?;
    Ok(Json(
        json!({"id": file, "object": "container.file.deleted", "deleted": true}),
    ))
}
