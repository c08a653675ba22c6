//! Nerve as an Agent Client Protocol agent (protocol v1, JSON-RPC over stdio): the front
//! end an editor (Zed, JetBrains IDEs, Neovim's CodeCompanion) starts as `nerve acp`. It
//! only translates: every editor session is one execution that the runtime assembles as
//! it does for `nerve chat` (one sandbox, one log, one context; each prompt the next user
//! message), and what the runtime's [`Observer`](nerve_runtime::observer::Observer) hears
//! becomes `session/update` notifications (`updates`). The wire itself, from parsing a
//! line to answering an unknown method, is the official SDK's (`agent-client-protocol`).
//!
//! - `agent`: the methods (`initialize`, `session/new`, `session/load`, `session/prompt`,
//!   `session/cancel`, `session/set_mode`) and the sessions they keep.
//! - `updates`: events and answer deltas as session updates; a loaded session's transcript
//!   replayed the same way.
//! - `transport`: stdin and stdout as JSON-RPC lines, every line going out through the
//!   execution's redactor (a secret never reaches the editor).
//!
//! Nothing here writes to stdout but the transport; logs go to `tracing` (the binary sends
//! them to stderr).

mod agent;
mod transport;
mod updates;

use std::path::PathBuf;

use nerve_runtime::RuntimeError;
use nerve_runtime::config::Config;

/// What every session of this agent starts with (`nerve acp`'s options).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `script:PATH`, `openai` or `anthropic`; `None`: the runtime's default (a loaded
    /// session keeps the provider it started with).
    pub provider: Option<String>,
    pub model: Option<String>,
    /// Turns per prompt.
    pub max_turns: u32,
    /// The loop each prompt runs (`react` unless asked; a plan loop's plan is shown as a
    /// `plan` update).
    pub loop_type: nerve_core::LoopType,
    pub context_window: Option<u64>,
    pub image: Option<String>,
    /// Whether the engine's spans may carry message content (through the redactor).
    pub capture_content: bool,
    /// Whether AGENTS.md (or CLAUDE.md) and the user's instructions reach the model.
    pub project_instructions: bool,
}

/// Serves the protocol on stdin and stdout until the client closes stdin (or the
/// connection fails), then removes the sandboxes of the sessions it opened.
pub async fn serve(db: PathBuf, config: Config, settings: Settings) -> Result<(), RuntimeError> {
    let redactor = nerve_runtime::launch::config_redactor(&config)?;
    // One agent per process, alive until it exits: the launches borrow the log's path
    // and the configuration for as long as their sessions run.
    let db: &'static std::path::Path = Box::leak(db.into_boxed_path());
    let config: &'static Config = Box::leak(Box::new(config));
    agent::serve(db, config, settings, transport::stdio(redactor)).await
}
