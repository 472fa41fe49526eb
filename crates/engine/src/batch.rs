//! Batches of one-shot runs (`POST /v1/batch`, `runcell run --batch`): many independent
//! programs, each in its own fresh sandbox and recorded in the audit log, at most `concurrency`
//! at a time (and at most a tenant's share across all of its batches), finished runs handed
//! over in completion order.
//!
//! Backpressure: a worker hands its finished run to the caller before it takes the next one, so
//! a caller that is slow to take results (an HTTP client reading slowly) stops new runs from
//! starting; a batch never holds more than `concurrency` finished runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::Invalid;
use crate::oneshot::OneShot;
use crate::verdict::{Check, Judged, TestCase};
use crate::{Engine, EngineError};

/// Runs one batch may hold.
pub const MAX_BATCH_RUNS: usize = 1000;
/// Concurrency one batch may ask for.
pub const MAX_BATCH_CONCURRENCY: usize = 64;

/// How long a run waits for a place under the server's sandbox cap before it fails.
const SLOT_WAIT: Duration = Duration::from_secs(30);

/// One run of a batch: the program, its tests (none: run once) and how outputs are compared.
#[derive(Debug, Clone)]
pub struct BatchRun {
    pub run: OneShot,
    pub tests: Vec<TestCase>,
    pub check: Check,
}

/// A counting semaphore shared by every batch of one tenant: its runs in flight, all batches
/// together, stay under the tenant's cap.
#[derive(Debug)]
pub struct Gate {
    in_flight: Mutex<usize>,
    freed: Condvar,
    max: usize,
}

impl Gate {
    pub fn new(max: usize) -> Gate {
        Gate {
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
            max: max.max(1),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Waits for a place, or returns `None` once `stop` is set.
    fn enter(&self, stop: &AtomicBool) -> Option<GatePass<'_>> {
        let mut n = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        while *n >= self.max {
            if stop.load(Ordering::Relaxed) {
                return None;
            }
            n = self
                .freed
                .wait_timeout(n, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *n += 1;
        Some(GatePass(self))
    }
}

struct GatePass<'a>(&'a Gate);

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        let mut n = self.0.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        *n -= 1;
        self.0.freed.notify_one();
    }
}

impl Engine {
    /// Everything about a batch that can be refused before any of it runs: its size, and each
    /// run as [`Engine::check_one_shot`] and [`Engine::check_tests`] see it.
    pub fn check_batch(&self, runs: &[BatchRun]) -> Result<(), EngineError> {
        if runs.is_empty() || runs.len() > MAX_BATCH_RUNS {
            return Err(EngineError::InvalidRequest(Invalid::Run(format!(
                "a batch holds 1 to {MAX_BATCH_RUNS} runs, not {}",
                runs.len()
            ))));
        }
        for (i, run) in runs.iter().enumerate() {
            self.check_one_shot(&run.run)
                .and_then(|()| self.check_tests(&run.tests, &run.check))
                .map_err(|e| match e {
                    EngineError::InvalidRequest(why) => {
                        EngineError::InvalidRequest(Invalid::Run(format!("runs[{i}]: {why}")))
                    }
                    other => other,
                })?;
        }
        Ok(())
    }

    /// Runs `runs` with at most `concurrency` at once (and, with a `gate`, at most its share),
    /// calling `on_done(index, result)` as each finishes, from the worker that ran it. When
    /// `on_done` returns `false` (the caller is gone) no further run starts and the ones under
    /// way are ended. Returns once every started run has been handed over.
    pub fn run_batch(
        &self,
        runs: Vec<BatchRun>,
        concurrency: usize,
        gate: Option<&Gate>,
        on_done: &(dyn Fn(usize, Result<Judged, EngineError>) -> bool + Sync),
    ) {
        let stop = Arc::new(AtomicBool::new(false));
        let workers = concurrency.clamp(1, runs.len().max(1));
        let queue = Mutex::new(runs.into_iter().enumerate());
        let next = || queue.lock().unwrap_or_else(|p| p.into_inner()).next();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| loop {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Some((index, mut run)) = next() else {
                        return;
                    };
                    let _pass = match gate.map(|g| g.enter(&stop)) {
                        Some(None) => return,
                        pass => pass.flatten(),
                    };
                    run.run.cancel = Some(stop.clone());
                    let result = self.run_in_slot(&run, &stop);
                    if !on_done(index, result) {
                        stop.store(true, Ordering::Relaxed);
                        return;
                    }
                });
            }
        });
    }

    /// One run under the server's sandbox cap and memory budget, each of its sandboxes
    /// waiting (a while) for a place while either is full: other work ends and frees it, and
    /// a batch should slow down rather than fail.
    fn run_in_slot(&self, run: &BatchRun, stop: &AtomicBool) -> Result<Judged, EngineError> {
        let patiently = |req: &OneShot| {
            let until = Instant::now() + SLOT_WAIT;
            loop {
                let result = self
                    .sessions()
                    .reserve_sandbox()
                    .and_then(|_slot| self.run_once(req, &mut |_, _| {}));
                match result {
                    Err(EngineError::AtCapacity(_) | EngineError::OverCommitted(_))
                        if Instant::now() < until && !stop.load(Ordering::Relaxed) =>
                    {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    other => return other,
                }
            }
        };
        self.judge_with(&run.run, &run.tests, &run.check, &patiently)
    }
}
