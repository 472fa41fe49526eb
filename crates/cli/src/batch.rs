//! `runcell run --batch FILE.jsonl`: one run per line (as `POST /v1/execute` takes it), each
//! in its own fresh sandbox, recorded in the data dir's audit log; one NDJSON line per finished
//! run on stdout, in completion order with its `index` (as `POST /v1/batch` answers), and a
//! progress bar on stderr when that is a terminal.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;

pub fn run_batch(
    data_dir: &Path,
    file: &Path,
    concurrency: Option<usize>,
) -> anyhow::Result<ExitCode> {
    let reader: Box<dyn BufRead> = if file == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        let f = std::fs::File::open(file)
            .with_context(|| format!("cannot read the batch file {}", file.display()))?;
        Box::new(std::io::BufReader::new(f))
    };
    let lines: Vec<String> = reader
        .lines()
        .collect::<Result<_, _>>()
        .with_context(|| format!("cannot read the batch file {}", file.display()))?;

    let store = crate::audit::open_store(data_dir)?;
    // A batch is worth a zygote: its Python runs fork from one preloaded interpreter.
    let preload = runcell_engine::DEFAULT_PRELOAD
        .iter()
        .map(|m| m.to_string())
        .collect();
    let config = crate::engines::config_with_runtime(data_dir, Some(preload), Default::default())?;
    let engine = runcell_engine::Engine::audited(config, store.domain())?;

    let mut runs = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let run = runcell_server::batch::parse_run(&engine, "", line)
            .map_err(|e| crate::args::invalid(format!("{}:{}: {e}", file.display(), n + 1)))?;
        runs.push(run);
    }
    runcell_server::batch::check(&engine, &runs)
        .map_err(|e| crate::args::invalid(format!("{}: {e}", file.display())))?;
    let concurrency = concurrency
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, runcell_engine::MAX_BATCH_CONCURRENCY);
    let python = runs
        .iter()
        .any(|r| r.run.language == runcell_engine::Language::Python);
    if python {
        // Slower, never broken: without a zygote the runs start cold.
        let status = engine.wait_for_zygote(Duration::from_secs(120));
        tracing::debug!(?status, "zygote");
    }

    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(runs.len() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} runs, {per_sec}, {elapsed} {msg:.dim}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let failed = AtomicUsize::new(0);
    let stdout = std::io::stdout();
    engine.run_batch(runs, concurrency, None, &|index, result| {
        if result.is_err() {
            failed.fetch_add(1, Ordering::Relaxed);
        }
        let line = runcell_server::batch::line(index, result);
        bar.inc(1);
        let mut out = stdout.lock();
        // A closed stdout ends the batch (nobody reads what it would print).
        out.write_all(&line).and_then(|_| out.flush()).is_ok()
    });
    bar.finish_and_clear();
    let failed = failed.into_inner();
    if failed > 0 {
        eprintln!("runcell: {failed} runs could not run (their lines say why)");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
