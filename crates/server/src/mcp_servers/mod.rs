//! The operator's MCP servers, for code in the sandbox (issue 22: `from runcell_tools.mcp
//! import github`). runcell is their MCP client (rmcp): stdio servers are programs it starts on
//! the host as the operator configured them (they are the operator's tools, not user code, and
//! nothing a session sends ever reaches their command line), HTTP servers are streamable HTTP
//! endpoints. A session's code reaches them only through the tool bridge, and only the servers
//! its tenant may use ([`TenantAccess`]).
//!
//! Per server: one connection, started on first use and again after it closes (a server that
//! died is started anew by the next call; the call it died in fails with a clear error, never
//! resent: a tool's side effects must not happen twice); its tool list cached (refreshed on
//! `tools/list_changed`, after 30 s, and when a call names a tool not in it); at most
//! `max_concurrency` calls at once; each call within `call_timeout`; arguments and results
//! bounded ([`MAX_ARGUMENT_BYTES`], [`MAX_RESULT_BYTES`]).

mod config;
mod connection;
mod convert;
mod dispatch;
mod error;
mod registry;

pub use config::{
    check_name, http, parse_tenants_flag, stdio, McpConfigError, McpServerConfig, McpTransport,
    TenantAccess, DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_CONCURRENCY,
};
pub use convert::{convert, ConvertError};
pub use dispatch::install;
pub use error::McpError;
pub use registry::{McpServers, MAX_ARGUMENT_BYTES, MAX_RESULT_BYTES};
