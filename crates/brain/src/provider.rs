//! The provider port: one model call in, one assistant message out, with typed errors that
//! say whether retrying can help.

use std::time::Duration;

use async_trait::async_trait;
use nerve_core::event::CallPurpose;
use nerve_core::{Message, TokenUsage, ToolDefinition};

/// Why the model stopped producing output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    ToolCalls,
    /// The output hit the token limit; the loop asks the model to continue.
    MaxTokens,
}

impl FinishReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::ToolCalls => "tool_calls",
            Self::MaxTokens => "max_tokens",
        }
    }
}

/// One model call.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    pub messages: &'a [Message],
    pub tools: &'a [ToolDefinition],
    pub purpose: CallPurpose,
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    /// The assistant message: text, thinking and tool calls.
    pub message: Message,
    pub usage: TokenUsage,
    pub finish: FinishReason,
}

/// A failed model call, classified by what the caller should do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Rate limits, overload, 5xx, timeouts, dropped connections: retry with backoff,
    /// after `retry_after` when the provider said so.
    #[error("{kind}: {message}")]
    Transient { kind: &'static str, message: String, retry_after: Option<Duration> },
    /// The prompt does not fit the model's window: compact, then retry once.
    #[error("context_overflow: {0}")]
    ContextOverflow(String),
    /// Authentication, a bad request, an exhausted script: retrying cannot help.
    #[error("{kind}: {message}")]
    Permanent { kind: &'static str, message: String },
}

impl ProviderError {
    /// The error kind as recorded in the log (`rate_limited`, `auth`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Transient { kind, .. } | Self::Permanent { kind, .. } => kind,
            Self::ContextOverflow(_) => "context_overflow",
        }
    }
}

/// A model endpoint: the scripted provider, or an HTTP client of a real API.
#[async_trait]
pub trait Provider: Send + Sync {
    /// `script:demo.jsonl`, `openai`, ...: how the log names this provider.
    fn name(&self) -> &str;
    fn model(&self) -> &str;
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ProviderError>;
}
