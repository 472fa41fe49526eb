//! `runcell serve --database 'postgres://...?sslmode=verify-full&sslrootcert=CA.pem'` against
//! a PostgreSQL that takes TCP connections only with TLS (its certificate signed by a CA the
//! test makes): a node starts and serves; given another CA it refuses to start, saying the
//! TLS handshake failed and why; without TLS the server's own refusal is shown.

mod common;

use common::cluster::pg;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;

use common::serve::{data_dir, runcell};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde_json::{json, Value};

/// A CA's PEM, and a certificate and key for `host` signed by it.
fn ca_and_leaf(host: &str) -> (String, String, String) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "runcell test CA");
    let ca_pem = ca.self_signed(&ca_key).expect("ca").pem();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().expect("leaf key");
    let leaf = CertificateParams::new(vec![host.to_owned()])
        .expect("params")
        .signed_by(&leaf_key, &issuer)
        .expect("leaf");
    (ca_pem, leaf.pem(), leaf_key.serialize_pem())
}

fn flags(url: &str, keys: &Path) -> Vec<String> {
    vec![
        "--database".into(),
        url.into(),
        "--audit-key-file".into(),
        keys.join("audit-chain.key").display().to_string(),
        "--audit-signing-key-file".into(),
        keys.join("audit-signing.key").display().to_string(),
    ]
}

#[test]
fn a_node_connects_with_verify_full_and_refuses_another_ca_at_start() {
    let (ca, cert, key) = ca_and_leaf("127.0.0.1");
    let (other_ca, _, _) = ca_and_leaf("127.0.0.1");
    let server = pg::PgServer::start_tls(&cert, &key);
    let conninfo = server.new_database();
    let db = conninfo.rsplit("dbname=").next().expect("dbname");
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_file, other_file) = (dir.path().join("ca.pem"), dir.path().join("other.pem"));
    std::fs::write(&ca_file, ca).expect("write");
    std::fs::write(&other_file, other_ca).expect("write");
    let url = |query: String| {
        format!(
            "postgres://{}@127.0.0.1:{}/{db}?{query}",
            pg::PG_USER,
            server.port()
        )
    };
    let verified = url(format!(
        "sslmode=verify-full&sslrootcert={}",
        ca_file.display()
    ));
    let secret = dir.path().join("cluster.secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef-tls\n").expect("write");

    let api_key = common::serve::create_key(
        &data_dir("runcell-tls-k-"),
        &flags(&verified, dir.path()),
        &["--name", "ci"],
    );

    // A node on the verified link serves, its execution recorded through it.
    let data = data_dir("runcell-tls-a-");
    let port = common::serve::free_port();
    let me = format!("http://127.0.0.1:{port}");
    let mut child = runcell(&data)
        .args(flags(&verified, dir.path()))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--node-url",
            &me,
        ])
        .args([
            "--no-zygote",
            "--warm-sessions",
            "0",
            "--cluster-secret-file",
        ])
        .arg(&secret)
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    loop {
        let line = lines.next().expect("serve exited early").expect("log line");
        if line.contains("runcell serving on") {
            break;
        }
    }
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(drop));
    let node = common::serve::Serve::adopt(child, me);
    let e: Value = reqwest::blocking::Client::new()
        .post(format!("{}/v1/execute", node.base))
        .bearer_auth(&api_key)
        .json(&json!({"code": "print(6 * 7)"}))
        .send()
        .and_then(|r| r.json())
        .expect("execute");
    assert_eq!(e["stdout"], "42\n", "{e}");
    assert_eq!(
        server
            .psql(db, "SELECT count(*) FROM executions")
            .expect("psql"),
        "1"
    );
    drop(node);

    // Another CA: the node does not start, and says why.
    let refused = |url: String| {
        let out = runcell(&data_dir("runcell-tls-b-"))
            .args(flags(&url, dir.path()))
            .args(["serve", "--listen", "127.0.0.1:0", "--cluster-secret-file"])
            .arg(&secret)
            .output()
            .expect("serve");
        assert!(!out.status.success(), "started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused(url(format!(
        "sslmode=verify-full&sslrootcert={}",
        other_file.display()
    )));
    assert!(
        err.contains("cannot connect to PostgreSQL: TLS failed (sslmode=verify-full)"),
        "{err}"
    );
    // A CA of the same name, not the same key: the signature does not verify.
    assert!(
        err.contains("invalid peer certificate: BadSignature"),
        "{err}"
    );
    // Without TLS: the server refuses a plain connection, and that is what is shown.
    let err = refused(url("sslmode=disable".into()));
    assert!(err.contains("no encryption"), "{err}");
}
