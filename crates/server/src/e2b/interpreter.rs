//! The code interpreter's endpoints: `POST /execute` (NDJSON events while the cell runs, in
//! E2B's shapes) and the code contexts (`/contexts`). The sandbox's own session is its
//! default Python context; every other context is a kernel of its own on the same workspace
//! (a session beside it, `SessionManager::create_sibling`), so its variables are its own and
//! its files the sandbox's. The default JavaScript and Bash contexts start with their first
//! cell.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_engine::{CancelToken, Engine, ExecEvent, Language, ResultItem};
use serde_json::{json, Map, Value};

use super::access::sandbox_of;
use super::error::Error;
use super::names::{language, shell_quote, HOME};
use super::sandboxes::{Context, Sandbox, CONTEXT_OF};
use crate::state::AppState;

/// The E2B result field of each MIME type (others go to `extra`).
const FIELDS: &[(&str, &str)] = &[
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
];

/// A result as E2B's SDK reads it: `text`, `html`, `png`, ..., `is_main_result`.
pub(crate) fn result_json(r: &ResultItem) -> Value {
    let mut out = Map::new();
    let mut extra = Map::new();
    for (mime, value) in &r.data {
        match FIELDS.iter().find(|(m, _)| m == mime) {
            Some((_, "json")) => {
                let v = serde_json::from_str(value).unwrap_or(Value::String(value.clone()));
                out.insert("json".into(), v);
            }
            Some((_, field)) => {
                out.insert((*field).into(), value.clone().into());
            }
            None => {
                extra.insert(mime.clone(), value.clone().into());
            }
        }
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    // The chart data runcell extracts from a figure, once results carry it (issue 24).
    if let Ok(Value::Object(item)) = serde_json::to_value(r) {
        if let Some(chart) = item.get("chart").filter(|c| !c.is_null()) {
            out.insert("chart".into(), chart.clone());
        }
    }
    out.insert("is_main_result".into(), r.is_main_result.into());
    out.insert("type".into(), "result".into());
    Value::Object(out)
}

fn now_ns() -> i64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default()
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

/// The code that sets `envs` for one cell, and the code that puts things back after it.
fn env_cells(language: Language, envs: &BTreeMap<String, String>) -> Option<(String, String)> {
    if envs.is_empty() {
        return None;
    }
    let map = serde_json::to_string(envs).unwrap_or_default();
    // A JSON string is a Python string literal too.
    let literal = serde_json::to_string(&map).unwrap_or_default();
    Some(match language {
        Language::Python => (
            format!(
                "import os as __e2b_os, json as __e2b_json\n__e2b_envs = __e2b_json.loads({literal})\n__e2b_saved = {{k: __e2b_os.environ.get(k) for k in __e2b_envs}}\n__e2b_os.environ.update(__e2b_envs)\nNone"
            ),
            "for __e2b_k, __e2b_v in __e2b_saved.items():\n    (__e2b_os.environ.pop(__e2b_k, None) if __e2b_v is None else __e2b_os.environ.__setitem__(__e2b_k, __e2b_v))\nNone".to_owned(),
        ),
        Language::Javascript => (
            format!("globalThis.__e2bSaved = {{}}; for (const [k, v] of Object.entries({map})) {{ globalThis.__e2bSaved[k] = process.env[k]; process.env[k] = v; }} undefined"),
            "for (const [k, v] of Object.entries(globalThis.__e2bSaved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; } undefined".to_owned(),
        ),
        Language::Bash => {
            let set: Vec<String> = envs
                .iter()
                .map(|(k, v)| format!("export {k}={}", shell_quote(v)))
                .collect();
            let unset: Vec<String> = envs.keys().map(|k| format!("unset {k}")).collect();
            (set.join("\n"), unset.join("\n"))
        }
    })
}

/// The IPython syntax E2B's Jupyter kernel takes and code written for it uses, as plain
/// Python: `!cmd` and `%pip`/`%conda` run the shell (output streamed, as Jupyter does), `%cd`
/// and `%env` change the kernel's directory and variables, `%time STMT` runs STMT, and the
/// display and configuration magics (`%matplotlib inline`, `%config`, `%load_ext`,
/// `%%time`...) do nothing: figures are always returned. Other lines are left alone.
fn ipython_compat(code: &str) -> Option<String> {
    let is_magic = |l: &str| {
        let t = l.trim_start();
        t.starts_with('!')
            || (t.starts_with('%')
                && t[1..].starts_with(|c: char| c == '%' || c.is_ascii_alphabetic()))
    };
    if !code.lines().any(is_magic) {
        return None;
    }
    let mut out = String::from(
        "import os as __e2b_os, subprocess as __e2b_sp, sys as __e2b_sys\n\
         def __e2b_sh(cmd):\n    __e2b_sys.stdout.flush(); __e2b_sys.stderr.flush()\n    __e2b_sp.run(cmd, shell=True)\n",
    );
    for line in code.lines() {
        if !is_magic(line) {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let indent = &line[..line.len() - line.trim_start().len()];
        let t = line.trim_start();
        let lit = |s: &str| serde_json::to_string(s.trim()).unwrap_or_default();
        let stmt = if let Some(cmd) = t.strip_prefix('!') {
            format!("__e2b_sh({})", lit(cmd))
        } else {
            let (magic, arg) = t
                .trim_start_matches('%')
                .split_once(char::is_whitespace)
                .unwrap_or((t.trim_start_matches('%'), ""));
            match (t.starts_with("%%"), magic) {
                (false, "pip" | "conda") => format!("__e2b_sh({})", lit(&format!("{magic} {arg}"))),
                (false, "cd") => format!("__e2b_os.chdir(__e2b_os.path.expanduser({}))", lit(arg)),
                (false, "env") => match arg.split_once(['=', ' ']) {
                    Some((k, v)) => format!("__e2b_os.environ[{}] = {}", lit(k), lit(v)),
                    None => format!("print(__e2b_os.environ.get({}))", lit(arg)),
                },
                (false, "time" | "timeit") if !arg.trim().is_empty() => arg.trim().to_owned(),
                _ => "pass".to_owned(),
            }
        };
        out.push_str(indent);
        out.push_str(&stmt);
        out.push('\n');
    }
    Some(out)
}

/// `POST /execute` `{code, context_id?, language?, env_vars?}`.
pub(crate) async fn execute(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Error> {
    let sandbox = sandbox_of(&state, &headers)?;
    let req: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid(format!("the body is not JSON: {e}")))?;
    let code = req
        .get("code")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid("code is required"))?
        .to_owned();
    runcell_engine::check_code(&code)?;
    let envs: BTreeMap<String, String> = req
        .get("env_vars")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default();
    if envs
        .keys()
        .any(|k| k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    {
        return Err(Error::invalid("env_vars names must be [A-Za-z0-9_]+"));
    }
    let context =
        match req.get("context_id").and_then(Value::as_str) {
            Some(id) => sandbox.contexts().get(id).cloned().ok_or_else(|| {
                Error::new(StatusCode::NOT_FOUND, format!("context {id} not found"))
            })?,
            None => {
                let name = req.get("language").and_then(Value::as_str).unwrap_or("");
                let (lang, canonical) = language(name).ok_or_else(|| {
                    Error::invalid(format!(
                        "language {name:?} is not supported by runcell: python, javascript or bash"
                    ))
                })?;
                let st = state.clone();
                let sb = sandbox.clone();
                tokio::task::spawn_blocking(move || default_context(&st, &sb, lang, canonical))
                    .await
                    .map_err(crate::error::ApiError::internal)??
            }
        };
    let session_language = state.engine.sessions().get(&context.session)?.language;
    let code = match session_language {
        Language::Python => ipython_compat(&code).unwrap_or(code),
        _ => code,
    };
    Ok(stream(
        state.engine.clone(),
        context.session,
        session_language,
        code,
        envs,
    ))
}

/// The NDJSON reply: the cell's events as they happen, then its execution count.
fn stream(
    engine: Engine,
    session: String,
    lang: Language,
    code: String,
    envs: BTreeMap<String, String>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
    let events_tx = tx.clone();
    let sent_error = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = sent_error.clone();
    let sink: runcell_engine::EventSink = Box::new(move |e: ExecEvent<'_>| {
        let v = match e {
            ExecEvent::Stdout(text) => {
                json!({"type": "stdout", "text": text, "timestamp": now_ns()})
            }
            ExecEvent::Stderr(text) => {
                json!({"type": "stderr", "text": text, "timestamp": now_ns()})
            }
            ExecEvent::Result(r) => result_json(r),
            ExecEvent::Error(err) => {
                sent.store(true, std::sync::atomic::Ordering::SeqCst);
                json!({"type": "error", "name": err.name, "value": err.value, "traceback": err.traceback})
            }
        };
        let _ = events_tx.send(line(&v));
    });
    let token = CancelToken::new();
    let worker_token = token.clone();
    let worker_engine = engine.clone();
    let worker_session = session.clone();
    tokio::task::spawn_blocking(move || {
        let sessions = worker_engine.sessions();
        let cells = env_cells(lang, &envs);
        if let Some((set, _)) = &cells {
            let _ = sessions.execute(&worker_session, set, None, None);
        }
        let result =
            sessions.execute_cancellable(&worker_session, &code, None, Some(sink), worker_token);
        if let Some((_, restore)) = &cells {
            let _ = sessions.execute(&worker_session, restore, None, None);
        }
        match result {
            Ok(execution) => {
                if let Some(err) = execution
                    .error
                    .as_ref()
                    .filter(|_| !sent_error.load(std::sync::atomic::Ordering::SeqCst))
                {
                    let _ = tx.send(line(&json!({"type": "error", "name": err.name, "value": err.value, "traceback": err.traceback})));
                }
                let _ = tx.send(line(&json!({"type": "number_of_executions", "execution_count": execution.execution_count})));
                let _ = tx.send(line(&json!({"type": "end_of_execution"})));
            }
            Err(e) => {
                let api: crate::error::ApiError = e.into();
                let (_, body) = api.parts();
                let _ = tx.send(line(&json!({"type": "error", "name": "RuncellError", "value": body.error.message, "traceback": ""})));
                let _ = tx.send(line(&json!({"type": "unexpected_end_of_execution"})));
            }
        }
    });
    let guard = Interrupt {
        engine,
        session,
        token,
        armed: true,
    };
    let body = futures_util::stream::unfold((rx, guard), |(mut rx, mut guard)| async move {
        match rx.recv().await {
            Some(b) => Some((Ok::<_, std::io::Error>(b), (rx, guard))),
            None => {
                guard.disarm();
                None
            }
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Interrupts the cell when its client goes away before the end (the SDK closes the
/// connection at its `timeout`): the kernel keeps its state.
struct Interrupt {
    engine: Engine,
    session: String,
    token: CancelToken,
    armed: bool,
}

impl Interrupt {
    /// The cell ended: nothing to interrupt.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        if self.armed {
            tracing::info!(session = %self.session, "E2B client went away; interrupting its cell");
            let engine = self.engine.clone();
            let session = std::mem::take(&mut self.session);
            let token = self.token.clone();
            std::thread::spawn(move || engine.sessions().cancel(&session, &token));
        }
    }
}

/// The default context of `lang`: the sandbox's own session for Python, else a kernel
/// started beside it the first time. Blocking.
fn default_context(
    state: &AppState,
    sandbox: &Sandbox,
    lang: Language,
    name: &'static str,
) -> Result<Context, Error> {
    if let Some(c) = sandbox.contexts().get(name).cloned() {
        return Ok(c);
    }
    let c = new_context(state, sandbox, name.to_owned(), lang, name, HOME.to_owned())?;
    // Two first cells at once may both have started one: keep the first, end the other.
    let mut contexts = sandbox.contexts();
    if let Some(existing) = contexts.get(name).cloned() {
        drop(contexts);
        let _ = state.engine.sessions().delete(&c.session);
        return Ok(existing);
    }
    contexts.insert(name.to_owned(), c.clone());
    Ok(c)
}

/// A kernel beside the sandbox's, in `cwd`. Blocking.
fn new_context(
    state: &AppState,
    sandbox: &Sandbox,
    id: String,
    lang: Language,
    name: &'static str,
    cwd: String,
) -> Result<Context, Error> {
    let mut metadata = BTreeMap::new();
    metadata.insert(CONTEXT_OF.to_owned(), sandbox.id.clone());
    let sessions = state.engine.sessions();
    let info = sessions.create_sibling(&sandbox.id, lang, sandbox.envs.clone(), metadata)?;
    // It lives as long as the sandbox: the E2B sweeper ends it with the sandbox, however long
    // it sat idle meanwhile.
    let max = state.engine.config().limits.max.idle_timeout_s;
    sessions.set_idle_timeout(&info.id, std::time::Duration::from_secs(max))?;
    let c = Context {
        id,
        language: name,
        cwd,
        session: info.id,
    };
    enter_cwd(&state.engine, &c)?;
    Ok(c)
}

/// Moves a context's kernel to its working directory (unless that is the workspace).
fn enter_cwd(engine: &Engine, c: &Context) -> Result<(), Error> {
    if c.cwd == HOME || c.cwd == "/workspace" {
        return Ok(());
    }
    let quoted = serde_json::to_string(&c.cwd).unwrap_or_default();
    let code = match c.language {
        "python" => format!("import os as __e2b_os\n__e2b_os.chdir({quoted})\nNone"),
        "javascript" => format!("process.chdir({quoted}); undefined"),
        _ => format!("cd -- {}", shell_quote(&c.cwd)),
    };
    let ex = engine.sessions().execute(&c.session, &code, None, None)?;
    if let Some(e) = ex.error {
        return Err(Error::invalid(format!(
            "cannot use {} as the context's working directory: {}",
            c.cwd, e.value
        )));
    }
    Ok(())
}

fn context_json(c: &Context) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd})
}

/// `POST /contexts` `{language?, cwd?}`.
pub(crate) async fn create_context(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, Error> {
    let sandbox = sandbox_of(&state, &headers)?;
    let req: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| Error::invalid(format!("the body is not JSON: {e}")))?
    };
    let name = req.get("language").and_then(Value::as_str).unwrap_or("");
    let (lang, canonical) = language(name).ok_or_else(|| {
        Error::invalid(format!(
            "language {name:?} is not supported by runcell: python, javascript or bash"
        ))
    })?;
    let cwd = req
        .get("cwd")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .unwrap_or(HOME)
        .to_owned();
    let st = state.clone();
    let c = tokio::task::spawn_blocking(move || {
        let c = new_context(
            &st,
            &sandbox,
            runcell_engine::new_id("ctx"),
            lang,
            canonical,
            cwd,
        )?;
        sandbox.contexts().insert(c.id.clone(), c.clone());
        Ok::<_, Error>(c)
    })
    .await
    .map_err(crate::error::ApiError::internal)??;
    Ok(Json(context_json(&c)).into_response())
}

/// `GET /contexts`.
pub(crate) async fn list_contexts(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, Error> {
    let sandbox = sandbox_of(&state, &headers)?;
    let list: Vec<Value> = sandbox.contexts().values().map(context_json).collect();
    Ok(Json(list).into_response())
}

/// `DELETE /contexts/{id}`: ends its kernel (the default Python context is the sandbox's own
/// and stays).
pub(crate) async fn remove_context(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let sandbox = sandbox_of(&state, &headers)?;
    let c = sandbox
        .contexts()
        .get(&id)
        .cloned()
        .ok_or_else(|| Error::new(StatusCode::NOT_FOUND, format!("context {id} not found")))?;
    if c.session == sandbox.id {
        return Err(Error::invalid(
            "the default Python context is the sandbox's own kernel: restart it instead",
        ));
    }
    sandbox.contexts().remove(&id);
    let engine = state.engine.clone();
    let _ = tokio::task::spawn_blocking(move || engine.sessions().delete(&c.session)).await;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /contexts/{id}/restart`: a fresh kernel, variables gone, files kept.
pub(crate) async fn restart_context(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, Error> {
    let sandbox = sandbox_of(&state, &headers)?;
    let c = sandbox
        .contexts()
        .get(&id)
        .cloned()
        .ok_or_else(|| Error::new(StatusCode::NOT_FOUND, format!("context {id} not found")))?;
    let engine = state.engine.clone();
    tokio::task::spawn_blocking(move || {
        engine.sessions().restart(&c.session)?;
        enter_cwd(&engine, &c)
    })
    .await
    .map_err(crate::error::ApiError::internal)??;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_take_e2b_field_names() {
        let mut data = BTreeMap::new();
        data.insert("text/plain".to_owned(), "df".to_owned());
        data.insert("text/html".to_owned(), "<table/>".to_owned());
        data.insert("image/png".to_owned(), "iVBOR".to_owned());
        data.insert("application/json".to_owned(), r#"{"a":1}"#.to_owned());
        data.insert("application/x-custom".to_owned(), "x".to_owned());
        let v = result_json(&ResultItem {
            is_main_result: true,
            data,
            chart: Some(serde_json::json!({"type": "line", "title": "t", "elements": []})),
        });
        assert_eq!(v["type"], "result");
        assert_eq!(v["text"], "df");
        assert_eq!(v["html"], "<table/>");
        assert_eq!(v["png"], "iVBOR");
        assert_eq!(v["json"]["a"], 1);
        assert_eq!(v["extra"]["application/x-custom"], "x");
        assert_eq!(v["is_main_result"], true);
        assert_eq!(v["chart"]["type"], "line");
    }

    #[test]
    fn ipython_syntax_becomes_python() {
        assert_eq!(ipython_compat("x = 1\nx"), None);
        assert_eq!(ipython_compat("a % b\n"), None, "a modulo is no magic");
        let code = ipython_compat(
            "%matplotlib inline\n!echo 'hi'\nfor i in range(2):\n    !ls\n%pip install x\n%env A=1\n%time y = 2\n%%capture\ny",
        )
        .expect("rewritten");
        let body: Vec<&str> = code.lines().skip(4).collect();
        assert_eq!(
            body,
            [
                "pass",
                r#"__e2b_sh("echo 'hi'")"#,
                "for i in range(2):",
                r#"    __e2b_sh("ls")"#,
                r#"__e2b_sh("pip install x")"#,
                r#"__e2b_os.environ["A"] = "1""#,
                "y = 2",
                "pass",
                "y",
            ]
        );
    }

    #[test]
    fn cell_variables_are_set_then_put_back() {
        let mut envs = BTreeMap::new();
        envs.insert("A".to_owned(), "it's".to_owned());
        let (set, restore) = env_cells(Language::Bash, &envs).expect("ok");
        assert_eq!(set, r"export A='it'\''s'");
        assert_eq!(restore, "unset A");
        assert!(env_cells(Language::Python, &BTreeMap::new()).is_none());
        let (set, _) = env_cells(Language::Python, &envs).expect("ok");
        assert!(set.contains("environ.update"));
    }
}
