//! E2B's control plane: create, list, get, connect, set the timeout of, pause, resume and kill
//! sandboxes, in the REST shapes of E2B's OpenAPI document (both its `/v2` routes and the
//! older ones).
//!
//! A sandbox's `timeout` maps onto its session's limits: without `autoPause` it is the idle
//! timeout (the sandbox is killed that long after its last activity); with it, it is the
//! session's `pause_after_s` (the sandbox pauses instead, and its idle timeout is the server's
//! maximum so that expiry never comes first). A paused sandbox is a paused session: its
//! variables in a snapshot, its files on disk; `connect` (or `resume`) brings it back.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_engine::{
    CreateSession, Language, LimitsRequest, NetworkPolicy, SessionInfo, SessionStatus,
};
use serde_json::{json, Value};

use super::error::Error;
use super::sandboxes::{self, Sandbox, CONTEXT_OF, DEFAULT_TIMEOUT_S, ENVD_VERSION};
use crate::state::{AppState, Principal, Tenant};

/// Sandboxes per page when the client names no limit, and at most (E2B's).
const PAGE: usize = 100;

/// The tenant behind the request's `X-API-KEY` (E2B's header).
async fn tenant(state: &AppState, headers: &HeaderMap) -> Result<Tenant, Error> {
    Ok(principal(state, headers).await?.tenant)
}

/// [`tenant`], with the key (for what is bounded per key: the network).
async fn principal(state: &AppState, headers: &HeaderMap) -> Result<Principal, Error> {
    match Principal::of_vendor_request(headers, Some("x-api-key"), state).await? {
        Ok(p) => Ok(p),
        Err(why) => Err(Error::new(StatusCode::UNAUTHORIZED, why)),
    }
}

/// The tenant's sandbox `id`, running or paused (a session, not a context's kernel).
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

/// When the sandbox ends (killed or paused) if left idle; for a paused one, when it expires.
fn end_at(info: &SessionInfo, sandbox: Option<&Sandbox>) -> chrono::DateTime<chrono::Utc> {
    match sandbox {
        Some(s) if s.auto_pause && info.status != SessionStatus::Paused => {
            info.last_active_at + chrono::Duration::seconds(info.limits.pause_after_s as i64)
        }
        _ => info.expires_at,
    }
}

/// E2B's word for a session's state.
fn state_of(info: &SessionInfo) -> &'static str {
    match info.status {
        SessionStatus::Paused => "paused",
        _ => "running",
    }
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
        "endAt": end_at(info, sandbox).to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "envdVersion": ENVD_VERSION,
        "cpuCount": info.limits.cpu.ceil().max(1.0) as u64,
        "memoryMB": info.limits.memory_mb,
        "diskSizeMB": info.limits.disk_mb,
        "metadata": info.metadata,
        "state": state_of(info),
        "domain": null,
        // What runcell gives the sandbox, in E2B's words: never the whole internet; the
        // allowlist's names through its proxy, everything else denied.
        "allowInternetAccess": false,
        "network": match &info.network {
            NetworkPolicy::Allowlist { allowed_domains, .. } => {
                json!({"allowOut": allowed_domains, "denyOut": ["0.0.0.0/0"]})
            }
            NetworkPolicy::Disabled => json!({"denyOut": ["0.0.0.0/0"]}),
        },
        // Any request resumes a paused sandbox (runcell's own rule): E2B's auto-resume.
        "lifecycle": {
            "onTimeout": if sandbox.is_some_and(|s| s.auto_pause) { "pause" } else { "kill" },
            "autoResume": true,
        },
    });
    if let Some(s) = sandbox {
        v["envdAccessToken"] = s.token.clone().into();
    }
    v
}

/// The lifetime a request asks for, within the server's maximum: its idle timeout's, or with
/// `auto_pause` its `pause_after_s`'s.
fn lifetime(state: &AppState, auto_pause: bool, asked: Option<u64>) -> u64 {
    let max = &state.engine.config().limits.max;
    let max = match auto_pause {
        // One second short of the idle maximum, so that the pause comes before the expiry.
        true => max
            .pause_after_s
            .min(max.idle_timeout_s.saturating_sub(1))
            .max(1),
        false => max.idle_timeout_s,
    };
    asked.unwrap_or(DEFAULT_TIMEOUT_S).clamp(1, max)
}

/// The session limits for a sandbox's `timeout` (module docs).
fn limits_for(state: &AppState, auto_pause: bool, secs: u64) -> LimitsRequest {
    let max = &state.engine.config().limits.max;
    let (idle, pause_after) = match auto_pause {
        true => (max.idle_timeout_s, secs),
        // Never paused by itself before it is killed: the idle timeout comes first.
        false => (secs, max.pause_after_s.max(secs)),
    };
    LimitsRequest {
        // E2B's cell limit, or the server's maximum if that is lower.
        exec_timeout_s: Some(DEFAULT_TIMEOUT_S.min(max.exec_timeout_s)),
        idle_timeout_s: Some(idle),
        pause_after_s: Some(pause_after.min(max.pause_after_s)),
        ..LimitsRequest::default()
    }
}

/// The largest network E2B's `allow_internet_access` and `network` can be given on runcell:
/// an allowlist of the names (and IP literals) in `network.allowOut`, within the server's
/// `--egress-allow` (the engine checks that bound, as for `/v1/sessions`). E2B's default,
/// the whole internet, is no policy runcell has: a sandbox without `allowOut` has no network
/// at all, whatever `allow_internet_access` says (the SDKs send `true` unless told).
fn network_of(req: &Value) -> Result<NetworkPolicy, Error> {
    match req.get("allow_internet_access") {
        None | Some(Value::Null) | Some(Value::Bool(_)) => {}
        Some(_) => return Err(Error::invalid("allow_internet_access must be a boolean")),
    }
    let net = match req.get("network") {
        None | Some(Value::Null) => return Ok(NetworkPolicy::Disabled),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(Error::invalid("network must be an object")),
    };
    let list = |field: &str| -> Result<Option<Vec<String>>, Error> {
        match net.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(|x| x.trim().to_owned()).ok_or_else(|| {
                        Error::invalid(format!("network.{field} must be a list of strings"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(Error::invalid(format!(
                "network.{field} must be a list of strings"
            ))),
        }
    };
    for (k, v) in net {
        match k.as_str() {
            "allowOut" | "denyOut" => {}
            // Inbound traffic to the sandbox's ports: runcell exposes none, so there is nothing
            // to make public or to mask.
            "allowPublicTraffic" | "maskRequestHost" => {}
            _ if v.is_null() => {}
            other => {
                return Err(Error::invalid(format!(
                    "network.{other} is not supported by runcell's E2B API: only allowOut (names) and denyOut (all traffic) map onto runcell's egress allowlist (docs/e2b.md)"
                )))
            }
        }
    }
    let all = |x: &str| matches!(x, "0.0.0.0/0" | "::/0");
    if let Some(deny) = list("denyOut")? {
        if let Some(d) = deny.iter().find(|d| !all(d)) {
            return Err(Error::invalid(format!(
                "network.denyOut {d:?} cannot be mapped: runcell's egress policy is an allowlist (everything else is denied); deny all traffic (0.0.0.0/0) and list what is allowed in allowOut (docs/e2b.md)"
            )));
        }
    }
    let allow = list("allowOut")?.unwrap_or_default();
    if allow.is_empty() {
        return Ok(NetworkPolicy::Disabled);
    }
    for a in &allow {
        if all(a) {
            return Err(Error::invalid(
                "network.allowOut 0.0.0.0/0 (all internet) cannot be mapped: runcell allows only named domains, within the server's --egress-allow (docs/e2b.md)",
            ));
        }
        if a.contains('/') {
            return Err(Error::invalid(format!(
                "network.allowOut {a:?} is an address range, which runcell's allowlist does not take: name the domains (or single IP addresses) instead (docs/e2b.md)"
            )));
        }
    }
    Ok(NetworkPolicy::Allowlist {
        allowed_domains: allow,
        domain_secrets: Vec::new(),
    })
}

/// `POST /sandboxes`, `POST /v2/sandboxes`.
pub(crate) async fn create(
    State(state): State<AppState>,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, Error> {
    let principal = principal(&state, &headers).await?;
    let tenant = principal.tenant;
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
    let auto_pause = match req.get("autoPause") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(Error::invalid("autoPause must be a boolean")),
    };
    let network = network_of(&req)?;
    crate::caller::within_key(principal.key.as_ref(), &network)?;
    if req.get("mcp").is_some_and(|m| !m.is_null()) {
        return Err(Error::invalid(
            "MCP gateways are not supported by runcell's E2B API",
        ));
    }
    let timeout = lifetime(&state, auto_pause, seconds(&req, "timeout")?);
    let limits = limits_for(&state, auto_pause, timeout);
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
            network,
        })
    })
    .await
    .map_err(crate::error::ApiError::internal)??;
    state.e2b.start_sweeper(&state.engine);
    let sandbox = Sandbox::new(&info.id, &tenant.0, &template, envs, auto_pause);
    sandbox.timeout_s.store(timeout, Ordering::Relaxed);
    let sandbox = state.e2b.insert(sandbox);
    let (store, kept) = (state.store.clone(), sandbox.clone());
    tokio::task::spawn_blocking(move || kept.persist(&store))
        .await
        .map_err(crate::error::ApiError::internal)?;
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
    let sandbox = adopt(&state, &id, &tenant).await?;
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
    running(&live(&state, &tenant, &id)?)?;
    let req = body(&bytes)?;
    let secs = seconds(&req, "timeout")?.ok_or_else(|| Error::invalid("timeout is required"))?;
    let sandbox = adopt(&state, &id, &tenant).await?;
    retime(&state, &sandbox, secs).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The sandbox's record, made now for a session that is not one yet (created through
/// `/v1/sessions`). May read and write the store.
async fn adopt(state: &AppState, id: &str, tenant: &Tenant) -> Result<Arc<Sandbox>, Error> {
    let (st, id, owner) = (state.clone(), id.to_owned(), tenant.0.clone());
    tokio::task::spawn_blocking(move || st.e2b.get_or_adopt(&st.engine, &st.store, &id, &owner))
        .await
        .map_err(|e| crate::error::ApiError::internal(e).into())
}

/// A timeout's settings need a running sandbox (a request to a paused one would resume it
/// behind the client's back: `connect` does that).
fn running(info: &SessionInfo) -> Result<(), Error> {
    match info.status {
        SessionStatus::Paused => Err(Error::new(
            StatusCode::CONFLICT,
            format!("sandbox {} is paused: connect to it to resume it", info.id),
        )),
        _ => Ok(()),
    }
}

/// Sets the sandbox's timeout, counted from now: when it is killed, or with `autoPause` when
/// it pauses (its context kernels live as long as it does: they end with it). Kept in the
/// store, for a server that starts again.
async fn retime(state: &AppState, sandbox: &Arc<Sandbox>, asked: u64) -> Result<(), Error> {
    let secs = lifetime(state, sandbox.auto_pause, Some(asked));
    let (st, sb) = (state.clone(), sandbox.clone());
    tokio::task::spawn_blocking(move || {
        let d = Duration::from_secs(secs);
        let sessions = st.engine.sessions();
        match sb.auto_pause {
            true => sessions.set_pause_after(&sb.id, d),
            false => sessions.set_idle_timeout(&sb.id, d),
        }?;
        sb.timeout_s.store(secs, Ordering::Relaxed);
        sb.persist(&st.store);
        Ok::<_, Error>(())
    })
    .await
    .map_err(crate::error::ApiError::internal)?
}

/// `POST /sandboxes/{id}/refreshes` `{duration?}`: keeps the sandbox alive that much longer.
pub(crate) async fn refresh(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    running(&live(&state, &tenant, &id)?)?;
    let req = body(&bytes)?;
    let sandbox = adopt(&state, &id, &tenant).await?;
    let secs = seconds(&req, "duration")?.unwrap_or(sandbox.timeout_s.load(Ordering::Relaxed));
    retime(&state, &sandbox, secs).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect` `{timeout?}`: another
/// client attaches to a sandbox: 200 when it was running (its timeout only ever grows here,
/// as E2B's), 201 when it was paused and is resumed now (its timeout then starts again: the
/// one asked for, or the one it had).
pub(crate) async fn connect(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let info = live(&state, &tenant, &id)?;
    let req = body(&bytes)?;
    let asked = seconds(&req, "timeout")?;
    state.e2b.start_sweeper(&state.engine);
    let sandbox = adopt(&state, &id, &tenant).await?;
    if info.status == SessionStatus::Paused {
        wake(&state, &sandbox).await?;
        let secs = asked.unwrap_or(sandbox.timeout_s.load(Ordering::Relaxed));
        retime(&state, &sandbox, secs).await?;
        return Ok((StatusCode::CREATED, Json(created(&sandbox))).into_response());
    }
    if let Some(secs) = asked {
        let left = (end_at(&info, Some(&sandbox)) - chrono::Utc::now())
            .num_seconds()
            .max(0) as u64;
        if secs > left {
            retime(&state, &sandbox, secs).await?;
        }
    }
    Ok((StatusCode::OK, Json(created(&sandbox))).into_response())
}

/// Resumes a paused sandbox's session (its context kernels resume when next used).
async fn wake(state: &AppState, sandbox: &Sandbox) -> Result<(), Error> {
    let (engine, id) = (state.engine.clone(), sandbox.id.clone());
    let (_, restored) = crate::sessions::blocking(move || engine.sessions().resume(&id)).await?;
    if let Some(r) = restored {
        tracing::info!(session = %sandbox.id, names = r.names.len(), skipped = r.skipped.len(), files_only = r.files_only.is_some(), "E2B sandbox resumed");
    }
    Ok(())
}

/// `POST /sandboxes/{id}/pause`: 204, the sandbox paused (its variables in a snapshot, its
/// files kept, its kernel and memory freed; its code contexts' kernels too); 409 when it is
/// paused already (the SDK then says `False`); 503 while a cell or command runs (runcell
/// cannot freeze a running cell: retry when it is done).
pub(crate) async fn pause(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    if live(&state, &tenant, &id)?.status == SessionStatus::Paused {
        return Err(Error::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    let sandbox = adopt(&state, &id, &tenant).await?;
    let st = state.clone();
    tokio::task::spawn_blocking(move || pause_blocking(&st, &sandbox))
        .await
        .map_err(crate::error::ApiError::internal)??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Pauses the sandbox's context kernels, then its own. One after the other: each snapshot
/// passes through the workspace they share.
fn pause_blocking(state: &AppState, sandbox: &Sandbox) -> Result<(), Error> {
    let sessions = state.engine.sessions();
    let busy = |e: runcell_engine::EngineError| {
        match e {
        runcell_engine::EngineError::SessionBusy(_) => Error::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "sandbox {} is running code or a command: runcell pauses sandboxes between cells, not during one; retry when it is done",
                sandbox.id
            ),
        ),
        other => other.into(),
    }
    };
    // Refuse before pausing anything: a busy sandbox stays as it was, contexts included. A
    // command runs in a sandbox of its own beside the kernel, which a pause would not stop.
    if !sandbox.processes().is_empty()
        || sessions
            .get(&sandbox.id)
            .is_ok_and(|i| i.status == SessionStatus::Busy)
    {
        return Err(busy(runcell_engine::EngineError::SessionBusy(
            runcell_engine::Busy::Running {
                id: sandbox.id.clone(),
            },
        )));
    }
    for ctx in sandbox.context_sessions() {
        match sessions.pause(&ctx) {
            Ok(_) => {}
            // A context removed meanwhile has nothing to keep.
            Err(
                runcell_engine::EngineError::NotFound(_)
                | runcell_engine::EngineError::SessionEnded(_),
            ) => {}
            Err(e) => return Err(busy(e)),
        }
    }
    sessions.pause(&sandbox.id).map(|_| ()).map_err(busy)
}

/// `POST /sandboxes/{id}/resume` `{timeout?}` (the older SDKs' resume): 201 with the
/// sandbox, resumed; 409 when it is running, not paused.
pub(crate) async fn resume(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    bytes: Bytes,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let info = live(&state, &tenant, &id)?;
    let req = body(&bytes)?;
    if info.status != SessionStatus::Paused {
        return Err(Error::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is running, not paused"),
        ));
    }
    state.e2b.start_sweeper(&state.engine);
    let sandbox = adopt(&state, &id, &tenant).await?;
    wake(&state, &sandbox).await?;
    let secs = seconds(&req, "timeout")?.unwrap_or(sandbox.timeout_s.load(Ordering::Relaxed));
    retime(&state, &sandbox, secs).await?;
    Ok((StatusCode::CREATED, Json(created(&sandbox))).into_response())
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
    let wants = |word: &str| {
        q.states
            .as_ref()
            .is_none_or(|s| s.iter().any(|x| x == word))
    };
    let (running, paused) = (wants("running"), wants("paused"));
    let all: Vec<SessionInfo> = state
        .engine
        .sessions()
        .list()
        .into_iter()
        .filter(|s| s.owner == tenant.0)
        .filter(|s| !s.metadata.contains_key(CONTEXT_OF))
        .filter(|s| match s.status {
            SessionStatus::Ready | SessionStatus::Busy => running,
            SessionStatus::Paused => paused,
            _ => false,
        })
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

/// Reads the records of the tenant's sandboxes this process does not know yet (a server that
/// started again) from the store, so the listing tells their template and lifecycle.
async fn load_known(state: &AppState, tenant: &Tenant) {
    let unknown: Vec<String> = state
        .engine
        .sessions()
        .list()
        .into_iter()
        .filter(|s| s.owner == tenant.0 && !s.metadata.contains_key(CONTEXT_OF))
        .filter(|s| state.e2b.get(&s.id).is_none())
        .map(|s| s.id)
        .collect();
    if unknown.is_empty() {
        return;
    }
    let (st, owner) = (state.clone(), tenant.0.clone());
    let _ = tokio::task::spawn_blocking(move || {
        for id in unknown {
            st.e2b.get_or_load(&st.engine, &st.store, &id, &owner);
        }
    })
    .await;
}

/// `GET /v2/sandboxes`: a page, with `x-next-token` when more follow.
pub(crate) async fn list_v2(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, Error> {
    let tenant = tenant(&state, &headers).await?;
    let q = Query::parse(raw.as_deref())?;
    load_known(&state, &tenant).await;
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
    load_known(&state, &tenant).await;
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
