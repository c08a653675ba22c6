//! Ctrl-C and SIGTERM: the first one stops the run now (no new tool call starts, a running
//! command is interrupted, a model call in flight is abandoned; `shutdown`, exit 1, the
//! summary printed, resumable); a second one aborts at once (exit 130) and leaves a log that
//! replays with the gaps of a crash and can be resumed.

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
fn one_ctrl_c_abandons_the_model_call_in_flight_and_the_run_resumes() {
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
    // Ctrl-C while the model thinks about turn 2: its answer is abandoned, nothing of turn 2
    // is recorded, and no tool call starts.
    wait_for_event(&db, &mut running, "the end of turn 1", |e| {
        is_turn_event(e, "turn_completed", 1)
    });
    running.signal("INT");
    let output = running.wait();
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("nerve: stopping: no new tool call starts"),
        "{}",
        stderr(&output)
    );
    let result = last_json(&output);
    assert_eq!(result["termination_reason"], "shutdown", "{result}");
    assert_eq!(result["total_turns"], 1, "{result}");
    assert_eq!(result["answer"], Value::Null, "{result}");
    // Suspended when a checkpoint was taken to resume from, else interrupted.
    assert!(
        result["task_status"] == "suspended" || result["task_status"] == "interrupted",
        "{result}"
    );
    let id = result["execution_id"].as_str().unwrap().to_owned();
    let replay = replay_json(&db, &id);
    assert_eq!(replay["termination_reason"], "shutdown", "{replay}");
    assert_eq!(replay["gaps"], json!([]), "{replay}");
    assert!(!workspace.join("b.txt").exists());
    assert!(!workspace.join("c.txt").exists());
    let started = read_log(&db)
        .iter()
        .filter(|e| e.kind == "tool_call_started")
        .count();
    assert_eq!(started, 1, "no tool call started after the Ctrl-C");

    let resume = nerve(&db, &["resume", &id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    let result = last_json(&resume);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    // The abandoned answer's line was used (as a model asked again answers anew): the
    // resumed run goes on with the next one.
    assert_eq!(result["total_turns"], 3, "{result}");
    assert_eq!(result["answer"], "done", "{result}");
    for (file, content) in [("a.txt", "one\n"), ("c.txt", "three\n")] {
        assert_eq!(
            std::fs::read_to_string(workspace.join(file)).unwrap(),
            content
        );
    }
    assert!(!workspace.join("b.txt").exists());
    let events = crate::support::events_json(&db, &id);
    check_sequence(&events);
    assert_eq!(completed_turns(&events), [1, 2, 3]);
    let abandoned = events
        .iter()
        .filter(|e| e["kind"] == "model_called" && e["payload"]["outcome"] == "cancelled")
        .count();
    assert_eq!(abandoned, 1, "the abandoned model call is recorded");
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
            // It ignores SIGINT, and the grace before SIGKILL is long (the config below), so
            // the first Ctrl-C leaves the run waiting for it, however slow the machine, when
            // the second one comes.
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "trap '' INT; touch running; sleep 30"}}]}),
            write("b.txt", "two\n"),
            json!({"text": "done"}),
        ],
    );
    let config = dir.path().join("nerve.toml");
    std::fs::write(&config, "[sandbox]\ninterrupt_grace_secs = 600\n").unwrap();
    let mut args = vec!["--config", config.to_str().unwrap()];
    args.extend(run(&workspace, &provider));
    // Without --json, as on a terminal: progress lines on stderr.
    let mut running = spawn_nerve(&db, &args);
    wait_for_event(&db, &mut running, "the start of turn 2's sleep", |e| {
        is_turn_event(e, "tool_call_started", 2)
    });
    // The call's start is durable before its command runs: a Ctrl-C in between would stop
    // the call before it ran, and the run would end before the second one.
    running.wait_for_file("the sleep to run", &workspace.join("running"));
    running.signal("INT");
    // The second Ctrl-C only once the first was seen: two signals in quick succession may
    // reach the process as one.
    running.wait_for_stderr("the first Ctrl-C to be seen", |err| {
        err.contains("nerve: stopping: no new tool call starts")
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

/// SIGTERM (what `timeout`, systemd, Docker and Kubernetes send) mid-command: the command
/// is interrupted at once (SIGINT in the sandbox), the call recorded as interrupted, the
/// run ends `shutdown` with its summary, and `resume` completes it, the model told.
#[test]
fn sigterm_interrupts_the_running_command_and_the_run_resumes() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (workspace, db, provider) = setup(
        dir.path(),
        &[
            json!({"tool_calls": [{"name": "shell", "arguments": {"command": "touch running; sleep 10 && touch slept.txt"}}]}),
            json!({"text": "done"}),
        ],
    );
    let mut args = run(&workspace, &provider).to_vec();
    args.push("--json");
    let mut running = spawn_nerve(&db, &args);
    wait_for_event(&db, &mut running, "the start of the sleep", |e| {
        is_turn_event(e, "tool_call_started", 1)
    });
    running.wait_for_file("the sleep to run", &workspace.join("running"));
    let sent = std::time::Instant::now();
    running.signal("TERM");
    let log = wait_for_event(&db, &mut running, "the sleep's end", |e| {
        e.kind == "tool_call_finished"
    });
    let stopped = sent.elapsed();
    let output = running.wait();
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stopped < std::time::Duration::from_secs(2),
        "the command took {stopped:?} to stop"
    );
    let finished = log.iter().find(|e| e.kind == "tool_call_finished").unwrap();
    assert_eq!(
        finished.payload["interrupted"], true,
        "{:?}",
        finished.payload
    );
    let content = finished.payload["result"]["content"].as_str().unwrap();
    assert!(
        content.contains("[interrupted: the user stopped the execution"),
        "{content}"
    );
    let result = last_json(&output);
    assert_eq!(result["termination_reason"], "shutdown", "{result}");
    assert_eq!(result["total_turns"], 1, "{result}");
    assert!(!workspace.join("slept.txt").exists());
    let id = result["execution_id"].as_str().unwrap().to_owned();
    let replay = replay_json(&db, &id);
    assert_eq!(replay["termination_reason"], "shutdown", "{replay}");
    assert_eq!(replay["gaps"], json!([]), "{replay}");

    let resume = nerve(&db, &["resume", &id, "--json"]);
    assert_eq!(resume.status.code(), Some(0), "{}", stderr(&resume));
    let result = last_json(&resume);
    assert_eq!(result["termination_reason"], "completed", "{result}");
    assert_eq!(result["answer"], "done", "{result}");
    verify(&db, &id);
}
