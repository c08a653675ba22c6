//! `nerve mcp list`: starts every configured MCP server as a run would (inside a throwaway
//! sandbox unless trusted on the host, `url` servers through the config's proxy rules),
//! shows where it runs and its tools, and removes it all again. Nothing is written to the
//! log.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nerve_core::ExecutionId;
use nerve_core::{Event, EventSink, SinkError};
use nerve_hands::mcp::McpTools;
use nerve_hands::{DEFAULT_IMAGE, ProxyListener, Sandbox, SandboxConfig, SandboxTools};

use crate::Failure;
use crate::args::McpCommand;
use crate::output;
use nerve_runtime::config::Config;

pub(crate) async fn command(command: McpCommand, config: Option<&Path>) -> Result<u8, Failure> {
    match command {
        McpCommand::List {
            workspace,
            image,
            json,
        } => list(config, workspace, image, json).await,
    }
}

async fn list(
    config_path: Option<&Path>,
    workspace: Option<PathBuf>,
    image: Option<String>,
    json: bool,
) -> Result<u8, Failure> {
    let config = Config::load(config_path)?;
    if config.mcp.servers.is_empty() {
        if json {
            output::json(&serde_json::json!([]));
        } else {
            output::line("no MCP servers are configured ([[mcp.servers]] in the config file)");
        }
        return Ok(0);
    }
    let empty = tempfile::Builder::new()
        .prefix("nerve-mcp-list-")
        .tempdir()
        .map_err(|e| Failure::runtime(format!("cannot create a workspace: {e}")))?;
    let workspace = match workspace {
        Some(dir) => std::fs::canonicalize(&dir)
            .map_err(|e| Failure::usage(format!("workspace {}: {e}", dir.display())))?,
        None => empty.path().to_path_buf(),
    };
    let image = image
        .or(config.sandbox.image.clone())
        .unwrap_or_else(|| DEFAULT_IMAGE.to_owned());
    let redactor =
        nerve_core::Redactor::with_secrets(std::iter::empty::<(&str, &secrecy::SecretString)>())
            .map_err(Failure::usage)?;
    let specs = config.mcp.specs(&redactor);
    let docker = nerve_hands::connect_docker()
        .await
        .map_err(Failure::usage)?;
    // The run's proxy rules, so that `url` servers are reached as a run reaches them; its
    // decisions go nowhere, like everything else here.
    let proxy = config.proxy.build(&|name| std::env::var(name).ok())?;
    let proxy = ProxyListener::bind(proxy.config).map_err(Failure::usage)?;
    let execution = ExecutionId::new();
    let mut sandbox_config = SandboxConfig::new(image, workspace.clone(), execution);
    sandbox_config.proxy = Some(proxy.mount());
    let _proxy = proxy
        .serve(Arc::new(Discard), execution)
        .map_err(Failure::usage)?;
    config.sandbox.apply_limits(&mut sandbox_config)?;
    let sandbox = Arc::new(
        Sandbox::start(docker, &sandbox_config)
            .await
            .map_err(Failure::usage)?,
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
    if json {
        output::json(&serde_json::json!(reports));
    } else {
        for report in &reports {
            output::line(&format!(
                "{}  ({}: {})",
                report.name, report.runs, report.command
            ));
            if let Some(warning) = &report.warning {
                output::line(&format!("  warning: {warning}"));
            }
            if let Some(error) = &report.error {
                output::line(&format!("  error: {error}"));
            }
            for tool in &report.tools {
                output::line(&format!("  {tool}"));
            }
            for skipped in &report.skipped {
                output::line(&format!("  skipped: {skipped}"));
            }
        }
    }
    // Non-zero when a server offers nothing, so a script sees a broken configuration.
    Ok(u8::from(reports.iter().any(|r| r.error.is_some())))
}

/// Where the throwaway proxy's decisions go: nowhere (`mcp list` writes no log).
struct Discard;

#[async_trait::async_trait]
impl EventSink for Discard {
    async fn append(&self, _execution: ExecutionId, _event: Event) -> Result<u64, SinkError> {
        Ok(0)
    }
}
