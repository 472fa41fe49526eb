//! E2B's control plane: create, list, get, connect, set the timeout of and kill sandboxes, in
//! the REST shapes of E2B's OpenAPI document (both its `/v2` routes and the older ones).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_engine::{CreateSession, Language, LimitsRequest, SessionInfo, SessionStatus};
use serde_json::{json, Value};

use super::error::Error;
use super::sandboxes::{self, Sandbox, CONTEXT_OF, DEFAULT_TIMEOUT_S, ENVD_VERSION};
use crate::state::{AppState, Tenant};

/// Sandboxes per page when the client names no limit, and at most (E2B's).
const PAGE: usize = 100;

/// The tenant behind the request's `X-API-KEY` (E2B's header).
async fn tenant(state: &AppState, headers: &HeaderMap) -> Result<Tenant, Error> {
    match Tenant::of_vendor_request(headers, Some("x-api-key"), state).await? {
        Ok(t) => Ok(t),
        Err(why) => Err(Error::new(StatusCode::UNAUTHORIZED, why)),
    }
}

/// The tenant's live sandbox `id` (a session, not a context's kernel).
fn live(state: &AppState, tenant: &Tenant, id: &str) -> Result<SessionInfo, Error> {
    state
        .engine
        .sessions()
        .get(id)
        .ok()
        .filter(|s| s.owner == tenant.0 && !s.metadata.contains_key(CONTEXT_OF))
        .ok_or_else(|| Error::not_found(id))
}

/// A JSON body, `{}` when empty.
fn body(bytes: &Bytes) -> Result<Value, Error> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| Error::invalid(format!("the body is not JSON: {e}")))?;
    if !v.is_object() {
        return Err(Error::invalid("the body must be a JSON object"));
    }
    Ok(v)
}

/// A string map field (`metadata`, `envVars`).
fn string_map(v: &Value, field: &str) -> Result<BTreeMap<String, String>, Error> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                other => Err(Error::invalid(format!(
                    "{field}.{k} must be a string, not {other}"
                ))),
            })
            .collect(),
        Some(_) => Err(Error::invalid(format!("{field} must be an object"))),
    }
}

/// A timeout field in seconds.
fn seconds(v: &Value, field: &str) -> Result<Option<u64>, Error> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f.ceil() as u64))
            .map(Some)
            .ok_or_else(|| Error::invalid(format!("{field} must be a number of seconds"))),
    }
}

/// What E2B's SDK reads of a created or connected sandbox.
fn created(sandbox: &Sandbox) -> Value {
    json!({
        "templateID": sandbox.template,
        "sandboxID": sandbox.id,
        "clientID": "runcell",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sandbox.token,
        "trafficAccessToken": sandbox.token,
        "domain": null,
        "alias": sandbox.template,
    })
}

/// A sandbox as `GET /sandboxes/{id}` and the listings show it.
fn detail(info: &SessionInfo, sandbox: Option<&Sandbox>) -> Value {
    let template = sandbox.map_or("base", |s| s.template.as_str());
    let mut v = json!({
        "templateID": template,
        "alias": template,
        "sandboxID": info.id,
        "clientID": "runcell",
        "startedAt": info.created_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "endAt": info.expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "envdVersion": ENVD_VERSION,
        "cpuCount": info.limits.cpu.ceil().max(1.0) as u64,
        "memoryMB": info.limits.memory_mb,
        "diskSizeMB": info.limits.disk_mb,
        "metadata": info.metadata,
        "state": "running",
        "domain": null,
    });
    if let Some(s) = sandbox {
        v["envdAccessToken"] = s.token.clone().into();
    }
    v
}

/// The lifetime a request asks for, within the server's idle maximum.
fn lifetime(state: &AppState, asked: Option<u64>) -> u64 {
    let max = state.engine.config().limits.max.idle_timeout_s;
    asked.unwrap_or(DEFAULT_TIMEOUT_S).clamp(1, max)
}

/// `POST /sandboxes`, `POST /v2/sandboxes`.
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let req = body(&bytes)?;
    let template = req
        .get("templateID")
        .and_then(Value::as_str)
        .unwrap_or("base")
        .to_owned();
    let metadata = string_map(&req, "metadata")?;
    if metadata.contains_key(CONTEXT_OF) {
        return Err(Error::invalid(format!(
            "metadata.{CONTEXT_OF} is runcell's own"
        )));
    }
    let envs = string_map(&req, "envVars")?;
    if req.get("autoPause").and_then(Value::as_bool) == Some(true) {
        return Err(Error::invalid(
            "autoPause is not supported by this runcell server: sandboxes are killed at their timeout (docs/e2b.md)",
        ));
    }
    if req.get("mcp").is_some_and(|m| !m.is_null()) {
        return Err(Error::invalid(
            "MCP gateways are not supported by runcell's E2B API",
        ));
    }
    let idle = lifetime(&state, seconds(&req, "timeout")?);
    let policy = &state.engine.config().limits;
    let limits = LimitsRequest {
        // E2B's cell limit, or the server's maximum if that is lower.
        exec_timeout_s: Some(DEFAULT_TIMEOUT_S.min(policy.max.exec_timeout_s)),
        idle_timeout_s: Some(idle),
        ..LimitsRequest::default()
    };
    let engine = state.engine.clone();
    let owner = tenant.0.clone();
    let kernel_env = envs.clone();
    let info = tokio::task::spawn_blocking(move || {
        engine.sessions().create(CreateSession {
            owner,
            language: Some(Language::Python),
            limits,
            env: kernel_env,
            metadata,
            start: None,
            // No way out: E2B's `allow_internet_access` and `network` are not mapped (yet).
            network: Default::default(),
        })
    })
    .await
    .map_err(crate::error::ApiError::internal)??;
    state.e2b.start_sweeper(&state.engine);
    let sandbox = state
        .e2b
        .insert(Sandbox::new(&info.id, &tenant.0, &template, envs));
    Ok((StatusCode::CREATED, Json(created(&sandbox))).into_response())
}

/// `GET /sandboxes/{id}`.
pub(crate) async fn info(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let info = live(&state, &tenant, &id)?;
    state.e2b.start_sweeper(&state.engine);
    let sandbox = state.e2b.get_or_adopt(&id, &tenant.0);
    Ok(Json(detail(&info, Some(&sandbox))).into_response())
}

/// `DELETE /sandboxes/{id}`: 204, or 404 when there is no such sandbox.
pub(crate) async fn kill(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    live(&state, &tenant, &id)?;
    let st = state.clone();
    tokio::task::spawn_blocking(move || {
        if let Some(sandbox) = st.e2b.remove(&id) {
            sandboxes::end_extras(&st.engine, &sandbox);
        }
        st.engine.sessions().delete(&id)
    })
    .await
    .map_err(crate::error::ApiError::internal)??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/timeout` `{timeout}`: the sandbox now ends that many seconds from now
/// (when idle: a running cell or command keeps it).
pub(crate) async fn set_timeout(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    live(&state, &tenant, &id)?;
    let req = body(&bytes)?;
    let secs = seconds(&req, "timeout")?.ok_or_else(|| Error::invalid("timeout is required"))?;
    retime(&state, &id, lifetime(&state, Some(secs)))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Sets the sandbox's lifetime (its context kernels live as long as it does: they end with it).
fn retime(state: &AppState, id: &str, secs: u64) -> Result<(), Error> {
    state
        .engine
        .sessions()
        .set_idle_timeout(id, Duration::from_secs(secs))?;
    Ok(())
}

/// `POST /sandboxes/{id}/refreshes` `{duration?}`: keeps the sandbox alive that much longer.
pub(crate) async fn refresh(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let info = live(&state, &tenant, &id)?;
    let req = body(&bytes)?;
    let secs = seconds(&req, "duration")?.unwrap_or(info.limits.idle_timeout_s);
    retime(&state, &id, lifetime(&state, Some(secs)))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect` `{timeout?}`: another
/// client attaches to a running sandbox (its timeout only ever grows here, as E2B's).
pub(crate) async fn connect(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let info = live(&state, &tenant, &id)?;
    let req = body(&bytes)?;
    if let Some(secs) = seconds(&req, "timeout")? {
        let left = (info.expires_at - chrono::Utc::now()).num_seconds().max(0) as u64;
        if secs > left {
            retime(&state, &id, lifetime(&state, Some(secs)))?;
        }
    }
    state.e2b.start_sweeper(&state.engine);
    let sandbox = state.e2b.get_or_adopt(&id, &tenant.0);
    Ok((StatusCode::OK, Json(created(&sandbox))).into_response())
}

/// `POST /sandboxes/{id}/pause`: not in this runcell yet.
pub(crate) async fn pause(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    live(&state, &tenant, &id)?;
    Err(Error::new(
        StatusCode::NOT_IMPLEMENTED,
        "pausing sandboxes is not supported by this runcell server yet: the sandbox keeps running until its timeout (docs/e2b.md)",
    ))
}

/// `POST /sandboxes/{id}/resume`: a running sandbox is already resumed.
pub(crate) async fn resume(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    live(&state, &tenant, &id)?;
    let _ = bytes;
    Err(Error::new(
        StatusCode::CONFLICT,
        format!("sandbox {id} is running, not paused (runcell does not pause sandboxes yet)"),
    ))
}

/// `GET /sandboxes/{id}/metrics`: none are kept (an empty series).
pub(crate) async fn metrics(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    live(&state, &tenant, &id)?;
    Ok(Json(json!([])).into_response())
}

/// What a listing asks for.
#[derive(Debug, Default)]
struct Query {
    metadata: BTreeMap<String, String>,
    states: Option<Vec<String>>,
    limit: Option<usize>,
    next_token: Option<String>,
}

fn decode(s: &str) -> String {
    let s = s.replace('+', " ");
    percent_encoding::percent_decode_str(&s)
        .decode_utf8_lossy()
        .into_owned()
}

/// `k=v&k2=v2` pairs, each decoded.
fn pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

impl Query {
    /// The query string: `metadata` is itself a URL-encoded `k=v&...` (whose keys and values
    /// the SDK encoded once more), `state` a comma list, `limit`, `nextToken`.
    fn parse(raw: Option<&str>) -> Result<Query, Error> {
        let mut q = Query::default();
        for (k, v) in pairs(raw.unwrap_or("")) {
            match k.as_str() {
                "metadata" => {
                    for (mk, mv) in pairs(&v) {
                        q.metadata.insert(decode(&mk), decode(&mv));
                    }
                }
                "state" => {
                    q.states
                        .get_or_insert_with(Vec::new)
                        .extend(v.split(',').map(|s| s.trim().to_owned()));
                }
                "limit" => {
                    let n: usize = v
                        .parse()
                        .map_err(|_| Error::invalid(format!("limit {v:?} is not a number")))?;
                    q.limit = Some(n.clamp(1, PAGE));
                }
                "nextToken" => q.next_token = Some(v),
                _ => {}
            }
        }
        Ok(q)
    }
}

/// The tenant's sandboxes matching `q`, oldest first, from `q.next_token` on; and the next
/// page's token.
fn matching(state: &AppState, tenant: &Tenant, q: &Query) -> (Vec<Value>, Option<String>) {
    let wants_running = q
        .states
        .as_ref()
        .is_none_or(|s| s.iter().any(|x| x == "running"));
    if !wants_running {
        return (Vec::new(), None);
    }
    let all: Vec<SessionInfo> = state
        .engine
        .sessions()
        .list()
        .into_iter()
        .filter(|s| s.owner == tenant.0)
        .filter(|s| !s.metadata.contains_key(CONTEXT_OF))
        .filter(|s| matches!(s.status, SessionStatus::Ready | SessionStatus::Busy))
        .filter(|s| {
            q.metadata
                .iter()
                .all(|(k, v)| s.metadata.get(k).is_some_and(|x| x == v))
        })
        .collect();
    let start = q
        .next_token
        .as_ref()
        .and_then(|t| all.iter().position(|s| &s.id == t))
        .map_or(0, |i| i + 1);
    let limit = q.limit.unwrap_or(PAGE);
    let page: Vec<&SessionInfo> = all.iter().skip(start).take(limit).collect();
    let next = (start + page.len() < all.len())
        .then(|| page.last().map(|s| s.id.clone()))
        .flatten();
    let items = page
        .into_iter()
        .map(|s| {
            let sandbox = state.e2b.get(&s.id);
            let mut v = detail(s, sandbox.as_deref());
            if let Some(o) = v.as_object_mut() {
                o.remove("envdAccessToken");
            }
            v
        })
        .collect();
    (items, next)
}

/// `GET /v2/sandboxes`: a page, with `x-next-token` when more follow.
pub(crate) async fn list_v2(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let q = Query::parse(raw.as_deref())?;
    let (items, next) = matching(&state, &tenant, &q);
    let mut resp = Json(Value::Array(items)).into_response();
    if let Some(t) = next.and_then(|t| HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert("x-next-token", t);
    }
    Ok(resp)
}

/// `GET /sandboxes`: the older listing, every match at once.
pub(crate) async fn list_v1(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let mut q = Query::parse(raw.as_deref())?;
    q.limit = Some(usize::MAX);
    let (items, _) = matching(&state, &tenant, &q);
    Ok(Json(Value::Array(items)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_queries_decode_the_sdks_double_encoding() {
        // What the SDK sends for metadata {"user": "a b", "k&": "v="}, state running.
        let q = Query::parse(Some(
            "metadata=user%3Da%2520b%26k%2526%3Dv%253D&state=running,paused&limit=5&nextToken=ses_x",
        ))
        .expect("ok");
        assert_eq!(q.metadata.get("user").map(String::as_str), Some("a b"));
        assert_eq!(q.metadata.get("k&").map(String::as_str), Some("v="));
        assert_eq!(q.states.expect("ok"), ["running", "paused"]);
        assert_eq!(q.limit, Some(5));
        assert_eq!(q.next_token.as_deref(), Some("ses_x"));
        assert_eq!(
            Query::parse(Some("limit=1000")).expect("ok").limit,
            Some(PAGE)
        );
        assert!(Query::parse(Some("limit=x")).is_err());
    }
}
