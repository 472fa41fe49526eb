//! The `runcell` command: clap commands over the engine; thin glue, anyhow at the top.
#![forbid(unsafe_code)]

mod args;
mod ask;
mod audit;
mod batch;
mod c2pa;
mod config;
mod doctor;
mod engines;
mod keys;
mod local;
mod mcp;
mod repl;
mod replay;
mod run;
mod runtime;
mod serve;
mod snapshot_store;
mod tools;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "runcell",
    version,
    about = "A self-hosted code interpreter for AI agents"
)]
struct Cli {
    /// Where runcell keeps its state (workspaces, database, runtimes).
    #[arg(long, global = true, env = "RUNCELL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The audit chain's secret key (default: DIR/keys/audit-chain.key, created if missing).
    /// Every command on one data dir must use the same.
    #[arg(
        long,
        global = true,
        env = "RUNCELL_AUDIT_KEY_FILE",
        value_name = "FILE"
    )]
    audit_key_file: Option<PathBuf>,
    /// The key audit checkpoints are signed with (default: DIR/keys/audit-signing.key,
    /// created if missing).
    #[arg(
        long,
        global = true,
        env = "RUNCELL_AUDIT_SIGNING_KEY_FILE",
        value_name = "FILE"
    )]
    audit_signing_key_file: Option<PathBuf>,
    /// The database: a PostgreSQL URL (`postgres://USER:PASSWORD@HOST:PORT/DB`) shared by
    /// several `runcell serve` nodes, their `keys` and `audit` commands [default: SQLite in the
    /// data dir]. Every node needs the same audit key files (docs/scale.md).
    #[arg(long, global = true, env = "RUNCELL_DATABASE_URL", value_name = "URL")]
    database: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API (and the web page) on this machine.
    Serve(Box<serve::ServeArgs>),
    /// Run a program once in a fresh sandbox; its output is streamed and its exit code returned.
    Run(run::RunArgs),
    /// One stateful session in the terminal (cells separated by `%%` lines when piped).
    Repl(repl::ReplArgs),
    /// Ask a model a question it answers by running code (the agent loop), with these files.
    Ask(ask::AskArgs),
    /// An MCP server over stdio (for Claude Desktop and any MCP client), with a local engine.
    Mcp,
    /// Print the model tool definitions (python, bash, text_editor) for a function-calling API.
    Tools(tools::ToolsArgs),
    /// Check every isolation layer of this host and say what is available, degraded or missing.
    Doctor(DoctorArgs),
    /// Manage the Python runtimes sessions run on.
    #[command(subcommand)]
    Runtime(runtime::RuntimeCommand),
    /// Manage API keys (stored hashed; the key is shown once).
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Read and verify the tamper-evident audit log of executions.
    #[command(subcommand)]
    Audit(keys::AuditCommand),
    /// Check a file an execution produced against its signed provenance statement; non-zero
    /// exit, with the reason, when the file or the statement was changed.
    Verify(verify::VerifyArgs),
}

#[derive(Debug, clap::Args)]
struct DoctorArgs {
    /// Instead: remove the session workspaces a killed runcell process (`runcell mcp`, or a
    /// server killed with -9) left mounted under the data dir, when no live process holds
    /// them and the database does not name them.
    #[arg(long)]
    clean: bool,
}

/// mimalloc for the server's own allocations: under load glibc's allocator (with its
/// `malloc_consolidate` passes) was ~8 µs of each execution's CPU; mimalloc gave 2-8% more
/// executions per second (docs/benchmarks.md). Only there: every other command (`runcell run`
/// above all) and the sandbox helpers keep the C library's, since mimalloc's start (a 1 GiB
/// arena on zeroed 2 MiB pages) cost `runcell run` ~1 ms before its sandbox was even cloned
/// (runcell_sandbox::alloc). Python in the sandboxes keeps its own allocator either way:
/// libpython calls the C library's `malloc`, not this one.
#[global_allocator]
static GLOBAL: runcell_sandbox::alloc::ServerOnly<mimalloc::MiMalloc> =
    runcell_sandbox::alloc::ServerOnly(mimalloc::MiMalloc);

fn main() -> ExitCode {
    // When started as the sandbox init helper this never returns. It must come before anything
    // else: the helper has to stay a plain single-threaded process.
    runcell_sandbox::run_if_init();

    let cli = Cli::parse();
    init_logging();
    // Absolute from here on: the sandboxes' bind mounts, the server's socket and every path a
    // zygote is handed must not depend on the working directory (`--data-dir data` used to
    // start a server whose every one-shot failed with "workspace must be an absolute path").
    let explicit_data_dir = match cli
        .data_dir
        .as_deref()
        .map(config::absolute_data_dir)
        .transpose()
    {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("runcell: {e:#}");
            return ExitCode::from(2);
        }
    };
    let data_dir = explicit_data_dir.clone().unwrap_or_else(default_data_dir);
    audit::set_key_files(audit::KeyFiles {
        chain: cli.audit_key_file,
        signing: cli.audit_signing_key_file,
        database: cli.database,
    });
    let result = match cli.command {
        Command::Serve(args) => serve::serve(explicit_data_dir.as_deref(), data_dir, *args),
        Command::Run(args) => run::run(&data_dir, args),
        Command::Repl(args) => repl::repl(&data_dir, args),
        Command::Ask(args) => ask::ask(&data_dir, args),
        Command::Mcp => mcp::mcp(&data_dir),
        Command::Tools(args) => tools::tools(args),
        Command::Doctor(DoctorArgs { clean: true }) => doctor::clean(&data_dir),
        Command::Doctor(DoctorArgs { clean: false }) => doctor::doctor(&data_dir),
        Command::Runtime(cmd) => runtime::runtime(&data_dir, cmd),
        Command::Keys(cmd) => keys::keys(&data_dir, cmd),
        Command::Audit(cmd) => keys::audit(&data_dir, cmd),
        Command::Verify(args) => verify::verify(&data_dir, args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            if let Some(hint) = hint_for(&e) {
                eprintln!("hint: {hint}");
            }
            ExitCode::from(2)
        }
    }
}

fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let ansi = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        && std::io::stderr().is_terminal();
    tracing_subscriber::fmt()
        // The C2PA SDK logs each signature's and each check's phases at info.
        .with_env_filter(
            EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| "info,c2pa=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

/// `$RUNCELL_DATA_DIR` is handled by clap; otherwise `~/.local/share/runcell`.
fn default_data_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("/var/lib"))
        .join("runcell")
}

const DOCTOR_HINT: &str = "run `runcell doctor` to see which isolation layer is missing and why";
const CHAIN_KEY_HINT: &str = "pass the chain key file it was keyed with: --audit-key-file FILE (or RUNCELL_AUDIT_KEY_FILE); see docs/operations.md, \"Key files\"";
const HELP_HINT: &str = "see `runcell run --help` for the accepted values";

/// What to do about `e`, chosen by the kinds of error in its chain.
fn hint_for(e: &anyhow::Error) -> Option<&'static str> {
    use runcell_engine::EngineError;
    use runcell_store::StoreError;
    let engine = || e.chain().filter_map(|c| c.downcast_ref::<EngineError>());
    if engine().any(|e| {
        matches!(
            e,
            EngineError::IsolationMissing { .. }
                | EngineError::Unavailable(_)
                | EngineError::NoThread { .. }
        )
    }) {
        Some(DOCTOR_HINT)
    } else if e
        .chain()
        .any(|c| matches!(c.downcast_ref(), Some(StoreError::WrongChainKey { .. })))
    {
        Some(CHAIN_KEY_HINT)
    } else if e.chain().any(|c| c.is::<args::InvalidArgs>())
        || engine().any(|e| matches!(e, EngineError::InvalidRequest(_)))
    {
        Some(HELP_HINT)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_engine::{EngineError, Invalid};

    /// Hints follow the kind of error anywhere in the chain, never its text.
    #[test]
    fn hints_are_chosen_by_kind() {
        let missing = EngineError::IsolationMissing { layers: Vec::new() };
        assert_eq!(hint_for(&missing.into()), Some(DOCTOR_HINT));
        let invalid = anyhow::Error::from(EngineError::InvalidRequest(Invalid::NulInCommand))
            .context("cannot run the program");
        assert_eq!(hint_for(&invalid), Some(HELP_HINT));
        let flag = args::invalid("--memory must be a number");
        assert_eq!(hint_for(&flag), Some(HELP_HINT));
        let key = runcell_store::StoreError::WrongChainKey {
            path: "k".into(),
            expected: "a".into(),
            found: "holds key b".into(),
        };
        assert_eq!(hint_for(&key.into()), Some(CHAIN_KEY_HINT));
        // Control: the same words in a message of another kind get no hint.
        let words = anyhow::anyhow!("invalid request: runcell cannot run code on this host");
        assert_eq!(hint_for(&words), None);
    }
}
