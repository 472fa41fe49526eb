//! Dead sessions (a kernel that ended with an earlier server process, or could not be
//! restarted): listed as `dead`, answering 409, counted by `/metrics`, and expiring after
//! their idle timeout like any other session.

mod common;

use std::time::Duration;

use common::start;
use reqwest::StatusCode;
use serde_json::{json, Value};

async fn call(srv: &common::Server, method: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let url = format!("{}{path}", srv.base);
    let req = match method {
        "POST" => srv.http.post(url).json(&body),
        _ => srv.http.get(url),
    };
    let resp = req.send().await.expect("send");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn dead_gauge(srv: &common::Server) -> String {
    let text = srv
        .http
        .get(format!("{}/metrics", srv.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .find(|l| l.starts_with("runcell_sessions{state=\"dead\"}"))
        .unwrap_or_default()
        .to_owned()
}

async fn listed(srv: &common::Server) -> Vec<(String, String)> {
    let (_, list) = call(srv, "GET", "/v1/sessions", Value::Null).await;
    list["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["id"].as_str().unwrap_or_default().to_owned(),
                s["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_dead_with_an_earlier_server_are_counted_and_expire() {
    let srv = start().await;
    let (s, live) = call(&srv, "POST", "/v1/sessions", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{live}");
    let rows = srv
        .store
        .sessions_with_status(&["starting", "ready", "busy"])
        .expect("rows");
    let template = rows.first().expect("the live session's row").clone();
    // As recovery leaves them: one still within its idle timeout, one past it.
    let now = chrono::Utc::now();
    for (id, expires_at) in [
        ("ses_deadfresh", now + chrono::Duration::hours(1)),
        ("ses_deadold", now - chrono::Duration::seconds(1)),
    ] {
        let mut rec = template.clone();
        rec.id = id.into();
        rec.status = "dead".into();
        rec.expires_at = expires_at;
        srv.store.put_session(&rec).expect("put");
    }
    let sessions = listed(&srv).await;
    assert!(
        sessions.contains(&("ses_deadfresh".into(), "dead".into())),
        "{sessions:?}"
    );
    assert!(!sessions.iter().any(|(id, _)| id == "ses_deadold"));
    let (s, _) = call(&srv, "GET", "/v1/sessions/ses_deadold", Value::Null).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(
        srv.store
            .get_session(&template.tenant, "ses_deadold")
            .expect("get")
            .is_none(),
        "an expired dead session is forgotten"
    );
    let (s, body) = call(
        &srv,
        "POST",
        "/v1/sessions/ses_deadfresh/execute",
        json!({"code": "1"}),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert_eq!(dead_gauge(&srv).await, "runcell_sessions{state=\"dead\"} 1");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_whose_kernel_cannot_restart_is_dead_then_expires() {
    let srv = start().await;
    let (s, info) = call(
        &srv,
        "POST",
        "/v1/sessions",
        json!({"limits": {"idle_timeout_s": 2}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{info}");
    let id = info["id"].as_str().expect("id").to_owned();
    // Without its kernel's files no kernel can start again.
    let kernel_dir = srv.engine.config().data_dir.join("kernel");
    std::fs::remove_dir_all(&kernel_dir).expect("remove the kernel files");
    let (s, e) = call(
        &srv,
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": "import os; os._exit(1)"}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert!(
        e["error"]["value"]
            .as_str()
            .is_some_and(|v| v.contains("could not be restarted")),
        "{e}"
    );
    assert!(listed(&srv).await.contains(&(id.clone(), "dead".into())));
    assert_eq!(dead_gauge(&srv).await, "runcell_sessions{state=\"dead\"} 1");
    let (s, body) = call(
        &srv,
        "POST",
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": "1"}),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    // Idle for its 2 s (the expiry sweep runs every second).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while listed(&srv).await.iter().any(|(i, _)| *i == id) {
        assert!(
            std::time::Instant::now() < deadline,
            "a dead session never expired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(dead_gauge(&srv).await, "runcell_sessions{state=\"dead\"} 0");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounted.contains(&id), "its workspace is unmounted");
}
