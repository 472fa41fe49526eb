//! HTTPS through the proxy to a local TLS server with a CA of its own: a domain with a secret
//! header is opened (the client sees runcell's leaf, the server sees the header), every other
//! tunnel stays end to end (the client sees the server's own certificate), and what cannot be
//! verified or names another host is refused, each with its control.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use runcell_egress::{
    Authority, Cidr, DomainSecret, Egress, EgressLimits, Interception, Policy, PolicyBounds,
    Serving, SessionEgress,
};
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};

const SECRET: &str = "Bearer tls-secret-5c1d";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("runcell-intercept-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A test CA (written to `dir/test-ca.pem`) and an HTTPS server on 127.0.0.1 with a leaf from it
/// that answers each request on a connection with the request's head (keep-alive).
fn https_server(dir: &Path) -> (u16, PathBuf) {
    https_server_closing(dir, false)
}

/// [`https_server`]; with `close_each`, the server closes each connection after one response
/// without saying so (as a keep-alive connection's idle timeout does).
fn https_server_closing(dir: &Path, close_each: bool) -> (u16, PathBuf) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test upstream CA");
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let ca_file = dir.join("test-ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).expect("write ca");
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .expect("leaf params")
        .signed_by(&leaf_key, &issuer)
        .expect("leaf");
    let key = PrivateKeyDer::from_pem_slice(leaf_key.serialize_pem().as_bytes()).expect("key");
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .expect("server config");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let config = Arc::new(config);
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let config = config.clone();
            thread::spawn(move || {
                let conn = rustls::ServerConnection::new(config).expect("conn");
                let mut tls = BufReader::new(rustls::StreamOwned::new(conn, s));
                loop {
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
                    let length = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    let mut body = vec![0u8; length];
                    if tls.read_exact(&mut body).is_err() {
                        return;
                    }
                    let reply = format!("{head}{}", String::from_utf8_lossy(&body));
                    let out = tls.get_mut();
                    if write!(
                        out,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{reply}",
                        reply.len()
                    )
                    .and_then(|()| out.flush())
                    .is_err()
                        || close_each
                    {
                        return;
                    }
                }
            });
        }
    });
    (port, ca_file)
}

fn proxy(
    dir: &Path,
    extra_roots: &[PathBuf],
    secrets: &[DomainSecret],
) -> (SessionEgress, Serving, u16, String) {
    let cidrs: Vec<Cidr> = vec!["127.0.0.0/8".parse().expect("cidr")];
    let authority = Authority::load_or_create(&dir.join("ca")).expect("authority");
    let ca_pem = authority.cert_pem().to_owned();
    let interception = Interception::new(authority, extra_roots).expect("interception");
    let egress = Egress::intercepting(cidrs, EgressLimits::default(), interception);
    let policy: Policy = PolicyBounds {
        domains: vec![runcell_egress::DomainPattern::Any],
    }
    .check(&["127.0.0.1".to_owned()], secrets)
    .expect("policy");
    let session = egress.session(policy);
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let serving = session.serve(l).expect("serve");
    (session, serving, port, ca_pem)
}

fn secret() -> DomainSecret {
    DomainSecret {
        domain: "127.0.0.1".into(),
        name: "Authorization".into(),
        value: SECRET.into(),
    }
}

/// A TLS client through the proxy's CONNECT to 127.0.0.1:`port`, trusting only `root` (PEM),
/// offering `alpn`.
fn client(
    proxy_port: u16,
    port: u16,
    root: &str,
    alpn: &[&[u8]],
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    client_named(proxy_port, port, root, alpn, "127.0.0.1")
}

fn client_named(
    proxy_port: u16,
    port: u16,
    root: &str,
    alpn: &[&[u8]],
    server_name: &str,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let mut s = TcpStream::connect(("127.0.0.1", proxy_port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
    )?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b)? == 0 {
            return Err(std::io::Error::other(format!(
                "the proxy closed: {}",
                String::from_utf8_lossy(&head)
            )));
        }
        head.push(b[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(root.as_bytes()).expect("root"))
        .expect("add root");
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let name = ServerName::try_from(server_name.to_owned()).expect("name");
    let conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, s);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

fn ask(tls: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>, head: &str) -> String {
    // A BufReader per request: the responses are read exactly, so nothing is left buffered.
    let (conn, sock) = (&mut tls.conn, &mut tls.sock);
    let mut stream = rustls::Stream::new(conn, sock);
    let mut buf = Vec::new();
    stream.write_all(head.as_bytes()).expect("write");
    stream.flush().expect("flush");
    // Read until a full response (head + Content-Length body) is in.
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap_or(0))
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return String::from_utf8_lossy(&buf).into_owned();
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return String::from_utf8_lossy(&buf).into_owned(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

#[test]
fn a_secret_domain_is_opened_and_each_request_on_the_connection_gets_the_header() {
    let dir = temp_dir("secret");
    let (up, test_ca) = https_server(&dir);
    let (session, _serving, port, runcell_ca) = proxy(&dir, &[test_ca], &[secret()]);
    // The client trusts runcell's CA only: the handshake succeeding says it saw runcell's leaf.
    let mut tls = client(port, up, &runcell_ca, &[b"h2", b"http/1.1"]).expect("intercepted TLS");
    assert_eq!(
        tls.conn.alpn_protocol(),
        Some(&b"http/1.1"[..]),
        "HTTP/2 is not offered"
    );
    let first = ask(
        &mut tls,
        &format!("GET /one HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\nAuthorization: forged\r\n\r\n"),
    );
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(
        first.contains(&format!("authorization: {SECRET}\r\n")),
        "{first}"
    );
    assert!(!first.contains("forged"), "{first}");
    let second = ask(
        &mut tls,
        &format!("POST /two HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\nContent-Length: 5\r\n\r\nhello"),
    );
    assert!(second.contains("POST /two HTTP/1.1"), "{second}");
    assert!(
        second.contains(&format!("authorization: {SECRET}\r\n")),
        "{second}"
    );
    assert!(second.ends_with("hello"), "{second}");
    // Another host named inside the tunnel: refused, the secret not sent.
    let other = ask(
        &mut tls,
        "GET /three HTTP/1.1\r\nHost: other.example:443\r\n\r\n",
    );
    assert!(other.starts_with("HTTP/1.1 403"), "{other}");
    assert!(
        other.contains("refused a request inside the tunnel"),
        "{other}"
    );
    assert!(!other.contains(SECRET), "{other}");
    drop(tls);
    let records = session.take_records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(
        (records[0].domain.as_str(), records[0].port),
        ("127.0.0.1", up)
    );
    assert!(
        records[0].bytes_out > 0 && records[0].bytes_in > 0,
        "{records:?}"
    );
    let shown = format!("{records:?}");
    assert!(!shown.contains(SECRET), "{shown}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_domain_without_a_secret_stays_end_to_end() {
    let dir = temp_dir("plain");
    let (up, test_ca) = https_server(&dir);
    let (_session, _serving, port, runcell_ca) = proxy(&dir, std::slice::from_ref(&test_ca), &[]);
    let test_ca_pem = std::fs::read_to_string(&test_ca).expect("ca");
    // Trusting the server's own CA works: the client saw the server's certificate.
    let mut tls = client(port, up, &test_ca_pem, &[b"http/1.1"]).expect("end to end");
    let reply = ask(
        &mut tls,
        &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\n\r\n"),
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(
        !reply.to_ascii_lowercase().contains("authorization"),
        "{reply}"
    );
    // Trusting runcell's CA does not: nothing in between.
    let err = client(port, up, &runcell_ca, &[b"http/1.1"]).expect_err("not runcell's leaf");
    assert!(
        err.to_string().contains("UnknownIssuer")
            || err.to_string().contains("invalid peer certificate"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_upstream_the_proxy_cannot_verify_is_a_502_saying_why() {
    let dir = temp_dir("untrusted");
    let (up, test_ca) = https_server(&dir);
    // No --egress-ca-file: the test server's CA is unknown to the proxy.
    let (session, _serving, port, runcell_ca) = proxy(&dir, &[], &[secret()]);
    let mut tls = client(port, up, &runcell_ca, &[b"http/1.1"]).expect("intercepted TLS");
    let reply = ask(
        &mut tls,
        &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\n\r\n"),
    );
    assert!(reply.starts_with("HTTP/1.1 502"), "{reply}");
    assert!(
        reply.contains("the TLS connection to 127.0.0.1:"),
        "{reply}"
    );
    assert!(reply.contains("UnknownIssuer"), "{reply}");
    drop(tls);
    let records = session.take_records();
    assert!(!records[0].allowed, "{records:?}");
    // Control: the same with the CA given works.
    let dir2 = temp_dir("untrusted-control");
    let (_s, _v, port, runcell_ca) = proxy(&dir2, &[test_ca], &[secret()]);
    let mut tls = client(port, up, &runcell_ca, &[b"http/1.1"]).expect("intercepted TLS");
    let reply = ask(
        &mut tls,
        &format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\n\r\n"),
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&dir2);
}

#[test]
fn an_http2_only_client_or_another_server_name_is_refused() {
    let dir = temp_dir("alpn");
    let (up, test_ca) = https_server(&dir);
    let (session, _serving, port, runcell_ca) = proxy(&dir, &[test_ca], &[secret()]);
    // The proxy closes before answering the ClientHello; the record says why.
    client(port, up, &runcell_ca, &[b"h2"]).expect_err("h2 only");
    let records = session.take_records();
    let why = records[0].refused.clone().unwrap_or_default();
    assert!(why.contains("no HTTP/1.1"), "{records:?}");
    // A server name other than the tunnel's: refused before any leaf is made for it.
    client_named(port, up, &runcell_ca, &[b"http/1.1"], "other.example").expect_err("SNI");
    let records = session.take_records();
    let why = records[0].refused.clone().unwrap_or_default();
    assert!(
        why.contains("its TLS server name is \"other.example\""),
        "{records:?}"
    );
    // Control: the same client offering HTTP/1.1, naming the tunnel's host, goes through.
    client(port, up, &runcell_ca, &[b"h2", b"http/1.1"]).expect("h2 and http/1.1");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_ca_and_trust_files_are_checked() {
    let dir = temp_dir("files");
    let a = Authority::load_or_create(&dir.join("ca")).expect("authority");
    let bad = dir.join("bad.pem");
    std::fs::write(&bad, "hello").expect("write");
    let err = Interception::new(a, std::slice::from_ref(&bad)).expect_err("not PEM");
    assert!(err.to_string().contains("no PEM certificate"), "{err}");
    let a = Authority::load_or_create(&dir.join("ca")).expect("authority");
    let err = Interception::new(a, &[dir.join("missing.pem")]).expect_err("missing");
    assert!(err.to_string().contains("cannot read"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_destination_that_closes_its_keep_alive_connection_is_reconnected() {
    let dir = temp_dir("reconnect");
    let (up, test_ca) = https_server_closing(&dir, true);
    let (_session, _serving, port, runcell_ca) = proxy(&dir, &[test_ca], &[secret()]);
    let mut tls = client(port, up, &runcell_ca, &[b"http/1.1"]).expect("intercepted TLS");
    for n in 0..3 {
        // Each request after the first finds the upstream connection closed: the proxy opens
        // another to the same checked address (a request the destination had already taken
        // and dropped would be a 502, never sent twice).
        let reply = ask(
            &mut tls,
            &format!("GET /{n} HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\n\r\n"),
        );
        assert!(reply.starts_with("HTTP/1.1 200"), "{n}: {reply}");
        assert!(reply.contains(&format!("GET /{n} HTTP/1.1")), "{reply}");
        assert!(
            reply.contains(&format!("authorization: {SECRET}")),
            "{reply}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
