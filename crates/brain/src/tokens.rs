//! Token estimates for when a provider reports no usage. A calibrated estimate: about four
//! bytes of English or code per token, plus a small per-message overhead.

use nerve_core::{Message, MessagePart};

/// Tokens every message costs for its role and framing in chat formats.
const MESSAGE_OVERHEAD: u64 = 4;

pub fn estimate_text(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

pub fn estimate_message(message: &Message) -> u64 {
    let parts: u64 = message
        .parts
        .iter()
        .map(|part| match part {
            MessagePart::Text { text } | MessagePart::Thinking { text, .. } => estimate_text(text),
            MessagePart::ToolCall(call) => estimate_text(&call.name) + estimate_text(&call.arguments.to_string()),
            MessagePart::ToolResult(result) => estimate_text(&result.content),
            MessagePart::CompactionSummary { text, .. } => estimate_text(text),
        })
        .sum();
    parts + MESSAGE_OVERHEAD
}

pub fn estimate_messages(messages: &[Message]) -> u64 {
    messages.iter().map(estimate_message).sum()
}
