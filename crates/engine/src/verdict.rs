//! Test-case verdicts (Judge0's model): a one-shot program is run once per test, each time in
//! a fresh sandbox with the test's stdin and arguments, and its stdout compared with the
//! expected output. Each test gets a verdict with its usage; the run gets a summary.

use serde::{Deserialize, Serialize};

use crate::error::Invalid;
use crate::model::{Execution, ExecutionStatus, KilledBy, UsageInfo};
use crate::oneshot::{OneShot, OneShotOutcome};
use crate::{Engine, EngineError};

/// Tests one run may carry.
pub const MAX_TESTS_PER_RUN: usize = 100;

/// One test: the program's input and the output it must print.
#[derive(Debug, Clone, Default)]
pub struct TestCase {
    pub stdin: Vec<u8>,
    pub expected_stdout: String,
    /// Arguments after the program file; the run's own when empty.
    pub args: Vec<String>,
}

/// How stdout is compared with the expected output.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    /// Byte for byte.
    Exact,
    /// The same whitespace-separated tokens (line breaks, runs of spaces and a final newline
    /// do not matter). The default: what most judges accept.
    #[default]
    Whitespace,
    /// Token by token as `whitespace`, except that two numbers are equal when they differ by
    /// at most `tolerance` (absolute, or relative to the expected value when that is above 1).
    Numeric,
}

/// Default tolerance of [`Comparison::Numeric`].
pub const DEFAULT_TOLERANCE: f64 = 1e-6;

/// A comparison and its tolerance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Check {
    pub comparison: Comparison,
    pub tolerance: f64,
}

impl Default for Check {
    fn default() -> Self {
        Check {
            comparison: Comparison::default(),
            tolerance: DEFAULT_TOLERANCE,
        }
    }
}

impl Check {
    /// Whether `got` passes for `expected`.
    pub fn matches(&self, got: &str, expected: &str) -> bool {
        match self.comparison {
            Comparison::Exact => got == expected,
            Comparison::Whitespace => got.split_whitespace().eq(expected.split_whitespace()),
            Comparison::Numeric => {
                let (mut g, mut e) = (got.split_whitespace(), expected.split_whitespace());
                loop {
                    match (g.next(), e.next()) {
                        (None, None) => return true,
                        (Some(a), Some(b)) if a == b || self.close(a, b) => {}
                        _ => return false,
                    }
                }
            }
        }
    }

    fn close(&self, got: &str, expected: &str) -> bool {
        match (got.parse::<f64>(), expected.parse::<f64>()) {
            (Ok(a), Ok(b)) if a.is_finite() && b.is_finite() => {
                (a - b).abs() <= self.tolerance * b.abs().max(1.0)
            }
            _ => false,
        }
    }
}

/// What one test came to.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Exited 0 and printed the expected output.
    Accepted,
    /// Exited 0 and printed something else.
    WrongAnswer,
    /// Exited non-zero, died of a signal, raised, or hit the process limit (a fork bomb).
    RuntimeError,
    /// Killed at the time limit.
    TimeLimit,
    /// Killed by the memory limit (or raised `MemoryError`).
    MemoryLimit,
    /// Printed more than the output cap: what it printed cannot be compared.
    OutputLimit,
}

impl Verdict {
    /// The verdict of a finished test run.
    pub fn of(execution: &Execution, expected: &str, check: &Check) -> Verdict {
        match execution.usage.killed_by {
            Some(KilledBy::Timeout) => Verdict::TimeLimit,
            Some(KilledBy::Oom) => Verdict::MemoryLimit,
            Some(KilledBy::Output) => Verdict::OutputLimit,
            Some(KilledBy::Pids | KilledBy::Signal) => Verdict::RuntimeError,
            None if execution.truncated.stdout => Verdict::OutputLimit,
            None if execution.status == ExecutionStatus::Ok => {
                if check.matches(&execution.stdout, expected) {
                    Verdict::Accepted
                } else {
                    Verdict::WrongAnswer
                }
            }
            None if execution
                .error
                .as_ref()
                .is_some_and(|e| e.name == "MemoryError") =>
            {
                Verdict::MemoryLimit
            }
            None => Verdict::RuntimeError,
        }
    }
}

/// One test's outcome: its verdict and its own run (recorded in the audit log as such).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TestResult {
    /// Position in the run's `tests`.
    pub index: usize,
    pub verdict: Verdict,
    /// The id of this test's execution.
    pub execution_id: String,
    /// The program's exit code (128 + the signal when it died of one).
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    pub usage: UsageInfo,
}

/// A run's tests at a glance.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TestSummary {
    /// `accepted` when every test was; else the verdict of the first test that was not.
    pub verdict: Verdict,
    pub passed: usize,
    pub total: usize,
    /// Wall and CPU time over all tests (ms), and the highest peak memory (bytes).
    pub wall_ms: u64,
    pub cpu_ms: u64,
    pub peak_memory_bytes: u64,
}

/// A finished run: its execution and, when it carried tests, their verdicts. With tests, the
/// execution is that of the first test not accepted (of the last test when all were).
#[derive(Debug, Clone)]
pub struct Judged {
    pub outcome: OneShotOutcome,
    pub tests: Option<(TestSummary, Vec<TestResult>)>,
}

impl Engine {
    /// Whether `tests` and `check` can be run: at most [`MAX_TESTS_PER_RUN`], arguments as
    /// for a run, a tolerance that is a number, zero or more.
    pub fn check_tests(&self, tests: &[TestCase], check: &Check) -> Result<(), EngineError> {
        let invalid = |m: String| Err(EngineError::InvalidRequest(Invalid::Run(m)));
        if tests.len() > MAX_TESTS_PER_RUN {
            return invalid(format!(
                "{} tests; a run carries at most {MAX_TESTS_PER_RUN}",
                tests.len()
            ));
        }
        if !(check.tolerance.is_finite() && check.tolerance >= 0.0) {
            return invalid("tolerance must be a number, zero or more".into());
        }
        for (i, t) in tests.iter().enumerate() {
            crate::oneshot::check_args(&t.args).or_else(|e| invalid(format!("tests[{i}]: {e}")))?;
        }
        Ok(())
    }

    /// Runs `req` once, or once per test (each in its own sandbox, with the test's stdin and
    /// arguments), and judges each test's output with `check`.
    pub fn judge(
        &self,
        req: &OneShot,
        tests: &[TestCase],
        check: &Check,
    ) -> Result<Judged, EngineError> {
        self.judge_with(req, tests, check, &|r| self.run_once(r, &mut |_, _| {}))
    }

    /// [`Engine::judge`], each sandbox run by `run_once` (a batch's waits for a place).
    pub(crate) fn judge_with(
        &self,
        req: &OneShot,
        tests: &[TestCase],
        check: &Check,
        run_once: &dyn Fn(&OneShot) -> Result<OneShotOutcome, EngineError>,
    ) -> Result<Judged, EngineError> {
        if tests.is_empty() {
            let outcome = run_once(req)?;
            return Ok(Judged {
                outcome,
                tests: None,
            });
        }
        let mut results = Vec::with_capacity(tests.len());
        let mut shown: Option<OneShotOutcome> = None;
        let mut shown_failed = false;
        let mut summary = TestSummary {
            verdict: Verdict::Accepted,
            passed: 0,
            total: tests.len(),
            wall_ms: 0,
            cpu_ms: 0,
            peak_memory_bytes: 0,
        };
        for (index, test) in tests.iter().enumerate() {
            let mut run = req.clone();
            // Output past the cap cannot be compared: no use letting the program go on.
            run.output_kill_bytes = run.output_kill_bytes.min(2 * run.output_cap as u64);
            run.stdin = test.stdin.clone();
            if !test.args.is_empty() {
                run.args = test.args.clone();
            }
            let outcome = run_once(&run)?;
            let e = &outcome.execution;
            let verdict = Verdict::of(e, &test.expected_stdout, check);
            summary.wall_ms += e.usage.wall_ms;
            summary.cpu_ms += e.usage.cpu_ms;
            summary.peak_memory_bytes = summary.peak_memory_bytes.max(e.usage.peak_memory_bytes);
            if verdict == Verdict::Accepted {
                summary.passed += 1;
            } else if summary.verdict == Verdict::Accepted {
                summary.verdict = verdict;
            }
            results.push(TestResult {
                index,
                verdict,
                execution_id: e.id.clone(),
                exit_code: outcome.exit_code,
                stdout: e.stdout.clone(),
                stderr: e.stderr.clone(),
                usage: e.usage,
            });
            // Kept: the first failing test's run, or the latest while all pass.
            if !shown_failed {
                shown_failed = verdict != Verdict::Accepted;
                shown = Some(outcome);
            }
        }
        let outcome = match shown {
            Some(o) => o,
            // Not reached: `tests` is not empty, so one was kept.
            None => run_once(req)?,
        };
        Ok(Judged {
            outcome,
            tests: Some((summary, results)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(comparison: Comparison) -> Check {
        Check {
            comparison,
            ..Check::default()
        }
    }

    #[test]
    fn comparisons_accept_what_they_say_and_nothing_else() {
        let exact = check(Comparison::Exact);
        assert!(exact.matches("3\n", "3\n"));
        assert!(!exact.matches("3\n", "3"));
        let ws = check(Comparison::Whitespace);
        assert!(ws.matches("1  2\n3\n\n", "1 2 3"));
        assert!(!ws.matches("1 2", "1 2 3"));
        assert!(!ws.matches("12", "1 2"));
        assert!(!ws.matches("3.0", "3"));
        let num = check(Comparison::Numeric);
        assert!(num.matches("3.0000001 x\n", "3 x"));
        assert!(num.matches("1000000.5", "1000000")); // relative above 1
        assert!(!num.matches("3.001", "3"));
        assert!(!num.matches("3 y", "3 x"));
        assert!(num.matches("nan", "nan")); // equal tokens pass as text
        assert!(!num.matches("nan", "1"));
        assert!(!num.matches("inf", "1e308"));
        assert!(!num.matches("3", "3 4"));
        let loose = Check {
            comparison: Comparison::Numeric,
            tolerance: 0.01,
        };
        assert!(loose.matches("3.001", "3"));
    }
}
