//! What the CLI prints as JSON, as insta snapshots (tests/snapshots/): `run --json` (Python and
//! bash), `repl --json` (one Execution per cell and line) and `tools --format F` for each format.
//! Ids, times and usage figures differ on every run; they are checked for their shape and
//! redacted, so a change to any other field, a field added, renamed or dropped, fails here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use insta::internals::{Content, ContentPath};
use serde_json::Value;

/// A data dir with the shared test runtime, so `repl` does not install its own.
fn data_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        runcell_engine::testing::data_dir_with_runtime(
            Path::new(env!("CARGO_TARGET_TMPDIR")),
            "runcell-snapshots-",
        )
    })
}

/// `runcell ARGS` with `stdin` piped in.
fn runcell(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runcell"))
        .env("RUNCELL_DATA_DIR", data_dir())
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
        .expect("write stdin");
    child.wait_with_output().expect("wait runcell")
}

/// The JSON documents `out` printed, one per line, and its exit code.
fn json_lines(out: &Output) -> (Vec<Value>, i32) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let docs = stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|e| {
                panic!(
                    "not JSON ({e}): {l:?}; stderr={}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
        })
        .collect();
    (docs, out.status.code().expect("exited"))
}

/// `prefix_` and `len` characters of the ids' alphabet: 16 random ones for a session, 10 of
/// time and 16 random ones for an execution.
fn id(prefix: &'static str, len: usize) -> impl Fn(Content, ContentPath<'_>) -> String {
    move |value, path| {
        let s = value.as_str().unwrap_or_default();
        let rest = s.strip_prefix(prefix).and_then(|r| r.strip_prefix('_'));
        assert!(
            rest.is_some_and(|r| r.len() == len
                && r.bytes()
                    .all(|b| b"0123456789abcdefghjkmnpqrstvwxyz".contains(&b))),
            "{path}: {s:?} is not a {prefix}_ id"
        );
        format!("[{prefix}_id]")
    }
}

/// RFC 3339 in UTC with milliseconds (`2026-01-02T03:04:05.678Z`).
fn time(value: Content, path: ContentPath<'_>) -> &'static str {
    let s = value.as_str().unwrap_or_default();
    let shape = s.bytes().enumerate().all(|(i, b)| match i {
        4 | 7 => b == b'-',
        10 => b == b'T',
        13 | 16 => b == b':',
        19 => b == b'.',
        23 => b == b'Z',
        _ => b.is_ascii_digit(),
    });
    assert!(
        s.len() == 24 && shape,
        "{path}: {s:?} is not an RFC 3339 UTC time"
    );
    "[time]"
}

/// A session's id, or null (kept) for a one-shot run.
fn session_id(value: Content, path: ContentPath<'_>) -> Content {
    if value.as_str().is_some() {
        id("ses", 16)(value, path).into()
    } else {
        value
    }
}

/// A measured figure: a whole number that differs from run to run.
fn figure(value: Content, path: ContentPath<'_>) -> &'static str {
    assert!(value.as_u64().is_some(), "{path}: {value:?} is not a count");
    "[figure]"
}

/// The Execution's redactions, under `at` (`""` for a bare Execution, `"[]"` for a list).
macro_rules! assert_execution_snapshot {
    ($name:expr, $value:expr, $at:literal) => {
        insta::assert_json_snapshot!($name, $value, {
            concat!($at, ".id") => insta::dynamic_redaction(id("ex", 26)),
            concat!($at, ".session_id") => insta::dynamic_redaction(session_id),
            concat!($at, ".started_at") => insta::dynamic_redaction(time),
            concat!($at, ".finished_at") => insta::dynamic_redaction(time),
            concat!($at, ".usage.wall_ms") => insta::dynamic_redaction(figure),
            concat!($at, ".usage.cpu_ms") => insta::dynamic_redaction(figure),
            concat!($at, ".usage.peak_memory_bytes") => insta::dynamic_redaction(figure),
        })
    };
}

#[test]
fn run_json_prints_the_execution() {
    let out = runcell(
        &["run", "--json", "-"],
        "import sys\nprint('hello')\nprint('careful', file=sys.stderr)\n",
    );
    let (docs, code) = json_lines(&out);
    assert_eq!((docs.len(), code), (1, 0), "{out:?}");
    assert_eq!(docs[0]["session_id"], Value::Null);
    assert_execution_snapshot!("run_python", &docs[0], "");

    let out = runcell(&["run", "--json", "-"], "answer = 6 * 7\nanswer / 0\n");
    let (docs, code) = json_lines(&out);
    assert_eq!((docs.len(), code), (1, 1), "{out:?}");
    assert_execution_snapshot!("run_python_error", &docs[0], "");

    let out = runcell(
        &["run", "--json", "--lang", "bash", "-"],
        "echo hi > greeting.txt\ncat greeting.txt\nexit 3\n",
    );
    let (docs, code) = json_lines(&out);
    assert_eq!((docs.len(), code), (1, 3), "{out:?}");
    assert_execution_snapshot!("run_bash_exit_code", &docs[0], "");
}

#[test]
fn repl_json_prints_one_execution_per_cell() {
    let out = runcell(
        &["repl", "--json"],
        "answer = 6 * 7\nanswer\n%%\nprint(answer + 1)\n%%\nundefined_name\n",
    );
    let (docs, code) = json_lines(&out);
    // A cell that did not end `ok` makes the exit code 1.
    assert_eq!((docs.len(), code), (3, 1), "{out:?}");
    assert_eq!(docs[0]["session_id"], docs[2]["session_id"], "one session");
    assert_execution_snapshot!("repl_cells", &docs, "[]");
}

#[test]
fn tools_prints_the_definitions_for_each_format() {
    for format in ["openai", "anthropic", "gemini", "mcp"] {
        let out = runcell(&["tools", "--format", format], "");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        // As printed, indentation included: the text is what gets pasted into a request.
        let text = String::from_utf8(out.stdout).expect("UTF-8");
        serde_json::from_str::<Value>(&text).expect("tools prints JSON");
        insta::assert_snapshot!(format!("tools_{format}"), text);
    }
}
