//! Network policies over HTTP: the session's `network` as created and read back, the server's
//! bound (400 `limit_exceeded`) and malformed policies (400 `invalid_request`), the document
//! saying so, and a domain secret that reaches the destination while a scan of the sandbox's
//! environment, memory and workspace, and the audit log, never finds it.

mod common;

use std::io::{Read, Seek, Write};
use std::net::TcpListener;

use reqwest::StatusCode;
use serde_json::{json, Value};

const SECRET: &str = "Bearer rc-secret-7f3a9c1e55d24b6c";

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

async fn server() -> common::Server {
    common::start_engine_with(None, |c| {
        c.network = runcell_engine::NetworkConfig {
            allow_domains: vec!["127.0.0.2".into(), "*.example.com".into()],
            allow_cidrs: vec!["127.0.0.0/8".into()],
        };
    })
    .await
}

/// A destination on the host (127.0.0.2) that says whether the request carried the secret,
/// never echoing it.
fn destination() -> u16 {
    let l = TcpListener::bind("127.0.0.2:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let body = if head.contains(&format!("\r\nAuthorization: {SECRET}\r\n")) {
                "authorized"
            } else {
                "no secret"
            };
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn policies_are_checked_against_the_bound_and_read_back_redacted() {
    let srv = server().await;
    for (network, status, code) in [
        (
            json!({"type": "allowlist", "allowed_domains": ["github.com"]}),
            400,
            "limit_exceeded",
        ),
        (
            json!({"type": "allowlist", "allowed_domains": ["a b"]}),
            400,
            "invalid_request",
        ),
        (
            json!({"type": "allowlist", "allowed_domains": ["127.0.0.2"], "domain_secrets": [{"domain": "x.example.com", "name": "A", "value": "v"}]}),
            400,
            "invalid_request",
        ),
        (json!({"type": "open"}), 400, "invalid_request"),
        (
            json!({"type": "disabled", "allowed_domains": []}),
            400,
            "invalid_request",
        ),
    ] {
        let (s, body) = post(
            &srv,
            "/v1/sessions",
            json!({"language": "bash", "network": network}),
        )
        .await;
        assert_eq!(
            (s.as_u16(), body["error"]["code"].as_str()),
            (status, Some(code)),
            "{network}: {body}"
        );
    }
    let (s, session) = post(
        &srv,
        "/v1/sessions",
        json!({"language": "bash", "network": {"type": "allowlist", "allowed_domains": ["127.0.0.2", "A.Example.com"],
            "domain_secrets": [{"domain": "127.0.0.2", "name": "Authorization", "value": SECRET}]}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{session}");
    assert_eq!(
        session["network"],
        json!({"type": "allowlist", "allowed_domains": ["127.0.0.2", "A.Example.com"],
            "domain_secrets": [{"domain": "127.0.0.2", "name": "Authorization", "value": "<redacted>"}]})
    );
    let (_, plain) = post(&srv, "/v1/sessions", json!({"language": "bash"})).await;
    assert_eq!(plain["network"], json!({"type": "disabled"}));
    // The document says what this server takes.
    let doc: Value = srv
        .http
        .get(format!("{}/openapi.json", srv.base))
        .send()
        .await
        .expect("doc")
        .json()
        .await
        .expect("json");
    let policy = &doc["components"]["schemas"]["NetworkPolicy"];
    assert!(
        policy["description"]
            .as_str()
            .expect("description")
            .ends_with("This server allows: 127.0.0.2, *.example.com."),
        "{policy}"
    );
    assert_eq!(
        policy["oneOf"][1]["properties"]["allowed_domains"]["maxItems"],
        256
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_bound_the_document_allows_no_domain() {
    let srv = common::start().await;
    let doc: Value = srv
        .http
        .get(format!("{}/openapi.json", srv.base))
        .send()
        .await
        .expect("doc")
        .json()
        .await
        .expect("json");
    let allowlist = &doc["components"]["schemas"]["NetworkPolicy"]["oneOf"][1]["properties"];
    assert_eq!(allowlist["allowed_domains"]["maxItems"], 0);
    assert_eq!(allowlist["domain_secrets"]["maxItems"], 0);
    let (s, body) = post(
        &srv,
        "/v1/sessions",
        json!({"network": {"type": "allowlist", "allowed_domains": ["pypi.org"]}}),
    )
    .await;
    assert_eq!(
        (s.as_u16(), body["error"]["code"].as_str()),
        (400, Some("limit_exceeded"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_domain_secret_reaches_the_destination_and_never_the_sandbox_or_the_audit_log() {
    let srv = server().await;
    let port = destination();
    let (s, session) = post(
        &srv,
        "/v1/sessions",
        json!({"network": {"type": "allowlist", "allowed_domains": ["127.0.0.2"],
            "domain_secrets": [{"domain": "127.0.0.2", "name": "Authorization", "value": SECRET}]}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().expect("id").to_owned();
    let code = format!(
        "import urllib.request\nmarker = 'MEMORY-' + 'PROBE' * 2\nopen('probe.txt', 'w').write('FILE-' + 'PROBE' * 2)\n\
         print(urllib.request.urlopen('http://127.0.0.2:{port}/', timeout=10).read().decode())"
    );
    let (s, e) = post(
        &srv,
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": code}),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(e["stdout"], "authorized\n", "{e}");
    assert_eq!(e["network"][0]["domain"], "127.0.0.2");
    assert_eq!(e["network"][0]["allowed"], true);

    // The sandbox's processes: those with the session's proxy environment.
    let pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("proc")
        .filter_map(|d| d.ok()?.file_name().to_str()?.parse().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| contains(&env, b"PIP_TARGET=/workspace/.runcell/site-packages"))
        })
        .collect();
    assert!(!pids.is_empty(), "no sandbox process found");
    let mut probes_seen = false;
    for pid in &pids {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        assert!(
            !contains(&env, SECRET.as_bytes()),
            "the secret is in pid {pid}'s environment"
        );
        let mem = readable_memory(*pid);
        probes_seen |= contains(&mem, b"MEMORY-PROBEPROBE");
        assert!(
            !contains(&mem, SECRET.as_bytes()),
            "the secret is in pid {pid}'s memory"
        );
    }
    // The control: the scan sees what the cell put in its memory.
    assert!(
        probes_seen,
        "the memory scan found not even the cell's own marker"
    );
    let ws = srv.engine.workspace_path(&id);
    let mut files = Vec::new();
    walk(&ws, &mut files);
    assert!(
        files.iter().any(|f| contains(f, b"FILE-PROBEPROBE")),
        "the workspace scan found not even probe.txt"
    );
    assert!(
        files.iter().all(|f| !contains(f, SECRET.as_bytes())),
        "the secret is in the workspace"
    );

    let audit = srv
        .http
        .get(format!("{}/v1/executions?session_id={id}", srv.base))
        .send()
        .await
        .expect("audit")
        .text()
        .await
        .expect("text");
    assert!(audit.contains("\"network\":[{\"allowed\":true,"), "{audit}");
    assert!(
        !audit.contains(SECRET) && !audit.contains("rc-secret"),
        "the secret is in the audit log"
    );
    let db = std::fs::read(srv.engine.config().data_dir.join("runcell.db")).expect("db");
    assert!(
        !contains(&db, SECRET.as_bytes()),
        "the secret is in the database"
    );
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every readable mapping of `pid` (as root, through /proc/PID/mem).
fn readable_memory(pid: u32) -> Vec<u8> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.seek(std::io::SeekFrom::Start(a)).is_ok() && mem.read_exact(&mut buf).is_ok() {
            out.extend_from_slice(&buf);
        }
    }
    out
}

fn walk(dir: &std::path::Path, out: &mut Vec<Vec<u8>>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, out),
            Ok(t) if t.is_file() => out.push(std::fs::read(&p).unwrap_or_default()),
            _ => {}
        }
    }
}
