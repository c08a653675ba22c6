//! The agent's tools as the model sees them, executed in a [`Sandbox`]. Arguments are
//! typed; their JSON Schemas are generated from the types, and anything the model sends
//! that does not fit becomes an error result naming the problem. Every tool goes through the
//! sandbox's executor, so file operations are confined inside the container; `http_request`
//! goes through the auth proxy's socket, under the same rules as commands in the sandbox.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use nerve_core::{Interrupt, ToolCall, ToolDefinition, ToolError, ToolExecutor, ToolOutput};
use nerve_executor::{
    EditFileOutput, EditFileRequest, EntryKind, ExecOutput, ExecRequest, GrepOutput, GrepRequest,
    ListDirOutput, ListDirRequest, ReadFileOutput, ReadFileRequest, WriteFileOutput,
    WriteFileRequest,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::HandsError;
use crate::proxy::{HttpRequest, HttpResponse, PROXY_HEADER, ProxyClient};
use crate::sandbox::Sandbox;

/// Default and largest per-command timeouts.
const DEFAULT_TIMEOUT_SECS: u64 = 60;
const MAX_TIMEOUT_SECS: u64 = 600;
/// Output kept per stream (head and tail).
const MAX_OUTPUT_BYTES: u64 = 32 * 1024;

/// Run a shell command in the workspace.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellArgs {
    /// The command, run with `/bin/sh -c` (busybox).
    pub command: String,
    /// Seconds before the command and everything it started are killed (default 60, at most 600).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Directory to run in, relative to the workspace root (default: the root).
    #[serde(default)]
    pub workdir: Option<String>,
}

/// Read a window of lines from a text file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// File path relative to the workspace root.
    pub path: String,
    /// Lines to skip before the first returned line (default 0).
    #[serde(default)]
    pub offset: Option<u64>,
    /// Most lines to return (default 2000).
    #[serde(default)]
    pub limit: Option<u64>,
}

/// Create or overwrite a file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// File path relative to the workspace root; missing parent directories are created.
    pub path: String,
    /// The complete new content of the file.
    pub content: String,
}

/// Replace exact text in a file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// File path relative to the workspace root.
    pub path: String,
    /// The exact text to replace, whitespace included; it must occur exactly once unless
    /// `replace_all` is true.
    pub old_text: String,
    /// The text to put in its place.
    pub new_text: String,
    /// Replace every occurrence (default false).
    #[serde(default)]
    pub replace_all: Option<bool>,
}

/// List a directory.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// Directory path relative to the workspace root (default: the root).
    #[serde(default)]
    pub path: Option<String>,
}

/// Search file contents with a regular expression.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// A regular expression (Rust regex syntax), matched against each line.
    pub pattern: String,
    /// File or directory to search, relative to the workspace root (default: the root).
    #[serde(default)]
    pub path: Option<String>,
    /// Only search files matching this glob, e.g. `*.rs`, `*.{ts,tsx}` or `src/**/*.rs`.
    #[serde(default)]
    pub glob: Option<String>,
}

/// Send an HTTP request through the auth proxy.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpRequestArgs {
    /// The method, upper case: GET, HEAD, POST, PUT, PATCH, DELETE, ...
    pub method: String,
    /// Absolute URL, e.g. `http://api.example.com/v1/items?page=2`. Plain `http` is enough:
    /// the proxy uses TLS upstream where its rules say so.
    pub url: String,
    /// Extra request headers. Credentials are added by the proxy for the hosts it holds
    /// them for; any you send to such a host are removed.
    #[serde(default)]
    pub headers: Option<BTreeMap<String, String>>,
    /// The request body, as text.
    #[serde(default)]
    pub body: Option<String>,
}

/// The tools of one execution, bound to its sandbox (and its proxy, for `http_request`).
#[derive(Debug, Clone)]
pub struct SandboxTools {
    sandbox: Arc<Sandbox>,
    proxy: Option<ProxyClient>,
}

impl SandboxTools {
    /// The tools without network access: `http_request` answers that no proxy is
    /// configured.
    pub fn new(sandbox: Arc<Sandbox>) -> Self {
        Self {
            sandbox,
            proxy: None,
        }
    }

    /// The tools with `http_request` going through `proxy`.
    pub fn with_proxy(sandbox: Arc<Sandbox>, proxy: ProxyClient) -> Self {
        Self {
            sandbox,
            proxy: Some(proxy),
        }
    }

    async fn http_request(&self, args: HttpRequestArgs) -> Result<ToolOutput, ToolError> {
        let Some(proxy) = &self.proxy else {
            return Ok(ToolOutput::error(
                "http_request: no network access is configured for this execution",
            ));
        };
        let request = HttpRequest {
            method: args.method,
            url: args.url,
            headers: args.headers.unwrap_or_default().into_iter().collect(),
            body: args.body,
        };
        Ok(match proxy.send(request).await {
            Ok(response) => format_http(&response, proxy.limits.max_body_bytes),
            Err(problem) => ToolOutput::error(format!("http_request: {problem}")),
        })
    }

    async fn shell(
        &self,
        args: ShellArgs,
        interrupt: Option<Interrupt<'_>>,
    ) -> Result<ToolOutput, ToolError> {
        if args.command.trim().is_empty() {
            return Ok(ToolOutput::error("shell: `command` is empty"));
        }
        let (timeout_secs, capped) = match args.timeout_secs {
            Some(0) => {
                return Ok(ToolOutput::error(
                    "shell: `timeout_secs` must be at least 1",
                ));
            }
            Some(secs) if secs > MAX_TIMEOUT_SECS => (MAX_TIMEOUT_SECS, true),
            Some(secs) => (secs, false),
            None => (DEFAULT_TIMEOUT_SECS, false),
        };
        let request = ExecRequest {
            command: args.command,
            workdir: args.workdir,
            timeout_ms: timeout_secs * 1000,
            max_output_bytes: MAX_OUTPUT_BYTES,
            env: Default::default(),
            interrupt_grace_ms: None,
        };
        let answer = self.sandbox.exec_until(request, interrupt).await;
        let limit = match &answer {
            Ok(Ok(output)) if !output.interrupted => self.sandbox.limit_reached(output).await,
            _ => None,
        };
        respond("shell", answer, |output| {
            let mut result = format_exec(&output, timeout_secs);
            if let Some(limit) = limit {
                result.content.push('\n');
                result.content.push_str(&limit);
            }
            if capped {
                result.content.push_str(&format!(
                    "\n[timeout_secs was capped at {MAX_TIMEOUT_SECS}]"
                ));
            }
            result
        })
    }

    async fn read_file(&self, args: ReadFileArgs) -> Result<ToolOutput, ToolError> {
        if let Some(problem) = empty_path("read_file", &args.path) {
            return Ok(problem);
        }
        if args.limit == Some(0) {
            return Ok(ToolOutput::error("read_file: `limit` must be at least 1"));
        }
        let offset = args.offset.unwrap_or(0);
        let request = ReadFileRequest {
            path: args.path.clone(),
            offset: args.offset,
            limit: args.limit,
        };
        let answer = self.sandbox.read_file(request).await;
        respond("read_file", answer, |output| {
            format_read(&args.path, offset, &output)
        })
    }

    async fn write_file(&self, args: WriteFileArgs) -> Result<ToolOutput, ToolError> {
        if let Some(problem) = empty_path("write_file", &args.path) {
            return Ok(problem);
        }
        let path = args.path.clone();
        let answer = self
            .sandbox
            .write_file(WriteFileRequest {
                path: args.path,
                content: args.content,
            })
            .await;
        respond("write_file", answer, |output: WriteFileOutput| {
            let verb = if output.created {
                "created"
            } else {
                "replaced"
            };
            ToolOutput::ok(format!("{verb} {path} ({} bytes)", output.bytes))
        })
    }

    async fn edit_file(&self, args: EditFileArgs) -> Result<ToolOutput, ToolError> {
        if let Some(problem) = empty_path("edit_file", &args.path) {
            return Ok(problem);
        }
        if args.old_text.is_empty() {
            return Ok(ToolOutput::error(
                "edit_file: `old_text` is empty; give the exact text to replace",
            ));
        }
        if args.old_text == args.new_text {
            return Ok(ToolOutput::error(
                "edit_file: `old_text` and `new_text` are identical; nothing would change",
            ));
        }
        let path = args.path.clone();
        let answer = self
            .sandbox
            .edit_file(EditFileRequest {
                path: args.path,
                old_text: args.old_text,
                new_text: args.new_text,
                replace_all: args.replace_all.unwrap_or(false),
            })
            .await;
        respond("edit_file", answer, |output: EditFileOutput| {
            let plural = if output.replacements == 1 { "" } else { "s" };
            ToolOutput::ok(format!(
                "edited {path}: {} replacement{plural}",
                output.replacements
            ))
        })
    }

    async fn list_dir(&self, args: ListDirArgs) -> Result<ToolOutput, ToolError> {
        let shown = args
            .path
            .clone()
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| ".".to_owned());
        let answer = self
            .sandbox
            .list_dir(ListDirRequest { path: args.path })
            .await;
        respond("list_dir", answer, |output| format_list(&shown, &output))
    }

    async fn grep(&self, args: GrepArgs) -> Result<ToolOutput, ToolError> {
        if args.pattern.is_empty() {
            return Ok(ToolOutput::error("grep: `pattern` is empty"));
        }
        let pattern = args.pattern.clone();
        let answer = self
            .sandbox
            .grep(GrepRequest {
                pattern: args.pattern,
                path: args.path,
                glob: args.glob,
            })
            .await;
        respond("grep", answer, |output| format_grep(&pattern, &output))
    }
}

/// Turns a sandbox answer into the tool result: a refusal or a lost executor is an error
/// result the model sees; only an engine failure (the container is gone) is a [`ToolError`].
fn respond<T>(
    tool: &str,
    answer: Result<Result<T, String>, HandsError>,
    format: impl FnOnce(T) -> ToolOutput,
) -> Result<ToolOutput, ToolError> {
    match answer {
        Ok(Ok(output)) => Ok(format(output)),
        Ok(Err(refused)) => Ok(ToolOutput::error(format!("{tool}: {refused}"))),
        Err(HandsError::Executor(reason)) => Ok(ToolOutput::error(format!(
            "{tool}: the sandbox executor stopped during this call ({reason}); whether the call took effect is unknown. The executor restarts for the next call."
        ))),
        Err(other) => Err(ToolError::Unavailable(other.to_string())),
    }
}

fn empty_path(tool: &str, path: &str) -> Option<ToolOutput> {
    path.trim()
        .is_empty()
        .then(|| ToolOutput::error(format!("{tool}: `path` is empty")))
}

/// stdout, then stderr under a marker, then one status line. Non-zero exits, signals and
/// timeouts are error results.
fn format_exec(output: &ExecOutput, timeout_secs: u64) -> ToolOutput {
    let mut content = output.stdout.clone();
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
    let failed = if output.interrupted {
        content.push_str(
            "[interrupted: the user stopped the execution; the command got SIGINT, then SIGKILL if it was still running]",
        );
        true
    } else if output.timed_out {
        content.push_str(&format!(
            "[timed out after {timeout_secs}s; the command and everything it started were killed]"
        ));
        true
    } else if let Some(code) = output.exit_code {
        content.push_str(&format!("[exit code: {code}]"));
        code != 0
    } else if let Some(signal) = output.signal {
        content.push_str(&format!("[killed by signal {signal}]"));
        true
    } else {
        content.push_str("[exit status unknown]");
        true
    };
    ToolOutput {
        content,
        is_error: failed,
    }
}

/// The status line, the headers, a blank line and the body (text, capped). Statuses of 400
/// and above are error results; a refusal by the proxy says why in its body.
fn format_http(response: &HttpResponse, cap: usize) -> ToolOutput {
    let mut content = format!("HTTP {} {}\n", response.status, response.reason);
    for (name, value) in &response.headers {
        content.push_str(&format!("{name}: {value}\n"));
    }
    content.push('\n');
    match std::str::from_utf8(&response.body) {
        Ok(text) => content.push_str(text),
        // A cut in the middle of a character is not binary: keep what decodes.
        Err(error) if response.truncated && error.error_len().is_none() => {
            content.push_str(&String::from_utf8_lossy(
                &response.body[..error.valid_up_to()],
            ));
        }
        Err(_) => content.push_str(&format!(
            "[binary body of {} bytes not shown]",
            response.body.len()
        )),
    }
    if response.truncated {
        if !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str(&format!(
            "[body truncated: only the first {cap} bytes are shown]"
        ));
    }
    let refused = response
        .headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case(PROXY_HEADER));
    ToolOutput {
        content,
        is_error: refused || response.status >= 400,
    }
}

fn format_read(path: &str, offset: u64, output: &ReadFileOutput) -> ToolOutput {
    let mut content = output.content.clone();
    let mut notes = Vec::new();
    if output.size == 0 {
        notes.push(format!("{path} is empty"));
    } else if let Some(next) = output.next_offset {
        notes.push(format!(
            "lines {}-{} of {path} shown; more follow: read_file with offset={next}",
            offset + 1,
            offset + output.lines
        ));
    }
    if let Some(note) = &output.note {
        notes.push(note.clone());
    }
    for note in notes {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        content.push_str(&format!("[{note}]"));
    }
    ToolOutput::ok(content)
}

fn format_list(path: &str, output: &ListDirOutput) -> ToolOutput {
    if output.entries.is_empty() {
        return ToolOutput::ok(format!("{path} is empty"));
    }
    let mut lines: Vec<String> = output
        .entries
        .iter()
        .map(|entry| match (entry.kind, entry.size) {
            (EntryKind::Dir, _) => format!("{}/", entry.name),
            (EntryKind::Symlink, _) => format!("{}@ (symlink)", entry.name),
            (EntryKind::Special, _) => format!("{} (special file)", entry.name),
            (EntryKind::File, Some(size)) => format!("{} ({size} bytes)", entry.name),
            (EntryKind::File, None) => entry.name.clone(),
        })
        .collect();
    let shown = output.entries.len() as u64;
    if output.total > shown {
        lines.push(format!("[{shown} of {} entries shown]", output.total));
    }
    ToolOutput::ok(lines.join("\n"))
}

fn format_grep(pattern: &str, output: &GrepOutput) -> ToolOutput {
    if output.matches.is_empty() {
        return ToolOutput::ok(format!("no matches for `{pattern}`"));
    }
    let mut content = output.matches.join("\n");
    if output.truncated {
        content.push_str("\n[more matches exist; narrow the path, glob or pattern]");
    }
    ToolOutput::ok(content)
}

/// Parses a call's arguments as `T`. Absent arguments (`null`) count as `{}`, so tools
/// whose fields are all optional can be called bare. A failure names the problem and the
/// arguments the tool expects (its signature), so that a model that wrote them wrong can
/// write them right.
fn parse<T: DeserializeOwned + JsonSchema>(call: &ToolCall) -> Result<T, ToolOutput> {
    parse_arguments(call).map_err(|problem| {
        ToolOutput::error(format!(
            "{problem}. Expected arguments: {}",
            definition::<T>(&call.name, "").signature()
        ))
    })
}

fn parse_arguments<T: DeserializeOwned>(call: &ToolCall) -> Result<T, String> {
    let arguments = match &call.arguments {
        serde_json::Value::Null => serde_json::Value::Object(serde_json::Map::new()),
        serde_json::Value::Object(_) => call.arguments.clone(),
        other @ (serde_json::Value::Bool(_)
        | serde_json::Value::Number(_)
        | serde_json::Value::String(_)
        | serde_json::Value::Array(_)) => {
            return Err(format!(
                "invalid arguments for `{}`: expected a JSON object, got {}",
                call.name,
                json_kind(other)
            ));
        }
    };
    serde_json::from_value(arguments)
        .map_err(|e| format!("invalid arguments for `{}`: {e}", call.name))
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
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

fn definitions() -> Vec<ToolDefinition> {
    vec![
        definition::<ShellArgs>(
            "shell",
            "Run a shell command (busybox sh) in the workspace, which is the current directory. \
             No network. The command and everything it starts are killed at the timeout; long \
             output keeps its beginning and end.",
        ),
        definition::<ReadFileArgs>(
            "read_file",
            "Read a text file in the workspace, a window of lines at a time.",
        ),
        definition::<WriteFileArgs>(
            "write_file",
            "Create or overwrite a file in the workspace with the given content.",
        ),
        definition::<EditFileArgs>(
            "edit_file",
            "Replace exact text in a workspace file. `old_text` must occur exactly once unless \
             `replace_all` is true.",
        ),
        definition::<ListDirArgs>(
            "list_dir",
            "List a directory of the workspace: directories end with `/`, files show their size.",
        ),
        definition::<GrepArgs>(
            "grep",
            "Search the files under a workspace path for a regular expression; answers \
             `path:line:text` lines.",
        ),
        definition::<HttpRequestArgs>(
            "http_request",
            "Send an HTTP request through the auth proxy, the only network access there is. \
             Only hosts, methods and paths allowed by its rules are reached; credentials are \
             added by the proxy, never by you. Redirects are returned, not followed. Answers \
             the status, the headers and the body (long bodies are cut).",
        ),
    ]
}

#[async_trait]
impl ToolExecutor for SandboxTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        definitions()
    }

    /// The tools that only read: the file tools that do not write, and `http_request`
    /// (its effects are outside the sandbox). `shell`, `write_file` and `edit_file` may.
    fn may_change_workspace(&self, call: &ToolCall) -> bool {
        !matches!(
            call.name.as_str(),
            "read_file" | "list_dir" | "grep" | "http_request"
        )
    }

    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError> {
        #[cfg(feature = "kill-points")]
        crate::kill_points::before_call();
        let output = self.dispatch(call, None).await;
        #[cfg(feature = "kill-points")]
        crate::kill_points::after_call();
        output
    }

    /// `shell` stops its command when `interrupt` resolves; the other tools are quick and
    /// run to their end.
    async fn execute_until(
        &self,
        call: &ToolCall,
        interrupt: Interrupt<'_>,
    ) -> Result<ToolOutput, ToolError> {
        #[cfg(feature = "kill-points")]
        crate::kill_points::before_call();
        let output = self.dispatch(call, Some(interrupt)).await;
        #[cfg(feature = "kill-points")]
        crate::kill_points::after_call();
        output
    }

    async fn read_text(&self, path: &str) -> Option<String> {
        let request = ReadFileRequest {
            path: path.to_owned(),
            offset: None,
            limit: None,
        };
        match self.sandbox.read_file(request).await {
            Ok(Ok(output)) => Some(output.content),
            Ok(Err(_)) | Err(_) => None,
        }
    }
}

impl SandboxTools {
    /// Runs `call` with the tool it names.
    async fn dispatch(
        &self,
        call: &ToolCall,
        interrupt: Option<Interrupt<'_>>,
    ) -> Result<ToolOutput, ToolError> {
        macro_rules! dispatch {
            ($args:ty, $method:ident) => {
                match parse::<$args>(call) {
                    Ok(args) => self.$method(args).await,
                    Err(output) => Ok(output),
                }
            };
        }
        match call.name.as_str() {
            "shell" => match parse::<ShellArgs>(call) {
                Ok(args) => self.shell(args, interrupt).await,
                Err(output) => Ok(output),
            },
            "read_file" => dispatch!(ReadFileArgs, read_file),
            "write_file" => dispatch!(WriteFileArgs, write_file),
            "edit_file" => dispatch!(EditFileArgs, edit_file),
            "list_dir" => dispatch!(ListDirArgs, list_dir),
            "grep" => dispatch!(GrepArgs, grep),
            "http_request" => dispatch!(HttpRequestArgs, http_request),
            other => Ok(ToolOutput::error(format!(
                "unknown tool `{other}`; available tools: {}",
                definitions()
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
    use nerve_core::ToolCallId;
    use nerve_executor::DirEntry;

    use super::*;

    fn check_parse<T: DeserializeOwned + JsonSchema + std::fmt::Debug>(
        name: &str,
        arguments: serde_json::Value,
        expected: Result<&str, &str>,
    ) {
        let call = ToolCall {
            id: ToolCallId("call-1".to_owned()),
            name: name.to_owned(),
            arguments,
        };
        // Every failure ends with the tool's signature; the problem comes before it.
        let signature = definition::<T>(name, "").signature();
        let got = parse::<T>(&call)
            .map(|args| format!("{args:?}"))
            .map_err(|output| {
                let suffix = format!(". Expected arguments: {signature}");
                assert!(output.content.ends_with(&suffix), "{}", output.content);
                output.content[..output.content.len() - suffix.len()].to_owned()
            });
        assert_eq!(
            got.as_ref().map(String::as_str).map_err(String::as_str),
            expected,
            "{name}"
        );
    }

    #[test]
    fn a_failure_shows_the_expected_arguments() {
        let call = ToolCall {
            id: ToolCallId("call-1".to_owned()),
            name: "edit_file".to_owned(),
            arguments: serde_json::json!({"path": "a.py"}),
        };
        assert_eq!(
            parse::<EditFileArgs>(&call).unwrap_err().content,
            "invalid arguments for `edit_file`: missing field `old_text`. Expected arguments: \
             edit_file {path: string, old_text: string, new_text: string, replace_all?: boolean}"
        );
    }

    #[test]
    fn arguments_are_validated_with_messages_naming_the_problem() {
        check_parse::<ShellArgs>(
            "shell",
            serde_json::json!({"command": "ls"}),
            Ok(r#"ShellArgs { command: "ls", timeout_secs: None, workdir: None }"#),
        );
        check_parse::<ShellArgs>(
            "shell",
            serde_json::json!({}),
            Err("invalid arguments for `shell`: missing field `command`"),
        );
        check_parse::<ShellArgs>(
            "shell",
            serde_json::json!({"command": "ls", "cwd": "/"}),
            Err(
                "invalid arguments for `shell`: unknown field `cwd`, expected one of `command`, `timeout_secs`, `workdir`",
            ),
        );
        check_parse::<ShellArgs>(
            "shell",
            serde_json::json!("ls"),
            Err("invalid arguments for `shell`: expected a JSON object, got a string"),
        );
        check_parse::<ReadFileArgs>(
            "read_file",
            serde_json::json!({"path": "a", "offset": -1}),
            Err("invalid arguments for `read_file`: invalid value: integer `-1`, expected u64"),
        );
        check_parse::<ListDirArgs>(
            "list_dir",
            serde_json::Value::Null,
            Ok("ListDirArgs { path: None }"),
        );
        check_parse::<EditFileArgs>(
            "edit_file",
            serde_json::json!({"path": "a", "old_text": "x", "new_text": "y", "replace_all": "yes"}),
            Err(
                "invalid arguments for `edit_file`: invalid type: string \"yes\", expected a boolean",
            ),
        );
    }

    #[test]
    fn schemas_are_generated_from_the_types() {
        let defs = definitions();
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "shell",
                "read_file",
                "write_file",
                "edit_file",
                "list_dir",
                "grep",
                "http_request"
            ]
        );
        let required = |name: &str| {
            defs.iter().find(|d| d.name == name).unwrap().parameters["required"].clone()
        };
        assert_eq!(required("shell"), serde_json::json!(["command"]));
        assert_eq!(required("read_file"), serde_json::json!(["path"]));
        assert_eq!(
            required("write_file"),
            serde_json::json!(["path", "content"])
        );
        assert_eq!(
            required("edit_file"),
            serde_json::json!(["path", "old_text", "new_text"])
        );
        assert_eq!(required("list_dir"), serde_json::Value::Null);
        assert_eq!(required("grep"), serde_json::json!(["pattern"]));
        assert_eq!(
            required("http_request"),
            serde_json::json!(["method", "url"])
        );
        for def in &defs {
            assert_eq!(def.parameters["type"], "object", "{}", def.name);
            assert_eq!(
                def.parameters["additionalProperties"], false,
                "{}",
                def.name
            );
            assert!(def.parameters.get("$schema").is_none());
        }
        let shell = &defs[0].parameters;
        assert!(shell["properties"]["timeout_secs"]["description"].is_string());
    }

    fn exec_output(stdout: &str, stderr: &str, exit: Option<i32>, timed_out: bool) -> ExecOutput {
        ExecOutput {
            exit_code: exit,
            signal: if exit.is_none() { Some(9) } else { None },
            timed_out,
            interrupted: false,
            stdout: stdout.to_owned(),
            stderr: stderr.to_owned(),
            stdout_omitted_bytes: 0,
            stderr_omitted_bytes: 0,
            duration_ms: 1,
        }
    }

    fn check_exec(output: ExecOutput, expected: &str, is_error: bool) {
        let got = format_exec(&output, 5);
        assert_eq!(got.content, expected);
        assert_eq!(got.is_error, is_error, "{expected}");
    }

    #[test]
    fn shell_results() {
        check_exec(
            exec_output("hi\n", "", Some(0), false),
            "hi\n[exit code: 0]",
            false,
        );
        check_exec(
            exec_output("out", "oops\n", Some(2), false),
            "out\n[stderr]\noops\n[exit code: 2]",
            true,
        );
        check_exec(
            exec_output("", "", None, true),
            "[timed out after 5s; the command and everything it started were killed]",
            true,
        );
        check_exec(
            exec_output("", "", None, false),
            "[killed by signal 9]",
            true,
        );
    }

    #[test]
    fn file_results() {
        let read = ReadFileOutput {
            content: "a\nb\n".into(),
            lines: 2,
            size: 10,
            next_offset: Some(12),
            note: None,
        };
        assert_eq!(
            format_read("f.txt", 10, &read).content,
            "a\nb\n[lines 11-12 of f.txt shown; more follow: read_file with offset=12]"
        );
        let empty = ReadFileOutput {
            content: String::new(),
            lines: 0,
            size: 0,
            next_offset: None,
            note: None,
        };
        assert_eq!(format_read("e", 0, &empty).content, "[e is empty]");
        let list = ListDirOutput {
            entries: vec![
                DirEntry {
                    name: "a.rs".into(),
                    kind: EntryKind::File,
                    size: Some(3),
                },
                DirEntry {
                    name: "src".into(),
                    kind: EntryKind::Dir,
                    size: None,
                },
                DirEntry {
                    name: "up".into(),
                    kind: EntryKind::Symlink,
                    size: None,
                },
                DirEntry {
                    name: "pipe".into(),
                    kind: EntryKind::Special,
                    size: None,
                },
            ],
            total: 5,
        };
        assert_eq!(
            format_list(".", &list).content,
            "a.rs (3 bytes)\nsrc/\nup@ (symlink)\npipe (special file)\n[4 of 5 entries shown]"
        );
        assert_eq!(
            format_grep(
                "x",
                &GrepOutput {
                    matches: vec![],
                    truncated: false
                }
            )
            .content,
            "no matches for `x`"
        );
        assert_eq!(
            format_grep(
                "x",
                &GrepOutput {
                    matches: vec!["a:1:x".into()],
                    truncated: true
                }
            )
            .content,
            "a:1:x\n[more matches exist; narrow the path, glob or pattern]"
        );
    }

    fn http_response(
        status: u16,
        headers: &[(&str, &str)],
        body: &[u8],
        truncated: bool,
    ) -> HttpResponse {
        HttpResponse {
            status,
            reason: http::StatusCode::from_u16(status)
                .unwrap()
                .canonical_reason()
                .unwrap_or_default()
                .to_owned(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            body: body.to_vec(),
            truncated,
        }
    }

    #[test]
    fn http_results() {
        let check = |response: HttpResponse, expected: &str, is_error: bool| {
            let got = format_http(&response, 4);
            assert_eq!(got.content, expected);
            assert_eq!(got.is_error, is_error, "{expected}");
        };
        check(
            http_response(200, &[("content-type", "text/plain")], b"ok", false),
            "HTTP 200 OK\ncontent-type: text/plain\n\nok",
            false,
        );
        check(
            http_response(302, &[("location", "http://elsewhere.test/")], b"", false),
            "HTTP 302 Found\nlocation: http://elsewhere.test/\n\n",
            false,
        );
        check(
            http_response(404, &[], b"nope", false),
            "HTTP 404 Not Found\n\nnope",
            true,
        );
        check(
            http_response(
                403,
                &[("x-nerve-proxy", "denied")],
                b"nerve proxy: denied: no rule allows the host evil.test\n",
                false,
            ),
            "HTTP 403 Forbidden\nx-nerve-proxy: denied\n\nnerve proxy: denied: no rule allows the host evil.test\n",
            true,
        );
        check(
            http_response(200, &[], b"abc\xc3", true),
            "HTTP 200 OK\n\nabc\n[body truncated: only the first 4 bytes are shown]",
            false,
        );
        check(
            http_response(200, &[], b"\xff\xfe\x00", false),
            "HTTP 200 OK\n\n[binary body of 3 bytes not shown]",
            false,
        );
    }
}
