//! Store, writer and replay tests against a real SQLite file on disk, and replay tests over
//! hand-built and generated logs.

use std::sync::Arc;

use nerve_core::event::{
    ApprovalDecided, ApprovalDecision, ApprovalRequested, CallPurpose, Compaction,
    CompactionStrategy, CompactionTrigger, ContextCreated, Decider, Finish, MessageAppended,
    ModelCalled, ProxyDecision, ProxyVerdict, Resumed, Started, TaskTransition, TurnCompleted,
};
use nerve_core::{
    BlockId, Event, EventKind, EventSink, ExecutionId, LoopType, Message, MicroUsd, Redactor,
    TaskId, TaskStatus, TerminationReason, TokenUsage, ToolCall, ToolCallFinished, ToolCallStarted,
    ToolResult,
};
use proptest::prelude::*;

use super::*;

const CANARY: &str = "canary-7f3a9c1e5b";

fn started() -> Event {
    Event::Started(Started {
        task_id: TaskId::new(),
        task: "demo".into(),
        workspace: "/w".into(),
        loop_type: LoopType::React,
        provider: "script:x".into(),
        model: "scripted".into(),
        max_turns: 20,
        config: serde_json::Value::Null,
        parent: None,
        call_id: None,
        fork: None,
    })
}

fn context() -> Event {
    Event::ContextCreated(ContextCreated {
        context_window: None,
        tools: vec![],
    })
}

fn transition(from: TaskStatus, to: TaskStatus) -> Event {
    Event::TaskTransition(TaskTransition { from, to })
}

fn message(index: u32, message: Message) -> Event {
    Event::MessageAppended(MessageAppended { index, message })
}

fn turn(n: u32) -> Event {
    Event::TurnCompleted(TurnCompleted {
        turn: n,
        usage: TokenUsage::new(100, 10),
        cost: MicroUsd(5),
        tool_calls: vec![],
        finish: nerve_core::FinishReason::Stop,
        duration_ms: 1,
    })
}

fn model_called(n: u32) -> Event {
    Event::ModelCalled(ModelCalled {
        turn: n,
        purpose: CallPurpose::Agent,
        outcome: nerve_core::event::CallOutcome::Ok,
        usage: TokenUsage::new(100, 10),
        time_to_first_token_ms: None,
        tokens_per_second: None,
    })
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "shell".into(),
        arguments: serde_json::json!({"command": "ls"}),
    }
}

fn tool_started(n: u32, id: &str) -> Event {
    Event::ToolCallStarted(ToolCallStarted {
        turn: n,
        call: call(id),
        repaired: None,
    })
}

fn tool_finished(n: u32, id: &str) -> Event {
    Event::ToolCallFinished(ToolCallFinished {
        turn: n,
        result: ToolResult {
            call_id: id.into(),
            name: "shell".into(),
            content: "ok".into(),
            is_error: false,
        },
        duration_ms: 1,
        interrupted: false,
        child: None,
    })
}

fn finish(reason: TerminationReason) -> Event {
    Event::Finish(Finish {
        termination_reason: reason,
        task_status: TaskStatus::InReview,
        total_turns: 2,
        usage: TokenUsage::new(200, 20),
        cost: MicroUsd(10),
        error: None,
    })
}

fn requested(n: u32, id: &str) -> Event {
    Event::ApprovalRequested(ApprovalRequested {
        turn: n,
        call: call(id),
        rule: "shell: ask".into(),
    })
}

fn decided(n: u32, id: &str) -> Event {
    Event::ApprovalDecided(ApprovalDecided {
        turn: n,
        call_id: id.into(),
        decision: ApprovalDecision::Approved,
        decided_by: Decider::User,
        rule: "shell: ask".into(),
        reason: None,
    })
}

fn resumed(attempt: u32, in_doubt: &[&str]) -> Event {
    Event::Resumed(Resumed {
        attempt,
        from_checkpoint_seq: None,
        from_turn: 1,
        in_doubt: in_doubt.iter().map(|&id| id.into()).collect(),
    })
}

fn compaction(from: u32, to: u32, summary: &str, archived: Vec<BlockId>) -> Compaction {
    Compaction {
        turn: 1,
        strategy: CompactionStrategy::Summarize,
        trigger: CompactionTrigger::HardThreshold,
        from_index: from,
        to_index: to,
        replacement: vec![Message {
            role: nerve_core::MessageRole::User,
            parts: vec![nerve_core::MessagePart::CompactionSummary {
                text: summary.into(),
                archived: archived.clone(),
            }],
            pinned: false,
        }],
        archived,
        tokens_before: 1000,
        tokens_after: 200,
        summary: Some(summary.into()),
        extractive: false,
    }
}

fn full_log() -> Vec<Event> {
    vec![
        started(),
        context(),
        transition(TaskStatus::Assigned, TaskStatus::InProgress),
        message(0, Message::system("sys")),
        turn(1),
        turn(2),
        finish(TerminationReason::Completed),
    ]
}

/// Builds stored events the way the writer would, without a database.
fn stored(events: &[Event]) -> Vec<StoredEvent> {
    let mut prev = GENESIS_HASH.to_owned();
    events
        .iter()
        .enumerate()
        .map(|(i, event)| {
            let payload = serde_json::to_string(event).unwrap();
            let seq = i as u64 + 1;
            let hash = chain::event_hash(&prev, "x", seq, "t", event.kind().as_str(), 1, &payload);
            let stored = StoredEvent {
                execution_id: "x".into(),
                seq,
                ts: "t".into(),
                kind: event.kind().as_str().into(),
                version: 1,
                payload,
                prev_hash: prev.clone(),
                hash: hash.clone(),
            };
            prev = hash;
            stored
        })
        .collect()
}

fn kinds(replayed: &Replay) -> Vec<GapKind> {
    replayed.gaps.iter().map(|g| g.kind).collect()
}

fn check(events: &[Event], score: u32, gaps: &[GapKind]) -> Replay {
    let replayed = replay("x", &stored(events));
    assert_eq!(replayed.score, score, "{replayed:#?}");
    assert_eq!(kinds(&replayed), gaps, "{replayed:#?}");
    replayed
}

// ---- replay over hand-built logs ------------------------------------------------------------

#[test]
fn replay_scores_table() {
    let full = check(&full_log(), 100, &[]);
    assert!(full.complete);
    assert_eq!(full.completeness(), 1.0);
    assert_eq!(full.total_turns, 2);
    assert_eq!(full.termination_reason, Some(TerminationReason::Completed));
    assert_eq!(full.task_status, Some(TaskStatus::InReview));

    let turns_only = check(&[turn(1), turn(2)], 60, &[GapKind::NoFinish]);
    assert!(!turns_only.complete);
    assert_eq!(turns_only.completeness(), 0.6);
    let start_only = check(&[started()], 15, &[GapKind::NoFinish]);
    assert_eq!(start_only.completeness(), 0.15);
    check(&[], 0, &[GapKind::NoFinish]);
    // Exactly at the threshold: everything but the context (0.90), then everything but
    // the task transition and the context (0.75).
    let mut no_context = full_log();
    no_context.remove(1);
    assert!(check(&no_context, 90, &[]).complete);
    let mut neither = no_context.clone();
    neither.remove(1);
    assert!(!check(&neither, 75, &[]).complete);
}

fn snapshot(turn: u32, tree: &str, outside: &[&str]) -> Event {
    Event::WorkspaceSnapshot(nerve_core::event::WorkspaceSnapshot {
        turn,
        tree: tree.repeat(40),
        outside: outside
            .iter()
            .map(|path| nerve_core::event::WorkspaceChange {
                change: nerve_core::event::ChangeKind::Modified,
                path: (*path).into(),
            })
            .collect(),
    })
}

/// The workspace's history: the tree after each turn (a turn without a snapshot keeps
/// the tree before it), the turns that changed it, changes found at a resume (not a
/// turn's), and a rewind after the finish, which neither reopens the execution nor
/// costs completeness. A log without snapshots has an empty history.
#[test]
fn replay_follows_the_workspace_through_snapshots_and_rewinds() {
    let mut log = full_log();
    log.insert(4, snapshot(0, "a", &[]));
    // turn(1) is at 5: its snapshot after it; turn 2 changes nothing.
    log.insert(6, snapshot(1, "b", &[]));
    log.insert(8, snapshot(2, "c", &["notes.txt"]));
    log.push(Event::WorkspaceRewound(
        nerve_core::event::WorkspaceRewound {
            turn: 0,
            tree: "a".repeat(40),
            forced: false,
            changes: Vec::new(),
        },
    ));
    let replayed = check(&log, 100, &[]);
    assert_eq!(
        replayed.termination_reason,
        Some(TerminationReason::Completed)
    );
    let history = &replayed.workspace;
    let tree = |t: &str| t.repeat(40);
    assert_eq!(history.first, Some((0, tree("a"))));
    assert_eq!(
        history.after,
        [(0, tree("a")), (1, tree("b")), (2, tree("b"))].into()
    );
    assert_eq!(history.changed, [(1, (tree("a"), tree("b")))].into());
    assert_eq!(history.last_snapshot, Some(tree("c")));
    assert_eq!(history.current, Some(tree("a")));
    assert_eq!(
        (history.position, history.snapshots, history.rewinds),
        (0, 3, 1)
    );
    let none = check(&full_log(), 100, &[]).workspace;
    assert!(none.first.is_none() && none.after.is_empty() && none.current.is_none());
}

#[test]
fn a_follow_up_after_the_finish_reopens_the_execution_until_it_finishes_again() {
    let mut log = full_log();
    // `nerve chat`'s next message: the task back in progress, the message, a turn.
    log.extend([
        transition(TaskStatus::InReview, TaskStatus::InProgress),
        message(1, Message::user("and now this")),
        turn(3),
    ]);
    let open = check(&log, 100, &[GapKind::NoFinish]);
    assert_eq!(
        open.termination_reason, None,
        "the follow-up has not finished"
    );
    assert_eq!(open.task_status, Some(TaskStatus::InProgress));
    assert_eq!(open.total_turns, 3);

    log.push(finish(TerminationReason::Completed));
    let done = check(&log, 100, &[]);
    assert_eq!(done.termination_reason, Some(TerminationReason::Completed));
    assert_eq!(done.messages.len(), 2);

    // Without a transition (the task never left in_progress) the message alone reopens it.
    let mut log = full_log();
    log.extend([message(1, Message::user("more")), turn(3)]);
    let open = check(&log, 100, &[GapKind::NoFinish]);
    assert_eq!(open.termination_reason, None);
}

#[test]
fn replay_skips_malformed_and_duplicate_turns() {
    let mut events = stored(&[started(), turn(1), turn(1), turn(2)]);
    events[1].payload = r#"{"kind":"turn_completed","turn":"one"}"#.into();
    let replayed = replay("x", &events);
    assert_eq!(replayed.malformed_events, 1);
    assert_eq!(replayed.duplicate_turns, 0);
    assert_eq!(replayed.total_turns, 2);
    assert_eq!(
        kinds(&replayed),
        [GapKind::BrokenChain, GapKind::NoFinish],
        "the edit also breaks the chain"
    );

    let replayed = replay("x", &stored(&[started(), turn(1), turn(1), turn(2)]));
    assert_eq!(replayed.duplicate_turns, 1);
    assert_eq!(replayed.total_turns, 2);
    assert_eq!(
        replayed.usage.input_tokens, 200,
        "a duplicate turn is not counted twice"
    );
    assert_eq!(replayed.cost, MicroUsd(10));
}

#[test]
fn replay_counts_every_kind_of_malformed_event() {
    let base = stored(&[started(), turn(1), turn(2), message(0, Message::user("a"))]);
    type Corruption = Box<dyn Fn(&mut StoredEvent)>;
    let cases: Vec<(&str, Corruption)> = vec![
        ("invalid JSON", Box::new(|e| e.payload = "{not json".into())),
        (
            "kind column disagrees",
            Box::new(|e| e.kind = "retry".into()),
        ),
        ("unknown kind", Box::new(|e| e.kind = "teleported".into())),
        ("newer payload version", Box::new(|e| e.version = 2)),
        (
            "turn zero",
            Box::new(|e| {
                e.payload = r#"{"kind":"turn_completed","turn":0,"usage":{"input_tokens":1,"output_tokens":1},"cost":1,"tool_calls":[],"finish":"stop","duration_ms":1}"#.into()
            }),
        ),
        (
            "tag second",
            Box::new(|e| e.payload = r#"{"turn":"x","kind":"turn_completed"}"#.into()),
        ),
    ];
    for (what, corrupt) in cases {
        let mut events = base.clone();
        corrupt(&mut events[2]);
        let replayed = replay("x", &events);
        assert_eq!(replayed.malformed_events, 1, "{what}");
        assert_eq!(replayed.total_turns, 1, "{what}");
    }
    // A message index past the end of the conversation cannot be placed.
    let replayed = replay("x", &stored(&[message(3, Message::user("far"))]));
    assert_eq!(replayed.malformed_events, 1);
    assert!(replayed.messages.is_empty());
    // Payloads written with sorted keys (the redacting path before serde_json kept the
    // order, so in older logs) decode through the general path.
    let mut sorted = stored(&[turn(1)]);
    let value: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_str(&sorted[0].payload).unwrap();
    sorted[0].payload = serde_json::to_string(&value).unwrap();
    assert!(
        !sorted[0].payload.starts_with(r#"{"kind""#),
        "{}",
        sorted[0].payload
    );
    assert_eq!(replay("x", &sorted).total_turns, 1);
}

#[test]
fn replay_reports_non_contiguous_turns() {
    check(
        &[started(), turn(1), turn(3)],
        50,
        &[GapKind::TurnsNotContiguous, GapKind::NoFinish],
    );
}

#[test]
fn replay_reports_calls_in_doubt_and_incomplete_turns() {
    let events = [
        started(),
        turn(1),
        model_called(2),
        tool_started(2, "a"),
        tool_finished(2, "a"),
        tool_started(2, "b"),
    ];
    let replayed = check(
        &events,
        75,
        &[
            GapKind::ToolCallInDoubt,
            GapKind::TurnIncomplete,
            GapKind::NoFinish,
        ],
    );
    assert_eq!(replayed.in_doubt, [call("b")]);
    assert!(
        replayed.gaps[0].detail.contains("tool call b (shell)"),
        "{}",
        replayed.gaps[0].detail
    );
    assert!(
        replayed.gaps[1].detail.contains("turn 2"),
        "{}",
        replayed.gaps[1].detail
    );
    assert_eq!(replayed.model_calls.get("agent"), Some(&1));
    // A tool call started twice is one call.
    let replayed = replay("x", &stored(&[tool_started(1, "a"), tool_started(1, "a")]));
    assert_eq!(replayed.duplicate_events, 1);
    assert_eq!(replayed.in_doubt.len(), 1);
}

#[test]
fn replay_tracks_approvals() {
    let ask = [started(), turn(1), requested(2, "a")];
    let replayed = check(&ask, 75, &[GapKind::ApprovalUndecided, GapKind::NoFinish]);
    assert_eq!(replayed.pending_approvals.len(), 1);
    assert_eq!(replayed.pending_approvals[0].seq, 3);
    assert_eq!(replayed.pending_approvals[0].rule, "shell: ask");

    // Parked: the pending approval is what `nerve approve` decides, not a gap.
    let parked = [
        started(),
        turn(1),
        requested(2, "a"),
        finish(TerminationReason::Parked),
    ];
    let replayed = check(&parked, 75, &[]);
    assert_eq!(replayed.pending_approvals[0].call.id.0, "a");

    let decided_log = [
        started(),
        turn(1),
        requested(2, "a"),
        decided(2, "a"),
        decided(2, "a"),
        requested(2, "a"),
    ];
    let replayed = check(&decided_log, 75, &[GapKind::NoFinish]);
    assert!(replayed.pending_approvals.is_empty());
    assert_eq!(replayed.approvals_decided, 1);
    assert_eq!(
        replayed.duplicate_events, 2,
        "decided twice, requested again after the decision"
    );
}

#[test]
fn replay_applies_compactions_to_the_conversation() {
    let block = BlockId::new();
    let events = [
        message(0, Message::system("sys")),
        message(1, Message::user("task").pinned()),
        message(2, Message::user("old 1")),
        message(3, Message::user("old 2")),
        message(4, Message::user("recent")),
        Event::Compaction(compaction(2, 4, "summary of old", vec![block])),
        message(4, Message::user("after")),
        // Out of range: skipped and counted, the conversation untouched.
        Event::Compaction(compaction(3, 9, "bad", vec![])),
    ];
    let replayed = replay("x", &stored(&events));
    let texts: Vec<String> = replayed
        .messages
        .iter()
        .map(|m| {
            if let nerve_core::MessagePart::CompactionSummary { text, .. } = &m.parts[0] {
                format!("summary: {text}")
            } else {
                m.text_content()
            }
        })
        .collect();
    assert_eq!(
        texts,
        ["sys", "task", "summary: summary of old", "recent", "after"]
    );
    assert_eq!(replayed.compactions.len(), 1);
    assert_eq!(replayed.compactions[0].seq, 6);
    assert_eq!(replayed.compactions[0].compaction.archived, [block]);
    assert_eq!(replayed.malformed_events, 1);
}

#[test]
fn replay_of_a_resumed_execution() {
    // Crashed in turn 2 with a call in doubt, resumed (telling the model about it), finished.
    let crashed = vec![
        started(),
        context(),
        transition(TaskStatus::Assigned, TaskStatus::InProgress),
        turn(1),
        finish(TerminationReason::Shutdown),
        resumed(1, &[]),
        model_called(2),
        tool_started(2, "a"),
    ];
    let replayed = check(
        &crashed,
        100,
        &[
            GapKind::ToolCallInDoubt,
            GapKind::TurnIncomplete,
            GapKind::NoFinish,
        ],
    );
    assert_eq!(
        replayed.termination_reason, None,
        "the resumed attempt has not finished"
    );
    assert_eq!(replayed.resumes.len(), 1);

    let mut finished = crashed;
    finished.extend([
        resumed(2, &["a"]),
        model_called(2),
        turn(2),
        finish(TerminationReason::Completed),
    ]);
    let replayed = check(&finished, 100, &[]);
    assert!(
        replayed.in_doubt.is_empty(),
        "the resume acknowledged call a"
    );
    assert_eq!(replayed.resumes.len(), 2);
    assert_eq!(
        replayed.resumes[1].resumed.in_doubt,
        [nerve_core::ToolCallId::from("a")]
    );
    assert_eq!(
        replayed.termination_reason,
        Some(TerminationReason::Completed)
    );
}

#[test]
fn replay_counts_proxy_decisions_and_keeps_verdicts() {
    let proxy = |decision| {
        Event::ProxyDecision(ProxyDecision {
            host: "api.github.com".into(),
            method: "GET".into(),
            path: "/".into(),
            decision,
            status: None,
            credential: None,
            reason: None,
        })
    };
    let events = [
        proxy(ProxyVerdict::Allowed),
        proxy(ProxyVerdict::Denied),
        proxy(ProxyVerdict::Injected),
        proxy(ProxyVerdict::Denied),
    ];
    let replayed = replay("x", &stored(&events));
    assert_eq!(
        replayed.proxy,
        ProxyTally {
            allowed: 1,
            denied: 2,
            injected: 1
        }
    );
}

// ---- replay over generated logs -------------------------------------------------------------

/// The shape of a generated run: tool calls per turn, where it compacts, asks for approval
/// and checkpoints, and whether it finishes.
#[derive(Debug, Clone)]
struct Shape {
    calls_per_turn: Vec<u8>,
    compact_after_turn: Option<usize>,
    approval_in_turn: Option<usize>,
    checkpoint_every: usize,
    finish: bool,
}

fn shapes() -> impl Strategy<Value = Shape> {
    (
        prop::collection::vec(0u8..4, 1..8),
        any::<Option<prop::sample::Index>>(),
        any::<Option<prop::sample::Index>>(),
        1usize..4,
        any::<bool>(),
    )
        .prop_map(
            |(calls_per_turn, compact, approval, checkpoint_every, finish)| {
                let turns = calls_per_turn.len();
                Shape {
                    compact_after_turn: compact.map(|i| i.index(turns)),
                    approval_in_turn: approval.map(|i| i.index(turns)),
                    calls_per_turn,
                    checkpoint_every,
                    finish,
                }
            },
        )
}

/// A log as the engine writes it for `shape`.
fn generate(shape: &Shape) -> Vec<Event> {
    let mut events = vec![
        started(),
        context(),
        transition(TaskStatus::Assigned, TaskStatus::InProgress),
        message(0, Message::system("sys")),
        message(1, Message::user("task").pinned()),
    ];
    let mut len = 2u32;
    for (t, &calls) in shape.calls_per_turn.iter().enumerate() {
        let n = t as u32 + 1;
        events.push(model_called(n));
        let ids: Vec<String> = (0..calls).map(|c| format!("t{n}c{c}")).collect();
        let mut assistant = Message::text(nerve_core::MessageRole::Assistant, format!("turn {n}"));
        assistant.parts.extend(
            ids.iter()
                .map(|id| nerve_core::MessagePart::ToolCall(call(id))),
        );
        events.push(message(len, assistant));
        len += 1;
        for id in &ids {
            if shape.approval_in_turn == Some(t) {
                events.push(requested(n, id));
                events.push(decided(n, id));
            }
            events.push(tool_started(n, id));
            events.push(tool_finished(n, id));
            events.push(message(
                len,
                Message::tool_result(ToolResult {
                    call_id: id.as_str().into(),
                    name: "shell".into(),
                    content: "ok".into(),
                    is_error: false,
                }),
            ));
            len += 1;
        }
        events.push(turn(n));
        if (t + 1) % shape.checkpoint_every == 0 {
            events.push(Event::Checkpoint(nerve_core::event::Checkpoint {
                turn: n,
                snapshot_sha256: "00".into(),
                snapshot_bytes: 2,
            }));
        }
        if shape.compact_after_turn == Some(t) && len > 3 {
            events.push(Event::Compaction(compaction(
                2,
                len - 1,
                "summary",
                vec![BlockId::new()],
            )));
            len = 4;
        }
    }
    if shape.finish {
        events.push(finish(TerminationReason::Completed));
    }
    events
}

/// What an independent reading of a prefix says is missing.
fn expected_gaps(prefix: &[Event]) -> Vec<GapKind> {
    let mut open: Vec<String> = Vec::new();
    let (mut begun, mut completed, mut finished) = (0, 0, false);
    let mut pending = 0usize;
    for event in prefix {
        match event {
            Event::ToolCallStarted(s) => open.push(s.call.id.0.clone()),
            Event::ToolCallFinished(f) => open.retain(|id| *id != f.result.call_id.0),
            Event::ModelCalled(m) => begun = m.turn,
            Event::TurnCompleted(t) => completed = t.turn,
            Event::ApprovalRequested(_) => pending += 1,
            Event::ApprovalDecided(_) => pending -= 1,
            Event::Finish(_) => finished = true,
            Event::Started(_)
            | Event::ContextCreated(_)
            | Event::MessageAppended(_)
            | Event::TaskTransition(_)
            | Event::Retry(_)
            | Event::Compaction(_)
            | Event::Stagnation(_)
            | Event::ProxyDecision(_)
            | Event::Checkpoint(_)
            | Event::Resumed(_)
            | Event::WorkspaceSnapshot(_)
            | Event::WorkspaceRewound(_)
            | Event::ToolProtocolSwitched(_)
            | Event::InstructionsLoaded(_)
            | Event::HookRan(_)
            | Event::SkillLoaded(_) => {}
        }
    }
    let mut gaps = vec![GapKind::ToolCallInDoubt; open.len()];
    if begun > completed {
        gaps.push(GapKind::TurnIncomplete);
    }
    gaps.extend(std::iter::repeat_n(GapKind::ApprovalUndecided, pending));
    if !finished {
        gaps.push(GapKind::NoFinish);
    }
    gaps
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_prefix_of_a_log_replays_and_names_what_is_missing(shape in shapes()) {
        let events = generate(&shape);
        let rows = stored(&events);
        let mut last_score = 0;
        for cut in 0..=rows.len() {
            let replayed = replay("x", &rows[..cut]);
            prop_assert_eq!(kinds(&replayed), expected_gaps(&events[..cut]), "prefix of {} events", cut);
            prop_assert!(replayed.score >= last_score, "completeness never drops as the log grows");
            last_score = replayed.score;
            let turns = events[..cut].iter().filter(|e| e.kind() == EventKind::TurnCompleted).count();
            prop_assert_eq!(replayed.total_turns as usize, turns);
            prop_assert_eq!(replayed.malformed_events + replayed.duplicate_events + replayed.duplicate_turns, 0);
        }
        let whole = replay("x", &rows);
        prop_assert_eq!(whole.complete, true);
        prop_assert_eq!(whole.checkpoints.len(), shape.calls_per_turn.len() / shape.checkpoint_every);
    }

    #[test]
    fn damaged_logs_replay_without_panicking(
        shape in shapes(),
        damage in prop::collection::vec((any::<prop::sample::Index>(), 0u8..4, ".{0,40}"), 1..6),
    ) {
        let mut rows = stored(&generate(&shape));
        for (at, how, junk) in damage {
            let i = at.index(rows.len());
            match how {
                0 => rows[i].payload = junk,
                1 => { let copy = rows[i].clone(); rows.insert(i, copy); }
                2 => { rows.remove(i); }
                _ => rows[i].kind = junk,
            }
            if rows.is_empty() { break; }
        }
        let replayed = replay("x", &rows);
        prop_assert!(replayed.score <= 100);
        prop_assert_eq!(replayed.events, rows.len() as u64);
    }

    #[test]
    fn any_search_text_is_a_valid_fts_query(text in "\\PC{0,60}|[\"*():^+\\-{} ]{0,20}|NEAR\\(.{0,10}\\)") {
        let (_dir, path) = temp_db();
        let mut store = Store::open(&path).unwrap();
        let id = ExecutionId::new();
        store.put_blocks(&id, &[NewBlock { block_id: BlockId::new(), messages: vec![Message::user("needle in \"hay\" (stack)")], note: String::new() }], &Redactor::new()).unwrap();
        prop_assert!(store.search_archive(&id, &text, 5).is_ok());
    }
}

// ---- the store ------------------------------------------------------------------------------

fn temp_db() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested").join("nerve.db");
    (dir, path)
}

#[tokio::test]
async fn sink_appends_durably_and_chains() {
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let id = ExecutionId::new();
    for (i, event) in full_log().into_iter().enumerate() {
        let seq = sink.append(id, event).await.unwrap();
        assert_eq!(seq, i as u64 + 1);
    }
    let store = Store::open_read_only(&path).unwrap();
    assert_eq!(store.verify(&id).unwrap(), Ok(7));
    let events = store.events(&id).unwrap();
    let replayed = replay(&id.to_string(), &events);
    assert_eq!(replayed.score, 100);
    assert_eq!(
        store.replay(&id).unwrap(),
        replayed,
        "streamed replay equals replay of the rows"
    );
    assert_eq!(sink.replay(id).await.unwrap(), replayed);
    assert!(
        events.windows(2).all(|w| w[0].ts <= w[1].ts),
        "fixed-width timestamps sort"
    );
    let listed = store.executions().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].termination_reason.as_deref(), Some("completed"));
    assert!(matches!(
        store.events(&ExecutionId::new()),
        Err(SessionError::UnknownExecution(_))
    ));
    assert!(matches!(
        store.verify(&ExecutionId::new()),
        Err(SessionError::UnknownExecution(_))
    ));
    assert!(matches!(
        store.replay(&ExecutionId::new()),
        Err(SessionError::UnknownExecution(_))
    ));
}

#[tokio::test]
async fn append_all_is_atomic_and_ordered() {
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let id = ExecutionId::new();
    assert_eq!(
        sink.append_all(id, vec![started(), context()])
            .await
            .unwrap(),
        [1, 2]
    );
    assert_eq!(
        sink.append_all(id, vec![]).await.unwrap(),
        Vec::<u64>::new()
    );
    assert_eq!(sink.append(id, turn(1)).await.unwrap(), 3);
    assert_eq!(sink.verify(id).await.unwrap(), Ok(3));
    assert_eq!(sink.events(id).await.unwrap().len(), 3);
}

/// The kinds of `id`'s stored events, in order.
async fn stored_kinds(sink: &SqliteSink, id: ExecutionId) -> Vec<String> {
    let events = sink.events(id).await.unwrap();
    events.into_iter().map(|e| e.kind).collect()
}

#[tokio::test]
async fn a_commit_stores_its_events_and_then_its_checkpoint_in_one_write() {
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let id = ExecutionId::new();
    let port: &dyn EventSink = &sink;
    assert_eq!(port.commit(id, vec![], None).await.unwrap(), None);
    assert_eq!(
        port.commit(id, vec![started(), context()], None)
            .await
            .unwrap(),
        None
    );
    let snapshot = nerve_core::Snapshot {
        turn: 1,
        state: serde_json::json!({"turn": 1, "messages": 3}),
    };
    let seq = port
        .commit(id, vec![model_called(1), turn(1)], Some(snapshot.clone()))
        .await
        .unwrap();
    assert_eq!(
        seq,
        Some(5),
        "the checkpoint event follows the commit's events"
    );
    let kinds = stored_kinds(&sink, id).await;
    assert_eq!(
        kinds,
        [
            "started",
            "context_created",
            "model_called",
            "turn_completed",
            "checkpoint"
        ]
    );
    let checkpoint = sink.latest_checkpoint(id).await.unwrap().unwrap();
    assert_eq!((checkpoint.seq, checkpoint.turn), (5, 1));
    assert_eq!(checkpoint.snapshot, snapshot.state);
    assert_eq!(sink.verify(id).await.unwrap(), Ok(5));
}

#[tokio::test]
async fn secrets_never_reach_the_file() {
    let (_dir, path) = temp_db();
    let canary = secrecy::SecretString::from(CANARY);
    let redactor = Redactor::with_secrets([("canary", &canary)]).unwrap();
    let sink = SqliteSink::open(&path, Arc::new(redactor)).unwrap();
    let id = ExecutionId::new();
    let text = format!(
        "the token is {} and ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789",
        CANARY
    );
    sink.append(id, message(0, Message::user(text.clone())))
        .await
        .unwrap();
    let mut start = started();
    if let Event::Started(s) = &mut start {
        s.task = format!("use {CANARY}");
    }
    sink.append(id, start).await.unwrap();
    sink.write_checkpoint(
        id,
        1,
        serde_json::json!({"messages": [text.clone()], "nested": {"k": CANARY}}),
    )
    .await
    .unwrap();
    let block = BlockId::new();
    sink.compact(
        id,
        vec![NewBlock {
            block_id: block,
            messages: vec![Message::user(text)],
            note: format!("holds {CANARY}"),
        }],
        compaction(0, 1, CANARY, vec![block]),
    )
    .await
    .unwrap();

    let events = sink.events(id).await.unwrap();
    assert!(
        events[0].payload.contains("[REDACTED:canary]"),
        "{}",
        events[0].payload
    );
    assert!(events[0].payload.contains("[REDACTED:github_token]"));
    let checkpoint = sink.latest_checkpoint(id).await.unwrap().unwrap();
    assert_eq!(checkpoint.snapshot["nested"]["k"], "[REDACTED:canary]");
    let archived = sink.archive_block(id, block).await.unwrap().unwrap();
    assert!(
        archived.messages[0]
            .text_content()
            .contains("[REDACTED:canary]")
    );
    assert_eq!(
        sink.execution(id).await.unwrap().task.as_deref(),
        Some("use [REDACTED:canary]")
    );
    // The searchable text is built from redacted messages too.
    assert!(
        sink.search_archive(id, "canary".into(), 5).await.unwrap()[0]
            .snippet
            .contains("REDACTED")
    );
    drop(sink);
    for file in std::fs::read_dir(path.parent().unwrap()).unwrap() {
        // The writer's threads close their connections on their own time, and the last
        // close removes the WAL: a file may be gone by the time it is read.
        let bytes = match std::fs::read(file.unwrap().path()) {
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            read => read.unwrap(),
        };
        assert!(!bytes.windows(CANARY.len()).any(|w| w == CANARY.as_bytes()));
    }
}

#[tokio::test]
async fn update_and_delete_are_refused_and_tampering_is_detected() {
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let id = ExecutionId::new();
    for event in full_log() {
        sink.append(id, event).await.unwrap();
    }
    sink.write_checkpoint(id, 2, serde_json::json!({"turn": 2}))
        .await
        .unwrap();
    sink.put_blocks(
        id,
        vec![NewBlock {
            block_id: BlockId::new(),
            messages: vec![Message::user("x")],
            note: String::new(),
        }],
    )
    .await
    .unwrap();
    let intact = Store::open_read_only(&path).unwrap();
    assert_eq!(
        intact.verified_events(&id).unwrap(),
        intact.events(&id).unwrap()
    );
    drop(intact);
    let conn = rusqlite::Connection::open(&path).unwrap();
    for table in ["events", "archive_blocks"] {
        let update = conn
            .execute(&format!("UPDATE {table} SET ts = 'x'"), [])
            .unwrap_err();
        assert!(
            update.to_string().contains("append-only: UPDATE refused"),
            "{table}: {update}"
        );
        let delete = conn
            .execute(&format!("DELETE FROM {table}"), [])
            .unwrap_err();
        assert!(
            delete.to_string().contains("append-only: DELETE refused"),
            "{table}: {delete}"
        );
    }

    conn.execute_batch("DROP TRIGGER events_no_update").unwrap();
    conn.execute(
        "UPDATE events SET payload = replace(payload, '\"sys\"', '\"evil\"') WHERE seq = 4",
        [],
    )
    .unwrap();
    let store = Store::open_read_only(&path).unwrap();
    let broken = store.verify(&id).unwrap().unwrap_err();
    assert_eq!(broken.seq, 4, "{broken}");
    assert!(broken.reason.contains("content"), "{broken}");
    // What a resume reads refuses the log, naming the same sequence; an intact chain of
    // the same events would have been handed over.
    match store.verified_events(&id) {
        Err(SessionError::BrokenChain(refused)) => assert_eq!(refused, broken),
        other => panic!("a tampered log was handed to a resume: {other:?}"),
    }
    assert_eq!(
        crate::verify_events(&store.events(&id).unwrap()).unwrap_err(),
        broken
    );
    let replayed = replay(&id.to_string(), &store.events(&id).unwrap());
    assert_eq!(replayed.gaps[0].kind, GapKind::BrokenChain);
    assert!(
        replayed.gaps[0].detail.contains("sequence 4"),
        "{}",
        replayed.gaps[0].detail
    );

    conn.execute_batch("DROP TRIGGER events_no_delete").unwrap();
    conn.execute("DELETE FROM events WHERE seq = 2", [])
        .unwrap();
    let broken = store.verify(&id).unwrap().unwrap_err();
    assert_eq!(broken.seq, 2, "{broken}");
    assert_eq!(
        store.replay(&id).unwrap().gaps[0].kind,
        GapKind::SequenceGap
    );

    // A checkpoint's snapshot is tied to the chain by the hash in its event (the snapshot
    // column itself is outside the chain).
    conn.execute(
        "UPDATE events SET snapshot = '{\"turn\":99}' WHERE snapshot IS NOT NULL",
        [],
    )
    .unwrap();
    let corrupt = store.latest_checkpoint(&id).unwrap_err();
    assert!(
        corrupt.to_string().contains("does not match the hash"),
        "{corrupt}"
    );
}

#[test]
fn checkpoints_latest_wins_and_resume_reads_one_snapshot() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).unwrap();
    let redactor = Redactor::new();
    let id = ExecutionId::new();
    assert_eq!(store.latest_checkpoint(&id).unwrap(), None);
    store
        .append(&id, &[started(), context(), turn(1)], &redactor)
        .unwrap();
    assert_eq!(
        store
            .write_checkpoint(&id, 1, &serde_json::json!({"turns": 1}), &redactor)
            .unwrap(),
        4
    );
    store.append(&id, &[turn(2)], &redactor).unwrap();
    assert_eq!(
        store
            .write_checkpoint(&id, 2, &serde_json::json!({"turns": 2}), &redactor)
            .unwrap(),
        6
    );
    store
        .append(&id, &[model_called(3), tool_started(3, "a")], &redactor)
        .unwrap();

    let latest = store.latest_checkpoint(&id).unwrap().unwrap();
    assert_eq!((latest.seq, latest.turn), (6, 2));
    assert_eq!(latest.snapshot, serde_json::json!({"turns": 2}));

    let point = store.resume_point(&id).unwrap();
    assert_eq!(point.checkpoint, Some(latest));
    assert_eq!(
        point.later.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [7, 8]
    );
    assert_eq!(point.replay.in_doubt, [call("a")]);
    assert_eq!(
        point
            .replay
            .checkpoints
            .iter()
            .map(|c| (c.seq, c.turn))
            .collect::<Vec<_>>(),
        [(4, 1), (6, 2)]
    );
    assert!(matches!(
        store.resume_point(&ExecutionId::new()),
        Err(SessionError::UnknownExecution(_))
    ));
}

#[test]
fn the_archive_finds_blocks_by_their_words_and_only_for_their_execution() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).unwrap();
    let redactor = Redactor::new();
    let (id, other) = (ExecutionId::new(), ExecutionId::new());
    store.append(&id, &[started()], &redactor).unwrap();
    let (config, test, hidden) = (BlockId::new(), BlockId::new(), BlockId::new());
    let tool_call = Message {
        role: nerve_core::MessageRole::Assistant,
        parts: vec![nerve_core::MessagePart::ToolCall(ToolCall {
            id: "c".into(),
            name: "shell".into(),
            arguments: serde_json::json!({"command": "cargo test --package parser"}),
        })],
        pinned: false,
    };
    let seq = store
        .compact(
            &id,
            &[
                NewBlock {
                    block_id: config,
                    messages: vec![Message::user("The config loader reads TOML files.")],
                    note: "1 message summarised at turn 4".into(),
                },
                NewBlock {
                    block_id: test,
                    messages: vec![tool_call, Message::user("3 tests failed in parse_config")],
                    note: "2 tool outputs masked at turn 4".into(),
                },
            ],
            compaction(0, 0, "s", vec![config, test]),
            &redactor,
        )
        .unwrap();
    assert_eq!(seq, 2);
    store
        .put_blocks(
            &other,
            &[NewBlock {
                block_id: hidden,
                messages: vec![Message::user("config of another run")],
                note: String::new(),
            }],
            &redactor,
        )
        .unwrap();

    let found = |query: &str| -> Vec<BlockId> {
        store
            .search_archive(&id, query, 10)
            .unwrap()
            .into_iter()
            .map(|hit| hit.block_id)
            .collect()
    };
    assert_eq!(found("toml"), [config]);
    assert_eq!(
        found("failing tests"),
        [test],
        "stemmed: failing ~ failed, tests ~ test"
    );
    assert_eq!(found("parse_config"), [test]);
    assert_eq!(
        found("cargo package"),
        [test],
        "tool call arguments are searchable"
    );
    assert_eq!(found("config tests"), [test], "every term must match");
    assert_eq!(found("masked"), [test], "notes are searchable");
    assert_eq!(
        found("config").len(),
        2,
        "the other execution's block stays invisible"
    );
    assert_eq!(found("\"unbalanced ( quote * NEAR"), Vec::<BlockId>::new());
    assert!(store.search_archive(&id, "config", 0).unwrap().is_empty());

    let block = store.archive_block(&id, &test).unwrap().unwrap();
    assert_eq!((block.created_seq, block.messages.len()), (2, 2));
    assert_eq!(block.note, "2 tool outputs masked at turn 4");
    assert_eq!(
        store.search_archive(&id, "toml", 1).unwrap()[0].note,
        "1 message summarised at turn 4"
    );
    assert_eq!(store.archive_block(&id, &hidden).unwrap(), None);
    assert_eq!(
        store
            .archive_block(&other, &hidden)
            .unwrap()
            .unwrap()
            .created_seq,
        0
    );
    // Block ids are unique: archiving one twice fails, and writes nothing.
    let again = store.put_blocks(
        &id,
        &[NewBlock {
            block_id: test,
            messages: vec![],
            note: String::new(),
        }],
        &redactor,
    );
    assert!(
        matches!(again, Err(SessionError::Sqlite { .. })),
        "{again:?}"
    );
    assert_eq!(store.append(&id, &[context()], &redactor).unwrap(), [3]);
}

/// A follow-up that never finished (a chat aborted by a second Ctrl-C): the list and the
/// replay agree that the execution has no ending yet.
#[test]
fn a_follow_up_after_a_finish_reopens_the_index_as_replay_does() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).unwrap();
    let redactor = Redactor::new();
    let id = ExecutionId::new();
    store.append(&id, &full_log(), &redactor).unwrap();
    assert_eq!(
        store.execution(&id).unwrap().termination_reason.as_deref(),
        Some("completed")
    );
    let follow_up = transition(TaskStatus::InReview, TaskStatus::InProgress);
    store.append(&id, &[follow_up], &redactor).unwrap();
    let replayed = store.replay(&id).unwrap();
    assert_eq!(replayed.termination_reason, None);
    assert_eq!(store.execution(&id).unwrap().termination_reason, None);
    assert_eq!(store.executions().unwrap()[0].termination_reason, None);
    // Its ending, when it comes, is the one listed.
    store
        .append(&id, &[finish(TerminationReason::Shutdown)], &redactor)
        .unwrap();
    assert_eq!(
        store.execution(&id).unwrap().termination_reason.as_deref(),
        Some("shutdown")
    );
}

#[test]
fn the_executions_index_follows_the_log() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).unwrap();
    let redactor = Redactor::new();
    let (first, second) = (ExecutionId::new(), ExecutionId::new());
    store.append(&first, &full_log(), &redactor).unwrap();
    store
        .append(&second, &[started(), context(), turn(1)], &redactor)
        .unwrap();

    let listed = store.executions().unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|e| e.execution_id.clone())
            .collect::<Vec<_>>(),
        [second.to_string(), first.to_string()]
    );
    let done = store.execution(&first).unwrap();
    assert_eq!(done.task.as_deref(), Some("demo"));
    assert_eq!(done.loop_type.as_deref(), Some("react"));
    assert_eq!(done.model.as_deref(), Some("scripted"));
    assert_eq!(done.termination_reason.as_deref(), Some("completed"));
    assert_eq!(done.task_status.as_deref(), Some("in_review"));
    assert_eq!(
        (
            done.total_turns,
            done.input_tokens,
            done.output_tokens,
            done.cost_micro_usd
        ),
        (2, 200, 20, 10)
    );
    assert_eq!(done.events, 7);
    let running = store.execution(&second).unwrap();
    assert_eq!(
        (
            running.termination_reason.as_deref(),
            running.total_turns,
            running.events
        ),
        (None, 1, 3)
    );

    // Resumed: running again until the next finish.
    store.append(&first, &[resumed(1, &[])], &redactor).unwrap();
    let again = store.execution(&first).unwrap();
    assert_eq!(
        (again.termination_reason, again.resumes, again.events),
        (None, 1, 8)
    );
    assert!(matches!(
        store.execution(&ExecutionId::new()),
        Err(SessionError::UnknownExecution(_))
    ));

    // Another connection (a second process) appending to the same execution: the first
    // connection's cached head is stale, its append conflicts, and succeeds once re-read.
    let mut other = Store::open(&path).unwrap();
    assert_eq!(other.append(&second, &[turn(2)], &redactor).unwrap(), [4]);
    assert_eq!(store.append(&second, &[turn(3)], &redactor).unwrap(), [5]);
    assert_eq!(store.verify(&second).unwrap(), Ok(5));
    assert_eq!(store.execution(&second).unwrap().total_turns, 3);

    // The index is trusted to say an execution is new; when it lies, the append conflicts
    // and the retry reads the head from the events.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "DELETE FROM executions WHERE execution_id = ?1",
        [second.to_string()],
    )
    .unwrap();
    let mut fresh = Store::open(&path).unwrap();
    assert_eq!(fresh.append(&second, &[turn(4)], &redactor).unwrap(), [6]);
    assert_eq!(fresh.verify(&second).unwrap(), Ok(6));
}

#[test]
fn a_crash_leaves_a_wal_with_zeroed_room_that_recovers_every_commit() {
    let (_dir, path) = temp_db();
    let redactor = Redactor::new();
    let id = ExecutionId::new();
    let mut store = Store::open(&path).unwrap();
    for n in 1..=30 {
        store.append(&id, &[turn(n)], &redactor).unwrap();
    }
    let wal = std::path::PathBuf::from(format!("{}-wal", path.display()));
    assert!(
        std::fs::metadata(&wal).unwrap().len() >= 256 << 10,
        "room was made"
    );
    // A copy of the files as a crash leaves them: nothing checkpointed, the WAL holding
    // the commits and the zeroes after them.
    let crashed = tempfile::tempdir().unwrap();
    let copy = crashed.path().join("nerve.db");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::copy(&wal, crashed.path().join("nerve.db-wal")).unwrap();
    let recovered = Store::open(&copy).unwrap();
    assert_eq!(recovered.verify(&id).unwrap(), Ok(30));
    assert_eq!(recovered.execution(&id).unwrap().total_turns, 30);
    drop(store);
}

#[test]
fn the_index_row_lags_by_turns_only_and_reads_add_them_from_the_log() {
    let (_dir, path) = temp_db();
    let redactor = Redactor::new();
    let id = ExecutionId::new();
    let as_of = |path: &std::path::Path| -> i64 {
        rusqlite::Connection::open(path)
            .unwrap()
            .query_row("SELECT as_of FROM executions", [], |row| row.get(0))
            .unwrap()
    };
    let mut store = Store::open(&path).unwrap();
    store
        .append(&id, &[started(), context()], &redactor)
        .unwrap();
    let mut seq = 2;
    for n in 1..=40 {
        // A turn as the engine records it: a model call, two messages, the turn record.
        let events = [
            model_called(n),
            message(2 * n, Message::user("q")),
            message(2 * n + 1, Message::user("a")),
            turn(n),
        ];
        seq += store.append(&id, &events, &redactor).unwrap().len() as u64;
        let summary = store.execution(&id).unwrap();
        assert_eq!(
            (
                summary.total_turns,
                summary.input_tokens,
                summary.output_tokens,
                summary.cost_micro_usd,
                summary.events
            ),
            (
                n,
                100 * u64::from(n),
                10 * u64::from(n),
                5 * u64::from(n),
                seq
            ),
            "after turn {n}"
        );
        if n == 20 {
            // A new writer (another process, or this one after a crash) picks up the
            // turns the row on disk does not hold yet.
            assert!(as_of(&path) < seq as i64, "the row lags: {}", as_of(&path));
            store = Store::open(&path).unwrap();
        }
    }
    assert!(as_of(&path) >= seq as i64 - 64);
    store
        .append(&id, &[finish(TerminationReason::Completed)], &redactor)
        .unwrap();
    assert_eq!(as_of(&path), seq as i64 + 1, "a finish is written at once");
    assert_eq!(
        store.executions().unwrap()[0],
        store.execution(&id).unwrap()
    );
}

#[test]
fn a_version_1_database_is_read_and_migrated_with_its_index() {
    let (_dir, path) = temp_db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(schema::MIGRATIONS[0]).unwrap();
    conn.pragma_update(None, "user_version", 1).unwrap();
    let (done, crashed) = (ExecutionId::new(), ExecutionId::new());
    for (id, events) in [
        (done, full_log()),
        (crashed, vec![started(), context(), turn(1), turn(2)]),
    ] {
        let mut prev = GENESIS_HASH.to_owned();
        for (i, event) in events.iter().enumerate() {
            let payload = serde_json::to_string(event).unwrap();
            let seq = i as u64 + 1;
            let ts = format!("2025-01-0{}T00:00:00Z", if id == done { 1 } else { 2 });
            let kind = event.kind().as_str();
            let hash = chain::event_hash(&prev, &id.to_string(), seq, &ts, kind, 1, &payload);
            conn.execute(
                "INSERT INTO events VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?7)",
                rusqlite::params![id.to_string(), seq as i64, ts, kind, payload, prev, hash],
            )
            .unwrap();
            prev = hash;
        }
    }
    drop(conn);

    let old = Store::open_read_only(&path).unwrap();
    let derived = old.executions().unwrap();
    assert_eq!(old.latest_checkpoint(&done).unwrap(), None);
    assert!(old.search_archive(&done, "x", 5).unwrap().is_empty());
    let migrated = Store::open(&path).unwrap();
    assert_eq!(
        migrated.executions().unwrap(),
        derived,
        "the backfilled index equals the derived one"
    );
    assert_eq!(derived[0].execution_id, crashed.to_string());
    assert_eq!(derived[0].termination_reason, None);
    assert_eq!(
        (
            derived[0].total_turns,
            derived[0].input_tokens,
            derived[0].cost_micro_usd
        ),
        (2, 200, 10)
    );
    assert_eq!(derived[1].termination_reason.as_deref(), Some("completed"));
    assert_eq!(
        (derived[1].task.as_deref(), derived[1].events),
        (Some("demo"), 7)
    );
    assert_eq!(migrated.verify(&done).unwrap(), Ok(7));
    assert_eq!(
        Store::open_read_only(&path).unwrap().executions().unwrap(),
        derived
    );
}

#[test]
fn a_version_3_database_is_rebuilt_keyed_with_its_snapshots_and_every_event_intact() {
    let (_dir, path) = temp_db();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let conn = rusqlite::Connection::open(&path).unwrap();
    for sql in &schema::MIGRATIONS[..3] {
        conn.execute_batch(sql).unwrap();
    }
    conn.pragma_update(None, "user_version", 3).unwrap();
    let id = ExecutionId::new();
    let snapshots = [r#"{"turn":1}"#, r#"{"turn":2,"k":"v"}"#];
    let checkpoint = |turn: u32, snapshot: &str| {
        Event::Checkpoint(nerve_core::event::Checkpoint {
            turn,
            snapshot_sha256: encode::sha256_hex(snapshot),
            snapshot_bytes: snapshot.len() as u64,
        })
    };
    let events = [
        started(),
        turn(1),
        checkpoint(1, snapshots[0]),
        turn(2),
        checkpoint(2, snapshots[1]),
        turn(3),
    ];
    // Another execution's events interleaved with these ones.
    let other = ExecutionId::new();
    let other_events = [started(), context(), turn(1), turn(2), turn(3), turn(4)];
    let (mut prev, mut other_prev) = (GENESIS_HASH.to_owned(), GENESIS_HASH.to_owned());
    let insert = |id: &ExecutionId, seq: u64, event: &Event, prev: &str| {
        let payload = serde_json::to_string(event).unwrap();
        let ts = "2025-01-01T00:00:00.000000Z";
        let kind = event.kind().as_str();
        let hash = chain::event_hash(prev, &id.to_string(), seq, ts, kind, 1, &payload);
        conn.execute(
            "INSERT INTO events VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6, ?7)",
            rusqlite::params![id.to_string(), seq as i64, ts, kind, payload, prev, hash],
        )
        .unwrap();
        hash
    };
    for (i, (event, other_event)) in events.iter().zip(&other_events).enumerate() {
        let seq = i as u64 + 1;
        other_prev = insert(&other, seq, other_event, &other_prev);
        let hash = insert(&id, seq, event, &prev);
        let ts = "2025-01-01T00:00:00.000000Z";
        if let Event::Checkpoint(c) = event {
            let snapshot = snapshots[c.turn as usize - 1];
            conn.execute(
                "INSERT INTO checkpoints VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                rusqlite::params![
                    id.to_string(),
                    seq as i64,
                    c.turn,
                    ts,
                    snapshot,
                    c.snapshot_sha256
                ],
            )
            .unwrap();
        }
        prev = hash;
    }
    drop(conn);

    let old = Store::open_read_only(&path).unwrap();
    let (before, other_before, checkpoint_before, listed_before) = (
        old.events(&id).unwrap(),
        old.events(&other).unwrap(),
        old.latest_checkpoint(&id).unwrap().unwrap(),
        old.executions().unwrap(),
    );
    assert_eq!((checkpoint_before.seq, checkpoint_before.turn), (5, 2));
    drop(old);

    let mut migrated = Store::open(&path).unwrap();
    assert_eq!(
        migrated.events(&id).unwrap(),
        before,
        "every event keeps its bytes"
    );
    assert_eq!(migrated.events(&other).unwrap(), other_before);
    assert_eq!(migrated.verify(&id).unwrap(), Ok(6));
    assert_eq!(migrated.verify(&other).unwrap(), Ok(6));
    assert_eq!(
        migrated.latest_checkpoint(&id).unwrap(),
        Some(checkpoint_before)
    );
    assert_eq!(migrated.executions().unwrap(), listed_before);
    let raw = rusqlite::Connection::open(&path).unwrap();
    let stored: Vec<(i64, String)> = raw
        .prepare("SELECT seq, snapshot FROM events WHERE snapshot IS NOT NULL ORDER BY seq")
        .unwrap()
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        stored,
        [(3, snapshots[0].to_owned()), (5, snapshots[1].to_owned())]
    );
    let update = raw
        .execute("UPDATE events SET snapshot = NULL", [])
        .unwrap_err();
    assert!(update.to_string().contains("append-only"), "{update}");
    let delete = raw.execute("DELETE FROM events", []).unwrap_err();
    assert!(delete.to_string().contains("append-only"), "{delete}");

    // New checkpoints go in their events' rows too.
    let seq = migrated
        .write_checkpoint(&id, 3, &serde_json::json!({"turn": 3}), &Redactor::new())
        .unwrap();
    let latest = migrated.latest_checkpoint(&id).unwrap().unwrap();
    assert_eq!((latest.seq, latest.turn), (seq, 3));
    assert_eq!(migrated.verify(&id).unwrap(), Ok(7));
    assert_eq!(
        migrated
            .append(&other, &[turn(5)], &Redactor::new())
            .unwrap(),
        [7]
    );
    assert_eq!(migrated.verify(&other).unwrap(), Ok(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_executions_share_the_writer_and_stay_gap_free() {
    let (_dir, path) = temp_db();
    let sink = Arc::new(SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap());
    let ids: Vec<ExecutionId> = (0..20).map(|_| ExecutionId::new()).collect();
    let tasks: Vec<_> = ids
        .iter()
        .map(|&id| {
            let sink = Arc::clone(&sink);
            tokio::spawn(async move {
                let mut seqs = Vec::new();
                for event in full_log() {
                    seqs.push(sink.append(id, event).await.unwrap());
                }
                seqs
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), (1..=7).collect::<Vec<u64>>());
    }
    for id in &ids {
        assert_eq!(sink.verify(*id).await.unwrap(), Ok(7));
    }
    assert_eq!(sink.executions().await.unwrap().len(), 20);
}

#[test]
fn the_docs_describe_every_event_kind() {
    let docs = include_str!("../../../docs/events.md");
    for kind in EventKind::ALL {
        assert!(
            docs.contains(&format!("### `{}`", kind.as_str())),
            "docs/events.md lacks a section for `{}`",
            kind.as_str()
        );
    }
}

#[tokio::test]
async fn an_open_reader_neither_blocks_the_writer_nor_sees_later_commits() {
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let id = ExecutionId::new();
    sink.append_all(id, vec![started(), context()])
        .await
        .unwrap();
    let reader =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let count = |conn: &rusqlite::Connection| -> i64 {
        conn.query_row("SELECT COUNT(*) FROM events", [], |row| row.get(0))
            .unwrap()
    };
    reader.execute_batch("BEGIN").unwrap();
    assert_eq!(count(&reader), 2);
    // The writer commits a whole run (and a checkpoint) while the read transaction is open.
    for (i, event) in full_log().into_iter().enumerate() {
        assert_eq!(sink.append(id, event).await.unwrap(), i as u64 + 3);
    }
    sink.write_checkpoint(id, 2, serde_json::json!({}))
        .await
        .unwrap();
    assert_eq!(count(&reader), 2, "the reader's snapshot does not move");
    reader.execute_batch("COMMIT").unwrap();
    assert_eq!(count(&reader), 10);
}

#[test]
fn a_long_log_replays_the_same_on_two_threads() {
    let mut events = vec![
        started(),
        context(),
        transition(TaskStatus::Assigned, TaskStatus::InProgress),
    ];
    for n in 1..=1000 {
        events.extend([
            model_called(n),
            tool_started(n, &format!("c{n}")),
            tool_finished(n, &format!("c{n}")),
            message(n - 1, Message::user(format!("turn {n}"))),
            turn(n),
        ]);
    }
    events.push(finish(TerminationReason::Completed));
    let mut rows = stored(&events);
    assert!(rows.len() > 4096, "long enough for the parallel path");
    let whole = replay("x", &rows);
    assert_eq!(
        (whole.score, whole.total_turns, whole.messages.len()),
        (100, 1000, 1000)
    );
    assert!(whole.gaps.is_empty(), "{:?}", whole.gaps);
    rows[4500].payload = rows[4500].payload.replace("turn", "tvrn");
    let tampered = replay("x", &rows);
    assert_eq!(tampered.gaps[0].kind, GapKind::BrokenChain);
    assert!(
        tampered.gaps[0]
            .detail
            .starts_with("hash chain broken at sequence 4501"),
        "{}",
        tampered.gaps[0].detail
    );

    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).unwrap();
    let id = ExecutionId::new();
    store.append(&id, &events, &Redactor::new()).unwrap();
    let streamed = store.replay(&id).unwrap();
    assert_eq!(
        streamed,
        replay(&id.to_string(), &store.events(&id).unwrap())
    );
    assert_eq!(
        (streamed.score, streamed.events),
        (100, events.len() as u64)
    );
    drop(store);

    // Broken chains: the two threads share the hash checks by batch of 512 events, and
    // the earliest break is reported, wherever it was found. Each step adds an earlier one:
    // in a batch the reading thread checks, in one the decoding thread checks, a broken
    // link, and a reading-thread break before a decoding-thread one.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("DROP TRIGGER events_no_update").unwrap();
    let reader = Store::open_read_only(&path).unwrap();
    for (seq, column, first_broken) in [
        (1500, "payload", 1500),
        (800, "payload", 800),
        (700, "prev_hash", 700),
        (300, "ts", 300),
    ] {
        let sql = format!("UPDATE events SET {column} = {column} || 'x' WHERE seq = ?1");
        assert_eq!(conn.execute(&sql, [seq]).unwrap(), 1);
        let streamed = reader.replay(&id).unwrap();
        assert_eq!(
            streamed,
            replay(&id.to_string(), &reader.events(&id).unwrap()),
            "broken at {seq}"
        );
        let broken = streamed
            .gaps
            .iter()
            .find(|gap| gap.kind == GapKind::BrokenChain)
            .unwrap();
        assert!(
            broken
                .detail
                .starts_with(&format!("hash chain broken at sequence {first_broken}:")),
            "{}",
            broken.detail
        );
    }
}

#[tokio::test]
async fn the_sink_is_the_archive_brain_compacts_into() {
    use nerve_core::{ArchivedBlock, ContextArchive};
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let (id, other) = (ExecutionId::new(), ExecutionId::new());
    let block = ArchivedBlock {
        id: BlockId::new(),
        messages: vec![Message::user(
            "cargo test failed: 3 assertions in the tokenizer",
        )],
        note: "3 tool outputs masked at turn 12".into(),
    };
    sink.archive(id, block.clone()).await.unwrap();
    assert_eq!(sink.fetch(id, block.id).await.unwrap(), Some(block.clone()));
    assert_eq!(sink.fetch(other, block.id).await.unwrap(), None);
    let hits = sink.search(id, "tokenizer assertions", 5).await.unwrap();
    assert_eq!(
        (hits.len(), hits[0].id, hits[0].note.as_str()),
        (1, block.id, "3 tool outputs masked at turn 12")
    );
    assert!(hits[0].snippet.contains("tokenizer"), "{}", hits[0].snippet);
    assert!(
        sink.search(id, "tokenizer unrelated", 5)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(sink.search(id, "\" OR *", 5).await.unwrap().is_empty());
    assert!(
        sink.archive(id, block).await.is_err(),
        "a block id is archived once"
    );
}

/// A compaction's blocks go in one write; each is there as if archived alone.
#[tokio::test]
async fn the_sink_archives_a_compactions_blocks_in_one_write() {
    use nerve_core::{ArchivedBlock, ContextArchive};
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let id = ExecutionId::new();
    let blocks: Vec<ArchivedBlock> = BlockId::batch(3)
        .into_iter()
        .enumerate()
        .map(|(i, block)| ArchivedBlock {
            id: block,
            messages: vec![Message::user(format!(
                "output {i}: listening on port 84{i}0"
            ))],
            note: format!("output of shell masked at turn {i}"),
        })
        .collect();
    sink.archive_many(id, blocks.clone()).await.unwrap();
    for block in &blocks {
        assert_eq!(
            sink.fetch(id, block.id).await.unwrap().as_ref(),
            Some(block)
        );
    }
    let hits = sink.search(id, "8410", 5).await.unwrap();
    assert_eq!(
        hits.iter().map(|h| h.id).collect::<Vec<_>>(),
        [blocks[1].id]
    );
    sink.archive_many(id, Vec::new()).await.unwrap();
}

#[test]
fn an_id_prefix_finds_its_executions_in_id_order() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).unwrap();
    let redactor = Redactor::new();
    let ids: Vec<ExecutionId> = [
        "0192f0c4-7b1e-7c3a-9f00-4a5b6c7d8e9f",
        "0192f0c4-7b1e-7c3a-9f00-000000000001",
        "0192f0c5-0000-7000-8000-000000000000",
    ]
    .iter()
    .map(|id| id.parse().unwrap())
    .collect();
    for id in &ids {
        store.append(id, &[started()], &redactor).unwrap();
    }
    let check = |prefix: &str, limit: usize, expected: &[usize]| {
        let found = store.executions_with_prefix(prefix, limit).unwrap();
        let expected: Vec<ExecutionId> = expected.iter().map(|i| ids[*i]).collect();
        assert_eq!(found, expected, "prefix {prefix:?}");
    };
    check("0192f0c", 10, &[1, 0, 2]);
    check("0192f0c", 2, &[1, 0]);
    check("0192F0C4", 10, &[1, 0]);
    check("0192f0c4-7b1e-7c3a-9f00-4a", 10, &[0]);
    check("0192f0c5", 10, &[2]);
    check("0192f0c6", 10, &[]);
    check("", 10, &[]);
    check("01%", 10, &[]);
    check("zz", 10, &[]);
    check(&ids[2].to_string(), 10, &[2]);
}

#[tokio::test]
async fn the_writer_serves_id_prefixes_like_the_store() {
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let id: ExecutionId = "0192f0c4-7b1e-7c3a-9f00-4a5b6c7d8e9f".parse().unwrap();
    sink.append_all(id, vec![started()]).await.unwrap();
    assert_eq!(
        sink.executions_with_prefix("0192".into(), 5).await.unwrap(),
        [id]
    );
    assert!(
        sink.executions_with_prefix("0193".into(), 5)
            .await
            .unwrap()
            .is_empty()
    );
}

mod backends;
mod log_order;

/// A summary restating an output ranks below the output itself, however well it matches.
#[tokio::test]
async fn the_archive_ranks_original_outputs_above_summaries() {
    use nerve_core::{ArchivedBlock, ContextArchive};
    let (_dir, path) = temp_db();
    let sink = SqliteSink::open(&path, Arc::new(Redactor::new())).unwrap();
    let id = ExecutionId::new();
    let summary = ArchivedBlock {
        id: BlockId::new(),
        messages: vec![Message::user(
            "## Findings\n- ledger port 8443, ledger port 8443, ledger port 8443",
        )],
        note: "summary, folded into a new one at turn 30".into(),
    };
    let original = ArchivedBlock {
        id: BlockId::new(),
        messages: vec![Message::user(
            "listen address 0.0.0.0, the ledger port is 8443, with many other lines around it \
             that make this block a much weaker match by bm25 than the summary's repetitions",
        )],
        note: "output of shell masked at turn 12".into(),
    };
    sink.archive(id, summary.clone()).await.unwrap();
    sink.archive(id, original.clone()).await.unwrap();
    let hits = sink.search(id, "ledger 8443", 5).await.unwrap();
    let ids: Vec<BlockId> = hits.iter().map(|h| h.id).collect();
    assert_eq!(ids, vec![original.id, summary.id]);
}
