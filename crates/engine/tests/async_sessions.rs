//! `SessionManager::execute_async`: cells run on the caller's task (what the HTTP API does),
//! in order with the worker's queued jobs, with the same interrupts, kills, restarts and
//! session ends as the synchronous path.

mod common;

use std::time::{Duration, Instant};

use common::{create, main_text};
use runcell_engine::{CancelToken, EngineError, Execution, ExecutionStatus, KilledBy};

/// Spawns `code` as the HTTP API does: a task of its own that runs to its end.
fn spawn(
    engine: &runcell_engine::Engine,
    id: &str,
    code: &str,
    timeout: Option<Duration>,
    cancel: CancelToken,
) -> tokio::task::JoinHandle<Result<Execution, EngineError>> {
    let run = engine
        .sessions()
        .execute_async(id, code.to_owned(), timeout, cancel)
        .expect("accepted");
    tokio::spawn(run)
}

async fn run(engine: &runcell_engine::Engine, id: &str, code: &str) -> Execution {
    spawn(engine, id, code, None, CancelToken::new())
        .await
        .expect("task")
        .expect("execute")
}

/// [`run`] with a timeout of `seconds`.
async fn run_for(engine: &runcell_engine::Engine, id: &str, code: &str, seconds: u64) -> Execution {
    spawn(
        engine,
        id,
        code,
        Some(Duration::from_secs(seconds)),
        CancelToken::new(),
    )
    .await
    .expect("task")
    .expect("execute")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cells_run_in_order_with_output_errors_and_files() {
    let engine = common::engine();
    let id = create(&engine);
    let first = run(&engine, &id, "log = []\nimport sys\nprint('out'); print('err', file=sys.stderr)\nopen('f.txt', 'w').write('x')\n1+1").await;
    assert_eq!(first.status, ExecutionStatus::Ok, "{first:?}");
    assert_eq!(
        (first.stdout.as_str(), first.stderr.as_str()),
        ("out\n", "err\n")
    );
    assert_eq!(main_text(&first), "2");
    assert_eq!(first.files.len(), 1, "{:?}", first.files);
    // Behind a running cell, cells wait and then run one at a time, in the order they began
    // to wait; a synchronous caller's cell (run by the worker thread) shares the same kernel.
    let blocker = spawn(
        &engine,
        &id,
        "import time\ntime.sleep(2)",
        None,
        CancelToken::new(),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut handles = Vec::new();
    for i in 0..6 {
        handles.push(spawn(
            &engine,
            &id,
            &format!("log.append({i}); len(log)"),
            None,
            CancelToken::new(),
        ));
        // Each begins to wait before the next is spawned (the blocker runs 2 s).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sync = {
        let (engine, id) = (engine.clone(), id.clone());
        tokio::task::spawn_blocking(move || {
            engine
                .sessions()
                .execute(&id, "log.append('sync')", None, None)
        })
    };
    blocker.await.expect("task").expect("blocker");
    for (i, h) in handles.into_iter().enumerate() {
        let e = h.await.expect("task").expect("execute");
        assert_eq!(main_text(&e), (i + 1).to_string());
        assert_eq!(e.execution_count, i as u64 + 3);
    }
    sync.await.expect("task").expect("sync execute");
    let log = run(&engine, &id, "log").await;
    assert_eq!(main_text(&log), "[0, 1, 2, 3, 4, 5, 'sync']");
    // A cell bigger than the channel's buffer (~200 KiB), near the 1 MiB code cap: the task
    // waits for the kernel to read it.
    let big = format!("s = '{}'\nlen(s)", "a".repeat(1_000_000));
    assert_eq!(main_text(&run(&engine, &id, &big).await), "1000000");
    let err = run(&engine, &id, "1/0").await;
    assert_eq!(err.status, ExecutionStatus::Error);
    assert_eq!(
        err.error.as_ref().map(|e| e.name.as_str()),
        Some("ZeroDivisionError")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_cell_called_off_is_skipped_and_a_running_one_interrupted() {
    let engine = common::engine();
    let id = create(&engine);
    run(&engine, &id, "x = 'kept'").await;
    let (slow_token, queued_token) = (CancelToken::new(), CancelToken::new());
    let slow = spawn(
        &engine,
        &id,
        "import time\ntime.sleep(30)",
        None,
        slow_token.clone(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = spawn(&engine, &id, "x = 'changed'", None, queued_token.clone());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Calling off the queued one leaves the running one alone...
    engine.sessions().cancel(&id, &queued_token);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !slow.is_finished(),
        "the running cell was interrupted by someone else's cancel"
    );
    // ...and calling off the running one interrupts it.
    let started = Instant::now();
    engine.sessions().cancel(&id, &slow_token);
    let e = slow
        .await
        .expect("task")
        .expect("interrupted, not an error");
    assert_eq!(e.status, ExecutionStatus::Interrupted, "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(matches!(
        queued.await.expect("task"),
        Err(EngineError::Cancelled)
    ));
    assert_eq!(main_text(&run(&engine, &id, "x").await), "'kept'");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_kills_and_restarts() {
    let engine = common::engine();
    let id = create(&engine);
    run(&engine, &id, "x = 1").await;
    // The deadline interrupts; the state is kept.
    let e = run_for(&engine, &id, "import time\ntime.sleep(60)", 1).await;
    assert_eq!(e.status, ExecutionStatus::Timeout, "{e:?}");
    assert_eq!(main_text(&run(&engine, &id, "x").await), "1");
    // A cell that ignores the interrupt is killed, and the session restarts at once.
    let e = run_for(
        &engine,
        &id,
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)",
        1,
    )
    .await;
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    assert_eq!(e.usage.killed_by, Some(KilledBy::Timeout));
    // A kernel that exits by itself: the same.
    let e = run(&engine, &id, "import os\nos._exit(3)").await;
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    let after = run(&engine, &id, "'x' in globals()").await;
    assert_eq!(after.status, ExecutionStatus::Ok, "{after:?}");
    assert_eq!(main_text(&after), "False", "a fresh kernel");
    // A flood past the output bound is cut at the cap.
    let flood = run(&engine, &id, "print('y' * 3_000_000)").await;
    assert!(flood.truncated.stdout, "{:?}", flood.truncated);
    assert!(flood.stdout.len() < 2_200_000, "{}", flood.stdout.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_is_busy_and_a_deleted_session_ends_its_cells() {
    let engine = common::engine();
    let id = create(&engine);
    let running = spawn(
        &engine,
        &id,
        "import time\ntime.sleep(30)",
        None,
        CancelToken::new(),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued: Vec<_> = (0..runcell_engine::QUEUE_DEPTH)
        .map(|_| spawn(&engine, &id, "1", None, CancelToken::new()))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    match engine
        .sessions()
        .execute_async(&id, "1".into(), None, CancelToken::new())
    {
        Err(EngineError::SessionBusy(_)) => {}
        Err(e) => panic!("expected busy, got {e}"),
        Ok(_) => panic!("expected busy, got accepted"),
    }
    let started = Instant::now();
    {
        let (engine, id) = (engine.clone(), id.clone());
        tokio::task::spawn_blocking(move || engine.sessions().delete(&id))
            .await
            .expect("task")
            .expect("delete");
    }
    let e = running
        .await
        .expect("task")
        .expect("the running cell is reported");
    assert_eq!(e.status, ExecutionStatus::Killed, "{e:?}");
    for q in queued {
        assert!(
            matches!(
                q.await.expect("task"),
                Err(EngineError::SessionEnded(runcell_engine::Ended {
                    during_execution: true,
                    ..
                }))
            ),
            "a queued cell of a deleted session"
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let ws = engine.workspace_path(&id);
    assert!(!ws.exists(), "the workspace is gone");
    assert!(matches!(
        engine
            .sessions()
            .execute_async(&id, "1".into(), None, CancelToken::new()),
        Err(EngineError::NotFound(_))
    ));
    // The limit counted only waiting cells: a new session takes executions again.
    let other = create(&engine);
    assert_eq!(main_text(&run(&engine, &other, "6*7").await), "42");
}
