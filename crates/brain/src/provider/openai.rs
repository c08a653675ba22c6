//! A client of the OpenAI Chat Completions API and of the servers that speak it (vLLM,
//! llama.cpp's `llama-server`, Ollama, LM Studio, OpenRouter, ...).
//!
//! The request side is conservative: the plain string form of `content` (`""`, never
//! `null`, beside tool calls: llama.cpp's server refuses `null`), optional fields only when
//! configured, `tools` only when there are some, tool calls sent back exactly as the server
//! wrote them, and an output limit that fits the window. The response side is lenient
//! where those servers differ from OpenAI: missing tool-call ids are generated, tool-call
//! deltas without an `index` are placed by their id, missing usage is estimated with the
//! token counter, `finish_reason: "stop"` on an answer with tool calls means tool calls,
//! unknown finish reasons are a warning, the legacy `function_call` is ignored beside
//! `tool_calls` (llama.cpp's server sends both), and reasoning comes in as `reasoning_content`
//! (DeepSeek, vLLM) or `reasoning` (Ollama, OpenRouter). Text that merely looks like a tool
//! call (a JSON object, `<tool_call>` tags) stays text: only the structured `tool_calls`
//! field asks for a tool.

use nerve_core::event::ModelErrorKind;
use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;

use async_trait::async_trait;
use nerve_core::{Message, MessagePart, MessageRole, TokenUsage, ToolDefinition};
use reqwest::header::HeaderMap;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::provider::endpoint::{Endpoint, RawArguments, output_limit, safe_call_id};
use crate::provider::http::{self, ClientError, HttpConfig};
use crate::provider::json_text::{Arguments, Content, Text, text};
use crate::provider::model_call::{ModelRequest, ModelResponse, ProviderError, ToolChoice};
use crate::provider::port::Provider;
use crate::provider::sse::SseEvent;
use crate::provider::stream::{
    Assembler, Delta, Flow, ModelStream, StreamDecoder, reconcile_finish,
};
use crate::provider::text_tools::ToolProtocol;
use crate::provider::tokens::UsageEstimate;
use nerve_core::FinishReason;

/// OpenAI's own endpoint, used when no base URL is configured.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// How to reach an OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Up to and including the version segment: `https://api.openai.com/v1`,
    /// `http://localhost:8000/v1` (vLLM), `http://localhost:11434/v1` (Ollama).
    pub base_url: String,
    /// Sent as a bearer token; local servers usually need none.
    pub api_key: Option<SecretString>,
    pub model: String,
    /// The output limit (the model's); `None` leaves it to the server unless the window
    /// is known. Sent as `max_completion_tokens` to OpenAI itself (its reasoning models
    /// refuse `max_tokens`) and as `max_tokens` elsewhere (what local servers understand),
    /// lowered to what the window leaves after the prompt.
    pub max_output_tokens: Option<u64>,
    /// The model's context window in tokens, when known: the output limit never asks for
    /// more than it leaves after the prompt.
    pub context_window: Option<u64>,
    pub temperature: Option<f64>,
    pub tool_choice: ToolChoice,
    /// `parallel_tool_calls`; `None` leaves the server's default (parallel on OpenAI).
    pub parallel_tool_calls: Option<bool>,
    /// Ask for usage in streams (`stream_options.include_usage`). Turn off for a server
    /// that rejects the option; usage is then estimated.
    pub stream_usage: bool,
    /// Stream answers (`stream: true`), so they are seen as the model writes them. Off,
    /// every call asks for the whole answer (`[providers.openai] stream = false`).
    pub stream: bool,
    /// How tool calls travel (`[providers.openai] tool_protocol`): `auto` by default, so a
    /// local model that writes its calls as text works (docs/providers.md).
    pub tool_protocol: ToolProtocol,
    pub http: HttpConfig,
}

impl OpenAiConfig {
    /// OpenAI's endpoint, no key, everything else at its default.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            model: model.into(),
            max_output_tokens: None,
            context_window: None,
            temperature: None,
            tool_choice: ToolChoice::Auto,
            parallel_tool_calls: None,
            stream_usage: true,
            stream: true,
            tool_protocol: ToolProtocol::Auto,
            http: HttpConfig::default(),
        }
    }
}

/// The Chat Completions client.
#[derive(Debug)]
pub struct OpenAiProvider {
    config: OpenAiConfig,
    endpoint: Endpoint,
    official: bool,
}

impl OpenAiProvider {
    pub fn new(config: OpenAiConfig) -> Result<Self, ClientError> {
        let base = http::base_url(&config.base_url)?;
        let mut headers = HeaderMap::new();
        if let Some(key) = &config.api_key {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                http::secret_header(&format!("Bearer {}", key.expose_secret()))?,
            );
        }
        Ok(Self {
            endpoint: Endpoint::new(
                "openai",
                &config.http,
                &base,
                "/chat/completions",
                headers,
                &config.model,
            )?,
            official: base.starts_with("https://api.openai.com"),
            config,
        })
    }

    /// The JSON body of a request, exactly as sent.
    pub fn request_body(&self, request: &ModelRequest<'_>, stream: bool) -> serde_json::Value {
        let estimate = self.endpoint.estimate(request);
        serde_json::to_value(self.wire_request(request, &estimate, stream)).unwrap_or_default()
    }

    fn wire_request<'a>(
        &'a self,
        request: &ModelRequest<'a>,
        estimate: &UsageEstimate,
        stream: bool,
    ) -> ChatRequest<'a> {
        let has_tools = !request.tools.is_empty();
        let limit = output_limit(
            self.config.max_output_tokens,
            self.config.context_window,
            estimate.prompt(),
        );
        let (max_tokens, max_completion_tokens) = match limit {
            Some(limit) if self.official => (None, Some(limit)),
            Some(limit) => (Some(limit), None),
            None => (None, None),
        };
        ChatRequest {
            model: &self.config.model,
            messages: wire_messages(request.messages, &self.endpoint.raw, self.official),
            tools: request.tools.iter().map(WireTool::from).collect(),
            tool_choice: has_tools.then(|| tool_choice(&self.config.tool_choice)),
            parallel_tool_calls: self.config.parallel_tool_calls.filter(|_| has_tools),
            max_tokens,
            max_completion_tokens,
            temperature: self.config.temperature,
            stream,
            stream_options: (stream && self.config.stream_usage).then_some(StreamOptions {
                include_usage: true,
            }),
        }
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        "openai"
    }

    fn model(&self) -> &str {
        &self.config.model
    }

    fn prompt_scale_permille(&self) -> u64 {
        self.endpoint.prompt_scale_permille()
    }

    fn tool_protocol(&self) -> ToolProtocol {
        self.config.tool_protocol
    }

    async fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ProviderError> {
        let estimate = self.endpoint.estimate(&request);
        let body = self.wire_request(&request, &estimate, false);
        self.endpoint
            .complete(&body, &estimate, decode_response)
            .await
    }

    async fn stream(&self, request: ModelRequest<'_>) -> ModelStream {
        if !self.config.stream || !self.endpoint.streams() {
            return ModelStream::from_result(self.complete(request).await);
        }
        let estimate = self.endpoint.estimate(&request);
        let body = self.wire_request(&request, &estimate, true);
        let decoder =
            ChatStreamDecoder::new(estimate.clone()).remembering(Arc::clone(&self.endpoint.raw));
        self.endpoint
            .stream(&body, estimate, decode_response, decoder)
            .await
    }
}

fn tool_choice(choice: &ToolChoice) -> serde_json::Value {
    match choice {
        ToolChoice::Auto => "auto".into(),
        ToolChoice::Required => "required".into(),
        ToolChoice::None => "none".into(),
        ToolChoice::Tool(name) => {
            serde_json::json!({"type": "function", "function": {"name": name}})
        }
    }
}

#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct WireTool<'a> {
    r#type: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a serde_json::Value,
}

impl<'a> From<&'a ToolDefinition> for WireTool<'a> {
    fn from(tool: &'a ToolDefinition) -> Self {
        Self {
            r#type: "function",
            function: WireFunction {
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
            },
        }
    }
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    /// Always a string: `""` on an assistant message made of tool calls alone, which
    /// every server takes (llama.cpp's refuses `null`; LiteLLM drops it, and then the
    /// model's chat template may fail on the missing field).
    content: Cow<'a, str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCall<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
struct WireCall<'a> {
    id: Cow<'a, str>,
    r#type: &'static str,
    function: WireCallFunction<'a>,
}

#[derive(Serialize)]
struct WireCallFunction<'a> {
    name: &'a str,
    arguments: String,
}

/// Our messages in Chat Completions form. Each tool result becomes its own `tool`
/// message; thinking is not sent (Chat Completions has no field for it, and some servers
/// refuse `reasoning_content` in requests). Tool calls go back with the arguments the
/// server wrote (`raw`); their ids as they came, except that OpenAI's own API gets ids it
/// accepts (`strict_ids`).
fn wire_messages<'a>(
    messages: &'a [Message],
    raw: &RawArguments,
    strict_ids: bool,
) -> Vec<WireMessage<'a>> {
    let id = |id: &'a str| {
        if strict_ids {
            safe_call_id(id)
        } else {
            Cow::Borrowed(id)
        }
    };
    let mut out = Vec::with_capacity(messages.len());
    for message in messages {
        let mut texts: Vec<&str> = Vec::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for part in &message.parts {
            match part {
                MessagePart::Text { text } | MessagePart::CompactionSummary { text, .. } => {
                    texts.push(text)
                }
                MessagePart::ToolCall(call) => calls.push(WireCall {
                    id: id(&call.id.0),
                    r#type: "function",
                    function: WireCallFunction {
                        name: &call.name,
                        arguments: raw.text(&call.id.0, &call.name, &call.arguments),
                    },
                }),
                MessagePart::ToolResult(result) => results.push(WireMessage {
                    role: "tool",
                    content: Cow::Borrowed(&result.content),
                    tool_calls: Vec::new(),
                    tool_call_id: Some(id(&result.call_id.0)),
                }),
                MessagePart::Thinking { .. } => {}
            }
        }
        out.extend(results);
        let content = match texts.as_slice() {
            [] => None,
            [one] => Some(Cow::Borrowed(*one)),
            many => Some(Cow::Owned(many.join("\n"))),
        };
        let role = match message.role {
            MessageRole::System => "system",
            MessageRole::User | MessageRole::Tool => "user",
            MessageRole::Assistant => "assistant",
        };
        if role == "assistant" && (content.is_some() || !calls.is_empty()) {
            out.push(WireMessage {
                role,
                content: content.unwrap_or_default(),
                tool_calls: calls,
                tool_call_id: None,
            });
        } else if let Some(content) = content {
            out.push(WireMessage {
                role,
                content,
                tool_calls: Vec::new(),
                tool_call_id: None,
            });
        }
    }
    out
}

#[derive(Debug, Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Debug, Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

impl WireUsage {
    fn usage(&self) -> TokenUsage {
        let input = self.prompt_tokens.unwrap_or(0);
        let cached = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .unwrap_or(0);
        TokenUsage {
            cache_read_tokens: cached.min(input),
            ..TokenUsage::new(input, self.completion_tokens.unwrap_or(0))
        }
    }
}

#[derive(Debug, Deserialize)]
struct WireCallIn<'a> {
    #[serde(default)]
    index: Option<usize>,
    #[serde(default, borrow)]
    id: Option<Text<'a>>,
    #[serde(default, borrow)]
    function: Option<WireFunctionIn<'a>>,
}

#[derive(Debug, Deserialize)]
struct WireFunctionIn<'a> {
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
    /// A string by the spec; some servers send the object itself.
    #[serde(default, borrow)]
    arguments: Option<Arguments<'a>>,
}

impl WireFunctionIn<'_> {
    fn arguments(&self) -> Option<&str> {
        self.arguments.as_ref()?.0.as_deref()
    }
}

/// The content of a choice, whole (`message`) or in pieces (`delta`). Its strings are
/// borrowed from the response or event wherever they hold no escapes ([`json_text`]).
#[derive(Debug, Default, Deserialize)]
struct WireContent<'a> {
    #[serde(default, borrow)]
    content: Option<Content<'a>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Text<'a>>,
    #[serde(default, borrow)]
    reasoning: Option<Text<'a>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<WireCallIn<'a>>>,
    /// The deprecated single-call form.
    #[serde(default, borrow)]
    function_call: Option<WireFunctionIn<'a>>,
}

#[derive(Debug, Deserialize)]
struct WireChoice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, alias = "delta", borrow)]
    message: Option<WireContent<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Text<'a>>,
}

/// A whole response, or one chunk of a stream: the same shape, `message` or `delta`.
#[derive(Debug, Deserialize)]
struct WireResponse<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<WireChoice<'a>>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

impl WireResponse<'_> {
    /// The first choice: Nerve never asks for more than one.
    fn choice(&self) -> Option<&WireChoice<'_>> {
        self.choices
            .as_deref()?
            .iter()
            .find(|c| c.index.unwrap_or(0) == 0)
    }
}

/// Reads `finish_reason`. `content_filter` is an error, not a way of finishing.
fn finish_reason(reason: &str) -> Result<FinishReason, ProviderError> {
    match reason {
        "stop" | "end_turn" | "eos" | "stop_sequence" => Ok(FinishReason::Stop),
        "length" | "max_tokens" => Ok(FinishReason::MaxTokens),
        "tool_calls" | "function_call" | "tool_use" => Ok(FinishReason::ToolCalls),
        "content_filter" => Err(ProviderError::permanent(
            ModelErrorKind::ContentFilter,
            "the answer was withheld by the provider's content filter",
        )),
        other => {
            tracing::warn!(
                finish_reason = other,
                "unknown finish reason; treating it as stop"
            );
            Ok(FinishReason::Stop)
        }
    }
}

/// Feeds one choice's content into the assembler, whole or as a delta.
#[derive(Debug)]
struct ChoiceState {
    asm: Assembler,
    text: Option<usize>,
    thinking: Option<usize>,
    /// Wire index of each tool call → its block.
    tools: Vec<(usize, usize)>,
    last_tool: Option<usize>,
    /// A `tool_calls` entry has arrived: a legacy `function_call` beside it (llama.cpp's
    /// server sends both, the same call twice) is ignored from then on.
    saw_tool_calls: bool,
}

impl ChoiceState {
    fn new(emit: bool) -> Self {
        Self {
            asm: Assembler::new(emit),
            text: None,
            thinking: None,
            tools: Vec::new(),
            last_tool: None,
            saw_tool_calls: false,
        }
    }

    fn absorb(&mut self, content: &WireContent<'_>, deltas: &mut VecDeque<Delta>) {
        for reasoning in [&content.reasoning_content, &content.reasoning]
            .into_iter()
            .flatten()
        {
            if !reasoning.as_str().is_empty() {
                let block = *self
                    .thinking
                    .get_or_insert_with(|| self.asm.open_thinking());
                self.asm.push(block, reasoning.as_str(), deltas);
            }
        }
        if let Some(text) = content
            .content
            .as_ref()
            .and_then(|c| c.0.as_deref())
            .filter(|t| !t.is_empty())
        {
            let block = *self.text.get_or_insert_with(|| self.asm.open_text());
            self.asm.push(block, text, deltas);
        }
        for (position, call) in content.tool_calls.iter().flatten().enumerate() {
            self.saw_tool_calls = true;
            self.tool_call(
                call.index,
                text(call.id.as_ref()),
                call.function.as_ref(),
                position,
                deltas,
            );
        }
        if let Some(function) = &content.function_call
            && !self.saw_tool_calls
        {
            self.tool_call(Some(0), None, Some(function), 0, deltas);
        }
    }

    /// One tool call or tool-call delta. In a whole message, a call without an `index` is
    /// placed by its position. In a stream, a delta without an `index` continues the call
    /// with its id, or the last call when it has no id and comes first in its chunk;
    /// anything else starts a new call.
    fn tool_call(
        &mut self,
        index: Option<usize>,
        id: Option<&str>,
        function: Option<&WireFunctionIn<'_>>,
        position: usize,
        deltas: &mut VecDeque<Delta>,
    ) {
        let fresh = self
            .tools
            .iter()
            .map(|(wire, _)| wire + 1)
            .max()
            .unwrap_or(0);
        let known = id.and_then(|id| {
            self.tools
                .iter()
                .find(|(_, block)| self.asm.tool_id(*block) == Some(id))
        });
        let wire_index = match (index, known, self.last_tool) {
            (Some(index), _, _) => index,
            (None, _, _) if !self.asm.emits() => position,
            (None, Some((wire, _)), _) => *wire,
            (None, None, Some(last)) if id.is_none() && position == 0 => last,
            (None, None, _) => fresh,
        };
        let name = function
            .and_then(|f| text(f.name.as_ref()))
            .unwrap_or_default();
        let block = match self.tools.iter().find(|(wire, _)| *wire == wire_index) {
            Some((_, block)) => {
                let block = *block;
                if !name.is_empty() {
                    self.asm.name_tool(block, name);
                }
                block
            }
            None => {
                let block = self.asm.open_tool(id, name, deltas);
                self.tools.push((wire_index, block));
                block
            }
        };
        self.last_tool = Some(wire_index);
        if let Some(arguments) = function.and_then(WireFunctionIn::arguments) {
            self.asm.push(block, arguments, deltas);
        }
    }
}

/// Decodes a whole (non-streamed) response body.
pub(crate) fn decode_response(
    body: &[u8],
    estimate: &UsageEstimate,
    raw: Option<&RawArguments>,
) -> Result<ModelResponse, ProviderError> {
    let response: WireResponse = serde_json::from_slice(body).map_err(|e| {
        ProviderError::permanent(
            ModelErrorKind::InvalidResponse,
            format!("not a Chat Completions response: {e}"),
        )
    })?;
    if let Some(error) = &response.error {
        return Err(http::error_from_event(
            "openai",
            &serde_json::json!({ "error": error }),
        ));
    }
    let mut state = ChoiceState::new(false);
    let mut deltas = VecDeque::new();
    let reported = match response.choice() {
        Some(choice) => {
            if let Some(content) = &choice.message {
                state.absorb(content, &mut deltas);
            }
            choice
                .finish_reason
                .as_ref()
                .map(|reason| finish_reason(reason.as_str()))
                .transpose()?
        }
        None => {
            tracing::warn!("the response has no choices; treating it as an empty answer");
            None
        }
    };
    let has_calls = state.asm.has_tool_calls();
    state.asm.remember_raw(raw);
    let message = state.asm.message();
    let finish = reconcile_finish(reported.unwrap_or(FinishReason::Stop), has_calls);
    let usage = estimate.resolve(response.usage.as_ref().map(WireUsage::usage), &message);
    Ok(ModelResponse {
        message,
        usage,
        finish,
    })
}

/// Decodes a Chat Completions stream (`data: {chunk}` events, then `data: [DONE]`).
#[derive(Debug)]
pub struct ChatStreamDecoder {
    state: ChoiceState,
    finish: Option<FinishReason>,
    usage: Option<TokenUsage>,
    estimate: UsageEstimate,
    raw: Option<Arc<RawArguments>>,
}

impl ChatStreamDecoder {
    pub fn new(estimate: UsageEstimate) -> Self {
        Self {
            state: ChoiceState::new(true),
            finish: None,
            usage: None,
            estimate,
            raw: None,
        }
    }

    /// Keeps the raw arguments of the answer's tool calls in `raw`.
    pub(crate) fn remembering(mut self, raw: Arc<RawArguments>) -> Self {
        self.raw = Some(raw);
        self
    }
}

impl StreamDecoder for ChatStreamDecoder {
    fn event(
        &mut self,
        event: &SseEvent,
        deltas: &mut VecDeque<Delta>,
    ) -> Result<Flow, ProviderError> {
        let data = event.data.trim();
        if data == "[DONE]" {
            return Ok(Flow::Done);
        }
        let chunk: WireResponse = match serde_json::from_str(data) {
            Ok(chunk) => chunk,
            Err(error) => {
                tracing::warn!(%error, "skipping a stream event that is not a Chat Completions chunk");
                return Ok(Flow::Continue);
            }
        };
        if let Some(error) = &chunk.error {
            return Err(http::error_from_event(
                "openai",
                &serde_json::json!({ "error": error }),
            ));
        }
        if let Some(usage) = &chunk.usage {
            self.usage = Some(usage.usage());
        }
        if let Some(choice) = chunk.choice() {
            if let Some(content) = &choice.message {
                self.state.absorb(content, deltas);
            }
            if let Some(reason) = &choice.finish_reason {
                self.finish = Some(finish_reason(reason.as_str())?);
            }
        }
        Ok(Flow::Continue)
    }

    fn finish(&mut self, done: bool) -> Result<ModelResponse, ProviderError> {
        if !done && self.finish.is_none() {
            return Err(ProviderError::transient(
                ModelErrorKind::TruncatedStream,
                "the stream ended before the model finished (no finish_reason, no [DONE])",
            ));
        }
        let has_calls = self.state.asm.has_tool_calls();
        self.state.asm.remember_raw(self.raw.as_deref());
        let message = self.state.asm.message();
        let finish = reconcile_finish(self.finish.unwrap_or(FinishReason::Stop), has_calls);
        let usage = self.estimate.resolve(self.usage, &message);
        Ok(ModelResponse {
            message,
            usage,
            finish,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::stream::{MemorySource, StreamChunk};
    use crate::provider::tokens::Estimate;
    use bytes::Bytes;
    use nerve_core::event::CallPurpose;
    use nerve_core::{ToolCall, ToolCallId, ToolResult};

    fn estimate() -> UsageEstimate {
        UsageEstimate {
            input: 100,
            counter: Arc::new(Estimate),
            calibration: None,
        }
    }

    fn decode(body: serde_json::Value) -> Result<ModelResponse, ProviderError> {
        decode_response(body.to_string().as_bytes(), &estimate(), None)
    }

    fn call(id: &str, name: &str, arguments: serde_json::Value) -> MessagePart {
        MessagePart::ToolCall(ToolCall {
            id: ToolCallId(id.into()),
            name: name.into(),
            arguments,
        })
    }

    #[test]
    fn whole_responses_decode_leniently() {
        let plain = decode(serde_json::json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi", "reasoning_content": "think"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}
        }))
        .unwrap();
        assert_eq!(
            plain.message.parts,
            vec![
                MessagePart::Thinking {
                    text: "think".into(),
                    signature: None
                },
                MessagePart::Text { text: "hi".into() }
            ]
        );
        assert_eq!(
            plain.usage,
            TokenUsage {
                cache_read_tokens: 4,
                ..TokenUsage::new(10, 2)
            }
        );
        assert_eq!(plain.finish, FinishReason::Stop);

        // Ollama-style: no ids, object arguments, "stop" with tool calls, no usage.
        let local = decode(serde_json::json!({
            "choices": [{"message": {"content": "", "tool_calls": [
                {"function": {"name": "shell", "arguments": {"command": "ls"}}},
                {"function": {"name": "read_file", "arguments": "{\"path\": \"a\"}"}}
            ]}, "finish_reason": "stop"}]
        }))
        .unwrap();
        assert_eq!(local.finish, FinishReason::ToolCalls);
        let calls: Vec<_> = local.message.tool_calls().collect();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, serde_json::json!({"command": "ls"}));
        assert_eq!(calls[1].arguments, serde_json::json!({"path": "a"}));
        assert_ne!(calls[0].id, calls[1].id);
        assert_eq!(local.usage.input_tokens, 100);
        assert!(local.usage.output_tokens > 0);

        // Bad input never fails the call.
        let bad = decode(serde_json::json!({
            "choices": [{"message": {"content": "{\"name\": \"shell\", \"arguments\": {}}", "tool_calls": [
                {"id": "c1", "function": {"name": "shell", "arguments": "{\"command\": \"ls"}}
            ]}, "finish_reason": "something_new"}]
        }))
        .unwrap();
        assert_eq!(bad.finish, FinishReason::ToolCalls);
        assert_eq!(
            bad.message.parts,
            vec![
                MessagePart::Text {
                    text: "{\"name\": \"shell\", \"arguments\": {}}".into()
                },
                call("c1", "shell", serde_json::json!("{\"command\": \"ls")),
            ]
        );
        let empty = decode(serde_json::json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 0}})).unwrap();
        assert!(empty.message.parts.is_empty());
        assert_eq!(empty.finish, FinishReason::Stop);
        assert_eq!(decode(serde_json::json!({"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]})).unwrap().finish, FinishReason::MaxTokens);
        assert_eq!(decode(serde_json::json!({"choices": [{"message": {"content": "x"}, "finish_reason": "content_filter"}]})).unwrap_err().kind(), ModelErrorKind::ContentFilter);
        assert_eq!(
            decode(serde_json::json!({"error": {"message": "boom", "type": "server_error"}}))
                .unwrap_err()
                .kind(),
            ModelErrorKind::ServerError
        );
        assert_eq!(
            decode_response(b"<html>", &estimate(), None)
                .unwrap_err()
                .kind(),
            ModelErrorKind::InvalidResponse
        );
    }

    async fn stream(
        events: &[serde_json::Value],
        done: bool,
    ) -> (Vec<Delta>, Result<ModelResponse, ProviderError>) {
        let mut text: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        if done {
            text.push_str("data: [DONE]\n\n");
        }
        let mut stream = ModelStream::new(
            MemorySource([Bytes::from(text)].into()),
            ChatStreamDecoder::new(estimate()),
        );
        let mut deltas = Vec::new();
        loop {
            match stream.next().await {
                Some(StreamChunk::Delta(delta)) => deltas.push(delta),
                Some(StreamChunk::End(result)) => return (deltas, result),
                None => panic!("no terminal chunk"),
            }
        }
    }

    fn delta(delta: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
    }

    #[tokio::test]
    async fn tool_calls_without_index_are_placed_by_id() {
        let (_, end) = stream(
            &[
                delta(serde_json::json!({"tool_calls": [{"id": "a", "function": {"name": "shell", "arguments": "{\"command\":"}}]})),
                delta(serde_json::json!({"tool_calls": [{"function": {"arguments": "\"ls\"}"}}]})),
                delta(serde_json::json!({"tool_calls": [{"id": "b", "function": {"name": "list_dir", "arguments": "{}"}}]})),
                serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ],
            true,
        )
        .await;
        let end = end.unwrap();
        assert_eq!(
            end.message.parts,
            vec![
                call("a", "shell", serde_json::json!({"command": "ls"})),
                call("b", "list_dir", serde_json::json!({}))
            ]
        );
    }

    #[tokio::test]
    async fn streams_end_cleanly_or_say_why_not() {
        let text = delta(serde_json::json!({"content": "hi"}));
        let stop =
            serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        // A finish reason without [DONE] is accepted (some servers omit it).
        assert!(stream(&[text.clone(), stop], false).await.1.is_ok());
        // Neither: truncated.
        assert_eq!(
            stream(std::slice::from_ref(&text), false)
                .await
                .1
                .unwrap_err()
                .kind(),
            ModelErrorKind::TruncatedStream
        );
        // [DONE] without a finish reason: lenient stop.
        assert_eq!(
            stream(std::slice::from_ref(&text), true)
                .await
                .1
                .unwrap()
                .finish,
            FinishReason::Stop
        );
        // An error event mid-stream.
        let error =
            serde_json::json!({"error": {"message": "overloaded", "type": "overloaded_error"}});
        let (deltas, end) = stream(&[text.clone(), error], true).await;
        assert_eq!(deltas, vec![Delta::Text("hi".into())]);
        assert_eq!(end.unwrap_err().kind(), ModelErrorKind::Overloaded);
        // Garbage events and empty choices are skipped.
        let (_, end) = stream(
            &[
                serde_json::json!("nonsense"),
                serde_json::json!({"choices": []}),
                text,
            ],
            true,
        )
        .await;
        assert_eq!(end.unwrap().message.text_content(), "hi");
    }

    #[test]
    fn messages_take_the_chat_completions_shape() {
        let messages = vec![
            Message::system("sys"),
            Message::user("task"),
            Message {
                role: MessageRole::Assistant,
                parts: vec![
                    MessagePart::Thinking {
                        text: "private".into(),
                        signature: Some("s".into()),
                    },
                    call("c1", "shell", serde_json::json!({"command": "ls"})),
                    call("c2", "shell", serde_json::json!("{not json")),
                ],
                pinned: false,
            },
            Message::tool_result(ToolResult {
                call_id: ToolCallId("c1".into()),
                name: "shell".into(),
                content: "a\nb".into(),
                is_error: false,
            }),
            Message::tool_result(ToolResult {
                call_id: ToolCallId("c2".into()),
                name: "shell".into(),
                content: "bad args".into(),
                is_error: true,
            }),
            Message {
                role: MessageRole::Assistant,
                parts: vec![],
                pinned: false,
            },
        ];
        let value = serde_json::to_value(wire_messages(&messages, &RawArguments::default(), false))
            .unwrap();
        assert_eq!(
            value,
            serde_json::json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "task"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":\"ls\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "shell", "arguments": "{not json"}}
                ]},
                {"role": "tool", "content": "a\nb", "tool_call_id": "c1"},
                {"role": "tool", "content": "bad args", "tool_call_id": "c2"}
            ])
        );
    }

    #[test]
    fn optional_fields_are_sent_only_when_they_apply() {
        let mut config = OpenAiConfig::new("llama3");
        config.base_url = "http://127.0.0.1:1/v1".into();
        config.max_output_tokens = Some(100);
        config.parallel_tool_calls = Some(true);
        let provider = OpenAiProvider::new(config).unwrap();
        let messages = [Message::user("hi")];
        let request = ModelRequest {
            messages: &messages,
            tools: &[],
            purpose: CallPurpose::Agent,
        };
        let body = provider.request_body(&request, false);
        assert_eq!(
            body,
            serde_json::json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "stream": false})
        );
        let mut official = OpenAiConfig::new("o3");
        official.max_output_tokens = Some(100);
        official.stream_usage = false;
        let body = OpenAiProvider::new(official)
            .unwrap()
            .request_body(&request, true);
        assert_eq!(body["max_completion_tokens"], 100);
        assert!(body.get("stream_options").is_none());
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        let mut config = OpenAiConfig::new("gpt-4o");
        config.api_key = Some(SecretString::from("sk-very-secret-value"));
        let provider = OpenAiProvider::new(config).unwrap();
        let shown = format!("{provider:?}");
        assert!(!shown.contains("sk-very-secret-value"), "{shown}");
    }
}
