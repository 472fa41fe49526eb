//! The server's MCP dispatcher, for every cell of every session (issue 22: the operator's MCP
//! servers as `runcell_tools.mcp.<server>`). Client tools are the execute request's own
//! ([`ExecTools`], bridge.rs); MCP servers are the operator's and reachable from any cell
//! (the HTTP API's, MCP's, the chat's, the vendor endpoints'), so the server sets one
//! dispatcher here once and each cell's tools are completed with it. Which servers a call may
//! reach is the dispatcher's decision, from the call's owner (its tenant).
//!
//! Unset (no MCP server configured), nothing changes: a cell without tools gets no broker.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::bridge::{ExecTools, ToolDispatch};

#[derive(Default)]
pub(crate) struct McpTools {
    slot: RwLock<Option<Installed>>,
}

#[derive(Clone)]
struct Installed {
    dispatch: Arc<dyn ToolDispatch>,
    runtime: tokio::runtime::Handle,
    call_timeout: Duration,
}

impl McpTools {
    pub(crate) fn set(
        &self,
        dispatch: Arc<dyn ToolDispatch>,
        runtime: tokio::runtime::Handle,
        call_timeout: Duration,
    ) {
        *self.slot.write().unwrap_or_else(|e| e.into_inner()) = Some(Installed {
            dispatch,
            runtime,
            call_timeout,
        });
    }

    pub(crate) fn is_set(&self) -> bool {
        self.slot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// `tools` with the MCP dispatcher filled in (a cell without client tools gets one with
    /// MCP alone); as is when none is set or `tools` already has one.
    pub(crate) fn complete(&self, tools: Option<ExecTools>) -> Option<ExecTools> {
        let installed = self.slot.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(m) = installed else {
            return tools;
        };
        Some(match tools {
            Some(mut t) => {
                if t.mcp.is_none() {
                    t.mcp = Some(m.dispatch);
                }
                t
            }
            None => ExecTools {
                specs: Vec::new(),
                client: None,
                mcp: Some(m.dispatch),
                mcp_specs: Vec::new(),
                call_timeout: m.call_timeout,
                runtime: m.runtime,
            },
        })
    }
}
