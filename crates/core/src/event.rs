//! The events an execution emits. They are the log's payloads and a public wire format:
//! each variant serialises as a JSON object tagged with its `kind` (see `docs/events.md`).

use serde::{Deserialize, Serialize};

use crate::execution::{LoopType, TerminationReason};
use crate::id::TaskId;
use crate::message::{Message, ToolCall, ToolResult};
use crate::task::TaskStatus;
use crate::usage::{MicroUsd, TokenUsage};

/// The payload schema version written beside every event.
pub const EVENT_VERSION: u32 = 1;

/// Which kind of model call a provider request serves; the scripted provider routes on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallPurpose {
    /// Loop turns and plan-step turns.
    Agent,
    /// Planning and replanning.
    Plan,
    /// Compaction summaries.
    Summary,
}

/// The first event of an execution: what was asked and how it will run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Started {
    pub task_id: TaskId,
    pub task: String,
    pub workspace: String,
    pub loop_type: LoopType,
    pub provider: String,
    pub model: String,
    pub max_turns: u32,
    /// The effective settings, for explaining a run later. Never holds secrets.
    #[serde(default)]
    pub config: serde_json::Value,
}

/// The conversation was created.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextCreated {
    /// The model's context capacity in tokens, when known.
    pub context_window: Option<u64>,
    pub tools: Vec<String>,
}

/// A message joined the conversation, content included, so replay can rebuild it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageAppended {
    /// Position in the conversation, 0-based.
    pub index: u32,
    pub message: Message,
}

/// Written before a tool runs: if no matching finish follows, its side effect is in doubt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallStarted {
    pub turn: u32,
    pub call: ToolCall,
}

/// Written after a tool ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallFinished {
    pub turn: u32,
    pub result: ToolResult,
    pub duration_ms: u64,
}

/// One model call answered (or failed); lets a resumed scripted run continue where it left off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCalled {
    pub turn: u32,
    pub purpose: CallPurpose,
    /// `ok`, or the error kind (`rate_limited`, `context_overflow`, ...).
    pub outcome: String,
    pub usage: TokenUsage,
}

/// A turn ended: one model call and the tool calls it asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnCompleted {
    /// 1-based and contiguous.
    pub turn: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    pub tool_calls: Vec<String>,
    pub finish: String,
    pub duration_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskTransition {
    pub from: TaskStatus,
    pub to: TaskStatus,
}

/// A transient provider failure that will be retried after `delay_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retry {
    pub turn: u32,
    pub attempt: u32,
    pub error: String,
    pub delay_ms: u64,
}

/// The last event of an execution.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finish {
    pub termination_reason: TerminationReason,
    pub task_status: TaskStatus,
    pub total_turns: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    /// Required when `termination_reason` is `error`.
    pub error: Option<String>,
}

/// Every event an execution can record, tagged by `kind`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    Started(Started),
    ContextCreated(ContextCreated),
    MessageAppended(MessageAppended),
    ToolCallStarted(ToolCallStarted),
    ToolCallFinished(ToolCallFinished),
    ModelCalled(ModelCalled),
    TurnCompleted(TurnCompleted),
    TaskTransition(TaskTransition),
    Retry(Retry),
    Finish(Finish),
}

/// The `kind` tag of an [`Event`], as stored in the log's `kind` column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    Started,
    ContextCreated,
    MessageAppended,
    ToolCallStarted,
    ToolCallFinished,
    ModelCalled,
    TurnCompleted,
    TaskTransition,
    Retry,
    Finish,
}

impl EventKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::ContextCreated => "context_created",
            Self::MessageAppended => "message_appended",
            Self::ToolCallStarted => "tool_call_started",
            Self::ToolCallFinished => "tool_call_finished",
            Self::ModelCalled => "model_called",
            Self::TurnCompleted => "turn_completed",
            Self::TaskTransition => "task_transition",
            Self::Retry => "retry",
            Self::Finish => "finish",
        }
    }
}

impl Event {
    pub const fn kind(&self) -> EventKind {
        match self {
            Self::Started(_) => EventKind::Started,
            Self::ContextCreated(_) => EventKind::ContextCreated,
            Self::MessageAppended(_) => EventKind::MessageAppended,
            Self::ToolCallStarted(_) => EventKind::ToolCallStarted,
            Self::ToolCallFinished(_) => EventKind::ToolCallFinished,
            Self::ModelCalled(_) => EventKind::ModelCalled,
            Self::TurnCompleted(_) => EventKind::TurnCompleted,
            Self::TaskTransition(_) => EventKind::TaskTransition,
            Self::Retry(_) => EventKind::Retry,
            Self::Finish(_) => EventKind::Finish,
        }
    }
}
