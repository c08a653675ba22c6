//! A client of the Anthropic Messages API.
//!
//! Leading system messages become the separate `system` prompt; later ones (notes the
//! loops inject) are sent as user text, because the API has no system role in
//! `messages`. Tool results travel as `tool_result` blocks in user messages, consecutive
//! messages of one role are merged (the API wants alternating roles), and thinking blocks
//! go back verbatim with their signatures, which extended thinking requires when a tool
//! call continues a turn. Redacted thinking is kept as a thinking part whose signature is
//! [`REDACTED_THINKING`] and whose text is the opaque `data`, and is sent back as it came.
//!
//! With prompt caching on, up to four cache breakpoints are set: on the last tool, on the
//! system prompt, at the end of the stable prefix before the newest turn (where the
//! previous request's last breakpoint was, so each turn reads it from the cache whatever
//! it added), and on the last message. With caching off (a gateway in front of a model
//! that is not Claude) no block carries `cache_control` and `system` is a plain string,
//! which every gateway passes on.
//!
//! Tool-use ids are sent as this API accepts them (`[A-Za-z0-9_-]+`): an id from another
//! server that does not fit is replaced by a stable hash, the same in the call and its
//! result. `max_tokens` fits the window: at most the model's limit, and at most what the
//! window leaves after the prompt.

use nerve_core::event::ModelErrorKind;
use std::borrow::Cow;
use std::collections::VecDeque;

use async_trait::async_trait;
use nerve_core::{Message, MessagePart, MessageRole, TokenUsage, ToolDefinition};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::provider::endpoint::{Endpoint, RawArguments, output_limit, safe_call_id};
use crate::provider::http::{self, ClientError, HttpConfig};
use crate::provider::json_text::{Text, text};
use crate::provider::model_call::{ModelRequest, ModelResponse, ProviderError, ToolChoice};
use crate::provider::port::Provider;
use crate::provider::sse::SseEvent;
use crate::provider::stream::{
    Assembler, Delta, Flow, ModelStream, StreamDecoder, reconcile_finish,
};
use crate::provider::text_tools::ToolProtocol;
use crate::provider::tokens::UsageEstimate;
use nerve_core::FinishReason;

/// Anthropic's endpoint, used when no base URL is configured (without `/v1`, like the
/// official SDKs' `ANTHROPIC_BASE_URL`).
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// The `anthropic-version` header this client speaks.
pub const API_VERSION: &str = "2023-06-01";
/// The signature that marks a thinking part as Anthropic's redacted thinking.
pub const REDACTED_THINKING: &str = "anthropic:redacted_thinking";

/// How to reach the Messages API.
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    pub base_url: String,
    /// Sent as `x-api-key`. `None` only makes sense behind a proxy that adds it.
    pub api_key: Option<SecretString>,
    pub model: String,
    /// `max_tokens`, which this API requires: the model's output limit. Lowered to what
    /// the window leaves after the prompt when `context_window` is known.
    pub max_output_tokens: u64,
    /// The model's context window in tokens, when known.
    pub context_window: Option<u64>,
    pub temperature: Option<f64>,
    pub tool_choice: ToolChoice,
    /// Extended thinking with this token budget (must be below `max_output_tokens`).
    pub thinking_budget: Option<u64>,
    /// Set cache breakpoints (tools, system prompt, the stable prefix, the last message).
    /// Turn off for a gateway in front of a model that is not Claude: LiteLLM passes a
    /// `system` array with `cache_control` on as an array, which llama.cpp refuses.
    pub prompt_caching: bool,
    /// Stream answers, so they are seen as the model writes them. Off, every call asks
    /// for the whole answer (`[providers.anthropic] stream = false`).
    pub stream: bool,
    /// How tool calls travel (`[providers.anthropic] tool_protocol`): `auto` by default.
    pub tool_protocol: ToolProtocol,
    pub http: HttpConfig,
}

impl AnthropicConfig {
    /// Anthropic's endpoint, no key, 8,192 output tokens, caching on.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            base_url: DEFAULT_BASE_URL.to_owned(),
            api_key: None,
            model: model.into(),
            max_output_tokens: 8_192,
            context_window: None,
            temperature: None,
            tool_choice: ToolChoice::Auto,
            thinking_budget: None,
            prompt_caching: true,
            stream: true,
            tool_protocol: ToolProtocol::Auto,
            http: HttpConfig::default(),
        }
    }
}

/// The Messages client.
#[derive(Debug)]
pub struct AnthropicProvider {
    config: AnthropicConfig,
    endpoint: Endpoint,
}

impl AnthropicProvider {
    pub fn new(config: AnthropicConfig) -> Result<Self, ClientError> {
        let base = http::base_url(&config.base_url)?;
        if config.max_output_tokens == 0 {
            return Err(ClientError::Config(
                "max_output_tokens must be at least 1".into(),
            ));
        }
        if let Some(budget) = config.thinking_budget
            && budget >= config.max_output_tokens
        {
            return Err(ClientError::Config(format!(
                "the thinking budget ({budget}) must be below max_output_tokens ({})",
                config.max_output_tokens
            )));
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        );
        if let Some(key) = &config.api_key {
            headers.insert(
                HeaderName::from_static("x-api-key"),
                http::secret_header(key.expose_secret())?,
            );
        }
        Ok(Self {
            endpoint: Endpoint::new(
                "anthropic",
                &config.http,
                &base,
                "/v1/messages",
                headers,
                &config.model,
            )?,
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
    ) -> MessagesRequest<'a> {
        let (mut system, mut messages) = wire_messages(request.messages);
        let mut tools: Vec<WireTool<'_>> = request.tools.iter().map(WireTool::from).collect();
        if self.config.prompt_caching {
            if let Some(last) = tools.last_mut() {
                last.cache_control = EPHEMERAL;
            }
            if let Some(last) = system.last_mut() {
                last.mark_cached();
            }
            // The end of the prefix the previous request ended with: the turn before the
            // newest assistant message.
            if let Some(previous) = messages
                .iter()
                .rposition(|m| m.role == "assistant")
                .and_then(|i| i.checked_sub(1))
            {
                mark_last_cacheable(&mut messages[previous]);
            }
            if let Some(last) = messages.last_mut() {
                mark_last_cacheable(last);
            }
        }
        let system = if system.iter().any(Block::is_cached) {
            System::Blocks(system)
        } else {
            System::Text(
                system
                    .iter()
                    .filter_map(Block::text)
                    .collect::<Vec<_>>()
                    .join("\n\n"),
            )
        };
        let has_tools = !request.tools.is_empty();
        let max_tokens = output_limit(
            Some(self.config.max_output_tokens),
            self.config.context_window,
            estimate.prompt(),
        )
        .unwrap_or(self.config.max_output_tokens);
        // The thinking budget must stay below max_tokens, and at 1,024 or more.
        let thinking = self
            .config
            .thinking_budget
            .map(|budget| budget.min(max_tokens.saturating_sub(1)))
            .filter(|budget| *budget >= 1_024);
        MessagesRequest {
            model: &self.config.model,
            max_tokens,
            system,
            messages,
            tools,
            tool_choice: has_tools.then(|| tool_choice(&self.config.tool_choice)),
            thinking: thinking
                .map(|budget| serde_json::json!({"type": "enabled", "budget_tokens": budget})),
            temperature: self.config.temperature,
            stream,
        }
    }
}

fn mark_last_cacheable(message: &mut WireMessage<'_>) {
    if let Some(block) = message.content.iter_mut().rev().find(|b| b.cacheable()) {
        block.mark_cached();
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        "anthropic"
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
        let decoder = MessagesStreamDecoder::new(estimate.clone());
        self.endpoint
            .stream(&body, estimate, decode_response, decoder)
            .await
    }
}

fn tool_choice(choice: &ToolChoice) -> serde_json::Value {
    match choice {
        ToolChoice::Auto => serde_json::json!({"type": "auto"}),
        ToolChoice::Required => serde_json::json!({"type": "any"}),
        ToolChoice::None => serde_json::json!({"type": "none"}),
        ToolChoice::Tool(name) => serde_json::json!({"type": "tool", "name": name}),
    }
}

#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u64,
    #[serde(skip_serializing_if = "System::is_empty")]
    system: System<'a>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    stream: bool,
}

/// The system prompt: blocks when one carries a cache breakpoint, else a plain string.
#[derive(Serialize)]
#[serde(untagged)]
enum System<'a> {
    Text(String),
    Blocks(Vec<Block<'a>>),
}

impl System<'_> {
    fn is_empty(&self) -> bool {
        match self {
            Self::Text(text) => text.is_empty(),
            Self::Blocks(blocks) => blocks.is_empty(),
        }
    }
}

#[derive(Serialize)]
struct WireTool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a serde_json::Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_control: Option<CacheControl>,
}

impl<'a> From<&'a ToolDefinition> for WireTool<'a> {
    fn from(tool: &'a ToolDefinition) -> Self {
        Self {
            name: &tool.name,
            description: &tool.description,
            input_schema: &tool.parameters,
            cache_control: None,
        }
    }
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

#[derive(Serialize, Clone, Copy)]
struct CacheControl {
    r#type: &'static str,
}

const EPHEMERAL: Option<CacheControl> = Some(CacheControl {
    r#type: "ephemeral",
});

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: &'a str,
        input: Cow<'a, serde_json::Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
    ToolResult {
        tool_use_id: Cow<'a, str>,
        content: &'a str,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        cache_control: Option<CacheControl>,
    },
}

impl Block<'_> {
    /// Thinking blocks cannot carry a cache breakpoint.
    fn cacheable(&self) -> bool {
        match self {
            Self::Text { .. } | Self::ToolUse { .. } | Self::ToolResult { .. } => true,
            Self::Thinking { .. } | Self::RedactedThinking { .. } => false,
        }
    }

    fn mark_cached(&mut self) {
        match self {
            Self::Text { cache_control, .. }
            | Self::ToolUse { cache_control, .. }
            | Self::ToolResult { cache_control, .. } => *cache_control = EPHEMERAL,
            Self::Thinking { .. } | Self::RedactedThinking { .. } => {}
        }
    }

    fn is_tool_result(&self) -> bool {
        matches!(self, Self::ToolResult { .. })
    }

    fn is_cached(&self) -> bool {
        match self {
            Self::Text { cache_control, .. }
            | Self::ToolUse { cache_control, .. }
            | Self::ToolResult { cache_control, .. } => cache_control.is_some(),
            Self::Thinking { .. } | Self::RedactedThinking { .. } => false,
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            Self::Text { text, .. } => Some(text),
            Self::Thinking { .. }
            | Self::RedactedThinking { .. }
            | Self::ToolUse { .. }
            | Self::ToolResult { .. } => None,
        }
    }
}

/// The tool input as the API wants it: an object. Arguments that were not valid JSON
/// (kept as a string, see `stream::parse_arguments`) are wrapped so the model sees them.
fn tool_input(arguments: &serde_json::Value) -> Cow<'_, serde_json::Value> {
    if arguments.is_object() {
        Cow::Borrowed(arguments)
    } else {
        Cow::Owned(serde_json::json!({ "invalid_arguments": arguments }))
    }
}

/// Our messages as a system prompt and alternating Messages-API turns.
fn wire_messages(messages: &[Message]) -> (Vec<Block<'_>>, Vec<WireMessage<'_>>) {
    let mut system = Vec::new();
    let mut out: Vec<WireMessage<'_>> = Vec::new();
    let mut leading = true;
    for message in messages {
        if message.role == MessageRole::System && leading {
            for part in &message.parts {
                if let MessagePart::Text { text } | MessagePart::CompactionSummary { text, .. } =
                    part
                    && !text.is_empty()
                {
                    system.push(Block::Text {
                        text: Cow::Borrowed(text),
                        cache_control: None,
                    });
                }
            }
            continue;
        }
        leading = false;
        let assistant = message.role == MessageRole::Assistant;
        let mut blocks = Vec::with_capacity(message.parts.len());
        for part in &message.parts {
            match part {
                MessagePart::Text { text } | MessagePart::CompactionSummary { text, .. } => {
                    // The API refuses empty text blocks.
                    if !text.trim().is_empty() {
                        blocks.push(Block::Text {
                            text: Cow::Borrowed(text),
                            cache_control: None,
                        });
                    }
                }
                MessagePart::Thinking {
                    text,
                    signature: Some(signature),
                } if assistant => {
                    if signature == REDACTED_THINKING {
                        blocks.push(Block::RedactedThinking { data: text });
                    } else {
                        blocks.push(Block::Thinking {
                            thinking: text,
                            signature,
                        });
                    }
                }
                // Unsigned thinking came from another provider; this API would refuse it.
                MessagePart::Thinking { .. } => {}
                MessagePart::ToolCall(call) => blocks.push(Block::ToolUse {
                    id: safe_call_id(&call.id.0),
                    name: &call.name,
                    input: tool_input(&call.arguments),
                    cache_control: None,
                }),
                MessagePart::ToolResult(result) => blocks.push(Block::ToolResult {
                    tool_use_id: safe_call_id(&result.call_id.0),
                    content: &result.content,
                    is_error: result.is_error,
                    cache_control: None,
                }),
            }
        }
        if blocks.is_empty() {
            continue;
        }
        let role = if assistant { "assistant" } else { "user" };
        match out.last_mut() {
            Some(last) if last.role == role => last.content.extend(blocks),
            Some(_) | None => out.push(WireMessage {
                role,
                content: blocks,
            }),
        }
    }
    // Tool results must open the user turn that answers the tool calls.
    for message in out.iter_mut().filter(|m| m.role == "user") {
        let (mut results, others): (Vec<_>, Vec<_>) =
            message.content.drain(..).partition(Block::is_tool_result);
        results.extend(others);
        message.content = results;
    }
    (system, out)
}

#[derive(Debug, Default, Clone, Copy)]
struct UsageSoFar {
    input: u64,
    output: u64,
    cache_write: u64,
    cache_read: u64,
    seen: bool,
}

impl UsageSoFar {
    /// Later reports carry running totals: each field present replaces the earlier value.
    fn merge(&mut self, usage: &serde_json::Value) {
        let field = |name: &str| usage.get(name).and_then(serde_json::Value::as_u64);
        for (name, slot) in [
            ("input_tokens", &mut self.input),
            ("output_tokens", &mut self.output),
            ("cache_creation_input_tokens", &mut self.cache_write),
            ("cache_read_input_tokens", &mut self.cache_read),
        ] {
            if let Some(value) = field(name) {
                *slot = value;
                self.seen = true;
            }
        }
    }

    /// Anthropic's `input_tokens` excludes cache reads and writes; ours includes them.
    fn usage(self) -> Option<TokenUsage> {
        self.seen.then(|| TokenUsage {
            input_tokens: self.input + self.cache_write + self.cache_read,
            output_tokens: self.output,
            cache_read_tokens: self.cache_read,
            cache_write_tokens: self.cache_write,
        })
    }
}

fn stop_reason(reason: &str) -> Result<FinishReason, ProviderError> {
    match reason {
        "end_turn" | "stop_sequence" => Ok(FinishReason::Stop),
        "tool_use" => Ok(FinishReason::ToolCalls),
        "max_tokens" | "model_context_window_exceeded" => Ok(FinishReason::MaxTokens),
        "refusal" => Err(ProviderError::permanent(
            ModelErrorKind::ContentFilter,
            "the model refused to answer (stop_reason: refusal)",
        )),
        other => {
            tracing::warn!(
                stop_reason = other,
                "unknown stop reason; treating it as end_turn"
            );
            Ok(FinishReason::Stop)
        }
    }
}

fn text_field<'v>(value: &'v serde_json::Value, name: &str) -> &'v str {
    value
        .get(name)
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
}

/// Opens the assembler block for one content block (whole, or the start of a streamed
/// one). `None` for block types Nerve does not use (server tools, citations).
fn open_block(
    asm: &mut Assembler,
    block: &serde_json::Value,
    streaming: bool,
    deltas: &mut VecDeque<Delta>,
) -> Option<usize> {
    let index = match text_field(block, "type") {
        "text" => {
            let index = asm.open_text();
            asm.push(index, text_field(block, "text"), deltas);
            index
        }
        "thinking" => {
            let index = asm.open_thinking();
            asm.push(index, text_field(block, "thinking"), deltas);
            let signature = text_field(block, "signature");
            if !signature.is_empty() {
                asm.sign(index, signature);
            }
            index
        }
        "redacted_thinking" => {
            asm.open_opaque_thinking(text_field(block, "data"), REDACTED_THINKING)
        }
        "tool_use" => {
            let id = block.get("id").and_then(serde_json::Value::as_str);
            let index = asm.open_tool(id, text_field(block, "name"), deltas);
            // A streamed tool_use starts with `input: {}` and sends the real input as
            // input_json_delta; a whole one carries it here.
            if !streaming && let Some(input) = block.get("input") {
                asm.push(index, &input.to_string(), deltas);
            }
            index
        }
        other => {
            tracing::debug!(
                block_type = other,
                "ignoring a content block type Nerve does not use"
            );
            return None;
        }
    };
    Some(index)
}

/// Decodes a whole (non-streamed) response body. Tool inputs arrive as objects, so there
/// are no raw argument bytes to keep.
pub(crate) fn decode_response(
    body: &[u8],
    estimate: &UsageEstimate,
    _raw: Option<&RawArguments>,
) -> Result<ModelResponse, ProviderError> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        ProviderError::permanent(
            ModelErrorKind::InvalidResponse,
            format!("not a Messages API response: {e}"),
        )
    })?;
    if text_field(&value, "type") == "error" || value.get("error").is_some() {
        return Err(http::error_from_event("anthropic", &value));
    }
    let Some(content) = value.get("content").and_then(serde_json::Value::as_array) else {
        return Err(ProviderError::permanent(
            ModelErrorKind::InvalidResponse,
            "the response has no content array",
        ));
    };
    let mut asm = Assembler::new(false);
    let mut deltas = VecDeque::new();
    for block in content {
        open_block(&mut asm, block, false, &mut deltas);
    }
    let reported = value
        .get("stop_reason")
        .and_then(serde_json::Value::as_str)
        .map(stop_reason)
        .transpose()?;
    let mut usage = UsageSoFar::default();
    if let Some(reported_usage) = value.get("usage") {
        usage.merge(reported_usage);
    }
    let has_calls = asm.has_tool_calls();
    let message = asm.message();
    let finish = reconcile_finish(reported.unwrap_or(FinishReason::Stop), has_calls);
    Ok(ModelResponse {
        usage: estimate.resolve(usage.usage(), &message),
        message,
        finish,
    })
}

/// Decodes a Messages stream (`message_start` ... `message_stop`).
#[derive(Debug)]
pub struct MessagesStreamDecoder {
    asm: Assembler,
    /// Wire block index → assembler block (`None`: a block type Nerve ignores).
    blocks: Vec<(u64, Option<usize>)>,
    stop: Option<FinishReason>,
    usage: UsageSoFar,
    estimate: UsageEstimate,
}

impl MessagesStreamDecoder {
    pub fn new(estimate: UsageEstimate) -> Self {
        Self {
            asm: Assembler::new(true),
            blocks: Vec::new(),
            stop: None,
            usage: UsageSoFar::default(),
            estimate,
        }
    }

    fn block(&self, event: &serde_json::Value) -> Option<usize> {
        self.block_at(event.get("index").and_then(serde_json::Value::as_u64)?)
    }

    fn block_at(&self, index: u64) -> Option<usize> {
        self.blocks
            .iter()
            .find(|(wire, _)| *wire == index)
            .and_then(|(_, block)| *block)
    }

    /// A block's delta: more text, thinking, signature or tool-call arguments.
    fn block_delta<'d>(
        &mut self,
        block: usize,
        kind: &str,
        get: impl Fn(&str) -> Option<&'d str>,
        deltas: &mut VecDeque<Delta>,
    ) {
        let field = |name: &str| get(name).unwrap_or_default();
        match kind {
            "text_delta" => self.asm.push(block, field("text"), deltas),
            "thinking_delta" => self.asm.push(block, field("thinking"), deltas),
            "signature_delta" => self.asm.sign(block, field("signature")),
            "input_json_delta" => self.asm.push(block, field("partial_json"), deltas),
            other => tracing::debug!(
                delta_type = other,
                "ignoring a delta type Nerve does not use"
            ),
        }
    }

    /// Most events of a stream are `content_block_delta`s: those are read into borrowed
    /// strings ([`crate::provider::json_text`]) instead of a `Value`. `false` when `data` is not one
    /// (or not in the expected shape: the general path then reads it).
    fn fast_block_delta(&mut self, event: &SseEvent, deltas: &mut VecDeque<Delta>) -> bool {
        let Ok(wire) = serde_json::from_str::<WireBlockDeltaEvent<'_>>(&event.data) else {
            return false;
        };
        let kind = text(wire.kind.as_ref()).unwrap_or(&event.event);
        if kind != "content_block_delta" {
            return false;
        }
        let Some(block) = wire.index.and_then(|index| self.block_at(index)) else {
            return true;
        };
        let delta = wire.delta.unwrap_or_default();
        let delta_kind = text(delta.kind.as_ref()).unwrap_or_default();
        self.block_delta(
            block,
            delta_kind,
            |name| match name {
                "text" => text(delta.text.as_ref()),
                "thinking" => text(delta.thinking.as_ref()),
                "signature" => text(delta.signature.as_ref()),
                "partial_json" => text(delta.partial_json.as_ref()),
                _ => None,
            },
            deltas,
        );
        true
    }
}

/// A `content_block_delta` event, its strings borrowed from the event.
#[derive(Debug, Deserialize)]
struct WireBlockDeltaEvent<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Text<'a>>,
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    delta: Option<WireBlockDelta<'a>>,
}

#[derive(Debug, Default, Deserialize)]
struct WireBlockDelta<'a> {
    #[serde(rename = "type", default, borrow)]
    kind: Option<Text<'a>>,
    #[serde(default, borrow)]
    text: Option<Text<'a>>,
    #[serde(default, borrow)]
    thinking: Option<Text<'a>>,
    #[serde(default, borrow)]
    signature: Option<Text<'a>>,
    #[serde(default, borrow)]
    partial_json: Option<Text<'a>>,
}

impl StreamDecoder for MessagesStreamDecoder {
    fn event(
        &mut self,
        event: &SseEvent,
        deltas: &mut VecDeque<Delta>,
    ) -> Result<Flow, ProviderError> {
        if self.fast_block_delta(event, deltas) {
            return Ok(Flow::Continue);
        }
        let value: serde_json::Value = match serde_json::from_str(&event.data) {
            Ok(value) => value,
            Err(error) => {
                tracing::warn!(%error, event = %event.event, "skipping a stream event that is not JSON");
                return Ok(Flow::Continue);
            }
        };
        // The `type` member is authoritative; the SSE event name is the fallback.
        let kind = value
            .get("type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or(&event.event);
        match kind {
            "message_start" => {
                if let Some(usage) = value.get("message").and_then(|m| m.get("usage")) {
                    self.usage.merge(usage);
                }
            }
            "content_block_start" => {
                let index = value
                    .get("index")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(self.blocks.len() as u64);
                let block = value
                    .get("content_block")
                    .and_then(|block| open_block(&mut self.asm, block, true, deltas));
                self.blocks.push((index, block));
            }
            "content_block_delta" => {
                let Some(block) = self.block(&value) else {
                    return Ok(Flow::Continue);
                };
                let delta = value.get("delta").unwrap_or(&serde_json::Value::Null);
                self.block_delta(
                    block,
                    text_field(delta, "type"),
                    |name| delta.get(name).and_then(serde_json::Value::as_str),
                    deltas,
                );
            }
            "message_delta" => {
                if let Some(reason) = value
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(serde_json::Value::as_str)
                {
                    self.stop = Some(stop_reason(reason)?);
                }
                if let Some(usage) = value.get("usage") {
                    self.usage.merge(usage);
                }
            }
            "message_stop" => return Ok(Flow::Done),
            "error" => return Err(http::error_from_event("anthropic", &value)),
            // content_block_stop needs nothing; ping keeps the connection alive.
            "content_block_stop" | "ping" => {}
            other => tracing::debug!(event_type = other, "ignoring an unknown stream event"),
        }
        Ok(Flow::Continue)
    }

    fn finish(&mut self, done: bool) -> Result<ModelResponse, ProviderError> {
        if !done && self.stop.is_none() {
            return Err(ProviderError::transient(
                ModelErrorKind::TruncatedStream,
                "the stream ended before the model finished (no stop_reason, no message_stop)",
            ));
        }
        let has_calls = self.asm.has_tool_calls();
        let message = self.asm.message();
        let finish = reconcile_finish(self.stop.unwrap_or(FinishReason::Stop), has_calls);
        Ok(ModelResponse {
            usage: self.estimate.resolve(self.usage.usage(), &message),
            message,
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
    use nerve_core::{ToolCall, ToolCallId, ToolResult};
    use std::sync::Arc;

    fn estimate() -> UsageEstimate {
        UsageEstimate {
            input: 100,
            counter: Arc::new(Estimate),
            calibration: None,
        }
    }

    fn call(id: &str, name: &str, arguments: serde_json::Value) -> MessagePart {
        MessagePart::ToolCall(ToolCall {
            id: ToolCallId(id.into()),
            name: name.into(),
            arguments,
        })
    }

    #[test]
    fn whole_responses_keep_thinking_and_map_usage() {
        let body = serde_json::json!({
            "id": "msg_1", "type": "message", "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": "sig=="},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Running ls."},
                {"type": "tool_use", "id": "toolu_1", "name": "shell", "input": {"command": "ls"}},
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 20, "cache_creation_input_tokens": 5, "cache_read_input_tokens": 100}
        });
        let response = decode_response(body.to_string().as_bytes(), &estimate(), None).unwrap();
        assert_eq!(
            response.message.parts,
            vec![
                MessagePart::Thinking {
                    text: "plan".into(),
                    signature: Some("sig==".into())
                },
                MessagePart::Thinking {
                    text: "opaque".into(),
                    signature: Some(REDACTED_THINKING.into())
                },
                MessagePart::Text {
                    text: "Running ls.".into()
                },
                call("toolu_1", "shell", serde_json::json!({"command": "ls"})),
            ]
        );
        assert_eq!(response.finish, FinishReason::ToolCalls);
        assert_eq!(
            response.usage,
            TokenUsage {
                input_tokens: 115,
                output_tokens: 20,
                cache_read_tokens: 100,
                cache_write_tokens: 5
            }
        );
        let error = serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        assert_eq!(
            decode_response(error.to_string().as_bytes(), &estimate(), None)
                .unwrap_err()
                .kind(),
            ModelErrorKind::Overloaded
        );
        let refusal = serde_json::json!({"content": [], "stop_reason": "refusal"});
        assert_eq!(
            decode_response(refusal.to_string().as_bytes(), &estimate(), None)
                .unwrap_err()
                .kind(),
            ModelErrorKind::ContentFilter
        );
        let odd = serde_json::json!({"content": [{"type": "text", "text": "x"}], "stop_reason": "brand_new"});
        assert_eq!(
            decode_response(odd.to_string().as_bytes(), &estimate(), None)
                .unwrap()
                .finish,
            FinishReason::Stop
        );
    }

    async fn stream(
        events: &[serde_json::Value],
    ) -> (Vec<Delta>, Result<ModelResponse, ProviderError>) {
        let text: String = events
            .iter()
            .map(|e| {
                format!(
                    "event: {}\ndata: {e}\n\n",
                    e.get("type")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or("x")
                )
            })
            .collect();
        let mut stream = ModelStream::new(
            MemorySource([Bytes::from(text)].into()),
            MessagesStreamDecoder::new(estimate()),
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

    #[tokio::test]
    async fn streams_assemble_blocks_and_ignore_what_they_do_not_know() {
        let events = [
            serde_json::json!({"type": "message_start", "message": {"usage": {"input_tokens": 30, "output_tokens": 1}}}),
            serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}}),
            serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "SIG"}}),
            serde_json::json!({"type": "content_block_stop", "index": 0}),
            serde_json::json!({"type": "ping"}),
            serde_json::json!({"type": "brand_new_event", "index": 0}),
            serde_json::json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "shell", "input": {}}}),
            serde_json::json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
            serde_json::json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"command\": \"l"}}),
            serde_json::json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "s\"}"}}),
            serde_json::json!({"type": "content_block_delta", "index": 1, "delta": {"type": "mystery_delta", "x": 1}}),
            serde_json::json!({"type": "content_block_start", "index": 2, "content_block": {"type": "web_search_tool_result", "content": []}}),
            serde_json::json!({"type": "content_block_delta", "index": 2, "delta": {"type": "text_delta", "text": "ignored"}}),
            serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 42}}),
            serde_json::json!({"type": "message_stop"}),
        ];
        let (deltas, end) = stream(&events).await;
        let end = end.unwrap();
        assert_eq!(
            end.message.parts,
            vec![
                MessagePart::Thinking {
                    text: "hm".into(),
                    signature: Some("SIG".into())
                },
                call("t1", "shell", serde_json::json!({"command": "ls"})),
            ]
        );
        assert_eq!(end.usage, TokenUsage::new(30, 42));
        assert_eq!(end.finish, FinishReason::ToolCalls);
        assert_eq!(deltas.len(), 4);
        // An error event mid-stream, and a stream that stops early.
        let (_, end) = stream(&[events[0].clone(), serde_json::json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})]).await;
        assert_eq!(end.unwrap_err().kind(), ModelErrorKind::Overloaded);
        let (_, end) = stream(&events[..4]).await;
        assert_eq!(end.unwrap_err().kind(), ModelErrorKind::TruncatedStream);
    }

    #[test]
    fn conversations_take_the_messages_shape() {
        let messages = vec![
            Message::system("sys one"),
            Message::system("sys two"),
            Message::user("task"),
            Message {
                role: MessageRole::Assistant,
                parts: vec![
                    MessagePart::Thinking {
                        text: "why".into(),
                        signature: Some("S".into()),
                    },
                    MessagePart::Thinking {
                        text: "opaque".into(),
                        signature: Some(REDACTED_THINKING.into()),
                    },
                    MessagePart::Thinking {
                        text: "foreign".into(),
                        signature: None,
                    },
                    MessagePart::Text {
                        text: String::new(),
                    },
                    call("t1", "shell", serde_json::json!({"command": "ls"})),
                    call("t2", "shell", serde_json::json!("{broken")),
                ],
                pinned: false,
            },
            Message::tool_result(ToolResult {
                call_id: ToolCallId("t1".into()),
                name: "shell".into(),
                content: "a".into(),
                is_error: false,
            }),
            Message::system("[Context: 10/100 tokens]"),
            Message::tool_result(ToolResult {
                call_id: ToolCallId("t2".into()),
                name: "shell".into(),
                content: "bad".into(),
                is_error: true,
            }),
        ];
        let (system, turns) = wire_messages(&messages);
        assert_eq!(
            serde_json::to_value(&system).unwrap(),
            serde_json::json!([{"type": "text", "text": "sys one"}, {"type": "text", "text": "sys two"}])
        );
        assert_eq!(
            serde_json::to_value(&turns).unwrap(),
            serde_json::json!([
                {"role": "user", "content": [{"type": "text", "text": "task"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "why", "signature": "S"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "tool_use", "id": "t1", "name": "shell", "input": {"command": "ls"}},
                    {"type": "tool_use", "id": "t2", "name": "shell", "input": {"invalid_arguments": "{broken"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "a"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "bad", "is_error": true},
                    {"type": "text", "text": "[Context: 10/100 tokens]"}
                ]}
            ])
        );
    }

    #[test]
    fn configuration_is_checked() {
        let mut config = AnthropicConfig::new("claude-sonnet-4-5");
        config.thinking_budget = Some(8_192);
        assert!(matches!(
            AnthropicProvider::new(config),
            Err(ClientError::Config(_))
        ));
        let mut config = AnthropicConfig::new("claude-sonnet-4-5");
        config.base_url = "ftp://x".into();
        assert!(matches!(
            AnthropicProvider::new(config),
            Err(ClientError::BaseUrl { .. })
        ));
        let mut config = AnthropicConfig::new("claude-sonnet-4-5");
        config.api_key = Some(SecretString::from("sk-ant-secret-value"));
        let shown = format!("{:?}", AnthropicProvider::new(config).unwrap());
        assert!(!shown.contains("sk-ant-secret-value"), "{shown}");
    }
}
