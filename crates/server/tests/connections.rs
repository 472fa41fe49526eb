//! What bounds a connection, from a client's side: silent, half-sent and idle keep-alive
//! connections are closed on time, the connection cap answers 503 past it and frees up as
//! connections close, a slow body is cut, a session keeps working through a flood, and the
//! session cap refuses clearly.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use runcell_server::ServeOptions;
use serde_json::{json, Value};

fn options(
    max_connections: usize,
    header: u64,
    keep_alive: u64,
    body: u64,
    rate: u64,
) -> ServeOptions {
    ServeOptions {
        max_connections,
        header_timeout: Duration::from_secs(header),
        keep_alive_timeout: Duration::from_secs(keep_alive),
        body_timeout: Duration::from_secs(body),
        body_min_rate: rate,
    }
}

async fn start(options: ServeOptions) -> common::Server {
    common::start_with_options(|s| s, options).await
}

/// Blocks (on a blocking thread) until the server closes `tcp`; returns how long that took
/// and what it sent first (a 408 from hyper would be fine; nothing is what it sends today).
async fn closed_after(mut tcp: TcpStream) -> (Duration, Vec<u8>) {
    tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        tcp.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("the server did not close the connection: {e}"),
            }
        }
        (start.elapsed(), got)
    })
    .await
    .expect("join")
}

fn request(addr: SocketAddr, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_or_half_sent_request_is_closed_after_the_header_timeout() {
    let server = start(options(64, 1, 30, 30, 1024)).await;

    let silent = TcpStream::connect(server.addr).expect("connect");
    let (took, got) = closed_after(silent).await;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "a silent connection was closed after {took:?}"
    );
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));

    let mut half = TcpStream::connect(server.addr).expect("connect");
    half.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n", server.addr).as_bytes())
        .expect("write");
    let (took, _) = closed_after(half).await;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "a half-sent head was closed after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_keep_alive_connection_is_closed_after_its_own_timeout() {
    // The header timeout is long: only the keep-alive timeout can close this one early.
    let server = start(options(64, 30, 1, 30, 1024)).await;
    let mut tcp = TcpStream::connect(server.addr).expect("connect");
    tcp.write_all(request(server.addr, "/healthz").as_bytes())
        .expect("write");
    let first = tokio::task::spawn_blocking(move || {
        let r = common::read_response(&mut tcp);
        (r, tcp)
    });
    let (resp, tcp) = first.await.expect("join");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let (took, got) = closed_after(tcp).await;
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "an idle keep-alive connection was closed after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_connection_cap_a_client_gets_503_until_one_closes() {
    let server = start(options(8, 60, 60, 30, 1024)).await;
    let mut idle: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(server.addr).expect("connect"))
        .collect();
    // Accepted in order: by the time the ninth is, the eight hold every slot.
    let addr = server.addr;
    let resp = tokio::task::spawn_blocking(move || {
        let mut ninth = TcpStream::connect(addr).expect("connect");
        ninth
            .write_all(request(addr, "/healthz").as_bytes())
            .expect("write");
        common::read_response(&mut ninth)
    })
    .await
    .expect("join");
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    let lower = resp.to_ascii_lowercase();
    assert!(lower.contains("retry-after: 1"), "{resp}");
    assert!(lower.contains("connection: close"), "{resp}");
    let body: Value =
        serde_json::from_str(resp.split_once("\r\n\r\n").expect("body").1).expect("json");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("at most 8 connections")),
        "{body}"
    );

    // Two leave; a new client is served once the server has seen them go.
    idle.truncate(6);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = reqwest::Client::new();
        let r = fresh
            .get(format!("{}/healthz", server.base))
            .send()
            .await
            .expect("request");
        if r.status() == 200 {
            break;
        }
        assert_eq!(r.status(), 503);
        assert!(Instant::now() < deadline, "no slot freed after two closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(idle);
}

/// POSTs `body` on `tcp`, a keep-alive connection, and returns the status and the JSON reply.
fn post_on(tcp: &mut TcpStream, addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    tcp.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .expect("write");
    let resp = common::read_response(tcp);
    let status = resp[9..12].parse().expect("status");
    let json = serde_json::from_str(resp.split_once("\r\n\r\n").expect("body").1).expect("json");
    (status, json)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_keeps_executing_while_idle_connections_saturate_the_cap() {
    let server = start(options(8, 60, 60, 30, 1024)).await;
    let addr = server.addr;
    tokio::task::spawn_blocking(move || {
        // This client's connection is in before the flood, and kept alive through it.
        let mut mine = TcpStream::connect(addr).expect("connect");
        let (status, s) = post_on(&mut mine, addr, "/v1/sessions", &json!({}));
        assert_eq!(status, 201, "{s}");
        let id = s["id"].as_str().expect("id").to_owned();
        let flood: Vec<TcpStream> = (0..40)
            .map(|_| TcpStream::connect(addr).expect("connect"))
            .collect();
        for i in 0..5 {
            let code = format!("open('f{i}', 'w').write('x')\n{i} * 2");
            let path = format!("/v1/sessions/{id}/execute");
            let (status, e) = post_on(&mut mine, addr, &path, &json!({ "code": code }));
            assert_eq!(status, 200, "{e}");
            assert_eq!(e["status"], "ok", "{e}");
            assert_eq!(e["results"][0]["data"]["text/plain"], (i * 2).to_string());
        }
        let path = format!("/v1/sessions/{id}/commands");
        let (status, c) = post_on(&mut mine, addr, &path, &json!({"command": "ls"}));
        assert_eq!(status, 200, "{c}");
        assert_eq!(c["stdout"], "f0\nf1\nf2\nf3\nf4\n", "{c}");
        drop(flood);
    })
    .await
    .expect("join");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_execution_longer_than_the_keep_alive_timeout_is_not_cut() {
    let server = start(options(16, 1, 1, 30, 1024)).await;
    let s: Value = server
        .http
        .post(format!("{}/v1/sessions", server.base))
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("session");
    let id = s["id"].as_str().expect("id");
    let text = server
        .http
        .post(format!("{}/v1/sessions/{id}/execute", server.base))
        .header("accept", "application/x-ndjson")
        .json(&json!({"code": "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(1)"}))
        .send()
        .await
        .expect("execute")
        .text()
        .await
        .expect("stream");
    let last: Value = serde_json::from_str(text.lines().last().expect("a line")).expect("json");
    assert_eq!(last["type"], "end", "{text}");
    assert_eq!(last["execution"]["status"], "ok", "{text}");
    assert_eq!(last["execution"]["stdout"], "0\n1\n2\n", "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_slower_than_the_minimum_rate_is_cut_with_408() {
    let server = start(options(16, 30, 30, 1, 100)).await;
    let s: Value = server
        .http
        .post(format!("{}/v1/sessions", server.base))
        .json(&json!({}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("session");
    let id = s["id"].as_str().expect("id").to_owned();
    let addr = server.addr;
    let (took, resp) = tokio::task::spawn_blocking(move || {
        let mut tcp = TcpStream::connect(addr).expect("connect");
        tcp.write_all(
            format!(
                "PUT /v1/sessions/{id}/files/slow.txt HTTP/1.1\r\nHost: {addr}\r\n\
                 Content-Length: 100000\r\n\r\n"
            )
            .as_bytes(),
        )
        .expect("head");
        let start = Instant::now();
        tcp.set_nonblocking(true).expect("nonblocking");
        let mut got = Vec::new();
        // 20 bytes a second: a fifth of the minimum rate.
        while start.elapsed() < Duration::from_secs(20) {
            let _ = tcp.write_all(b"xx");
            let mut buf = [0u8; 4096];
            match tcp.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if String::from_utf8_lossy(&got).contains("}}") {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (start.elapsed(), String::from_utf8_lossy(&got).into_owned())
    })
    .await
    .expect("join");
    assert!(resp.starts_with("HTTP/1.1 408"), "after {took:?}: {resp}");
    assert!(resp.contains("\"code\":\"invalid_request\""), "{resp}");
    assert!(resp.contains("too slowly"), "{resp}");
    assert!(took < Duration::from_secs(5), "cut after {took:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn creating_a_session_past_the_session_cap_is_refused_with_503() {
    let server = start(ServeOptions::default()).await;
    server.engine.sessions().set_max_sessions(1);
    let create = || async {
        server
            .http
            .post(format!("{}/v1/sessions", server.base))
            .json(&json!({}))
            .send()
            .await
            .expect("create")
    };
    let first = create().await;
    assert_eq!(first.status(), 201);
    let id = first.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let second = create().await;
    assert_eq!(second.status(), 503);
    assert_eq!(
        second
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = second.json().await.expect("json");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("at most 1 sessions")),
        "{body}"
    );
    // A one-shot sandbox takes a place too.
    let once = || async {
        server
            .http
            .post(format!("{}/v1/execute", server.base))
            .json(&json!({"code": "print(6 * 7)"}))
            .send()
            .await
            .expect("execute once")
    };
    let r = once().await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");

    // Its place frees with the first.
    let r = server
        .http
        .delete(format!("{}/v1/sessions/{id}", server.base))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status(), 204);
    let r = once().await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["stdout"], "42\n");
    assert_eq!(create().await.status(), 201);
}

#[test]
fn the_capacity_leaves_every_session_its_descriptors() {
    use runcell_server::{Capacity, FDS_PER_SESSION, RESERVED_FDS};
    let c = Capacity::derive(20_000, 2, None).expect("capacity");
    assert_eq!(c.max_connections, 1024);
    let used = RESERVED_FDS
        + 2 * FDS_PER_SESSION
        + c.max_connections as u64
        + 32
        + c.max_sessions as u64 * FDS_PER_SESSION;
    assert!(used <= 20_000, "{c:?} needs {used}");
    assert!(c.max_sessions > 500, "{c:?}");

    let small = Capacity::derive(512, 0, None).expect("capacity");
    assert_eq!(small.max_connections, 96);
    assert_eq!(small.max_sessions, 8);
    // What the CLI's flood test runs with.
    let flooded = Capacity::derive(4096, 0, Some(3700)).expect("capacity");
    assert_eq!(flooded.max_sessions, 7);

    // An explicit cap that leaves nothing for sessions is refused, with the way out.
    let err = Capacity::derive(512, 0, Some(500)).expect_err("no room");
    assert!(err.contains("ulimit -n"), "{err}");
}
