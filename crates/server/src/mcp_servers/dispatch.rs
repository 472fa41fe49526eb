//! The MCP servers behind the tool bridge (runcell-engine's `bridge.rs`): the calls of the
//! sandbox's `runcell_tools.mcp` arrive here by name, for the tenant that owns the session.
//!
//! - `mcp.<server>.<tool>` calls the tool (a tool name may contain dots: the server's name
//!   cannot) → the envelope of [`super::convert`];
//! - `mcp.<server>` lists the server's tools (an `import` of `runcell_tools.mcp.<server>`);
//! - `mcp.*` lists the servers the tenant may use (`runcell_tools.mcp.servers()`).
//!
//! Listings go through the bridge like calls, so an Execution's `tool_calls` (and the audit
//! log) show that the code imported a server, under the listing's name.

use std::sync::Arc;
use std::time::Duration;

use runcell_engine::bridge::{
    ToolCall, ToolDispatch, ToolError, ToolErrorKind, ToolFuture, MCP_PREFIX,
};
use serde_json::{json, Value};

use super::config::DEFAULT_CALL_TIMEOUT;
use super::error::McpError;
use super::registry::McpServers;

/// Makes `engine`'s session cells reach `servers` through the tool bridge (from now on; the
/// calls run on the calling tokio runtime). Nothing is installed when there are none.
pub fn install(servers: &Arc<McpServers>, engine: &runcell_engine::Engine) {
    if servers.is_empty() {
        return;
    }
    // The bridge's own limit a little past the longest server's: each server's timeout fires
    // first, with its name in the message.
    let longest = servers
        .configs()
        .map(|c| c.call_timeout)
        .max()
        .unwrap_or(DEFAULT_CALL_TIMEOUT);
    engine.set_mcp_dispatch(
        Arc::new(McpDispatch {
            servers: servers.clone(),
        }),
        tokio::runtime::Handle::current(),
        longest + Duration::from_secs(5),
    );
}

struct McpDispatch {
    servers: Arc<McpServers>,
}

impl ToolDispatch for McpDispatch {
    fn call(&self, call: ToolCall) -> ToolFuture {
        let servers = self.servers.clone();
        Box::pin(async move {
            // A local engine's owner is empty: the open tenant.
            let tenant = if call.owner.is_empty() {
                runcell_engine::OPEN_TENANT
            } else {
                call.owner.as_str()
            };
            dispatch(&servers, tenant, &call.name, call.input)
                .await
                .map_err(|e| ToolError::new(kind(&e), e.to_string()))
        })
    }
}

async fn dispatch(
    servers: &McpServers,
    tenant: &str,
    name: &str,
    input: Value,
) -> Result<Value, McpError> {
    let rest = name.strip_prefix(MCP_PREFIX).unwrap_or(name);
    if rest == "*" {
        return Ok(json!({ "servers": servers.names_for(tenant) }));
    }
    match rest.split_once('.') {
        None => servers.list_tools(tenant, rest).await,
        Some((server, tool)) => servers.call(tenant, server, tool, input).await,
    }
}

/// The bridge's kind for each failure: what the sandbox raises (`ToolRefused`, `ToolTimeout`,
/// `ToolTooLarge`, or `ToolError` for the tool's own error and a server that failed).
fn kind(e: &McpError) -> ToolErrorKind {
    match e {
        McpError::NotAvailable { .. } | McpError::UnknownTool { .. } => ToolErrorKind::Refused,
        McpError::TooLarge { .. } => ToolErrorKind::TooLarge,
        McpError::Timeout { .. } => ToolErrorKind::Timeout,
        McpError::Arguments { .. }
        | McpError::Connect { .. }
        | McpError::Stopped { .. }
        | McpError::Protocol { .. }
        | McpError::Tool { .. } => ToolErrorKind::Error,
    }
}
