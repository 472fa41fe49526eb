//! `runcell runtime install|list|remove`: the Python environments sessions run on.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use runcell_kernel::runtime::{InstallEvent, RuntimeInfo, Runtimes};

#[derive(Debug, clap::Subcommand)]
pub enum RuntimeCommand {
    /// Build the default Python runtime (numpy, pandas, matplotlib, ... pinned in runtime/python.lock).
    Install,
    /// List installed runtimes.
    List,
    /// Remove a runtime by name.
    Remove { name: String },
}

pub fn runtime(data_dir: &Path, cmd: RuntimeCommand) -> anyhow::Result<ExitCode> {
    let runtimes = Runtimes::new(data_dir);
    match cmd {
        RuntimeCommand::Install => {
            let info = ensure_default(data_dir)?;
            println!("{}", describe(&info));
        }
        RuntimeCommand::List => {
            let all = runtimes.list();
            if all.is_empty() {
                eprintln!("no runtime installed; `runcell runtime install` builds the default one");
            }
            for info in all {
                println!("{}", describe(&info));
            }
        }
        RuntimeCommand::Remove { name } => {
            runtimes
                .remove(&name)
                .with_context(|| format!("cannot remove runtime {name}"))?;
            eprintln!("removed {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn describe(info: &RuntimeInfo) -> String {
    format!(
        "{}  python {}  {} packages  {} MiB  {}",
        info.name,
        info.python_version,
        info.packages.len(),
        info.size_bytes >> 20,
        info.path.display()
    )
}

/// Installs the default runtime if it is missing, showing progress on stderr.
pub fn ensure_default(data_dir: &Path) -> anyhow::Result<RuntimeInfo> {
    let runtimes = Runtimes::new(data_dir);
    if let Some(info) = runtimes.default_runtime() {
        return Ok(info);
    }
    let tty = std::io::stderr().is_terminal();
    let bar = if tty {
        let b = indicatif::ProgressBar::new(1);
        b.set_style(
            indicatif::ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg:.dim}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        b.enable_steady_tick(Duration::from_millis(120));
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    eprintln!("installing the default Python runtime (first start only)");
    let result = runtimes.ensure_default(&mut |event| match event {
        InstallEvent::Step {
            index,
            total,
            message,
        } => {
            bar.set_length(total as u64);
            bar.set_position(index as u64);
            bar.set_message(message.to_owned());
            if !tty {
                eprintln!("[{index}/{total}] {message}");
            }
        }
        InstallEvent::Output(line) => {
            if tty {
                bar.set_message(line.trim().chars().take(100).collect::<String>());
            }
        }
    });
    bar.finish_and_clear();
    let info = result.context("cannot install the default Python runtime")?;
    eprintln!("runtime ready: {}", info.path.display());
    Ok(info)
}
