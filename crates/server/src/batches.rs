//! This server's batch policy (`POST /v1/batch`): its bounds, and each tenant's gate on its
//! batch runs in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use runcell_engine::{BatchRun, Gate, MAX_BATCH_RUNS, MAX_TESTS_PER_RUN};

use crate::error::{ApiError, ApiResult};

/// This server's batch policy: how many runs a batch and how many tests a run may hold (the
/// OpenAPI document says the same), and each tenant's gate on its batch runs in flight,
/// across all of its batches.
#[derive(Debug)]
pub struct Batches {
    pub max_runs: usize,
    pub max_tests_per_run: usize,
    per_tenant: usize,
    gates: Mutex<HashMap<String, Arc<Gate>>>,
}

impl Batches {
    /// At most `max_runs` runs a batch (1 to 1000) and `max_tests_per_run` tests a run
    /// (0 to 100); each tenant's runs in flight under twice the CPUs (a sandbox's start-up is
    /// partly waiting, so two runs per CPU keep it busy).
    pub fn new(max_runs: usize, max_tests_per_run: usize) -> Batches {
        Batches {
            max_runs: max_runs.clamp(1, MAX_BATCH_RUNS),
            max_tests_per_run: max_tests_per_run.min(MAX_TESTS_PER_RUN),
            per_tenant: 2 * cpus(),
            gates: Mutex::default(),
        }
    }

    pub(crate) fn gate(&self, tenant: &str) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|p| p.into_inner());
        gates
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Gate::new(self.per_tenant)))
            .clone()
    }

    /// Whether a batch of `runs` (each with its tests) is within this server's bounds.
    pub(crate) fn check(&self, runs: &[BatchRun]) -> ApiResult<()> {
        if runs.is_empty() || runs.len() > self.max_runs {
            return Err(ApiError::invalid(format!(
                "a batch holds 1 to {} runs, not {}",
                self.max_runs,
                runs.len()
            )));
        }
        for (i, r) in runs.iter().enumerate() {
            self.check_tests(r.tests.len())
                .map_err(|e| e.with_prefix(&format!("runs[{i}]: ")))?;
        }
        Ok(())
    }

    pub(crate) fn check_tests(&self, n: usize) -> ApiResult<()> {
        if n > self.max_tests_per_run {
            return Err(ApiError::invalid(format!(
                "{n} tests; a run carries at most {} here",
                self.max_tests_per_run
            )));
        }
        Ok(())
    }
}

impl Default for Batches {
    fn default() -> Self {
        Batches::new(MAX_BATCH_RUNS, MAX_TESTS_PER_RUN)
    }
}

pub(crate) fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
