//! `/healthz` and `/metrics`.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
    /// The preloaded zygote Python sessions are forked from (`off`, `starting`, `ready`,
    /// `failed`); without a ready one, sessions start cold.
    pub zygote: runcell_engine::ZygoteStatus,
    /// Python sessions started ahead of demand and ready to be handed out (`serve
    /// --warm-sessions`); a create with the default limits and no `env` takes one.
    pub warm_sessions: usize,
}

#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
pub async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok",
        zygote: state.engine.zygote_status(),
        warm_sessions: state.engine.sessions().warm_ready(),
    })
}

#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, content_type = "text/plain", body = String, description = "Prometheus text exposition")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let engine = state.engine.clone();
    let statuses = tokio::task::spawn_blocking(move || {
        engine
            .sessions()
            .list()
            .into_iter()
            .map(|s| s.status)
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(&statuses),
    )
}
