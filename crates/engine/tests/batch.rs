//! Batches and test-case verdicts: a mix of correct, wrong, crashing, looping, flooding, forking
//! and memory-hungry programs, each judged as a reference judge would, every run in its own
//! sandbox; a caller that goes away stops the batch.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use runcell_engine::{
    BatchRun, Check, Comparison, Gate, Language, LimitsRequest, OneShot, TestCase, Verdict,
};

fn tests(cases: &[(&str, &str)]) -> Vec<TestCase> {
    cases
        .iter()
        .map(|(stdin, expected)| TestCase {
            stdin: stdin.as_bytes().to_vec(),
            expected_stdout: (*expected).to_owned(),
            args: Vec::new(),
        })
        .collect()
}

fn run(code: &str, cases: &[(&str, &str)]) -> BatchRun {
    let mut run = OneShot::new(Language::Python, code);
    run.timeout = Duration::from_secs(2);
    run.output_cap = 64 << 10;
    BatchRun {
        run,
        tests: tests(cases),
        check: Check::default(),
    }
}

#[test]
fn a_mixed_batch_gets_the_reference_verdicts() {
    let engine = runcell_engine::testing::zygote_engine(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let sum = "print(sum(map(int, input().split())))";
    let cases = [("1 2\n", "3"), ("10 20\n", "30\n"), ("-1 1", "0")];
    let mut hog = run(
        "b = bytearray(400 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = 1\nprint(0)",
        &[("", "0")],
    );
    hog.run.limits = LimitsRequest {
        memory_mb: Some(128),
        ..LimitsRequest::default()
    };
    let mut numeric = run("print(float(input()) / 3)", &[("1", "0.333333")]);
    numeric.check = Check {
        comparison: Comparison::Numeric,
        tolerance: 1e-5,
    };
    let mut exact = run(sum, &[("1 2", "3")]);
    exact.check.comparison = Comparison::Exact;
    let mut args = run("import sys\nprint(sys.argv[1:])", &[]);
    args.tests = vec![TestCase {
        stdin: Vec::new(),
        expected_stdout: "['x', 'y']\n".into(),
        args: vec!["x".into(), "y".into()],
    }];
    let mut fork_bomb = run(
        "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n            time.sleep(100)\n    except OSError:\n        pass",
        &cases[..1],
    );
    fork_bomb.run.timeout = Duration::from_secs(20);
    let mut bash = run("read a b; echo $((a * b))", &[("6 7", "42")]);
    bash.run.language = Language::Bash;
    let batch = vec![
        (run(sum, &cases), Verdict::Accepted, 3),
        (
            run("print(sum(map(int, input().split())) + 1)", &cases),
            Verdict::WrongAnswer,
            0,
        ),
        (
            run("raise ValueError('nope')", &cases[..1]),
            Verdict::RuntimeError,
            0,
        ),
        (
            run("import sys\nsys.exit(2)", &cases[..1]),
            Verdict::RuntimeError,
            0,
        ),
        (
            run("while True:\n    pass", &cases[..1]),
            Verdict::TimeLimit,
            0,
        ),
        (
            run("import time\ntime.sleep(60)", &cases[..1]),
            Verdict::TimeLimit,
            0,
        ),
        (
            run("while True:\n    print('y' * 4096)", &cases[..1]),
            Verdict::OutputLimit,
            0,
        ),
        (fork_bomb, Verdict::RuntimeError, 0),
        (hog, Verdict::MemoryLimit, 0),
        (numeric, Verdict::Accepted, 1),
        (exact, Verdict::WrongAnswer, 0),
        (args, Verdict::Accepted, 1),
        (bash, Verdict::Accepted, 1),
        // Second test wrong: the summary says so and counts the one that passed.
        (
            run(sum, &[("1 1", "2"), ("2 2", "5")]),
            Verdict::WrongAnswer,
            1,
        ),
    ];
    let want: Vec<(Verdict, usize)> = batch.iter().map(|(_, v, p)| (*v, *p)).collect();
    let runs: Vec<BatchRun> = batch.into_iter().map(|(r, _, _)| r).collect();
    let n = runs.len();
    let got = Mutex::new(Vec::new());
    let gate = Gate::new(2);
    engine.run_batch(runs, 4, Some(&gate), &|index, result| {
        got.lock().expect("lock").push((index, result));
        true
    });
    let mut got = got.into_inner().expect("lock");
    assert_eq!(got.len(), n);
    got.sort_by_key(|(i, _)| *i);
    let mut ids = std::collections::HashSet::new();
    for ((index, result), (verdict, passed)) in got.into_iter().zip(want) {
        let judged = result.unwrap_or_else(|e| panic!("run {index}: {e}"));
        let (summary, results) = judged.tests.expect("tests");
        assert_eq!(
            (summary.verdict, summary.passed),
            (verdict, passed),
            "run {index}: {results:#?}"
        );
        assert_eq!(summary.total, results.len());
        // Every test ran in its own sandbox, as its own execution.
        for r in &results {
            assert!(
                ids.insert(r.execution_id.clone()),
                "{} twice",
                r.execution_id
            );
        }
        // The execution shown is the first test that failed.
        if let Some(first) = results.iter().find(|r| r.verdict != Verdict::Accepted) {
            assert_eq!(judged.outcome.execution.id, first.execution_id);
        }
    }
}

#[test]
fn a_caller_that_goes_away_stops_the_batch() {
    let engine = runcell_engine::testing::engine(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let runs: Vec<BatchRun> = (0..6)
        .map(|i| BatchRun {
            run: OneShot::new(Language::Bash, format!("echo {i}")),
            tests: Vec::new(),
            check: Check::default(),
        })
        .collect();
    let calls = Mutex::new(0);
    engine.run_batch(runs, 1, None, &|_, result| {
        assert!(result.is_ok());
        *calls.lock().expect("lock") += 1;
        false
    });
    // One worker: it handed over its first run, was told the caller is gone, and stopped.
    assert_eq!(*calls.lock().expect("lock"), 1);
}
