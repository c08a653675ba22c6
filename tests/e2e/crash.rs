//! Crash recovery: `nerve run` on a 30-turn cassette (examples/crash) killed with SIGKILL
//! before a tool call, during one and between turns. Each time the log replays with the
//! right gaps and verifies, `nerve resume` finishes the run, the workspace ends exactly as
//! after an uninterrupted run, no event is lost or duplicated, and the killed run's
//! container is reaped.
//!
//! The kill points are where the cassette holds the run still for seconds (a rate-limit
//! backoff, a `sleep 5` tool call, a slow model answer), found by polling the log, so the
//! log's state at the kill is known and the test does not depend on timing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::{Value, json};

use crate::support::{
    LogEvent, containers_of, copy_example, docker_available, events_json, is_turn_event, last_json,
    nerve, read_log, root, spawn_nerve, stderr, tree, wait_for_event,
};

/// Turns of the cassette, the final answer included.
const TURNS: u64 = 30;

fn provider() -> String {
    format!(
        "script:{}",
        root().join("examples/crash/cassette.jsonl").display()
    )
}

fn run_args(workspace: &Path, provider: &str) -> Vec<String> {
    let task = root().join("examples/crash/task.txt");
    [
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task-file",
        task.to_str().unwrap(),
        "--provider",
        provider,
        "--max-turns",
        "40",
        "--json",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// The workspace after an uninterrupted run of the cassette, computed once for all tests.
fn uninterrupted() -> &'static BTreeMap<String, Vec<u8>> {
    static TREE: OnceLock<BTreeMap<String, Vec<u8>>> = OnceLock::new();
    TREE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let workspace = copy_example("crash", dir.path());
        let db = dir.path().join("nerve.db");
        let args = run_args(&workspace, &provider());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = nerve(&db, &args);
        assert!(run.status.success(), "{}", stderr(&run));
        let result = last_json(&run);
        assert_eq!(result["termination_reason"], "completed", "{result}");
        assert_eq!(result["total_turns"], TURNS, "{result}");
        let files = tree(&workspace);
        assert_eq!(
            files.get("config.ini").map(Vec::as_slice),
            Some(&b"name=counter\nversion=3\n"[..]),
            "the cassette's edits landed"
        );
        files
    })
}

/// Where a run is killed, and what its log must say about it then.
struct KillPoint {
    /// What the test waits for, in words.
    what: &'static str,
    /// The event after which the run is killed.
    after: fn(&LogEvent) -> bool,
    /// Turns completed when it is killed.
    completed: u64,
    /// Gap kinds `replay --json` reports for the killed run, in its order.
    gaps: &'static [&'static str],
    /// The tool call in doubt, if any.
    in_doubt: Option<&'static str>,
}

#[test]
fn killed_before_a_tool_call_the_resume_runs_it() {
    // Turn 10's first model call was rate limited; killed during the 3 s backoff. The turn
    // began (a model call is recorded) but its write_file never started.
    check(&KillPoint {
        what: "the retry of turn 10",
        after: |e| is_turn_event(e, "retry", 10),
        completed: 9,
        gaps: &["turn_incomplete", "no_finish"],
        in_doubt: None,
    });
}

#[test]
fn killed_during_a_tool_call_the_call_is_in_doubt_and_not_rerun() {
    // Turn 17 runs `sleep 5`; killed once its intent is in the log.
    check(&KillPoint {
        what: "the start of turn 17's tool call",
        after: |e| is_turn_event(e, "tool_call_started", 17),
        completed: 16,
        gaps: &["tool_call_in_doubt", "turn_incomplete", "no_finish"],
        in_doubt: Some("shell"),
    });
}

#[test]
fn killed_between_turns_the_resume_continues_with_the_next() {
    // Turn 23 completed; the model takes 3 s to answer turn 24.
    check(&KillPoint {
        what: "the end of turn 23",
        after: |e| is_turn_event(e, "turn_completed", 23),
        completed: 23,
        gaps: &["no_finish"],
        in_doubt: None,
    });
}

/// A run of the crash cassette killed at a point, with what it left behind.
struct Killed {
    dir: tempfile::TempDir,
    db: PathBuf,
    workspace: PathBuf,
    id: String,
}

/// Runs the crash cassette and kills it with SIGKILL right after the first event `after`
/// accepts (`what` says which, for a test that waits in vain).
fn kill_at(what: &str, after: fn(&LogEvent) -> bool) -> Killed {
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("crash", dir.path());
    let db = dir.path().join("nerve.db");
    let args = run_args(&workspace, &provider());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut running = spawn_nerve(&db, &args);
    wait_for_event(&db, &mut running, what, after);
    let killed = running.kill();
    assert_eq!(
        killed.status.code(),
        None,
        "nerve must have died of SIGKILL: {}",
        stderr(&killed)
    );
    let id = execution_id(&read_log(&db));
    Killed {
        dir,
        db,
        workspace,
        id,
    }
}

fn check(point: &KillPoint) {
    if !docker_available() {
        return;
    }
    let expected = uninterrupted();
    let Killed {
        dir: _dir,
        db,
        workspace,
        id,
    } = kill_at(point.what, point.after);

    // The log of the killed run: a committed prefix that replays with the right gaps.
    let before = events_json(&db, &id);
    check_sequence(&before);
    assert_eq!(
        completed_turns(&before),
        (1..=point.completed).collect::<Vec<_>>()
    );
    let replay = replay_json(&db, &id);
    assert_eq!(replay["termination_reason"], Value::Null, "{replay}");
    assert_eq!(replay["total_turns"], point.completed, "{replay}");
    assert_eq!(replay["completeness"], 1.0, "{replay}");
    assert_eq!(replay["complete"], true, "{replay}");
    let kinds: Vec<&str> = replay["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|gap| gap["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, point.gaps, "{replay}");
    verify(&db, &id);
    let in_doubt: Vec<Value> = before
        .iter()
        .filter(|e| e["kind"] == "tool_call_started")
        .filter(|started| {
            !before.iter().any(|e| {
                e["kind"] == "tool_call_finished"
                    && e["payload"]["result"]["call_id"] == started["payload"]["call"]["id"]
            })
        })
        .map(|started| started["payload"]["call"].clone())
        .collect();
    assert_eq!(
        in_doubt
            .iter()
            .map(|c| c["name"].clone())
            .collect::<Vec<_>>(),
        point.in_doubt.iter().map(|n| json!(n)).collect::<Vec<_>>()
    );
    resume_and_check(&db, &id, &before, point.completed, &in_doubt);
    assert_same_tree(expected, &workspace);
    let left = containers_of(&id);
    assert!(left.is_empty(), "containers of {id} left behind: {left:?}");
}

/// Resumes `id`, whose log held `before` with `completed` turns and the calls `in_doubt`,
/// and checks that the run completed with every event kept and every turn done once.
fn resume_and_check(db: &Path, id: &str, before: &[Value], completed: u64, in_doubt: &[Value]) {
    let resume = nerve(db, &["resume", id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    let result = last_json(&resume);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["total_turns"], TURNS, "{result}");
    assert_eq!(result["error"], Value::Null, "{result}");

    // Nothing lost, nothing duplicated: the killed run's events are a prefix of the final
    // log, sequence numbers run 1..n, every turn completed exactly once.
    let after = events_json(db, id);
    check_sequence(&after);
    assert_eq!(
        after[..before.len()],
        before[..],
        "the killed run's events changed"
    );
    assert_eq!(completed_turns(&after), (1..=TURNS).collect::<Vec<_>>());
    for (kind, count) in [("started", 1), ("resumed", 1), ("finish", 1)] {
        assert_eq!(
            after.iter().filter(|e| e["kind"] == kind).count(),
            count,
            "{kind} events"
        );
    }
    let finish = after.last().unwrap();
    assert_eq!(finish["kind"], "finish");
    assert_eq!(finish["payload"]["termination_reason"], "completed");
    let resumed = after.iter().find(|e| e["kind"] == "resumed").unwrap();
    assert_eq!(resumed["payload"]["from_turn"], completed);
    assert_eq!(
        resumed["payload"]["in_doubt"],
        json!(in_doubt.iter().map(|c| c["id"].clone()).collect::<Vec<_>>())
    );
    for call in in_doubt {
        // Told to the model, never re-run.
        let starts = after
            .iter()
            .filter(|e| {
                e["kind"] == "tool_call_started" && e["payload"]["call"]["id"] == call["id"]
            })
            .count();
        assert_eq!(starts, 1, "the in-doubt call {call} ran again");
        let told = after
            .iter()
            .find(|e| {
                e["kind"] == "tool_call_finished" && e["payload"]["result"]["call_id"] == call["id"]
            })
            .unwrap();
        assert_eq!(told["payload"]["result"]["is_error"], true);
        assert!(
            told["payload"]["result"]["content"]
                .as_str()
                .unwrap()
                .contains("effect is unknown"),
            "{told}"
        );
    }
    let replay = replay_json(db, id);
    assert_eq!(replay["termination_reason"], "completed", "{replay}");
    assert_eq!(replay["total_turns"], TURNS, "{replay}");
    assert_eq!(replay["gaps"], json!([]), "{replay}");
    assert_eq!(replay["complete"], true, "{replay}");
    verify(db, id);
}

#[test]
fn a_crash_after_the_model_answered_resumes_to_the_same_workspace() {
    // The two commits between the model's answer and its tool call's intent are too close
    // together to kill a process between them, so the crash is made by cutting a real log
    // there: the log of a run killed during turn 17's `sleep 5`, written again by the real
    // writer up to (a) the `model_called` of turn 17, its answer unrecorded, and (b) the
    // assistant message holding the tool call that never started. (a) replays the cassette
    // line, (b) runs the pending call; both finish with the uninterrupted run's workspace.
    if !docker_available() {
        return;
    }
    let expected = uninterrupted();
    let killed = kill_at("the start of turn 17's tool call", |e| {
        is_turn_event(e, "tool_call_started", 17)
    });
    let log = events_json(&killed.db, &killed.id);
    let answered = log
        .iter()
        .position(|e| e["kind"] == "model_called" && e["payload"]["turn"] == 17)
        .unwrap();
    assert_eq!(log[answered + 1]["payload"]["message"]["role"], "assistant");
    assert_eq!(log[answered + 2]["kind"], "tool_call_started");
    for (cut, gaps) in [
        (answered + 1, json!(["turn_incomplete", "no_finish"])),
        (answered + 2, json!(["turn_incomplete", "no_finish"])),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        crate::support::copy_dir(&killed.workspace, &workspace);
        let db = dir.path().join("nerve.db");
        // The copy is the workspace of this execution now.
        let mut events = log[..cut].to_vec();
        events[0]["payload"]["workspace"] =
            json!(std::fs::canonicalize(&workspace).unwrap().to_str().unwrap());
        rewrite_log(&db, &killed.id, &events);
        let before = events_json(&db, &killed.id);
        assert_eq!(before.len(), cut);
        assert_eq!(before[0]["kind"], "started");
        let replay = replay_json(&db, &killed.id);
        assert_eq!(
            replay["gaps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|gap| gap["kind"].clone())
                .collect::<Value>(),
            gaps,
            "{replay}"
        );
        resume_and_check(&db, &killed.id, &before, 16, &[]);
        let after = events_json(&db, &killed.id);
        let sleeps = after
            .iter()
            .filter(|e| {
                e["kind"] == "tool_call_finished"
                    && e["payload"]["result"]["name"] == "shell"
                    && e["payload"]["result"]["content"] == "[exit code: 0]"
            })
            .count();
        assert!(sleeps >= 1, "turn 17's sleep ran on the resume");
        assert_same_tree(expected, &workspace);
    }
}

/// Writes `events` (as `events --json` printed them) to a fresh log at `db` through the
/// real writer: a log as a crash right after the last of them would have left it.
fn rewrite_log(db: &Path, id: &str, events: &[Value]) {
    use nerve_core::EventSink;
    let execution: nerve_core::ExecutionId = id.parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let sink =
            nerve_session::SqliteSink::open(db, std::sync::Arc::new(nerve_core::Redactor::new()))
                .unwrap();
        for event in events {
            let event: nerve_core::Event =
                serde_json::from_value(event["payload"].clone()).unwrap();
            sink.append(execution, event).await.unwrap();
        }
    });
}

/// The execution id of the (only) execution in the log.
pub(crate) fn execution_id(log: &[LogEvent]) -> String {
    let started = log
        .iter()
        .find(|e| e.kind == "started")
        .unwrap_or_else(|| panic!("the run recorded no start"));
    started.execution_id.clone()
}

pub(crate) fn replay_json(db: &Path, id: &str) -> Value {
    let replay = nerve(db, &["replay", id, "--json"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    last_json(&replay)
}

pub(crate) fn verify(db: &Path, id: &str) {
    let verify = nerve(db, &["verify", id]);
    assert!(verify.status.success(), "{}", stderr(&verify));
}

/// Sequence numbers are 1..n.
pub(crate) fn check_sequence(events: &[Value]) {
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "sequence numbers are not contiguous");
}

/// The turns of the `turn_completed` events, in log order.
pub(crate) fn completed_turns(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .filter(|e| e["kind"] == "turn_completed")
        .map(|e| e["payload"]["turn"].as_u64().unwrap())
        .collect()
}

pub(crate) fn assert_same_tree(expected: &BTreeMap<String, Vec<u8>>, workspace: &Path) {
    let actual = tree(workspace);
    let names = |t: &BTreeMap<String, Vec<u8>>| t.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&actual), names(expected), "the files differ");
    for (name, contents) in expected {
        assert_eq!(
            String::from_utf8_lossy(&actual[name]),
            String::from_utf8_lossy(contents),
            "{name} differs from the uninterrupted run's"
        );
    }
}
