//! The HTTP API for real: the app bound to port 0, spoken to with reqwest.

mod common;

use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{start, Server};
use reqwest::StatusCode;
use serde_json::{json, Value};

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn post(&self, path: &str, key: Option<&str>, body: Value) -> (StatusCode, Value) {
        let mut req = self.http.post(self.url(path)).json(&body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str, key: Option<&str>) -> (StatusCode, Value) {
        let mut req = self.http.get(self.url(path));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A multipart question to the chat; the reply as sent.
    async fn chat(&self, form: reqwest::multipart::Form) -> reqwest::Response {
        self.http
            .post(self.url("/v1/chat"))
            .multipart(form)
            .send()
            .await
            .expect("send")
    }

    async fn session(&self, key: Option<&str>) -> String {
        let (s, v) = self.post("/v1/sessions", key, json!({})).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        v["id"].as_str().expect("id").to_owned()
    }

    async fn exec(&self, id: &str, key: Option<&str>, code: &str) -> Value {
        let (s, v) = self
            .post(
                &format!("/v1/sessions/{id}/execute"),
                key,
                json!({"code": code}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }
}

fn main_text(e: &Value) -> String {
    e["results"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["is_main_result"] == true)
        .and_then(|r| r["data"]["text/plain"].as_str())
        .unwrap_or_default()
        .to_owned()
}

fn assert_error(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[tokio::test(flavor = "multi_thread")]
async fn acceptance_cases_over_http() {
    let srv = start().await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/acceptance");
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).expect("cases"))
            .expect("json");
    let mut failures = Vec::new();
    for case in cases.as_array().expect("cases") {
        let name = case["name"].as_str().unwrap_or_default();
        let id = srv.session(None).await;
        for f in case["upload"].as_array().into_iter().flatten() {
            let f = f.as_str().expect("file");
            let data = std::fs::read(dir.join("files").join(f)).expect("file");
            let part = reqwest::multipart::Part::bytes(data).file_name(f.to_owned());
            let resp = srv
                .http
                .post(srv.url(&format!("/v1/sessions/{id}/files")))
                .multipart(reqwest::multipart::Form::new().part("file", part))
                .send()
                .await
                .expect("upload");
            assert_eq!(resp.status(), StatusCode::CREATED);
        }
        for (i, cell) in case["cells"].as_array().expect("cells").iter().enumerate() {
            let e = srv
                .exec(&id, None, cell["code"].as_str().unwrap_or_default())
                .await;
            let mut check = |ok: bool, what: &str| {
                if !ok {
                    failures.push(format!("{name} cell {i}: {what}: {e}"));
                }
            };
            check(
                e["status"] == cell["status"].as_str().unwrap_or("ok"),
                "status",
            );
            for s in cell["stdout_contains"].as_array().into_iter().flatten() {
                check(
                    e["stdout"]
                        .as_str()
                        .unwrap_or_default()
                        .contains(s.as_str().unwrap_or("")),
                    "stdout",
                );
            }
            for s in cell["main_result_contains"]
                .as_array()
                .into_iter()
                .flatten()
            {
                check(
                    main_text(&e).contains(s.as_str().unwrap_or("")),
                    "main result",
                );
            }
            if cell["has_png"] == true {
                let png = e["results"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find_map(|r| r["data"]["image/png"].as_str());
                let ok = png
                    .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                    .is_some_and(|b| b.starts_with(b"\x89PNG"));
                check(ok, "png");
            }
            if cell["has_html"] == true {
                check(
                    e["results"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|r| r["data"]["text/html"].is_string()),
                    "html",
                );
            }
            if let Some(n) = cell["error_name"].as_str() {
                check(e["error"]["name"] == n, "error name");
            }
            for f in cell["files"].as_array().into_iter().flatten() {
                check(
                    e["files"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|x| x["path"] == *f),
                    "files",
                );
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_tenants_and_error_envelope() {
    let srv = start().await;
    // Open mode before any key exists.
    let open = srv.session(None).await;
    let (a_info, key_a) = srv.store.create_key("a", "tenant-a").expect("key a");
    let (_, key_b) = srv.store.create_key("b", "tenant-b").expect("key b");
    // From now on every /v1 request needs a key.
    let (s, v) = srv.get("/v1/sessions", None).await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "unauthorized");
    let (s, v) = srv.get("/v1/sessions", Some("rc_not-a-key")).await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "unauthorized");
    // The open tenant's session is not tenant a's.
    let (s, v) = srv.get(&format!("/v1/sessions/{open}"), Some(&key_a)).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");

    let a = srv.session(Some(&key_a)).await;
    srv.exec(&a, Some(&key_a), "secret = 42").await;
    // Tenant b sees nothing of tenant a: sessions, executions, files: 404, never 403.
    for path in [
        format!("/v1/sessions/{a}"),
        format!("/v1/sessions/{a}/files"),
        format!("/v1/sessions/{a}/files/x.txt"),
    ] {
        let (s, v) = srv.get(&path, Some(&key_b)).await;
        assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    }
    let (s, v) = srv
        .post(
            &format!("/v1/sessions/{a}/execute"),
            Some(&key_b),
            json!({"code": "secret"}),
        )
        .await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (_, list) = srv.get("/v1/sessions", Some(&key_b)).await;
    assert_eq!(list["sessions"], json!([]));
    let (_, execs_b) = srv.get("/v1/executions", Some(&key_b)).await;
    assert_eq!(execs_b["executions"], json!([]));
    let (_, execs_a) = srv.get("/v1/executions", Some(&key_a)).await;
    let first = &execs_a["executions"][0];
    assert_eq!(first["code"], "secret = 42");
    let ex_id = first["id"].as_str().expect("id");
    let (s, v) = srv
        .get(&format!("/v1/executions/{ex_id}"), Some(&key_b))
        .await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = srv
        .get(&format!("/v1/executions/{ex_id}"), Some(&key_a))
        .await;
    assert_eq!((s, v["id"].as_str()), (StatusCode::OK, Some(ex_id)));

    // Bad input: the envelope, never a panic.
    let resp = srv
        .http
        .post(srv.url("/v1/sessions"))
        .bearer_auth(&key_a)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .expect("send");
    let s = resp.status();
    assert_error(
        s,
        &resp.json().await.expect("json"),
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    let (s, v) = srv
        .post(
            "/v1/sessions",
            Some(&key_a),
            json!({"limits": {"memory_mb": 0}}),
        )
        .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    let (s, v) = srv
        .post("/v1/sessions", Some(&key_a), json!({"bogus": 1}))
        .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    let (s, v) = srv.get("/v1/sessions/ses_nope", Some(&key_a)).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = srv.get("/v1/nowhere", Some(&key_a)).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");

    // Revoked keys stop working.
    assert!(srv.store.revoke_key(&a_info.id).expect("revoke"));
    let (s, v) = srv.get("/v1/sessions", Some(&key_a)).await;
    assert_error(s, &v, StatusCode::UNAUTHORIZED, "unauthorized");
}

#[tokio::test(flavor = "multi_thread")]
async fn files_paths_sizes_and_symlinks() {
    let srv = start().await;
    let id = srv.session(None).await;
    let put = |path: &str, body: Vec<u8>| {
        srv.http
            .put(srv.url(&format!("/v1/sessions/{id}/files/{path}")))
            .body(body)
            .send()
    };
    let resp = put("dir/data.csv", b"a,b\n1,2\n".to_vec())
        .await
        .expect("put");
    assert_eq!(resp.status(), StatusCode::CREATED);
    let entry: Value = resp.json().await.expect("json");
    assert_eq!(
        (entry["path"].as_str(), entry["size"].as_u64()),
        (Some("dir/data.csv"), Some(8))
    );
    let e = srv
        .exec(&id, None, "import os\nos.symlink('/etc', 'etc')\nos.symlink('/etc/passwd', 'pw')\nopen('dir/data.csv').read()")
        .await;
    assert!(main_text(&e).contains("a,b"), "{e}");
    let (s, list) = srv
        .get(&format!("/v1/sessions/{id}/files?path=dir"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list["files"][0]["path"], "dir/data.csv");
    assert_eq!(list["files"][0]["mime"], "text/csv");
    let resp = srv
        .http
        .get(srv.url(&format!("/v1/sessions/{id}/files/dir/data.csv")))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.headers()["content-type"], "text/csv");
    assert_eq!(resp.bytes().await.expect("bytes").as_ref(), b"a,b\n1,2\n");
    // Path attacks: encoded so the client does not normalise them away.
    for bad in [
        "..%2F..%2Fetc%2Fpasswd",
        "a%2F..%2F..%2Fx",
        "%2Fetc%2Fpasswd",
        "a%00b",
    ] {
        let resp = srv
            .http
            .get(srv.url(&format!("/v1/sessions/{id}/files/{bad}")))
            .send()
            .await
            .expect("get");
        let s = resp.status();
        assert_error(
            s,
            &resp.json().await.expect("json"),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        );
    }
    let long = "a".repeat(300);
    let resp = put(&long, b"x".to_vec()).await.expect("put");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Symlinks planted by code are never followed, as files or as directories: the path is
    // well formed, the workspace's state refuses it (a link where a directory is needed is, as
    // the kernel says, not a directory: nothing below it is found).
    for (p, status, code) in [
        ("pw", StatusCode::CONFLICT, "conflict"),
        ("etc/passwd", StatusCode::NOT_FOUND, "not_found"),
    ] {
        let resp = srv
            .http
            .get(srv.url(&format!("/v1/sessions/{id}/files/{p}")))
            .send()
            .await
            .expect("get");
        let s = resp.status();
        assert_error(s, &resp.json().await.expect("json"), status, code);
    }
    let resp = put("etc/evil", b"x".to_vec()).await.expect("put");
    let s = resp.status();
    assert_error(
        s,
        &resp.json().await.expect("json"),
        StatusCode::CONFLICT,
        "conflict",
    );
    // A file where a directory is needed: a write conflicts, a read finds nothing there.
    let resp = put("dir/data.csv/inner", b"x".to_vec()).await.expect("put");
    let s = resp.status();
    let v = resp.json().await.expect("json");
    assert_error(s, &v, StatusCode::CONFLICT, "conflict");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .contains("is a file or a symbolic link"),
        "{v}"
    );
    let (s, v) = srv
        .get(&format!("/v1/sessions/{id}/files/dir/data.csv/inner"), None)
        .await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    let (s, v) = srv
        .get(&format!("/v1/sessions/{id}/files?path=dir/data.csv"), None)
        .await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
    // A directory where a file is needed, and a directory that is not empty.
    let (s, v) = srv.get(&format!("/v1/sessions/{id}/files/dir"), None).await;
    assert_error(s, &v, StatusCode::CONFLICT, "conflict");
    let resp = put("dir", b"x".to_vec()).await.expect("put");
    let s = resp.status();
    assert_error(
        s,
        &resp.json().await.expect("json"),
        StatusCode::CONFLICT,
        "conflict",
    );
    let resp = srv
        .http
        .delete(srv.url(&format!("/v1/sessions/{id}/files/dir")))
        .send()
        .await
        .expect("delete");
    let s = resp.status();
    assert_error(
        s,
        &resp.json().await.expect("json"),
        StatusCode::CONFLICT,
        "conflict",
    );
    // Every spelling of the workspace itself lists it.
    for root in ["", ".", "./", ".//.", "././"] {
        let (s, v) = srv
            .get(&format!("/v1/sessions/{id}/files?path={root}"), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{root:?}: {v}");
        assert!(
            !v["files"].as_array().expect("files").is_empty(),
            "{root:?}: {v}"
        );
    }
    let (s, _) = srv
        .get(&format!("/v1/sessions/{id}/files?path=etc"), None)
        .await;
    assert!(s.is_client_error());
    // Over the upload limit: 413.
    let resp = put("big.bin", vec![0u8; runcell_server::MAX_BODY_BYTES + 10])
        .await
        .expect("put");
    let s = resp.status();
    assert_error(
        s,
        &resp.json().await.expect("json"),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
    // Delete.
    let resp = srv
        .http
        .delete(srv.url(&format!("/v1/sessions/{id}/files/dir/data.csv")))
        .send()
        .await
        .expect("delete");
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let (s, v) = srv
        .get(&format!("/v1/sessions/{id}/files/dir/data.csv"), None)
        .await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_disconnect_queue_and_lifecycle() {
    let srv = start().await;
    let id = srv.session(None).await;
    // NDJSON: events as they happen, `end` last.
    let resp = srv
        .http
        .post(srv.url(&format!("/v1/sessions/{id}/execute")))
        .header("accept", "application/x-ndjson")
        .json(&json!({"code": "import time\nprint('a', flush=True)\ntime.sleep(0.3)\nprint('b')\n6*7"}))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let text = resp.text().await.expect("body");
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds, ["stdout", "stdout", "result", "end"], "{text}");
    assert_eq!(events[0]["text"], "a\n");
    assert_eq!(events[2]["data"]["text/plain"], "42");
    assert_eq!(events[3]["execution"]["status"], "ok");

    // A client that disconnects mid-execution interrupts it.
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(700))
        .build()
        .expect("client");
    let r = short
        .post(srv.url(&format!("/v1/sessions/{id}/execute")))
        .json(&json!({"code": "import time\ntry:\n    time.sleep(30)\nexcept KeyboardInterrupt:\n    open('was_interrupted', 'w').write('yes')\n    raise"}))
        .send()
        .await;
    assert!(r.is_err(), "the client gave up");
    let started = Instant::now();
    loop {
        let (_, files) = srv.get(&format!("/v1/sessions/{id}/files"), None).await;
        if files["files"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x["path"] == "was_interrupted"))
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never interrupted"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Past the FIFO: 429 session_busy.
    let mut slow = Vec::new();
    for _ in 0..12 {
        let srv_url = srv.url(&format!("/v1/sessions/{id}/execute"));
        let c = srv.http.clone();
        slow.push(tokio::spawn(async move {
            let r = c
                .post(srv_url)
                .json(&json!({"code": "import time; time.sleep(0.5)"}))
                .send()
                .await
                .expect("send");
            let s = r.status();
            (s, r.json::<Value>().await.unwrap_or(Value::Null))
        }));
    }
    let mut statuses = Vec::new();
    for h in slow {
        statuses.push(h.await.expect("join"));
    }
    let busy: Vec<_> = statuses
        .iter()
        .filter(|(s, _)| *s == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    assert!(!busy.is_empty(), "{statuses:?}");
    assert_eq!(busy[0].1["error"]["code"], "session_busy");
    assert!(statuses
        .iter()
        .all(|(s, _)| *s == StatusCode::OK || *s == StatusCode::TOO_MANY_REQUESTS));

    // Restart keeps files, loses variables; delete ends the session.
    srv.exec(&id, None, "v = 1").await;
    let (s, v) = srv
        .post(&format!("/v1/sessions/{id}/restart"), None, json!({}))
        .await;
    assert_eq!(
        (s, v["status"].as_str()),
        (StatusCode::OK, Some("ready")),
        "{v}"
    );
    let e = srv.exec(&id, None, "v").await;
    assert_eq!(e["error"]["name"], "NameError");
    let e = srv.exec(&id, None, "open('was_interrupted').read()").await;
    assert_eq!(main_text(&e), "'yes'");
    let (s, out) = srv
        .post(
            &format!("/v1/sessions/{id}/commands"),
            None,
            json!({"command": "ls; exit 3"}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{out}");
    assert_eq!(out["exit_code"], 3);
    assert!(out["stdout"]
        .as_str()
        .unwrap_or_default()
        .contains("was_interrupted"));
    // Commands are in the audit log too, as bash executions of the session.
    let (_, execs) = srv
        .get(&format!("/v1/executions?session_id={id}&limit=1"), None)
        .await;
    let last = &execs["executions"][0];
    assert_eq!(
        (last["language"].as_str(), last["code"].as_str()),
        (Some("bash"), Some("ls; exit 3"))
    );
    assert_eq!(last["error"]["value"], "3");
    let resp = srv
        .http
        .delete(srv.url(&format!("/v1/sessions/{id}")))
        .send()
        .await
        .expect("delete");
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let (s, v) = srv.get(&format!("/v1/sessions/{id}"), None).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");

    // The audit chain holds every execution and verifies.
    let (_, report) = srv.get("/v1/audit/verify", None).await;
    assert_eq!(report["ok"], true, "{report}");
    assert!(report["checked"].as_u64().unwrap_or(0) >= 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_shot_health_metrics_and_openapi() {
    let srv = start().await;
    let (s, e) = srv
        .post(
            "/v1/execute",
            None,
            json!({"language": "python", "code": "import sys\nprint(open('in.txt').read() + sys.stdin.read())",
                   "files": [{"path": "in.txt", "content_base64": "ZnJvbSBmaWxlIA=="}],
                   "stdin": "and stdin", "timeout_s": 20}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert_eq!(e["stdout"], "from file and stdin\n");
    assert_eq!(e["session_id"], Value::Null);
    let (s, e) = srv
        .post(
            "/v1/execute",
            None,
            json!({"language": "bash", "code": "exit 4"}),
        )
        .await;
    assert_eq!((s, e["status"].as_str()), (StatusCode::OK, Some("error")));
    let (s, v) = srv
        .post(
            "/v1/execute",
            None,
            json!({"code": "1", "files": [{"path": "../x", "content_base64": ""}]}),
        )
        .await;
    assert_error(s, &v, StatusCode::BAD_REQUEST, "invalid_request");

    let (s, v) = srv.get("/healthz", None).await;
    assert_eq!(
        (s, v),
        (
            StatusCode::OK,
            json!({"status": "ok", "zygote": {"state": "off"}, "warm_sessions": 0, "warm_one_shots": 0})
        )
    );
    let metrics = srv
        .http
        .get(srv.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for m in [
        "runcell_executions_total{status=\"ok\"}",
        "runcell_execution_duration_seconds_bucket",
        "runcell_sessions{state=\"ready\"}",
    ] {
        assert!(metrics.contains(m), "{m} missing from\n{metrics}");
    }

    // The OpenAPI document and the router come from the same declarations; every documented
    // operation must also be served (no 404/405 from the router for it).
    let (_, doc) = srv.get("/openapi.json", None).await;
    let paths = doc["paths"].as_object().expect("paths");
    for want in [
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/execute",
        "/v1/sessions/{id}/interrupt",
        "/v1/sessions/{id}/restart",
        "/v1/sessions/{id}/commands",
        "/v1/sessions/{id}/files",
        "/v1/sessions/{id}/files/{path}",
        "/v1/execute",
        "/v1/executions",
        "/v1/executions/{id}",
        "/v1/audit/verify",
        "/v1/chat",
        "/healthz",
        "/metrics",
    ] {
        assert!(paths.contains_key(want), "{want} is not documented");
    }
    for (path, ops) in paths {
        let concrete = path
            .replace("{id}", "ses_none")
            .replace("{path}", "a/b.txt");
        for method in ops.as_object().expect("ops").keys() {
            let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).expect("method");
            let resp = srv
                .http
                .request(m, srv.url(&concrete))
                .send()
                .await
                .expect("send");
            let s = resp.status();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            let unrouted = s == StatusCode::METHOD_NOT_ALLOWED
                || (s == StatusCode::NOT_FOUND && body["error"]["message"] == "route not found");
            assert!(
                !unrouted,
                "{method} {path} is documented but not served ({s})"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_queued_client_that_leaves_does_not_interrupt_another_and_errors_are_clear() {
    let srv = start().await;
    let id = srv.session(None).await;
    // A runs for a while.
    let url = srv.url(&format!("/v1/sessions/{id}/execute"));
    let c = srv.http.clone();
    let a = tokio::spawn(async move {
        c.post(url)
            .json(&json!({"code": "import time\ntime.sleep(2)\n'A done'"}))
            .send()
            .await
            .expect("a")
            .json::<Value>()
            .await
            .expect("json")
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // B queues behind it and gives up.
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .expect("client");
    let b = short
        .post(srv.url(&format!("/v1/sessions/{id}/execute")))
        .json(&json!({"code": "open('b_ran', 'w').write('x')"}))
        .send()
        .await;
    assert!(b.is_err());
    let a = a.await.expect("join");
    assert_eq!(a["status"], "ok", "A was not interrupted by B leaving: {a}");
    assert_eq!(main_text(&a), "'A done'");
    // B's abandoned request never ran.
    let e = srv
        .exec(&id, None, "import os\nos.path.exists('b_ran')")
        .await;
    assert_eq!(main_text(&e), "False");

    // Clear errors for directories and misspelt limits.
    srv.exec(
        &id,
        None,
        "import os\nos.makedirs('d/e')\nopen('d/e/f.txt', 'w').write('x')",
    )
    .await;
    let resp = srv
        .http
        .delete(srv.url(&format!("/v1/sessions/{id}/files/d")))
        .send()
        .await
        .expect("delete");
    let s = resp.status();
    let body: Value = resp.json().await.expect("json");
    // The workspace's state refuses them: 409, as for any conflict with what is there.
    assert_error(s, &body, StatusCode::CONFLICT, "conflict");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("not empty"),
        "{body}"
    );
    let (s, body) = srv.get(&format!("/v1/sessions/{id}/files/d"), None).await;
    assert_error(s, &body, StatusCode::CONFLICT, "conflict");
    let (s, body) = srv
        .get(&format!("/v1/sessions/{id}/files/nope.txt"), None)
        .await;
    assert_error(s, &body, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(body["error"]["message"], "file nope.txt not found");
    let (s, body) = srv
        .post("/v1/sessions", None, json!({"limits": {"memry_mb": 5}}))
        .await;
    assert_error(s, &body, StatusCode::BAD_REQUEST, "invalid_request");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_page_is_served_with_its_headers_and_the_chat_says_it_is_off() {
    let srv = start().await;
    let page = srv.http.get(srv.url("/")).send().await.expect("send");
    assert_eq!(page.status(), StatusCode::OK);
    let headers = page.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().expect("csp");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("script-src 'self'"),
        "{csp}"
    );
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    let etag = headers["etag"].clone();
    let html = page.text().await.expect("html");
    assert!(html.contains("/assets/app.js"), "{html}");
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing from elsewhere"
    );
    let again = srv
        .http
        .get(srv.url("/"))
        .header("if-none-match", etag)
        .send()
        .await
        .expect("send");
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    for (asset, kind) in [
        ("app.js", "text/javascript; charset=utf-8"),
        ("editor.js", "text/javascript; charset=utf-8"),
        ("app.css", "text/css; charset=utf-8"),
        ("icon.svg", "image/svg+xml"),
    ] {
        let r = srv
            .http
            .get(srv.url(&format!("/assets/{asset}")))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), StatusCode::OK, "{asset}");
        assert_eq!(r.headers()["content-type"], kind, "{asset}");
    }
    let (s, v) = srv.get("/assets/nope.js", None).await;
    assert_error(s, &v, StatusCode::NOT_FOUND, "not_found");

    let (s, v) = srv.get("/v1/chat", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["enabled"], false, "{v}");
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("--agent-provider")),
        "{v}"
    );
    let form = reqwest::multipart::Form::new().text("question", "Hello?");
    let resp = srv.chat(form).await;
    let status = resp.status();
    let v: Value = resp.json().await.expect("json");
    assert_error(status, &v, StatusCode::NOT_FOUND, "not_found");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not configured")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chat_reports_a_provider_that_refuses_its_key_and_rejects_empty_questions() {
    use runcell_agent::testing::StandIn;
    let stand_in = StandIn::start(|_, _| {
        (
            401,
            vec![],
            r#"{"error":{"message":"Incorrect API key provided"}}"#.to_owned(),
        )
    });
    let srv = common::start_with_chat(Some(runcell_server::ChatConfig {
        provider: stand_in.config(runcell_agent::ProviderKind::OpenAi),
        max_steps: 3,
    }))
    .await;
    let (s, v) = srv.get("/v1/chat", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["enabled"], true, "{v}");
    assert_eq!(v["model"], "test-model", "{v}");

    let empty = reqwest::multipart::Form::new().text("question", "  ");
    let resp = srv.chat(empty).await;
    let status = resp.status();
    let v: Value = resp.json().await.expect("json");
    assert_error(status, &v, StatusCode::BAD_REQUEST, "invalid_request");

    let form = reqwest::multipart::Form::new()
        .text("question", "What is in the file?")
        .part(
            "file",
            reqwest::multipart::Part::bytes(b"a,b\n1,2\n".to_vec()).file_name("data.csv"),
        );
    let resp = srv.chat(form).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let body = resp.text().await.expect("body");
    let events: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).expect("an NDJSON line"))
        .collect();
    assert_eq!(events[0]["type"], "session", "{body}");
    let session = events[0]["session"]["id"].as_str().expect("id");
    let end = events.last().expect("end");
    assert_eq!(end["type"], "end", "{body}");
    assert_eq!(end["status"], 502, "{body}");
    let message = end["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("Incorrect API key provided") && message.contains("OPENAI_API_KEY"),
        "{message}"
    );
    // The session is the caller's, and the question's file is in it.
    let (s, v) = srv
        .get(&format!("/v1/sessions/{session}/files"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["files"][0]["path"], "data.csv", "{v}");
    assert_eq!(stand_in.requests().len(), 1, "a refused key is not retried");
}
