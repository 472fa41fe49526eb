//! The audit writer: sessions' finished executions are recorded by one thread, in batches,
//! and each one's reply is sent only once the batch holding it is recorded.
//!
//! A session's worker used to record its execution itself and only then take its next job.
//! Under load that made every commit a batch of about one row: the first worker to arrive
//! committed at once, and each commit wrote the same four or five pages (the table's last
//! leaf, two index leaves, the chain head) for one row. Handing the execution to this thread
//! instead lets the worker run the session's next queued cell while the store commits, and
//! whatever finishes meanwhile, from any session, shares the next commit.
//!
//! What a caller sees is unchanged: its reply still comes only after its execution is
//! recorded (DESIGN.md §9), or is an error saying it could not be. Executions are recorded in
//! the order they are handed over, so a session's cells keep their order in the chain.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::error::RecordError;
use crate::{EngineError, Execution};

/// Receives the outcome of a queued execution, on the session's worker thread or the audit
/// writer's (so it must be quick: hand the result over, e.g. through a channel). Dropped
/// uncalled if the session ends before running the execution.
pub(crate) type Reply = Box<dyn FnOnce(Result<Execution, EngineError>) + Send>;

/// Receives every finished execution with its code and owner before anyone sees the result
/// (the store's chains, `records.rs`). An error fails the execution's reply: nothing is
/// acknowledged that was not recorded.
pub(crate) trait AuditSink: Send + Sync {
    fn record(&self, owner: &str, execution: &Execution, code: &str) -> Result<(), RecordError>;

    /// Records several executions, in order, sharing one commit where the store can; one
    /// result per item, in order. Sessions' executions come this way, from one writer thread.
    fn record_batch(&self, items: &[AuditItem<'_>]) -> Vec<Result<(), RecordError>> {
        items
            .iter()
            .map(|i| self.record(i.owner, i.execution, i.code))
            .collect()
    }
}

/// One execution for [`AuditSink::record_batch`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct AuditItem<'a> {
    pub(crate) owner: &'a str,
    pub(crate) execution: &'a Execution,
    pub(crate) code: &'a str,
}

/// Finished executions waiting for the writer at most; a worker that finds the queue full
/// waits, so a store slower than the sessions slows them down instead of piling up memory.
const QUEUE: usize = 1024;
/// Executions in one commit at most.
const MAX_BATCH: usize = 256;
/// How long the writer waits at most for more executions (see [`Linger`]).
const LINGER: Duration = Duration::from_millis(1);
/// A batch this large is committed without waiting for more.
const LINGER_BATCH: usize = 32;

struct Pending {
    owner: String,
    code: String,
    execution: Execution,
    then: Reply,
}

/// The writer thread and the queue to it. Dropping it records what is queued, then joins.
pub(crate) struct Auditor {
    queue: Option<SyncSender<Pending>>,
    thread: Option<JoinHandle<()>>,
}

impl Auditor {
    pub(crate) fn start(
        sink: Arc<dyn AuditSink>,
        running: Arc<AtomicUsize>,
    ) -> Result<Auditor, EngineError> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let thread = thread::Builder::new()
            .name("runcell-audit".into())
            .spawn(move || write(&*sink, rx, &running))
            .map_err(|source| EngineError::NoThread {
                thread: "the audit writer",
                source,
            })?;
        Ok(Auditor {
            queue: Some(tx),
            thread: Some(thread),
        })
    }

    /// Queues `execution` for recording; `then` gets it back once it is recorded.
    pub(crate) fn record(&self, owner: String, execution: Execution, code: String, then: Reply) {
        let Some(queue) = &self.queue else {
            return then(Err(writer_gone()));
        };
        let pending = Pending {
            owner,
            code,
            execution,
            then,
        };
        // Try first: a full queue is rare, and blocking on it is the backpressure.
        let sent = match queue.try_send(pending) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(p)) => queue.send(p).map_err(|e| e.0),
            Err(TrySendError::Disconnected(p)) => Err(p),
        };
        if let Err(p) = sent {
            (p.then)(Err(writer_gone()));
        }
    }
}

impl Drop for Auditor {
    fn drop(&mut self) {
        // Closing the queue ends the thread once it has recorded what was queued.
        self.queue = None;
        if let Some(t) = self.thread.take() {
            if t.thread().id() != thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// Whether the writer waits for more executions before committing.
///
/// A commit costs about the same for one row as for ten (the same few pages are written), so
/// under load it pays to wait for the cells that are about to finish: with 16 busy sessions,
/// waiting up to [`LINGER`] made batches of ~6 rows instead of ~1.5 and raised throughput by
/// 4-10% (docs/benchmarks.md). It only pays when executions finish close together. A session
/// running `1+1` after `1+1` next to another stuck in a long cell would otherwise wait the
/// whole [`LINGER`] every time for nothing, so waiting stops after a wait that brought no row,
/// and resumes once executions arrive together again (a batch of two or more unwaited).
#[derive(Debug)]
struct Linger {
    on: bool,
}

impl Default for Linger {
    fn default() -> Self {
        Linger { on: true }
    }
}

impl Linger {
    /// Whether to wait, with `queued` executions taken so far and `running` cells running.
    fn wanted(&mut self, queued: usize, running: usize) -> bool {
        if queued >= 2 {
            self.on = true;
        }
        self.on && running > 0 && queued < LINGER_BATCH
    }

    /// After a wait: whether it brought anything.
    fn waited(&mut self, gained: bool) {
        self.on = gained;
    }
}

fn writer_gone() -> EngineError {
    RecordError::WriterStopped.into()
}

/// The writer thread: takes what is queued (waiting for the first), records it in one call
/// and answers each.
fn write(sink: &dyn AuditSink, queue: Receiver<Pending>, running: &AtomicUsize) {
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH);
    let mut linger = Linger::default();
    while let Ok(first) = queue.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        if linger.wanted(batch.len(), running.load(Ordering::Relaxed)) {
            let (before, until) = (batch.len(), Instant::now() + LINGER);
            while batch.len() < LINGER_BATCH && running.load(Ordering::Relaxed) > 0 {
                let left = until.saturating_duration_since(Instant::now());
                match queue.recv_timeout(left) {
                    Ok(p) => batch.push(p),
                    Err(_) => break,
                }
            }
            linger.waited(batch.len() > before);
        }
        let items: Vec<AuditItem<'_>> = batch
            .iter()
            .map(|p| AuditItem {
                owner: &p.owner,
                execution: &p.execution,
                code: &p.code,
            })
            .collect();
        // A sink that panics fails its batch, not the writer (which would fail every later
        // execution).
        let results = panic::catch_unwind(AssertUnwindSafe(|| sink.record_batch(&items)))
            .unwrap_or_else(|_| vec![Err(RecordError::Panicked); items.len()]);
        drop(items);
        let mut results = results.into_iter();
        for p in batch.drain(..) {
            let result = match results.next() {
                Some(Ok(())) => Ok(p.execution),
                Some(Err(e)) => Err(e.into()),
                None => Err(RecordError::NoAnswer.into()),
            };
            (p.then)(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    /// Records ids and batch sizes; fails ids starting with "bad"; can be held shut.
    #[derive(Default)]
    struct Sink {
        recorded: Mutex<Vec<String>>,
        batches: Mutex<Vec<usize>>,
        shut: Mutex<bool>,
        opened: Condvar,
        /// Batches that reached the sink (recorded or held at the shut door).
        entered: AtomicUsize,
    }

    impl Sink {
        fn open(&self) {
            *self.shut.lock().expect("lock") = false;
            self.opened.notify_all();
        }
    }

    impl AuditSink for Sink {
        fn record(&self, _: &str, _: &Execution, _: &str) -> Result<(), RecordError> {
            unreachable!("the writer records in batches")
        }

        fn record_batch(&self, items: &[AuditItem<'_>]) -> Vec<Result<(), RecordError>> {
            self.entered.fetch_add(1, Ordering::SeqCst);
            let mut shut = self.shut.lock().expect("lock");
            while *shut {
                shut = self.opened.wait(shut).expect("wait");
            }
            drop(shut);
            if items.iter().any(|i| i.code == "panic") {
                panic!("sink panics");
            }
            self.batches.lock().expect("lock").push(items.len());
            items
                .iter()
                .map(|i| match i.execution.id.starts_with("bad") {
                    true => Err(RecordError::store(std::io::Error::other("refused"))),
                    false => {
                        self.recorded
                            .lock()
                            .expect("lock")
                            .push(i.execution.id.clone());
                        Ok(())
                    }
                })
                .collect()
        }
    }

    fn execution(id: &str) -> Execution {
        let mut e: Execution = serde_json::from_value(serde_json::json!({
            "id": id, "session_id": null, "language": "python", "execution_count": 1,
            "status": "ok", "stdout": "", "stderr": "",
            "truncated": {"stdout": false, "stderr": false}, "results": [], "error": null,
            "files": [], "usage": {"wall_ms": 0, "cpu_ms": 0, "peak_memory_bytes": 0},
            "started_at": "2026-11-30T00:00:00Z", "finished_at": "2026-11-30T00:00:00Z"
        }))
        .expect("an execution");
        e.id = id.to_owned();
        e
    }

    type Outcome = Result<Execution, EngineError>;

    fn record(a: &Auditor, id: &str, code: &str) -> mpsc::Receiver<Outcome> {
        let (tx, rx) = mpsc::channel();
        a.record(
            "t".into(),
            execution(id),
            code.into(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx
    }

    #[test]
    fn replies_only_after_recording_in_order_and_batched() {
        let sink = Arc::new(Sink::default());
        *sink.shut.lock().expect("lock") = true;
        let a = Auditor::start(sink.clone(), Arc::default()).expect("start");
        let first = record(&a, "ex_1", "1");
        // Once the writer is stuck in the shut sink with ex_1, these queue behind it.
        while sink.entered.load(Ordering::SeqCst) == 0 {
            thread::sleep(Duration::from_millis(1));
        }
        let rest: Vec<_> = (2..=5)
            .map(|i| record(&a, &format!("ex_{i}"), "1"))
            .collect();
        thread::sleep(Duration::from_millis(100));
        assert!(first.try_recv().is_err(), "a reply before its record");
        assert!(sink.recorded.lock().expect("lock").is_empty());
        sink.open();
        assert_eq!(first.recv().expect("reply").expect("ok").id, "ex_1");
        for (i, rx) in rest.iter().enumerate() {
            assert_eq!(
                rx.recv().expect("reply").expect("ok").id,
                format!("ex_{}", i + 2)
            );
        }
        assert_eq!(
            *sink.recorded.lock().expect("lock"),
            ["ex_1", "ex_2", "ex_3", "ex_4", "ex_5"]
        );
        // What queued while the store was busy went in one batch.
        assert_eq!(*sink.batches.lock().expect("lock"), [1, 4]);
    }

    #[test]
    fn failures_are_per_execution_and_a_panic_fails_only_its_batch() {
        let sink = Arc::new(Sink::default());
        let a = Auditor::start(sink.clone(), Arc::default()).expect("start");
        let err = record(&a, "bad_1", "1")
            .recv()
            .expect("reply")
            .expect_err("refused");
        assert!(
            matches!(err, EngineError::NotRecorded(RecordError::Store(_))),
            "{err:?}"
        );
        // The store's own error is the cause.
        let chain = crate::error_chain(&err);
        assert!(
            chain.ends_with("cannot record the execution: refused"),
            "{chain}"
        );
        assert!(record(&a, "ex_2", "1").recv().expect("reply").is_ok());
        let err = record(&a, "ex_3", "panic")
            .recv()
            .expect("reply")
            .expect_err("panicked");
        assert!(
            matches!(err, EngineError::NotRecorded(RecordError::Panicked)),
            "{err:?}"
        );
        // The writer lives on.
        assert!(record(&a, "ex_4", "1").recv().expect("reply").is_ok());
        assert_eq!(*sink.recorded.lock().expect("lock"), ["ex_2", "ex_4"]);
    }

    #[test]
    fn lingering_stops_when_it_brings_nothing_and_resumes_under_load() {
        let mut l = Linger::default();
        assert!(!l.wanted(1, 0), "no other cell runs: nothing to wait for");
        assert!(l.wanted(1, 3));
        l.waited(true);
        assert!(l.wanted(1, 3), "the last wait paid");
        l.waited(false);
        assert!(!l.wanted(1, 3), "the last wait brought nothing");
        assert!(!l.wanted(1, 3));
        assert!(l.wanted(2, 3), "executions arrive together again");
        assert!(!l.wanted(LINGER_BATCH, 3), "a full batch goes at once");
    }

    #[test]
    fn a_lone_execution_waits_for_running_cells_at_most_once() {
        let sink = Arc::new(Sink::default());
        let running = Arc::new(AtomicUsize::new(1)); // a long cell elsewhere
        let a = Auditor::start(sink.clone(), running).expect("start");
        let started = Instant::now();
        record(&a, "ex_1", "1").recv().expect("reply").expect("ok");
        assert!(started.elapsed() >= LINGER, "control: the first one waits");
        // Waiting each time would take at least 199 LINGERs; without waiting, each record is
        // a round trip to the writer thread (tens of microseconds).
        let started = Instant::now();
        for i in 2..=200 {
            record(&a, &format!("ex_{i}"), "1")
                .recv()
                .expect("reply")
                .expect("ok");
        }
        assert!(started.elapsed() < LINGER * 199, "{:?}", started.elapsed());
        assert_eq!(sink.batches.lock().expect("lock").len(), 200);
    }

    #[test]
    fn drop_records_what_is_queued() {
        let sink = Arc::new(Sink::default());
        *sink.shut.lock().expect("lock") = true;
        let a = Auditor::start(sink.clone(), Arc::default()).expect("start");
        let replies: Vec<_> = (1..=3)
            .map(|i| record(&a, &format!("ex_{i}"), "1"))
            .collect();
        let opener = {
            let sink = sink.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                sink.open();
            })
        };
        drop(a);
        opener.join().expect("opener");
        assert_eq!(sink.recorded.lock().expect("lock").len(), 3);
        for rx in replies {
            assert!(rx
                .try_recv()
                .expect("answered before drop returned")
                .is_ok());
        }
    }
}
