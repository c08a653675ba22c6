//! The provider port: one model call in, one assistant message out (whole, or streamed as
//! deltas that end in exactly one terminal chunk), with typed errors that say whether
//! retrying can help.

use std::time::Duration;

use async_trait::async_trait;
use nerve_core::event::CallPurpose;
use nerve_core::{Message, TokenUsage, ToolDefinition};

use crate::stream::ModelStream;

/// Why the model stopped producing output; a core type, since turn records carry it.
pub use nerve_core::FinishReason;

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
    /// Any other 5xx, or an error event in the middle of a stream. Transient.
    pub const SERVER_ERROR: &str = "server_error";
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
    /// HTTP 404: usually an unknown model or a wrong base URL. Permanent.
    pub const NOT_FOUND: &str = "not_found";
    /// A 429 that says the account has no credit left (`insufficient_quota`). Permanent.
    pub const QUOTA: &str = "quota";
    /// The provider refused to answer (content filter, `refusal`). Permanent.
    pub const CONTENT_FILTER: &str = "content_filter";
    /// A 2xx answer that is not the API's format (wrong base URL, a proxy's page). Permanent.
    pub const INVALID_RESPONSE: &str = "invalid_response";
    /// The scripted provider has no line left for this kind of call. Permanent.
    pub const SCRIPT_EXHAUSTED: &str = "script_exhausted";
}

/// A failed model call, classified by what the caller should do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// Rate limits, overload, 5xx, timeouts, dropped connections, truncated streams: retry
    /// with backoff, after `retry_after` when the provider said so. `kind` is one of
    /// [`kind::RATE_LIMITED`], [`kind::OVERLOADED`], [`kind::SERVER_ERROR`],
    /// [`kind::TIMEOUT`], [`kind::CONNECTION`], [`kind::TRUNCATED_STREAM`].
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

/// A model endpoint: the scripted provider, or an HTTP client of a real API.
#[async_trait]
pub trait Provider: Send + Sync {
    /// `script:demo.jsonl`, `openai`, ...: how the log names this provider.
    fn name(&self) -> &str;
    fn model(&self) -> &str;

    /// The whole answer at once.
    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ProviderError>;

    /// The answer as it is produced: deltas, then exactly one terminal chunk carrying the
    /// assembled response or the error, also when the call fails before or during the
    /// stream. The default replays [`Provider::complete`] as deltas, which is what a
    /// provider without a streaming wire (the scripted one) does.
    async fn stream(&self, request: ModelRequest<'_>) -> ModelStream {
        ModelStream::from_result(self.complete(request).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{Delta, StreamChunk};
    use nerve_core::{MessagePart, MessageRole, ToolCall, ToolCallId};

    struct Fixed(Result<ModelResponse, ProviderError>);

    #[async_trait]
    impl Provider for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn model(&self) -> &str {
            "fixed"
        }
        async fn complete(&self, _: ModelRequest<'_>) -> Result<ModelResponse, ProviderError> {
            self.0.clone()
        }
    }

    async fn drain(mut stream: ModelStream) -> Vec<StreamChunk> {
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.next().await {
            chunks.push(chunk);
        }
        assert!(
            stream.next().await.is_none(),
            "a finished stream stays finished"
        );
        chunks
    }

    #[tokio::test]
    async fn the_default_stream_replays_complete_and_ends_once() {
        let message = Message {
            role: MessageRole::Assistant,
            parts: vec![
                MessagePart::Thinking {
                    text: "hmm".into(),
                    signature: None,
                },
                MessagePart::Text { text: "hi".into() },
                MessagePart::ToolCall(ToolCall {
                    id: ToolCallId("c1".into()),
                    name: "shell".into(),
                    arguments: serde_json::json!({"command": "ls"}),
                }),
            ],
            pinned: false,
        };
        let response = ModelResponse {
            message,
            usage: TokenUsage::new(3, 4),
            finish: FinishReason::ToolCalls,
        };
        let request = ModelRequest {
            messages: &[],
            tools: &[],
            purpose: CallPurpose::Agent,
        };
        let chunks = drain(Fixed(Ok(response.clone())).stream(request).await).await;
        assert_eq!(
            chunks,
            vec![
                StreamChunk::Delta(Delta::Thinking("hmm".into())),
                StreamChunk::Delta(Delta::Text("hi".into())),
                StreamChunk::Delta(Delta::ToolCallStart {
                    index: 0,
                    id: "c1".into(),
                    name: "shell".into()
                }),
                StreamChunk::Delta(Delta::ToolCallArguments {
                    index: 0,
                    fragment: r#"{"command":"ls"}"#.into()
                }),
                StreamChunk::End(Ok(response)),
            ]
        );

        let error = ProviderError::permanent(kind::AUTH, "no key");
        let chunks = drain(Fixed(Err(error.clone())).stream(request).await).await;
        assert_eq!(chunks, vec![StreamChunk::End(Err(error))]);
    }

    #[test]
    fn kinds_and_transience() {
        assert_eq!(
            ProviderError::ContextOverflow("x".into()).kind(),
            "context_overflow"
        );
        assert!(ProviderError::transient(kind::TIMEOUT, "slow").is_transient());
        assert!(!ProviderError::permanent(kind::AUTH, "no").is_transient());
    }
}
