//! The model tools on a real session: text_editor semantics and confinement, python and bash
//! results as a model reads them.

use std::path::Path;

use base64::Engine as _;
use runcell_engine::tools::{ToolCall, ToolOutput};
use runcell_engine::{CancelToken, CreateSession};
use serde_json::{json, Value};

fn run(engine: &runcell_engine::Engine, session: &str, name: &str, args: Value) -> ToolOutput {
    let call = ToolCall::parse(name, args).expect("valid call");
    engine
        .run_tool(session, &call, CancelToken::new())
        .expect("the session exists")
}

/// An engine with one Python session.
fn engine_and_session() -> (runcell_engine::testing::TestEngine, String) {
    let engine = runcell_engine::testing::engine(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let s = engine
        .sessions()
        .create(CreateSession::default())
        .expect("session")
        .id;
    (engine, s)
}

fn edit(engine: &runcell_engine::Engine, session: &str, args: Value) -> ToolOutput {
    run(engine, session, "text_editor", args)
}

#[test]
fn text_editor_views_creates_replaces_and_inserts() {
    let (engine, s) = engine_and_session();

    let out = edit(
        &engine,
        &s,
        json!({"command": "create", "path": "/workspace/src/app.py", "file_text": "a = 1\nb = 2\nc = 3\n"}),
    );
    assert!(!out.is_error, "{}", out.text);
    assert!(out.text.contains("created src/app.py"), "{}", out.text);
    assert_eq!(
        engine.read_file(&s, "src/app.py").expect("read"),
        b"a = 1\nb = 2\nc = 3\n"
    );

    // view: numbered lines, a range, a directory.
    let out = edit(
        &engine,
        &s,
        json!({"command": "view", "path": "src/app.py"}),
    );
    assert!(
        out.text
            .contains("     1\ta = 1\n     2\tb = 2\n     3\tc = 3\n"),
        "{}",
        out.text
    );
    let out = edit(
        &engine,
        &s,
        json!({"command": "view", "path": "/mnt/data/src/app.py", "view_range": [2, -1]}),
    );
    assert!(
        out.text.contains("     2\tb = 2\n     3\tc = 3\n"),
        "{}",
        out.text
    );
    assert!(!out.text.contains("a = 1"), "{}", out.text);
    let out = edit(
        &engine,
        &s,
        json!({"command": "view", "path": "src/app.py", "view_range": [5, 6]}),
    );
    assert!(
        out.is_error && out.text.contains("invalid view_range"),
        "{}",
        out.text
    );
    let out = edit(
        &engine,
        &s,
        json!({"command": "view", "path": "/workspace"}),
    );
    assert!(out.text.contains("- src/app.py (18 bytes"), "{}", out.text);
    let out = edit(&engine, &s, json!({"command": "view", "path": "src"}));
    assert!(out.text.contains("src/app.py"), "{}", out.text);

    // str_replace: exactly one occurrence.
    let out = edit(
        &engine,
        &s,
        json!({"command": "str_replace", "path": "src/app.py", "old_str": "b = 2", "new_str": "b = 20"}),
    );
    assert!(!out.is_error, "{}", out.text);
    assert!(out.text.contains("     2\tb = 20"), "{}", out.text);
    let out = edit(
        &engine,
        &s,
        json!({"command": "str_replace", "path": "src/app.py", "old_str": "zzz", "new_str": "y"}),
    );
    assert!(
        out.is_error && out.text.contains("did not appear verbatim"),
        "{}",
        out.text
    );
    let out = edit(
        &engine,
        &s,
        json!({"command": "str_replace", "path": "src/app.py", "old_str": " = ", "new_str": "="}),
    );
    assert!(out.is_error, "{}", out.text);
    assert!(
        out.text.contains("occurs 3 times") && out.text.contains("lines 1, 2, 3"),
        "{}",
        out.text
    );

    // insert: after a line, at the top, out of range.
    let out = edit(
        &engine,
        &s,
        json!({"command": "insert", "path": "src/app.py", "insert_line": 1, "new_str": "# one\n"}),
    );
    assert!(!out.is_error, "{}", out.text);
    let out = edit(
        &engine,
        &s,
        json!({"command": "insert", "path": "src/app.py", "insert_line": 0, "new_str": "# top"}),
    );
    assert!(!out.is_error, "{}", out.text);
    assert_eq!(
        String::from_utf8(engine.read_file(&s, "src/app.py").expect("read")).expect("utf-8"),
        "# top\na = 1\n# one\nb = 20\nc = 3\n"
    );
    let out = edit(
        &engine,
        &s,
        json!({"command": "insert", "path": "src/app.py", "insert_line": 9, "new_str": "x"}),
    );
    assert!(
        out.is_error && out.text.contains("invalid insert_line 9"),
        "{}",
        out.text
    );

    // The python tool sees the edited file.
    let out = run(
        &engine,
        &s,
        "python",
        json!({"code": "print(open('src/app.py').read().count('\\n'))"}),
    );
    assert!(out.text.contains("stdout:\n5\n"), "{}", out.text);

    // Missing files, unknown commands, missing arguments.
    let out = edit(&engine, &s, json!({"command": "view", "path": "nope.txt"}));
    assert!(
        out.is_error && out.text.contains("nope.txt does not exist"),
        "{}",
        out.text
    );
    let out = edit(
        &engine,
        &s,
        json!({"command": "undo_edit", "path": "src/app.py"}),
    );
    assert!(
        out.is_error && out.text.contains("unknown command"),
        "{}",
        out.text
    );
    let out = edit(&engine, &s, json!({"command": "create", "path": "x.txt"}));
    assert!(
        out.is_error && out.text.contains("file_text"),
        "{}",
        out.text
    );
}

#[test]
fn text_editor_stays_in_the_workspace() {
    let (engine, s) = engine_and_session();
    for path in [
        "/etc/passwd",
        "../../etc/passwd",
        "/workspace/../etc/passwd",
        "/tmp/x",
    ] {
        let out = edit(&engine, &s, json!({"command": "view", "path": path}));
        assert!(out.is_error, "{path}: {}", out.text);
        let out = edit(
            &engine,
            &s,
            json!({"command": "create", "path": path, "file_text": "x"}),
        );
        assert!(out.is_error, "{path}: {}", out.text);
    }
    let out = edit(
        &engine,
        &s,
        json!({"command": "view", "path": "/etc/passwd"}),
    );
    assert!(out.text.contains("outside /workspace"), "{}", out.text);
    // A symlink planted by code is not followed.
    let out = run(
        &engine,
        &s,
        "bash",
        json!({"command": "ln -s /etc/passwd link && echo ok"}),
    );
    assert!(!out.is_error, "{}", out.text);
    let out = edit(&engine, &s, json!({"command": "view", "path": "link"}));
    assert!(out.is_error, "{}", out.text);
    assert!(!out.text.contains("root:"), "{}", out.text);
    let out = edit(
        &engine,
        &s,
        json!({"command": "str_replace", "path": "link", "old_str": "root", "new_str": "x"}),
    );
    assert!(out.is_error && !out.text.contains("root:"), "{}", out.text);
}

#[test]
fn python_and_bash_results_are_written_for_a_model() {
    let (engine, s) = engine_and_session();

    let out = run(
        &engine,
        &s,
        "python",
        json!({"code": "import sys\nprint('out')\nprint('err', file=sys.stderr)\nopen('r.txt','w').write('hello')\n6*7"}),
    );
    assert!(!out.is_error, "{}", out.text);
    for part in [
        "stdout:\nout\n",
        "stderr:\nerr\n",
        "result:\n42\n",
        "files:\n- r.txt (5 bytes, text/plain, created)",
    ] {
        assert!(out.text.contains(part), "{part:?} in {}", out.text);
    }
    let structured = out.structured.expect("the Execution");
    assert_eq!(structured["status"], "ok");
    assert_eq!(structured["session_id"], s.as_str());

    let out = run(
        &engine,
        &s,
        "python",
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"}),
    );
    assert_eq!(out.images.len(), 1, "{}", out.text);
    let png = base64::engine::general_purpose::STANDARD
        .decode(&out.images[0].data_base64)
        .expect("base64");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    assert!(
        out.text.contains("images: 1 PNG image attached"),
        "{}",
        out.text
    );

    let out = run(&engine, &s, "python", json!({"code": "1/0"}));
    assert!(out.is_error);
    assert!(
        out.text
            .contains("error:\nZeroDivisionError: division by zero\nTraceback"),
        "{}",
        out.text
    );
    assert!(out.text.contains("status: error"), "{}", out.text);

    let out = run(
        &engine,
        &s,
        "python",
        json!({"code": "print('x' * 50_000)"}),
    );
    assert!(
        out.text.contains("bytes truncated …]"),
        "{}",
        out.text.len()
    );
    assert!(out.text.len() < 25_000, "{}", out.text.len());

    let out = run(
        &engine,
        &s,
        "bash",
        json!({"command": "cat r.txt; echo; echo oops >&2; exit 3"}),
    );
    assert!(out.is_error);
    assert!(
        out.text.contains("stdout:\nhello\n") && out.text.contains("stderr:\noops\n"),
        "{}",
        out.text
    );
    assert!(out.text.contains("exit_code: 3"), "{}", out.text);
    assert_eq!(out.structured.expect("output")["exit_code"], 3);
}
