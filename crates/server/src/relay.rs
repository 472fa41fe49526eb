//! The link from one node to another: a request passed on to the node that is to serve it
//! (a session's owner, or the node a new session is placed on), signed for the client this
//! node authenticated, and its answer streamed back. Neither body is buffered here, and the
//! connections to the other nodes are kept open between requests.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue, Uri};
use axum::response::Response;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use crate::cluster::ClusterSecret;
use crate::error::ApiError;
use crate::state::{AppState, Principal};
use axum::response::IntoResponse;

/// Marks a request one node forwarded to another (its value: the forwarding node), so it is
/// never forwarded again.
pub(crate) const FORWARDED_BY: HeaderName = HeaderName::from_static("x-runcell-forwarded-by");
/// The tenant the forwarding node authenticated the client as.
pub(crate) const FORWARDED_TENANT: HeaderName =
    HeaderName::from_static("x-runcell-forwarded-tenant");
/// The id of the API key the client presented there (empty on a server without keys): the
/// owner holds the request to that key's bounds, as it would a request made to it.
pub(crate) const FORWARDED_KEY: HeaderName = HeaderName::from_static("x-runcell-forwarded-key");
/// The node credential: `t=UNIX_SECONDS,s=HEX_HMAC` (see [`ClusterSecret::sign`]).
pub(crate) const NODE_SIGNATURE: HeaderName = HeaderName::from_static("x-runcell-node-signature");

/// On every answer of a node in a cluster: the node that served it (its id, the URL other
/// nodes reach it at), so a client can see where a session was placed.
pub(crate) const SERVED_BY: HeaderName = HeaderName::from_static("x-runcell-node");

pub(crate) fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// How long the other node may take to accept a connection before the request fails.
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

/// Why a request could not be passed on to a node.
#[derive(Debug)]
pub(crate) enum RelayError {
    /// The node could not be reached (its URL is no `http://HOST:PORT`, no connection, or
    /// the connection broke before an answer): another node may be tried.
    Unreachable(String),
    /// The request itself could not be built.
    Internal(ApiError),
}

/// Sends `req` to the node at `node` (`http://host:port`) for `who`, as node `me`, and
/// streams its answer back.
pub(crate) async fn send(
    node: &str,
    me: &str,
    who: &Principal,
    secret: &ClusterSecret,
    req: Request,
) -> Result<Response, RelayError> {
    let authority = node
        .parse::<Uri>()
        .ok()
        .filter(|u| u.scheme_str() == Some("http"))
        .and_then(|u| u.authority().cloned())
        .ok_or_else(|| RelayError::Unreachable("its node URL is not http://HOST:PORT".into()))?;
    let internal = |e: axum::http::Error| RelayError::Internal(ApiError::internal(e));
    let (mut parts, body) = req.into_parts();
    // The other node answers to its node URL's name (`serve --node-url` allows it). This
    // node's guard has checked the request's Host and Origin already: the other would judge
    // the browser's Origin against its own names, so it is not passed on.
    parts.headers.insert(
        header::HOST,
        HeaderValue::from_str(authority.as_str())
            .map_err(|e| RelayError::Internal(ApiError::internal(e)))?,
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
        // The client's key stays here: the node credential and the key's id stand for it.
        header::AUTHORIZATION,
    ] {
        parts.headers.remove(hop);
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let tenant = who.tenant.0.as_str();
    let key = who.key.as_ref().map_or("", |k| k.id.as_str());
    let signature = secret.sign(me, tenant, key, parts.method.as_str(), path, unix_now());
    for (name, value) in [
        (FORWARDED_BY, me),
        (FORWARDED_TENANT, tenant),
        (FORWARDED_KEY, key),
        (NODE_SIGNATURE, signature.as_str()),
    ] {
        parts.headers.insert(
            name,
            HeaderValue::from_str(value)
                .map_err(|e| RelayError::Internal(ApiError::internal(e)))?,
        );
    }
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(authority.clone())
        .path_and_query(parts.uri.path_and_query().map_or("/", |p| p.as_str()))
        .build()
        .map_err(internal)?;
    let answer = client()
        .request(axum::http::Request::from_parts(parts, body))
        .await
        .map_err(|e| RelayError::Unreachable(error_chain(&e)))?;
    let (parts, body) = answer.into_parts();
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// `answer`, marked as this node's (in a cluster).
pub(crate) fn served_here(state: &AppState, mut answer: Response) -> Response {
    if let Some(me) = state.store.node_id() {
        if let Ok(v) = HeaderValue::from_str(me) {
            answer.headers_mut().insert(SERVED_BY, v);
        }
    }
    answer
}

/// Passes `req` on to `node` for its client, authenticated here as it would be there: the
/// other node takes this node's word for the tenant and the key, never the client's.
/// `Err(why)`: the node could not be reached.
pub(crate) async fn to_node(
    state: &AppState,
    node: &str,
    me: &str,
    req: Request,
) -> Result<Response, String> {
    let Some(secret) = state.cluster_secret.clone() else {
        return Ok(ApiError::unavailable(
            "this request is for another node, and this node has no cluster secret to \
             forward with (serve --cluster-secret-file)",
        )
        .into_response());
    };
    let who = match Principal::of_headers(req.headers(), state).await {
        Ok(p) => p,
        Err(e) => return Ok(e.into_response()),
    };
    match send(node, me, &who, &secret, req).await {
        Ok(answer) => Ok(answer),
        Err(RelayError::Unreachable(why)) => Err(why),
        Err(RelayError::Internal(e)) => Ok(e.into_response()),
    }
}
