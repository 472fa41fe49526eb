//! `runcell serve` under a small open-files limit, flooded with idle connections: the
//! connections it takes are capped from the descriptor budget, so the sessions it runs keep
//! every descriptor they need, and a create past the session cap is refused clearly.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The server's open-files limit in this test (the least a sandbox's own 4096 fits under)...
const NOFILE: u32 = 4096;
/// ...and its connection cap, which leaves 7 sessions by `Capacity::derive`.
const MAX_CONNECTIONS: u32 = 3700;

struct Serve {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn serve_limited(data: &Path) -> Serve {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let mut child = Command::new("prlimit")
        .arg(format!("--nofile={NOFILE}:{NOFILE}"))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_runcell"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--warm-sessions", "0", "--header-timeout", "300"])
        .args(["--max-connections", &MAX_CONNECTIONS.to_string()])
        .env("RUNCELL_DATA_DIR", data)
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve under prlimit");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    loop {
        let line = lines.next().expect("serve exited early").expect("line");
        if line.contains("runcell serving on") {
            break;
        }
    }
    std::thread::spawn(move || for _ in lines.by_ref() {});
    Serve {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    }
}

/// One request on `tcp`, a keep-alive connection; the status and the JSON reply.
fn send(
    tcp: &mut TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &Value,
) -> (u16, Value) {
    let body = body.to_string();
    tcp.write_all(
        format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .expect("write");
    tcp.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, rest)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().expect("length"))
                })
                .unwrap_or(0);
            if rest.len() >= len {
                let status = head[9..12].parse().expect("status");
                let json = serde_json::from_str(rest).unwrap_or(Value::Null);
                return (status, json);
            }
        }
        let n = tcp.read(&mut buf).expect("read");
        assert!(n > 0, "connection closed: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn a_flood_of_connections_never_costs_a_session_its_descriptors() {
    let data = runcell_engine::testing::data_dir_with_runtime(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "runcell-conn-test-",
    );
    let server = serve_limited(&data);
    let addr = server.addr;
    let mut mine = TcpStream::connect(addr).expect("connect");
    let (status, s) = send(&mut mine, addr, "POST", "/v1/sessions", &json!({}));
    assert_eq!(status, 201, "{s}");
    let id = s["id"].as_str().expect("id").to_owned();
    let run = |tcp: &mut TcpStream, code: &str| {
        let path = format!("/v1/sessions/{id}/execute");
        send(tcp, addr, "POST", &path, &json!({ "code": code }))
    };
    let (status, e) = run(&mut mine, "1");
    assert_eq!((status, &e["status"]), (200, &json!("ok")), "{e}");

    // More connections than the server has descriptors; they send nothing. Those past the
    // listen backlog may not get through at all: a flood is what gets through.
    let flood: Vec<TcpStream> = (0..NOFILE as usize + 100)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok())
        .collect();
    assert!(
        flood.len() > MAX_CONNECTIONS as usize,
        "{} connected",
        flood.len()
    );
    // Let the server take all it will take: a request behind the flood gets 503 or waits;
    // meanwhile the session works on, restarts included (a new kernel needs descriptors).
    let started = Instant::now();
    for i in 0..10 {
        let (status, e) = run(
            &mut mine,
            &format!("open('f{i}', 'w').write('x' * {i})\n{i}"),
        );
        assert_eq!(status, 200, "execution {i} during the flood: {e}");
        assert_eq!(e["status"], "ok", "{e}");
    }
    let path = format!("/v1/sessions/{id}/commands");
    let (status, c) = send(
        &mut mine,
        addr,
        "POST",
        &path,
        &json!({"command": "ls | wc -l"}),
    );
    assert_eq!((status, &c["stdout"]), (200, &json!("10\n")), "{c}");
    let (status, e) = run(&mut mine, "import os; os.kill(os.getpid(), 9)");
    assert_eq!(status, 200, "{e}");
    let (status, e) = run(
        &mut mine,
        "sorted(os.listdir()) if 'os' in dir() else len(__import__('os').listdir())",
    );
    assert_eq!(
        (status, &e["status"]),
        (200, &json!("ok")),
        "the kernel came back: {e}"
    );
    let (_, info) = send(
        &mut mine,
        addr,
        "GET",
        &format!("/v1/sessions/{id}"),
        &json!({}),
    );
    assert_eq!(info["status"], "ready", "{info}");

    // Sessions up to the derived cap start; the next is refused with 503, not a dead kernel.
    let mut created = 1;
    let refused = loop {
        let (status, s) = send(&mut mine, addr, "POST", "/v1/sessions", &json!({}));
        if status != 201 {
            break (status, s);
        }
        created += 1;
        assert!(
            created <= 64,
            "no session cap under an open-files limit of {NOFILE}"
        );
    };
    assert_eq!(refused.0, 503, "{}", refused.1);
    assert_eq!(refused.1["error"]["code"], "unavailable", "{}", refused.1);
    assert_eq!(
        created, 7,
        "the cap Capacity::derive gives for {NOFILE} descriptors"
    );
    let (status, e) = run(&mut mine, "2 + 2");
    assert_eq!((status, &e["status"]), (200, &json!("ok")), "{e}");
    eprintln!("flood held for {:?}", started.elapsed());
    drop(flood);
}
