//! `runcell repl`: one stateful session in the terminal. With a terminal: a prompt with history
//! and multi-line input. Otherwise: cells separated by lines that are exactly `%%`.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::args::SandboxArgs;
use anyhow::Context;
use runcell_engine::{CreateSession, Engine, ExecEvent, Execution, ExecutionStatus, LimitsRequest};

#[derive(Debug, clap::Args)]
pub struct ReplArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Per-cell time limit in seconds (interrupted, then killed after a grace period).
    #[arg(
        long,
        default_value_t = runcell_engine::SessionLimits::DESIGN_DEFAULTS.exec_timeout_s as f64,
        value_name = "S"
    )]
    timeout: f64,
}

pub fn repl(data_dir: &Path, args: ReplArgs) -> anyhow::Result<ExitCode> {
    let timeout = crate::args::timeout(args.timeout)?;
    let files = args.sandbox.input_files()?;
    let engine = crate::engines::engine_with_runtime(data_dir)?;
    let sessions = engine.sessions();
    let session = sessions.create(CreateSession {
        owner: "local".into(),
        language: Some(args.sandbox.lang),
        limits: LimitsRequest {
            memory_mb: args.sandbox.memory,
            exec_timeout_s: Some(timeout.as_secs().max(1)),
            ..LimitsRequest::default()
        },
        env: BTreeMap::new(),
        metadata: BTreeMap::from([("client".to_owned(), "runcell repl".to_owned())]),
        start: None,
        network: Default::default(),
    })?;
    let result = (|| {
        for f in &files {
            engine.write_file(&session.id, &f.path, &f.content)?;
        }
        if std::io::stdin().is_terminal() && !args.sandbox.json {
            interactive(&engine, &session.id, timeout)
        } else {
            scripted(&engine, &session.id, timeout, args.sandbox.json)
        }
    })();
    let _ = sessions.delete(&session.id);
    result
}

/// Cells from stdin, separated by `%%` lines. Exit code 1 if any cell did not end `ok`.
fn scripted(
    engine: &Engine,
    session: &str,
    timeout: Duration,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .context("cannot read cells from stdin")?;
    let mut all_ok = true;
    for cell in split_cells(&input) {
        let execution = run_cell(engine, session, &cell, timeout, !json)?;
        all_ok &= execution.status == ExecutionStatus::Ok;
        if json {
            let mut out = std::io::stdout().lock();
            serde_json::to_writer(&mut out, &execution)?;
            writeln!(out)?;
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Splits a script into cells at lines that are exactly `%%`; empty cells are skipped.
fn split_cells(input: &str) -> Vec<String> {
    let mut cells = vec![String::new()];
    for line in input.split_inclusive('\n') {
        if line.trim_end_matches(['\n', '\r']) == "%%" {
            cells.push(String::new());
        } else if let Some(last) = cells.last_mut() {
            last.push_str(line);
        }
    }
    cells.retain(|c| !c.trim().is_empty());
    cells
}

fn interactive(engine: &Engine, session: &str, timeout: Duration) -> anyhow::Result<ExitCode> {
    use rustyline::error::ReadlineError;
    // Ctrl-C while a cell runs interrupts the cell (KeyboardInterrupt inside), not runcell.
    // At the prompt the line editor reads Ctrl-C itself.
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT])?;
    let (e, id) = (engine.clone(), session.to_owned());
    std::thread::spawn(move || {
        for _ in signals.forever() {
            let _ = e.sessions().interrupt(&id);
        }
    });
    let mut rl = rustyline::Editor::<CellHelper, rustyline::history::DefaultHistory>::new()?;
    rl.set_helper(Some(CellHelper));
    let history = history_path();
    if let Some(h) = &history {
        let _ = rl.load_history(h);
    }
    eprintln!(
        "runcell repl: a sandboxed Python session. Ctrl-D to quit; Ctrl-C interrupts a cell."
    );
    loop {
        match rl.readline(">>> ") {
            Ok(cell) => {
                if cell.trim().is_empty() {
                    continue;
                }
                let _ = rl.add_history_entry(cell.as_str());
                run_cell(engine, session, &cell, timeout, true)?;
            }
            Err(ReadlineError::Interrupted) => {
                eprintln!("KeyboardInterrupt (Ctrl-D quits)");
                continue;
            }
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(h) = &history {
        let _ = rl.save_history(h);
    }
    Ok(ExitCode::SUCCESS)
}

fn history_path() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".runcell_history"))
}

/// Multi-line input: a line ending in `:` or `\`, or open brackets, continues the cell; after
/// a `:` block, an empty line ends it (as in Python's own REPL).
#[derive(rustyline::Helper, rustyline::Completer, rustyline::Hinter, rustyline::Highlighter)]
struct CellHelper;

impl rustyline::validate::Validator for CellHelper {
    fn validate(
        &self,
        ctx: &mut rustyline::validate::ValidationContext<'_>,
    ) -> rustyline::Result<rustyline::validate::ValidationResult> {
        use rustyline::validate::ValidationResult::{Incomplete, Valid};
        Ok(if is_incomplete(ctx.input()) {
            Incomplete
        } else {
            Valid(None)
        })
    }
}

fn is_incomplete(input: &str) -> bool {
    let mut depth = 0i32;
    for c in input.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ => {}
        }
    }
    if depth > 0 || input.ends_with('\\') {
        return true;
    }
    let lines: Vec<&str> = input.lines().collect();
    let opened_block = lines.iter().any(|l| l.trim_end().ends_with(':'));
    // A block is finished by an empty line.
    opened_block && !input.ends_with('\n') && !lines.last().is_some_and(|l| l.trim().is_empty())
}

/// Runs one cell, printing its output as it happens (when `print`), and returns it.
fn run_cell(
    engine: &Engine,
    session: &str,
    code: &str,
    timeout: Duration,
    print: bool,
) -> anyhow::Result<Execution> {
    let events: Option<runcell_engine::EventSink> = print.then(|| {
        Box::new(|e: ExecEvent<'_>| {
            let _ = match e {
                ExecEvent::Stdout(s) => {
                    let mut out = std::io::stdout().lock();
                    out.write_all(s.as_bytes()).and_then(|_| out.flush())
                }
                ExecEvent::Stderr(s) => std::io::stderr().lock().write_all(s.as_bytes()),
                ExecEvent::Result(r) => {
                    let mut out = std::io::stdout().lock();
                    writeln!(out, "{}", describe_result(&r.data))
                }
                ExecEvent::Error(_) => Ok(()),
            };
        }) as runcell_engine::EventSink
    });
    let execution = engine
        .sessions()
        .execute(session, code, Some(timeout), events)?;
    if print {
        if execution.truncated.stdout || execution.truncated.stderr {
            eprintln!("[output truncated]");
        }
        if let Some(e) = &execution.error {
            if e.traceback.is_empty() {
                eprintln!("{}: {}", e.name, e.value);
            } else {
                eprintln!("{}", e.traceback);
                if e.name == "TimeoutError" {
                    eprintln!("{}: {}", e.name, e.value);
                }
            }
        }
        for f in &execution.files {
            eprintln!("[file {:?}: {} ({} bytes)]", f.change, f.path, f.size);
        }
    }
    Ok(execution)
}

/// What a terminal can show of a MIME bundle: its text, or a note about an image.
fn describe_result(data: &BTreeMap<String, String>) -> String {
    if let Some(png) = data.get("image/png") {
        let text = data
            .get("text/plain")
            .map(String::as_str)
            .unwrap_or("image");
        return format!("{text} [image/png, {} bytes]", png.len() / 4 * 3);
    }
    data.get("text/plain").cloned().unwrap_or_else(|| {
        let kinds: Vec<&str> = data.keys().map(String::as_str).collect();
        format!("[{}]", kinds.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_split_on_exact_percent_lines() {
        let cells = split_cells("x = 1\n%%\nx + 1\n%% not a separator\n%%\n\n%%\nprint(x)");
        assert_eq!(
            cells,
            vec!["x = 1\n", "x + 1\n%% not a separator\n", "print(x)"]
        );
    }

    #[test]
    fn multi_line_input_detection() {
        assert!(is_incomplete("def f():"));
        assert!(is_incomplete("def f():\n    return 1"));
        assert!(!is_incomplete("def f():\n    return 1\n"));
        assert!(is_incomplete("x = [1,"));
        assert!(!is_incomplete("x = [1, 2]"));
        assert!(!is_incomplete("print('a:')"));
    }
}
