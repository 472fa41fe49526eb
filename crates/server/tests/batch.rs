//! `POST /v1/batch` and one-shot test cases over HTTP: NDJSON in completion order with each
//! run's index and verdicts, every run audited, and bad batches refused whole with a 400
//! before anything runs.

mod common;

use reqwest::StatusCode;
use serde_json::{json, Value};

async fn post(srv: &common::Server, path: &str, body: Value) -> (StatusCode, String, String) {
    let resp = srv
        .http
        .post(format!("{}{path}", srv.base))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = resp.status();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (status, ctype, resp.text().await.expect("body"))
}

async fn get(srv: &common::Server, path: &str) -> Value {
    let resp = srv
        .http
        .get(format!("{}{path}", srv.base))
        .send()
        .await
        .expect("send");
    resp.json().await.expect("json")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_streams_every_run_with_its_index_and_verdicts() {
    let srv = common::start().await;
    let sum = "print(sum(map(int, input().split())))";
    let tests = json!([{"stdin": "1 2\n", "expected_stdout": "3\n"}, {"stdin": "5 5", "expected_stdout": "10"}]);
    let runs = json!([
        {"code": sum, "tests": tests},
        {"code": "print(1 + 1)"},
        {"code": "print(sum(map(int, input().split())) * 2)", "tests": tests},
        {"language": "bash", "code": "echo \"$1-$2\"", "args": ["a", "b"]},
        {"code": "import time\ntime.sleep(30)", "timeout_s": 1, "tests": [{"expected_stdout": ""}]},
        {"code": "raise SystemExit(3)", "tests": [{"stdin": "", "expected_stdout": ""}]},
        {"code": "print(2/3)", "comparison": "numeric", "tolerance": 0.001,
         "tests": [{"expected_stdout": "0.667"}]},
        {"code": "print('x')", "start": "cold"},
    ]);
    let n = runs.as_array().map_or(0, Vec::len);
    let (status, ctype, body) =
        post(&srv, "/v1/batch", json!({"runs": runs, "concurrency": 3})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(ctype, "application/x-ndjson");
    let mut lines: Vec<Value> = body
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), n, "{body}");
    lines.sort_by_key(|l| l["index"].as_u64());
    let summary = |l: &Value| {
        (
            l["summary"]["verdict"].as_str().unwrap_or("-").to_owned(),
            l["summary"]["passed"].as_u64(),
        )
    };
    assert_eq!(summary(&lines[0]), ("accepted".into(), Some(2)));
    assert_eq!(lines[0]["tests"][1]["verdict"], "accepted");
    assert_eq!(lines[1]["stdout"], "2\n");
    assert!(lines[1].get("tests").is_none());
    assert_eq!(summary(&lines[2]), ("wrong_answer".into(), Some(0)));
    assert_eq!(lines[2]["tests"][0]["stdout"], "6\n");
    assert_eq!(lines[3]["stdout"], "a-b\n");
    assert_eq!(summary(&lines[4]), ("time_limit".into(), Some(0)));
    assert_eq!(lines[4]["status"], "timeout");
    assert_eq!(summary(&lines[5]), ("runtime_error".into(), Some(0)));
    assert_eq!(lines[5]["tests"][0]["exit_code"], 3);
    assert_eq!(summary(&lines[6]), ("accepted".into(), Some(1)));
    assert_eq!(lines[7]["stdout"], "x\n");

    // Every run, every test, is its own audited execution.
    let ids: Vec<String> = lines
        .iter()
        .flat_map(|l| match l["tests"].as_array() {
            Some(t) => t.iter().map(|t| t["execution_id"].clone()).collect(),
            None => vec![l["id"].clone()],
        })
        .map(|v| v.as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(ids.len(), 2 + 1 + 2 + 1 + 1 + 1 + 1 + 1);
    for id in &ids {
        let e = get(&srv, &format!("/v1/executions/{id}")).await;
        assert_eq!(e["id"], id.as_str(), "{e}");
    }
    let verify = get(&srv, "/v1/audit/verify").await;
    assert_eq!(verify["ok"], true, "{verify}");

    // /v1/execute takes tests too.
    let (status, _, body) = post(&srv, "/v1/execute", json!({"code": sum, "tests": tests})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(summary(&v), ("accepted".into(), Some(2)));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_batches_are_refused_whole_before_anything_runs() {
    let srv = common::start().await;
    let before = get(&srv, "/v1/audit/verify").await["checked"].as_u64();
    let many: Vec<Value> = (0..1001).map(|_| json!({"code": "1"})).collect();
    for (body, code) in [
        (json!({"runs": []}), "invalid_request"),
        (json!({"runs": many}), "invalid_request"),
        (
            json!({"runs": [{"code": "1"}], "concurrency": 0}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"code": "1"}], "concurrency": 65}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"code": "1"}, {"language": "cobol", "code": "1"}]}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"code": "1", "tests": [{"stdin": "1"}]}]}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"code": "1", "args": ["a\u{0}b"]}]}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"code": "1"}, {"code": "1", "timeout_s": 0}]}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"code": "1", "files": [{"path": "../x", "content_base64": ""}]}]}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"code": "1", "tolerance": -1}]}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"language": "bash", "code": "1", "start": "zygote"}]}),
            "invalid_request",
        ),
        (
            json!({"runs": [{"code": "x".repeat((1 << 20) + 1)}]}),
            "payload_too_large",
        ),
    ] {
        let (status, _, text) = post(&srv, "/v1/batch", body).await;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        assert!(status.is_client_error(), "{status} {text}");
        assert_eq!(v["error"]["code"], code, "{text}");
    }
    let tests: Vec<Value> = (0..101).map(|_| json!({"expected_stdout": ""})).collect();
    let (status, _, text) = post(&srv, "/v1/execute", json!({"code": "1", "tests": tests})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    // Nothing ran.
    assert_eq!(
        get(&srv, "/v1/audit/verify").await["checked"].as_u64(),
        before
    );
}
