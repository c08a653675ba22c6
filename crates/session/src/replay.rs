//! Replay: a pure function from an execution's stored events to the rebuilt execution, with
//! a completeness score and the gaps that explain what is missing.
//!
//! Torn turns. Each event commits on its own (a tool call's intent must be durable before
//! the tool runs), so a turn spans several commits, and a reader in another process may
//! look at the log between two of them. What it sees is always a committed prefix of each
//! execution: sequence numbers are gap-free, assigned in commit order, and each read is
//! one SQLite snapshot. So the only "torn" state is a turn in progress, and replay treats
//! it as exactly that: a turn without `turn_completed` is not counted (no turn, no tokens,
//! no cost), is reported as [`GapKind::TurnIncomplete`], and its unfinished tool calls as
//! [`GapKind::ToolCallInDoubt`]. Its messages are kept, since they were recorded; a resume
//! continues from them. A crashed run and a live one look the same until the run writes its
//! `finish`; [`GapKind::NoFinish`] says so.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use nerve_core::event::{
    ApprovalDecided, ApprovalRequested, CallOutcome, CallPurpose, Compaction, ContextCreated,
    Finish, InstructionsLoaded, MessageAppended, ModelCalled, ProxyDecision, ProxyVerdict, Resumed,
    Retry, Stagnation, Started, TaskTransition, ToolCallFinished, ToolCallStarted,
    ToolProtocolSwitched, TurnCompleted, WorkspaceRewound, WorkspaceSnapshot,
};
use nerve_core::{
    BlockId, Event, EventKind, Message, MessagePart, MessageRole, MicroUsd, TaskStatus,
    TerminationReason, TokenUsage, ToolCall, ToolCallId, ToolResult,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::chain::StoredEvent;
use crate::chain::{Break, ChainCheck};

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
    /// An approval was requested and never decided, and the execution is not parked
    /// waiting for it.
    ApprovalUndecided,
}

/// Something the log does not say, and why it matters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Gap {
    pub kind: GapKind,
    pub detail: String,
}

/// A tool call waiting for a human decision (`nerve approve`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PendingApproval {
    /// The sequence number of its `approval_requested` event.
    pub seq: u64,
    pub turn: u32,
    pub call: ToolCall,
    pub rule: String,
}

/// A compaction, with where it sits in the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CompactionRecord {
    pub seq: u64,
    pub compaction: Compaction,
}

/// A checkpoint, with where it sits in the log (its id).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CheckpointMark {
    pub seq: u64,
    pub turn: u32,
    pub snapshot_sha256: String,
}

/// A resume, with where it sits in the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResumeMark {
    pub seq: u64,
    pub resumed: Resumed,
}

/// How the auth proxy decided, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProxyTally {
    pub allowed: u32,
    pub denied: u32,
    pub injected: u32,
}

/// The workspace as the log's `workspace_snapshot` and `workspace_rewound` events describe
/// it (docs/checkpoints.md): which tree it was after each turn, and which turns changed it.
/// Empty for logs written before snapshots existed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct WorkspaceHistory {
    /// The first tree recorded, with its turn (0: the workspace as the run found it).
    pub first: Option<(u32, String)>,
    /// The workspace after each turn: that turn's snapshot, or the tree current when the
    /// turn completed when it changed nothing.
    pub after: BTreeMap<u32, String>,
    /// The turns that changed the workspace: the tree before and after each.
    pub changed: BTreeMap<u32, (String, String)>,
    /// The workspace as the log last recorded it (a turn's snapshot, changes found at a
    /// resume, or a rewind).
    pub current: Option<String>,
    /// The tree of the last `workspace_snapshot` (a rewind after it is not one: the run
    /// that goes on finds the rewound workspace changed, and tells the model).
    pub last_snapshot: Option<String>,
    /// The turn whose end state the workspace is in: the last turn completed, or the turn a
    /// rewind restored.
    pub position: u32,
    pub snapshots: u32,
    pub rewinds: u32,
}

impl WorkspaceHistory {
    fn snapshot(&mut self, snapshot: nerve_core::event::WorkspaceSnapshot) {
        self.snapshots += 1;
        self.first
            .get_or_insert_with(|| (snapshot.turn, snapshot.tree.clone()));
        if snapshot.outside.is_empty() {
            if snapshot.turn > 0
                && let Some(before) = &self.current
                && before != &snapshot.tree
            {
                self.changed
                    .entry(snapshot.turn)
                    .or_insert_with(|| (before.clone(), snapshot.tree.clone()));
            }
            self.after.insert(snapshot.turn, snapshot.tree.clone());
            self.position = snapshot.turn;
        }
        self.last_snapshot = Some(snapshot.tree.clone());
        self.current = Some(snapshot.tree);
    }

    fn turn_completed(&mut self, turn: u32) {
        self.position = turn;
        if let Some(current) = &self.current {
            self.after.entry(turn).or_insert_with(|| current.clone());
        }
    }
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
    /// The conversation as the model last saw it (compactions applied).
    pub messages: Vec<Message>,
    /// Distinct valid turns recorded.
    pub total_turns: u32,
    pub usage: TokenUsage,
    pub cost: MicroUsd,
    pub task_status: Option<TaskStatus>,
    /// The latest attempt's; `None` when it never finished (or was resumed and is running).
    pub termination_reason: Option<TerminationReason>,
    pub error: Option<String>,
    /// Tool calls started but never finished nor acknowledged by a resume, in order.
    pub in_doubt: Vec<ToolCall>,
    /// Model calls answered or failed, per purpose: where a resumed scripted run continues.
    pub model_calls: BTreeMap<String, u64>,
    pub retries: u32,
    /// Approvals requested and not decided yet, in order.
    pub pending_approvals: Vec<PendingApproval>,
    pub approvals_decided: u32,
    pub compactions: Vec<CompactionRecord>,
    pub stagnation: Vec<Stagnation>,
    /// The last switch of the tool protocol (`tool_protocol = "auto"` moving to calls
    /// written as text), if any.
    pub tool_protocol: Option<ToolProtocolSwitched>,
    /// The project instructions the model was given, in the order they were loaded.
    pub instructions: Vec<InstructionsLoaded>,
    /// Every run of a user's hook.
    pub hooks: Vec<nerve_core::event::HookRan>,
    /// Every skill the model loaded, in order.
    pub skills: Vec<nerve_core::event::SkillLoaded>,
    /// The child executions its `delegate` calls started, as they ended.
    pub children: Vec<nerve_core::event::ChildEnding>,
    pub proxy: ProxyTally,
    pub checkpoints: Vec<CheckpointMark>,
    /// Every resume of this execution; its length is the number of attempts so far.
    pub resumes: Vec<ResumeMark>,
    pub workspace: WorkspaceHistory,
    pub gaps: Vec<Gap>,
    /// Events skipped because they do not decode, disagree with their `kind` column, come
    /// from a newer payload version, or contradict the conversation (an impossible index).
    pub malformed_events: u32,
    /// `turn_completed` events for a turn already recorded, skipped.
    pub duplicate_turns: u32,
    /// Other events that repeat an earlier one (a second `started`, a tool call started
    /// twice, an approval decided twice), skipped.
    pub duplicate_events: u32,
    pub events: u64,
}

impl Replay {
    /// Completeness as a fraction in `0.0..=1.0`.
    pub fn completeness(&self) -> f64 {
        f64::from(self.score) / 100.0
    }
}

/// Logs at least this long are verified on a second thread while the first decodes: the
/// two halves of replay take about as long as each other, and neither needs the other.
const PARALLEL_FROM: usize = 4096;

/// Rebuilds an execution from `events` (in sequence order). Never panics: malformed and
/// duplicate events are skipped and counted.
pub fn replay(execution_id: &str, events: &[StoredEvent]) -> Replay {
    let verify = || {
        let mut chain = ChainCheck::default();
        events.iter().for_each(|event| chain.push(&event.fields()));
        chain
    };
    let decode = || {
        let mut replayer = Replayer::new(execution_id);
        for event in events {
            replayer.push(
                event.seq,
                EventKind::from_wire(&event.kind),
                event.version,
                &event.payload,
            );
        }
        replayer
    };
    let (chain, replayer) = if events.len() < PARALLEL_FROM {
        (verify(), decode())
    } else {
        std::thread::scope(|scope| {
            match std::thread::Builder::new()
                .name("nerve-replay-chain".into())
                .spawn_scoped(scope, verify)
            {
                Ok(verifying) => {
                    let replayer = decode();
                    let chain = verifying
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    (chain, replayer)
                }
                // No thread to be had: do both here.
                Err(_) => (verify(), decode()),
            }
        })
    };
    replayer.finish(&chain)
}

/// Replay one event at a time, so the store can stream rows into it, and the hash chain
/// can be checked elsewhere at the same time. Pure: it only ever looks at what it is given.
#[derive(Debug)]
pub(crate) struct Replayer {
    out: Replay,
    turns: BTreeSet<u32>,
    highest_begun: u32,
    cost_recorded: bool,
    transitioned: bool,
    finished: bool,
    open_calls: Vec<(u32, ToolCall)>,
    decided: HashSet<ToolCallId>,
}

impl Replayer {
    pub(crate) fn new(execution_id: &str) -> Self {
        Self {
            out: Replay {
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
                retries: 0,
                pending_approvals: Vec::new(),
                approvals_decided: 0,
                compactions: Vec::new(),
                stagnation: Vec::new(),
                tool_protocol: None,
                instructions: Vec::new(),
                skills: Vec::new(),
                children: Vec::new(),
                hooks: Vec::new(),
                proxy: ProxyTally::default(),
                checkpoints: Vec::new(),
                resumes: Vec::new(),
                workspace: WorkspaceHistory::default(),
                gaps: Vec::new(),
                malformed_events: 0,
                duplicate_turns: 0,
                duplicate_events: 0,
                events: 0,
            },
            turns: BTreeSet::new(),
            highest_begun: 0,
            cost_recorded: false,
            transitioned: false,
            finished: false,
            open_calls: Vec::new(),
            decided: HashSet::new(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.out.events == 0
    }

    /// One stored event: its sequence number, its `kind` column (`None` for a kind this
    /// build does not know), payload version and payload.
    pub(crate) fn push(&mut self, seq: u64, kind: Option<EventKind>, version: u32, payload: &str) {
        self.out.events += 1;
        match kind.and_then(|kind| decode(kind, version, payload)) {
            Some(event) => self.apply(seq, event),
            None => self.out.malformed_events += 1,
        }
    }

    fn apply(&mut self, seq: u64, event: Event) {
        let out = &mut self.out;
        match event {
            Event::Started(started) => {
                if out.started.is_none() {
                    out.started = Some(started);
                } else {
                    out.duplicate_events += 1;
                }
            }
            Event::ContextCreated(_) => out.context_created = true,
            Event::MessageAppended(appended) => {
                self.reopen_after_finish();
                let out = &mut self.out;
                let index = appended.index as usize;
                if index == out.messages.len() {
                    out.messages.push(appended.message);
                } else if let Some(slot) = out.messages.get_mut(index) {
                    *slot = appended.message;
                } else {
                    out.malformed_events += 1;
                }
            }
            Event::ModelCalled(called) => {
                // A call abandoned because the run was stopped begins no turn: the stopped
                // run left none half done.
                if called.outcome != CallOutcome::Cancelled {
                    self.highest_begun = self.highest_begun.max(called.turn);
                }
                let purpose = match called.purpose {
                    CallPurpose::Agent => "agent",
                    CallPurpose::Plan => "plan",
                    CallPurpose::Summary => "summary",
                };
                match out.model_calls.get_mut(purpose) {
                    Some(count) => *count += 1,
                    None => {
                        out.model_calls.insert(purpose.to_owned(), 1);
                    }
                }
            }
            Event::ToolCallStarted(started) => {
                self.highest_begun = self.highest_begun.max(started.turn);
                if self
                    .open_calls
                    .iter()
                    .any(|(_, call)| call.id == started.call.id)
                {
                    out.duplicate_events += 1;
                } else {
                    self.open_calls.push((started.turn, started.call));
                }
            }
            Event::ToolCallFinished(finished) => {
                self.open_calls
                    .retain(|(_, call)| call.id != finished.result.call_id);
                if let Some(child) = finished.child {
                    self.out.children.push(child);
                }
            }
            Event::TurnCompleted(turn) => {
                if turn.turn == 0 {
                    out.malformed_events += 1;
                } else if !self.turns.insert(turn.turn) {
                    out.duplicate_turns += 1;
                } else {
                    out.usage += turn.usage;
                    out.cost += turn.cost;
                    out.workspace.turn_completed(turn.turn);
                    self.cost_recorded = true;
                }
            }
            Event::TaskTransition(transition) => {
                self.reopen_after_finish();
                let out = &mut self.out;
                self.transitioned = true;
                out.task_status = Some(transition.to);
            }
            Event::Retry(_) => out.retries += 1,
            Event::Finish(finish) => {
                self.finished = true;
                out.termination_reason = Some(finish.termination_reason);
                out.task_status = Some(finish.task_status);
                out.error = finish.error;
                self.cost_recorded = true;
            }
            Event::Compaction(compaction) => {
                let (from, to) = (compaction.from_index as usize, compaction.to_index as usize);
                if from <= to && to <= out.messages.len() {
                    out.messages
                        .splice(from..to, compaction.replacement.iter().cloned());
                    out.compactions.push(CompactionRecord { seq, compaction });
                } else {
                    out.malformed_events += 1;
                }
            }
            Event::Stagnation(verdict) => out.stagnation.push(verdict),
            Event::ApprovalRequested(request) => {
                if out
                    .pending_approvals
                    .iter()
                    .any(|p| p.call.id == request.call.id)
                    || self.decided.contains(&request.call.id)
                {
                    out.duplicate_events += 1;
                } else {
                    out.pending_approvals.push(PendingApproval {
                        seq,
                        turn: request.turn,
                        call: request.call,
                        rule: request.rule,
                    });
                }
            }
            Event::ApprovalDecided(decided) => {
                if self.decided.insert(decided.call_id.clone()) {
                    out.pending_approvals
                        .retain(|p| p.call.id != decided.call_id);
                    out.approvals_decided += 1;
                } else {
                    out.duplicate_events += 1;
                }
            }
            Event::ProxyDecision(decision) => match decision.decision {
                ProxyVerdict::Allowed => out.proxy.allowed += 1,
                ProxyVerdict::Denied => out.proxy.denied += 1,
                ProxyVerdict::Injected => out.proxy.injected += 1,
            },
            Event::Checkpoint(checkpoint) => out.checkpoints.push(CheckpointMark {
                seq,
                turn: checkpoint.turn,
                snapshot_sha256: checkpoint.snapshot_sha256,
            }),
            Event::Resumed(resumed) => {
                // The calls in doubt were told to the model: no longer open, though their
                // side effects stay unknown (the resume event keeps their ids).
                self.open_calls
                    .retain(|(_, call)| !resumed.in_doubt.contains(&call.id));
                // A new attempt: the previous one's ending no longer describes the run.
                self.finished = false;
                out.termination_reason = None;
                out.error = None;
                out.resumes.push(ResumeMark { seq, resumed });
            }
            // Neither starts an attempt: a rewind is a person's act on a finished run.
            Event::WorkspaceSnapshot(snapshot) => out.workspace.snapshot(snapshot),
            Event::WorkspaceRewound(rewound) => {
                out.workspace.rewinds += 1;
                out.workspace.position = rewound.turn;
                out.workspace.current = Some(rewound.tree);
            }
            Event::ToolProtocolSwitched(switched) => out.tool_protocol = Some(switched),
            Event::InstructionsLoaded(loaded) => out.instructions.push(loaded),
            Event::HookRan(ran) => out.hooks.push(ran),
            Event::SkillLoaded(loaded) => out.skills.push(loaded),
        }
    }

    /// A person's follow-up (`nerve chat`, `run --continue`) appends to a finished
    /// execution: its first `task_transition` or `message_appended` after a finish starts a
    /// new attempt, whose ending is the one that counts (none yet, until it finishes).
    fn reopen_after_finish(&mut self) {
        if self.finished {
            self.finished = false;
            self.out.termination_reason = None;
            self.out.error = None;
        }
    }

    /// The replay, given the verdict of the hash chain over the same events.
    pub(crate) fn finish(self, chain: &ChainCheck) -> Replay {
        let Self {
            mut out,
            turns,
            highest_begun,
            cost_recorded,
            transitioned,
            finished,
            open_calls,
            ..
        } = self;
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

        if let Err((broken, cause)) = chain.finish() {
            let kind = match cause {
                Break::Missing { .. } => GapKind::SequenceGap,
                Break::Link | Break::Content => GapKind::BrokenChain,
            };
            out.gaps.push(Gap {
                kind,
                detail: broken.to_string(),
            });
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
        if out.termination_reason != Some(TerminationReason::Parked) {
            for pending in &out.pending_approvals {
                out.gaps.push(Gap {
                    kind: GapKind::ApprovalUndecided,
                    detail: format!(
                        "turn {}: approval for tool call {} ({}) was requested and never decided",
                        pending.turn, pending.call.id, pending.call.name
                    ),
                });
            }
        }
        if !finished {
            out.gaps.push(Gap {
                kind: GapKind::NoFinish,
                detail: "no finish event: the execution crashed, was killed, or is still running"
                    .into(),
            });
        }
        out
    }
}

/// Decodes one stored payload, or `None` when it is malformed: a payload version newer
/// than this build writes, invalid JSON, or a `kind` tag that disagrees with the `kind`
/// column.
fn decode(kind: EventKind, version: u32, payload: &str) -> Option<Event> {
    if version > kind.version() {
        return None;
    }
    // The writer puts the tag first. Then the kind column says which struct to read, and
    // serde can skip buffering the whole object to find the tag (internally tagged enums
    // do), which is most of replay's time. Anything else takes the general path.
    let tag = kind.as_str();
    let tagged_first = payload
        .strip_prefix(r#"{"kind":""#)
        .and_then(|rest| rest.strip_prefix(tag))
        .is_some_and(|rest| rest.starts_with(r#"","#) || rest.starts_with(r#""}"#));
    if !tagged_first {
        let event: Event = serde_json::from_str(payload).ok()?;
        return (event.kind() == kind).then_some(event);
    }
    fn read<T: DeserializeOwned>(payload: &str, wrap: fn(T) -> Event) -> Option<Event> {
        serde_json::from_str(payload).ok().map(wrap)
    }
    match kind {
        EventKind::Started => read::<Started>(payload, Event::Started),
        EventKind::ContextCreated => read::<ContextCreated>(payload, Event::ContextCreated),
        EventKind::MessageAppended => message_appended(payload).map(Event::MessageAppended),
        EventKind::ToolCallStarted => read::<ToolCallStarted>(payload, Event::ToolCallStarted),
        EventKind::ToolCallFinished => read::<ToolCallFinished>(payload, Event::ToolCallFinished),
        EventKind::ModelCalled => read::<ModelCalled>(payload, Event::ModelCalled),
        EventKind::TurnCompleted => read::<TurnCompleted>(payload, Event::TurnCompleted),
        EventKind::TaskTransition => read::<TaskTransition>(payload, Event::TaskTransition),
        EventKind::Retry => read::<Retry>(payload, Event::Retry),
        EventKind::Finish => read::<Finish>(payload, Event::Finish),
        EventKind::Compaction => read::<Compaction>(payload, Event::Compaction),
        EventKind::Stagnation => read::<Stagnation>(payload, Event::Stagnation),
        EventKind::ApprovalRequested => {
            read::<ApprovalRequested>(payload, Event::ApprovalRequested)
        }
        EventKind::ApprovalDecided => read::<ApprovalDecided>(payload, Event::ApprovalDecided),
        EventKind::ProxyDecision => read::<ProxyDecision>(payload, Event::ProxyDecision),
        EventKind::Checkpoint => read::<nerve_core::event::Checkpoint>(payload, Event::Checkpoint),
        EventKind::Resumed => read::<Resumed>(payload, Event::Resumed),
        EventKind::WorkspaceSnapshot => {
            read::<WorkspaceSnapshot>(payload, Event::WorkspaceSnapshot)
        }
        EventKind::WorkspaceRewound => read::<WorkspaceRewound>(payload, Event::WorkspaceRewound),
        EventKind::ToolProtocolSwitched => {
            read::<ToolProtocolSwitched>(payload, Event::ToolProtocolSwitched)
        }
        EventKind::InstructionsLoaded => {
            read::<InstructionsLoaded>(payload, Event::InstructionsLoaded)
        }
        EventKind::HookRan => read::<nerve_core::event::HookRan>(payload, Event::HookRan),
        EventKind::SkillLoaded => {
            read::<nerve_core::event::SkillLoaded>(payload, Event::SkillLoaded)
        }
    }
}

/// `message_appended`, decoded without serde's buffering of internally tagged enums: every
/// part is first taken as raw JSON, and one whose `type` tag comes first (as the writer puts
/// it) is read straight into its variant. Anything else goes through `MessagePart`'s own
/// `Deserialize`, so both paths accept exactly the same documents.
fn message_appended(payload: &str) -> Option<MessageAppended> {
    #[derive(Deserialize)]
    struct Wire<'a> {
        index: u32,
        #[serde(borrow)]
        message: WireMessage<'a>,
    }
    #[derive(Deserialize)]
    struct WireMessage<'a> {
        role: MessageRole,
        #[serde(borrow)]
        parts: Vec<&'a RawValue>,
        #[serde(default)]
        pinned: bool,
    }
    let wire: Wire<'_> = serde_json::from_str(payload).ok()?;
    let parts = wire
        .message
        .parts
        .iter()
        .map(|raw| message_part(raw.get()))
        .collect::<Option<Vec<_>>>()?;
    Some(MessageAppended {
        index: wire.index,
        message: Message {
            role: wire.message.role,
            parts,
            pinned: wire.message.pinned,
        },
    })
}

fn message_part(json: &str) -> Option<MessagePart> {
    #[derive(Deserialize)]
    struct Text {
        text: String,
    }
    #[derive(Deserialize)]
    struct Thinking {
        text: String,
        #[serde(default)]
        signature: Option<String>,
    }
    #[derive(Deserialize)]
    struct Summary {
        text: String,
        archived: Vec<BlockId>,
    }
    let tag = json.strip_prefix(r#"{"type":""#).and_then(|rest| {
        let (tag, after) = rest.split_once('"')?;
        (after.starts_with(',') || after.starts_with('}')).then_some(tag)
    });
    let part = match tag {
        Some("text") => {
            serde_json::from_str::<Text>(json).map(|p| MessagePart::Text { text: p.text })
        }
        Some("tool_call") => serde_json::from_str::<ToolCall>(json).map(MessagePart::ToolCall),
        Some("tool_result") => {
            serde_json::from_str::<ToolResult>(json).map(MessagePart::ToolResult)
        }
        Some("thinking") => serde_json::from_str::<Thinking>(json).map(|p| MessagePart::Thinking {
            text: p.text,
            signature: p.signature,
        }),
        Some("compaction_summary") => {
            serde_json::from_str::<Summary>(json).map(|p| MessagePart::CompactionSummary {
                text: p.text,
                archived: p.archived,
            })
        }
        // Keys in another order, or a part this file does not know: the general path.
        Some(_) | None => serde_json::from_str::<MessagePart>(json),
    };
    part.ok()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn parts() -> impl Strategy<Value = MessagePart> {
        let text = ".{0,12}";
        prop_oneof![
            text.prop_map(|text| MessagePart::Text { text }),
            (text, text, text).prop_map(|(id, name, arg)| MessagePart::ToolCall(ToolCall {
                id: id.as_str().into(),
                name,
                arguments: serde_json::json!({"command": arg, "n": [1, 2]}),
            })),
            (text, text, text, any::<bool>()).prop_map(|(id, name, content, is_error)| {
                MessagePart::ToolResult(ToolResult {
                    call_id: id.as_str().into(),
                    name,
                    content,
                    is_error,
                })
            }),
            (text, proptest::option::of(text))
                .prop_map(|(text, signature)| MessagePart::Thinking { text, signature }),
            (text, 0usize..3).prop_map(|(text, n)| MessagePart::CompactionSummary {
                text,
                archived: (0..n).map(|_| BlockId::new()).collect(),
            }),
        ]
    }

    proptest! {
        /// The fast decoder reads exactly what serde reads, whatever the key order.
        #[test]
        fn fast_message_decoding_agrees_with_serde(
            parts in prop::collection::vec(parts(), 0..5),
            pinned in any::<bool>(),
            index in 0u32..1000,
            sorted in any::<bool>(),
        ) {
            let event = Event::MessageAppended(MessageAppended {
                index,
                message: Message { role: MessageRole::Assistant, parts, pinned },
            });
            let payload = if sorted {
                serde_json::to_value(&event).unwrap().to_string()
            } else {
                serde_json::to_string(&event).unwrap()
            };
            let fast = decode(EventKind::MessageAppended, 1, &payload);
            prop_assert_eq!(fast.as_ref(), Some(&event));
            prop_assert_eq!(fast, serde_json::from_str::<Event>(&payload).ok());
        }

        /// And rejects what serde rejects.
        #[test]
        fn fast_message_decoding_rejects_what_serde_rejects(junk in r#"\{"type":"(text|tool_call|thinking|compaction_summary|tool_result|other)"(,"[a-z_]{1,8}":("x"|1|null|\[\]))*\}"#) {
            let payload = format!(r#"{{"kind":"message_appended","index":0,"message":{{"role":"user","parts":[{junk}]}}}}"#);
            prop_assert_eq!(decode(EventKind::MessageAppended, 1, &payload), serde_json::from_str::<Event>(&payload).ok());
        }
    }
}
