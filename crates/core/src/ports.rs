//! The ports through which `brain` reaches the event log and the tools. `session` and
//! `hands` implement them; tests of the loops use in-memory fakes.

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::event::Event;
use crate::id::ExecutionId;
use crate::message::ToolCall;

/// The event log (or the archive beside it) failed. Fatal for the execution: a run that
/// cannot be recorded cannot be explained or resumed, so it stops. The kinds say what went
/// wrong, for callers that treat them apart (a resume may retry on a log that is back, never
/// on one that cannot encode); every kind displays as `event log: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The write failed (I/O, a full disk, a refused transaction); nothing of the batch
    /// was written. Returned by every write. Retrying the same write may help once the cause
    /// is fixed; the execution stops either way.
    #[error("event log: {0}")]
    Write(String),
    /// The log is gone (its writer stopped, the connection was lost, a lock poisoned).
    /// Returned by writes and reads alike. Not retryable within this process.
    #[error("event log: {0}")]
    Unavailable(String),
    /// An event, snapshot or block could not be encoded: a bug, never retryable.
    #[error("event log: {0}")]
    Encode(String),
    /// A stored record does not hold together (an archive block that does not decode, a
    /// snapshot that does not match its hash). Returned by reads. Not retryable.
    #[error("event log: {0}")]
    Corrupt(String),
}

impl SinkError {
    /// The message, without the `event log:` prefix.
    pub fn message(&self) -> &str {
        match self {
            Self::Write(message)
            | Self::Unavailable(message)
            | Self::Encode(message)
            | Self::Corrupt(message) => message,
        }
    }
}

/// Where an execution's events go. An append returns once the event is durable.
#[async_trait]
pub trait EventSink: Send + Sync {
    /// Records `event` as the next event of `execution` and returns its sequence number.
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError>;

    /// Saves a snapshot of the agent's state after `turn` (a `checkpoint` event ties it to
    /// the chain) and returns the checkpoint's sequence number. Sinks without checkpoint
    /// storage keep nothing and return `None`.
    async fn checkpoint(
        &self,
        _execution: ExecutionId,
        _turn: u32,
        _snapshot: serde_json::Value,
    ) -> Result<Option<u64>, SinkError> {
        Ok(None)
    }

    /// Records `events` in order and then, when given, `checkpoint`, in as few durable
    /// steps as the sink can (the SQLite log: one transaction); returns once all of it is
    /// durable, with the checkpoint's sequence number when one was stored. The default
    /// appends one by one. Two `commit` futures of one execution alive at once are ordered
    /// by nothing: a caller that issues a batch before the one before it is durable uses
    /// [`EventSink::enqueue`] instead.
    async fn commit(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Result<Option<u64>, SinkError> {
        for event in events {
            self.append(execution, event).await?;
        }
        match checkpoint {
            Some(snapshot) => {
                self.checkpoint(execution, snapshot.turn, snapshot.state)
                    .await
            }
            None => Ok(None),
        }
    }

    /// Places `events` (then `checkpoint`) in `execution`'s order before it returns, without
    /// waiting for the disk: the place is fixed by this call, not by when the returned
    /// future is first polled. Engines use it to overlap a turn's commit with the next
    /// model call and to queue the next batch before the previous one is durable, so that
    /// a group-committing sink may write both in one transaction. A sink with a write queue
    /// overrides it; the default defers, and the caller then commits in order.
    fn enqueue(
        &self,
        _execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        Enqueued::Deferred { events, checkpoint }
    }
}

/// A batch on its way to disk; resolves once it is durable, with the checkpoint's sequence
/// number when one was stored (as [`EventSink::commit`] does).
pub type PendingCommit =
    Pin<Box<dyn Future<Output = Result<Option<u64>, SinkError>> + Send + 'static>>;

/// What [`EventSink::enqueue`] did with a batch.
pub enum Enqueued {
    /// The batch has taken its place in the execution's order: every batch enqueued after
    /// it is written after it, whenever either future is polled. Await it for durability.
    Placed(PendingCommit),
    /// The sink cannot place a batch without waiting, so it hands the batch back: the caller
    /// commits it with [`EventSink::commit`] once every batch before it is durable.
    Deferred {
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    },
}

impl std::fmt::Debug for Enqueued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Placed(_) => f.write_str("Placed(..)"),
            Self::Deferred { events, checkpoint } => f
                .debug_struct("Deferred")
                .field("events", &events.len())
                .field("checkpoint", &checkpoint.is_some())
                .finish(),
        }
    }
}

/// The agent's state after a turn, saved as a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    pub turn: u32,
    pub state: serde_json::Value,
}

/// A tool as the model sees it: name, description and JSON Schema of its arguments.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

impl ToolDefinition {
    /// The tool's arguments in one line, from its JSON Schema, for a model that got them
    /// wrong or reads its tools as text: `shell {command: string, timeout_secs?: integer}`
    /// (`?` marks an optional argument; enumerations list their values).
    pub fn signature(&self) -> String {
        let schema = &self.parameters;
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(serde_json::Value::as_str).collect())
            .unwrap_or_default();
        let arguments: Vec<String> = schema["properties"]
            .as_object()
            .map(|properties| {
                properties
                    .iter()
                    .map(|(name, property)| {
                        let optional = if required.contains(&name.as_str()) {
                            ""
                        } else {
                            "?"
                        };
                        format!("{name}{optional}: {}", type_of(property))
                    })
                    .collect()
            })
            .unwrap_or_default();
        format!("{} {{{}}}", self.name, arguments.join(", "))
    }
}

/// A JSON Schema's type in a word or two: `string`, `integer`, `array of string`,
/// `"a" | "b"`; a nullable type is named without its `null`.
fn type_of(schema: &serde_json::Value) -> String {
    if let Some(values) = schema["enum"].as_array() {
        let values: Vec<String> = values.iter().map(ToString::to_string).collect();
        return values.join(" | ");
    }
    let named = match &schema["type"] {
        serde_json::Value::String(name) => Some(name.clone()),
        serde_json::Value::Array(names) => names
            .iter()
            .filter_map(serde_json::Value::as_str)
            .find(|name| *name != "null")
            .map(str::to_owned),
        serde_json::Value::Null
        | serde_json::Value::Bool(_)
        | serde_json::Value::Number(_)
        | serde_json::Value::Object(_) => None,
    };
    match named.as_deref() {
        Some("array") => format!("array of {}", type_of(&schema["items"])),
        Some(name) => name.to_owned(),
        None => schema["anyOf"]
            .as_array()
            .and_then(|variants| variants.iter().find(|v| v["type"] != "null"))
            .map_or_else(|| "any".to_owned(), type_of),
    }
}

/// A future that resolves when the caller wants a running tool call interrupted.
pub type Interrupt<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>;

/// What a tool call produced, for the model. `is_error` covers everything the model
/// should see and react to: bad arguments, a path outside the workspace, a non-zero exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    pub content: String,
    pub is_error: bool,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
        }
    }

    pub fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
        }
    }
}

/// A failure of the tool machinery itself (the sandbox is gone), not of the tool call.
/// Fatal for the execution; model-visible failures are [`ToolOutput::error`] instead.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The sandbox cannot run anything any more. Not retryable within this execution.
    #[error("sandbox unavailable: {0}")]
    Unavailable(String),
}

/// Runs the agent's tool calls.
#[async_trait]
pub trait ToolExecutor: Send + Sync {
    /// The tools offered to the model.
    fn definitions(&self) -> Vec<ToolDefinition>;

    /// Runs one call. Unknown tools and malformed arguments are `Ok` with `is_error`.
    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError>;

    /// Runs one call until it ends or `interrupt` resolves (the user asked to stop). A tool
    /// that can stop what it runs stops it then (the sandbox's `shell`: SIGINT, then SIGKILL
    /// after a grace period) and returns what it had. The default ignores `interrupt` and
    /// runs the call to its end; the engine waits for it a bounded time after an interrupt
    /// (docs/termination.md).
    async fn execute_until(
        &self,
        call: &ToolCall,
        interrupt: Interrupt<'_>,
    ) -> Result<ToolOutput, ToolError> {
        drop(interrupt);
        self.execute(call).await
    }

    /// Whether `call` can change the workspace. The engine takes no snapshot after a turn
    /// whose calls all say no (docs/checkpoints.md): only a tool that only reads (a file, a
    /// listing, a search, the network) should say no. The default says yes, so a tool that
    /// does not say is never skipped.
    fn may_change_workspace(&self, call: &ToolCall) -> bool {
        let _ = call;
        true
    }

    /// Reads a workspace text file as the sandbox sees it (confined to the workspace like
    /// `read_file`: no symlink followed out of it), for the engine's own use (project
    /// instructions), not as the agent's tool call: no event, no kill point. `None` when
    /// there is no such readable text file. The default has no files.
    async fn read_text(&self, path: &str) -> Option<String> {
        let _ = path;
        None
    }
}

/// Runs the user's hooks at a point of the execution (on the host, the runtime's). Each
/// configured hook that applies runs in order with `input` as JSON on its stdin; what each
/// run did is returned for the log. A hook that blocks stops the ones after it.
#[async_trait]
pub trait Hooks: Send + Sync {
    /// Whether any hook is configured at `point` (nothing is built for a point without).
    fn any(&self, point: crate::event::HookPoint) -> bool;

    async fn run(
        &self,
        point: crate::event::HookPoint,
        tool: Option<&str>,
        input: &serde_json::Value,
    ) -> Vec<HookOutcome>;
}

/// One hook's run, as the engine records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookOutcome {
    pub command: Vec<String>,
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub verdict: crate::event::HookVerdict,
    pub stderr: String,
    pub duration_ms: u64,
}

/// The workspace's snapshot store failed (a full disk, an unreadable file, a store removed).
/// Not fatal for the execution: the run goes on without that snapshot, and the next
/// boundary tries again; `nerve diff` then shows the turns together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("workspace snapshot: {0}")]
pub struct WorkspaceError(pub String);

/// Snapshots of the execution's workspace, taken at turn boundaries (docs/checkpoints.md).
/// `cli` implements it with the shadow store of `nerve_hands::checkpoint` (git's format,
/// written in process), off the async runtime; engines without one take no snapshots.
#[async_trait]
pub trait WorkspaceSnapshots: Send + Sync {
    /// Records the workspace as it is now and returns its tree hash. Costs what changed
    /// since the last snapshot (plus an `lstat` per file); starts no process.
    async fn snapshot(&self) -> Result<String, WorkspaceError>;

    /// The paths that differ from tree `from` to tree `to`, sorted by path.
    async fn changes(
        &self,
        from: &str,
        to: &str,
    ) -> Result<Vec<crate::event::WorkspaceChange>, WorkspaceError>;
}

/// A block of archived context: messages taken out of the conversation by a compaction,
/// kept beside the log so that the agent can `recall` them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchivedBlock {
    pub id: crate::id::BlockId,
    pub messages: Vec<crate::message::Message>,
    /// What the block holds, in a line (`3 tool outputs masked at turn 12`).
    pub note: String,
}

/// One search result of [`ContextArchive::search`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecallHit {
    pub id: crate::id::BlockId,
    pub note: String,
    /// The matching text, shortened.
    pub snippet: String,
}

/// Where compaction puts what it takes out of the conversation. Failures are
/// [`SinkError`]s: the archive lives beside the event log.
#[async_trait]
pub trait ContextArchive: Send + Sync {
    async fn archive(&self, execution: ExecutionId, block: ArchivedBlock) -> Result<(), SinkError>;
    /// Archives `blocks` (in order), as [`Self::archive`] does each: one compaction archives
    /// one block per output or message it takes out (over a thousand on a long
    /// conversation), so a store that can write them together should. The default archives
    /// them one by one.
    async fn archive_many(
        &self,
        execution: ExecutionId,
        blocks: Vec<ArchivedBlock>,
    ) -> Result<(), SinkError> {
        for block in blocks {
            self.archive(execution, block).await?;
        }
        Ok(())
    }
    async fn fetch(
        &self,
        execution: ExecutionId,
        id: crate::id::BlockId,
    ) -> Result<Option<ArchivedBlock>, SinkError>;
    /// Blocks of `execution` matching `query` (plain words; never a query language).
    async fn search(
        &self,
        execution: ExecutionId,
        query: &str,
        limit: usize,
    ) -> Result<Vec<RecallHit>, SinkError>;
}

/// A shared sink is a sink: wrappers (progress display) can hold an `Arc` of the log.
#[async_trait]
impl<T: EventSink + ?Sized> EventSink for std::sync::Arc<T> {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        (**self).append(execution, event).await
    }

    async fn checkpoint(
        &self,
        execution: ExecutionId,
        turn: u32,
        snapshot: serde_json::Value,
    ) -> Result<Option<u64>, SinkError> {
        (**self).checkpoint(execution, turn, snapshot).await
    }

    async fn commit(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Result<Option<u64>, SinkError> {
        (**self).commit(execution, events, checkpoint).await
    }

    fn enqueue(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        (**self).enqueue(execution, events, checkpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::ToolDefinition;

    fn check(parameters: serde_json::Value, expected: &str) {
        let tool = ToolDefinition {
            name: "t".into(),
            description: String::new(),
            parameters,
        };
        assert_eq!(tool.signature(), expected);
    }

    #[test]
    fn signatures_name_every_argument_and_mark_the_optional_ones() {
        check(
            serde_json::json!({"type": "object", "required": ["command"], "properties": {
                "command": {"type": "string"},
                "timeout_secs": {"type": ["integer", "null"], "format": "uint64"},
                "steps": {"type": "array", "items": {"type": "string"}},
                "strategy": {"anyOf": [{"enum": ["summarize", "archive"]}, {"type": "null"}]},
            }}),
            r#"t {command: string, timeout_secs?: integer, steps?: array of string, strategy?: "summarize" | "archive"}"#,
        );
        check(serde_json::json!({"type": "object"}), "t {}");
        check(serde_json::Value::Null, "t {}");
    }
}
