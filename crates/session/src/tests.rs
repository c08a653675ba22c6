//! Store, writer and replay tests against a real SQLite file on disk.

use std::sync::Arc;

use nerve_core::event::{ContextCreated, Finish, MessageAppended, Started, TaskTransition, TurnCompleted};
use nerve_core::{
    Event, EventSink, ExecutionId, LoopType, Message, MicroUsd, Redactor, TaskId, TaskStatus,
    TerminationReason, TokenUsage,
};

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
    })
}

fn turn(n: u32) -> Event {
    Event::TurnCompleted(TurnCompleted {
        turn: n,
        usage: TokenUsage::new(100, 10),
        cost: MicroUsd(5),
        tool_calls: vec![],
        finish: "stop".into(),
        duration_ms: 1,
    })
}

fn full_log() -> Vec<Event> {
    vec![
        started(),
        Event::ContextCreated(ContextCreated { context_window: None, tools: vec![] }),
        Event::TaskTransition(TaskTransition { from: TaskStatus::Assigned, to: TaskStatus::InProgress }),
        Event::MessageAppended(MessageAppended { index: 0, message: Message::system("sys") }),
        turn(1),
        turn(2),
        Event::Finish(Finish {
            termination_reason: TerminationReason::Completed,
            task_status: TaskStatus::InReview,
            total_turns: 2,
            usage: TokenUsage::new(200, 20),
            cost: MicroUsd(10),
            error: None,
        }),
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

fn check(events: &[Event], score: u32, gaps: &[GapKind]) -> Replay {
    let replayed = replay("x", &stored(events));
    assert_eq!(replayed.score, score, "{replayed:#?}");
    let kinds: Vec<GapKind> = replayed.gaps.iter().map(|g| g.kind).collect();
    assert_eq!(kinds, gaps, "{replayed:#?}");
    replayed
}

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
    check(&[started()], 15, &[GapKind::NoFinish]);
    check(&[], 0, &[GapKind::NoFinish]);
}

#[test]
fn replay_skips_malformed_and_duplicate_turns() {
    let mut events = stored(&[started(), turn(1), turn(1), turn(2)]);
    events[1].payload = r#"{"kind":"turn_completed","turn":"one"}"#.into();
    let replayed = replay("x", &events);
    assert_eq!(replayed.malformed_events, 1);
    assert_eq!(replayed.duplicate_turns, 0);
    assert_eq!(replayed.total_turns, 2);

    let replayed = replay("x", &stored(&[started(), turn(1), turn(1), turn(2)]));
    assert_eq!(replayed.duplicate_turns, 1);
    assert_eq!(replayed.total_turns, 2);
    assert_eq!(replayed.usage.input_tokens, 200, "a duplicate turn is not counted twice");
}

#[test]
fn replay_reports_non_contiguous_turns() {
    check(&[started(), turn(1), turn(3)], 50, &[GapKind::TurnsNotContiguous, GapKind::NoFinish]);
}

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
    let replayed = replay(&id.to_string(), &store.events(&id).unwrap());
    assert_eq!(replayed.score, 100);
    let listed = store.executions().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].termination_reason.as_deref(), Some("completed"));
    assert!(matches!(store.events(&ExecutionId::new()), Err(SessionError::UnknownExecution(_))));
}

#[tokio::test]
async fn secrets_never_reach_the_file() {
    let (_dir, path) = temp_db();
    let canary = secrecy::SecretString::from(CANARY);
    let redactor = Redactor::with_secrets([("canary", &canary)]).unwrap();
    let sink = SqliteSink::open(&path, Arc::new(redactor)).unwrap();
    let id = ExecutionId::new();
    let text = format!("the token is {} and ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", CANARY);
    sink.append(id, Event::MessageAppended(MessageAppended { index: 0, message: Message::user(text) }))
        .await
        .unwrap();
    drop(sink);
    let store = Store::open_read_only(&path).unwrap();
    let events = store.events(&id).unwrap();
    assert!(events[0].payload.contains("[REDACTED:canary]"), "{}", events[0].payload);
    assert!(events[0].payload.contains("[REDACTED:github_token]"));
    for file in std::fs::read_dir(path.parent().unwrap()).unwrap() {
        let bytes = std::fs::read(file.unwrap().path()).unwrap();
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
    let conn = rusqlite::Connection::open(&path).unwrap();
    let update = conn.execute("UPDATE events SET payload = '{}' WHERE seq = 3", []).unwrap_err();
    assert!(update.to_string().contains("append-only"), "{update}");
    let delete = conn.execute("DELETE FROM events WHERE seq = 3", []).unwrap_err();
    assert!(delete.to_string().contains("append-only"), "{delete}");

    conn.execute_batch("DROP TRIGGER events_no_update").unwrap();
    conn.execute("UPDATE events SET payload = replace(payload, 'demo', 'evil') WHERE seq = 1", []).unwrap();
    let store = Store::open_read_only(&path).unwrap();
    let broken = store.verify(&id).unwrap().unwrap_err();
    assert_eq!(broken.seq, 1);
    let replayed = replay(&id.to_string(), &store.events(&id).unwrap());
    assert_eq!(replayed.gaps[0].kind, GapKind::BrokenChain);
}
