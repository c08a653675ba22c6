//! In-memory fakes of the ports, published once for every crate's tests, benches and
//! xtask (the `testing` feature; a dev-dependency turns it on, and no library or front
//! end asks for it): an event sink that keeps what it is given ([`MemorySink`]) or drops it
//! ([`DiscardSink`]), and tool executors that echo their arguments ([`EchoTools`]) or
//! answer every call the same ([`CannedTools`]). A fake of another shape (one that fails
//! on cue, times what passes through) stays beside the test that needs it.

use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use crate::{
    Enqueued, Event, EventSink, ExecutionId, SinkError, Snapshot, ToolCall, ToolDefinition,
    ToolError, ToolExecutor, ToolOutput, ToolResult,
};

/// A lock that a panicking test left poisoned still holds the data the next check reads.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records every event in memory, and the kinds of each commit.
#[derive(Debug, Default)]
pub struct MemorySink {
    pub events: Mutex<Vec<Event>>,
    pub commits: Mutex<Vec<Vec<&'static str>>>,
    /// The commit (counted from 0) that fails, as a full disk would.
    pub fail_commit: Option<usize>,
}

impl MemorySink {
    pub fn kinds(&self) -> Vec<&'static str> {
        lock(&self.events)
            .iter()
            .map(|e| e.kind().as_str())
            .collect()
    }

    pub fn events(&self) -> Vec<Event> {
        lock(&self.events).clone()
    }

    /// The results of the tool calls, in order, as the events recorded them.
    pub fn tool_results(&self) -> Vec<ToolResult> {
        self.events()
            .into_iter()
            .filter_map(|e| {
                if let Event::ToolCallFinished(finished) = e {
                    Some(finished.result)
                } else {
                    None
                }
            })
            .collect()
    }
}

#[async_trait]
impl EventSink for MemorySink {
    async fn append(&self, _execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        let mut events = lock(&self.events);
        events.push(event);
        Ok(events.len() as u64)
    }

    async fn commit(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        _checkpoint: Option<Snapshot>,
    ) -> Result<Option<u64>, SinkError> {
        self.write(execution, events)
    }

    /// In memory a batch is written at once, so it takes its place as the SQLite writer's
    /// queue gives it: when enqueued.
    fn enqueue(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        _checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        Enqueued::Placed(Box::pin(std::future::ready(self.write(execution, events))))
    }
}

impl MemorySink {
    fn write(&self, _execution: ExecutionId, events: Vec<Event>) -> Result<Option<u64>, SinkError> {
        let mut commits = lock(&self.commits);
        if self.fail_commit == Some(commits.len()) {
            commits.push(Vec::new());
            return Err(SinkError::Write("disk full".into()));
        }
        commits.push(events.iter().map(|e| e.kind().as_str()).collect());
        lock(&self.events).extend(events);
        Ok(None)
    }
}

/// Drops every event: for code that must be given a sink and whose events nobody reads.
#[derive(Debug, Default, Clone, Copy)]
pub struct DiscardSink;

#[async_trait]
impl EventSink for DiscardSink {
    async fn append(&self, _execution: ExecutionId, _event: Event) -> Result<u64, SinkError> {
        Ok(0)
    }
}

/// A tool executor that offers `definitions` and answers every call with `output`.
#[derive(Debug, Default, Clone)]
pub struct CannedTools {
    pub definitions: Vec<ToolDefinition>,
    pub output: String,
}

impl CannedTools {
    /// One tool, `name`, whose every call answers `output`.
    pub fn one(name: &str, output: impl Into<String>) -> Self {
        Self {
            definitions: vec![ToolDefinition {
                name: name.to_owned(),
                description: name.to_owned(),
                parameters: serde_json::json!({"type": "object"}),
            }],
            output: output.into(),
        }
    }
}

#[async_trait]
impl ToolExecutor for CannedTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        self.definitions.clone()
    }

    async fn execute(&self, _call: &ToolCall) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::ok(self.output.clone()))
    }
}

/// A tool executor whose every call echoes its arguments; `fail` makes calls error results.
/// A call with `{"lines": N}` answers N numbered lines instead (large outputs), one with
/// `{"freeze": N}` N pinned packages like `pip freeze`, `orjson==3.9.104` among them (a
/// fact its arguments do not state).
#[derive(Debug, Default)]
pub struct EchoTools {
    pub fail: bool,
    pub calls: Mutex<Vec<ToolCall>>,
}

/// `lines` numbered lines mentioning `fact` once in the middle.
pub fn big_output(lines: u64, fact: &str) -> String {
    (0..lines)
        .map(|i| {
            if i == lines / 2 {
                format!("line {i}: {fact}")
            } else {
                format!("line {i}: nothing to see here, carry on")
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[async_trait]
impl ToolExecutor for EchoTools {
    fn definitions(&self) -> Vec<ToolDefinition> {
        vec![ToolDefinition {
            name: "shell".into(),
            description: "echo".into(),
            parameters: serde_json::json!({"type": "object"}),
        }]
    }

    async fn execute(&self, call: &ToolCall) -> Result<ToolOutput, ToolError> {
        lock(&self.calls).push(call.clone());
        if let Some(n) = call
            .arguments
            .get("freeze")
            .and_then(serde_json::Value::as_u64)
        {
            // Each package its own name, as in a real environment, and versions that vary
            // in every part: nothing but its name sets the fact's line apart.
            let name = |i: u64| -> String {
                let letter = |n: u64| char::from(b'a' + u8::try_from(n % 26).unwrap_or(0));
                format!("py{}{}{}", letter(i / 676), letter(i / 26), letter(i))
            };
            let text = (0..n)
                .map(|i| {
                    if i == n / 2 {
                        "orjson==3.9.104".to_owned()
                    } else {
                        format!("{}=={}.{}.{}", name(i), i % 7, i, i * 37 % 211)
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            return Ok(ToolOutput::ok(text));
        }
        let text = match call
            .arguments
            .get("lines")
            .and_then(serde_json::Value::as_u64)
        {
            Some(lines) => big_output(
                lines,
                call.arguments
                    .get("fact")
                    .and_then(|f| f.as_str())
                    .unwrap_or(""),
            ),
            None => call.arguments.to_string(),
        };
        Ok(if self.fail {
            ToolOutput::error(text)
        } else {
            ToolOutput::ok(text)
        })
    }
}
