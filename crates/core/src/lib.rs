//! Nerve's shared vocabulary: the types every layer speaks, and nothing that does I/O.
//!
//! `session`, `hands` and `brain` all depend on this crate and on nothing of each other.
//! The port traits in [`ports`] are how `brain` reaches the event log and the sandbox
//! without knowing that they are SQLite and Docker.

pub mod credentials;
pub mod event;
pub mod execution;
pub mod id;
pub mod message;
pub mod ports;
pub mod redact;
pub mod task;
#[cfg(feature = "testing")]
pub mod testing;
pub mod text;
pub mod usage;

pub use credentials::{
    CredentialKeyError, filter_sandbox_env, is_credential_env_name, validate_metadata,
};
pub use event::{Event, EventKind, Finish, ToolCallFinished, ToolCallStarted, TurnCompleted};
pub use execution::{Complexity, ExecutionStatus, LoopType, TerminationReason};
pub use id::{BlockId, ExecutionId, TaskId, ToolCallId};
pub use message::{Message, MessagePart, MessageRole, ToolCall, ToolResult};
pub use ports::{
    ArchivedBlock, ContextArchive, Enqueued, EventSink, HookOutcome, Hooks, Interrupt,
    PendingCommit, RecallHit, SinkError, Snapshot, ToolDefinition, ToolError, ToolExecutor,
    ToolOutput, WorkspaceError, WorkspaceSnapshots,
};
pub use redact::{Redactor, StreamRedaction};
pub use task::{MAX_RESUMES, TaskStatus, TransitionError, may_resume};
pub use usage::{FinishReason, MicroUsd, TokenUsage, TurnRecord};

#[cfg(test)]
mod wire_tests;
