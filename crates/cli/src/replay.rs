//! `runcell audit replay SESSION_ID`: a recorded session's cells re-run in a fresh sandbox and
//! compared with the audit log, cell by cell (the engine's `replay`). A table with diffs, or
//! the JSON report with `--json`; the exit code is 1 when a cell differed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use runcell_engine::{ReplayCheck, ReplayReport};

#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The recorded session (`runcell audit list` shows each execution's session).
    #[arg(value_name = "SESSION_ID")]
    session: String,
    #[arg(long, default_value = "default")]
    tenant: String,
    /// A file to restore into /workspace before the first cell (repeatable), checked against
    /// the upload's recorded SHA-256 when the store recorded one at its name. The store keeps
    /// uploads' hashes, not their content.
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn replay(data_dir: &Path, args: ReplayArgs) -> anyhow::Result<ExitCode> {
    let files = crate::ask::input_files(&args.files)?;
    let store = crate::audit::open_store(data_dir)?;
    let engine = crate::engines::audited_engine(data_dir, &store)?;
    let report = engine.replay(&args.tenant, &args.session, &files);
    engine.sessions().shutdown();
    let report = report?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(if report.differed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn mark(c: &ReplayCheck) -> &'static str {
    if c.matches {
        "same"
    } else {
        "DIFF"
    }
}

/// The report for a person: one row per cell, then each difference with its diff.
pub(crate) fn table(r: &ReplayReport) -> String {
    let mut out = String::new();
    let total = r.cells.len();
    let _ = writeln!(
        out,
        "replay of {} in {}: {} of {total} cells match, {} differ",
        r.session_id, r.replay_session_id, r.matched, r.differed
    );
    for u in &r.uploads {
        let _ = writeln!(
            out,
            "upload {}: {}{}",
            u.path,
            if u.restored { "" } else { "NOT RESTORED: " },
            u.note
        );
    }
    let _ = writeln!(
        out,
        "{:>4}  {:<32}  {:6} {:6} {:6} {:6}  code",
        "cell", "execution", "stdout", "result", "error", "files"
    );
    for c in &r.cells {
        let first = c.code.lines().next().unwrap_or("");
        let _ = writeln!(
            out,
            "{:>4}  {:<32}  {:6} {:6} {:6} {:6}  {}",
            c.index,
            c.execution_id,
            mark(&c.stdout),
            mark(&c.result),
            mark(&c.error),
            mark(&c.files),
            first.chars().take(50).collect::<String>()
        );
    }
    for c in r.cells.iter().filter(|c| !c.matches) {
        let _ = writeln!(out, "\ncell {} differs ({}):", c.index, c.execution_id);
        if c.sources_of_difference.is_empty() {
            let _ = writeln!(out, "  no known source of difference found in its code");
        } else {
            let _ = writeln!(
                out,
                "  known sources of difference: {}",
                c.sources_of_difference.join("; ")
            );
        }
        for (name, check) in [
            ("stdout", &c.stdout),
            ("main result", &c.result),
            ("error", &c.error),
            ("files", &c.files),
        ] {
            if let Some(d) = &check.diff {
                let _ = writeln!(out, "  {name}:");
                for l in d.lines() {
                    let _ = writeln!(out, "    {l}");
                }
            }
        }
    }
    out
}
