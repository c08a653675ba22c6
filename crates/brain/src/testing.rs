//! In-memory fakes of the core ports, for the loops' unit tests.

use std::sync::Mutex;

use async_trait::async_trait;
use nerve_core::{
    Enqueued, Event, EventSink, ExecutionId, SinkError, Snapshot, ToolCall, ToolDefinition,
    ToolError, ToolExecutor, ToolOutput,
};

/// Records every event in memory, and the kinds of each commit.
#[derive(Debug, Default)]
pub(crate) struct MemorySink {
    pub(crate) events: Mutex<Vec<Event>>,
    pub(crate) commits: Mutex<Vec<Vec<&'static str>>>,
    /// The commit (counted from 0) that fails, as a full disk would.
    pub(crate) fail_commit: Option<usize>,
}

impl MemorySink {
    pub(crate) fn kinds(&self) -> Vec<&'static str> {
        self.events
            .lock()
            .unwrap()
            .iter()
            .map(|e| e.kind().as_str())
            .collect()
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// The results of the tool calls, in order, as the events recorded them.
    pub(crate) fn tool_results(&self) -> Vec<nerve_core::ToolResult> {
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
        let mut events = self.events.lock().unwrap();
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
        let mut commits = self.commits.lock().unwrap();
        if self.fail_commit == Some(commits.len()) {
            commits.push(Vec::new());
            return Err(SinkError::Write("disk full".into()));
        }
        commits.push(events.iter().map(|e| e.kind().as_str()).collect());
        self.events.lock().unwrap().extend(events);
        Ok(None)
    }
}

/// A tool executor whose every call echoes its arguments; `fail` makes calls error results.
/// A call with `{"lines": N}` answers N numbered lines instead (large outputs), one with
/// `{"freeze": N}` N pinned packages like `pip freeze`, `orjson==3.9.104` among them (a
/// fact its arguments do not state).
#[derive(Debug, Default)]
pub(crate) struct EchoTools {
    pub(crate) fail: bool,
    pub(crate) calls: Mutex<Vec<ToolCall>>,
}

/// `lines` numbered lines mentioning `fact` once in the middle.
pub(crate) fn big_output(lines: u64, fact: &str) -> String {
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
        self.calls.lock().unwrap().push(call.clone());
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

/// `PROPTEST_CASES` when set (the fuzz passes set it), else `default`: for properties whose
/// cases are whole runs, too slow for proptest's 256 in an ordinary `cargo test`.
pub(crate) fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(default)
}
