//! `runcell run` through the `runcell serve` of the same data dir, when one is running: the
//! program then runs in a one-shot forked from the server's zygote (a prepared sandbox when
//! one is ready) instead of a cold interpreter in a sandbox made by this process, and is
//! recorded in the server's audit log like any run. Without a server, or for what the server
//! would run differently (a network allowlist, a batch), `runcell run` runs it itself.
//!
//! The server listens on `DATA_DIR/serve.sock` (mode 0600), and serves only peers of its own
//! uid: whoever may connect could run `runcell run` on this data dir anyway. One connection
//! per run: the request (one JSON line), then frames back, each `[kind u8][len u32 LE][bytes]`:
//! output as it is produced (1 stdout, 2 stderr), and last either the run (3: the Execution
//! and the program's exit code, JSON) or why it could not run (4: text). A byte from the client
//! (or its hang-up) ends the run, as Ctrl-C ends a local one.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use runcell_engine::{Engine, Execution, InputFile, Language, LimitsRequest, OneShot, Stream};

/// The socket's name in the data dir.
pub const SOCKET: &str = "serve.sock";
/// Local runs in progress at most; more wait in the listen backlog.
const MAX_RUNS: usize = 64;
/// Largest request line (the program and its `--file`s, base64): the engine bounds them
/// again.
const MAX_REQUEST: u64 = 64 << 20;

const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const DONE: u8 = 3;
const FAILED: u8 = 4;

/// What `runcell run` sends.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub language: Language,
    pub code: String,
    /// `(name in /workspace, base64 content)`.
    pub files: Vec<(String, String)>,
    pub memory_mb: Option<u64>,
    pub timeout_s: f64,
}

/// A finished run, as the server answered it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Done {
    pub execution: Execution,
    pub exit_code: i32,
}

/// The server's side: a thread accepting local runs for `engine` on `DATA_DIR/serve.sock`
/// until the process ends. The socket file is replaced if a previous server left it.
pub fn listen(engine: Engine, data_dir: &Path) -> anyhow::Result<PathBuf> {
    let path = data_dir.join(SOCKET);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let listener = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    let running = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("local-runs".into())
        .spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else {
                    // Out of descriptors, say: not a reason to spin.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                if !same_user(&conn) {
                    continue;
                }
                if running.fetch_add(1, Ordering::AcqRel) >= MAX_RUNS {
                    running.fetch_sub(1, Ordering::AcqRel);
                    let _ = frame(&mut &conn, FAILED, b"too many local runs at once");
                    continue;
                }
                let engine = engine.clone();
                let running = running.clone();
                let spawned =
                    std::thread::Builder::new()
                        .name("local-run".into())
                        .spawn(move || {
                            serve_one(&engine, conn);
                            running.fetch_sub(1, Ordering::AcqRel);
                        });
                if spawned.is_err() {
                    tracing::warn!("cannot start a thread for a local run");
                }
            }
        })?;
    Ok(path)
}

/// Whether the peer runs as this process's user.
fn same_user(conn: &UnixStream) -> bool {
    rustix::net::sockopt::socket_peercred(conn).is_ok_and(|c| c.uid == rustix::process::geteuid())
}

fn serve_one(engine: &Engine, conn: UnixStream) {
    let mut line = Vec::new();
    let read = BufReader::new((&conn).take(MAX_REQUEST)).read_until(b'\n', &mut line);
    let req = match read
        .map_err(anyhow::Error::from)
        .and_then(|_| Ok(serde_json::from_slice::<Request>(&line)?))
        .and_then(one_shot)
    {
        Ok(r) => r,
        Err(e) => {
            let _ = frame(&mut &conn, FAILED, format!("{e:#}").as_bytes());
            return;
        }
    };
    let cancel = req.cancel.clone().unwrap_or_default();
    // Any byte from the client, or its hang-up, cancels the run.
    if let Ok(watch) = conn.try_clone() {
        let cancel = cancel.clone();
        let _ = std::thread::Builder::new()
            .name("local-run-watch".into())
            .spawn(move || {
                let _ = (&watch).read(&mut [0u8; 1]);
                cancel.store(true, Ordering::Relaxed);
            });
    }
    let mut out = &conn;
    let mut on_output = |stream: Stream, data: &[u8]| {
        let kind = match stream {
            Stream::Stdout => STDOUT,
            Stream::Stderr => STDERR,
        };
        let _ = frame(&mut out, kind, data);
    };
    let result = engine.run_once(&req, &mut on_output);
    let _ = match result {
        Ok(o) => serde_json::to_vec(&Done {
            execution: o.execution,
            exit_code: o.exit_code,
        })
        .map_err(std::io::Error::from)
        .and_then(|json| frame(&mut &conn, DONE, &json)),
        Err(e) => frame(
            &mut &conn,
            FAILED,
            format!("{:#}", anyhow::Error::from(e)).as_bytes(),
        ),
    };
    // The watcher ends once the client closes its end; this run's cancel is moot by now.
    cancel.store(true, Ordering::Relaxed);
    let _ = conn.shutdown(std::net::Shutdown::Both);
}

fn one_shot(r: Request) -> anyhow::Result<OneShot> {
    let mut req = OneShot::new(r.language, r.code);
    req.timeout = crate::args::timeout(r.timeout_s)?;
    req.limits = LimitsRequest {
        memory_mb: r.memory_mb,
        ..LimitsRequest::default()
    };
    req.files = r
        .files
        .into_iter()
        .map(|(path, b64)| {
            let content = base64::engine::general_purpose::STANDARD.decode(b64)?;
            Ok(InputFile { path, content })
        })
        .collect::<anyhow::Result<_>>()?;
    req.cancel = Some(Arc::new(AtomicBool::new(false)));
    Ok(req)
}

fn frame(w: &mut impl Write, kind: u8, data: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(data.len()).map_err(std::io::Error::other)?;
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&len.to_le_bytes());
    w.write_all(&head)?;
    w.write_all(data)
}

/// The client's side: runs `req` on the data dir's server. `Ok(None)`: no server serves this
/// data dir (nothing ran). Output goes to `on_output` as it comes; `cancel` set (Ctrl-C) ends
/// the run there.
pub fn run(
    data_dir: &Path,
    req: &Request,
    cancel: &AtomicBool,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> anyhow::Result<Option<Done>> {
    let Ok(mut conn) = UnixStream::connect(data_dir.join(SOCKET)) else {
        return Ok(None);
    };
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    if conn.write_all(&line).is_err() {
        // A server that went away between connect and write: run locally.
        return Ok(None);
    }
    // Short reads so that Ctrl-C is noticed while a silent program runs.
    conn.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut told = false;
    let mut head = [0u8; 5];
    loop {
        if !told && cancel.load(Ordering::Relaxed) {
            let _ = conn.write_all(b"x");
            told = true;
        }
        match read_exact_or_timeout(&mut conn, &mut head)? {
            Some(()) => {}
            None => continue,
        }
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let mut data = vec![0u8; len];
        conn.set_read_timeout(None)?;
        conn.read_exact(&mut data)?;
        conn.set_read_timeout(Some(Duration::from_millis(100)))?;
        match head[0] {
            STDOUT => on_output(Stream::Stdout, &data),
            STDERR => on_output(Stream::Stderr, &data),
            DONE => return Ok(Some(serde_json::from_slice(&data)?)),
            FAILED => anyhow::bail!("{}", String::from_utf8_lossy(&data)),
            other => anyhow::bail!("the local server sent an unknown frame ({other})"),
        }
    }
}

/// Reads a whole frame header, or `None` when nothing arrived within the read timeout (a
/// header is never split by one: its five bytes are written at once).
fn read_exact_or_timeout(conn: &mut UnixStream, buf: &mut [u8]) -> anyhow::Result<Option<()>> {
    match conn.read(&mut buf[..1]) {
        Ok(0) => anyhow::bail!("the local server closed the connection before the run ended"),
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Ok(None)
        }
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    conn.set_read_timeout(None)?;
    conn.read_exact(&mut buf[1..])?;
    conn.set_read_timeout(Some(Duration::from_millis(100)))?;
    Ok(Some(()))
}

/// The request for `runcell run`'s program and options.
pub fn request(
    language: Language,
    code: &str,
    files: &[InputFile],
    memory_mb: Option<u64>,
    timeout_s: f64,
) -> Request {
    Request {
        language,
        code: code.to_owned(),
        files: files
            .iter()
            .map(|f| {
                (
                    f.path.clone(),
                    base64::engine::general_purpose::STANDARD.encode(&f.content),
                )
            })
            .collect(),
        memory_mb,
        timeout_s,
    }
}
