//! `runcell doctor`: every isolation layer and runtime, then a real sandboxed run.

use std::collections::HashSet;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use runcell_engine::{ExecutionStatus, Language, OneShot};
use runcell_sandbox::doctor::{self, State};

/// Removes the session workspaces a killed runcell process (a `runcell mcp` or a server
/// killed with -9) left mounted under `data_dir`, when it can prove they are nobody's: no
/// live process holds their uid lease (a running server's or another `runcell mcp`'s
/// sessions do), and the data dir's database does not name them (a server recovers those on
/// its next start). Returns how many went. Without a readable database nothing is removed.
pub fn sweep_orphans(data_dir: &Path, engine: &runcell_engine::Engine) -> anyhow::Result<usize> {
    let db = data_dir.join("runcell.db");
    let known: HashSet<String> = if db.exists() {
        crate::audit::open_store(data_dir)?
            .sessions_with_status(&["starting", "ready", "busy", "paused", "dead", "expired"])?
            .into_iter()
            .map(|s| s.id)
            .collect()
    } else {
        HashSet::new()
    };
    Ok(engine
        .sessions()
        .sweep_orphan_workspaces(&|id| known.contains(id)))
}

/// `runcell doctor --clean`: [`sweep_orphans`], saying what it did.
pub fn clean(data_dir: &Path) -> anyhow::Result<ExitCode> {
    let engine = crate::engines::engine(data_dir)?;
    let removed = sweep_orphans(data_dir, &engine)?;
    println!(
        "removed {removed} orphaned session workspace{} under {}",
        if removed == 1 { "" } else { "s" },
        engine.config().workspaces_dir().display()
    );
    Ok(ExitCode::SUCCESS)
}

pub fn doctor(data_dir: &Path) -> anyhow::Result<ExitCode> {
    let mut blocked = false;
    let layers = doctor::check();
    let width = layers
        .iter()
        .map(|l| l.name.len())
        .max()
        .unwrap_or(10)
        .max(18);
    for l in &layers {
        blocked |= l.blocks();
        println!("{:width$}  {:9}  {}", l.name, l.state.as_str(), l.detail);
    }
    for (name, path) in [
        ("runtime python", "/usr/bin/python3"),
        ("runtime bash", "/bin/bash"),
        ("runtime javascript", "/usr/bin/node"),
    ] {
        let version = std::process::Command::new(path)
            .arg("--version")
            .env_clear()
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                let text = if o.stdout.is_empty() {
                    o.stderr
                } else {
                    o.stdout
                };
                String::from_utf8_lossy(&text)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned()
            });
        let (state, detail) = match version {
            Some(v) => (State::Available, format!("{path}: {v}")),
            None if name == "runtime python" => {
                blocked = true;
                (State::Missing, format!("{path} not found: install python3"))
            }
            None => (State::Missing, format!("{path} not found")),
        };
        println!("{name:width$}  {:9}  {detail}", state.as_str());
    }
    if blocked {
        println!(
            "{:width$}  {:9}  a mandatory layer is missing: runcell refuses to run code",
            "sandbox", "missing"
        );
        return Ok(ExitCode::from(1));
    }
    // The layers above are what the host offers; this proves they compose into a sandbox.
    let mut req = OneShot::new(Language::Bash, "id -u; hostname");
    req.timeout = Duration::from_secs(20);
    let result =
        crate::engines::engine(data_dir).and_then(|e| Ok(e.run_once(&req, &mut |_, _| {})?));
    match result {
        Ok(o)
            if o.execution.status == ExecutionStatus::Ok
                && o.execution.stdout == "1000\nruncell\n" =>
        {
            println!(
                "{:width$}  {:9}  a test run took {} ms as uid 1000 on host runcell",
                "sandbox", "available", o.execution.usage.wall_ms
            );
            Ok(ExitCode::SUCCESS)
        }
        Ok(o) => {
            println!(
                "{:width$}  {:9}  test run ended {:?}: {}{}",
                "sandbox", "missing", o.execution.status, o.execution.stdout, o.execution.stderr
            );
            Ok(ExitCode::from(1))
        }
        Err(e) => {
            println!(
                "{:width$}  {:9}  test run failed: {e:#}",
                "sandbox", "missing"
            );
            Ok(ExitCode::from(1))
        }
    }
}
