//! Durable sessions through a real `runcell serve` (issue 17): pause and resume (explicit and
//! by any request), fork, a busy pause, a corrupt snapshot, auto-pause, a SIGTERM restart and
//! a kill -9 restart, and hostile probes against a resumed and a forked session.

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

fn create(c: &reqwest::blocking::Client, srv: &Serve, body: Value) -> String {
    let (status, s) = post(c, format!("{}/v1/sessions", srv.base), body);
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

fn get(c: &reqwest::blocking::Client, srv: &Serve, id: &str) -> Value {
    c.get(format!("{}/v1/sessions/{id}", srv.base))
        .send()
        .and_then(|r| r.json())
        .expect("GET session")
}

fn text(e: &Value) -> String {
    e["results"][0]["data"]["text/plain"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn names(restored: &Value) -> Vec<String> {
    restored["names"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn skipped(restored: &Value) -> Vec<(String, String)> {
    restored["skipped"]
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
        .unwrap_or_default()
}

const STATE: &str = r#"
import pandas as pd
df = pd.DataFrame({"a": range(1000), "b": [i * 0.5 for i in range(1000)]})
def f(x):
    return x * 3
g = lambda y: y + 100
class Counter:
    def __init__(self):
        self.n = 0
    def bump(self):
        self.n += 1
        return self.n
c = Counter()
c.bump()
fh = open("kept.txt", "w")
fh.write("file kept")
fh.flush()
gen = (i for i in range(3))
"#;

const CHECK: &str =
    "(int(df['a'].sum()), f(2), g(1), c.bump(), type(c).__name__, Counter().bump())";
const CHECKED: &str = "(499500, 6, 101, 2, 'Counter', 1)";

/// No warm sessions and no prepared one-shots: the tests count the server's processes,
/// mounts and cgroups, which only their own sessions may hold.
fn serve(data: &Path) -> Serve {
    common::serve::serve(data, &["--warm-sessions", "0", "--warm-one-shots", "0"])
}

#[test]
fn pause_and_resume_keep_variables_and_name_what_was_skipped() {
    let data = common::serve::data_dir("runcell-durable-pause-");
    let c = http();
    let srv = serve(&data);
    let id = create(&c, &srv, json!({}));
    let e = execute(&c, &srv, &id, STATE);
    assert_eq!(e["status"], "ok", "{e}");

    let (status, s) = action(&c, &srv, &id, "pause");
    assert_eq!(status, 200, "{s}");
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(get(&c, &srv, &id)["status"], "paused");
    // Its sandbox is gone: no process of its uid is left.
    let listed: Value = c
        .get(format!("{}/v1/sessions", srv.base))
        .send()
        .and_then(|r| r.json())
        .expect("list");
    assert!(
        listed["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .any(|s| s["id"] == id.as_str() && s["status"] == "paused"),
        "{listed}"
    );
    // Pausing a paused session changes nothing.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);

    let (status, r) = action(&c, &srv, &id, "resume");
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "ready", "{r}");
    let restored = &r["restored"];
    let got = names(restored);
    for n in ["df", "f", "g", "Counter", "c"] {
        assert!(got.contains(&n.to_owned()), "{n} restored: {restored}");
    }
    let skip = skipped(restored);
    for n in ["fh", "gen"] {
        assert!(
            skip.iter()
                .any(|(name, reason)| name == n && !reason.is_empty()),
            "{n} skipped with a reason: {restored}"
        );
        assert!(!got.contains(&n.to_owned()), "{restored}");
    }
    assert_eq!(restored.get("files_only"), None, "{restored}");
    let e = execute(&c, &srv, &id, CHECK);
    assert_eq!(text(&e), CHECKED, "{e}");
    // The explicit resume said it: the execution does not again.
    assert_eq!(e.get("restored"), None, "{e}");
    let e = execute(&c, &srv, &id, "open('kept.txt').read()");
    assert_eq!(text(&e), "'file kept'", "{e}");

    // Paused again, any request resumes it: the first Execution says what came back.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let e = execute(&c, &srv, &id, CHECK);
    assert_eq!(text(&e), "(499500, 6, 101, 3, 'Counter', 1)", "{e}");
    assert!(names(&e["restored"]).contains(&"df".to_owned()), "{e}");
    let e = execute(&c, &srv, &id, "1+1");
    assert_eq!(e.get("restored"), None, "only the first: {e}");

    // Files, commands and NDJSON streams resume it too.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let files: Value = c
        .get(format!("{}/v1/sessions/{id}/files", srv.base))
        .send()
        .and_then(|r| r.json())
        .expect("files");
    assert!(files["files"].to_string().contains("kept.txt"), "{files}");
    assert_eq!(get(&c, &srv, &id)["status"], "ready");
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let (status, out) = post(
        &c,
        format!("{}/v1/sessions/{id}/commands", srv.base),
        json!({"command": "cat kept.txt"}),
    );
    assert_eq!(
        (status, out["stdout"].as_str()),
        (200, Some("file kept")),
        "{out}"
    );
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let body = c
        .post(format!("{}/v1/sessions/{id}/execute", srv.base))
        .header("accept", "application/x-ndjson")
        .json(&json!({"code": "print(f(5))"}))
        .send()
        .and_then(|r| r.text())
        .expect("stream");
    let end: Value = body
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["type"] == "end")
        .expect("end event");
    assert_eq!(end["execution"]["stdout"], "15\n", "{body}");
    assert!(end["execution"]["restored"].is_object(), "{body}");
    // Upload into a paused session, then delete it: its workspace and snapshot go.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let put = c
        .put(format!("{}/v1/sessions/{id}/files/up.txt", srv.base))
        .body("up")
        .send()
        .expect("put");
    assert_eq!(put.status(), 201);
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    assert!(data.join("snapshots").join(format!("{id}.snap")).exists());
    let del = c
        .delete(format!("{}/v1/sessions/{id}", srv.base))
        .send()
        .expect("delete");
    assert_eq!(del.status(), 204);
    assert!(!data.join("snapshots").join(format!("{id}.snap")).exists());
    assert_eq!(
        c.get(format!("{}/v1/sessions/{id}", srv.base))
            .send()
            .expect("get")
            .status(),
        404
    );
}

#[test]
fn a_busy_session_is_not_paused_and_a_corrupt_snapshot_resumes_with_files_only() {
    let data = common::serve::data_dir("runcell-durable-busy-");
    let c = http();
    let srv = serve(&data);
    let id = create(&c, &srv, json!({}));
    execute(&c, &srv, &id, "x = 5\nopen('a.txt', 'w').write('a')");
    let base = srv.base.clone();
    let id2 = id.clone();
    let running = std::thread::spawn(move || {
        http()
            .post(format!("{base}/v1/sessions/{id2}/execute"))
            .json(&json!({"code": "import time; time.sleep(3); x += 1"}))
            .send()
            .and_then(|r| r.json::<Value>())
            .expect("long cell")
    });
    // Busy: refused at once (409 session_busy), never queued behind the cell.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if get(&c, &srv, &id)["status"] == "busy" {
            break;
        }
        assert!(Instant::now() < deadline, "the cell never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    let (status, err) = action(&c, &srv, &id, "pause");
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"]["code"], "session_busy", "{err}");
    assert!(t.elapsed() < Duration::from_secs(2), "not waited for");
    assert_eq!(running.join().expect("cell")["status"], "ok");
    // Idle again: paused.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);

    // A flipped byte: the kernel refuses the snapshot before unpickling; the files are back.
    let snap = data.join("snapshots").join(format!("{id}.snap"));
    let mut bytes = std::fs::read(&snap).expect("snapshot on disk");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&snap, &bytes).expect("corrupt it");
    let (status, r) = action(&c, &srv, &id, "resume");
    assert_eq!(status, 200, "{r}");
    let why = r["restored"]["files_only"].as_str().unwrap_or_default();
    assert!(why.contains("corrupt"), "{r}");
    assert!(names(&r["restored"]).is_empty(), "{r}");
    let e = execute(&c, &srv, &id, "print(open('a.txt').read())\nx");
    assert_eq!(e["stdout"], "a\n", "{e}");
    assert_eq!(e["error"]["name"], "NameError", "{e}");

    // Control: an intact snapshot of the same session restores.
    execute(&c, &srv, &id, "x = 7");
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let e = execute(&c, &srv, &id, "x");
    assert_eq!(text(&e), "7", "{e}");

    // Truncated: refused too.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let bytes = std::fs::read(&snap).expect("snapshot");
    std::fs::write(&snap, &bytes[..bytes.len() / 3]).expect("truncate");
    let e = execute(&c, &srv, &id, "x");
    let why = e["restored"]["files_only"].as_str().unwrap_or_default();
    assert!(why.contains("truncated"), "{e}");
    assert_eq!(e["error"]["name"], "NameError", "{e}");
}

#[test]
fn a_fork_copies_files_and_variables_and_is_independent() {
    let data = common::serve::data_dir("runcell-durable-fork-");
    let c = http();
    let srv = serve(&data);
    let id = create(&c, &srv, json!({"metadata": {"who": "source"}}));
    execute(
        &c,
        &srv,
        &id,
        "import os\nx = [1, 2]\nos.makedirs('d', exist_ok=True)\nopen('d/a.txt', 'w').write('a')",
    );
    let (status, fork) = action(&c, &srv, &id, "fork");
    assert_eq!(status, 201, "{fork}");
    let fid = fork["id"].as_str().expect("id").to_owned();
    assert_ne!(fid, id);
    assert_eq!(fork["metadata"]["who"], "source", "{fork}");
    assert!(names(&fork["restored"]).contains(&"x".to_owned()), "{fork}");
    let e = execute(&c, &srv, &fid, "print(open('d/a.txt').read())\nx");
    assert_eq!(
        (e["stdout"].as_str(), text(&e).as_str()),
        (Some("a\n"), "[1, 2]"),
        "{e}"
    );
    // Independent: each changes its own.
    execute(
        &c,
        &srv,
        &fid,
        "x.append(3)\nopen('d/a.txt', 'w').write('fork')\nopen('new.txt', 'w').write('n')",
    );
    let e = execute(
        &c,
        &srv,
        &id,
        "import os\nprint(open('d/a.txt').read(), os.path.exists('new.txt'))\nx",
    );
    assert_eq!(
        (e["stdout"].as_str(), text(&e).as_str()),
        (Some("a False\n"), "[1, 2]"),
        "{e}"
    );
    execute(&c, &srv, &id, "x.append(99)");
    let e = execute(&c, &srv, &fid, "x");
    assert_eq!(text(&e), "[1, 2, 3]", "{e}");
    // A paused source forks too (it is resumed first).
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let (status, fork2) = action(&c, &srv, &id, "fork");
    assert_eq!(status, 201, "{fork2}");
    let e = execute(&c, &srv, fork2["id"].as_str().expect("id"), "x");
    assert_eq!(text(&e), "[1, 2, 99]", "{e}");
}

#[test]
fn an_idle_session_pauses_by_itself() {
    let data = common::serve::data_dir("runcell-durable-auto-");
    let c = http();
    let srv = serve(&data);
    let id = create(&c, &srv, json!({"limits": {"pause_after_s": 2}}));
    let s = get(&c, &srv, &id);
    assert_eq!(s["limits"]["pause_after_s"], 2, "{s}");
    assert_eq!(s["limits"]["expire_after_s"], 30 * 24 * 3600, "{s}");
    execute(&c, &srv, &id, "y = 'still here'");
    let deadline = Instant::now() + Duration::from_secs(15);
    while get(&c, &srv, &id)["status"] != "paused" {
        assert!(Instant::now() < deadline, "never paused");
        std::thread::sleep(Duration::from_millis(200));
    }
    let e = execute(&c, &srv, &id, "y");
    assert_eq!(text(&e), "'still here'", "{e}");
    // Past the server's maximum: refused, naming it.
    let (status, err) = post(
        &c,
        format!("{}/v1/sessions", srv.base),
        json!({"limits": {"expire_after_s": 400 * 24 * 3600}}),
    );
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("expire_after_s"),
        "{err}"
    );
}

#[test]
fn a_sigterm_restart_keeps_variables() {
    let data = common::serve::data_dir("runcell-durable-sigterm-");
    let c = http();
    let first = serve(&data);
    let id = create(&c, &first, json!({}));
    execute(
        &c,
        &first,
        &id,
        "import numpy as np\na = np.arange(10)\nopen('f.txt', 'w').write('f')",
    );
    drop(first); // SIGTERM: pauses every live session
    assert!(data.join("snapshots").join(format!("{id}.snap")).exists());
    let second = serve(&data);
    assert_eq!(get(&c, &second, &id)["status"], "paused");
    let e = execute(
        &c,
        &second,
        &id,
        "print(open('f.txt').read())\nint(a.sum())",
    );
    assert_eq!(
        (e["stdout"].as_str(), text(&e).as_str()),
        (Some("f\n"), "45"),
        "{e}"
    );
    assert!(names(&e["restored"]).contains(&"a".to_owned()), "{e}");
    assert_eq!(
        e["restored"].get("lost_executions"),
        None,
        "nothing lost: {e}"
    );
}

/// The environment across a restart: the session's `env` given at its create and what cells
/// changed in `os.environ` (Python); a Bash session's variables (exported or not), functions,
/// aliases and working directory. Each checked against a session that never had them.
#[test]
fn a_restart_keeps_the_environment_and_bash_state() {
    let data = common::serve::data_dir("runcell-durable-env-");
    let c = http();
    let first = serve(&data);
    let py = create(
        &c,
        &first,
        json!({"env": {"GIVEN": "at create", "CHANGED": "old", "REMOVED": "soon"}}),
    );
    let e = execute(
        &c,
        &first,
        &py,
        "import os\nos.environ['CHANGED'] = 'new'\nos.environ['ADDED'] = 'in a cell'\ndel os.environ['REMOVED']",
    );
    assert_eq!(e["status"], "ok", "{e}");
    let sh = create(
        &c,
        &first,
        json!({"language": "bash", "env": {"GIVEN": "to bash"}}),
    );
    let e = execute(
        &c,
        &first,
        &sh,
        "export EXPORTED=ex; PLAIN=pl; declare -a ARR=(a 'b c'); greet() { echo \"hello $1\"; }; alias say='echo said'; mkdir -p sub/dir && cd sub/dir",
    );
    assert_eq!(e["status"], "ok", "{e}");
    // SIGTERM in between (a restart); the paused sessions come back paused.
    drop(first);
    let second = serve(&data);
    const ENV: &str = "import os\n(os.environ.get('GIVEN'), os.environ.get('CHANGED'), os.environ.get('ADDED'), os.environ.get('REMOVED'))";
    let e = execute(&c, &second, &py, ENV);
    assert_eq!(text(&e), "('at create', 'new', 'in a cell', None)", "{e}");
    assert!(
        names(&e["restored"]).contains(&"os.environ".to_owned()),
        "{e}"
    );
    const SH: &str =
        "echo \"$GIVEN|$EXPORTED|$PLAIN|${ARR[1]}|$(printenv EXPORTED)\"; greet you; say; pwd";
    let e = execute(&c, &second, &sh, SH);
    assert_eq!(
        e["stdout"], "to bash|ex|pl|b c|ex\nhello you\nsaid\n/workspace/sub/dir\n",
        "{e}"
    );
    let restored = names(&e["restored"]);
    for name in ["EXPORTED", "PLAIN", "ARR", "greet()", "alias say", "cwd"] {
        assert!(restored.contains(&name.to_owned()), "{name}: {e}");
    }
    // Controls: fresh sessions have none of it.
    let fresh = create(&c, &second, json!({}));
    let e = execute(&c, &second, &fresh, ENV);
    assert_eq!(text(&e), "(None, None, None, None)", "{e}");
    let fresh = create(&c, &second, json!({"language": "bash"}));
    let e = execute(
        &c,
        &second,
        &fresh,
        "echo \"[$EXPORTED|$PLAIN]\"; type greet >/dev/null 2>&1 || echo no-greet; pwd",
    );
    assert_eq!(e["stdout"], "[|]\nno-greet\n/workspace\n", "{e}");
    // A kill -9 brings the create's env back too (kept at the first idle snapshot).
    let mut second = second;
    let again = create(&c, &second, json!({"env": {"AFTER_KILL": "kept"}}));
    execute(&c, &second, &again, "v = 1");
    let kept = data.join("snapshots").join(format!("{again}.env"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !kept.exists()
        || !data
            .join("snapshots")
            .join(format!("{again}.json"))
            .exists()
    {
        assert!(Instant::now() < deadline, "no idle snapshot");
        std::thread::sleep(Duration::from_millis(100));
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&kept)
        .expect("env file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the env may hold secrets");
    second.kill9();
    let third = serve(&data);
    let e = execute(
        &c,
        &third,
        &again,
        "import os\nos.environ.get('AFTER_KILL'), v",
    );
    assert_eq!(text(&e), "('kept', 1)", "{e}");
}

#[test]
fn a_kill9_restart_restores_the_idle_snapshot_and_names_lost_executions() {
    let data = common::serve::data_dir("runcell-durable-kill9-");
    let c = http();
    let mut first = serve(&data);
    let id = create(&c, &first, json!({}));
    execute(&c, &first, &id, "v = 1");
    // Idle for a few seconds: the idle snapshot is taken (off the request path).
    let desc = data.join("snapshots").join(format!("{id}.json"));
    let deadline = Instant::now() + Duration::from_secs(15);
    while !desc.exists() {
        assert!(Instant::now() < deadline, "no idle snapshot");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    let lost = execute(
        &c,
        &first,
        &id,
        "v = 2\nopen('after.txt', 'w').write('kept')",
    );
    first.kill9();
    let second = serve(&data);
    assert_eq!(get(&c, &second, &id)["status"], "paused");
    let e = execute(&c, &second, &id, "print(open('after.txt').read())\nv");
    assert_eq!(e["stdout"], "kept\n", "files are intact: {e}");
    assert_eq!(text(&e), "1", "variables from the idle snapshot: {e}");
    assert_eq!(e["restored"]["lost_executions"], json!([lost["id"]]), "{e}");
}

#[test]
fn hostile_probes_fail_the_same_in_a_resumed_and_a_forked_session() {
    let data = common::serve::data_dir("runcell-durable-hostile-");
    let c = http();
    let srv = serve(&data);
    let id = create(&c, &srv, json!({}));
    execute(&c, &srv, &id, "z = 1");
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    assert_eq!(action(&c, &srv, &id, "resume").0, 200);
    let (status, fork) = action(&c, &srv, &id, "fork");
    assert_eq!(status, 201, "{fork}");
    let fid = fork["id"].as_str().expect("id").to_owned();
    let s = |v: &[&str]| v.iter().map(|x| (*x).to_owned()).collect::<Vec<String>>();
    // Each with what the host says (the probe reaches the kernel there).
    let table: Vec<(&str, Vec<String>, &str, &str)> = vec![
        (
            "mount",
            s(&["/nonexistent-probe"]),
            "errno:EPERM",
            "errno:ENOENT",
        ),
        ("unshare_user", s(&[]), "errno:EPERM", "ok"),
        ("ptrace_traceme", s(&[]), "errno:EPERM", "ok"),
        ("socket", s(&["packet", "raw"]), "errno:EPERM", "ok"),
        ("process_vm_readv", s(&[]), "errno:EPERM", "ok"),
        // Positive controls inside: a plain fork and an ordinary socket still work.
        ("clone_plain", s(&[]), "ok", "ok"),
        ("socket", s(&["inet", "stream"]), "ok", "ok"),
    ];
    let probes: Vec<(&str, Vec<String>)> =
        table.iter().map(|(n, a, _, _)| (*n, a.clone())).collect();
    for session in [&id, &fid] {
        let e = execute(&c, &srv, session, &common::probe_program(&probes));
        assert_eq!(e["status"], "ok", "{e}");
        let got = common::parse_probes(e["stdout"].as_str().unwrap_or_default());
        assert_eq!(got.len(), table.len(), "{e}");
        for ((name, args, inside, _), (_, _, result, detail)) in table.iter().zip(&got) {
            assert_eq!(result, inside, "{session} {name} {args:?}: {detail}");
        }
        // Its own uid, as every session: the fork does not share the source's.
        let e = execute(&c, &srv, session, "import os\nos.getuid(), z");
        assert_eq!(text(&e), "(1000, 1)", "{e}");
    }
    for (name, args, _, host) in &table {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(
            common::control(name, &args).0,
            *host,
            "host {name} {args:?}"
        );
    }
    let uid = |id: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(data.join("workspaces").join(id))
            .expect("workspace")
            .uid()
    };
    assert_ne!(uid(&id), uid(&fid), "a fork runs as another host uid");
}

/// Whether `path` is a mount point now (in this process's mount namespace, the server's).
fn mounted(path: &Path) -> bool {
    let want = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| Path::new(m) == want)
}

#[test]
fn a_session_paused_for_a_while_holds_no_mount_and_still_resumes() {
    let data = common::serve::data_dir("runcell-durable-unmount-");
    let c = http();
    let srv = serve(&data);
    let id = create(&c, &srv, json!({}));
    execute(&c, &srv, &id, "w = 'back'\nopen('f.txt', 'w').write('f')");
    let ws = data.join("workspaces").join(&id);
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    assert!(mounted(&ws), "control: mounted right after the pause");
    // Unmounted 30 s after the pause (the expiry thread looks every second).
    let deadline = Instant::now() + Duration::from_secs(45);
    while mounted(&ws) {
        assert!(Instant::now() < deadline, "still mounted");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(data
        .join("workspace-images")
        .join(format!("{id}.ext4"))
        .exists());
    let e = execute(&c, &srv, &id, "print(open('f.txt').read())\nw");
    assert_eq!(
        (e["stdout"].as_str(), text(&e).as_str()),
        (Some("f\n"), "'back'"),
        "{e}"
    );
    assert!(mounted(&ws), "mounted again at the resume");
    // Deleting a paused, unmounted session removes its image too.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);
    let deadline = Instant::now() + Duration::from_secs(45);
    while mounted(&ws) {
        assert!(Instant::now() < deadline, "still mounted");
        std::thread::sleep(Duration::from_millis(250));
    }
    let del = c
        .delete(format!("{}/v1/sessions/{id}", srv.base))
        .send()
        .expect("delete");
    assert_eq!(del.status(), 204);
    let deadline = Instant::now() + Duration::from_secs(20);
    while data
        .join("workspace-images")
        .join(format!("{id}.ext4"))
        .exists()
    {
        assert!(Instant::now() < deadline, "image left");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!ws.exists());
}

#[test]
fn a_full_workspace_keeps_the_session_running_and_a_removed_runtime_is_a_clear_error() {
    let data = common::serve::data_dir("runcell-durable-faults-");
    // The runtime as a link of this data dir's own, so that removing it removes it for this
    // server only.
    let shared = std::fs::read_link(data.join("runtimes")).expect("runtimes link");
    std::fs::remove_file(data.join("runtimes")).expect("unlink");
    std::fs::create_dir(data.join("runtimes")).expect("runtimes dir");
    let mut names = Vec::new();
    for e in std::fs::read_dir(&shared).expect("runtimes").flatten() {
        std::os::unix::fs::symlink(e.path(), data.join("runtimes").join(e.file_name()))
            .expect("link a runtime");
        names.push(e.file_name());
    }
    let c = http();
    let srv = serve(&data);

    // A workspace full to its last block: the snapshot finds no room, 507, and the session
    // keeps running with its state.
    let id = create(&c, &srv, json!({"limits": {"disk_mb": 16}}));
    let e = execute(
        &c,
        &srv,
        &id,
        "import numpy as np\nbig = np.ones(1 << 20)\ntry:\n    with open('fill', 'wb') as f:\n        while True:\n            f.write(b'x' * 65536)\n            f.flush()\nexcept OSError as e:\n    print(e.errno)",
    );
    assert_eq!(e["stdout"], "28\n", "{e}");
    let (status, err) = action(&c, &srv, &id, "pause");
    assert_eq!(status, 507, "{err}");
    assert_eq!(err["error"]["code"], "insufficient_storage", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("keeps running"),
        "{err}"
    );
    assert_eq!(get(&c, &srv, &id)["status"], "ready");
    let e = execute(
        &c,
        &srv,
        &id,
        "import os\nos.remove('fill')\nint(big.sum())",
    );
    assert_eq!(text(&e), "1048576", "{e}");
    // Control: with room again, it pauses.
    assert_eq!(action(&c, &srv, &id, "pause").0, 200);

    // Its runtime removed while it is paused: a resume says so, and works once it is back.
    for n in &names {
        std::fs::remove_file(data.join("runtimes").join(n)).expect("remove the runtime");
    }
    let (status, err) = action(&c, &srv, &id, "resume");
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"]["code"], "conflict", "{err}");
    let msg = err["error"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("runtime") && msg.contains("runcell runtime install"),
        "{err}"
    );
    assert_eq!(get(&c, &srv, &id)["status"], "paused");
    for n in &names {
        std::os::unix::fs::symlink(shared.join(n), data.join("runtimes").join(n)).expect("relink");
    }
    let e = execute(&c, &srv, &id, "int(big.sum())");
    assert_eq!(text(&e), "1048576", "{e}");
}

/// Every process under `pid` (children, their children...).
fn descendants(pid: u32) -> Vec<u32> {
    let mut children: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // After the command's ") ": state, then the parent's pid.
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if let Some(pp) = ppid {
            children.entry(pp).or_default().push(p);
        }
    }
    let (mut out, mut todo) = (Vec::new(), vec![pid]);
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).map(Vec::as_slice).unwrap_or_default() {
            out.push(c);
            todo.push(c);
        }
    }
    out
}

/// What the descriptors of process `pid` point at.
fn open_fds(pid: u32) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect()
}

/// Mount points under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(&dir))
        .map(str::to_owned)
        .collect()
}

/// Loop devices whose backing file is under `dir`.
fn loop_devices_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let Ok(blocks) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    blocks
        .flatten()
        .filter_map(|b| {
            let backing = std::fs::read_to_string(b.path().join("loop/backing_file")).ok()?;
            Path::new(backing.trim())
                .starts_with(&dir)
                .then(|| b.file_name().to_string_lossy().into_owned())
        })
        .collect()
}

/// Per-run cgroup directories of host uid `uid` (`rc-<uid>-…` under every hierarchy's
/// `runcell` directory).
fn cgroups_of(uid: u32) -> Vec<std::path::PathBuf> {
    let prefix = format!("rc-{uid}-");
    let mut found = Vec::new();
    let roots = ["/sys/fs/cgroup/runcell".to_owned()].into_iter().chain(
        std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| format!("{}/runcell", e.path().display())),
    );
    for root in roots {
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(e.path());
            }
        }
    }
    found
}

/// Issue 17's "a paused session costs no sandbox and no memory", counted: 50 paused sessions
/// leave no process, no cgroup, no workspace mount and no loop device behind (each checked
/// present while they are live: the control), and of the server's descriptors exactly one
/// each, its uid lease; the listing shows them all paused and each resumes with its own
/// variables.
#[test]
fn fifty_paused_sessions_hold_no_process_cgroup_mount_loop_device_or_descriptor() {
    use std::os::unix::fs::MetadataExt;
    const N: usize = 50;
    let data = common::serve::data_dir("runcell-durable-fifty-");
    let c = http();
    let srv = serve(&data);
    let pid = srv.child.id();
    let small = json!({"limits": {"memory_mb": 64, "disk_mb": 16}});
    // Warm up (the zygote, the store's connections), then the baseline.
    let first = create(&c, &srv, small.clone());
    execute(&c, &srv, &first, "1");
    let del = c
        .delete(format!("{}/v1/sessions/{first}", srv.base))
        .send()
        .expect("delete");
    assert_eq!(del.status(), 204);
    std::thread::sleep(Duration::from_secs(1));
    let (procs0, fds0) = (descendants(pid).len(), open_fds(pid));
    let workspaces = data.join("workspaces");
    let images = data.join("workspace-images");
    let mut ids = Vec::new();
    let mut uids = Vec::new();
    for i in 0..N {
        let id = create(&c, &srv, small.clone());
        let e = execute(&c, &srv, &id, &format!("v = {i} * 7"));
        assert_eq!(e["status"], "ok", "{e}");
        uids.push(
            std::fs::metadata(workspaces.join(&id))
                .expect("workspace")
                .uid(),
        );
        ids.push(id);
    }
    // The control: live, each has its processes, its cgroup and its mounted image.
    assert!(descendants(pid).len() >= procs0 + N, "a sandbox each");
    assert!(
        uids.iter().all(|u| !cgroups_of(*u).is_empty()),
        "a cgroup each"
    );
    assert!(mounts_under(&workspaces).len() >= N, "mounted");
    let session_loops = || {
        loop_devices_under(&images)
            .len()
            .saturating_sub(loop_devices_under(&images.join("spares")).len())
    };
    assert!(session_loops() >= N, "a loop device each");
    for id in &ids {
        let (status, body) = action(&c, &srv, id, "pause");
        assert_eq!(status, 200, "pause {id}: {body}");
    }
    // Unmounted 30 s after their pause (UNMOUNT_AFTER), by the expiry thread.
    let deadline = Instant::now() + Duration::from_secs(90);
    while !mounts_under(&workspaces).is_empty() {
        assert!(
            Instant::now() < deadline,
            "still mounted: {:?}",
            mounts_under(&workspaces)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Sandboxes end off the pause's path: give the teardown threads a moment.
    let deadline = Instant::now() + Duration::from_secs(30);
    while descendants(pid).len() > procs0 {
        assert!(Instant::now() < deadline, "processes left");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A loop device is freed after its last unmount by the kernel's deferred autoclear.
    let deadline = Instant::now() + Duration::from_secs(30);
    while session_loops() > 0 {
        assert!(
            Instant::now() < deadline,
            "loop devices left: {:?}",
            loop_devices_under(&images)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for u in &uids {
        assert_eq!(cgroups_of(*u), Vec::<std::path::PathBuf>::new(), "uid {u}");
    }
    // The one descriptor a paused session keeps: its uid's lease, a lock on
    // `<run dir>/uids/<uid>` (the image's files are that uid's; a lock, so a killed server's
    // leases free themselves). Nothing else was left open.
    let fds = open_fds(pid);
    let leases: Vec<u32> = fds
        .iter()
        .filter(|p| p.parent().and_then(|d| d.file_name()) == Some("uids".as_ref()))
        .filter_map(|p| p.file_name()?.to_str()?.parse().ok())
        .collect();
    for u in &uids {
        assert_eq!(
            leases.iter().filter(|l| *l == u).count(),
            1,
            "uid {u}'s lease: {fds:?}"
        );
    }
    let others = fds.len() - leases.len();
    assert!(
        others <= fds0.len() + 4,
        "{others} descriptors besides the leases, {} before: {fds:?}",
        fds0.len()
    );
    // Listing: all of them, paused.
    let list: Value = c
        .get(format!("{}/v1/sessions", srv.base))
        .send()
        .and_then(|r| r.json())
        .expect("list");
    let paused: Vec<&str> = list["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter(|s| s["status"] == "paused")
        .filter_map(|s| s["id"].as_str())
        .collect();
    for id in &ids {
        assert!(paused.contains(&id.as_str()), "{id} listed paused");
    }
    // And each resumes with its own state: the first by a cell, the last explicitly.
    let e = execute(&c, &srv, &ids[0], "v");
    assert_eq!(text(&e), "0", "{e}");
    let (status, r) = action(&c, &srv, &ids[N - 1], "resume");
    assert_eq!(status, 200, "{r}");
    assert!(names(&r["restored"]).contains(&"v".to_owned()), "{r}");
    let e = execute(&c, &srv, &ids[N - 1], "v");
    assert_eq!(text(&e), ((N - 1) * 7).to_string(), "{e}");
}
