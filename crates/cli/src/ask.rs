//! `runcell ask`: the agent loop (DESIGN.md §8) in the terminal. The answer goes to stdout,
//! the files the code produced to `--out`, every cell to the audit log (the data dir's store,
//! tenant "default"), and with `--show-code` each cell and its output to stderr.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use runcell_agent::{
    Agent, AgentOptions, Gate, ProviderConfig, ProviderKind, StepEvent, StopReason,
};
use runcell_engine::tools::ToolCall;

mod approve;
mod out_dir;

#[derive(Debug, clap::Args)]
pub struct AskArgs {
    /// The question, in plain words.
    #[arg(value_name = "QUESTION")]
    question: String,
    /// A file uploaded into /workspace before the first step (repeatable).
    #[arg(long = "file", value_name = "PATH")]
    files: Vec<PathBuf>,
    /// The model API: any OpenAI-compatible Chat Completions endpoint (openai), Anthropic
    /// Messages (anthropic) or Gemini's generateContent (gemini, key in GEMINI_API_KEY).
    #[arg(long, default_value = "openai", value_parser = parse_provider, env = "RUNCELL_PROVIDER")]
    provider: ProviderKind,
    #[arg(long, value_name = "M", env = "RUNCELL_MODEL",
        help = format!("The model (default: {})", runcell_agent::default_models()))]
    model: Option<String>,
    /// The API's base URL (default https://api.openai.com/v1, https://api.anthropic.com or
    /// https://generativelanguage.googleapis.com/v1beta);
    /// e.g. http://localhost:11434/v1 for Ollama (no key needed then).
    #[arg(long, value_name = "URL")]
    base_url: Option<String>,
    /// Model replies at most.
    #[arg(long, default_value_t = 12, value_name = "N")]
    max_steps: usize,
    /// Where the files the code created or modified are saved. Existing files are kept (and
    /// reported) unless --force; symbolic links in DIR are never followed.
    #[arg(long, default_value = "runcell-out", value_name = "DIR")]
    out: PathBuf,
    /// Replace existing regular files in --out (never a symbolic link, a directory or anything
    /// else: those are still refused).
    #[arg(long)]
    force: bool,
    /// Print each cell and its output on stderr as it runs.
    #[arg(long)]
    show_code: bool,
    /// Show each cell before it runs and run it only on `y`: `n` declines (the model is told,
    /// with the reason asked for), `e` opens it in $EDITOR and runs the edited code. Answers
    /// are read from stdin; every decision is recorded in the audit log.
    #[arg(long)]
    approve: bool,
    /// An MCP server whose tools the model's code may call (code mode), repeatable:
    /// `NAME=COMMAND ARGS...` (stdio: a program started on this host as you, the line split
    /// into words as a shell would, never run by one) or `NAME=URL` (streamable HTTP). In the
    /// session it is `from runcell_tools.mcp import NAME`; the model is told its functions and
    /// sees only what its code prints (docs/tools.md).
    #[arg(long, value_name = "NAME=COMMAND...|NAME=URL")]
    mcp_server: Vec<String>,
}

pub(crate) fn parse_provider(s: &str) -> Result<ProviderKind, String> {
    s.parse()
}

pub fn ask(data_dir: &Path, args: AskArgs) -> anyhow::Result<ExitCode> {
    if args.max_steps == 0 {
        return Err(crate::args::invalid("--max-steps must be at least 1"));
    }
    let files = input_files(&args.files)?;
    let provider = ProviderConfig::from_env(args.provider, args.model, args.base_url)?;

    let mcp_servers = mcp_servers(&args.mcp_server)?;

    let store = crate::audit::open_store(data_dir)?;
    let engine = crate::engines::audited_engine(data_dir, &store)?;
    // The MCP clients run on a runtime of their own (the agent loop is synchronous); it lives
    // until the run ends.
    let _mcp_runtime = match &mcp_servers {
        None => None,
        Some(servers) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("runcell-ask-mcp")
                .enable_all()
                .build()
                .context("cannot start the MCP clients' runtime")?;
            let _entered = rt.enter();
            runcell_server::mcp_servers::install(servers, &engine);
            Some(rt)
        }
    };

    // Ctrl-C or SIGTERM: end the session (sandbox and workspace) before leaving.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])?;
    let on_signal = engine.clone();
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            eprintln!("runcell: interrupted; ending the session");
            on_signal.sessions().shutdown();
            std::process::exit(130);
        }
    });

    let agent = Agent::new(engine.clone(), provider)?;
    let opts = AgentOptions {
        max_steps: args.max_steps,
        owner: runcell_engine::OPEN_TENANT.to_owned(),
        ..AgentOptions::default()
    };
    let show = args.show_code;
    let approve = args.approve;
    let mut on_step = |event: StepEvent<'_>| {
        // With --approve the cell was shown already, with the prompt.
        if show && !(approve && matches!(event, StepEvent::ToolCall { .. })) {
            show_step(&event);
        }
    };
    let mut decide = |p: &runcell_agent::Proposal<'_>| approve::decide(p).into();
    let gate = approve.then(|| Gate {
        by: approve::decided_by(),
        decide: &mut decide,
    });
    let outcome = agent.run_gated(&args.question, &files, &opts, &mut on_step, gate);
    engine.sessions().shutdown();
    let outcome = outcome?;

    // The files go to disk before the answer is printed, but a problem with them never loses
    // the answer: it is reported, and the exit code says so.
    let saved = out_dir::save(&args.out, &outcome.files_produced, args.force);
    let files_ok = match &saved {
        Ok(report) => report.refused == 0,
        Err(e) => {
            eprintln!("runcell: the files were not saved: {e:#}");
            false
        }
    };

    let mut stdout = std::io::stdout().lock();
    match outcome.stop {
        StopReason::Answer => {
            writeln!(stdout, "{}", outcome.answer.trim_end())?;
            Ok(if files_ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
        stop => {
            if !outcome.answer.trim().is_empty() {
                writeln!(stdout, "{}", outcome.answer.trim_end())?;
            }
            eprintln!(
                "runcell: no final answer: {}",
                match stop {
                    StopReason::MaxSteps => format!(
                        "the model was still calling tools after {} steps (raise --max-steps)",
                        outcome.steps
                    ),
                    _ => format!(
                        "{} tool calls failed in a row",
                        opts.max_consecutive_failures
                    ),
                }
            );
            Ok(ExitCode::from(1))
        }
    }
}

/// The `--mcp-server`s, or None without any. The user running `ask` is its only tenant, so
/// every server is open to it (serve's `--mcp-server-tenants` has nothing to decide here).
fn mcp_servers(
    flags: &[String],
) -> anyhow::Result<Option<std::sync::Arc<runcell_server::mcp_servers::McpServers>>> {
    use runcell_server::mcp_servers::{McpServerConfig, McpServers, TenantAccess};
    if flags.is_empty() {
        return Ok(None);
    }
    let configs = flags
        .iter()
        .map(|f| {
            let mut c = McpServerConfig::parse_flag(f)
                .map_err(|e| crate::args::invalid(format!("--mcp-server {f}: {e}")))?;
            c.tenants = TenantAccess::All;
            Ok(c)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let servers = McpServers::new(configs).map_err(|e| crate::args::invalid(format!("{e}")))?;
    Ok(Some(std::sync::Arc::new(servers)))
}

/// The `--file`s, read, each named after its file name in /workspace.
pub(crate) fn input_files(paths: &[PathBuf]) -> anyhow::Result<Vec<runcell_engine::InputFile>> {
    paths
        .iter()
        .map(|f| {
            let content =
                std::fs::read(f).with_context(|| format!("cannot read --file {}", f.display()))?;
            let name = f
                .file_name()
                .and_then(|n| n.to_str())
                .with_context(|| format!("--file {} has no usable file name", f.display()))?;
            Ok(runcell_engine::InputFile {
                path: name.to_owned(),
                content,
            })
        })
        .collect()
}

fn show_step(event: &StepEvent<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = match event {
        StepEvent::ToolsListed { section } => {
            writeln!(err, "── code mode ──\n{}", section.trim_end())
        }
        StepEvent::Model { step, reply } => {
            if reply.text.trim().is_empty() || reply.calls.is_empty() {
                Ok(())
            } else {
                writeln!(err, "── model (step {step}) ──\n{}", reply.text.trim_end())
            }
        }
        StepEvent::ToolCall { step, call } => {
            let body = match ToolCall::parse(&call.name, call.input.clone()) {
                Ok(ToolCall::Python(i)) => i.code,
                Ok(ToolCall::Bash(i)) => i.command,
                Ok(ToolCall::TextEditor(i)) => format!("{} {}", i.command, i.path),
                Err(_) => call.arguments.clone(),
            };
            writeln!(
                err,
                "── {} (step {step}) ──\n{}",
                call.name,
                body.trim_end()
            )
        }
        StepEvent::ToolResult { output, .. } => writeln!(
            err,
            "── output{} ──\n{}",
            if output.is_error { " (error)" } else { "" },
            output.text.trim_end()
        ),
    };
}
