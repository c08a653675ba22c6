//! Execution-level enums: runtime status, why a run ended, which loop ran it, how hard the task is.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The agent's runtime state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Idle,
    Executing,
    Paused,
}

/// Why an execution stopped. Every run ends with exactly one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminationReason {
    /// The model gave a final answer.
    Completed,
    /// The turn limit was reached.
    MaxTurns,
    /// A token or USD budget ran out; a controlled stop.
    BudgetExhausted,
    /// Cooperative cancellation (Ctrl-C); resumable.
    Shutdown,
    /// The wall-clock timeout expired.
    TimedOut,
    /// The agent repeated itself after being corrected.
    Stagnation,
    /// Something failed; the result carries a message.
    Error,
    /// Waiting for a human decision on an approval; resumable after `nerve approve`.
    Parked,
}

impl TerminationReason {
    pub const ALL: [Self; 8] = [
        Self::Completed,
        Self::MaxTurns,
        Self::BudgetExhausted,
        Self::Shutdown,
        Self::TimedOut,
        Self::Stagnation,
        Self::Error,
        Self::Parked,
    ];

    /// The wire name (`max_turns`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::MaxTurns => "max_turns",
            Self::BudgetExhausted => "budget_exhausted",
            Self::Shutdown => "shutdown",
            Self::TimedOut => "timed_out",
            Self::Stagnation => "stagnation",
            Self::Error => "error",
            Self::Parked => "parked",
        }
    }

    /// Whether `nerve resume` may continue an execution that ended this way.
    pub const fn is_resumable(self) -> bool {
        match self {
            Self::Shutdown | Self::Parked | Self::TimedOut | Self::Error => true,
            Self::Completed | Self::MaxTurns | Self::BudgetExhausted | Self::Stagnation => false,
        }
    }
}

impl fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The execution loop that drives the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopType {
    React,
    PlanExecute,
    Hybrid,
    /// Chosen from the task's complexity and the budget at run time.
    Auto,
}

/// How hard a task is estimated to be; drives `auto` loop selection and compaction preservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Complexity {
    Simple,
    Medium,
    Complex,
    Epic,
}
