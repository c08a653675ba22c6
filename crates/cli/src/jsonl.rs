//! `nerve run --jsonl` and `nerve resume --jsonl`: one JSON object per line of stdout as
//! things happen, for scripts and editors (what `codex exec --json` and `claude -p
//! --output-format stream-json` are for theirs). The schema is in docs/cli.md.
//!
//! Three types of line, told apart by `type`:
//! - `event`: every event the engine records, as it goes to the log: `kind` and the
//!   `payload` the log stores (redacted by the same redactor, so a secret the log would
//!   scrub never reaches stdout either). Printed when the engine hands the event over,
//!   which is before it is durable.
//! - `delta`: a piece of an answer as the model streams it (text, thinking, a tool call
//!   starting, its arguments growing). Shown, never recorded: the log keeps whole
//!   messages, and the `message_appended` event that follows carries the whole answer.
//! - `summary`: the last line, with the fields `--json` prints.
//!
//! Each line is written with one `write` under the stdout lock, so lines never interleave.

use std::sync::Arc;

use async_trait::async_trait;
use nerve_brain::{Delta, DeltaObserver};
use nerve_core::event::CallPurpose;
use nerve_core::{Enqueued, Event, EventSink, ExecutionId, Redactor, SinkError, Snapshot};
use serde_json::{Value, json};

use crate::output;

/// Prints events and deltas of one run as JSON lines, redacted.
#[derive(Debug)]
pub(crate) struct Jsonl {
    redactor: Arc<Redactor>,
}

impl Jsonl {
    pub(crate) fn new(redactor: Arc<Redactor>) -> Self {
        Self { redactor }
    }

    /// The line of one event.
    pub(crate) fn event_line(&self, execution: ExecutionId, event: &Event) -> String {
        let payload = nerve_session::redacted_json(event, &self.redactor)
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .unwrap_or(Value::Null);
        json!({
            "type": "event",
            "execution_id": execution.to_string(),
            "kind": event.kind().as_str(),
            "payload": payload,
        })
        .to_string()
    }

    /// The line of one delta.
    pub(crate) fn delta_line(
        &self,
        execution: ExecutionId,
        purpose: CallPurpose,
        delta: &Delta,
    ) -> String {
        let mut line = json!({
            "type": "delta",
            "execution_id": execution.to_string(),
            "purpose": purpose,
        });
        let fields = match delta {
            Delta::Text(text) => json!({"kind": "text", "text": text}),
            Delta::Thinking(text) => json!({"kind": "thinking", "text": text}),
            Delta::ToolCallStart { index, id, name } => {
                json!({"kind": "tool_call", "index": index, "id": id, "name": name})
            }
            Delta::ToolCallArguments { index, fragment } => {
                json!({"kind": "tool_call_arguments", "index": index, "fragment": fragment})
            }
        };
        if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), fields) {
            line.extend(fields);
        }
        nerve_session::redacted_json(&line, &self.redactor).unwrap_or_default()
    }

    fn print_events<'a>(
        &self,
        execution: ExecutionId,
        events: impl IntoIterator<Item = &'a Event>,
    ) {
        for event in events {
            output::line(&self.event_line(execution, event));
        }
    }
}

impl DeltaObserver for Jsonl {
    fn delta(&self, execution_id: ExecutionId, purpose: CallPurpose, delta: &Delta) {
        output::line(&self.delta_line(execution_id, purpose, delta));
    }
}

/// The summary object (`--json`'s fields) as the last line of a `--jsonl` run.
pub(crate) fn summary_line(summary: &Value) -> Value {
    let mut line = json!({"type": "summary"});
    if let (Some(line), Some(fields)) = (line.as_object_mut(), summary.as_object()) {
        line.extend(fields.clone());
    }
    line
}

/// Prints every event on its way to `inner` (the log, behind the progress display).
pub(crate) struct JsonlSink {
    jsonl: Arc<Jsonl>,
    inner: Arc<dyn EventSink>,
}

impl JsonlSink {
    pub(crate) fn new(jsonl: Arc<Jsonl>, inner: Arc<dyn EventSink>) -> Self {
        Self { jsonl, inner }
    }
}

#[async_trait]
impl EventSink for JsonlSink {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        self.jsonl.print_events(execution, [&event]);
        self.inner.append(execution, event).await
    }

    async fn checkpoint(
        &self,
        execution: ExecutionId,
        turn: u32,
        snapshot: Value,
    ) -> Result<Option<u64>, SinkError> {
        self.inner.checkpoint(execution, turn, snapshot).await
    }

    async fn commit(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Result<Option<u64>, SinkError> {
        self.jsonl.print_events(execution, &events);
        self.inner.commit(execution, events, checkpoint).await
    }

    fn enqueue(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        self.jsonl.print_events(execution, &events);
        self.inner.enqueue(execution, events, checkpoint)
    }
}

#[cfg(test)]
mod tests {
    use nerve_core::event::ModelCalled;
    use nerve_core::{Message, TokenUsage};
    use secrecy::SecretString;

    use super::*;

    const KEY: &str = "sk-jsonl-test-0123456789abcdef";

    fn jsonl() -> Jsonl {
        let key = SecretString::from(KEY);
        Jsonl::new(Arc::new(
            Redactor::with_secrets([("OPENAI_API_KEY", &key)]).unwrap(),
        ))
    }

    fn execution() -> ExecutionId {
        "0192f0c4-7b1e-7c3a-9f00-4a5b6c7d8e9f".parse().unwrap()
    }

    fn check(line: &str) -> Value {
        assert!(!line.contains('\n'), "one line: {line}");
        assert!(!line.contains(KEY), "redacted: {line}");
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn every_line_type_keeps_its_shape() {
        let jsonl = jsonl();
        let id = execution();
        let deltas = [
            Delta::Text(format!("the key is {KEY}")),
            Delta::Thinking("hmm".into()),
            Delta::ToolCallStart {
                index: 0,
                id: "call_1".into(),
                name: "shell".into(),
            },
            Delta::ToolCallArguments {
                index: 0,
                fragment: "{\"command\": \"ls\"}".into(),
            },
        ];
        let mut lines: Vec<Value> = deltas
            .iter()
            .map(|d| check(&jsonl.delta_line(id, CallPurpose::Agent, d)))
            .collect();
        let events = [
            Event::ModelCalled(ModelCalled {
                turn: 1,
                purpose: CallPurpose::Agent,
                outcome: "ok".into(),
                usage: TokenUsage::new(1200, 40),
                time_to_first_token_ms: Some(210),
                tokens_per_second: Some(41.5),
            }),
            Event::MessageAppended(nerve_core::event::MessageAppended {
                index: 2,
                message: Message::text(
                    nerve_core::MessageRole::Assistant,
                    format!("the key is {KEY}"),
                ),
            }),
        ];
        lines.extend(events.iter().map(|e| check(&jsonl.event_line(id, e))));
        lines.push(summary_line(&json!({
            "execution_id": id.to_string(),
            "termination_reason": "completed",
            "error": null,
        })));
        insta::assert_json_snapshot!("jsonl_lines", lines);
    }
}
