//! HTTP details real clients trip on: how `Authorization` is read (in open mode and with
//! keys), what a 401 says, and that every rejection axum makes before a handler runs (path,
//! query, body, content type, method) comes in the error envelope.

mod common;

use reqwest::StatusCode;
use serde_json::{json, Value};

async fn send(req: reqwest::RequestBuilder) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let resp = req.send().await.expect("send");
    let status = resp.status();
    let headers = resp.headers().clone();
    let text = resp.text().await.expect("body");
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{status}: not JSON ({e}): {text:?}"));
    (status, headers, body)
}

fn assert_envelope(status: StatusCode, body: &Value, want: StatusCode, code: &str) {
    assert_eq!(status, want, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(body["error"]["message"].is_string(), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn open_mode_ignores_any_authorization_header() {
    let srv = common::start().await;
    let url = format!("{}/v1/sessions", srv.base);
    for auth in [
        "Bearer rc_not-a-key",
        "bearer sk-placeholder",
        "Basic dXNlcjpwYXNz",
        "Bearer",
        "nonsense",
    ] {
        let (s, _, v) = send(srv.http.get(&url).header("authorization", auth)).await;
        assert_eq!(s, StatusCode::OK, "{auth}: {v}");
        assert!(v["sessions"].is_array(), "{auth}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_keys_401s_name_bearer_and_the_scheme_is_case_insensitive() {
    let srv = common::start().await;
    let (_, key) = srv.store.create_key("k", "tenant-k").expect("key");
    let url = format!("{}/v1/sessions", srv.base);

    for (auth, says) in [
        (None, "an API key is required"),
        (Some("Bearer rc_not-a-key".to_owned()), "invalid or revoked"),
        (Some("Basic dXNlcjpwYXNz".to_owned()), "must be Bearer"),
        (Some("Bearer ".to_owned()), "must be Bearer"),
        (Some(format!("Token {key}")), "must be Bearer"),
    ] {
        let mut req = srv.http.get(&url);
        if let Some(a) = &auth {
            req = req.header("authorization", a);
        }
        let (s, headers, v) = send(req).await;
        assert_envelope(s, &v, StatusCode::UNAUTHORIZED, "unauthorized");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(says)),
            "{auth:?}: {v}"
        );
        let challenge = headers
            .get("www-authenticate")
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        assert!(challenge.starts_with("Bearer"), "{auth:?}: {challenge:?}");
    }

    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let (s, _, v) = send(
            srv.http
                .get(&url)
                .header("authorization", format!("{scheme} {key}")),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{scheme}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rejections_before_the_handler_use_the_error_envelope() {
    let srv = common::start().await;
    let (s, _, v) = send(
        srv.http
            .post(format!("{}/v1/sessions", srv.base))
            .json(&json!({})),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id");

    // A path segment that is not UTF-8 once decoded.
    for path in [
        format!("/v1/sessions/{id}/files/%FF"),
        format!("/v1/sessions/{id}/files/a%C3%28b"),
        "/v1/sessions/%FF".to_owned(),
        "/v1/executions/%FF%FE".to_owned(),
    ] {
        let (s, _, v) = send(srv.http.get(format!("{}{path}", srv.base))).await;
        assert_envelope(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    }
    let (s, _, v) = send(
        srv.http
            .put(format!("{}/v1/sessions/{id}/files/%FF", srv.base))
            .body("x"),
    )
    .await;
    assert_envelope(s, &v, StatusCode::BAD_REQUEST, "invalid_request");

    // Bodies: not JSON, the wrong content type, none at all, the wrong shape.
    let execute = format!("{}/v1/sessions/{id}/execute", srv.base);
    for req in [
        srv.http
            .post(&execute)
            .header("content-type", "application/json")
            .body("{\"code\": "),
        srv.http
            .post(&execute)
            .header("content-type", "text/plain")
            .body("{\"code\": \"1\"}"),
        srv.http.post(&execute).body("{\"code\": \"1\"}"),
        srv.http.post(&execute),
        srv.http.post(&execute).json(&json!({"code": 1})),
        srv.http.post(&execute).json(&json!([])),
    ] {
        let (s, _, v) = send(req).await;
        assert_envelope(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    }

    // Queries of the wrong type or with unknown fields.
    for q in ["limit=abc", "limit=-1", "bogus=1"] {
        let (s, _, v) = send(srv.http.get(format!("{}/v1/executions?{q}", srv.base))).await;
        assert_envelope(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    }
    let (s, _, v) = send(srv.http.get(format!(
        "{}/v1/sessions/{id}/files?path=.&bogus=1",
        srv.base
    )))
    .await;
    assert_envelope(s, &v, StatusCode::BAD_REQUEST, "invalid_request");

    // A multipart upload without a boundary.
    let (s, _, v) = send(
        srv.http
            .post(format!("{}/v1/sessions/{id}/files", srv.base))
            .header("content-type", "multipart/form-data")
            .body("x"),
    )
    .await;
    assert_envelope(s, &v, StatusCode::BAD_REQUEST, "invalid_request");

    // A route asked with a method it does not serve, and no route at all.
    let (s, _, v) = send(srv.http.put(format!("{}/v1/sessions", srv.base))).await;
    assert_envelope(s, &v, StatusCode::METHOD_NOT_ALLOWED, "invalid_request");
    let (s, _, v) = send(srv.http.patch(format!("{}/v1/sessions/{id}", srv.base))).await;
    assert_envelope(s, &v, StatusCode::METHOD_NOT_ALLOWED, "invalid_request");
    let (s, _, v) = send(srv.http.get(format!("{}/v1/nowhere/%FF", srv.base))).await;
    assert_envelope(s, &v, StatusCode::NOT_FOUND, "not_found");
}
