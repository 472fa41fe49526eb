//! `runcell serve`: the HTTP API on one node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use runcell_agent::{ProviderConfig, ProviderKind};
use runcell_sandbox::doctor::{self, State};

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on. Beyond loopback, API keys are required (`runcell keys create`).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// A configuration file (reserved; every setting has a flag today).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Modules the zygote imports before forking Python sessions (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = runcell_engine::DEFAULT_PRELOAD.iter().map(|m| m.to_string()))]
    preload: Vec<String>,
    /// Start every Python session cold, without the preloaded zygote.
    #[arg(long)]
    no_zygote: bool,
    /// Python sessions kept started ahead of demand (forked from the zygote), so creating one
    /// with the default limits and no environment takes no fork; 0 turns this off.
    #[arg(long, default_value_t = 2, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=64))]
    warm_sessions: u16,
    /// Turns the web page's chat on: the model API the agent loop talks to (openai: any
    /// Chat Completions endpoint; anthropic: Messages). The key comes from OPENAI_API_KEY or
    /// ANTHROPIC_API_KEY, as for `runcell ask`.
    #[arg(long, value_name = "PROVIDER", value_parser = crate::ask::parse_provider, env = "RUNCELL_AGENT_PROVIDER")]
    agent_provider: Option<ProviderKind>,
    /// The chat's model (default: gpt-4.1 for openai, claude-sonnet-4-5 for anthropic).
    #[arg(
        long,
        value_name = "M",
        env = "RUNCELL_AGENT_MODEL",
        requires = "agent_provider"
    )]
    agent_model: Option<String>,
    /// The chat's API base URL, e.g. http://localhost:11434/v1 for Ollama (no key needed then).
    #[arg(
        long,
        value_name = "URL",
        env = "RUNCELL_AGENT_BASE_URL",
        requires = "agent_provider"
    )]
    agent_base_url: Option<String>,
    /// Model replies at most per chat question.
    #[arg(long, default_value_t = 12, value_name = "N")]
    agent_max_steps: usize,
    /// CPU scheduling policy of the server and its sessions: `batch` (woken threads do not
    /// preempt running ones: fewer context switches, more executions per second) or
    /// `normal` (the default policy: lower latency when sessions keep the CPUs busy).
    #[arg(long, value_enum, default_value_t = Scheduling::Batch, value_name = "POLICY")]
    scheduling: Scheduling,
    /// Host names the server also answers to (comma-separated, repeatable), e.g. the public
    /// name a reverse proxy forwards: `NAME` on any port, `NAME:PORT` on that port. Without
    /// it, a request naming any host but localhost or the listener's address, with the
    /// listener's port, is refused (403: DNS rebinding).
    #[arg(long, value_delimiter = ',', value_name = "HOST[:PORT]")]
    allowed_hosts: Vec<runcell_server::AllowedHost>,
    /// Serves /metrics on this address, without a key, and not on --listen (where, once keys
    /// exist, it otherwise needs one).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Connections served at once; past it a few more are answered 503 and the rest wait in
    /// the listen backlog. Default: a quarter of the descriptors left beside the server's
    /// own, at most 1024; sessions get the rest (the session cap is derived from it).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: Option<u32>,
    /// Seconds a client has to send a request's head, from connecting or its first byte.
    #[arg(long, default_value_t = 30, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_timeout: u64,
    /// Seconds an idle keep-alive connection stays open between requests.
    #[arg(long, default_value_t = 60, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    keep_alive_timeout: u64,
    /// Seconds a request body may take before --body-min-rate applies.
    #[arg(long, default_value_t = 30, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
    body_timeout: u64,
    /// Bytes per second a request body must average after --body-timeout (each byte buys
    /// 1/RATE s more): slower uploads are cut with 408.
    #[arg(long, default_value_t = 8192, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    body_min_rate: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Scheduling {
    Batch,
    Normal,
}

pub fn serve(data_dir: &Path, args: ServeArgs) -> anyhow::Result<ExitCode> {
    if let Some(c) = &args.config {
        bail!(
            "invalid request: --config {} is not supported yet; use the flags",
            c.display()
        );
    }
    // Before any thread exists: every thread and process started from here on inherits it.
    if let Err(e) = runcell_sandbox::set_batch_scheduling(args.scheduling == Scheduling::Batch) {
        tracing::warn!(error = %e, policy = ?args.scheduling, "cannot set the scheduling policy");
    }
    let open_files = match runcell_sandbox::raise_nofile_soft_limit() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open files limit");
            1024
        }
    };
    // Sessions and connections share the descriptors: each gets a budget, so a flood of
    // connections never leaves a session's kernel without one.
    let capacity = runcell_server::Capacity::derive(
        open_files,
        args.warm_sessions.into(),
        args.max_connections.map(|n| n as usize),
    )
    .map_err(|m| anyhow::anyhow!("invalid request: {m}"))?;
    tracing::info!(
        open_files,
        max_connections = capacity.max_connections,
        max_sessions = capacity.max_sessions,
        "capacity"
    );
    let serve_options = runcell_server::ServeOptions {
        max_connections: capacity.max_connections,
        header_timeout: std::time::Duration::from_secs(args.header_timeout),
        keep_alive_timeout: std::time::Duration::from_secs(args.keep_alive_timeout),
        body_timeout: std::time::Duration::from_secs(args.body_timeout),
        body_min_rate: args.body_min_rate,
    };
    // Every layer's state, for the operator: degraded layers are named, missing mandatory
    // layers stop the server.
    for layer in doctor::check() {
        match layer.state {
            State::Available => tracing::info!(layer = layer.name, "{}", layer.detail),
            State::Degraded | State::Missing if !layer.mandatory => {
                tracing::warn!(
                    layer = layer.name,
                    state = layer.state.as_str(),
                    "{}",
                    layer.detail
                )
            }
            _ => tracing::error!(
                layer = layer.name,
                state = layer.state.as_str(),
                "{}",
                layer.detail
            ),
        }
    }
    let store = runcell_store::Store::open(&data_dir.join("runcell.db"))
        .context("cannot open the database")?;
    let has_keys = store.has_active_keys()?;
    if !has_keys && !args.listen.ip().is_loopback() {
        bail!(
            "refusing to listen on {} without API keys: create one with `runcell keys create --name NAME`, or listen on 127.0.0.1",
            args.listen
        );
    }
    // A misconfigured chat (no key, say) stops the server now rather than failing each question.
    let chat = match args.agent_provider {
        Some(kind) => {
            if args.agent_max_steps == 0 {
                bail!("invalid request: --agent-max-steps must be at least 1");
            }
            let provider = ProviderConfig::from_env(kind, args.agent_model, args.agent_base_url)
                .context("cannot configure the chat's model provider")?;
            tracing::info!(provider = kind.name(), model = %provider.model, base_url = %provider.base_url, "chat enabled");
            Some(runcell_server::ChatConfig {
                provider,
                max_steps: args.agent_max_steps,
            })
        }
        None => {
            tracing::info!("chat disabled: no --agent-provider");
            None
        }
    };
    let preload = (!args.no_zygote).then(|| args.preload.clone());
    let engine = crate::audited_engine(data_dir, &store, preload)?;
    engine.sweep_stale_cgroups();
    engine.sessions().set_max_sessions(capacity.max_sessions);

    let (recovered, dead) = runcell_server::recover_sessions(&engine, &store)?;
    if recovered + dead > 0 {
        tracing::warn!(
            recovered,
            dead,
            "sessions of a previous run: recovered ones have their files and a fresh kernel"
        );
    }
    // Only now: a warm session must not take the uid of a workspace being recovered.
    engine.sessions().start_warm_pool(args.warm_sessions.into());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("runcell-http")
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        let metrics_listener = match args.metrics_listen {
            Some(at) => {
                let l = tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("cannot listen on {at} for metrics"))?;
                tracing::info!(addr = %l.local_addr()?, "metrics on their own listener");
                Some(l)
            }
            None => None,
        };
        if has_keys {
            tracing::info!(%addr, "runcell listening; API keys required");
        } else {
            tracing::warn!(%addr, "runcell listening without API keys (loopback only): anyone on this machine can run code");
        }
        eprintln!("runcell serving on http://{addr}");
        let mut state = runcell_server::state(engine.clone(), store, addr)
            .with_allowed_hosts(args.allowed_hosts);
        if let Some(chat) = chat {
            state = state.with_chat(chat);
        }
        let metrics = match metrics_listener {
            Some(l) => {
                let app = runcell_server::metrics_app(&state, l.local_addr()?);
                state = state.without_metrics();
                // Ends with the main listener: scrapes in flight need no draining.
                // A scraper or two: its few connections fit in the server's reserve.
                let options = runcell_server::ServeOptions {
                    max_connections: 16,
                    ..serve_options.clone()
                };
                Some(tokio::spawn(runcell_server::serve_with(
                    l,
                    app,
                    std::future::pending(),
                    options,
                )))
            }
            None => None,
        };
        let router = runcell_server::app(state);
        runcell_server::serve_with(listener, router, shutdown_signal(), serve_options).await?;
        if let Some(m) = metrics {
            m.abort();
        }
        tracing::info!("shutting down: ending sessions");
        tokio::task::spawn_blocking(move || engine.sessions().shutdown()).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    // Open MCP event streams would keep graceful shutdown waiting forever.
    runcell_server::mcp::end_streams();
}
