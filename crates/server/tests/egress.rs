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
    server_with(None).await
}

async fn server_with(pip_index_url: Option<String>) -> common::Server {
    let ca_file = tls::trusted().ca_file.clone();
    common::start_engine_with(None, move |c| {
        c.network = runcell_engine::NetworkConfig {
            allow_domains: vec![
                "127.0.0.2".into(),
                "127.0.0.3".into(),
                "127.0.0.4".into(),
                "*.example.com".into(),
            ],
            allow_cidrs: vec!["127.0.0.0/8".into()],
            // The HTTPS destinations' test CA, as an operator adds a private one; not the
            // other test CA (127.0.0.4's), which stays unknown.
            ca_files: vec![ca_file],
            pip_index_url,
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
            .ends_with("This server allows: 127.0.0.2, 127.0.0.3, 127.0.0.4, *.example.com."),
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

    scan_for_secret(&srv, &id).await;
}

/// The secret is in none of the sandbox's processes' environments or memory, the workspace,
/// the audit API or the database file; each scan is shown to work by a marker the cell left.
async fn scan_for_secret(srv: &common::Server, id: &str) {
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
    let ws = srv.engine.workspace_path(id);
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
    let listed: Value = serde_json::from_str(&audit).expect("the audit is JSON");
    assert_eq!(
        listed["executions"][0]["network"][0]["allowed"], true,
        "{audit}"
    );
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

/// HTTPS destinations on the host, each with a leaf from a test CA of its own (generated once
/// per test process): `trusted()`'s CA is given to the server (`--egress-ca-file`),
/// `untrusted()`'s is not.
mod tls {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpListener;
    use std::path::PathBuf;
    use std::sync::{Arc, OnceLock};

    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{pem::PemObject, PrivateKeyDer};

    pub struct TestCa {
        pub ca_file: PathBuf,
        pub ca_pem: String,
        config: Arc<rustls::ServerConfig>,
    }

    fn make(name: &str) -> TestCa {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("egress-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let ca_key = KeyPair::generate().expect("key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, name);
        let ca_cert = ca.self_signed(&ca_key).expect("ca");
        let ca_file = dir.join(format!("{}.pem", name.replace(' ', "-")));
        std::fs::write(&ca_file, ca_cert.pem()).expect("write");
        let issuer = Issuer::new(ca, ca_key);
        let leaf_key = KeyPair::generate().expect("leaf key");
        let leaf = CertificateParams::new(vec![
            "127.0.0.2".to_owned(),
            "127.0.0.3".to_owned(),
            "127.0.0.4".to_owned(),
        ])
        .expect("leaf params")
        .signed_by(&leaf_key, &issuer)
        .expect("leaf");
        let key = PrivateKeyDer::from_pem_slice(leaf_key.serialize_pem().as_bytes()).expect("key");
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .expect("config");
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        TestCa {
            ca_file,
            ca_pem: ca_cert.pem(),
            config: Arc::new(config),
        }
    }

    pub fn trusted() -> &'static TestCa {
        static CA: OnceLock<TestCa> = OnceLock::new();
        CA.get_or_init(|| make("test upstream CA"))
    }

    pub fn untrusted() -> &'static TestCa {
        static CA: OnceLock<TestCa> = OnceLock::new();
        CA.get_or_init(|| make("unknown test CA"))
    }

    /// Serves HTTPS on `ip`:0 with `ca`'s leaf. Each response says whether the request carried
    /// `secret` (never echoing it) and which request of its connection it was:
    /// `authorized 2` is the second request on one connection.
    pub fn destination(ca: &'static TestCa, ip: &str, secret: &'static str) -> u16 {
        serve(ca, ip, secret, |_, authorized, n| {
            let said = if authorized {
                "authorized"
            } else {
                "no secret"
            };
            (200, format!("{said} {n}").into_bytes())
        })
    }

    /// Serves HTTPS on `ip`:0 with `ca`'s leaf; `answer(request line, authorized, n)` gives
    /// each response's status and body (`n`: the request's place on its connection).
    pub fn serve(
        ca: &'static TestCa,
        ip: &str,
        secret: &'static str,
        answer: fn(&str, bool, usize) -> (u16, Vec<u8>),
    ) -> u16 {
        let l = TcpListener::bind((ip, 0)).expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { continue };
                std::thread::spawn(move || {
                    let Ok(conn) = rustls::ServerConnection::new(ca.config.clone()) else {
                        return;
                    };
                    let mut tls = BufReader::new(rustls::StreamOwned::new(conn, s));
                    for n in 1.. {
                        let mut head = String::new();
                        loop {
                            let mut line = String::new();
                            match tls.read_line(&mut line) {
                                Ok(0) | Err(_) => return,
                                Ok(_) => {}
                            }
                            head.push_str(&line);
                            if line == "\r\n" {
                                break;
                            }
                        }
                        let lower = head.to_ascii_lowercase();
                        let length: usize = lower
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        let mut body = vec![0u8; length];
                        if tls.read_exact(&mut body).is_err() {
                            return;
                        }
                        let authorized = lower.contains(&format!(
                            "\r\nauthorization: {}\r\n",
                            secret.to_ascii_lowercase()
                        ));
                        let (status, reply) =
                            answer(head.lines().next().unwrap_or_default(), authorized, n);
                        let kind = if reply.starts_with(b"<html") {
                            "text/html"
                        } else {
                            "application/octet-stream"
                        };
                        let out = tls.get_mut();
                        let sent = write!(
                            out,
                            "HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\r\n",
                            reply.len()
                        )
                        .and_then(|()| out.write_all(&reply))
                        .and_then(|()| out.flush());
                        if sent.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }
}

/// HTTPS to a domain with a secret: the proxy opens it with runcell's CA (which the sandbox's
/// trust stores hold), adds the header to each request on the connection, and verifies the
/// real host against the operator's CA file; Python's requests and urllib and curl all get
/// through. A domain without a secret stays end to end (the sandbox sees the destination's
/// own certificate), an upstream the proxy cannot verify is a 502 saying why, and the scan
/// never finds the secret.
#[tokio::test(flavor = "multi_thread")]
async fn an_https_domain_secret_is_added_by_the_proxy_and_never_enters_the_sandbox() {
    let srv = server().await;
    let secret_port = tls::destination(tls::trusted(), "127.0.0.2", SECRET);
    let plain_port = tls::destination(tls::trusted(), "127.0.0.3", SECRET);
    let unknown_port = tls::destination(tls::untrusted(), "127.0.0.4", SECRET);
    let (s, session) = post(
        &srv,
        "/v1/sessions",
        json!({"network": {"type": "allowlist",
            "allowed_domains": ["127.0.0.2", "127.0.0.3", "127.0.0.4"],
            "domain_secrets": [
                {"domain": "127.0.0.2", "name": "Authorization", "value": SECRET},
                {"domain": "127.0.0.4", "name": "Authorization", "value": SECRET}]}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().expect("id").to_owned();
    let test_ca = tls::trusted().ca_pem.clone();
    let code = format!(
        r#"import json, ssl, subprocess, http.client, urllib.request
# The runtime has no requests of its own; pip's copy is the same library (its proxy and
# REQUESTS_CA_BUNDLE handling included).
from pip._vendor import requests
marker = 'MEMORY-' + 'PROBE' * 2
open('probe.txt', 'w').write('FILE-' + 'PROBE' * 2)
open('test-ca.pem', 'w').write("""{test_ca}""")
out = {{}}
with requests.Session() as s:
    out['requests'] = [s.get('https://127.0.0.2:{secret_port}/a', timeout=10).text for _ in range(2)]
out['urllib'] = urllib.request.urlopen('https://127.0.0.2:{secret_port}/b', timeout=10).read().decode()
r = subprocess.run(['curl', '-sS', 'https://127.0.0.2:{secret_port}/c'], capture_output=True, text=True)
out['curl'] = r.stdout + r.stderr
def issuer(host, port, ctx):
    c = http.client.HTTPSConnection('127.0.0.1', 3128, context=ctx, timeout=10)
    c.set_tunnel(host, port)
    c.request('GET', '/d')
    body = c.getresponse().read().decode()
    cn = dict(x[0] for x in c.sock.getpeercert()['issuer'])['commonName']
    c.close()
    return [body, cn]
out['opened'] = issuer('127.0.0.2', {secret_port}, ssl.create_default_context())
out['tunnel'] = issuer('127.0.0.3', {plain_port}, ssl.create_default_context(cafile='test-ca.pem'))
try:
    issuer('127.0.0.3', {plain_port}, ssl.create_default_context())
    out['tunnel_default'] = 'verified'
except ssl.SSLCertVerificationError as e:
    out['tunnel_default'] = e.verify_message
r = requests.get('https://127.0.0.4:{unknown_port}/e', timeout=10)
out['unknown'] = [r.status_code, r.text]
print(json.dumps(out))
"#
    );
    let (s, e) = post(
        &srv,
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": code}),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert!(e["error"].is_null(), "{e}");
    let out: Value = serde_json::from_str(e["stdout"].as_str().unwrap_or_default())
        .unwrap_or_else(|err| panic!("{err}: {e}"));
    // Two requests on one kept-alive connection, both with the header.
    assert_eq!(
        out["requests"],
        json!(["authorized 1", "authorized 2"]),
        "{out}"
    );
    assert_eq!(out["urllib"], "authorized 1", "{out}");
    assert_eq!(out["curl"], "authorized 1", "{out}");
    let opened = out["opened"].as_array().expect("opened");
    assert_eq!(opened[0], "authorized 1", "{out}");
    assert!(
        opened[1]
            .as_str()
            .unwrap_or_default()
            .starts_with("runcell egress CA"),
        "the opened connection's leaf is runcell's: {out}"
    );
    // No secret: end to end, the destination's own certificate, nothing added.
    assert_eq!(
        out["tunnel"],
        json!(["no secret 1", "test upstream CA"]),
        "{out}"
    );
    assert_eq!(
        out["tunnel_default"], "unable to get local issuer certificate",
        "{out}"
    );
    let unknown = out["unknown"].as_array().expect("unknown");
    assert_eq!(unknown[0], 502, "{out}");
    let why = unknown[1].as_str().unwrap_or_default();
    assert!(
        why.starts_with(&format!("runcell egress: the TLS connection to 127.0.0.4:{unknown_port} failed: invalid peer certificate: UnknownIssuer")),
        "{why}"
    );
    let network = e["network"].as_array().expect("network");
    assert!(
        network
            .iter()
            .any(|c| c["domain"] == "127.0.0.4" && c["allowed"] == false),
        "{e}"
    );
    assert!(
        network
            .iter()
            .filter(|c| c["domain"] == "127.0.0.2")
            .all(|c| c["allowed"] == true && c["bytes_in"].as_u64() > Some(0)),
        "{e}"
    );
    scan_for_secret(&srv, &id).await;
}

/// A wheel of `rcdemo` 1.0 (`rcdemo.VALUE == 42`), built once by the host's Python.
fn demo_wheel() -> &'static [u8] {
    static WHEEL: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    WHEEL.get_or_init(|| {
        let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("rcdemo-{}.whl", std::process::id()));
        let script = r#"
import sys, zipfile
files = {
    'rcdemo/__init__.py': 'VALUE = 42\n',
    'rcdemo-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\nName: rcdemo\nVersion: 1.0\n',
    'rcdemo-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\nGenerator: runcell-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
}
files['rcdemo-1.0.dist-info/RECORD'] = ''.join(f'{n},,\n' for n in files) + 'rcdemo-1.0.dist-info/RECORD,,\n'
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    for n, t in files.items():
        z.writestr(n, t)
"#;
        let ok = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .status()
            .expect("python3");
        assert!(ok.success());
        let wheel = std::fs::read(&path).expect("wheel");
        let _ = std::fs::remove_file(&path);
        wheel
    })
}

/// A private package index (a PEP 503 simple index over HTTPS) that answers only requests
/// carrying the secret: `serve --pip-index-url` points pip at it, the proxy adds the secret,
/// and pip installs from it into the workspace; with another value it is a 401.
#[tokio::test(flavor = "multi_thread")]
async fn pip_installs_from_the_operators_index_through_an_opened_https_domain() {
    demo_wheel();
    let index_port = tls::serve(
        tls::trusted(),
        "127.0.0.2",
        SECRET,
        |line, authorized, _| {
            if !authorized {
                return (401, b"no secret".to_vec());
            }
            match line.split(' ').nth(1).unwrap_or_default() {
            "/simple/rcdemo/" => (
                200,
                b"<html><body><a href=\"/files/rcdemo-1.0-py3-none-any.whl\">rcdemo-1.0-py3-none-any.whl</a></body></html>".to_vec(),
            ),
            "/files/rcdemo-1.0-py3-none-any.whl" => (200, demo_wheel().to_vec()),
            _ => (404, b"not here".to_vec()),
        }
        },
    );
    let srv = server_with(Some(format!("https://127.0.0.2:{index_port}/simple/"))).await;
    let policy = |secret: bool| {
        let value = if secret { SECRET } else { "Bearer wrong" };
        let secrets = json!([{"domain": "127.0.0.2", "name": "Authorization", "value": value}]);
        json!({"network": {"type": "allowlist", "allowed_domains": ["127.0.0.2"], "domain_secrets": secrets}})
    };
    let install = "import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', 'rcdemo'], capture_output=True, text=True)\nprint(r.returncode)\nprint(r.stdout[-500:], r.stderr[-1500:])";
    let (s, session) = post(&srv, "/v1/sessions", policy(true)).await;
    assert_eq!(s, StatusCode::CREATED, "{session}");
    let id = session["id"].as_str().expect("id").to_owned();
    let (_, e) = post(
        &srv,
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": install}),
    )
    .await;
    let out = e["stdout"].as_str().unwrap_or_default();
    assert!(out.starts_with("0\n"), "{e}");
    assert!(out.contains("Successfully installed rcdemo-1.0"), "{out}");
    let (_, e) = post(
        &srv,
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": "import rcdemo\nprint(rcdemo.VALUE, rcdemo.__file__)"}),
    )
    .await;
    assert_eq!(
        e["stdout"], "42 /workspace/.runcell/site-packages/rcdemo/__init__.py\n",
        "{e}"
    );
    // The control: the same index with another value refuses pip.
    let (_, session) = post(&srv, "/v1/sessions", policy(false)).await;
    let id = session["id"].as_str().expect("id").to_owned();
    let (_, e) = post(
        &srv,
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": install}),
    )
    .await;
    let out = e["stdout"].as_str().unwrap_or_default();
    // pip (no prompt: PIP_NO_INPUT) takes the index's 401 as an empty page.
    assert!(out.starts_with("1\n"), "{e}");
    assert!(
        out.contains("No matching distribution found for rcdemo"),
        "{out}"
    );
}
