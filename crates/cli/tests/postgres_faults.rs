//! Faults of a cluster on PostgreSQL, through real `runcell serve` nodes: a node cut off
//! from the database (a partition between it and PostgreSQL, made by a proxy the test
//! controls, while the other node reaches the database directly) stops serving its sessions
//! before the cluster calls it dead and serves again once it renews its lease; cut off past
//! that, it never acts on them again, down to the execution it was running, which the
//! database refuses to record. And PostgreSQL restarted under HTTP load: every request
//! succeeds or fails as 503 with Retry-After, the node recovers by itself, and every
//! execution a client was told succeeded is in the audit chain, which verifies.

mod common;

use common::cluster::pg;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::serve::{data_dir, runcell, UnmountOnDrop};
use serde_json::{json, Value};

const SECRET: &str = "0123456789abcdef0123456789abcdef-faults";

/// The global flags every node and command of one test shares, `url` its database.
fn shared(url: &str, keys: &Path) -> Vec<String> {
    vec![
        "--database".into(),
        url.into(),
        "--audit-key-file".into(),
        keys.join("audit-chain.key").display().to_string(),
        "--audit-signing-key-file".into(),
        keys.join("audit-signing.key").display().to_string(),
    ]
}

fn new_key(url: &str, keys: &Path) -> String {
    common::serve::create_key(
        &data_dir("runcell-faults-k-"),
        &shared(url, keys),
        &["--name", "ci"],
    )
}

/// `runcell serve` as node `http://127.0.0.1:PORT` on `url`.
fn node(data: &Path, url: &str, keys: &Path, log: &Log) -> common::serve::Serve {
    let log = log.clone();
    let port = common::serve::free_port();
    let me = format!("http://127.0.0.1:{port}");
    let secret = keys.join("cluster.secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("write the cluster secret");
    let mut child = runcell(data)
        .args(shared(url, keys))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--node-url", &me, "--no-zygote", "--warm-sessions", "0"])
        .arg("--cluster-secret-file")
        .arg(&secret)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    loop {
        let line = lines.next().expect("serve exited early").expect("log line");
        if line.contains("runcell serving on") {
            break;
        }
    }
    let kept = log.clone();
    std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .filter(|l| l.contains("ERROR") || l.contains("WARN"))
            .for_each(|l| kept.lock().expect("log").push(l))
    });
    common::serve::Serve::adopt(child, me)
}

/// What a node logged as errors and warnings, for a failure's message.
type Log = Arc<Mutex<Vec<String>>>;

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        // The bound on any one request: a request that hangs past it fails the test.
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// A TCP proxy in front of the test server's Unix socket, which the test cuts and heals.
/// Cut, it passes no byte either way and holds new connections: connections stay open with
/// nothing coming back, as in a network partition, so every database call of a node behind
/// it hangs (none is refused, which would be the easy case).
struct Partition {
    port: u16,
    cut: Arc<AtomicBool>,
}

impl Partition {
    fn start(socket: PathBuf) -> Partition {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let cutting = cut.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming().map_while(Result::ok) {
                let (cut, socket) = (cutting.clone(), socket.clone());
                std::thread::spawn(move || {
                    wait_while(&cut);
                    let Ok(unix) = UnixStream::connect(&socket) else {
                        return;
                    };
                    let (tcp2, unix2, cut2) = (
                        tcp.try_clone().expect("clone"),
                        unix.try_clone().expect("clone"),
                        cut.clone(),
                    );
                    std::thread::spawn(move || {
                        pipe(&tcp2, &unix2, &cut2);
                        let _ = unix2.shutdown(Shutdown::Write);
                    });
                    pipe(&unix, &tcp, &cut);
                    let _ = tcp.shutdown(Shutdown::Write);
                });
            }
        });
        Partition { port, cut }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn wait_while(cut: &AtomicBool) {
    while cut.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Copies `from` to `to`; what it read while the link is cut waits until it heals.
fn pipe(mut from: impl Read, mut to: impl Write, cut: &AtomicBool) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        wait_while(cut);
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// A session's status in `base`'s listing, which is read from the database.
fn listed_status(base: &str, key: &str, sid: &str) -> String {
    let l: Value = http()
        .get(format!("{base}/v1/sessions"))
        .bearer_auth(key)
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.json())
        .expect("list");
    l["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["id"] == sid)
        .map(|s| s["status"].as_str().expect("status").to_owned())
        .expect("the session is listed")
}

/// The 503 a request gets, its message and Retry-After checked; its message.
fn refused(r: reqwest::blocking::Response, what: &str) -> String {
    assert_eq!(r.status(), 503, "{what}");
    assert!(
        r.headers().contains_key("retry-after"),
        "{what}: no Retry-After"
    );
    let body: Value = r.json().expect("json");
    assert_eq!(body["error"]["code"], "unavailable", "{what}: {body}");
    body["error"]["message"]
        .as_str()
        .expect("message")
        .to_owned()
}

/// Polls `f` every 100 ms until it gives `Some`, for at most `limit` (a bound on a wait,
/// not a claim about speed).
fn until<T>(limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Node A reaches PostgreSQL through a proxy the test cuts; node B directly.
///
/// Cut for a while: A answers 503 for its session (and for a new one) while B still lists
/// that session `ready` — A stopped before the cluster could call it dead — and once the
/// link heals, A renews its lease and serves the session again, its state intact.
///
/// Cut for longer, with a cell running on A: B lists the session `dead`; healed, A has lost
/// its epoch for good: its session-bound requests, creates and `/healthz` say so, and the
/// cell's execution, which ends after the cluster called A dead, is not recorded (its stream
/// ends with that 503) and is not in the audit chain. (That the database itself refuses such
/// a write, whatever the node believes, is store/tests/postgres.rs's
/// `the_database_refuses_a_node_it_called_dead_and_sessions_held_elsewhere`.)
#[test]
fn a_node_cut_off_from_postgresql_stops_serving_and_once_declared_dead_never_acts_again() {
    let server = pg::pg_server();
    let conninfo = server.new_database();
    let db = conninfo
        .rsplit("dbname=")
        .next()
        .expect("dbname")
        .to_owned();
    let direct = format!(
        "postgres://{}@/{db}?host={}",
        pg::PG_USER,
        server.socket_dir().display()
    );
    let link = Partition::start(server.socket_dir().join(".s.PGSQL.5432"));
    let through = format!(
        "postgres://{}@127.0.0.1:{}/{db}?sslmode=disable",
        pg::PG_USER,
        link.port
    );
    let keys = tempfile::tempdir().expect("tempdir");
    let key = new_key(&direct, keys.path());
    let data_a = data_dir("runcell-faults-a-");
    let _unmount_a = UnmountOnDrop(data_a.to_path_buf());
    let log: Log = Arc::default();
    let a = node(&data_a, &through, keys.path(), &log);
    let data_b = data_dir("runcell-faults-b-");
    let b = node(&data_b, &direct, keys.path(), &log);
    let c = http();

    let s: Value = c
        .post(format!("{}/v1/sessions", a.base))
        .bearer_auth(&key)
        .header("x-runcell-node", a.base.as_str())
        .json(&json!({}))
        .send()
        .and_then(|r| r.json())
        .expect("session on A");
    let sid = s["id"].as_str().expect("session id").to_owned();
    let session = format!("{}/v1/sessions/{sid}", a.base);
    let execute = |base: &str, code: &str| {
        c.post(format!("{base}/v1/sessions/{sid}/execute"))
            .bearer_auth(&key)
            .json(&json!({"code": code}))
            .send()
            .expect("execute")
    };
    let e: Value = execute(&a.base, "x = 1").json().expect("json");
    assert_eq!(e["status"], "ok", "{e}");

    // A short partition.
    link.cut();
    let answer = until(Duration::from_secs(60), "A refusing its session", || {
        let r = c.get(&session).bearer_auth(&key).send().expect("get on A");
        match r.status().as_u16() {
            200 => None,
            _ => Some(r),
        }
    });
    let message = refused(answer, "A's session while cut off");
    eprintln!("cut off: {message}");
    assert!(
        message.starts_with("this node cannot prove it still owns its sessions: it has not renewed its lease with the database for"),
        "{message}"
    );
    // A stopped first: the cluster still counts it alive.
    assert_eq!(listed_status(&b.base, &key, &sid), "ready");
    let message = refused(execute(&a.base, "x"), "execute on A while cut off");
    assert!(message.contains("cannot prove it still owns"), "{message}");
    let r = c
        .post(format!("{}/v1/sessions", a.base))
        .bearer_auth(&key)
        .header("x-runcell-node", a.base.as_str())
        .json(&json!({}))
        .send()
        .expect("create on A");
    let message = refused(r, "create on A while cut off");
    assert!(message.contains("cannot prove it still owns"), "{message}");
    link.heal();
    until(Duration::from_secs(60), "A serving again", || {
        let r = c.get(&session).bearer_auth(&key).send().expect("get on A");
        (r.status() == 200).then_some(())
    });
    for base in [&a.base, &b.base] {
        let e: Value = execute(base, "x + 1").json().expect("json");
        assert_eq!(
            e["results"][0]["data"]["text/plain"], "2",
            "through {base}: {e}"
        );
    }
    let health: Value = c
        .get(format!("{}/healthz", a.base))
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.json())
        .expect("healthz");
    assert_eq!(health["status"], "ok");

    // A long one, over a running cell: it prints, then sleeps past the partition.
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let streamed = {
        let (url, key) = (format!("{}/v1/sessions/{sid}/execute", a.base), key.clone());
        std::thread::spawn(move || {
            let r = reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .expect("client")
                .post(url)
                .bearer_auth(&key)
                .header("Accept", "application/x-ndjson")
                .json(&json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(25)\nx = 99", "timeout_s": 100}))
                .send()
                .expect("stream");
            assert_eq!(r.status(), 200);
            let mut events = Vec::new();
            for line in BufReader::new(r).lines() {
                let event: Value = serde_json::from_str(&line.expect("line")).expect("event");
                if event["type"] == "stdout" {
                    let _ = started_tx.send(());
                }
                events.push(event);
            }
            events
        })
    };
    started_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the cell started");
    let recorded_before: Value = c
        .get(format!("{}/v1/executions?session_id={sid}", b.base))
        .bearer_auth(&key)
        .send()
        .and_then(|r| r.json())
        .expect("executions");
    link.cut();
    until(
        Duration::from_secs(60),
        "B calling A's session dead",
        || (listed_status(&b.base, &key, &sid) == "dead").then_some(()),
    );
    link.heal();
    let lost = until(
        Duration::from_secs(60),
        "A knowing it lost its epoch",
        || {
            let r = c.get(&session).bearer_auth(&key).send().expect("get on A");
            let message = refused(r, "A's session once declared dead");
            message
                .contains("no longer owns its sessions")
                .then_some(message)
        },
    );
    eprintln!("declared dead: {lost}");
    assert!(
        lost.starts_with(
            "this node no longer owns its sessions: the cluster declared its epoch 1 dead"
        ),
        "{lost}"
    );
    let message = refused(execute(&a.base, "x"), "execute on A after");
    assert_eq!(message, lost);
    let r = c
        .post(format!("{}/v1/sessions", a.base))
        .bearer_auth(&key)
        .header("x-runcell-node", a.base.as_str())
        .json(&json!({}))
        .send()
        .expect("create on A");
    assert_eq!(refused(r, "create on A after"), lost);
    let r = c
        .get(format!("{}/healthz", a.base))
        .send()
        .expect("healthz");
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().expect("json")["status"], "lost");
    // The cell ran to its end on A, which did not record it: it no longer owns the session.
    let events = streamed.join().expect("stream thread");
    let end = events.last().expect("end");
    assert_eq!(end["type"], "end", "{events:?}");
    assert_eq!(end["status"], 503, "{end}");
    assert_eq!(end["error"]["code"], "unavailable", "{end}");
    assert!(
        end["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("declared its epoch 1 dead")),
        "{end}"
    );
    let recorded_after: Value = c
        .get(format!("{}/v1/executions?session_id={sid}", b.base))
        .bearer_auth(&key)
        .send()
        .and_then(|r| r.json())
        .expect("executions");
    assert_eq!(
        recorded_after, recorded_before,
        "nothing of A's was recorded"
    );
    assert_eq!(listed_status(&b.base, &key, &sid), "dead");
    let v: Value = c
        .get(format!("{}/v1/audit/verify", b.base))
        .bearer_auth(&key)
        .send()
        .and_then(|r| r.json())
        .expect("verify");
    assert_eq!(v["ok"], true, "{v}");
    drop(a);
    drop(b);
}

/// One node on a PostgreSQL restarted (`pg_ctl stop -m fast`, then start) while clients
/// create sessions, execute in them and as one-shots, and list sessions and executions:
/// each request succeeds or answers 503 with Retry-After (never a 500, never a hang past
/// the client's 60 s), every client succeeds again afterwards without the node being
/// touched, and every execution a client got a 200 for is in the database and the audit
/// chain verifies (through the API and `runcell audit verify`).
#[test]
fn postgresql_restarting_under_http_load_fails_requests_clearly_and_loses_nothing() {
    let server = pg::PgServer::start();
    let conninfo = server.new_database();
    let db = conninfo
        .rsplit("dbname=")
        .next()
        .expect("dbname")
        .to_owned();
    let url = format!(
        "postgres://{}@/{db}?host={}",
        pg::PG_USER,
        server.socket_dir().display()
    );
    let keys = tempfile::tempdir().expect("tempdir");
    let key = new_key(&url, keys.path());
    let data = data_dir("runcell-faults-r-");
    let log: Log = Arc::default();
    let n = node(&data, &url, keys.path(), &log);

    // What every client saw: (what, status), and the executions acknowledged.
    let seen: Arc<Mutex<Vec<(String, u16)>>> = Arc::default();
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let restarted = Arc::new(AtomicBool::new(false));
    // Each client stops once it has succeeded after the restart.
    let client = |kind: &'static str| {
        let (base, key) = (n.base.clone(), key.clone());
        let (seen, acked, restarted) = (seen.clone(), acked.clone(), restarted.clone());
        std::thread::spawn(move || {
            let c = http();
            let mut sid: Option<String> = None;
            let mut i = 0;
            loop {
                i += 1;
                let after = restarted.load(Ordering::SeqCst);
                let r = match kind {
                    "session" => match &sid {
                        None => c
                            .post(format!("{base}/v1/sessions"))
                            .bearer_auth(&key)
                            .json(&json!({}))
                            .send(),
                        Some(s) => c
                            .post(format!("{base}/v1/sessions/{s}/execute"))
                            .bearer_auth(&key)
                            .json(&json!({"code": format!("print({i})")}))
                            .send(),
                    },
                    "one-shot" => c
                        .post(format!("{base}/v1/execute"))
                        .bearer_auth(&key)
                        .json(&json!({"code": format!("print({i})")}))
                        .send(),
                    _ => c
                        .get(format!(
                            "{base}/v1/{}",
                            if i % 2 == 0 { "sessions" } else { "executions" }
                        ))
                        .bearer_auth(&key)
                        .send(),
                };
                let r = r.unwrap_or_else(|e| panic!("{kind} request {i}: {e}"));
                let status = r.status().as_u16();
                if status == 503 {
                    assert!(
                        r.headers().contains_key("retry-after"),
                        "{kind}: no Retry-After"
                    );
                }
                let body: Value = r.json().unwrap_or_else(|e| panic!("{kind} {i}: {e}"));
                if status == 503 {
                    assert_eq!(body["error"]["code"], "unavailable", "{kind}: {body}");
                }
                let ok = status == 200 || status == 201;
                if ok {
                    match (kind, &sid) {
                        ("session", None) => {
                            sid = Some(body["id"].as_str().expect("id").to_owned());
                        }
                        ("session", Some(_)) | ("one-shot", _) => {
                            assert_eq!(body["stdout"], format!("{i}\n"), "{body}");
                            acked
                                .lock()
                                .expect("lock")
                                .push(body["id"].as_str().expect("id").to_owned());
                        }
                        _ => {}
                    }
                }
                seen.lock().expect("lock").push((kind.to_owned(), status));
                if ok && after && (kind != "session" || i > 2) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let clients: Vec<_> = ["session", "one-shot", "listing", "listing"]
        .into_iter()
        .map(client)
        .collect();
    // Some load first, then the restart.
    until(Duration::from_secs(120), "load before the restart", || {
        (acked.lock().expect("lock").len() >= 4).then_some(())
    });
    server.pg_stop();
    std::thread::sleep(Duration::from_secs(2));
    server.pg_start();
    restarted.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().expect("client");
    }

    let seen = seen.lock().expect("lock").clone();
    let refused = seen.iter().filter(|(_, s)| *s == 503).count();
    for (kind, status) in &seen {
        assert!(
            [200, 201, 503].contains(status),
            "{kind}: {status} (all: {seen:?}); the node logged:\n{}",
            log.lock().expect("log").join("\n")
        );
    }
    eprintln!(
        "{} requests, {refused} refused with 503 while PostgreSQL restarted",
        seen.len()
    );
    assert!(
        refused > 0,
        "the restart was noticed by no request: {seen:?}"
    );
    // Nothing acknowledged is lost.
    let acked = acked.lock().expect("lock").clone();
    let recorded = server
        .psql(&db, "SELECT execution_id FROM executions")
        .expect("psql");
    let recorded: Vec<&str> = recorded.lines().collect();
    for id in &acked {
        assert!(
            recorded.contains(&id.as_str()),
            "{id} was acknowledged but is not recorded"
        );
    }
    let v: Value = http()
        .get(format!("{}/v1/audit/verify", n.base))
        .bearer_auth(&key)
        .send()
        .and_then(|r| r.json())
        .expect("verify");
    assert_eq!(v["ok"], true, "{v}");
    assert!(
        v["checked"].as_u64().expect("checked") >= acked.len() as u64,
        "{v}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_runcell"))
        .env("RUNCELL_DATA_DIR", &*data_dir("runcell-faults-v-"))
        .args(shared(&url, keys.path()))
        .args(["audit", "verify"])
        .output()
        .expect("audit verify");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    drop(n);
}
