//! `POST /v1/execute`: one program in a fresh sandbox (Judge0/Piston style).

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use runcell_engine::{Execution, InputFile, Language, LimitsRequest, NetworkPolicy, OneShot};
use serde::Deserialize;
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::ApiJson;
use crate::state::{AppState, Tenant};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecuteOnceRequest {
    /// `python` (default), `bash` or `javascript`.
    pub language: Option<Language>,
    pub code: String,
    /// Files placed in /workspace first.
    #[serde(default, deserialize_with = "crate::extract::objects")]
    pub files: Option<Vec<InputFileBody>>,
    /// Bytes on the program's stdin (UTF-8 text).
    pub stdin: Option<String>,
    /// Wall-clock limit in seconds (default 60).
    pub timeout_s: Option<f64>,
    #[serde(default, deserialize_with = "crate::extract::object")]
    pub limits: Option<LimitsRequest>,
    /// As a session's (`{"type":"disabled"}` by default).
    #[serde(default, deserialize_with = "crate::extract::object")]
    pub network: Option<NetworkPolicy>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputFileBody {
    pub path: String,
    /// Standard base64, padded, with no stray bits in the last symbol.
    #[schema(
        pattern = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$"
    )]
    pub content_base64: String,
}

#[utoipa::path(post, path = "/v1/execute", tag = "execute",
    request_body = ExecuteOnceRequest,
    responses((status = 200, body = Execution, description = "the finished execution, whatever its status (`ok`, `error`, `timeout`, `killed`)"),
        (status = 400, body = ErrorBody, description = "`invalid_request` (bad base64, a bad file path), or `limit_exceeded`: a limit or `timeout_s` over the server's maximum"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: code over 1 MiB or a file over the file size limit"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed, or it runs as many sandboxes as its descriptors allow; see `Retry-After`")))]
pub async fn execute_once(
    State(state): State<AppState>,
    tenant: Tenant,
    ApiJson(req): ApiJson<ExecuteOnceRequest>,
) -> ApiResult<Json<Execution>> {
    let mut one = OneShot::new(req.language.unwrap_or(Language::Python), req.code);
    one.owner = tenant.0;
    one.timeout = crate::sessions::timeout(req.timeout_s)?
        .unwrap_or_else(|| state.engine.config().limits.one_shot_timeout());
    one.limits = req.limits.unwrap_or_default();
    one.network = req.network.unwrap_or_default();
    one.stdin = req.stdin.unwrap_or_default().into_bytes();
    for f in req.files.unwrap_or_default() {
        let content = base64::engine::general_purpose::STANDARD
            .decode(f.content_base64.as_bytes())
            .map_err(|e| ApiError::invalid(format!("files[{}].content_base64: {e}", f.path)))?;
        one.files.push(InputFile {
            path: f.path,
            content,
        });
    }
    // A one-shot sandbox holds as many descriptors as a session: it takes a place under the
    // session cap while it runs.
    let slot = state.engine.sessions().reserve_sandbox()?;
    let engine = state.engine.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        engine.run_once(&one, &mut |_, _| {})
    })
    .await
    .map_err(ApiError::internal)??;
    state.metrics.observe_execution(&outcome.execution);
    Ok(Json(outcome.execution))
}
