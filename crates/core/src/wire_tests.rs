//! Snapshots of the JSON form of every core enum and message type: the wire contract.
//! Refresh with `cargo insta test --accept -p nerve-core` after a deliberate change.

use serde_json::json;
use uuid::Uuid;

use crate::event::{
    CallPurpose, ContextCreated, Event, Finish, MessageAppended, ModelCalled, Retry, Started,
    TaskTransition, ToolCallFinished, ToolCallStarted, TurnCompleted,
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
        finish: "tool_calls".into(),
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
            outcome: "ok".into(),
            usage,
        }),
        Event::ToolCallStarted(ToolCallStarted {
            turn: 1,
            call: call(),
        }),
        Event::ToolCallFinished(ToolCallFinished {
            turn: 1,
            result: result(),
            duration_ms: 7,
        }),
        Event::TurnCompleted(TurnCompleted {
            turn: 1,
            usage,
            cost: MicroUsd(0),
            tool_calls: vec!["shell".into()],
            finish: "tool_calls".into(),
            duration_ms: 20,
        }),
        Event::TaskTransition(TaskTransition {
            from: TaskStatus::Assigned,
            to: TaskStatus::InProgress,
        }),
        Event::Retry(Retry {
            turn: 2,
            attempt: 1,
            error: "rate_limited".into(),
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
    ];
    for event in &events {
        let value = serde_json::to_value(event).unwrap();
        assert_eq!(value["kind"], event.kind().as_str());
        let back: Event = serde_json::from_value(value).unwrap();
        assert_eq!(&back, event);
    }
    insta::assert_json_snapshot!("events", events);
}
