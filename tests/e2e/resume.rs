//! `nerve resume` at its edges: an execution that ended `error` is taken up again (and only
//! as often as the resume attempts allow), and a log whose hash chain is broken is refused
//! before anything runs or is appended.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::crash::{replay_json, verify};
use crate::support::{
    containers_of, docker_available, events_json, last_json, nerve, read_log, stderr,
};

/// A workspace and a log in `dir`, and a cassette of `lines` there: `(workspace, db, provider)`.
fn setup(dir: &Path, lines: &[Value]) -> (PathBuf, PathBuf, String) {
    let workspace = dir.join("workspace");
    std::fs::create_dir(&workspace).unwrap();
    let db = dir.join("nerve.db");
    let script = dir.join("cassette.jsonl");
    let text: String = lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&script, text).unwrap();
    (workspace, db, format!("script:{}", script.display()))
}

fn write(path: &str, content: &str) -> Value {
    json!({"text": format!("Write {path}."), "tool_calls": [{"name": "write_file", "arguments": {"path": path, "content": content}}]})
}

/// `nerve run --json` of the notes task; its JSON, after checking the exit code.
fn run(db: &Path, workspace: &Path, provider: &str, code: i32) -> Value {
    let output = nerve(
        db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Write the notes.",
            "--provider",
            provider,
            "--json",
        ],
    );
    assert_eq!(output.status.code(), Some(code), "{}", stderr(&output));
    last_json(&output)
}

fn resume(db: &Path, id: &str, code: i32) -> Value {
    let output = nerve(db, &["resume", id, "--json"]);
    assert_eq!(output.status.code(), Some(code), "{}", stderr(&output));
    last_json(&output)
}

/// The `task_transition` events of the log, as `(from, to)`.
fn transitions(events: &[Value]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["kind"] == "task_transition")
        .map(|e| {
            (
                e["payload"]["from"].as_str().unwrap().to_owned(),
                e["payload"]["to"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn an_execution_that_ended_with_an_error_resumes_and_completes() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The provider refuses the second call (a permanent error): the run ends `error`.
    let (workspace, db, provider) = setup(
        dir.path(),
        &[
            write("one.txt", "one\n"),
            json!({"error": "auth"}),
            write("two.txt", "two\n"),
            json!({"text": "Both notes are written."}),
        ],
    );
    let failed = run(&db, &workspace, &provider, 1);
    assert_eq!(failed["termination_reason"], "error", "{failed}");
    assert_eq!(failed["task_status"], "failed", "{failed}");
    assert!(
        failed["error"].as_str().unwrap().contains("auth"),
        "{failed}"
    );
    let id = failed["execution_id"].as_str().unwrap().to_owned();

    let resumed = resume(&db, &id, 0);
    assert_eq!(resumed["termination_reason"], "completed", "{resumed}");
    assert_eq!(resumed["error"], Value::Null, "{resumed}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("two.txt")).unwrap(),
        "two\n"
    );

    // The failed task was taken up again by a recorded move, right after the resume.
    let events = events_json(&db, &id);
    let resumed_at = events.iter().position(|e| e["kind"] == "resumed").unwrap();
    assert_eq!(events[resumed_at]["payload"]["attempt"], 1);
    assert_eq!(events[resumed_at + 1]["kind"], "task_transition");
    assert_eq!(
        events[resumed_at + 1]["payload"],
        json!({"kind": "task_transition", "from": "failed", "to": "in_progress"}),
    );
    assert!(
        transitions(&events).contains(&("in_progress".into(), "failed".into())),
        "{:?}",
        transitions(&events)
    );
    let replay = replay_json(&db, &id);
    assert_eq!(replay["termination_reason"], "completed", "{replay}");
    verify(&db, &id);
}

#[test]
fn an_execution_stopped_by_a_provider_outage_resumes_after_it() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Every attempt of the second call fails (5 in all, the first included): the outage
    // outlasts the retries and the run ends `error`; the provider is back for the resume.
    let mut lines = vec![write("one.txt", "one\n")];
    lines.extend(std::iter::repeat_n(
        json!({"error": "server_error", "retry_after_ms": 1}),
        5,
    ));
    lines.push(write("two.txt", "two\n"));
    lines.push(json!({"text": "Both notes are written."}));
    let (workspace, db, provider) = setup(dir.path(), &lines);
    let failed = run(&db, &workspace, &provider, 1);
    assert_eq!(failed["termination_reason"], "error", "{failed}");
    assert!(
        failed["error"].as_str().unwrap().contains("server_error"),
        "{failed}"
    );
    let id = failed["execution_id"].as_str().unwrap().to_owned();
    let events = events_json(&db, &id);
    assert_eq!(events.iter().filter(|e| e["kind"] == "retry").count(), 4);

    let resumed = resume(&db, &id, 0);
    assert_eq!(resumed["termination_reason"], "completed", "{resumed}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("two.txt")).unwrap(),
        "two\n"
    );
    assert_eq!(
        std::fs::read_to_string(workspace.join("one.txt")).unwrap(),
        "one\n"
    );
    verify(&db, &id);
}

#[test]
fn a_failing_execution_is_resumed_at_most_three_times() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (workspace, db, provider) = setup(dir.path(), &vec![json!({"error": "auth"}); 5]);
    let failed = run(&db, &workspace, &provider, 1);
    assert_eq!(failed["termination_reason"], "error", "{failed}");
    let id = failed["execution_id"].as_str().unwrap().to_owned();
    for attempt in 1..=3 {
        let again = resume(&db, &id, 1);
        assert_eq!(
            again["termination_reason"], "error",
            "attempt {attempt}: {again}"
        );
        assert_eq!(again["task_status"], "failed", "attempt {attempt}: {again}");
    }
    let before = read_log(&db).len();
    let refused = nerve(&db, &["resume", &id]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("was already resumed 3 times"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(read_log(&db).len(), before, "a refused resume appended");
    let events = events_json(&db, &id);
    assert_eq!(
        transitions(&events)
            .iter()
            .filter(|(from, to)| from == "failed" && to == "in_progress")
            .count(),
        3
    );
    verify(&db, &id);
}

#[test]
fn a_tampered_log_is_reported_by_verify_and_refused_by_resume() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (workspace, db, provider) = setup(
        dir.path(),
        &[
            write("one.txt", "one\n"),
            json!({"error": "auth"}),
            json!({"text": "Done."}),
        ],
    );
    let failed = run(&db, &workspace, &provider, 1);
    let id = failed["execution_id"].as_str().unwrap().to_owned();

    // An editor of the database rewrites the task the model will read.
    let conn = rusqlite::Connection::open(&db).unwrap();
    let seq: i64 = conn
        .query_row(
            "SELECT seq FROM events WHERE execution_id = ?1 AND kind = 'message_appended' \
             AND payload LIKE '%Write the notes.%' ORDER BY seq LIMIT 1",
            [&id],
            |row| row.get(0),
        )
        .unwrap();
    conn.execute_batch("DROP TRIGGER events_no_update").unwrap();
    let edited = conn
        .execute(
            "UPDATE events SET payload = replace(payload, 'Write the notes.', 'Delete every file.') \
             WHERE execution_id = ?1 AND seq = ?2",
            rusqlite::params![id, seq],
        )
        .unwrap();
    assert_eq!(edited, 1);
    drop(conn);
    let broken = format!("hash chain broken at sequence {seq}");

    let verified = nerve(&db, &["verify", &id]);
    assert_eq!(verified.status.code(), Some(1), "{}", stderr(&verified));
    assert!(stderr(&verified).contains(&broken), "{}", stderr(&verified));

    let before = read_log(&db).len();
    let refused = nerve(&db, &["resume", &id, "--json"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let message = stderr(&refused);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.contains(&broken), "{message}");
    assert!(
        refused.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&refused.stdout)
    );
    assert_eq!(read_log(&db).len(), before, "a refused resume appended");
    // Nor is a decision appended to it.
    let approve = nerve(&db, &["approve", &id, "--deny"]);
    assert_eq!(approve.status.code(), Some(2), "{}", stderr(&approve));
    assert!(stderr(&approve).contains(&broken), "{}", stderr(&approve));
    assert_eq!(read_log(&db).len(), before, "a refused approve appended");
    // Nor does a person's next message go on it, in a chat or headless.
    for args in [
        vec!["chat", id.as_str()],
        vec!["run", "--continue", id.as_str(), "--task", "Go on."],
    ] {
        let refused = nerve(&db, &args);
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&refused)
        );
        let message = stderr(&refused);
        assert_eq!(message.lines().count(), 1, "{message}");
        assert!(message.contains(&broken), "{args:?}: {message}");
    }
    assert_eq!(read_log(&db).len(), before, "a refused follow-up appended");
    assert_eq!(
        containers_of(&id),
        Vec::<String>::new(),
        "a refused resume started a sandbox"
    );
    assert!(!workspace.join("two.txt").exists());
}
