//! Bad input over HTTP is the caller's mistake: a 4xx with the error envelope, or for a time
//! limit shorter than a sandbox's start-up, an execution that timed out; never a 500.

mod common;

use reqwest::StatusCode;
use serde_json::{json, Value};

async fn post(srv: &common::Server, path: &str, body: Value) -> (StatusCode, Value) {
    let resp = srv
        .http
        .post(format!("{}{path}", srv.base))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn assert_error(got: &(StatusCode, Value), want: StatusCode, code: &str, says: &str) {
    let (status, body) = got;
    assert_eq!(*status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{message:?} should say {says:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_time_limit_shorter_than_the_start_up_times_out() {
    let srv = common::start().await;
    // 1 ms kills the sandbox before its helper has read its spec; 1e-300 s is positive too.
    for t in [0.001, 1e-300] {
        let (s, e) = post(
            &srv,
            "/v1/execute",
            json!({"code": "print(1)", "timeout_s": t}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "timeout_s {t}: {e}");
        assert_eq!(e["status"], "timeout", "timeout_s {t}: {e}");
    }
    let (s, v) = post(&srv, "/v1/sessions", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id");
    for t in [0.001, 1e-300] {
        let (s, out) = post(
            &srv,
            &format!("/v1/sessions/{id}/commands"),
            json!({"command": "echo hi", "timeout_s": t}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "timeout_s {t}: {out}");
        assert_eq!(out["usage"]["killed_by"], "timeout", "timeout_s {t}: {out}");
        let (s, e) = post(
            &srv,
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": "1", "timeout_s": t}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "timeout_s {t}: {e}");
    }
    // The session is still usable.
    let (s, out) = post(
        &srv,
        &format!("/v1/sessions/{id}/commands"),
        json!({"command": "echo hi"}),
    )
    .await;
    assert_eq!((s, out["stdout"].as_str()), (StatusCode::OK, Some("hi\n")));
}

#[tokio::test(flavor = "multi_thread")]
async fn nul_bytes_and_oversized_environments_are_refused() {
    let srv = common::start().await;
    let got = post(&srv, "/v1/sessions", json!({"env": {"A": "x\u{0}y"}})).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_request", "NUL");
    let got = post(&srv, "/v1/sessions", json!({"env": {"A\u{0}": "y"}})).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_request", "name");
    let big = "x".repeat(runcell_engine::MAX_ENV_VAR_BYTES);
    let got = post(&srv, "/v1/sessions", json!({"env": {"A": big}})).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_request", "env");

    let (s, v) = post(&srv, "/v1/sessions", json!({"env": {"A": "fine"}})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id");
    let got = post(
        &srv,
        &format!("/v1/sessions/{id}/commands"),
        json!({"command": "echo a\u{0}b"}),
    )
    .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_request", "NUL");
    let (s, e) = post(
        &srv,
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": "import os; print(os.environ['A'])"}),
    )
    .await;
    assert_eq!(
        (s, e["stdout"].as_str()),
        (StatusCode::OK, Some("fine\n")),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_are_objects_limits_whole_numbers_and_an_unknown_cursor_is_not_found() {
    let srv = common::start().await;
    // serde builds a struct from an array of its fields; no schema of the API allows one.
    let got = post(&srv, "/v1/sessions/x/execute", json!(["print(1)"])).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_request", "object");
    let got = post(&srv, "/v1/sessions", json!({"limits": [null, null]})).await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_request", "limits");
    let got = post(
        &srv,
        "/v1/execute",
        json!({"code": "1", "files": [["a", "YQ=="]]}),
    )
    .await;
    assert_error(&got, StatusCode::BAD_REQUEST, "invalid_request", "files");
    // JSON Schema's integer: 64.0 is one.
    let (s, v) = post(&srv, "/v1/sessions", json!({"limits": {"disk_mb": 64.0}})).await;
    assert_eq!(
        (s, &v["limits"]["disk_mb"]),
        (StatusCode::CREATED, &json!(64)),
        "{v}"
    );
    let got = post(&srv, "/v1/sessions", json!({"limits": {"disk_mb": 64.5}})).await;
    assert_error(
        &got,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "whole number",
    );

    let resp = srv
        .http
        .get(format!("{}/v1/executions?before=ex_nothing", srv.base))
        .send()
        .await
        .expect("send");
    let got = (resp.status(), resp.json::<Value>().await.expect("json"));
    assert_error(&got, StatusCode::NOT_FOUND, "not_found", "ex_nothing");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_document_states_the_statuses_security_and_ranges_of_this_server() {
    let srv = common::start().await;
    let doc: Value = srv
        .http
        .get(format!("{}/openapi.json", srv.base))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(doc.get("security"), None, "security is per operation");
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("ops") {
            let responses = op["responses"].as_object().expect("responses");
            for (status, r) in responses {
                assert!(
                    r["description"].as_str().is_some_and(|d| !d.is_empty()),
                    "{method} {path} {status} has no description"
                );
            }
            let keyed = path != "/healthz";
            assert_eq!(op.get("security").is_some(), keyed, "{method} {path}");
            assert_eq!(responses.contains_key("401"), keyed, "{method} {path}");
            for p in op["parameters"].as_array().into_iter().flatten() {
                let named = format!("{{{}}}", p["name"].as_str().unwrap_or_default());
                let in_path = path.contains(&named);
                assert_eq!(p["in"] == "path", in_path, "{method} {path} {p}");
                assert_eq!(p["required"] == true, in_path, "{method} {path} {p}");
            }
        }
    }
    let limits = &doc["components"]["schemas"]["LimitsRequest"]["properties"];
    let max = srv.engine.config().limits.max;
    assert_eq!(limits["memory_mb"]["minimum"], 16);
    assert_eq!(limits["memory_mb"]["maximum"], max.memory_mb);
    assert_eq!(limits["pids"]["maximum"], max.pids);
    let timeout = &doc["components"]["schemas"]["ExecuteRequest"]["properties"]["timeout_s"];
    assert_eq!(timeout["exclusiveMinimum"], 0);
    assert_eq!(timeout["maximum"], max.exec_timeout_s);
}
