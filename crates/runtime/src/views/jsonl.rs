//! The JSON Lines view of an execution (`nerve run --jsonl`, `nerve resume --jsonl`): one
//! JSON object per line as things happen, for scripts and editors (what `codex exec --json`
//! and `claude -p --output-format stream-json` are for theirs). The schema is in
//! docs/cli.md; this makes the lines, a front end writes them.
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
//! A front end writes each line with one `write` (the CLI: under the stdout lock), so lines
//! never interleave.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use nerve_brain::Delta;
use nerve_core::event::CallPurpose;
use nerve_core::{Event, ExecutionId, Redactor, StreamRedaction};
use serde_json::{Value, json};

use crate::log::redacted_json;

/// The JSON lines of one run's events and deltas, redacted.
#[derive(Debug)]
pub struct Jsonl {
    redactor: Arc<Redactor>,
    /// Streamed text held back because it may be the start of a secret that the next delta
    /// completes: a secret split across deltas is redacted whole.
    held: Mutex<Held>,
}

/// The streams of the answer being written, each redacted as one text.
#[derive(Debug, Default)]
struct Held {
    /// Whose answer it is, for the lines that flush what is held.
    call: Option<(ExecutionId, CallPurpose)>,
    text: StreamRedaction,
    thinking: StreamRedaction,
    arguments: BTreeMap<usize, StreamRedaction>,
}

impl Jsonl {
    pub fn new(redactor: Arc<Redactor>) -> Self {
        Self {
            redactor,
            held: Mutex::new(Held::default()),
        }
    }

    /// The lines of one delta: what can be shown of it now (nothing while it may still be
    /// part of a secret).
    pub fn delta_lines(
        &self,
        execution: ExecutionId,
        purpose: CallPurpose,
        delta: &Delta,
    ) -> Vec<String> {
        let mut held = self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut lines = Vec::new();
        if held.call.is_some_and(|call| call != (execution, purpose)) {
            lines.extend(self.flush_held(&mut held));
        }
        held.call = Some((execution, purpose));
        let shown = match delta {
            Delta::Text(text) => Delta::Text(held.text.push(&self.redactor, text)),
            Delta::Thinking(text) => Delta::Thinking(held.thinking.push(&self.redactor, text)),
            Delta::ToolCallStart { .. } => delta.clone(),
            Delta::ToolCallArguments { index, fragment } => Delta::ToolCallArguments {
                index: *index,
                fragment: held
                    .arguments
                    .entry(*index)
                    .or_default()
                    .push(&self.redactor, fragment),
            },
        };
        if !is_empty(&shown) {
            lines.push(self.delta_line(execution, purpose, &shown));
        }
        lines
    }

    /// The lines that show what is held back: the answer has ended (an event follows).
    fn flush_held(&self, held: &mut Held) -> Vec<String> {
        let Some((execution, purpose)) = held.call.take() else {
            return Vec::new();
        };
        let mut deltas = vec![
            Delta::Thinking(held.thinking.finish(&self.redactor)),
            Delta::Text(held.text.finish(&self.redactor)),
        ];
        deltas.extend(std::mem::take(&mut held.arguments).into_iter().map(
            |(index, mut stream)| Delta::ToolCallArguments {
                index,
                fragment: stream.finish(&self.redactor),
            },
        ));
        deltas
            .iter()
            .filter(|delta| !is_empty(delta))
            .map(|delta| self.delta_line(execution, purpose, delta))
            .collect()
    }

    /// The line of one event.
    pub fn event_line(&self, execution: ExecutionId, event: &Event) -> String {
        let payload = redacted_json(event, &self.redactor)
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
    pub fn delta_line(
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
        redacted_json(&line, &self.redactor).unwrap_or_default()
    }

    /// The lines of events on their way to the log: first whatever streamed text was held
    /// back (the answer has ended), then one line per event.
    pub fn event_lines<'a>(
        &self,
        execution: ExecutionId,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Vec<String> {
        let mut lines = {
            let mut held = self
                .held
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.flush_held(&mut held)
        };
        lines.extend(
            events
                .into_iter()
                .map(|event| self.event_line(execution, event)),
        );
        lines
    }
}

/// A delta that adds nothing.
fn is_empty(delta: &Delta) -> bool {
    match delta {
        Delta::Text(text) | Delta::Thinking(text) => text.is_empty(),
        Delta::ToolCallArguments { fragment, .. } => fragment.is_empty(),
        Delta::ToolCallStart { .. } => false,
    }
}

/// The summary object (`--json`'s fields) as the last line of a `--jsonl` run.
pub fn summary_line(summary: &Value) -> Value {
    let mut line = json!({"type": "summary"});
    if let (Some(line), Some(fields)) = (line.as_object_mut(), summary.as_object()) {
        line.extend(fields.clone());
    }
    line
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
                outcome: nerve_core::event::CallOutcome::Ok,
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

    #[test]
    fn a_key_streamed_across_deltas_never_reaches_a_line_whole_or_in_part() {
        let id = execution();
        // Every way of cutting the answer into three deltas.
        let answer = format!("here it is: {KEY} and more text");
        for first in 0..answer.len() {
            for second in first..answer.len() {
                if !answer.is_char_boundary(first) || !answer.is_char_boundary(second) {
                    continue;
                }
                let jsonl = jsonl();
                let mut lines = Vec::new();
                for piece in [&answer[..first], &answer[first..second], &answer[second..]] {
                    lines.extend(jsonl.delta_lines(
                        id,
                        CallPurpose::Agent,
                        &Delta::Text(piece.into()),
                    ));
                }
                let mut held = jsonl.held.lock().unwrap();
                lines.extend(jsonl.flush_held(&mut held));
                let shown: String = lines
                    .iter()
                    .map(|line| check(line)["text"].as_str().unwrap().to_owned())
                    .collect();
                assert_eq!(shown, "here it is: [REDACTED:OPENAI_API_KEY] and more text");
                // No line carries a piece of the key long enough to matter.
                for line in &lines {
                    assert!(!line.contains(&KEY[..12]), "{line}");
                }
            }
        }
    }
}
