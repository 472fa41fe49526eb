//! What API clients see, as insta snapshots (tests/snapshots/): a Session, the Execution of a
//! value, an error and a written file, the NDJSON stream of one execution and the error envelope.
//! Ids, times and usage figures differ on every run; they are checked for their shape and
//! redacted, so a change to any other field, a field added, renamed or dropped, fails here.

mod common;

use common::{start, Server};
use insta::internals::{Content, ContentPath};
use reqwest::StatusCode;
use serde_json::{json, Value};

impl Server {
    async fn send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let resp = req.send().await.expect("send");
        let status = resp.status();
        (status, resp.json().await.expect("a JSON body"))
    }

    async fn execute(&self, session: &str, code: &str) -> Value {
        let url = format!("{}/v1/sessions/{session}/execute", self.base);
        let (status, v) = self
            .send(self.http.post(url).json(&json!({ "code": code })))
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    }
}

/// `prefix_` and `len` characters of the ids' alphabet: 16 random ones for a session, 10 of
/// time and 16 random ones for an execution.
fn id(prefix: &'static str, len: usize) -> impl Fn(Content, ContentPath<'_>) -> String {
    move |value, path| {
        let s = value.as_str().unwrap_or_default();
        let rest = s.strip_prefix(prefix).and_then(|r| r.strip_prefix('_'));
        assert!(
            rest.is_some_and(|r| r.len() == len
                && r.bytes()
                    .all(|b| b"0123456789abcdefghjkmnpqrstvwxyz".contains(&b))),
            "{path}: {s:?} is not a {prefix}_ id"
        );
        format!("[{prefix}_id]")
    }
}

/// RFC 3339 in UTC with milliseconds (`2026-01-02T03:04:05.678Z`).
fn time(value: Content, path: ContentPath<'_>) -> &'static str {
    let s = value.as_str().unwrap_or_default();
    let shape = s.bytes().enumerate().all(|(i, b)| match i {
        4 | 7 => b == b'-',
        10 => b == b'T',
        13 | 16 => b == b':',
        19 => b == b'.',
        23 => b == b'Z',
        _ => b.is_ascii_digit(),
    });
    assert!(
        s.len() == 24 && shape,
        "{path}: {s:?} is not an RFC 3339 UTC time"
    );
    "[time]"
}

/// A measured figure: a whole number that differs from run to run.
fn figure(value: Content, path: ContentPath<'_>) -> &'static str {
    assert!(value.as_u64().is_some(), "{path}: {value:?} is not a count");
    "[figure]"
}

/// The Execution's redactions, under `at` (`""` for a bare Execution).
macro_rules! assert_execution_snapshot {
    ($name:expr, $value:expr, $at:literal) => {
        insta::assert_json_snapshot!($name, $value, {
            concat!($at, ".id") => insta::dynamic_redaction(id("ex", 26)),
            concat!($at, ".session_id") => insta::dynamic_redaction(id("ses", 16)),
            concat!($at, ".started_at") => insta::dynamic_redaction(time),
            concat!($at, ".finished_at") => insta::dynamic_redaction(time),
            concat!($at, ".usage.wall_ms") => insta::dynamic_redaction(figure),
            concat!($at, ".usage.cpu_ms") => insta::dynamic_redaction(figure),
            concat!($at, ".usage.peak_memory_bytes") => insta::dynamic_redaction(figure),
        })
    };
}

#[tokio::test(flavor = "multi_thread")]
async fn what_api_clients_see() {
    let srv = start().await;

    let (status, session) = srv
        .send(
            srv.http
                .post(format!("{}/v1/sessions", srv.base))
                .json(&json!({ "metadata": { "user": "snapshot" } })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{session}");
    insta::assert_json_snapshot!("session", session, {
        ".id" => insta::dynamic_redaction(id("ses", 16)),
        ".created_at" => insta::dynamic_redaction(time),
        ".last_active_at" => insta::dynamic_redaction(time),
        ".expires_at" => insta::dynamic_redaction(time),
    });
    let sid = session["id"].as_str().expect("id").to_owned();

    let value = srv
        .execute(&sid, "print('hello')\nanswer = 6 * 7\nanswer")
        .await;
    assert_eq!(value["session_id"], sid.as_str());
    assert_execution_snapshot!("execution_value", value, "");

    let error = srv.execute(&sid, "answer / 0").await;
    assert_execution_snapshot!("execution_error", error, "");

    let file = srv
        .execute(
            &sid,
            "with open('answer.txt', 'w') as f:\n    f.write(str(answer))",
        )
        .await;
    assert_execution_snapshot!("execution_file", file, "");

    let resp = srv
        .http
        .post(format!("{}/v1/sessions/{sid}/execute", srv.base))
        .header("accept", "application/x-ndjson")
        .json(&json!({ "code": "print('streamed')\nanswer + 1" }))
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let events: Vec<Value> = resp
        .text()
        .await
        .expect("body")
        .lines()
        .map(|l| serde_json::from_str(l).expect("an event per line"))
        .collect();
    assert_execution_snapshot!("execution_stream", events, "[].execution");

    let (status, missing) = srv
        .send(
            srv.http
                .get(format!("{}/v1/sessions/ses_0000000000000000", srv.base)),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    insta::assert_json_snapshot!("error_not_found", missing);
}
