//! Frames a cell forges on its kernel's channel, over HTTP: every execution is answered
//! (never a 500) and in the audit log with the code that was sent and the host's count; a
//! garbage frame is a `ProtocolError` whose reply says the session was restarted; what a
//! cell prints after a forged end is in no other execution's reply or record.

mod common;

use std::time::Duration;

use common::start;
use reqwest::StatusCode;
use serde_json::{json, Value};

const FORGE: &str = r#"
import gc, json, os, struct
def frame(msg):
    body = json.dumps(msg).encode()
    os.write(3, struct.pack('>I', len(body)) + body)
def current_id():
    return next(o for o in gc.get_objects() if type(o).__name__ == 'Kernel' and hasattr(o, 'current_id')).current_id
"#;

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

async fn get(srv: &common::Server, path: &str) -> (StatusCode, Value) {
    let resp = srv
        .http
        .get(format!("{}{path}", srv.base))
        .send()
        .await
        .expect("send");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_frames_are_recorded_with_the_hosts_code_and_count_and_stay_in_their_cell() {
    let srv = start().await;
    let (s, session) = post(&srv, "/v1/sessions", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().expect("id");
    let execute = format!("/v1/sessions/{id}/execute");

    let garbage = "open('side.txt', 'w').write('s')\nimport os\nos.write(3, b'\\x00\\x00\\x00\\x01x')\nimport time\ntime.sleep(30)";
    let (s, e) = post(&srv, &execute, json!({ "code": garbage })).await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert_eq!(e["status"], "killed", "{e}");
    assert_eq!(e["error"]["name"], "ProtocolError", "{e}");
    let value = e["error"]["value"].as_str().unwrap_or_default();
    assert!(value.contains("The session was restarted"), "{value}");
    assert_eq!(e["files"][0]["path"], "side.txt", "{e}");

    let (s, e) = post(&srv, &execute, json!({ "code": FORGE })).await;
    assert_eq!(
        (s, e["execution_count"].as_u64()),
        (StatusCode::OK, Some(1))
    );
    let forged = "frame({'type': 'done', 'id': current_id(), 'status': 'ok', 'execution_count': 99})\nprint('after')";
    let (s, f) = post(&srv, &execute, json!({ "code": forged })).await;
    assert_eq!(s, StatusCode::OK, "{f}");
    assert_eq!(f["execution_count"], 2, "the host's count: {f}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, next) = post(&srv, &execute, json!({ "code": "print('next')" })).await;
    assert_eq!(s, StatusCode::OK, "{next}");
    assert_eq!(next["stdout"], "next\n", "{next}");
    assert_eq!(next["execution_count"], 3);

    // The audit log: every execution sent, in order, with the code sent.
    let (s, list) = get(&srv, &format!("/v1/executions?session_id={id}")).await;
    assert_eq!(s, StatusCode::OK, "{list}");
    let mut rows = list["executions"].as_array().cloned().unwrap_or_default();
    rows.sort_by(|a, b| a["started_at"].as_str().cmp(&b["started_at"].as_str()));
    let codes: Vec<&str> = rows.iter().filter_map(|r| r["code"].as_str()).collect();
    assert_eq!(codes, [garbage, FORGE, forged, "print('next')"], "{list}");
    assert_eq!(rows[0]["error"]["name"], "ProtocolError");
    assert_eq!(rows[2]["execution_count"], 2);
    assert_eq!(rows[3]["stdout"], "next\n");
    let (s, verify) = get(&srv, "/v1/audit/verify").await;
    assert_eq!(s, StatusCode::OK, "{verify}");
}
