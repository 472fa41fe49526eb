//! envd's `process.Process` service: `Start` (server streaming: a `start` event with the pid,
//! `data` events with base64 stdout/stderr as they are read, an `end` event with the exit
//! code), `Connect` to a running command, `List`, `SendSignal`. A command is a session shell
//! command (its own sandbox beside the kernel, same workspace; in the audit log), run with the
//! sandbox's and the call's variables in the call's working directory. Commands outlive the
//! stream that started them (E2B's background commands), until they end or are killed.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use runcell_engine::{Stream, WatchedCommand};
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc};

use super::access::sandbox_of;
use super::connect::{self, Code, RpcError};
use super::names::{shell_quote, HOME};
use super::sandboxes::{Process, Sandbox};
use crate::state::AppState;

/// `POST /process.Process/{method}`.
pub(crate) async fn call(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect");
    match serve(&state, &method, &headers, &body).await {
        Ok(r) => r,
        Err(e) if streaming || connect::is_stream(&headers) => connect::stream_error(e),
        Err(e) => e.into_response(),
    }
}

async fn serve(
    state: &AppState,
    method: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, RpcError> {
    connect::check_codec(headers)?;
    let sandbox = sandbox_of(state, headers)?;
    let req = connect::request_message(headers, body)?;
    match method {
        "Start" => start(state, sandbox, &req, connect::timeout(headers)),
        "Connect" => attach(&sandbox, &req),
        "List" => {
            let processes: Vec<Value> = sandbox
                .processes()
                .values()
                .map(|p| {
                    let mut v = json!({"config": p.config, "pid": p.pid});
                    if let Some(t) = &p.tag {
                        v["tag"] = t.clone().into();
                    }
                    v
                })
                .collect();
            Ok(connect::unary(json!({ "processes": processes })))
        }
        "SendSignal" => {
            let p = selected(&sandbox, &req)?;
            // SIGKILL and SIGTERM alike end the command's whole sandbox.
            p.kill();
            Ok(connect::unary(json!({})))
        }
        "SendInput" | "StreamInput" | "CloseStdin" | "Update" => Err(RpcError::new(
            Code::Unimplemented,
            format!(
                "process.Process/{method} is not supported by runcell: commands run without stdin or a terminal (docs/e2b.md)"
            ),
        )),
        other => Err(RpcError::new(
            Code::Unimplemented,
            format!("process.Process/{other} is not a method runcell serves"),
        )),
    }
}

/// The process a `ProcessSelector` (`{"pid"}` or `{"tag"}`) names.
fn selected(sandbox: &Sandbox, req: &Value) -> Result<Arc<Process>, RpcError> {
    let sel = &req["process"];
    let procs = sandbox.processes();
    let found = if let Some(pid) = sel.get("pid").and_then(Value::as_u64) {
        procs.get(&(pid as u32)).cloned()
    } else if let Some(tag) = sel.get("tag").and_then(Value::as_str) {
        procs
            .values()
            .find(|p| p.tag.as_deref() == Some(tag))
            .cloned()
    } else {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "process must name a pid or a tag",
        ));
    };
    found.ok_or_else(|| RpcError::new(Code::NotFound, "process not found (it has ended)"))
}

/// The shell line that runs `config` (`cmd`, `args`, `cwd`).
fn shell_line(config: &Value) -> Result<String, RpcError> {
    let cmd = config
        .get("cmd")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .ok_or_else(|| RpcError::new(Code::InvalidArgument, "process.cmd is required"))?;
    // E2B's user lives in /home/user: `~` in a command is the workspace, as there.
    let mut line = format!("export HOME={HOME}\n");
    if let Some(cwd) = config
        .get("cwd")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
    {
        line.push_str(&format!("cd -- {} || exit 1\n", shell_quote(cwd)));
    }
    line.push_str("exec ");
    line.push_str(&shell_quote(cmd));
    for a in config
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        line.push(' ');
        line.push_str(&shell_quote(a.as_str().unwrap_or("")));
    }
    Ok(line)
}

fn event(e: Value) -> Bytes {
    connect::envelope(&json!({ "event": e }))
}

fn start(
    state: &AppState,
    sandbox: Arc<Sandbox>,
    req: &Value,
    deadline: Option<Duration>,
) -> Result<Response, RpcError> {
    let config = req.get("process").cloned().unwrap_or_else(|| json!({}));
    let line = shell_line(&config)?;
    let mut env: BTreeMap<String, String> = sandbox.envs.clone();
    if let Some(m) = config.get("envs").and_then(Value::as_object) {
        for (k, v) in m {
            env.insert(k.clone(), v.as_str().unwrap_or("").to_owned());
        }
    }
    let policy_max = Duration::from_secs(state.engine.config().limits.max.exec_timeout_s);
    let cancel = Arc::new(AtomicBool::new(false));
    let cmd = WatchedCommand {
        command: line,
        env,
        // No deadline from the client (`timeout=0`): as long as the server allows.
        timeout: Some(deadline.unwrap_or(policy_max).min(policy_max)),
        cancel: Some(cancel.clone()),
    };
    let pid = sandbox.next_pid();
    let (events, _) = broadcast::channel(1024);
    let process = Arc::new(Process {
        pid,
        tag: req.get("tag").and_then(Value::as_str).map(str::to_owned),
        config,
        cancel,
        events: events.clone(),
    });
    sandbox.processes().insert(pid, process);
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    let _ = tx.send(event(json!({"start": {"pid": pid}})));
    let engine = state.engine.clone();
    tokio::task::spawn_blocking(move || {
        let send = |b: Bytes| {
            // The starting stream may be gone (a background command): the rest still runs.
            let _ = tx.send(b.clone());
            let _ = events.send(b);
        };
        let b64 = base64::engine::general_purpose::STANDARD;
        let result = engine.run_watched(&sandbox.id, &cmd, &mut |stream, chunk| {
            let key = match stream {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            send(event(json!({"data": { key: b64.encode(chunk) }})));
        });
        sandbox.processes().remove(&pid);
        match result {
            Ok(out) => {
                let killed = out.usage.killed_by.is_some();
                let status = if killed {
                    "signal: killed".to_owned()
                } else {
                    format!("exit status {}", out.exit_code)
                };
                let mut end =
                    json!({"exitCode": out.exit_code, "exited": !killed, "status": status});
                if let Some(k) = out.usage.killed_by {
                    end["error"] = format!("the command was killed ({k:?})")
                        .to_lowercase()
                        .into();
                }
                send(event(json!({ "end": end })));
                send(connect::end_of_stream(None));
            }
            Err(e) => send(connect::end_of_stream(Some(&RpcError::from(e)))),
        }
    });
    let frames = futures_util::stream::unfold(rx, |mut rx| async move {
        let b = rx.recv().await?;
        Some((b, rx))
    });
    Ok(connect::stream(frames))
}

/// `Connect`: the running command's events from now on, after a `start` with its pid.
fn attach(sandbox: &Sandbox, req: &Value) -> Result<Response, RpcError> {
    let p = selected(sandbox, req)?;
    let rx = p.events.subscribe();
    let first = event(json!({"start": {"pid": p.pid}}));
    let rest = futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(b) => return Some((b, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    use futures_util::StreamExt;
    Ok(connect::stream(
        futures_util::stream::iter([first]).chain(rest),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_run_in_their_directory_with_their_arguments_quoted() {
        let line = shell_line(&json!({
            "cmd": "/bin/bash",
            "args": ["-l", "-c", "echo 'hi'"],
            "cwd": "/home/user/my dir",
        }))
        .expect("ok");
        assert_eq!(
            line,
            "export HOME=/home/user\ncd -- '/home/user/my dir' || exit 1\nexec '/bin/bash' '-l' '-c' 'echo '\\''hi'\\'''"
        );
        assert!(shell_line(&json!({"args": ["x"]})).is_err());
    }
}
