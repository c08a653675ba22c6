//! The state of one execution: the conversation, the turns, what was spent. Serialisable,
//! so that a checkpoint is a snapshot of it.

use nerve_core::{
    ExecutionId, LoopType, Message, MicroUsd, TaskId, TaskStatus, TerminationReason, TokenUsage,
    TurnRecord,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentContext {
    pub execution_id: ExecutionId,
    pub task_id: TaskId,
    /// The conversation; the system message is always first.
    pub messages: Vec<Message>,
    pub turns: Vec<TurnRecord>,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    pub task_status: TaskStatus,
    pub compactions: u32,
    /// Checkpoints taken by this run.
    #[serde(default)]
    pub checkpoints: u32,
    /// The loop that runs (never `auto` once resolved).
    pub loop_type: LoopType,
}

impl AgentContext {
    pub fn turn_count(&self) -> u32 {
        u32::try_from(self.turns.len()).unwrap_or(u32::MAX)
    }
}

/// How an execution ended.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionResult {
    pub context: AgentContext,
    pub termination_reason: TerminationReason,
    /// Set for `error`, and for any stop worth explaining (`max_turns` reached, budget...).
    pub error: Option<String>,
}
