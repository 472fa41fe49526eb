//! The egress proxy attacked from inside a sandbox (`runcell run --allow-domain`): raw sockets
//! and DNS still go nowhere, and every way to make the proxy reach what the allowlist and the
//! address policy forbid is refused with its reason; each probe has a positive control (the
//! allowed destination through the proxy, and the same raw connect from the host).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

/// The probes, one `name: outcome` line each. `{PORT}` is the host server's, `{OWN}` one of
/// the host's own addresses.
const PROBES: &str = r#"
import socket, errno
P = ('127.0.0.1', 3128)
PORT, OWN = {PORT}, '{OWN}'
def ask(raw):
    s = socket.create_connection(P, timeout=10)
    s.sendall(raw)
    out = b''
    while True:
        try:
            d = s.recv(65536)
        except OSError:
            break
        if not d:
            break
        out += d
    return out.decode('latin1')
def refusal(out):
    head, _, body = out.partition('\r\n\r\n')
    return head.split('\r\n')[0].split(' ', 2)[1] + ' ' + body.strip()
def hello(sni):
    n = sni.encode()
    sn = b'\x00' + len(n).to_bytes(2, 'big') + n
    ext = b'\x00\x00' + (len(sn) + 2).to_bytes(2, 'big') + len(sn).to_bytes(2, 'big') + sn
    body = b'\x03\x03' + b'\x07' * 32 + b'\x00' + b'\x00\x02\x13\x01' + b'\x01\x00' + len(ext).to_bytes(2, 'big') + ext
    hs = b'\x01' + len(body).to_bytes(3, 'big') + body
    return b'\x16\x03\x01' + len(hs).to_bytes(2, 'big') + hs
def raw(kind, addr):
    try:
        if kind == 'udp':
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', addr)
        else:
            socket.create_connection(addr, timeout=5)
        return 'ok'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def line(name, value):
    print(name + ': ' + value)
line('raw_tcp_out', raw('tcp', ('1.1.1.1', 80)))
line('raw_udp_out', raw('udp', ('8.8.8.8', 53)))
line('raw_tcp_host_server', raw('tcp', ('127.0.0.2', PORT)))
try:
    socket.getaddrinfo('pypi.org', 443)
    line('dns', 'resolved')
except socket.gaierror as e:
    line('dns', str(e.errno))
line('allowed', ask(b'CONNECT 127.0.0.2:%d HTTP/1.1\r\n\r\nPING\r\n\r\n' % PORT).replace('\r\n', '|'))
line('loopback', refusal(ask(b'CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n' % PORT)))
line('rebinding_name', refusal(ask(b'CONNECT localhost:%d HTTP/1.1\r\n\r\n' % PORT)))
line('metadata', refusal(ask(b'GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n')))
line('own_address', refusal(ask(b'CONNECT %s:%d HTTP/1.1\r\n\r\n' % (OWN.encode(), PORT))))
line('unlisted_literal', refusal(ask(b'CONNECT 127.0.0.3:%d HTTP/1.1\r\n\r\n' % PORT)))
line('other_host', refusal(ask(b'GET http://pypi.org/simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n')))
line('host_mismatch', refusal(ask(b'GET http://127.0.0.2:%d/ HTTP/1.1\r\nHost: example.org\r\n\r\n' % PORT)))
line('sni_mismatch', ask(b'CONNECT 127.0.0.2:%d HTTP/1.1\r\n\r\n' % PORT + hello('example.org')).replace('\r\n', '|'))
line('origin_form', refusal(ask(b'GET / HTTP/1.1\r\nHost: 127.0.0.2:%d\r\n\r\n' % PORT)))
line('smuggled', refusal(ask(b'POST http://127.0.0.2:%d/ HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n' % PORT)))
"#;

/// A host server at 127.0.0.2 answering `hello` to whatever comes.
fn host_server() -> u16 {
    let l = TcpListener::bind("127.0.0.2:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        }
    });
    port
}

/// One of the host's own non-loopback addresses (the one its default route leaves by).
fn own_address() -> String {
    let s = UdpSocket::bind("0.0.0.0:0").expect("udp");
    s.connect("192.0.2.1:9").expect("route");
    s.local_addr().expect("addr").ip().to_string()
}

#[test]
fn the_proxy_refuses_every_way_around_the_allowlist() {
    let port = host_server();
    let own = own_address();
    // The control for the raw probe: from the host, the server is there.
    let mut direct = TcpStream::connect(("127.0.0.2", port)).expect("host connect");
    direct.set_read_timeout(Some(Duration::from_secs(5))).ok();
    direct.write_all(b"GET / HTTP/1.1\r\n\r\n").expect("write");
    let mut got = String::new();
    let _ = direct.read_to_string(&mut got);
    assert!(got.ends_with("hello"), "{got}");

    let code = PROBES
        .replace("{PORT}", &port.to_string())
        .replace("{OWN}", &own);
    let allow = format!("127.0.0.2,127.0.0.1,localhost,169.254.169.254,{own},example.org");
    let out = common::run_raw(
        "python",
        &code,
        &[],
        &["--allow-domain", &allow, "--allow-cidr", "127.0.0.2/32"],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: std::collections::HashMap<&str, &str> =
        stdout.lines().filter_map(|l| l.split_once(": ")).collect();
    let policy = " (the server's address policy; serve --egress-allow-cidr allows a range)";
    let expect = [
        ("raw_tcp_out", "ENETUNREACH".to_owned()),
        ("raw_udp_out", "ENETUNREACH".to_owned()),
        // 127.0.0.2 inside is the sandbox's own loopback: nothing listens there.
        ("raw_tcp_host_server", "ECONNREFUSED".to_owned()),
        // No resolver at all (an empty resolv.conf; nothing on port 53).
        ("dns", "-2".to_owned()),
        (
            "allowed",
            "HTTP/1.1 200 Connection Established||HTTP/1.1 200 OK|Content-Length: 5||hello".to_owned(),
        ),
        ("loopback", format!("403 runcell egress: refused CONNECT 127.0.0.1:{port}: 127.0.0.1 resolves to 127.0.0.1, a loopback address{policy}")),
        ("rebinding_name", format!("403 runcell egress: refused CONNECT localhost:{port}: localhost resolves to 127.0.0.1, a loopback address{policy}")),
        ("metadata", format!("403 runcell egress: refused GET 169.254.169.254:80: 169.254.169.254 resolves to 169.254.169.254, a link-local address (cloud metadata lives there){policy}")),
        ("unlisted_literal", format!("403 runcell egress: refused CONNECT 127.0.0.3:{port}: 127.0.0.3 is not in this session's network allowlist (allowed_domains: {allow})").replace(",", ", ")),
        ("other_host", format!("403 runcell egress: refused GET pypi.org:80: pypi.org is not in this session's network allowlist (allowed_domains: {allow})").replace(",", ", ")),
        ("host_mismatch", format!("403 runcell egress: refused GET 127.0.0.2:{port}: the Host header says \"example.org\", the URL another destination")),
        // Cut before a byte of the hello went on: no answer from the server.
        ("sni_mismatch", "HTTP/1.1 200 Connection Established||".to_owned()),
        ("origin_form", "400 runcell egress: not a proxy request: an origin-form request: send absolute-form (GET http://host/path) or CONNECT".to_owned()),
        ("smuggled", "400 runcell egress: malformed request: both Transfer-Encoding and Content-Length".to_owned()),
    ];
    for (name, want) in &expect {
        assert_eq!(
            lines.get(name).copied(),
            Some(want.as_str()),
            "{name}\n{stdout}"
        );
    }
    let own_line = lines.get("own_address").copied().unwrap_or_default();
    assert!(
        own_line.starts_with(&format!(
            "403 runcell egress: refused CONNECT {own}:{port}: {own} resolves to {own}, "
        )) && (own_line.contains("a private address")
            || own_line.contains("one of the host's own addresses")),
        "{own_line}"
    );
}

const KEPT_SECRET: &str = "Bearer kept-secret-41d9";

/// A destination at 127.0.0.2 saying whether a request carried [`KEPT_SECRET`] (never echoing
/// it).
fn secret_destination() -> u16 {
    let l = TcpListener::bind("127.0.0.2:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_string();
            let body = if head.contains(&format!("\r\nAuthorization: {KEPT_SECRET}\r\n")) {
                "authorized"
            } else {
                "no secret"
            };
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// A session's network policy (allowlist and secret) is the same after a pause and resume and
/// after the server restarts (kept beside the egress CA, readable by the server only, never
/// in the database); a restart whose bound no longer covers it brings the session back
/// without a network, never with more than the server allows. The CA survives restarts.
#[test]
fn a_network_policy_survives_pause_resume_and_a_restart() {
    use serde_json::{json, Value};
    let port = secret_destination();
    let data = common::serve::data_dir("runcell-egress-kept-");
    let flags = [
        "--egress-allow",
        "127.0.0.2,127.0.0.3",
        "--egress-allow-cidr",
        "127.0.0.0/8",
    ];
    let c = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client");
    let post = |base: &str, path: &str, body: Value| -> (u16, Value) {
        let r = c
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .expect("POST");
        (r.status().as_u16(), r.json().unwrap_or(Value::Null))
    };
    let fetch = |base: &str, id: &str, host: &str| -> String {
        let code = format!(
            "import urllib.request, urllib.error\n\
             try:\n    print(urllib.request.urlopen('http://{host}:{port}/', timeout=10).read().decode())\n\
             except urllib.error.HTTPError as e:\n    print(e.code)"
        );
        let (s, e) = post(
            base,
            &format!("/v1/sessions/{id}/execute"),
            json!({"code": code}),
        );
        assert_eq!(s, 200, "{e}");
        e["stdout"].as_str().unwrap_or_default().trim().to_owned()
    };
    let first = common::serve::serve(&data, &flags);
    let (s, session) = post(
        &first.base,
        "/v1/sessions",
        json!({"network": {"type": "allowlist", "allowed_domains": ["127.0.0.2"],
            "domain_secrets": [{"domain": "127.0.0.2", "name": "Authorization", "value": KEPT_SECRET}]}}),
    );
    assert_eq!(s, 201, "{session}");
    let id = session["id"].as_str().expect("id").to_owned();
    let expected = session["network"].clone();
    assert_eq!(expected["domain_secrets"][0]["value"], "<redacted>");
    assert_eq!(fetch(&first.base, &id, "127.0.0.2"), "authorized");
    let kept = data
        .join("egress")
        .join("sessions")
        .join(format!("{id}.json"));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&kept)
            .expect("kept policy")
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let ca = std::fs::read(data.join("egress").join("ca").join("ca.pem")).expect("ca");
    // Pause and resume in the same server.
    assert_eq!(
        post(&first.base, &format!("/v1/sessions/{id}/pause"), json!({})).0,
        200
    );
    let (s, resumed) = post(&first.base, &format!("/v1/sessions/{id}/resume"), json!({}));
    assert_eq!(s, 200, "{resumed}");
    assert_eq!(resumed["network"], expected, "{resumed}");
    assert_eq!(fetch(&first.base, &id, "127.0.0.2"), "authorized");
    assert_eq!(
        fetch(&first.base, &id, "127.0.0.3"),
        "403",
        "still only its allowlist"
    );
    drop(first); // SIGTERM: the session is paused for the next start

    let second = common::serve::serve(&data, &flags);
    let info: Value = c
        .get(format!("{}/v1/sessions/{id}", second.base))
        .send()
        .and_then(|r| r.json())
        .expect("GET");
    assert_eq!(info["status"], "paused", "{info}");
    assert_eq!(info["network"], expected, "{info}");
    // Any request resumes it, with its policy and its secret.
    assert_eq!(fetch(&second.base, &id, "127.0.0.2"), "authorized");
    assert_eq!(fetch(&second.base, &id, "127.0.0.3"), "403");
    assert_eq!(
        std::fs::read(data.join("egress").join("ca").join("ca.pem")).expect("ca"),
        ca,
        "the same CA after a restart"
    );
    let db = std::fs::read(data.join("runcell.db")).expect("db");
    assert!(
        !db.windows(KEPT_SECRET.len())
            .any(|w| w == KEPT_SECRET.as_bytes()),
        "the secret is in the database"
    );
    drop(second);

    // The operator narrows the bound: the session comes back without a network.
    let third = common::serve::serve(
        &data,
        &[
            "--egress-allow",
            "127.0.0.3",
            "--egress-allow-cidr",
            "127.0.0.0/8",
        ],
    );
    let info: Value = c
        .get(format!("{}/v1/sessions/{id}", third.base))
        .send()
        .and_then(|r| r.json())
        .expect("GET");
    assert_eq!(info["network"], json!({"type": "disabled"}), "{info}");
    let code = format!(
        "import urllib.request\ntry:\n    urllib.request.urlopen('http://127.0.0.2:{port}/', timeout=10)\nexcept Exception as e:\n    print(type(e).__name__, e)"
    );
    let (_, e) = post(
        &third.base,
        &format!("/v1/sessions/{id}/execute"),
        json!({"code": code}),
    );
    let out = e["stdout"].as_str().unwrap_or_default();
    assert!(
        out.starts_with("URLError <urlopen error [Errno 111] Connection refused>"),
        "no proxy, no route: {e}"
    );
    assert!(!kept.exists(), "the policy beyond the bound is forgotten");
}
