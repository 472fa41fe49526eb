//! JavaScript sessions keep their state (issue 17) through a real `runcell serve`: pause and
//! resume (explicit and by any request), fork, a SIGTERM restart, a kill -9 restart from the
//! idle snapshot, and a corrupt snapshot (files only, said so). What cannot be saved (a
//! socket, a timer, a function closing over local state) is named with its reason.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::serve::Serve;
use serde_json::{json, Value};

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

fn post(c: &reqwest::blocking::Client, url: String, body: Value) -> (u16, Value) {
    let r = c.post(url).json(&body).send().expect("POST");
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

fn create_js(c: &reqwest::blocking::Client, srv: &Serve) -> String {
    let (status, s) = post(
        c,
        format!("{}/v1/sessions", srv.base),
        json!({"language": "javascript"}),
    );
    assert_eq!(status, 201, "{s}");
    s["id"].as_str().expect("id").to_owned()
}

fn execute(c: &reqwest::blocking::Client, srv: &Serve, id: &str, code: &str) -> Value {
    let (status, e) = post(
        c,
        format!("{}/v1/sessions/{id}/execute", srv.base),
        json!({ "code": code }),
    );
    assert_eq!(status, 200, "{e}");
    e
}

fn action(c: &reqwest::blocking::Client, srv: &Serve, id: &str, what: &str) -> (u16, Value) {
    post(
        c,
        format!("{}/v1/sessions/{id}/{what}", srv.base),
        json!({}),
    )
}

fn text(e: &Value) -> String {
    e["results"][0]["data"]["text/plain"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn sorted_names(restored: &Value) -> Vec<String> {
    let mut names: Vec<String> = restored["names"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn skipped(restored: &Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = restored["skipped"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        s["name"].as_str().unwrap_or_default().to_owned(),
                        s["reason"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// No warm sessions and no prepared one-shots: the tests count the server's processes,
/// mounts and cgroups, which only their own sessions may hold.
fn serve(data: &Path) -> Serve {
    common::serve::serve(data, &["--warm-sessions", "0", "--warm-one-shots", "0"])
}

/// A session's state of every kind the issue names: a Map, a typed array, a Date, a nested
/// (cyclic) object, a class and its instance, functions, and a socket and a timer.
const STATE: &str = r#"
const scores = new Map([['ada', 3], ['bob', { tries: [1, 2] }]]);
const samples = new Float64Array([0.5, 1.5, 2.5]);
const when = new Date(Date.UTC(2026, 0, 2));
const config = { name: 'run', nested: { deep: { n: 10n } }, tags: new Set(['x']) };
config.nested.up = config;
let hits = 2;
class Account {
  constructor(owner, balance) { this.owner = owner; this.balance = balance; }
  deposit(n) { this.balance += n; return this.balance; }
}
const acct = new Account('ada', 100);
function fee(n) { return n * 0.1 + hits; }
const double = (x) => x * 2;
function makeCounter() { let n = 0; return () => ++n; }
const next = makeCounter();
const sock = new (require('net').Socket)();
const timer = setInterval(() => {}, 1 << 30);
require('fs').writeFileSync('kept.txt', 'file kept');
"#;

const CHECK: &str = "JSON.stringify([scores.get('bob').tries, scores.size, Array.from(samples), \
    samples instanceof Float64Array, when.toISOString(), String(config.nested.deep.n), \
    config.nested.up === config, [...config.tags], hits, acct instanceof Account, acct.deposit(5), \
    fee(10), double(21), require('fs').readFileSync('kept.txt', 'utf8')])";

fn checked(balance: u32) -> String {
    format!(
        "'[[1,2],2,[0.5,1.5,2.5],true,\"2026-01-02T00:00:00.000Z\",\"10\",true,[\"x\"],2,true,{balance},3,42,\"file kept\"]'"
    )
}

const NAMES: [&str; 10] = [
    "Account",
    "acct",
    "config",
    "double",
    "fee",
    "hits",
    "makeCounter",
    "samples",
    "scores",
    "when",
];

fn expected_skipped() -> Vec<(String, String)> {
    vec![
        (
            "next".into(),
            "a function closing over local state (Closure (makeCounter): n): its source alone cannot re-create it"
                .into(),
        ),
        ("sock".into(), "a socket (Socket)".into()),
        ("timer".into(), "a timer (Timeout)".into()),
    ]
}

#[test]
fn javascript_state_survives_pause_resume_and_fork() {
    let data = common::serve::data_dir("runcell-durable-js-");
    let c = http();
    let srv = serve(&data);
    let id = create_js(&c, &srv);
    let e = execute(&c, &srv, &id, STATE);
    assert_eq!(e["status"], "ok", "{e}");
    assert_eq!(text(&execute(&c, &srv, &id, "next(); next()")), "2");

    let (status, s) = action(&c, &srv, &id, "pause");
    assert_eq!((status, s["status"].as_str()), (200, Some("paused")), "{s}");
    let (status, r) = action(&c, &srv, &id, "resume");
    assert_eq!(status, 200, "{r}");
    let restored = &r["restored"];
    assert_eq!(sorted_names(restored), NAMES, "{restored}");
    assert_eq!(skipped(restored), expected_skipped(), "{restored}");
    assert_eq!(restored.get("files_only"), None, "{restored}");
    let e = execute(&c, &srv, &id, CHECK);
    assert_eq!(text(&e), checked(105), "{e}");
    assert_eq!(e.get("restored"), None, "said by the explicit resume: {e}");
    // What was skipped is not there (and says so at use, as any undeclared name).
    let e = execute(&c, &srv, &id, "typeof next + typeof sock + typeof timer");
    assert_eq!(text(&e), "'undefinedundefinedundefined'", "{e}");
    // A restored const stays const; a cell may declare it again (REPL rules).
    let e = execute(&c, &srv, &id, "samples = 1");
    assert_eq!(e["error"]["name"], "TypeError", "{e}");

    // Paused again, any request resumes it: the first Execution says what came back.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let e = execute(&c, &srv, &id, CHECK);
    assert_eq!(text(&e), checked(110), "{e}");
    assert_eq!(sorted_names(&e["restored"]), NAMES, "{e}");

    // Fork: the variables too, and the two are independent afterwards. What the first pause
    // skipped is gone from the session; a timer made since is named again.
    execute(&c, &srv, &id, "const later = setTimeout(() => {}, 1 << 30)");
    let (status, fork) = action(&c, &srv, &id, "fork");
    assert_eq!(status, 201, "{fork}");
    let fid = fork["id"].as_str().expect("id").to_owned();
    assert_eq!(sorted_names(&fork["restored"]), NAMES, "{fork}");
    assert_eq!(
        skipped(&fork["restored"]),
        [("later".to_owned(), "a timer (Timeout)".to_owned())],
        "{fork}"
    );
    let e = execute(&c, &srv, &fid, CHECK);
    assert_eq!(text(&e), checked(115), "{e}");
    execute(&c, &srv, &fid, "scores.set('eve', 9); hits = 50");
    let e = execute(
        &c,
        &srv,
        &id,
        "JSON.stringify([scores.has('eve'), hits, acct.balance])",
    );
    assert_eq!(text(&e), "'[false,2,110]'", "{e}");
    let e = execute(
        &c,
        &srv,
        &fid,
        "JSON.stringify([scores.get('eve'), fee(0)])",
    );
    assert_eq!(text(&e), "'[9,50]'", "{e}");
}

#[test]
fn javascript_state_survives_a_sigterm_and_a_kill9_restart() {
    let data = common::serve::data_dir("runcell-durable-js-restart-");
    let c = http();
    let first = serve(&data);
    let id = create_js(&c, &first);
    assert_eq!(execute(&c, &first, &id, STATE)["status"], "ok");
    drop(first); // SIGTERM: pauses every live session
    assert!(data.join("snapshots").join(format!("{id}.snap")).exists());
    let mut second = serve(&data);
    let e = execute(&c, &second, &id, CHECK);
    assert_eq!(text(&e), checked(105), "{e}");
    assert_eq!(sorted_names(&e["restored"]), NAMES, "{e}");
    assert_eq!(skipped(&e["restored"]), expected_skipped(), "{e}");
    assert_eq!(e["restored"].get("lost_executions"), None, "{e}");

    // kill -9: the idle snapshot (taken a few seconds after the last cell) comes back, and
    // the execution after it is named as lost.
    let v = execute(&c, &second, &id, "let v = 1");
    assert_eq!(v["status"], "ok", "{v}");
    let desc = data.join("snapshots").join(format!("{id}.json"));
    let taken = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let before = taken(&desc);
    let deadline = Instant::now() + Duration::from_secs(20);
    while taken(&desc) == before {
        assert!(Instant::now() < deadline, "no idle snapshot");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    let lost = execute(&c, &second, &id, "v = 2");
    second.kill9();
    let third = serve(&data);
    let e = execute(&c, &third, &id, "JSON.stringify([v, hits, acct.balance])");
    assert_eq!(text(&e), "'[1,2,105]'", "{e}");
    assert_eq!(e["restored"]["lost_executions"], json!([lost["id"]]), "{e}");
}

#[test]
fn a_corrupt_javascript_snapshot_resumes_with_files_only_and_says_so() {
    let data = common::serve::data_dir("runcell-durable-js-corrupt-");
    let c = http();
    let srv = serve(&data);
    let id = create_js(&c, &srv);
    execute(
        &c,
        &srv,
        &id,
        "const x = {v: 5}; require('fs').writeFileSync('a.txt', 'a')",
    );
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let snap = data.join("snapshots").join(format!("{id}.snap"));
    let mut bytes = std::fs::read(&snap).expect("snapshot on disk");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&snap, &bytes).expect("corrupt it");
    let (status, r) = action(&c, &srv, &id, "resume");
    assert_eq!(status, 200, "{r}");
    assert_eq!(
        r["restored"]["files_only"],
        "the snapshot is corrupt: its checksum does not match its content",
        "{r}"
    );
    assert_eq!(sorted_names(&r["restored"]), Vec::<String>::new(), "{r}");
    let e = execute(&c, &srv, &id, "require('fs').readFileSync('a.txt', 'utf8')");
    assert_eq!(text(&e), "'a'", "{e}");
    let e = execute(&c, &srv, &id, "x");
    assert_eq!(e["error"]["name"], "ReferenceError", "{e}");

    // Control: an intact snapshot of the same session restores.
    execute(&c, &srv, &id, "const x = {v: 7}");
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let e = execute(&c, &srv, &id, "x.v");
    assert_eq!(text(&e), "7", "{e}");
    assert_eq!(sorted_names(&e["restored"]), ["x"], "{e}");
}

/// A workspace full to its last block: Node's ENOSPC from the snapshot is the storage's
/// fault (507), and the session keeps running with its state; with room again, it pauses.
#[test]
fn a_full_workspace_keeps_a_javascript_session_running() {
    let data = common::serve::data_dir("runcell-durable-js-full-");
    let c = http();
    let srv = serve(&data);
    let (status, s) = post(
        &c,
        format!("{}/v1/sessions", srv.base),
        json!({"language": "javascript", "limits": {"disk_mb": 16}}),
    );
    assert_eq!(status, 201, "{s}");
    let id = s["id"].as_str().expect("id").to_owned();
    let e = execute(
        &c,
        &srv,
        &id,
        "const big = new Float64Array(1 << 20).fill(1);\nconst fs = require('fs');\nlet code = null;\nconst fd = fs.openSync('fill', 'w');\ntry { const chunk = Buffer.alloc(65536, 120); for (;;) fs.writeSync(fd, chunk); } catch (e) { code = e.code; } finally { fs.closeSync(fd); }\ncode",
    );
    assert_eq!(text(&e), "'ENOSPC'", "{e}");
    let (status, err) = action(&c, &srv, &id, "pause");
    assert_eq!(status, 507, "{err}");
    assert_eq!(err["error"]["code"], "insufficient_storage", "{err}");
    let e = execute(
        &c,
        &srv,
        &id,
        "fs.unlinkSync('fill'); big.reduce((a, b) => a + b, 0)",
    );
    assert_eq!(text(&e), "1048576", "{e}");
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let e = execute(&c, &srv, &id, "big.length");
    assert_eq!(text(&e), "1048576", "{e}");
}
