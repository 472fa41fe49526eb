//! `runcell run`: one program, one fresh sandbox.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

use crate::args::SandboxArgs;
use anyhow::Context;
use runcell_engine::{ExecutionStatus, LimitsRequest, OneShot, Stream};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Let the program reach this domain through runcell's egress proxy (HTTP and HTTPS;
    /// `pypi.org`, `*.example.com` or an IP literal; comma-separated, repeatable). Without it
    /// the program has no network at all.
    #[arg(long = "allow-domain", value_delimiter = ',', value_name = "DOMAIN")]
    allow_domains: Vec<String>,
    /// An address range the proxy may connect to although it is loopback, private,
    /// link-local or this host's own (e.g. 127.0.0.0/8 for a local test server; repeatable).
    #[arg(long = "allow-cidr", value_delimiter = ',', value_name = "CIDR")]
    allow_cidrs: Vec<String>,
    /// Wall-clock limit in seconds; the whole process tree is killed after it.
    #[arg(long, default_value_t = runcell_engine::ONE_SHOT_TIMEOUT.as_secs_f64(), value_name = "S")]
    timeout: f64,
    /// The program file, or `-` to read it from stdin.
    #[arg(value_name = "FILE|-", required_unless_present = "batch")]
    program: Option<String>,
    /// Run a batch instead: one run per line of FILE (`-`: stdin), each a JSON object as
    /// `POST /v1/execute` takes it (`language`, `code`, `files`, `stdin`, `timeout_s`, `args`,
    /// `tests`, ...); one finished run per line on stdout, as `POST /v1/batch` streams them.
    #[arg(long, value_name = "FILE.jsonl", conflicts_with = "program")]
    batch: Option<std::path::PathBuf>,
    /// With `--batch`: runs at once (default: the CPUs).
    #[arg(long, value_name = "N", requires = "batch")]
    concurrency: Option<usize>,
}

pub fn run(data_dir: &Path, args: RunArgs) -> anyhow::Result<ExitCode> {
    if let Some(file) = &args.batch {
        return crate::batch::run_batch(data_dir, file, args.concurrency);
    }
    let program = args.program.clone().unwrap_or_default();
    let code = if program == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("cannot read the program from stdin")?;
        s
    } else {
        std::fs::read_to_string(&program)
            .with_context(|| format!("cannot read the program file {program}"))?
    };
    let json = args.sandbox.json;
    let mut req = OneShot::new(args.sandbox.lang, code);
    req.timeout = crate::args::timeout(args.timeout)?;
    req.limits = LimitsRequest {
        memory_mb: args.sandbox.memory,
        ..LimitsRequest::default()
    };
    req.files = args.sandbox.input_files()?;

    // Ctrl-C or SIGTERM end the program, not runcell: it still kills the sandbox, removes the
    // workspace and reports how the program ended.
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, cancel.clone())?;
    }
    req.cancel = Some(cancel.clone());
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let mut on_output = |stream: Stream, data: &[u8]| {
        if json {
            return;
        }
        // A closed terminal or pipe must not stop the run; its output is still recorded.
        let _ = match stream {
            Stream::Stdout => stdout
                .lock()
                .write_all(data)
                .and_then(|_| stdout.lock().flush()),
            Stream::Stderr => stderr.lock().write_all(data),
        };
    };
    // A `runcell serve` on this data dir runs it forked from its zygote (crate::local); a
    // network allowlist is this command's own policy, which the server's may not allow.
    let local = match args.allow_domains.is_empty() && args.allow_cidrs.is_empty() {
        true => {
            let r = crate::local::request(
                req.language,
                &req.code,
                &req.files,
                req.limits.memory_mb,
                args.timeout,
            );
            crate::local::run(data_dir, &r, &cancel, &mut on_output)?
        }
        false => None,
    };
    let outcome = match local {
        Some(done) => runcell_engine::OneShotOutcome {
            execution: done.execution,
            exit_code: done.exit_code,
        },
        None => run_here(
            data_dir,
            req,
            args.allow_domains,
            args.allow_cidrs,
            &mut on_output,
        )?,
    };
    report(json, &outcome)
}

/// Runs `req` in a sandbox made by this process.
fn run_here(
    data_dir: &Path,
    mut req: OneShot,
    allow_domains: Vec<String>,
    allow_cidrs: Vec<String>,
    on_output: &mut dyn FnMut(Stream, &[u8]),
) -> anyhow::Result<runcell_engine::OneShotOutcome> {
    // The caller is the operator here: what it allows is both the bound and the policy.
    if !allow_domains.is_empty() {
        req.network = runcell_engine::NetworkPolicy::Allowlist {
            allowed_domains: allow_domains.clone(),
            domain_secrets: Vec::new(),
        };
    }
    let engine = crate::engines::engine_with_network(
        data_dir,
        runcell_engine::NetworkConfig {
            allow_domains,
            allow_cidrs,
            ..Default::default()
        },
    )?;
    Ok(engine.run_once(&req, on_output)?)
}

/// The end of the run on the terminal (or as JSON), and the exit code.
fn report(json: bool, outcome: &runcell_engine::OneShotOutcome) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let execution = &outcome.execution;

    if json {
        let mut out = stdout.lock();
        serde_json::to_writer(&mut out, execution)?;
        writeln!(out)?;
    } else {
        // What was streamed live is the head of each stream; finish with the marker and tail.
        for (text, truncated, is_err) in [
            (&execution.stdout, execution.truncated.stdout, false),
            (&execution.stderr, execution.truncated.stderr, true),
        ] {
            if truncated {
                if let Some(pos) = text.find("\n[… ") {
                    let rest = &text[pos..];
                    let _ = if is_err {
                        stderr.lock().write_all(rest.as_bytes())
                    } else {
                        stdout.lock().write_all(rest.as_bytes())
                    };
                }
            }
        }
        match execution.status {
            ExecutionStatus::Ok | ExecutionStatus::Error => {}
            _ => {
                if let Some(e) = &execution.error {
                    eprintln!("runcell: {}: {}", e.name, e.value);
                }
            }
        }
    }
    Ok(ExitCode::from(exit_code(
        execution.status,
        outcome.exit_code,
    )))
}

/// The program's exit code; 124 for a timeout (as timeout(1)); 128 + signal when killed.
fn exit_code(status: ExecutionStatus, program: i32) -> u8 {
    match status {
        ExecutionStatus::Timeout => 124,
        _ => u8::try_from(program).unwrap_or(1),
    }
}
