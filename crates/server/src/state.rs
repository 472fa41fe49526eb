//! What every handler shares, and who is asking (the tenant behind the API key).

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use runcell_engine::Engine;
use runcell_store::Store;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// The tenant requests belong to when the server runs without API keys (loopback only).
pub const OPEN_TENANT: &str = "default";

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub store: Store,
    pub metrics: Arc<Metrics>,
    /// Whether the listener is loopback-only: without any active key, only such a server
    /// serves requests (openly, as the default tenant).
    pub loopback: bool,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// The caller's tenant: from `Authorization: Bearer KEY` once any key exists, otherwise the
/// open tenant (the server refuses to listen beyond loopback without keys).
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let store = state.store.clone();
        let loopback = state.loopback;
        let result = tokio::task::spawn_blocking(move || -> Result<Tenant, ApiError> {
            let key = header
                .as_deref()
                .and_then(|h| h.strip_prefix("Bearer "))
                .map(str::trim)
                .filter(|k| !k.is_empty());
            // A key that is sent is checked, even on an open server: a revoked or mistyped key
            // should fail loudly rather than act as the default tenant.
            if let Some(key) = key {
                return match store.authenticate(key).map_err(ApiError::internal)? {
                    Some(info) => Ok(Tenant(info.tenant)),
                    None => Err(ApiError::unauthorized("invalid or revoked API key")),
                };
            }
            if store.has_active_keys().map_err(ApiError::internal)? {
                return Err(ApiError::unauthorized(
                    "an API key is required: Authorization: Bearer KEY",
                ));
            }
            if !loopback {
                // Every key was revoked while serving beyond loopback: serve nobody.
                return Err(ApiError::unauthorized(
                    "this server requires API keys and none is active: runcell keys create",
                ));
            }
            Ok(Tenant(OPEN_TENANT.to_owned()))
        })
        .await
        .map_err(ApiError::internal)?;
        result
    }
}
