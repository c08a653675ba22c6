//! Tracing spans for a team's trace viewer: one per execution, turn, model call, tool call
//! and compaction, carrying the OpenTelemetry GenAI semantic-convention attributes and
//! Nerve's own. Brain only opens spans (`tracing`); the `nerve` binary decides whether
//! anything exports them (OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set).
//!
//! Every span is at `INFO` under this module's target, with its fields declared `Empty` and
//! recorded once, when known. Message content (prompts, answers, tool arguments and
//! results) goes into spans only when [`TraceConfig::capture_content`] is set, and always
//! through the redactor; so does any other free text (error messages). When no subscriber
//! wants the spans (the default), opening one costs a cached interest check and nothing is
//! formatted.

use std::sync::Arc;

use nerve_core::event::{CallPurpose, Compaction};
use nerve_core::{
    ExecutionId, LoopType, Message, MessagePart, MessageRole, MicroUsd, Redactor, TaskStatus,
    TerminationReason, TokenUsage, ToolCall, ToolResult,
};
use tracing::Span;
use tracing::field::Empty;

use crate::provider::model_call::{ModelResponse, ProviderError};
use nerve_core::FinishReason;

/// Attribute names. The semantic-conventions crate has deprecated its GenAI constants, so
/// Nerve keeps its own; the `gen_ai.*` ones follow the GenAI conventions, `nerve.*` are ours.
pub mod attr {
    /// `invoke_agent` (the execution), `chat` (a model call), `execute_tool` (a tool call).
    pub const OPERATION_NAME: &str = "gen_ai.operation.name";
    /// `openai`, `anthropic`, or `nerve.scripted` for a cassette.
    pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// The finish reason of the answer (`stop`, `tool_calls`, `max_tokens`). The convention
    /// makes this a string array; a `tracing` field is a scalar, so it is the one reason.
    pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// The execution id: every span of one execution carries the same.
    pub const CONVERSATION_ID: &str = "gen_ai.conversation.id";
    /// `nerve` on the execution's span.
    pub const AGENT_NAME: &str = "gen_ai.agent.name";
    pub const TOOL_NAME: &str = "gen_ai.tool.name";
    pub const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
    /// `function` for every tool Nerve offers.
    pub const TOOL_TYPE: &str = "gen_ai.tool.type";
    /// Opt-in content: the request's messages, as JSON in the conventions' message shape.
    pub const INPUT_MESSAGES: &str = "gen_ai.input.messages";
    /// Opt-in content: the answer, as JSON in the conventions' message shape.
    pub const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
    /// Opt-in content: a tool call's arguments (JSON).
    pub const TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
    /// Opt-in content: a tool call's result as the model sees it.
    pub const TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";
    /// The error kind of a failed operation (`rate_limited`, `auth`, ...).
    pub const ERROR_TYPE: &str = "error.type";

    /// The turn number (1-based), on turn, model-call, tool-call and compaction spans.
    pub const TURN: &str = "nerve.turn";
    /// The plan step a turn belongs to (plan loops).
    pub const STEP: &str = "nerve.step";
    /// What a model call serves: `agent`, `plan` or `summary`.
    pub const CALL_PURPOSE: &str = "nerve.call.purpose";
    /// Attempt number of a model call (1 for the first; retries count up).
    pub const CALL_ATTEMPT: &str = "nerve.call.attempt";
    /// Cost in US dollars: of the call, of the turn, or of the whole execution.
    pub const COST_USD: &str = "nerve.cost_usd";
    /// Tokens the request carries (messages and tool definitions), at the start of a turn.
    pub const CONTEXT_FILL_TOKENS: &str = "nerve.context.fill_tokens";
    /// The model's context capacity in tokens, when known.
    pub const CONTEXT_CAPACITY_TOKENS: &str = "nerve.context.capacity_tokens";
    /// Fill as a percentage of capacity, when the capacity is known.
    pub const CONTEXT_FILL_PERCENT: &str = "nerve.context.fill_percent";
    /// The compaction layer that ran: `offload`, `mask`, `summarize` or `archive`. Absent on
    /// a compaction span whose attempt changed nothing.
    pub const COMPACTION_LAYER: &str = "nerve.compaction.layer";
    /// What set it off: `output_size`, `soft_threshold`, `hard_threshold`, `agent`, `overflow`.
    pub const COMPACTION_TRIGGER: &str = "nerve.compaction.trigger";
    pub const COMPACTION_TOKENS_BEFORE: &str = "nerve.compaction.tokens_before";
    pub const COMPACTION_TOKENS_AFTER: &str = "nerve.compaction.tokens_after";
    /// Whether the summary is the extractive fallback rather than the model's.
    pub const COMPACTION_EXTRACTIVE: &str = "nerve.compaction.extractive";
    /// Whether a tool's result is an error the model sees.
    pub const TOOL_IS_ERROR: &str = "nerve.tool.is_error";
    /// How many tool calls a turn made.
    pub const TOOL_CALLS: &str = "nerve.tool_calls";
    pub const LOOP_TYPE: &str = "nerve.loop.type";
    pub const TASK_ID: &str = "nerve.task.id";
    pub const TASK_STATUS: &str = "nerve.task.status";
    pub const TERMINATION_REASON: &str = "nerve.termination_reason";
    /// Completed turns at the end of the execution.
    pub const TURNS: &str = "nerve.turns";
    pub const COMPACTIONS: &str = "nerve.compactions";
    /// Which resume of the execution this is (1 for the first); absent on a fresh run.
    pub const RESUME_ATTEMPT: &str = "nerve.resume.attempt";

    /// The span kind in the OpenInference conventions (`AGENT`, `CHAIN`, `LLM`, `TOOL`), so
    /// that Phoenix and other OpenInference viewers draw the tree with the right icons.
    pub const OPENINFERENCE_SPAN_KIND: &str = "openinference.span.kind";
}

/// The values of [`attr::OPERATION_NAME`].
pub mod operation {
    pub const INVOKE_AGENT: &str = "invoke_agent";
    pub const CHAT: &str = "chat";
    pub const EXECUTE_TOOL: &str = "execute_tool";
}

/// Span names (the exported name is set through `otel.name` where the conventions want the
/// model or tool in it).
pub mod name {
    pub const EXECUTION: &str = "invoke_agent";
    pub const TURN: &str = "turn";
    pub const CHAT: &str = "chat";
    pub const EXECUTE_TOOL: &str = "execute_tool";
    pub const COMPACTION: &str = "compaction";
}

/// The most characters of content put in one attribute; the rest is cut with a marker.
pub const CONTENT_LIMIT: usize = 32 * 1024;

/// What goes into spans. Part of [`crate::EngineConfig`].
#[derive(Debug, Clone, Default)]
pub struct TraceConfig {
    /// Put message content, tool arguments and tool results in spans (redacted). Off by
    /// default; `nerve` turns it on with `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`.
    pub capture_content: bool,
    /// Applied to every free-text attribute: content and error messages. The run's
    /// redactor (provider keys, proxy secrets, token formats) in `nerve`.
    pub redactor: Arc<Redactor>,
}

impl TraceConfig {
    /// `text` redacted, cut to [`CONTENT_LIMIT`].
    pub fn scrub(&self, text: &str) -> String {
        let redacted = self.redactor.redact(text);
        let clipped = nerve_core::text::clip(&redacted, CONTENT_LIMIT);
        if clipped.len() < redacted.len() {
            format!("{clipped}[... truncated ...]")
        } else {
            redacted.into_owned()
        }
    }

    fn wants_content(&self, span: &Span) -> bool {
        self.capture_content && !span.is_disabled()
    }
}

/// The name a provider goes by in [`attr::PROVIDER_NAME`]: the scripted provider's name
/// carries its cassette's path, which says nothing about the provider.
pub fn provider_name(name: &str) -> &str {
    if name.starts_with("script") {
        "nerve.scripted"
    } else {
        name
    }
}

/// Facts about the execution for its span.
#[derive(Debug, Clone, Copy)]
pub struct ExecutionInfo<'a> {
    pub execution_id: ExecutionId,
    pub task_id: nerve_core::TaskId,
    pub provider: &'a str,
    pub model: &'a str,
    pub loop_type: LoopType,
    /// `Some(attempt)` when resuming.
    pub resume_attempt: Option<u32>,
}

/// The root span of one execution (`invoke_agent nerve`).
pub fn execution_span(info: ExecutionInfo<'_>) -> Span {
    let span = tracing::info_span!(
        "invoke_agent",
        otel.name = "invoke_agent nerve",
        otel.kind = "internal",
        otel.status_code = Empty,
        otel.status_description = Empty,
        { attr::OPERATION_NAME } = operation::INVOKE_AGENT,
        { attr::AGENT_NAME } = "nerve",
        { attr::CONVERSATION_ID } = %info.execution_id,
        { attr::PROVIDER_NAME } = provider_name(info.provider),
        { attr::REQUEST_MODEL } = info.model,
        { attr::TASK_ID } = %info.task_id,
        { attr::LOOP_TYPE } = wire(&info.loop_type),
        { attr::RESUME_ATTEMPT } = Empty,
        { attr::TERMINATION_REASON } = Empty,
        { attr::TASK_STATUS } = Empty,
        { attr::TURNS } = Empty,
        { attr::USAGE_INPUT_TOKENS } = Empty,
        { attr::USAGE_OUTPUT_TOKENS } = Empty,
        { attr::COST_USD } = Empty,
        { attr::COMPACTIONS } = Empty,
        { attr::ERROR_TYPE } = Empty,
        { attr::OPENINFERENCE_SPAN_KIND } = "AGENT",
    );
    if let Some(attempt) = info.resume_attempt {
        span.record(attr::RESUME_ATTEMPT, i64::from(attempt));
    }
    span
}

/// How an execution ended, for its span.
#[derive(Debug, Clone, Copy)]
pub struct ExecutionEnd<'a> {
    pub reason: TerminationReason,
    pub task_status: TaskStatus,
    pub turns: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    pub compactions: u32,
    pub error: Option<&'a str>,
}

/// Records the end of an execution on its span: an error status for every end but
/// `completed` and `parked` (which waits for a person, as designed).
pub fn record_execution_end(span: &Span, config: &TraceConfig, end: ExecutionEnd<'_>) {
    if span.is_disabled() {
        return;
    }
    span.record(attr::TERMINATION_REASON, wire(&end.reason));
    span.record(attr::TASK_STATUS, wire(&end.task_status));
    span.record(attr::TURNS, i64::from(end.turns));
    span.record(attr::USAGE_INPUT_TOKENS, int(end.usage.input_tokens));
    span.record(attr::USAGE_OUTPUT_TOKENS, int(end.usage.output_tokens));
    span.record(attr::COST_USD, end.cost.as_usd());
    span.record(attr::COMPACTIONS, i64::from(end.compactions));
    match end.reason {
        TerminationReason::Completed | TerminationReason::Parked => {
            span.record("otel.status_code", "ok");
        }
        TerminationReason::MaxTurns
        | TerminationReason::BudgetExhausted
        | TerminationReason::Shutdown
        | TerminationReason::TimedOut
        | TerminationReason::Stagnation
        | TerminationReason::Error => {
            span.record(attr::ERROR_TYPE, wire(&end.reason));
            span.record("otel.status_code", "error");
            let message = end.error.unwrap_or("the execution did not complete");
            span.record("otel.status_description", config.scrub(message));
        }
    }
}

/// Where a turn stands when it starts.
#[derive(Debug, Clone, Copy)]
pub struct TurnInfo {
    pub execution_id: ExecutionId,
    pub turn: u32,
    pub step: Option<u32>,
    pub fill: u64,
    pub capacity: Option<u64>,
}

/// One turn of a loop: its compaction, model call and tool calls are its children.
pub fn turn_span(info: TurnInfo) -> Span {
    let span = tracing::info_span!(
        "turn",
        otel.name = Empty,
        otel.kind = "internal",
        { attr::CONVERSATION_ID } = %info.execution_id,
        { attr::TURN } = i64::from(info.turn),
        { attr::STEP } = Empty,
        { attr::CONTEXT_FILL_TOKENS } = int(info.fill),
        { attr::CONTEXT_CAPACITY_TOKENS } = Empty,
        { attr::CONTEXT_FILL_PERCENT } = Empty,
        { attr::RESPONSE_FINISH_REASONS } = Empty,
        { attr::TOOL_CALLS } = Empty,
        { attr::USAGE_INPUT_TOKENS } = Empty,
        { attr::USAGE_OUTPUT_TOKENS } = Empty,
        { attr::COST_USD } = Empty,
        { attr::OPENINFERENCE_SPAN_KIND } = "CHAIN",
    );
    if span.is_disabled() {
        return span;
    }
    span.record("otel.name", format!("turn {}", info.turn));
    if let Some(step) = info.step {
        span.record(attr::STEP, i64::from(step));
    }
    if let Some(capacity) = info.capacity.filter(|&c| c > 0) {
        span.record(attr::CONTEXT_CAPACITY_TOKENS, int(capacity));
        span.record(
            attr::CONTEXT_FILL_PERCENT,
            i64::try_from(u128::from(info.fill) * 100 / u128::from(capacity)).unwrap_or(i64::MAX),
        );
    }
    span
}

/// Records what a turn came to on its span.
pub fn record_turn_end(
    span: &Span,
    finish: &str,
    tool_calls: usize,
    usage: TokenUsage,
    cost: MicroUsd,
) {
    if span.is_disabled() {
        return;
    }
    span.record(attr::RESPONSE_FINISH_REASONS, finish);
    span.record(
        attr::TOOL_CALLS,
        i64::try_from(tool_calls).unwrap_or(i64::MAX),
    );
    span.record(attr::USAGE_INPUT_TOKENS, int(usage.input_tokens));
    span.record(attr::USAGE_OUTPUT_TOKENS, int(usage.output_tokens));
    span.record(attr::COST_USD, cost.as_usd());
}

/// Facts about one model call attempt.
#[derive(Debug, Clone, Copy)]
pub struct ChatInfo<'a> {
    pub execution_id: ExecutionId,
    pub provider: &'a str,
    pub model: &'a str,
    pub purpose: CallPurpose,
    pub turn: u32,
    pub attempt: u32,
}

/// One model call attempt (`chat {model}`, a client span). With content capture on, the
/// request's messages are recorded, redacted.
pub fn chat_span(info: ChatInfo<'_>, config: &TraceConfig, messages: &[Message]) -> Span {
    let span = tracing::info_span!(
        "chat",
        otel.name = Empty,
        otel.kind = "client",
        otel.status_code = Empty,
        otel.status_description = Empty,
        { attr::OPERATION_NAME } = operation::CHAT,
        { attr::CONVERSATION_ID } = %info.execution_id,
        { attr::PROVIDER_NAME } = provider_name(info.provider),
        { attr::REQUEST_MODEL } = info.model,
        { attr::RESPONSE_MODEL } = Empty,
        { attr::CALL_PURPOSE } = wire(&info.purpose),
        { attr::CALL_ATTEMPT } = i64::from(info.attempt),
        { attr::TURN } = i64::from(info.turn),
        { attr::USAGE_INPUT_TOKENS } = Empty,
        { attr::USAGE_OUTPUT_TOKENS } = Empty,
        { attr::RESPONSE_FINISH_REASONS } = Empty,
        { attr::COST_USD } = Empty,
        { attr::ERROR_TYPE } = Empty,
        { attr::INPUT_MESSAGES } = Empty,
        { attr::OUTPUT_MESSAGES } = Empty,
        { attr::OPENINFERENCE_SPAN_KIND } = "LLM",
    );
    if span.is_disabled() {
        return span;
    }
    span.record("otel.name", format!("chat {}", info.model));
    if config.wants_content(&span) {
        span.record(
            attr::INPUT_MESSAGES,
            config.scrub(&messages_json(messages.iter())),
        );
    }
    span
}

/// Records a model call's answer (`model` is the model that answered) or its failure.
pub fn record_chat_result(
    span: &Span,
    config: &TraceConfig,
    model: &str,
    result: &Result<ModelResponse, ProviderError>,
    cost: MicroUsd,
) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(response) => {
            span.record(attr::RESPONSE_MODEL, model);
            span.record(attr::USAGE_INPUT_TOKENS, int(response.usage.input_tokens));
            span.record(attr::USAGE_OUTPUT_TOKENS, int(response.usage.output_tokens));
            span.record(
                attr::RESPONSE_FINISH_REASONS,
                finish_reason(response.finish),
            );
            span.record(attr::COST_USD, cost.as_usd());
            if config.wants_content(span) {
                span.record(
                    attr::OUTPUT_MESSAGES,
                    config.scrub(&messages_json(std::iter::once(&response.message))),
                );
            }
        }
        Err(error) => record_chat_error(span, config, error.kind().as_str(), &error.to_string()),
    }
}

/// Records a model call that failed or was cut off (`kind` as in the log: `timeout`, ...).
pub fn record_chat_error(span: &Span, config: &TraceConfig, kind: &str, message: &str) {
    if span.is_disabled() {
        return;
    }
    span.record(attr::ERROR_TYPE, kind);
    span.record("otel.status_code", "error");
    span.record("otel.status_description", config.scrub(message));
}

/// One tool call the loop runs (`execute_tool {name}`). The name and id come from the
/// model, so they pass the redactor too. With content capture on, its arguments are
/// recorded, redacted.
pub fn tool_span(
    execution_id: ExecutionId,
    turn: u32,
    call: &ToolCall,
    config: &TraceConfig,
) -> Span {
    let span = tracing::info_span!(
        "execute_tool",
        otel.name = Empty,
        otel.kind = "internal",
        otel.status_code = Empty,
        otel.status_description = Empty,
        { attr::OPERATION_NAME } = operation::EXECUTE_TOOL,
        { attr::CONVERSATION_ID } = %execution_id,
        { attr::TOOL_NAME } = Empty,
        { attr::TOOL_CALL_ID } = Empty,
        { attr::TOOL_TYPE } = "function",
        { attr::TURN } = i64::from(turn),
        { attr::TOOL_IS_ERROR } = Empty,
        { attr::TOOL_CALL_ARGUMENTS } = Empty,
        { attr::TOOL_CALL_RESULT } = Empty,
        { attr::ERROR_TYPE } = Empty,
        { attr::OPENINFERENCE_SPAN_KIND } = "TOOL",
    );
    if span.is_disabled() {
        return span;
    }
    let name = config.scrub(&call.name);
    span.record("otel.name", format!("execute_tool {name}"));
    span.record(attr::TOOL_NAME, name);
    span.record(attr::TOOL_CALL_ID, config.scrub(&call.id.0));
    if config.wants_content(&span) {
        span.record(
            attr::TOOL_CALL_ARGUMENTS,
            config.scrub(&call.arguments.to_string()),
        );
    }
    span
}

/// Records a tool call's outcome: its result, or the failure that lost the sandbox.
pub fn record_tool_result(span: &Span, config: &TraceConfig, result: Result<&ToolResult, &str>) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(result) => {
            span.record(attr::TOOL_IS_ERROR, result.is_error);
            if config.wants_content(span) {
                span.record(attr::TOOL_CALL_RESULT, config.scrub(&result.content));
            }
        }
        Err(message) => {
            span.record(attr::ERROR_TYPE, "tool_executor");
            span.record("otel.status_code", "error");
            span.record("otel.status_description", config.scrub(message));
        }
    }
}

/// One compaction attempt. Its layer and token counts are recorded by
/// [`record_compaction`] when it changes the conversation; a summary's model call is its
/// child.
pub fn compaction_span(
    execution_id: ExecutionId,
    turn: u32,
    trigger: nerve_core::event::CompactionTrigger,
) -> Span {
    tracing::info_span!(
        "compaction",
        otel.kind = "internal",
        { attr::CONVERSATION_ID } = %execution_id,
        { attr::TURN } = i64::from(turn),
        { attr::COMPACTION_TRIGGER } = wire(&trigger),
        { attr::COMPACTION_LAYER } = Empty,
        { attr::COMPACTION_TOKENS_BEFORE } = Empty,
        { attr::COMPACTION_TOKENS_AFTER } = Empty,
        { attr::COMPACTION_EXTRACTIVE } = Empty,
        { attr::OPENINFERENCE_SPAN_KIND } = "CHAIN",
    )
}

/// Records a compaction that happened on the current span (the compaction span it runs
/// in). The summary text is content: never recorded here.
pub fn record_compaction(compaction: &Compaction) {
    let span = Span::current();
    if span.is_disabled() {
        return;
    }
    span.record(attr::COMPACTION_LAYER, wire(&compaction.strategy));
    span.record(
        attr::COMPACTION_TOKENS_BEFORE,
        int(compaction.tokens_before),
    );
    span.record(attr::COMPACTION_TOKENS_AFTER, int(compaction.tokens_after));
    span.record(attr::COMPACTION_EXTRACTIVE, compaction.extractive);
}

/// Integers go out as `i64`: `tracing-opentelemetry` sends a `u64` as a string.
fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn finish_reason(finish: FinishReason) -> &'static str {
    finish.as_str()
}

/// A snake_case wire value (`max_turns`, `hard_threshold`) as its string.
fn wire<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// Messages in the GenAI conventions' shape: `[{role, parts: [{type, ...}]}]`.
fn messages_json<'a>(messages: impl Iterator<Item = &'a Message>) -> String {
    let messages: Vec<serde_json::Value> = messages
        .map(|message| {
            let role = match message.role {
                MessageRole::System => "system",
                MessageRole::User => "user",
                MessageRole::Assistant => "assistant",
                MessageRole::Tool => "tool",
            };
            let parts: Vec<serde_json::Value> = message
                .parts
                .iter()
                .map(|part| match part {
                    MessagePart::Text { text } | MessagePart::CompactionSummary { text, .. } => {
                        serde_json::json!({"type": "text", "content": text})
                    }
                    MessagePart::Thinking { text, .. } => {
                        serde_json::json!({"type": "reasoning", "content": text})
                    }
                    MessagePart::ToolCall(call) => serde_json::json!({
                        "type": "tool_call",
                        "id": call.id.0,
                        "name": call.name,
                        "arguments": call.arguments,
                    }),
                    MessagePart::ToolResult(result) => serde_json::json!({
                        "type": "tool_call_response",
                        "id": result.call_id.0,
                        "response": result.content,
                    }),
                })
                .collect();
            serde_json::json!({"role": role, "parts": parts})
        })
        .collect();
    serde_json::Value::Array(messages).to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use nerve_core::event::ModelErrorKind;
    use secrecy::SecretString;
    use tracing::Subscriber;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};

    use super::*;

    /// Collects every span's name, parent and fields, as an exporter would see them.
    #[derive(Default)]
    struct Recorder {
        spans: Mutex<Vec<(String, BTreeMap<String, String>)>>,
    }

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.insert(field.name().to_owned(), format!("{value:?}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().to_owned(), value.to_owned());
        }
    }

    /// The process-wide subscriber of this test binary: it records nothing (a thread's own
    /// [`Recorder`] or [`Tree`] does), and exists to keep tracing's global caches from
    /// hiding spans from those.
    ///
    /// tracing caches each callsite's interest and a maximum level for the whole process,
    /// combined over the subscribers alive when they are computed, and other tests register
    /// callsites and subscribers on other threads at any moment. With no global subscriber,
    /// a recording test's subscriber is often the only one registered, and then tracing
    /// computes interest from *the registering thread's* current subscriber: an engine test
    /// elsewhere that reaches the `chat` span first, with none, caches `never` for it, and a
    /// recording test running meanwhile records no span (rebuilding the cache first does not
    /// help: the other thread may write after). With this subscriber always registered,
    /// every computation includes it, and it answers `sometimes` and no level hint, so no
    /// callsite is ever cached as `never` and the maximum level stays `TRACE`.
    struct KeepInterest;

    impl Subscriber for KeepInterest {
        fn register_callsite(
            &self,
            _: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            false
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            Id::from_u64(1) // never called: nothing is enabled
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Installs [`KeepInterest`] once per process, before a test records. Installing it
    /// rebuilds every callsite's interest, so a `never` cached before it is gone too.
    fn keep_interest() {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        INSTALLED.call_once(|| {
            tracing::subscriber::set_global_default(KeepInterest)
                .expect("no other global subscriber in this test binary");
        });
    }

    impl Subscriber for &'static Recorder {
        // Asked again at every span (as [`KeepInterest`] makes sure for every subscriber).
        fn register_callsite(
            &self,
            _: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let mut fields = BTreeMap::new();
            span.record(&mut Fields(&mut fields));
            let mut spans = self.spans.lock().unwrap();
            spans.push((span.metadata().name().to_owned(), fields));
            Id::from_u64(spans.len() as u64)
        }
        fn record(&self, id: &Id, values: &Record<'_>) {
            let mut spans = self.spans.lock().unwrap();
            let index = usize::try_from(id.into_u64()).unwrap() - 1;
            values.record(&mut Fields(&mut spans[index].1));
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    fn recorded(f: impl FnOnce()) -> Vec<(String, BTreeMap<String, String>)> {
        keep_interest();
        let recorder: &'static Recorder = Box::leak(Box::default());
        tracing::subscriber::with_default(recorder, f);
        recorder.spans.lock().unwrap().clone()
    }

    const SECRET: &str = "hunter2-the-canary";

    fn config(capture_content: bool) -> TraceConfig {
        let secret = SecretString::from(SECRET);
        TraceConfig {
            capture_content,
            redactor: Arc::new(Redactor::with_secrets([("canary", &secret)]).unwrap()),
        }
    }

    fn chat(capture: bool) -> BTreeMap<String, String> {
        let messages = [Message::user(format!("use {SECRET} please"))];
        let spans = recorded(|| {
            let config = config(capture);
            let info = ChatInfo {
                execution_id: ExecutionId::new(),
                provider: "script:/tmp/x.jsonl",
                model: "scripted",
                purpose: CallPurpose::Agent,
                turn: 2,
                attempt: 1,
            };
            let span = chat_span(info, &config, &messages);
            let response = ModelResponse {
                message: Message::text(MessageRole::Assistant, format!("the key is {SECRET}")),
                usage: TokenUsage::new(120, 7),
                finish: FinishReason::Stop,
            };
            record_chat_result(&span, &config, "scripted", &Ok(response), MicroUsd(1500));
        });
        assert_eq!(spans.len(), 1);
        spans[0].1.clone()
    }

    #[test]
    fn a_chat_span_carries_the_genai_attributes_and_no_content_by_default() {
        let fields = chat(false);
        let expected = [
            ("otel.name", "chat scripted"),
            ("otel.kind", "client"),
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "nerve.scripted"),
            ("gen_ai.request.model", "scripted"),
            ("gen_ai.response.model", "scripted"),
            ("gen_ai.usage.input_tokens", "120"),
            ("gen_ai.usage.output_tokens", "7"),
            ("gen_ai.response.finish_reasons", "stop"),
            ("nerve.call.purpose", "agent"),
            ("nerve.turn", "2"),
            ("nerve.cost_usd", "0.0015"),
        ];
        for (name, value) in expected {
            assert_eq!(fields.get(name).map(String::as_str), Some(value), "{name}");
        }
        assert!(!fields.contains_key(attr::INPUT_MESSAGES), "{fields:?}");
        assert!(!fields.contains_key(attr::OUTPUT_MESSAGES), "{fields:?}");
        assert!(!format!("{fields:?}").contains(SECRET));
    }

    #[test]
    fn opted_in_content_is_recorded_redacted() {
        let fields = chat(true);
        let input = &fields[attr::INPUT_MESSAGES];
        let output = &fields[attr::OUTPUT_MESSAGES];
        assert!(input.contains("[REDACTED:canary]"), "{input}");
        assert!(output.contains("\"role\":\"assistant\""), "{output}");
        assert!(output.contains("the key is [REDACTED:canary]"), "{output}");
        assert!(!format!("{fields:?}").contains(SECRET));
    }

    #[test]
    fn a_failed_call_is_an_error_with_a_redacted_message() {
        let spans = recorded(|| {
            let config = config(false);
            let info = ChatInfo {
                execution_id: ExecutionId::new(),
                provider: "openai",
                model: "gpt-4o",
                purpose: CallPurpose::Summary,
                turn: 1,
                attempt: 2,
            };
            let span = chat_span(info, &config, &[]);
            let error =
                ProviderError::permanent(ModelErrorKind::Auth, format!("key {SECRET} refused"));
            record_chat_result(&span, &config, "gpt-4o", &Err(error), MicroUsd::ZERO);
        });
        let fields = &spans[0].1;
        assert_eq!(fields["error.type"], "auth");
        assert_eq!(fields["otel.status_code"], "error");
        assert_eq!(
            fields["otel.status_description"],
            "auth: key [REDACTED:canary] refused"
        );
        assert_eq!(fields["gen_ai.provider.name"], "openai");
        assert_eq!(fields["nerve.call.attempt"], "2");
    }

    #[test]
    fn a_tool_span_names_the_call_and_redacts_what_the_model_chose() {
        let spans = recorded(|| {
            let config = config(true);
            let call = ToolCall {
                id: nerve_core::ToolCallId(format!("call_{SECRET}")),
                name: "shell".into(),
                arguments: serde_json::json!({"command": format!("echo {SECRET}")}),
            };
            let span = tool_span(ExecutionId::new(), 4, &call, &config);
            let result = ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: "exit 1".into(),
                is_error: true,
            };
            record_tool_result(&span, &config, Ok(&result));
        });
        let fields = &spans[0].1;
        assert_eq!(fields["otel.name"], "execute_tool shell");
        assert_eq!(fields["gen_ai.operation.name"], "execute_tool");
        assert_eq!(fields["gen_ai.tool.name"], "shell");
        assert_eq!(fields["gen_ai.tool.call.id"], "call_[REDACTED:canary]");
        assert_eq!(fields["nerve.tool.is_error"], "true");
        assert_eq!(fields["nerve.turn"], "4");
        assert!(fields["gen_ai.tool.call.arguments"].contains("echo [REDACTED:canary]"));
        assert_eq!(fields["gen_ai.tool.call.result"], "exit 1");
        assert!(!format!("{fields:?}").contains(SECRET));
    }

    #[test]
    fn long_content_is_cut() {
        let config = TraceConfig::default();
        let long = "x".repeat(CONTENT_LIMIT + 10);
        let scrubbed = config.scrub(&long);
        assert!(scrubbed.ends_with("[... truncated ...]"));
        assert!(scrubbed.len() < CONTENT_LIMIT + 30);
    }

    #[test]
    fn turn_and_execution_spans_record_their_ends() {
        let spans = recorded(|| {
            let id = ExecutionId::new();
            let execution = execution_span(ExecutionInfo {
                execution_id: id,
                task_id: nerve_core::TaskId::new(),
                provider: "anthropic",
                model: "claude",
                loop_type: LoopType::React,
                resume_attempt: Some(1),
            });
            let turn = turn_span(TurnInfo {
                execution_id: id,
                turn: 3,
                step: None,
                fill: 750,
                capacity: Some(1000),
            });
            record_turn_end(&turn, "tool_calls", 2, TokenUsage::new(5, 6), MicroUsd(10));
            record_execution_end(
                &execution,
                &config(false),
                ExecutionEnd {
                    reason: TerminationReason::MaxTurns,
                    task_status: TaskStatus::InProgress,
                    turns: 3,
                    usage: TokenUsage::new(50, 60),
                    cost: MicroUsd(100),
                    compactions: 1,
                    error: Some(&format!("stopped; {SECRET}")),
                },
            );
        });
        let execution = &spans[0].1;
        assert_eq!(execution["gen_ai.operation.name"], "invoke_agent");
        assert_eq!(execution["nerve.resume.attempt"], "1");
        assert_eq!(execution["nerve.termination_reason"], "max_turns");
        assert_eq!(execution["error.type"], "max_turns");
        assert_eq!(execution["nerve.loop.type"], "react");
        assert!(!execution["otel.status_description"].contains(SECRET));
        let turn = &spans[1].1;
        assert_eq!(turn["otel.name"], "turn 3");
        assert_eq!(turn["nerve.context.fill_percent"], "75");
        assert_eq!(turn["nerve.tool_calls"], "2");
    }

    /// A span as the engine left it: its name, fields and parent (an index into the list).
    #[derive(Debug, Clone)]
    struct Node {
        name: String,
        fields: BTreeMap<String, String>,
        parent: Option<usize>,
    }

    /// Like [`Recorder`], and it knows each span's parent: the explicit one, or the span
    /// entered when it opened (the engine's spans are all contextual).
    #[derive(Default)]
    struct Tree {
        nodes: Mutex<Vec<Node>>,
        entered: Mutex<Vec<usize>>,
    }

    impl Subscriber for &'static Tree {
        // Asked again at every span (as [`KeepInterest`] makes sure for every subscriber).
        fn register_callsite(
            &self,
            _: &'static tracing::Metadata<'static>,
        ) -> tracing::subscriber::Interest {
            tracing::subscriber::Interest::sometimes()
        }
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let mut fields = BTreeMap::new();
            span.record(&mut Fields(&mut fields));
            let parent = match span.parent() {
                Some(id) => Some(usize::try_from(id.into_u64()).unwrap() - 1),
                None if span.is_contextual() => self.entered.lock().unwrap().last().copied(),
                None => None,
            };
            let mut nodes = self.nodes.lock().unwrap();
            nodes.push(Node {
                name: span.metadata().name().to_owned(),
                fields,
                parent,
            });
            Id::from_u64(nodes.len() as u64)
        }
        fn record(&self, id: &Id, values: &Record<'_>) {
            let mut nodes = self.nodes.lock().unwrap();
            let index = usize::try_from(id.into_u64()).unwrap() - 1;
            values.record(&mut Fields(&mut nodes[index].fields));
        }
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, id: &Id) {
            let index = usize::try_from(id.into_u64()).unwrap() - 1;
            self.entered.lock().unwrap().push(index);
        }
        fn exit(&self, id: &Id) {
            let index = usize::try_from(id.into_u64()).unwrap() - 1;
            let mut entered = self.entered.lock().unwrap();
            let at = entered.iter().rposition(|&i| i == index).unwrap();
            entered.remove(at);
        }
    }

    /// Runs `body` on this thread with a [`Tree`] as the subscriber; returns the spans.
    async fn traced<F: std::future::Future>(body: F) -> (F::Output, Vec<Node>) {
        keep_interest();
        let tree: &'static Tree = Box::leak(Box::default());
        let _default = tracing::subscriber::set_default(tree);
        let output = body.await;
        let nodes = tree.nodes.lock().unwrap().clone();
        (output, nodes)
    }

    fn engine(cassette: &str, config: crate::EngineConfig) -> crate::AgentEngine {
        crate::AgentEngine::new(
            Arc::new(crate::ScriptedProvider::parse("test", cassette).unwrap()),
            Arc::new(nerve_core::testing::EchoTools::default()),
            Arc::new(nerve_core::testing::MemorySink::default()),
            config,
        )
    }

    fn task() -> crate::engine::Task {
        crate::engine::Task {
            id: nerve_core::TaskId::new(),
            description: "do it".into(),
            metadata: serde_json::Value::Null,
            status: TaskStatus::Created,
            workspace: "/w".into(),
        }
    }

    const TOOL: &str = r#"{"tool_calls":[{"name":"shell","arguments":{"command":"ls"}}]}"#;
    const DONE: &str = r#"{"text":"done"}"#;

    fn parent_name(nodes: &[Node], node: &Node) -> String {
        node.parent
            .map_or_else(|| "<root>".into(), |p| nodes[p].name.clone())
    }

    #[tokio::test]
    async fn an_execution_is_a_tree_of_turns_with_their_model_and_tool_calls() {
        let engine = engine(&format!("{TOOL}\n{DONE}"), crate::EngineConfig::default());
        let run = engine.run(
            ExecutionId::new(),
            task(),
            tokio_util::sync::CancellationToken::new(),
        );
        let (result, nodes) = traced(run).await;
        assert_eq!(
            result.unwrap().termination_reason,
            TerminationReason::Completed
        );
        let shape: Vec<(String, String, Option<&str>)> = nodes
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    parent_name(&nodes, n),
                    n.fields.get(attr::TURN).map(String::as_str),
                )
            })
            .collect();
        let expected = [
            ("invoke_agent", "<root>", None),
            ("turn", "invoke_agent", Some("1")),
            ("chat", "turn", Some("1")),
            ("execute_tool", "turn", Some("1")),
            ("turn", "invoke_agent", Some("2")),
            ("chat", "turn", Some("2")),
        ];
        let expected: Vec<(String, String, Option<&str>)> = expected
            .iter()
            .map(|(n, p, t)| ((*n).to_owned(), (*p).to_owned(), *t))
            .collect();
        assert_eq!(shape, expected);
        assert_eq!(nodes[0].fields[attr::TERMINATION_REASON], "completed");
        assert_eq!(nodes[1].fields[attr::RESPONSE_FINISH_REASONS], "tool_calls");
        assert_eq!(nodes[3].fields[attr::TOOL_NAME], "shell");
        assert_eq!(nodes[5].fields[attr::RESPONSE_FINISH_REASONS], "stop");
    }

    #[tokio::test]
    async fn a_model_call_cut_off_by_the_deadline_is_an_error_span() {
        // The deadline must fall inside the (minute-long) call, not before the first turn
        // starts on a loaded machine: ten seconds of margin (two were not always enough
        // beside other test binaries on two cores).
        let config = crate::EngineConfig {
            timeout: Some(std::time::Duration::from_secs(10)),
            ..crate::EngineConfig::default()
        };
        let engine = engine(r#"{"text":"late","delay_ms":60000}"#, config);
        let run = engine.run(
            ExecutionId::new(),
            task(),
            tokio_util::sync::CancellationToken::new(),
        );
        let (result, nodes) = traced(run).await;
        assert_eq!(
            result.unwrap().termination_reason,
            TerminationReason::TimedOut
        );
        let chat = nodes.iter().find(|n| n.name == "chat").unwrap();
        assert_eq!(parent_name(&nodes, chat), "turn");
        assert_eq!(chat.fields[attr::ERROR_TYPE], "timeout");
        assert_eq!(chat.fields["otel.status_code"], "error");
        assert_eq!(nodes[0].fields[attr::TERMINATION_REASON], "timed_out");
    }

    #[tokio::test]
    async fn a_resumed_turn_settles_its_in_doubt_call_under_a_turn_span() {
        // The first run asked for a tool; the resume finds the call without a result.
        let first = engine(TOOL, crate::EngineConfig::default())
            .run(
                ExecutionId::new(),
                task(),
                tokio_util::sync::CancellationToken::new(),
            )
            .await
            .unwrap();
        let mut messages = first.context.messages.clone();
        while messages
            .last()
            .is_some_and(|m| m.role != MessageRole::Assistant)
        {
            messages.pop();
        }
        let call = messages
            .last()
            .unwrap()
            .tool_calls()
            .next()
            .unwrap()
            .clone();
        let state = crate::engine::ResumeState {
            task_id: first.context.task_id,
            messages,
            turns: 0,
            usage: TokenUsage::default(),
            cost: MicroUsd::ZERO,
            task_status: TaskStatus::InProgress,
            pending_turn_usage: TokenUsage::new(10, 2),
            in_doubt: vec![call.id.clone()],
            approvals: Vec::new(),
            attempt: 1,
            from_checkpoint_seq: None,
            finished_in_incomplete_turn: Vec::new(),
            workspace_tree: None,
        };
        let engine = engine(DONE, crate::EngineConfig::default());
        let resume = engine.resume(
            ExecutionId::new(),
            state,
            tokio_util::sync::CancellationToken::new(),
        );
        let (result, nodes) = traced(resume).await;
        assert_eq!(
            result.unwrap().termination_reason,
            TerminationReason::Completed
        );
        let names: Vec<(&str, String)> = nodes
            .iter()
            .map(|n| (n.name.as_str(), parent_name(&nodes, n)))
            .collect();
        assert_eq!(
            names,
            [
                ("invoke_agent", "<root>".to_owned()),
                ("turn", "invoke_agent".to_owned()),
                ("execute_tool", "turn".to_owned()),
                ("turn", "invoke_agent".to_owned()),
                ("chat", "turn".to_owned()),
            ]
        );
        assert_eq!(nodes[0].fields[attr::RESUME_ATTEMPT], "1");
        let settled = &nodes[1].fields;
        assert_eq!(settled[attr::TURN], "1");
        assert_eq!(settled[attr::TOOL_CALLS], "1");
        assert_eq!(settled[attr::USAGE_INPUT_TOKENS], "10");
        let tool = &nodes[2].fields;
        assert_eq!(tool[attr::TOOL_CALL_ID], call.id.0);
        assert_eq!(tool[attr::TOOL_IS_ERROR], "true");
        assert_eq!(nodes[3].fields[attr::TURN], "2");
    }
}
