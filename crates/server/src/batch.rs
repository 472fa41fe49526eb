//! `POST /v1/batch`: many one-shot runs in one request, each in its own fresh sandbox, streamed
//! back as NDJSON in completion order, one line per run with its `index`.
//!
//! Backpressure: lines travel through a channel of `concurrency` places, and a run's worker
//! hands its line over before it starts the next run. A client that reads slowly fills the
//! socket, then the channel, and the workers wait: no run starts that nobody will read, and a
//! batch holds at most `concurrency` finished lines. A client that goes away ends the batch
//! (the runs under way are stopped; every run that started is in the audit log).

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use runcell_engine::{BatchRun, Engine, EngineError, Judged, MAX_BATCH_CONCURRENCY};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody, ErrorDetail};
use crate::extract::ApiJson;
use crate::oneshot::{ExecuteOnceReply, ExecuteOnceRequest};
use crate::state::{AppState, Principal};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// The runs, each as `POST /v1/execute` takes it (1 to 1000, or the server's
    /// `--max-batch-runs`).
    #[schema(min_items = 1, max_items = 1000)]
    pub runs: Vec<ExecuteOnceRequest>,
    /// Runs at once (default: the server's CPUs); a tenant's runs in flight, all of its
    /// batches together, stay under the server's per-tenant cap whatever this says.
    #[schema(minimum = 1, maximum = 64)]
    #[serde(default, deserialize_with = "runcell_engine::whole_number")]
    pub concurrency: Option<u64>,
}

/// One line of the reply: a finished run (its Execution, with `tests` and `summary` when it
/// carried tests) or, for a run the server could not start, its error.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum BatchLine {
    Finished {
        /// The run's position in `runs`.
        index: usize,
        #[serde(flatten)]
        run: Box<ExecuteOnceReply>,
    },
    Failed {
        /// The run's position in `runs`.
        index: usize,
        /// Why this run did not run (`unavailable`, `internal`, ...).
        error: ErrorDetail,
    },
}

#[utoipa::path(post, path = "/v1/batch", tag = "execute",
    request_body = BatchRequest,
    responses((status = 200, content_type = "application/x-ndjson", body = BatchLine, description = "one line per run, in completion order, each a finished execution (whatever its status) with its `index`, or a run's `error`; with `tests`, each test's verdict and the run's summary"),
        (status = 400, body = ErrorBody, description = "`invalid_request`: no runs or more than 1000, `concurrency` outside 1-64, or a run `POST /v1/execute` would refuse (the message names it: `runs[i]: ...`); or `limit_exceeded`: a run's limit or `timeout_s` over the server's maximum. Nothing ran"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: a run's code over 1 MiB or a file over the file size limit. Nothing ran")))]
pub async fn batch(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(req): ApiJson<BatchRequest>,
) -> ApiResult<Response> {
    let (tenant, key) = (principal.tenant, principal.key);
    let concurrency = match req.concurrency {
        None => crate::batches::cpus().min(MAX_BATCH_CONCURRENCY),
        Some(n) if (1..=MAX_BATCH_CONCURRENCY as u64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(format!(
                "concurrency must be 1 to {MAX_BATCH_CONCURRENCY}, not {n}"
            )))
        }
    };
    let mut runs = Vec::with_capacity(req.runs.len());
    for (i, r) in req.runs.into_iter().enumerate() {
        runs.push(
            crate::oneshot::batch_run(&state.engine, &tenant.0, key.as_ref(), r)
                .map_err(|e| e.with_prefix(&format!("runs[{i}]: ")))?,
        );
    }
    state.batches.check(&runs)?;
    state.engine.check_batch(&runs)?;
    let gate = state.batches.gate(&tenant.0);
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(concurrency);
    let engine = state.engine.clone();
    let metrics = state.metrics.clone();
    tokio::task::spawn_blocking(move || {
        engine.run_batch(runs, concurrency, Some(&gate), &|index, result| {
            if let Ok(judged) = &result {
                metrics.observe_execution(&judged.outcome.execution);
            }
            // Waits while the client is slow to read; fails once it is gone.
            tx.blocking_send(line(index, result).into()).is_ok()
        });
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let line = rx.recv().await?;
        Some((Ok::<_, std::io::Error>(line), rx))
    });
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|e| ApiError::internal(e).into_response()))
}

/// The NDJSON line (newline included) of a finished run of a batch.
pub fn line(index: usize, result: Result<Judged, EngineError>) -> Vec<u8> {
    let line = match result {
        Ok(judged) => BatchLine::Finished {
            index,
            run: Box::new(judged.into()),
        },
        Err(e) => BatchLine::Failed {
            index,
            error: ApiError::from(e).parts().1.error,
        },
    };
    let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// A run of a batch file (`runcell run --batch`), one JSON object as `POST /v1/execute` takes
/// it, checked as the server checks a run of `POST /v1/batch`; refusals in the API's words.
pub fn parse_run(engine: &Engine, owner: &str, json: &str) -> Result<BatchRun, String> {
    let req: ExecuteOnceRequest = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let refusal = |e: ApiError| e.parts().1.error.message;
    crate::oneshot::batch_run(engine, owner, None, req).map_err(refusal)
}

/// What [`Engine::check_batch`] says of a batch, in the API's words.
pub fn check(engine: &Engine, runs: &[BatchRun]) -> Result<(), String> {
    engine
        .check_batch(runs)
        .map_err(|e| ApiError::from(e).parts().1.error.message)
}
