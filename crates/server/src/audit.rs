//! Signed audit checkpoints: `GET /v1/audit/checkpoint`, `GET /v1/audit/public-key`, and the
//! checkpoints the server takes by itself (every N executions recorded, every M seconds) and
//! hands to the operator (a file, one JSON per line, and a log line) to keep elsewhere.
//!
//! Taking one is a read of the chain heads (one small table) and a signature, done on a
//! blocking thread of a background task, never on an execution's path: the task only looks at
//! the store's append counter once a second.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::Json;
use runcell_store::audit::signed::{AuditSigner, Checkpoint};
use runcell_store::Store;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::{AppState, Tenant};

/// When the server takes checkpoints by itself, and where they go.
#[derive(Debug, Clone, Default)]
pub struct CheckpointPolicy {
    /// After this many executions recorded since the last one (0: never for that reason).
    pub every: u64,
    /// At most this long after the last one, if anything was recorded since (`None`: never
    /// for that reason).
    pub interval: Option<Duration>,
    /// Appended to, one JSON checkpoint per line (also logged either way).
    pub file: Option<PathBuf>,
}

/// The published half of the checkpoint signing key.
#[derive(Debug, Serialize, ToSchema)]
pub struct PublicKey {
    /// Always `ed25519`.
    pub algorithm: &'static str,
    /// The 32-byte public key, hex.
    pub public_key: String,
    /// The first 16 hex characters of SHA-256 of the key; checkpoints name it.
    pub key_id: String,
}

fn signer(state: &AppState) -> ApiResult<Arc<AuditSigner>> {
    state
        .audit_signer
        .clone()
        .ok_or_else(|| ApiError::not_found("audit checkpoints (this server has no signing key)"))
}

/// The checkpoint statement, as the file and the endpoint give it.
#[derive(Debug, Serialize, ToSchema)]
#[allow(
    dead_code,
    reason = "the OpenAPI shape of runcell_store's Checkpoint, which is what is served"
)]
pub struct CheckpointDoc {
    /// `runcell.audit.checkpoint`.
    #[serde(rename = "type")]
    pub kind: String,
    pub version: u32,
    /// `all` (every tenant) or `tenant` (the caller's).
    pub scope: String,
    pub time: String,
    pub key_id: String,
    /// `[{tenant, count, head}]`: record `count` of the tenant's chain has hash `head`.
    #[schema(value_type = Vec<Object>)]
    pub tenants: Vec<serde_json::Value>,
    /// Ed25519 signature, hex (see docs/operations.md for the signed encoding).
    pub signature: String,
}

#[utoipa::path(get, path = "/v1/audit/public-key", tag = "executions",
    responses((status = 200, body = PublicKey, description = "the key checkpoints are signed with"),
        (status = 404, body = ErrorBody, description = "this server has no signing key")))]
pub async fn public_key(
    State(state): State<AppState>,
    _tenant: Tenant,
) -> ApiResult<Json<PublicKey>> {
    let pk = signer(&state)?.public_key();
    Ok(Json(PublicKey {
        algorithm: "ed25519",
        public_key: pk.to_hex(),
        key_id: pk.id(),
    }))
}

/// The CA certificate of this server's C2PA signing chain, PEM: the trust anchor a C2PA
/// validator needs to call runcell's embedded manifests trusted (docs/operations.md, "C2PA
/// manifests in images").
#[utoipa::path(get, path = "/v1/audit/c2pa-ca", tag = "executions",
    responses((status = 200, content_type = "application/x-pem-file", body = String, description = "the runcell CA certificate (PEM) that issued this server's C2PA signing certificate"),
        (status = 404, body = ErrorBody, description = "this server signs no images")))]
pub async fn c2pa_ca(
    State(state): State<AppState>,
    _tenant: Tenant,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let signer =
        state.engine.config().image_signer.clone().ok_or_else(|| {
            ApiError::not_found("a C2PA certificate (this server signs no images)")
        })?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-pem-file")],
        signer.trust_anchor_pem().to_owned(),
    )
        .into_response())
}

/// A checkpoint of the caller's tenant when API keys are in use; of every tenant on an open
/// (keyless, loopback) server, whose one tenant-less user sees everything anyway.
#[utoipa::path(get, path = "/v1/audit/checkpoint", tag = "executions",
    responses((status = 200, body = CheckpointDoc, description = "a signed statement of the chain heads now"),
        (status = 404, body = ErrorBody, description = "this server has no signing key")))]
pub async fn checkpoint(
    State(state): State<AppState>,
    tenant: Tenant,
) -> ApiResult<Json<Checkpoint>> {
    let signer = signer(&state)?;
    let store = state.store.clone();
    let cp = tokio::task::spawn_blocking(move || {
        if store.has_active_keys()? {
            signer.checkpoint(&*store, Some(&tenant.0))
        } else {
            signer.checkpoint(&*store, None)
        }
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(crate::error::store_error)?;
    Ok(Json(cp))
}

/// Takes a checkpoint of every tenant and hands it out: appended to the policy's file and
/// logged.
fn emit(store: &Store, signer: &AuditSigner, file: Option<&PathBuf>) -> Result<(), String> {
    let cp = signer
        .checkpoint(&**store, None)
        .map_err(|e| runcell_engine::error_chain(&e))?;
    let line = serde_json::to_string(&cp).map_err(|e| e.to_string())?;
    tracing::info!(target: "runcell::audit", checkpoint = %line, "audit checkpoint");
    if let Some(path) = file {
        let mut o = std::fs::OpenOptions::new();
        o.create(true).append(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        // One write of the whole line: appends from two servers never interleave inside it.
        o.open(path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()))
            .map_err(|e| format!("cannot append to {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Starts the background task that takes the policy's checkpoints, one right away (the state
/// the server starts from). Runs until the runtime stops.
pub fn spawn_checkpoints(store: Store, signer: Arc<AuditSigner>, policy: CheckpointPolicy) {
    tokio::spawn(async move {
        let mut last_count = store.appended_count();
        let mut last_at = Instant::now();
        let mut first = true;
        let tick = policy
            .interval
            .map_or(Duration::from_secs(1), |i| i.min(Duration::from_secs(1)));
        loop {
            if !first {
                tokio::time::sleep(tick).await;
            }
            let count = store.appended_count();
            let new = count.saturating_sub(last_count);
            let due = first
                || (policy.every > 0 && new >= policy.every)
                || (new > 0 && policy.interval.is_some_and(|i| last_at.elapsed() >= i));
            first = false;
            if !due {
                continue;
            }
            let (s, k, f) = (store.clone(), signer.clone(), policy.file.clone());
            match tokio::task::spawn_blocking(move || emit(&s, &k, f.as_ref())).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "cannot emit an audit checkpoint"),
                Err(e) => tracing::error!(error = %e, "audit checkpoint task failed"),
            }
            last_count = count;
            last_at = Instant::now();
        }
    });
}
