//! `runcell mcp`: an MCP server over stdio with a local engine (no server process). stdout is
//! the protocol; logs and runtime installation progress go to stderr.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use rmcp::ServiceExt;
use runcell_server::mcp::McpHandler;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

pub fn mcp(data_dir: &Path) -> anyhow::Result<ExitCode> {
    let engine = crate::engines::engine_with_runtime(data_dir)?;
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
            .serve(checked_stdio())
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

/// stdin and stdout for rmcp, with a line rmcp cannot take (not JSON, not JSON-RPC) answered
/// with a JSON-RPC error (`"id": null` when it has none) instead of dropped without a word.
/// rmcp reads the good lines from one pipe and writes to another; one task owns stdout, so
/// its replies and these errors never interleave within a line.
fn checked_stdio() -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
    const PIPE: usize = 1 << 20;
    let (rmcp_in, mut to_rmcp) = tokio::io::duplex(PIPE);
    let (from_rmcp, rmcp_out) = tokio::io::duplex(PIPE);
    let (errors, mut error_lines) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        let mut stdin = tokio::io::BufReader::new(tokio::io::stdin());
        let mut line = Vec::new();
        loop {
            line.clear();
            match stdin.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let text = line.trim_ascii();
            if text.is_empty() {
                continue;
            }
            match runcell_server::mcp::stdio_refusal(text) {
                Some(reply) => {
                    let mut out = reply.to_string().into_bytes();
                    out.push(b'\n');
                    let _ = errors.send(out);
                }
                None => {
                    if to_rmcp.write_all(text).await.is_err()
                        || to_rmcp.write_all(b"\n").await.is_err()
                    {
                        break;
                    }
                }
            }
        }
        // EOF: rmcp sees its input end, and the connection closes.
        let _ = to_rmcp.shutdown().await;
    });
    tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        let mut replies = tokio::io::BufReader::new(from_rmcp);
        let mut line = Vec::new();
        loop {
            // A read cut short by an error line keeps what it read in `line` and goes on.
            let out = tokio::select! {
                read = replies.read_until(b'\n', &mut line) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(_) => std::mem::take(&mut line),
                },
                Some(error) = error_lines.recv() => error,
            };
            if stdout.write_all(&out).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    (rmcp_in, rmcp_out)
}
