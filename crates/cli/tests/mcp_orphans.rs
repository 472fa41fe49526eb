//! A `runcell mcp` killed with -9 leaves its session's workspace (a tmpfs) mounted on the
//! host; the next `runcell mcp`, or `runcell doctor --clean`, removes it, and leaves alone
//! the workspace of one still running.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;

fn data_dir() -> PathBuf {
    runcell_engine::testing::data_dir_with_runtime(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "runcell-mcp-orphans-",
    )
}

fn mounted(path: &Path) -> bool {
    let path = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(path.as_str()))
}

/// A `runcell mcp` on `data` that has run a cell: its pid and its session's workspace.
async fn mcp_with_a_session(data: &Path) -> (RunningService<RoleClient, ()>, u32, PathBuf) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_runcell"));
    cmd.arg("--data-dir").arg(data).arg("mcp");
    let transport = TokioChildProcess::new(cmd).expect("spawn runcell mcp");
    let pid = transport.id().expect("pid");
    let client = ().serve(transport).await.expect("initialize");
    let args = json!({"code": "open('kept.txt', 'w').write('x')"});
    let r = client
        .call_tool(
            CallToolRequestParams::new("python".to_owned())
                .with_arguments(args.as_object().expect("object").clone()),
        )
        .await
        .expect("tools/call");
    let execution = r.structured_content.expect("structuredContent");
    let session = execution["session_id"].as_str().expect("session");
    let ws = runcell_engine::workspaces_dir(data).join(session);
    assert!(mounted(&ws), "{} is not mounted", ws.display());
    (client, pid, ws)
}

fn kill9(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// Waits for a path to be unmounted (a killed process's mounts go as it is reaped).
fn wait_unmounted(path: &Path, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while mounted(path) {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_mcps_workspace_is_removed_by_the_next_start_and_by_doctor_clean() {
    let data = data_dir();
    let (client, pid, orphan) = mcp_with_a_session(&data).await;
    kill9(pid);
    drop(client);
    std::thread::sleep(Duration::from_millis(500));
    assert!(mounted(&orphan), "left mounted by the kill");

    // A second `runcell mcp` sweeps it at start, while its own session stays.
    let (client, pid2, own) = mcp_with_a_session(&data).await;
    assert!(wait_unmounted(&orphan, Duration::from_secs(5)));
    assert!(!orphan.exists(), "{} is left", orphan.display());
    assert!(mounted(&own));

    // `doctor --clean` leaves a running one's workspace alone...
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runcell"))
        .arg("--data-dir")
        .arg(&data)
        .args(["doctor", "--clean"])
        .output()
        .expect("doctor --clean");
    assert!(out.status.success(), "{out:?}");
    assert!(mounted(&own), "a live process's workspace was removed");
    // ...and removes it once that one is killed.
    kill9(pid2);
    drop(client);
    std::thread::sleep(Duration::from_millis(500));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_runcell"))
        .arg("--data-dir")
        .arg(&data)
        .args(["doctor", "--clean"])
        .output()
        .expect("doctor --clean");
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("removed 1 orphaned"), "{said}");
    assert!(!mounted(&own) && !own.exists());
    let _ = std::fs::remove_dir_all(&data);
}
