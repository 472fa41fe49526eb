//! `runcell serve`: the HTTP API on one node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
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
}

pub fn serve(data_dir: &Path, args: ServeArgs) -> anyhow::Result<ExitCode> {
    if let Some(c) = &args.config {
        bail!(
            "invalid request: --config {} is not supported yet; use the flags",
            c.display()
        );
    }
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
    let preload = (!args.no_zygote).then(|| args.preload.clone());
    let engine = crate::audited_engine(data_dir, &store, preload)?;

    let (recovered, dead) = runcell_server::recover_sessions(&engine, &store)?;
    if recovered + dead > 0 {
        tracing::warn!(
            recovered,
            dead,
            "sessions of a previous run: recovered ones have their files and a fresh kernel"
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("runcell-http")
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        let addr = listener.local_addr()?;
        if has_keys {
            tracing::info!(%addr, "runcell listening; API keys required");
        } else {
            tracing::warn!(%addr, "runcell listening without API keys (loopback only): anyone on this machine can run code");
        }
        eprintln!("runcell serving on http://{addr}");
        let state = runcell_server::state(engine.clone(), store, addr.ip().is_loopback());
        let router = runcell_server::app(state);
        runcell_server::serve(listener, router, shutdown_signal()).await?;
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
