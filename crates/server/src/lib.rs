//! runcell-server: the HTTP API (axum) over the engine, its OpenAPI document, metrics and the
//! web page. The only crate that speaks HTTP; it decides every status code in `error.rs`.
#![forbid(unsafe_code)]

pub mod audit;
mod chat;
mod connections;
mod error;
mod executions;
mod extract;
mod files;
mod hosts;
pub mod mcp;
mod metrics;
mod misc;
mod oneshot;
mod openapi;
mod sessions;
mod state;
mod vendor;
mod web;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use axum::Router;
use chrono::{DateTime, Utc};
use runcell_engine::{AuditSink, Execution, SessionInfo};
use runcell_store::{NewExecution, SessionRecord, Store, StoreError};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use chat::ChatConfig;
pub use connections::{Capacity, ServeOptions, FDS_PER_SESSION, RESERVED_FDS};
pub use error::{ApiError, ErrorCode};
pub use hosts::{AllowedHost, HostPolicy};
pub use metrics::Metrics;
pub use state::{AppState, OPEN_TENANT};
pub use vendor::VendorConfig;

/// Largest request body ([`runcell_engine::MAX_REQUEST_BYTES`]).
pub const MAX_BODY_BYTES: usize = runcell_engine::MAX_REQUEST_BYTES;

#[derive(OpenApi)]
#[openapi(
    info(title = "runcell", description = "A self-hosted code interpreter for AI agents"),
    paths(files::get_file, files::put_file, files::delete_file),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        openapi.security = Some(vec![utoipa::openapi::security::SecurityRequirement::new(
            "api_key",
            Vec::<String>::new(),
        )]);
    }
}

/// The router and the OpenAPI document, built from the same handler declarations so the two
/// cannot drift apart (the file routes need axum's `{*path}` and are added by hand; a test
/// checks every documented path is served).
pub fn app_with_openapi(state: AppState) -> (Router, utoipa::openapi::OpenApi) {
    let (router, api) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(sessions::create_session, sessions::list_sessions))
        .routes(routes!(sessions::get_session, sessions::delete_session))
        .routes(routes!(sessions::interrupt_session))
        .routes(routes!(sessions::restart_session))
        .routes(routes!(sessions::execute))
        .routes(routes!(sessions::run_command))
        .routes(routes!(files::list_files, files::upload_multipart))
        .routes(routes!(oneshot::execute_once))
        .routes(routes!(executions::list_executions))
        .routes(routes!(executions::get_execution))
        .routes(routes!(executions::verify))
        .routes(routes!(audit::checkpoint))
        .routes(routes!(audit::public_key))
        .routes(routes!(chat::chat_info, chat::chat))
        .routes(routes!(misc::healthz))
        .routes(routes!(misc::metrics))
        .split_for_parts();
    let mut api = api;
    document_forbidden(&mut api);
    document_no_space(&mut api);
    openapi::document(&mut api, &state.engine.config().limits);
    let doc = api.clone();
    let router = router
        .merge(mcp::router(state.clone()))
        .nest("/anthropic", vendor::anthropic::router())
        .nest("/openai/v1", vendor::openai::router())
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(files::get_file)
                .put(files::put_file)
                .delete(files::delete_file),
        )
        .route("/", get(web::index))
        .route("/assets/{name}", get(web::asset))
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc.clone();
                async move { axum::Json(doc) }
            }),
        )
        .fallback(|| async { ApiError::not_found("route") })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError::method_not_allowed(&method)
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Outside every route (the page and its assets too: a rebound page reads them) and
        // before any body is read.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            hosts::guard,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state);
    (router, api)
}

/// `/metrics` alone, for its own listener (`serve --metrics-listen`) bound to `listen`: for a
/// scraper, without a key, behind the same `Host` check (with that listener's port).
pub fn metrics_app(state: &AppState, listen: SocketAddr) -> Router {
    let mut state = state.clone();
    state.hosts = Arc::new(state.hosts.rebound(listen));
    Router::new()
        .route("/metrics", get(misc::metrics_text))
        .fallback(|| async { ApiError::not_found("route") })
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            hosts::guard,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// Every operation that writes (POST, PUT, DELETE) may be refused with 507
/// `insufficient_storage` when the server's disk is full, whatever its handler.
fn document_no_space(api: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let response = ResponseBuilder::new()
        .description(
            "insufficient_storage: the server's disk is full; nothing was recorded, and the \
             same request works once space is freed",
        )
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build();
    for item in api.paths.paths.values_mut() {
        for op in [&mut item.put, &mut item.post, &mut item.delete]
            .into_iter()
            .flatten()
        {
            op.responses
                .responses
                .entry("507".to_owned())
                .or_insert_with(|| response.clone().into());
        }
    }
}

/// Every operation may be refused with 403 `forbidden` by the `Host`/`Origin` check, which
/// sits in front of all of them rather than in each handler's declaration.
fn document_forbidden(api: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let response = ResponseBuilder::new()
        .description(
            "forbidden: the request's Host is not one of this server's names, or a \
             state-changing request came from a page of another origin",
        )
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build();
    for item in api.paths.paths.values_mut() {
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ]
        .into_iter()
        .flatten()
        {
            op.responses
                .responses
                .entry("403".to_owned())
                .or_insert_with(|| response.clone().into());
        }
    }
}

/// `app(state) -> Router`: the whole HTTP surface.
pub fn app(state: AppState) -> Router {
    app_with_openapi(state).0
}

/// Serves `router` on `listener` until `shutdown` resolves, with the default
/// [`ServeOptions`]; requests in flight finish first.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, router, shutdown, ServeOptions::default()).await
}

/// [`serve`] with connections bounded by `options`.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    options: ServeOptions,
) -> std::io::Result<()> {
    connections::serve_with(listener, router, shutdown, options).await
}

/// Records every execution in the store's per-tenant hash chain before its reply is sent.
#[derive(Debug)]
pub struct StoreAudit(pub Store);

impl AuditSink for StoreAudit {
    fn record(
        &self,
        owner: &str,
        execution: &Execution,
        code: &str,
    ) -> Result<(), runcell_engine::RecordError> {
        let rec = new_execution(owner, execution, code)?;
        self.0
            .append_execution(&rec)
            .map_err(|e| record_error(&e))?;
        Ok(())
    }

    fn record_batch(
        &self,
        items: &[runcell_engine::AuditItem<'_>],
    ) -> Vec<Result<(), runcell_engine::RecordError>> {
        let mut results: Vec<Option<Result<(), runcell_engine::RecordError>>> =
            Vec::with_capacity(items.len());
        let mut recs = Vec::with_capacity(items.len());
        for i in items {
            match new_execution(i.owner, i.execution, i.code) {
                Ok(r) => {
                    recs.push(r);
                    results.push(None);
                }
                Err(e) => results.push(Some(Err(e.into()))),
            }
        }
        let mut appended = self.0.append_executions(&recs).into_iter();
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| match appended.next() {
                    Some(Ok(_)) => Ok(()),
                    Some(Err(e)) => Err(record_error(&e)),
                    None => Err(runcell_engine::RecordError::Failed(
                        "the store gave no answer for this execution".into(),
                    )),
                })
            })
            .collect()
    }
}

/// Tenants' quotas and default start, read from the store at every session start (so
/// `runcell keys update`, another process, takes effect at once).
#[derive(Debug)]
pub struct StoreTenants(pub Store);

impl runcell_engine::TenantPolicies for StoreTenants {
    fn policy(&self, owner: &str) -> Result<runcell_engine::TenantPolicy, String> {
        let tenant = if owner.is_empty() { OPEN_TENANT } else { owner };
        let t = self
            .0
            .tenant_settings(tenant)
            .map_err(|e| runcell_engine::error_chain(&e))?;
        Ok(runcell_engine::TenantPolicy {
            max_sessions: t.max_sessions,
            max_memory_mb: t.max_memory_mb,
            start: t.start.as_deref().map(str::parse).transpose()?,
        })
    }
}

/// The store's record of an execution.
fn new_execution(owner: &str, execution: &Execution, code: &str) -> Result<NewExecution, String> {
    let json = serde_json::to_string(execution).map_err(|e| e.to_string())?;
    let status = serde_json::to_value(execution.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let tenant = if owner.is_empty() { OPEN_TENANT } else { owner };
    Ok(NewExecution {
        tenant: tenant.to_owned(),
        execution_id: execution.id.clone(),
        session_id: execution.session_id.clone(),
        status,
        code: code.to_owned(),
        execution_json: json,
        created_at: execution.finished_at,
    })
}

/// Sessions a previous server process left behind (killed with -9, say): their kernels died
/// with it, their workspaces did not. Each one whose workspace is still mounted gets a fresh
/// kernel (recovered: files intact, variables lost); the others are marked dead. Session
/// workspaces the store has no record of are removed. Returns (recovered, dead).
pub fn recover_sessions(
    engine: &runcell_engine::Engine,
    store: &Store,
) -> Result<(usize, usize), StoreError> {
    let stale = store.sessions_with_status(&["starting", "ready", "busy"])?;
    let (mut recovered, mut dead) = (0, 0);
    for s in stale {
        let limits = serde_json::from_str(&s.limits_json);
        let metadata = serde_json::from_str(&s.metadata_json).unwrap_or_default();
        let language = s.language.parse::<runcell_engine::Language>();
        let result = match (limits, language) {
            (Ok(limits), Ok(language)) => engine
                .sessions()
                .recover(runcell_engine::RecoverSession {
                    id: s.id.clone(),
                    language,
                    owner: s.tenant.clone(),
                    created_at: s.created_at,
                    limits,
                    start: s.start.parse().unwrap_or_default(),
                    metadata,
                })
                .map_err(|e| e.to_string()),
            (Err(e), _) => Err(e.to_string()),
            (_, Err(e)) => Err(e),
        };
        let updated = match result {
            Ok(info) => {
                recovered += 1;
                store.update_session_status(&s.id, "ready", info.last_active_at, info.expires_at)
            }
            Err(why) => {
                dead += 1;
                tracing::warn!(session = %s.id, reason = %why, "session could not be recovered; marked dead");
                store.update_session_status(&s.id, "dead", s.last_active_at, s.expires_at)
            }
        };
        match updated {
            // A full disk must not keep the server from starting (the operator frees space
            // through it). The row keeps its old status, which the next start settles again.
            Err(e) if e.is_storage_full() => tracing::warn!(
                session = %s.id,
                "the disk is full: the session's status is not updated in the store"
            ),
            other => {
                other?;
            }
        }
    }
    // Dead sessions past their expiry are forgotten, and their workspaces swept below.
    dead_sessions(store);
    // Workspaces no row names: warm sessions of the killed server, or sessions it started
    // but never recorded. Nobody can reach them; they only hold disk and memory.
    let known: std::collections::HashSet<String> = store
        .sessions_with_status(&["starting", "ready", "busy", "dead", "expired"])?
        .into_iter()
        .map(|s| s.id)
        .collect();
    engine
        .sessions()
        .sweep_orphan_workspaces(&|id| known.contains(id));
    Ok((recovered, dead))
}

/// Whether a session only the store remembers as dead is past its idle expiry; it is then
/// forgotten (its row and uploads deleted), as a live session expires after its idle timeout.
pub(crate) fn forget_if_expired(store: &Store, rec: &SessionRecord, now: DateTime<Utc>) -> bool {
    if rec.expires_at > now {
        return false;
    }
    if let Err(e) = store.delete_session(&rec.id) {
        tracing::warn!(session = %rec.id, error = %runcell_engine::error_chain(&e), "cannot forget an expired dead session");
    } else {
        tracing::info!(session = %rec.id, "dead session expired");
    }
    true
}

/// The sessions only the store remembers as dead and not yet expired (those past their expiry
/// are forgotten on the way).
pub(crate) fn dead_sessions(store: &Store) -> Vec<SessionRecord> {
    let now = Utc::now();
    store
        .sessions_with_status(&["dead"])
        .unwrap_or_default()
        .into_iter()
        .filter(|r| !forget_if_expired(store, r, now))
        .collect()
}

/// What the API shows of a session only the store remembers (its kernel is gone).
pub(crate) fn dead_session(rec: &SessionRecord) -> Option<SessionInfo> {
    Some(SessionInfo {
        id: rec.id.clone(),
        language: rec.language.parse().ok()?,
        status: runcell_engine::SessionStatus::Dead,
        created_at: rec.created_at,
        last_active_at: rec.last_active_at,
        expires_at: rec.expires_at,
        limits: serde_json::from_str(&rec.limits_json).ok()?,
        start: rec.start.parse().unwrap_or_default(),
        metadata: serde_json::from_str(&rec.metadata_json).unwrap_or_default(),
        owner: rec.tenant.clone(),
    })
}

pub(crate) fn store_error(e: StoreError) -> ApiError {
    match e {
        StoreError::Invalid(m) => ApiError::invalid(m),
        StoreError::NotFound(m) => ApiError::not_found(m),
        e if e.is_storage_full() => ApiError::no_space(NO_SPACE),
        other => ApiError::internal(runcell_engine::error_chain(&other)),
    }
}

/// What a client is told when the database cannot take a write.
const NO_SPACE: &str =
    "the server's disk is full: nothing was recorded; retry once the operator frees space";

/// The audit sink's word for a store error.
fn record_error(e: &StoreError) -> runcell_engine::RecordError {
    if e.is_storage_full() {
        runcell_engine::RecordError::NoSpace(NO_SPACE.into())
    } else {
        runcell_engine::RecordError::Failed(runcell_engine::error_chain(e))
    }
}

/// What the store keeps of a live session.
pub(crate) fn session_record(engine: &runcell_engine::Engine, info: &SessionInfo) -> SessionRecord {
    SessionRecord {
        id: info.id.clone(),
        tenant: info.owner.clone(),
        language: info.language.as_str().to_owned(),
        status: "ready".into(),
        created_at: info.created_at,
        last_active_at: info.last_active_at,
        expires_at: info.expires_at,
        // Both serialise plain maps and numbers: they cannot fail.
        limits_json: serde_json::to_string(&info.limits).unwrap_or_default(),
        metadata_json: serde_json::to_string(&info.metadata).unwrap_or_default(),
        workspace_path: engine
            .config()
            .data_dir
            .join("workspaces")
            .join(&info.id)
            .to_string_lossy()
            .into_owned(),
        start: info.start.as_str().to_owned(),
    }
}

pub(crate) async fn persist_session(state: &AppState, info: &SessionInfo) -> Result<(), ApiError> {
    let store = state.store.clone();
    let rec = session_record(&state.engine, info);
    tokio::task::spawn_blocking(move || store.put_session(&rec))
        .await
        .map_err(ApiError::internal)?
        .map_err(store_error)
}

pub(crate) async fn forget_session(state: &AppState, id: &str) -> Result<(), ApiError> {
    let store = state.store.clone();
    let id = id.to_owned();
    tokio::task::spawn_blocking(move || store.delete_session(&id))
        .await
        .map_err(ApiError::internal)?
        .map_err(store_error)?;
    Ok(())
}

pub(crate) async fn record_upload(
    state: &AppState,
    session: &str,
    entry: &runcell_engine::FileEntry,
    sha256: String,
) -> Result<(), ApiError> {
    let store = state.store.clone();
    let (session, path, size) = (session.to_owned(), entry.path.clone(), entry.size);
    tokio::task::spawn_blocking(move || {
        store.record_upload(&session, &path, size, &sha256, Utc::now())
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(store_error)
}

/// Builds the shared state of a server listening on `listen` (the bound address, with the
/// real port when 0 was asked for): it answers to that address and the loopback names on its
/// port, and serves openly without keys only when it is loopback.
pub fn state(engine: runcell_engine::Engine, store: Store, listen: SocketAddr) -> AppState {
    engine.set_tenant_policies(Arc::new(StoreTenants(store.clone())));
    AppState {
        engine,
        store,
        metrics: Arc::new(Metrics::default()),
        loopback: listen.ip().is_loopback(),
        auth: Arc::default(),
        chat: None,
        vendor: None,
        hosts: Arc::new(HostPolicy::new(listen)),
        metrics_elsewhere: false,
        audit_signer: None,
    }
}
