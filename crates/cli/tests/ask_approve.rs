//! `runcell ask --approve` on a pseudo-terminal (python's `pty` module types the answers, as a
//! person would): a cell run on `y`, one declined with a reason on `n`, one edited in $EDITOR
//! on `e`; what reached the model, and what the audit log says of each decision.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use runcell_agent::testing::StandIn;
use serde_json::{json, Value};

fn data_dir() -> PathBuf {
    runcell_engine::testing::data_dir_with_runtime(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        "runcell-approve-test-",
    )
}

fn runcell(data: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_runcell"));
    c.env("RUNCELL_DATA_DIR", data)
        .env_remove("NO_COLOR")
        .env_remove("OPENAI_API_KEY")
        .env_remove("RUNCELL_PROVIDER")
        .env_remove("RUNCELL_MODEL")
        .env_remove("VISUAL");
    c
}

fn call(id: &str, code: &str) -> Value {
    json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": null, "tool_calls": [{
            "id": id, "type": "function",
            "function": {"name": "python", "arguments": json!({"code": code}).to_string()}}]}}]})
}

/// The content of the last tool message the model was sent.
fn last_tool_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn approve_decline_and_edit_on_a_terminal_reach_the_model_and_the_audit_log() {
    let data = data_dir();
    let work = tempfile::tempdir().expect("tempdir");
    let stand_in = StandIn::start(|n, _| {
        let body = match n {
            0 => call("call_a", "import os  # approved\nprint('A=' + str(6 * 7))"),
            1 => call("call_b", "import shutil; shutil.rmtree('/workspace')"),
            2 => call("call_c", "print('C=' + str(1))"),
            _ => json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "done"}}]}),
        };
        (200, vec![], body.to_string())
    });
    // The "editor": rewrites the cell in place, as a person would in vi.
    let editor = work.path().join("editor.sh");
    std::fs::write(&editor, "#!/bin/sh\nsed -i 's/str(1)/str(2)/' \"$1\"\n").expect("editor");
    std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).expect("chmod");

    let mut cmd = Command::new("python3");
    cmd.arg(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pty_drive.py"
    ))
    .arg(json!(["Run it? [y]es / [n]o / [e]dit: ", "Reason (optional"]).to_string())
    .arg(json!(["y", "n", "it deletes the workspace", "e"]).to_string())
    .arg("--")
    .arg(env!("CARGO_BIN_EXE_runcell"))
    .args(["ask", "Compute things", "--approve", "--provider", "openai"])
    .args(["--model", "m", "--base-url"])
    .arg(format!("{}/v1", stand_in.base))
    .arg("--out")
    .arg(work.path().join("out"));
    let base = runcell(&data);
    for (k, v) in base.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.env("OPENAI_API_KEY", "sk-test").env("EDITOR", &editor);
    let out = cmd.output().expect("python3 pty driver");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}\n{shown}");
    assert!(shown.contains("done"), "{shown}");
    // On a terminal the cell is highlighted: the keyword, the comment.
    assert!(shown.contains("\x1b[1;34mimport\x1b[0m os"), "{shown}");
    assert!(shown.contains("\x1b[90m# approved\x1b[0m"), "{shown}");

    let reqs = stand_in.requests();
    assert_eq!(reqs.len(), 4, "{shown}");
    assert!(last_tool_text(&reqs[1].body).contains("A=42"));
    assert_eq!(
        last_tool_text(&reqs[2].body),
        "the user declined to run this code: it deletes the workspace"
    );
    let edited = last_tool_text(&reqs[3].body);
    assert!(
        edited.starts_with(
            "the user edited the code before it ran; this is what ran:\nprint('C=' + str(2))"
        ),
        "{edited}"
    );
    assert!(
        edited.contains("C=2") && !edited.contains("C=1"),
        "{edited}"
    );

    // The audit log: each decision, in order, before the cell it let run.
    let list = runcell(&data)
        .args(["audit", "list"])
        .output()
        .expect("audit list");
    let list = String::from_utf8_lossy(&list.stdout).into_owned();
    let statuses: Vec<&str> = list
        .lines()
        .rev()
        .map(|l| l.split_whitespace().nth(3).unwrap_or(""))
        .collect();
    assert_eq!(
        statuses,
        ["approved", "ok", "declined", "edited", "ok"],
        "{list}"
    );
    let edit_id = list
        .lines()
        .find(|l| l.contains(" edited "))
        .and_then(|l| l.split_whitespace().nth(2))
        .expect("edited row");
    let show = runcell(&data)
        .args(["audit", "show", edit_id])
        .output()
        .expect("audit show");
    let rec: Value = serde_json::from_slice(&show.stdout).expect("json");
    assert_eq!(rec["decision"], "edited");
    assert_eq!(rec["proposed_code"], "print('C=' + str(1))");
    assert_eq!(rec["edited_code"], "print('C=' + str(2))");
    assert!(rec["decided_by"].as_str().expect("by").starts_with("cli:"));
    let declined = list
        .lines()
        .find(|l| l.contains(" declined "))
        .expect("declined row");
    let id = declined.split_whitespace().nth(2).expect("id");
    let show = runcell(&data)
        .args(["audit", "show", id])
        .output()
        .expect("show");
    let rec: Value = serde_json::from_slice(&show.stdout).expect("json");
    assert_eq!(rec["reason"], "it deletes the workspace");

    let verify = runcell(&data)
        .args(["audit", "verify"])
        .output()
        .expect("verify");
    assert!(verify.status.success(), "{verify:?}");
}
