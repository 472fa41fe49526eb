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
    let big = "x".repeat(runcell_engine::MAX_ENV_BYTES);
    let got = post(&srv, "/v1/sessions", json!({"env": {"A": big}})).await;
    assert_error(
        &got,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "environment",
    );

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
