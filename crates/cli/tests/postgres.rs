//! `--database postgres://...` end to end: `runcell keys` and two `runcell serve` nodes (data
//! dirs of their own) on one real PostgreSQL (the store tests' server, started by the test):
//! a key made by the CLI authenticates on both nodes, an execution on one node is listed and
//! verified in the audit chain through the other, a node leaves the other's sessions alone and
//! reports them dead once that node is killed, `runcell audit verify` agrees, and a node given
//! another chain key refuses to start.

mod common;

use common::cluster::pg;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::serve::{data_dir, runcell, serve, UnmountOnDrop};
use serde_json::{json, Value};

/// The global flags every command on the shared database takes.
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

/// A cluster secret for the nodes of one test, in `dir`; its `--cluster-secret-file` flag.
fn cluster_secret(dir: &Path, secret: &str) -> [String; 2] {
    let file = dir.join("cluster.secret");
    std::fs::write(&file, format!("{secret}\n")).expect("write the cluster secret");
    ["--cluster-secret-file".into(), file.display().to_string()]
}

const SECRET: &str = "0123456789abcdef0123456789abcdef-test";

fn cli(data: &Path, flags: &[String]) -> Command {
    let mut c = runcell(data);
    c.args(flags);
    c
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

fn get(base: &str, path: &str, key: &str) -> Value {
    let r = http()
        .get(format!("{base}{path}"))
        .bearer_auth(key)
        .send()
        .expect("get");
    assert_eq!(r.status(), 200, "GET {path}");
    r.json().expect("json")
}

#[test]
fn two_nodes_on_one_postgres_share_keys_executions_and_the_audit_chain() {
    let server = pg::pg_server();
    let conninfo = server.new_database();
    let db = conninfo.rsplit("dbname=").next().expect("dbname");
    let url = format!(
        "postgres://{}@/{db}?host={}",
        pg::PG_USER,
        server.socket_dir().display()
    );
    let keys = tempfile::tempdir().expect("tempdir");
    let flags = shared(&url, keys.path());
    let (data_a, data_b) = (data_dir("runcell-pg-a-"), data_dir("runcell-pg-b-"));
    let _unmount_a = UnmountOnDrop(data_a.to_path_buf());

    let out = cli(&data_a, &flags)
        .args(["keys", "create", "--name", "ci", "--tenant", "team-a"])
        .output()
        .expect("keys create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let key = stdout.lines().last().expect("key line").to_owned();
    assert!(
        server
            .psql(db, "SELECT count(*) FROM api_keys")
            .expect("psql")
            == "1",
        "the key is in PostgreSQL"
    );

    let secret = cluster_secret(keys.path(), SECRET);
    let mut node_flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    node_flags.extend(["--no-zygote", "--warm-sessions", "0"]);
    node_flags.extend(secret.iter().map(String::as_str));
    let node = |url: &'static str| {
        let mut f = node_flags.clone();
        f.extend(["--node-url", url]);
        f
    };
    let mut a = serve(&data_a, &node("http://node-a"));
    let c = http();

    // One execution through node A, a one-shot and one in a session.
    let e: Value = c
        .post(format!("{}/v1/execute", a.base))
        .bearer_auth(&key)
        .json(&json!({"code": "print(6 * 7)"}))
        .send()
        .and_then(|r| r.json())
        .expect("execute on A");
    assert_eq!(e["stdout"], "42\n", "{e}");
    let one_shot = e["id"].as_str().expect("id").to_owned();
    let s: Value = c
        .post(format!("{}/v1/sessions", a.base))
        .bearer_auth(&key)
        // Made on A (placement would pick any node with room).
        .header("x-runcell-node", "http://node-a")
        .json(&json!({}))
        .send()
        .and_then(|r| r.json())
        .expect("session on A");
    let sid = s["id"].as_str().unwrap_or_else(|| panic!("{s}")).to_owned();
    let e: Value = c
        .post(format!("{}/v1/sessions/{sid}/execute", a.base))
        .bearer_auth(&key)
        .json(&json!({"code": "x = 5\nx * 2"}))
        .send()
        .and_then(|r| r.json())
        .expect("execute in the session");
    assert_eq!(e["status"], "ok", "{e}");

    // Node B starts after it: what it recovers is its own, so A's session is left alone.
    let b = serve(&data_b, &node("http://node-b"));
    let status = |id: &str| {
        server
            .psql(
                db,
                &format!("SELECT status FROM sessions WHERE id = '{id}'"),
            )
            .expect("psql")
    };
    assert_eq!(status(&sid), "ready");
    assert_eq!(
        server
            .psql(db, "SELECT id FROM nodes ORDER BY id")
            .expect("psql"),
        "http://node-a\nhttp://node-b"
    );

    // Node B authenticates the same key and reads the same executions and chain.
    let listed = get(&b.base, "/v1/executions", &key);
    let ids: Vec<&str> = listed["executions"]
        .as_array()
        .expect("executions")
        .iter()
        .filter_map(|x| x["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{listed}");
    assert!(ids.contains(&one_shot.as_str()), "{listed}");
    let got = get(&b.base, &format!("/v1/executions/{one_shot}"), &key);
    assert_eq!(got["stdout"], "42\n");
    for node in [&a, &b] {
        let v = get(&node.base, "/v1/audit/verify", &key);
        assert_eq!(v, json!({"ok": true, "checked": 2}), "{}", node.base);
    }
    let bad = c
        .get(format!("{}/v1/executions", b.base))
        .bearer_auth("rc_not-a-key")
        .send()
        .expect("get");
    assert_eq!(bad.status(), 401);

    // Node A dies: within its heartbeat's timeout, its session is dead through node B.
    a.kill9();
    let killed = std::time::Instant::now();
    loop {
        let r = c
            .get(format!("{}/v1/sessions/{sid}", b.base))
            .bearer_auth(&key)
            .send()
            .expect("get");
        if r.status() == 200 {
            let s: Value = r.json().expect("json");
            assert_eq!(s["status"], "dead", "{s}");
            // Not before its heartbeat could have gone stale (10 s, less one 2 s beat).
            assert!(
                killed.elapsed() >= Duration::from_secs(7),
                "{:?}",
                killed.elapsed()
            );
            eprintln!(
                "node A's session read dead through node B {:?} after kill -9",
                killed.elapsed()
            );
            break;
        }
        // Until its heartbeat is stale, node A counts as alive: B forwards, and fails fast.
        assert_eq!(r.status(), 503, "not dead yet: node A cannot be reached");
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "still not dead after {:?}",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    drop(b);

    let out = cli(&data_b, &flags)
        .args(["audit", "verify"])
        .output()
        .expect("audit verify");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // A node with a chain key of its own cannot join.
    let other = tempfile::tempdir().expect("tempdir");
    let out = cli(&data_b, &shared(&url, other.path()))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .expect("serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("keyed with key"), "{err}");
    // Nor one without the cluster secret: it could neither forward nor be forwarded to.
    let out = cli(&data_b, &flags)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .expect("serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--cluster-secret-file FILE (or RUNCELL_CLUSTER_SECRET)"),
        "{err}"
    );
}

/// `runcell serve` on `port`, as node `http://127.0.0.1:PORT`.
fn node_on(data: &Path, port: u16, flags: &[&str]) -> common::serve::Serve {
    use std::io::{BufRead, BufReader};
    let url = format!("http://127.0.0.1:{port}");
    let mut child = runcell(data)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--node-url", &url])
        .args(flags)
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
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    common::serve::Serve::adopt(child, url)
}

/// Three nodes: a session made on A is reached through B and C, its NDJSON stream included,
/// a file uploaded through C downloads through B, and once A is killed its session is dead
/// through B.
#[test]
fn three_nodes_route_session_requests_to_their_owner() {
    let server = pg::pg_server();
    let conninfo = server.new_database();
    let db = conninfo.rsplit("dbname=").next().expect("dbname");
    let url = format!(
        "postgres://{}@/{db}?host={}",
        pg::PG_USER,
        server.socket_dir().display()
    );
    let keys = tempfile::tempdir().expect("tempdir");
    let flags = shared(&url, keys.path());
    let out = cli(&data_dir("runcell-pg-k-"), &flags)
        .args(["keys", "create", "--name", "ci"])
        .output()
        .expect("keys create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("key")
        .to_owned();
    let secret = cluster_secret(keys.path(), SECRET);
    let mut node_flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    node_flags.extend(["--no-zygote", "--warm-sessions", "0"]);
    node_flags.extend(secret.iter().map(String::as_str));
    let data_a = data_dir("runcell-pg-a-");
    let _unmount_a = UnmountOnDrop(data_a.to_path_buf());
    let mut a = node_on(&data_a, common::serve::free_port(), &node_flags);
    // Bound: a data dir is removed when its guard drops, after the node on it has stopped.
    let data_b = data_dir("runcell-pg-b-");
    let b = node_on(&data_b, common::serve::free_port(), &node_flags);
    let data_c = data_dir("runcell-pg-c-");
    let c_node = node_on(&data_c, common::serve::free_port(), &node_flags);
    let c = http();

    let s: Value = c
        .post(format!("{}/v1/sessions", a.base))
        .bearer_auth(&key)
        // Made on A (placement would pick any node with room).
        .header("x-runcell-node", a.base.as_str())
        .json(&json!({}))
        .send()
        .and_then(|r| r.json())
        .expect("session on A");
    let sid = s["id"].as_str().expect("session id").to_owned();
    let e: Value = c
        .post(format!("{}/v1/sessions/{sid}/execute", b.base))
        .bearer_auth(&key)
        .json(&json!({"code": "x = 41"}))
        .send()
        .and_then(|r| r.json())
        .expect("execute through B");
    assert_eq!(e["status"], "ok", "{e}");
    // Streamed through C: the events come as they happen, the end last.
    let stream = c
        .post(format!("{}/v1/sessions/{sid}/execute", c_node.base))
        .bearer_auth(&key)
        .header("Accept", "application/x-ndjson")
        .json(&json!({"code": "print('hi')\nx + 1"}))
        .send()
        .expect("stream through C");
    assert_eq!(stream.status(), 200);
    let events: Vec<Value> = stream
        .text()
        .expect("body")
        .lines()
        .map(|l| serde_json::from_str(l).expect("event"))
        .collect();
    assert_eq!(
        events.first().map(|e| e["type"].clone()),
        Some(json!("stdout"))
    );
    let end = events.last().expect("end");
    assert_eq!(end["type"], "end", "{events:?}");
    assert_eq!(
        end["execution"]["results"][0]["data"]["text/plain"], "42",
        "{end}"
    );
    // Uploaded through C (3 MiB), downloaded through B.
    let data: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let up = c
        .put(format!("{}/v1/sessions/{sid}/files/data.bin", c_node.base))
        .bearer_auth(&key)
        .body(data.clone())
        .send()
        .expect("upload through C");
    assert!(up.status().is_success(), "{}", up.status());
    let down = c
        .get(format!("{}/v1/sessions/{sid}/files/data.bin", b.base))
        .bearer_auth(&key)
        .send()
        .expect("download through B");
    assert_eq!(down.status(), 200);
    assert!(down.bytes().expect("bytes").as_ref() == data.as_slice());
    assert_eq!(
        get(&b.base, &format!("/v1/sessions/{sid}"), &key)["status"],
        "ready"
    );

    // The node credential. Through B, a client is authenticated by B: no key, no request.
    let session_url = |base: &str| format!("{base}/v1/sessions/{sid}");
    let r = c.get(session_url(&b.base)).send().expect("get");
    assert_eq!(r.status(), 401, "no key through B");
    // Another tenant's key through B: the owner serves B's word for that tenant, for whom
    // the session does not exist.
    let out = cli(&data_dir("runcell-pg-k2-"), &flags)
        .args(["keys", "create", "--name", "other", "--tenant", "team-b"])
        .output()
        .expect("keys create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let other_key = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("key")
        .to_owned();
    let r = c
        .get(session_url(&b.base))
        .bearer_auth(&other_key)
        .send()
        .expect("get");
    assert_eq!(r.status(), 404, "team-b through B");
    // A client forging the forwarded headers at the owner, to act as the session's tenant
    // with team-b's key (or none): refused whatever it signs, and the session's tenant
    // never named.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let forged_signature = format!("t={now},s={}", "ab".repeat(32));
    for (signature, key) in [
        (Some(forged_signature.as_str()), Some(other_key.as_str())),
        (Some(forged_signature.as_str()), None),
        (None, Some(other_key.as_str())),
    ] {
        let mut r = c
            .get(session_url(&a.base))
            .header("x-runcell-forwarded-by", b.base.as_str())
            .header("x-runcell-forwarded-tenant", "default");
        if let Some(s) = signature {
            r = r.header("x-runcell-node-signature", s);
        }
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        let r = r.send().expect("forged get");
        assert_eq!(r.status(), 401, "forged: {signature:?} {key:?}");
        let body: Value = r.json().expect("json");
        assert_eq!(body["error"]["code"], "unauthorized", "{body}");
        let message = body["error"]["message"].as_str().expect("message");
        assert!(
            message.starts_with(
                "a forwarded request (x-runcell-forwarded-by) must carry a valid node credential"
            ),
            "{message}"
        );
        assert!(!message.contains(&sid), "{message}");
    }
    // A node with another cluster's secret forwards, and the owner refuses its word.
    let stranger_dir = tempfile::tempdir().expect("tempdir");
    let stranger_secret = cluster_secret(stranger_dir.path(), &"x".repeat(40));
    let mut stranger_flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    stranger_flags.extend(["--no-zygote", "--warm-sessions", "0"]);
    stranger_flags.extend(stranger_secret.iter().map(String::as_str));
    let stranger = node_on(
        &data_dir("runcell-pg-d-"),
        common::serve::free_port(),
        &stranger_flags,
    );
    let r = c
        .get(session_url(&stranger.base))
        .bearer_auth(&key)
        .send()
        .expect("get through the stranger");
    assert_eq!(r.status(), 401, "another cluster's node");
    let body: Value = r.json().expect("json");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("the signature is not this cluster's")),
        "{body}"
    );
    drop(stranger);

    // Listing reads the shared store: a session made on B and paused there, and A's, are
    // listed alike through every node, with their status.
    let on_b: Value = c
        .post(format!("{}/v1/sessions", b.base))
        .bearer_auth(&key)
        .header("x-runcell-node", b.base.as_str())
        .json(&json!({"metadata": {"node": "b"}}))
        .send()
        .and_then(|r| r.json())
        .expect("session on B");
    let sid_b = on_b["id"].as_str().expect("session id").to_owned();
    let paused = c
        .post(format!("{}/v1/sessions/{sid_b}/pause", c_node.base))
        .bearer_auth(&key)
        .send()
        .expect("pause through C");
    assert!(paused.status().is_success(), "{}", paused.status());
    let listing = |base: &str| -> Vec<(String, String, String)> {
        let mut l: Vec<_> = get(base, "/v1/sessions", &key)["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .map(|s| {
                (
                    s["id"].as_str().expect("id").to_owned(),
                    s["status"].as_str().expect("status").to_owned(),
                    s["metadata"].to_string(),
                )
            })
            .collect();
        l.sort();
        l
    };
    let mut expected = vec![
        (sid.clone(), "ready".to_owned(), json!({}).to_string()),
        (
            sid_b.clone(),
            "paused".to_owned(),
            json!({"node": "b"}).to_string(),
        ),
    ];
    expected.sort();
    for base in [&a.base, &b.base, &c_node.base] {
        assert_eq!(listing(base), expected, "listed through {base}");
        // And one session's GET agrees, wherever it is asked.
        assert_eq!(
            get(base, &format!("/v1/sessions/{sid_b}"), &key)["status"],
            "paused",
            "through {base}"
        );
    }
    // Another tenant lists none of them, through any node.
    for base in [&a.base, &b.base, &c_node.base] {
        assert_eq!(
            get(base, "/v1/sessions", &other_key)["sessions"],
            json!([]),
            "team-b through {base}"
        );
    }

    // What forwarding costs (printed, not asserted: the machine is shared): a session's GET
    // at its owner and through another node, p50 of 50 each.
    let p50 = |base: &str| {
        let mut ms: Vec<f64> = (0..50)
            .map(|_| {
                let t = std::time::Instant::now();
                let r = c
                    .get(format!("{base}/v1/sessions/{sid}"))
                    .bearer_auth(&key)
                    .send()
                    .and_then(|r| r.error_for_status())
                    .and_then(|r| r.bytes())
                    .expect("get");
                drop(r);
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        ms[25]
    };
    let (at_owner, through_b) = (p50(&a.base), p50(&b.base));
    eprintln!("GET session p50: {at_owner:.2} ms at its node, {through_b:.2} ms through another");

    a.kill9();
    let killed = std::time::Instant::now();
    loop {
        let r = c
            .get(format!("{}/v1/sessions/{sid}", b.base))
            .bearer_auth(&key)
            .send()
            .expect("get");
        if r.status() == 200 {
            let s: Value = r.json().expect("json");
            if s["status"] == "dead" {
                // Listed dead through the nodes left, B's paused session still paused.
                for base in [&b.base, &c_node.base] {
                    let mut after = expected.clone();
                    after.iter_mut().for_each(|e| {
                        if e.0 == sid {
                            e.1 = "dead".to_owned();
                        }
                    });
                    assert_eq!(listing(base), after, "after A died, through {base}");
                }
                break;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "A's session still not dead through B after {:?}",
            killed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
