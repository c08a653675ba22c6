//! Compaction through `nerve run` with a small `--context-window`: large outputs are
//! archived, compactions are recorded, and `recall` returns archived content.

use crate::support::{copy_example, docker_available, last_json, nerve, root, stderr};

#[test]
fn a_small_window_compacts_and_recall_returns_archived_content() {
    if !docker_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let workspace = copy_example("demo", dir.path());
    let db = dir.path().join("nerve.db");
    let script = format!(
        "script:{}",
        root().join("examples/compaction/cassette.jsonl").display()
    );
    let run = nerve(
        &db,
        &[
            "run",
            "--workspace",
            workspace.to_str().unwrap(),
            "--task",
            "Find out why the build fails.",
            "--provider",
            &script,
            "--context-window",
            "4000",
            "--json",
        ],
    );
    assert!(run.status.success(), "{}", stderr(&run));
    let result = last_json(&run);
    assert_eq!(result["termination_reason"], "completed");
    assert!(result["compactions"].as_u64().unwrap() >= 2, "{result}");

    let id = result["execution_id"].as_str().unwrap();
    let events = last_json(&nerve(&db, &["events", id, "--json"]));
    let events = events.as_array().unwrap();
    let strategies: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "compaction")
        .map(|e| e["payload"]["strategy"].as_str().unwrap())
        .collect();
    assert!(strategies.contains(&"offload"), "{strategies:?}");
    // The recall found the finding that was archived with the first, offloaded output.
    let recall = events
        .iter()
        .find(|e| e["kind"] == "tool_call_finished" && e["payload"]["result"]["name"] == "recall")
        .expect("a recall result is recorded");
    let content = recall["payload"]["result"]["content"].as_str().unwrap();
    assert!(content.contains("nerve_frobnicate"), "{content}");
    // The log keeps the original output in full.
    let original = events
        .iter()
        .find(|e| e["kind"] == "tool_call_finished")
        .map(|e| {
            e["payload"]["result"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .unwrap();
    assert!(
        original.contains("FATAL: missing symbol nerve_frobnicate"),
        "the log keeps the original"
    );
    let replay = last_json(&nerve(&db, &["replay", id, "--json"]));
    assert_eq!(replay["complete"], true, "{replay}");
    assert!(nerve(&db, &["verify", id]).status.success());
}
