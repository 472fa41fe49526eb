//! Control points over HTTP: a chat run with `approval: always` whose cells wait until
//! `POST /v1/approvals/{id}` approves, declines or edits them; and `POST
//! /v1/sessions/{id}/replay` on a recorded session.

mod common;

use reqwest::StatusCode;
use runcell_agent::testing::StandIn;
use serde_json::{json, Value};

fn call(id: &str, code: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": null, "tool_calls": [{
            "id": id, "type": "function",
            "function": {"name": "python", "arguments": json!({"code": code}).to_string()}}]}}]})
}

fn last_tool_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

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
async fn chat_cells_wait_for_approve_decline_and_edit_over_http() {
    let stand_in = StandIn::start(|n, _| {
        let body = match n {
            0 => call("call_a", "print('A=' + str(6 * 7))"),
            1 => call("call_b", "import os; os.remove('data.csv')"),
            2 => call("call_c", "print('C=' + str(1))"),
            _ => json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "done"}}]}),
        };
        (200, vec![], body.to_string())
    });
    let srv = common::start_with_chat(Some(runcell_server::ChatConfig {
        provider: stand_in.config(runcell_agent::ProviderKind::OpenAi),
        max_steps: 6,
    }))
    .await;

    // Nothing waits yet; unknown ids are 404, bad bodies 400.
    let (s, v) = get(&srv, "/v1/approvals").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v, json!({"object": "list", "data": []}));
    let (s, v) = post(
        &srv,
        "/v1/approvals/apv_nope",
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    let (s, _) = post(&srv, "/v1/approvals/apv_nope", json!({"decision": "maybe"})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let form = reqwest::multipart::Form::new()
        .text("question", "Compute things")
        .text("approval", "always");
    let mut resp = srv
        .http
        .post(format!("{}/v1/chat", srv.base))
        .multipart(form)
        .send()
        .await
        .expect("chat");
    assert_eq!(resp.status(), StatusCode::OK);

    let answers = [
        json!({"decision": "approve"}),
        json!({"decision": "decline", "reason": "it deletes the data"}),
        json!({"decision": "edit", "code": "print('C=' + str(2))"}),
    ];
    let mut answered = 0;
    let mut buf = String::new();
    let mut events = Vec::new();
    let mut session = String::new();
    while let Some(chunk) = resp.chunk().await.expect("chunk") {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(nl) = buf.find('\n') {
            let line: String = buf.drain(..=nl).collect();
            let event: Value = serde_json::from_str(&line).expect("NDJSON");
            if event["type"] == "session" {
                session = event["session"]["id"].as_str().expect("id").to_owned();
            }
            if event["type"] == "approval" {
                let id = event["approval"]["id"].as_str().expect("id").to_owned();
                // Listed while it waits, with its session and code.
                let (s, list) = get(&srv, "/v1/approvals").await;
                assert_eq!(s, StatusCode::OK);
                assert_eq!(list["data"].as_array().expect("data").len(), 1, "{list}");
                assert_eq!(list["data"][0]["id"], id.as_str());
                assert_eq!(list["data"][0]["session_id"], session.as_str());
                assert_eq!(list["data"][0]["code"], event["approval"]["code"]);
                if answered == 2 {
                    // `edit` needs its code.
                    let (s, v) = post(
                        &srv,
                        &format!("/v1/approvals/{id}"),
                        json!({"decision": "edit"}),
                    )
                    .await;
                    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
                }
                let (s, v) = post(
                    &srv,
                    &format!("/v1/approvals/{id}"),
                    answers[answered].clone(),
                )
                .await;
                assert_eq!(s, StatusCode::OK, "{v}");
                assert_eq!(v["id"], id.as_str());
                // Answered once only.
                let (s, _) = post(
                    &srv,
                    &format!("/v1/approvals/{id}"),
                    json!({"decision": "approve"}),
                )
                .await;
                assert_eq!(s, StatusCode::NOT_FOUND);
                answered += 1;
            }
            events.push(event);
        }
    }
    assert_eq!(answered, 3, "{events:#?}");
    let end = events.last().expect("end");
    assert_eq!(end["type"], "end", "{end}");
    assert_eq!(end["answer"], "done", "{end}");

    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 4);
    assert!(last_tool_text(&reqs[1].body).contains("A=42"));
    assert_eq!(
        last_tool_text(&reqs[2].body),
        "the user declined to run this code: it deletes the data"
    );
    let edited = last_tool_text(&reqs[3].body);
    assert!(
        edited.contains("C=2") && edited.contains("the user edited the code"),
        "{edited}"
    );

    // The audit log has each decision, who made it and both versions of the edited cell; the
    // executions API lists only the two cells that ran.
    let (rows, _) = srv
        .store
        .list_executions("default", Some(&session), 100, None)
        .expect("rows");
    let statuses: Vec<&str> = rows.iter().rev().map(|r| r.status.as_str()).collect();
    assert_eq!(statuses, ["approved", "ok", "declined", "edited", "ok"]);
    let edit: Value = serde_json::from_str(&rows[1].execution_json).expect("json");
    assert_eq!(edit["decided_by"], "api:default");
    assert_eq!(edit["proposed_code"], "print('C=' + str(1))");
    assert_eq!(edit["edited_code"], "print('C=' + str(2))");
    let (s, v) = get(&srv, &format!("/v1/executions?session_id={session}")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let listed = v["executions"].as_array().expect("executions");
    assert_eq!(listed.len(), 2, "{v}");
    assert!(listed.iter().all(|e| e["status"] == "ok"), "{v}");
    assert_eq!(
        listed[0]["code"], "print('C=' + str(2))",
        "the edited code is what ran"
    );
    let (s, v) = get(&srv, "/v1/audit/verify").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["ok"], true, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn replay_over_http_names_the_unseeded_cell_and_restores_the_upload() {
    let srv = common::start().await;
    let (s, v) = post(&srv, "/v1/sessions/ses_unknown/replay", json!({})).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");

    let (s, v) = post(&srv, "/v1/sessions", json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    let put = srv
        .http
        .put(format!("{}/v1/sessions/{id}/files/data.csv", srv.base))
        .body("n\n4\n5\n")
        .send()
        .await
        .expect("put");
    assert!(put.status().is_success(), "{put:?}");
    for code in [
        "print(open('data.csv').read().split())",
        "import random\nprint(random.random())",
        "open('out.txt', 'w').write('same')\n6 * 7",
    ] {
        let (s, v) = post(
            &srv,
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": code}),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{v}");
    }
    let (s, r) = post(&srv, &format!("/v1/sessions/{id}/replay"), json!({})).await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["uploads"][0]["path"], "data.csv", "{r}");
    assert_eq!(r["uploads"][0]["restored"], true, "{r}");
    let matches: Vec<bool> = r["cells"]
        .as_array()
        .expect("cells")
        .iter()
        .map(|c| c["matches"].as_bool().expect("bool"))
        .collect();
    assert_eq!(matches, [true, false, true], "{r:#}");
    assert_eq!(
        r["cells"][1]["sources_of_difference"],
        json!(["the random module without random.seed()"])
    );
}

/// The chat under a key whose approval default is `always`: a question that says nothing
/// waits at its first cell (answered by another key of the tenant, whose id the audit row
/// names); `approval=never` is refused with 403 before anything starts; a key without the
/// default (the control) runs `never` unattended.
#[tokio::test(flavor = "multi_thread")]
async fn a_keys_approval_default_holds_on_the_chat() {
    let stand_in = StandIn::start(|n, _| {
        let body = match n % 2 {
            0 => call("call_a", "print('A=' + str(6 * 7))"),
            _ => json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "done"}}]}),
        };
        (200, vec![], body.to_string())
    });
    let srv = common::start_with_chat(Some(runcell_server::ChatConfig {
        provider: stand_in.config(runcell_agent::ProviderKind::OpenAi),
        max_steps: 4,
    }))
    .await;
    let (strict, strict_key) = srv.store.create_key("strict", "acme").expect("key");
    srv.store
        .set_key_approval(&strict.id, Some(runcell_store::ApprovalMode::Always))
        .expect("set")
        .expect("key");
    let (reviewer, reviewer_key) = srv.store.create_key("reviewer", "acme").expect("key");
    let (_, plain_key) = srv.store.create_key("plain", "acme").expect("key");
    let chat = |key: &str, approval: Option<&str>| {
        let mut form = reqwest::multipart::Form::new().text("question", "Compute");
        if let Some(a) = approval {
            form = form.text("approval", a.to_owned());
        }
        srv.http
            .post(format!("{}/v1/chat", srv.base))
            .bearer_auth(key)
            .multipart(form)
            .send()
    };

    let resp = chat(&strict_key, Some("never")).await.expect("chat");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "forbidden", "{v}");
    assert_eq!(stand_in.requests().len(), 0, "no model call");

    // Nothing said: the first cell waits, and is answered by the reviewer's key.
    let mut resp = chat(&strict_key, None).await.expect("chat");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut buf = String::new();
    let mut session = String::new();
    let mut end = Value::Null;
    while let Some(chunk) = resp.chunk().await.expect("chunk") {
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(nl) = buf.find('\n') {
            let line: String = buf.drain(..=nl).collect();
            let event: Value = serde_json::from_str(&line).expect("NDJSON");
            match event["type"].as_str() {
                Some("session") => session = event["session"]["id"].as_str().expect("id").into(),
                Some("approval") => {
                    assert_eq!(event["approval"]["source"], "chat", "{event}");
                    let id = event["approval"]["id"].as_str().expect("id");
                    let resp = srv
                        .http
                        .post(format!("{}/v1/approvals/{id}", srv.base))
                        .bearer_auth(&reviewer_key)
                        .json(&json!({"decision": "approve"}))
                        .send()
                        .await
                        .expect("answer");
                    assert_eq!(resp.status(), StatusCode::OK);
                }
                Some("end") => end = event,
                _ => {}
            }
        }
    }
    assert_eq!(end["answer"], "done", "{end}");
    let (rows, _) = srv
        .store
        .list_executions("acme", Some(&session), 10, None)
        .expect("rows");
    let statuses: Vec<&str> = rows.iter().rev().map(|r| r.status.as_str()).collect();
    assert_eq!(statuses, ["approved", "ok"]);
    let decision: Value = serde_json::from_str(&rows[1].execution_json).expect("json");
    assert_eq!(
        decision["decided_by"],
        format!("key:{} (reviewer)", reviewer.id)
    );

    // The control: no floor, so `never` runs at once.
    let resp = chat(&plain_key, Some("never")).await.expect("chat");
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.text().await.expect("body");
    assert!(!text.contains("\"type\":\"approval\""), "{text}");
    assert!(text.contains("\"answer\":\"done\""), "{text}");
}
