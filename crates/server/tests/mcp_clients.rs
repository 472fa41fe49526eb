//! `/mcp` as clients nobody here wrote speak it: the MCP Python SDK's default client (which
//! negotiates the session-less 2026-07-28 revision) and the official conformance suite,
//! against the app on port 0. Both are installed under target/ on first use (tests/common/
//! clients.rs) and pinned by tests/mcp-clients/.

mod common;

#[path = "common/clients.rs"]
mod clients;

use std::ffi::OsStr;
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdks_default_client_keeps_its_state() {
    tokio::task::spawn_blocking(clients::sdk_python)
        .await
        .expect("install the SDK");
    let srv = common::start().await;
    let url = format!("{}/mcp", srv.base);
    let u = url.clone();
    let report = tokio::task::spawn_blocking(move || clients::run_sdk_client(&[OsStr::new(&u)]))
        .await
        .expect("first run");
    assert_eq!(report["protocol_version"], "2026-07-28", "{report}");
    clients::assert_state_kept(&report);
    let session = report["calls"][0]["structured"]["session_id"].clone();

    // The same client again (a new process): the same session, nothing left behind.
    let report = tokio::task::spawn_blocking(move || clients::run_sdk_client(&[OsStr::new(&url)]))
        .await
        .expect("second run");
    clients::assert_state_kept(&report);
    assert_eq!(report["calls"][0]["structured"]["session_id"], session);
    let sessions: serde_json::Value = srv
        .http
        .get(format!("{}/v1/sessions", srv.base))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(
        sessions["sessions"].as_array().map(Vec::len),
        Some(1),
        "{sessions}"
    );
}

/// The official conformance suite, every active server scenario, against `/mcp`; the
/// baseline lists the scenarios that need its fixtures, each with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_passes() {
    let (node, suite) = tokio::task::spawn_blocking(clients::conformance)
        .await
        .expect("install the suite");
    let srv = common::start().await;
    let url = format!("{}/mcp", srv.base);
    let results = tempfile::tempdir().expect("results dir");
    let baseline = clients::clients_dir().join("conformance-baseline.yml");
    let out = tokio::task::spawn_blocking({
        let dir = results.path().to_owned();
        move || {
            Command::new("timeout")
                // The suite takes seconds; a hang must not hold up CI.
                .args(["300"])
                .arg(&node)
                .arg(&suite)
                .args(["server", "--url", &url, "--expected-failures"])
                .arg(&baseline)
                .arg("-o")
                .arg(&dir)
                .output()
                .expect("run the conformance suite")
        }
    })
    .await
    .expect("conformance");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stdout
        .find("=== SUMMARY")
        .map_or(&stdout[..], |at| &stdout[at..]);
    assert!(
        out.status.success(),
        "the conformance suite failed ({}):\n{summary}\n{stderr}",
        out.status
    );
    // It did run the scenarios, and the server-side ones that need no fixture passed.
    for scenario in [
        "server-initialize",
        "tools-list",
        "ping",
        "dns-rebinding-protection",
    ] {
        assert!(
            summary.contains(&format!("✓ {scenario}:")),
            "{scenario} did not pass:\n{summary}"
        );
    }
}
