//! `serve --config`, `serve --max-*` and `keys create|update|list` quotas as an operator uses
//! them: the real binary and a real database file.

mod common;

use std::process::{Output, Stdio};

use common::serve::{runcell, serve, Serve};
use serde_json::{json, Value};

fn data_dir() -> common::serve::DataDir {
    common::serve::data_dir("runcell-limits-test-")
}

fn ok(out: Output) -> (String, String) {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "stdout={stdout} stderr={stderr}");
    (stdout, stderr)
}

fn create(srv: &Serve, key: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::blocking::Client::new()
        .post(format!("{}/v1/sessions", srv.base))
        .bearer_auth(key)
        .json(&body)
        .send()
        .expect("send");
    let status = resp.status().as_u16();
    (status, resp.json().expect("json"))
}

#[test]
fn a_config_file_sets_maxima_flags_win_and_key_quotas_are_enforced() {
    let data = data_dir();
    let config = data.join("runcell.toml");
    std::fs::write(
        &config,
        "# the operator's file\n\
         no_zygote = true\n\
         warm_sessions = 0\n\
         max_memory_mb = 512\n\
         max_pids = 100\n\
         default_memory_mb = 256\n\
         max_committed_memory_mb = 4096\n",
    )
    .expect("config");
    // A key whose tenant may hold one session.
    let (key, stderr) = ok(runcell(&data)
        .args([
            "keys",
            "create",
            "--name",
            "ci",
            "--tenant",
            "acme",
            "--max-sessions",
            "1",
        ])
        .output()
        .expect("keys create"));
    let key = key.trim().to_owned();
    assert!(
        stderr.contains("tenant acme: max_sessions=1 max_memory_mb=none start=default"),
        "{stderr}"
    );
    let (list, _) = ok(runcell(&data)
        .args(["keys", "list"])
        .output()
        .expect("list"));
    assert!(
        list.contains("tenant=acme") && list.contains("max_sessions=1 max_memory_mb=none"),
        "{list}"
    );

    // The flag wins over the file's max_pids.
    let srv = serve(
        &data,
        &[
            "--config",
            config.to_str().expect("path"),
            "--max-pids",
            "200",
        ],
    );
    let (s, v) = create(&srv, &key, json!({"limits": {"memory_mb": 513}}));
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], "limit_exceeded", "{v}");
    assert_eq!(
        v["error"]["message"],
        "memory_mb 513 exceeds this server's maximum of 512 (serve --max-memory-mb)"
    );
    let (s, v) = create(
        &srv,
        &key,
        json!({"limits": {"memory_mb": 512, "pids": 150}}),
    );
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["limits"]["pids"], 150, "{v}");
    // The tenant's one session is live: a second is over its quota...
    let (s, v) = create(&srv, &key, json!({}));
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("message")
            .starts_with("tenant quota: tenant acme already has 1 live session"),
        "{v}"
    );
    // ...until the operator raises it, from another process, while the server runs.
    let (_, stderr) = ok(runcell(&data)
        .args([
            "keys",
            "update",
            "ci",
            "--max-sessions",
            "2",
            "--max-memory-mb",
            "768",
        ])
        .output()
        .expect("keys update"));
    assert!(
        stderr.contains("max_sessions=2 max_memory_mb=768"),
        "{stderr}"
    );
    let (s, v) = create(&srv, &key, json!({}));
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["limits"]["memory_mb"], 256, "the file's default: {v}");
    let (list, _) = ok(runcell(&data)
        .args(["keys", "list"])
        .output()
        .expect("list"));
    assert!(list.contains("max_sessions=2 max_memory_mb=768"), "{list}");
    // Cleared again: `none`.
    let (_, stderr) = ok(runcell(&data)
        .args(["keys", "update", "ci", "--max-sessions", "none"])
        .output()
        .expect("keys update"));
    assert!(
        stderr.contains("max_sessions=none max_memory_mb=768"),
        "{stderr}"
    );
}

#[test]
fn bad_configuration_is_refused_by_name() {
    let data = data_dir();
    let config = data.join("runcell.toml");
    std::fs::write(&config, "max_memory_mb = 512\nmax_memroy_mb = 1024\n").expect("config");
    let out = runcell(&data)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            config.to_str().expect("path"),
        ])
        .output()
        .expect("serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unknown field `max_memroy_mb`"), "{stderr}");
    // A default over its maximum is not silently lowered either.
    let out = runcell(&data)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--max-memory-mb",
            "512",
            "--default-memory-mb",
            "1024",
        ])
        .output()
        .expect("serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("default_memory_mb 1024 exceeds max_memory_mb 512"),
        "{stderr}"
    );
    // Nor is a missing file.
    let out = runcell(&data)
        .args(["serve", "--config", "/nonexistent/runcell.toml"])
        .output()
        .expect("serve");
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("cannot read --config /nonexistent/runcell.toml"));
    // `keys update` needs something to change and a key to change it for.
    let out = runcell(&data)
        .args(["keys", "update", "nobody", "--max-sessions", "1"])
        .output()
        .expect("keys");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no key matches \"nobody\""));
    let out = runcell(&data)
        .args(["keys", "update", "nobody", "--max-sessions", "lots"])
        .output()
        .expect("keys");
    assert!(!out.status.success());
}

#[test]
fn run_memory_over_the_host_is_refused_naming_the_maximum() {
    let data = data_dir();
    let out = runcell(&data)
        .args(["run", "--memory", "100000000", "-"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("memory_mb 100000000 exceeds this host's maximum of"),
        "{stderr}"
    );
}
