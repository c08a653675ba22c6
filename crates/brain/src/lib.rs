//! Nerve's brain: model providers, the execution loops that drive an agent from task to a
//! well-defined end, and the guardrails around them. It reaches the event log and the
//! sandbox only through the ports of `nerve-core`, so every loop runs in-process against
//! fakes in tests and against SQLite and Docker in production.

pub mod context;
pub mod engine;
pub mod provider;
mod react;
pub mod retry;
pub mod scripted;
pub mod tokens;

pub use context::{AgentContext, ExecutionResult};
pub use engine::{AgentEngine, EngineConfig, EngineError, Pricing, Task};
pub use provider::{FinishReason, ModelRequest, ModelResponse, Provider, ProviderError};
pub use scripted::{ScriptError, ScriptedProvider};
