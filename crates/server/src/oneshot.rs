//! `POST /v1/execute`: one program in a fresh sandbox (Judge0/Piston style), optionally judged
//! against test cases.

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use runcell_engine::{
    BatchRun, Check, Comparison, Execution, InputFile, Judged, Language, LimitsRequest,
    NetworkPolicy, OneShot, Start, TestCase, TestResult, TestSummary,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::extract::ApiJson;
use crate::state::{AppState, Principal};

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
    /// Arguments after the program file: `sys.argv[1:]`, `$1`..., `process.argv.slice(2)`.
    #[schema(max_items = 64, inline)]
    pub args: Option<Vec<ArgBody>>,
    /// Python: `zygote` (the default: a fork of the preloaded interpreter, numpy and pandas
    /// already imported, when it is ready) or `cold` (a fresh interpreter: its own hash secret
    /// and address-space layout). Either way a fresh sandbox that is destroyed afterwards.
    pub start: Option<Start>,
    /// Test cases, Judge0 style: the program runs once per test, each time in its own fresh
    /// sandbox with the test's stdin and arguments, and each test gets a verdict. The reply's
    /// execution is then that of the first test not accepted (of the last test when all were).
    /// At most 100 (or the server's `--max-tests-per-run`).
    #[serde(default, deserialize_with = "crate::extract::objects")]
    #[schema(max_items = 100)]
    pub tests: Option<Vec<TestBody>>,
    /// How each test's stdout is compared with `expected_stdout` (default `whitespace`).
    pub comparison: Option<Comparison>,
    /// For `numeric`: how far two numbers may differ, absolutely or relative to the expected
    /// value when that is above 1 (default 1e-6).
    #[schema(minimum = 0)]
    pub tolerance: Option<f64>,
    /// As a session's (`{"type":"disabled"}` by default).
    #[serde(default, deserialize_with = "crate::extract::object")]
    pub network: Option<NetworkPolicy>,
}

/// A program argument: at most 4096 characters, no NUL.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(value_type = String, max_length = 4096, pattern = r"^[^\x00]*$")]
#[serde(transparent)]
pub struct ArgBody(pub String);

/// One test case.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TestBody {
    /// The program's stdin for this test (default: none).
    pub stdin: Option<String>,
    /// What the program must print on stdout.
    pub expected_stdout: String,
    /// Arguments for this test (default: the run's `args`).
    #[schema(max_items = 64, inline)]
    pub args: Option<Vec<ArgBody>>,
}

/// A finished one-shot run: the Execution and, for a run with `tests`, each test's verdict
/// and the run's summary.
#[derive(Debug, Serialize, ToSchema)]
pub struct ExecuteOnceReply {
    #[serde(flatten)]
    pub execution: Execution,
    /// Each test's verdict, output and usage, in the order of `tests`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tests: Option<Vec<TestResult>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<TestSummary>,
}

impl From<Judged> for ExecuteOnceReply {
    fn from(j: Judged) -> Self {
        let (summary, tests) = j.tests.map_or((None, None), |(s, t)| (Some(s), Some(t)));
        ExecuteOnceReply {
            execution: j.outcome.execution,
            tests,
            summary,
        }
    }
}

/// The engine's run for `req`, by `tenant`, checked as far as it can be before it runs.
pub(crate) fn batch_run(
    engine: &runcell_engine::Engine,
    owner: &str,
    key: Option<&crate::caller::KeyRef>,
    req: ExecuteOnceRequest,
) -> ApiResult<BatchRun> {
    let language = req.language.unwrap_or(Language::Python);
    if req.start == Some(Start::Zygote) && language != Language::Python {
        return Err(runcell_engine::EngineError::InvalidRequest(
            runcell_engine::Invalid::ZygoteStart { language },
        )
        .into());
    }
    let mut one = OneShot::new(language, req.code);
    one.owner = owner.to_owned();
    one.timeout = crate::sessions::timeout(req.timeout_s)?
        .unwrap_or_else(|| engine.config().limits.one_shot_timeout());
    one.limits = req.limits.unwrap_or_default();
    one.network = req.network.unwrap_or_default();
    crate::caller::within_key(key, &one.network)?;
    one.stdin = req.stdin.unwrap_or_default().into_bytes();
    one.args = req
        .args
        .unwrap_or_default()
        .into_iter()
        .map(|a| a.0)
        .collect();
    one.start = req.start.unwrap_or_default();
    for f in req.files.unwrap_or_default() {
        let content = base64::engine::general_purpose::STANDARD
            .decode(f.content_base64.as_bytes())
            .map_err(|e| ApiError::invalid(format!("files[{}].content_base64: {e}", f.path)))?;
        one.files.push(InputFile {
            path: f.path,
            content,
        });
    }
    let tests = req
        .tests
        .unwrap_or_default()
        .into_iter()
        .map(|t| TestCase {
            stdin: t.stdin.unwrap_or_default().into_bytes(),
            expected_stdout: t.expected_stdout,
            args: t
                .args
                .unwrap_or_default()
                .into_iter()
                .map(|a| a.0)
                .collect(),
        })
        .collect();
    let check = Check {
        comparison: req.comparison.unwrap_or_default(),
        tolerance: req.tolerance.unwrap_or(runcell_engine::DEFAULT_TOLERANCE),
    };
    Ok(BatchRun {
        run: one,
        tests,
        check,
    })
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
    responses((status = 200, body = ExecuteOnceReply, description = "the finished execution, whatever its status (`ok`, `error`, `timeout`, `killed`); with `tests`, each test's verdict and a summary"),
        (status = 400, body = ErrorBody, description = "`invalid_request` (bad base64, a bad file path, a bad argument, more than 100 tests, `start: zygote` for another language than Python), or `limit_exceeded`: a limit or `timeout_s` over the server's maximum"),
        (status = 413, body = ErrorBody, description = "`payload_too_large`: code over 1 MiB or a file over the file size limit"),
        (status = 503, body = ErrorBody, description = "`unavailable`: the server's memory for sandboxes is committed, or it runs as many sandboxes as its descriptors allow; see `Retry-After`")))]
pub async fn execute_once(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(req): ApiJson<ExecuteOnceRequest>,
) -> ApiResult<Json<ExecuteOnceReply>> {
    let run = batch_run(
        &state.engine,
        &principal.tenant.0,
        principal.key.as_ref(),
        req,
    )?;
    state.batches.check_tests(run.tests.len())?;
    state.engine.check_tests(&run.tests, &run.check)?;
    // A one-shot sandbox holds as many descriptors as a session: it takes a place under the
    // session cap while it runs.
    let slot = state.engine.sessions().reserve_sandbox()?;
    let engine = state.engine.clone();
    let judged = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        engine.judge(&run.run, &run.tests, &run.check)
    })
    .await
    .map_err(ApiError::internal)??;
    state.metrics.observe_execution(&judged.outcome.execution);
    Ok(Json(judged.into()))
}
