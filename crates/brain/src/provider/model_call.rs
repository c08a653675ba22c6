//! The vocabulary of one model call: what goes in, what comes back (whole, or at the end of
//! a stream) and how it fails. It sits below the provider port (`provider`), the stream
//! assembler (`stream`) and the HTTP plumbing (`http`, `request`), which all speak it, so
//! that none of them imports another in a circle.

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

/// The error kinds recorded in the log (`ModelCalled.outcome`, `Retry.error`). Kinds are
/// strings on the wire; these constants keep the spelling in one place.
pub mod kind {
    /// HTTP 429, or a scripted `rate_limited`. Transient; honours Retry-After.
    pub const RATE_LIMITED: &str = "rate_limited";
    /// HTTP 503/529, Anthropic's `overloaded_error`. Transient.
    pub const OVERLOADED: &str = "overloaded";
    /// Any other 5xx, HTTP 409, or an error event in the middle of a stream. Transient.
    pub const SERVER_ERROR: &str = "server_error";
    /// A 5xx whose body blames the request (a validation error, a chat template that
    /// failed on it): llama.cpp's Python server answers so, and gateways pass a backend's
    /// 400 on as a 500. Transient, but retried at most once.
    pub const SERVER_REJECTED: &str = "server_rejected";
    /// No answer in time (connect, request or idle timeout; HTTP 408). Transient.
    pub const TIMEOUT: &str = "timeout";
    /// The connection could not be made or was reset before an answer. Transient.
    pub const CONNECTION: &str = "connection";
    /// A stream that broke off, or ended without its done marker. Transient.
    pub const TRUNCATED_STREAM: &str = "truncated_stream";
    /// The prompt does not fit the model's window (`ProviderError::ContextOverflow`).
    pub const CONTEXT_OVERFLOW: &str = "context_overflow";
    /// HTTP 401/403: a missing, wrong or unauthorised key. Permanent.
    pub const AUTH: &str = "auth";
    /// Any other 4xx: the request is wrong and will stay wrong. Permanent.
    pub const BAD_REQUEST: &str = "bad_request";
    /// HTTP 404 or 501: usually an unknown model or a wrong base URL. Permanent.
    pub const NOT_FOUND: &str = "not_found";
    /// A 429 that says the account has no credit left (`insufficient_quota`). Permanent.
    pub const QUOTA: &str = "quota";
    /// The provider refused to answer (content filter, `refusal`). Permanent.
    pub const CONTENT_FILTER: &str = "content_filter";
    /// A 2xx answer that is not the API's format (wrong base URL, a proxy's page). Permanent.
    pub const INVALID_RESPONSE: &str = "invalid_response";
    /// The streamed answer ran away (the same text over and over) and was stopped. The
    /// call is asked again with a note about it (the engine's `Run::call_model`), at most
    /// twice, never the same request again: a model that samples greedily would repeat it.
    pub const RUNAWAY: &str = "runaway";
    /// The scripted provider has no line left for this kind of call. Permanent.
    pub const SCRIPT_EXHAUSTED: &str = "script_exhausted";
}

/// A failed model call, classified by what the caller should do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Rate limits, overload, 5xx, timeouts, dropped connections, truncated streams: retry
    /// with backoff, after `retry_after` when the provider said so. `kind` is one of
    /// [`kind::RATE_LIMITED`], [`kind::OVERLOADED`], [`kind::SERVER_ERROR`],
    /// [`kind::SERVER_REJECTED`], [`kind::TIMEOUT`], [`kind::CONNECTION`],
    /// [`kind::TRUNCATED_STREAM`]. How often each is retried is the
    /// [`RetryPolicy`](crate::provider::retry::RetryPolicy)'s call.
    #[error("{kind}: {message}")]
    Transient {
        kind: &'static str,
        message: String,
        retry_after: Option<Duration>,
    },
    /// The prompt does not fit the model's window: compact, then retry once.
    #[error("context_overflow: {0}")]
    ContextOverflow(String),
    /// Authentication, a bad request, a refusal, an exhausted script: retrying cannot help.
    /// `kind` is one of the permanent constants in [`kind`].
    #[error("{kind}: {message}")]
    Permanent { kind: &'static str, message: String },
}

impl ProviderError {
    /// The error kind as recorded in the log (`rate_limited`, `auth`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Transient { kind, .. } | Self::Permanent { kind, .. } => kind,
            Self::ContextOverflow(_) => kind::CONTEXT_OVERFLOW,
        }
    }

    /// Whether retrying the same request can succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. })
    }

    pub(crate) fn transient(kind: &'static str, message: impl Into<String>) -> Self {
        Self::Transient {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    pub(crate) fn permanent(kind: &'static str, message: impl Into<String>) -> Self {
        Self::Permanent {
            kind,
            message: message.into(),
        }
    }
}
