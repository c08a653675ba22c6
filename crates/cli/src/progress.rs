//! Progress lines as events pass on their way to the log: the display can never disagree
//! with what was recorded, because it is drawn from the same events.

use async_trait::async_trait;
use nerve_core::{Event, EventSink, ExecutionId, SinkError};

use crate::output;

/// Wraps the log's sink and prints a line for the events a watching user cares about.
#[derive(Debug)]
pub(crate) struct ProgressSink<S> {
    inner: S,
    enabled: bool,
}

impl<S> ProgressSink<S> {
    pub(crate) fn new(inner: S, enabled: bool) -> Self {
        Self { inner, enabled }
    }
}

fn describe(event: &Event) -> Option<String> {
    match event {
        Event::ToolCallStarted(started) => {
            let mut args = started.call.arguments.to_string();
            if args.len() > 120 {
                let cut = (0..=117)
                    .rev()
                    .find(|&i| args.is_char_boundary(i))
                    .unwrap_or(0);
                args.truncate(cut);
                args.push_str("...");
            }
            Some(format!(
                "  turn {} -> {} {args}",
                started.turn, started.call.name
            ))
        }
        Event::ToolCallFinished(finished) if finished.result.is_error => Some(format!(
            "  turn {} <- {} failed",
            finished.turn, finished.result.name
        )),
        Event::TurnCompleted(turn) => Some(format!(
            "turn {}: {} in / {} out tokens, {} ({})",
            turn.turn, turn.usage.input_tokens, turn.usage.output_tokens, turn.cost, turn.finish
        )),
        Event::Retry(retry) => Some(format!(
            "  retry {} after {}: waiting {} ms",
            retry.attempt, retry.error, retry.delay_ms
        )),
        Event::Started(_)
        | Event::ContextCreated(_)
        | Event::MessageAppended(_)
        | Event::ToolCallFinished(_)
        | Event::ModelCalled(_)
        | Event::TaskTransition(_)
        | Event::Finish(_)
        | Event::Compaction(_)
        | Event::Stagnation(_)
        | Event::ApprovalRequested(_)
        | Event::ApprovalDecided(_)
        | Event::ProxyDecision(_)
        | Event::Checkpoint(_)
        | Event::Resumed(_) => None,
    }
}

#[async_trait]
impl<S: EventSink> EventSink for ProgressSink<S> {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        let line = if self.enabled { describe(&event) } else { None };
        let seq = self.inner.append(execution, event).await?;
        if let Some(line) = line {
            output::error_line(&line);
        }
        Ok(seq)
    }
}
