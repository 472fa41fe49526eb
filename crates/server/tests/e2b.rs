//! `/e2b` as the official E2B SDKs speak it, configured only by the three variables the README
//! gives: the Python SDK (`e2b-code-interpreter` from PyPI, its newest and its oldest usable
//! versions pinned in tests/vendor-clients/e2b-*requirements.txt) running the user code of
//! tests/vendor-clients/e2b_client.py, and the JavaScript one (tests/vendor-clients/e2b-js),
//! against the app on port 0; then what runcell itself recorded (sessions, the audit log).

mod common;

#[path = "common/clients.rs"]
mod clients;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vendor-clients")
}

/// The SDK versions a venv holds: the newest known to work, or the oldest that can be pointed
/// at runcell by environment variables (E2B_SANDBOX_URL came with e2b 2.7, and the code
/// interpreter honours it from 2.9).
#[derive(Debug, Clone, Copy)]
enum Sdk {
    Newest,
    Oldest,
}

fn sdk_python(sdk: Sdk) -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    match sdk {
        Sdk::Newest => {
            clients::requirements_venv("e2b-sdk", &clients_dir().join("e2b-requirements.txt"))
        }
        Sdk::Oldest => clients::requirements_venv(
            "e2b-sdk-oldest",
            &clients_dir().join("e2b-oldest-requirements.txt"),
        ),
    }
}

/// Runs a scenario of e2b_client.py with the newest SDK as the holder of `key`; its report.
async fn scenario(srv: &common::Server, key: &str, args: &[&str]) -> Value {
    scenario_with(Sdk::Newest, srv, key, args).await
}

async fn scenario_with(sdk: Sdk, srv: &common::Server, key: &str, args: &[&str]) -> Value {
    let base = srv.base.clone();
    let key = key.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(sdk_python(sdk))
            .arg(clients_dir().join("e2b_client.py"))
            .args(&args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("E2B_API_URL", format!("{base}/e2b"))
            .env("E2B_SANDBOX_URL", format!("{base}/e2b/sandbox"))
            .env("E2B_API_KEY", &key)
            .output()
            .expect("run e2b_client.py");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "e2b_client.py {args:?} failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
    })
    .await
    .expect("the SDK client")
}

async fn server_and_key(tenant: &str) -> (common::Server, String) {
    let srv = common::start().await;
    let (_, key) = srv.store.create_key("e2b", tenant).expect("key");
    (srv, key)
}

/// The tenant's executions of `session` (cells and commands), oldest first.
async fn audited(srv: &common::Server, key: &str, session: &str) -> Vec<Value> {
    let v: Value = srv
        .http
        .get(format!(
            "{}/v1/executions?session_id={session}&limit=100",
            srv.base
        ))
        .bearer_auth(key)
        .send()
        .await
        .expect("executions")
        .json()
        .await
        .expect("json");
    let mut list = v["executions"].as_array().cloned().unwrap_or_default();
    list.reverse();
    list
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_keep_state_stream_output_and_report_errors_in_e2b_shapes() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["state"]).await;
    assert_eq!(r["text"], "42", "{r}");
    assert_eq!(r["count"], 2);
    // The first line reached the callback about 2 s before the cell ended.
    let seen = r["seen"].as_array().expect("seen");
    assert_eq!(seen[0][0], "early\n", "{r}");
    let early_at = seen[0][1].as_f64().expect("a number");
    let ended = r["ended_after"].as_f64().expect("a number");
    assert!(
        ended - early_at > 1.5,
        "early at {early_at}s, ended at {ended}s"
    );
    assert_eq!(r["timestamps_ns"], true);
    assert_eq!(r["logs"], serde_json::json!(["early\n", "late\n"]));
    assert_eq!(r["error"][0], "ZeroDivisionError");
    assert_eq!(r["error"][1], "division by zero");
    assert_eq!(r["error"][2], true);
    assert_eq!(r["stderr"], serde_json::json!(["to stderr\n"]));
    assert_eq!(r["sandbox_env"], "'hello'");
    assert_eq!(r["cell_env"], "'yes'");
    assert!(r["cell_env_after"].is_null(), "{r}");
    assert_eq!(r["cwd"], "'/workspace'");
    assert_eq!(
        r["ipython"],
        serde_json::json!([["shell says hi\n"], "5", null]),
        "Jupyter's shell escape and magics"
    );
    assert_eq!(r["js"], "42", "{r}");
    assert_eq!(r["bash"], serde_json::json!(["42\n"]), "{r}");

    // The sandbox was a session of the key's tenant, every cell in its audit log.
    let id = r["sandbox_id"].as_str().expect("a string");
    let cells = audited(&srv, &key, id).await;
    let codes: Vec<&str> = cells.iter().filter_map(|e| e["code"].as_str()).collect();
    assert!(codes.contains(&"x + 1"), "{codes:?}");
    assert!(codes.contains(&"1 / 0"), "{codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_and_the_async_sdk_work() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["readme"]).await;
    assert_eq!(r["text"], "2", "{r}");
    assert_eq!(r["killed_on_exit"], true, "{r}");
    let r = scenario(&srv, &key, &["async"]).await;
    assert_eq!(r["text"], "42", "{r}");
    assert_eq!(r["lines"], serde_json::json!(["async out\n"]));
    assert_eq!(r["read"], "async file");
    assert_eq!(r["command"], "async file\n2\n");
    assert_eq!(r["ctx"], "1");
    assert_eq!(r["default"], "6");
    assert_eq!(r["listed"], serde_json::json!(["async"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn charts_come_back_as_png_and_dataframes_as_html_and_text() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["chart"]).await;
    assert_eq!(r["pngs"], 1, "{r}");
    assert_eq!(r["png_magic"], "89504e470d0a1a0a");
    assert!(
        r["formats"]
            .as_array()
            .expect("a list")
            .iter()
            .any(|f| f == "png"),
        "{r}"
    );
    assert_eq!(r["chart"], serde_json::json!(["line", "squares"]), "{r}");
    assert_eq!(r["df_main"], true);
    assert_eq!(r["df_html"], true);
    let text = r["df_text"].as_str().expect("a string");
    assert!(text.contains("Oslo") && text.contains("temp"), "{text}");
    assert_eq!(
        r["display_results"],
        serde_json::json!([[false, "{'a': 1}"], [true, "2"]]),
        "{r}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_written_read_listed_moved_and_removed_are_the_codes_files() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["files"]).await;
    assert_eq!(
        r["write_info"],
        serde_json::json!(["data.txt", "/home/user/data.txt"])
    );
    assert_eq!(r["read"], "hello runcell");
    assert_eq!(r["bytes"], serde_json::json!([0, 1, 255]));
    assert_eq!(r["file_object"], "a,b\n1,2\n");
    assert_eq!(r["code_sees"], "'hello runcell'");
    assert_eq!(r["sdk_sees"], "from the kernel");
    assert_eq!(r["mkdir"], true);
    assert_eq!(r["mkdir_again"], false);
    let list = r["list"].as_array().expect("a list");
    assert!(
        list.iter()
            .any(|e| e[0] == "data.txt" && e[2] == "/home/user/data.txt"),
        "{list:?}"
    );
    assert!(
        list.iter().any(|e| e[0] == "sub" && e[1] == "dir"),
        "{list:?}"
    );
    assert_eq!(
        r["list_depth2"],
        serde_json::json!(["/home/user/sub/dir", "/home/user/sub/dir/deep.txt"])
    );
    assert_eq!(r["exists"], true);
    assert_eq!(
        r["renamed"],
        serde_json::json!(["renamed.txt", "/home/user/renamed.txt", false])
    );
    assert_eq!(r["exists_after_remove"], false);
    assert_eq!(r["dir_removed"], false);
    assert_eq!(r["info"], serde_json::json!(["bytes.bin", 3]));
    assert_eq!(
        r["download_url"],
        serde_json::json!([format!("{}/files", srv.base), [0, 1, 255]])
    );
    assert_eq!(r["tampered_url"], 401);
    assert_eq!(r["expired_url"], 401);
    assert_eq!(
        r["upload_url"],
        serde_json::json!([200, "via a signed url"]),
        "{r}"
    );
    assert_eq!(r["missing"], "FileNotFoundException");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_stream_take_envs_and_cwd_and_fail_with_the_sdks_exception() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["commands"]).await;
    assert_eq!(r["fg"], serde_json::json!(["hi\n", "oops\n", 0]), "{r}");
    assert_eq!(r["callback"], serde_json::json!(["hi\n"]));
    assert_eq!(r["envs"], "b sbx\n");
    assert_eq!(r["cwd"], "/home/user/work\n");
    assert_eq!(r["shared"], "same filesystem");
    assert_eq!(r["home"], "home\n", "~ is /home/user in commands");
    let ls = r["ls"].as_str().expect("a string");
    assert!(
        ls.contains("shared.txt"),
        "/home/user is a directory to ls -l: {ls}"
    );
    assert_eq!(r["find"], "/home/user/shared.txt\n");
    assert_eq!(r["code_reads_command_file"], "'made\\n'");
    assert_eq!(
        r["failing"],
        serde_json::json!(["CommandExitException", 3, "failing\n"])
    );
    assert_eq!(r["bg_listed"], true);
    assert_eq!(r["bg_killed"], true);
    assert_eq!(r["bg_wait"], "killed");
    assert!(r["bg_kill_took"].as_f64().expect("a number") < 10.0, "{r}");
    assert_eq!(r["bg_result"], "background done\n");
    assert_eq!(r["attached_result"], "background done\n", "{r}");
    // Commands are in the audit log, with their exit codes.
    let id = r["sandbox_id"].as_str().expect("a string");
    let records = audited(&srv, &key, id).await;
    let failing = records
        .iter()
        .find(|e| {
            e["code"]
                .as_str()
                .is_some_and(|c| c.contains("echo failing >&2; exit 3"))
        })
        .expect("the failing command's record");
    assert_eq!(failing["status"], "error");
    assert_eq!(failing["error"]["value"], "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_have_their_own_variables_and_share_the_files() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["contexts"]).await;
    assert_eq!(r["ctx"], serde_json::json!(["python", "/home/user"]));
    assert_eq!(r["in_ctx"], "'context'");
    assert_eq!(r["in_default"], "'default'");
    assert_eq!(r["ctx_files_shared"], "seen");
    assert_eq!(r["listed"], true);
    assert_eq!(r["after_restart"], "NameError");
    assert_eq!(r["cwd_ctx"], "'/home/user/proj'");
    assert_eq!(r["js_ctx"], "42");
    assert_eq!(r["listed_after_remove"], false);
    assert_eq!(r["removed_run"], "NotFoundException");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_timeout_interrupts_the_cell_and_keeps_the_state() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["timeouts"]).await;
    assert_eq!(r["timeout"], "TimeoutException", "{r}");
    assert!(r["raised_after"].as_f64().expect("a number") < 10.0, "{r}");
    assert_eq!(
        r["after"], "'state'",
        "the interrupted cell changed nothing"
    );
    assert!(
        r["next_cell_took"].as_f64().expect("a number") < 10.0,
        "the sleeping cell was interrupted, not waited for: {r}"
    );
    let left = r["left"].as_f64().expect("a number");
    assert!((110.0..=121.0).contains(&left), "{r}");
    let later = r["left_after_set"].as_f64().expect("a number");
    assert!((590.0..=601.0).contains(&later), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_connect_list_page_and_die_and_other_tenants_never_see_them() {
    let (srv, key) = server_and_key("acme").await;
    let (_, other) = srv.store.create_key("other", "globex").expect("key");
    let r = scenario(&srv, &key, &["lifecycle", "suite-1", &other]).await;
    let (a, b) = (
        r["a"].as_str().expect("a string"),
        r["b"].as_str().expect("a string"),
    );
    assert_eq!(r["connected_state"], "123", "{r}");
    let mut both = vec![a, b];
    both.sort();
    assert_eq!(r["listed"], serde_json::json!(both));
    assert_eq!(r["listed_metadata"], serde_json::json!(["a", "b"]));
    assert_eq!(r["filtered"], serde_json::json!([b]));
    assert_eq!(r["pages"].as_array().expect("a list").len(), 2, "{r}");
    assert_eq!(r["info"][0], a);
    assert_eq!(r["info"][1], "a");
    assert_eq!(r["other_connect"], "SandboxNotFoundException");
    assert_eq!(r["other_info"], "SandboxNotFoundException");
    assert_eq!(r["other_kill"], false);
    assert_eq!(r["other_list"], serde_json::json!([]));
    assert_eq!(r["wrong_token_status"], 401);
    assert_eq!(r["no_token_status"], 401);
    assert_eq!(r["running_before_kill"], true);
    assert_eq!(r["killed"], true);
    assert_eq!(r["running_after_kill"], false);
    assert_eq!(r["kill_again"], false);
    assert_eq!(r["listed_after_kill"], serde_json::json!([b]));
    assert_ne!(r["code_after_kill"], "ran");

    // The sandboxes were sessions of acme: listed in /v1/sessions for acme only.
    let sessions = |k: String| {
        let http = srv.http.clone();
        let url = format!("{}/v1/sessions", srv.base);
        async move {
            let v: Value = http
                .get(url)
                .bearer_auth(k)
                .send()
                .await
                .expect("the request")
                .json()
                .await
                .expect("ok");
            v["sessions"].as_array().cloned().unwrap_or_default()
        }
    };
    assert!(sessions(other.clone()).await.is_empty());
    let mine = sessions(key.clone()).await;
    assert!(mine.iter().any(|s| s["id"] == b), "{mine:?}");
    assert!(!mine.iter().any(|s| s["id"] == a), "killed: {mine:?}");
    let cells = audited(&srv, &key, a).await;
    assert!(
        cells
            .iter()
            .any(|e| e["code"] == "left_by_first_client = 123"),
        "{cells:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_sdk_that_honours_the_variables_works_too() {
    let srv = common::start().await;
    // That SDK refuses any key but E2B's shape (`e2b_` and hex digits).
    let e2b_key = |name, tenant| {
        srv.store
            .create_key_in_format(name, tenant, runcell_store::KeyFormat::E2b)
            .expect("key")
            .1
    };
    let (key, other) = (e2b_key("e2b", "acme"), e2b_key("other", "globex"));
    assert!(key.starts_with("e2b_"), "{key}");
    let r = scenario_with(Sdk::Oldest, &srv, &key, &["state"]).await;
    assert_eq!(r["text"], "42", "{r}");
    assert_eq!(r["js"], "42", "{r}");
    let r = scenario_with(Sdk::Oldest, &srv, &key, &["files"]).await;
    assert_eq!(r["read"], "hello runcell", "{r}");
    assert_eq!(r["file_object"], "a,b\n1,2\n", "{r}");
    let r = scenario_with(Sdk::Oldest, &srv, &key, &["commands"]).await;
    assert_eq!(r["fg"], serde_json::json!(["hi\n", "oops\n", 0]), "{r}");
    assert_eq!(r["bg_killed"], true, "{r}");
    let r = scenario_with(Sdk::Oldest, &srv, &key, &["contexts"]).await;
    assert_eq!(r["in_ctx"], "'context'", "{r}");
    let r = scenario_with(Sdk::Oldest, &srv, &key, &["lifecycle", "suite-old", &other]).await;
    assert_eq!(r["connected_state"], "123", "{r}");
    assert_eq!(r["other_connect"], "SandboxNotFoundException", "{r}");
    assert_eq!(r["running_after_kill"], false, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_deleted_behind_e2bs_back_takes_its_context_kernels_along() {
    let (srv, key) = server_and_key("acme").await;
    let created: Value = srv
        .http
        .post(format!("{}/e2b/v2/sandboxes", srv.base))
        .header("x-api-key", &key)
        .json(&serde_json::json!({"templateID": "base", "timeout": 60}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let id = created["sandboxID"].as_str().expect("an id").to_owned();
    let token = created["envdAccessToken"]
        .as_str()
        .expect("a token")
        .to_owned();
    let data = |path: &str| {
        srv.http
            .post(format!("{}/e2b/sandbox{path}", srv.base))
            .header("e2b-sandbox-id", &id)
            .header("x-access-token", &token)
    };
    let ctx = data("/contexts")
        .json(&serde_json::json!({"language": "python"}))
        .send()
        .await
        .expect("context");
    assert_eq!(ctx.status(), 200);
    let live = || async {
        let v: Value = srv
            .http
            .get(format!("{}/v1/sessions", srv.base))
            .bearer_auth(&key)
            .send()
            .await
            .expect("sessions")
            .json()
            .await
            .expect("json");
        v["sessions"].as_array().map_or(0, Vec::len)
    };
    assert_eq!(live().await, 2, "the sandbox and its context's kernel");
    let deleted = srv
        .http
        .delete(format!("{}/v1/sessions/{id}", srv.base))
        .bearer_auth(&key)
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 204);
    let started = std::time::Instant::now();
    while live().await > 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the context's kernel outlived its sandbox"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    // The sweeper ended it; the data plane answers as E2B's proxy does for a gone sandbox.
    let health = srv
        .http
        .get(format!("{}/e2b/sandbox/health", srv.base))
        .header("e2b-sandbox-id", &id)
        .header("x-access-token", &token)
        .send()
        .await
        .expect("health");
    assert_eq!(
        health.status(),
        502,
        "a gone sandbox is answered as E2B's proxy does"
    );
}

/// The JavaScript SDK (tests/vendor-clients/e2b-js, pinned by its package-lock.json), installed
/// under target/ on first use; its client script copied beside its node_modules.
fn js_client() -> PathBuf {
    let src = clients_dir().join("e2b-js");
    let lock = std::fs::read(src.join("package-lock.json")).expect("package-lock.json");
    let pin = format!(
        "{:016x}",
        lock.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
    );
    let dir = clients::installed("e2b-js", &pin, |dir| {
        for f in ["package.json", "package-lock.json"] {
            std::fs::copy(src.join(f), dir.join(f)).expect("copy the npm manifest");
        }
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
            .current_dir(dir)
            .status()
            .expect("run npm (the E2B JavaScript SDK test needs npm)");
        assert!(status.success(), "npm ci failed in {}", dir.display());
    });
    let script = dir.join("client.mjs");
    std::fs::copy(src.join("client.mjs"), &script).expect("copy client.mjs");
    script
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_javascript_sdk_works_too() {
    let (srv, key) = server_and_key("acme").await;
    let base = srv.base.clone();
    let k = key.clone();
    let r: Value = tokio::task::spawn_blocking(move || {
        let out = Command::new("node")
            .arg(js_client())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("E2B_API_URL", format!("{base}/e2b"))
            .env("E2B_SANDBOX_URL", format!("{base}/e2b/sandbox"))
            .env("E2B_API_KEY", &k)
            .output()
            .expect("run node");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "client.mjs failed:\n{stdout}\n{stderr}"
        );
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
    })
    .await
    .expect("the JavaScript client");
    assert_eq!(r["text"], "42", "{r}");
    assert_eq!(r["seen"], serde_json::json!(["from js sdk\n"]));
    assert_eq!(r["error"], "ZeroDivisionError");
    assert_eq!(r["png"], true);
    assert_eq!(r["read"], "written by js");
    assert_eq!(r["listed"], true);
    assert_eq!(r["exists"], false);
    assert_eq!(r["command"], "written by js\nb\n");
    assert_eq!(r["failing"], serde_json::json!([true, 4]));
    assert_eq!(r["ctx"], "1");
    assert_eq!(r["listedSandbox"], serde_json::json!([r["sandboxId"]]));
    assert_eq!(r["paused"], true, "{r}");
    assert_eq!(r["stateWhenPaused"], "paused", "{r}");
    assert_eq!(r["runningWhenPaused"], false, "{r}");
    assert_eq!(r["afterResume"], "41", "x = 41 came back: {r}");
    assert_eq!(r["fileAfterResume"], "written by js", "{r}");
    assert_eq!(r["runningAfterKill"], false);
    let id = r["sandboxId"].as_str().expect("a string");
    assert!(audited(&srv, &key, id)
        .await
        .iter()
        .any(|e| e["code"] == "x = 41"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sandbox_keeps_its_variables_files_and_contexts_and_connect_resumes_it() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["pause", "suite-pause"]).await;
    let (id, other) = (
        r["sandbox_id"].as_str().expect("a string"),
        r["other"].as_str().expect("a string"),
    );
    assert_eq!(
        r["pause_with_command"],
        serde_json::json!(["ServiceBusyException", "503"]),
        "{r}"
    );
    assert_eq!(r["paused"], true, "{r}");
    assert_eq!(r["paused_again"], false, "409: already paused");
    assert_eq!(r["running_when_paused"], false, "{r}");
    assert_eq!(r["state"], "paused");
    assert_eq!(r["listed_paused"], serde_json::json!([id]), "{r}");
    assert_eq!(r["listed_running"], serde_json::json!([other]), "{r}");
    let mut both = vec![id, other];
    both.sort();
    assert_eq!(r["listed_both"], serde_json::json!(both));
    assert_eq!(r["set_timeout_paused"], "SandboxException", "{r}");
    assert_eq!(r["state_after_connect"], "running");
    assert_eq!(r["running_after_connect"], true);
    assert_eq!(r["var"], "42", "{r}");
    assert_eq!(r["df"], "6", "{r}");
    assert_eq!(r["file"], "on disk");
    assert_eq!(r["ctx_var"], "'context variable'", "{r}");
    assert_eq!(
        r["bash_ctx"],
        serde_json::json!(["5\n"]),
        "a Bash context keeps its variables: {r}"
    );
    assert_eq!(r["default_lacks_ctx_var"], "NameError");
    assert_eq!(r["connect_running"], true);
    assert_eq!(r["implicit"], "84", "{r}");
    assert_eq!(r["killed_paused"], true);
    assert_eq!(
        r["listed_after_kill"],
        serde_json::json!([id]),
        "the killed paused sandbox is gone, the other one is running"
    );
    // The pause was runcell's own: the session was paused, and its cells are in the audit log.
    let cells = audited(&srv, &key, id).await;
    assert!(cells.iter().any(|e| e["code"] == "kept * 2"), "{cells:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_sdk_pauses_and_connects_too() {
    let srv = common::start().await;
    let key = srv
        .store
        .create_key_in_format("e2b", "acme", runcell_store::KeyFormat::E2b)
        .expect("key")
        .1;
    let r = scenario_with(Sdk::Oldest, &srv, &key, &["pause", "suite-old-pause"]).await;
    // That SDK's pause() returns nothing on an instance and the sandbox id from the class,
    // whatever the status (409 included).
    assert_eq!(r["paused"], Value::Null, "{r}");
    assert_eq!(r["paused_again"], r["sandbox_id"], "{r}");
    assert_eq!(r["pause_with_command"][1], "503", "{r}");
    assert_eq!(r["running_when_paused"], false, "{r}");
    assert_eq!(r["state"], "paused");
    assert_eq!(r["listed_paused"], serde_json::json!([r["sandbox_id"]]));
    assert_eq!(r["var"], "42", "{r}");
    assert_eq!(r["file"], "on disk");
    assert_eq!(r["ctx_var"], "'context variable'", "{r}");
    assert_eq!(r["implicit"], "84", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_its_timeout_an_auto_pause_sandbox_pauses_and_any_other_is_killed() {
    let (srv, key) = server_and_key("acme").await;
    let r = scenario(&srv, &key, &["auto_pause"]).await;
    let end_in = r["end_in"].as_f64().expect("a number");
    assert!((0.0..=3.5).contains(&end_in), "end_at is the pause: {r}");
    assert_eq!(
        r["lifecycle"],
        serde_json::json!({"on_timeout": "pause", "auto_resume": true}),
        "{r}"
    );
    assert_eq!(r["running_when_paused"], false, "{r}");
    assert_eq!(r["var"], "'paused at the timeout'", "{r}");
    assert_eq!(r["file"], "and its file");
    assert_eq!(r["state_after_connect"], "running");
    assert_eq!(r["killed_at_timeout"], true);
    assert_eq!(r["connect_killed"], "SandboxNotFoundException", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2b_network_options_map_onto_the_egress_allowlist_or_are_refused_in_e2bs_shape() {
    let srv = common::start_engine_with(None, |c| {
        c.network = runcell_engine::NetworkConfig {
            allow_domains: vec!["*.example.com".into()],
            allow_cidrs: Vec::new(),
            ..Default::default()
        };
    })
    .await;
    let (_, key) = srv.store.create_key("e2b", "acme").expect("key");
    let r = scenario(&srv, &key, &["network"]).await;
    let refused = |what: &str, says: &str| {
        let v = &r[what];
        assert_eq!(v[0], "SandboxException", "{what}: {r}");
        let msg = v[1].as_str().expect("a message");
        assert!(
            msg.starts_with("400: ") && msg.contains(says),
            "{what}: {msg}"
        );
    };
    refused("deny_list", "denyOut \"10.0.0.0/8\" cannot be mapped");
    refused("cidr", "address range");
    refused("all", "all internet");
    refused("beyond_bound", "pypi.org");
    assert_eq!(r["proxy_default"], "'none'", "{r}");
    assert_eq!(
        r["info_allowed"],
        serde_json::json!([{"allow_out": ["api.example.com"], "deny_out": ["0.0.0.0/0"]}, false]),
        "get_info() tells what runcell gave: {r}"
    );
    assert_eq!(
        r["info_default"],
        serde_json::json!([{"deny_out": ["0.0.0.0/0"]}, false]),
        "{r}"
    );
    assert!(
        r["proxy_allowed"]
            .as_str()
            .is_some_and(|p| p.contains("127.0.0.1:")),
        "{r}"
    );
    // What the sessions say of their network, through runcell's own API.
    let network = |id: &str| {
        let http = srv.http.clone();
        let url = format!("{}/v1/sessions/{id}", srv.base);
        let key = key.clone();
        async move {
            let v: Value = http
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .expect("the session")
                .json()
                .await
                .expect("json");
            v["network"].clone()
        }
    };
    assert_eq!(
        network(r["allowed"].as_str().expect("an id")).await,
        serde_json::json!({"type": "allowlist", "allowed_domains": ["api.example.com"], "domain_secrets": []})
    );
    for id in ["offline", "default"] {
        assert_eq!(
            network(r[id].as_str().expect("an id")).await,
            serde_json::json!({"type": "disabled"}),
            "{id}"
        );
    }
}

/// A key bounded to one destination (`runcell keys create --egress-allow 127.0.0.2`) through
/// the E2B SDK: its sandbox reaches that destination from inside, and one asking for another
/// the server allows is refused in E2B's shape, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_egress_bound_narrows_e2b_networks_too() {
    let srv = common::start_engine_with(None, |c| {
        c.network = runcell_engine::NetworkConfig {
            allow_domains: vec!["127.0.0.2".into(), "127.0.0.3".into()],
            allow_cidrs: vec!["127.0.0.0/8".into()],
            ..Default::default()
        };
    })
    .await;
    let listener = std::net::TcpListener::bind("127.0.0.2:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = vec![0u8; 8192];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            );
        }
    });
    let (info, key) = srv.store.create_key("e2b", "acme").expect("key");
    srv.store
        .set_key_egress(&info.id, Some(&["127.0.0.2".to_owned()]))
        .expect("set")
        .expect("key");
    let url = format!("http://127.0.0.2:{port}/");
    let r = scenario(&srv, &key, &["network_key", &url, "127.0.0.3"]).await;
    assert_eq!(r["fetched"], "'hello'", "from inside the sandbox: {r}");
    assert_eq!(r["other"][0], "SandboxException", "{r}");
    let msg = r["other"][1].as_str().expect("a message");
    assert!(
        msg.starts_with("400: ")
            && msg.contains(&format!(
                "domain \"127.0.0.3\" is beyond what API key {} (e2b) allows",
                info.id
            )),
        "{msg}"
    );
}
