//! Server maxima, tenants' quotas, admission control and cold starts, over HTTP: the app
//! bound to port 0 with a limit policy of the test's own.

mod common;

use std::time::{Duration, Instant};

use common::{start_engine_with, Server};
use reqwest::StatusCode;
use runcell_engine::{LimitPolicy, Maxima, SessionLimits};
use serde_json::{json, Value};

/// A policy with small, known maxima (what `serve --max-*` would set).
fn policy(committed_memory_mb: u64) -> LimitPolicy {
    LimitPolicy {
        defaults: SessionLimits {
            memory_mb: 256,
            cpu: 1.0,
            pids: 64,
            disk_mb: 64,
            exec_timeout_s: 30,
            idle_timeout_s: 600,
            pause_after_s: 300,
            expire_after_s: 3600,
        },
        max: Maxima {
            memory_mb: 1024,
            cpu: 1.0,
            pids: 256,
            disk_mb: 128,
            exec_timeout_s: 60,
            idle_timeout_s: 3600,
            pause_after_s: 3600,
            expire_after_s: 7200,
        },
        committed_memory_mb,
        server: true,
    }
}

async fn server(committed_memory_mb: u64) -> Server {
    start_engine_with(None, move |c| c.limits = policy(committed_memory_mb)).await
}

async fn send(
    srv: &Server,
    req: reqwest::RequestBuilder,
    key: Option<&str>,
) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    let req = match key {
        Some(k) => req.bearer_auth(k),
        None => req,
    };
    let resp = req.send().await.expect("send");
    let status = resp.status();
    let headers = resp.headers().clone();
    let _ = srv;
    (status, resp.json().await.unwrap_or(Value::Null), headers)
}

async fn create(
    srv: &Server,
    key: Option<&str>,
    body: Value,
) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    send(
        srv,
        srv.http
            .post(format!("{}/v1/sessions", srv.base))
            .json(&body),
        key,
    )
    .await
}

async fn delete(srv: &Server, key: Option<&str>, id: &str) {
    let (s, v, _) = send(
        srv,
        srv.http.delete(format!("{}/v1/sessions/{id}", srv.base)),
        key,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{v}");
}

async fn session_count(srv: &Server, key: Option<&str>) -> usize {
    let (s, v, _) = send(srv, srv.http.get(format!("{}/v1/sessions", srv.base)), key).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v["sessions"].as_array().expect("sessions").len()
}

fn error(status: StatusCode, v: &Value, want: StatusCode, code: &str) -> String {
    assert_eq!(status, want, "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    v["error"]["message"].as_str().expect("message").to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_over_the_maximum_is_refused_naming_it_and_one_at_it_works() {
    let srv = server(8192).await;
    let cases = [
        ("memory_mb", json!(1025), "memory_mb 1025 exceeds this server's maximum of 1024 (serve --max-memory-mb)"),
        ("cpu", json!(1.5), "cpu 1.5 exceeds this server's maximum of 1 (serve --max-cpu)"),
        ("pids", json!(257), "pids 257 exceeds this server's maximum of 256 (serve --max-pids)"),
        ("disk_mb", json!(129), "disk_mb 129 exceeds this server's maximum of 128 (serve --max-disk-mb)"),
        ("exec_timeout_s", json!(61), "exec_timeout_s 61 exceeds this server's maximum of 60 (serve --max-exec-timeout-s)"),
        ("idle_timeout_s", json!(3601), "idle_timeout_s 3601 exceeds this server's maximum of 3600 (serve --max-idle-timeout-s)"),
        ("pause_after_s", json!(3601), "pause_after_s 3601 exceeds this server's maximum of 3600 (serve --max-pause-after-s)"),
        ("expire_after_s", json!(7201), "expire_after_s 7201 exceeds this server's maximum of 7200 (serve --max-expire-after-s)"),
    ];
    for (name, value, message) in cases {
        let (s, v, _) = create(&srv, None, json!({"limits": {name: value}})).await;
        assert_eq!(
            error(s, &v, StatusCode::BAD_REQUEST, "limit_exceeded"),
            message
        );
    }
    // Nothing was started for them: no session, no memory committed.
    assert_eq!(session_count(&srv, None).await, 0);
    assert_eq!(srv.engine.committed_memory_mb(), 0);
    // The one-shot endpoint holds to the same maxima.
    let (s, v, _) = send(
        &srv,
        srv.http
            .post(format!("{}/v1/execute", srv.base))
            .json(&json!({"code": "print(1)", "limits": {"memory_mb": 4096}})),
        None,
    )
    .await;
    assert!(error(s, &v, StatusCode::BAD_REQUEST, "limit_exceeded").contains("--max-memory-mb"));

    // Exactly at every maximum: a session, with those limits.
    let at = json!({"memory_mb": 1024, "cpu": 1.0, "pids": 256, "disk_mb": 128,
                    "exec_timeout_s": 60, "idle_timeout_s": 3600,
                    "pause_after_s": 3600, "expire_after_s": 7200});
    let (s, v, _) = create(&srv, None, json!({"limits": at})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["limits"], at, "{v}");
    assert_eq!(srv.engine.committed_memory_mb(), 1024);
    let id = v["id"].as_str().expect("id").to_owned();
    // An execution's own time limit too.
    let exec = |t: f64| {
        srv.http
            .post(format!("{}/v1/sessions/{id}/execute", srv.base))
            .json(&json!({"code": "1 + 1", "timeout_s": t}))
    };
    let (s, v, _) = send(&srv, exec(61.0), None).await;
    assert_eq!(
        error(s, &v, StatusCode::BAD_REQUEST, "limit_exceeded"),
        "timeout_s 61 exceeds this server's maximum of 60 (serve --max-exec-timeout-s)"
    );
    // A hair over (the next float after 60, under a nanosecond more) is over: rounding the
    // time to whole nanoseconds must not round it down to the maximum.
    let (s, v, _) = send(&srv, exec(60.000_000_000_000_01), None).await;
    assert!(
        error(s, &v, StatusCode::BAD_REQUEST, "limit_exceeded").starts_with("timeout_s 60.0"),
        "{v}"
    );
    let (s, v, _) = send(&srv, exec(60.0), None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    delete(&srv, None, &id).await;
    assert_eq!(srv.engine.committed_memory_mb(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn tenant_quotas_count_live_sessions_and_their_memory() {
    let srv = server(8192).await;
    let (_, acme) = srv.store.create_key("acme-ci", "acme").expect("key");
    let (_, other) = srv.store.create_key("other-ci", "other").expect("key");
    srv.store
        .update_tenant(
            "acme",
            &runcell_store::TenantChange {
                max_sessions: Some(Some(2)),
                ..Default::default()
            },
        )
        .expect("quota");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (s, v, _) = create(&srv, Some(&acme), json!({})).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    let (s, v, _) = create(&srv, Some(&acme), json!({})).await;
    let m = error(s, &v, StatusCode::BAD_REQUEST, "limit_exceeded");
    assert!(
        m.starts_with(
            "tenant quota: tenant acme already has 2 live sessions of its max_sessions 2"
        ),
        "{m}"
    );
    assert!(m.contains("runcell keys update"), "{m}");
    assert_eq!(session_count(&srv, Some(&acme)).await, 2);
    // Another tenant is not held by acme's quota.
    let (s, v, _) = create(&srv, Some(&other), json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let other_id = v["id"].as_str().expect("id").to_owned();
    // Ending one frees its place.
    delete(&srv, Some(&acme), &ids.remove(0)).await;
    let (s, v, _) = create(&srv, Some(&acme), json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    ids.push(v["id"].as_str().expect("id").to_owned());

    // Memory: the sum of the live sessions' limits. 256 MiB live; 768 fits 1024, 16 more not.
    for id in ids.drain(1..) {
        delete(&srv, Some(&acme), &id).await;
    }
    srv.store
        .update_tenant(
            "acme",
            &runcell_store::TenantChange {
                max_sessions: Some(None),
                max_memory_mb: Some(Some(1024)),
                start: None,
            },
        )
        .expect("quota");
    let (s, v, _) = create(&srv, Some(&acme), json!({"limits": {"memory_mb": 768}})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let big = v["id"].as_str().expect("id").to_owned();
    let (s, v, _) = create(&srv, Some(&acme), json!({"limits": {"memory_mb": 16}})).await;
    let m = error(s, &v, StatusCode::BAD_REQUEST, "limit_exceeded");
    assert!(
        m.contains("1024 MiB in live sessions") && m.contains("max_memory_mb 1024"),
        "{m}"
    );
    delete(&srv, Some(&acme), &big).await;
    let (s, v, _) = create(&srv, Some(&acme), json!({"limits": {"memory_mb": 768}})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    delete(&srv, Some(&other), &other_id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mcp_and_the_chat_count_against_the_same_quota() {
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    use runcell_agent::testing::StandIn;

    // The chat's model is never reached: the session start is refused first.
    let stand_in = StandIn::start(|_, _| (500, vec![], "{}".to_owned()));
    let srv = start_engine_with(
        Some(runcell_server::ChatConfig {
            provider: stand_in.config(runcell_agent::ProviderKind::OpenAi),
            max_steps: 1,
        }),
        |c| c.limits = policy(8192),
    )
    .await;
    let (_, key) = srv.store.create_key("solo", "solo").expect("key");
    srv.store
        .update_tenant(
            "solo",
            &runcell_store::TenantChange {
                max_sessions: Some(Some(1)),
                ..Default::default()
            },
        )
        .expect("quota");
    let (s, v, _) = create(&srv, Some(&key), json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let held = v["id"].as_str().expect("id").to_owned();

    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", srv.base))
            .auth_header(key.clone()),
    );
    let client = ().serve(transport).await.expect("initialize");
    let call = || {
        let Value::Object(args) = json!({"code": "6 * 7"}) else {
            unreachable!()
        };
        client.call_tool(CallToolRequestParams::new("python".to_owned()).with_arguments(args))
    };
    let r = call().await.expect("tools/call");
    let text: String = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert_eq!(r.is_error, Some(true), "{text}");
    assert!(
        text.contains("tenant quota: tenant solo already has 1 live session"),
        "{text}"
    );

    let form = reqwest::multipart::Form::new().text("question", "What is 6 * 7?");
    let (s, v, _) = send(
        &srv,
        srv.http
            .post(format!("{}/v1/chat", srv.base))
            .multipart(form),
        Some(&key),
    )
    .await;
    assert!(error(s, &v, StatusCode::BAD_REQUEST, "limit_exceeded").contains("tenant quota"));

    // With the REST session gone, MCP's session fits (the positive control).
    delete(&srv, Some(&key), &held).await;
    let r = call().await.expect("tools/call");
    let text: String = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    assert_eq!(r.is_error, Some(false), "{text}");
    assert!(text.contains("42"), "{text}");
    let _ = client.cancel().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_committed_memory_budget_a_start_is_503_with_retry_after() {
    // Room for two sandboxes of 1024 MiB.
    let srv = start_engine_with(None, |c| {
        let mut p = policy(2048);
        p.max.memory_mb = 2048;
        c.limits = p;
    })
    .await;
    let big = json!({"limits": {"memory_mb": 1024}});
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (s, v, _) = create(&srv, None, big.clone()).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    assert_eq!(srv.engine.committed_memory_mb(), 2048);
    let (s, v, h) = create(&srv, None, big.clone()).await;
    let m = error(s, &v, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert!(m.contains("2048 of its 2048 MiB"), "{m}");
    assert_eq!(h["retry-after"], "5");
    // A one-shot run is a sandbox too.
    let (s, v, h) = send(
        &srv,
        srv.http
            .post(format!("{}/v1/execute", srv.base))
            .json(&json!({"code": "print(1)"})),
        None,
    )
    .await;
    error(s, &v, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert_eq!(h["retry-after"], "5");
    assert_eq!(session_count(&srv, None).await, 2);
    // Room again once one ends.
    delete(&srv, None, &ids.remove(0)).await;
    let (s, v, _) = create(&srv, None, big).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(srv.engine.committed_memory_mb(), 2048);
}

/// `hash("abc")` in a session: str hashing is keyed by the interpreter's hash secret.
async fn hash_of_abc(srv: &Server, id: &str) -> String {
    let (s, v, _) = send(
        srv,
        srv.http
            .post(format!("{}/v1/sessions/{id}/execute", srv.base))
            .json(&json!({"code": "print(hash('abc'))"})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    v["stdout"].as_str().expect("stdout").trim().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cold_session_has_its_own_hash_secret_and_warm_sessions_stay_in_the_budget() {
    // Room for four sandboxes of the default 256 MiB; the pool would like eight.
    let srv = start_engine_with(None, |c| {
        c.limits = policy(1024);
        c.preload = Some(
            runcell_engine::DEFAULT_PRELOAD
                .iter()
                .map(|m| m.to_string())
                .collect(),
        );
    })
    .await;
    let engine = srv.engine.clone();
    let status =
        tokio::task::spawn_blocking(move || engine.wait_for_zygote(Duration::from_secs(180)))
            .await
            .expect("wait");
    assert!(
        matches!(status, runcell_engine::ZygoteStatus::Ready { .. }),
        "{status:?}"
    );
    srv.engine.sessions().start_warm_pool(8);
    let deadline = Instant::now() + Duration::from_secs(120);
    while srv.engine.sessions().warm_ready() < 4 {
        assert!(Instant::now() < deadline, "the pool did not fill");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // It stops at the budget, not at its target.
    let watch = Instant::now() + Duration::from_secs(2);
    while Instant::now() < watch {
        assert!(srv.engine.sessions().warm_ready() <= 4);
        assert!(srv.engine.committed_memory_mb() <= 1024);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Two zygote sessions (warm ones) share the zygote's hash secret: the probe sees it.
    let mut zygote = Vec::new();
    for _ in 0..2 {
        let (s, v, _) = create(&srv, None, json!({})).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert_eq!(v["start"], "zygote", "{v}");
        zygote.push(v["id"].as_str().expect("id").to_owned());
    }
    let a = hash_of_abc(&srv, &zygote[0]).await;
    let b = hash_of_abc(&srv, &zygote[1]).await;
    assert_eq!(a, b, "zygote-born sessions share the hash secret");

    // A cold one does not; the budget is full of warm sessions, and one makes room for it.
    let (s, v, _) = create(&srv, None, json!({"start": "cold"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["start"], "cold", "{v}");
    let cold = v["id"].as_str().expect("id").to_owned();
    let (s, v, _) = send(
        &srv,
        srv.http.get(format!("{}/v1/sessions/{cold}", srv.base)),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["start"], "cold", "{v}");
    let c = hash_of_abc(&srv, &cold).await;
    assert_ne!(c, a, "a cold session has a hash secret of its own");
    assert!(srv.engine.committed_memory_mb() <= 1024);

    // A tenant whose sessions start cold by default (`runcell keys update --start cold`).
    delete(&srv, None, &zygote[0]).await;
    srv.store
        .update_tenant(
            runcell_server::OPEN_TENANT,
            &runcell_store::TenantChange {
                start: Some(Some("cold".into())),
                ..Default::default()
            },
        )
        .expect("default start");
    let (s, v, _) = create(&srv, None, json!({})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["start"], "cold", "{v}");
    let id = v["id"].as_str().expect("id").to_owned();
    assert_ne!(hash_of_abc(&srv, &id).await, a);
    // A session's own `start` wins over the tenant's default.
    delete(&srv, None, &zygote[1]).await;
    let (s, v, _) = create(&srv, None, json!({"start": "zygote"})).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["start"], "zygote", "{v}");

    // Only Python sessions come from the zygote.
    let (s, v, _) = create(&srv, None, json!({"language": "bash", "start": "zygote"})).await;
    error(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
    let (s, v, _) = create(&srv, None, json!({"start": "lukewarm"})).await;
    error(s, &v, StatusCode::BAD_REQUEST, "invalid_request");
}
