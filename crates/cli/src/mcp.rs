//! `nerve mcp list`: the runtime starts every configured MCP server as a run would (inside
//! a throwaway sandbox unless trusted on the host, `url` servers through the config's proxy
//! rules) and removes it all again; this shows where each runs and its tools. Nothing is
//! written to the log.

use std::path::{Path, PathBuf};

use crate::Failure;
use crate::args::McpCommand;
use crate::output;

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
    let config = crate::settings::load(
        config_path,
        workspace.as_deref(),
        nerve_runtime::settings::Flags::default(),
    )?;
    if config.mcp.servers.is_empty() {
        if json {
            output::json(&serde_json::json!([]));
        } else {
            output::line("no MCP servers are configured ([[mcp.servers]] in the config file)");
        }
        return Ok(0);
    }
    let reports = nerve_runtime::mcp::servers(&config, workspace, image).await?;
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
