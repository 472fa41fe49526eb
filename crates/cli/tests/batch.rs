//! `runcell run --batch`: one line per finished run on stdout with its index and verdicts,
//! every run in the data dir's audit log, and a bad line refused before anything runs.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn data_dir() -> std::path::PathBuf {
    runcell_engine::testing::data_dir_with_runtime(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        "runcell-batch-",
    )
}

fn runcell(data: &std::path::Path, args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runcell"))
        .env("RUNCELL_DATA_DIR", data)
        .env("NO_COLOR", "1")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runcell");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write");
    child.wait_with_output().expect("wait")
}

#[test]
fn a_batch_file_prints_one_line_per_run_and_audits_each() {
    let data = data_dir();
    let lines = [
        json!({"code": "print(int(input()) * 2)", "tests": [{"stdin": "21", "expected_stdout": "42"}, {"stdin": "1", "expected_stdout": "3"}]}),
        json!({"language": "bash", "code": "echo $1", "args": ["hello"]}),
        json!({"code": "import sys; sys.exit(7)"}),
    ];
    let input: String = lines.iter().map(|l| format!("{l}\n\n")).collect();
    let out = runcell(
        &data,
        &["run", "--batch", "-", "--concurrency", "2"],
        &input,
    );
    assert!(out.status.success(), "{out:?}");
    let mut got: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    got.sort_by_key(|v| v["index"].as_u64());
    assert_eq!(got.len(), 3, "{out:?}");
    assert_eq!(got[0]["summary"]["verdict"], "wrong_answer");
    assert_eq!(got[0]["summary"]["passed"], 1);
    assert_eq!(got[0]["tests"][0]["verdict"], "accepted");
    assert_eq!(got[1]["stdout"], "hello\n");
    assert_eq!(got[2]["status"], "error");
    // No terminal: no progress bar, stderr stays quiet of it.
    assert!(!String::from_utf8_lossy(&out.stderr).contains("runs,"));
    let verify = runcell(&data, &["audit", "verify"], "");
    let v: Value = serde_json::from_slice(&verify.stdout).expect("verify json");
    assert_eq!(
        (v["ok"].as_bool(), v["checked"].as_u64()),
        (Some(true), Some(4))
    );

    // A bad line: refused with its line number, nothing run.
    let bad = format!(
        "{}\n{}\n",
        lines[1],
        json!({"code": "1", "tests": [{"stdin": ""}]})
    );
    let out = runcell(&data, &["run", "--batch", "-"], &bad);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("-:2:") && err.contains("expected_stdout"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
    let verify = runcell(&data, &["audit", "verify"], "");
    let v: Value = serde_json::from_slice(&verify.stdout).expect("verify json");
    assert_eq!(v["checked"].as_u64(), Some(4));
}
