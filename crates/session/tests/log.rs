//! Cross-process tests of the event log: a writer killed with SIGKILL loses nothing it
//! acknowledged, and a reader in another process sees whole, verifying chains while fifty
//! executions append. The other processes are this test binary itself, re-executed with
//! `NERVE_LOG_CHILD` naming the role; the `child` test is their entry point and does
//! nothing in a normal run.

// Test helpers may unwrap: a failure here is a test failure with its reason.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use nerve_core::event::{
    ContextCreated, Finish, MessageAppended, ModelCalled, Started, TaskTransition,
    ToolCallFinished, ToolCallStarted, TurnCompleted,
};
use nerve_core::{
    Event, EventSink, ExecutionId, LoopType, Message, MicroUsd, Redactor, TaskId, TaskStatus,
    TerminationReason, TokenUsage, ToolCall, ToolResult,
};
use nerve_session::{GapKind, SqliteSink, Store};

const ROLE: &str = "NERVE_LOG_CHILD";
const DB: &str = "NERVE_LOG_DB";
/// Every line a child reports starts with this, so libtest's own output is never mistaken
/// for a report.
const MARK: &str = "@nerve-log ";
const EXECUTIONS: usize = 50;
const TURNS: u32 = 6;

/// The first events of a run, as the engine writes them.
fn start_events() -> Vec<Event> {
    vec![
        Event::Started(Started {
            task_id: TaskId::new(),
            task: "fix the build".into(),
            workspace: "/w".into(),
            loop_type: LoopType::React,
            provider: "script:x".into(),
            model: "scripted".into(),
            max_turns: 50,
            config: serde_json::json!({}),
            parent: None,
            call_id: None,
            fork: None,
        }),
        Event::ContextCreated(ContextCreated {
            context_window: Some(16_000),
            tools: vec!["shell".into()],
        }),
        Event::TaskTransition(TaskTransition {
            from: TaskStatus::Assigned,
            to: TaskStatus::InProgress,
        }),
    ]
}

/// One turn with one tool call.
fn turn_events(turn: u32) -> Vec<Event> {
    let call = ToolCall {
        id: format!("call_{turn}").as_str().into(),
        name: "shell".into(),
        arguments: serde_json::json!({"command": format!("cargo build -p crate{turn}")}),
    };
    vec![
        Event::ModelCalled(ModelCalled {
            turn,
            purpose: nerve_core::event::CallPurpose::Agent,
            outcome: nerve_core::event::CallOutcome::Ok,
            usage: TokenUsage::new(1000, 50),
            time_to_first_token_ms: None,
            tokens_per_second: None,
        }),
        Event::ToolCallStarted(ToolCallStarted {
            turn,
            call: call.clone(),
            repaired: None,
        }),
        Event::ToolCallFinished(ToolCallFinished {
            turn,
            result: ToolResult {
                call_id: call.id.clone(),
                name: "shell".into(),
                content: "ok\n".repeat(20),
                is_error: false,
            },
            duration_ms: 3,
            interrupted: false,
            child: None,
        }),
        Event::MessageAppended(MessageAppended {
            index: turn - 1,
            message: Message::user(format!("turn {turn} observed the build output")),
        }),
        Event::TurnCompleted(TurnCompleted {
            turn,
            usage: TokenUsage::new(1000, 50),
            cost: MicroUsd(30),
            tool_calls: vec!["shell".into()],
            finish: nerve_core::FinishReason::ToolCalls,
            duration_ms: 5,
        }),
    ]
}

/// A whole run of `turns` turns that finishes.
fn run_events(turns: u32) -> Vec<Event> {
    let mut events = start_events();
    events.extend((1..=turns).flat_map(turn_events));
    events.push(Event::Finish(Finish {
        termination_reason: TerminationReason::Completed,
        task_status: TaskStatus::InReview,
        total_turns: turns,
        usage: TokenUsage::new(1000 * u64::from(turns), 50 * u64::from(turns)),
        cost: MicroUsd(30 * u64::from(turns)),
        error: None,
    }));
    events
}

/// Kills and reaps the child when the test ends, however it ends.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_child(role: &str, db: &Path) -> Reaped {
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1", "-q"])
        .env(ROLE, role)
        .env(DB, db)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Reaped(child)
}

/// The reports of a child, one per line, without the mark.
fn reports(child: &mut Reaped) -> impl Iterator<Item = String> + use<> {
    let stdout = child.0.stdout.take().unwrap();
    BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| line.find(MARK).map(|at| line[at + MARK.len()..].to_owned()))
}

/// Writes one report line, or exits when the parent is gone (the pipe broke).
fn report(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{MARK}{line}")
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

#[test]
fn child() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let db = std::path::PathBuf::from(std::env::var(DB).unwrap());
    match role.as_str() {
        "writer" => writer_child(&db),
        "reader" => reader_child(&db),
        other => panic!("unknown child role {other}"),
    }
}

/// Appends in a loop from four executions at once and reports every append that returned.
fn writer_child(db: &Path) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let sink = Arc::new(SqliteSink::open(db, Arc::new(Redactor::new())).unwrap());
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let sink = Arc::clone(&sink);
                tokio::spawn(async move {
                    let id = ExecutionId::new();
                    // Never finishes: it runs until it is killed (or its parent is gone).
                    let events = start_events()
                        .into_iter()
                        .chain((1..).flat_map(turn_events));
                    for event in events {
                        let seq = sink.append(id, event).await.unwrap();
                        report(&format!("committed {id} {seq}"));
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// Reads every execution over and over until all of them finished, checking each snapshot:
/// gap-free sequence numbers from 1, a verifying chain, and a replay whose only gaps are the
/// ones of a run in progress.
fn reader_child(db: &Path) {
    let parent = std::os::unix::process::parent_id();
    let store = Store::open_read_only(db).unwrap();
    report("ready");
    let (mut passes, mut mid_turn) = (0u64, 0u64);
    loop {
        if std::os::unix::process::parent_id() != parent {
            return;
        }
        let listed = store.executions().unwrap();
        let mut finished = 0;
        for summary in &listed {
            let id: ExecutionId = summary.execution_id.parse().unwrap();
            let events = store.events(&id).unwrap();
            let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
            assert_eq!(
                seqs,
                (1..=events.len() as u64).collect::<Vec<_>>(),
                "{id}: sequence numbers skip"
            );
            let replayed = nerve_session::replay(&summary.execution_id, &events);
            for gap in &replayed.gaps {
                assert!(
                    matches!(
                        gap.kind,
                        GapKind::NoFinish | GapKind::TurnIncomplete | GapKind::ToolCallInDoubt
                    ),
                    "{id}: a reader saw {gap:?}"
                );
                mid_turn += u64::from(gap.kind == GapKind::TurnIncomplete);
            }
            if replayed.termination_reason.is_some() {
                assert!(
                    replayed.gaps.is_empty(),
                    "{id}: finished with gaps {:?}",
                    replayed.gaps
                );
                finished += 1;
            }
        }
        passes += 1;
        if finished == EXECUTIONS {
            report(&format!("done {passes} {mid_turn}"));
            return;
        }
    }
}

#[test]
fn a_writer_killed_with_sigkill_loses_nothing_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let mut child = spawn_child("writer", &db);
    let mut acknowledged: HashMap<String, u64> = HashMap::new();
    let mut lines = reports(&mut child);
    let mut seen = 0;
    for line in lines.by_ref() {
        let mut words = line.split_whitespace().skip(1);
        let (id, seq) = (
            words.next().unwrap().to_owned(),
            words.next().unwrap().parse::<u64>().unwrap(),
        );
        let highest = acknowledged.entry(id).or_default();
        *highest = (*highest).max(seq);
        seen += 1;
        if seen == 400 {
            break;
        }
    }
    child.0.kill().unwrap();
    // Appends acknowledged before the kill may still sit in the pipe.
    for line in lines {
        let mut words = line.split_whitespace().skip(1);
        let (id, seq) = (
            words.next().unwrap().to_owned(),
            words.next().unwrap().parse::<u64>().unwrap(),
        );
        let highest = acknowledged.entry(id).or_default();
        *highest = (*highest).max(seq);
    }
    child.0.wait().unwrap();

    // Opening read-write recovers the WAL the way the next `nerve run` would.
    let store = Store::open(&db).unwrap();
    assert_eq!(acknowledged.len(), 4);
    for (id, &highest) in &acknowledged {
        let id: ExecutionId = id.parse().unwrap();
        let verified = store.verify(&id).unwrap().unwrap();
        assert!(
            verified >= highest,
            "{id}: {verified} events on disk, but {highest} were acknowledged"
        );
        let replayed = store.replay(&id).unwrap();
        assert!(replayed.gaps.iter().any(|g| g.kind == GapKind::NoFinish));
        assert!(
            !replayed
                .gaps
                .iter()
                .any(|g| matches!(g.kind, GapKind::BrokenChain | GapKind::SequenceGap))
        );
        assert_eq!(
            store.execution(&id).unwrap().events,
            verified,
            "the index committed with the events"
        );
    }
}

#[test]
fn fifty_executions_append_while_another_process_reads() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("concurrent.db");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sink = Arc::new(SqliteSink::open(&db, Arc::new(Redactor::new())).unwrap());
    let mut reader = spawn_child("reader", &db);
    let mut lines = reports(&mut reader);
    assert_eq!(
        lines.next().as_deref(),
        Some("ready"),
        "the reader is running before the writes start"
    );

    let expected = run_events(TURNS).len() as u64;
    let ids: Vec<ExecutionId> = (0..EXECUTIONS).map(|_| ExecutionId::new()).collect();
    runtime.block_on(async {
        let tasks: Vec<_> = ids
            .iter()
            .map(|&id| {
                let sink = Arc::clone(&sink);
                tokio::spawn(async move {
                    let mut seqs = Vec::new();
                    for event in run_events(TURNS) {
                        seqs.push(sink.append(id, event).await.unwrap());
                    }
                    seqs
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(
                task.await.unwrap(),
                (1..=expected).collect::<Vec<_>>(),
                "gap-free, in order"
            );
        }
    });

    let done = lines.next().unwrap_or_default();
    assert!(
        done.starts_with("done "),
        "the reader ended without finishing: {done:?}"
    );
    assert!(reader.0.wait().unwrap().success());
    let store = Store::open_read_only(&db).unwrap();
    for id in &ids {
        assert_eq!(store.verify(id).unwrap(), Ok(expected));
        assert_eq!(store.replay(id).unwrap().score, 100);
    }
    assert_eq!(store.executions().unwrap().len(), EXECUTIONS);
}
