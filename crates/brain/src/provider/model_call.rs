//! The vocabulary of one model call: what goes in, what comes back (whole, or at the end of
//! a stream) and how it fails. It sits below the provider port (`provider`), the stream
//! assembler (`stream`) and the HTTP plumbing (`http`, `request`), which all speak it, so
//! that none of them imports another in a circle.

use nerve_core::event::ModelErrorKind;
use std::time::Duration;

use nerve_core::event::CallPurpose;
use nerve_core::{FinishReason, Message, TokenUsage, ToolDefinition};

/// One model call.
#[derive(Debug, Clone, Copy)]
pub struct ModelRequest<'a> {
    pub messages: &'a [Message],
    pub tools: &'a [ToolDefinition],
    pub purpose: CallPurpose,
}

/// Which tools the model may or must call. Sent only when the request has tools.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must not call tools.
    None,
    /// The model must call this tool.
    Tool(String),
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
    /// Rate limits, overload, 5xx, timeouts, dropped connections, truncated streams: retry
    /// with backoff, after `retry_after` when the provider said so. `kind` is one of
    /// `RateLimited`, `Overloaded`, `ServerError`, `ServerRejected`, `Timeout`, `Connection`,
    /// `TruncatedStream` and `Runaway` ([`ModelErrorKind`]). How often each is retried is the
    /// [`RetryPolicy`](crate::provider::retry::RetryPolicy)'s call.
    #[error("{kind}: {message}")]
    Transient {
        kind: ModelErrorKind,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The prompt does not fit the model's window: compact, then retry. `stated_tokens`
    /// is the server's own count of the refused prompt when its refusal states one, read
    /// once where the refusal arrives (`http::context_overflow`).
    #[error("context_overflow: {message}")]
    ContextOverflow {
        message: String,
        stated_tokens: Option<u64>,
    },
    /// Authentication, a bad request, a refusal, an exhausted script: retrying cannot help.
    /// `kind` is one of the permanent kinds of [`ModelErrorKind`].
    #[error("{kind}: {message}")]
    Permanent {
        kind: ModelErrorKind,
        message: String,
    },
}

impl ProviderError {
    /// The error's kind, as the log records it (`rate_limited`, `auth`, ...).
    pub fn kind(&self) -> ModelErrorKind {
        match self {
            Self::Transient { kind, .. } | Self::Permanent { kind, .. } => *kind,
            Self::ContextOverflow { .. } => ModelErrorKind::ContextOverflow,
        }
    }

    /// Whether retrying the same request can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }

    pub(crate) fn transient(kind: ModelErrorKind, message: impl Into<String>) -> Self {
        Self::Transient {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn permanent(kind: ModelErrorKind, message: impl Into<String>) -> Self {
        Self::Permanent {
            kind,
            message: message.into(),
        }
    }
}
