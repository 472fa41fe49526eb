//! `runcell mcp`: an MCP server over stdio with a local engine (no server process). stdout is
//! the protocol; logs and runtime installation progress go to stderr.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use rmcp::ServiceExt;
use runcell_server::mcp::McpHandler;

pub fn mcp(data_dir: &Path) -> anyhow::Result<ExitCode> {
    let engine = crate::engine_with_runtime(data_dir)?;
    // An earlier `runcell mcp` killed with -9 left its workspace mounted.
    if let Err(e) = crate::doctor::sweep_orphans(data_dir, &engine) {
        tracing::warn!(error = %format!("{e:#}"), "cannot look for orphaned workspaces");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("runcell-mcp")
        .build()?;
    let handler = McpHandler::local(engine.clone(), "local");
    let result = rt.block_on(async {
        tracing::info!("runcell MCP server on stdio");
        let service = handler
            .clone()
            .serve(rmcp::transport::stdio())
            .await
            .context("the MCP client did not complete the handshake")?;
        let reason = service.waiting().await;
        tracing::info!(?reason, "MCP client disconnected");
        anyhow::Ok(())
    });
    // The connection is over (EOF): its session goes, and any other this process started.
    handler.close();
    engine.sessions().shutdown();
    // Don't wait for tokio's blocking stdin reader: it only returns on input.
    rt.shutdown_background();
    result?;
    Ok(ExitCode::SUCCESS)
}
