//! envd's `filesystem.Filesystem` service (unary calls): `Stat`, `ListDir`, `MakeDir`, `Move`,
//! `Remove`. Each runs as a small stdlib Python program in a command sandbox of the sandbox's
//! session, as the sandbox user: it sees exactly what the code sees (`/home/user` is the
//! workspace), and the host never follows a path the sandbox could have planted.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use runcell_engine::WatchedCommand;
use serde_json::{json, Value};

use super::access::sandbox_of;
use super::connect::{self, Code, RpcError};
use super::names::shell_quote;
use crate::state::AppState;

/// The program: reads its request from `RUNCELL_FS_REQUEST`, prints one JSON line.
const PROGRAM: &str = r#"
import datetime, grp, json, os, pwd, shutil, stat, sys
HOME = "/home/user"
req = json.loads(os.environ["RUNCELL_FS_REQUEST"])

def absolute(p):
    p = p or HOME
    if p == "~" or p.startswith("~/"):
        p = HOME + p[1:]
    if not p.startswith("/"):
        p = HOME + "/" + p
    return os.path.normpath(p)

def name_of(ids, get):
    try:
        return get(ids).__getitem__(0)
    except KeyError:
        return str(ids)

def entry(p):
    st = os.lstat(p)
    link = stat.S_ISLNK(st.st_mode)
    target, kind = None, st
    if link:
        target = os.readlink(p)
        try:
            kind = os.stat(p)
        except OSError:
            kind = None
    if kind is None:
        t = "FILE_TYPE_SYMLINK"
    elif stat.S_ISDIR(kind.st_mode):
        t = "FILE_TYPE_DIRECTORY"
    else:
        t = "FILE_TYPE_FILE"
    when = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
    e = {
        "name": os.path.basename(p) or p,
        "type": t,
        "path": p,
        "size": str(st.st_size),
        "mode": st.st_mode & 0o7777,
        "permissions": stat.filemode(st.st_mode),
        "owner": name_of(st.st_uid, pwd.getpwuid),
        "group": name_of(st.st_gid, grp.getgrgid),
        "modifiedTime": when.isoformat().replace("+00:00", "Z"),
        "isSymlink": link,
    }
    if target is not None:
        e["symlinkTarget"] = target
    return e

def listing(p, depth):
    out = []
    for n in sorted(os.listdir(p)):
        c = os.path.join(p, n)
        try:
            out.append(entry(c))
        except OSError:
            continue
        if depth > 1 and os.path.isdir(c) and not os.path.islink(c):
            out.extend(listing(c, depth - 1))
    return out

def run(op):
    if op == "Stat":
        return {"entry": entry(absolute(req.get("path")))}
    if op == "ListDir":
        p = absolute(req.get("path"))
        if not os.path.isdir(p):
            if os.path.lexists(p):
                raise NotADirectoryError(p)
            raise FileNotFoundError(p)
        return {"entries": listing(p, max(int(req.get("depth") or 1), 1))}
    if op == "MakeDir":
        p = absolute(req.get("path"))
        if os.path.lexists(p):
            if os.path.isdir(p):
                return {"error": ["already_exists", "directory " + p + " already exists"]}
            raise FileExistsError(p)
        os.makedirs(p)
        return {"entry": entry(p)}
    if op == "Move":
        src, dst = absolute(req.get("source")), absolute(req.get("destination"))
        os.makedirs(os.path.dirname(dst) or "/", exist_ok=True)
        os.rename(src, dst)
        return {"entry": entry(dst)}
    if op == "Remove":
        p = absolute(req.get("path"))
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p)
        else:
            os.unlink(p)
        return {}
    return {"error": ["unimplemented", op + " is not supported"]}

try:
    out = run(req["op"])
except FileNotFoundError as e:
    out = {"error": ["not_found", "path " + str(e.filename or e) + " does not exist"]}
except (NotADirectoryError, IsADirectoryError, FileExistsError) as e:
    out = {"error": ["invalid_argument", str(e)]}
except PermissionError as e:
    out = {"error": ["permission_denied", str(e)]}
except OSError as e:
    out = {"error": ["internal", str(e)]}
sys.stdout.write(json.dumps(out) + "\n")
"#;

/// `POST /filesystem.Filesystem/{method}`.
pub(crate) async fn call(
    State(state): State<AppState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match serve(&state, &method, &headers, &body).await {
        Ok(v) => connect::unary(v),
        Err(e) if connect::is_stream(&headers) => connect::stream_error(e),
        Err(e) => e.into_response(),
    }
}

async fn serve(
    state: &AppState,
    method: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Value, RpcError> {
    connect::check_codec(headers)?;
    let sandbox = sandbox_of(state, headers)?;
    if !matches!(method, "Stat" | "ListDir" | "MakeDir" | "Move" | "Remove") {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!("filesystem.Filesystem/{method} is not supported by runcell (docs/e2b.md)"),
        ));
    }
    let mut req = connect::request_message(headers, body)?;
    req["op"] = method.into();
    let mut env = BTreeMap::new();
    env.insert("RUNCELL_FS_REQUEST".to_owned(), req.to_string());
    env.insert("RUNCELL_FS_PROGRAM".to_owned(), PROGRAM.to_owned());
    // The audit log records what was asked, not the (fixed) program that answers it.
    let asked: String = req
        .to_string()
        .chars()
        .filter(|c| !c.is_control())
        .take(2000)
        .collect();
    let cmd = WatchedCommand {
        command: format!(
            "exec python3 -c \"$RUNCELL_FS_PROGRAM\"  # E2B filesystem.Filesystem/{method} {}",
            shell_quote(&asked)
        ),
        env,
        timeout: Some(Duration::from_secs(60)),
        cancel: None,
    };
    let engine = state.engine.clone();
    let out =
        tokio::task::spawn_blocking(move || engine.run_watched(&sandbox.id, &cmd, &mut |_, _| {}))
            .await
            .map_err(|e| RpcError::new(Code::Internal, e.to_string()))??;
    let reply: Value = out
        .stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| {
            RpcError::new(
                Code::Internal,
                format!(
                    "the filesystem helper failed (exit {}): {}",
                    out.exit_code,
                    out.stderr.trim()
                ),
            )
        })?;
    if let Some([code, message]) = reply
        .get("error")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        let code = match code.as_str().unwrap_or("") {
            "not_found" => Code::NotFound,
            "already_exists" => Code::AlreadyExists,
            "invalid_argument" => Code::InvalidArgument,
            "permission_denied" => Code::PermissionDenied,
            "unimplemented" => Code::Unimplemented,
            _ => Code::Internal,
        };
        return Err(RpcError::new(
            code,
            message.as_str().unwrap_or("").to_owned(),
        ));
    }
    Ok(if reply.is_object() { reply } else { json!({}) })
}
