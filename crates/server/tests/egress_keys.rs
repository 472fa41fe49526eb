//! A key's own egress bound over HTTP (`runcell keys create --egress-allow`): a key narrows the
//! server's `--egress-allow`, never widens it. Key A, bounded to one local destination, opens a
//! session allowing it and reaches a local HTTP server from inside the sandbox, and is refused
//! (400 `limit_exceeded`, naming the domain and the key) for a destination the server allows;
//! key B, without a bound of its own, gets the server's bound. The same for one-shot runs,
//! batches and forks (E2B's path: crates/server/tests/e2b.rs).

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;

use reqwest::StatusCode;
use serde_json::{json, Value};

async fn server() -> common::Server {
    common::start_engine_with(None, |c| {
        c.network = runcell_engine::NetworkConfig {
            allow_domains: vec![
                "127.0.0.2".into(),
                "127.0.0.3".into(),
                "*.example.com".into(),
            ],
            allow_cidrs: vec!["127.0.0.0/8".into()],
            ..Default::default()
        };
    })
    .await
}

/// A destination on the host at `ip` that answers every request with `hello from IP`.
fn destination(ip: &str) -> u16 {
    let l = TcpListener::bind((ip, 0)).expect("bind");
    let port = l.local_addr().expect("addr").port();
    let body = format!("hello from {ip}");
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = vec![0u8; 8192];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

async fn post(srv: &common::Server, key: &str, path: &str, body: Value) -> (StatusCode, Value) {
    let resp = srv
        .http
        .post(format!("{}{path}", srv.base))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = resp.status();
    (status, resp.json().await.unwrap_or(Value::Null))
}

fn allowlist(domains: &[&str]) -> Value {
    json!({"type": "allowlist", "allowed_domains": domains})
}

/// Python that fetches `url` through the session's proxy and prints the body.
fn fetch(url: &str) -> String {
    format!(
        "import urllib.request\nprint(urllib.request.urlopen('{url}', timeout=20).read().decode())"
    )
}

/// `POST /v1/sessions` in `language` asking for `domains`.
async fn ask(
    srv: &common::Server,
    key: &str,
    language: &str,
    domains: &[&str],
) -> (StatusCode, Value) {
    let body = json!({"language": language, "network": allowlist(domains)});
    post(srv, key, "/v1/sessions", body).await
}

/// A Python session of `key` allowing `host`, whose code fetches `host:port` through the
/// proxy from inside its sandbox (the positive control); its id.
async fn session_reaching(srv: &common::Server, key: &str, host: &str, port: u16) -> String {
    let (s, session) = ask(srv, key, "python", &[host]).await;
    assert_eq!(s, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().expect("id").to_owned();
    let code = fetch(&format!("http://{host}:{port}/"));
    let (s, e) = post(
        srv,
        key,
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": code}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert_eq!(e["stdout"], format!("hello from {host}\n"), "{e}");
    assert_eq!(e["network"][0]["allowed"], true, "{e}");
    id
}

/// `(status, code, message)` of a refusal.
fn refusal(status: StatusCode, body: &Value) -> (u16, String, String) {
    (
        status.as_u16(),
        body["error"]["code"].as_str().unwrap_or("").to_owned(),
        body["error"]["message"].as_str().unwrap_or("").to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keys_bound_narrows_the_servers_on_every_path_that_asks_for_a_network() {
    let srv = server().await;
    let (p2, p3) = (destination("127.0.0.2"), destination("127.0.0.3"));
    let (a, key_a) = srv.store.create_key("bounded", "acme").expect("key");
    srv.store
        .set_key_egress(
            &a.id,
            Some(&["127.0.0.2".to_owned(), "*.api.example.com".to_owned()]),
        )
        .expect("set")
        .expect("key");
    let (_, key_b) = srv.store.create_key("unbounded", "acme").expect("key");
    let (c, key_c) = srv.store.create_key("offline", "acme").expect("key");
    srv.store
        .set_key_egress(&c.id, Some(&[]))
        .expect("set")
        .expect("key");
    let beyond_a = |domain: &str| {
        format!(
            "network: domain {domain:?} is beyond what API key {} (bounded) allows (127.0.0.2, *.api.example.com; runcell keys update --egress-allow)",
            a.id
        )
    };

    // Key A: a session allowing its one destination reaches it from inside the sandbox.
    let id_a = session_reaching(&srv, &key_a, "127.0.0.2", p2).await;

    // Within the key's wildcard: `*.api.example.com` covers a name and a narrower wildcard
    // below it (the server's `*.example.com` covers both too).
    for within in [&["x.api.example.com"][..], &["*.v1.api.example.com"]] {
        let (s, body) = ask(&srv, &key_a, "bash", within).await;
        assert_eq!(s, StatusCode::CREATED, "{within:?}: {body}");
    }

    // Beyond the key's bound although the server allows it: refused, naming the domain and
    // the key; the first pattern beyond it is the one named.
    for (domains, named) in [
        (&["127.0.0.3"][..], "127.0.0.3"),
        (&["127.0.0.2", "www.example.com"], "www.example.com"),
        (&["*.example.com"], "*.example.com"),
        (&["api.example.com"], "api.example.com"),
    ] {
        let (s, body) = ask(&srv, &key_a, "bash", domains).await;
        assert_eq!(
            refusal(s, &body),
            (400, "limit_exceeded".to_owned(), beyond_a(named)),
            "{domains:?}"
        );
    }
    // Beyond both: the key's refusal; beyond the server's alone: the server's. A malformed
    // pattern is invalid whatever either allows.
    let (s, body) = ask(&srv, &key_a, "python", &["pypi.org"]).await;
    assert_eq!(
        refusal(s, &body),
        (400, "limit_exceeded".to_owned(), beyond_a("pypi.org"))
    );
    let (s, body) = ask(&srv, &key_a, "python", &["a..b"]).await;
    assert_eq!(
        (s.as_u16(), body["error"]["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );

    // Key B has no bound of its own: the server's. It reaches 127.0.0.3, and pypi.org is
    // refused by the server's bound, not by a key's.
    let id_b = session_reaching(&srv, &key_b, "127.0.0.3", p3).await;
    let (s, body) = ask(&srv, &key_b, "python", &["pypi.org"]).await;
    let (status, code, message) = refusal(s, &body);
    assert_eq!((status, code.as_str()), (400, "limit_exceeded"));
    assert!(
        message.contains("beyond what this server allows (serve --egress-allow)")
            && !message.contains("API key"),
        "{message}"
    );

    // Key C allows no network: refused for any domain; no network at all is fine.
    let (s, body) = ask(&srv, &key_c, "bash", &["127.0.0.2"]).await;
    assert_eq!(
        refusal(s, &body),
        (
            400,
            "limit_exceeded".to_owned(),
            format!("network: domain \"127.0.0.2\" refused: API key {} (offline) allows no network (runcell keys update --egress-allow)", c.id)
        )
    );
    let (s, body) = post(
        &srv,
        &key_c,
        "/v1/sessions",
        json!({"language": "bash", "network": {"type": "disabled"}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");

    // One-shot runs: within the key's bound the run reaches its destination; beyond it,
    // refused before anything runs.
    let (s, r) = post(
        &srv,
        &key_a,
        "/v1/execute",
        json!({"code": fetch(&format!("http://127.0.0.2:{p2}/")), "network": allowlist(&["127.0.0.2"])}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["stdout"], "hello from 127.0.0.2\n", "{r}");
    let (s, body) = post(
        &srv,
        &key_a,
        "/v1/execute",
        json!({"code": fetch(&format!("http://127.0.0.3:{p3}/")), "network": allowlist(&["127.0.0.3"])}),
    )
    .await;
    assert_eq!(
        refusal(s, &body),
        (400, "limit_exceeded".to_owned(), beyond_a("127.0.0.3"))
    );
    let (s, r) = post(
        &srv,
        &key_b,
        "/v1/execute",
        json!({"code": fetch(&format!("http://127.0.0.3:{p3}/")), "network": allowlist(&["127.0.0.3"])}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{r}");
    assert_eq!(r["stdout"], "hello from 127.0.0.3\n", "{r}");
    // A batch: the run beyond the key's bound is named, and nothing ran.
    let (s, body) = post(
        &srv,
        &key_a,
        "/v1/batch",
        json!({"runs": [
            {"code": "print(1)"},
            {"code": "print(2)", "network": allowlist(&["127.0.0.3"])},
        ]}),
    )
    .await;
    assert_eq!(
        refusal(s, &body),
        (
            400,
            "limit_exceeded".to_owned(),
            format!("runs[1]: {}", beyond_a("127.0.0.3"))
        )
    );

    // A fork asks for its source's network: key A may not fork key B's session (same tenant)
    // into a network beyond its bound; key B may, and key A may fork its own.
    let (s, body) = post(
        &srv,
        &key_a,
        &format!("/v1/sessions/{id_b}/fork"),
        json!({}),
    )
    .await;
    assert_eq!(
        refusal(s, &body),
        (400, "limit_exceeded".to_owned(), beyond_a("127.0.0.3"))
    );
    let (s, body) = post(
        &srv,
        &key_b,
        &format!("/v1/sessions/{id_b}/fork"),
        json!({}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");
    let (s, body) = post(
        &srv,
        &key_a,
        &format!("/v1/sessions/{id_a}/fork"),
        json!({}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{body}");

    // Narrowing a key later applies to what it asks for next; a session it opened before
    // keeps the policy it was created with (docs/operations.md).
    srv.store
        .set_key_egress(&a.id, Some(&[]))
        .expect("narrow")
        .expect("key");
    let (s, body) = ask(&srv, &key_a, "python", &["127.0.0.2"]).await;
    assert_eq!(refusal(s, &body).1, "limit_exceeded", "{body}");
    let (s, e) = post(
        &srv,
        &key_a,
        &format!("/v1/sessions/{id_a}/execute"),
        json!({"code": fetch(&format!("http://127.0.0.2:{p2}/"))}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{e}");
    assert_eq!(e["stdout"], "hello from 127.0.0.2\n", "{e}");
}
