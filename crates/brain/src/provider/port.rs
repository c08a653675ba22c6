//! The provider port: one model call in, one assistant message out (whole, or streamed as
//! deltas that end in exactly one terminal chunk), with typed errors that say whether
//! retrying can help.

use async_trait::async_trait;

use crate::provider::model_call::{ModelRequest, ModelResponse, ProviderError};
use crate::provider::stream::ModelStream;
use crate::provider::text_tools::ToolProtocol;

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

    /// How the server counts a prompt against the engine's estimate, in thousandths, by
    /// what it last said (a usage report, or a refusal stating its count): 1000 when it
    /// counts the same or has said nothing, never less. The compactor's thresholds and
    /// targets take a prompt's size by this count, so that a model whose tokenizer splits
    /// finer than the estimate is compacted before its server refuses.
    fn prompt_scale_permille(&self) -> u64 {
        1000
    }

    /// How tool calls travel to and from this provider's model: natively (the default),
    /// as text, or natively until the model writes its calls as text (`auto`).
    fn tool_protocol(&self) -> ToolProtocol {
        ToolProtocol::Native
    }

    /// The provider a child execution named `name` (a `delegate` call's) asks: `None`, the
    /// default, when it asks this one. The scripted provider gives a view of its cassette
    /// that reads the lines with `"agent": name`.
    fn for_agent(&self, name: &str) -> Option<std::sync::Arc<dyn Provider>> {
        let _ = name;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::stream::{Delta, StreamChunk};
    use nerve_core::event::{CallPurpose, ModelErrorKind};
    use nerve_core::{
        FinishReason, Message, MessagePart, MessageRole, TokenUsage, ToolCall, ToolCallId,
    };

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

        let error = ProviderError::permanent(ModelErrorKind::Auth, "no key");
        let chunks = drain(Fixed(Err(error.clone())).stream(request).await).await;
        assert_eq!(chunks, vec![StreamChunk::End(Err(error))]);
    }

    #[test]
    fn kinds_and_transience() {
        assert_eq!(
            ProviderError::ContextOverflow {
                message: "x".into(),
                stated_tokens: None
            }
            .kind(),
            ModelErrorKind::ContextOverflow
        );
        assert!(ProviderError::transient(ModelErrorKind::Timeout, "slow").is_transient());
        assert!(!ProviderError::permanent(ModelErrorKind::Auth, "no").is_transient());
    }
}
