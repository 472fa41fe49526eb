//! An E2B sandbox survives `runcell serve` stopping (SIGTERM: its session is paused) and
//! starting again on the same address: the official SDK's `Sandbox` object from before the
//! restart keeps working with the access token it holds, `Sandbox.connect(id)` hands out the
//! same token, the variables and files are back (tests/vendor-clients/e2b_client.py `restart`,
//! run with the pinned SDK of the server's E2B tests).

mod common;

#[path = "../../server/tests/common/clients.rs"]
mod clients;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/tests/vendor-clients")
}

#[test]
fn a_sandbox_is_connectable_with_its_token_after_a_sigterm_restart() {
    let python = clients::requirements_venv("e2b-sdk", &clients_dir().join("e2b-requirements.txt"));
    let data = common::serve::data_dir("runcell-e2b-restart-");
    let port = common::serve::free_port();
    let flags = ["--warm-sessions", "0"];
    let first = common::serve::serve_at(&data, port, &flags, |_| {});
    let base = first.base.clone();
    // No keys on a loopback server: any key of E2B's shape is the local tenant's.
    let mut client = Command::new(python)
        .arg(clients_dir().join("e2b_client.py"))
        .arg("restart")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("E2B_API_URL", format!("{base}/e2b"))
        .env("E2B_SANDBOX_URL", format!("{base}/e2b/sandbox"))
        .env("E2B_API_KEY", "e2b_0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run e2b_client.py");
    let mut out = BufReader::new(client.stdout.take().expect("stdout"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the first half's report");
    let before: Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("{e}: {line}"));
    let id = before["sandbox_id"].as_str().expect("an id").to_owned();

    drop(first); // SIGTERM: every session paused, its snapshot kept
    assert!(
        data.join("snapshots").join(format!("{id}.snap")).exists(),
        "the sandbox was paused at the stop"
    );
    let second = common::serve::serve_at(&data, port, &flags, |_| {});
    assert_eq!(second.base, base);
    let mut stdin = client.stdin.take().expect("stdin");
    stdin.write_all(b"go\n").expect("go on");
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("the report");
    let status = client.wait().expect("the client");
    assert!(status.success(), "e2b_client.py restart failed: {rest}");
    let r: Value = serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("{e}: {rest}"));

    assert_eq!(r["sandbox_id"], id.as_str());
    assert_eq!(r["state"], "paused", "{r}");
    assert_eq!(
        r["listed"],
        serde_json::json!([[id, "my-template"]]),
        "listed paused, its record read back: {r}"
    );
    assert_eq!(r["same_token"], true, "{r}");
    assert_eq!(r["var"], "'before the restart'", "{r}");
    assert_eq!(r["file"], "a file from before", "{r}");
    assert_eq!(
        r["command_env"], "hello\n",
        "the sandbox's envs are kept: {r}"
    );
    assert_eq!(
        r["kernel_env"], "'hello'",
        "and given back to its kernel: {r}"
    );
    // What a restart loses (docs/e2b.md): code contexts other than the default one.
    assert_eq!(r["context"], "NotFoundException", "{r}");
    assert_eq!(r["health"], true, "{r}");
    drop(second); // SIGTERM: the sandbox was killed, nothing is left mounted
    let _ = std::fs::remove_dir_all(&data);
}
