//! Snapshots of the JSON form of every core enum and message type: the wire contract.
//! Refresh with `cargo insta test --accept -p nerve-core` after a deliberate change.

use serde_json::json;
use uuid::Uuid;

use crate::event::{
    ApprovalDecided, ApprovalDecision, ApprovalRequested, CallOutcome, CallPurpose, Checkpoint,
    Compaction, CompactionStrategy, CompactionTrigger, ContextCreated, Decider, Event, EventKind,
    Finish, MessageAppended, ModelCalled, ModelErrorKind, ProxyDecision, ProxyVerdict, Resumed,
    Retry, Stagnation, StagnationAction, Started, TaskTransition, ToolCallFinished,
    ToolCallStarted, TurnCompleted,
};
use crate::event::{
    ChangeKind, HookPoint, HookRan, HookVerdict, InstructionsFile, InstructionsLoaded,
    InstructionsSource, SkillLoaded, ToolProtocolSwitched, ToolTransport, WorkspaceChange,
    WorkspaceRewound, WorkspaceSnapshot,
};
use crate::{
    BlockId, Complexity, ExecutionStatus, LoopType, Message, MessagePart, MessageRole, MicroUsd,
    TaskId, TaskStatus, TerminationReason, TokenUsage, ToolCall, ToolResult, TurnRecord,
};

fn block() -> BlockId {
    BlockId::from_uuid(Uuid::from_u128(0x0192_f0c4_7b1e_7c3a_9f00_4a5b_6c7d_8e9f))
}

fn call() -> ToolCall {
    ToolCall {
        id: "call_1".into(),
        name: "shell".into(),
        arguments: json!({"command": "ls"}),
    }
}

fn result() -> ToolResult {
    ToolResult {
        call_id: "call_1".into(),
        name: "shell".into(),
        content: "a.txt\n".into(),
        is_error: false,
    }
}

#[test]
fn enums() {
    insta::assert_json_snapshot!(
        "enums",
        json!({
            "termination_reason": TerminationReason::ALL,
            "task_status": TaskStatus::ALL,
            "execution_status": [ExecutionStatus::Idle, ExecutionStatus::Executing, ExecutionStatus::Paused],
            "loop_type": [LoopType::React, LoopType::PlanExecute, LoopType::Hybrid, LoopType::Auto],
            "complexity": [Complexity::Simple, Complexity::Medium, Complexity::Complex, Complexity::Epic],
            "message_role": [MessageRole::System, MessageRole::User, MessageRole::Assistant, MessageRole::Tool],
            "call_purpose": [CallPurpose::Agent, CallPurpose::Plan, CallPurpose::Summary],
        })
    );
    for reason in TerminationReason::ALL {
        assert_eq!(json!(reason), json!(reason.as_str()));
    }
    for status in TaskStatus::ALL {
        assert_eq!(json!(status), json!(status.as_str()));
    }
}

#[test]
fn messages() {
    let messages = vec![
        Message::system("You are Nerve."),
        Message::user("make the failing test pass").pinned(),
        Message {
            role: MessageRole::Assistant,
            parts: vec![
                MessagePart::Thinking {
                    text: "look first".into(),
                    signature: Some("sig==".into()),
                },
                MessagePart::Text {
                    text: "Listing files.".into(),
                },
                MessagePart::ToolCall(call()),
            ],
            pinned: false,
        },
        Message::tool_result(result()),
        Message {
            role: MessageRole::User,
            parts: vec![MessagePart::CompactionSummary {
                text: "## Goal\n...".into(),
                archived: vec![block()],
            }],
            pinned: false,
        },
    ];
    insta::assert_json_snapshot!("messages", messages);
}

#[test]
fn usage_and_turns() {
    let usage = TokenUsage {
        input_tokens: 1200,
        output_tokens: 40,
        cache_read_tokens: 1000,
        cache_write_tokens: 0,
    };
    let turn = TurnRecord {
        turn: 1,
        usage,
        cost: MicroUsd(3_600),
        tool_calls: vec![call()],
        finish: crate::FinishReason::ToolCalls,
        duration_ms: 12,
    };
    insta::assert_json_snapshot!("turn_record", turn);
}

#[test]
fn events() {
    let task_id = TaskId::from_uuid(Uuid::from_u128(1));
    let usage = TokenUsage::new(1200, 40);
    let events = vec![
        Event::Started(Started {
            task_id,
            task: "make the failing test pass".into(),
            workspace: "/home/me/repo".into(),
            loop_type: LoopType::React,
            provider: "script:demo.jsonl".into(),
            model: "scripted".into(),
            max_turns: 20,
            config: json!({"timeout_secs": null}),
            parent: None,
            call_id: None,
            fork: None,
        }),
        Event::ContextCreated(ContextCreated {
            context_window: Some(128_000),
            tools: vec!["shell".into()],
        }),
        Event::MessageAppended(MessageAppended {
            index: 1,
            message: Message::user("go").pinned(),
        }),
        Event::ModelCalled(ModelCalled {
            turn: 1,
            purpose: CallPurpose::Agent,
            outcome: CallOutcome::Ok,
            usage,
            time_to_first_token_ms: Some(412),
            tokens_per_second: Some(38.5),
        }),
        Event::ToolCallStarted(ToolCallStarted {
            turn: 1,
            call: call(),
            repaired: None,
        }),
        Event::ToolCallFinished(ToolCallFinished {
            turn: 1,
            result: result(),
            duration_ms: 7,
            interrupted: false,
            child: None,
        }),
        Event::TurnCompleted(TurnCompleted {
            turn: 1,
            usage,
            cost: MicroUsd(0),
            tool_calls: vec!["shell".into()],
            finish: crate::FinishReason::ToolCalls,
            duration_ms: 20,
        }),
        Event::TaskTransition(TaskTransition {
            from: TaskStatus::Assigned,
            to: TaskStatus::InProgress,
        }),
        Event::Retry(Retry {
            turn: 2,
            attempt: 1,
            error: ModelErrorKind::RateLimited,
            delay_ms: 20,
        }),
        Event::Finish(Finish {
            termination_reason: TerminationReason::Completed,
            task_status: TaskStatus::InReview,
            total_turns: 2,
            usage,
            cost: MicroUsd(0),
            error: None,
        }),
        Event::Compaction(Compaction {
            turn: 12,
            strategy: CompactionStrategy::Summarize,
            trigger: CompactionTrigger::HardThreshold,
            from_index: 2,
            to_index: 30,
            replacement: vec![Message {
                role: MessageRole::User,
                parts: vec![MessagePart::CompactionSummary {
                    text: "## Goal\n...".into(),
                    archived: vec![block()],
                }],
                pinned: false,
            }],
            archived: vec![block()],
            tokens_before: 102_400,
            tokens_after: 31_000,
            summary: Some("## Goal\n...".into()),
            extractive: false,
        }),
        Event::Stagnation(Stagnation {
            turn: 9,
            action: StagnationAction::Corrected,
            repetition_ratio: 0.5,
            cycle_length: Some(2),
            repeated_calls: vec!["shell:3f2a9c1e5b7d4a60".into()],
            no_progress_call: None,
            step: None,
        }),
        Event::ApprovalRequested(ApprovalRequested {
            turn: 3,
            call: call(),
            rule: "shell: ask".into(),
        }),
        Event::ApprovalDecided(ApprovalDecided {
            turn: 3,
            call_id: "call_1".into(),
            decision: ApprovalDecision::Denied,
            decided_by: Decider::User,
            rule: "shell: ask".into(),
            reason: Some("not on main".into()),
        }),
        Event::ProxyDecision(ProxyDecision {
            host: "api.github.com".into(),
            method: "GET".into(),
            path: "/repos/o/r/pulls".into(),
            decision: ProxyVerdict::Injected,
            status: Some(200),
            credential: Some("github".into()),
            reason: None,
        }),
        Event::Checkpoint(Checkpoint {
            turn: 4,
            snapshot_sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
                .into(),
            snapshot_bytes: 18_211,
        }),
        Event::Resumed(Resumed {
            attempt: 1,
            from_checkpoint_seq: Some(41),
            from_turn: 4,
            in_doubt: vec!["call_7".into()],
        }),
        Event::WorkspaceSnapshot(WorkspaceSnapshot {
            turn: 4,
            tree: "9c1185a5c5e9fc54612808977ee8f548b2258d31".into(),
            outside: vec![
                WorkspaceChange {
                    change: ChangeKind::Added,
                    path: "notes/todo.md".into(),
                },
                WorkspaceChange {
                    change: ChangeKind::Modified,
                    path: "src/lib.rs".into(),
                },
                WorkspaceChange {
                    change: ChangeKind::Deleted,
                    path: "old.txt".into(),
                },
            ],
        }),
        Event::WorkspaceRewound(WorkspaceRewound {
            turn: 3,
            tree: "4b825dc642cb6eb9a060e54bf8d69288fbee4904".into(),
            forced: true,
            changes: vec![WorkspaceChange {
                change: ChangeKind::Deleted,
                path: "notes/todo.md".into(),
            }],
        }),
        Event::ToolProtocolSwitched(ToolProtocolSwitched {
            turn: 1,
            from: ToolTransport::Native,
            to: ToolTransport::Text,
            reason: "the answer wrote a call of `read_file` as text and made no native call".into(),
        }),
        Event::InstructionsLoaded(InstructionsLoaded {
            turn: 2,
            files: vec![InstructionsFile {
                source: InstructionsSource::Workspace,
                path: "crates/web/AGENTS.md".into(),
                sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
                bytes: 4,
                truncated: false,
            }],
        }),
        Event::HookRan(HookRan {
            point: HookPoint::PreToolUse,
            turn: 1,
            call_id: Some("call_1".into()),
            tool: Some("shell".into()),
            command: vec!["./check.sh".into()],
            exit_code: Some(2),
            timed_out: false,
            verdict: HookVerdict::Block,
            stderr: "no rm here".into(),
            duration_ms: 12,
        }),
        Event::SkillLoaded(SkillLoaded {
            turn: 1,
            call_id: "call_2".into(),
            name: "pdf".into(),
            source: InstructionsSource::User,
            path: "/home/u/.config/nerve/skills/pdf/SKILL.md".into(),
            file: None,
            sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
            bytes: 4,
            truncated: false,
        }),
    ];
    let mut kinds: Vec<&str> = events.iter().map(|e| e.kind().as_str()).collect();
    let mut all: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
    kinds.sort_unstable();
    all.sort_unstable();
    assert_eq!(kinds, all, "exactly one example of every kind");
    for event in &events {
        let value = serde_json::to_value(event).unwrap();
        assert_eq!(value["kind"], event.kind().as_str());
        assert_eq!(
            EventKind::from_wire(event.kind().as_str()),
            Some(event.kind())
        );
        let back: Event = serde_json::from_value(value).unwrap();
        assert_eq!(&back, event);
    }
    insta::assert_json_snapshot!("events", events);
}

/// A snapshot taken at a turn's end has no `outside` list on the wire, and reads back.
#[test]
fn workspace_snapshot_of_a_turn() {
    let event = Event::WorkspaceSnapshot(WorkspaceSnapshot {
        turn: 3,
        tree: "4b825dc642cb6eb9a060e54bf8d69288fbee4904".into(),
        outside: Vec::new(),
    });
    let wire = json!({"kind": "workspace_snapshot", "turn": 3,
        "tree": "4b825dc642cb6eb9a060e54bf8d69288fbee4904"});
    assert_eq!(serde_json::to_value(&event).unwrap(), wire);
    assert_eq!(serde_json::from_value::<Event>(wire).unwrap(), event);
}

/// `model_called` without stream timings (older logs, whole answers, the scripted
/// provider) reads back and writes out without the fields.
#[test]
fn model_called_without_stream_timings() {
    let old = json!({"kind": "model_called", "turn": 2, "purpose": "agent", "outcome": "timeout",
        "usage": {"input_tokens": 0, "output_tokens": 0}});
    let event: Event = serde_json::from_value(old.clone()).unwrap();
    let Event::ModelCalled(called) = &event else {
        panic!("{event:?}");
    };
    assert_eq!(called.time_to_first_token_ms, None);
    assert_eq!(called.tokens_per_second, None);
    let back = serde_json::to_value(&event).unwrap();
    assert!(back.get("time_to_first_token_ms").is_none(), "{back}");
    assert!(back.get("tokens_per_second").is_none(), "{back}");
}

/// `tool_call_started` of a call that was not repaired (every call in older logs) has no
/// `repaired` on the wire; a repaired one carries what was repaired.
#[test]
fn tool_call_started_with_and_without_a_repair() {
    let plain = Event::ToolCallStarted(ToolCallStarted {
        turn: 2,
        call: call(),
        repaired: None,
    });
    let wire = serde_json::to_value(&plain).unwrap();
    assert!(wire.get("repaired").is_none(), "{wire}");
    assert_eq!(serde_json::from_value::<Event>(wire).unwrap(), plain);
    let repaired = Event::ToolCallStarted(ToolCallStarted {
        turn: 2,
        call: call(),
        repaired: Some("escaped 6 double quotes inside strings".into()),
    });
    let wire = serde_json::to_value(&repaired).unwrap();
    assert_eq!(wire["repaired"], "escaped 6 double quotes inside strings");
    assert_eq!(serde_json::from_value::<Event>(wire).unwrap(), repaired);
}

/// `model_called`'s outcome and `retry`'s error are one string each on the wire, every
/// value read back as it was written, and a string that names no outcome is refused.
#[test]
fn call_outcomes_are_one_string_each() {
    use ModelErrorKind::{
        Auth, BadRequest, Connection, ContentFilter, ContextOverflow, InvalidResponse, NotFound,
        Overloaded, Quota, RateLimited, Runaway, ScriptExhausted, ServerError, ServerRejected,
        Timeout, TruncatedStream,
    };
    let kinds = [
        RateLimited,
        Overloaded,
        ServerError,
        ServerRejected,
        Timeout,
        Connection,
        TruncatedStream,
        ContextOverflow,
        Auth,
        BadRequest,
        NotFound,
        Quota,
        ContentFilter,
        InvalidResponse,
        Runaway,
        ScriptExhausted,
    ];
    let mut outcomes = vec![
        (CallOutcome::Ok, "ok"),
        (CallOutcome::Cancelled, "cancelled"),
    ];
    for kind in kinds {
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        outcomes.push((CallOutcome::Failed(kind), kind.as_str()));
    }
    for (outcome, text) in outcomes {
        assert_eq!(serde_json::to_value(outcome).unwrap(), text);
        assert_eq!(outcome.to_string(), text);
        let back: CallOutcome = serde_json::from_value(text.into()).unwrap();
        assert_eq!(back, outcome);
    }
    assert!(serde_json::from_str::<CallOutcome>("\"melted\"").is_err());
}
