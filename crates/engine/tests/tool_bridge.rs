//! The tool bridge (bridge.rs) on a real Python session: calls from a cell reach the dispatch
//! point and come back as values or exceptions; the broker's refusals happen before any
//! dispatcher sees the call.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::create;
use runcell_engine::bridge::{
    ExecTools, ToolCall, ToolDispatch, ToolError, ToolErrorKind, ToolFuture, ToolSpec,
};
use runcell_engine::{CancelToken, Execution, ExecutionStatus};
use serde_json::{json, Value};

/// Answers `echo` with its input, fails `fail`, never answers `hang`; counts what it saw.
#[derive(Default)]
struct Echo {
    seen: AtomicUsize,
    names: std::sync::Mutex<Vec<String>>,
}

impl ToolDispatch for Echo {
    fn call(&self, call: ToolCall) -> ToolFuture {
        self.seen.fetch_add(1, Ordering::SeqCst);
        self.names.lock().expect("names").push(call.name.clone());
        assert!(
            call.id.starts_with("call_") && call.id.len() == 37,
            "{}",
            call.id
        );
        Box::pin(async move {
            match call.name.as_str() {
                "echo" => Ok(json!({"echo": call.input})),
                "fail" => Err(ToolError::new(ToolErrorKind::Error, "boom: no such record")),
                _ => std::future::pending().await,
            }
        })
    }
}

fn spec(name: &str, schema: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("the {name} tool"),
        input_schema: schema,
    }
}

fn tools(dispatch: Arc<Echo>, timeout: Duration) -> ExecTools {
    let id_schema = json!({"type": "object", "properties": {"id": {"type": "integer", "minimum": 0}}, "required": ["id"], "additionalProperties": false});
    ExecTools {
        specs: vec![
            spec("echo", id_schema.clone()),
            spec("fail", json!({"type": "object"})),
            spec("hang", json!({"type": "object"})),
        ],
        client: Some(dispatch),
        mcp: None,
        mcp_specs: Vec::new(),
        call_timeout: timeout,
        runtime: tokio::runtime::Handle::current(),
    }
}

async fn run(engine: &runcell_engine::Engine, id: &str, code: &str, t: ExecTools) -> Execution {
    let run = engine
        .sessions()
        .execute_async_with_tools(id, code.to_owned(), None, CancelToken::new(), Some(t))
        .expect("accepted");
    tokio::spawn(run).await.expect("task").expect("execute")
}

const LOOP_AND_GATHER: &str = r#"
import asyncio
from runcell_tools import echo
total = sum(echo(id=i)["echo"]["id"] for i in range(50))
async def many():
    return await asyncio.gather(*(echo(id=i) for i in range(20)))
got = asyncio.run(many())
print(total, [g["echo"]["id"] for g in got] == list(range(20)))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_calls_tools_in_a_loop_and_concurrently() {
    let engine = common::engine();
    let id = create(&engine);
    let echo = Arc::new(Echo::default());
    let e = run(
        &engine,
        &id,
        LOOP_AND_GATHER,
        tools(echo.clone(), Duration::from_secs(60)),
    )
    .await;
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    assert_eq!(e.stdout, "1225 True\n");
    assert_eq!(echo.seen.load(Ordering::SeqCst), 70);
    assert_eq!(e.tool_calls.len(), 70);
    let first = &e.tool_calls[0];
    assert_eq!(
        (first.name.as_str(), &first.input),
        ("echo", &json!({"id": 0}))
    );
    assert_eq!(first.output_bytes, r#"{"echo":{"id":0}}"#.len() as u64);
    assert!(e.tool_calls.iter().all(|c| c.error.is_none()));
    let mut ids: Vec<_> = e.tool_calls.iter().map(|c| c.id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 70, "every call has its own id");

    // The same on the worker thread's path (what NDJSON streaming uses).
    let engine2: runcell_engine::Engine = (*engine).clone();
    let id2 = id.clone();
    let t = tools(echo.clone(), Duration::from_secs(60));
    let e = tokio::task::spawn_blocking(move || {
        engine2.sessions().execute_with_tools(
            &id2,
            LOOP_AND_GATHER,
            None,
            None,
            CancelToken::new(),
            Some(t),
        )
    })
    .await
    .expect("task")
    .expect("execute");
    assert_eq!(e.stdout, "1225 True\n", "{e:?}");
    assert_eq!(e.tool_calls.len(), 70);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_exceptions_and_refusals_reach_no_dispatcher() {
    let engine = common::engine();
    let id = create(&engine);
    let echo = Arc::new(Echo::default());
    let code = r#"
import runcell_tools
from runcell_tools import echo, fail, hang
out = []
for f, kw in ((fail, {}), (hang, {}), (echo, {"id": "3"}), (echo, {"id": -1}), (echo, {}), (echo, {"id": 1, "x": 2})):
    try:
        f(**kw)
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
try:
    runcell_tools._call("secret", {})
except runcell_tools.ToolRefused as exc:
    out.append(f"refused: {exc}")
try:
    from runcell_tools import secret
except ImportError as exc:
    out.append("import: no secret")
print("\n".join(out))
"#;
    let e = run(
        &engine,
        &id,
        code,
        tools(echo.clone(), Duration::from_secs(1)),
    )
    .await;
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    assert_eq!(
        e.stdout,
        "ToolError: boom: no such record\n\
         ToolTimeout: no answer to hang within 1 s\n\
         TypeError: echo(): 'id' must be integer, not string\n\
         ValueError: echo(): 'id' must be ≥ 0, got -1\n\
         TypeError: echo(): arguments is missing the required field 'id'\n\
         TypeError: echo(): arguments has an unexpected field 'x'\n\
         refused: \"secret\" is not a tool declared for this execution\n\
         import: no secret\n"
    );
    // Arguments the schema refused never left the sandbox; `secret` reached no dispatcher.
    assert_eq!(*echo.names.lock().expect("names"), ["fail", "hang"]);
    let errors: Vec<_> = e
        .tool_calls
        .iter()
        .map(|c| (c.name.as_str(), c.error.clone()))
        .collect();
    assert_eq!(
        errors,
        [
            ("fail", Some("error: boom: no such record".into())),
            ("hang", Some("timeout: no answer to hang within 1 s".into())),
            (
                "secret",
                Some("refused: \"secret\" is not a tool declared for this execution".into())
            ),
        ]
    );
    // Without tools, a call is refused at once; the kernel's next cell is unaffected.
    let run_plain = engine
        .sessions()
        .execute_async(&id, "import runcell_tools\ntry:\n    runcell_tools._call('echo', {})\nexcept runcell_tools.ToolRefused as e:\n    print(e)".into(), None, CancelToken::new())
        .expect("accepted");
    let e = tokio::spawn(run_plain)
        .await
        .expect("task")
        .expect("execute");
    assert_eq!(
        e.stdout, "no tools were declared for this execution: \"echo\" cannot be called\n",
        "{e:?}"
    );
    assert_eq!(echo.seen.load(Ordering::SeqCst), 2);
}
