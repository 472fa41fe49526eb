//! The proxy against local servers, as a sandbox's client would use it (one test per path,
//! each refusal paired with the same request allowed).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use runcell_egress::{
    Cidr, DomainSecret, Egress, EgressLimits, Policy, PolicyBounds, Serving, SessionEgress,
};

/// An upstream that answers every connection with what it received (its first read), then
/// closes.
fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                let mut got = Vec::new();
                s.set_read_timeout(Some(Duration::from_millis(300))).ok();
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let body = String::from_utf8_lossy(&got).into_owned();
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

fn proxy(
    cidrs: &[&str],
    allowed: &[&str],
    secrets: &[DomainSecret],
) -> (SessionEgress, Serving, u16) {
    let cidrs: Vec<Cidr> = cidrs.iter().map(|c| c.parse().expect("cidr")).collect();
    let egress = Egress::new(cidrs, EgressLimits::default());
    let allowed: Vec<String> = allowed.iter().map(|s| (*s).to_owned()).collect();
    let policy: Policy = PolicyBounds {
        domains: vec![runcell_egress::DomainPattern::Any],
    }
    .check(&allowed, secrets)
    .expect("policy");
    let session = egress.session(policy);
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let serving = session.serve(l).expect("serve");
    (session, serving, port)
}

fn ask(proxy_port: u16, request: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", proxy_port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    s.write_all(request).expect("write");
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn plain_http_is_forwarded_origin_form_with_connection_close() {
    let up = echo_server();
    let (session, _serving, port) = proxy(&["127.0.0.0/8"], &["127.0.0.1"], &[]);
    let reply = ask(
        port,
        format!("GET http://127.0.0.1:{up}/x?y HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\nProxy-Connection: keep-alive\r\n\r\n").as_bytes(),
    );
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    assert!(
        reply.contains(&format!(
            "GET /x?y HTTP/1.1\r\nHost: 127.0.0.1:{up}\r\nConnection: close\r\n\r\n"
        )),
        "{reply}"
    );
    let records = session.take_records();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(
        (r.domain.as_str(), r.port, r.allowed),
        ("127.0.0.1", up, true)
    );
    assert!(r.bytes_out > 40 && r.bytes_in > 60, "{r:?}");
    assert!(session.take_records().is_empty());
}

#[test]
fn a_secret_header_is_added_and_replaces_the_clients() {
    let up = echo_server();
    let secret = DomainSecret {
        domain: "127.0.0.1".into(),
        name: "Authorization".into(),
        value: "Bearer s3cr3t".into(),
    };
    let (_session, _serving, port) = proxy(&["127.0.0.0/8"], &["127.0.0.1"], &[secret]);
    let reply = ask(
        port,
        format!("GET http://127.0.0.1:{up}/ HTTP/1.1\r\nAuthorization: forged\r\n\r\n").as_bytes(),
    );
    assert!(
        reply.contains("Authorization: Bearer s3cr3t\r\n"),
        "{reply}"
    );
    assert!(!reply.contains("forged"), "{reply}");
}

#[test]
fn names_outside_the_allowlist_are_403_with_the_reason() {
    let up = echo_server();
    let (session, _serving, port) = proxy(&["127.0.0.0/8"], &["127.0.0.1"], &[]);
    let reply = ask(port, b"CONNECT pypi.org:443 HTTP/1.1\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 403 Forbidden: runcell egress: refused CONNECT pypi.org:443: pypi.org is not in this session's network allowlist (allowed_domains: 127.0.0.1)\r\n"), "{reply}");
    assert!(reply.ends_with(
        "runcell egress: refused CONNECT pypi.org:443: pypi.org is not in this session's network allowlist (allowed_domains: 127.0.0.1)\n"
    ), "{reply}");
    // A Host header that disagrees with the URL.
    let reply = ask(
        port,
        format!("GET http://127.0.0.1:{up}/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n").as_bytes(),
    );
    assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
    assert!(
        reply.contains("the Host header says \"pypi.org\""),
        "{reply}"
    );
    // An IP literal not in the list.
    let reply = ask(
        port,
        format!("CONNECT 127.0.0.2:{up} HTTP/1.1\r\n\r\n").as_bytes(),
    );
    assert!(
        reply.contains("127.0.0.2 is not in this session's network allowlist"),
        "{reply}"
    );
    // Not a proxy request at all.
    let reply = ask(port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    assert!(reply.starts_with("HTTP/1.1 400"), "{reply}");
    let records = session.take_records();
    assert_eq!(records.len(), 3, "{records:?}");
    assert!(records.iter().all(|r| !r.allowed && r.refused.is_some()));
}

#[test]
fn loopback_and_rebinding_names_are_refused_without_an_allowed_range() {
    let up = echo_server();
    // `localhost` is a name that resolves to 127.0.0.1: the address check, not the name, says no.
    let (_s, _serving, port) = proxy(&[], &["127.0.0.1", "localhost"], &[]);
    for host in ["127.0.0.1", "localhost"] {
        let reply = ask(
            port,
            format!("CONNECT {host}:{up} HTTP/1.1\r\n\r\n").as_bytes(),
        );
        assert!(reply.starts_with("HTTP/1.1 403"), "{reply}");
        assert!(
            reply.contains("a loopback address (the server's address policy"),
            "{reply}"
        );
    }
    let (_s, _serving, port) = proxy(&["127.0.0.0/8"], &["169.254.169.254"], &[]);
    let reply = ask(
        port,
        b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n",
    );
    assert!(
        reply.contains("169.254.169.254, a link-local address"),
        "{reply}"
    );
    // The control: with the range allowed, the same name goes through.
    let (_s, _serving, port) = proxy(&["127.0.0.0/8"], &["localhost"], &[]);
    let reply = ask(
        port,
        format!("CONNECT localhost:{up} HTTP/1.1\r\n\r\nPING\r\n\r\n").as_bytes(),
    );
    assert!(
        reply.starts_with("HTTP/1.1 200 Connection Established\r\n\r\nHTTP/1.1 200 OK"),
        "{reply}"
    );
}

#[test]
fn a_tunnel_whose_tls_server_name_differs_is_cut_before_a_byte_goes_through() {
    let up = echo_server();
    let (session, _serving, port) = proxy(&["127.0.0.0/8"], &["localhost"], &[]);
    let mut req = format!("CONNECT localhost:{up} HTTP/1.1\r\n\r\n").into_bytes();
    req.extend_from_slice(&hello(Some("evil.example")));
    let reply = ask(port, &req);
    assert_eq!(reply, "HTTP/1.1 200 Connection Established\r\n\r\n");
    let r = session.take_records();
    assert_eq!(r[0].bytes_out, 0);
    assert_eq!(
        r[0].refused.as_deref(),
        Some(format!("runcell egress: refused the tunnel to localhost:{up}: its TLS server name is \"evil.example\"").as_str())
    );
    // The control: the matching name is forwarded (the echo server answers the hello's bytes).
    let mut req = format!("CONNECT localhost:{up} HTTP/1.1\r\n\r\n").into_bytes();
    req.extend_from_slice(&hello(Some("LOCALHOST")));
    req.extend_from_slice(b"\r\n\r\n");
    let reply = ask(port, &req);
    assert!(reply.contains("HTTP/1.1 200 OK"), "{reply}");
    assert!(session.take_records()[0].allowed);
}

/// A minimal TLS 1.2 ClientHello record with an optional server_name.
fn hello(sni: Option<&str>) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let n = name.as_bytes();
        let mut list = vec![0u8];
        list.extend_from_slice(&(n.len() as u16).to_be_bytes());
        list.extend_from_slice(n);
        let mut ext = (list.len() as u16).to_be_bytes().to_vec();
        ext.extend_from_slice(&list);
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        exts.extend_from_slice(&ext);
    }
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1u8];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

fn limited(limits: EgressLimits) -> (SessionEgress, Serving, u16) {
    let egress = Egress::new(vec!["127.0.0.0/8".parse().expect("cidr")], limits);
    let policy = PolicyBounds {
        domains: vec![runcell_egress::DomainPattern::Any],
    }
    .check(&["127.0.0.1".to_owned()], &[])
    .expect("policy");
    let session = egress.session(policy);
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let serving = session.serve(l).expect("serve");
    (session, serving, port)
}

#[test]
fn connections_past_the_limit_are_refused_and_bytes_past_the_budget_cut() {
    let up = echo_server();
    let (session, _serving, port) = limited(EgressLimits {
        max_connections: 1,
        ..EgressLimits::default()
    });
    // One tunnel held open, then a second connection: over the limit of one.
    let mut first = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    first
        .write_all(format!("CONNECT 127.0.0.1:{up} HTTP/1.1\r\n\r\n").as_bytes())
        .expect("write");
    let mut ok = [0u8; 39];
    first.read_exact(&mut ok).expect("established");
    assert_eq!(&ok, b"HTTP/1.1 200 Connection Established\r\n\r\n");
    let reply = ask(
        port,
        format!("CONNECT 127.0.0.1:{up} HTTP/1.1\r\n\r\n").as_bytes(),
    );
    assert!(
        reply.contains("this session already has 1 connections open (the limit)"),
        "{reply}"
    );
    drop(first);
    assert_eq!(session.take_records().len(), 2);

    // 250 bytes per execution: a request head over it is cut before the answer comes back.
    let (session, _serving, port) = limited(EgressLimits {
        max_bytes_per_execution: 250,
        ..EgressLimits::default()
    });
    let big = format!(
        "GET http://127.0.0.1:{up}/{} HTTP/1.1\r\n\r\n",
        "x".repeat(400)
    );
    assert_eq!(ask(port, big.as_bytes()), "");
    let small = format!("GET http://127.0.0.1:{up}/ HTTP/1.1\r\n\r\n");
    // The window is the execution's: a new one (take_records) starts from zero.
    session.take_records();
    assert!(ask(port, small.as_bytes()).starts_with("HTTP/1.1 200 OK"));
}

#[test]
fn an_execution_records_at_most_so_many_connections() {
    let (session, _serving, port) = proxy(&[], &["127.0.0.1"], &[]);
    for _ in 0..runcell_egress::MAX_RECORDS + 5 {
        ask(port, b"CONNECT example.org:443 HTTP/1.1\r\n\r\n");
    }
    assert_eq!(session.take_records().len(), runcell_egress::MAX_RECORDS);
}
