//! Conversation messages and their parts, as the loops, the log and the providers share them.

use serde::{Deserialize, Serialize};

use crate::id::{BlockId, ToolCallId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MessageRole {
    System,
    User,
    Assistant,
    /// Tool results fed back to the model.
    Tool,
}

/// A tool invocation the model asked for. `arguments` is whatever JSON the model sent:
/// nothing from the model is trusted, tools validate it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: ToolCallId,
    pub name: String,
    pub arguments: serde_json::Value,
}

/// What a tool call produced. A failing tool is a result with `is_error`, never a crash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: ToolCallId,
    pub name: String,
    pub content: String,
    pub is_error: bool,
}

/// One piece of a message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MessagePart {
    Text {
        text: String,
    },
    ToolCall(ToolCall),
    ToolResult(ToolResult),
    /// Model reasoning, passed back to the provider verbatim (with its signature, when the
    /// provider signs it).
    Thinking {
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// A summary that replaced older messages; the originals live in the archive.
    CompactionSummary {
        text: String,
        archived: Vec<BlockId>,
    },
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: MessageRole,
    pub parts: Vec<MessagePart>,
    /// Pinned messages (the task) survive every compaction.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
}

impl Message {
    pub fn text(role: MessageRole, text: impl Into<String>) -> Self {
        Self {
            role,
            parts: vec![MessagePart::Text { text: text.into() }],
            pinned: false,
        }
    }

    pub fn system(text: impl Into<String>) -> Self {
        Self::text(MessageRole::System, text)
    }

    pub fn user(text: impl Into<String>) -> Self {
        Self::text(MessageRole::User, text)
    }

    #[must_use]
    pub fn pinned(mut self) -> Self {
        self.pinned = true;
        self
    }

    /// The concatenated text parts (no tool calls or thinking).
    pub fn text_content(&self) -> String {
        let mut out = String::new();
        for part in &self.parts {
            if let MessagePart::Text { text } = part {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(text);
            }
        }
        out
    }

    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        self.parts.iter().filter_map(|part| match part {
            MessagePart::ToolCall(call) => Some(call),
            MessagePart::Text { .. }
            | MessagePart::ToolResult(_)
            | MessagePart::Thinking { .. }
            | MessagePart::CompactionSummary { .. } => None,
        })
    }

    pub fn tool_result(result: ToolResult) -> Self {
        Self {
            role: MessageRole::Tool,
            parts: vec![MessagePart::ToolResult(result)],
            pinned: false,
        }
    }
}
