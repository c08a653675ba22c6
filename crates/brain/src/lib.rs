//! Nerve's brain: model providers, the execution loops that drive an agent from task to a
//! well-defined end, and the guardrails around them. It reaches the event log and the
//! sandbox only through the ports of `nerve-core`, so every loop runs in-process against
//! fakes in tests and against SQLite and Docker in production.

mod answer;
pub mod anthropic;
pub mod approval;
pub mod archive;
pub mod auto;
mod builtin;
mod call_repair;
mod caller;
pub mod compaction;
mod compactor;
pub mod config;
pub mod context;
pub mod delegate;
pub mod engine;
pub mod epistemic;
mod hooks;
pub mod http;
pub mod instructions;
mod journal;
mod json_text;
pub mod models;
pub mod openai;
mod plan;
pub mod prompt;
pub mod provider;
mod react;
mod relevance;
mod request;
pub mod retry;
mod runaway;
mod runner;
pub mod scripted;
pub mod skills;
pub mod sse;
pub mod stagnation;
mod stop;
pub mod stream;
pub mod telemetry;
pub mod text_tools;
pub mod tokens;
mod turn;
mod window;
mod workspace;

#[cfg(test)]
mod compaction_tests;
#[cfg(test)]
mod engine_fuzz;
#[cfg(test)]
mod loop_tests;
#[cfg(test)]
mod prefix_tests;
#[cfg(test)]
mod testing;

pub use anthropic::{AnthropicConfig, AnthropicProvider};
pub use config::{EngineConfig, Pricing};
pub use context::{AgentContext, ExecutionResult};
pub use engine::{
    AgentEngine, ChildLimits, ChildLog, ChildResume, ChildState, EngineError, FollowUp,
    ResumeState, Task,
};
pub use http::{ClientError, HttpConfig};
pub use models::{ModelInfo, ModelOverride, ModelTable, ModelTableError};
pub use openai::{OpenAiConfig, OpenAiProvider};
pub use provider::{
    FinishReason, ModelRequest, ModelResponse, Provider, ProviderError, ToolChoice, ToolProtocol,
};
pub use scripted::{ScriptError, ScriptedProvider};
pub use stream::{Delta, DeltaObserver, IgnoreDeltas, ModelStream, StreamChunk};
pub use telemetry::TraceConfig;
pub use tokens::{TokenCounter, counter_for_model};
