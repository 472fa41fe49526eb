//! The registry of the operator's MCP servers (see the module's doc in mod.rs): each server's
//! connection, permits and bounds, and the tenant check every listing and call passes.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::config::{McpConfigError, McpServerConfig};
use super::connection::Connection;
use super::convert::{convert, ConvertError};
use super::error::McpError;

/// Largest arguments of one call, as JSON: the bridge's bound (checked in the sandbox too).
pub const MAX_ARGUMENT_BYTES: usize = runcell_engine::bridge::MAX_INPUT_BYTES;
/// Largest result of one call as the sandbox receives it (JSON, images in base64): the
/// bridge's bound, checked here so that the refusal names the server and tool.
pub const MAX_RESULT_BYTES: usize = runcell_engine::bridge::MAX_OUTPUT_BYTES;

/// Every configured server, by name.
#[derive(Default)]
pub struct McpServers {
    servers: BTreeMap<String, Arc<Server>>,
}

impl std::fmt::Debug for McpServers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.servers.keys()).finish()
    }
}

struct Server {
    config: McpServerConfig,
    /// Held while connecting, so that calls arriving together start one process.
    connection: tokio::sync::Mutex<Option<Arc<Connection>>>,
    permits: tokio::sync::Semaphore,
}

impl McpServers {
    /// The servers of `configs`; a name given twice is an error.
    pub fn new(configs: Vec<McpServerConfig>) -> Result<McpServers, McpConfigError> {
        let mut servers = BTreeMap::new();
        for config in configs {
            let name = config.name.clone();
            let server = Arc::new(Server {
                permits: tokio::sync::Semaphore::new(config.max_concurrency),
                connection: tokio::sync::Mutex::new(None),
                config,
            });
            if servers.insert(name.clone(), server).is_some() {
                return Err(McpConfigError::Duplicate(name));
            }
        }
        Ok(McpServers { servers })
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Every server's configuration, in name order.
    pub fn configs(&self) -> impl Iterator<Item = &McpServerConfig> {
        self.servers.values().map(|s| &s.config)
    }

    /// The servers `tenant`'s sessions may use, in name order.
    pub fn names_for(&self, tenant: &str) -> Vec<String> {
        self.servers
            .values()
            .filter(|s| s.config.tenants.allows(tenant))
            .map(|s| s.config.name.clone())
            .collect()
    }

    /// The server, if `tenant` may use it. An unknown server and one the tenant may not use
    /// are the same error: a tenant does not learn which servers others have.
    fn server(&self, tenant: &str, name: &str) -> Result<&Arc<Server>, McpError> {
        self.servers
            .get(name)
            .filter(|s| s.config.tenants.allows(tenant))
            .ok_or_else(|| McpError::NotAvailable {
                server: name.to_owned(),
            })
    }

    /// `{"tools": [...], "instructions"?}` for `runcell_tools.mcp.<server>`: each tool's name,
    /// description and schemas as the server lists them.
    pub async fn list_tools(&self, tenant: &str, server: &str) -> Result<Value, McpError> {
        let s = self.server(tenant, server)?;
        let conn = s.connected().await?;
        let tools = match conn.tools(server, false).await {
            Err(e) if conn.is_closed() => {
                // It died since the last use: listing is safe to repeat on a new connection.
                tracing::warn!(server, error = %e, "MCP server connection closed; reconnecting");
                s.drop_connection(&conn).await;
                s.connected().await?.tools(server, false).await?
            }
            other => other?,
        };
        let mut listing = json!({ "tools": *tools });
        if let Some(text) = &conn.instructions {
            listing["instructions"] = json!(text);
        }
        Ok(listing)
    }

    /// Calls `tool` of `server` for `tenant` with `arguments` (a JSON object): the envelope
    /// the sandbox decodes ([`convert`]), or why not.
    pub async fn call(
        &self,
        tenant: &str,
        server: &str,
        tool: &str,
        arguments: Value,
    ) -> Result<Value, McpError> {
        let s = self.server(tenant, server)?;
        let Value::Object(arguments) = arguments else {
            return Err(McpError::Arguments {
                server: server.to_owned(),
                tool: tool.to_owned(),
            });
        };
        let size = serde_json::to_vec(&arguments).map_or(usize::MAX, |v| v.len());
        if size > MAX_ARGUMENT_BYTES {
            return Err(McpError::TooLarge {
                server: server.to_owned(),
                tool: tool.to_owned(),
                what: "arguments",
                size,
                limit: MAX_ARGUMENT_BYTES,
            });
        }
        let timeout = s.config.call_timeout;
        let work = async {
            let _permit = s.permits.acquire().await.expect("never closed");
            let mut conn = s.connected().await?;
            if conn.is_closed() {
                s.drop_connection(&conn).await;
                conn = s.connected().await?;
            }
            // Only tools the server lists are called: refresh once if it is not there (the
            // list may have changed without a word).
            let listed = |tools: &[Value]| tools.iter().any(|t| t["name"] == tool);
            if !listed(&conn.tools(server, false).await?)
                && !listed(&conn.tools(server, true).await?)
            {
                return Err(McpError::UnknownTool {
                    server: server.to_owned(),
                    tool: tool.to_owned(),
                });
            }
            match conn.call(server, tool, arguments).await {
                Err(e) if conn.is_closed() => {
                    s.drop_connection(&conn).await;
                    Err(McpError::Stopped {
                        server: server.to_owned(),
                        why: e.to_string(),
                    })
                }
                other => other,
            }
        };
        let raw = tokio::time::timeout(timeout, work)
            .await
            .map_err(|_| McpError::Timeout {
                server: server.to_owned(),
                tool: tool.to_owned(),
                after: timeout,
            })??;
        let envelope = convert(&raw).map_err(|e| match e {
            ConvertError::Tool(message) => McpError::Tool {
                server: server.to_owned(),
                tool: tool.to_owned(),
                message,
            },
            ConvertError::Invalid(why) => McpError::Protocol {
                server: server.to_owned(),
                why,
            },
        })?;
        let size = serde_json::to_vec(&envelope).map_or(usize::MAX, |v| v.len());
        if size > MAX_RESULT_BYTES {
            return Err(McpError::TooLarge {
                server: server.to_owned(),
                tool: tool.to_owned(),
                what: "result's contents",
                size,
                limit: MAX_RESULT_BYTES,
            });
        }
        Ok(envelope)
    }

    /// Connects to every server in the background and logs each one's tools or why it cannot
    /// be reached: the operator learns of a broken command at start-up, not at the first call.
    pub fn connect_in_background(self: &Arc<Self>) {
        for server in self.servers.values() {
            let server = server.clone();
            tokio::spawn(async move {
                let name = server.config.name.clone();
                match server.connected().await {
                    Ok(conn) => match conn.tools(&name, false).await {
                        Ok(tools) => {
                            tracing::info!(server = %name, tools = tools.len(), "MCP server connected")
                        }
                        Err(e) => {
                            tracing::warn!(server = %name, error = %e, "MCP server: cannot list its tools")
                        }
                    },
                    Err(e) => {
                        tracing::warn!(server = %name, error = %e, "MCP server: cannot connect (tried again on first use)")
                    }
                }
            });
        }
    }
}

impl Server {
    /// The live connection, started if there is none.
    async fn connected(&self) -> Result<Arc<Connection>, McpError> {
        let mut slot = self.connection.lock().await;
        if let Some(conn) = &*slot {
            if !conn.is_closed() {
                return Ok(conn.clone());
            }
            tracing::warn!(server = %self.config.name, "MCP server connection closed; starting it again");
        }
        let conn = Arc::new(Connection::open(&self.config).await?);
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets `conn` (if it is still the current one): the next use starts a new one.
    async fn drop_connection(&self, conn: &Arc<Connection>) {
        let mut slot = self.connection.lock().await;
        if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp_servers::config::parse_tenants_flag;

    fn server(flag: &str, tenants: &str) -> McpServerConfig {
        let mut c = McpServerConfig::parse_flag(flag).expect("flag");
        c.tenants = parse_tenants_flag(&format!("x={tenants}"))
            .expect("tenants")
            .1;
        c
    }

    #[test]
    fn tenants_see_only_their_servers() {
        let all = McpServers::new(vec![
            server("github=gh-mcp", "acme"),
            server("docs=http://127.0.0.1:9/mcp", "*"),
        ])
        .expect("servers");
        assert_eq!(all.names_for("acme"), ["docs", "github"]);
        assert_eq!(all.names_for("other"), ["docs"]);
        let refused = all.server("other", "github").err().expect("refused");
        let unknown = all.server("other", "nope").err().expect("unknown");
        // Not allowed and not configured read the same, but for the name.
        assert_eq!(
            refused.to_string().replace("github", "X"),
            unknown.to_string().replace("nope", "X")
        );
        let dup = McpServers::new(vec![server("a=x", "*"), server("a=y", "*")]);
        assert_eq!(dup.err(), Some(McpConfigError::Duplicate("a".into())));
    }

    #[tokio::test]
    async fn bounds_are_checked_before_anything_starts() {
        let all = McpServers::new(vec![server("s=/nonexistent/mcp-server", "*")]).expect("servers");
        let big = json!({ "x": "a".repeat(MAX_ARGUMENT_BYTES) });
        let e = all
            .call("t", "s", "tool", big)
            .await
            .expect_err("too large");
        assert!(
            matches!(
                e,
                McpError::TooLarge {
                    what: "arguments",
                    ..
                }
            ),
            "{e}"
        );
        let e = all
            .call("t", "s", "tool", json!([1]))
            .await
            .expect_err("not an object");
        assert!(matches!(e, McpError::Arguments { .. }), "{e}");
        // A command that cannot start says so, with the command.
        let e = all
            .call("t", "s", "tool", json!({}))
            .await
            .expect_err("no program");
        assert!(e.to_string().contains("/nonexistent/mcp-server"), "{e}");
    }
}
