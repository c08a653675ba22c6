//! The configured MCP servers as an execution would start them (inside a throwaway sandbox
//! unless trusted on the host, `url` servers through the configuration's proxy rules),
//! each with where it runs and its tools; everything is removed again and nothing is
//! written to the log.

use std::path::PathBuf;
use std::sync::Arc;

use nerve_core::{Event, EventSink, ExecutionId, SinkError};
use nerve_hands::mcp::McpTools;
pub use nerve_hands::mcp::ServerReport;
use nerve_hands::{DEFAULT_IMAGE, ProxyListener, Sandbox, SandboxConfig, SandboxTools};

use crate::RuntimeError;
use crate::config::Config;

/// Starts every server of `config` in a throwaway sandbox on `workspace` (an empty
/// directory when `None`) with `image` (the configuration's, else the built-in one), and
/// reports each. No servers: no sandbox, no reports.
pub async fn servers(
    config: &Config,
    workspace: Option<PathBuf>,
    image: Option<String>,
) -> Result<Vec<ServerReport>, RuntimeError> {
    if config.mcp.servers.is_empty() {
        return Ok(Vec::new());
    }
    let empty = tempfile::Builder::new()
        .prefix("nerve-mcp-list-")
        .tempdir()
        .map_err(|e| RuntimeError::failed(format!("cannot create a workspace: {e}")))?;
    let workspace = match workspace {
        Some(dir) => std::fs::canonicalize(&dir)
            .map_err(|e| RuntimeError::usage(format!("workspace {}: {e}", dir.display())))?,
        None => empty.path().to_path_buf(),
    };
    let image = image
        .or(config.sandbox.image.clone())
        .unwrap_or_else(|| DEFAULT_IMAGE.to_owned());
    let redactor =
        nerve_core::Redactor::with_secrets(std::iter::empty::<(&str, &secrecy::SecretString)>())
            .map_err(RuntimeError::config)?;
    let specs = config.mcp.specs(&redactor);
    let docker = nerve_hands::connect_docker()
        .await
        .map_err(RuntimeError::sandbox)?;
    // The run's proxy rules, so that `url` servers are reached as a run reaches them; its
    // decisions go nowhere, like everything else here.
    let proxy = config.proxy.build(&|name| std::env::var(name).ok())?;
    let proxy = ProxyListener::bind(proxy.config).map_err(RuntimeError::sandbox)?;
    let execution = ExecutionId::new();
    let mut sandbox_config = SandboxConfig::new(image, workspace.clone(), execution);
    sandbox_config.proxy = Some(proxy.mount());
    let _proxy = proxy
        .serve(Arc::new(Discard), execution)
        .map_err(RuntimeError::sandbox)?;
    config.sandbox.apply_limits(&mut sandbox_config)?;
    let sandbox = Arc::new(
        Sandbox::start(docker, &sandbox_config)
            .await
            .map_err(RuntimeError::sandbox)?,
    );
    let builtin = Arc::new(SandboxTools::new(Arc::clone(&sandbox)));
    let tools = McpTools::start(builtin, specs, Some(Arc::clone(&sandbox)), Some(workspace)).await;
    let reports = tools.reports();
    tools.shutdown().await;
    if let Err(error) = sandbox.remove().await {
        tracing::warn!(%error, "could not remove the throwaway sandbox; the reaper will");
    }
    // Its home too: nothing ever resumes a throwaway execution.
    if let Err(error) = nerve_hands::discard_sandbox_home(None, execution) {
        tracing::warn!(%error, "could not remove the throwaway sandbox's home");
    }
    Ok(reports)
}

/// Where the throwaway proxy's decisions go: nowhere (the listing writes no log).
struct Discard;

#[async_trait::async_trait]
impl EventSink for Discard {
    async fn append(&self, _execution: ExecutionId, _event: Event) -> Result<u64, SinkError> {
        Ok(0)
    }
}
