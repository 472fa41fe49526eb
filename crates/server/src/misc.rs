//! `/healthz` and `/metrics`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody, ErrorCode};
use crate::state::{AppState, Tenant};

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok`; `lost` (with 503) when this node's epoch was declared dead by the cluster.
    pub status: &'static str,
    /// The preloaded zygote Python sessions are forked from (`off`, `starting`, `ready`,
    /// `failed`); without a ready one, sessions start cold. Only with a valid key once keys
    /// exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zygote: Option<runcell_engine::ZygoteStatus>,
    /// Python sessions started ahead of demand and ready to be handed out (`serve
    /// --warm-sessions`); a create with the default limits and no `env` takes one. Only with
    /// a valid key once keys exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_sessions: Option<usize>,
    /// Python one-shot sandboxes made ahead of demand and ready, from both zygotes (`serve
    /// --warm-one-shots`); a run with the default limits and no network takes one. Only with a
    /// valid key once keys exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_one_shots: Option<usize>,
}

/// For a probe, never refused: once keys exist, a caller without a valid one learns only that
/// the server is up (the zygote's pid and preloaded modules, the pool's size, are for the
/// operator).
///
/// A node sharing a database whose epoch the cluster declared dead (it was cut off from the
/// database past 10 s) answers 503 with status `lost`: it no longer serves its sessions, and
/// a liveness probe should restart it (docs/scale.md).
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, body = Health, description = "the server is up"),
        (status = 503, body = Health, description = "`lost`: this node's epoch was declared dead by the cluster; restart it")))]
pub async fn healthz(
    State(state): State<AppState>,
    tenant: Result<Tenant, ApiError>,
) -> (StatusCode, Json<Health>) {
    let (code, status) = match state.store.lease() {
        runcell_store::Lease::Lost { .. } => (StatusCode::SERVICE_UNAVAILABLE, "lost"),
        _ => (StatusCode::OK, "ok"),
    };
    if tenant.is_err() {
        return (
            code,
            Json(Health {
                status,
                zygote: None,
                warm_sessions: None,
                warm_one_shots: None,
            }),
        );
    }
    (
        code,
        Json(Health {
            status,
            zygote: Some(state.engine.zygote_status()),
            warm_sessions: Some(state.engine.sessions().warm_ready()),
            warm_one_shots: Some({
                let (light, full) = state.engine.one_shots_ready();
                light + full
            }),
        }),
    )
}

/// Once keys exist, any valid key reads the metrics (they count every tenant's sessions and
/// executions, naming none); `--metrics-listen` moves them to a listener of their own.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, content_type = "text/plain", body = String, description = "Prometheus text exposition"),
        (status = 404, body = ErrorBody, description = "served by the metrics listener (`serve --metrics-listen`)")))]
pub async fn metrics(
    State(state): State<AppState>,
    tenant: Result<Tenant, ApiError>,
) -> Result<Response, ApiError> {
    if state.metrics_elsewhere {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            "metrics are served on their own listener (serve --metrics-listen)",
        ));
    }
    tenant?;
    Ok(metrics_text(State(state)).await)
}

/// The Prometheus text exposition, with the live sessions counted now.
pub(crate) async fn metrics_text(State(state): State<AppState>) -> Response {
    let engine = state.engine.clone();
    let statuses = tokio::task::spawn_blocking(move || {
        let mut statuses: Vec<_> = engine
            .sessions()
            .list()
            .into_iter()
            .map(|s| s.status)
            .collect();
        // Dead with an earlier server process: still listed (and answering 409) until they
        // expire, so counted too.
        let dead = engine.sessions().dead_count();
        statuses.extend(std::iter::repeat_n(
            runcell_engine::SessionStatus::Dead,
            dead,
        ));
        statuses
    })
    .await
    .unwrap_or_default();
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(&statuses),
    )
        .into_response()
}
