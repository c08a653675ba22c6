//! The README demo as a test: a scripted agent fixes a failing test in a real sandbox, and
//! the log replays it completely.

use crate::support::{copy_example, docker_available, last_json, nerve, root, stderr};

#[test]
fn readme_demo_runs_replays_and_the_log_is_append_only() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("demo", dir.path());
    let db = dir.path().join("nerve.db");
    let cassette = format!(
        "script:{}",
        root().join("examples/demo/cassette.jsonl").display()
    );
    let task_file = root().join("examples/demo/task.txt");

    let run = nerve(
        &db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task-file",
            task_file.to_str().unwrap(),
            "--provider",
            &cassette,
            "--json",
        ],
    );
    assert!(run.status.success(), "nerve run failed: {}", stderr(&run));
    let result = last_json(&run);
    assert_eq!(result["termination_reason"], "completed");
    assert_eq!(result["task_status"], "in_review");
    assert_eq!(result["total_turns"], 5);
    assert_eq!(result["error"], serde_json::Value::Null);
    for field in [
        "execution_id",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "compactions",
    ] {
        assert!(result.get(field).is_some(), "missing {field} in {result}");
    }

    // The shell tool's effect is visible in the workspace.
    let greet = std::fs::read_to_string(workspace.join("greet.sh")).unwrap();
    assert!(greet.contains("Hello, Nerve!"), "{greet}");

    let id = result["execution_id"].as_str().unwrap();
    let replay = nerve(&db, &["replay", id, "--json"]);
    assert!(replay.status.success(), "{}", stderr(&replay));
    let replayed = last_json(&replay);
    assert_eq!(replayed["termination_reason"], "completed");
    assert_eq!(replayed["total_turns"], 5);
    assert_eq!(replayed["completeness"], 1.0);
    assert_eq!(replayed["complete"], true);
    assert_eq!(replayed["gaps"], serde_json::json!([]));
    assert_eq!(
        replayed["messages"], 11,
        "system, task, 5 assistant messages and 4 tool results: {replayed}"
    );

    let verify = nerve(&db, &["verify", id]);
    assert!(verify.status.success(), "{}", stderr(&verify));

    let conn = rusqlite::Connection::open(&db).unwrap();
    let update = conn
        .execute("UPDATE events SET kind = 'x'", [])
        .unwrap_err()
        .to_string();
    assert!(update.contains("append-only"), "{update}");
    let delete = conn
        .execute("DELETE FROM events", [])
        .unwrap_err()
        .to_string();
    assert!(delete.contains("append-only"), "{delete}");

    // No sandbox container outlives the run.
    let left = crate::support::containers_of(id);
    assert!(left.is_empty(), "container left behind: {left:?}");
}
