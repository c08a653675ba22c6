//! Progress as events pass on their way to the log: the display can never disagree with
//! what was recorded, because it is drawn from the same events. On a terminal, a live
//! status line (turn, tokens, cost, context fill, the tool in flight, compactions) with the
//! notable events printed above it; otherwise plain lines; with `--json`, nothing.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nerve_core::event::{ProxyVerdict, StagnationAction};
use nerve_core::{
    Enqueued, Event, EventSink, ExecutionId, MicroUsd, SinkError, Snapshot, TokenUsage,
};

use crate::output;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Quiet,
    Plain,
    Live,
}

impl Mode {
    /// Live on a terminal, plain lines otherwise, quiet for `--json`.
    pub(crate) fn detect(json: bool) -> Self {
        use std::io::IsTerminal;
        if json {
            Self::Quiet
        } else if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
            Self::Live
        } else {
            Self::Plain
        }
    }
}

#[derive(Debug, Default)]
struct Status {
    turn: u32,
    usage: TokenUsage,
    cost: MicroUsd,
    last_input: u64,
    tool: Option<String>,
    compactions: u32,
}

/// Wraps the log's sink and shows progress.
#[derive(Debug)]
pub(crate) struct ProgressSink<S> {
    inner: S,
    mode: Mode,
    context_window: Option<u64>,
    bar: Option<ProgressBar>,
    status: Mutex<Status>,
}

impl<S> ProgressSink<S> {
    pub(crate) fn new(inner: S, mode: Mode, context_window: Option<u64>) -> Self {
        let bar = (mode == Mode::Live).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Self {
            inner,
            mode,
            context_window,
            bar,
            status: Mutex::new(Status::default()),
        }
    }

    /// Clears the live line before the result is printed.
    pub(crate) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    fn status_line(&self, status: &Status) -> String {
        let fill = match self.context_window {
            Some(window) if window > 0 => {
                format!(" · context {}%", status.last_input * 100 / window)
            }
            Some(_) | None => String::new(),
        };
        let tool = status
            .tool
            .as_deref()
            .map(|t| format!(" · running {t}"))
            .unwrap_or_default();
        format!(
            "turn {} · {} in / {} out tokens · {}{fill} · {} compactions{tool}",
            status.turn,
            status.usage.input_tokens,
            status.usage.output_tokens,
            status.cost,
            status.compactions
        )
    }
}

fn shorten(mut text: String, max: usize) -> String {
    if text.len() > max {
        let cut = nerve_core::text::clip(&text, max.saturating_sub(3)).len();
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// The line printed for a notable event.
fn describe(event: &Event) -> Option<String> {
    match event {
        Event::ToolCallStarted(started) => Some(format!(
            "  turn {} -> {} {}",
            started.turn,
            started.call.name,
            shorten(started.call.arguments.to_string(), 120)
        )),
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
        Event::Compaction(compaction) => Some(format!(
            "  compaction ({:?}): {} -> {} tokens",
            compaction.strategy, compaction.tokens_before, compaction.tokens_after
        )),
        Event::Stagnation(stagnation) => Some(match stagnation.action {
            StagnationAction::Corrected => {
                format!("  turn {}: repeating itself; corrected", stagnation.turn)
            }
            StagnationAction::Terminated => format!(
                "  turn {}: still repeating itself; stopping",
                stagnation.turn
            ),
        }),
        Event::ApprovalRequested(request) => Some(format!(
            "  turn {}: {} needs approval ({})",
            request.turn, request.call.name, request.rule
        )),
        Event::ProxyDecision(decision) if decision.decision == ProxyVerdict::Denied => {
            Some(format!(
                "  proxy denied {} {}{}",
                decision.method,
                decision.host,
                decision
                    .reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ))
        }
        Event::Resumed(resumed) => Some(format!(
            "resumed after turn {} (attempt {})",
            resumed.from_turn, resumed.attempt
        )),
        Event::Started(_)
        | Event::ContextCreated(_)
        | Event::MessageAppended(_)
        | Event::ToolCallFinished(_)
        | Event::ModelCalled(_)
        | Event::TaskTransition(_)
        | Event::Finish(_)
        | Event::ApprovalDecided(_)
        | Event::ProxyDecision(_)
        | Event::Checkpoint(_) => None,
    }
}

impl<S> ProgressSink<S> {
    fn observe(&self, event: &Event) {
        if self.mode == Mode::Quiet {
            return;
        }
        let line = describe(event);
        let Some(bar) = &self.bar else {
            if let Some(line) = line {
                output::error_line(&line);
            }
            return;
        };
        let Ok(mut status) = self.status.lock() else {
            return;
        };
        match event {
            Event::ModelCalled(called) => {
                status.turn = status.turn.max(called.turn);
                if called.usage.input_tokens > 0 {
                    status.last_input = called.usage.input_tokens;
                }
            }
            Event::ToolCallStarted(started) => {
                status.tool = Some(shorten(
                    format!("{} {}", started.call.name, started.call.arguments),
                    60,
                ));
            }
            Event::ToolCallFinished(_) => status.tool = None,
            Event::TurnCompleted(turn) => {
                status.turn = turn.turn;
                status.usage += turn.usage;
                status.cost += turn.cost;
            }
            Event::Compaction(_) => status.compactions += 1,
            Event::Started(_)
            | Event::ContextCreated(_)
            | Event::MessageAppended(_)
            | Event::TaskTransition(_)
            | Event::Retry(_)
            | Event::Finish(_)
            | Event::Stagnation(_)
            | Event::ApprovalRequested(_)
            | Event::ApprovalDecided(_)
            | Event::ProxyDecision(_)
            | Event::Checkpoint(_)
            | Event::Resumed(_) => {}
        }
        // On a terminal only the notable lines stay; the turn summary lives in the status.
        if let Some(line) =
            line.filter(|_| !matches!(event, Event::TurnCompleted(_) | Event::ToolCallStarted(_)))
        {
            bar.println(line);
        }
        bar.set_message(self.status_line(&status));
    }
}

#[async_trait]
impl<S: EventSink> EventSink for ProgressSink<S> {
    async fn append(&self, execution: ExecutionId, event: Event) -> Result<u64, SinkError> {
        self.observe(&event);
        self.inner.append(execution, event).await
    }

    async fn checkpoint(
        &self,
        execution: ExecutionId,
        turn: u32,
        snapshot: serde_json::Value,
    ) -> Result<Option<u64>, SinkError> {
        self.inner.checkpoint(execution, turn, snapshot).await
    }

    async fn commit(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Result<Option<u64>, SinkError> {
        for event in &events {
            self.observe(event);
        }
        self.inner.commit(execution, events, checkpoint).await
    }

    fn enqueue(
        &self,
        execution: ExecutionId,
        events: Vec<Event>,
        checkpoint: Option<Snapshot>,
    ) -> Enqueued {
        for event in &events {
            self.observe(event);
        }
        self.inner.enqueue(execution, events, checkpoint)
    }
}

#[cfg(test)]
mod tests {
    use nerve_core::event::TurnCompleted;

    use super::*;

    #[test]
    fn plain_lines_name_what_happened() {
        let turn = Event::TurnCompleted(TurnCompleted {
            turn: 3,
            usage: TokenUsage::new(1200, 40),
            cost: MicroUsd(1500),
            tool_calls: vec!["shell".into()],
            finish: nerve_core::FinishReason::ToolCalls,
            duration_ms: 5,
        });
        assert_eq!(
            describe(&turn).unwrap(),
            "turn 3: 1200 in / 40 out tokens, $0.001500 (tool_calls)"
        );
        assert_eq!(shorten("abcdefghij".into(), 8), "abcde...");
    }
}
