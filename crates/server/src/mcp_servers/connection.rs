//! One live MCP client connection (rmcp) to one of the operator's servers: started on first
//! use (and tried once at start-up, for the log), dropped when its transport closes so the
//! next call starts a new one, its tool list cached until the server says it changed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, SubscriptionFilter};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};

use super::config::{McpServerConfig, McpTransport};
use super::error::McpError;

/// How long a connection may take to start and answer `initialize`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A cached tool list older than this is asked for again on the next import, for servers
/// that change their tools without saying so.
const TOOLS_MAX_AGE: Duration = Duration::from_secs(30);
/// Largest message accepted from a server (a stdio line, an HTTP response or SSE event): a
/// result past the sandbox's own bound is refused anyway, this keeps the host's memory bounded.
pub(crate) const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Notifications from the server: only `tools/list_changed` matters here.
#[derive(Clone)]
struct Handler {
    stale: Arc<AtomicBool>,
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.stale.store(true, Ordering::Release);
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("runcell", env!("CARGO_PKG_VERSION")),
        )
    }
}

pub(crate) struct Connection {
    service: RunningService<RoleClient, Handler>,
    stale: Arc<AtomicBool>,
    tools: std::sync::Mutex<Option<(Instant, Arc<Vec<serde_json::Value>>)>>,
    /// The server's `instructions`, shown as its module's docstring.
    pub(crate) instructions: Option<String>,
}

impl Connection {
    pub(crate) async fn open(config: &McpServerConfig) -> Result<Connection, McpError> {
        let stale = Arc::new(AtomicBool::new(false));
        let handler = Handler {
            stale: stale.clone(),
        };
        let name = &config.name;
        let started = match &config.transport {
            McpTransport::Stdio { program, args } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).kill_on_drop(true);
                let mut command = process_wrap::tokio::CommandWrap::from(command);
                // Its own process group: a server started through `npx` or a shell leaves no
                // child behind when runcell kills it.
                command.wrap(process_wrap::tokio::ProcessGroup::leader());
                let (transport, _) = rmcp::transport::TokioChildProcess::builder(command)
                    .stderr(std::process::Stdio::inherit())
                    .spawn()
                    .map_err(|e| McpError::Connect {
                        server: name.clone(),
                        why: format!("cannot start {program:?}: {e}"),
                    })?;
                tokio::time::timeout(CONNECT_TIMEOUT, handler.serve(transport)).await
            }
            McpTransport::Http { url } => {
                use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
                let transport = rmcp::transport::StreamableHttpClientTransport::from_config(
                    StreamableHttpClientTransportConfig::with_uri(url.as_str())
                        .max_json_response_size(MAX_MESSAGE_BYTES)
                        .max_sse_event_size(MAX_MESSAGE_BYTES),
                );
                tokio::time::timeout(CONNECT_TIMEOUT, handler.serve(transport)).await
            }
        };
        let service = match started {
            Ok(Ok(service)) => service,
            Ok(Err(e)) => {
                return Err(McpError::Connect {
                    server: name.clone(),
                    why: e.to_string(),
                })
            }
            Err(_) => {
                return Err(McpError::Connect {
                    server: name.clone(),
                    why: format!(
                        "no answer to initialize within {}s",
                        CONNECT_TIMEOUT.as_secs()
                    ),
                })
            }
        };
        let instructions = service.peer_info().and_then(|i| i.instructions.clone());
        // Servers on the 2026-07-28 revision send `tools/list_changed` only to a subscription;
        // older ones send it unasked (the handler above). Either way the list is marked stale.
        let peer = service.peer().clone();
        let watch = stale.clone();
        tokio::spawn(async move {
            let filter = SubscriptionFilter::builder().tools_list_changed().build();
            let Ok(Ok(mut sub)) = tokio::time::timeout(CONNECT_TIMEOUT, peer.listen(filter)).await
            else {
                return;
            };
            while let Ok(Some(_)) = sub.next().await {
                watch.store(true, Ordering::Release);
            }
        });
        Ok(Connection {
            service,
            stale,
            tools: std::sync::Mutex::new(None),
            instructions,
        })
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.is_transport_closed()
    }

    /// The server's tools as it lists them (the wire JSON of each), from the cache unless the
    /// server said they changed, the cache is older than [`TOOLS_MAX_AGE`] or `refresh`.
    pub(crate) async fn tools(
        &self,
        server: &str,
        refresh: bool,
    ) -> Result<Arc<Vec<serde_json::Value>>, McpError> {
        let stale = self.stale.swap(false, Ordering::AcqRel);
        if !stale && !refresh {
            if let Some((at, tools)) = &*self.tools.lock().expect("tools cache") {
                if at.elapsed() < TOOLS_MAX_AGE {
                    return Ok(tools.clone());
                }
            }
        }
        let listed = self
            .service
            .list_all_tools()
            .await
            .map_err(|e| McpError::from_service(server, e))?;
        let tools: Vec<serde_json::Value> = listed
            .into_iter()
            .filter_map(|t| serde_json::to_value(t).ok())
            .collect();
        let tools = Arc::new(tools);
        *self.tools.lock().expect("tools cache") = Some((Instant::now(), tools.clone()));
        Ok(tools)
    }

    /// One `tools/call`, its result as wire JSON.
    pub(crate) async fn call(
        &self,
        server: &str,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Result<serde_json::Value, McpError> {
        let params =
            rmcp::model::CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let result = self
            .service
            .call_tool(params)
            .await
            .map_err(|e| McpError::from_service(server, e))?;
        serde_json::to_value(result).map_err(|e| McpError::Protocol {
            server: server.to_owned(),
            why: e.to_string(),
        })
    }
}
