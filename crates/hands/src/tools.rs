//! The agent's tools as the model sees them, executed in a [`Sandbox`]. Arguments are
//! typed; their JSON Schemas are generated from the types, and anything the model sends
//! that does not fit becomes an error result naming the problem.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nerve_core::{ToolCall, ToolDefinition, ToolError, ToolExecutor, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::HandsError;
use crate::sandbox::Sandbox;

/// Default and largest per-command timeouts.
const DEFAULT_TIMEOUT_SECS: u64 = 60;
const MAX_TIMEOUT_SECS: u64 = 600;
/// Output kept per stream (head and tail).
const MAX_OUTPUT_BYTES: usize = 32 * 1024;

/// Run a shell command in the workspace.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct ShellArgs {
    /// The command, run with `/bin/sh -c`.
    pub(crate) command: String,
    /// Seconds before the command and all its children are killed (default 60, at most 600).
    #[serde(default)]
    pub(crate) timeout_secs: Option<u64>,
    /// Directory to run in, relative to the workspace root (default: the root).
    #[serde(default)]
    pub(crate) workdir: Option<String>,
}

/// The tools of one execution, bound to its sandbox.
#[derive(Debug, Clone)]
pub struct SandboxTools {
    sandbox: Arc<Sandbox>,
}

impl SandboxTools {
    pub fn new(sandbox: Arc<Sandbox>) -> Self {
        Self { sandbox }
    }

    async fn shell(&self, args: ShellArgs) -> Result<ToolOutput, ToolError> {
        let workdir = match confine(args.workdir.as_deref().unwrap_or(".")) {
            Ok(dir) => dir,
            Err(message) => return Ok(ToolOutput::error(message)),
        };
        let timeout = Duration::from_secs(
            args.timeout_secs
                .unwrap_or(DEFAULT_TIMEOUT_SECS)
                .clamp(1, MAX_TIMEOUT_SECS),
        );
        let output = self
            .sandbox
            .exec(&args.command, &workdir, timeout, MAX_OUTPUT_BYTES)
            .await
            .map_err(|e: HandsError| ToolError::Unavailable(e.to_string()))?;
        let mut content = output.stdout;
        if !output.stderr.is_empty() {
            if !content.is_empty() && !content.ends_with('\n') {
                content.push('\n');
            }
            content.push_str("[stderr]\n");
            content.push_str(&output.stderr);
        }
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        let failed = match (output.timed_out, output.exit_code) {
            (true, _) => {
                content.push_str(&format!(
                    "[timed out after {}s; the command and its children were killed]",
                    timeout.as_secs()
                ));
                true
            }
            (false, Some(code)) => {
                content.push_str(&format!("[exit code: {code}]"));
                code != 0
            }
            (false, None) => {
                content.push_str("[exit code unknown]");
                true
            }
        };
        Ok(ToolOutput {
            content,
            is_error: failed,
        })
    }
}

/// Resolves a workspace-relative directory to its absolute path inside the container,
/// refusing anything that would leave `/workspace`. Symlinks are the executor's concern.
fn confine(path: &str) -> Result<String, String> {
    let relative = match path.strip_prefix("/workspace") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        Some(_) | None => path,
    };
    if relative.starts_with('/') && relative.len() == path.len() {
        return Err(format!(
            "path escapes the workspace: {path} (paths are relative to the workspace root)"
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for component in relative.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(format!("path escapes the workspace: {path}"));
                }
            }
            other => parts.push(other),
        }
    }
    Ok(if parts.is_empty() {
        "/workspace".to_owned()
    } else {
        format!("/workspace/{}", parts.join("/"))
    })
}

fn parse<T: DeserializeOwned>(call: &ToolCall) -> Result<T, ToolOutput> {
    serde_json::from_value(call.arguments.clone())
        .map_err(|e| ToolOutput::error(format!("invalid arguments for `{}`: {e}", call.name)))
}

fn definition<T: JsonSchema>(name: &str, description: &str) -> ToolDefinition {
    let mut schema = serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        object.remove("description");
    }
    ToolDefinition {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters: schema,
    }
}

#[async_trait]
impl ToolExecutor for SandboxTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        vec![definition::<ShellArgs>(
            "shell",
            "Run a shell command (busybox sh) in the workspace, which is the current directory. No network.",
        )]
    }

    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError> {
        match call.name.as_str() {
            "shell" => match parse::<ShellArgs>(call) {
                Ok(args) => self.shell(args).await,
                Err(output) => Ok(output),
            },
            other => Ok(ToolOutput::error(format!(
                "unknown tool `{other}`; available tools: {}",
                self.definitions()
                    .iter()
                    .map(|d| d.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Result<&str, ()>) {
        assert_eq!(
            confine(input).map_err(|_| ()),
            expected.map(str::to_owned),
            "{input}"
        );
    }

    #[test]
    fn workdir_confinement() {
        check(".", Ok("/workspace"));
        check("src/../lib", Ok("/workspace/lib"));
        check("/workspace/src", Ok("/workspace/src"));
        check("/workspace", Ok("/workspace"));
        check("..", Err(()));
        check("a/../../etc", Err(()));
        check("/etc", Err(()));
        check("/workspacefoo", Err(()));
    }

    #[test]
    fn shell_schema_is_generated_from_the_type() {
        let def = definition::<ShellArgs>("shell", "x");
        assert_eq!(def.parameters["type"], "object");
        assert_eq!(def.parameters["required"], serde_json::json!(["command"]));
        assert!(def.parameters["properties"]["timeout_secs"].is_object());
    }
}
