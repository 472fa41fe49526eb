//! `runcell verify FILE [STATEMENT]`: a file and its signed provenance statement, checked with
//! a given public key or the data dir's own; a changed byte, an edited statement and another
//! key each fail with exit 1 and the reason; and the whole round trip through a real
//! `runcell serve`: a chart an execution saved, its statement, the server's published key.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use runcell_store::audit::provenance::FileOrigin;
use runcell_store::audit::signed::AuditSigner;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn runcell(data: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runcell"))
        .env("RUNCELL_DATA_DIR", data)
        .env("NO_COLOR", "1")
        .args(args)
        .output()
        .expect("run runcell")
}

fn hex(d: &[u8]) -> String {
    Sha256::digest(d)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "not a JSON report: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn a_file_verifies_against_its_statement_until_a_byte_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let signer = AuditSigner::load_or_create(&data.join("keys/audit-signing.key")).expect("key");
    let content = b"\x89PNG\r\n\x1a\n a chart".to_vec();
    let statement = signer.sign_provenance(FileOrigin {
        path: "chart.png".into(),
        size: content.len() as u64,
        sha256: hex(&content),
        mime: "image/png".into(),
        execution_id: "ex_01".into(),
        code_sha256: hex(b"plt.show()"),
        session_id: Some("ses_1".into()),
        tenant: "default".into(),
        time: "2026-12-01T00:00:00.000Z".into(),
    });
    let file = dir.path().join("chart.png");
    std::fs::write(&file, &content).expect("write");
    let stmt = dir.path().join("chart.png.provenance.json");
    std::fs::write(&stmt, serde_json::to_string(&statement).expect("json")).expect("write");
    let pk = signer.public_key().to_hex();
    let f = file.to_str().expect("utf-8");
    let s = stmt.to_str().expect("utf-8");

    let out = runcell(&data, &["verify", f, s, "--public-key", &pk]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out);
    assert_eq!(
        (r["ok"].clone(), r["execution_id"].clone()),
        (true.into(), "ex_01".into())
    );
    // The statement beside the file, the data dir's own key (with a note to pass one).
    let out = runcell(&data, &["verify", f]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("--public-key"));

    // One byte changed: exit 1, and why.
    let mut tampered = content.clone();
    tampered[9] ^= 0x20;
    std::fs::write(&file, &tampered).expect("write");
    let out = runcell(&data, &["verify", f, s, "--public-key", &pk]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(report(&out)["ok"], false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the file is not the one the statement describes"),
        "{stderr}"
    );
    std::fs::write(&file, &content).expect("restore");

    // An edited statement, and another key.
    let mut edited = statement.clone();
    edited.execution_id = "ex_02".into();
    std::fs::write(&stmt, serde_json::to_string(&edited).expect("json")).expect("write");
    let out = runcell(&data, &["verify", f, s, "--public-key", &pk]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the statement was altered"));
    std::fs::write(&stmt, serde_json::to_string(&statement).expect("json")).expect("write");
    let other = AuditSigner::ephemeral().expect("key").public_key().to_hex();
    let out = runcell(&data, &["verify", f, s, "--public-key", &other]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("signed by another key"));

    // Not a statement at all: an error with its cause (exit 2).
    std::fs::write(&stmt, "{}").expect("write");
    let out = runcell(&data, &["verify", f, s, "--public-key", &pk]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a runcell provenance statement"));
}

#[test]
fn a_chart_from_a_real_server_verifies_with_its_published_key_and_a_changed_byte_fails() {
    let data = common::serve::data_dir("runcell-verify-test-");
    let server = common::serve::serve(&data, &["--no-zygote", "--warm-sessions", "0"]);
    let http = reqwest::blocking::Client::new();
    let session: Value = http
        .post(format!("{}/v1/sessions", server.base))
        .json(&serde_json::json!({}))
        .send()
        .and_then(|r| r.json())
        .expect("session");
    let sid = session["id"].as_str().expect("id");
    let code = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.savefig('chart.png')";
    let e: Value = http
        .post(format!("{}/v1/sessions/{sid}/execute", server.base))
        .json(&serde_json::json!({ "code": code }))
        .send()
        .and_then(|r| r.json())
        .expect("execute");
    assert_eq!(e["status"], "ok", "{e}");
    let url = format!("{}/v1/sessions/{sid}/files/chart.png", server.base);
    let png = http
        .get(&url)
        .send()
        .and_then(|r| r.bytes())
        .expect("download")
        .to_vec();
    let statement = http
        .get(format!("{url}?provenance"))
        .send()
        .and_then(|r| r.text())
        .expect("statement");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("chart.png");
    std::fs::write(&file, &png).expect("write");
    std::fs::write(dir.path().join("chart.png.provenance.json"), &statement).expect("write");
    let f = file.to_str().expect("utf-8");
    // Another data dir: the key can only come from the server.
    let elsewhere = dir.path().join("elsewhere");

    let out = runcell(&elsewhere, &["verify", f, "--server", &server.base]);
    assert!(
        out.status.success(),
        "{}\n{statement}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = report(&out);
    assert_eq!(
        (&r["ok"], &r["execution_id"]),
        (&Value::Bool(true), &e["id"])
    );
    assert_eq!(r["sha256"], e["files"][0]["sha256"]);

    let mut tampered = png.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 0x01;
    std::fs::write(&file, &tampered).expect("write");
    let out = runcell(&elsewhere, &["verify", f, "--server", &server.base]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not the one the statement describes"));
    let out = runcell(&elsewhere, &["verify", f]);
    assert_eq!(out.status.code(), Some(2), "no key to check with");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no public key"));
}
