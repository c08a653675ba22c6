//! The one module that knows the MCP SDK (`rmcp`, pinned in the workspace). Everything
//! else in `mcp` speaks the protocol's JSON (tools and call results as the specification
//! spells them), so an SDK update touches this file only.

use std::future::Future;
use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, UnixSocketHttpClient};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};

/// Called with the server's new tool list (as MCP JSON) after it said the list changed.
pub(crate) type OnToolsChanged = Arc<dyn Fn(Result<Vec<Value>, String>) + Send + Sync>;

struct Handler {
    on_change: OnToolsChanged,
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        // The list is fetched off the notification path: the service loop must keep reading
        // to receive the answer.
        let on_change = Arc::clone(&self.on_change);
        tokio::spawn(async move {
            let listed = context.peer.list_all_tools().await;
            on_change(listed.map_err(|e| e.to_string()).and_then(|tools| {
                tools
                    .iter()
                    .map(|tool| serde_json::to_value(tool).map_err(|e| e.to_string()))
                    .collect()
            }));
        });
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::default()
    }
}

/// Why a `tools/call` produced no result.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The server answered with a JSON-RPC error (unknown tool, bad arguments): it is well.
    Refused(String),
    /// The session broke: the transport closed, the answer did not fit the protocol.
    Broken(String),
}

/// An initialised MCP session over a byte stream.
pub(crate) struct Client {
    service: RunningService<RoleClient, Handler>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Client {
    /// Runs the MCP handshake over `read` (the server's stdout) and `write` (its stdin).
    pub(crate) async fn connect<R, W>(
        read: R,
        write: W,
        on_change: OnToolsChanged,
    ) -> Result<Self, String>
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let service = Handler { on_change }
            .serve((read, write))
            .await
            .map_err(|e| format!("the MCP handshake failed: {e}"))?;
        Ok(Self { service })
    }

    /// Runs the MCP handshake with a streamable-HTTP server at `url`, every request sent as
    /// HTTP over the unix socket `proxy` (the execution's auth proxy, which judges it by its
    /// rules, injects the rule's credential and records the decision).
    pub(crate) async fn connect_http(
        proxy: &std::path::Path,
        url: &str,
        on_change: OnToolsChanged,
    ) -> Result<Self, String> {
        let socket = proxy
            .to_str()
            .ok_or_else(|| format!("the proxy's socket path {} is not UTF-8", proxy.display()))?;
        let client = UnixSocketHttpClient::new(socket, url);
        let config = StreamableHttpClientTransportConfig::with_uri(url);
        let transport = StreamableHttpClientTransport::with_client(client, config);
        let service = Handler { on_change }
            .serve(transport)
            .await
            .map_err(|e| format!("the MCP handshake failed: {e}"))?;
        Ok(Self { service })
    }

    /// Every tool the server offers, as MCP JSON objects (`name`, `description`,
    /// `inputSchema`, ...).
    pub(crate) async fn list_tools(&self) -> Result<Vec<Value>, String> {
        let tools = self
            .service
            .list_all_tools()
            .await
            .map_err(|e| format!("tools/list failed: {e}"))?;
        tools
            .iter()
            .map(|tool| serde_json::to_value(tool).map_err(|e| e.to_string()))
            .collect()
    }

    /// Calls one tool; the result as MCP JSON (`content`, `structuredContent`, `isError`).
    pub(crate) async fn call_tool(
        &self,
        name: &str,
        arguments: serde_json::Map<String, Value>,
    ) -> Result<Value, CallError> {
        let params = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        let result = self.service.call_tool(params).await.map_err(|e| {
            if let rmcp::ServiceError::McpError(error) = &e {
                CallError::Refused(error.message.to_string())
            } else {
                CallError::Broken(e.to_string())
            }
        })?;
        serde_json::to_value(&result).map_err(|e| CallError::Broken(e.to_string()))
    }

    /// Whether the session has ended (the transport closed, the server went away).
    pub(crate) fn is_closed(&self) -> bool {
        self.service.is_transport_closed()
    }

    /// Ends the session and its transport.
    pub(crate) async fn close(mut self) {
        let _ = self.service.close().await;
    }
}
