//! Replay: a pure function from an execution's stored events to the rebuilt execution, with
//! a completeness score and the gaps that explain what is missing.

use std::collections::{BTreeMap, BTreeSet};

use nerve_core::event::{CallPurpose, Started};
use nerve_core::{Event, Message, MicroUsd, TaskStatus, TerminationReason, TokenUsage, ToolCall};
use serde::Serialize;

use crate::store::{StoredEvent, verify_chain};

/// Completeness weights in hundredths; integer arithmetic so scores compare exactly.
const W_STARTED: u32 = 15;
const W_CONTEXT: u32 = 10;
const W_VALID_TURN: u32 = 20;
const W_CONTIGUOUS: u32 = 25;
const W_COST: u32 = 15;
const W_TRANSITION: u32 = 15;
/// A replay at or above this score (hundredths) counts as complete.
pub const COMPLETE_AT: u32 = 85;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GapKind {
    /// A tool call was started but never finished: its side effect is in doubt.
    ToolCallInDoubt,
    /// A turn began (model called or tool started) but never completed.
    TurnIncomplete,
    /// The execution has no finish event: it crashed or is still running.
    NoFinish,
    /// The hash chain does not verify.
    BrokenChain,
    /// Sequence numbers skip.
    SequenceGap,
    /// Turns are not numbered 1, 2, 3, ...
    TurnsNotContiguous,
}

/// Something the log does not say, and why it matters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gap {
    pub kind: GapKind,
    pub detail: String,
}

/// An execution rebuilt from its log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Replay {
    pub execution_id: String,
    /// Completeness in hundredths (0..=100).
    pub score: u32,
    pub complete: bool,
    pub started: Option<Started>,
    pub context_created: bool,
    pub messages: Vec<Message>,
    /// Distinct valid turns recorded.
    pub total_turns: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    pub task_status: Option<TaskStatus>,
    pub termination_reason: Option<TerminationReason>,
    pub error: Option<String>,
    /// Tool calls started but never finished, in order.
    pub in_doubt: Vec<ToolCall>,
    /// Model calls answered or failed, per purpose: where a resumed scripted run continues.
    pub model_calls: BTreeMap<String, u64>,
    pub gaps: Vec<Gap>,
    pub malformed_events: u32,
    pub duplicate_turns: u32,
    pub events: u64,
}

impl Replay {
    /// Completeness as a fraction in `0.0..=1.0`.
    pub fn completeness(&self) -> f64 {
        f64::from(self.score) / 100.0
    }
}

/// Rebuilds an execution from `events` (in sequence order). Never panics: malformed and
/// duplicate events are skipped and counted.
pub fn replay(execution_id: &str, events: &[StoredEvent]) -> Replay {
    let mut out = Replay {
        execution_id: execution_id.to_owned(),
        score: 0,
        complete: false,
        started: None,
        context_created: false,
        messages: Vec::new(),
        total_turns: 0,
        usage: TokenUsage::default(),
        cost: MicroUsd::ZERO,
        task_status: None,
        termination_reason: None,
        error: None,
        in_doubt: Vec::new(),
        model_calls: BTreeMap::new(),
        gaps: Vec::new(),
        malformed_events: 0,
        duplicate_turns: 0,
        events: events.len() as u64,
    };
    let mut turns = BTreeSet::new();
    let mut highest_begun = 0u32;
    let mut cost_recorded = false;
    let mut transitioned = false;
    let mut finished = false;
    let mut open_calls: Vec<(u32, ToolCall)> = Vec::new();

    for stored in events {
        let event: Event = match serde_json::from_str(&stored.payload) {
            Ok(event) => event,
            Err(_) => {
                out.malformed_events += 1;
                continue;
            }
        };
        if event.kind().as_str() != stored.kind {
            out.malformed_events += 1;
            continue;
        }
        match event {
            Event::Started(started) => {
                if out.started.is_none() {
                    out.started = Some(started);
                }
            }
            Event::ContextCreated(_) => out.context_created = true,
            Event::MessageAppended(appended) => {
                let index = appended.index as usize;
                if index == out.messages.len() {
                    out.messages.push(appended.message);
                } else if index < out.messages.len() {
                    out.messages[index] = appended.message;
                } else {
                    out.malformed_events += 1;
                }
            }
            Event::ModelCalled(called) => {
                highest_begun = highest_begun.max(called.turn);
                let purpose = match called.purpose {
                    CallPurpose::Agent => "agent",
                    CallPurpose::Plan => "plan",
                    CallPurpose::Summary => "summary",
                };
                *out.model_calls.entry(purpose.to_owned()).or_default() += 1;
            }
            Event::ToolCallStarted(started) => {
                highest_begun = highest_begun.max(started.turn);
                open_calls.push((started.turn, started.call));
            }
            Event::ToolCallFinished(finished_call) => {
                open_calls.retain(|(_, call)| call.id != finished_call.result.call_id);
            }
            Event::TurnCompleted(turn) => {
                if turn.turn == 0 {
                    out.malformed_events += 1;
                } else if !turns.insert(turn.turn) {
                    out.duplicate_turns += 1;
                } else {
                    out.usage += turn.usage;
                    out.cost += turn.cost;
                    cost_recorded = true;
                }
            }
            Event::TaskTransition(transition) => {
                transitioned = true;
                out.task_status = Some(transition.to);
            }
            Event::Retry(_) => {}
            Event::Finish(finish) => {
                finished = true;
                out.termination_reason = Some(finish.termination_reason);
                out.task_status = Some(finish.task_status);
                out.error = finish.error;
                cost_recorded = true;
            }
        }
    }

    out.total_turns = u32::try_from(turns.len()).unwrap_or(u32::MAX);
    let contiguous = !turns.is_empty() && turns.iter().copied().eq(1..=out.total_turns);
    let highest_completed = turns.last().copied().unwrap_or(0);

    let mut score = 0;
    for (present, weight) in [
        (out.started.is_some(), W_STARTED),
        (out.context_created, W_CONTEXT),
        (!turns.is_empty(), W_VALID_TURN),
        (contiguous, W_CONTIGUOUS),
        (cost_recorded, W_COST),
        (transitioned, W_TRANSITION),
    ] {
        if present {
            score += weight;
        }
    }
    out.score = score.min(100);
    out.complete = out.score >= COMPLETE_AT;

    if let Err(broken) = verify_chain(events) {
        let kind = if broken.reason.starts_with("sequence") { GapKind::SequenceGap } else { GapKind::BrokenChain };
        out.gaps.push(Gap { kind, detail: broken.to_string() });
    }
    if !turns.is_empty() && !contiguous {
        out.gaps.push(Gap {
            kind: GapKind::TurnsNotContiguous,
            detail: format!("recorded turns are {turns:?}, not 1..={}", out.total_turns),
        });
    }
    for (turn, call) in &open_calls {
        out.gaps.push(Gap {
            kind: GapKind::ToolCallInDoubt,
            detail: format!(
                "turn {turn}: tool call {} ({}) started but never finished; its side effect is in doubt",
                call.id, call.name
            ),
        });
    }
    out.in_doubt = open_calls.into_iter().map(|(_, call)| call).collect();
    if highest_begun > highest_completed {
        out.gaps.push(Gap {
            kind: GapKind::TurnIncomplete,
            detail: format!("turn {highest_begun} began but never completed"),
        });
    }
    if !finished {
        out.gaps.push(Gap {
            kind: GapKind::NoFinish,
            detail: "no finish event: the execution crashed, was killed, or is still running".into(),
        });
    }
    out
}
