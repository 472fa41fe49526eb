//! E2B drop-in (docs/e2b.md): the unmodified E2B SDK (`e2b`, `e2b-code-interpreter`) works
//! against runcell with `E2B_API_URL=http://HOST/e2b`, `E2B_SANDBOX_URL=http://HOST/e2b/sandbox`
//! and `E2B_API_KEY` set to a runcell key.
//!
//! A sandbox is a runcell session of the key's tenant (its id is the sandbox id; it is listed
//! in `/v1/sessions`, every cell and command is in the audit log) whose workspace is the
//! sandbox's `/home/user`. The control plane (`/e2b/...`) speaks E2B's REST API; the data
//! plane (`/e2b/sandbox/...`) is envd's (the file REST endpoint, the `process.Process` and
//! `filesystem.Filesystem` Connect-RPC services) and the code interpreter's (`/execute`,
//! `/contexts`) on one URL: with `E2B_SANDBOX_URL` set the SDK sends every sandbox's requests
//! there, naming the sandbox in `E2b-Sandbox-Id` and proving access with the token it was given
//! at create (`X-Access-Token`, or `E2B-Traffic-Access-Token` where the SDK sends only that).

mod connect;
mod control;
mod envd;
mod filesystem;
mod interpreter;
mod process;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::Router;
use runcell_engine::{Engine, EngineError, Language};

use crate::error::ApiError;
use crate::state::AppState;

/// The envd version runcell answers as: the SDK picks its wire shapes by it (octet-stream
/// uploads from 0.5.7, no default `user` from 0.4.0).
pub(crate) const ENVD_VERSION: &str = "0.6.4";

/// E2B's default sandbox lifetime and its default (and runcell's maximum) cell time limit.
pub(crate) const DEFAULT_TIMEOUT_S: u64 = 300;

/// The sandbox user's home, where E2B keeps the user's files: runcell's workspace.
pub(crate) const HOME: &str = "/home/user";

/// Marks a context's kernel (a session beside the sandbox's own, on its workspace) with the
/// sandbox it belongs to; such sessions are no sandboxes of their own.
pub(crate) const CONTEXT_OF: &str = "e2b_context_of";

/// Every route under `/e2b`: the control plane at the root, the data plane under `/sandbox`.
pub(crate) fn router() -> Router<AppState> {
    let data = Router::new()
        .route("/health", get(envd::health))
        .route("/files", get(envd::download).post(envd::upload))
        .route("/process.Process/{method}", post(process::call))
        .route("/filesystem.Filesystem/{method}", post(filesystem::call))
        .route("/execute", post(interpreter::execute))
        .route(
            "/contexts",
            get(interpreter::list_contexts).post(interpreter::create_context),
        )
        .route("/contexts/{id}", delete(interpreter::remove_context))
        .route("/contexts/{id}/restart", post(interpreter::restart_context));
    Router::new()
        .route("/sandboxes", get(control::list_v1).post(control::create))
        .route("/v2/sandboxes", get(control::list_v2).post(control::create))
        .route("/sandboxes/{id}", get(control::info).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/resume", post(control::resume))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/metrics", get(control::metrics))
        .nest("/sandbox", data)
        .fallback(|uri: axum::http::Uri| async move {
            Error::new(
                StatusCode::NOT_FOUND,
                format!("runcell's E2B API does not serve {}", uri.path()),
            )
        })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("this endpoint does not serve {method}"),
            )
        })
}

/// `/files` at the listener's root: the SDK's signed `download_url()` and `upload_url()` join
/// `/files` onto `E2B_SANDBOX_URL` as an absolute path, dropping its `/e2b/sandbox`.
pub(crate) fn signed_urls() -> Router<AppState> {
    Router::new().route("/files", get(envd::download).post(envd::upload))
}

/// E2B's error envelope, `{"code": STATUS, "message"}`, for the control plane and envd's REST
/// endpoints alike (the SDK reads `message`).
#[derive(Debug)]
pub(crate) struct Error {
    pub status: StatusCode,
    pub message: String,
}

impl Error {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
        }
    }

    pub fn not_found(id: &str) -> Error {
        Error::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Error {
        let (status, body) = e.parts();
        Error::new(status, body.error.message)
    }
}

impl From<EngineError> for Error {
    fn from(e: EngineError) -> Error {
        ApiError::from(e).into()
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

/// What runcell keeps of an E2B sandbox beside its session: the data plane's token, the
/// variables every command and kernel gets, its code contexts and its commands.
#[derive(Debug)]
pub(crate) struct Sandbox {
    pub id: String,
    pub owner: String,
    pub token: String,
    pub template: String,
    pub envs: BTreeMap<String, String>,
    pub contexts: Mutex<BTreeMap<String, Context>>,
    pub processes: Mutex<BTreeMap<u32, Arc<process::Process>>>,
    next_pid: AtomicU32,
}

/// A code context: a kernel of the sandbox (its own session's, or one beside it).
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub id: String,
    /// As E2B names it (`python`, `javascript`, `bash`).
    pub language: &'static str,
    pub cwd: String,
    /// The runcell session whose kernel it is.
    pub session: String,
}

impl Sandbox {
    pub fn contexts(&self) -> MutexGuard<'_, BTreeMap<String, Context>> {
        self.contexts.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn processes(&self) -> MutexGuard<'_, BTreeMap<u32, Arc<process::Process>>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn next_pid(&self) -> u32 {
        self.next_pid.fetch_add(1, Ordering::Relaxed)
    }

    /// The sessions of its contexts beside its own.
    pub fn context_sessions(&self) -> Vec<String> {
        self.contexts()
            .values()
            .map(|c| c.session.clone())
            .filter(|s| *s != self.id)
            .collect()
    }
}

/// The E2B view of the sessions: which are sandboxes, with their tokens and contexts.
#[derive(Debug, Default)]
pub(crate) struct Sandboxes {
    map: Mutex<HashMap<String, Arc<Sandbox>>>,
    sweeper: std::sync::OnceLock<()>,
}

/// How often sandboxes whose session ended (expired, deleted through `/v1`) are forgotten and
/// their context kernels and commands ended.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

impl Sandboxes {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Sandbox>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts (once) the task that forgets sandboxes whose session is gone. Call it from the
    /// runtime (a handler).
    pub fn start_sweeper(self: &Arc<Self>, engine: &Engine) {
        self.sweeper.get_or_init(|| {
            let me = Arc::downgrade(self);
            let engine = engine.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(SWEEP_EVERY).await;
                    let Some(me) = me.upgrade() else { break };
                    let gone: Vec<String> = me
                        .map()
                        .keys()
                        .filter(|id| engine.sessions().get(id).is_err())
                        .cloned()
                        .collect();
                    for id in gone {
                        if let Some(sandbox) = me.remove(&id) {
                            let engine = engine.clone();
                            tokio::task::spawn_blocking(move || end_extras(&engine, &sandbox));
                        }
                    }
                }
            });
        });
    }

    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.map().get(id).cloned()
    }

    /// The sandbox session `id` is, made known now if it was not (a session created through
    /// `/v1/sessions`, or before a restart): a fresh token, no variables.
    pub fn get_or_adopt(&self, id: &str, owner: &str) -> Arc<Sandbox> {
        self.map()
            .entry(id.to_owned())
            .or_insert_with(|| Arc::new(Sandbox::new(id, owner, "base", BTreeMap::new())))
            .clone()
    }

    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        self.map().values().cloned().collect()
    }

    pub fn insert(&self, sandbox: Sandbox) -> Arc<Sandbox> {
        let s = Arc::new(sandbox);
        self.map().insert(s.id.clone(), s.clone());
        s
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.map().remove(id)
    }
}

impl Sandbox {
    pub fn new(id: &str, owner: &str, template: &str, envs: BTreeMap<String, String>) -> Sandbox {
        let mut contexts = BTreeMap::new();
        contexts.insert(
            "python".to_owned(),
            Context {
                id: "python".to_owned(),
                language: "python",
                cwd: HOME.to_owned(),
                session: id.to_owned(),
            },
        );
        Sandbox {
            id: id.to_owned(),
            owner: owner.to_owned(),
            token: new_token(),
            template: template.to_owned(),
            envs,
            contexts: Mutex::new(contexts),
            processes: Mutex::default(),
            next_pid: AtomicU32::new(1000),
        }
    }
}

/// 160 random bits.
fn new_token() -> String {
    let a = runcell_engine::new_id("");
    let b = runcell_engine::new_id("");
    format!("{}{}", a.trim_start_matches('_'), b.trim_start_matches('_'))
}

/// Whether two secrets are equal, in time independent of where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Why a data-plane request is refused.
#[derive(Debug)]
pub(crate) enum Refused {
    /// No such sandbox, or no longer running: E2B's proxy answers 502 then.
    Gone(String),
    Unauthorized(&'static str),
}

impl Refused {
    pub fn status(&self) -> StatusCode {
        match self {
            Refused::Gone(_) => StatusCode::BAD_GATEWAY,
            Refused::Unauthorized(_) => StatusCode::UNAUTHORIZED,
        }
    }

    pub fn message(&self) -> String {
        match self {
            Refused::Gone(id) => format!("sandbox {id} is not running (killed or timed out)"),
            Refused::Unauthorized(m) => (*m).to_owned(),
        }
    }
}

impl From<Refused> for Error {
    fn from(r: Refused) -> Error {
        Error::new(r.status(), r.message())
    }
}

/// The sandbox a data-plane request is for (`E2b-Sandbox-Id`), once its token checks out.
pub(crate) fn sandbox_of(state: &AppState, headers: &HeaderMap) -> Result<Arc<Sandbox>, Refused> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let id = header("e2b-sandbox-id")
        .ok_or(Refused::Unauthorized(
            "the E2b-Sandbox-Id header is required (the SDK sends it when E2B_SANDBOX_URL is set)",
        ))?
        .to_owned();
    let sandbox = state
        .e2b
        .get(&id)
        .ok_or_else(|| Refused::Gone(id.clone()))?;
    let token = header("x-access-token").or_else(|| header("e2b-traffic-access-token"));
    match token {
        Some(t) if same_secret(t, &sandbox.token) => {}
        Some(_) => {
            return Err(Refused::Unauthorized(
                "invalid access token for this sandbox",
            ))
        }
        None => {
            return Err(Refused::Unauthorized(
                "the sandbox's access token is required (X-Access-Token)",
            ))
        }
    }
    let live = state.engine.sessions().get(&id);
    if live.is_err() || live.is_ok_and(|s| s.owner != sandbox.owner) {
        // Expired or deleted behind the registry's back: forget it, end what it left.
        if let Some(gone) = state.e2b.remove(&id) {
            let engine = state.engine.clone();
            tokio::task::spawn_blocking(move || end_extras(&engine, &gone));
        }
        return Err(Refused::Gone(id));
    }
    Ok(sandbox)
}

/// A path the SDK names, as a path relative to the workspace: `/home/user/x`, `~/x` and `x`
/// are the workspace's `x` (so are `/workspace/x` and `/mnt/data/x`, its runcell names).
pub(crate) fn workspace_rel(path: &str) -> Result<String, String> {
    let p = path.trim();
    let rest = if let Some(r) = strip_dir(p, HOME) {
        r
    } else if let Some(r) = strip_dir(p, "/workspace") {
        r
    } else if let Some(r) = strip_dir(p, "/mnt/data") {
        r
    } else if let Some(r) = p.strip_prefix('~') {
        r.strip_prefix('/').unwrap_or(r)
    } else if p.starts_with('/') {
        return Err(format!(
            "{p} is outside {HOME}: a runcell sandbox keeps files only in {HOME} (its workspace)"
        ));
    } else {
        p
    };
    let parts: Vec<&str> = rest
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    Ok(parts.join("/"))
}

/// `p` without the leading directory `dir`, if `p` is `dir` or below it.
fn strip_dir<'a>(p: &'a str, dir: &str) -> Option<&'a str> {
    let r = p.strip_prefix(dir)?;
    (r.is_empty() || r.starts_with('/')).then(|| r.trim_start_matches('/'))
}

/// A workspace path as the sandbox's user sees it.
pub(crate) fn shown(rel: &str) -> String {
    if rel.is_empty() {
        HOME.to_owned()
    } else {
        format!("{HOME}/{rel}")
    }
}

/// The runcell language of an E2B language name, and its canonical name.
pub(crate) fn language(name: &str) -> Option<(Language, &'static str)> {
    match name.trim().to_ascii_lowercase().as_str() {
        "" | "python" | "python3" => Some((Language::Python, "python")),
        "javascript" | "js" | "node" | "nodejs" => Some((Language::Javascript, "javascript")),
        "bash" | "sh" | "shell" => Some((Language::Bash, "bash")),
        _ => None,
    }
}

/// `'s'` for a shell: the string single-quoted.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Ends the sandbox's context kernels (not its own session) and its commands. Blocking.
pub(crate) fn end_extras(engine: &Engine, sandbox: &Sandbox) {
    for p in sandbox.processes().values() {
        p.kill();
    }
    for s in sandbox.context_sessions() {
        let _ = engine.sessions().delete(&s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_paths_name_workspace_files() {
        assert_eq!(workspace_rel("/home/user/a/b.txt").expect("ok"), "a/b.txt");
        assert_eq!(workspace_rel("/home/user").expect("ok"), "");
        assert_eq!(workspace_rel("/home/user/").expect("ok"), "");
        assert_eq!(workspace_rel("a.txt").expect("ok"), "a.txt");
        assert_eq!(workspace_rel("./a/./b").expect("ok"), "a/b");
        assert_eq!(workspace_rel("~/x").expect("ok"), "x");
        assert_eq!(workspace_rel("/workspace/x").expect("ok"), "x");
        assert_eq!(workspace_rel("/mnt/data/x").expect("ok"), "x");
        assert!(workspace_rel("/home/username/x").is_err());
        assert!(workspace_rel("/etc/passwd").is_err());
        assert_eq!(shown(""), "/home/user");
        assert_eq!(shown("a/b"), "/home/user/a/b");
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abc", "abc"));
        assert!(!same_secret("abc", "abd"));
        assert!(!same_secret("abc", "abcd"));
        assert_ne!(new_token(), new_token());
        assert!(new_token().len() >= 32);
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
