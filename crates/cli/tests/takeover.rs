//! A dead node's sessions resumed on another node (issue 18) through a snapshot store the
//! nodes share: nodes on one real PostgreSQL (the store tests' server, started by the test),
//! each with a data dir of its own and the same `--snapshot-dir` (or `--snapshot-store s3://`
//! on a real S3-compatible server, moto's, started by the test). A session made on A keeps
//! `x = 41` and a file; after its idle snapshot A is killed with -9; requests through B and C
//! at once both answer `x + 1 == 42` from one new owner, the first reply says what came back
//! and which execution was lost; A, started again, does not take it back. A session with no
//! snapshot stays dead.

#[path = "../../server/tests/common/clients.rs"]
mod clients;
mod common;

use common::cluster::pg;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::serve::{data_dir, free_port, runcell, Serve, UnmountOnDrop};
use serde_json::{json, Value};

const SECRET: &str = "0123456789abcdef0123456789abcdef-takeover";

/// An API key of `tenant` on the database of `flags`.
fn api_key(flags: &[String], tenant: &str) -> String {
    common::serve::create_key(
        &data_dir("runcell-tk-k-"),
        flags,
        &["--name", tenant, "--tenant", tenant],
    )
}

/// A database of its own on the test's PostgreSQL, audit keys and a cluster secret in `keys`,
/// and two API keys: the flags every node takes, team-a's key and team-b's.
fn cluster(keys: &Path) -> (Vec<String>, String, String) {
    let server = pg::pg_server();
    let conninfo = server.new_database();
    let db = conninfo.rsplit("dbname=").next().expect("dbname");
    let url = format!(
        "postgres://{}@/{db}?host={}",
        pg::PG_USER,
        server.socket_dir().display()
    );
    let secret = keys.join("cluster.secret");
    std::fs::write(&secret, format!("{SECRET}\n")).expect("write the cluster secret");
    let flags: Vec<String> = [
        "--database",
        &url,
        "--audit-key-file",
        &keys.join("audit-chain.key").display().to_string(),
        "--audit-signing-key-file",
        &keys.join("audit-signing.key").display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    let (key, other_key) = (api_key(&flags, "team-a"), api_key(&flags, "team-b"));
    let mut node_flags = flags;
    node_flags.extend(
        [
            "--no-zygote",
            "--warm-sessions",
            "0",
            "--cluster-secret-file",
            &secret.display().to_string(),
        ]
        .map(str::to_owned),
    );
    (node_flags, key, other_key)
}

/// `runcell serve` on `port` as node `http://127.0.0.1:PORT`, with `env` set.
fn node(data: &Path, port: u16, flags: &[String], env: &[(&str, String)]) -> Serve {
    use std::io::{BufRead, BufReader};
    let url = format!("http://127.0.0.1:{port}");
    let mut child = runcell(data)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--node-url", &url])
        .args(flags)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("serve exited early: {seen:#?}"))
            .expect("log line");
        if line.contains("runcell serving on") {
            break;
        }
        seen.push(line);
    }
    // The node's warnings go to the test's output (shown when it fails).
    let name = url.clone();
    std::thread::spawn(move || {
        lines
            .map_while(Result::ok)
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .for_each(|l| eprintln!("[{name}] {l}"))
    });
    Serve::adopt(child, url)
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

fn call(method: reqwest::Method, url: &str, key: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = http().request(method.clone(), url).bearer_auth(key);
    // A session is made on the node asked (placement would pick any node with room).
    if let Some(node) = url.strip_suffix("/v1/sessions") {
        if method == reqwest::Method::POST {
            r = r.header("x-runcell-node", node);
        }
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().expect("request");
    let status = r.status().as_u16();
    let text = r.text().expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn execute(base: &str, sid: &str, key: &str, code: &str) -> Value {
    let (status, e) = call(
        reqwest::Method::POST,
        &format!("{base}/v1/sessions/{sid}/execute"),
        key,
        Some(json!({ "code": code })),
    );
    assert_eq!(status, 200, "{code} through {base}: {e}");
    assert_eq!(e["status"], "ok", "{code} through {base}: {e}");
    e
}

/// Waits (bounded) until `done()` holds; `what` names it in the failure.
fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(
            t.elapsed() < within,
            "{what}: still not so after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The session's status as a listing through `base` has it (a listing takes nothing over).
fn listed_status(base: &str, key: &str, sid: &str) -> Option<String> {
    let (status, l) = call(
        reqwest::Method::GET,
        &format!("{base}/v1/sessions"),
        key,
        None,
    );
    assert_eq!(status, 200, "{l}");
    l["sessions"]
        .as_array()?
        .iter()
        .find(|s| s["id"] == sid)
        .and_then(|s| s["status"].as_str().map(str::to_owned))
}

/// What both the directory and the S3 test check, once nodes `a` (with `data_a`), `b` and `c`
/// run on one shared store: `kept(key)` tells whether the store holds that key.
#[allow(clippy::too_many_arguments)]
fn a_dead_nodes_session_resumes_elsewhere(
    a: &mut Serve,
    data_a: &Path,
    restart_a: impl FnOnce() -> Serve,
    b: &Serve,
    c: Option<&Serve>,
    data_of: &[(&str, &Path)],
    key: &str,
    other_key: &str,
    kept: impl Fn(&str) -> bool,
) {
    let (status, s) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", a.base),
        key,
        Some(json!({"metadata": {"made_on": "a"}})),
    );
    assert_eq!(status, 201, "{s}");
    let sid = s["id"].as_str().expect("id").to_owned();
    execute(
        &a.base,
        &sid,
        key,
        "x = 41\nopen('note.txt', 'w').write('kept on A')",
    );
    // The idle snapshot (3 s after the cell), its files beside it, its description last.
    wait_for(
        "the idle snapshot in the shared store",
        Duration::from_secs(30),
        || kept(&format!("{sid}.json")),
    );
    assert!(kept(&format!("{sid}.snap")) && kept(&format!("{sid}.files.tar")));
    // A cell after the snapshot, at once followed by the kill: its effect on variables is lost.
    let lost = execute(&a.base, &sid, key, "y = 'after the snapshot'");
    let lost_id = lost["id"].as_str().expect("execution id").to_owned();
    // And a session that never ran anything has no snapshot: it stays dead.
    let (status, bare) = call(
        reqwest::Method::POST,
        &format!("{}/v1/sessions", a.base),
        key,
        Some(json!({})),
    );
    assert_eq!(status, 201, "{bare}");
    let bare = bare["id"].as_str().expect("id").to_owned();
    a.kill9();
    assert!(
        data_a.join("workspaces").join(&sid).exists(),
        "A's own copy stays on A's disk (the test's control: nothing moved it)"
    );

    wait_for(
        "A's session listed dead through B",
        Duration::from_secs(30),
        || listed_status(&b.base, key, &sid).as_deref() == Some("dead"),
    );
    // Only the session's own tenant moves it: another tenant's request is a 404, one with no
    // key a 401, and neither takes it over (still dead, on no live node's disk; the takeover
    // below is the positive control).
    let url = format!("{}/v1/sessions/{sid}/execute", b.base);
    let (status, e) = call(
        reqwest::Method::POST,
        &url,
        other_key,
        Some(json!({"code": "x"})),
    );
    assert_eq!(
        (status, e["error"]["code"].clone()),
        (404, json!("not_found")),
        "{e}"
    );
    let r = http()
        .post(&url)
        .json(&json!({"code": "x"}))
        .send()
        .expect("no key");
    assert_eq!(r.status(), 401);
    assert_eq!(listed_status(&b.base, key, &sid).as_deref(), Some("dead"));
    assert!(data_of
        .iter()
        .all(|(_, d)| !d.join("workspaces").join(&sid).exists()));
    // Through B and C at once: one takes it over, the other forwards to it.
    let through: Vec<&Serve> = std::iter::once(b).chain(c).collect();
    let replies: Vec<Value> = std::thread::scope(|scope| {
        let handles: Vec<_> = through
            .iter()
            .map(|n| {
                let (base, sid) = (n.base.clone(), sid.clone());
                scope.spawn(move || execute(&base, &sid, key, "x + 1"))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for r in &replies {
        assert_eq!(r["results"][0]["data"]["text/plain"], "42", "{r}");
    }
    let restored: Vec<&Value> = replies.iter().filter_map(|r| r.get("restored")).collect();
    assert_eq!(restored.len(), 1, "one resume, told once: {replies:#?}");
    let restored = restored[0];
    assert!(
        restored["names"]
            .as_array()
            .is_some_and(|n| n.contains(&json!("x"))),
        "{restored}"
    );
    assert_eq!(restored["lost_executions"], json!([lost_id]), "{restored}");
    assert!(restored.get("files_only").is_none(), "{restored}");

    // One owner: exactly one of the live nodes (`data_of`) holds its workspace now.
    let owners: Vec<&str> = data_of
        .iter()
        .filter(|(_, d)| d.join("workspaces").join(&sid).exists())
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(owners.len(), 1, "one owner: {owners:?}");
    for n in &through {
        // The file came along, the lost cell's variable did not; the session is live.
        let e = execute(
            &n.base,
            &sid,
            key,
            "open('note.txt').read(), 'y' in globals()",
        );
        assert_eq!(
            e["results"][0]["data"]["text/plain"], "('kept on A', False)",
            "through {}",
            n.base
        );
        let (status, s) = call(
            reqwest::Method::GET,
            &format!("{}/v1/sessions/{sid}", n.base),
            key,
            None,
        );
        assert_eq!((status, s["status"].clone()), (200, json!("ready")), "{s}");
        assert_eq!(s["metadata"], json!({"made_on": "a"}), "{s}");
    }
    // The session without a snapshot: dead, wherever it is asked.
    for n in &through {
        let (status, s) = call(
            reqwest::Method::GET,
            &format!("{}/v1/sessions/{bare}", n.base),
            key,
            None,
        );
        assert_eq!((status, s["status"].clone()), (200, json!("dead")), "{s}");
    }

    // A starts again (a new epoch of the same node): the session is not A's any more. Its
    // requests through A reach the new owner, whose state it has.
    *a = restart_a();
    let e = execute(&a.base, &sid, key, "x = x + 100\nx");
    assert_eq!(e["results"][0]["data"]["text/plain"], "141", "{e}");
    let e = execute(&b.base, &sid, key, "x");
    assert_eq!(e["results"][0]["data"]["text/plain"], "141", "{e}");
    assert_eq!(
        listed_status(&a.base, key, &sid).as_deref(),
        Some("ready"),
        "listed through A"
    );
    let owners_after: Vec<&str> = data_of
        .iter()
        .filter(|(_, d)| d.join("workspaces").join(&sid).exists())
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(owners_after, owners, "the owner did not change");
    assert!(
        !data_a.join("workspaces").join(&sid).exists(),
        "A removed its own copy at its start: the session is not its any more"
    );
}

/// Three nodes and a directory they share (here a local one: an NFS or RWX volume in a real
/// cluster).
#[test]
fn a_dead_nodes_session_resumes_on_another_node_from_a_shared_directory() {
    let keys = tempfile::tempdir().expect("tempdir");
    let (mut flags, key, other_key) = cluster(keys.path());
    let shared = tempfile::Builder::new()
        .prefix("runcell-tk-shared-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("shared dir");
    flags.extend([
        "--snapshot-dir".to_owned(),
        shared.path().display().to_string(),
    ]);
    let data_a = data_dir("runcell-tk-a-");
    let _unmount_a = UnmountOnDrop(data_a.to_path_buf());
    let port_a = free_port();
    let mut a = node(&data_a, port_a, &flags, &[]);
    let data_b = data_dir("runcell-tk-b-");
    let b = node(&data_b, free_port(), &flags, &[]);
    let data_c = data_dir("runcell-tk-c-");
    let c = node(&data_c, free_port(), &flags, &[]);
    let dir = shared.path().to_path_buf();
    a_dead_nodes_session_resumes_elsewhere(
        &mut a,
        &data_a,
        || node(&data_a, port_a, &flags, &[]),
        &b,
        Some(&c),
        &[("b", &*data_b), ("c", &*data_c)],
        &key,
        &other_key,
        |k| dir.join(k).exists(),
    );
    // The snapshot's files are the server's alone.
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir(shared.path()).expect("shared dir") {
        let entry = entry.expect("entry");
        let mode = entry.metadata().expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", entry.path().display());
    }
}

/// `moto_server` (PyPI's moto, pinned, in a venv under target/) on a free port.
struct Moto {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto() -> Moto {
    let requirements: PathBuf =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/moto-requirements.txt");
    let python = clients::requirements_venv("moto", &requirements);
    let port = free_port();
    // `python -m`, not the venv's `moto_server` script: the venv was built in a directory
    // renamed into place afterwards, so its scripts' #! lines name a path that is gone.
    let child = std::process::Command::new(python)
        .args([
            "-m",
            "moto.server",
            "-H",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("moto_server");
    let endpoint = format!("http://127.0.0.1:{port}");
    let moto = Moto { child, endpoint };
    wait_for("moto_server listening", Duration::from_secs(60), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    moto
}

/// Two nodes and an S3 bucket (a real S3-compatible server, moto's), reached by the
/// `object_store` crate's AWS backend through `AWS_ENDPOINT_URL`.
#[test]
fn a_dead_nodes_session_resumes_on_another_node_from_s3() {
    let s3 = moto();
    // The bucket, made as any S3 client makes one (moto does not check signatures).
    let made = http()
        .put(format!("{}/runcell-snapshots", s3.endpoint))
        .send()
        .expect("create the bucket");
    assert!(made.status().is_success(), "{}", made.status());
    let env = [
        ("AWS_ENDPOINT_URL", s3.endpoint.clone()),
        ("AWS_ACCESS_KEY_ID", "test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "test".to_owned()),
        ("AWS_DEFAULT_REGION", "us-east-1".to_owned()),
    ];
    let keys = tempfile::tempdir().expect("tempdir");
    let (mut flags, key, other_key) = cluster(keys.path());
    flags.extend(["--snapshot-store", "s3://runcell-snapshots/cluster-1"].map(str::to_owned));
    let data_a = data_dir("runcell-tk-s3a-");
    let _unmount_a = UnmountOnDrop(data_a.to_path_buf());
    let port_a = free_port();
    let mut a = node(&data_a, port_a, &flags, &env);
    let data_b = data_dir("runcell-tk-s3b-");
    let b = node(&data_b, free_port(), &flags, &env);
    let endpoint = s3.endpoint.clone();
    a_dead_nodes_session_resumes_elsewhere(
        &mut a,
        &data_a,
        || node(&data_a, port_a, &flags, &env),
        &b,
        None,
        &[("b", &*data_b)],
        &key,
        &other_key,
        // The bucket's listing (moto refuses an unsigned HEAD, not an unsigned listing).
        |k| bucket_keys(&endpoint).contains(&format!("cluster-1/{k}")),
    );
    // Nothing was kept outside the prefix.
    let keys_listed = bucket_keys(&s3.endpoint);
    assert!(!keys_listed.is_empty());
    assert!(
        keys_listed.iter().all(|k| k.starts_with("cluster-1/ses_")),
        "{keys_listed:?}"
    );
}

/// The keys of the test's bucket, from its (unsigned) listing.
fn bucket_keys(endpoint: &str) -> Vec<String> {
    let listing = http()
        .get(format!("{endpoint}/runcell-snapshots"))
        .send()
        .and_then(|r| r.text())
        .expect("list the bucket");
    listing
        .split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .map(str::to_owned)
        .collect()
}

/// A store that does not answer stops `serve` with the reason, before it listens.
#[test]
fn an_unreachable_snapshot_store_stops_serve() {
    let data = data_dir("runcell-tk-bad-");
    let port = free_port();
    let out = runcell(&data)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--snapshot-store",
            "s3://nowhere/p",
            "--warm-sessions",
            "0",
            "--no-zygote",
        ])
        .env(
            "AWS_ENDPOINT_URL",
            format!("http://127.0.0.1:{}", free_port()),
        )
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .output()
        .expect("serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--snapshot-store s3://nowhere/p: the bucket does not answer"),
        "{err}"
    );
    let out = runcell(&data)
        .args(["serve", "--snapshot-store", "gs://x"])
        .output()
        .expect("serve");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--snapshot-store takes s3://BUCKET[/PREFIX]"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
