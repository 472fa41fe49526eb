//! The audit log against someone who can edit the database file, as an operator would check
//! it: a real `runcell serve` records executions and emits signed checkpoints, then copies of
//! its database are rewritten with a raw SQLite client and `runcell audit verify` judges them.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use runcell_store::audit::signed::{AuditPublicKey, AuditSigner, Checkpoint};
use runcell_store::audit::{chain_hash, chain_mac, ChainFields, ChainKey, GENESIS_HASH};
use std::sync::{Arc, Mutex};

use common::serve::runcell;
use serde_json::{json, Value};

fn data_dir() -> common::serve::DataDir {
    common::serve::data_dir("runcell-audit-test-")
}

/// A server on `data` (cold sessions, none warm) and its log lines of audit checkpoints.
struct Serve {
    /// Stopped (SIGTERM) when dropped.
    _server: common::serve::Serve,
    base: String,
    logged: Arc<Mutex<Vec<String>>>,
}

fn serve(data: &Path, extra: &[&str]) -> Serve {
    let logged = Arc::new(Mutex::new(Vec::new()));
    let keep = logged.clone();
    let flags: Vec<&str> = ["--no-zygote", "--warm-sessions", "0"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let inner = common::serve::serve_logging(data, &flags, move |line| {
        if line.contains("audit checkpoint") {
            keep.lock().expect("lock").push(line);
        }
    });
    Serve {
        base: inner.base.clone(),
        _server: inner,
        logged,
    }
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

fn get_json(url: String) -> Value {
    http().get(url).send().and_then(|r| r.json()).expect("get")
}

/// `runcell audit verify ARGS` on `data`: exit code and the JSON report.
fn verify(data: &Path, args: &[&str]) -> (i32, Value, String) {
    let out: Output = runcell(data)
        .args(["audit", "verify"])
        .args(args)
        .output()
        .expect("verify");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify printed no report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        out.status.code().unwrap_or(-1),
        report,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A copy of `data`'s database and keys (nothing else), in a new directory.
fn copy_of(data: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(data.join("runcell.db"), dir.path().join("runcell.db")).expect("copy db");
    let wal = data.join("runcell.db-wal");
    if wal.exists() {
        std::fs::copy(&wal, dir.path().join("runcell.db-wal")).expect("copy wal");
    }
    std::fs::create_dir(dir.path().join("keys")).expect("keys");
    for f in ["audit-chain.key", "audit-signing.key"] {
        std::fs::copy(data.join("keys").join(f), dir.path().join("keys").join(f))
            .expect("copy key");
    }
    dir
}

/// A raw connection with every trigger dropped.
fn attacker(db: &Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(db).expect("open db");
    let names: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .expect("triggers");
    for t in names {
        c.execute_batch(&format!("DROP TRIGGER \"{t}\""))
            .expect("drop");
    }
    c
}

/// Edits `id`'s code, recomputes the whole tenant's chain with `hash` and moves its head.
fn rewrite(db: &Path, id: &str, hash: &dyn Fn(&str, &ChainFields<'_>) -> String) {
    let c = attacker(db);
    let n = c
        .execute(
            "UPDATE executions SET code = 'print(\"innocent\")' WHERE execution_id = ?1",
            [id],
        )
        .expect("edit");
    assert_eq!(n, 1);
    type Row = (
        String,
        i64,
        String,
        Option<String>,
        String,
        String,
        String,
        String,
    );
    let rows: Vec<Row> = c
        .prepare(
            "SELECT tenant, seq, execution_id, session_id, status, code, execution_json,
                    created_at FROM executions ORDER BY tenant, seq",
        )
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                ))
            })?
            .collect()
        })
        .expect("rows");
    let mut prev = GENESIS_HASH.to_owned();
    for (tenant, seq, id, session, status, code, json, created) in &rows {
        if *seq == 1 {
            prev = GENESIS_HASH.to_owned();
        }
        let h = hash(
            &prev,
            &ChainFields {
                seq: *seq,
                tenant,
                execution_id: id,
                session_id: session.as_deref(),
                status,
                code,
                execution_json: json,
                created_at: created,
            },
        );
        c.execute(
            "UPDATE executions SET prev_hash = ?1, hash = ?2 WHERE tenant = ?3 AND seq = ?4",
            rusqlite::params![prev, h, tenant, seq],
        )
        .expect("rehash");
        c.execute(
            "UPDATE chain_heads SET seq = ?1, hash = ?2 WHERE tenant = ?3",
            rusqlite::params![seq, h, tenant],
        )
        .expect("head");
        prev = h;
    }
}

fn stolen_key(dir: &Path) -> ChainKey {
    ChainKey::read(&dir.join("keys/audit-chain.key")).expect("chain key")
}

fn checkpoints_in(file: &Path) -> Vec<Checkpoint> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("checkpoint line"))
        .collect()
}

#[test]
fn signed_checkpoints_catch_what_a_stolen_chain_key_can_rewrite() {
    let data = data_dir();
    let cp_file = data.join("checkpoints.jsonl");
    let srv = serve(
        &data,
        &[
            "--audit-checkpoint-every",
            "2",
            "--audit-checkpoint-file",
            cp_file.to_str().expect("path"),
        ],
    );
    let c = http();
    let mut ids = Vec::new();
    for i in 0..3 {
        let e: Value = c
            .post(format!("{}/v1/execute", srv.base))
            .json(&json!({"code": format!("print({i})")}))
            .send()
            .and_then(|r| r.json())
            .expect("execute");
        assert_eq!(e["status"], "ok", "{e}");
        ids.push(e["id"].as_str().expect("id").to_owned());
    }
    // The published key, and an on-demand checkpoint that verifies under it.
    let pk = get_json(format!("{}/v1/audit/public-key", srv.base));
    assert_eq!(pk["algorithm"], "ed25519");
    let pk_hex = pk["public_key"].as_str().expect("hex").to_owned();
    let public = AuditPublicKey::from_hex(&pk_hex).expect("public key");
    let cp: Checkpoint =
        serde_json::from_value(get_json(format!("{}/v1/audit/checkpoint", srv.base)))
            .expect("checkpoint");
    public.verify(&cp).expect("the served checkpoint verifies");
    assert_eq!(cp.tenants.len(), 1, "{cp:?}");
    assert_eq!(
        (cp.tenants[0].tenant.as_str(), cp.tenants[0].count),
        ("default", 3)
    );
    assert_eq!(pk["key_id"].as_str(), Some(cp.key_id.as_str()));
    let served = data.join("served.jsonl");
    std::fs::write(
        &served,
        format!("{}\n", serde_json::to_string(&cp).expect("json")),
    )
    .expect("write");
    // The server took one at start and one once two executions were recorded.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !checkpoints_in(&cp_file)
        .iter()
        .any(|c| c.tenants.iter().any(|t| t.count >= 2))
    {
        assert!(
            Instant::now() < deadline,
            "no checkpoint after 2 executions"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let logged = srv.logged.clone();
    drop(srv);
    let emitted = checkpoints_in(&cp_file);
    // Each one is also a log line on stderr, and a file of those lines verifies as well.
    // (Logged before it is appended to the file; the reader thread may still be behind.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while logged.lock().expect("lock").len() < emitted.len() {
        assert!(Instant::now() < deadline, "checkpoints were not logged");
        std::thread::sleep(Duration::from_millis(50));
    }
    let logged = logged.lock().expect("lock").clone();
    assert_eq!(logged.len(), emitted.len(), "{logged:?}");
    let log_file = data.join("stderr-checkpoints.log");
    std::fs::write(&log_file, logged.join("\n")).expect("write");
    let (code, report, _) = verify(
        &data,
        &[
            "--checkpoint",
            log_file.to_str().expect("path"),
            "--public-key",
            &pk_hex,
        ],
    );
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["checkpoints"], emitted.len());
    assert!(emitted.len() >= 2, "{emitted:?}");
    assert!(
        emitted[0].tenants.is_empty(),
        "the first one is of the empty start"
    );
    for e in &emitted {
        public.verify(e).expect("emitted checkpoints verify");
    }
    // The CLI's own public key is the server's.
    let out = runcell(&data)
        .args(["audit", "public-key"])
        .output()
        .expect("public-key");
    let cli_pk: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(cli_pk["public_key"], pk_hex.as_str());

    let cp_arg = cp_file.to_str().expect("path");
    let served_arg = served.to_str().expect("path");
    // Positive control: the untouched log extends every checkpoint.
    let (code, report, err) = verify(&data, &["--checkpoint", cp_arg, "--public-key", &pk_hex]);
    assert_eq!(code, 0, "{report} {err}");
    assert_eq!(report["checked"], 3);
    let (code, report, _) = verify(
        &data,
        &["--checkpoint", served_arg, "--public-key", &pk_hex],
    );
    assert_eq!(code, 0, "{report}");
    // A public key given as the JSON file the endpoint serves.
    let pk_file = data.join("public-key.json");
    std::fs::write(&pk_file, pk.to_string()).expect("write");
    let (code, _, _) = verify(
        &data,
        &[
            "--checkpoint",
            served_arg,
            "--public-key",
            pk_file.to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0);

    // The old attack: edit, recompute with plain SHA-256. The keyed chain alone catches it.
    let copy = copy_of(&data);
    rewrite(&copy.path().join("runcell.db"), &ids[0], &chain_hash);
    let (code, report, _) = verify(copy.path(), &[]);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["first_broken"]["execution_id"], ids[0].as_str());
    assert!(
        report["first_broken"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("recomputed without the chain key")),
        "{report}"
    );

    // With the chain key stolen the rewrite is consistent: verify alone passes, the
    // checkpoints taken before it do not, and name the record.
    let copy = copy_of(&data);
    let key = stolen_key(copy.path());
    rewrite(&copy.path().join("runcell.db"), &ids[0], &|p, f| {
        chain_mac(&key, p, f)
    });
    let (code, report, _) = verify(copy.path(), &[]);
    assert_eq!(code, 0, "the stolen key makes a consistent chain: {report}");
    let (code, report, err) = verify(
        copy.path(),
        &["--checkpoint", cp_arg, "--public-key", &pk_hex],
    );
    assert_eq!(code, 1, "{report}");
    let reason = report["first_broken"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("differs from the checkpoint of"),
        "{report}"
    );
    assert!(
        err.contains("audit chain broken for tenant default"),
        "{err}"
    );

    // The whole tenant deleted: nothing is left to be inconsistent, but a checkpoint names it.
    let copy = copy_of(&data);
    let c = attacker(&copy.path().join("runcell.db"));
    for table in ["executions", "chain_heads", "audit_legacy"] {
        c.execute(&format!("DELETE FROM {table}"), [])
            .expect("delete");
    }
    drop(c);
    let (code, report, _) = verify(copy.path(), &[]);
    assert_eq!(code, 0, "{report}");
    let (code, report, _) = verify(
        copy.path(),
        &["--checkpoint", served_arg, "--public-key", &pk_hex],
    );
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["first_broken"]["tenant"], "default");
    assert!(
        report["first_broken"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the whole tenant was deleted")),
        "{report}"
    );

    // Tampered checkpoints are rejected: count, head, signature, or another signer.
    let tampered = |what: &str, f: &dyn Fn(&mut Value)| {
        let mut v = serde_json::to_value(&cp).expect("json");
        f(&mut v);
        let file = data.join(format!("tampered-{what}.jsonl"));
        std::fs::write(&file, format!("{v}\n")).expect("write");
        let (code, report, err) = verify(
            &data,
            &[
                "--checkpoint",
                file.to_str().expect("path"),
                "--public-key",
                &pk_hex,
            ],
        );
        assert_eq!(code, 1, "{what}: {report}");
        assert_eq!(report["ok"], false, "{what}");
        (report["error"].as_str().unwrap_or_default().to_owned(), err)
    };
    let (e, _) = tampered("count", &|v| v["tenants"][0]["count"] = json!(2));
    assert!(e.contains("the signature does not verify"), "{e}");
    let (e, _) = tampered("head", &|v| {
        v["tenants"][0]["head"] = json!("00".repeat(32))
    });
    assert!(e.contains("the signature does not verify"), "{e}");
    let (e, _) = tampered("signature", &|v| {
        let s = v["signature"].as_str().expect("sig").to_owned();
        let flipped = if s.starts_with('0') { "1" } else { "0" };
        v["signature"] = json!(format!("{flipped}{}", &s[1..]));
    });
    assert!(e.contains("the signature does not verify"), "{e}");
    let other = AuditSigner::ephemeral().expect("key");
    let forged = other.sign(cp.scope, cp.time.clone(), cp.tenants.clone());
    let (e, _) = tampered("signer", &|v| {
        *v = serde_json::to_value(&forged).expect("json")
    });
    assert!(e.contains("signed by another key"), "{e}");
    // ... even when the forger also replaced the data dir's signing key, if the published
    // key is given.
    let copy = copy_of(&data);
    let forged_file = copy.path().join("forged.jsonl");
    let signer_file = copy.path().join("keys/audit-signing.key");
    std::fs::remove_file(&signer_file).expect("rm");
    let replaced = AuditSigner::load_or_create(&signer_file).expect("new key");
    let forged = replaced.sign(cp.scope, cp.time.clone(), cp.tenants.clone());
    std::fs::write(&forged_file, serde_json::to_string(&forged).expect("json")).expect("write");
    let forged_arg = forged_file.to_str().expect("path");
    let (code, _, _) = verify(copy.path(), &["--checkpoint", forged_arg]);
    assert_eq!(code, 0, "the data dir's own key is what was replaced");
    let (code, report, _) = verify(
        copy.path(),
        &["--checkpoint", forged_arg, "--public-key", &pk_hex],
    );
    assert_eq!(code, 1, "{report}");

    // The server's verify endpoint reports a keyed-chain failure too.
    rewrite(&data.join("runcell.db"), &ids[1], &chain_hash);
    let srv = serve(&data, &[]);
    let v = get_json(format!("{}/v1/audit/verify", srv.base));
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["first_broken"]["execution_id"], ids[0].as_str(), "{v}");
    assert!(
        v["first_broken"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("recomputed without the chain key")),
        "{v}"
    );
}

/// With API keys a key holder's checkpoint covers its own tenant only; in open mode it
/// covers every tenant.
#[test]
fn a_key_holder_gets_its_own_tenants_checkpoint() {
    let data = data_dir();
    let out = runcell(&data)
        .args(["keys", "create", "--name", "a", "--tenant", "team-a"])
        .output()
        .expect("keys create");
    assert!(out.status.success());
    let key = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .expect("key")
        .to_owned();
    // Checkpoints by time only: one at start, one within a second of a recorded execution.
    let cp_file = data.join("timed.jsonl");
    let srv = serve(
        &data,
        &[
            "--audit-checkpoint-every",
            "0",
            "--audit-checkpoint-interval-s",
            "1",
            "--audit-checkpoint-file",
            cp_file.to_str().expect("path"),
        ],
    );
    let c = http();
    let e: Value = c
        .post(format!("{}/v1/execute", srv.base))
        .bearer_auth(&key)
        .json(&json!({"code": "1"}))
        .send()
        .and_then(|r| r.json())
        .expect("execute");
    assert_eq!(e["status"], "ok", "{e}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let emitted = checkpoints_in(&cp_file);
        if let Some(last) = emitted.last().filter(|c| !c.tenants.is_empty()) {
            // The server's own checkpoints cover every tenant.
            assert_eq!(serde_json::to_value(last.scope).expect("scope"), "all");
            assert_eq!(
                (last.tenants[0].tenant.as_str(), last.tenants[0].count),
                ("team-a", 1)
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no timed checkpoint: {emitted:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let unauth = c
        .get(format!("{}/v1/audit/checkpoint", srv.base))
        .send()
        .expect("get");
    assert_eq!(unauth.status(), 401);
    let cp: Checkpoint = c
        .get(format!("{}/v1/audit/checkpoint", srv.base))
        .bearer_auth(&key)
        .send()
        .and_then(|r| r.json())
        .expect("checkpoint");
    assert_eq!(serde_json::to_value(cp.scope).expect("scope"), "tenant");
    assert_eq!(cp.tenants.len(), 1);
    assert_eq!(
        (cp.tenants[0].tenant.as_str(), cp.tenants[0].count),
        ("team-a", 1)
    );
    let pk: Value = c
        .get(format!("{}/v1/audit/public-key", srv.base))
        .bearer_auth(&key)
        .send()
        .and_then(|r| r.json())
        .expect("public key");
    let public = AuditPublicKey::from_hex(pk["public_key"].as_str().expect("hex")).expect("pk");
    public.verify(&cp).expect("verifies");
    drop(srv);
    // The CLI's per-tenant checkpoint, checked for that tenant.
    let out = runcell(&data)
        .args(["audit", "checkpoint", "--tenant", "team-a"])
        .output()
        .expect("checkpoint");
    assert!(out.status.success());
    let file = data.join("team-a.jsonl");
    std::fs::write(&file, &out.stdout).expect("write");
    let (code, report, _) = verify(
        &data,
        &[
            "--tenant",
            "team-a",
            "--checkpoint",
            file.to_str().expect("path"),
        ],
    );
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["checked"], 1);
}
