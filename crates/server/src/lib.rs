//! runcell-server: the HTTP API (axum) over the engine, its OpenAPI document, metrics and the
//! web page. The only crate that speaks HTTP; it decides every status code in `error.rs`.
#![forbid(unsafe_code)]

mod approvals;
pub mod audit;
pub mod batch;
mod batches;
mod caller;
mod chat;
mod cluster;
mod connections;
mod e2b;
mod error;
mod executions;
mod extract;
mod files;
mod forward;
mod hosts;
pub mod mcp;
pub mod mcp_servers;
mod metrics;
mod misc;
mod oneshot;
mod openapi;
mod owned;
mod pause;
mod pending;
mod placement;
mod relay;
mod replay;
mod sessions;
mod state;
mod tool_calls;
mod tool_routes;
mod vendor;
mod web;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use axum::Router;
use runcell_store::Store;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use cluster::{ClusterSecret, MIN_CLUSTER_SECRET_BYTES};
pub use connections::{Capacity, ServeOptions, FDS_PER_SESSION, RESERVED_FDS};
pub use error::{ApiError, ErrorCode};
pub use hosts::{AllowedHost, HostPolicy};
pub use metrics::Metrics;
pub use placement::spawn_room_reports;
pub use runcell_engine::OPEN_TENANT;
pub use state::{AppState, ChatConfig};
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
        .routes(routes!(pause::pause_session))
        .routes(routes!(pause::resume_session))
        .routes(routes!(pause::fork_session))
        .routes(routes!(sessions::execute))
        .routes(routes!(sessions::run_command))
        .routes(routes!(tool_routes::tool_results))
        .routes(routes!(tool_routes::continue_execution))
        .routes(routes!(files::list_files, files::upload_multipart))
        .routes(routes!(oneshot::execute_once))
        .routes(routes!(batch::batch))
        .routes(routes!(executions::list_executions))
        .routes(routes!(executions::get_execution))
        .routes(routes!(executions::verify))
        .routes(routes!(audit::checkpoint))
        .routes(routes!(audit::public_key))
        .routes(routes!(audit::c2pa_ca))
        .routes(routes!(chat::chat_info, chat::chat))
        .routes(routes!(approvals::list_approvals))
        .routes(routes!(approvals::answer_approval))
        .routes(routes!(replay::replay_session))
        .routes(routes!(misc::healthz))
        .routes(routes!(misc::metrics))
        .split_for_parts();
    let mut api = api;
    document_forbidden(&mut api);
    document_no_space(&mut api);
    openapi::document(&mut api, &state.engine.config().limits, &state.batches);
    openapi::document_network(&mut api, &state.engine.config().network.allow_domains);
    let doc = api.clone();
    let router = router
        .merge(mcp::router(state.clone()))
        .nest("/anthropic", vendor::anthropic::router())
        .nest("/openai/v1", vendor::openai::router())
        .nest("/e2b", e2b::router())
        .merge(e2b::signed_urls())
        .nest("/gemini", vendor::gemini::router())
        .nest("/mistral", vendor::mistral::router())
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
        // A session another node holds is served there (several nodes on one database).
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            forward::to_owner,
        ))
        // Outside every route (the page and its assets too: a rebound page reads them) and
        // before any body is read.
        .layer(axum::middleware::from_fn_with_state(
            state.hosts.clone(),
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
            state.hosts.clone(),
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

/// Builds the shared state of a server listening on `listen` (the bound address, with the
/// real port when 0 was asked for): it answers to that address and the loopback names on its
/// port, and serves openly without keys only when it is loopback.
///
/// `store` is the engine's own (see [`runcell_engine::Engine::with_store`]): the server reads
/// API keys and audit checkpoints' chain heads there, the engine everything else.
pub fn state(engine: runcell_engine::Engine, store: Store, listen: SocketAddr) -> AppState {
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
        approvals: Arc::default(),
        batches: Arc::default(),
        e2b: Arc::default(),
        mcp_servers: Arc::default(),
        tool_calls: Arc::default(),
        cluster_secret: None,
    }
}
