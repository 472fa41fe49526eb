//! MCP (rmcp): the `python`, `bash` and `text_editor` tools of `runcell_engine::tools` for any
//! MCP client. The same handler serves `runcell mcp` (stdio, a local engine) and `POST /mcp`
//! (streamable HTTP, behind the API keys of `/v1`).
//!
//! A connection gets its own Python session, created on the first tool call and deleted when
//! the connection ends (stdio: at EOF; HTTP: when the MCP session is closed or expires). A
//! `session_id` argument targets another session of the same tenant. Requests of the
//! session-less protocol (2026-07-28 and later, over HTTP) have no connection: each client of
//! a tenant gets a default session instead ([`DefaultSessions`]), reused by its calls, with a
//! short idle expiry and a bound per tenant. Every result names its session.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use runcell_engine::tools::{self, ToolCall, ToolOutput};
use runcell_engine::{
    CancelToken, CreateSession, Engine, EngineError, Language, Limit, SessionInfo,
};

use serde_json::Value;

use crate::error::{JsonRpcKind, JsonRpcRefusal};
use crate::metrics::Metrics;
use crate::state::{AppState, Tenant};

const INSTRUCTIONS: &str = "runcell runs code in an isolated, network-less sandbox. Use the \
python tool for analysis (state persists between calls), bash for shell commands and \
text_editor to read and edit files; all three share /workspace.";

/// One MCP connection's tools and its default session.
#[derive(Clone)]
pub struct McpHandler {
    inner: Arc<Conn>,
}

impl std::fmt::Debug for McpHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpHandler").finish_non_exhaustive()
    }
}

struct Conn {
    /// HTTP: the server's engine, which records sessions like those of `/v1` (listed,
    /// recovered after a crash); stdio: a local engine, which records nothing.
    engine: Engine,
    metrics: Option<Arc<Metrics>>,
    /// stdio: the owner of every session; HTTP: the tenant of each request.
    local_owner: Option<String>,
    client: &'static str,
    state: tokio::sync::Mutex<ConnState>,
    /// HTTP: the default sessions of requests without an MCP session, shared by every
    /// connection of the server.
    defaults: Option<Arc<DefaultSessions>>,
    /// HTTP: the server, whose cluster a call for another node's session is forwarded in.
    app: Option<AppState>,
}

/// How long an MCP session (protocol revisions with `initialize`) lives without a request.
const MCP_SESSION_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// How long a default session of the session-less protocol lives unused. No connection ends
/// to say its client is gone, and clients (the Inspector CLI, SDK scripts) come and go:
/// shorter than a session's usual 20 minutes, long enough for a model's pause between calls.
const DEFAULT_SESSION_IDLE_S: u64 = 10 * 60;

/// Default sessions a tenant keeps at most (one per client name); a new client past it
/// takes the place of the one unused the longest, whose session is deleted.
const DEFAULT_SESSIONS_PER_TENANT: usize = 8;

/// The default sessions of session-less MCP requests (2026-07-28 and later): one per tenant
/// and client, reused by each of that client's calls, so that `x = 1` then `x` works as it
/// does within a connection.
#[derive(Default)]
pub(crate) struct DefaultSessions {
    /// Per tenant, its clients' sessions, the most recently used last. A tokio mutex held
    /// across a session's creation, so that two first calls of one client start one session.
    by_tenant: tokio::sync::Mutex<std::collections::HashMap<String, Vec<DefaultSession>>>,
}

struct DefaultSession {
    client: String,
    session: String,
}

#[derive(Default)]
struct ConnState {
    /// The tenant this connection acts for, fixed by its first tool call.
    owner: Option<String>,
    /// The connection's own session, deleted with the connection.
    default: Option<String>,
    closed: bool,
}

impl McpHandler {
    /// A handler for one local client (`runcell mcp`): sessions belong to `owner`.
    pub fn local(engine: Engine, owner: &str) -> McpHandler {
        McpHandler::new(engine, None, Some(owner.to_owned()), "runcell mcp")
    }

    fn new(
        engine: Engine,
        metrics: Option<Arc<Metrics>>,
        local_owner: Option<String>,
        client: &'static str,
    ) -> McpHandler {
        McpHandler {
            inner: Arc::new(Conn {
                engine,
                metrics,
                local_owner,
                client,
                state: tokio::sync::Mutex::new(ConnState::default()),
                defaults: None,
                app: None,
            }),
        }
    }

    fn with_defaults(mut self, defaults: Arc<DefaultSessions>, app: AppState) -> McpHandler {
        if let Some(conn) = Arc::get_mut(&mut self.inner) {
            conn.defaults = Some(defaults);
            conn.app = Some(app);
        }
        self
    }

    /// Ends the connection: deletes its default session (blocks until it is gone).
    pub fn close(&self) {
        let default = {
            let mut s = self.inner.state.blocking_lock();
            s.closed = true;
            s.default.take()
        };
        if let Some(id) = default {
            self.inner.forget(&id);
        }
    }

    /// The tool definitions as MCP `Tool`s.
    pub fn tools() -> Vec<Tool> {
        tools::definitions()
            .into_iter()
            .map(|d| {
                let schema = match d.input_schema {
                    serde_json::Value::Object(m) => m,
                    _ => serde_json::Map::new(),
                };
                Tool::new(d.name, d.description, Arc::new(schema))
            })
            .collect()
    }

    async fn call(&self, call: ToolCall, ctx: &RequestContext<RoleServer>) -> ToolOutput {
        let owner = match self.owner_of(ctx).await {
            Ok(o) => o,
            Err(m) => return ToolOutput::error(m),
        };
        // Over HTTP, a request outside an MCP session (no Mcp-Session-Id) has no connection.
        let sessionless = self.inner.local_owner.is_none()
            && ctx
                .extensions
                .get::<axum::http::request::Parts>()
                .is_some_and(|p| !p.headers.contains_key("mcp-session-id"));
        let client = sessionless.then(|| client_identity(ctx));
        let (session, note) = match self.session_for(&call, &owner, client.as_deref()).await {
            Ok(s) => s,
            Err(m) => return ToolOutput::error(m),
        };
        let mut out = run_in(
            &self.inner.engine,
            self.inner.metrics.as_deref(),
            session,
            call,
            ctx.ct.cancelled(),
        )
        .await;
        if let Some(note) = note {
            out.text = format!("{note}\n\n{}", out.text);
        }
        out
    }

    /// A call naming (`session_id`) a session another live node holds, over HTTP in a
    /// cluster: forwarded to that node, which runs it (`forwarded_tool_call`); `None` for a
    /// session of this node, or of none (then answered here as usual).
    async fn elsewhere(
        &self,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<CallToolResult> {
        let id = request
            .arguments
            .as_ref()?
            .get("session_id")?
            .as_str()?
            .to_owned();
        let parts = ctx.extensions.get::<axum::http::request::Parts>()?;
        let (app, me, node) = self.owner_elsewhere(&id).await?;
        let owner = runcell_store::SessionNode { node, alive: true };
        let app = &app;
        let failed =
            |why: String| CallToolResult::error(vec![ContentBlock::text(format!("error: {why}"))]);
        // The connection's tenant is checked here as for a local call; the session's is
        // checked by its node.
        if let Err(m) = self.owner_of(ctx).await {
            return Some(failed(m));
        }
        let body = serde_json::json!({"name": request.name, "arguments": request.arguments});
        let mut req = Request::post(format!("/v1/sessions/{id}/tool-call"))
            .header(axum::http::header::CONTENT_TYPE, "application/json");
        if let Some(auth) = parts.headers.get(axum::http::header::AUTHORIZATION) {
            req = req.header(axum::http::header::AUTHORIZATION, auth);
        }
        let req = match req.body(axum::body::Body::from(body.to_string())) {
            Ok(r) => r,
            Err(e) => return Some(failed(format!("internal error: {e}"))),
        };
        // The client calling the request off drops the link, and so the call at its node.
        let answer = tokio::select! {
            a = crate::relay::to_node(app, &owner.node, &me, req) => a,
            _ = ctx.ct.cancelled() => return Some(failed("the call was cancelled".into())),
        };
        Some(match answer {
            Ok(resp) => {
                let status = resp.status();
                let bytes =
                    axum::body::to_bytes(resp.into_body(), runcell_engine::MAX_REQUEST_BYTES << 4)
                        .await
                        .unwrap_or_default();
                match serde_json::from_slice::<CallToolResult>(&bytes) {
                    Ok(result) if status.is_success() => result,
                    _ => failed(format!(
                        "the node holding session {id} ({}) answered {status}: {}",
                        owner.node,
                        String::from_utf8_lossy(&bytes)
                    )),
                }
            }
            Err(why) => failed(format!(
                "the node holding session {id} ({}) cannot be reached: {why}",
                owner.node
            )),
        })
    }

    /// The other live node holding session `id`, when this node is one of a cluster and
    /// does not hold it itself: this node's state and id, and that node's.
    async fn owner_elsewhere(&self, id: &str) -> Option<(AppState, String, String)> {
        let app = self.inner.app.as_ref()?;
        let me = app.store.node_id()?.to_owned();
        let (engine, store, sid) = (app.engine.clone(), app.store.clone(), id.to_owned());
        let owner = tokio::task::spawn_blocking(move || {
            if engine.sessions().get(&sid).is_ok() {
                return None;
            }
            store.session_node(&sid).ok().flatten()
        })
        .await
        .ok()
        .flatten()
        .filter(|o| o.alive && o.node != me)?;
        Some((app.clone(), me, owner.node))
    }

    /// A file link's contents from the node holding its session (its `/v1` download, for
    /// the client's tenant and key); `None` for a session of this node, or of none.
    async fn file_elsewhere(
        &self,
        id: &str,
        path: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<Result<Vec<u8>, String>> {
        let (app, me, node) = self.owner_elsewhere(id).await?;
        let parts = ctx.extensions.get::<axum::http::request::Parts>()?;
        let mut req = Request::get(format!("/v1/sessions/{id}/files/{}", encode_path(path)));
        if let Some(auth) = parts.headers.get(axum::http::header::AUTHORIZATION) {
            req = req.header(axum::http::header::AUTHORIZATION, auth);
        }
        let req = req.body(axum::body::Body::empty()).ok()?;
        Some(match crate::relay::to_node(&app, &node, &me, req).await {
            Ok(resp) => {
                let status = resp.status();
                let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
                    .await
                    .map_err(|e| e.to_string());
                match bytes {
                    Ok(b) if status.is_success() => Ok(b.to_vec()),
                    Ok(b) => Err(format!(
                        "the node holding session {id} ({node}) answered {status}: {}",
                        String::from_utf8_lossy(&b)
                    )),
                    Err(e) => Err(e),
                }
            }
            Err(why) => Err(format!(
                "the node holding session {id} ({node}) cannot be reached: {why}"
            )),
        })
    }

    /// Who is calling: the local owner, or the tenant of the HTTP request (fixed for the
    /// connection by its first call).
    async fn owner_of(&self, ctx: &RequestContext<RoleServer>) -> Result<String, String> {
        if let Some(o) = &self.inner.local_owner {
            return Ok(o.clone());
        }
        let tenant = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<Tenant>())
            .map(|t| t.0.clone())
            .ok_or("internal error: the request carries no tenant")?;
        let mut s = self.inner.state.lock().await;
        match &s.owner {
            Some(o) if *o != tenant => {
                Err("this MCP session belongs to another API key's tenant".into())
            }
            Some(_) => Ok(tenant),
            None => {
                s.owner = Some(tenant.clone());
                Ok(tenant)
            }
        }
    }

    /// The session a call runs in, and a note for the model when it is news.
    async fn session_for(
        &self,
        call: &ToolCall,
        owner: &str,
        sessionless_client: Option<&str>,
    ) -> Result<(String, Option<String>), String> {
        if let Some(id) = call.session_id() {
            let engine = self.inner.engine.clone();
            let id2 = id.to_owned();
            let info = tokio::task::spawn_blocking(move || engine.sessions().get(&id2))
                .await
                .map_err(|e| e.to_string())?;
            return match info {
                Ok(i) if i.owner == owner => {
                    if matches!(call, ToolCall::Python(_)) && i.language != Language::Python {
                        return Err(format!(
                            "session {id} runs {}, not Python; use the bash tool, or omit session_id",
                            i.language.as_str()
                        ));
                    }
                    Ok((i.id, None))
                }
                _ => Err(format!("session {id} not found")),
            };
        }
        if let Some(client) = sessionless_client {
            return self.default_session(owner, client).await;
        }
        let mut s = self.inner.state.lock().await;
        if s.closed {
            return Err("the connection is closing".into());
        }
        let mut note = None;
        if let Some(id) = s.default.clone() {
            let engine = self.inner.engine.clone();
            let id2 = id.clone();
            let alive = tokio::task::spawn_blocking(move || engine.sessions().get(&id2).is_ok())
                .await
                .unwrap_or(false);
            if alive {
                return Ok((id, None));
            }
            note = Some(
                "note: the previous session had ended (idle for too long); this call runs in a new session: variables are lost and /workspace is empty".to_owned(),
            );
            let this = self.inner.clone();
            tokio::task::spawn_blocking(move || this.forget(&id));
        }
        let info = self.create(owner).await?;
        s.default = Some(info.id.clone());
        Ok((info.id, note))
    }

    async fn create(&self, owner: &str) -> Result<SessionInfo, String> {
        let this = self.inner.clone();
        let owner = owner.to_owned();
        tokio::task::spawn_blocking(move || this.create(&owner, None))
            .await
            .map_err(|e| e.to_string())?
    }

    /// The tenant's default session for `client` (session-less requests): the one its earlier
    /// calls used while it lives, else a new one, named for the model.
    async fn default_session(
        &self,
        owner: &str,
        client: &str,
    ) -> Result<(String, Option<String>), String> {
        let Some(defaults) = self.inner.defaults.clone() else {
            return Err("internal error: no default sessions".into());
        };
        let mut by_tenant = defaults.by_tenant.lock().await;
        let mine = by_tenant.entry(owner.to_owned()).or_default();
        let mut ended = None;
        if let Some(at) = mine.iter().position(|d| d.client == client) {
            let d = mine.remove(at);
            let engine = self.inner.engine.clone();
            let id = d.session.clone();
            let alive = tokio::task::spawn_blocking(move || engine.sessions().get(&id).is_ok())
                .await
                .unwrap_or(false);
            if alive {
                let id = d.session.clone();
                mine.push(d);
                return Ok((id, None));
            }
            ended = Some(d.session);
        }
        if mine.len() >= DEFAULT_SESSIONS_PER_TENANT {
            let evicted = mine.remove(0);
            let this = self.inner.clone();
            tracing::info!(session = %evicted.session, client = %evicted.client, "MCP default session evicted: too many clients of one tenant");
            tokio::task::spawn_blocking(move || this.forget(&evicted.session));
        }
        let this = self.inner.clone();
        let o = owner.to_owned();
        let info =
            tokio::task::spawn_blocking(move || this.create(&o, Some(DEFAULT_SESSION_IDLE_S)))
                .await
                .map_err(|e| e.to_string())??;
        mine.push(DefaultSession {
            client: client.to_owned(),
            session: info.id.clone(),
        });
        let note = match ended {
            Some(old) => format!(
                "note: session {old} had ended (idle for too long); this call runs in a new session, session_id: {} (variables are lost and /workspace is empty)",
                info.id
            ),
            None => format!(
                "session_id: {} (this client's default session: later calls without session_id run here too, until it is idle for {} minutes)",
                info.id,
                DEFAULT_SESSION_IDLE_S / 60
            ),
        };
        Ok((info.id, Some(note)))
    }
}

/// Who a session-less request comes from, for its default session: the client's name from
/// the request's `_meta` (MCP 2026-07-28), else its User-Agent.
fn client_identity(ctx: &RequestContext<RoleServer>) -> String {
    let name = ctx
        .meta
        .client_info()
        .map(|i| i.name)
        .filter(|n| !n.is_empty());
    let name = name.or_else(|| {
        ctx.extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.headers.get(axum::http::header::USER_AGENT))
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    });
    // Bounded: it is a key the client chooses.
    let mut name = name.unwrap_or_else(|| "unknown".to_owned());
    if name.len() > 200 {
        let mut end = 200;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

impl Conn {
    /// A Python session of `owner`; `idle_s` shortens its idle expiry (never lengthens it).
    fn create(&self, owner: &str, idle_s: Option<u64>) -> Result<SessionInfo, String> {
        let started = std::time::Instant::now();
        let request = |idle_timeout_s| CreateSession {
            owner: owner.to_owned(),
            language: Some(Language::Python),
            limits: runcell_engine::LimitsRequest {
                idle_timeout_s,
                ..Default::default()
            },
            metadata: BTreeMap::from([("client".to_owned(), self.client.to_owned())]),
            ..CreateSession::default()
        };
        let sessions = self.engine.sessions();
        let created = match sessions.create(request(idle_s)) {
            // A server whose idle maximum is below ours: its own default is shorter still.
            Err(EngineError::LimitExceeded(Limit::OverMaximum {
                limit: "idle_timeout_s",
                ..
            })) if idle_s.is_some() => sessions.create(request(None)),
            other => other,
        };
        let info = created.map_err(|e| {
            format!(
                "cannot start a session: {}",
                runcell_engine::error_chain(&e)
            )
        })?;
        if let Some(m) = &self.metrics {
            m.observe_session_start(started.elapsed().as_secs_f64());
        }
        tracing::info!(session = %info.id, client = self.client, "MCP session started");
        Ok(info)
    }

    /// Deletes a session of this connection (blocking), whatever the store says: its client
    /// is gone.
    fn forget(&self, id: &str) {
        let _ = self.engine.sessions().close(id);
        tracing::info!(session = %id, "MCP session ended");
    }
}

impl Drop for Conn {
    /// The connection is gone (HTTP: its MCP session closed): so is its session. On a thread
    /// of its own, since deleting waits for the sandbox to go.
    fn drop(&mut self) {
        let default = self.state.get_mut().default.take();
        if let Some(id) = default {
            let engine = self.engine.clone();
            std::thread::spawn(move || {
                let _ = engine.sessions().close(&id);
                tracing::info!(session = %id, "MCP session ended");
            });
        }
    }
}

impl ServerHandler for McpHandler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(
            Implementation::new("runcell", env!("CARGO_PKG_VERSION"))
                .with_title("runcell code interpreter"),
        )
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(McpHandler::tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        McpHandler::tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        if let Some(result) = self.elsewhere(&request, &context).await {
            return Ok(result.into());
        }
        let args = request
            .arguments
            .map(serde_json::Value::Object)
            .unwrap_or(serde_json::Value::Null);
        let out = match ToolCall::parse(&request.name, args) {
            Ok(call) => self.call(call, &context).await,
            Err(m) if tools::definitions().iter().all(|d| d.name != request.name) => {
                return Err(McpError::invalid_params(m, None))
            }
            Err(m) => ToolOutput::error(m),
        };
        Ok(to_result(out).into())
    }

    /// Reads a file a tool result linked to (`runcell://sessions/{id}/files/{path}`), from a
    /// session of the caller's tenant.
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let owner = self
            .owner_of(&context)
            .await
            .map_err(|m| McpError::invalid_params(m, None))?;
        let (session, path) = request
            .uri
            .strip_prefix(RESOURCE_PREFIX)
            .and_then(|rest| rest.split_once("/files/"))
            .map(|(s, p)| (s.to_owned(), p.to_owned()))
            .ok_or_else(|| {
                McpError::resource_not_found(format!("unknown resource {}", request.uri), None)
            })?;
        let data = match self.file_elsewhere(&session, &path, &context).await {
            Some(read) => read.map_err(|m| McpError::resource_not_found(m, None))?,
            None => {
                let engine = self.inner.engine.clone();
                let p = path.clone();
                tokio::task::spawn_blocking(move || match engine.sessions().get(&session) {
                    Ok(info) if info.owner == owner => engine.read_file(&session, &p),
                    _ => Err(EngineError::NotFound(runcell_engine::Resource::Session {
                        id: session,
                    })),
                })
                .await
                .map_err(|e| McpError::internal_error(e.to_string(), None))?
                .map_err(|e| McpError::resource_not_found(runcell_engine::error_chain(&e), None))?
            }
        };
        use base64::Engine as _;
        let mime = runcell_engine::mime_of(&path);
        let textual = mime.starts_with("text/") || mime.ends_with("json") || mime.ends_with("xml");
        let contents = match String::from_utf8(data) {
            Ok(text) if textual => ResourceContents::text(text, request.uri),
            Ok(text) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(text.as_bytes()),
                request.uri,
            ),
            Err(e) => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(e.as_bytes()),
                request.uri,
            ),
        };
        Ok(ReadResourceResult::new(vec![contents.with_mime_type(mime)]).into())
    }
}

/// Runs `call` in `session`, interrupted when `cancelled` resolves or when this future is
/// dropped (a forwarded call whose forwarding node went away); the output names its session.
async fn run_in(
    engine: &Engine,
    metrics: Option<&Metrics>,
    session: String,
    call: ToolCall,
    cancelled: impl std::future::Future<Output = ()>,
) -> ToolOutput {
    /// Interrupts the call unless disarmed: dropped before the call ended.
    struct Interrupt(Option<(Engine, String, CancelToken)>);
    impl Drop for Interrupt {
        fn drop(&mut self) {
            if let Some((engine, sid, token)) = self.0.take() {
                tokio::task::spawn_blocking(move || engine.sessions().cancel(&sid, &token));
            }
        }
    }
    let token = CancelToken::new();
    let mut interrupt = Interrupt(Some((engine.clone(), session.clone(), token.clone())));
    let (worker_token, sid, e2) = (token.clone(), session.clone(), engine.clone());
    let mut run = tokio::task::spawn_blocking(move || e2.run_tool(&sid, &call, worker_token));
    let joined = tokio::select! {
        r = &mut run => r,
        () = cancelled => {
            // The client called the request off: interrupt the execution, then report it.
            let (engine, sid, t) = (engine.clone(), session.clone(), token.clone());
            let _ = tokio::task::spawn_blocking(move || engine.sessions().cancel(&sid, &t)).await;
            run.await
        }
    };
    interrupt.0 = None;
    let mut out = match joined {
        Ok(Ok(out)) => out,
        Ok(Err(EngineError::NotFound(_) | EngineError::SessionEnded(_))) => ToolOutput::error(format!(
            "session {session} has ended (deleted or idle for too long); call again without session_id to start a new one"
        )),
        Ok(Err(e)) => ToolOutput::error(runcell_engine::error_chain(&e)),
        Err(e) => ToolOutput::error(format!("internal error: {e}")),
    };
    if let (Some(m), Some(e)) = (metrics, &out.execution) {
        m.observe_execution(e);
    }
    // Every result names its session, for clients that keep several.
    match &mut out.structured {
        Some(Value::Object(m)) => {
            m.insert("session_id".into(), Value::String(session));
        }
        s @ None => *s = Some(serde_json::json!({ "session_id": session })),
        Some(_) => {}
    }
    out
}

/// `POST /v1/sessions/{id}/tool-call` `{name, arguments}`: an MCP tool call another node of
/// the cluster took for a session of this one, answered with the MCP `CallToolResult`. Only
/// for requests a node forwarded (signed, crate::forward); anyone else: 404, as for any
/// route there is not.
async fn forwarded_tool_call(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    forwarded: Option<axum::Extension<crate::cluster::ForwardedTenant>>,
    body: axum::body::Bytes,
) -> Response {
    let Some(axum::Extension(caller)) = forwarded else {
        return crate::error::ApiError::not_found("route").into_response();
    };
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let name = body.get("name").and_then(Value::as_str).unwrap_or_default();
    let args = body.get("arguments").cloned().unwrap_or(Value::Null);
    let out = match ToolCall::parse(name, args) {
        Err(m) => ToolOutput::error(m),
        Ok(call) => {
            let (engine, sid) = (state.engine.clone(), id.clone());
            let info = tokio::task::spawn_blocking(move || engine.sessions().get(&sid)).await;
            match info {
                Ok(Ok(i)) if i.owner == caller.tenant => {
                    if matches!(call, ToolCall::Python(_)) && i.language != Language::Python {
                        ToolOutput::error(format!(
                            "session {id} runs {}, not Python; use the bash tool, or omit session_id",
                            i.language.as_str()
                        ))
                    } else {
                        run_in(
                            &state.engine,
                            Some(&state.metrics),
                            i.id,
                            call,
                            std::future::pending(),
                        )
                        .await
                    }
                }
                _ => ToolOutput::error(format!("session {id} not found")),
            }
        }
    };
    axum::Json(to_result(out)).into_response()
}

/// `path` for a URL's path: every byte but unreserved ones and `/` percent-encoded.
fn encode_path(path: &str) -> String {
    path.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Files produced by a tool call are linked as `runcell://sessions/{id}/files/{path}`.
const RESOURCE_PREFIX: &str = "runcell://sessions/";

/// A tool output as MCP content: the text, every image, the Execution as structured content.
pub fn to_result(out: ToolOutput) -> CallToolResult {
    let mut content = vec![ContentBlock::text(out.text)];
    content.extend(
        out.images
            .into_iter()
            .map(|i| ContentBlock::image(i.data_base64, i.mime)),
    );
    // A link per file the code created or changed; `resources/read` serves it.
    if let Some(e) = &out.execution {
        if let Some(session) = &e.session_id {
            content.extend(
                e.files
                    .iter()
                    .filter(|f| f.change != runcell_engine::FileChangeKind::Deleted)
                    .map(|f| {
                        ContentBlock::resource_link(
                            Resource::new(
                                format!("{RESOURCE_PREFIX}{session}/files/{}", f.path),
                                f.path.clone(),
                            )
                            .with_mime_type(f.mime.clone())
                            .with_size(f.size),
                        )
                    }),
            );
        }
    }
    let mut result = if out.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = out.structured;
    result
}

/// Cancels every MCP stream of this process (see [`end_streams`]).
static STREAMS: std::sync::LazyLock<tokio_util::sync::CancellationToken> =
    std::sync::LazyLock::new(tokio_util::sync::CancellationToken::new);

/// Ends every open MCP stream (the long-lived `GET /mcp` event streams of MCP sessions), so that
/// a graceful shutdown need not wait for MCP clients to hang up. Call it when shutting down.
pub fn end_streams() {
    STREAMS.cancel();
}

/// `POST /mcp` (and the GET/DELETE of streamable HTTP sessions), behind the API keys.
pub(crate) fn router(state: AppState) -> Router<AppState> {
    let (engine, metrics, app) = (state.engine.clone(), state.metrics.clone(), state.clone());
    // The router's own Host/Origin check (`hosts.rs`) sits in front of `/mcp` like every
    // route, with the listener's port and the operator's `--allowed-hosts`; rmcp's default
    // list (loopback names on any port) would refuse those names and add nothing.
    let config = StreamableHttpServerConfig::default()
        .with_max_request_body_bytes(runcell_engine::MAX_REQUEST_BYTES)
        .disable_allowed_hosts();
    let defaults = Arc::new(DefaultSessions::default());
    let mut manager = LocalSessionManager::default();
    // An MCP session with no request for this long ends, and its Python session with it:
    // clients that never send DELETE (the Inspector CLI) must not leave sessions behind.
    manager.session_config.keep_alive = Some(MCP_SESSION_KEEP_ALIVE);
    let sessions = Arc::new(manager);
    let service = StreamableHttpService::new(
        move || {
            Ok(
                McpHandler::new(engine.clone(), Some(metrics.clone()), None, "mcp")
                    .with_defaults(defaults.clone(), app.clone()),
            )
        },
        sessions.clone(),
        config,
    );
    Router::new()
        .route_service("/mcp", service)
        .route_layer(axum::middleware::from_fn_with_state(sessions, jsonrpc))
        .route_layer(axum::middleware::from_fn_with_state(state, authenticate))
        // Node to node only (its own check), outside `/mcp`'s layers.
        .route(
            "/v1/sessions/{id}/tool-call",
            axum::routing::post(forwarded_tool_call),
        )
}

/// What rmcp would answer with a plain-text status or a wrong code, answered in JSON-RPC:
/// a body that is not JSON (`-32700`), not JSON-RPC 2.0 (`-32600`), a `tools/call` without a
/// tool name (`-32602`; rmcp cannot parse it as `tools/call` and says "method not found"), and
/// `DELETE` of an MCP session (204, or 404 for one it does not know; rmcp answers 202 to both).
async fn jsonrpc(
    State(sessions): State<Arc<LocalSessionManager>>,
    req: Request,
    next: Next,
) -> Response {
    use rmcp::transport::streamable_http_server::SessionManager as _;
    if req.method() == axum::http::Method::DELETE {
        let Some(id) = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
        else {
            return next.run(req).await;
        };
        let id: rmcp::transport::streamable_http_server::SessionId = Arc::from(id);
        return match sessions.has_session(&id).await {
            Ok(true) => {
                // Closing drops the connection's handler, which deletes its runcell session.
                let _ = sessions.close_session(&id).await;
                axum::http::StatusCode::NO_CONTENT.into_response()
            }
            _ => JsonRpcRefusal {
                kind: JsonRpcKind::UnknownSession,
                id: Value::Null,
                message: "no such MCP session (it was closed or has expired)".into(),
            }
            .into_response(),
        };
    }
    if req.method() != axum::http::Method::POST {
        return as_jsonrpc(next.run(req).await, Value::Null).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, runcell_engine::MAX_REQUEST_BYTES).await {
        Ok(b) => b,
        Err(_) => {
            return crate::error::ApiError::too_large(format!(
                "an MCP message is at most {} bytes",
                runcell_engine::MAX_REQUEST_BYTES
            ))
            .into_response()
        }
    };
    let id = match check_message(&bytes) {
        Ok(id) => id,
        Err(refusal) => return refusal.into_response(),
    };
    let resp = next
        .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await;
    as_jsonrpc(resp, id).await
}

/// What a message must be before it reaches rmcp, which drops (stdio) or answers in plain text
/// (HTTP) what it cannot parse: JSON, JSON-RPC 2.0, and a `tools/call` names its tool. The
/// message's id when it is.
fn check_message(bytes: &[u8]) -> Result<Value, JsonRpcRefusal> {
    let refuse = |kind, id, message: String| JsonRpcRefusal { kind, id, message };
    let message: Value = serde_json::from_slice(bytes).map_err(|e| {
        refuse(
            JsonRpcKind::Parse,
            Value::Null,
            format!("parse error: the message is not JSON ({e})"),
        )
    })?;
    let id = message.get("id").cloned().unwrap_or(Value::Null);
    if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        let why = if message.is_array() {
            "invalid request: one JSON-RPC message at a time (MCP has no batches)"
        } else {
            "invalid request: not a JSON-RPC 2.0 message (\"jsonrpc\": \"2.0\" is missing)"
        };
        return Err(refuse(JsonRpcKind::InvalidRequest, id, why.into()));
    }
    if message.get("method").and_then(Value::as_str) == Some("tools/call")
        && !id.is_null()
        && message
            .pointer("/params/name")
            .and_then(Value::as_str)
            .is_none()
    {
        return Err(refuse(
            JsonRpcKind::InvalidParams,
            id,
            "invalid params: tools/call needs params.name, the tool to call (python, bash or text_editor)".into(),
        ));
    }
    Ok(id)
}

/// For `runcell mcp`: the JSON-RPC error reply to a line of stdin that is not a message
/// rmcp can take (it would drop it without a word), or `None` for one it can.
pub fn stdio_refusal(line: &[u8]) -> Option<Value> {
    let refusal = match check_message(line) {
        Err(r) => r,
        Ok(id) => match serde_json::from_slice::<rmcp::model::ClientJsonRpcMessage>(line) {
            Ok(_) => return None,
            Err(e) => JsonRpcRefusal {
                kind: JsonRpcKind::InvalidRequest,
                id,
                message: format!("invalid request: {e}"),
            },
        },
    };
    Some(refusal.body())
}

/// rmcp's own refusals (415, 406, 404 for an unknown session, ...) have a plain-text body:
/// the same status with that text as a JSON-RPC error.
async fn as_jsonrpc(resp: Response, id: Value) -> Response {
    let plain = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|t| !t.starts_with("application/json") && !t.starts_with("text/event-stream"));
    let status = resp.status();
    if !status.is_client_error() || !plain {
        return resp;
    }
    let text = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let kind = if status == axum::http::StatusCode::NOT_FOUND {
        JsonRpcKind::UnknownSession
    } else {
        JsonRpcKind::Transport(status)
    };
    JsonRpcRefusal {
        kind,
        id,
        message: if text.is_empty() {
            status.to_string()
        } else {
            text
        },
    }
    .into_response()
}

/// The `/v1` authentication: 401 with the API's error envelope, or the tenant for the handler.
async fn authenticate(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    match Tenant::from_request_parts(&mut parts, &state).await {
        Ok(tenant) => {
            parts.extensions.insert(tenant);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(e) => e.into_response(),
    }
}
