//! Why an MCP listing or call failed, as the cell's exception says it.

use std::time::Duration;

/// Why an MCP call or listing failed; the message is what the cell's exception says.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error(
        "no MCP server {server:?} for this session: the operator has not configured one by \
         that name for this tenant (runcell_tools.mcp.servers() lists those it may use)"
    )]
    NotAvailable { server: String },
    #[error("the MCP server {server:?} has no tool {tool:?}")]
    UnknownTool { server: String, tool: String },
    #[error("MCP {server}.{tool}: the arguments must be an object of named values")]
    Arguments { server: String, tool: String },
    #[error(
        "MCP {server}.{tool}: the {what} are {size} bytes as JSON, over the limit of {limit} bytes"
    )]
    TooLarge {
        server: String,
        tool: String,
        what: &'static str,
        size: usize,
        limit: usize,
    },
    #[error("cannot reach the MCP server {server:?}: {why}")]
    Connect { server: String, why: String },
    #[error("MCP {server}.{tool}: no answer within {}s", after.as_secs())]
    Timeout {
        server: String,
        tool: String,
        after: Duration,
    },
    #[error(
        "the MCP server {server:?} stopped during the call ({why}); it is started again on the \
         next call, and this call was not repeated"
    )]
    Stopped { server: String, why: String },
    #[error("the MCP server {server:?} answered wrongly: {why}")]
    Protocol { server: String, why: String },
    /// The tool's own error (`isError`), its text as is.
    #[error("{message}")]
    Tool {
        server: String,
        tool: String,
        message: String,
    },
}

impl McpError {
    pub(super) fn from_service(server: &str, e: rmcp::ServiceError) -> McpError {
        match e {
            rmcp::ServiceError::McpError(data) => McpError::Tool {
                server: server.to_owned(),
                tool: String::new(),
                message: data.message.into_owned(),
            },
            other => McpError::Protocol {
                server: server.to_owned(),
                why: other.to_string(),
            },
        }
    }
}
