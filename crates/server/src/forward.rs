//! Requests for a session another node holds, forwarded to that node. With several nodes on
//! one PostgreSQL database (docs/scale.md) each session lives on the node that made it; any
//! node takes a request for it (`/v1/sessions/{id}/...`) and, when the store names another
//! live node as the owner, authenticates the client itself, and passes the request on with
//! the tenant it found and a node credential instead of the client's key: an HMAC-SHA256,
//! under the secret every node of the cluster shares (`serve --cluster-secret-file`), of the
//! forwarding node, the tenant, the method, the path and the time. The owner checks that
//! credential and serves the asserted tenant; a client that sends those headers itself
//! cannot sign them, and is refused with 401. It streams the answer back, over connections
//! kept open between requests. Neither body is buffered: an upload or an NDJSON stream goes
//! through as it comes (a client that goes away drops the answer, and so the connection to
//! the owner, which then sees its client gone). A session whose owner is dead is answered
//! here: taken over and resumed from the snapshot store the nodes share, when they share one
//! (the engine's takeover.rs), else `dead` as the store reads it.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use crate::cluster::{ClusterSecret, ForwardedTenant};
use crate::error::{store_error, ApiError};
use crate::state::AppState;

/// Marks a request one node forwarded to another (its value: the forwarding node), so it is
/// never forwarded again.
const FORWARDED_BY: HeaderName = HeaderName::from_static("x-runcell-forwarded-by");
/// The tenant the forwarding node authenticated the client as.
const FORWARDED_TENANT: HeaderName = HeaderName::from_static("x-runcell-forwarded-tenant");
/// The node credential: `t=UNIX_SECONDS,s=HEX_HMAC` (see [`ClusterSecret::sign`]).
const NODE_SIGNATURE: HeaderName = HeaderName::from_static("x-runcell-node-signature");
fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// How long the owner may take to accept a connection before the request fails.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The connections to the other nodes, kept open between requests (HTTP/1.1 keep-alive), so
/// a forwarded request pays no connection set-up.
fn client() -> &'static Client<HttpConnector, Body> {
    static CLIENT: std::sync::OnceLock<Client<HttpConnector, Body>> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        Client::builder(TokioExecutor::new()).build(connector)
    })
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// The session a path is about, if it is one of a session's (`/v1/sessions/{id}[/...]`).
fn session_of(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/v1/sessions/")?.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// The middleware: a request another node forwarded is served here as its tenant once its
/// node credential checks out; one for a session another live node holds is forwarded
/// there; the rest is served here.
pub(crate) async fn to_owner(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    // A node that cannot prove it still owns its sessions (its lease with the database
    // lapsed: runcell_store::Lease) acts on none, at once and without asking the database,
    // which is likely what it cannot reach.
    let creates = req.method() == axum::http::Method::POST && req.uri().path() == "/v1/sessions";
    if creates || session_of(req.uri().path()).is_some() {
        if let Err(e) = state.store.lease().check() {
            return store_error(e).into_response();
        }
    }
    // A session this node is taking over from a dead one: its database row already names
    // this node, but it is here only once its workspace is rebuilt. Bounded by the takeover
    // itself (a workspace's files from the shared store).
    if let Some(id) = session_of(req.uri().path()) {
        while state.engine.sessions().taking_over(id) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let h = req.headers();
    if h.contains_key(&FORWARDED_BY)
        || h.contains_key(&FORWARDED_TENANT)
        || h.contains_key(&NODE_SIGNATURE)
    {
        return match forwarded_tenant(&state, &req) {
            Ok(tenant) => {
                req.extensions_mut().insert(ForwardedTenant(tenant));
                next.run(req).await
            }
            Err(e) => e.into_response(),
        };
    }
    let Some(me) = state.store.node_id().map(str::to_owned) else {
        return next.run(req).await;
    };
    let Some(id) = session_of(req.uri().path()).map(str::to_owned) else {
        return next.run(req).await;
    };
    let mut owner = match owner_of(&state, &id).await {
        Ok(owner) => owner,
        Err(e) => return e.into_response(),
    };
    // A dead owner's session comes here when the nodes share their snapshots: taken over
    // (one node wins), then served here, where the request resumes it. Otherwise, or when
    // another node won, it is answered as the store now has it.
    if let Some(o) = owner.as_ref().filter(|o| !o.alive && o.node != me) {
        if state.engine.sessions().shares_snapshots() {
            let tenant = match crate::state::Principal::of_headers(req.headers(), &state).await {
                Ok(p) => p.tenant.0,
                Err(e) => return e.into_response(),
            };
            let (engine, dead, sid) = (state.engine.clone(), o.node.clone(), id.clone());
            let taken = tokio::task::spawn_blocking(move || {
                engine.sessions().take_over(&tenant, &sid, &dead)
            })
            .await;
            match taken {
                Ok(Ok(Some(_))) => return next.run(req).await,
                Ok(Ok(None)) => {}
                Ok(Err(e)) => return ApiError::from(e).into_response(),
                Err(e) => return ApiError::internal(e).into_response(),
            }
            owner = match owner_of(&state, &id).await {
                Ok(owner) => owner,
                Err(e) => return e.into_response(),
            };
        }
    }
    match owner {
        Some(o) if o.alive && o.node != me => {
            let Some(secret) = state.cluster_secret.clone() else {
                return ApiError::unavailable(
                    "this session is held by another node, and this node has no cluster \
                     secret to forward with (serve --cluster-secret-file)",
                )
                .into_response();
            };
            // The client is authenticated here, as it would be at the owner: the owner
            // takes this node's word for the tenant, never the client's.
            let tenant = match crate::state::Principal::of_headers(req.headers(), &state).await {
                Ok(p) => p.tenant.0,
                Err(e) => return e.into_response(),
            };
            forward(&o.node, &me, &tenant, &secret, req)
                .await
                .unwrap_or_else(IntoResponse::into_response)
        }
        _ => next.run(req).await,
    }
}

/// The node owning session `id`, read from the store off the reactor.
async fn owner_of(
    state: &AppState,
    id: &str,
) -> Result<Option<runcell_store::SessionNode>, ApiError> {
    let (store, id) = (state.store.clone(), id.to_owned());
    match tokio::task::spawn_blocking(move || store.session_node(&id)).await {
        Ok(r) => r.map_err(store_error),
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// The tenant a forwarded request asserts, if its node credential is this cluster's.
fn forwarded_tenant(state: &AppState, req: &Request) -> Result<String, ApiError> {
    let refused = |why: &str| {
        ApiError::unauthorized(format!(
            "a forwarded request (x-runcell-forwarded-by) must carry a valid node credential: {why}"
        ))
    };
    let Some(secret) = state.cluster_secret.as_deref() else {
        return Err(refused("this node has no cluster secret"));
    };
    let header = |name: &HeaderName| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| refused(&format!("{name} is missing")))
    };
    let node = header(&FORWARDED_BY)?;
    let tenant = header(&FORWARDED_TENANT)?;
    let signature = header(&NODE_SIGNATURE)?;
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    if !secret.verify(
        signature,
        node,
        tenant,
        req.method().as_str(),
        path,
        unix_now(),
    ) {
        return Err(refused(
            "the signature is not this cluster's, or too old (nodes' clocks must agree within 30 s)",
        ));
    }
    Ok(tenant.to_owned())
}

/// Sends `req` to the node at `node` (`http://host:port`) and streams its answer back.
async fn forward(
    node: &str,
    me: &str,
    tenant: &str,
    secret: &ClusterSecret,
    req: Request,
) -> Result<Response, ApiError> {
    let unreachable = |why: &str| {
        ApiError::unavailable(format!(
            "the node holding this session ({node}) cannot be reached: {why}"
        ))
    };
    let authority = node
        .parse::<Uri>()
        .ok()
        .filter(|u| u.scheme_str() == Some("http"))
        .and_then(|u| u.authority().cloned())
        .ok_or_else(|| unreachable("its node URL is not http://HOST:PORT"))?;
    let (mut parts, body) = req.into_parts();
    // The owner answers to its node URL's name (`serve --node-url` allows it). This node's
    // guard has checked the request's Host and Origin already: the owner would judge the
    // browser's Origin against its own names, so it is not passed on.
    parts.headers.insert(
        header::HOST,
        HeaderValue::from_str(authority.as_str()).map_err(ApiError::internal)?,
    );
    for hop in [
        header::ORIGIN,
        HeaderName::from_static("sec-fetch-site"),
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        HeaderName::from_static("keep-alive"),
        // The client's key stays here: the node credential stands for it.
        header::AUTHORIZATION,
    ] {
        parts.headers.remove(hop);
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let signature = secret.sign(me, tenant, parts.method.as_str(), path, unix_now());
    for (name, value) in [
        (FORWARDED_BY, me),
        (FORWARDED_TENANT, tenant),
        (NODE_SIGNATURE, signature.as_str()),
    ] {
        parts.headers.insert(
            name,
            HeaderValue::from_str(value).map_err(ApiError::internal)?,
        );
    }
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(authority.clone())
        .path_and_query(parts.uri.path_and_query().map_or("/", |p| p.as_str()))
        .build()
        .map_err(ApiError::internal)?;
    let answer = client()
        .request(axum::http::Request::from_parts(parts, body))
        .await
        .map_err(|e| unreachable(&error_chain(&e)))?;
    let (parts, body) = answer.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)))
}

#[cfg(test)]
mod tests {
    use super::session_of;

    #[test]
    fn session_paths() {
        assert_eq!(session_of("/v1/sessions/ses_1"), Some("ses_1"));
        assert_eq!(session_of("/v1/sessions/ses_1/files/a/b"), Some("ses_1"));
        assert_eq!(session_of("/v1/sessions/"), None);
        assert_eq!(session_of("/v1/sessions"), None);
        assert_eq!(session_of("/v1/executions/ses_1"), None);
    }
}
