//! A cell's code runs in its kernel's own process, so it can write to the kernel's channel
//! (fd 3) and close or replace its output descriptors. What it forges there stays its own
//! output: every execution is recorded with the host's count, a broken frame ends the
//! kernel with a clear error and a restart, and what a cell prints after a forged end never
//! reaches the next cell. Positive controls: honest cells around the forged ones.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{create, main_text};
use runcell_engine::{ExecEvent, Execution, ExecutionStatus};

fn exec(engine: &runcell_engine::Engine, id: &str, code: &str) -> Execution {
    engine
        .sessions()
        .execute(id, code, None, None)
        .expect("every execution that started is answered and recorded")
}

/// Python that writes frames onto the kernel's channel, as the kernel does, and finds the
/// running cell's id in the kernel's memory.
const FORGE: &str = r#"
import gc, json, os, struct
def frame(msg):
    body = json.dumps(msg).encode()
    data = memoryview(struct.pack('>I', len(body)) + body)
    while data:
        data = data[os.write(3, data):]
def current_id():
    return next(o for o in gc.get_objects() if type(o).__name__ == 'Kernel' and hasattr(o, 'current_id')).current_id
"#;

#[test]
fn a_garbage_frame_is_a_recorded_protocol_error_with_its_side_effects_and_a_restart() {
    let engine = common::engine();
    let id = create(&engine);
    assert_eq!(exec(&engine, &id, "x = 1").status, ExecutionStatus::Ok);
    let e = exec(
        &engine,
        &id,
        "open('side.txt', 'w').write('s')\nimport os, time\nos.write(3, b'\\x00\\x00\\x00\\x01x')\ntime.sleep(30)",
    );
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    assert_eq!(e.execution_count, 2);
    let err = e.error.as_ref().expect("error");
    assert_eq!(err.name, "ProtocolError");
    assert!(
        err.value.contains("malformed frame") && err.value.contains("The session was restarted"),
        "{}",
        err.value
    );
    assert!(e.usage.wall_ms < 10_000, "killed at once");
    assert!(
        e.files.iter().any(|f| f.path == "side.txt"),
        "its side effects are in its record: {:?}",
        e.files
    );
    // Restarted: the state is gone, the count starts again, and the kernel works.
    let next = exec(&engine, &id, "print('fine'); 'x' in dir()");
    assert_eq!(next.status, ExecutionStatus::Ok, "{next:?}");
    assert_eq!(next.stdout, "fine\n");
    assert_eq!(main_text(&next), "False");
    assert_eq!(next.execution_count, 1);
}

#[test]
fn a_forged_done_ends_its_own_cell_with_the_hosts_count_and_its_tail_is_no_cells() {
    let engine = common::engine();
    let id = create(&engine);
    assert_eq!(exec(&engine, &id, FORGE).execution_count, 1);
    let e = exec(
        &engine,
        &id,
        "y = 7\nframe({'type': 'done', 'id': current_id(), 'status': 'ok', 'execution_count': 99})\nprint('after')",
    );
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    assert_eq!(e.execution_count, 2, "the host counts, not the kernel");
    // The forging cell's real end comes while no cell runs: it and what the cell printed
    // after its forged end are dropped before the next cell is sent.
    std::thread::sleep(Duration::from_millis(300));
    let next = exec(&engine, &id, "print('next'); y");
    assert_eq!(next.status, ExecutionStatus::Ok, "{next:?}");
    assert_eq!(next.stdout, "next\n", "{next:?}");
    assert_eq!(main_text(&next), "7", "the kernel and its state live on");
    assert_eq!(next.execution_count, 3);
}

#[test]
fn output_after_a_forged_done_never_reaches_the_next_cell_even_while_it_runs() {
    let engine = common::engine();
    let id = create(&engine);
    exec(&engine, &id, FORGE);
    let e = exec(
        &engine,
        &id,
        "frame({'type': 'done', 'id': current_id(), 'status': 'ok', 'execution_count': 99})\nimport time\ntime.sleep(0.5)\nprint('after', flush=True)\ndisplay('late display')",
    );
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    assert!(e.usage.wall_ms < 450, "ended by its forged done");
    // Sent while the forging cell still runs: its tail comes during this cell.
    let streamed = Arc::new(Mutex::new(String::new()));
    let sink = streamed.clone();
    let next = engine
        .sessions()
        .execute(
            &id,
            "print('next')",
            None,
            Some(Box::new(move |ev: ExecEvent<'_>| {
                if let ExecEvent::Stdout(s) = ev {
                    sink.lock().expect("lock").push_str(s)
                }
            })),
        )
        .expect("recorded");
    // Streamed too: output is held until the kernel says the cell began.
    let streamed = streamed.lock().expect("lock").clone();
    assert_eq!(streamed, "", "{next:?}");
    assert!(!next.stdout.contains("after"), "{next:?}");
    assert!(!format!("{:?}", next.results).contains("late display"));
    assert_eq!(next.status, ExecutionStatus::Killed, "{next:?}");
    let err = next.error.as_ref().expect("error");
    assert_eq!(err.name, "ProtocolError");
    assert!(
        err.value.contains("forged its end") && err.value.contains("The session was restarted"),
        "{}",
        err.value
    );
    let after = exec(&engine, &id, "print('works')");
    assert_eq!(after.stdout, "works\n");
    assert_eq!(after.status, ExecutionStatus::Ok);
}

#[test]
fn frames_naming_another_cell_are_not_this_cells_output() {
    let engine = common::engine();
    let id = create(&engine);
    exec(&engine, &id, FORGE);
    // A display for another id is dropped; the cell's own display is kept.
    let e = exec(
        &engine,
        &id,
        "frame({'type': 'display', 'id': 'ex_other', 'data': {'text/plain': 'forged'}})\ndisplay('mine')\n1",
    );
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    let texts: Vec<_> = e
        .results
        .iter()
        .filter_map(|r| r.data.get("text/plain").cloned())
        .collect();
    assert_eq!(texts, ["'mine'", "1"]);
    // An end for an execution that is not running breaks the protocol.
    let e = exec(
        &engine,
        &id,
        "frame({'type': 'done', 'id': 'ex_other', 'status': 'ok', 'execution_count': 5})\nimport time\ntime.sleep(30)",
    );
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    let err = e.error.expect("error");
    assert!(
        err.name == "ProtocolError" && err.value.contains("\"ex_other\""),
        "{err:?}"
    );
    assert_eq!(exec(&engine, &id, "print(2)").stdout, "2\n");
}

#[test]
fn closing_stdout_and_stderr_lasts_one_cell() {
    let engine = common::engine();
    let id = create(&engine);
    let e = exec(&engine, &id, "import os\nos.close(1)\nos.close(2)");
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    let e = exec(
        &engine,
        &id,
        "import sys, subprocess\nprint('out')\nprint('err', file=sys.stderr)\nsubprocess.run(['echo', 'child'])",
    );
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    assert_eq!(e.stdout, "out\nchild\n");
    assert_eq!(e.stderr, "err\n");
    // Replaced rather than closed: fd 1 onto a file, for one cell.
    let e = exec(
        &engine,
        &id,
        "import os\nf = os.open('redirected.txt', os.O_WRONLY | os.O_CREAT)\nos.dup2(f, 1)\nos.dup2(f, 2)",
    );
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    let e = exec(&engine, &id, "print('back')");
    assert_eq!(e.stdout, "back\n", "{e:?}");
}

#[test]
fn closing_stdout_and_stderr_in_a_bash_cell_lasts_one_cell() {
    let engine = common::engine();
    let id = engine
        .sessions()
        .create(runcell_engine::CreateSession {
            language: Some(runcell_engine::Language::Bash),
            ..Default::default()
        })
        .expect("bash session")
        .id;
    let e = exec(&engine, &id, "exec 1>&- 2>&-");
    assert_eq!(e.status, ExecutionStatus::Ok, "{e:?}");
    let e = exec(&engine, &id, "echo out; echo err >&2; x=1");
    assert_eq!(
        (e.stdout.as_str(), e.stderr.as_str()),
        ("out\n", "err\n"),
        "{e:?}"
    );
    let e = exec(&engine, &id, "exec >redirected.txt; echo hidden");
    assert_eq!(e.stdout, "", "{e:?}");
    let e = exec(&engine, &id, "echo $x; cat redirected.txt");
    assert_eq!(e.stdout, "1\nhidden\n", "{e:?}");
}

#[test]
fn streamed_output_still_streams_while_the_cell_runs() {
    let engine = common::engine();
    let id = create(&engine);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let session = id.clone();
    let engine2: runcell_engine::Engine = (*engine).clone();
    let worker = std::thread::spawn(move || {
        engine2
            .sessions()
            .execute(
                &session,
                "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')",
                None,
                Some(Box::new(move |ev: ExecEvent<'_>| {
                    if let ExecEvent::Stdout(s) = ev {
                        let _ = tx.send(s.to_owned());
                    }
                })),
            )
            .expect("execute")
    });
    let first = rx
        .recv_timeout(Duration::from_millis(1500))
        .expect("streamed before the end");
    assert_eq!(first, "first\n");
    let e = worker.join().expect("worker");
    assert_eq!(e.stdout, "first\nsecond\n");
}
