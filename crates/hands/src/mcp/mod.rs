//! MCP tools: the tools of Model Context Protocol servers, offered to the model beside the
//! built-in ones as `SERVER__TOOL`.
//!
//! A stdio server runs inside the execution's sandbox by default, started by the executor
//! with its stdio on a one-off unix socket to the host ([`Sandbox::spawn_process`]): it has
//! the sandbox's confinement (no network but the proxy, no host secrets, no path outside the
//! workspace). With `trust = "host"` it runs on the host instead, which is recorded with a
//! warning. A `url` server is spoken to in streamable HTTP from the host, every request sent
//! through the execution's auth proxy ([`Sandbox::proxy_socket`]), so the proxy's rules,
//! credential injection and events apply to it as to the sandbox. Each server's tools pass
//! a schema check and the `tools` allow / deny lists; `notifications/tools/list_changed`
//! refreshes them for the next turn.
//!
//! Faults (a server that cannot start, exits, breaks the protocol or passes its timeout)
//! become an error result for the model; the server is restarted once, and after a second
//! fault its tools are withdrawn, with a note in the failing call's result. The tail of its
//! stderr goes with every fault into the result, and so into the log.
//!
//! The SDK (`rmcp`) stays in `client.rs`; this module works on the protocol's JSON.

mod client;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use nerve_core::{ToolCall, ToolDefinition, ToolError, ToolExecutor, ToolOutput};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::task::JoinHandle;

use crate::sandbox::Sandbox;
use client::{CallError, Client, OnToolsChanged};

/// How long a call may take when the server's config names no `timeout_secs`.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// How long a server may take at least to start and list its tools (its call timeout when
/// longer).
const START_LIMIT: Duration = Duration::from_secs(30);
/// Restarts after a fault before the server's tools are withdrawn.
const MAX_RESTARTS: u32 = 1;
/// How much of a server's stderr is kept, and how much of it a fault's result shows.
const STDERR_KEPT: usize = 8 * 1024;
const STDERR_SHOWN: usize = 1024;
/// The longest tool name providers accept.
const MAX_TOOL_NAME: usize = 64;
/// The most text one result carries; the rest is cut with a note.
const MAX_RESULT_BYTES: usize = 256 * 1024;
/// The largest input schema passed to the model.
const MAX_SCHEMA_BYTES: usize = 64 * 1024;

type Reader = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
type Writer = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// One `[[mcp.servers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The server's name: the prefix of its tools (`NAME__TOOL`).
    pub name: String,
    /// The program of a stdio server (looked up in the sandbox's `PATH`, or the host's).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The endpoint of a streamable-HTTP server, reached through the auth proxy.
    #[serde(default)]
    pub url: Option<String>,
    /// Names of host variables passed to the server; values go through the credential
    /// filter (a secret never reaches a server's environment: use a proxy rule).
    #[serde(default)]
    pub env: Vec<String>,
    /// Which of its tools the model sees.
    #[serde(default)]
    pub tools: ToolFilter,
    /// Seconds one call may take (default 60).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Where a stdio server runs (default: inside the sandbox).
    #[serde(default)]
    pub trust: Trust,
}

/// `tools = { allow = [...], deny = [...] }`: patterns over the server's own tool names,
/// `*` matching any run of characters. Empty `allow` allows every tool; `deny` wins.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolFilter {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub deny: Vec<String>,
}

impl ToolFilter {
    /// Whether the tool named `name` (the server's name for it) is offered.
    pub fn admits(&self, name: &str) -> bool {
        let allowed = self.allow.is_empty() || self.allow.iter().any(|p| glob_match(p, name));
        allowed && !self.deny.iter().any(|p| glob_match(p, name))
    }
}

/// Where a server runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trust {
    /// Inside the execution's sandbox, started by its executor.
    #[default]
    Sandbox,
    /// On the host, with the user's rights: only for servers the user trusts.
    Host,
}

impl Trust {
    /// `sandbox` or `host`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sandbox => "sandbox",
            Self::Host => "host",
        }
    }
}

impl McpServerConfig {
    /// Checks the entry on its own; the error is one line naming the server.
    pub fn validate(&self) -> Result<(), String> {
        let name = &self.name;
        if name.is_empty() || sanitize(name) != *name || name.contains("__") {
            return Err(format!(
                "MCP server name `{name}` must be non-empty letters, digits, `-` or single `_`"
            ));
        }
        match (&self.command, &self.url) {
            (Some(command), None) if !command.trim().is_empty() => {}
            (None, Some(url)) => {
                check_url(url).map_err(|why| format!("MCP server `{name}`: `url` {why}"))?;
                let stdio_only = [
                    ("args", !self.args.is_empty()),
                    ("env", !self.env.is_empty()),
                    ("trust = \"host\"", self.trust == Trust::Host),
                ];
                if let Some((key, _)) = stdio_only.iter().find(|(_, given)| *given) {
                    return Err(format!(
                        "MCP server `{name}`: `{key}` is for stdio servers; a `url` server is reached through the auth proxy"
                    ));
                }
            }
            (Some(_), Some(_)) => {
                return Err(format!(
                    "MCP server `{name}`: give either `command` (stdio) or `url` (HTTP), not both"
                ));
            }
            _ => {
                return Err(format!(
                    "MCP server `{name}`: give `command` (stdio) or `url` (HTTP)"
                ));
            }
        }
        if self.timeout_secs == Some(0) {
            return Err(format!(
                "MCP server `{name}`: `timeout_secs` must be at least 1"
            ));
        }
        if let Some(bad) = self
            .env
            .iter()
            .find(|v| v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            return Err(format!(
                "MCP server `{name}`: `env` lists variable names; `{bad}` is not one"
            ));
        }
        Ok(())
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS))
    }

    /// Where the server runs: `sandbox`, `host`, or `remote` (a `url` server).
    pub fn runs(&self) -> &'static str {
        if self.url.is_some() {
            "remote"
        } else {
            self.trust.as_str()
        }
    }
}

/// A streamable-HTTP endpoint the proxy can judge: `http://` or `https://`, a host, no user
/// name or password (the proxy refuses those too; credentials go in a proxy rule).
fn check_url(url: &str) -> Result<(), String> {
    let parsed: http::Uri = url
        .parse()
        .map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if !matches!(parsed.scheme_str(), Some("http" | "https")) {
        return Err(format!("`{url}` must start with http:// or https://"));
    }
    match parsed.authority() {
        None => Err(format!("`{url}` names no host")),
        Some(authority) if authority.as_str().contains('@') => Err(format!(
            "`{url}` carries a user name; give credentials through a proxy rule"
        )),
        Some(authority) if authority.host().is_empty() => Err(format!("`{url}` names no host")),
        Some(_) => Ok(()),
    }
}

/// A configured server with the values of its environment, already filtered.
#[derive(Debug, Clone)]
pub struct McpServerSpec {
    pub config: McpServerConfig,
    pub env: BTreeMap<String, String>,
}

/// What became of one server, for `nerve mcp list` and the log's record of the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerReport {
    pub name: String,
    /// `sandbox`, `host`, or `remote` (a `url` server, reached through the auth proxy).
    pub runs: &'static str,
    /// The command line, or the URL.
    pub command: String,
    /// The tools offered to the model, by their exposed names.
    pub tools: Vec<String>,
    /// Tools not offered, each with the reason (an invalid schema, a name clash).
    pub skipped: Vec<String>,
    /// Why the server offers nothing, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Said about a server on the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// The built-in tools plus the tools of the configured MCP servers.
pub struct McpTools {
    inner: Arc<dyn ToolExecutor>,
    servers: Vec<Arc<Server>>,
}

impl std::fmt::Debug for McpTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTools")
            .field("servers", &self.servers)
            .finish_non_exhaustive()
    }
}

impl McpTools {
    /// Starts every server (inside `sandbox` unless trusted on the host; host servers start
    /// in `workspace`; `url` servers through the sandbox's proxy) and lists its tools. A
    /// server that cannot start is reported and offers nothing; nothing here fails the run.
    pub async fn start(
        inner: Arc<dyn ToolExecutor>,
        specs: Vec<McpServerSpec>,
        sandbox: Option<Arc<Sandbox>>,
        workspace: Option<PathBuf>,
    ) -> Self {
        let mut servers = Vec::new();
        for spec in specs {
            let server = Arc::new(Server::new(spec, sandbox.clone(), workspace.clone()));
            server.boot().await;
            servers.push(server);
        }
        // Names clash only across servers with equal sanitised prefixes, which validation
        // forbids; a clash with a built-in tool is impossible (those have no `__`).
        Self { inner, servers }
    }

    /// One report per server, in configuration order.
    pub fn reports(&self) -> Vec<ServerReport> {
        self.servers.iter().map(|s| s.report()).collect()
    }

    /// Ends every server: closes its stdin, then kills what is left.
    pub async fn shutdown(&self) {
        for server in &self.servers {
            let mut state = server.state.lock().await;
            if let Some(live) = state.live.take() {
                server.stop(live).await;
            }
        }
    }

    fn route(&self, name: &str) -> Option<(&Arc<Server>, String)> {
        self.servers.iter().find_map(|server| {
            let remote = server.remote_name(name)?;
            Some((server, remote))
        })
    }
}

#[async_trait]
impl ToolExecutor for McpTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        let mut definitions = self.inner.definitions();
        for server in &self.servers {
            definitions.extend(server.definitions());
        }
        definitions
    }

    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError> {
        match self.route(&call.name) {
            Some((server, remote)) => Ok(server.call(&call.name, &remote, &call.arguments).await),
            None => self.inner.execute(call).await,
        }
    }

    /// An MCP tool may do anything; the built-in ones say for themselves.
    fn may_change_workspace(&self, call: &ToolCall) -> bool {
        self.route(&call.name).is_some() || self.inner.may_change_workspace(call)
    }

    async fn read_text(&self, path: &str) -> Option<String> {
        self.inner.read_text(path).await
    }
}

/// One tool as offered: its exposed name, the server's name for it, its definition.
#[derive(Debug, Clone)]
struct Exposed {
    remote: String,
    definition: ToolDefinition,
}

/// The server's current tool list, shared with the list-changed handler.
#[derive(Debug, Default)]
struct ToolSet {
    tools: Vec<Exposed>,
    skipped: Vec<String>,
}

/// One configured server and its running process, if any.
#[derive(Debug)]
struct Server {
    config: McpServerConfig,
    env: BTreeMap<String, String>,
    sandbox: Option<Arc<Sandbox>>,
    workspace: Option<PathBuf>,
    tools: Arc<Mutex<ToolSet>>,
    stderr: StderrTail,
    /// Held for a whole call: a server answers one call at a time here.
    state: tokio::sync::Mutex<State>,
    /// Mirrors `state` for the synchronous readers (`definitions`, `report`).
    status: Mutex<Status>,
}

#[derive(Debug, Default)]
struct State {
    live: Option<Live>,
    restarts: u32,
}

#[derive(Debug, Default, Clone)]
struct Status {
    /// Why the server offers nothing: it could not start or was withdrawn.
    withdrawn: Option<String>,
}

#[derive(Debug)]
struct Live {
    client: Client,
    process: Process,
    drain: JoinHandle<()>,
}

#[derive(Debug)]
enum Process {
    Sandbox(u32),
    Host(tokio::process::Child),
    /// A `url` server: no process of ours.
    Remote,
}

/// How the client reaches a server.
enum Transport {
    /// The server's stdout and stdin.
    Stdio(Reader, Writer),
    /// Streamable HTTP at `url`, through the proxy's socket.
    Http { proxy: PathBuf, url: String },
}

impl Server {
    fn new(spec: McpServerSpec, sandbox: Option<Arc<Sandbox>>, workspace: Option<PathBuf>) -> Self {
        Self {
            config: spec.config,
            env: spec.env,
            sandbox,
            workspace,
            tools: Arc::default(),
            stderr: StderrTail::default(),
            state: tokio::sync::Mutex::default(),
            status: Mutex::default(),
        }
    }

    fn command_line(&self) -> String {
        if let Some(url) = &self.config.url {
            return url.clone();
        }
        let mut words = vec![self.config.command.clone().unwrap_or_default()];
        words.extend(self.config.args.iter().cloned());
        words.join(" ")
    }

    fn report(&self) -> ServerReport {
        let set = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        let status = self.status();
        let withdrawn = status.withdrawn.is_some();
        ServerReport {
            name: self.config.name.clone(),
            runs: self.config.runs(),
            command: self.command_line(),
            tools: if withdrawn {
                Vec::new()
            } else {
                set.tools.iter().map(|t| t.definition.name.clone()).collect()
            },
            skipped: set.skipped.clone(),
            error: status.withdrawn,
            warning: (self.config.trust == Trust::Host).then(|| {
                format!(
                    "MCP server `{}` runs on the host with the user's rights (trust = \"host\"), outside the sandbox",
                    self.config.name
                )
            }),
        }
    }

    fn status(&self) -> Status {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn withdraw(&self, reason: String) {
        tracing::warn!(server = %self.config.name, %reason, "MCP server withdrawn");
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .withdrawn = Some(reason);
    }

    fn definitions(&self) -> Vec<ToolDefinition> {
        if self.status().withdrawn.is_some() {
            return Vec::new();
        }
        let set = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        set.tools.iter().map(|t| t.definition.clone()).collect()
    }

    /// The server's name for an exposed tool name of this server.
    fn remote_name(&self, exposed: &str) -> Option<String> {
        if !exposed.starts_with(&format!("{}__", self.config.name)) {
            return None;
        }
        let set = self.tools.lock().unwrap_or_else(PoisonError::into_inner);
        set.tools
            .iter()
            .find(|t| t.definition.name == exposed)
            .map(|t| t.remote.clone())
    }

    /// The first start, with the one restart a fault earns.
    async fn boot(&self) {
        let mut state = self.state.lock().await;
        if self.config.trust == Trust::Host {
            tracing::warn!(server = %self.config.name, "MCP server runs on the host (trust = \"host\")");
        }
        match self.start().await {
            Ok(live) => state.live = Some(live),
            Err(first) => {
                state.restarts += 1;
                match self.start().await {
                    Ok(live) => state.live = Some(live),
                    Err(second) => self.withdraw(format!(
                        "it could not start ({first}; again on restart: {second}){}",
                        self.stderr.shown()
                    )),
                }
            }
        }
    }

    /// Starts the process (or reaches the `url`), runs the handshake and lists the tools.
    async fn start(&self) -> Result<Live, String> {
        let (transport, stderr, process): (Transport, Reader, Process) = match (
            &self.config.url,
            self.config.trust,
        ) {
            (Some(url), _) => {
                let proxy = self
                        .sandbox
                        .as_ref()
                        .and_then(|s| s.proxy_socket())
                        .ok_or_else(|| {
                            "a `url` server is reached through the execution's auth proxy, and there is none here".to_owned()
                        })?;
                let transport = Transport::Http {
                    proxy: proxy.to_path_buf(),
                    url: url.clone(),
                };
                (transport, Box::new(tokio::io::empty()), Process::Remote)
            }
            (None, Trust::Sandbox) => {
                let Some(sandbox) = &self.sandbox else {
                    return Err("there is no sandbox to run it in".to_owned());
                };
                let mut argv = vec![self.config.command.clone().unwrap_or_default()];
                argv.extend(self.config.args.iter().cloned());
                let spawned = sandbox
                    .spawn_process(argv, self.env.clone())
                    .await
                    .map_err(|e| e.to_string())??;
                let (read, write) = spawned.stdio.into_split();
                (
                    Transport::Stdio(Box::new(read), Box::new(write)),
                    Box::new(spawned.stderr),
                    Process::Sandbox(spawned.pid),
                )
            }
            (None, Trust::Host) => {
                let program = self.config.command.clone().unwrap_or_default();
                let mut command = tokio::process::Command::new(&program);
                command
                    .args(&self.config.args)
                    .env_clear()
                    .envs(host_base_env())
                    .envs(&self.env)
                    .stdin(std::process::Stdio::piped())
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .kill_on_drop(true);
                if let Some(dir) = &self.workspace {
                    command.current_dir(dir);
                }
                let mut child = command
                    .spawn()
                    .map_err(|e| format!("cannot start `{program}`: {e}"))?;
                let (Some(stdin), Some(stdout), Some(stderr)) =
                    (child.stdin.take(), child.stdout.take(), child.stderr.take())
                else {
                    return Err("the server's stdio is missing".to_owned());
                };
                (
                    Transport::Stdio(Box::new(stdout), Box::new(stdin)),
                    Box::new(stderr),
                    Process::Host(child),
                )
            }
        };
        let drain = self.stderr.drain(stderr, self.config.name.clone());
        let on_change = self.on_tools_changed();
        let start_limit = START_LIMIT.max(self.config.timeout());
        let started = tokio::time::timeout(start_limit, async {
            let client = match transport {
                Transport::Stdio(read, write) => Client::connect(read, write, on_change).await?,
                Transport::Http { proxy, url } => {
                    Client::connect_http(&proxy, &url, on_change).await?
                }
            };
            let listed = client.list_tools().await?;
            Ok::<_, String>((client, listed))
        })
        .await;
        let live_parts = match started {
            Ok(Ok(parts)) => Ok(parts),
            Ok(Err(reason)) => Err(reason),
            Err(_) => Err(format!(
                "it did not finish its handshake within {}s",
                start_limit.as_secs()
            )),
        };
        // What went wrong on the way is the proxy's to tell; and one thing it does on
        // purpose breaks servers that keep sessions (docs/mcp.md).
        let live_parts = live_parts.map_err(|reason| match &self.config.url {
            Some(_) => format!(
                "{reason}; it is reached through the auth proxy, whose proxy_decision events say what it did (behind a rule with a credential the proxy drops the Mcp-Session-Id header, so only a stateless server works there)"
            ),
            None => reason,
        });
        match live_parts {
            Ok((client, listed)) => {
                *self.tools.lock().unwrap_or_else(PoisonError::into_inner) =
                    expose(&self.config, &listed);
                Ok(Live {
                    client,
                    process,
                    drain,
                })
            }
            Err(reason) => {
                self.kill(process).await;
                drain.abort();
                Err(reason)
            }
        }
    }

    fn on_tools_changed(&self) -> OnToolsChanged {
        let tools = Arc::clone(&self.tools);
        let config = self.config.clone();
        Arc::new(move |listed| match listed {
            Ok(listed) => {
                let set = expose(&config, &listed);
                tracing::info!(server = %config.name, tools = set.tools.len(), "MCP tool list changed");
                *tools.lock().unwrap_or_else(PoisonError::into_inner) = set;
            }
            Err(error) => {
                tracing::warn!(server = %config.name, %error, "cannot refresh the MCP tool list");
            }
        })
    }

    async fn stop(&self, live: Live) {
        live.client.close().await;
        self.kill(live.process).await;
        live.drain.abort();
    }

    async fn kill(&self, process: Process) {
        match process {
            Process::Sandbox(pid) => {
                if let Some(sandbox) = &self.sandbox {
                    let _ = sandbox.signal_process(pid, true).await;
                }
            }
            Process::Host(mut child) => {
                let _ = child.kill().await;
            }
            Process::Remote => {}
        }
    }

    /// One call, with the fault handling of the module doc.
    async fn call(&self, exposed: &str, remote: &str, arguments: &Value) -> ToolOutput {
        let arguments = match arguments {
            Value::Object(map) => map.clone(),
            Value::Null => serde_json::Map::new(),
            other @ (Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Array(_)) => {
                return ToolOutput::error(format!(
                    "{exposed}: arguments must be a JSON object, not {other}"
                ));
            }
        };
        let mut state = self.state.lock().await;
        if let Some(reason) = self.status().withdrawn {
            return ToolOutput::error(format!(
                "{exposed}: the MCP server `{}` was withdrawn: {reason}",
                self.config.name
            ));
        }
        if state
            .live
            .as_ref()
            .is_none_or(|live| live.client.is_closed())
        {
            // It exited between calls, or a fault left it stopped: a restart is due.
            if let Some(message) = self.recover(&mut state, None).await {
                return ToolOutput::error(format!("{exposed}: {message}"));
            }
        }
        let Some(live) = &state.live else {
            return ToolOutput::error(format!("{exposed}: the MCP server is not running"));
        };
        let timeout = self.config.timeout();
        let answer = tokio::time::timeout(timeout, live.client.call_tool(remote, arguments)).await;
        let fault = match answer {
            Ok(Ok(result)) => return to_output(&result),
            Ok(Err(CallError::Refused(message))) => {
                return ToolOutput::error(format!(
                    "{exposed}: the server refused the call: {message}"
                ));
            }
            Ok(Err(CallError::Broken(reason))) => {
                format!("the server failed during the call ({reason})")
            }
            Err(_) => format!("the server did not answer within {}s", timeout.as_secs()),
        };
        let message = self
            .recover(&mut state, Some(fault))
            .await
            .unwrap_or_default();
        ToolOutput::error(format!("{exposed}: {message}"))
    }

    /// Stops a faulty server and restarts it if it has a restart left, else withdraws its
    /// tools. Returns the message for the model (`None` after a silent, successful restart
    /// of a server that was already stopped).
    async fn recover(&self, state: &mut State, fault: Option<String>) -> Option<String> {
        if let Some(live) = state.live.take() {
            self.stop(live).await;
        }
        let stderr = self.stderr.shown();
        let name = &self.config.name;
        let said = fault.clone().unwrap_or_else(|| "it had stopped".to_owned());
        if state.restarts >= MAX_RESTARTS {
            let reason = format!("{said}, after it had already been restarted once{stderr}");
            self.withdraw(reason.clone());
            return Some(format!(
                "{reason}. The tools of MCP server `{name}` are withdrawn for the rest of this execution; do not call them again."
            ));
        }
        state.restarts += 1;
        match self.start().await {
            Ok(live) => {
                state.live = Some(live);
                fault.map(|fault| {
                    format!("{fault}; whether the call took effect is unknown. The server was restarted and takes calls again{stderr}")
                })
            }
            Err(again) => {
                let reason = format!("{said}; restarting it failed too ({again}){stderr}");
                self.withdraw(reason.clone());
                Some(format!(
                    "{reason}. The tools of MCP server `{name}` are withdrawn for the rest of this execution; do not call them again."
                ))
            }
        }
    }
}

/// What a host server's environment starts from: a `PATH` and a `HOME`, nothing else of
/// the user's (the configured `env` names add to it).
fn host_base_env() -> Vec<(String, String)> {
    ["PATH", "HOME", "LANG", "TZ"]
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?)))
        .collect()
}

/// The last bytes a server wrote to stderr.
#[derive(Debug, Default, Clone)]
struct StderrTail(Arc<Mutex<Vec<u8>>>);

impl StderrTail {
    fn drain(&self, mut stream: Reader, server: String) -> JoinHandle<()> {
        let tail = self.clone();
        tokio::spawn(async move {
            let mut buffer = vec![0u8; 4096];
            while let Ok(n @ 1..) = stream.read(&mut buffer).await {
                let chunk = &buffer[..n];
                tracing::debug!(%server, stderr = %String::from_utf8_lossy(chunk).trim_end(), "MCP server stderr");
                let mut kept = tail.0.lock().unwrap_or_else(PoisonError::into_inner);
                kept.extend_from_slice(chunk);
                let excess = kept.len().saturating_sub(STDERR_KEPT);
                kept.drain(..excess);
            }
        })
    }

    /// `"; its stderr ended with: ..."` (clipped), or nothing when it wrote none.
    fn shown(&self) -> String {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let start = kept.len().saturating_sub(STDERR_SHOWN);
        let text = String::from_utf8_lossy(&kept[start..]).trim().to_owned();
        if text.is_empty() {
            String::new()
        } else {
            let cut = if start > 0 { "..." } else { "" };
            format!("; its stderr ended with: {cut}{text}")
        }
    }
}

/// Letters, digits, `_` and `-`: what every provider accepts in a tool name.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The exposed name of a server's tool: `SERVER__TOOL`, sanitised, at most 64 characters.
pub fn exposed_name(server: &str, tool: &str) -> String {
    let mut name = format!("{}__{}", sanitize(server), sanitize(tool));
    name.truncate(MAX_TOOL_NAME);
    name
}

/// The server's tools as offered to the model: filtered, renamed, schemas checked.
fn expose(config: &McpServerConfig, listed: &[Value]) -> ToolSet {
    let mut set = ToolSet::default();
    for tool in listed {
        let Some(remote) = tool.get("name").and_then(Value::as_str) else {
            set.skipped
                .push("a tool without a name was skipped".to_owned());
            continue;
        };
        if !config.tools.admits(remote) {
            continue;
        }
        let name = exposed_name(&config.name, remote);
        if set.tools.iter().any(|t| t.definition.name == name) {
            set.skipped.push(format!(
                "{remote}: its name clashes with another tool as {name}"
            ));
            continue;
        }
        let schema = tool.get("inputSchema").cloned().unwrap_or(Value::Null);
        if let Err(problem) = check_schema(&schema) {
            tracing::warn!(server = %config.name, tool = remote, %problem, "MCP tool skipped");
            set.skipped
                .push(format!("{remote}: invalid input schema: {problem}"));
            continue;
        }
        let description = tool
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim();
        set.tools.push(Exposed {
            remote: remote.to_owned(),
            definition: ToolDefinition {
                name,
                description: format!("[MCP server `{}`] {description}", config.name)
                    .trim_end()
                    .to_owned(),
                parameters: schema,
            },
        });
    }
    set
}

/// The checks an input schema must pass before a provider sees it: a JSON Schema object
/// of `type: object`, `properties` an object of schemas, `required` a list of names.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    let Value::Object(map) = schema else {
        return Err("it is not a JSON object".to_owned());
    };
    if map.get("type").and_then(Value::as_str) != Some("object") {
        return Err("its `type` is not \"object\"".to_owned());
    }
    if let Some(properties) = map.get("properties") {
        let Value::Object(properties) = properties else {
            return Err("`properties` is not an object".to_owned());
        };
        if let Some((key, _)) = properties
            .iter()
            .find(|(_, v)| !matches!(v, Value::Object(_) | Value::Bool(_)))
        {
            return Err(format!("property `{key}` is not a schema"));
        }
    }
    if let Some(required) = map.get("required") {
        let names = required
            .as_array()
            .filter(|a| a.iter().all(Value::is_string));
        if names.is_none() {
            return Err("`required` is not a list of names".to_owned());
        }
    }
    let size = schema.to_string().len();
    if size > MAX_SCHEMA_BYTES {
        return Err(format!(
            "it is {size} bytes; the limit is {MAX_SCHEMA_BYTES}"
        ));
    }
    Ok(())
}

/// A `tools/call` result (MCP JSON) as the tool result: text as it is, structured content
/// as JSON when there is no text, binary content as a placeholder naming its type and
/// size, `isError` as an error result.
pub fn to_output(result: &Value) -> ToolOutput {
    let mut parts = Vec::new();
    for block in result
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let kind = block
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        let text = |key: &str| block.get(key).and_then(Value::as_str).unwrap_or("");
        parts.push(match kind {
            "text" => text("text").to_owned(),
            "image" | "audio" => format!(
                "[{kind} content: {}, {} bytes, not shown]",
                text("mimeType"),
                base64_len(text("data"))
            ),
            "resource" => {
                let resource = block.get("resource").cloned().unwrap_or(Value::Null);
                let field = |key: &str| {
                    resource
                        .get(key)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                match resource.get("text").and_then(Value::as_str) {
                    Some(body) => format!("[resource {}]\n{body}", field("uri")),
                    None => format!(
                        "[resource {}: {}, {} bytes, not shown]",
                        field("uri"),
                        field("mimeType"),
                        base64_len(&field("blob"))
                    ),
                }
            }
            "resource_link" => format!("[resource link: {}]", text("uri")),
            other => format!("[{other} content, not shown]"),
        });
    }
    if parts.is_empty()
        && let Some(structured) = result.get("structuredContent")
    {
        parts.push(structured.to_string());
    }
    let mut content = parts.join("\n");
    if content.is_empty() {
        content = "(the tool returned no content)".to_owned();
    }
    if content.len() > MAX_RESULT_BYTES {
        let mut cut = MAX_RESULT_BYTES;
        while !content.is_char_boundary(cut) {
            cut -= 1;
        }
        let dropped = content.len() - cut;
        content.truncate(cut);
        content.push_str(&format!("\n[... {dropped} bytes cut ...]"));
    }
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        ToolOutput::error(content)
    } else {
        ToolOutput::ok(content)
    }
}

/// The decoded size of base64 text.
fn base64_len(data: &str) -> usize {
    let data = data.trim_end_matches('=');
    data.len() * 3 / 4
}

/// `*` matches any run of characters; everything else matches itself.
fn glob_match(pattern: &str, name: &str) -> bool {
    let Some((head, rest)) = pattern.split_once('*') else {
        return pattern == name;
    };
    let Some(mut remaining) = name.strip_prefix(head) else {
        return false;
    };
    let mut pieces: Vec<&str> = rest.split('*').collect();
    let last = pieces.pop().unwrap_or("");
    for piece in pieces {
        match remaining.find(piece) {
            Some(at) => remaining = &remaining[at + piece.len()..],
            None => return false,
        }
    }
    remaining.len() >= last.len() && remaining.ends_with(last)
}

#[cfg(test)]
mod tests;
