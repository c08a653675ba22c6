//! Ctrl-C: one SIGINT stops the run at the next turn boundary (`shutdown`, exit 1,
//! resumable); a second one aborts at once (exit 130) and leaves a log that replays with the
//! gaps of a crash and can be resumed.

use std::path::Path;

use serde_json::{Value, json};

use crate::crash::{check_sequence, completed_turns, execution_id, replay_json, verify};
use crate::support::{
    containers_of, docker_available, is_turn_event, last_json, nerve, read_log, spawn_nerve,
    stderr, stdout, wait_for_event,
};

/// Writes `lines` as a cassette in `dir` and returns the workspace, the log and the
/// provider spec.
fn setup(dir: &Path, lines: &[Value]) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let workspace = dir.join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let cassette = dir.join("cassette.jsonl");
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&cassette, text).unwrap();
    (
        workspace,
        dir.join("nerve.db"),
        format!("script:{}", cassette.display()),
    )
}

fn write(path: &str, content: &str) -> Value {
    json!({"tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]})
}

fn run<'a>(workspace: &'a Path, provider: &'a str) -> [&'a str; 7] {
    [
        "run",
        "--workspace",
        workspace.to_str().unwrap(),
        "--task",
        "Write the files.",
        "--provider",
        provider,
    ]
}

#[test]
fn one_ctrl_c_stops_at_the_turn_boundary_and_the_run_resumes() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut slow = write("b.txt", "two\n");
    slow["delay_ms"] = json!(3000);
    let (workspace, db, provider) = setup(
        dir.path(),
        &[
            write("a.txt", "one\n"),
            slow,
            write("c.txt", "three\n"),
            json!({"text": "done"}),
        ],
    );
    let mut args = run(&workspace, &provider).to_vec();
    args.push("--json");
    let mut running = spawn_nerve(&db, &args);
    // Ctrl-C while the model thinks about turn 2: turn 2 still completes, turn 3 never starts.
    wait_for_event(&db, &mut running, "the end of turn 1", |e| {
        is_turn_event(e, "turn_completed", 1)
    });
    running.signal("INT");
    let output = running.wait();
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("stopping at the next turn boundary"),
        "{}",
        stderr(&output)
    );
    let result = last_json(&output);
    assert_eq!(result["termination_reason"], "shutdown", "{result}");
    assert_eq!(result["total_turns"], 2, "{result}");
    // Suspended when a checkpoint was taken to resume from, else interrupted.
    assert!(
        result["task_status"] == "suspended" || result["task_status"] == "interrupted",
        "{result}"
    );
    let id = result["execution_id"].as_str().unwrap().to_owned();
    let replay = replay_json(&db, &id);
    assert_eq!(replay["termination_reason"], "shutdown", "{replay}");
    assert_eq!(replay["gaps"], json!([]), "{replay}");
    assert!(!workspace.join("c.txt").exists());

    let resume = nerve(&db, &["resume", &id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    let result = last_json(&resume);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["total_turns"], 4, "{result}");
    for (file, content) in [("a.txt", "one\n"), ("b.txt", "two\n"), ("c.txt", "three\n")] {
        assert_eq!(
            std::fs::read_to_string(workspace.join(file)).unwrap(),
            content
        );
    }
    let events = crate::support::events_json(&db, &id);
    check_sequence(&events);
    assert_eq!(completed_turns(&events), [1, 2, 3, 4]);
    verify(&db, &id);
}

#[test]
fn two_ctrl_c_abort_at_once_with_a_log_that_replays_and_resumes() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (workspace, db, provider) = setup(
        dir.path(),
        &[
            write("a.txt", "one\n"),
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "sleep 5"}}]}),
            write("b.txt", "two\n"),
            json!({"text": "done"}),
        ],
    );
    // Without --json, as on a terminal: progress lines on stderr.
    let mut running = spawn_nerve(&db, &run(&workspace, &provider));
    wait_for_event(&db, &mut running, "the start of turn 2's sleep", |e| {
        is_turn_event(e, "tool_call_started", 2)
    });
    running.signal("INT");
    // The second Ctrl-C only once the first was seen: two signals in quick succession may
    // reach the process as one.
    running.wait_for_stderr("the first Ctrl-C to be seen", |err| {
        err.contains("stopping at the next turn boundary")
    });
    running.signal("INT");
    let output = running.wait();
    assert_eq!(
        output.status.code(),
        Some(130),
        "stdout: {}\nstderr: {}",
        stdout(&output),
        stderr(&output)
    );
    assert!(
        stderr(&output).contains("nerve: aborted"),
        "{}",
        stderr(&output)
    );

    let id = execution_id(&read_log(&db));
    let replay = replay_json(&db, &id);
    assert_eq!(replay["termination_reason"], Value::Null, "{replay}");
    assert_eq!(replay["total_turns"], 1, "{replay}");
    let kinds: Vec<&str> = replay["gaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|gap| gap["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["tool_call_in_doubt", "turn_incomplete", "no_finish"],
        "{replay}"
    );
    verify(&db, &id);

    // The aborted run left its container behind; the resume reaps it and finishes.
    let resume = nerve(&db, &["resume", &id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    let result = last_json(&resume);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["total_turns"], 4, "{result}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("b.txt")).unwrap(),
        "two\n"
    );
    let left = containers_of(&id);
    assert!(left.is_empty(), "containers of {id} left behind: {left:?}");
}
