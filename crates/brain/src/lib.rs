//! Nerve's brain: model providers, the execution loops that drive an agent from task to a
//! well-defined end, and the guardrails around them. It reaches the event log and the
//! sandbox only through the ports of `nerve-core`, so every loop runs in-process against
//! fakes in tests and against SQLite and Docker in production.
//!
//! Its folders are its floors, from the bottom up (ARCHITECTURE.md, `tests/layout`):
//! `provider` (one model call: the port, the wire formats, the clients, tokens, retry),
//! `guards` (approval, stagnation, runaway streams), `context` (the window and its
//! compaction), `run` (the running execution's parts and its tool calls), `loops` (ReAct,
//! plan-execute and hybrid), and `engine`, which builds a run and drives a loop to its end.
//! `config`, `stop` and `telemetry` sit beside the parts, below every loop.

pub mod config;
pub mod context;
pub mod engine;
pub mod guards;
pub mod loops;
pub mod provider;
pub mod run;
pub(crate) mod stop;
pub mod telemetry;

#[cfg(test)]
mod tests;

pub use config::EngineConfig;
pub use engine::{
    AgentEngine, ChildLimits, ChildLog, ChildResume, ChildState, EngineError, FollowUp,
    ResumeState, Task,
};
pub use provider::anthropic::{AnthropicConfig, AnthropicProvider};
pub use provider::http::{ClientError, HttpConfig};
pub use provider::model_call::{ModelRequest, ModelResponse, ProviderError, ToolChoice};
pub use provider::model_table::{ModelInfo, ModelOverride, ModelTable, ModelTableError, Pricing};
pub use provider::openai::{OpenAiConfig, OpenAiProvider};
pub use provider::port::Provider;
pub use provider::scripted::{ScriptError, ScriptedProvider};
pub use provider::stream::{Delta, DeltaObserver, IgnoreDeltas, ModelStream, StreamChunk};
pub use provider::text_tools::ToolProtocol;
pub use provider::tokens::{TokenCounter, counter_for_model};
pub use run::state::{AgentContext, ExecutionResult};
pub use telemetry::TraceConfig;
