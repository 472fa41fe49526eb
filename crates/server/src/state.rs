//! What every handler shares, and who is asking (the tenant behind the API key).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use runcell_engine::{Engine, OPEN_TENANT};
use runcell_store::Store;

use crate::caller::KeyRef;
use crate::error::ApiError;
use crate::hosts::{AllowedHost, HostPolicy};
use crate::metrics::Metrics;

/// The model the chat talks to, set when the server starts (`runcell serve --agent-provider`).
#[derive(Debug, Clone)]
pub struct ChatConfig {
    pub provider: runcell_agent::ProviderConfig,
    /// Model replies at most per question.
    pub max_steps: usize,
}

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    /// The engine's store, for what is the HTTP layer's own: API keys, and the chain heads
    /// audit checkpoints sign.
    pub store: Store,
    pub metrics: Arc<Metrics>,
    /// Whether the listener is loopback-only: without any active key, only such a server
    /// serves requests (openly, as the default tenant).
    pub loopback: bool,
    /// Recent authentication outcomes, so a busy client costs no database trip per request.
    pub auth: Arc<AuthCache>,
    /// The model behind `/v1/chat`; none unless the operator configured one.
    pub chat: Option<Arc<ChatConfig>>,
    /// The model behind the vendor-compatible prefixes (`/anthropic`, `/openai/v1`); none unless the
    /// operator configured one.
    pub vendor: Option<Arc<crate::vendor::VendorConfig>>,
    /// The names this server answers to (`Host`, `Origin`): its listener's, and the
    /// operator's `--allowed-hosts`.
    pub hosts: Arc<HostPolicy>,
    /// Whether `/metrics` is served by its own listener (`--metrics-listen`), not this one.
    pub metrics_elsewhere: bool,
    /// Signs audit checkpoints (`/v1/audit/checkpoint`); none: those endpoints are 404.
    pub audit_signer: Option<Arc<runcell_store::audit::signed::AuditSigner>>,
    /// Agent loops' cells waiting for a person (`/v1/approvals`).
    pub approvals: Arc<crate::pending::Approvals>,
    /// Batch bounds and each tenant's cap on batch runs in flight (`POST /v1/batch`).
    pub batches: Arc<crate::batches::Batches>,
    /// Which sessions are E2B sandboxes, with their access tokens and contexts (`/e2b`).
    pub(crate) e2b: Arc<crate::e2b::Sandboxes>,
    /// The operator's MCP servers, for sessions' code (`runcell_tools.mcp`); none unless
    /// configured (`serve --mcp-server`).
    pub mcp_servers: Arc<crate::mcp_servers::McpServers>,
    /// Client tool calls waiting for answers, and plain executions suspended on them.
    pub(crate) tool_calls: Arc<crate::tool_calls::ToolCalls>,
    /// Signs and checks the requests nodes forward to each other; none on a single node.
    pub cluster_secret: Option<Arc<crate::cluster::ClusterSecret>>,
}

impl AppState {
    /// At most `max_runs` runs a batch and `max_tests_per_run` tests a one-shot run.
    pub fn with_batch_limits(mut self, max_runs: usize, max_tests_per_run: usize) -> Self {
        self.batches = Arc::new(crate::batches::Batches::new(max_runs, max_tests_per_run));
        self
    }

    /// Turns the chat on, against `config`'s model.
    pub fn with_chat(mut self, config: ChatConfig) -> Self {
        self.chat = Some(Arc::new(config));
        self
    }

    /// Answers the vendor-compatible prefixes' requests with `config`'s model.
    pub fn with_vendor(mut self, config: crate::vendor::VendorConfig) -> Self {
        self.vendor = Some(Arc::new(config));
        self
    }

    /// Answers to `hosts` too (`serve --allowed-hosts`): a reverse proxy's public names.
    pub fn with_allowed_hosts(mut self, hosts: impl IntoIterator<Item = AllowedHost>) -> Self {
        Arc::make_mut(&mut self.hosts).allow(hosts);
        self
    }

    /// Leaves `/metrics` to its own listener ([`crate::metrics_app`], `serve
    /// --metrics-listen`): this one answers it with 404.
    pub fn without_metrics(mut self) -> Self {
        self.metrics_elsewhere = true;
        self
    }

    /// Forwards to, and takes forwarded requests from, the other nodes holding `secret`.
    pub fn with_cluster_secret(mut self, secret: crate::cluster::ClusterSecret) -> Self {
        self.cluster_secret = Some(Arc::new(secret));
        self
    }

    /// Lets sessions' code call `servers`' tools (each only for the tenants it allows). Call
    /// on the tokio runtime the calls are to run on.
    pub fn with_mcp_servers(mut self, servers: Arc<crate::mcp_servers::McpServers>) -> Self {
        crate::mcp_servers::install(&servers, &self.engine);
        self.mcp_servers = servers;
        self
    }

    /// Serves signed audit checkpoints with this key.
    pub fn with_audit_signer(
        mut self,
        signer: Arc<runcell_store::audit::signed::AuditSigner>,
    ) -> Self {
        self.audit_signer = Some(signer);
        self
    }
}

/// How long an authentication outcome is reused. Keys are created and revoked by another
/// process (`runcell keys`) writing the database: a revocation takes effect within this.
const AUTH_TTL: std::time::Duration = std::time::Duration::from_secs(1);
/// Bound on remembered outcomes (cleared when reached; guessing keys cannot grow it).
const AUTH_ENTRIES: usize = 4096;

/// Outcomes by what was presented, each with when it was decided.
#[derive(Debug, Default)]
pub struct AuthCache(
    std::sync::Mutex<std::collections::HashMap<Credential, (std::time::Instant, u64, Outcome)>>,
);

type Outcome = Result<Principal, &'static str>;

/// What a request's `Authorization` header presents.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Credential {
    None,
    /// `Bearer KEY`, the scheme in any case (RFC 9110: schemes are case-insensitive).
    Bearer(String),
    /// Another scheme (`Basic ...`), or a bearer with no key.
    Other,
}

impl Credential {
    fn of(header: Option<&axum::http::HeaderValue>) -> Credential {
        let Some(h) = header else {
            return Credential::None;
        };
        let Ok(h) = h.to_str() else {
            return Credential::Other;
        };
        let (scheme, key) = h.trim().split_once(' ').unwrap_or((h.trim(), ""));
        let key = key.trim();
        if scheme.eq_ignore_ascii_case("bearer") && !key.is_empty() {
            Credential::Bearer(key.to_owned())
        } else {
            Credential::Other
        }
    }
}

impl AuthCache {
    fn get(&self, key: &Credential, generation: u64) -> Option<Outcome> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key)
            .filter(|(at, g, _)| *g == generation && at.elapsed() < AUTH_TTL)
            .map(|(_, _, r)| r.clone())
    }

    fn put(&self, key: Credential, generation: u64, outcome: Outcome) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= AUTH_ENTRIES {
            map.clear();
        }
        map.insert(key, (std::time::Instant::now(), generation, outcome));
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// The caller's tenant: from `Authorization: Bearer KEY` once any key exists, otherwise the
/// open tenant whatever `Authorization` says (the server refuses to listen beyond loopback
/// without keys).
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        Ok(Principal::from_request_parts(parts, state).await?.tenant)
    }
}

/// Who is asking: the tenant, and the key that says so (none on an open server, which has
/// no keys).
#[derive(Debug, Clone)]
pub struct Principal {
    pub tenant: Tenant,
    pub key: Option<KeyRef>,
}

impl Principal {
    /// How the audit log names this caller as the one who decided on a cell: the key (id and
    /// name) on a server with keys, else the tenant.
    pub fn decided_by(&self) -> String {
        match &self.key {
            Some(k) => format!("key:{} ({})", k.id, k.name),
            None => format!("api:{}", self.tenant.0),
        }
    }
}

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        // Another node authenticated the client and signed for its tenant (crate::forward);
        // the key stayed there.
        if let Some(t) = parts.extensions.get::<crate::cluster::ForwardedTenant>() {
            return Ok(Principal {
                tenant: Tenant(t.0.clone()),
                key: None,
            });
        }
        Self::of_headers(&parts.headers, state).await
    }
}

impl Principal {
    /// Who the request's own `Authorization` names.
    pub(crate) async fn of_headers(
        headers: &axum::http::HeaderMap,
        state: &AppState,
    ) -> Result<Self, ApiError> {
        let key = Credential::of(headers.get(axum::http::header::AUTHORIZATION));
        resolve(state, key).await?.map_err(ApiError::unauthorized)
    }
}

impl Principal {
    /// Who a request to a vendor-compatible prefix is from, whose SDK sends the key its own
    /// way: in `vendor_header` (Anthropic's and E2B's `x-api-key`) when present, else as
    /// `Authorization: Bearer` (OpenAI's). `Ok(Err(why))`: refused, for the caller to answer
    /// in its vendor's envelope.
    pub(crate) async fn of_vendor_request(
        headers: &axum::http::HeaderMap,
        vendor_header: Option<&str>,
        state: &AppState,
    ) -> Result<Result<Principal, &'static str>, ApiError> {
        let key = match vendor_header.and_then(|h| headers.get(h)) {
            Some(v) => match v.to_str().map(str::trim) {
                Ok(k) if !k.is_empty() => Credential::Bearer(k.to_owned()),
                _ => Credential::Other,
            },
            None => Credential::of(headers.get(axum::http::header::AUTHORIZATION)),
        };
        resolve(state, key).await
    }
}

/// Who `key` acts for, from the cache or the store.
async fn resolve(state: &AppState, key: Credential) -> Result<Outcome, ApiError> {
    // Read before the lookup: a change during it makes this entry stale at once.
    let generation = state.store.keys_generation();
    if let Some(o) = state.auth.get(&key, generation) {
        return Ok(o);
    }
    let store = state.store.clone();
    let loopback = state.loopback;
    let k = key.clone();
    let o = tokio::task::spawn_blocking(move || authenticate(&store, loopback, k))
        .await
        .map_err(ApiError::internal)?
        // A database restarting or cut off is a 503 to retry, not runcell's failure.
        .map_err(crate::error::store_error)?;
    state.auth.put(key, generation, o.clone());
    Ok(o)
}

/// Who `key` is (its tenant, and the key itself), or why the request is refused.
fn authenticate(
    store: &Store,
    loopback: bool,
    key: Credential,
) -> Result<Outcome, runcell_store::StoreError> {
    if !store.has_active_keys()? {
        if !loopback {
            // Every key was revoked while serving beyond loopback: serve nobody.
            return Ok(Err(
                "this server requires API keys and none is active: runcell keys create",
            ));
        }
        // Open mode: there is no key to check anything against, so whatever `Authorization`
        // says (a stale key, the placeholder an SDK insists on, Basic) is ignored alike.
        return Ok(Ok(Principal {
            tenant: Tenant(OPEN_TENANT.to_owned()),
            key: None,
        }));
    }
    Ok(match key {
        Credential::Bearer(key) => match store.authenticate(&key)? {
            Some(info) => Ok(Principal {
                tenant: Tenant(info.tenant.clone()),
                key: Some(KeyRef::of(info)),
            }),
            None => Err("invalid or revoked API key"),
        },
        Credential::None => Err("an API key is required: Authorization: Bearer KEY"),
        Credential::Other => Err("the Authorization header must be Bearer KEY (an API key)"),
    })
}
