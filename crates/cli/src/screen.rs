//! What `nerve` hears of an execution (the runtime's [`Observer`]): events and deltas
//! drawn as the transcript ([`Display`]) or printed as `--jsonl` lines, the runtime's
//! notices as lines on stderr, and `ask` approvals put to the person at the terminal
//! (`chat`) or left to park the execution (`run`).

use std::sync::Arc;

use async_trait::async_trait;
use nerve_brain::Delta;
use nerve_brain::guards::approval::{Approval, Approver};
use nerve_core::event::CallPurpose;
use nerve_core::{Event, ExecutionId, ToolCall};
use nerve_runtime::observer::{Notice, Observer};
use nerve_runtime::views::jsonl::Jsonl;

use crate::output;
use crate::progress::{Display, Mode};

/// The terminal's side of an execution.
pub(crate) struct Screen {
    pub(crate) display: Arc<Display>,
    /// `--jsonl`: events and deltas as JSON lines (the display is silent then).
    pub(crate) jsonl: Option<Arc<Jsonl>>,
    /// Who answers `ask` rules; `None`: nobody, the execution parks.
    pub(crate) approver: Option<Arc<dyn Approver>>,
    /// Child executions (a `delegate` call's) seen so far: their events are not drawn as
    /// the execution's own; the parent's call and result lines say what they did.
    pub(crate) children: nerve_runtime::observer::Children,
}

#[async_trait]
impl Observer for Screen {
    fn events(&self, execution: ExecutionId, events: &[Event]) {
        if let Some(jsonl) = &self.jsonl {
            for line in jsonl.event_lines(execution, events) {
                output::line(&line);
            }
        }
        if self.children.of_child(execution, events) {
            return;
        }
        for event in events {
            self.display.observe(event);
        }
    }

    fn delta(&self, execution: ExecutionId, purpose: CallPurpose, delta: &Delta) {
        match &self.jsonl {
            Some(jsonl) => {
                for line in jsonl.delta_lines(execution, purpose, delta) {
                    output::line(&line);
                }
            }
            None => self.display.delta(purpose, delta),
        }
    }

    fn notice(&self, notice: Notice) {
        // `--json` and `--jsonl` keep stderr for errors.
        if self.display.mode() == Mode::Silent {
            // The warnings go to the stderr log, as an unattended execution's do.
            nerve_runtime::observer::Unobserved.notice(notice);
            return;
        }
        let line = match notice {
            Notice::BuildingDefaultImage { image } => {
                format!("building the sandbox image {image} (once)")
            }
            Notice::BuildingImage { dockerfile } => format!(
                "building the sandbox image from {} (once per change)",
                dockerfile.display()
            ),
            Notice::BuildOutput(line) => format!("build: {line}"),
            Notice::McpWarning(warning) => format!("warning: {warning}"),
            Notice::McpNoTools { server, error } => {
                format!("warning: MCP server `{server}` offers no tools: {error}")
            }
            Notice::NoSnapshots { reason } => {
                format!("warning: no workspace snapshots for this run: {reason}")
            }
            Notice::SkillSkipped { path, reason } => {
                format!("warning: skill {} skipped: {reason}", path.display())
            }
        };
        output::error_line(&line);
    }

    async fn approve(&self, call: &ToolCall, rule: &str) -> Option<Approval> {
        match &self.approver {
            Some(approver) => approver.decide(call, rule).await,
            None => None,
        }
    }
}
