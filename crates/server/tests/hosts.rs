//! What a web page can do to a server on 127.0.0.1: DNS rebinding (a foreign `Host`) and
//! cross-site requests (an `Origin` or `Sec-Fetch-Site` of another page) are refused with
//! 403 before any handler runs; the server's own names and page, and clients that send
//! neither header, work. Also: what `/healthz` and `/metrics` tell a caller without a key,
//! and the headers of a download.

mod common;

use std::io::{Read, Write};

use common::{start, start_with, Server};
use reqwest::StatusCode;
use runcell_agent::testing::StandIn;
use serde_json::{json, Value};

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn port(&self) -> u16 {
        self.base
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port")
    }

    /// GET `path` naming `host` in the `Host` header.
    async fn get_as(&self, host: &str, path: &str) -> (StatusCode, String) {
        let resp = self
            .http
            .get(self.url(path))
            .header("host", host)
            .send()
            .await
            .expect("send");
        (resp.status(), resp.text().await.expect("body"))
    }

    async fn files(&self, id: &str) -> Value {
        let resp = self
            .http
            .get(self.url(&format!("/v1/sessions/{id}/files")))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::OK);
        resp.json::<Value>().await.expect("json")["files"].clone()
    }

    async fn session(&self, key: Option<&str>) -> String {
        let mut req = self.http.post(self.url("/v1/sessions")).json(&json!({}));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.expect("send");
        assert_eq!(resp.status(), StatusCode::CREATED);
        resp.json::<Value>().await.expect("json")["id"]
            .as_str()
            .expect("id")
            .to_owned()
    }
}

/// The 403 envelope, with a message that contains each of `mentions`.
fn assert_forbidden(status: StatusCode, body: &str, mentions: &[&str]) {
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let v: Value = serde_json::from_str(body).expect("a JSON envelope");
    assert_eq!(v["error"]["code"], "forbidden", "{v}");
    let message = v["error"]["message"].as_str().expect("message");
    for m in mentions {
        assert!(message.contains(m), "{m:?} not in {message:?}");
    }
}

/// One raw HTTP/1.1 exchange (for requests reqwest would not send, without a Host); the
/// status code.
fn raw(base: &str, request: &str) -> u16 {
    let addr = base.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
    tcp.write_all(request.as_bytes()).expect("write");
    let mut reply = String::new();
    let _ = tcp.read_to_string(&mut reply);
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {reply:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_foreign_host_is_refused_on_every_route_and_the_servers_own_names_are_served() {
    let srv = start().await;
    let port = srv.port();
    let evil = format!("evil.example:{port}");
    for path in [
        "/v1/sessions",
        "/",
        "/assets/app.js",
        "/healthz",
        "/openapi.json",
    ] {
        let (s, body) = srv.get_as(&evil, path).await;
        assert_forbidden(s, &body, &[&evil, "--allowed-hosts evil.example"]);
    }
    // A loopback name on another port is another server (another origin).
    let other_port = format!("localhost:{}", port.wrapping_add(1));
    let (s, body) = srv.get_as(&other_port, "/v1/sessions").await;
    assert_forbidden(s, &body, &[&other_port]);
    let (s, body) = srv.get_as("localhost", "/v1/sessions").await;
    assert_forbidden(s, &body, &["localhost"]);
    // POSTs too, MCP included, before anything is read or created.
    let resp = srv
        .http
        .post(srv.url("/v1/sessions"))
        .header("host", &evil)
        .json(&json!({}))
        .send()
        .await
        .expect("send");
    let s = resp.status();
    assert_forbidden(s, &resp.text().await.expect("body"), &[&evil]);
    let resp = srv
        .http
        .post(srv.url("/mcp"))
        .header("host", &evil)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
        .send()
        .await
        .expect("send");
    let s = resp.status();
    assert_forbidden(s, &resp.text().await.expect("body"), &[&evil]);
    let (s, sessions) = srv
        .get_as(&format!("127.0.0.1:{port}"), "/v1/sessions")
        .await;
    assert_eq!(s, StatusCode::OK, "{sessions}");
    assert_eq!(
        serde_json::from_str::<Value>(&sessions).expect("json")["sessions"],
        json!([])
    );

    // Positive controls: every loopback name with the right port.
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("127.0.0.2:{port}"),
    ] {
        for path in ["/v1/sessions", "/", "/healthz"] {
            let (s, body) = srv.get_as(&host, path).await;
            assert_eq!(s, StatusCode::OK, "{host} {path}: {body}");
        }
    }

    // Without a Host header (HTTP/1.1 requires one): refused; with one: served.
    let base = srv.base.clone();
    let (missing, present) = tokio::task::spawn_blocking(move || {
        (
            raw(
                &base,
                "GET /v1/sessions HTTP/1.1\r\nConnection: close\r\n\r\n",
            ),
            raw(
                &base,
                &format!(
                    "GET /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
                ),
            ),
        )
    })
    .await
    .expect("raw");
    assert_eq!((missing, present), (403, 200));

    // The OpenAPI document says so for every operation.
    let doc: Value = srv
        .http
        .get(srv.url("/openapi.json"))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    for (path, ops) in doc["paths"].as_object().expect("paths") {
        for (method, op) in ops.as_object().expect("ops") {
            assert_eq!(
                op["responses"]["403"]["content"]["application/json"]["schema"]["$ref"],
                "#/components/schemas/ErrorBody",
                "{method} {path}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cross_origin_form_post_changes_nothing_and_the_servers_own_page_does() {
    let stand_in = StandIn::start(|_, _| (200, vec![], "{}".to_owned()));
    let srv = common::start_with_chat(Some(runcell_server::ChatConfig {
        provider: stand_in.config(runcell_agent::ProviderKind::OpenAi),
        max_steps: 2,
    }))
    .await;
    let id = srv.session(None).await;
    let upload = format!("/v1/sessions/{id}/files");
    let form = || {
        reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(b"pwned".to_vec()).file_name("x.txt"),
        )
    };

    // What a plain <form method=post enctype=multipart/form-data> on evil.example sends.
    let resp = srv
        .http
        .post(srv.url(&upload))
        .header("origin", "http://evil.example")
        .multipart(form())
        .send()
        .await
        .expect("send");
    let s = resp.status();
    assert_forbidden(
        s,
        &resp.text().await.expect("body"),
        &["http://evil.example", "cross-origin"],
    );
    assert_eq!(srv.files(&id).await, json!([]), "nothing was uploaded");

    // The chat: a urlencoded form and a multipart one; the model is never asked.
    let resp = srv
        .http
        .post(srv.url("/v1/chat"))
        .header("origin", "http://evil.example")
        .header("content-type", "application/x-www-form-urlencoded")
        .body("question=run+my+code")
        .send()
        .await
        .expect("send");
    let s = resp.status();
    assert_forbidden(
        s,
        &resp.text().await.expect("body"),
        &["http://evil.example"],
    );
    let resp = srv
        .http
        .post(srv.url("/v1/chat"))
        .header("origin", "http://evil.example")
        .multipart(reqwest::multipart::Form::new().text("question", "run my code"))
        .send()
        .await
        .expect("send");
    let s = resp.status();
    assert_forbidden(
        s,
        &resp.text().await.expect("body"),
        &["http://evil.example"],
    );
    assert!(stand_in.requests().is_empty(), "the model was asked");

    // Other origins of this machine, `null` (sandboxed frames) and other schemes.
    let port = srv.port();
    for origin in [
        format!("http://127.0.0.1:{}", port.wrapping_add(1)),
        "null".to_owned(),
        "file://".to_owned(),
        format!("http://evil.example:{port}"),
    ] {
        let resp = srv
            .http
            .post(srv.url(&upload))
            .header("origin", &origin)
            .multipart(form())
            .send()
            .await
            .expect("send");
        let s = resp.status();
        assert_forbidden(s, &resp.text().await.expect("body"), &[&origin]);
    }
    // Sec-Fetch-Site without an Origin: cross-site and same-site are other pages.
    for site in ["cross-site", "same-site"] {
        let resp = srv
            .http
            .post(srv.url(&upload))
            .header("sec-fetch-site", site)
            .multipart(form())
            .send()
            .await
            .expect("send");
        let s = resp.status();
        assert_forbidden(s, &resp.text().await.expect("body"), &[site, "cross-site"]);
        let resp = srv
            .http
            .delete(srv.url(&format!("/v1/sessions/{id}")))
            .header("sec-fetch-site", site)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    }
    // An allowed Origin does not outvote the browser's cross-site verdict.
    let resp = srv
        .http
        .post(srv.url(&upload))
        .header("origin", format!("http://127.0.0.1:{port}"))
        .header("sec-fetch-site", "cross-site")
        .multipart(form())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert_eq!(srv.files(&id).await, json!([]), "nothing was uploaded");

    // Reads with a foreign Origin are answered (no CORS headers: the page cannot read them).
    let resp = srv
        .http
        .get(srv.url(&upload))
        .header("origin", "http://evil.example")
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers().get("access-control-allow-origin").is_none());

    // Positive controls: the server's own page (as a browser sends it), and a client that
    // sends neither header.
    for (origin, name) in [
        (format!("http://127.0.0.1:{port}"), "own.txt"),
        (format!("http://localhost:{port}"), "own-localhost.txt"),
    ] {
        let resp = srv
            .http
            .post(srv.url(&upload))
            .header("origin", origin)
            .header("sec-fetch-site", "same-origin")
            .multipart(reqwest::multipart::Form::new().part(
                "file",
                reqwest::multipart::Part::bytes(b"ok".to_vec()).file_name(name),
            ))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::CREATED, "{name}");
    }
    let resp = srv
        .http
        .post(srv.url(&upload))
        .multipart(reqwest::multipart::Form::new().part(
            "file",
            reqwest::multipart::Part::bytes(b"ok".to_vec()).file_name("sdk.txt"),
        ))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::CREATED);
    let names: Vec<Value> = srv
        .files(&id)
        .await
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["path"].clone())
        .collect();
    assert_eq!(
        names,
        vec![
            json!("own-localhost.txt"),
            json!("own.txt"),
            json!("sdk.txt")
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn allowed_hosts_let_a_reverse_proxys_name_through() {
    let srv = start_with(|state| {
        state.with_allowed_hosts([
            "runcell.example.com".parse().expect("name"),
            "alt.example:8443".parse().expect("name:port"),
        ])
    })
    .await;
    for host in [
        "runcell.example.com",
        "runcell.example.com:443",
        "alt.example:8443",
    ] {
        let (s, body) = srv.get_as(host, "/v1/sessions").await;
        assert_eq!(s, StatusCode::OK, "{host}: {body}");
    }
    for host in [
        "other.example",
        "alt.example:8444",
        "runcell.example.com.evil.example",
    ] {
        let (s, body) = srv.get_as(host, "/v1/sessions").await;
        assert_forbidden(s, &body, &[host, "runcell.example.com", "alt.example:8443"]);
    }
    // The proxy's page changes state under its public origin.
    let resp = srv
        .http
        .post(srv.url("/v1/sessions"))
        .header("host", "runcell.example.com")
        .header("origin", "https://runcell.example.com")
        .header("sec-fetch-site", "same-origin")
        .json(&json!({}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::CREATED);
    let resp = srv
        .http
        .post(srv.url("/v1/sessions"))
        .header("host", "runcell.example.com")
        .header("origin", "https://evil.example")
        .json(&json!({}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_and_metrics_say_less_without_a_key_once_keys_exist() {
    let srv = start().await;
    let get = |path: &'static str, key: Option<String>| {
        let mut req = srv.http.get(srv.url(path));
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        async move {
            let resp = req.send().await.expect("send");
            (resp.status(), resp.text().await.expect("body"))
        }
    };
    // Open mode: everything, to anyone on this machine.
    let (s, body) = get("/healthz", None).await;
    assert_eq!(s, StatusCode::OK);
    let health: Value = serde_json::from_str(&body).expect("json");
    assert!(
        health.get("zygote").is_some() && health.get("warm_sessions").is_some(),
        "{health}"
    );
    let (s, body) = get("/metrics", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("runcell_sessions"), "{body}");

    let (_, key) = srv.store.create_key("ops", "default").expect("key");
    let (s, body) = get("/healthz", None).await;
    assert_eq!(
        (s, serde_json::from_str::<Value>(&body).expect("json")),
        (StatusCode::OK, json!({"status": "ok"}))
    );
    let (s, body) = get("/healthz", Some("rc_wrong".into())).await;
    assert_eq!(
        (s, serde_json::from_str::<Value>(&body).expect("json")),
        (StatusCode::OK, json!({"status": "ok"}))
    );
    let (s, body) = get("/healthz", Some(key.clone())).await;
    assert_eq!(s, StatusCode::OK);
    let full: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(full["zygote"], health["zygote"], "{full}");
    assert_eq!(full["warm_sessions"], health["warm_sessions"], "{full}");

    let (s, body) = get("/metrics", None).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{body}");
    assert!(!body.contains("runcell_"), "{body}");
    let (s, body) = get("/metrics", Some(key)).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.contains("runcell_sessions"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_on_their_own_listener_leave_the_main_one() {
    let mut metrics_base = String::new();
    let srv = start_with(|state| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let addr = l.local_addr().expect("addr");
        metrics_base = format!("http://{addr}");
        let app = runcell_server::metrics_app(&state, addr);
        let l = tokio::net::TcpListener::from_std(l).expect("tokio listener");
        tokio::spawn(runcell_server::serve(l, app, std::future::pending()));
        state.without_metrics()
    })
    .await;
    let (_, key) = srv.store.create_key("ops", "default").expect("key");
    let resp = srv
        .http
        .get(srv.url("/metrics"))
        .bearer_auth(&key)
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let v: Value = resp.json().await.expect("json");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("--metrics-listen")),
        "{v}"
    );
    // The metrics listener: no key, only /metrics, the same Host check with its own port.
    let resp = srv
        .http
        .get(format!("{metrics_base}/metrics"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp
        .text()
        .await
        .expect("text")
        .contains("runcell_sessions"));
    for path in ["/v1/sessions", "/healthz", "/"] {
        let resp = srv
            .http
            .get(format!("{metrics_base}{path}"))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let resp = srv
        .http
        .get(format!("{metrics_base}/metrics"))
        .header("host", "evil.example")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = srv
        .http
        .get(format!("{metrics_base}/metrics"))
        .header("host", format!("localhost:{}", srv.port()))
        .send()
        .await
        .expect("send");
    assert_eq!(
        resp.status(),
        StatusCode::FORBIDDEN,
        "the main port is not this listener's"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_named_with_a_quote_and_a_newline_downloads_with_safe_headers() {
    let srv = start().await;
    let id = srv.session(None).await;
    let resp = srv
        .http
        .post(srv.url(&format!("/v1/sessions/{id}/execute")))
        .json(&json!({"code": "open('a\"b\\nc.txt','w').write('one')\nopen('r\u{e9}sum\u{e9} 100%.html','w').write('<script>alert(1)</script>')"}))
        .send()
        .await
        .expect("send");
    let e: Value = resp.json().await.expect("json");
    assert_eq!(e["status"], "ok", "{e}");

    for (path, disposition, mime, body) in [
        (
            "a%22b%0Ac.txt",
            "attachment; filename=\"a_b_c.txt\"; filename*=UTF-8''a%22b%0Ac.txt",
            "text/plain",
            "one",
        ),
        (
            "r%C3%A9sum%C3%A9%20100%25.html",
            "attachment; filename=\"r_sum_ 100_.html\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20100%25.html",
            "text/html",
            "<script>alert(1)</script>",
        ),
    ] {
        let resp = srv
            .http
            .get(srv.url(&format!("/v1/sessions/{id}/files/{path}")))
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let h = resp.headers().clone();
        assert_eq!(h["content-disposition"], disposition, "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["content-security-policy"], "sandbox", "{path}");
        assert_eq!(h["content-type"], mime, "{path}");
        assert_eq!(resp.text().await.expect("body"), body);
    }
}
