//! `runcell serve`, `keys` and `audit` as an operator uses them: the real binary, a real
//! database file, `kill -9` in the middle of work.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::serve::{free_port, runcell, Serve, UnmountOnDrop};
use serde_json::{json, Value};

fn data_dir() -> common::serve::DataDir {
    common::serve::data_dir("runcell-serve-test-")
}

fn serve(data: &Path) -> Serve {
    serve_with(data, &[])
}

/// [`serve`] with more flags.
fn serve_with(data: &Path, flags: &[&str]) -> Serve {
    common::serve::serve(data, flags)
}

/// Sends `code` to a session from another thread, ignoring the outcome (the server is about to
/// be killed under it).
fn execute_in_background(base: &str, id: &str, code: &str) -> std::thread::JoinHandle<()> {
    let url = format!("{base}/v1/sessions/{id}/execute");
    let body = json!({ "code": code });
    std::thread::spawn(move || {
        let _ = http().post(url).json(&body).send();
    })
}

/// GET `url` as JSON; `what` names it in a failure.
fn get_json(c: &reqwest::blocking::Client, url: String, what: &str) -> Value {
    c.get(url).send().and_then(|r| r.json()).expect(what)
}

/// POST `body` to `url` and read the JSON reply; `what` names it in a failure.
fn post_json(c: &reqwest::blocking::Client, url: String, body: &Value, what: &str) -> Value {
    c.post(url)
        .json(body)
        .send()
        .and_then(|r| r.json())
        .expect(what)
}

/// A process's scheduling policy (0 SCHED_OTHER, 3 SCHED_BATCH), from `/proc/PID/stat`.
fn sched_policy(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after_comm = stat.rsplit_once(')').expect("comm").1;
    // Field 41 of stat; fields 3.. follow the command name.
    after_comm
        .split_whitespace()
        .nth(41 - 3)
        .and_then(|f| f.parse().ok())
        .expect("policy")
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

#[test]
fn kill_9_loses_no_acknowledged_execution_and_sessions_recover() {
    let data = data_dir();
    // Its recovered session is paused, and a paused session's image stays mounted at a stop.
    let _unmount = UnmountOnDrop(data.to_path_buf());
    let c = http();
    let first = serve(&data);
    let session: Value = post_json(
        &c,
        format!("{}/v1/sessions", first.base),
        &json!({"metadata": {"test": "crash"}}),
        "create",
    );
    let id = session["id"].as_str().expect("id").to_owned();
    let put = c
        .put(format!("{}/v1/sessions/{id}/files/upload.txt", first.base))
        .body("uploaded before the crash")
        .send()
        .expect("upload");
    assert_eq!(put.status(), 201);
    let mut acknowledged = Vec::new();
    for i in 0..5 {
        let e: Value = post_json(
            &c,
            format!("{}/v1/sessions/{id}/execute", first.base),
            &json!({"code": format!("x = {i}\nopen('cell{i}.txt', 'w').write('{i}')")}),
            "execute",
        );
        assert_eq!(e["status"], "ok", "{e}");
        acknowledged.push(e["id"].as_str().expect("id").to_owned());
    }
    // Work in flight when the server dies.
    let inflight = execute_in_background(&first.base, &id, "import time; time.sleep(30)");
    std::thread::sleep(Duration::from_millis(500));
    let mut first = first;
    first.kill9();
    let _ = inflight.join();

    let second = serve(&data);
    let list: Value = get_json(
        &c,
        format!("{}/v1/executions?limit=100", second.base),
        "executions",
    );
    let listed: Vec<&str> = list["executions"]
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|e| e["id"].as_str())
        .collect();
    for id in &acknowledged {
        assert!(
            listed.contains(&id.as_str()),
            "acknowledged {id} was lost: {listed:?}"
        );
    }
    let verify: Value = get_json(&c, format!("{}/v1/audit/verify", second.base), "verify");
    assert_eq!(verify["ok"], true, "{verify}");
    // The session is not missing: it was recovered with its files, paused (durable sessions:
    // its next request resumes it, with a fresh kernel and what its last snapshot held).
    let s: Value = get_json(&c, format!("{}/v1/sessions/{id}", second.base), "session");
    assert_eq!(s["status"], "paused", "{s}");
    assert_eq!(s["metadata"]["test"], "crash");
    let body = c
        .get(format!("{}/v1/sessions/{id}/files/upload.txt", second.base))
        .send()
        .and_then(|r| r.text())
        .expect("download");
    assert_eq!(body, "uploaded before the crash");
    let e: Value = post_json(
        &c,
        format!("{}/v1/sessions/{id}/execute", second.base),
        &json!({"code": "import os\nprint(sorted(f for f in os.listdir() if f.startswith('cell')))\nx"}),
        "execute",
    );
    assert!(
        e["stdout"]
            .as_str()
            .unwrap_or_default()
            .contains("cell4.txt"),
        "{e}"
    );
    assert_eq!(
        e["error"]["name"], "NameError",
        "variables do not survive: {e}"
    );
}

#[test]
fn keys_and_loopback_rules_and_audit_commands() {
    let data = data_dir();
    // Without keys, only loopback.
    let out = runcell(&data)
        .args(["serve", "--listen", "0.0.0.0:0"])
        .output()
        .expect("serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without API keys"), "{err}");

    let out = runcell(&data)
        .args(["keys", "create", "--name", "ci", "--tenant", "team-a"])
        .output()
        .expect("keys create");
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let key = stdout.lines().last().expect("key line").to_owned();
    assert!(key.starts_with("rc_") && key.len() > 20, "{stdout}");
    let out = runcell(&data)
        .args(["keys", "list"])
        .output()
        .expect("list");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(listed.contains("ci") && listed.contains("team-a") && !listed.contains(&key));

    let srv = serve(&data);
    let c = http();
    assert_eq!(
        c.get(format!("{}/v1/sessions", srv.base))
            .send()
            .expect("get")
            .status(),
        401
    );
    let e: Value = c
        .post(format!("{}/v1/execute", srv.base))
        .bearer_auth(&key)
        .json(&json!({"code": "print('audited')"}))
        .send()
        .and_then(|r| r.json())
        .expect("execute");
    assert_eq!(e["stdout"], "audited\n");
    let ex_id = e["id"].as_str().expect("id").to_owned();
    drop(srv);

    let out = runcell(&data)
        .args(["audit", "list", "--tenant", "team-a"])
        .output()
        .expect("audit list");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&ex_id));
    let out = runcell(&data)
        .args(["audit", "show", &ex_id, "--tenant", "team-a"])
        .output()
        .expect("audit show");
    let shown: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(shown["code"], "print('audited')");
    let out = runcell(&data)
        .args(["audit", "verify"])
        .output()
        .expect("verify");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Someone edits the record directly in the database file.
    let db = rusqlite::Connection::open(data.join("runcell.db")).expect("open db");
    db.execute_batch(
        "DROP TRIGGER IF EXISTS executions_no_update; DROP TRIGGER IF EXISTS executions_no_delete;",
    )
    .expect("drop triggers");
    let names: Vec<String> = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("triggers");
    for t in names {
        db.execute_batch(&format!("DROP TRIGGER \"{t}\""))
            .expect("drop");
    }
    let changed = db
        .execute(
            "UPDATE executions SET code = 'print(\"innocent\")' WHERE execution_id = ?1",
            [&ex_id],
        )
        .expect("tamper");
    assert_eq!(changed, 1);
    drop(db);
    let out = runcell(&data)
        .args(["audit", "verify"])
        .output()
        .expect("verify");
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).expect("report");
    assert_eq!(report["ok"], false);
    assert_eq!(report["first_broken"]["execution_id"], ex_id.as_str());

    // Revoked keys stop working: refused while another key is active...
    for args in [
        &["keys", "create", "--name", "other", "--tenant", "team-b"][..],
        &["keys", "revoke", "ci"],
    ] {
        assert!(runcell(&data)
            .args(args)
            .output()
            .expect("keys")
            .status
            .success());
    }
    let srv = serve(&data);
    let r = c
        .get(format!("{}/v1/sessions", srv.base))
        .bearer_auth(&key)
        .send()
        .expect("get");
    assert_eq!(r.status(), 401);
    drop(srv);
    // ...and once none is, the loopback server is open and ignores `Authorization`: the
    // revoked key acts for the open tenant like no key, never for team-a.
    let out = runcell(&data)
        .args(["keys", "revoke", "other"])
        .output()
        .expect("revoke");
    assert!(out.status.success());
    let srv = serve(&data);
    let listed: Value = c
        .get(format!("{}/v1/executions", srv.base))
        .bearer_auth(&key)
        .send()
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.json())
        .expect("executions");
    assert_eq!(listed["executions"], json!([]), "{listed}");
}

#[test]
fn a_killed_server_takes_its_zygote_and_zygote_born_sandboxes_along() {
    let data = data_dir();
    // Its recovered session is paused, and a paused session's image stays mounted at a stop.
    let _unmount = UnmountOnDrop(data.to_path_buf());
    let c = http();
    let mut srv = serve(&data);
    // /healthz once `ready(h)` holds.
    let health_when = |what: &str, ready: &dyn Fn(&Value) -> bool| -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let h: Value = get_json(&c, format!("{}/healthz", srv.base), "healthz");
            if ready(&h) {
                return h;
            }
            assert!(Instant::now() < deadline, "{what}: {h}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // Sessions come from the zygote once it has preloaded.
    let h = health_when("zygote not ready", &|h| h["zygote"]["state"] == "ready");
    let zygote_pid = h["zygote"]["pid"].as_u64().expect("zygote pid") as u32;
    let session: Value = post_json(
        &c,
        format!("{}/v1/sessions", srv.base),
        &json!({}),
        "create",
    );
    let id = session["id"].as_str().expect("id");
    // Warm sessions (`--warm-sessions`, 2 by default) are zygote-born too, and have no row in
    // the store: the next server must remove their workspaces.
    let warm_workspaces = || -> Vec<String> {
        std::fs::read_dir(runcell_engine::workspaces_dir(&data))
            .expect("workspaces")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with("ses_") && n != id)
            .collect()
    };
    health_when("warm sessions", &|h| h["warm_sessions"] == 2);
    let warm = warm_workspaces();
    assert_eq!(warm.len(), 2, "{warm:?}");
    let mounted = |name: &str| {
        std::fs::read_to_string("/proc/mounts")
            .expect("mounts")
            .lines()
            .any(|l| {
                l.split(' ')
                    .nth(1)
                    .is_some_and(|m| m.ends_with(&format!("/{name}")))
            })
    };
    assert!(
        warm.iter().all(|w| mounted(w)),
        "control: warm workspaces are mounted"
    );
    // A process in the sandbox that would outlive a careless supervisor, and a sign that the
    // session is zygote-born (pandas already imported).
    let marker = format!("{}.{}", 40_000 + std::process::id() % 10_000, 17);
    let e = post_json(
        &c,
        format!("{}/v1/sessions/{id}/execute", srv.base),
        &json!({"code": format!(
            "import os, subprocess, sys\nsubprocess.Popen(['sleep', '{marker}'], start_new_session=True)\n('pandas' in sys.modules, os.sched_getscheduler(0) == os.SCHED_BATCH)"
        )}),
        "execute",
    );
    assert_eq!(e["status"], "ok", "{e}");
    // Zygote-born, and under the server's SCHED_BATCH (`serve --scheduling`, inherited by
    // every thread and process it starts).
    assert!(
        e["results"].to_string().contains("(True, True)"),
        "not zygote-born or not SCHED_BATCH: {e}"
    );
    assert_eq!(
        sched_policy(std::process::id()),
        0,
        "control: tests run under SCHED_OTHER"
    );
    assert_eq!(
        sched_policy(srv.child.id()),
        3,
        "the server runs under SCHED_BATCH"
    );
    assert_eq!(
        sched_policy(zygote_pid),
        3,
        "the zygote runs under SCHED_BATCH"
    );
    let sleeper = format!("sleep {marker}");
    assert!(
        common::find_process(&sleeper).is_some(),
        "positive control: the sleeper runs"
    );

    // The kernel is busy in a cell (it would notice a closed channel only afterwards).
    let inflight = execute_in_background(&srv.base, id, "import time; time.sleep(60)");
    std::thread::sleep(Duration::from_millis(500));
    srv.kill9();
    let _ = inflight.join();
    // Nobody is left to enforce limits or collect output: pid 1 sees the control socket hang
    // up and ends the sandbox; the zygote sees its request socket close and exits.
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::find_process(&sleeper).is_some()
        || Path::new(&format!("/proc/{zygote_pid}")).exists()
    {
        assert!(
            Instant::now() < deadline,
            "left behind: sleeper {:?}, zygote {}",
            common::find_process(&sleeper),
            Path::new(&format!("/proc/{zygote_pid}")).exists()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // What an operator does next: a new server recovers the session (and unmounts its workspace
    // when it stops).
    let again = serve(&data);
    let s: Value = get_json(&c, format!("{}/v1/sessions/{id}", again.base), "session");
    assert_eq!(s["status"], "paused", "{s}");
    for w in &warm {
        assert!(
            !runcell_engine::workspaces_dir(&data).join(w).exists()
                && !mounted(w)
                && !data
                    .join("workspace-images")
                    .join(format!("{w}.ext4"))
                    .exists(),
            "the killed server's warm session {w} was left behind"
        );
    }
}

#[test]
fn allowed_hosts_and_the_metrics_listener_flags() {
    let data = data_dir();
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let srv = serve_with(
        &data,
        &[
            "--no-zygote",
            "--warm-sessions",
            "0",
            "--allowed-hosts",
            "proxy.example,alt.example:8443",
            "--allowed-hosts",
            "third.example",
            "--metrics-listen",
            &metrics,
        ],
    );
    let c = http();
    let status = |url: String, host: Option<&str>| {
        let mut req = c.get(url);
        if let Some(h) = host {
            req = req.header("host", h);
        }
        req.send().expect("send").status().as_u16()
    };
    let sessions = format!("{}/v1/sessions", srv.base);
    assert_eq!(status(sessions.clone(), None), 200);
    for host in ["proxy.example", "alt.example:8443", "third.example:1234"] {
        assert_eq!(status(sessions.clone(), Some(host)), 200, "{host}");
    }
    for host in ["evil.example", "alt.example:8444"] {
        assert_eq!(status(sessions.clone(), Some(host)), 403, "{host}");
    }
    // Metrics moved: not on the main listener, on their own without a key.
    assert_eq!(status(format!("{}/metrics", srv.base), None), 404);
    let text = c
        .get(format!("http://{metrics}/metrics"))
        .send()
        .and_then(|r| r.text())
        .expect("metrics");
    assert!(text.contains("runcell_sessions"), "{text}");
    assert_eq!(status(format!("http://{metrics}/v1/sessions"), None), 404);

    let out = runcell(&data)
        .args(["serve", "--allowed-hosts", "a b"])
        .output()
        .expect("serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--allowed-hosts") && err.contains("a b"),
        "{err}"
    );
}

/// Waits until the server's zygote is ready and it holds prepared one-shot sandboxes.
fn wait_for_prepared_one_shots(c: &reqwest::blocking::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let h: Value = get_json(c, format!("{base}/healthz"), "healthz");
        if h["zygote"]["state"] == "ready" && h["warm_one_shots"].as_u64() > Some(0) {
            return;
        }
        assert!(Instant::now() < deadline, "no prepared one-shots: {h}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `runcell run` on the data dir of a running `runcell serve` hands the run to it: the program
/// runs in one of the server's prepared one-shot sandboxes (its process older than the run),
/// with the command's output, exit code, `--json` and `--file`s as when it runs itself; once
/// the server stops, `runcell run` runs it itself again (a process as new as the run).
#[test]
fn runcell_run_uses_the_server_of_its_data_dir() {
    let data = data_dir();
    let c = http();
    let srv = serve_with(&data, &["--warm-sessions", "0"]);
    wait_for_prepared_one_shots(&c, &srv.base);
    let socket = data.join("serve.sock");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket)
        .expect("serve.sock")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "only the server's user may connect");
    // Prepared sandboxes made well before the runs below.
    std::thread::sleep(Duration::from_millis(1500));
    let program = data.join("p.py");
    std::fs::write(
        &program,
        "import os, sys\nticks = os.sysconf('SC_CLK_TCK')\nstart = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])\nage = float(open('/proc/uptime').read().split()[0]) - start / ticks\nprint('age>1', age > 1, open('/workspace/in.txt').read())\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n",
    )
    .expect("program");
    let input = data.join("in.txt");
    std::fs::write(&input, "from a file").expect("input");
    let run = |flags: &[&str]| {
        runcell(&data)
            .arg("run")
            .args(flags)
            .arg("--file")
            .arg(&input)
            .arg(&program)
            .output()
            .expect("runcell run")
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "age>1 True from a file\n",
        "{out:?}"
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "to stderr\n",
        "{out:?}"
    );
    let out = run(&["--json"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let exec: Value = serde_json::from_slice(&out.stdout).expect("an Execution");
    assert_eq!(exec["status"], "error", "{exec:#}");
    assert_eq!(exec["stdout"], "age>1 True from a file\n", "{exec:#}");
    // The server recorded it.
    let id = exec["id"].as_str().expect("id");
    let got = c
        .get(format!("{}/v1/executions/{id}", srv.base))
        .send()
        .expect("GET execution");
    assert_eq!(got.status(), 200, "the server does not know {id}");

    drop(srv);
    assert!(!socket.exists(), "a stopped server removes its socket");
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "age>1 False from a file\n",
        "without a server the run is this command's own: {out:?}"
    );
}

/// Back-to-back one-shots faster than their sandboxes are torn down (the teardown comes after
/// each answer) are all answered: with a memory budget for three default one-shots at once,
/// sixty in a row each get 200, not `503` at capacity.
#[test]
fn back_to_back_one_shots_are_not_refused_while_teardowns_lag() {
    let data = data_dir();
    let c = http();
    let srv = serve_with(
        &data,
        &["--warm-sessions", "0", "--max-committed-memory-mb", "3072"],
    );
    wait_for_prepared_one_shots(&c, &srv.base);
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for _ in 0..60 {
        let r = c
            .post(format!("{}/v1/execute", srv.base))
            .json(&json!({"language": "python", "code": "print(1)"}))
            .send()
            .expect("execute");
        *statuses.entry(r.status().as_u16()).or_default() += 1;
    }
    assert_eq!(statuses, [(200, 60)].into(), "statuses of 60 runs in a row");
}

/// `--data-dir data` (relative) serves as an absolute one would: one-shots (prepared, forked
/// on demand, cold) and sessions run, and their workspaces are under the data dir. Before, every
/// one-shot of such a server failed with a 500 ("workspace must be an absolute path").
#[test]
fn a_relative_data_dir_serves_like_an_absolute_one() {
    let data = data_dir();
    let c = http();
    let parent = data.parent().expect("parent").to_owned();
    let name = data.file_name().expect("name").to_owned();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_runcell"));
    command
        .current_dir(&parent)
        .env_remove("RUNCELL_DATA_DIR")
        .env("NO_COLOR", "1")
        .arg("--data-dir")
        .arg(&name);
    let srv = common::serve::serve_command(
        command,
        common::serve::free_port(),
        &["--warm-sessions", "0"],
        |_| {},
    );
    wait_for_prepared_one_shots(&c, &srv.base);
    for start in [None, Some("cold")] {
        for i in 0..6 {
            let mut body = json!({"language": "python", "code": format!("print({i} * 7)")});
            if let Some(start) = start {
                body["start"] = json!(start);
            }
            let out = post_json(&c, format!("{}/v1/execute", srv.base), &body, "execute");
            assert_eq!(
                out["stdout"],
                format!("{}\n", i * 7),
                "{start:?} run {i}: {out}"
            );
            assert_eq!(out["status"], "ok", "{out}");
        }
    }
    let session = post_json(
        &c,
        format!("{}/v1/sessions", srv.base),
        &json!({"language": "python"}),
        "session",
    );
    let id = session["id"].as_str().expect("session id");
    let out = post_json(
        &c,
        format!("{}/v1/sessions/{id}/execute", srv.base),
        &json!({"code": "open('kept.txt', 'w').write('here'); print(6 * 7)"}),
        "session execute",
    );
    assert_eq!(out["stdout"], "42\n", "{out}");
    let kept = std::fs::read_to_string(data.join("workspaces").join(id).join("kept.txt"));
    // On disk the workspace is an image mounted under the data dir, or (without loop devices)
    // a directory: either way the file is reachable there while the session lives.
    assert_eq!(kept.as_deref().ok(), Some("here"), "{kept:?}");
}
