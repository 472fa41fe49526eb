//! TLS to PostgreSQL: a test server with `ssl=on` and a certificate signed by a CA this test
//! makes, taking TCP connections only with TLS (`hostssl`). A node connects with
//! `sslmode=verify-full` and that CA as `sslrootcert` and works; the same with another CA, or
//! for a host name the certificate does not name, is refused at once with a clear reason;
//! `verify-ca` accepts the name; `require` and `prefer` encrypt without checking (libpq's
//! rule); `sslmode=disable` is refused by the server.

mod common;

use std::path::Path;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use runcell_store::{Store, StoreError};

/// A CA, and when `leaf_for` names hosts, a server certificate and key for them; PEM.
fn ca(name: &str, leaf_for: &[&str]) -> (String, Option<(String, String)>) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, name);
    let ca_pem = ca.self_signed(&ca_key).expect("ca").pem();
    if leaf_for.is_empty() {
        return (ca_pem, None);
    }
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(leaf_for.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("leaf params")
        .signed_by(&leaf_key, &issuer)
        .expect("leaf");
    (ca_pem, Some((leaf.pem(), leaf_key.serialize_pem())))
}

fn chain(e: &StoreError) -> String {
    let mut out = e.to_string();
    let mut cur = std::error::Error::source(e);
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

#[test]
fn tls_to_postgresql_verifies_the_server_as_sslmode_says() {
    let (ca_pem, leaf) = ca("runcell test CA", &["127.0.0.1"]);
    let (cert, key) = leaf.expect("leaf");
    let (other_ca, _) = ca("another CA", &[]);
    let server = PgServer::start_tls(&cert, &key);
    let conninfo = server.new_database();
    let db = conninfo.rsplit("dbname=").next().expect("dbname");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_file, other_file) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
    std::fs::write(&ca_file, &ca_pem).expect("write");
    std::fs::write(&other_file, &other_ca).expect("write");
    let key_file = dir.path().join("audit-chain.key");
    let url = |host: &str, query: &str| {
        format!(
            "postgres://{PG_USER}@{host}:{}/{db}?connect_timeout=5&{query}",
            server.port()
        )
    };
    let root = |f: &Path| format!("sslrootcert={}", f.display());
    let open = |u: String| Store::open_postgres_node(&u, &key_file, "http://node-tls:8080");

    // verify-full with the CA: a node that works.
    let node = open(url(
        "127.0.0.1",
        &format!("sslmode=verify-full&{}", root(&ca_file)),
    ))
    .expect("verify-full with the right CA");
    node.put_session(&session("t", "ses_tls", 1))
        .expect("write");
    node.append_execution(&exec("t", "ex_tls", Some("ses_tls"), 1))
        .expect("append");
    assert!(node.verify_chain(None).expect("verify").ok);
    // The server saw the connection encrypted.
    let ssl = server
        .psql(
            db,
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'runcell' AND s.ssl",
        )
        .expect("psql");
    assert_ne!(ssl, "0", "no encrypted connection of the node's");
    drop(node);

    // Another CA: refused at once, saying TLS.
    let err = open(url(
        "127.0.0.1",
        &format!("sslmode=verify-full&{}", root(&other_file)),
    ))
    .expect_err("another CA");
    let text = chain(&err);
    assert!(err.is_unavailable(), "{text}");
    assert!(
        text.starts_with(
            "the database is unavailable: cannot connect to PostgreSQL: TLS failed (sslmode=verify-full)"
        ),
        "{text}"
    );
    assert!(text.contains("UnknownIssuer"), "{text}");
    // A host name the certificate does not name: verify-full refuses, verify-ca accepts.
    let err = open(url(
        "127.0.0.2",
        &format!("sslmode=verify-full&{}", root(&ca_file)),
    ))
    .expect_err("wrong name");
    assert!(
        chain(&err).contains("certificate not valid for name \"127.0.0.2\""),
        "{}",
        chain(&err)
    );
    open(url(
        "127.0.0.2",
        &format!("sslmode=verify-ca&{}", root(&ca_file)),
    ))
    .expect("verify-ca ignores the name");
    // require and prefer: encrypted, unchecked (another CA's certificate would do).
    open(url("127.0.0.2", "sslmode=require")).expect("require");
    open(url("127.0.0.1", "")).expect("prefer, the default");
    // require with a root file checks the chain, as libpq's does.
    let err = open(url(
        "127.0.0.1",
        &format!("sslmode=require&{}", root(&other_file)),
    ))
    .expect_err("require with another CA's file");
    assert!(chain(&err).contains("UnknownIssuer"), "{}", chain(&err));
    // Plain to a server that takes only TLS: its refusal, clearly.
    let err = open(url("127.0.0.1", "sslmode=disable")).expect_err("plain");
    let text = chain(&err);
    assert!(text.contains("no pg_hba.conf entry"), "{text}");
    assert!(text.contains("no encryption"), "{text}");
    // A root file that is no certificate, and an unknown mode: refused before connecting.
    let bogus = dir.path().join("bogus.pem");
    std::fs::write(&bogus, "not a certificate").expect("write");
    let err = open(url(
        "127.0.0.1",
        &format!("sslmode=verify-full&{}", root(&bogus)),
    ))
    .expect_err("bogus root file");
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
    assert!(
        chain(&err).contains("holds no usable certificate"),
        "{}",
        chain(&err)
    );
    let err = open(url("127.0.0.1", "sslmode=allow")).expect_err("allow");
    assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
}
