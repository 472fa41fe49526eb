//! Approval before execution on the vendor endpoints, as the official SDKs send it (issue 27):
//! `extra_body={"approval": "always"}`, `extra_headers={"runcell-approval": "always"}`, or
//! nothing, with a key whose default is `always`. While the SDK's request waits (streaming or
//! not), a reviewer polling `GET /v1/approvals` with another key of the same tenant approves
//! the first cell, declines the second and edits the third; another tenant sees none of them
//! and cannot answer them. The scripted model answers with what it was told of each cell, so
//! the test sees exactly what reached the model; the audit log has each decision, who made it
//! (the reviewer's key), and both versions of the edited cell.

mod common;

#[path = "common/vendor.rs"]
mod vendor;

use std::time::Duration;

use runcell_agent::ProviderKind;
use serde_json::{json, Value};
use vendor::{scripted, Step};

const A: &str = "print('A=' + str(6 * 7))";
/// Declined: the file it would write must not exist afterwards.
const B: &str = "open('declined.txt', 'w').write('ran')";
const C: &str = "print('C=' + str(1))";
const C_EDITED: &str = "print('C=' + str(2))";
const REASON: &str = "it writes files";

/// The model: three cells, one after the other, then an answer that is the JSON list of what
/// it was told of each.
fn model(tool: &'static str) -> impl Fn(&str, &[String]) -> Step + Send + 'static {
    move |task, outputs| {
        if task != "Review each cell" {
            return Step::Say(format!("unexpected task {task:?}"));
        }
        match outputs.len() {
            0 => Step::Call(tool, json!({"code": A})),
            1 => Step::Call(tool, json!({"code": B})),
            2 => Step::Call(tool, json!({"code": C})),
            _ => Step::Say(json!(outputs).to_string()),
        }
    }
}

async fn server(stand_in: &runcell_agent::testing::StandIn) -> common::Server {
    let provider = stand_in.config(ProviderKind::OpenAi);
    common::start_with(move |s| {
        s.with_vendor(runcell_server::VendorConfig {
            provider,
            pin_model: false,
            max_steps: 8,
        })
    })
    .await
}

/// The keys of a test: the application's, the reviewer's (same tenant), another tenant's.
struct Keys {
    app: String,
    reviewer: String,
    reviewer_id: String,
    other: String,
}

fn keys(srv: &common::Server) -> Keys {
    let (_, app) = srv.store.create_key("app", "acme").expect("key");
    let (info, reviewer) = srv.store.create_key("reviewer", "acme").expect("key");
    let (_, other) = srv.store.create_key("intruder", "globex").expect("key");
    Keys {
        app,
        reviewer,
        reviewer_id: info.id,
        other,
    }
}

async fn get(srv: &common::Server, key: &str, path: &str) -> (u16, Value) {
    let resp = srv
        .http
        .get(format!("{}{path}", srv.base))
        .bearer_auth(key)
        .send()
        .await
        .expect("get");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn post(srv: &common::Server, key: &str, path: &str, body: Value) -> (u16, Value) {
    let resp = srv
        .http
        .post(format!("{}{path}", srv.base))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("post");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Runs `script SCENARIO BASE KEY ARGS...` of the vendor clients on a blocking thread.
fn sdk(script: &'static str, args: Vec<String>) -> tokio::task::JoinHandle<Value> {
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        vendor::run_sdk(script, &args)
    })
}

/// Answers every cell that waits, while `client` runs: A approved, B declined, C edited; each
/// first refused to the other tenant. Returns the pending cells as they were listed.
async fn review(
    srv: &common::Server,
    keys: &Keys,
    source: &str,
    tool: &str,
    client: tokio::task::JoinHandle<Value>,
) -> (Value, Vec<Value>) {
    let mut seen: Vec<Value> = Vec::new();
    while !client.is_finished() {
        let (s, list) = get(srv, &keys.reviewer, "/v1/approvals").await;
        assert_eq!(s, 200, "{list}");
        for p in list["data"].as_array().expect("data") {
            let id = p["id"].as_str().expect("id").to_owned();
            if seen.iter().any(|q| q["id"] == id.as_str()) {
                continue;
            }
            assert_eq!(p["source"], source, "{p}");
            assert_eq!(p["tool"], tool, "{p}");
            // Another tenant neither sees it nor can answer it.
            let (s, theirs) = get(srv, &keys.other, "/v1/approvals").await;
            assert_eq!((s, theirs["data"].clone()), (200, json!([])), "{theirs}");
            let path = format!("/v1/approvals/{id}");
            let (s, v) = post(srv, &keys.other, &path, json!({"decision": "approve"})).await;
            assert_eq!(s, 404, "another tenant's answer: {v}");
            assert_eq!(v["error"]["code"], "not_found", "{v}");
            let decision = match p["code"].as_str().expect("code") {
                A => json!({"decision": "approve"}),
                B => json!({"decision": "decline", "reason": REASON}),
                C => json!({"decision": "edit", "code": C_EDITED}),
                other => panic!("an unexpected cell waits: {other:?}"),
            };
            let (s, v) = post(srv, &keys.reviewer, &path, decision).await;
            assert_eq!(s, 200, "{v}");
            seen.push(p.clone());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = client.await.expect("the SDK client");
    (report, seen)
}

/// What the model was told of each cell (its answer), checked exactly.
fn check_model_saw(answer: &str) {
    let told: Vec<String> =
        serde_json::from_str(answer).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(told.len(), 3, "{told:?}");
    assert!(told[0].contains("A=42"), "{told:?}");
    assert_eq!(
        told[1],
        format!("the user declined to run this code: {REASON}")
    );
    let note = format!(
        "the user edited the code before it ran; this is what ran:\n{C_EDITED}\n--- output ---\n"
    );
    assert!(told[2].starts_with(&note), "{:?}", told[2]);
    assert!(told[2].contains("C=2"), "{:?}", told[2]);
}

/// The session's audit rows: each decision before its cell, by the reviewer's key, with both
/// versions of the edited cell; the declined cell never ran.
fn check_audit(srv: &common::Server, session: &str, keys: &Keys) {
    let (rows, _) = srv
        .store
        .list_executions("acme", Some(session), 100, None)
        .expect("rows");
    let rows: Vec<_> = rows.into_iter().rev().collect();
    let statuses: Vec<&str> = rows.iter().map(|r| r.status.as_str()).collect();
    assert_eq!(statuses, ["approved", "ok", "declined", "edited", "ok"]);
    let by = format!("key:{} (reviewer)", keys.reviewer_id);
    for r in rows.iter().filter(|r| r.execution_id.starts_with("apr_")) {
        let v: Value = serde_json::from_str(&r.execution_json).expect("json");
        assert_eq!(v["decided_by"], by.as_str(), "{v}");
    }
    let declined: Value = serde_json::from_str(&rows[2].execution_json).expect("json");
    assert_eq!(declined["proposed_code"], B);
    assert_eq!(declined["reason"], REASON);
    let edited: Value = serde_json::from_str(&rows[3].execution_json).expect("json");
    assert_eq!(edited["proposed_code"], C);
    assert_eq!(edited["edited_code"], C_EDITED);
    assert_eq!(rows[4].code, C_EDITED, "the edited code is what ran");
    let files = srv.engine.list_files(session, "").expect("files");
    assert!(
        files.iter().all(|f| f.path != "declined.txt"),
        "the declined cell wrote its file: {files:?}"
    );
    let report = srv.store.verify_chain(Some("acme")).expect("verify");
    assert!(report.ok, "{report:?}");
}

/// A vendor client script, and its arguments.
type Run = (&'static str, Vec<String>);

fn anthropic_args(srv: &common::Server, scenario: &str, key: &str, how: &str) -> Run {
    let base = format!("{}/anthropic", srv.base);
    let args = [scenario, &base, key, how].map(str::to_owned).to_vec();
    ("anthropic_client.py", args)
}

fn openai_args(srv: &common::Server, scenario: &str, key: &str, how: &str) -> Run {
    let base = format!("{}/openai/v1", srv.base);
    let args = [scenario, &base, key, how].map(str::to_owned).to_vec();
    ("openai_client.py", args)
}

fn gemini_args(srv: &common::Server, how: &str, key: &str) -> Run {
    let base = format!("{}/gemini", srv.base);
    let args = ["approval", &base, key, how].map(str::to_owned).to_vec();
    ("gemini_client.py", args)
}

fn mistral_args(srv: &common::Server, key: &str) -> Run {
    let base = format!("{}/mistral", srv.base);
    let args = ["approval", &base, key, "header"]
        .map(str::to_owned)
        .to_vec();
    ("mistral_client.py", args)
}

fn start((script, args): Run) -> tokio::task::JoinHandle<Value> {
    sdk(script, args)
}

fn check_anthropic_report(r: &Value) {
    assert_eq!(
        r["codes"],
        json!([A, B, C_EDITED]),
        "the blocks name what ran: {r}"
    );
    assert_eq!(r["stdout"][0], "A=42\n", "{r}");
    assert_eq!(r["stdout"][1], "", "{r}");
    assert_eq!(
        r["stderr"][1],
        format!("the user declined to run this code: {REASON}"),
        "{r}"
    );
    assert_eq!(r["stdout"][2], "C=2\n", "{r}");
    assert_eq!(r["return_codes"], json!([0, 1, 0]), "{r}");
    assert_eq!(r["stop_reason"], "end_turn", "{r}");
    check_model_saw(r["answer"].as_str().expect("answer"));
}

fn check_openai_report(r: &Value) {
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(
        r["codes"],
        json!([A, B, C_EDITED]),
        "the items name what ran: {r}"
    );
    assert_eq!(
        r["statuses"],
        json!(["completed", "failed", "completed"]),
        "{r}"
    );
    assert_eq!(r["logs"][0], "A=42\n", "{r}");
    assert_eq!(
        r["logs"][1],
        format!("the user declined to run this code: {REASON}"),
        "{r}"
    );
    assert_eq!(r["logs"][2], "C=2\n", "{r}");
    check_model_saw(r["answer"].as_str().expect("answer"));
}

fn session_of(container: &Value, prefix: &str) -> String {
    let c = container.as_str().expect("container");
    format!("ses_{}", c.strip_prefix(prefix).expect("prefix"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_cells_wait_for_a_reviewer_asked_in_the_body() {
    let stand_in = scripted(ProviderKind::OpenAi, model("code_execution"));
    let srv = server(&stand_in).await;
    let keys = keys(&srv);
    let client = start(anthropic_args(&srv, "approval", &keys.app, "body"));
    let (r, seen) = review(&srv, &keys, "anthropic", "code_execution", client).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    check_anthropic_report(&r);
    let session = session_of(&r["container"], "container_");
    assert!(
        seen.iter().all(|p| p["session_id"] == session.as_str()),
        "{seen:?}"
    );
    check_audit(&srv, &session, &keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_streams_keep_streaming_while_a_cell_waits_asked_in_a_header() {
    let stand_in = scripted(ProviderKind::OpenAi, model("code_execution"));
    let srv = server(&stand_in).await;
    let keys = keys(&srv);
    let client = start(anthropic_args(&srv, "approval", &keys.app, "header-stream"));
    let (r, seen) = review(&srv, &keys, "anthropic", "code_execution", client).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    check_anthropic_report(&r);
    let events = r["events"].as_array().expect("events");
    assert!(events.contains(&json!("message_stop")), "{r}");
    check_audit(&srv, &session_of(&r["container"], "container_"), &keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_cells_wait_for_a_reviewer_asked_in_a_header() {
    let stand_in = scripted(ProviderKind::OpenAi, model("python"));
    let srv = server(&stand_in).await;
    let keys = keys(&srv);
    let client = start(openai_args(&srv, "approval", &keys.app, "header"));
    let (r, seen) = review(&srv, &keys, "openai", "python", client).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    check_openai_report(&r);
    let session = session_of(&r["container"], "cntr_");
    assert!(
        seen.iter().all(|p| p["session_id"] == session.as_str()),
        "{seen:?}"
    );
    check_audit(&srv, &session, &keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_streams_keep_streaming_while_a_cell_waits_asked_in_the_body() {
    let stand_in = scripted(ProviderKind::OpenAi, model("python"));
    let srv = server(&stand_in).await;
    let keys = keys(&srv);
    let client = start(openai_args(&srv, "approval", &keys.app, "body-stream"));
    let (r, seen) = review(&srv, &keys, "openai", "python", client).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    check_openai_report(&r);
    let events = r["events"].as_array().expect("events");
    assert!(events.contains(&json!("response.completed")), "{r}");
    check_audit(&srv, &session_of(&r["container"], "cntr_"), &keys);
}

/// A key whose default is `always`: its requests wait without saying so, and cannot lower
/// it; a key without that default (the control) may say `never`. Bad words are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_default_applies_when_a_request_does_not_say_and_is_a_floor() {
    let stand_in = scripted(ProviderKind::OpenAi, model("code_execution"));
    let srv = server(&stand_in).await;
    let mut keys = keys(&srv);
    let (strict, strict_key) = srv.store.create_key("strict", "acme").expect("key");
    srv.store
        .set_key_approval(&strict.id, Some(runcell_store::ApprovalMode::Always))
        .expect("set")
        .expect("key");

    // Anthropic: nothing in the request, and every cell waits.
    keys.app = strict_key.clone();
    let client = start(anthropic_args(&srv, "approval", &keys.app, "key"));
    let (r, seen) = review(&srv, &keys, "anthropic", "code_execution", client).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    check_anthropic_report(&r);
    check_audit(&srv, &session_of(&r["container"], "container_"), &keys);

    // The floor, in each vendor's envelope; nothing waits, nothing runs.
    let before = stand_in.requests().len();
    let r = start(anthropic_args(&srv, "approval_refused", &strict_key, ""))
        .await
        .expect("sdk");
    let floor = "the API key \"strict\" requires approval of every cell (its approval is `always`): a request cannot lower it to `never`";
    assert_eq!(r["lowered"], json!([403, "permission_error", floor]), "{r}");
    assert_eq!(
        r["lowered_header"],
        json!([403, "permission_error", floor]),
        "{r}"
    );
    assert_eq!(
        r["bad_word"],
        json!([
            400,
            "invalid_request_error",
            "`approval` is `never` or `always`, not \"sometimes\""
        ]),
        "{r}"
    );
    assert_eq!(
        r["bad_header"],
        json!([
            400,
            "invalid_request_error",
            "the runcell-approval header is `never` or `always`, not \"yes\""
        ]),
        "{r}"
    );
    let r = start(openai_args(&srv, "approval_refused", &strict_key, ""))
        .await
        .expect("sdk");
    assert_eq!(
        r["lowered"],
        json!([403, "invalid_request_error", "approval", floor]),
        "{r}"
    );
    assert_eq!(r["bad_word"][0], 400, "{r}");
    assert_eq!(r["bad_header"][0], 400, "{r}");
    assert_eq!(stand_in.requests().len(), before, "no model call was made");

    // The control: the application's key has no floor, so `never` runs the cells unattended.
    let (_, plain) = srv.store.create_key("plain", "acme").expect("key");
    let r = start(anthropic_args(&srv, "approval_refused", &plain, ""))
        .await
        .expect("sdk");
    assert_eq!(r["lowered"], "no error", "{r}");
    assert_eq!(r["lowered_header"], "no error", "{r}");
    let (_, list) = get(&srv, &keys.reviewer, "/v1/approvals").await;
    assert_eq!(list["data"], json!([]), "nothing waited: {list}");
}

/// A client that gives up while its cell waits: the cell is declined, by runcell, and the
/// model is not asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_its_cell_waits_declines_it() {
    let stand_in = scripted(ProviderKind::OpenAi, model("code_execution"));
    let srv = server(&stand_in).await;
    let keys = keys(&srv);
    let http = reqwest::Client::new();
    let url = format!("{}/anthropic/v1/messages", srv.base);
    let body = json!({"model": "m", "max_tokens": 64, "approval": "always",
        "tools": [{"type": "code_execution_20260120", "name": "code_execution"}],
        "messages": [{"role": "user", "content": "Review each cell"}]});
    let request = http
        .post(&url)
        .header("x-api-key", &keys.app)
        .json(&body)
        .send();
    let call = tokio::spawn(request);
    // The cell waits...
    let pending = loop {
        let (_, list) = get(&srv, &keys.reviewer, "/v1/approvals").await;
        if let Some(p) = list["data"].as_array().and_then(|d| d.first()) {
            break p.clone();
        }
        assert!(
            !call.is_finished(),
            "the request ended before its cell waited"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(pending["code"], A);
    // ...and the client goes away.
    call.abort();
    let _ = call.await;
    let session = pending["session_id"].as_str().expect("session").to_owned();
    let row = loop {
        let (rows, _) = srv
            .store
            .list_executions("acme", Some(&session), 10, None)
            .expect("rows");
        if let Some(r) = rows
            .into_iter()
            .find(|r| r.execution_id.starts_with("apr_"))
        {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(row.status, "declined");
    let v: Value = serde_json::from_str(&row.execution_json).expect("json");
    assert_eq!(v["decided_by"], "runcell", "{v}");
    assert_eq!(v["reason"], "the client went away", "{v}");
    let (_, list) = get(&srv, &keys.reviewer, "/v1/approvals").await;
    assert_eq!(list["data"], json!([]), "{list}");
    let (s, v) = post(
        &srv,
        &keys.reviewer,
        &format!("/v1/approvals/{}", pending["id"].as_str().expect("id")),
        json!({"decision": "approve"}),
    )
    .await;
    assert_eq!(s, 404, "too late: {v}");
    assert_eq!(
        stand_in.requests().len(),
        1,
        "the model was not asked again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_and_mistral_cells_wait_for_a_reviewer_too() {
    let stand_in = scripted(ProviderKind::OpenAi, model("python"));
    let srv = server(&stand_in).await;
    let keys = keys(&srv);
    let told = |r: &Value| check_model_saw(r["answer"].as_str().expect("answer"));

    for how in ["header", "body"] {
        let client = start(gemini_args(&srv, how, &keys.app));
        let (r, seen) = review(&srv, &keys, "gemini", "python", client).await;
        assert_eq!(seen.len(), 3, "{how}: {seen:?}");
        assert_eq!(r["codes"], json!([A, B, C_EDITED]), "{how}: {r}");
        let outcomes: Vec<&Value> = r["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|x| &x[0])
            .collect();
        assert_eq!(
            outcomes,
            ["OUTCOME_OK", "OUTCOME_FAILED", "OUTCOME_OK"],
            "{how}: {r}"
        );
        assert_eq!(r["results"][0][1], "A=42\n", "{how}: {r}");
        assert_eq!(
            r["results"][1][1],
            format!("the user declined to run this code: {REASON}"),
            "{how}: {r}"
        );
        assert_eq!(r["results"][2][1], "C=2\n", "{how}: {r}");
        told(&r);
        check_audit(
            &srv,
            seen[0]["session_id"].as_str().expect("session"),
            &keys,
        );
    }

    let client = start(mistral_args(&srv, &keys.app));
    let (r, seen) = review(&srv, &keys, "mistral", "python", client).await;
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(r["codes"], json!([A, B, C_EDITED]), "{r}");
    assert_eq!(
        r["outputs"],
        json!([
            "A=42\n",
            format!("the user declined to run this code: {REASON}"),
            "C=2\n"
        ]),
        "{r}"
    );
    told(&r);
    check_audit(
        &srv,
        seen[0]["session_id"].as_str().expect("session"),
        &keys,
    );
}
