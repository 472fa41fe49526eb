//! Requests for a session another node holds, forwarded to that node. With several nodes on
//! one PostgreSQL database (docs/scale.md) each session lives on the node that made it; any
//! node takes a request for it (`/v1/sessions/{id}/...`) and, when the store names another
//! live node as the owner, authenticates the client itself, and passes the request on
//! (crate::relay) with the tenant and the key id it found and a node credential instead of
//! the client's key: an HMAC-SHA256, under the secret every node of the cluster shares
//! (`serve --cluster-secret-file`), of the forwarding node, the tenant, the key id, the
//! method, the path and the time. The owner checks that credential, loads the key itself (so
//! its bounds hold as for a request made there) and serves the asserted tenant; a client that
//! sends those headers itself cannot sign them, and is refused with 401. It streams the
//! answer back, over connections kept open between requests. Neither body is buffered: an
//! upload or an NDJSON stream goes through as it comes (a client that goes away drops the
//! answer, and so the connection to the owner, which then sees its client gone). A session
//! whose owner is dead is answered here: taken over and resumed from the snapshot store the
//! nodes share, when they share one (the engine's takeover.rs), else `dead` as the store
//! reads it. New sessions are placed by crate::placement.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderName, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::cluster::ForwardedTenant;
use crate::error::{store_error, ApiError};
use crate::relay::{
    served_here, to_node, FORWARDED_BY, FORWARDED_KEY, FORWARDED_TENANT, NODE_SIGNATURE,
};
use crate::state::AppState;

/// The session a path is about, if it is one of a session's (`/v1/sessions/{id}[/...]`).
fn session_of(path: &str) -> Option<&str> {
    let id = path.strip_prefix("/v1/sessions/")?.split('/').next()?;
    (!id.is_empty()).then_some(id)
}

/// The middleware: a request another node forwarded is served here as its tenant and key
/// once its node credential checks out; one for a session another live node holds is
/// forwarded there; a new session is placed on the node with the most room
/// (crate::placement); the rest is served here.
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
        || h.contains_key(&FORWARDED_KEY)
        || h.contains_key(&NODE_SIGNATURE)
    {
        let path = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        let method = req.method().clone();
        return match forwarded_caller(&state, req.headers(), &method, &path).await {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
                served_here(&state, next.run(req).await)
            }
            Err(e) => e.into_response(),
        };
    }
    let Some(me) = state.store.node_id().map(str::to_owned) else {
        return next.run(req).await;
    };
    if req.method() == Method::POST && req.uri().path() == "/v1/sessions" {
        return crate::placement::create(&state, &me, req, next).await;
    }
    let Some(id) = session_of(req.uri().path()).map(str::to_owned) else {
        return served_here(&state, next.run(req).await);
    };
    if req.uri().path().ends_with("/tool-call") {
        // Node to node only (crate::mcp): a client's is answered 404 here, never forwarded.
        return served_here(&state, next.run(req).await);
    }
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
                Ok(Ok(Some(_))) => return served_here(&state, next.run(req).await),
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
        Some(o) if o.alive && o.node != me => to_node(&state, &o.node, &me, req)
            .await
            .unwrap_or_else(|e| {
                ApiError::unavailable(format!(
                    "the node holding this session ({}) cannot be reached: {e}",
                    o.node
                ))
                .into_response()
            }),
        _ => served_here(&state, next.run(req).await),
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

/// Who a forwarded request is for, if its node credential is this cluster's: the tenant it
/// asserts, and the key it names as loaded from this node's store.
async fn forwarded_caller(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    method: &Method,
    path: &str,
) -> Result<ForwardedTenant, ApiError> {
    let refused = |why: &str| {
        ApiError::unauthorized(format!(
            "a forwarded request (x-runcell-forwarded-by) must carry a valid node credential: {why}"
        ))
    };
    let Some(secret) = state.cluster_secret.as_deref() else {
        return Err(refused("this node has no cluster secret"));
    };
    let header = |name: &HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| refused(&format!("{name} is missing")))
    };
    let node = header(&FORWARDED_BY)?;
    let tenant = header(&FORWARDED_TENANT)?;
    let key = header(&FORWARDED_KEY)?;
    let signature = header(&NODE_SIGNATURE)?;
    if !secret.verify(
        signature,
        node,
        tenant,
        key,
        method.as_str(),
        path,
        crate::relay::unix_now(),
    ) {
        return Err(refused(
            "the signature is not this cluster's, or too old (nodes' clocks must agree within 30 s)",
        ));
    }
    let key = match key {
        "" => None,
        id => Some(
            crate::state::forwarded_key(state, tenant, id)
                .await?
                .map_err(ApiError::unauthorized)?,
        ),
    };
    Ok(ForwardedTenant {
        tenant: tenant.to_owned(),
        key,
    })
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
